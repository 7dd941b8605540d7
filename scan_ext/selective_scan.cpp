// Mamba's selective scan on the CPU, in the shape of selective_scan_cuda.cu: where a CUDA thread
// owns one (b, d) channel, a vector lane does here. A task runs a group of W neighbouring channels
// (W lanes: one 64-byte vector, 16 floats or 8 doubles) in lock-step over time, every statement a
// loop over the lanes under `omp simd` (exp and log1p: glibc's vector functions); lane w keeps its
// channel's state in h[k][w]. Per channel (mamba-ssm's selective_scan_ref: real A, B and C per
// token), with dout_t = ∂loss/∂out_t and dh_t = ∂loss/∂h_t:
//
//   forward:   Δ_t = softplus(delta_t + bias)  (if asked; above 20 the identity),  a_t = exp(Δ_t A)
//              h_t = a_t ⊙ h_{t-1} + Δ_t u_t B_t  (h_{-1} = 0),  y_t = C_t · h_t + D u_t,
//              out_t = y_t SiLU(z_t)  (if z is given)
//   backward:  dy_t = dout_t SiLU(z_t),  dz_t = dout_t y_t σ(z_t) (1 + z_t (1 - σ(z_t)))
//              (no z: dy_t = dout_t),  dh_t = dy_t C_t + a_{t+1} ⊙ dh_{t+1}  (from t = l-1 down),
//              du_t = D dy_t + Δ_t dh_t · B_t,  dΔ_t = dh_t · (u_t B_t + A ⊙ a_t ⊙ h_{t-1}),
//              dA += Δ_t dh_t ⊙ a_t ⊙ h_{t-1},  dB_t += Δ_t u_t dh_t,  dC_t += dy_t h_t,
//              dD += dy_t u_t,  ddelta_t = dΔ_t σ(delta_t + bias) with softplus (1 above 20),
//              dbias += ddelta_t
//
// dA, dB, dC, dD and dbias sum over channels or rows. So that the results do not depend on the
// number of threads, the backward gives each batch row to one task, which adds its groups' dB and
// dC per lane, then over the lanes; it writes dA, dD and dbias per row, for binding.cpp to sum.
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>
#include "selective_scan.h"

namespace scan {
namespace {

template <typename T> const T* cptr(const void* p) { return static_cast<const T*>(p); }

// One group's series, lane-minor: u[t W + w] = u_t of channel d0 + w, and so on. A tail group's
// spare lanes (w >= nw) read zeros (A, D, bias: the last channel's) and are never written back.
template <typename T> struct Group {
  static constexpr int64_t W = 64 / sizeof(T);  // lanes: the group's channels, one vector
  int64_t row = 0, d0 = 0, nw = 0, l, n;
  std::vector<T> u, dt, dsp, z, sz, A, D;  // u, Δ, dΔ/ddelta, z, σ(z); A[k W + w], D[w]
  Group(int64_t l_, int64_t n_)
      : l(l_), n(n_), u(l * W), dt(l * W), dsp(l * W), z(l * W), sz(l * W), A(n * W), D(W) {}
  void gather(const Strided& s, T* dst) const {  // a (b, d, l) tensor's W channels, all t
    const T* p = static_cast<const T*>(s.p) + row * s.sb + d0 * s.sd;
    std::fill(dst, dst + l * W, T(0));
    for (int64_t t = 0; t < l; ++t)
      for (int64_t w = 0; w < nw; ++w) dst[t * W + w] = p[t * s.sl + w * s.sd];
  }
  void scatter(const T* src, const Strided& s) const {
    T* p = static_cast<T*>(s.p) + row * s.sb + d0 * s.sd;
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
    gather(p.u, u.data());
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
  }
};

// y[t W + w] = y_t of lane w. With keep, H[((t + 1) n + k) W + w] = h_t,k (row t = -1 the zeros of
// h_{-1}) and E[(t n + k) W + w] = a_t,k; else H and E hold only the current step's.
template <typename T, bool keep>
void recur(const Problem& p, const Group<T>& group, T* y, T* H, T* E) {
  constexpr int64_t W = Group<T>::W;
  const int64_t n = p.n;
  std::fill(H, H + n * W, T(0));
  for (int64_t t = 0; t < p.l; ++t) {
    const T *dt = &group.dt[t * W], *u = &group.u[t * W];
    const T* Bt = cptr<T>(p.B) + (group.row * p.l + t) * n;
    const T* Ct = cptr<T>(p.C) + (group.row * p.l + t) * n;
    // the step's decays first, in a loop of their own: the vector exp is a call, across which the
    // recurrence's registers would be saved (so: 1.04-1.25x slower at bench_scan.py's shapes)
    T* a = E + keep * t * n * W;
    for (int64_t k = 0; k < n; ++k)
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) a[k * W + w] = std::exp(dt[w] * group.A[k * W + w]);
    T yt[W];  // in a register: y[] in memory would make each k wait for the last one's store
#pragma omp simd
    for (int64_t w = 0; w < W; ++w) yt[w] = group.D[w] * u[w];
    for (int64_t k = 0; k < n; ++k) {
      const T *ak = a + k * W, *hp = H + (keep * t * n + k) * W;
      T* ht = H + (keep * (t + 1) * n + k) * W;
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) {
        ht[w] = ak[w] * hp[w] + dt[w] * u[w] * Bt[k];
        yt[w] += Ct[k] * ht[w];
      }
    }
    std::copy(yt, yt + W, y + t * W);
  }
}

template <typename T> void forward(const Problem& p, const Strided& out) {
  constexpr int64_t W = Group<T>::W;
  const int64_t groups = (p.d + W - 1) / W;
  at::parallel_for(0, p.b * groups, 1, [&](int64_t begin, int64_t end) {
    Group<T> group(p.l, p.n);
    std::vector<T> y(p.l * W), h(p.n * W), a(p.n * W);
    for (int64_t task = begin; task < end; ++task) {
      group.load(p, task / groups, task % groups * W);
      recur<T, false>(p, group, y.data(), h.data(), a.data());
      if (p.z.p)
#pragma omp simd
        for (int64_t i = 0; i < p.l * W; ++i) y[i] *= group.z[i] * group.sz[i];
      group.scatter(y.data(), out);
    }
  });
}

template <typename T>
void backward(const Problem& p, const Strided& dout, const Strided& du, const Strided& ddelta,
              const Strided& dz, void* dA_, void* dB_, void* dC_, void* dD_, void* dbias_) {
  constexpr int64_t W = Group<T>::W;
  T *dA_b = static_cast<T*>(dA_), *dB = static_cast<T*>(dB_), *dC = static_cast<T*>(dC_);
  T *dD_b = static_cast<T*>(dD_), *dbias_b = static_cast<T*>(dbias_);
  const int64_t d = p.d, l = p.l, n = p.n;
  at::parallel_for(0, p.b, 1, [&](int64_t begin, int64_t end) {
    Group<T> group(l, n);
    std::vector<T> H((l + 1) * n * W), E(l * n * W), y(l * W), dy(l * W);
    std::vector<T> du_series(l * W), ddelta_series(l * W);  // the group's du_t and ddelta_t
    for (int64_t row = begin; row < end; ++row) {
      std::vector<T> dBw(l * n * W), dCw(l * n * W);  // the row's dB and dC, per lane
      for (int64_t d0 = 0; d0 < d; d0 += W) {
        // h_t and a_t are kept for the sweep (recomputing them measured 0.68-0.90x as fast)
        group.load(p, row, d0);
        recur<T, true>(p, group, y.data(), H.data(), E.data());
        group.gather(dout, dy.data());  // dout_t, made dy_t
        if (p.z.p)
#pragma omp simd
          for (int64_t i = 0; i < l * W; ++i) {  // y now holds dz
            y[i] = dy[i] * y[i] * group.sz[i] * (T(1) + group.z[i] * (T(1) - group.sz[i]));
            dy[i] *= group.z[i] * group.sz[i];
          }
        std::vector<T> carry(n * W), dA(n * W);  // carry[k W + w] holds a_{t+1} ⊙ dh_{t+1}
        T dD[W] = {}, dbias[W] = {};
        for (int64_t t = l - 1; t >= 0; --t) {
          const T *dt = &group.dt[t * W], *u = &group.u[t * W], *dyt = &dy[t * W];
          const T *Bt = cptr<T>(p.B) + (row * l + t) * n, *Ct = cptr<T>(p.C) + (row * l + t) * n;
          T S[W] = {}, AP[W] = {};  // Σ_k dh_t,k B_t,k and Σ_k A_k dh_t,k a_t,k h_{t-1},k
          for (int64_t k = 0; k < n; ++k) {
            // i: (t, k) in E, H, dBw and dCw; j: k in carry and dA
            const int64_t i = (t * n + k) * W, j = k * W;
#pragma omp simd
            for (int64_t w = 0; w < W; ++w) {
              const T dh = dyt[w] * Ct[k] + carry[j + w], P = dh * E[i + w] * H[i + w];
              S[w] += dh * Bt[k];
              AP[w] += group.A[j + w] * P;
              dA[j + w] += dt[w] * P;
              dBw[i + w] += dh * dt[w] * u[w];
              dCw[i + w] += dyt[w] * H[i + n * W + w];
              carry[j + w] = E[i + w] * dh;
            }
          }
#pragma omp simd
          for (int64_t w = 0; w < W; ++w) {
            const T ddelta_t = (u[w] * S[w] + AP[w]) * group.dsp[t * W + w];
            du_series[t * W + w] = group.D[w] * dyt[w] + dt[w] * S[w];
            ddelta_series[t * W + w] = ddelta_t;
            dbias[w] += ddelta_t;
            dD[w] += dyt[w] * u[w];
          }
        }
        group.scatter(du_series.data(), du);
        group.scatter(ddelta_series.data(), ddelta);
        if (p.z.p) group.scatter(y.data(), dz);
        for (int64_t w = 0; w < group.nw; ++w)
          for (int64_t k = 0; k < n; ++k) dA_b[(row * d + d0 + w) * n + k] = dA[k * W + w];
        std::copy(dD, dD + group.nw, dD_b + row * d + d0);
        std::copy(dbias, dbias + group.nw, dbias_b + row * d + d0);
      }
      for (int64_t i = 0; i < l * n; ++i) {  // the row's dB and dC: the lanes' sums, added
        dB[row * l * n + i] = std::accumulate(&dBw[i * W], &dBw[i * W] + W, T(0));
        dC[row * l * n + i] = std::accumulate(&dCw[i * W], &dCw[i * W] + W, T(0));
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
