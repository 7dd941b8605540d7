// The CUDA kernel's interface: plain pointers and strides, no torch types, so that
// selective_scan_cuda.cu compiles with nvcc alone (nvcc -c selective_scan_cuda.cu checks it on a
// machine without a GPU) and selective_scan.cpp does all the torch work.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace cuda_scan {

struct Strided {  // a (B, D, L) tensor: element (b, d, t) is p[b*sb + d*sd + t*sl]
  void* p = nullptr;
  int64_t sb = 0, sd = 0, sl = 0;
};

struct Problem {
  Strided u, delta, z;                     // z.p == nullptr when there is no gate
  const void *A, *B, *C, *D, *bias;        // A (D, N); B, C (B, L, N) contiguous; D, bias (D,) or null
  bool softplus;
  int64_t Bsz, Dim, L, N;
};

// out = scan(problem). fp64 selects double, else float.
void forward(const Problem& p, Strided out, bool fp64, cudaStream_t stream);

// One thread per (b, d) channel; per-channel partial sums, reduced by the caller:
//   dA_b (B, N, D), dD_b (B, D), dbias_b (B, D), dB_bd and dC_bd (B, L, N, D); H (B, L, N, D) scratch.
void backward(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz, void* dA_b,
              void* dB_bd, void* dC_bd, void* dD_b, void* dbias_b, void* H, bool fp64,
              cudaStream_t stream);

}  // namespace cuda_scan
