// Mamba's selective scan on the CPU (selective_scan_cuda.cu is the GPU's, binding.cpp the torch
// binding of both). scan_ext/__init__.py compiles these files on first use.
//
// The same shape as the CUDA kernel, whose threads each own one (b, d) channel: here a vector
// lane owns one channel. A task takes a group of G neighbouring channels (one 64-byte vector: 16
// floats or 8 doubles) and runs them in lock-step, sequential over time, every statement a loop
// over the G lanes under `omp simd`; lane w keeps its channel's state in h[k][w]. There are no
// sums across lanes in the time loop, and exp is the library's vector exp (-O3 -ffast-math
// -fopenmp: glibc's libmvec). Per channel (mamba-ssm's selective_scan_ref, real A, B, C per
// token), with G_t = ∂loss/∂out_t and g_t = ∂loss/∂h_t:
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
// number of threads, the backward runs one task per batch row: its groups add dB and dC into
// per-lane sums, added over the lanes once per row; dA, dD and dbias are written per row, for torch
// to sum. The backward keeps the forward's h_t and a_t (measured: 1.1-1.5x faster than recomputing
// the exps at l 400-1024).
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>
#include "selective_scan.h"

namespace scan {
namespace {

template <typename T> constexpr int64_t G = 64 / sizeof(T);  // channels per group, lanes

template <typename T> T* at(const Strided& s, int64_t row, int64_t ch) {  // the (row, ch) series
  return static_cast<T*>(s.p) + row * s.sb + ch * s.sd;
}
template <typename T> const T* cptr(const void* p) { return static_cast<const T*>(p); }

// One group's series, lane-minor: x[t G + w] = u_t of channel d0 + w, and so on. The lanes past
// the last channel (a tail group, nw < G) read zeros (A, D, bias: the last channel's) and are
// never written back.
template <typename T> struct Group {
  static constexpr int64_t W = G<T>;
  int64_t row = 0, d0 = 0, nw = 0, l, n;
  std::vector<T> x, dt, dsp, gate, sz, z, A, D;  // A[k W + w] = A of channel d0 + w, D[w]
  Group(int64_t l_, int64_t n_)
      : l(l_), n(n_), x(l * W), dt(l * W), dsp(l * W), gate(l * W), sz(l * W), z(l * W),
        A(n * W), D(W) {}
  void gather(const Strided& s, T* dst) const {  // a (b, d, l) tensor's G channels, all t
    const T* p = at<T>(s, row, d0);
    for (int64_t t = 0; t < l; ++t)
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) dst[t * W + w] = w < nw ? p[t * s.sl + w * s.sd] : T(0);
  }
  void scatter(const T* src, const Strided& s) const {
    T* p = at<T>(s, row, d0);
    for (int64_t t = 0; t < l; ++t)
      for (int64_t w = 0; w < nw; ++w) p[t * s.sl + w * s.sd] = src[t * W + w];
  }
  void load(const Problem& p, int64_t row_, int64_t d0_) {
    row = row_, d0 = d0_, nw = std::min(W, p.d - d0);
    T bias[W];
    for (int64_t w = 0; w < W; ++w) {
      const int64_t ch = std::min(d0 + w, p.d - 1);  // a tail group's spare lanes copy the last
      for (int64_t k = 0; k < n; ++k) A[k * W + w] = cptr<T>(p.A)[ch * n + k];
      D[w] = p.D ? cptr<T>(p.D)[ch] : T(0);
      bias[w] = p.bias ? cptr<T>(p.bias)[ch] : T(0);
    }
    gather(p.u, x.data());
    gather(p.delta, dt.data());
#pragma omp simd
    for (int64_t i = 0; i < l * W; ++i) {
      const T pre = dt[i] + bias[i % W], e = std::exp(std::min(pre, T(20)));
      dt[i] = p.softplus && pre <= T(20) ? std::log1p(e) : pre;
      dsp[i] = p.softplus && pre <= T(20) ? e / (T(1) + e) : T(1);
    }
    if (!p.z.p) return;
    gather(p.z, z.data());
#pragma omp simd
    for (int64_t i = 0; i < l * W; ++i) sz[i] = T(1) / (T(1) + std::exp(-z[i]));
#pragma omp simd
    for (int64_t i = 0; i < l * W; ++i) gate[i] = z[i] * sz[i];
  }
};

// y[t G + w] = y_t of lane w. With keep, H[((t + 1) n + k) G + w] = h_t,k (row t = -1 the zeros of
// h_{-1}) and E[(t n + k) G + w] = a_t,k; else H holds only the current h_t and E is not used.
template <typename T, bool keep> void recur(const Problem& p, const Group<T>& g, T* y, T* H, T* E) {
  constexpr int64_t W = G<T>;
  const int64_t n = p.n;
  std::fill(H, H + n * W, T(0));
  for (int64_t t = 0; t < p.l; ++t) {
    const T *dt = &g.dt[t * W], *x = &g.x[t * W];
    const T *Bt = cptr<T>(p.B) + (g.row * p.l + t) * n, *Ct = cptr<T>(p.C) + (g.row * p.l + t) * n;
    T yt[W];  // in a register: y[] in memory would make each k wait for the last one's store
#pragma omp simd
    for (int64_t w = 0; w < W; ++w) yt[w] = g.D[w] * x[w];
    for (int64_t k = 0; k < n; ++k) {
      const T *A = &g.A[k * W], *hp = H + (keep * t * n + k) * W;
      T *ht = H + (keep * (t + 1) * n + k) * W, *a = E + keep * (t * n + k) * W;
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) {
        const T ak = std::exp(dt[w] * A[w]);
        if (keep) a[w] = ak;
        ht[w] = ak * hp[w] + dt[w] * x[w] * Bt[k];
        yt[w] += Ct[k] * ht[w];
      }
    }
#pragma omp simd
    for (int64_t w = 0; w < W; ++w) y[t * W + w] = yt[w];
  }
}

template <typename T> void forward(const Problem& p, const Strided& out) {
  constexpr int64_t W = G<T>;
  const int64_t groups = (p.d + W - 1) / W;
  at::parallel_for(0, p.b * groups, 1, [&](int64_t begin, int64_t end) {
    Group<T> g(p.l, p.n);
    std::vector<T> y(p.l * W), h(p.n * W);
    for (int64_t task = begin; task < end; ++task) {
      g.load(p, task / groups, task % groups * W);
      recur<T, false>(p, g, y.data(), h.data(), nullptr);
      if (p.z.p)
#pragma omp simd
        for (int64_t i = 0; i < p.l * W; ++i) y[i] *= g.gate[i];
      g.scatter(y.data(), out);
    }
  });
}

template <typename T>
void backward(const Problem& p, const Strided& dout, const Strided& du, const Strided& ddelta,
              const Strided& dz, void* dA_, void* dB_, void* dC_, void* dD_, void* dbias_) {
  constexpr int64_t W = G<T>;
  T *dA_b = static_cast<T*>(dA_), *dB = static_cast<T*>(dB_), *dC = static_cast<T*>(dC_);
  T *dD_b = static_cast<T*>(dD_), *dbias_b = static_cast<T*>(dbias_);
  const int64_t d = p.d, l = p.l, n = p.n;
  at::parallel_for(0, p.b, 1, [&](int64_t begin, int64_t end) {
    Group<T> g(l, n);
    std::vector<T> H((l + 1) * n * W), E(l * n * W), dBw(l * n * W), dCw(l * n * W);
    std::vector<T> y(l * W), dy(l * W), gs(n * W), dA(n * W), du_g(l * W), dd_g(l * W);
    for (int64_t row = begin; row < end; ++row) {
      std::fill(dBw.begin(), dBw.end(), T(0));
      std::fill(dCw.begin(), dCw.end(), T(0));
      for (int64_t d0 = 0; d0 < d; d0 += W) {
        g.load(p, row, d0);
        recur<T, true>(p, g, y.data(), H.data(), E.data());
        g.gather(dout, dy.data());  // G_t, made dy_t
        if (p.z.p)
#pragma omp simd
          for (int64_t i = 0; i < l * W; ++i) {
            const T s = g.sz[i];
            y[i] = dy[i] * y[i] * s * (T(1) + g.z[i] * (T(1) - s));  // y now holds dz
            dy[i] *= g.gate[i];
          }
        std::fill(gs.begin(), gs.end(), T(0));  // gs[k G + w] holds a_{t+1} g_{t+1}
        std::fill(dA.begin(), dA.end(), T(0));
        T dD[W] = {}, dbias[W] = {};
        for (int64_t t = l - 1; t >= 0; --t) {
          const T *dt = &g.dt[t * W], *x = &g.x[t * W], *dyt = &dy[t * W];
          const T *Bt = cptr<T>(p.B) + (row * l + t) * n, *Ct = cptr<T>(p.C) + (row * l + t) * n;
          T S[W] = {}, AP[W] = {};  // Σ_k g_t,k B_t,k and Σ_k A_k g_t,k a_t,k h_{t-1},k
          for (int64_t k = 0; k < n; ++k) {
            const T *a = &E[(t * n + k) * W], *hp = &H[(t * n + k) * W], *A = &g.A[k * W];
            const T* ht = &H[((t + 1) * n + k) * W];
            T *gk = &gs[k * W], *dAk = &dA[k * W];
            T *dBk = &dBw[(t * n + k) * W], *dCk = &dCw[(t * n + k) * W];
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) {
              const T gt = dyt[w] * Ct[k] + gk[w], P = gt * a[w] * hp[w];
              S[w] += gt * Bt[k];
              AP[w] += A[w] * P;
              dAk[w] += dt[w] * P;
              dBk[w] += gt * dt[w] * x[w];
              dCk[w] += dyt[w] * ht[w];
              gk[w] = a[w] * gt;
            }
          }
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) {
            const T dd = (x[w] * S[w] + AP[w]) * g.dsp[t * W + w];
            du_g[t * W + w] = g.D[w] * dyt[w] + dt[w] * S[w];
            dd_g[t * W + w] = dd;
            dbias[w] += dd;
            dD[w] += dyt[w] * x[w];
          }
        }
        g.scatter(du_g.data(), du);
        g.scatter(dd_g.data(), ddelta);
        if (p.z.p) g.scatter(y.data(), dz);
        for (int64_t w = 0; w < g.nw; ++w) {
          for (int64_t k = 0; k < n; ++k) dA_b[(row * d + d0 + w) * n + k] = dA[k * W + w];
          dD_b[row * d + d0 + w] = dD[w];
          dbias_b[row * d + d0 + w] = dbias[w];
        }
      }
      for (int64_t i = 0; i < l * n; ++i) {  // the row's dB and dC: the lanes' sums, added
        T sb = T(0), sc = T(0);
        for (int64_t w = 0; w < W; ++w) sb += dBw[i * W + w], sc += dCw[i * W + w];
        dB[row * l * n + i] = sb;
        dC[row * l * n + i] = sc;
      }
    }
  });
}

}  // namespace

void forward_cpu(const Problem& p, Strided out, bool fp64) {
  fp64 ? forward<double>(p, out) : forward<float>(p, out);
}

void backward_cpu(const Problem& p, Strided dout, Strided du, Strided ddelta, Strided dz,
                  void* dA_b, void* dB, void* dC, void* dD_b, void* dbias_b, bool fp64) {
  (fp64 ? backward<double> : backward<float>)(p, dout, du, ddelta, dz, dA_b, dB, dC, dD_b, dbias_b);
}

}  // namespace scan
