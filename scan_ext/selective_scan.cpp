// Mamba's selective scan on the CPU, and the torch binding of both kernels (selective_scan_cuda.cu
// is the GPU's). scan_ext/__init__.py compiles this file on first use.
//
// The same shape as the CUDA kernel: one task per (b, d) channel, its state h[n] in a small array,
// sequential over time; the tasks run on OpenMP threads. Per channel (mamba-ssm's
// selective_scan_ref, real A, B and C per token), with G_t = ∂loss/∂out_t and g_t = ∂loss/∂h_t:
//
//   forward:   Δ_t = softplus(delta_t + bias)  (if asked; above 20 the identity),  a_t = exp(Δ_t A)
//              h_t = a_t ⊙ h_{t-1} + Δ_t u_t B_t  (h_{-1} = 0),  y_t = C_t · h_t + D u_t,
//              out_t = y_t SiLU(z_t)  (if z is given)
//   backward:  dy_t = G_t SiLU(z_t),  dz_t = G_t y_t σ(z_t) (1 + z_t (1 - σ(z_t)))  (no z: dy = G),
//              g_t = dy_t C_t + a_{t+1} ⊙ g_{t+1}  (from t = l-1 down),  dD += dy_t u_t,
//              du_t = D dy_t + Δ_t Σ_k g_t,k B_t,k,
//              dΔ_t = Σ_k g_t,k (u_t B_t,k + A_k a_t,k h_{t-1},k),
//              dA += Δ_t g_t ⊙ a_t ⊙ h_{t-1},  dB_t += Δ_t u_t g_t,  dC_t += dy_t h_t,
//              ddelta_t = dΔ_t σ(delta_t + bias) with softplus (1 above 20),  dbias += ddelta_t
//
// dA, dB, dC, dD and dbias are sums over channels or rows. So that the results do not depend on the
// number of threads, the backward runs one task per batch row: it adds its channels' dB and dC in
// channel order, and writes dA, dD and dbias per row, which torch then sums.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>
#include "selective_scan.h"

namespace {

using scan::Problem;
using scan::Strided;
constexpr int64_t kMaxState = 256;  // as mamba-ssm: d_state <= 256

template <typename T> T& at(const Strided& s, int64_t row, int64_t ch, int64_t t) {
  return static_cast<T*>(s.p)[row * s.sb + ch * s.sd + t * s.sl];
}
template <typename T> const T* cptr(const void* p) { return static_cast<const T*>(p); }

// A channel's Δ_t, dΔ_t/d(delta_t) and SiLU(z_t), σ(z_t) for all t: loops over t, so that the
// compiler vectorises them with the library's vector exp and log1p (-O3 -ffast-math -fopenmp).
template <typename T> struct Series {
  std::vector<T> dt, dsp, gate, sz, y;
  explicit Series(int64_t l) : dt(l), dsp(l), gate(l), sz(l), y(l) {}
  void load(const Problem& p, int64_t row, int64_t ch) {
    const T bias = p.bias ? cptr<T>(p.bias)[ch] : T(0), *delta = &at<T>(p.delta, row, ch, 0);
    const int64_t sl = p.delta.sl;
#pragma omp simd
    for (int64_t t = 0; t < p.l; ++t) {
      const T pre = delta[t * sl] + bias, e = std::exp(std::min(pre, T(20)));
      dt[t] = p.softplus && pre <= T(20) ? std::log1p(e) : pre;
      dsp[t] = p.softplus && pre <= T(20) ? e / (T(1) + e) : T(1);
    }
    if (!p.z.p) return;
    const T* z = &at<T>(p.z, row, ch, 0);
    const int64_t zl = p.z.sl;
#pragma omp simd
    for (int64_t t = 0; t < p.l; ++t) {
      sz[t] = T(1) / (T(1) + std::exp(-z[t * zl]));
      gate[t] = z[t * zl] * sz[t];
    }
  }
};

template <typename T>
void forward_channel(const Problem& p, const Strided& out, int64_t row, int64_t ch, Series<T>& s) {
  const int64_t n = p.n, l = p.l;
  const T* A = cptr<T>(p.A) + ch * n;
  const T Dc = p.D ? cptr<T>(p.D)[ch] : T(0);
  T h[kMaxState];
  std::fill(h, h + n, T(0));
  s.load(p, row, ch);
  for (int64_t t = 0; t < l; ++t) {
    const T dt = s.dt[t], x = at<T>(p.u, row, ch, t);
    const T *Bt = cptr<T>(p.B) + (row * l + t) * n, *Ct = cptr<T>(p.C) + (row * l + t) * n;
    T y = Dc * x;
#pragma omp simd reduction(+ : y)
    for (int64_t k = 0; k < n; ++k) {
      h[k] = std::exp(dt * A[k]) * h[k] + dt * x * Bt[k];
      y += Ct[k] * h[k];
    }
    at<T>(out, row, ch, t) = p.z.p ? y * s.gate[t] : y;
  }
}

// H[(t + 1) n + k] = h_t,k, row 0 the zeros of h_{-1}; dB, dC: the row's (l, n) sums over channels.
template <typename T>
void backward_channel(const Problem& p, const Strided& dout, const Strided& du,
                      const Strided& ddelta, const Strided& dz, T* dA, T* dB, T* dC, T* dD,
                      T* dbias, int64_t row, int64_t ch, Series<T>& s, T* H) {
  const int64_t n = p.n, l = p.l;
  const T* A = cptr<T>(p.A) + ch * n;
  const T Dc = p.D ? cptr<T>(p.D)[ch] : T(0);
  s.load(p, row, ch);
  std::fill(H, H + n, T(0));
  for (int64_t t = 0; t < l; ++t) {  // the forward again, keeping h_t and y_t
    const T dt = s.dt[t], x = at<T>(p.u, row, ch, t);
    const T *Bt = cptr<T>(p.B) + (row * l + t) * n, *Ct = cptr<T>(p.C) + (row * l + t) * n;
    const T* hp = H + t * n;
    T* ht = H + (t + 1) * n;
    T y = Dc * x;
#pragma omp simd reduction(+ : y)
    for (int64_t k = 0; k < n; ++k) {
      ht[k] = std::exp(dt * A[k]) * hp[k] + dt * x * Bt[k];
      y += Ct[k] * ht[k];
    }
    s.y[t] = y;
  }
  T g[kMaxState], dA_c[kMaxState], dD_c = T(0), dbias_c = T(0);  // g holds a_{t+1} g_{t+1}
  std::fill(g, g + n, T(0));
  std::fill(dA_c, dA_c + n, T(0));
  for (int64_t t = l - 1; t >= 0; --t) {
    const T dt = s.dt[t], x = at<T>(p.u, row, ch, t), G = at<T>(dout, row, ch, t);
    const T *Bt = cptr<T>(p.B) + (row * l + t) * n, *Ct = cptr<T>(p.C) + (row * l + t) * n;
    const T *hp = H + t * n, *ht = H + (t + 1) * n;
    T *dBt = dB + t * n, *dCt = dC + t * n;
    T dy = G;
    if (p.z.p) {
      const T sz = s.sz[t], z = at<T>(p.z, row, ch, t);
      at<T>(dz, row, ch, t) = G * s.y[t] * sz * (T(1) + z * (T(1) - sz));
      dy = G * s.gate[t];
    }
    T gB = T(0), gAah = T(0);  // Σ_k g_t,k B_t,k and Σ_k g_t,k A_k a_t,k h_{t-1},k
#pragma omp simd reduction(+ : gB, gAah)
    for (int64_t k = 0; k < n; ++k) {
      const T a = std::exp(dt * A[k]), gk = dy * Ct[k] + g[k], P = gk * a * hp[k];
      gB += gk * Bt[k];
      gAah += A[k] * P;
      dA_c[k] += dt * P;
      dBt[k] += gk * dt * x;
      dCt[k] += dy * ht[k];
      g[k] = a * gk;
    }
    const T ddt = (x * gB + gAah) * s.dsp[t];
    at<T>(du, row, ch, t) = Dc * dy + dt * gB;
    at<T>(ddelta, row, ch, t) = ddt;
    dD_c += dy * x;
    dbias_c += ddt;
  }
  std::copy(dA_c, dA_c + n, dA + ch * n);
  dD[ch] = dD_c;
  dbias[ch] = dbias_c;
}

template <typename T> void forward_cpu(const Problem& p, const Strided& out) {
  at::parallel_for(0, p.b * p.d, 1, [&](int64_t begin, int64_t end) {
    Series<T> s(p.l);
    for (int64_t task = begin; task < end; ++task)
      forward_channel<T>(p, out, task / p.d, task % p.d, s);
  });
}

// dA_b (b, d, n), dD_b and dbias_b (b, d): per row, summed by the caller; dB and dC (b, l, n).
template <typename T>
void backward_cpu(const Problem& p, const Strided& dout, const Strided& du, const Strided& ddelta,
                  const Strided& dz, T* dA_b, T* dB, T* dC, T* dD_b, T* dbias_b) {
  const int64_t d = p.d, l = p.l, n = p.n;
  at::parallel_for(0, p.b, 1, [&](int64_t begin, int64_t end) {
    Series<T> s(l);
    std::vector<T> H((l + 1) * n);
    for (int64_t row = begin; row < end; ++row) {
      std::fill(dB + row * l * n, dB + (row + 1) * l * n, T(0));
      std::fill(dC + row * l * n, dC + (row + 1) * l * n, T(0));
      for (int64_t ch = 0; ch < d; ++ch)
        backward_channel<T>(p, dout, du, ddelta, dz, dA_b + row * d * n, dB + row * l * n,
                            dC + row * l * n, dD_b + row * d, dbias_b + row * d, row, ch, s,
                            H.data());
    }
  });
}

Strided strided(const torch::Tensor& x) {
  return {x.data_ptr(), x.stride(0), x.stride(1), x.stride(2)};
}
const void* data(const std::optional<torch::Tensor>& x) { return x ? x->data_ptr() : nullptr; }

// The inputs as both kernels take them; each way to get them wrong has its own line.
Problem problem(const torch::Tensor& u, const torch::Tensor& delta, const torch::Tensor& A,
                const torch::Tensor& B, const torch::Tensor& C,
                const std::optional<torch::Tensor>& D, const std::optional<torch::Tensor>& z,
                const std::optional<torch::Tensor>& bias, bool softplus) {
  TORCH_CHECK(u.dim() == 3 && delta.sizes() == u.sizes(), "u and delta must be (b, d, l) alike");
  const int64_t b = u.size(0), d = u.size(1), l = u.size(2), n = A.dim() == 2 ? A.size(1) : -1;
  TORCH_CHECK(A.dim() == 2 && A.size(0) == d && n <= kMaxState, "A must be (d, n), n <= 256");
  TORCH_CHECK(B.sizes() == torch::IntArrayRef({b, l, n}) && C.sizes() == B.sizes(),
              "B and C must be (b, l, n) = (", b, ", ", l, ", ", n, "), got ", B.sizes(),
              C.sizes());
  TORCH_CHECK(A.is_contiguous() && B.is_contiguous() && C.is_contiguous(),
              "A, B and C must be contiguous");
  for (const auto* v : {&D, &bias})
    TORCH_CHECK(!*v || ((*v)->sizes() == torch::IntArrayRef({d}) && (*v)->is_contiguous()),
                "D and delta_bias must be contiguous (d,) vectors");
  TORCH_CHECK(!z || z->sizes() == u.sizes(), "z must have u's shape");
  for (const auto& t : {delta, A, B, C, D ? *D : u, z ? *z : u, bias ? *bias : u})
    TORCH_CHECK(t.scalar_type() == u.scalar_type() && t.device() == u.device(),
                "all inputs must have u's dtype and device");
  return {strided(u), strided(delta), z ? strided(*z) : Strided{}, A.data_ptr(), B.data_ptr(),
          C.data_ptr(), data(D), data(bias), softplus, b, d, l, n};
}

}  // namespace

#ifdef WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
void* stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
void launched(const char* error) { TORCH_CHECK(!error, "selective scan CUDA kernel: ", error); }
#define CUDA_OR_FAIL(call) launched(call)
#else
#define CUDA_OR_FAIL(call) TORCH_CHECK(false, "this build of the scan extension has no CUDA kernel")
#endif

torch::Tensor fwd(torch::Tensor u, torch::Tensor delta, torch::Tensor A, torch::Tensor B,
                  torch::Tensor C, std::optional<torch::Tensor> D, std::optional<torch::Tensor> z,
                  std::optional<torch::Tensor> delta_bias, bool delta_softplus) {
  const Problem p = problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus);
  auto out = torch::empty_like(u);
  const bool fp64 = u.scalar_type() == torch::kDouble;
  if (u.is_cuda()) {
#ifdef WITH_CUDA
    const c10::cuda::CUDAGuard guard(u.device());
#endif
    CUDA_OR_FAIL(scan::forward_cuda(p, strided(out), fp64, stream()));
  } else {
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_fwd",
                               [&] { forward_cpu<scalar_t>(p, strided(out)); });
  }
  return out;
}

// du, ddelta, dA, dB (b, l, n), dC (b, l, n), dD, dz, ddelta_bias (undefined where not given).
std::vector<torch::Tensor> bwd(torch::Tensor dout, torch::Tensor u, torch::Tensor delta,
                               torch::Tensor A, torch::Tensor B, torch::Tensor C,
                               std::optional<torch::Tensor> D, std::optional<torch::Tensor> z,
                               std::optional<torch::Tensor> delta_bias, bool delta_softplus) {
  const Problem p = problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus);
  TORCH_CHECK(dout.sizes() == u.sizes() && dout.scalar_type() == u.scalar_type() &&
              dout.device() == u.device(), "dout must have u's shape, dtype and device");
  const int64_t b = p.b, d = p.d, l = p.l, n = p.n;
  const auto opts = u.options();
  auto du = torch::empty_like(u), ddelta = torch::empty_like(delta);
  auto dz = z ? torch::empty_like(*z) : torch::Tensor();
  auto dD_b = torch::empty({b, d}, opts), dbias_b = torch::empty({b, d}, opts);  // per row
  torch::Tensor dA, dB, dC;
  const Strided dz_s = dz.defined() ? strided(dz) : Strided{};
  if (u.is_cuda()) {  // per-channel partial sums, (b, l, n, d), reduced here
#ifdef WITH_CUDA
    const c10::cuda::CUDAGuard guard(u.device());
#endif
    auto dA_b = torch::empty({b, n, d}, opts), dB_bd = torch::empty({b, l, n, d}, opts);
    auto dC_bd = torch::empty_like(dB_bd), H = torch::empty_like(dB_bd);
    CUDA_OR_FAIL(scan::backward_cuda(p, strided(dout), strided(du), strided(ddelta), dz_s,
                                     dA_b.data_ptr(), dB_bd.data_ptr(), dC_bd.data_ptr(),
                                     dD_b.data_ptr(), dbias_b.data_ptr(), H.data_ptr(),
                                     u.scalar_type() == torch::kDouble, stream()));
    dA = dA_b.sum(0).t().contiguous();
    dB = dB_bd.sum(-1);
    dC = dC_bd.sum(-1);
  } else {
    auto dA_b = torch::empty({b, d, n}, opts);  // the kernel writes every entry of these
    dB = torch::empty({b, l, n}, opts);
    dC = torch::empty({b, l, n}, opts);
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_bwd", [&] {
      backward_cpu<scalar_t>(p, strided(dout), strided(du), strided(ddelta), dz_s,
                             dA_b.data_ptr<scalar_t>(), dB.data_ptr<scalar_t>(),
                             dC.data_ptr<scalar_t>(), dD_b.data_ptr<scalar_t>(),
                             dbias_b.data_ptr<scalar_t>());
    });
    dA = dA_b.sum(0);
  }
  return {du, ddelta, dA, dB, dC, D ? dD_b.sum(0) : torch::Tensor(), dz,
          delta_bias ? dbias_b.sum(0) : torch::Tensor()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd, "selective scan forward");
  m.def("bwd", &bwd, "selective scan backward");
  m.def("max_threads", [] { return at::get_num_threads(); }, "threads at::parallel_for may use");
#ifdef _OPENMP
  m.def("openmp", [] { return true; }, "whether at::parallel_for runs on OpenMP threads");
#else
  m.def("openmp", [] { return false; }, "whether at::parallel_for runs on OpenMP threads");
#endif
#ifdef WITH_CUDA
  m.def("has_cuda", [] { return true; }, "whether this build has the CUDA kernel");
#else
  m.def("has_cuda", [] { return false; }, "whether this build has the CUDA kernel");
#endif
}
