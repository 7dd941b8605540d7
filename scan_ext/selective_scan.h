// The problem both kernels solve, in plain pointers and strides: no torch and no CUDA types, so
// that selective_scan_cuda.cu compiles with nvcc alone, or as C++ (tests/cuda_on_cpu.h), and
// binding.cpp does all the torch work. Shapes are (b, d, l, n): batch rows, channels,
// steps, state size; A, B, C and D are Mamba's matrices.
#pragma once
#include <cstdint>

namespace scan {

constexpr int64_t kMaxState = 256;  // as mamba-ssm: d_state <= 256

struct Strided {  // a (b, d, l) tensor: element (row, ch, t) is p[row * sb + ch * sd + t * sl]
  void* p = nullptr;
  int64_t sb = 0, sd = 0, sl = 0;
};

struct Problem {
  Strided u, delta, z;                // z.p == nullptr when there is no gate
  const void *A, *B, *C, *D, *bias;   // A (d, n); B, C (b, l, n) contiguous; D, bias (d,) or null
  bool softplus;
  int64_t b, d, l, n;
};

// The CPU kernel (selective_scan.cpp): out = scan(p); dA_b (b, d, n), dD_b and dbias_b (b, d) per
// row, summed by the caller, dB and dC (b, l, n). fp64 selects double, else float.
void forward_cpu(const Problem& p, Strided out, bool fp64);
void backward_cpu(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz,
                  void* dA_b, void* dB, void* dC, void* dD_b, void* dbias_b, bool fp64);

// The CUDA kernel (selective_scan_cuda.cu). Each returns nullptr, or the launch's error message.
// out = scan(p). fp64 selects double, else float; stream is a cudaStream_t.
const char* forward_cuda(const Problem& p, Strided out, bool fp64, void* stream);

// One thread per (b, d) channel; per-channel partial sums, reduced by the caller:
//   dA_b (b, n, d), dD_b and dbias_b (b, d), dB_bd and dC_bd (b, l, n, d); H (b, l, n, d) scratch.
const char* backward_cuda(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz,
                          void* dA_b, void* dB_bd, void* dC_bd, void* dD_b, void* dbias_b, void* H,
                          bool fp64, void* stream);

}  // namespace scan
