"""The worked examples of "Your own mixer": Mamba-2, Gated DeltaNet and Kimi Delta Attention
(figures/mixers/), each against a step-by-step loop of its recurrence written here, in float64,
and each in a 2-layer model that learns AR."""
import os
import runpy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mech

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("mamba2", "gated_deltanet", "kda")


@pytest.fixture(scope="module")
def files():
    """Each file run once into copies of the registries: {name: the file's globals}."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mech, "MIXERS", dict(mech.MIXERS))
        mp.setattr(mech, "DEFAULT_DCONV", dict(mech.DEFAULT_DCONV))
        yield {name: runpy.run_path(os.path.join(ROOT, "figures", "mixers", f"{name}.py"))
               for name in NAMES}


def mixer(name, d=16, **fields):
    torch.manual_seed(0)
    cfg = mech.Config(arch=name, d_model=d, num_kv=64, n_train=64, **fields)
    return mech.MIXERS[name](cfg, 0).double()


# The recurrences, one step at a time, as the papers write them (state S or h, zero at the start)
def ssd_loop(x, dt, A, B, C):      # Mamba-2: h_t = e^{Δ_t A} h_{t-1} + Δ_t x_t B_tᵀ, y_t = h_t C_t
    h, ys = x.new_zeros(*x.shape[:1], *x.shape[2:], B.shape[-1]), []     # (b, H, P, N)
    for t in range(x.shape[1]):
        decay = torch.exp(dt[:, t] * A)[..., None, None]                  # (b, H, 1, 1)
        h = decay * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None, :]
        ys.append((h * C[:, t, None, None, :]).sum(-1))
    return torch.stack(ys, 1)


def delta_loop(q, k, v, beta, g):  # S_t = (I - β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t-1} + β_t k_t v_tᵀ
    S, os_ = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]), []      # (b, h, d_k, d_v)
    for t in range(q.shape[2]):
        decay = g[:, :, t].exp()                      # (b, h): one per head, or (b, h, d_k)
        S = decay.view(*decay.shape, *(1,) * (4 - decay.dim())) * S
        k_t = k[:, :, t, :, None]
        S = S + k_t * (beta[:, :, t, None, None] * (v[:, :, t, None, :] - k_t.mT @ S))
        os_.append((S * q[:, :, t, :, None]).sum(-2))  # o_t = S_tᵀ q_t
    return torch.stack(os_, 2)


def inputs(b=2, h=2, l=37, d_k=8, d_v=6, per_channel=False):
    """Unit keys, β in (0, 1), log-decays from -0.01 to -30 a step: Γ falls below -700, so a form
    that divided e^{Γ_t} by e^{Γ_s} would overflow even in float64."""
    torch.manual_seed(1)
    q, k = (F.normalize(torch.randn(b, h, l, d_k, dtype=torch.double), dim=-1) for _ in range(2))
    v = torch.randn(b, h, l, d_v, dtype=torch.double)
    beta = torch.rand(b, h, l, dtype=torch.double)
    g = -torch.rand(b, h, l, *((d_k,) if per_channel else ()), dtype=torch.double) ** 4 * 30
    return q, k, v, beta, g


def test_mamba2_ssd_equals_its_recurrence(files):
    torch.manual_seed(2)
    b, l, H, P, N = 2, 37, 3, 4, 5
    x = torch.randn(b, l, H, P, dtype=torch.double)
    dt = F.softplus(torch.randn(b, l, H, dtype=torch.double)) * 3
    A = -torch.rand(H, dtype=torch.double) * 16
    B, C = (torch.randn(b, l, N, dtype=torch.double) for _ in range(2))
    torch.testing.assert_close(files["mamba2"]["ssd"](x, dt, A, B, C), ssd_loop(x, dt, A, B, C))


def test_gated_deltanet_equals_its_recurrence(files):
    q, k, v, beta, g = inputs()
    torch.testing.assert_close(files["gated_deltanet"]["gated_delta_rule"](q, k, v, beta, g),
                               delta_loop(q, k, v, beta, g))


@pytest.mark.parametrize("chunk", [16, 5, 64])  # chunks that cut l = 37 unevenly, and one chunk
def test_kda_chunks_equal_its_recurrence(files, chunk):
    q, k, v, beta, g = inputs(per_channel=True)
    torch.testing.assert_close(files["kda"]["kda_rule"](q, k, v, beta, g, chunk=chunk),
                               delta_loop(q, k, v, beta, g))


@pytest.mark.parametrize("name", NAMES)
def test_causal(files, name):
    m, x = mixer(name), torch.randn(2, 40, 16, dtype=torch.double)
    for t in (0, 15, 16, 39):  # KDA's chunk boundaries too
        later = torch.cat([x[:, :t], torch.randn_like(x[:, t:])], dim=1)
        torch.testing.assert_close(m(later)[:, :t], m(x)[:, :t], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(m(later)[:, t], m(x)[:, t])


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(files, name):
    m = mixer(name, d=8)
    x = torch.randn(1, 5, 8, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,), fast_mode=True)  # a random projection: seconds
    # and the parameters of each recurrence's own (decays, skips, convs, norms): not the Linears
    params = {n: p for n, p in m.named_parameters() if "proj" not in n}
    assert torch.autograd.gradcheck(
        lambda *p: torch.func.functional_call(m, dict(zip(params, p)), (x.detach(),)),
        tuple(params.values()), fast_mode=True)


def test_kda_rule_gradcheck_across_chunks(files):
    args = [t[:1, :1, :6, :3].clone().requires_grad_() if t.dim() == 4 else
            t[:1, :1, :6].clone().requires_grad_() for t in inputs(per_channel=True)]
    assert torch.autograd.gradcheck(lambda *a: files["kda"]["kda_rule"](*a, chunk=4), args)


@pytest.mark.parametrize("name", NAMES)
def test_dconv_sets_the_short_conv_and_its_site(files, name):
    for d_conv, width in ((None, 4), (2, 2), (0, None)):
        m = mixer(name, d_conv=d_conv)
        convs = [c for c in m.modules() if isinstance(c, mech.CausalConv1d)]
        assert {c.kernel_size[0] for c in convs} == ({width} if width else set())
        assert ("conv_output" in m.sites) == bool(width)
    model = mech.build_model(mech.Config(arch=name, d_model=16, num_kv=64, n_train=64), 68)
    assert ("conv_output", 1) in list(mech.sites_in(model))


def test_mamba2_heads_of_64_where_64_divides_d_inner_else_one(files):
    x = torch.randn(1, 5, 112, dtype=torch.double)
    for d, heads in ((16, (1, 32)), (64, (2, 64)), (112, (1, 224))):  # d_inner = 2d
        m = mixer("mamba2", d=d)
        assert (m.nheads, m.headdim) == heads
        assert m(x[..., :d]).shape == (1, 5, d)


class RunningMean(nn.Module):  # a control that cannot recall: the mean so far knows no order
    def forward(self, x):
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


def ar_accuracy(arch: str, lr: float) -> float:
    """A 2-layer model, d = 32, on AR with 2 pairs a document drawn from 8 keys and 8 values,
    fresh documents, batch 64, 300 steps (~5-7 s of CPU each). Guessing a value of the document
    scores 1/2. Measured (seeds 0-9): GDN at lr 5e-3 0.99-1.0, KDA 1.0 (with its present init);
    Mamba-2 at 5e-3 0.70-1.0, at 1e-2 1.0 but seed 9 (0.84); the running mean 0.44-0.54 (seeds
    0-4), a local conv of width 4 up to 1.0 (two layers see the whole document: no control here)."""
    cfg = mech.Config(arch=arch, d_model=32, n_pairs=2, num_kv=16, fresh_data=True, lr=lr,
                      batch_size=64, steps=300, eval_every=300, n_eval=256, seed=0)
    return mech.train(cfg, device="cpu", log=lambda m: None, dynamics=False)[1]["accuracy"]


@pytest.mark.parametrize("name, lr", [("mamba2", 1e-2), ("gated_deltanet", 5e-3), ("kda", 5e-3)])
def test_a_two_layer_model_learns_associative_recall(files, name, lr):
    assert ar_accuracy(name, lr) >= 0.9


def test_the_bar_is_out_of_reach_without_recall(files, monkeypatch):
    monkeypatch.setitem(mech.MIXERS, "running_mean", lambda cfg, layer: RunningMean())
    assert ar_accuracy("running_mean", 5e-3) < 0.6
