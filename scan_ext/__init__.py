"""The compiled selective scan: build, cache and autograd glue for the kernels in this folder.

mech.py shows the scan as a readable loop (selective_scan_ref) and reaches this fast path through one
call, kernel(device, required). Nothing here changes the maths; it only makes the loop fast:
    selective_scan.cpp        forward and backward on the CPU (OpenMP, vectorised over the state)
    selective_scan_cuda.cu    the same on CUDA, built only where torch sees a GPU and nvcc exists
Both are compiled on first use with torch.utils.cpp_extension.load (about a minute) and cached under
~/.cache/torch_extensions, outside the repository.
"""
import os
import platform
import sys
import warnings
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
_module = None   # the compiled module, or the exception its build raised (not retried)
_warned = False


def load():
    """The compiled extension (built on first use, then loaded from the cache), or RuntimeError with
    the build's last line of error (a missing compiler, ninja or header)."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import CUDA_HOME, load as build
        cuda = torch.cuda.is_available() and CUDA_HOME is not None
        # -march=native code runs only on CPUs like this one: name the build after the CPU, so that
        # a cache shared with other machines never hands them a binary they cannot execute
        cpu = zlib.crc32(platform.processor().encode() + cpu_flags().encode())
        sources = ["selective_scan.cpp"] + (["selective_scan_cuda.cu"] if cuda else [])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _module = build(name=f"mech_scan{'_cuda' if cuda else ''}_{cpu:08x}",
                                sources=[os.path.join(HERE, s) for s in sources],
                                extra_cflags=["-O3", "-fopenmp", "-ffast-math", "-march=native"]
                                + (["-DWITH_CUDA"] if cuda else []),
                                extra_ldflags=["-fopenmp"], extra_cuda_cflags=["-O3"], verbose=False)
        except Exception as e:  # remember why, in one line
            msg = str(e).strip()
            _module = RuntimeError(msg.splitlines()[-1] if msg else type(e).__name__)
    if isinstance(_module, Exception):
        raise _module
    return _module


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
