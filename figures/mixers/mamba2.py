"""Mamba-2 (SSD; Dao & Gu 2024, arXiv 2405.21060): Mamba with a scalar decay per head, d_state 64,
expand 2 (d_inner = 2d), heads of headdim P = 64, one group of B and C shared by all heads:
    z, xBC, dt = split(in_proj(u))           (b, l, d_inner), (b, l, d_inner + 2N), (b, l, H)
    x, B, C = split(SiLU(conv(xBC)))         one short causal conv over x, B and C together
    Δ = softplus(dt + dt_bias);   a_t = Δ_t A,   A = -exp(A_log)          per head
    h_t = exp(a_t) h_{t-1} + Δ_t x_t B_tᵀ,   y_t = h_t C_t + D x_t        state (P, N) per head
    out = out_proj(RMSNorm(y ⊙ SiLU(z)))     the gate before the norm (norm_before_gate=False)
computed in SSD's quadratic (attention-like) form, one chunk as long as the sequence:
    y = (L ∘ C Bᵀ)(Δ ⊙ x) + D x,   L[t, s] = exp(a_{s+1} + ... + a_t) for s <= t, else 0.
Official implementation: state-spaces/mamba, mamba_ssm/modules/mamba2_simple.py (Mamba2Simple: its
defaults but headdim 64, as mamba2.py's Mamba2; its init of A, dt_bias and D) and
mamba_ssm/modules/ssd_minimal.py (the chunk's L, as its segsum_unstable: a difference of cumulative
sums). Differences: one chunk, no Triton; fp32; one head of all of d_inner where 64 does not divide
it (d = 16: P = 32); no conv parameters when d_conv = 0 (SiLU kept, as mech.Mamba); in Mamba's block
(RMSNorm, no MLP) with mamba_ssm's init (mamba_block=True), as the paper's wrapper puts Mamba.
A_log, dt_bias and D are not marked _no_weight_decay (no effect at the paper's weight decay 0)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import mech


def ssd(x, dt, A, B, C):
    """SSD's quadratic form. x: (b, l, H, P), dt: (b, l, H), A: (H,), B, C: (b, l, N) -> x's shape;
    the loop over time that it equals is in tests/test_new_mixers.py."""
    a = (dt * A).transpose(1, 2).cumsum(-1)                  # (b, H, l): Σ_{r<=t} a_r
    causal = torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool, device=a.device).tril()
    # exp of a masked difference, never a ratio of exps: e^{-Σa} alone would overflow
    L = (a[..., :, None] - a[..., None, :]).masked_fill(~causal, -math.inf).exp()  # (b, H, l, l)
    scores = (C @ B.transpose(1, 2))[:, None] * L             # (b, H, l, l): C_t · B_s, decayed
    return (scores @ (x * dt[..., None]).transpose(1, 2)).transpose(1, 2)          # (b, l, H, P)


class Mamba2(nn.Module):
    def __init__(self, d: int, d_conv: int = 4, d_state: int = 64, expand: int = 2,
                 headdim: int = 64, dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        d_in = expand * d
        self.d_inner, self.d_state = d_in, d_state
        # heads of headdim where it divides d_inner (the official code asserts it), else one
        self.nheads = H = d_in // headdim if d_in % headdim == 0 else 1
        self.headdim = d_in // H
        self.in_proj = nn.Linear(d, 2 * d_in + 2 * d_state + H, bias=False)  # z, x, B, C, dt
        self.conv1d = mech.short_conv(d_in + 2 * d_state, d_conv, bias=True)
        self.conv_out = nn.Identity()                         # the conv's output, before SiLU
        self.sites = {"conv_output": "conv_out"} if d_conv else {}
        # the official init: Δ log-uniform in [dt_min, dt_max] through softplus⁻¹ as dt_bias,
        # A uniform in [1, 16], D = 1; init_weights (mech.py) leaves these three alone
        dt = torch.exp(torch.rand(H) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(H))
        self.norm = nn.RMSNorm(d_in, eps=1e-5)
        self.out_proj = nn.Linear(d_in, d, bias=False)

    def forward(self, u):                                     # u: (b, l, d)
        b, l, _ = u.shape
        z, xBC, dt = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * self.d_state,
                                            self.nheads], dim=-1)
        xBC = F.silu(self.conv_out(self.conv1d(xBC)))         # (b, l, d_inner + 2N)
        x, B, C = xBC.split([self.d_inner, self.d_state, self.d_state], dim=-1)
        x = x.view(b, l, self.nheads, self.headdim)           # (b, l, H, P)
        dt = F.softplus(dt + self.dt_bias)                    # (b, l, H)
        y = ssd(x, dt, -torch.exp(self.A_log), B, C) + self.D[:, None] * x
        return self.out_proj(self.norm(y.reshape(b, l, -1) * F.silu(z)))


mech.register_mixer("mamba2", lambda cfg, layer: Mamba2(cfg.d_model, d_conv=cfg.d_conv), d_conv=4,
                    mamba_block=True)
