import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mech

ARCHS = list(mech.MIXERS)
D_MODEL, NUM_KV = 16, 64


def make_cfg(arch, **kw):
    return mech.Config(**{**dict(arch=arch, d_model=D_MODEL, n_layer=2, num_kv=NUM_KV), **kw})


def make_model(arch, **kw):
    cfg = make_cfg(arch, **kw)
    return mech.build_model(cfg, mech.make_task(cfg).vocab_size), cfg


def random_ids(vocab, B, L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, L), generator=g)


def vocab_of(cfg):
    return mech.make_task(cfg).vocab_size


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ── the language model, every architecture ───────────────────────────────────────────────────

def test_registry_holds_the_seven_architectures():
    assert set(ARCHS) == {"attention", "base_conv", "based", "h3", "hyena", "mamba", "delta_net"}


@pytest.mark.parametrize("arch", ARCHS)
def test_output_shapes_and_at(arch):
    model, cfg = make_model(arch)
    V = vocab_of(cfg)
    ids = random_ids(V, 3, 13)
    at = torch.tensor([0, 7, 12])
    with torch.no_grad():
        full = model(ids)
        picked = model(ids, at=at)
    assert full.shape == (3, 13, V)
    assert picked.shape == (3, V)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(picked, full[torch.arange(3), at], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_and_gradients_reach_every_parameter(arch):
    model, cfg = make_model(arch)
    ex = mech.make_task(cfg).sample(3, mech.rng_for(0, "grad"))
    loss = F.cross_entropy(model(ex.ids, at=ex.pos["query"]), ex.answer)
    assert torch.isfinite(loss)
    # a fresh model predicts about uniformly over the vocabulary
    assert abs(loss.item() - math.log(vocab_of(cfg))) < 1.0
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{arch}: parameters without a gradient: {missing}"
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{arch}: non-finite gradients: {bad}"
    assert sum(p.grad.abs().sum() for p in model.parameters()) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_is_deterministic_given_seed(arch):
    a, cfg = make_model(arch)
    b, _ = make_model(arch)
    ids = random_ids(vocab_of(cfg), 2, 9)
    with torch.no_grad():
        assert torch.equal(a(ids), b(ids))


def test_sequence_longer_than_l_max_is_rejected():
    model, cfg = make_model("attention")
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.zeros(1, mech.L_MAX + 1, dtype=torch.long))


# ── causality ────────────────────────────────────────────────────────────────────────────────

CAUSAL_CASES = [(a, {}) for a in ARCHS] + [
    ("attention", dict(pos_emb=False)),
    ("mamba", dict(pos_emb=True)),
    ("based", dict(long_conv=True)),
    ("mamba", dict(d_conv=0)),
]


def perturbed_batch(x, ts, fresh):
    """x and, for each t in ts, a copy of x whose positions >= t are replaced by fresh(shape), stacked
    along the batch so that one forward checks every t (a forward is the slow part on a busy CPU)."""
    copies = [x]
    for t in ts:
        y = x.clone()
        y[:, t:] = fresh(y[:, t:].shape, t)
        copies.append(y)
    return torch.cat(copies)


def assert_causal(out, B, ts, atol=1e-10):
    base = out[:B]
    for n, t in enumerate(ts, 1):
        other = out[n * B:(n + 1) * B]
        torch.testing.assert_close(other[:, :t], base[:, :t], atol=atol, rtol=0, msg=f"t={t}")
        assert (other[:, t] - base[:, t]).abs().max() > 1e-6, f"t={t}: the change did not reach position t"


@pytest.mark.parametrize("arch, kw", CAUSAL_CASES, ids=lambda x: x if isinstance(x, str) else
                         ",".join(f"{k}={v}" for k, v in x.items()) or "default")
def test_model_is_causal(arch, kw):
    model, cfg = make_model(arch, **kw)
    model.double()
    V, L, ts = vocab_of(cfg), 14, (1, 6, 13)
    ids = random_ids(V, 2, L)
    # shifting every token by 1..V-1 (mod V) changes every token at positions >= t
    batch = perturbed_batch(ids, ts, lambda shape, t: (ids[:, t:] + 1 + random_ids(V - 1, *shape, seed=t)) % V)
    with torch.no_grad():
        assert_causal(model(batch), 2, ts)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer", [0, 1])
def test_mixer_is_causal(arch, layer):
    torch.manual_seed(0)
    mixer = mech.MIXERS[arch](make_cfg(arch), layer).double()
    L, ts = 11, (1, 5, 10)
    x = torch.randn(2, L, D_MODEL, dtype=torch.float64)
    batch = perturbed_batch(x, ts, lambda shape, t: torch.randn(shape, dtype=torch.float64))
    with torch.no_grad():
        y = mixer(batch)
    assert y.shape == batch.shape
    assert_causal(y, 2, ts)


def test_hybrids_alternate_by_layer():
    cfg = make_cfg("based")
    assert isinstance(mech.MIXERS["based"](cfg, 0), mech.BaseConv)
    assert isinstance(mech.MIXERS["based"](cfg, 1), mech.TaylorLinearAttention)
    assert isinstance(mech.MIXERS["based"](cfg, 2), mech.BaseConv)
    assert mech.MIXERS["based"](cfg, 0).conv.kernel_size == (3,)
    bc = make_cfg("base_conv")
    short, long = mech.MIXERS["base_conv"](bc, 0), mech.MIXERS["base_conv"](bc, 1)
    assert isinstance(short.conv, mech.CausalConv1d) and short.conv.kernel_size == (3,)
    assert isinstance(long.conv, mech.ImplicitLongConv)


# ── parameter counts of the official models ──────────────────────────────────────────────────

@pytest.mark.parametrize("arch, kw, vocab, expected", [
    ("mamba", dict(d_model=256, n_layer=2, pos_emb=False), 8196, 2_974_720),
    ("attention", dict(d_model=256, n_layer=2, pos_emb=True), 26, 1_847_296),
    ("mamba", dict(d_model=256, n_layer=1), 26, 445_184),
    ("based", dict(d_model=128, n_layer=2, pos_emb=False), 26, 319_872),
])
def test_official_parameter_counts(arch, kw, vocab, expected):
    cfg = mech.Config(arch=arch, **kw)
    assert n_params(mech.build_model(cfg, vocab)) == expected


def test_ar_vocabulary_matches_official():
    assert mech.make_task(mech.Config(arch="mamba")).vocab_size == 8196


# ── short-conv ablations ─────────────────────────────────────────────────────────────────────

def one_training_step(model, cfg):
    ex = mech.make_task(cfg).sample(8, mech.rng_for(0, "step"))
    loss_of = lambda: F.cross_entropy(model(ex.ids, at=ex.pos["query"]), ex.answer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = loss_of()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss_of()
    assert torch.isfinite(after)
    assert after < loss  # one step on the same batch lowers its loss
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before), set(before) - set(changed)


@pytest.mark.parametrize("arch, d_conv", [("mamba", 0), ("mamba", 1), ("mamba", 2), ("mamba", 4),
                                          ("delta_net", 0), ("delta_net", 4)])
def test_dconv_variants_train(arch, d_conv):
    model, cfg = make_model(arch, d_conv=d_conv)
    conv_params = [n for n, _ in model.named_parameters() if "conv1d" in n]
    if d_conv == 0:
        assert conv_params == []
    else:
        assert conv_params
        for m in model.modules():
            if isinstance(m, mech.CausalConv1d):
                assert m.kernel_size == (d_conv,)
    one_training_step(model, cfg)


def test_dconv_changes_parameter_count_as_expected():
    counts = {k: n_params(make_model("mamba", d_conv=k)[0]) for k in (0, 1, 4)}
    D_in, n_layer = 2 * D_MODEL, 2
    assert counts[1] - counts[0] == n_layer * (D_in + D_in)        # weight (D_in, 1, 1) + bias
    assert counts[4] - counts[0] == n_layer * (4 * D_in + D_in)


# ── Mamba's own init survives the generic init ──────────────────────────────────────────────

def test_mamba_init():
    model, cfg = make_model("mamba", d_model=64)
    for block in model.blocks:
        m = block.mixer
        dt = F.softplus(m.dt_proj.bias.detach())
        assert dt.shape == (128,)
        assert dt.min() >= 1e-3 - 1e-6 and dt.max() <= 0.1 + 1e-6
        assert dt.min() < 5e-3 and dt.max() > 5e-2  # log-uniform over the range, not one value
        expected = torch.log(torch.arange(1, 17).float()).repeat(128, 1)
        torch.testing.assert_close(m.A_log.detach(), expected)
        assert torch.equal(m.D.detach(), torch.ones(128))
        bound = 1 / math.sqrt(128) / math.sqrt(cfg.n_layer)   # kaiming-uniform / sqrt(n_layer)
        w = m.out_proj.weight.detach()
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
        assert m.dt_proj.weight.abs().max() <= 1 / math.sqrt(m.dt_rank)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod.bias is not None and not name.endswith("dt_proj"):
            assert torch.count_nonzero(mod.bias) == 0, name
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.02 * 0.05


# ── generic init (non-Mamba) ─────────────────────────────────────────────────────────────────

RESCALED = ("out_proj.weight", "fc2.weight")


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "mamba"])
def test_generic_init(arch):
    model, cfg = make_model(arch, d_model=128)
    small = 0.02 / math.sqrt(2 * cfg.n_layer)
    seen = set()
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if mod.bias is not None:
            assert torch.count_nonzero(mod.bias) == 0, name
        if mod.weight.numel() < 1000:  # too few entries for a good std estimate
            continue
        want = small if (name + ".weight").endswith(RESCALED) else 0.02
        std = mod.weight.std().item()
        assert abs(std - want) < 0.15 * want, (name, std, want)
        assert abs(mod.weight.mean().item()) < 0.2 * want, name
        seen.add(name.split(".")[-1])
    assert "fc2" in seen and "fc1" in seen
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.02 * 0.05
    expected_names = {"attention": {"Wqkv", "out_proj"}, "h3": {"output_linear", "q_proj"},
                      "based": {"proj_o", "proj_v", "projection"}, "hyena": {"out_proj", "in_proj"},
                      "delta_net": {"o_proj", "q_proj"}, "base_conv": {"projection"}}[arch]
    assert expected_names <= seen, expected_names - seen


def test_rescaled_and_not_rescaled_weights_by_name():
    model, cfg = make_model("attention", d_model=128)
    small = 0.02 / math.sqrt(2 * cfg.n_layer)
    for block in model.blocks:
        assert abs(block.mlp.fc2.weight.std().item() - small) < 0.15 * small
        assert abs(block.mixer.out_proj.weight.std().item() - small) < 0.15 * small
        assert abs(block.mixer.Wqkv.weight.std().item() - 0.02) < 0.15 * 0.02
    h3, _ = make_model("h3", d_model=128)
    for block in h3.blocks:
        assert abs(block.mixer.output_linear.weight.std().item() - 0.02) < 0.15 * 0.02
    based, _ = make_model("based", d_model=128)
    assert abs(based.blocks[1].mixer.proj_o.weight.std().item() - 0.02) < 0.15 * 0.02


# ── the selective scan against a per-(b, d), per-step loop ──────────────────────────────────

def naive_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, softplus=False):
    """h_t = exp(Δ_t A) h_{t-1} + Δ_t u_t B_t,  y_t = C_t·h_t + D u_t,  out = y SiLU(z), one channel at a time."""
    nb, nd, nl = u.shape
    out = []
    for b in range(nb):
        rows = []
        for d in range(nd):
            h = torch.zeros(A.shape[1], dtype=u.dtype)
            ys = []
            for t in range(nl):
                dt = delta[b, d, t] + (delta_bias[d] if delta_bias is not None else 0)
                if softplus:
                    dt = torch.log1p(torch.exp(dt)) if dt <= 20 else dt
                h = torch.exp(dt * A[d]) * h + dt * u[b, d, t] * B[b, :, t]
                y = (C[b, :, t] * h).sum()
                if D is not None:
                    y = y + D[d] * u[b, d, t]
                if z is not None:
                    y = y * z[b, d, t] * torch.sigmoid(z[b, d, t])
                ys.append(y)
            rows.append(torch.stack(ys))
        out.append(torch.stack(rows))
    return torch.stack(out)


SCAN_CASES = [  # (batch, channels, length, state, use D, use z, use delta_bias, softplus)
    (2, 3, 5, 4, True, True, True, True),
    (2, 3, 5, 4, False, False, False, False),
    (2, 3, 6, 1, True, False, True, False),
    (1, 2, 1, 4, True, True, True, True),
    (1, 3, 1, 1, False, True, False, True),
    (2, 2, 4, 4, False, True, True, False),
    (1, 2, 7, 4, True, False, False, True),
]


@pytest.mark.parametrize("nb, nd, nl, nn_, use_D, use_z, use_bias, softplus", SCAN_CASES)
def test_selective_scan_matches_loop(nb, nd, nl, nn_, use_D, use_z, use_bias, softplus):
    g = torch.Generator().manual_seed(nb * 100 + nl * 10 + nn_)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    u, z = r(nb, nd, nl), r(nb, nd, nl)
    delta = r(nb, nd, nl) if softplus else torch.rand(nb, nd, nl, generator=g, dtype=torch.float64)
    if softplus and nl > 2:
        delta[..., 1] = 21.0  # beyond softplus's threshold 20
    A = -torch.exp(r(nd, nn_))
    B, C = r(nb, nn_, nl), r(nb, nn_, nl)
    D, bias = r(nd), 0.3 * r(nd)
    inputs = dict(u=u, delta=delta, A=A, B=B, C=C, D=D if use_D else None, z=z if use_z else None,
                  delta_bias=bias if use_bias else None)
    leaves = {k: v.requires_grad_() for k, v in inputs.items() if v is not None}
    got = mech.selective_scan_ref(**inputs, delta_softplus=softplus)
    want = naive_scan(**inputs, softplus=softplus)
    assert got.shape == (nb, nd, nl) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    G = r(nb, nd, nl)
    g_got = torch.autograd.grad((got * G).sum(), list(leaves.values()))
    g_want = torch.autograd.grad((want * G).sum(), list(leaves.values()))
    for name, a, b in zip(leaves, g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"gradient w.r.t. {name}")
    via_dispatch = mech.selective_scan(**{k: v.detach() if v is not None else None for k, v in inputs.items()},
                                       delta_softplus=softplus)
    torch.testing.assert_close(via_dispatch, got.detach(), rtol=1e-13, atol=1e-14)


def test_selective_scan_keeps_input_dtype_and_rejects_unknown_backend():
    u = torch.randn(1, 2, 3, dtype=torch.bfloat16)
    A, B = -torch.ones(2, 4), torch.randn(1, 4, 3)
    out = mech.selective_scan(u, u.abs(), A, B, B)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="backend"):
        mech.selective_scan(u, u, A, B, B, backend="cuda")


@pytest.mark.parametrize("backend", mech.SCAN_BACKENDS)
@pytest.mark.parametrize("shape", [(2, 4), (1, 1, 4, 3), (1, 4, 2)])  # constant, grouped, short
def test_selective_scan_refuses_the_b_and_c_forms_it_does_not_compute(backend, shape):
    """mamba-ssm's constant (d, n) and grouped (b, g, n, l) B and C: one ValueError, either way."""
    u, A, B = torch.randn(1, 2, 3), -torch.ones(2, 4), torch.randn(1, 4, 3)
    for name, args in (("B", (torch.randn(shape), B)), ("C", (B, torch.randn(shape)))):
        with pytest.raises(ValueError, match=f"{name} must be per token, \\(b, n, l\\) = "
                                             r"\(1, 4, 3\), not"):
            mech.selective_scan(u, u.abs(), A, *args, backend=backend)


def test_mamba_mixer_uses_the_scan_as_specified():
    # the forward of mamba_ssm/modules/mamba_simple.py (Mamba.forward), written out with the naive scan
    torch.manual_seed(1)
    m = mech.Mamba(16, d_conv=3).double()
    x_in = torch.randn(2, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        x, z = m.in_proj(x_in).chunk(2, dim=-1)
        x = F.silu(m.conv1d(x))
        dt, B, C = m.x_proj(x).split([m.dt_rank, 16, 16], dim=-1)
        y = naive_scan(x.transpose(1, 2), (dt @ m.dt_proj.weight.T).transpose(1, 2), -torch.exp(m.A_log),
                       B.transpose(1, 2), C.transpose(1, 2), m.D, z.transpose(1, 2), m.dt_proj.bias, True)
        want = m.out_proj(y.transpose(1, 2))
        torch.testing.assert_close(m(x_in), want, rtol=1e-10, atol=1e-12)


# ── the delta rule against its per-step recurrence ─────────────────────────────────────────

def naive_delta_rule(q, k, v, beta):
    """S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,  o_t = S_tᵀ q_t, for each leading index."""
    lead = q.shape[:-2]
    qf, kf, vf, bf = (x.reshape(-1, *x.shape[len(lead):]) for x in (q, k, v, beta))
    outs = []
    for i in range(qf.shape[0]):
        S = torch.zeros(q.shape[-1], v.shape[-1], dtype=q.dtype)
        os_ = []
        for t in range(q.shape[-2]):
            kt = kf[i, t]
            S = S + bf[i, t] * torch.outer(kt, vf[i, t] - S.T @ kt)
            os_.append(S.T @ qf[i, t])
        outs.append(torch.stack(os_))
    return torch.stack(outs).reshape(*lead, q.shape[-2], v.shape[-1])


@pytest.mark.parametrize("L", [1, 5, 40])
def test_delta_rule_matches_recurrence(L):
    g = torch.Generator().manual_seed(L)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q, k, v = r(2, 2, L, 4), F.normalize(r(2, 2, L, 4), dim=-1), r(2, 2, L, 3)
    beta = torch.rand(2, 2, L, generator=g, dtype=torch.float64)
    leaves = [x.requires_grad_() for x in (q, k, v, beta)]
    got, want = mech.delta_rule(q, k, v, beta), naive_delta_rule(q, k, v, beta)
    assert got.shape == (2, 2, L, 3)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    G = r(2, 2, L, 3)
    for name, a, b in zip("q k v beta".split(), torch.autograd.grad((got * G).sum(), leaves),
                          torch.autograd.grad((want * G).sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=f"gradient w.r.t. {name}")


def test_delta_rule_with_beta_one_overwrites_the_value():
    # with β = 1 and orthonormal keys, reading key k_s returns exactly v_s (the state stores it)
    k = torch.eye(4, dtype=torch.float64)[None]
    v = torch.randn(1, 4, 3, dtype=torch.float64)
    o = mech.delta_rule(k, k, v, torch.ones(1, 4, dtype=torch.float64))
    torch.testing.assert_close(o, v)


# ── Based's Taylor linear attention against the explicit feature map ───────────────────────

def test_taylor_linear_attention_matches_feature_map():
    torch.manual_seed(0)
    m = mech.TaylorLinearAttention(D_MODEL).double()
    with torch.no_grad():
        for p in (m.proj_q.weight, m.proj_k.weight):
            p.mul_(3)  # larger q·k, so the quadratic term matters
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    f = m.feature_dim
    assert f == 8

    def phi(a):
        quad = (a[..., :, None] * a[..., None, :]).flatten(-2)
        return torch.cat([torch.ones_like(a[..., :1]), a / f ** 0.25, quad / (math.sqrt(2) * math.sqrt(f))], -1)

    with torch.no_grad():
        fq, fk, v = phi(m.proj_q(x)), phi(m.proj_k(x)), m.proj_v(x)
        assert fq.shape[-1] == 1 + f + f * f
        ys = []
        for n in range(x.shape[1]):
            w = (fq[:, n, None, :] * fk[:, :n + 1]).sum(-1)                 # (B, n+1)
            ys.append((w[..., None] * v[:, :n + 1]).sum(1) / (w.sum(1, keepdim=True) + m.eps))
        want = m.proj_o(torch.stack(ys, 1))
        got = m(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    s = (m.proj_q(x) @ m.proj_k(x).transpose(1, 2)).abs().max() / math.sqrt(f)
    assert s > 0.5


# ── long convolutions and H3's kernels ──────────────────────────────────────────────────────

@pytest.mark.parametrize("L", [1, 2, 7, 20, 37])
def test_causal_long_conv_is_the_direct_sum(L):
    g = torch.Generator().manual_seed(L)
    u = torch.randn(2, L, 3, generator=g, dtype=torch.float64)
    k = torch.randn(3, L, generator=g, dtype=torch.float64)
    want = torch.zeros_like(u)
    for b in range(2):
        for t in range(L):
            for c in range(3):
                want[b, t, c] = sum(k[c, t - s] * u[b, s, c] for s in range(t + 1))
    torch.testing.assert_close(mech.causal_long_conv(u, k), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("width", [1, 3, 4])
def test_short_causal_conv_formula(width):
    torch.manual_seed(width)
    conv = mech.CausalConv1d(3, width).double()
    x = torch.randn(2, 37, 3, dtype=torch.float64)
    w, bias = conv.weight[:, 0], conv.bias
    want = torch.zeros_like(x)
    for t in range(37):
        for i in range(width):
            s = t - (width - 1) + i
            if s >= 0:
                want[:, t] += w[:, i] * x[:, s]
    with torch.no_grad():
        torch.testing.assert_close(conv(x), want + bias, rtol=1e-12, atol=1e-12)


def test_short_conv_zero_width_is_identity():
    assert isinstance(mech.short_conv(4, 0, bias=True), torch.nn.Identity)


def random_h3(d=6, N=8, seed=0):
    torch.manual_seed(seed)
    m = mech.H3(d, d_state=N).double()
    with torch.no_grad():  # move every kernel parameter off its structured init
        for p in (m.shift_B, m.shift_C, m.C, m.B):
            p.copy_(torch.randn_like(p))
        m.inv_A_real.add_(0.3 * torch.randn_like(m.inv_A_real))
        m.A_imag.add_(torch.randn_like(m.A_imag))
        m.log_dt.copy_(torch.empty_like(m.log_dt).uniform_(math.log(1e-2), math.log(0.5)))
    return m


def test_h3_shift_kernel_at_init_is_C():
    m = mech.H3(4, d_state=8)
    torch.testing.assert_close(m.shift_kernel(8), m.shift_C.detach())


@pytest.mark.parametrize("L", [1, 5, 8, 12])
def test_h3_shift_kernel_is_cross_correlation(L):
    m = random_h3()
    B, C = m.shift_B.detach(), m.shift_C.detach()
    d, N = B.shape
    want = torch.zeros(d, L, dtype=torch.float64)
    for c in range(d):
        for l in range(min(L, N)):
            want[c, l] = sum(B[c, j] * C[c, j + l] for j in range(N - l))
    torch.testing.assert_close(m.shift_kernel(L).detach(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("L", [1, 6, 30])
def test_h3_diag_kernel_is_bilinear_s4d(L):
    m = random_h3()
    dt = np.exp(m.log_dt.detach().numpy())[:, None]                            # (H, 1)
    A = -np.exp(m.inv_A_real.detach().numpy()) + 1j * m.A_imag.detach().numpy()
    Bc = m.B.detach().numpy() @ np.array([1, 1j])
    Cc = m.C.detach().numpy() @ np.array([1, 1j])
    dA = (1 + dt * A / 2) / (1 - dt * A / 2)
    Cp = Bc * Cc * dt / (1 - dt * A / 2)
    want = np.stack([2 * (Cp * dA ** l).sum(-1).real for l in range(L)], -1)  # (H, L)
    got = m.diag_kernel(L).detach().numpy()
    assert got.shape == (m.H, L)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_h3_forward_matches_explicit_heads():
    # the per-head outer product and readout of zoology's h3.py, written with loops over heads
    m = random_h3(d=6, N=8)
    u = torch.randn(2, 7, 6, dtype=torch.float64)
    p, H, L = m.p, m.H, 7
    with torch.no_grad():
        q, k, v = m.q_proj(u), m.k_proj(u), m.v_proj(u)
        k = mech.causal_long_conv(k, m.shift_kernel(L)) + m.shift_D * k
        Kd = m.diag_kernel(L)
        out = torch.zeros(2, L, 6, dtype=torch.float64)
        for h in range(H):
            for i in range(p):
                for j in range(p):
                    kv = (k[..., h * p + i] * v[..., h * p + j])[..., None]          # (B, L, 1)
                    Y = mech.causal_long_conv(kv, Kd[h:h + 1]) + m.D[h] * kv
                    out[..., j * H + h] += q[..., h * p + i] * Y[..., 0]
        torch.testing.assert_close(m(u), m.output_linear(out), rtol=1e-10, atol=1e-12)


# ── Hyena's D skip flag ──────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("d_skip", [False, True])
def test_hyena_d_skip(d_skip):
    torch.manual_seed(0)
    m = mech.Hyena(D_MODEL, d_skip=d_skip).double()
    x = torch.randn(2, 8, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        y = m(x)
        m.D.add_(torch.randn_like(m.D))
        y2 = m(x)
    if d_skip:
        assert (y2 - y).abs().max() > 1e-6
    else:
        torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_hyena_d_skip_flag_reaches_the_model():
    model, _ = make_model("hyena", hyena_d_skip=False)
    assert all(not b.mixer.d_skip for b in model.blocks)
    model, _ = make_model("hyena")
    assert all(b.mixer.d_skip for b in model.blocks)
