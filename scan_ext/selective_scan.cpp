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
// (B, L, N) contiguous; A is (D, N) contiguous.
//
// Vectorisation: a task owns W neighbouring channels d (W = one 64-byte vector: 16 floats or 8
// doubles) and keeps their states h[n][w] side by side, so every step of the recurrence is a
// vector operation across channels: one vector exp per (t, n), no horizontal sums in the
// time loop, and Δ, SiLU(z) and softplus' derivative come out of vector loops too.
//
// Parallelism and determinism: the forward runs one task per (b, channel block). The backward runs
// one task per batch row b, so that dB[b] and dC[b] (sums over channels) belong to one task; dA, dD
// and d(bias) (sums over b) are written per b and summed afterwards in a fixed order. Results do not
// depend on the number of threads. at::parallel_for uses OpenMP only if compiled with -fopenmp.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kMaxState = 256;  // as upstream: d_state <= 256

// exp for the decays a = exp(Δ A) in the time loops, the kernel's hottest call. For float: the usual
// range reduction x = k ln2 + r with |r| <= ln2/2, a degree-7 polynomial for e^r, and 2^k written
// into the exponent bits; relative error ~1e-7 (float's own precision), 0 below -87 (where expf
// would return denormals), and inlined into the vector loops, ~3x faster than the library call.
template <typename T> inline T exp_(T x) { return std::exp(x); }
template <> inline float exp_<float>(float x) {
  const float xc = std::fmin(std::fmax(x, -87.0f), 88.0f);
  const float k = std::nearbyint(xc * 1.44269504088896341f);             // round(x / ln 2)
  float r = std::fma(k, -0.693359375f, xc);                              // x - k ln2, in two parts
  r = std::fma(k, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;                                            // e^r = 1 + r + r^2 p(r)
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;          // 2^k
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

// log(1 + y) for y >= 0, for softplus(x) = log(1 + e^x). For float, inlined like exp_ (the library's
// vector log1p costs as much as the whole recurrence at N = 4): 1 + y = 2^k m with m in [√½, √2),
// log(1 + y) = k ln 2 + 2 atanh(s) = k ln 2 + 2 (s + s^3/3 + ... + s^9/9) with s = (m - 1)/(m + 1),
// |s| <= 0.172 (error below 1e-9). When k = 0, s = y / (2 + y) instead: taking it from the rounded
// 1 + y would lose y's low bits (measured: relative errors up to 6e-4 in softplus).
template <typename T> inline T log1p_(T y) { return std::log1p(y); }
template <> inline float log1p_<float>(float y) {
  const float x = 1.0f + y;
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int32_t shifted = bits - 0x3f3504f3;                             // 0x3f3504f3 = √½
  const int32_t k = shifted >> 23;                                       // exponent, m in [√½, √2)
  const int32_t mbits = (shifted & 0x007fffff) + 0x3f3504f3;
  float m;
  std::memcpy(&m, &mbits, sizeof m);
  const float s = k == 0 ? y / (2.0f + y) : (m - 1.0f) / (m + 1.0f), s2 = s * s;
  float p = 2.0f / 9.0f;
  p = std::fma(p, s2, 2.0f / 7.0f);
  p = std::fma(p, s2, 2.0f / 5.0f);
  p = std::fma(p, s2, 2.0f / 3.0f);
  p = std::fma(p, s2, 2.0f);
  return std::fma(static_cast<float>(k), 0.693147180559945f, s * p);
}

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

// The time series of one block of W channels (d0 .. d0+nw-1) of batch row b, channel-minor:
// x[t*W + w] = u_t of channel d0+w, and so on. Lanes w >= nw are zero and never written back.
template <typename T>
struct Block {
  static constexpr int64_t W = 64 / sizeof(T);
  int64_t b = 0, d0 = 0, nw = 0, L = 0;
  std::vector<T> x, dt, dsp, z, sz, gate;  // u, Δ, dΔ/d(delta), z, σ(z), SiLU(z)
  std::vector<T> At, Dv;                   // At[n*W + w] = A[d0+w, n]; Dv[w] = D[d0+w]
  explicit Block(int64_t L_) : L(L_), x(L_ * W), dt(L_ * W), dsp(L_ * W), z(L_ * W), sz(L_ * W),
                               gate(L_ * W), At(kMaxState * W), Dv(W) {}

  // Copies between a (B, D, L) tensor and the block. The channel stride is 1 in Mamba's layout,
  // where a block's W channels at one step are contiguous: then the copies are vector moves.
  void gather(const BDL<T>& src, T* dst) const {
    const T* p = &src(b, d0, 0);
    for (int64_t t = 0; t < L; ++t, p += src.sl) {
      if (src.sd == 1 && nw == W) {
        // Mamba's layout puts steps a row of D channels apart, too far for the hardware prefetcher
        // to follow: ask for the next block's cache line now, so its gather finds it in the cache
        __builtin_prefetch(p + W);
        std::copy(p, p + W, dst + t * W);
      }
      else for (int64_t w = 0; w < W; ++w) dst[t * W + w] = w < nw ? p[w * src.sd] : T(0);
    }
  }
  void scatter(const T* src, const BDL<T>& dst) const {
    T* p = &dst(b, d0, 0);
    for (int64_t t = 0; t < L; ++t, p += dst.sl) {
      if (dst.sd == 1 && nw == W) std::copy(src + t * W, src + t * W + W, p);  // inlined: W is fixed
      else if (dst.sd == 1) std::copy(src + t * W, src + t * W + nw, p);
      else for (int64_t w = 0; w < nw; ++w) p[w * dst.sd] = src[t * W + w];
    }
  }

  void load(const Args<T>& a, int64_t b_, int64_t d0_) {
    b = b_; d0 = d0_; nw = std::min<int64_t>(W, a.Dim - d0);
    const int64_t N = a.N;
    T bias[W];
    for (int64_t w = 0; w < W; ++w) {
      const bool on = w < nw;
      for (int64_t n = 0; n < N; ++n) At[n * W + w] = on ? a.A[(d0 + w) * N + n] : T(0);
      Dv[w] = on && a.D ? a.D[d0 + w] : T(0);
      bias[w] = on && a.bias ? a.bias[d0 + w] : T(0);
    }
    gather(a.u, x.data());
    gather(a.delta, dt.data());
#pragma omp simd
    for (int64_t i = 0; i < L * W; ++i) dt[i] += bias[i % W];
    if (a.softplus_) {  // Δ = softplus(pre) (= pre above 20); dΔ/dpre = σ(pre) (1 above 20)
#pragma omp simd
      for (int64_t i = 0; i < L * W; ++i) {
        const T pre = dt[i], e = exp_(pre);
        dsp[i] = pre <= T(20) ? e / (T(1) + e) : T(1);
        dt[i] = pre <= T(20) ? log1p_(e) : pre;
      }
    }
    if (a.z) {
      gather(*a.z, z.data());
#pragma omp simd
      for (int64_t i = 0; i < L * W; ++i) { sz[i] = T(1) / (T(1) + exp_(-z[i])); gate[i] = z[i] * sz[i]; }
    }
  }
};

template <typename T>
void forward_kernel(const Args<T>& a, const BDL<T>& out) {
  constexpr int64_t W = Block<T>::W;
  const int64_t N = a.N, L = a.L, blocks = (a.Dim + W - 1) / W;
  at::parallel_for(0, a.Bsz * blocks, 1, [&](int64_t begin, int64_t end) {
    Block<T> blk(L);
    std::vector<T> h(kMaxState * W), y(L * W);
    for (int64_t task = begin; task < end; ++task) {
      blk.load(a, task / blocks, task % blocks * W);
      const int64_t b = blk.b;
      std::fill(h.begin(), h.begin() + N * W, T(0));
      for (int64_t t = 0; t < L; ++t) {
        const T* dt = &blk.dt[t * W];
        const T* x = &blk.x[t * W];
        const T* Bt = a.B + (b * L + t) * N;
        const T* Ct = a.C + (b * L + t) * N;
        // y_t accumulates in a local vector, i.e. in a register: accumulated in y[] in memory, every
        // step over n would wait for the previous one's store to come back from the cache
        T yt[W];
#pragma omp simd
        for (int64_t w = 0; w < W; ++w) yt[w] = blk.Dv[w] * x[w];    // D u_t
        for (int64_t n = 0; n < N; ++n) {
          T* hn = &h[n * W];
          const T* An = &blk.At[n * W];
          // h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t ;  y_t += C_t,n h_t,n   (W channels at once)
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) {
            hn[w] = exp_(dt[w] * An[w]) * hn[w] + dt[w] * x[w] * Bt[n];
            yt[w] += Ct[n] * hn[w];
          }
        }
        const T* gate = &blk.gate[t * W];
#pragma omp simd
        for (int64_t w = 0; w < W; ++w) y[t * W + w] = a.z ? yt[w] * gate[w] : yt[w];  // ⊙ SiLU(z_t)
      }
      blk.scatter(y.data(), out);
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
// Two passes per block of channels. The first recomputes the forward pass and does everything that
// needs h_t but not g_t: y_t (hence dz_t and dy_t), dD and dC. It keeps h_t and a_t for the adjoint
// sweep, so h_{t-1} is never recovered by dividing by a_t (which underflows to 0 for fast-decaying
// channels).
template <typename T>
void backward_kernel(const Args<T>& a, const BDL<T>& dout, const BDL<T>& du, const BDL<T>& ddelta,
                     const std::optional<BDL<T>>& dz, T* dA_b, T* dB, T* dC, T* dD_b, T* dbias_b) {
  constexpr int64_t W = Block<T>::W;
  const int64_t N = a.N, L = a.L, Dim = a.Dim;
  at::parallel_for(0, a.Bsz, 1, [&](int64_t begin, int64_t end) {
    Block<T> blk(L);
    // channel-minor scratch: H[((t + 1) N + n) W + w] = h_t (row t = -1 is zeros), Abar[(t N + n) W + w]
    // = a_t, the per-lane partial sums of dB and dC (reduced over lanes once per batch row), and the
    // block's gradients
    std::vector<T> H((L + 1) * N * W), Abar(L * N * W), dBw(L * N * W), dCw(L * N * W);
    std::vector<T> g(N * W), dA(N * W), dy(L * W), du_b(L * W), ddelta_b(L * W), dz_b(L * W);
    for (int64_t b = begin; b < end; ++b) {
      std::fill(dBw.begin(), dBw.end(), T(0));
      std::fill(dCw.begin(), dCw.end(), T(0));
      for (int64_t d0 = 0; d0 < Dim; d0 += W) {
        blk.load(a, b, d0);
        blk.gather(dout, dy.data());                 // G, turned into dy below
        std::fill(H.begin(), H.begin() + N * W, T(0));
        T dD[W] = {}, dbias[W] = {};
        for (int64_t t = 0; t < L; ++t) {            // pass 1: forward, with dy, dz, dD and dC
          const T* dt = &blk.dt[t * W];
          const T* x = &blk.x[t * W];
          const T* Bt = a.B + (b * L + t) * N;
          const T* Ct = a.C + (b * L + t) * N;
          T* dyt = &dy[t * W];
          T y[W];
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) y[w] = blk.Dv[w] * x[w];
          for (int64_t n = 0; n < N; ++n) {
            const T* hp = &H[(t * N + n) * W];
            T* ht = &H[((t + 1) * N + n) * W];
            T* at = &Abar[(t * N + n) * W];
            const T* An = &blk.At[n * W];
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) {
              at[w] = exp_(dt[w] * An[w]);
              ht[w] = at[w] * hp[w] + dt[w] * x[w] * Bt[n];
              y[w] += Ct[n] * ht[w];
            }
          }
          if (a.z) {
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) {
              const T s = blk.sz[t * W + w], zt = blk.z[t * W + w];
              dz_b[t * W + w] = dyt[w] * y[w] * s * (T(1) + zt * (T(1) - s));
              dyt[w] *= blk.gate[t * W + w];
            }
          }
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) dD[w] += dyt[w] * x[w];
          for (int64_t n = 0; n < N; ++n) {
            const T* hn = &H[((t + 1) * N + n) * W];
            T* dCn = &dCw[(t * N + n) * W];
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) dCn[w] += dyt[w] * hn[w];
          }
        }
        std::fill(g.begin(), g.end(), T(0));  // g[n][w] holds a_{t+1} g_{t+1}
        std::fill(dA.begin(), dA.end(), T(0));
        for (int64_t t = L - 1; t >= 0; --t) {       // pass 2: the adjoint sweep
          const T* dt = &blk.dt[t * W];
          const T* x = &blk.x[t * W];
          const T* Bt = a.B + (b * L + t) * N;
          const T* Ct = a.C + (b * L + t) * N;
          const T* dyt = &dy[t * W];
          // with S = Σ_n g_t,n B_t,n and P_n = g_t,n a_t,n h_{t-1},n, both vectors over channels:
          //   du_t = D dy_t + Δ_t S,   dΔ_t = u_t S + Σ_n A_n P_n,   dA_n += Δ_t P_n,   dB_t,n += g_t,n Δ_t u_t
          T S[W] = {}, AP[W] = {}, dtx[W];
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) dtx[w] = dt[w] * x[w];
          for (int64_t n = 0; n < N; ++n) {
            const T* at = &Abar[(t * N + n) * W];
            const T* hp = &H[(t * N + n) * W];
            const T* An = &blk.At[n * W];
            T* gn = &g[n * W];
            T* dAn = &dA[n * W];
            T* dBn = &dBw[(t * N + n) * W];
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) {
              const T gt = dyt[w] * Ct[n] + gn[w];       // g_t
              const T P = gt * at[w] * hp[w];
              S[w] += gt * Bt[n];
              AP[w] += An[w] * P;
              dAn[w] += dt[w] * P;
              dBn[w] += gt * dtx[w];
              gn[w] = at[w] * gt;                        // a_t g_t, for step t-1
            }
          }
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) {
            const T ddt = x[w] * S[w] + AP[w];
            const T dd = a.softplus_ ? ddt * blk.dsp[t * W + w] : ddt;
            du_b[t * W + w] = blk.Dv[w] * dyt[w] + dt[w] * S[w];
            ddelta_b[t * W + w] = dd;
            dbias[w] += dd;
          }
        }
        blk.scatter(du_b.data(), du);
        blk.scatter(ddelta_b.data(), ddelta);
        if (a.z) blk.scatter(dz_b.data(), *dz);
        for (int64_t w = 0; w < blk.nw; ++w) {
          for (int64_t n = 0; n < N; ++n) dA_b[(b * Dim + d0 + w) * N + n] = dA[n * W + w];
          dD_b[b * Dim + d0 + w] = dD[w];
          dbias_b[b * Dim + d0 + w] = dbias[w];
        }
      }
      for (int64_t i = 0; i < L * N; ++i) {  // dB[b], dC[b]: the lane partial sums, added up
        T sb = T(0), sc = T(0);
        for (int64_t w = 0; w < W; ++w) { sb += dBw[i * W + w]; sc += dCw[i * W + w]; }
        dB[b * L * N + i] = sb;
        dC[b * L * N + i] = sc;
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

void check_optional(const torch::Tensor& u, const std::optional<torch::Tensor>& D,
                    const std::optional<torch::Tensor>& z, const std::optional<torch::Tensor>& bias) {
  for (const auto* v : {&D, &bias})
    if (*v) TORCH_CHECK((*v)->dim() == 1 && (*v)->size(0) == u.size(1) && (*v)->is_contiguous() &&
                        (*v)->scalar_type() == u.scalar_type() && (*v)->device() == u.device(),
                        "D and delta_bias must be contiguous (D,) vectors of u's dtype and device");
  if (z) TORCH_CHECK(z->sizes() == u.sizes() && z->scalar_type() == u.scalar_type() && z->device() == u.device(),
                     "z must have u's shape, dtype and device");
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
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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
  check_optional(u, D, z, delta_bias);
  auto out = torch::empty_like(u);
#ifdef WITH_CUDA
  if (u.is_cuda()) {
    const c10::cuda::CUDAGuard guard(u.device());
    cuda_scan::forward(problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus), strided(out),
                       u.scalar_type() == torch::kDouble, c10::cuda::getCurrentCUDAStream());
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
  check_optional(u, D, z, delta_bias);
  TORCH_CHECK(dout.sizes() == u.sizes() && dout.scalar_type() == u.scalar_type() && dout.device() == u.device(),
              "dout must have u's shape, dtype and device");
  const int64_t Bsz = u.size(0), Dim = u.size(1), L = u.size(2), N = A.size(1);
  const auto opts = u.options();
  auto du = torch::empty_like(u), ddelta = torch::empty_like(delta);
  auto dz = z ? torch::empty_like(*z) : torch::Tensor();
  auto dD_b = torch::empty({Bsz, Dim}, opts), dbias_b = torch::empty({Bsz, Dim}, opts);  // per-b partial sums
  torch::Tensor dA, dB, dC;
#ifdef WITH_CUDA
  if (u.is_cuda()) {  // per-channel partial sums in (B, L, N, D) layout, reduced here
    const c10::cuda::CUDAGuard guard(u.device());
    auto dA_b = torch::empty({Bsz, N, Dim}, opts);
    auto dB_bd = torch::empty({Bsz, L, N, Dim}, opts), dC_bd = torch::empty_like(dB_bd), H = torch::empty_like(dB_bd);
    cuda_scan::backward(problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus), strided(dout), strided(du),
                        strided(ddelta), dz.defined() ? strided(dz) : cuda_scan::Strided{}, dA_b.data_ptr(),
                        dB_bd.data_ptr(), dC_bd.data_ptr(), dD_b.data_ptr(), dbias_b.data_ptr(), H.data_ptr(),
                        u.scalar_type() == torch::kDouble, c10::cuda::getCurrentCUDAStream());
    dA = dA_b.sum(0).t().contiguous();
    dB = dB_bd.sum(-1);
    dC = dC_bd.sum(-1);
  } else
#endif
  {
    TORCH_CHECK(u.device().is_cpu(), "this build of the scan extension has no CUDA kernel");
    auto dA_b = torch::empty({Bsz, Dim, N}, opts);  // the kernel writes every entry of these
    dB = torch::empty({Bsz, L, N}, opts);
    dC = torch::empty({Bsz, L, N}, opts);
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
