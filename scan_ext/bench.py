"""Benchmark of Mamba's selective scan on the CPU: the extension (backend "ext"), the reference loop
(backend "ref") and pure-PyTorch formulations written here, then one training step of small models.

    python scan_ext/bench.py                 # the full run (a few minutes; the ref loop is slow at L=1024)
    python scan_ext/bench.py --threads 1     # torch.set_num_threads(1)
    python scan_ext/bench.py --quick         # one shape, few repeats: a smoke test

In one process it
1. builds (or loads) the extension and says which;
2. checks every scan formulation against mech.selective_scan_ref (forward and all gradients, the fp32
   tolerances of mamba-ssm's own tests, state-spaces/mamba tests/ops/test_selective_scan.py), on a
   few small problems;
3. times forward + backward of each pure-PyTorch formulation at one shape and keeps the fastest;
4. times forward + backward of ext, ref and that fastest formulation at the paper's shapes (B = 32,
   L = 35, D = 2d for d in {64, 256}, N = 16; D, z, delta_bias and softplus on, u, delta, z given as
   transposed views of (B, L, D) tensors as Mamba does) and at L = 256 and 1024;
5. times one training step (forward, backward, AdamW) of a 2-layer d = 64 Mamba language model on AR
   with each backend, and of an attention model of the same width;
6. prints markdown tables: medians of wall-clock time and of CPU time (time.process_time, all threads
   of this process, less sensitive to other jobs on a shared machine), and their ratios.
Not a test: pytest does not collect it.
"""
import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mech  # noqa: E402
import scan_ext  # noqa: E402


# ── pure-PyTorch formulations ────────────────────────────────────────────────────────────────
# Same signature and semantics as mech.selective_scan_ref. Shapes: u, delta, z (b, d, l); A (d, n);
# B, C (b, n, l); D, delta_bias (d,). Each is checked against the reference before it is timed.

def _steps(delta, delta_bias, delta_softplus):
    pre = delta if delta_bias is None else delta + delta_bias[:, None]
    return pre, (F.softplus(pre) if delta_softplus else pre)        # F.softplus: threshold 20


def _inputs(u, dt, A, B):
    """log a_t = Δ_t A (<= 0) and x_t = Δ_t u_t B_t, both (b, d, l, n)."""
    return dt[..., None] * A[:, None, :], (dt * u)[..., None] * B.transpose(1, 2)[:, None]


def _readout(h, u, C, D, z):
    """y_t = C_t · h_t (+ D u_t), times SiLU(z_t): (b, d, l, n) states -> (b, d, l)."""
    y = (h * C.transpose(1, 2)[:, None]).sum(-1)
    if D is not None:
        y = y + D[:, None] * u
    return y if z is None else y * F.silu(z)


def scan_segsum(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, chunk=8):
    """Chunked and fully parallel in time, with segment sums (Mamba-2's SSD, with a decay per (d, n)).

    In a chunk of T steps with S_t = Σ_{r<=t} log a_r (cumulative, within the chunk), the state is
    h_t = Σ_{s<=t} exp(S_t - S_s) x_s + exp(S_t) H, where H is the state entering the chunk. Only the
    differences S_t - S_s for s <= t are exponentiated: they are <= 0, so nothing overflows, and the
    masked entries are set to -inf before exp (so they get a zero gradient, not a NaN). H for every
    chunk comes from the same construction one level up, over the chunks' total log-decays.
    The price: (b, d, l, T, n) and (b, d, c, c, n) tensors, T or c times the work of a loop.
    """
    _, dt = _steps(delta, delta_bias, delta_softplus)
    la, x = _inputs(u, dt, A, B)
    b, d, l, n = la.shape
    T = min(chunk, l)
    c = -(-l // T)
    if c * T != l:  # pad with steps that neither decay nor write
        la, x = F.pad(la, (0, 0, 0, c * T - l)), F.pad(x, (0, 0, 0, c * T - l))
    la, x = la.view(b, d, c, T, n), x.view(b, d, c, T, n)
    S = la.cumsum(3)                                                        # (b, d, c, T, n)
    causal = torch.ones(T, T, dtype=torch.bool, device=u.device).tril()[:, :, None]
    seg = (S.unsqueeze(4) - S.unsqueeze(3)).masked_fill(~causal, -math.inf)  # [t, s] = S_t - S_s
    h_in = (torch.exp(seg) * x.unsqueeze(3)).sum(4)                         # the chunk's own writes
    tot = S[:, :, :, -1].cumsum(2)                                          # (b, d, c, n)
    before = torch.ones(c, c, dtype=torch.bool, device=u.device).tril(-1)[:, :, None]
    seg2 = (F.pad(tot, (0, 0, 1, 0))[:, :, :-1].unsqueeze(3) - tot.unsqueeze(2)).masked_fill(~before, -math.inf)
    H = (torch.exp(seg2) * h_in[:, :, :, -1].unsqueeze(2)).sum(3)           # state entering chunk k
    h = (h_in + torch.exp(S) * H.unsqueeze(3)).reshape(b, d, c * T, n)[:, :, :l]
    return _readout(h, u, C, D, z)


def scan_blocked(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Two-level scan: 2√L sequential steps instead of L, all with decays <= 1 (nothing to overflow).

    Cut time into c chunks of T ≈ √L steps. (1) Run the recurrence inside all chunks at once, one
    position at a time (T steps on (b, d, c, n) tensors), keeping the local states h_in and the decay
    products P_t = a_1 ... a_t. (2) Carry the state across chunks (c steps on (b, d, n)):
    H_k = P_end,k H_{k-1} + h_in_end,k. (3) h_t = h_in_t + P_t H_{k-1}. The loops iterate over
    unbind() pieces: indexing x[:, :, t] in a loop costs a full-size zero tensor per step in the
    backward, which makes the backward quadratic in L.
    """
    _, dt = _steps(delta, delta_bias, delta_softplus)
    la, x = _inputs(u, dt, A, B)
    b, d, l, n = la.shape
    T = max(1, round(math.sqrt(l)))
    c = -(-l // T)
    a = torch.exp(la)
    if c * T != l:
        a, x = F.pad(a, (0, 0, 0, c * T - l)), F.pad(x, (0, 0, 0, c * T - l))
    a, x = a.view(b, d, c, T, n), x.view(b, d, c, T, n)
    hs, ps, h, p = [], [], None, None
    for aj, xj in zip(a.unbind(3), x.unbind(3)):       # inside every chunk at once
        h = xj if h is None else torch.addcmul(xj, aj, h)
        p = aj if p is None else p * aj
        hs.append(h)
        ps.append(p)
    Hs, H = [], torch.zeros_like(hs[0][:, :, 0])
    for h_end, p_end in zip(hs[-1].unbind(2), ps[-1].unbind(2)):   # across chunks
        Hs.append(H)
        H = torch.addcmul(h_end, p_end, H)
    h = torch.addcmul(torch.stack(hs, 3), torch.stack(ps, 3), torch.stack(Hs, 2).unsqueeze(3))
    return _readout(h.reshape(b, d, c * T, n)[:, :, :l], u, C, D, z)


def scan_hillis_steele(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Log-depth parallel scan (Hillis-Steele) on the pairs (a_t, x_t) with the associative operator
    (a', x') ∘ (a, x) = (a' a, a' x + x'): after the round with offset k, h_t holds the sum over the
    last 2k steps. ⌈log2 L⌉ rounds on full (b, d, l, n) tensors: O(L log L) work, decays <= 1."""
    _, dt = _steps(delta, delta_bias, delta_softplus)
    la, h = _inputs(u, dt, A, B)
    a, l, k = torch.exp(la), la.shape[2], 1
    while k < l:
        h = torch.cat([h[:, :, :k], torch.addcmul(h[:, :, k:], a[:, :, k:], h[:, :, :-k])], 2)
        if 2 * k < l:
            a = torch.cat([a[:, :, :k], a[:, :, k:] * a[:, :, :-k]], 2)
        k *= 2
    return _readout(h, u, C, D, z)


class AdjointScan(torch.autograd.Function):
    """The recurrence as a loop with a hand-written backward: the adjoint state runs backwards in time,
    g_t = dy_t C_t + a_{t+1} ⊙ g_{t+1} (as in mamba-ssm's CUDA backward, state-spaces/mamba
    csrc/selective_scan/selective_scan_bwd_kernel.cuh), and every gradient is then a
    full-size product or batched matmul of the stored states H and adjoints g.

    Work is kept in (b, l, d, n) layout, so that the step-t slice is contiguous, and the only
    sequential parts are one in-place addcmul per step forward (h_t = a_t h_{t-1} + x_t) and one per
    step backward. Autograd records nothing inside the loops, so there is no per-step graph, no
    per-step saved tensor, and no full-size zero tensor per step in the backward (the reference
    loop's x[:, :, t] indexing costs one, which makes its backward quadratic in L).
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
        pre, dt = _steps(delta, delta_bias, delta_softplus)
        ul, dtl, Bl, Cl = (x.transpose(1, 2) for x in (u, dt, B, C))         # (b, l, d), (b, l, n)
        a = torch.exp(dtl.unsqueeze(-1) * A)                                  # (b, l, d, n)
        H = (dtl * ul).unsqueeze(-1) * Bl.unsqueeze(2)                        # x_t, becomes h_t
        for t in range(1, H.shape[1]):
            H[:, t].addcmul_(a[:, t], H[:, t - 1])
        y = torch.matmul(H, Cl.unsqueeze(-1)).squeeze(-1)                     # (b, l, d)
        if D is not None:
            y = y + D * ul
        ctx.save_for_backward(u, pre, dt, A, B, C, D, z, delta_bias, a, H, y)
        ctx.delta_softplus = delta_softplus
        out = y if z is None else y * F.silu(z.transpose(1, 2))
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, dout):
        u, pre, dt, A, B, C, D, z, delta_bias, a, H, y = ctx.saved_tensors
        ul, dtl, Bl, Cl, dy = (x.transpose(1, 2) for x in (u, dt, B, C, dout))
        dz = None
        if z is not None:
            zl = z.transpose(1, 2)
            s = torch.sigmoid(zl)
            dz = (dy * y * s * (1 + zl * (1 - s))).transpose(1, 2)
            dy = dy * zl * s
        g = dy.unsqueeze(-1) * Cl.unsqueeze(2)                                # dy_t C_t, becomes g_t
        for t in range(g.shape[1] - 2, -1, -1):
            g[:, t].addcmul_(a[:, t + 1], g[:, t + 1])
        dC = torch.matmul(dy.unsqueeze(2), H).squeeze(2)                      # Σ_d dy h: (b, l, n)
        dB = torch.matmul((dtl * ul).unsqueeze(2), g).squeeze(2)              # Σ_d g Δ u
        gB = torch.matmul(g, Bl.unsqueeze(-1)).squeeze(-1)                    # Σ_n g B: (b, l, d)
        du = gB * dtl if D is None else gB * dtl + D * dy
        q = g * a                                                             # g_t a_t h_{t-1}
        q[:, 1:] *= H[:, :-1]
        q[:, 0] = 0
        dA = torch.einsum("bld,bldn->dn", dtl, q)
        ddelta = (gB * ul + (q * A).sum(-1)).transpose(1, 2)                # dL/dΔ
        if ctx.delta_softplus:
            ddelta = torch.where(pre > 20, ddelta, ddelta * torch.sigmoid(pre))
        dD = None if D is None else (dy * ul).sum((0, 1))
        dbias = None if delta_bias is None else ddelta.sum((0, 2))
        return du.transpose(1, 2), ddelta, dA, dB.transpose(1, 2), dC.transpose(1, 2), dD, dz, dbias, None


def scan_adjoint(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    return AdjointScan.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


CANDIDATES = {"adjoint loop": scan_adjoint, "blocked 2-level": scan_blocked,
              "hillis-steele": scan_hillis_steele, "segsum chunks": scan_segsum}
BACKENDS = {"ext": lambda **kw: mech.selective_scan(**kw, backend="ext"),
            "ref": lambda **kw: mech.selective_scan(**kw, backend="ref")}


# ── problems, checks, timing ─────────────────────────────────────────────────────────────────

def problem(b, l, d, n, seed=0, full=True, dtype=torch.float32):
    """Inputs as Mamba passes them: u, delta, z transposed views of (b, l, d) leaves, B and C of
    (b, l, n) leaves; Δ's bias from Mamba's init (Δ in [1e-3, 0.1]), A = -(1, ..., n) (S4D-real).
    full=False: no D, z or bias, and no softplus (with a positive delta, as upstream).
    Returns (kwargs, leaves)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)
    dt0 = torch.exp(torch.rand(d, generator=g, dtype=dtype) * math.log(100) + math.log(1e-3))
    leaves = dict(u=r(b, l, d), delta=0.5 * r(b, l, d) if full else 0.1 * torch.rand(b, l, d, generator=g, dtype=dtype),
                  A=-torch.arange(1, n + 1, dtype=dtype).repeat(d, 1), B=r(b, l, n), C=r(b, l, n))
    if full:
        leaves.update(D=r(d), z=r(b, l, d), delta_bias=dt0 + torch.log(-torch.expm1(-dt0)))
    leaves = {k: v.requires_grad_() for k, v in leaves.items()}
    kw = {k: v.transpose(1, 2) if v.dim() == 3 else v for k, v in leaves.items()}
    return dict(kw, delta_softplus=full), leaves


def cotangent(kw, seed=1):
    """A fixed random ∂loss/∂out for problem kw (drawn once, outside the timed calls)."""
    return torch.randn(kw["u"].shape, generator=torch.Generator().manual_seed(seed), dtype=kw["u"].dtype)


def fwd_bwd(fn, kw, leaves, G):
    out = fn(**kw)
    grads = torch.autograd.grad(out, list(leaves.values()), G, allow_unused=True)
    return out, {k: torch.zeros_like(v) if gr is None else gr for (k, v), gr in zip(leaves.items(), grads)}


TOL = {"out": (6e-4, 2e-3), "u": (1.2e-3, 4e-3), "delta": (3e-3, 2e-2), "A": (1e-3, 5e-3)}  # test_selective_scan.py's fp32


def check(name, fn):
    """fn against mech.selective_scan_ref on small problems: None if it agrees, else what differs."""
    for shape, full in [((2, 37, 7, 16), True), ((2, 64, 5, 4), False), ((3, 1, 4, 16), True), ((1, 271, 3, 8), True)]:
        kw, leaves = problem(*shape, seed=sum(shape), full=full)
        G = cotangent(kw)
        out, grads = fwd_bwd(fn, kw, leaves, G)
        out_r, grads_r = fwd_bwd(mech.selective_scan_ref, kw, leaves, G)
        for k, a, b in [("out", out, out_r), *((k, grads[k], grads_r[k]) for k in grads)]:
            rtol, atol = TOL.get(k, TOL["out"])
            if not torch.allclose(a, b, rtol=rtol, atol=atol):
                return f"{k} differs at shape {shape}: max |diff| {(a - b).abs().max().item():.2g}"
    return None


def measure(fn, repeats, warmup=1, budget_s=60.0):
    """Medians of wall-clock and CPU time (seconds) over up to `repeats` calls after `warmup` calls,
    and the number of calls timed: fewer once about budget_s is spent; a call slower than half the
    budget (even a warm-up) is the only one timed."""
    wall, cpu, spent = [], [], 0.0
    for i in range(warmup + repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w, time.process_time() - c
        spent += w
        if i >= warmup or w > budget_s / 2:
            wall.append(w)
            cpu.append(c)
        if wall and (w > budget_s / 2 or spent + w > budget_s):
            break
    return statistics.median(wall), statistics.median(cpu), len(wall)


def time_scan(fn, shape, repeats, warmup=1, budget_s=60.0):
    kw, leaves = problem(*shape)
    G = cotangent(kw)
    return measure(lambda: fwd_bwd(fn, kw, leaves, G), repeats, warmup, budget_s)


def time_train_step(arch, scan, repeats, budget_s=60.0, batch_size=32):
    cfg = mech.Config(arch=arch, d_model=64, scan=scan)
    task = mech.make_task(cfg)
    model = mech.build_model(cfg, task.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)   # as mech.train on CPU
    batch = task.sample(batch_size, mech.rng_for(0, "bench"))

    def step():
        loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return measure(step, repeats, warmup=2, budget_s=budget_s)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_extension():
    """Load the extension, building it if it is not cached; returns it and a line saying which."""
    t = time.perf_counter()
    try:
        ext = scan_ext.load()
    except RuntimeError as e:
        sys.exit(f"bench.py: the scan extension is unavailable: {e}")
    took = time.perf_counter() - t
    # loading a cached build takes well under a second; compiling it, a minute or two
    return ext, (f"cached (loaded in {took:.1f} s)" if took < 10 else f"built in {took:.0f} s (not cached)")


def ms(x):
    return f"{1e3 * x:,.1f}" if x < 10 else f"{x:,.1f} s"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (default: torch's choice)")
    p.add_argument("--repeats", type=int, default=11, help="timed repeats per measurement (medians are reported)")
    p.add_argument("--quick", action="store_true", help="one shape and few repeats: a smoke test")
    p.add_argument("--budget-s", type=float, default=60.0,
                   help="about how long to spend on one measurement: slow ones get fewer repeats (default 60)")
    p.add_argument("--max-run-s", type=float, default=900.0,
                   help="skip a ref timing whose single run is foreseen to take longer (default 900)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = 2 if args.quick and args.repeats == 11 else args.repeats

    ext, how = load_extension()
    print(f"# selective scan benchmark\n\ntorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU: {cpu_model()} ({os.cpu_count()} logical cores), load average before: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
          f"extension: {how}; openmp {ext.openmp()}, max_threads {ext.max_threads()}, cuda {ext.has_cuda()}\n"
          f"times: medians of {repeats} repeats after a warm-up (wall-clock; CPU = process time, all threads)\n")
    busy, policy = os.getloadavg()[0], os.environ.get("OMP_WAIT_POLICY", "unset")
    print(f"OMP_WAIT_POLICY={policy}\n")
    if torch.get_num_threads() > 1 and busy + torch.get_num_threads() > (os.cpu_count() or 1) + 0.5:
        print(f"note: load average {busy:.1f} on {os.cpu_count()} cores. With other jobs running, every parallel "
              "region waits for a descheduled thread, and with active waiting (the default) the waiting thread "
              "spins: multi-threaded times, CPU times included, can be inflated 2-40x. OMP_WAIT_POLICY=PASSIVE "
              "(set before Python starts) tames that.\n")

    # 1. correctness of every formulation, then pick the fastest pure-PyTorch one
    failed = {name: why for name, fn in {"ext": BACKENDS["ext"], **CANDIDATES}.items()
              if (why := check(name, fn))}
    for name, why in failed.items():
        print(f"- {name}: REJECTED, {why}")
    if "ext" in failed:
        sys.exit("the extension disagrees with the reference; not timing it")
    pick_shape = (8, 35, 128, 16) if args.quick else (32, 35, 128, 16)
    print(f"## pure-PyTorch formulations, forward + backward at (B, L, D, N) = {pick_shape}\n")
    print("| formulation | wall ms | CPU ms | check |\n|---|---:|---:|---|")
    picks = {}
    for name, fn in CANDIDATES.items():
        if name in failed:
            print(f"| {name} | | | fails |")
            continue
        picks[name] = time_scan(fn, pick_shape, max(1, min(repeats, 3)), budget_s=args.budget_s)
        print(f"| {name} | {ms(picks[name][0])} | {ms(picks[name][1])} | agrees with ref |")
    best = min(picks, key=lambda k: picks[k][0])
    print(f"\nfastest: {best} (used below as 'vec')\n")

    # 2. ext, ref, best pure-PyTorch at the paper's shapes and at long L
    shapes = [(32, 35, 128, 16)] if args.quick else [(32, 35, 128, 16), (32, 35, 512, 16),
                                                     (32, 256, 128, 16), (32, 1024, 128, 16)]
    print("## selective scan, forward + backward (D, z, delta_bias, softplus on; Mamba's strided layout)\n")
    print("| B, L, D, N | ext ms | ref ms | vec ms | ref/ext | vec/ext | CPU ms ext / ref / vec | CPU ref/ext | CPU vec/ext |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    runs = lambda t: "" if t[2] == repeats else f" ({t[2]} run{'s' * (t[2] > 1)})"
    ref_at = {}  # (B, D, N) -> (L, wall s) of the last ref timing, to foresee the next one
    for shape in shapes:
        b, l, d, n = shape
        t_ext = time_scan(BACKENDS["ext"], shape, repeats, budget_s=args.budget_s)
        t_vec = time_scan(CANDIDATES[best], shape, repeats, budget_s=args.budget_s)
        # foresee the ref loop's time from the last shape, conservatively as if quadratic in L
        prev = ref_at.get((b, d, n))
        guess = prev[1] * (l / prev[0]) ** 2 if prev else 0.0
        if guess > args.max_run_s:
            t_ref, ref_cell = None, f"≈{guess:,.0f} s, skipped (over --max-run-s)"
        else:
            t_ref = time_scan(BACKENDS["ref"], shape, repeats, budget_s=args.budget_s)
            ref_at[(b, d, n)] = (l, t_ref[0])
            ref_cell = ms(t_ref[0]) + runs(t_ref)
        ratio = lambda i, t: "" if t is None else f"{t[i] / t_ext[i]:.1f}"
        print(f"| {b}, {l}, {d}, {n} | {ms(t_ext[0])}{runs(t_ext)} | {ref_cell} | {ms(t_vec[0])}{runs(t_vec)} | "
              f"{ratio(0, t_ref)} | {ratio(0, t_vec)} | {ms(t_ext[1])} / {ms(t_ref[1]) if t_ref else '-'} / "
              f"{ms(t_vec[1])} | {ratio(1, t_ref)} | {ratio(1, t_vec)} |", flush=True)

    # 3. one training step of the language models
    print("\n## one training step (forward, backward, AdamW): 2 layers, d = 64, AR, batch 32\n")
    steps = {"mamba, scan ext": time_train_step("mamba", "ext", repeats, args.budget_s),
             "mamba, scan ref": time_train_step("mamba", "ref", repeats, args.budget_s),
             "attention": time_train_step("attention", "auto", repeats, args.budget_s)}
    print("| model | wall ms | CPU ms |\n|---|---:|---:|")
    for name, t in steps.items():
        print(f"| {name} | {ms(t[0])}{runs(t)} | {ms(t[1])} |")
    (we, ce, _), (wr, cr, _), (wa, ca, _) = steps.values()
    print(f"\nmamba ref step / ext step: {wr / we:.2f} (CPU {cr / ce:.2f}); "
          f"mamba ext step / attention step: {we / wa:.2f} (CPU {ce / ca:.2f})")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
