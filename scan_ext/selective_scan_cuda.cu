// Mamba's selective scan on CUDA: one thread per (b, d) channel, its state h[n] in registers,
// sequential over time. At the paper's lengths (l ~ 40-300) and shapes (b·d ~ 16k channels) this
// keeps the GPU busy without the block-wide parallel scan of the official kernel, which pays off
// only for long sequences. The equations, as in selective_scan.cpp (dout_t = ∂loss/∂out_t,
// dh_t = ∂loss/∂h_t):
//
//   forward:   Δ_t = softplus(delta_t + bias), a_t = exp(Δ_t A),  h_t = a_t ⊙ h_{t-1} + Δ_t u_t B_t
//              y_t = C_t · h_t + D u_t,  out_t = y_t · SiLU(z_t)
//   backward:  dh_t = dy_t C_t + a_{t+1} ⊙ dh_{t+1};  du_t = D dy_t + Σ_k dh_t,k Δ_t B_t,k;
//              dΔ_t = Σ_k dh_t,k (B_t,k u_t + A_k a_t,k h_{t-1},k);  dA += dh_t Δ_t a_t h_{t-1};
//              dB_t += dh_t Δ_t u_t;  dC_t += dy_t h_t  (per channel here, summed by the caller)
//
// Threads of a warp are consecutive channels of one batch row, so reads of u, delta, z (whose
// d-stride is 1 in Mamba's layout) and of the (b, l, n, d) scratch are coalesced, and B_t, C_t are
// broadcast. Partial sums are written per channel and reduced by torch: no atomics, deterministic.
// No shared memory and no synchronisation: a launch is its threads run in any order, which is how
// tests/test_scan.py runs this file on a CPU, compiled as C++ with tests/cuda_on_cpu.h.
#include "selective_scan.h"

#ifndef LAUNCH  // tests/cuda_on_cpu.h defines it as loops over the grid
#define LAUNCH(kernel, blocks, threads, stream) kernel<<<blocks, threads, 0, stream>>>
#endif

namespace scan {
namespace {

template <typename T> __device__ T softplus_(T x) { return x <= T(20) ? log1p(exp(x)) : x; }
template <typename T> __device__ T sigmoid_(T x) { return T(1) / (T(1) + exp(-x)); }
template <typename T> __device__ T& at(const Strided& s, int64_t row, int64_t ch, int64_t t) {
  return static_cast<T*>(s.p)[row * s.sb + ch * s.sd + t * s.sl];
}
template <typename T> __device__ T pre_step(const Problem& p, int64_t row, int64_t ch, int64_t t) {
  return at<T>(p.delta, row, ch, t) + (p.bias ? static_cast<const T*>(p.bias)[ch] : T(0));
}
template <typename T> __device__ T step(const Problem& p, int64_t row, int64_t ch, int64_t t) {
  return p.softplus ? softplus_(pre_step<T>(p, row, ch, t)) : pre_step<T>(p, row, ch, t);
}

// MAXN: a compile-time bound on n, so that the unrolled state arrays live in registers.
template <typename T, int MAXN>
__global__ void forward_kernel(Problem p, Strided out) {
  const int64_t task = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (task >= p.b * p.d) return;
  const int64_t row = task / p.d, ch = task % p.d, n = p.n, l = p.l;
  T h[MAXN], A[MAXN];
#pragma unroll
  for (int k = 0; k < MAXN; ++k) {
    h[k] = T(0);
    A[k] = k < n ? static_cast<const T*>(p.A)[ch * n + k] : T(0);
  }
  for (int64_t t = 0; t < l; ++t) {
    const T dt = step<T>(p, row, ch, t), u = at<T>(p.u, row, ch, t);
    const T* Bt = static_cast<const T*>(p.B) + (row * l + t) * n;
    const T* Ct = static_cast<const T*>(p.C) + (row * l + t) * n;
    T y = T(0);
#pragma unroll
    for (int k = 0; k < MAXN; ++k) {
      if (k < n) {
        h[k] = exp(dt * A[k]) * h[k] + dt * u * Bt[k];
        y += Ct[k] * h[k];
      }
    }
    if (p.D) y += static_cast<const T*>(p.D)[ch] * u;
    if (p.z.p) { const T z = at<T>(p.z, row, ch, t); y *= z * sigmoid_(z); }
    at<T>(out, row, ch, t) = y;
  }
}

template <typename T, int MAXN>
__global__ void backward_kernel(Problem p, Strided dout, Strided du, Strided ddelta, Strided dz,
                                T* dA_b, T* dB_bd, T* dC_bd, T* dD_b, T* dbias_b, T* H) {
  const int64_t task = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (task >= p.b * p.d) return;
  const int64_t row = task / p.d, ch = task % p.d, n = p.n, l = p.l, d = p.d;
  const T D = p.D ? static_cast<const T*>(p.D)[ch] : T(0);
  // (t, k) of this channel in the (b, l, n, d) scratch
  auto idx = [&](int64_t t, int64_t k) { return ((row * l + t) * n + k) * d + ch; };
  T h[MAXN], carry[MAXN], dA[MAXN], A[MAXN];  // carry = a_{t+1} ⊙ dh_{t+1}
#pragma unroll
  for (int k = 0; k < MAXN; ++k) {
    h[k] = carry[k] = dA[k] = T(0);
    A[k] = k < n ? static_cast<const T*>(p.A)[ch * n + k] : T(0);
  }
  // recompute the forward pass, storing h_t
  for (int64_t t = 0; t < l; ++t) {
    const T dt = step<T>(p, row, ch, t), u = at<T>(p.u, row, ch, t);
    const T* Bt = static_cast<const T*>(p.B) + (row * l + t) * n;
#pragma unroll
    for (int k = 0; k < MAXN; ++k)
      if (k < n) H[idx(t, k)] = h[k] = exp(dt * A[k]) * h[k] + dt * u * Bt[k];
  }
  T dD = T(0), dbias = T(0);
  for (int64_t t = l - 1; t >= 0; --t) {
    const T dt = step<T>(p, row, ch, t), u = at<T>(p.u, row, ch, t);
    const T dout_t = at<T>(dout, row, ch, t);
    const T* Bt = static_cast<const T*>(p.B) + (row * l + t) * n;
    const T* Ct = static_cast<const T*>(p.C) + (row * l + t) * n;
    T dy = dout_t;
    if (p.z.p) {  // dz_t = dout_t y_t σ(z_t) (1 + z_t (1 - σ(z_t))),  dy_t = dout_t SiLU(z_t)
      const T z = at<T>(p.z, row, ch, t), sz = sigmoid_(z);
      T y = D * u;
#pragma unroll
      for (int k = 0; k < MAXN; ++k) if (k < n) y += Ct[k] * H[idx(t, k)];
      at<T>(dz, row, ch, t) = dout_t * y * sz * (T(1) + z * (T(1) - sz));
      dy = dout_t * z * sz;
    }
    dD += dy * u;
    T du_t = D * dy, ddelta_t = T(0);  // ddelta_t: dΔ_t, until the softplus's factor below
#pragma unroll
    for (int k = 0; k < MAXN; ++k) {
      if (k < n) {
        const T a = exp(dt * A[k]);
        const T h_prev = t ? H[idx(t - 1, k)] : T(0);
        const T dh = dy * Ct[k] + carry[k];
        dC_bd[idx(t, k)] = dy * H[idx(t, k)];
        dB_bd[idx(t, k)] = dh * dt * u;
        du_t += dh * dt * Bt[k];
        ddelta_t += dh * (Bt[k] * u + A[k] * a * h_prev);
        dA[k] += dh * dt * a * h_prev;
        carry[k] = a * dh;
      }
    }
    at<T>(du, row, ch, t) = du_t;
    if (p.softplus) {  // ddelta_t = dΔ_t σ(delta_t + bias)  (1 above 20)
      const T pre = pre_step<T>(p, row, ch, t);
      ddelta_t *= pre <= T(20) ? sigmoid_(pre) : T(1);
    }
    at<T>(ddelta, row, ch, t) = ddelta_t;
    dbias += ddelta_t;
  }
#pragma unroll
  for (int k = 0; k < MAXN; ++k) if (k < n) dA_b[(row * n + k) * d + ch] = dA[k];
  dD_b[row * d + ch] = dD;
  dbias_b[row * d + ch] = dbias;
}

constexpr int kThreads = 128;

// nullptr, or the launch's error (a bad configuration shows at once, a fault at the next sync).
const char* launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <typename T, int MAXN>
const char* launch_fwd(const Problem& p, Strided out, cudaStream_t s) {
  const unsigned blocks = unsigned((p.b * p.d + kThreads - 1) / kThreads);
  auto kernel = forward_kernel<T, MAXN>;
  LAUNCH(kernel, blocks, kThreads, s)(p, out);
  return launch_error();
}

template <typename T, int MAXN>
const char* launch_bwd(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz,
                       void* dA_b, void* dB, void* dC, void* dD_b, void* dbias_b, void* H,
                       cudaStream_t s) {
  const unsigned blocks = unsigned((p.b * p.d + kThreads - 1) / kThreads);
  auto kernel = backward_kernel<T, MAXN>;
  LAUNCH(kernel, blocks, kThreads, s)(p, dout, du, ddelta, dz, static_cast<T*>(dA_b),
                                      static_cast<T*>(dB), static_cast<T*>(dC),
                                      static_cast<T*>(dD_b), static_cast<T*>(dbias_b),
                                      static_cast<T*>(H));
  return launch_error();
}

template <typename T>
const char* dispatch_fwd(const Problem& p, Strided out, cudaStream_t s) {
  if (p.n <= 16) return launch_fwd<T, 16>(p, out, s);
  if (p.n <= 64) return launch_fwd<T, 64>(p, out, s);
  return launch_fwd<T, 256>(p, out, s);
}

template <typename T, typename... Args>
const char* dispatch_bwd(const Problem& p, Args... args) {
  if (p.n <= 16) return launch_bwd<T, 16>(p, args...);
  if (p.n <= 64) return launch_bwd<T, 64>(p, args...);
  return launch_bwd<T, 256>(p, args...);
}

}  // namespace

const char* forward_cuda(const Problem& p, Strided out, bool fp64, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return fp64 ? dispatch_fwd<double>(p, out, s) : dispatch_fwd<float>(p, out, s);
}

const char* backward_cuda(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz,
                          void* dA_b, void* dB_bd, void* dC_bd, void* dD_b, void* dbias_b, void* H,
                          bool fp64, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (fp64) return dispatch_bwd<double>(p, dout, du, ddelta, dz, dA_b, dB_bd, dC_bd, dD_b, dbias_b,
                                        H, s);
  return dispatch_bwd<float>(p, dout, du, ddelta, dz, dA_b, dB_bd, dC_bd, dD_b, dbias_b, H, s);
}

}  // namespace scan
