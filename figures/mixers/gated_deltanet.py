"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464; Qwen3-Next's linear layers):
DeltaNet's delta rule under a Mamba-2 decay, one scalar per head and step. d_k = d/h, d_v = 2 d_k:
    q, k, v = SiLU(conv(W_q x)), SiLU(conv(W_k x)), SiLU(conv(W_v x))   short convs, no bias
    q, k = q/‖q‖, k/‖k‖;   β_t = sigmoid(W_b x_t);   g_t = -exp(A_log) softplus(W_a x_t + dt_bias)
    S_t = e^{g_t} (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,   S_0 = 0     state (d_k, d_v)
    o_t = S_tᵀ q_t / √d_k;   y = o_proj(RMSNorm(o) ⊙ SiLU(W_g x))         per head
For the whole sequence at once (mech.delta_rule's way, decayed): with G_t = Σ_{r<=t} g_r and
D[t, s] = e^{G_t - G_s} (s <= t, else 0), u = (I + tril(β D ⊙ K Kᵀ, -1))⁻¹ β V, o = (D ⊙ Q Kᵀ) u.
Official implementation: fla-org/flash-linear-attention, fla/layers/gated_deltanet.py
(GatedDeltaNet, its defaults: expand_v 2, use_gate, conv 4 without bias, q and k l2-normed in the
kernel, A uniform in [0, 16], dt_bias as Mamba-2's); fla/ops/gated_delta_rule/gate.py (the gate).
Differences: one head (mech.py's limit): d_k = d, not 0.75 d; one chunk solved exactly, no Triton;
fp32; the three convs' outputs side by side are the site conv_output (before SiLU); d_conv 0: no
convs, SiLU kept (as fla without its short conv). Its model is mech.py's, not fla's
GatedDeltaNetModel: a LayerNorm-GELU-MLP block (fla: RMSNorm, SwiGLU) and zoology's init, where
fla draws every Linear and Conv1d from N(0, 0.02) (here the convs keep PyTorch's default init);
o_norm's eps is the layer's default 1e-5 (fla's models pass norm_eps 1e-6); A_log and dt_bias
are not marked _no_weight_decay (no effect at the paper's weight decay 0)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import mech


def gated_delta_rule(q, k, v, beta, g):
    """q, k: (b, h, l, d_k), v: (b, h, l, d_v), beta, g: (b, h, l) -> o (b, h, l, d_v), unscaled."""
    l = q.shape[-2]
    G = g.cumsum(-1)                                           # (b, h, l): log of the decay so far
    past = torch.ones(l, l, dtype=torch.bool, device=q.device).tril()
    D = (G[..., :, None] - G[..., None, :]).masked_fill(~past, -math.inf).exp()   # (b, h, l, l)
    # row t of the system: u_t + β_t Σ_{s<t} D[t, s] (k_t·k_s) u_s = β_t v_t
    KK = (beta[..., None] * D * (k @ k.transpose(-1, -2))).tril(-1)
    eye = torch.eye(l, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(eye + KK, beta[..., None] * v, upper=False,
                                      unitriangular=True)             # (b, h, l, d_v)
    return (D * (q @ k.transpose(-1, -2))) @ u


class GatedDeltaNet(nn.Module):
    def __init__(self, d: int, n_head: int = 1, d_conv: int = 4, expand_v: int = 2):
        super().__init__()
        self.n_head, self.dims = n_head, [d, d, expand_v * d]    # q, k, v widths
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, w, bias=False) for w in self.dims)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (mech.short_conv(w, d_conv, bias=False)
                                                       for w in self.dims)
        self.conv_out = nn.Identity()                          # q, k, v convs' outputs, (b, l, 4d)
        self.sites = {"conv_output": "conv_out"} if d_conv else {}
        self.a_proj, self.b_proj = (nn.Linear(d, n_head, bias=False) for _ in range(2))
        # the official init: A uniform in [0, 16]; softplus(dt_bias) log-uniform in [1e-3, 0.1]
        self.A_log = nn.Parameter(torch.log(torch.empty(n_head).uniform_(0, 16)))
        dt = torch.exp(torch.rand(n_head) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.g_proj = nn.Linear(d, expand_v * d, bias=False)
        self.o_norm = nn.RMSNorm(expand_v * d // n_head, eps=1e-5)
        self.o_proj = nn.Linear(expand_v * d, d, bias=False)

    def forward(self, x):                                      # x: (b, l, d)
        b, l, _ = x.shape
        qkv = torch.cat([self.q_conv1d(self.q_proj(x)), self.k_conv1d(self.k_proj(x)),
                         self.v_conv1d(self.v_proj(x))], dim=-1)
        q, k, v = (t.view(b, l, self.n_head, -1).transpose(1, 2)   # (b, h, l, d_k or d_v)
                   for t in F.silu(self.conv_out(qkv)).split(self.dims, dim=-1))
        q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))  # l2norm
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)  # (b, h, l)
        g = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)      # (b, l, h)
        o = gated_delta_rule(q * q.shape[-1] ** -0.5, k, v, beta, g.transpose(1, 2))
        o = self.o_norm(o.transpose(1, 2)) * F.silu(self.g_proj(x).view(b, l, self.n_head, -1))
        return self.o_proj(o.reshape(b, l, -1))


mech.register_mixer("gated_deltanet", lambda cfg, layer: GatedDeltaNet(
    cfg.d_model, cfg.n_head, d_conv=cfg.d_conv), d_conv=4)
