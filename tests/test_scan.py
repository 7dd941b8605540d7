"""The selective-scan backends: the compiled extension of scan_ext/ ("ext") against the PyTorch loop
("ref", mech.selective_scan_ref), which is itself checked against a per-step loop in test_models.py.

Tolerances follow upstream mamba-ssm's tests/ops/test_selective_scan.py (state-spaces/mamba):
fp32 (rtol 6e-4, atol 2e-3) for the output and every gradient, looser for delta (rtol x5, atol x10)
and A (1e-3, 5e-3); float64 agrees to round-off. Tests that need the extension skip, with the
reason, where it cannot be built (no compiler); CUDA tests skip where torch sees no GPU, and
the compile check of the CUDA source where nvcc is not on the PATH.
"""
import _ctypes
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import mech
import scan_ext

ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def scan_extension_or_skip():
    try:
        return scan_ext.load()
    except RuntimeError as e:  # no compiler here: the reference loop is what runs
        pytest.skip(f"the scan extension cannot be built: {e}")


def cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    ext = scan_extension_or_skip()
    if not ext.has_cuda():
        pytest.skip("the scan extension was built without its CUDA kernel (no nvcc?)")
    return ext


# ── inputs ───────────────────────────────────────────────────────────────────────────────────

def scan_problem(nb, nd, nl, nn_, use_D=True, use_z=True, use_bias=True, softplus=True,
                 dtype=torch.float32, device="cpu", layout="contiguous", seed=0):
    """Random inputs for selective_scan, as a function that returns a fresh set of arguments (with
    their own autograd leaves) on each call, so that each backend gets its own graph.

    delta: a pre-activation of either sign with softplus, with one step beyond its threshold 20;
    without softplus, positive (with a positive bias), as upstream: negative steps make h explode.
    layout: "contiguous" (b, d, l) and (b, n, l) tensors; "transposed": u, delta, z transposed views
    of (b, l, d) tensors and B, C of (b, l, n) tensors; "mamba": as Mamba.forward passes them, u and
    z the two halves of one (b, l, 2d) projection, B and C slices of one (b, l, R + 2n) projection.
    """
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    pos = lambda *s: 0.5 * torch.rand(*s, generator=g, dtype=torch.float64)
    values = dict(u=r(nb, nd, nl), delta=r(nb, nd, nl) if softplus else pos(nb, nd, nl),
                  A=-torch.exp(r(nd, nn_)), B=r(nb, nn_, nl), C=r(nb, nn_, nl), D=r(nd), z=r(nb, nd, nl),
                  delta_bias=0.3 * r(nd) if softplus else pos(nd))
    if softplus and nl > 2:
        values["delta"][:, :, 1] = 21.0
    used = dict(D=use_D, z=use_z, delta_bias=use_bias)
    T = lambda x: x.transpose(1, 2)

    def make():
        leaf = lambda x: x.to(dtype=dtype, device=device).requires_grad_()
        if layout == "contiguous":
            args = {k: leaf(v) for k, v in values.items()}
        elif layout == "transposed":
            args = {k: leaf(T(v).contiguous() if v.dim() == 3 else v) for k, v in values.items()}
            args.update({k: T(args[k]) for k in ("u", "delta", "z", "B", "C")})  # (b, d, l), (b, n, l) views
        elif layout == "mamba":
            xz = leaf(torch.cat([T(values["u"]), T(values["z"])], dim=-1))                # (b, l, 2d)
            proj = leaf(torch.cat([r(nb, nl, 3), T(values["B"]), T(values["C"])], dim=-1))  # (b, l, R+2n)
            dt = leaf(T(values["delta"]).contiguous())                                   # (b, l, d)
            x, z = xz.chunk(2, dim=-1)
            _, B, C = proj.split([3, nn_, nn_], dim=-1)
            args = dict(u=T(x), delta=T(dt), z=T(z), B=T(B), C=T(C),
                        **{k: leaf(values[k]) for k in ("A", "D", "delta_bias")})
        else:
            raise ValueError(layout)
        return {k: None if not used.get(k, True) else args[k] for k in ARGS}

    return make


def run_scan(args, softplus, backend, G=None, seed=1):
    """The output and the gradients of <out, G> w.r.t. each argument given (G random if not given)."""
    out = mech.selective_scan(**args, delta_softplus=softplus, backend=backend)
    if G is None:
        g = torch.Generator().manual_seed(seed)
        G = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    names = [k for k in ARGS if args[k] is not None]
    grads = torch.autograd.grad(out, [args[k] for k in names], G)
    return out.detach(), dict(zip(names, grads))


TOL32 = {"out": (6e-4, 2e-3), "delta": (5 * 6e-4, 10 * 2e-3), "A": (1e-3, 5e-3)}  # others: "out"'s
TOL64 = (1e-10, 1e-12)


def assert_same_scan(got, want, tol=None):
    (out_g, grads_g), (out_w, grads_w) = got, want
    assert out_g.dtype == out_w.dtype and out_g.shape == out_w.shape
    assert grads_g.keys() == grads_w.keys()
    for name, a, b in [("out", out_g, out_w), *((k, grads_g[k], grads_w[k]) for k in grads_w)]:
        rtol, atol = tol or TOL32.get(name, TOL32["out"])
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ── ext against ref ──────────────────────────────────────────────────────────────────────────

# (batch, channels, length, state, use D, use z, use delta_bias, softplus): each of L in
# {1, 2, 37, 64, 271}, N in {1, 16, 64}, B = 1 and the odd channel count 7 occurs with each option on
# and off, rather than the full product.
SCAN_GRID = [
    (1, 1, 1, 1, False, False, False, False),
    (1, 7, 1, 16, True, True, True, True),
    (2, 3, 1, 64, False, True, False, True),
    (2, 7, 2, 1, True, False, True, False),
    (1, 3, 2, 64, False, True, False, True),
    (2, 7, 2, 16, True, True, False, False),
    (2, 7, 37, 16, True, True, True, True),     # as Mamba uses it, at the paper's length
    (2, 7, 37, 16, False, False, False, False),
    (1, 8, 37, 64, True, False, False, True),
    (3, 5, 37, 1, False, True, True, False),
    (4, 7, 37, 16, True, False, True, True),
    (2, 7, 64, 16, True, True, False, False),
    (2, 4, 64, 64, False, False, True, True),
    (1, 7, 64, 1, True, True, True, False),
    (2, 6, 64, 16, False, True, False, True),
    (2, 7, 271, 16, True, True, True, True),
    (1, 7, 271, 64, False, True, True, True),
    (2, 3, 271, 1, True, False, False, False),
    (1, 16, 271, 16, False, False, True, False),
    (2, 7, 271, 64, True, False, True, False),
    (1, 2, 271, 16, True, True, False, True),
    (2, 7, 5, 16, False, True, True, False),
]


@pytest.mark.parametrize("nb, nd, nl, nn_, use_D, use_z, use_bias, softplus", SCAN_GRID)
def test_ext_matches_ref_fp32(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus):
    scan_extension_or_skip()
    make = scan_problem(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus, seed=nl * 7 + nn_)
    got, want = run_scan(make(), softplus, "ext"), run_scan(make(), softplus, "ref")
    assert got[0].dtype == torch.float32
    assert_same_scan(got, want)


@pytest.mark.parametrize("nb, nd, nl, nn_, use_D, use_z, use_bias, softplus", [
    (2, 7, 37, 16, True, True, True, True),
    (1, 3, 271, 64, False, False, False, False),
    (2, 5, 1, 1, True, True, True, False),
    (1, 7, 64, 16, False, True, True, True),
])
def test_ext_matches_ref_fp64(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus):
    scan_extension_or_skip()
    make = scan_problem(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus, dtype=torch.float64, seed=nl)
    got, want = run_scan(make(), softplus, "ext"), run_scan(make(), softplus, "ref")
    assert got[0].dtype == torch.float64
    assert_same_scan(got, want, TOL64)


def test_ext_fp32_softplus_and_silu_are_accurate_to_float_precision():
    # The kernel computes softplus, its derivative and SiLU with its own exp and log1p. One channel
    # per value, N = 1, u = B = C = 1 and no decay at t = 0: out_0 = softplus(pre) (times SiLU(z)),
    # d out_0 / d delta = sigmoid(pre). Compared with float64 to a few float ulps, far tighter than
    # the fp32 tolerances of the other tests (a log1p taken from the rounded 1 + y erred by 6e-4).
    ext = scan_extension_or_skip()
    pre = torch.linspace(-30, 30, 60001)
    n = pre.numel()
    ones = torch.ones(1, 1, 1)
    u, A = torch.ones(1, n, 1), -torch.full((n, 1), 1e-3)
    rel = lambda got, want: ((got.double() - want).abs() / want.abs()).max().item()
    out = ext.fwd(u, pre.view(1, n, 1), A, ones, ones, None, None, None, True)
    assert rel(out.flatten(), F.softplus(pre.double())) < 1e-6
    ddelta = ext.bwd(torch.ones(1, n, 1), u, pre.view(1, n, 1), A, ones, ones, None, None, None, True)[1]
    assert rel(ddelta.flatten(), torch.sigmoid(pre.double())) < 1e-6
    z = torch.linspace(-80, 80, 60001)
    z = z[z.abs() > 1e-3]  # SiLU's zero at z = 0 has no relative error to speak of
    out = ext.fwd(torch.ones(1, z.numel(), 1), torch.zeros(1, z.numel(), 1), A[: z.numel()], ones, ones, None,
                  z.view(1, -1, 1), None, True)
    assert rel(out.flatten(), F.softplus(torch.zeros((), dtype=torch.float64)) * F.silu(z.double())) < 1e-6


@pytest.mark.parametrize("layout", ["transposed", "mamba"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ext_reads_strided_inputs(layout, dtype):
    """u, delta, z (and B, C) as the non-contiguous views Mamba passes: the kernel reads them through
    their strides, with the same results as from contiguous copies (bit for bit) and as the loop."""
    scan_extension_or_skip()
    kw = dict(nb=2, nd=7, nl=37, nn_=16, dtype=dtype, seed=3)
    strided = scan_problem(**kw, layout=layout)
    args = strided()
    assert not args["u"].is_contiguous() and not args["z"].is_contiguous() and not args["B"].is_contiguous()
    if layout == "transposed":
        assert not args["delta"].is_contiguous()
    got = run_scan(args, True, "ext")
    assert_same_scan(got, run_scan(strided(), True, "ref"), TOL64 if dtype == torch.float64 else None)
    out_c, grads_c = run_scan(scan_problem(**kw, layout="contiguous")(), True, "ext")
    assert torch.equal(got[0], out_c)
    for k in grads_c:
        assert torch.equal(got[1][k], grads_c[k]), k


def test_ext_keeps_low_precision_dtypes():
    """bf16 inputs: computed in fp32 by both backends (as upstream), returned in bf16."""
    scan_extension_or_skip()
    make = scan_problem(2, 4, 9, 4, dtype=torch.bfloat16)
    (out_e, g_e), (out_r, g_r) = run_scan(make(), True, "ext"), run_scan(make(), True, "ref")
    assert out_e.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in g_e.values())
    torch.testing.assert_close(out_e, out_r, rtol=1.6e-2, atol=1e-2)
    for k in g_r:
        torch.testing.assert_close(g_e[k], g_r[k], rtol=3e-2, atol=5e-2, msg=k)


@pytest.mark.parametrize("use_D, use_z, use_bias, softplus", [
    (True, True, True, True),
    (False, False, False, False),
    (True, False, True, False),
    (False, True, False, True),
    (True, True, False, True),
])
def test_ext_gradcheck(use_D, use_z, use_bias, softplus):
    scan_extension_or_skip()
    args = scan_problem(2, 3, 5, 4, use_D, use_z, use_bias, softplus, dtype=torch.float64, seed=11)()
    names = [k for k in ARGS if args[k] is not None]

    def f(*xs):
        return mech.selective_scan(**{**args, **dict(zip(names, xs))}, delta_softplus=softplus, backend="ext")

    assert torch.autograd.gradcheck(f, [args[k] for k in names], eps=1e-6, atol=1e-7, rtol=1e-5)


def test_ext_gradcheck_strided():
    scan_extension_or_skip()
    make = scan_problem(2, 3, 5, 4, dtype=torch.float64, layout="transposed", seed=12)
    args = make()
    base = {k: v._base if v is not None and v._base is not None else v for k, v in args.items()}
    views = {k for k in ARGS if args[k] is not base[k]}
    names = list(ARGS)

    def f(*xs):
        a = {k: x.transpose(1, 2) if k in views else x for k, x in zip(names, xs)}
        return mech.selective_scan(**a, delta_softplus=True, backend="ext")

    assert torch.autograd.gradcheck(f, [base[k] for k in names], eps=1e-6, atol=1e-7, rtol=1e-5)


# ── threads ──────────────────────────────────────────────────────────────────────────────────

def test_ext_is_built_with_openmp():
    ext = scan_extension_or_skip()
    assert ext.openmp(), "compiled without -fopenmp: at::parallel_for would run on one thread"
    assert ext.max_threads() >= 1
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ext.max_threads() == 2  # the kernel sees torch's thread count
    finally:
        torch.set_num_threads(before)


def test_ext_results_do_not_depend_on_thread_count():
    """The forward splits (b, d) channels across threads and the backward batch rows; dA, dD and
    d(bias) are reduced per row in a fixed order, so 1 and 2 threads give identical bits."""
    scan_extension_or_skip()
    make = scan_problem(8, 32, 37, 16, layout="transposed", seed=5)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(run_scan(make(), True, "ext"))
    finally:
        torch.set_num_threads(before)
    (out1, g1), (out2, g2) = results
    assert torch.equal(out1, out2)
    for k in g1:
        assert torch.equal(g1[k], g2[k]), k


# ── cost ─────────────────────────────────────────────────────────────────────────────────────

class CountElements(TorchDispatchMode):
    """Counts the elements of every tensor the ops run under it produce: a deterministic measure of
    work and memory traffic, unlike a timing."""
    n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.n += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


def elements_made_by_backward(backend, L):
    out = mech.selective_scan(**scan_problem(1, 4, L, 4)(), delta_softplus=True, backend=backend)
    with CountElements() as count:
        out.sum().backward()
    return count.n


@pytest.mark.parametrize("backend", ["ext", "ref"])
def test_backward_work_is_linear_in_length(backend):
    if backend == "ext":
        scan_extension_or_skip()
    short, long = elements_made_by_backward(backend, 128), elements_made_by_backward(backend, 256)
    assert long < 2.5 * short, (short, long)  # linear: 2x; quadratic: 4x


# ── inside Mamba ─────────────────────────────────────────────────────────────────────────────

def assert_mamba_same_with_either_backend(batch, device):
    """A Mamba layer gives the same outputs and gradients (input and every parameter) with ext and ref."""
    torch.manual_seed(0)
    ext = mech.Mamba(16, scan="ext").to(device)
    ref = mech.Mamba(16, scan="ref").to(device)
    ref.load_state_dict(ext.state_dict())
    x = torch.randn(batch, 37, 16, device=device, requires_grad=True)
    y_ext, y_ref = ext(x), ref(x)
    torch.testing.assert_close(y_ext, y_ref, rtol=6e-4, atol=2e-5)
    g_ext = torch.autograd.grad(y_ext.square().sum(), [x, *ext.parameters()])
    g_ref = torch.autograd.grad(y_ref.square().sum(), [x, *ref.parameters()])
    for (name, _), a, b in zip([("x", None), *ext.named_parameters()], g_ext, g_ref):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=1e-4, msg=name)


def test_mamba_layer_same_with_either_scan_backend():
    scan_extension_or_skip()
    assert_mamba_same_with_either_backend(2, "cpu")


def train_losses(scan, steps=20):
    cfg = mech.Config(arch="mamba", d_model=16, num_kv=64, scan=scan, seed=3)
    task = mech.make_task(cfg)
    model = mech.build_model(cfg, task.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        batch = task.sample(16, mech.rng_for(cfg.seed, f"scan-test-{step}"))
        loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_mamba_lm_trains_the_same_with_either_backend():
    scan_extension_or_skip()
    ext, ref = train_losses("ext"), train_losses("ref")
    assert ext[-1] < ext[0]
    assert ext == pytest.approx(ref, rel=0, abs=1e-4)


# ── CUDA ─────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nb, nd, nl, nn_, use_D, use_z, use_bias, softplus, layout", [
    (2, 7, 37, 16, True, True, True, True, "mamba"),
    (1, 3, 1, 1, False, False, False, False, "contiguous"),
    (2, 33, 271, 64, True, False, True, False, "transposed"),
    (1, 5, 64, 100, False, True, False, True, "contiguous"),   # N > 64: the largest template
])
def test_ext_matches_ref_cuda(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus, layout, dtype):
    cuda_or_skip()
    make = scan_problem(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus, dtype=dtype, device="cuda",
                        layout=layout, seed=nl)
    got, want = run_scan(make(), softplus, "ext"), run_scan(make(), softplus, "ref")
    assert got[0].is_cuda and all(g.is_cuda for g in got[1].values())
    assert_same_scan(got, want, TOL64 if dtype == torch.float64 else None)
    again = run_scan(make(), softplus, "ext")  # no atomics: deterministic
    assert torch.equal(again[0], got[0]) and all(torch.equal(again[1][k], got[1][k]) for k in got[1])


def test_ext_cuda_matches_cpu():
    cuda_or_skip()
    make_cpu = scan_problem(4, 16, 37, 16, layout="mamba")
    make_gpu = scan_problem(4, 16, 37, 16, layout="mamba", device="cuda")
    (out_c, g_c), (out_g, g_g) = run_scan(make_cpu(), True, "ext"), run_scan(make_gpu(), True, "ext")
    assert_same_scan((out_g.cpu(), {k: v.cpu() for k, v in g_g.items()}), (out_c, g_c))


def test_mamba_layer_on_cuda_same_with_either_backend():
    cuda_or_skip()
    assert_mamba_same_with_either_backend(4, "cuda")


def test_cuda_source_compiles_with_nvcc(tmp_path):
    """The CUDA kernel is built only where torch sees a GPU, so nothing else would notice when
    selective_scan_cuda.cu stops compiling: nvcc alone (no GPU, a CPU-only torch) checks it. Flags
    as torch's build, for sm_90 (H100/H200); -G leaves the device code unoptimised, so that every
    stage (front end, cicc, ptxas, host compiler) still runs but in seconds, not a minute and more."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on the PATH (scan_ext/README.md says how to get one)")
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths
    here = os.path.dirname(os.path.abspath(scan_ext.__file__))
    obj = tmp_path / "selective_scan_cuda.o"
    cmd = [nvcc, "-c", os.path.join(here, "selective_scan_cuda.cu"), "-o", str(obj), "-arch=sm_90",
           "-G", "-std=c++20", "-Xcompiler", "-fPIC", *COMMON_NVCC_FLAGS,
           *(f"-I{d}" for d in [here, *include_paths()])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TMPDIR=str(tmp_path)))  # nvcc's temporaries too
    if r.returncode != 0:
        pytest.fail(f"{nvcc} cannot compile selective_scan_cuda.cu (exit {r.returncode}):\n"
                    f"{r.stdout}{r.stderr}\ncommand: {' '.join(cmd)}", pytrace=False)
    assert obj.stat().st_size > 0


# ── the CUDA kernel, run on the CPU ─────────────────────────────────────────────────────────

class Strided(ctypes.Structure):  # selective_scan.h's structs, field for field
    _fields_ = [("p", ctypes.c_void_p), ("sb", ctypes.c_int64), ("sd", ctypes.c_int64),
                ("sl", ctypes.c_int64)]


class Problem(ctypes.Structure):
    _fields_ = [("u", Strided), ("delta", Strided), ("z", Strided),
                *((k, ctypes.c_void_p) for k in ("A", "B", "C", "D", "bias")),
                ("softplus", ctypes.c_bool), *((k, ctypes.c_int64) for k in "bdln")]


def cuda_kernel_on_cpu():
    """selective_scan_cuda.cu compiled as C++ with tests/cuda_on_cpu.h (a second or two with g++,
    then cached by content beside the extension's builds), loaded with ctypes."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler!r})")
    here, src = os.path.dirname(os.path.abspath(__file__)), os.path.dirname(scan_ext.__file__)
    files = [os.path.join(src, "selective_scan_cuda.cu"), os.path.join(src, "selective_scan.h"),
             os.path.join(here, "cuda_on_cpu.h")]
    key = hashlib.sha1(b"".join(open(f, "rb").read() for f in files)).hexdigest()[:16]
    lib = os.path.join(os.path.dirname(scan_ext.cache_dir(False)), f"cuda_on_cpu_{key}.so")
    if not os.path.exists(lib):
        os.makedirs(os.path.dirname(lib), exist_ok=True)
        subprocess.run([compiler, "-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-include",
                        files[2], "-I", src, files[0], "-o", lib + ".tmp"], check=True)
        os.replace(lib + ".tmp", lib)
    cdll = ctypes.CDLL(lib)
    cdll.forward.restype = cdll.backward.restype = ctypes.c_char_p
    return cdll


def cuda_scan_on_cpu(lib, G, u, delta, A, B, C, D, z, delta_bias, softplus):
    """The output and the gradients of <out, G>, as selective_scan.cpp's CUDA branch computes them:
    B and C as (b, l, n), per-channel partial sums (b, l, n, d) summed here."""
    u, delta, z, G = (None if x is None else x.detach() for x in (u, delta, z, G))
    A, D, delta_bias = (None if x is None else x.detach().contiguous() for x in (A, D, delta_bias))
    B, C = (x.detach().transpose(1, 2).contiguous() for x in (B, C))
    (b, d, l), n = u.shape, A.shape[1]
    view = lambda x: Strided(x.data_ptr(), *x.stride()) if x is not None else Strided()
    ptr = lambda x: None if x is None else x.data_ptr()
    p = Problem(view(u), view(delta), view(z), ptr(A), ptr(B), ptr(C), ptr(D), ptr(delta_bias),
                softplus, b, d, l, n)
    fp64 = u.dtype == torch.float64
    out, du, ddelta = torch.empty_like(u), torch.empty_like(u), torch.empty_like(u)
    dz = None if z is None else torch.empty_like(z)
    assert lib.forward(ctypes.byref(p), ctypes.byref(view(out)), fp64) is None
    sums = [u.new_empty(s) for s in [(b, n, d), (b, l, n, d), (b, l, n, d), (b, d), (b, d),
                                     (b, l, n, d)]]
    grads = (Strided * 4)(view(G), view(du), view(ddelta), view(dz))
    assert lib.backward(ctypes.byref(p), grads, (ctypes.c_void_p * 6)(*map(ptr, sums)), fp64) is None
    dA_b, dB_bd, dC_bd, dD_b, dbias_b, _ = sums
    got = dict(u=du, delta=ddelta, A=dA_b.sum(0).t(), B=dB_bd.sum(-1).transpose(1, 2),
               C=dC_bd.sum(-1).transpose(1, 2), D=dD_b.sum(0), z=dz, delta_bias=dbias_b.sum(0))
    return out, got


# n in {1, 16, 17, 64, 65, 256} (each side of the kernel's MAXN bounds 16, 64, 256), in fp32 and
# fp64; odd b, d, l; D, z, delta_bias and softplus each on and off, three layouts; d = 67 makes two
# blocks of 128 threads with some threads past the end
CUDA_ON_CPU = [
    (1, True, True, True, True, "mamba"), (16, False, False, False, False, "contiguous"),
    (17, True, False, True, False, "transposed"), (64, False, True, False, True, "mamba"),
    (65, True, True, False, True, "contiguous"), (256, False, False, True, False, "transposed"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nn_, use_D, use_z, use_bias, softplus, layout", CUDA_ON_CPU)
def test_cuda_kernel_run_on_the_cpu_matches_ref(nn_, use_D, use_z, use_bias, softplus, layout,
                                                dtype):
    lib = cuda_kernel_on_cpu()
    nd = 67 if nn_ in (1, 17, 65) else 5
    make = scan_problem(3, nd, 9, nn_, use_D, use_z, use_bias, softplus, dtype=dtype,
                        layout=layout, seed=nn_)
    out_w, grads_w = run_scan(make(), softplus, "ref")
    G = torch.randn(out_w.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, grads = cuda_scan_on_cpu(lib, G.to(dtype), **make(), softplus=softplus)
    assert_same_scan((out, {k: grads[k] for k in grads_w}), (out_w, grads_w),
                     TOL64 if dtype == torch.float64 else None)


# ── choosing the backend ─────────────────────────────────────────────────────────────────────

def small_args():
    return scan_problem(1, 2, 3, 4)()


def test_backend_ext_fails_clearly_without_the_extension(monkeypatch):
    monkeypatch.setattr(scan_ext, "_module", scan_ext.BuildError("no compiler"))
    with pytest.raises(RuntimeError, match="scan backend 'ext' is unavailable: no compiler"):
        mech.selective_scan(**small_args(), backend="ext")
    with pytest.raises(RuntimeError, match="unavailable"):
        mech.Mamba(16, scan="ext")(torch.randn(1, 5, 16))


def test_backend_auto_falls_back_to_the_loop_and_warns_once(monkeypatch, capsys):
    monkeypatch.setattr(scan_ext, "_module", scan_ext.BuildError("no compiler"))
    monkeypatch.setattr(scan_ext, "_warned", False)
    args = small_args()
    want = mech.selective_scan(**args, delta_softplus=True, backend="ref")
    capsys.readouterr()
    for _ in range(2):
        torch.testing.assert_close(mech.selective_scan(**args, delta_softplus=True, backend="auto"),
                                   want, rtol=0, atol=0)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "no compiler" in err and "reference loop" in err and err.startswith("mech.py: warning:")


def test_backend_auto_uses_the_extension_when_it_builds(monkeypatch):
    scan_extension_or_skip()
    called = []
    real = scan_ext.SelectiveScanFn.apply
    monkeypatch.setattr(scan_ext.SelectiveScanFn, "apply", lambda *a: called.append(1) or real(*a))
    mech.selective_scan(**small_args(), backend="auto")
    assert called


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="'cuda'.*auto, ext, ref"):
        mech.selective_scan(**small_args(), backend="cuda")
    with pytest.raises(ValueError, match="'fast'"):
        mech.Config(arch="mamba", scan="fast")


def test_ext_without_cuda_kernel_refuses_cuda_tensors():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    ext = scan_extension_or_skip()
    if ext.has_cuda():
        pytest.skip("the extension has its CUDA kernel")
    args = {k: v if v is None else v.detach().cuda() for k, v in small_args().items()}
    with pytest.raises(RuntimeError, match="without its CUDA kernel"):
        mech.selective_scan(**args, backend="ext")


# ── robustness ───────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name", ["D", "delta_bias"])
def test_ext_rejects_or_broadcasts_misshapen_vectors(name):
    scan_extension_or_skip()
    args = {k: v if v is None else v.detach() for k, v in scan_problem(2, 7, 5, 4)().items()}
    args[name] = torch.full((1,), 0.5)
    want = mech.selective_scan(**args, delta_softplus=True, backend="ref")  # broadcasts the (1,) vector
    try:
        got = mech.selective_scan(**args, delta_softplus=True, backend="ext")
    except (RuntimeError, ValueError):
        return  # a clear error is fine too
    torch.testing.assert_close(got, want, rtol=6e-4, atol=2e-3)


def test_ext_double_backward_raises():
    # The kernel has no second derivative: differentiating twice through it must fail loudly rather
    # than silently drop the scan's terms. (.backward() visits every node; torch.autograd.grad with
    # inputs= prunes the erroring node when another path reaches the inputs, a torch limitation.)
    scan_extension_or_skip()
    args = scan_problem(1, 2, 4, 3, dtype=torch.float64)()
    u = args["u"]
    loss = mech.selective_scan(**args, delta_softplus=True, backend="ext").square().sum() + u.pow(3).sum()
    (gu,) = torch.autograd.grad(loss, u, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gu.sum().backward()


# ── building the extension: a private cache, as a new user's first run ──────────────────────

def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("MECH_SCAN_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(scan_ext, "_module", None)
    with pytest.raises(RuntimeError, match="scan backend 'ext' is unavailable: no C.. compiler: "
                                           "'no-such-compiler'"):
        mech.selective_scan(**small_args(), backend="ext")


def test_a_stop_during_the_build_stops_the_run(monkeypatch):
    """Ctrl-C and mech.py's stop signals (KeyboardInterrupts) during the build go on up: taken as
    a failed build, the run would go on with the reference loop."""
    def stopped():
        raise KeyboardInterrupt
    monkeypatch.setattr(scan_ext, "_module", None)
    monkeypatch.setattr(scan_ext, "build", stopped)
    with pytest.raises(KeyboardInterrupt):
        scan_ext.kernel(torch.device("cpu"), required=False)
    assert scan_ext._module is None  # not remembered as a failure: the next run builds


# A stand-in for the kernel, built in a second where the kernel takes a minute: a module with no
# functions, in the Python C API (no torch or pybind11 headers to compile)
TINY_BINDING = """#include <Python.h>
#define NAME_(x) #x
#define NAME(x) NAME_(x)
#define INIT_(x) PyInit_##x
#define INIT(x) INIT_(x)
static PyModuleDef module = {PyModuleDef_HEAD_INIT, NAME(TORCH_EXTENSION_NAME), nullptr, -1};
PyMODINIT_FUNC INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
"""


def test_the_build_is_announced_cached_by_content_and_survives_a_stale_lock(
        tmp_path, monkeypatch):
    """A build killed half way leaves torch's lock file behind: the next run must not wait on it
    forever. The build is announced once; a second checkout of the same sources reuses it. The
    loader builds a stand-in for the kernel here (the real one is built by the tests above)."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("MECH_SCAN_CACHE", str(tmp_path / "cache"))
    checkouts = [tmp_path / "a", tmp_path / "b"]
    for c in checkouts:
        shutil.copytree(os.path.dirname(scan_ext.__file__), c / "scan_ext",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in scan_ext.SOURCES:
            (c / "scan_ext" / name).write_text(TINY_BINDING if name == "binding.cpp" else "\n")
    from torch.utils.cpp_extension import CUDA_HOME
    monkeypatch.setattr(scan_ext, "HERE", str(checkouts[0] / "scan_ext"))
    folder = scan_ext.cache_dir(torch.cuda.is_available() and CUDA_HOME is not None)
    os.makedirs(folder)
    open(os.path.join(folder, "lock"), "w").close()  # the stale lock of a killed build
    load = "import scan_ext; print(scan_ext.load().__file__)"
    runs = [subprocess.run([sys.executable, "-c", load], cwd=c, capture_output=True, text=True,
                           timeout=120) for c in checkouts]  # a wait on the stale lock: a timeout
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith(folder)
    assert runs[0].stderr.count("building the selective-scan kernel") == 1, runs[0].stderr
    assert "building" not in runs[1].stderr, runs[1].stderr


# ── the recurrence written out, one step at a time ───────────────────────────────────────────

def naive_scan(u, delta, A, B, C, D, z, delta_bias):
    """The recurrence for each (batch, channel, step) on its own, B and C per token (b, n, l)."""
    b, d, l = u.shape
    delta = F.softplus(delta + delta_bias[:, None])
    out = torch.empty_like(u)
    for i in range(b):
        for c in range(d):
            h = torch.zeros(A.shape[1], dtype=u.dtype)
            for t in range(l):
                h = torch.exp(delta[i, c, t] * A[c]) * h + delta[i, c, t] * u[i, c, t] * B[i, :, t]
                y = (h * C[i, :, t]).sum() + D[c] * u[i, c, t]
                out[i, c, t] = y * F.silu(z[i, c, t])
    return out


def test_the_loop_is_the_recurrence_written_out():
    torch.manual_seed(0)
    b, d, l, n = 2, 4, 5, 3
    kw = dict(u=torch.randn(b, d, l), delta=torch.randn(b, d, l), A=-torch.rand(d, n),
              B=torch.randn(b, n, l), C=torch.randn(b, n, l), D=torch.randn(d),
              z=torch.randn(b, d, l), delta_bias=torch.randn(d))
    kw = {k: v.double() for k, v in kw.items()}
    want = naive_scan(**kw)
    for backend in ("ref", "auto"):
        torch.testing.assert_close(mech.selective_scan(**kw, delta_softplus=True, backend=backend),
                                   want)


# ── the loader's failures, one true line each ────────────────────────────────────────────────

@pytest.mark.parametrize("shape, form", [((1, 4, 2), "wrong size"), ((2, 4), "constant"),
                                         ((1, 1, 4, 3), "grouped")])
def test_forms_of_B_the_kernel_does_not_take_are_named(shape, form):
    scan_extension_or_skip()
    args = {k: v if v is None else v.detach() for k, v in small_args().items()}  # B (1, 4, 3)
    args["B"] = torch.randn(shape)
    with pytest.raises(ValueError, match=r"B must be per token, \(b, n, l\) = \(1, 4, 3\), not"):
        mech.selective_scan(**args, backend="ext")


def run_loader(env, code="import scan_ext; print(scan_ext.load().__file__)", **kw):
    return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, **env),
                            cwd=os.path.dirname(os.path.dirname(scan_ext.__file__)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_a_wait_for_another_process_build_is_announced_and_its_build_used(tmp_path):
    import fcntl
    ext = scan_extension_or_skip()
    folder = tmp_path / os.path.basename(os.path.dirname(ext.__file__))
    folder.mkdir()
    with open(folder / "mech.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as another process's build would
        run = run_loader({"CXX": "no-such-compiler", "MECH_SCAN_CACHE": str(tmp_path)})
        line = run.stderr.readline()
        assert "waiting for another process's build" in line and lock.name in line, line
        for f in (ext.__file__, ext.__file__ + ".stamp"):  # that process's build, done
            shutil.copy(f, folder)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert out.strip() == str(folder / os.path.basename(ext.__file__)), err


def test_a_failed_build_is_reported_by_its_error_line_not_ninjas(tmp_path):
    """A full disk, as the compiler reports it: the one line is the compiler's, not ninja's last."""
    if shutil.which("ninja") is None and not shutil.which(os.path.join(os.path.dirname(
            sys.executable), "ninja")):
        pytest.skip("no ninja")
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *' -c '*) ;; *) echo 12.2.0; exit 0;; esac\n"
                    "echo 'cc1plus: fatal error: error writing to /tmp/ccX.s: No space left on "
                    "device' >&2\nexit 1\n")
    fake.chmod(0o755)
    code = ("import torch, scan_ext; print(scan_ext.kernel(torch.device('cpu'), required=False))")
    run = run_loader({"CXX": str(fake), "MECH_SCAN_CACHE": str(tmp_path / "cache")}, code)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0 and out.strip() == "None", err
    warning = [s for s in err.splitlines() if "warning" in s]
    assert len(warning) == 1 and "No space left on device" in warning[0], err


# ── the cache: a damaged build is rebuilt, never loaded ──────────────────────────────────────

def test_build_key_names_the_loaded_build():
    ext = scan_extension_or_skip()
    assert scan_ext.build_key == os.path.basename(os.path.dirname(ext.__file__))
    assert scan_ext.build_key == os.path.basename(scan_ext.cache_dir(ext.has_cuda()))


def reusing_compiler(built, folder):
    """A C++ compiler, written to `folder`, for the rebuilds below: it "compiles" a source by
    copying the object that the session's build folder `built` made of the same file (a second,
    not a minute), and links with the real compiler. Both folders have the same key (sources,
    flags, CPU, torch), so these are the objects a compile would make."""
    real = shutil.which(os.environ.get("CXX", "c++"))
    if real is None:  # the session's build was found, not built
        pytest.skip("no C++ compiler to link the rebuilds with")
    cxx = folder / "c++"  # so named, torch takes it for a compiler without asking it
    cxx.write_text(f"""#!/bin/sh
for a; do [ "$prev" = -c ] && src=$a; [ "$prev" = -o ] && out=$a; prev=$a; done  # -c SRC -o OBJ
name=$(basename "${{src:-none}}")
if [ -n "$src" ] && cmp -s "$src" "{built}/$name" && [ -f "{built}/${{name%.*}}.o" ]; then
    exec cp "{built}/${{name%.*}}.o" "$out"
fi
exec {real} "$@"
""")
    cxx.chmod(0o755)
    return str(cxx)


# Ways a cached mech_scan.so can be damaged, each done to a copy of the session's build in a cache
# of its own, with that build's stamp (True: the .so was spoiled after its build) or without it
DAMAGES = {
    "cut short": (lambda so: so.write_bytes(so.read_bytes()[: so.stat().st_size // 2]), True),
    "random bytes": (lambda so: so.write_bytes(os.urandom(so.stat().st_size)), True),
    "empty": (lambda so: so.write_bytes(b""), False),
    "another module's": (lambda so: shutil.copyfile(_ctypes.__file__, so), False),  # a stdlib .so
}

# run_loader's code: the kernel (required), checked against the loop
LOAD_AND_CHECK = """import sys; sys.path.insert(0, "tests")
import scan_ext, test_scan as t
make = t.scan_problem(2, 5, 9, 4, layout="mamba")
t.assert_same_scan(t.run_scan(make(), True, "ext"), t.run_scan(make(), True, "ref"))
print(scan_ext.load().__file__, scan_ext.build_key)
"""


@pytest.fixture(scope="module")
def damaged_caches(tmp_path_factory):
    """For each damage, and for a cut-short .so with no compiler: the .so, and the loader run on
    its cache in a subprocess (a crash must not take pytest with it); all started at once."""
    ext = scan_extension_or_skip()
    if ext.has_cuda():
        pytest.skip("a CUDA build: nvcc would compile the .cu again for each case, minutes")
    built = os.path.dirname(ext.__file__)
    cxx = reusing_compiler(built, tmp_path_factory.mktemp("bin"))

    def start(damage, cxx, code):
        spoil, keep_stamp = DAMAGES[damage]
        cache = tmp_path_factory.mktemp("cache")
        so = cache / os.path.basename(built) / os.path.basename(ext.__file__)
        so.parent.mkdir()
        shutil.copyfile(ext.__file__, so)
        if keep_stamp:
            shutil.copyfile(ext.__file__ + ".stamp", str(so) + ".stamp")
        spoil(so)
        return so, run_loader({"MECH_SCAN_CACHE": str(cache), "CXX": cxx}, code)

    runs = {damage: start(damage, cxx, LOAD_AND_CHECK) for damage in DAMAGES}
    runs["no compiler"] = start("cut short", "no-such-compiler", "import torch, scan_ext; print("
                                "scan_ext.kernel(torch.device('cpu'), False), scan_ext.build_key)")
    return runs


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_build_is_built_again_not_loaded(damage, damaged_caches):
    """dlopen of a .so cut short crashes the process ("Bus error"); others fail to import, which
    left the loop in use for good. The loader loads a build only when its stamp vouches for it."""
    so, run = damaged_caches[damage]
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {err}"  # -7: SIGBUS
    assert out.split() == [str(so), so.parent.name], err
    assert err.count("building the selective-scan kernel") == 1, err
    assert scan_ext.stamped(str(so))


def test_a_damaged_build_without_a_compiler_is_refused_in_one_line(damaged_caches):
    so, run = damaged_caches["no compiler"]
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}: {err}"  # -7: SIGBUS
    assert out.split() == ["None", "None"], err
    assert err.count("\n") == 1 and "no C++ compiler" in err and "warning" in err, err


# Makes the cache read-only in the subprocess, even for root (whom chmod does not stop): any
# write there, of a file or a folder, raises PermissionError, as a read-only file system would
READ_ONLY = """import os, sys
WRITES = {"os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.chmod", "os.truncate",
          "os.utime", "os.link", "os.symlink", "shutil.copyfile", "shutil.rmtree"}
def read_only(event, args, cache=os.environ["MECH_SCAN_CACHE"]):
    if event in WRITES or event == "open" and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        if any(isinstance(a, (str, os.PathLike)) and os.fspath(a).startswith(cache) for a in args):
            raise PermissionError(13, "read-only (the test's audit hook)", os.fspath(args[0]))
sys.addaudithook(read_only)
try:
    open(os.path.join(os.environ["MECH_SCAN_CACHE"], "probe"), "w")
    sys.exit("the audit hook let a write through")
except PermissionError:
    pass
"""


def test_a_build_in_a_read_only_cache_is_used(tmp_path):
    ext = scan_extension_or_skip()
    folder = tmp_path / os.path.basename(os.path.dirname(ext.__file__))
    folder.mkdir()
    for f in (ext.__file__, ext.__file__ + ".stamp"):
        shutil.copy(f, folder)
    for f in [*folder.iterdir(), folder, tmp_path]:
        f.chmod(0o555 if f.is_dir() else 0o444)
    try:
        run = run_loader({"MECH_SCAN_CACHE": str(tmp_path), "CXX": "no-such-compiler"},
                         READ_ONLY + LOAD_AND_CHECK)
        out, err = run.communicate(timeout=120)
    finally:
        for f in [tmp_path, folder]:
            f.chmod(0o755)
    assert run.returncode == 0 and "building" not in err, err
    assert out.split() == [str(folder / os.path.basename(ext.__file__)), folder.name], err


# ── scan_ext/README.md's map of the recurrence ──────────────────────────────────────────────

def test_the_readme_map_quotes_lines_of_the_loop_and_both_kernels():
    """Each step's row quotes the code that computes it in mech.py and in each kernel: each quote
    must still be in its file (a renamed variable or a rewritten line fails here)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(scan_ext.__file__)))
    readme = open(os.path.join(root, "scan_ext", "README.md")).read()
    table = readme[readme.index("| the step |"):].split("\n\n")[0].splitlines()
    files = ["mech.py", "scan_ext/selective_scan_cuda.cu", "scan_ext/selective_scan.cpp"]
    assert [c.split("`")[1] for c in table[0].split(" | ")[1:]] == [os.path.basename(f)
                                                                      for f in files]
    texts = [open(os.path.join(root, f)).read() for f in files]
    steps = table[2:]
    assert [row.split(" | ")[0] for row in steps] == [
        "| exp(Δ_t A)", "| h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t", "| y_t = C_t · h_t + D u_t"]
    for row in steps:
        for cell, text, name in zip(row.strip(" |").split(" | ")[1:], texts, files):
            quotes = cell.split("`")[1::2]
            assert quotes and all(q in text for q in quotes), (name, cell)
