// The torch binding of the two kernels (selective_scan.cpp on the CPU, selective_scan_cuda.cu on
// CUDA): checks the inputs, allocates the outputs, reduces the kernels' per-row partial sums.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>
#include "selective_scan.h"

namespace {

using scan::Problem;
using scan::Strided;

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
  TORCH_CHECK(A.dim() == 2 && A.size(0) == d && n <= scan::kMaxState,
              "A must be (d, n), n <= 256");
  TORCH_CHECK(B.sizes() == torch::IntArrayRef({b, l, n}) && C.sizes() == B.sizes(),
              "B and C must be (b, l, n) = (", b, ", ", l, ", ", n, "), got ", B.sizes(),
              C.sizes());
  TORCH_CHECK(A.is_contiguous() && B.is_contiguous() && C.is_contiguous(),
              "A, B and C must be contiguous");
  for (const auto* v : {&D, &bias})
    TORCH_CHECK(!*v || ((*v)->sizes() == torch::IntArrayRef({d}) && (*v)->is_contiguous()),
                "D and delta_bias must be contiguous (d,) vectors");
  TORCH_CHECK(!z || z->sizes() == u.sizes(), "z must have u's shape");
  TORCH_CHECK(u.scalar_type() == torch::kFloat || u.scalar_type() == torch::kDouble,
              "the scan takes float32 or float64");
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
    scan::forward_cpu(p, strided(out), fp64);
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
    scan::backward_cpu(p, strided(dout), strided(du), strided(ddelta), dz_s, dA_b.data_ptr(),
                       dB.data_ptr(), dC.data_ptr(), dD_b.data_ptr(), dbias_b.data_ptr(),
                       u.scalar_type() == torch::kDouble);
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
