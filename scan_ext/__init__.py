"""The compiled selective scan: the loader of this folder's kernels, and their autograd op.

torch.utils.cpp_extension.load compiles them on first use (about a minute) in a folder named after
the sources, the flags, the CPU and torch: $MECH_SCAN_CACHE/<key>/, else ~/.cache/mech_scan/<key>/.
"""
import fcntl
import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("selective_scan.cpp", "binding.cpp", "selective_scan_cuda.cu", "selective_scan.h")
_module = None     # the compiled module, or the BuildError its build raised (not retried)
build_key = None   # the loaded build's folder name: the hash of what its numbers depend on
_warned = False


class BuildError(RuntimeError):
    """Why the kernel cannot be had here, in one line."""


def flags(cuda: bool) -> dict:
    return dict(extra_cflags=["-O3", "-fopenmp", "-ffast-math", "-march=native"]
                + (["-DWITH_CUDA"] if cuda else []),
                extra_ldflags=["-fopenmp"], extra_cuda_cflags=["-O3"])


def cache_dir(cuda: bool) -> str:
    """The build folder of these sources and flags on this CPU (-march=native) and this torch."""
    with open("/proc/cpuinfo") if os.path.exists("/proc/cpuinfo") else open(os.devnull) as f:
        cpu = next((line for line in f if line.startswith(("flags", "Features"))), "")
    key = hashlib.sha1(repr((flags(cuda), cpu, torch.__version__)).encode())
    for name in SOURCES:
        key.update(pathlib.Path(HERE, name).read_bytes())
    root = os.environ.get("MECH_SCAN_CACHE") or os.path.expanduser("~/.cache/mech_scan")
    return os.path.join(root, key.hexdigest()[:16] + ("_cuda" if cuda else ""))


def load():
    """The compiled extension, or BuildError if its build failed (Ctrl-C or a stop goes on up)."""
    global _module, build_key
    if _module is None:
        try:
            _module = build()
            build_key = os.path.basename(os.path.dirname(_module.__file__))
        except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as e:
            # a build log's first error line (the compiler's), not its last (ninja's "stopped")
            lines = [s.strip() for s in str(e).strip().splitlines()] or [type(e).__name__]
            _module = BuildError(next((s for s in lines if "error" in s.lower()
                                       and not s.startswith("Error building")), lines[-1]))
    if isinstance(_module, BuildError):
        raise _module
    return _module


def sha1(path: str) -> str:
    return hashlib.sha1(pathlib.Path(path).read_bytes()).hexdigest()


def stamped(so: str) -> bool:
    """Whether the stamp written once so's build had loaded still gives its sha1. Only then is it
    dlopen'ed: a .so cut short (a full disk, a killed copy) crashes the process ("Bus error")."""
    try:
        return pathlib.Path(so + ".stamp").read_text() == sha1(so)
    except OSError:  # no build, or no stamp
        return False


def build():
    """A stamped build as it is (no compiler, lock or write: the cache may be read-only), else one
    built under an OS lock on its folder, freed when its process dies (torch's lock is not)."""
    from torch.utils.cpp_extension import CUDA_HOME, load as torch_load
    cuda = torch.cuda.is_available() and CUDA_HOME is not None
    folder, name = cache_dir(cuda), "mech_scan" + ("_cuda" if cuda else "")
    so = os.path.join(folder, name + ".so")
    if stamped(so):
        spec = importlib.util.spec_from_file_location(name, so)
        module = importlib.util.module_from_spec(spec)  # the dlopen
        spec.loader.exec_module(module)
        return module
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "mech.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # released when the other process's build ends, or it dies
            print(f"mech.py: waiting for another process's build of the selective-scan kernel "
                  f"(the lock {lock.name})", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if stamped(so):  # built by the process we waited for: imported as above
            return build()
        cxx = os.environ.get("CXX", "c++")
        if shutil.which(cxx) is None:  # else the one line would be ninja's
            raise BuildError(f"no C++ compiler: {cxx!r} not on the PATH (set CXX or install g++)")
        for old in (so, os.path.join(folder, "lock")):  # ninja could take a damaged .so as built
            if os.path.exists(old):
                os.remove(old)
        for s in SOURCES:  # copies: the build is of the sources the folder is named after
            shutil.copyfile(os.path.join(HERE, s), os.path.join(folder, s))
        print(f"mech.py: building the selective-scan kernel (about a minute, once; cached in "
              f"{folder})", file=sys.stderr, flush=True)
        units = SOURCES[:3] if cuda else SOURCES[:2]  # the .cpp files, and the .cu for CUDA
        module = torch_load(name=name, sources=[os.path.join(folder, s) for s in units],
                            build_directory=folder, **flags(cuda))
        pathlib.Path(so + ".stamp").write_text(sha1(so))  # one cut short matches no .so
        return module


def kernel(device: torch.device, required: bool):
    """The compiled scan, with selective_scan_ref's signature, for tensors on `device`. If it
    cannot be had: RuntimeError when required, else None after a one-line warning (once)."""
    global _warned
    try:
        ext = load()
        if device.type == "cuda" and not ext.has_cuda():
            raise BuildError("it was built without its CUDA kernel (no nvcc, or a CPU torch)")
    except BuildError as e:
        if required:
            raise RuntimeError(f"scan backend 'ext' is unavailable: {e}") from None
        if not _warned:
            _warned = True
            print(f"mech.py: warning: the scan extension is unavailable ({e}); using the reference "
                  "loop", file=sys.stderr)
        return None
    return SelectiveScanFn.apply


class SelectiveScanFn(torch.autograd.Function):
    """The kernels' forward and backward as one autograd op. They take B and C as (b, l, n)
    contiguous copies (b·l·n numbers each, small beside u's b·d·l); bf16 and fp16 run in fp32."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        (b, d, l), n = u.shape, A.shape[-1]
        for name, M in (("B", B), ("C", C)):
            if M.shape != (b, n, l):
                raise ValueError(f"scan extension: {name} must be per token, (b, n, l) = "
                                 f"{(b, n, l)}, not {tuple(M.shape)} (not constant or grouped)")
        ctx.dtype = u.dtype
        work = u.dtype if u.dtype in (torch.float32, torch.float64) else torch.float32
        u, delta, z = (None if x is None else x.to(work) for x in (u, delta, z))
        A, D, delta_bias = (None if x is None else x.to(work).contiguous()
                            for x in (A, D, delta_bias))
        B, C = (x.to(work).transpose(1, 2).contiguous() for x in (B, C))  # (b, l, n)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)  # as bwd takes them, after dout
        ctx.delta_softplus = delta_softplus
        return load().fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus).to(ctx.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel has no double backward
    def backward(ctx, dout):
        grads = load().bwd(dout.to(ctx.saved_tensors[0]), *ctx.saved_tensors, ctx.delta_softplus)
        du, ddelta, dA, dB, dC, dD, dz, dbias = (None if g is None else g.to(ctx.dtype)
                                                 for g in grads)
        return du, ddelta, dA, dB.transpose(1, 2), dC.transpose(1, 2), dD, dz, dbias, None
