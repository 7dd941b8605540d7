"""The compiled selective scan: build, cache and autograd glue for the kernels in this folder.

mech.py shows the scan as a readable loop (selective_scan_ref) and reaches this fast path through one
call, kernel(device, required). Nothing here changes the maths; it only makes the loop fast:
    selective_scan.cpp        forward and backward on the CPU (OpenMP, vectorised over the state)
    selective_scan_cuda.cu    the same on CUDA, built only where torch sees a GPU and nvcc exists
Both are compiled on first use with torch.utils.cpp_extension.load (about a minute) into a cache
named after the content of the sources, the flags and the CPU (~/.cache/mech_scan/<key>/, or
$MECH_SCAN_CACHE/<key>/): checkouts with the same sources share one build, and a changed source
gets a build of its own.
"""
import fcntl
import hashlib
import os
import platform
import shutil
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("selective_scan.cpp", "selective_scan_cuda.cu", "selective_scan_cuda.h")
LOCK_WAIT_S = 600  # a build takes about a minute; a lock held this long is another process's hang
_module = None     # the compiled module, or the exception its build raised (not retried)
_warned = False


def cache_dir(cuda: bool) -> str:
    """The build folder of these sources with these flags on this CPU (-march=native code runs
    only on CPUs like this one, so a cache shared with other machines never hands them a binary
    they cannot execute)."""
    key = hashlib.sha1(repr((flags(cuda), platform.processor(), cpu_flags(), torch.__version__))
                       .encode())
    for name in SOURCES:
        with open(os.path.join(HERE, name), "rb") as f:
            key.update(f.read())
    root = os.environ.get("MECH_SCAN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "mech_scan")
    return os.path.join(root, key.hexdigest()[:16] + ("_cuda" if cuda else ""))


def flags(cuda: bool) -> dict:
    return dict(extra_cflags=["-O3", "-fopenmp", "-ffast-math", "-march=native"]
                + (["-DWITH_CUDA"] if cuda else []),
                extra_ldflags=["-fopenmp"], extra_cuda_cflags=["-O3"])


def load():
    """The compiled extension (built on first use, then loaded from the cache), or RuntimeError
    with one line saying why not (no compiler, a failed build, another build that never ends)."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import CUDA_HOME
        cuda = torch.cuda.is_available() and CUDA_HOME is not None
        try:
            _module = build(cache_dir(cuda), cuda)
        except Exception as e:  # remember why, in one line
            msg = str(e).strip()
            _module = RuntimeError(msg.splitlines()[-1] if msg else type(e).__name__)
    if isinstance(_module, Exception):
        raise _module
    return _module


def build(folder: str, cuda: bool):
    """Copy the sources into `folder` and build there, holding an exclusive lock on the folder
    (an OS lock: a killed process leaves none behind). torch's own lock file in the folder is
    stale whenever we hold ours, e.g. after a build killed half way: it is removed, so a later run
    never waits on it forever."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: {compiler!r} is not on the PATH (set CXX or install "
                           "g++)")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "mech.lock"), "w") as lock:
        deadline = time.time() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    raise RuntimeError(f"another process has held the build lock of {folder} for "
                                       f"{LOCK_WAIT_S} s") from None
                time.sleep(0.5)
        if os.path.exists(os.path.join(folder, "lock")):
            os.remove(os.path.join(folder, "lock"))
        name = "mech_scan" + ("_cuda" if cuda else "")
        sources = [s for s in SOURCES if cuda or "cuda" not in s]
        for s in sources:  # the folder is named after their content: copy once, keep the mtimes
            if not os.path.exists(os.path.join(folder, s)):
                shutil.copyfile(os.path.join(HERE, s), os.path.join(folder, s + ".tmp"))
                os.replace(os.path.join(folder, s + ".tmp"), os.path.join(folder, s))
        if not os.path.exists(os.path.join(folder, name + ".so")):
            print(f"mech.py: building the selective-scan kernel (about a minute, once; cached in "
                  f"{folder})", file=sys.stderr, flush=True)
        from torch.utils.cpp_extension import load as torch_load
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch_load(name=name, sources=[os.path.join(folder, s) for s in sources
                                                  if not s.endswith(".h")],
                              build_directory=folder, verbose=False, **flags(cuda))


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), or '' where /proc/cpuinfo does not exist."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def kernel(device: torch.device, required: bool):
    """The compiled scan as a function with selective_scan_ref's signature, for tensors on `device`.
    If it cannot be had: RuntimeError when required, else None after a one-line warning (once)."""
    global _warned
    try:
        ext = load()
        if device.type == "cuda" and not ext.has_cuda():
            raise RuntimeError("it was built without its CUDA kernel (no nvcc, or torch without CUDA)")
    except RuntimeError as e:
        if required:
            raise RuntimeError(f"scan backend 'ext' is unavailable: {e}") from None
        if not _warned:
            _warned = True
            print(f"mech.py: warning: the scan extension is unavailable ({e}); using the reference loop",
                  file=sys.stderr)
        return None
    return SelectiveScanFn.apply


class SelectiveScanFn(torch.autograd.Function):
    """The extension's forward and backward as one autograd op. The kernel wants B and C as
    (b, l, n) contiguous: for Mamba, whose x_proj produces (B, L, N), the transposes are free."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        dtype = u.dtype
        if dtype not in (torch.float32, torch.float64):  # the kernel computes in fp32, like upstream
            u, delta, A, B, C, D, z, delta_bias = (None if x is None else x.float()
                                                    for x in (u, delta, A, B, C, D, z, delta_bias))
        A, D, delta_bias = (None if x is None else x.contiguous() for x in (A, D, delta_bias))
        B, C = B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous()  # (b, l, n)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
        ctx.delta_softplus, ctx.dtype = delta_softplus, dtype
        return load().fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus).to(dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel has no double backward
    def backward(ctx, dout):
        u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
        grads = load().bwd(dout.to(u.dtype), u, delta, A, B, C, D, z, delta_bias,
                           ctx.delta_softplus)
        du, ddelta, dA, dB, dC, dD, dz, dbias = (None if g is None else g.to(ctx.dtype)
                                                 for g in grads)
        return du, ddelta, dA, dB.transpose(1, 2), dC.transpose(1, 2), dD, dz, dbias, None
