// Mamba's selective scan on the CPU (and the binding of the optional CUDA kernel), as a torch
// extension that mech.py compiles on first use with torch.utils.cpp_extension.load.
//
// Semantics: mamba-ssm's selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py), real case.
// Per batch row b and channel d, with state h in R^N:
//
//     Δ_t   = softplus(delta_t + bias)            (softplus only if delta_softplus; x > 20 -> x)
//     a_t   = exp(Δ_t A)                          (A: one row of N per channel, negative)
//     h_t   = a_t ⊙ h_{t-1} + Δ_t u_t B_t         (h_{-1} = 0)
//     y_t   = C_t · h_t + D u_t
//     out_t = y_t · SiLU(z_t)                     (if z is given)
//
// Layouts: u, delta, z, out, dout are (B, D, L) with any strides (Mamba hands in transposed views
// of (B, L, D) tensors, and copying them would cost more than the scan); B and C come in as
// (B, L, N) contiguous, so that the innermost loop, over the state index n, is unit-stride and
// vectorises. A is (D, N) contiguous.
//
// Parallelism: the forward runs one task per (b, d) channel. The backward runs one task per batch
// row b: then dB[b] and dC[b] (sums over channels d) belong to one task, and dA, dD, d(bias) (sums
// over b) are written per b and summed afterwards in a fixed order, so results do not depend on
// the number of threads. at::parallel_for uses OpenMP only if this file is compiled with -fopenmp.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kMaxState = 256;  // as upstream: d_state <= 256

// Strided view of a (B, D, L) tensor.
template <typename T> struct BDL {
  T* p; int64_t sb, sd, sl;
  BDL(const torch::Tensor& x) : p(x.data_ptr<T>()), sb(x.stride(0)), sd(x.stride(1)), sl(x.stride(2)) {}
  T& operator()(int64_t b, int64_t d, int64_t t) const { return p[b * sb + d * sd + t * sl]; }
};

template <typename T>
struct Args {  // the inputs, shared by forward and backward
  BDL<T> u, delta;
  std::optional<BDL<T>> z;
  const T *A, *B, *C, *D, *bias;  // D and bias may be null
  bool softplus_;
  int64_t Bsz, Dim, L, N;
};

// Per-channel time series in contiguous buffers, so that the transcendental functions below run in
// vectorised loops (the strided loads are cheap; a scalar exp or log1p per step is not).
template <typename T>
struct Channel {
  std::vector<T> x, dt, dsp, gate, z, sz;  // u_t, Δ_t, dΔ/ddelta, SiLU(z_t), z_t, σ(z_t)
  explicit Channel(int64_t L) : x(L), dt(L), dsp(L), gate(L), z(L), sz(L) {}

  void load(const Args<T>& a, int64_t b, int64_t d) {
    const int64_t L = a.L;
    const T bias = a.bias ? a.bias[d] : T(0);
    for (int64_t t = 0; t < L; ++t) { x[t] = a.u(b, d, t); dt[t] = a.delta(b, d, t) + bias; }
    if (a.softplus_) {  // Δ = softplus(pre) (= pre above 20), dΔ/dpre = σ(pre)
#pragma omp simd
      for (int64_t t = 0; t < L; ++t) {
        const T pre = dt[t];
        dsp[t] = pre <= T(20) ? T(1) / (T(1) + std::exp(-pre)) : T(1);
        dt[t] = pre <= T(20) ? std::log1p(std::exp(pre)) : pre;
      }
    }
    if (a.z) {
      for (int64_t t = 0; t < L; ++t) z[t] = (*a.z)(b, d, t);
#pragma omp simd
      for (int64_t t = 0; t < L; ++t) { sz[t] = T(1) / (T(1) + std::exp(-z[t])); gate[t] = z[t] * sz[t]; }
    }
  }
};

template <typename T>
void forward_kernel(const Args<T>& a, const BDL<T>& out) {
  const int64_t N = a.N, L = a.L;
  at::parallel_for(0, a.Bsz * a.Dim, 8, [&](int64_t begin, int64_t end) {
    Channel<T> ch(L);
    T h[kMaxState];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / a.Dim, d = task % a.Dim;
      const T* A = a.A + d * N;
      ch.load(a, b, d);
      for (int64_t n = 0; n < N; ++n) h[n] = T(0);
      for (int64_t t = 0; t < L; ++t) {
        const T dt = ch.dt[t], x = ch.x[t];
        const T* Bt = a.B + (b * L + t) * N;
        const T* Ct = a.C + (b * L + t) * N;
        T y = T(0);
        // h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t ;  y_t = C_t · h_t
#pragma omp simd reduction(+ : y)
        for (int64_t n = 0; n < N; ++n) {
          h[n] = std::exp(dt * A[n]) * h[n] + dt * x * Bt[n];
          y += Ct[n] * h[n];
        }
        if (a.D) y += a.D[d] * x;          // + D u_t
        out(b, d, t) = a.z ? y * ch.gate[t] : y;  // ⊙ SiLU(z_t)
      }
    }
  });
}

// Backward. With G_t = ∂loss/∂out_t and s = σ(z_t):
//   dz_t = G_t y_t s (1 + z_t (1 - s)),   dy_t = G_t z_t s            (without z: dy_t = G_t)
//   dD  += dy_t u_t,                      du_t = D dy_t + Σ_n g_t,n Δ_t B_t,n
//   g_t  = dy_t C_t + a_{t+1} ⊙ g_{t+1}   the adjoint of h_t, swept from t = L-1 down to 0
//   dC_t += dy_t h_t                      dB_t += g_t Δ_t u_t          (summed over channels d)
//   dΔ_t = Σ_n g_t,n (B_t,n u_t + A_n a_t,n h_{t-1},n)
//   dA  += g_t Δ_t a_t ⊙ h_{t-1}
//   ddelta_t = dΔ_t σ(delta_t + bias) with softplus (1 above 20),   dbias += ddelta_t
// h_{t-1} is read from the states stored by a recomputed forward pass, never recovered by dividing
// by a_t (which underflows to 0 for fast-decaying channels).
template <typename T>
void backward_kernel(const Args<T>& a, const BDL<T>& dout, const BDL<T>& du, const BDL<T>& ddelta,
                     const std::optional<BDL<T>>& dz, T* dA_b, T* dB, T* dC, T* dD_b, T* dbias_b) {
  const int64_t N = a.N, L = a.L, Dim = a.Dim;
  at::parallel_for(0, a.Bsz, 1, [&](int64_t begin, int64_t end) {
    Channel<T> ch(L);
    std::vector<T> H((L + 1) * N);  // H[(t+1) N + n] = h_t,n, with a row of zeros for h_{-1}
    std::vector<T> Abar(L * N);     // a_t,n = exp(Δ_t A_n), kept from the recomputation
    T g[kMaxState];
    for (int64_t b = begin; b < end; ++b) {
      T* dBb = dB + b * L * N;
      T* dCb = dC + b * L * N;
      for (int64_t d = 0; d < Dim; ++d) {
        const T* A = a.A + d * N;
        const T Dd = a.D ? a.D[d] : T(0);
        T* dA = dA_b + (b * Dim + d) * N;
        ch.load(a, b, d);
        // recompute the forward pass for this channel, keeping every state
        for (int64_t n = 0; n < N; ++n) H[n] = T(0);
        for (int64_t t = 0; t < L; ++t) {
          const T dt = ch.dt[t], x = ch.x[t];
          const T* Bt = a.B + (b * L + t) * N;
          const T* hp = &H[t * N];
          T* ht = &H[(t + 1) * N];
          T* at = &Abar[t * N];
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) {
            at[n] = std::exp(dt * A[n]);
            ht[n] = at[n] * hp[n] + dt * x * Bt[n];
          }
        }
        for (int64_t n = 0; n < N; ++n) g[n] = T(0);  // holds a_{t+1} g_{t+1}
        T dD = T(0), dbias = T(0);
        for (int64_t t = L - 1; t >= 0; --t) {
          const T dt = ch.dt[t], x = ch.x[t], G = dout(b, d, t);
          const T* Bt = a.B + (b * L + t) * N;
          const T* Ct = a.C + (b * L + t) * N;
          const T* hp = &H[t * N];
          const T* ht = &H[(t + 1) * N];
          const T* at = &Abar[t * N];
          T dy = G;
          if (a.z) {
            T y = Dd * x;
#pragma omp simd reduction(+ : y)
            for (int64_t n = 0; n < N; ++n) y += Ct[n] * ht[n];
            const T s = ch.sz[t];
            (*dz)(b, d, t) = G * y * s * (T(1) + ch.z[t] * (T(1) - s));
            dy = G * ch.gate[t];
          }
          dD += dy * x;
          T du_t = Dd * dy, ddt = T(0);
#pragma omp simd reduction(+ : du_t, ddt)
          for (int64_t n = 0; n < N; ++n) {
            const T gn = dy * Ct[n] + g[n];              // g_t
            dCb[t * N + n] += dy * ht[n];
            dBb[t * N + n] += gn * dt * x;
            du_t += gn * dt * Bt[n];
            ddt += gn * (Bt[n] * x + A[n] * at[n] * hp[n]);
            dA[n] += gn * dt * at[n] * hp[n];
            g[n] = at[n] * gn;                           // a_t g_t, for step t-1
          }
          du(b, d, t) = du_t;
          if (a.softplus_) ddt *= ch.dsp[t];
          ddelta(b, d, t) = ddt;
          dbias += ddt;
        }
        dD_b[b * Dim + d] = dD;
        dbias_b[b * Dim + d] = dbias;
      }
    }
  });
}

void check_inputs(const torch::Tensor& u, const torch::Tensor& delta, const torch::Tensor& A,
                  const torch::Tensor& B, const torch::Tensor& C) {
  TORCH_CHECK(u.dim() == 3 && delta.sizes() == u.sizes(), "u and delta must be (B, D, L) of the same shape");
  TORCH_CHECK(A.dim() == 2 && A.size(0) == u.size(1) && A.is_contiguous(), "A must be contiguous (D, N)");
  TORCH_CHECK(A.size(1) <= kMaxState, "d_state must be <= 256");
  TORCH_CHECK(B.dim() == 3 && B.size(0) == u.size(0) && B.size(1) == u.size(2) && B.size(2) == A.size(1) &&
              B.is_contiguous() && C.sizes() == B.sizes() && C.is_contiguous(),
              "B and C must be contiguous (B, L, N)");
  for (const auto* t : {&delta, &A, &B, &C})
    TORCH_CHECK(t->scalar_type() == u.scalar_type() && t->device() == u.device(),
                "all inputs must share u's dtype and device");
}

template <typename T>
Args<T> make_args(const torch::Tensor& u, const torch::Tensor& delta, const torch::Tensor& A,
                  const torch::Tensor& B, const torch::Tensor& C, const std::optional<torch::Tensor>& D,
                  const std::optional<torch::Tensor>& z, const std::optional<torch::Tensor>& bias, bool sp) {
  return Args<T>{BDL<T>(u), BDL<T>(delta),
                 z ? std::optional<BDL<T>>(BDL<T>(*z)) : std::nullopt,
                 A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
                 D ? D->data_ptr<T>() : nullptr, bias ? bias->data_ptr<T>() : nullptr, sp,
                 u.size(0), u.size(1), u.size(2), A.size(1)};
}

}  // namespace

#ifdef WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include "selective_scan_cuda.h"

namespace {
cuda_scan::Strided strided(const torch::Tensor& x) { return {x.data_ptr(), x.stride(0), x.stride(1), x.stride(2)}; }

cuda_scan::Problem problem(const torch::Tensor& u, const torch::Tensor& delta, const torch::Tensor& A,
                           const torch::Tensor& B, const torch::Tensor& C, const std::optional<torch::Tensor>& D,
                           const std::optional<torch::Tensor>& z, const std::optional<torch::Tensor>& bias, bool sp) {
  return {strided(u), strided(delta), z ? strided(*z) : cuda_scan::Strided{}, A.data_ptr(), B.data_ptr(),
          C.data_ptr(), D ? D->data_ptr() : nullptr, bias ? bias->data_ptr() : nullptr, sp,
          u.size(0), u.size(1), u.size(2), A.size(1)};
}
}  // namespace
#endif

torch::Tensor fwd(torch::Tensor u, torch::Tensor delta, torch::Tensor A, torch::Tensor B, torch::Tensor C,
                  std::optional<torch::Tensor> D, std::optional<torch::Tensor> z,
                  std::optional<torch::Tensor> delta_bias, bool delta_softplus) {
  check_inputs(u, delta, A, B, C);
  auto out = torch::empty_like(u);
#ifdef WITH_CUDA
  if (u.is_cuda()) {
    cuda_scan::forward(problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus), strided(out),
                       u.scalar_type() == torch::kDouble, at::cuda::getCurrentCUDAStream());
    return out;
  }
#endif
  TORCH_CHECK(u.device().is_cpu(), "this build of the scan extension has no CUDA kernel");
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_fwd", [&] {
    forward_kernel<scalar_t>(make_args<scalar_t>(u, delta, A, B, C, D, z, delta_bias, delta_softplus),
                             BDL<scalar_t>(out));
  });
  return out;
}

// Returns du, ddelta, dA, dB, dC, dD, dz, ddelta_bias (the last three undefined when not applicable).
std::vector<torch::Tensor> bwd(torch::Tensor dout, torch::Tensor u, torch::Tensor delta, torch::Tensor A,
                               torch::Tensor B, torch::Tensor C, std::optional<torch::Tensor> D,
                               std::optional<torch::Tensor> z, std::optional<torch::Tensor> delta_bias,
                               bool delta_softplus) {
  check_inputs(u, delta, A, B, C);
  TORCH_CHECK(dout.sizes() == u.sizes(), "dout must have u's shape");
  const int64_t Bsz = u.size(0), Dim = u.size(1), L = u.size(2), N = A.size(1);
  const auto opts = u.options();
  auto du = torch::empty_like(u), ddelta = torch::empty_like(delta);
  auto dz = z ? torch::empty_like(*z) : torch::Tensor();
  auto dD_b = torch::empty({Bsz, Dim}, opts), dbias_b = torch::empty({Bsz, Dim}, opts);  // per-b partial sums
  torch::Tensor dA, dB, dC;
#ifdef WITH_CUDA
  if (u.is_cuda()) {  // per-channel partial sums in (B, L, N, D) layout, reduced here
    auto dA_b = torch::empty({Bsz, N, Dim}, opts);
    auto dB_bd = torch::empty({Bsz, L, N, Dim}, opts), dC_bd = torch::empty_like(dB_bd), H = torch::empty_like(dB_bd);
    cuda_scan::backward(problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus), strided(dout), strided(du),
                        strided(ddelta), dz.defined() ? strided(dz) : cuda_scan::Strided{}, dA_b.data_ptr(),
                        dB_bd.data_ptr(), dC_bd.data_ptr(), dD_b.data_ptr(), dbias_b.data_ptr(), H.data_ptr(),
                        u.scalar_type() == torch::kDouble, at::cuda::getCurrentCUDAStream());
    dA = dA_b.sum(0).t().contiguous();
    dB = dB_bd.sum(-1);
    dC = dC_bd.sum(-1);
  } else
#endif
  {
    TORCH_CHECK(u.device().is_cpu(), "this build of the scan extension has no CUDA kernel");
    auto dA_b = torch::zeros({Bsz, Dim, N}, opts);
    dB = torch::zeros({Bsz, L, N}, opts);
    dC = torch::zeros({Bsz, L, N}, opts);
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "selective_scan_bwd", [&] {
      std::optional<BDL<scalar_t>> dz_view;
      if (dz.defined()) dz_view = BDL<scalar_t>(dz);
      backward_kernel<scalar_t>(make_args<scalar_t>(u, delta, A, B, C, D, z, delta_bias, delta_softplus),
                                BDL<scalar_t>(dout), BDL<scalar_t>(du), BDL<scalar_t>(ddelta), dz_view,
                                dA_b.data_ptr<scalar_t>(), dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                                dD_b.data_ptr<scalar_t>(), dbias_b.data_ptr<scalar_t>());
    });
    dA = dA_b.sum(0);
  }
  return {du, ddelta, dA, dB, dC, D ? dD_b.sum(0) : torch::Tensor(), dz,
          delta_bias ? dbias_b.sum(0) : torch::Tensor()};
}

int max_threads() { return at::get_num_threads(); }

bool has_cuda() {
#ifdef WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd, "selective scan forward");
  m.def("bwd", &bwd, "selective scan backward");
  m.def("max_threads", &max_threads, "threads at::parallel_for may use");
  m.def("openmp", &openmp, "whether this build runs at::parallel_for on OpenMP threads");
  m.def("has_cuda", &has_cuda, "whether this build has the CUDA kernel");
}
