"""Kimi Delta Attention (KDA; Kimi Team 2025, arXiv 2510.26692; Kimi Linear's linear layers):
Gated DeltaNet with a decay per key channel, not per head. d_k = d_v = d/h; per head:
    q, k, v = SiLU(conv(W_q x)), SiLU(conv(W_k x)), SiLU(conv(W_v x))   short convs, no bias
    q, k = q/‖q‖, k/‖k‖;  β_t = sigmoid(W_b x_t);  g_t = -exp(A_log) softplus(f_proj(x_t) + dt_bias)
    S_t = (I - β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t-1} + β_t k_t v_tᵀ,  S_0 = 0    g_t: (d_k,)
    o_t = S_tᵀ q_t / √d_k;   y = o_proj(RMSNorm(o) ⊙ sigmoid(g_proj(x)))   f_proj, g_proj: 2 layers
In chunks of 16 steps: with Γ_t = Σ g_r since the chunk began, S the state before it, and
a ⋆ b [t, s] = Σ_c a_t[c] b_s[c] e^{Γ_t[c] - Γ_s[c]} (s <= t), every exponent <= 0 (no overflow):
    u = (I + tril(β (k ⋆ k), -1))⁻¹ β (v - (k ⊙ e^Γ) S),     o = (q ⊙ e^Γ) S + tril(q ⋆ k) u,
    S <- e^{Γ_last} ⊙ S + (k ⊙ e^{Γ_last - Γ})ᵀ u
Official implementation: fla-org/flash-linear-attention, fla/layers/kda.py (KimiDeltaAttention:
expand_v 1, conv 4 without bias, A uniform in [1, 16], dt_bias as Mamba-2's, q, k l2-normed in the
kernel), fla/ops/kda/gate.py, fla/ops/kda/naive.py. Differences: one head (mech.py's limit):
d_k = d; chunks of 16, not 64; f_proj and g_proj full rank (their bottleneck is the head width,
d); fp32, no Triton; conv_output: q, k, v's convs before SiLU; d_conv 0: no convs, SiLU kept.
Its model is mech.py's, not fla's KDAModel: a LayerNorm-GELU-MLP block (fla: RMSNorm, SwiGLU) and
zoology's init, where fla draws every Linear and Conv1d from N(0, 0.02) (here the convs keep
PyTorch's default init); o_norm's eps is the layer's default 1e-5 (fla's models pass norm_eps
1e-6); A_log and dt_bias are not marked _no_weight_decay (no effect at weight decay 0)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import mech


def kda_rule(q, k, v, beta, g, chunk: int = 16):
    """q, k, g: (b, h, l, d_k), v: (b, h, l, d_v), beta: (b, h, l) -> o (b, h, l, d_v), unscaled."""
    S, out = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]), []  # (b, h, d_k, d_v)
    for i in range(0, q.shape[-2], chunk):
        q_, k_, v_, b_, g_ = (t[:, :, i:i + chunk] for t in (q, k, v, beta, g))
        G = g_.cumsum(-2)                                     # (b, h, c, d_k): log-decay so far
        # e^{Γ_t - Γ_s} k_s per pair (t, s), c² d_k (why chunks); clamped only where s > t (dropped)
        decay_k = (G[..., :, None, :] - G[..., None, :, :]).clamp(max=0).exp() * k_[..., None, :, :]
        kk, qk = (decay_k @ torch.stack([k_, q_], dim=-1)).unbind(-1)     # (b, h, c, c) each
        lower = torch.eye(kk.shape[-1]).to(kk) + (b_[..., None] * kk).tril(-1)  # I + tril(β k⋆k)
        u = torch.linalg.solve_triangular(lower, b_[..., None] * (v_ - (k_ * G.exp()) @ S),
                                          upper=False, unitriangular=True)   # (b, h, c, d_v)
        out.append((q_ * G.exp()) @ S + qk.tril() @ u)
        S = G[..., -1, :, None].exp() * S + ((G[..., -1:, :] - G).exp() * k_).transpose(-1, -2) @ u
    return torch.cat(out, dim=2)


class KimiDeltaAttention(nn.Module):
    def __init__(self, d: int, n_head: int = 1, d_conv: int = 4):
        super().__init__()
        self.n_head, dh = n_head, d // n_head
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (mech.short_conv(d, d_conv, bias=False)
                                                       for _ in range(3))
        self.conv_out = nn.Identity()                         # q, k, v convs' outputs, (b, l, 3d)
        self.sites = {"conv_output": "conv_out"} if d_conv else {}
        self.f_proj = nn.Sequential(nn.Linear(d, dh, bias=False), nn.Linear(dh, d, bias=False))
        self.b_proj = nn.Linear(d, n_head, bias=False)
        # official init: A ~ U[1, 16]; softplus(dt_bias) log-uniform in [1e-3, 0.1] (fla, 2026-03)
        self.A_log = nn.Parameter(torch.log(torch.empty(n_head).uniform_(1, 16)))
        dt = torch.exp(torch.rand(d) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.g_proj = nn.Sequential(nn.Linear(d, dh, bias=False), nn.Linear(dh, d, bias=True))
        self.o_norm = nn.RMSNorm(dh, eps=1e-5)
        self.o_proj = nn.Linear(d, d, bias=False)

    def heads(self, t):                                       # (b, l, h·c) -> (b, h, l, c)
        return t.view(*t.shape[:2], self.n_head, -1).transpose(1, 2)

    def forward(self, x):                                     # x: (b, l, d)
        qkv = torch.cat([self.q_conv1d(self.q_proj(x)), self.k_conv1d(self.k_proj(x)),
                         self.v_conv1d(self.v_proj(x))], dim=-1)
        q, k, v = map(self.heads, F.silu(self.conv_out(qkv)).chunk(3, dim=-1))
        q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))  # l2norm
        beta = self.heads(torch.sigmoid(self.b_proj(x)))[..., 0]          # (b, h, l)
        g = self.heads(F.softplus(self.f_proj(x) + self.dt_bias)) * -self.A_log.exp()[:, None, None]
        o = kda_rule(q * q.shape[-1] ** -0.5, k, v, beta, g)  # (b, h, l, d_v)
        o = self.o_norm(o) * torch.sigmoid(self.heads(self.g_proj(x)))
        return self.o_proj(o.transpose(1, 2).flatten(2))


mech.register_mixer("kda", lambda cfg, layer: KimiDeltaAttention(
    cfg.d_model, cfg.n_head, d_conv=cfg.d_conv), d_conv=4)
