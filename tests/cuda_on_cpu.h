// CUDA's launch on a CPU: tests/test_scan.py compiles scan_ext/selective_scan_cuda.cu as plain C++
// with this header forced in front of it (g++ -x c++ -include tests/cuda_on_cpu.h). The kernels
// use no shared memory, no synchronisation and no atomics, so a launch is the same as running its
// grid's threads one after another, each with its own threadIdx and blockIdx.
#pragma once
#include <cmath>
#include <cstdint>
#include "selective_scan.h"

using std::exp;  // device code's exp(float) and log1p(float) are float overloads: <cmath>'s here
using std::log1p;
#define __global__
#define __device__

struct uint3 { unsigned x = 0, y = 0, z = 0; };
inline uint3 threadIdx, blockIdx, blockDim;
using cudaStream_t = struct CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

// kernel<<<blocks, threads, 0, stream>>>(args...) as loops over the grid's blocks and threads
template <typename... Args>
auto cpu_launch(void (*kernel)(Args...), unsigned blocks, unsigned threads) {
  return [=](Args... args) {
    blockDim.x = threads;
    for (blockIdx.x = 0; blockIdx.x < blocks; ++blockIdx.x)
      for (threadIdx.x = 0; threadIdx.x < threads; ++threadIdx.x) kernel(args...);
  };
}
#define LAUNCH(kernel, blocks, threads, stream) cpu_launch(kernel, blocks, threads)

// Entry points for ctypes: grads = {dout, du, ddelta, dz}, sums = {dA_b, dB_bd, dC_bd, dD_b,
// dbias_b, H} as selective_scan.h's backward_cuda takes them.
extern "C" const char* forward(const scan::Problem* p, const scan::Strided* out, bool fp64) {
  return scan::forward_cuda(*p, *out, fp64, nullptr);
}
extern "C" const char* backward(const scan::Problem* p, const scan::Strided* grads,
                                void* const* sums, bool fp64) {
  return scan::backward_cuda(*p, grads[0], grads[1], grads[2], grads[3], sums[0], sums[1],
                             sums[2], sums[3], sums[4], sums[5], fp64, nullptr);
}
