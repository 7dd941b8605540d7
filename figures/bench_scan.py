"""Benchmark of the compiled selective scan on the CPU, against another checkout's kernel and two
pure-PyTorch scans, all in one process:

    python figures/bench_scan.py --old /path/to/other/checkout     # 1 thread, medians of 7

- "new": this checkout's scan_ext/ kernel; "old": the kernel of the checkout given with --old
  (built from its scan_ext/*.cpp into a cache folder of its own, run through this loader's
  autograd op); the two timed in rounds that alternate them, so that a noisy host hits both;
- "ref": mech.selective_scan_ref, the loop with mamba-ssm's selective_scan_ref semantics;
- "parallel": a log-depth parallel scan in pure PyTorch, the idea of mamba.py's pscan
  (alxndrTL/mamba.py; Hillis-Steele's form here, not its in-place Blelloch sweeps); these two in
  rounds of their own, after the kernels' (their gigabytes of temporaries slowed the kernels
  timed beside them: a backward timed slower than forward and backward together);
at (b, l, d, n) = (32, 37, 128, 16), the paper's shape for d_model 64, and at l = 400 and 1024,
as Mamba passes them (u, delta, z transposed views; D, z, delta_bias and softplus on): forward,
backward (the kernels only: through a graph kept from one forward) and both; then one
training step of a 2-layer d_model 64 Mamba on AR (batch 32) with each kernel, and the largest
difference between the two kernels on a Mamba layer's forward and backward. Not a test.
"""
import argparse
import glob
import hashlib
import os
import shutil
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mech  # noqa: E402
import scan_ext  # noqa: E402

SHAPES = [(32, 37, 128, 16), (32, 400, 128, 16), (32, 1024, 128, 16)]  # (b, l, d, n)


def scan_parallel(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """h_t by ⌈log2 l⌉ rounds of (a', x') ∘ (a, x) = (a' a, a' x + x') on (b, d, l, n) tensors:
    after the round with offset k, h_t sums the writes of the last 2k steps."""
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    dt = F.softplus(dt) if delta_softplus else dt
    a = torch.exp(dt[..., None] * A[:, None, :])                          # (b, d, l, n)
    h = (dt * u)[..., None] * B.transpose(1, 2)[:, None]                  # Δ_t u_t B_t
    k, l = 1, u.shape[2]
    while k < l:
        h = torch.cat([h[:, :, :k], torch.addcmul(h[:, :, k:], a[:, :, k:], h[:, :, :-k])], 2)
        if 2 * k < l:
            a = torch.cat([a[:, :, :k], a[:, :, k:] * a[:, :, :-k]], 2)
        k *= 2
    y = (h * C.transpose(1, 2)[:, None]).sum(-1) + (0 if D is None else D[:, None] * u)
    return y if z is None else y * F.silu(z)


def build_old(checkout: str):
    """The kernel of another checkout's scan_ext/, built (CPU only, the same flags) in a folder
    named after its sources."""
    from torch.utils.cpp_extension import load
    files = sorted(glob.glob(os.path.join(checkout, "scan_ext", "*.cpp"))
                   + glob.glob(os.path.join(checkout, "scan_ext", "*.h")))
    if not files:
        sys.exit(f"bench_scan.py: no scan_ext/*.cpp in {checkout}")
    key = hashlib.sha1(b"".join(open(f, "rb").read() for f in files)).hexdigest()[:16]
    folder = os.path.join(os.path.dirname(scan_ext.cache_dir(False)), "old_" + key)
    os.makedirs(folder, exist_ok=True)
    for f in files:
        shutil.copyfile(f, os.path.join(folder, os.path.basename(f)))
    return load(name="mech_scan_old", sources=[os.path.join(folder, os.path.basename(f))
                                               for f in files if f.endswith(".cpp")],
                build_directory=folder, **scan_ext.flags(False))


def problem(b, l, d, n, seed=0):
    """Mamba's inputs: u, delta, z transposed views of (b, l, d) leaves; Δ's bias as at init."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    dt0 = torch.exp(torch.rand(d, generator=g) * 4.6 - 6.9)               # Δ in [1e-3, 0.1]
    leaves = dict(u=r(b, l, d), delta=0.5 * r(b, l, d), A=-torch.arange(1.0, n + 1).repeat(d, 1),
                  B=r(b, l, n), C=r(b, l, n), D=r(d), z=r(b, l, d),
                  delta_bias=dt0 + torch.log(-torch.expm1(-dt0)))
    leaves = {k: v.requires_grad_() for k, v in leaves.items()}
    kw = {k: v.transpose(1, 2) if v.dim() == 3 else v for k, v in leaves.items()}
    return dict(kw, delta_softplus=True), list(leaves.values()), torch.randn(b, d, l, generator=g)


def with_kernel(module, fn):
    """fn() with scan_ext's loader handing out `module` (the old or the new kernel)."""
    def run():
        saved, scan_ext._module = scan_ext._module, module
        try:
            return fn()
        finally:
            scan_ext._module = saved
    return run


def rounds(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Median wall-clock seconds of each fn, timed in alternating rounds."""
    times = {k: [] for k in fns}
    for i in range(warmup + repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            if i >= warmup:
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def scan_fns(kernels, shape, slow: bool):
    kw, leaves, G = problem(*shape)
    fns = {}
    for name, fn in [*((k, mech.selective_scan) for k in kernels),
                     *([("ref", mech.selective_scan_ref), ("parallel", scan_parallel)] if slow
                       else [])]:
        wrap = (lambda f: with_kernel(kernels[name], f)) if name in kernels else (lambda f: f)
        kwargs = dict(kw, backend="ext") if name in kernels else kw
        fns[name + " fwd"] = wrap(lambda fn=fn, kwargs=kwargs: fn(**kwargs))
        fns[name + " fwd+bwd"] = wrap(lambda fn=fn, kwargs=kwargs: torch.autograd.grad(
            fn(**kwargs), leaves, G))
        if name in kernels:  # the backward alone, through a graph kept from one forward
            out = wrap(lambda fn=fn, kwargs=kwargs: fn(**kwargs))()
            fns[name + " bwd"] = wrap(lambda out=out: torch.autograd.grad(
                out, leaves, G, retain_graph=True))
    return fns


def train_step_fn(module):
    cfg = mech.Config(arch="mamba", d_model=64, scan="ext")
    task = mech.make_task(cfg)
    torch.manual_seed(0)
    model = mech.build_model(cfg, task.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)   # as mech.train on CPU
    batch = task.sample(32, mech.rng_for(0, "bench"))

    def step():
        loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return with_kernel(module, step)


def mamba_difference(kernels) -> float:
    """max |old - new| over a Mamba layer's output and parameter gradients (d_model 64, l 37)."""
    results = []
    for module in kernels.values():
        torch.manual_seed(0)
        layer = mech.Mamba(64, scan="ext")
        x = torch.randn(8, 37, 64, generator=torch.Generator().manual_seed(1))
        out = with_kernel(module, lambda: layer(x))()
        with_kernel(module, lambda: out.square().sum().backward())()
        results.append([out.detach(), *(p.grad for p in layer.parameters())])
    return max((a - b).abs().max().item() for a, b in zip(*results))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", metavar="CHECKOUT", help="another checkout whose kernel to compare")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds, at least 5 (default 7)")
    p.add_argument("--no-slow", action="store_true", help="time the kernels only, not ref/parallel")
    args = p.parse_args(argv)
    if args.repeats < 5 or args.threads < 1:
        p.error("--repeats must be at least 5 and --threads at least 1")
    if args.old and not os.path.isdir(os.path.join(args.old, "scan_ext")):
        p.error(f"--old: {args.old} has no scan_ext/ folder")
    torch.set_num_threads(args.threads)
    kernels = {"new": scan_ext.load()}
    if args.old:
        kernels["old"] = build_old(args.old)
    print(f"{args.threads} thread(s), medians of {args.repeats} rounds, torch {torch.__version__}")
    ratios = [k for k in ["old", "ref", "parallel"] if k in kernels or not args.no_slow]
    cols = ["(b, l, d, n)", "timing", *(f"{k} ms" for k in kernels),
            *(f"{k} / new" for k in ratios)]
    print("\n| " + " | ".join(cols) + " |\n|---|---|" + "---:|" * (len(cols) - 2))
    for shape in SHAPES:
        fns = scan_fns(kernels, shape, not args.no_slow)
        med = rounds({k: f for k, f in fns.items() if k.split()[0] in kernels}, args.repeats)
        med |= rounds({k: f for k, f in fns.items() if k.split()[0] not in kernels}, args.repeats)
        for timing in ("fwd", "bwd", "fwd+bwd"):
            row = [f"{1e3 * med[f'{k} {timing}']:,.1f}" for k in kernels]
            row += [f"{med[f'{k} {timing}'] / med[f'new {timing}']:.2f}" if f"{k} {timing}" in med
                    else "" for k in ratios]
            print(f"| {shape} | {timing} | " + " | ".join(row) + " |")
    med = rounds({k: train_step_fn(m) for k, m in kernels.items()}, args.repeats, warmup=2)
    print("\nMamba training step, 2 layers, d_model 64, AR, batch 32: "
          + ", ".join(f"{k} {1e3 * t:.1f} ms" for k, t in med.items())
          + (f"; old / new {med['old'] / med['new']:.2f}" if "old" in med else ""))
    if "old" in kernels:
        print(f"max |old - new| on a Mamba layer's forward and backward (d_model 64, l 37, fp32): "
              f"{mamba_difference(kernels):.3g}")


if __name__ == "__main__":
    main()
