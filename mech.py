"""mech.py: a single-file reproduction of "Mechanistic evaluation of Transformers and state
space models" (Arora, Rathi, Selvam, Csordás, Jurafsky, Potts; arXiv 2505.15105).

Tiny 2-layer models of seven architectures learn Associative Recall (AR) and Associative
Treecall (ATR); interchange interventions then ask *how* each solved it. Guaranteed: the
official maths (an official quirk is a flag, the paper's intent its default); not the official
RNG calls, nor fused CUDA speed. Reading: Zoology (arXiv 2312.04927), H3 (2212.14052), Hyena
(2302.10866), Mamba (2312.00752), mamba-minimal, DeltaNet (2406.06484). Shapes: b batch, l
length, d width, h heads. Glossary:
    d_model, d         "Model dimension": the width of the residual stream
    pos_emb            PE / NoPE: learned absolute position embedding on or off
    pos["key"]         Key: the queried key in context (ATR: the queried word)
    pos["value"]       Value: the value next to it (ATR: the word's parent or sibling)
    pos["query"]       Query: the repeated key, where the prediction is read
    d_conv             "Conv.": width of the short causal convolution (0 = none)
    d_state, d_inner   N: SSM state size per channel; E·d, Mamba's expanded width
    dt_rank, dt, delta R: rank of Δ's projection; Δ (dt, delta), an SSM's step size
    phi, feature_dim   φ: Based's Taylor feature map, φ(q)·φ(k) ≈ exp(q·k/√f); f = 8
    beta, S            β, S: DeltaNet's write strength and fast-weight state
    max_rhs_len        Lmax: ATR rules have 1 .. Lmax-1 children plus a head word
    n_terminals        |Σ|: ATR's word vocabulary (20 or 8192)
Run it: python mech.py --arch mamba --task ar --dconv 4 (more in --help and README.md)."""

import contextlib
import dataclasses
import json
import math
import os
import signal
import time
import zlib
from bisect import bisect_right

# Set before torch loads (its OpenMP, libgomp, reads it then): a waiting thread spins 3,000
# times, not 300,000, then sleeps: other work does not stall a run (figures/bench_threads.py)
os.environ.setdefault("GOMP_SPINCOUNT", "3000")
if __name__ == "__main__":  # a Ctrl-C while torch loads: exit 130, quietly (as the appendix)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from numpy.random import Generator  # noqa: E402

import scan_ext  # noqa: E402

PAD, BOS, EOS = 0, 1, 2  # the special tokens of both tasks
L_MAX = 1024  # n_positions, the longest sequence; the implicit filters' grid; H3's N


# 1. The first task: Associative Recall (AR) ------------------------------------------------
# A task is seen only through its Examples, vocab_size, sample and other_token (ATR: §7).
def rng_for(seed: int, stream: str) -> Generator:
    """A random stream per (seed, purpose): test documents never depend on training draws."""
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


def distinct_ints(rng: Generator, n: int, k: int, high: int) -> np.ndarray:
    """(n, k): each row k distinct integers, uniform in [0, high), in random order."""
    if k * k > 2 * high:  # repeats would be common: the first k of a shuffle
        return np.argsort(rng.random((n, high)), axis=1)[:, :k]
    x = rng.integers(0, high, (n, k))
    while True:  # redraw the rows with a repeat
        repeats = (np.diff(np.sort(x, axis=1), axis=1) == 0).any(axis=1)
        if not repeats.any():
            return x
        x[repeats] = rng.integers(0, high, (int(repeats.sum()), k))


def other_than(tokens: torch.Tensor, first: int, n: int, rng: Generator) -> torch.Tensor:
    """For each token (ids first .. first+n-1), another id of that range, uniformly."""
    r = torch.from_numpy(rng.integers(0, n - 1, len(tokens))).to(tokens.device)
    return first + r + (r >= tokens - first)  # skip the original: uniform over the others


@dataclasses.dataclass
class Examples:
    """Documents with their named positions (one per document and name)."""
    ids: torch.Tensor  # (n, l) token ids, right-padded with PAD when lengths differ
    pos: dict          # name -> (n,) LongTensor: key, value, divider, query, answer

    @classmethod
    def from_numpy(cls, ids: np.ndarray, **pos: np.ndarray) -> "Examples":
        pos = {k: torch.from_numpy(v).long() for k, v in pos.items()}
        return cls(torch.from_numpy(ids), pos)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):  # a slice or an index tensor selects documents
        return Examples(self.ids[i], {name: p[i] for name, p in self.pos.items()})

    def to(self, device):
        return Examples(self.ids.to(device), {k: v.to(device) for k, v in self.pos.items()})

    def trim(self):  # cut padding no document needs (ATR): causal, outputs stay (to rounding)
        return Examples(self.ids[:, :int(self.pos["answer"].max()) + 2], self.pos)

    @property
    def answer(self) -> torch.Tensor:  # (n,) the token the model must predict at pos["query"]
        return self.ids[torch.arange(len(self), device=self.ids.device), self.pos["answer"]]


class AR:
    """Associative Recall, as the paper's AR-32:
        pos:  0     1   2   3   4  ...  31   32   33    34   35   36
        tok:  <bos> k1  v1  k2  v2 ...  k16  v16  <eos> k_i  v_i  <eos>
    Keys and values: drawn without replacement from disjoint halves of num_kv = 8192 tokens;
    the vocabulary is num_kv + 4 (PAD, BOS, EOS, an unused id). Official implementation:
    aryamanarora/tinylang, tinylang/language/ar.py, languages/ar_vary_kv/ar_32.yaml."""

    def __init__(self, num_kv: int = 8192, n_pairs: int = 16):
        self.n_keys = num_kv // 2  # keys and values each get half of the num_kv tokens
        self.n_pairs = n_pairs
        self.first_key, self.first_value = 3, 3 + self.n_keys
        self.vocab_size = num_kv + 4
        self.length = 2 * n_pairs + 5

    def sample(self, n: int, rng: Generator, split: str = "train") -> Examples:
        """n documents; AR has no held-out split (train and test differ by their rng)."""
        n_pairs, length = self.n_pairs, self.length
        keys = self.first_key + distinct_ints(rng, n, n_pairs, self.n_keys)  # (n, n_pairs)
        values = self.first_value + distinct_ints(rng, n, n_pairs, self.n_keys)
        i = rng.integers(0, n_pairs, n)                                     # the queried pair
        rows = np.arange(n)
        pairs = np.stack([keys, values], axis=2).reshape(n, 2 * n_pairs)    # k1 v1 k2 v2 ...
        eos = np.full(n, EOS)
        tail = np.stack([eos, keys[rows, i], values[rows, i], eos], axis=1)  # (n, 4)
        ids = np.concatenate([np.full((n, 1), BOS), pairs, tail], axis=1)   # (n, length)
        end = np.full(n, length - 1)                                        # the final <eos>
        return Examples.from_numpy(ids, key=2 * i + 1, value=2 * i + 2,
                                   divider=end - 3, query=end - 2, answer=end - 1)

    def other_token(self, kind: str, tokens: torch.Tensor, rng: Generator) -> torch.Tensor:
        """Per token, a uniform *different* token of its kind, "key" or "value"."""
        first = {"key": self.first_key, "value": self.first_value}[kind]
        return other_than(tokens, first, self.n_keys, rng)


def make_task(cfg):
    """The task of a run's Config (section 4); ATR and its settings: section 7."""
    if cfg.task == "ar":
        return AR(cfg.num_kv, cfg.n_pairs)
    return ATR(**ATR_SETTINGS[cfg.atr], held_out=cfg.held_out, query=cfg.atr_query,
               grammar_seed=cfg.grammar_seed, max_length=L_MAX - 5)


# 2. Building blocks: the MLP, causal convolutions (short and long), the filters' grid -------
class MLP(nn.Module):
    """fc2(GELU(fc1(x))), 4x wide. Official implementation: zoology/mixers/mlp.py."""

    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CausalConv1d(nn.Conv1d):
    """The short convolution of BaseConv, Hyena, Mamba and DeltaNet, depthwise and causal,
        y[t, j] = bias[j] + Σ_{i<k} w[j, i] · x[t - (k-1) + i, j],  x[t < 0] = 0."""

    def __init__(self, channels: int, width: int, bias: bool = True):
        super().__init__(channels, channels, width, groups=channels, bias=bias)

    def forward(self, x):                                           # x: (b, l, c)
        x = F.pad(x.transpose(1, 2), (self.kernel_size[0] - 1, 0))  # (b, c, k-1+l)
        return super().forward(x).transpose(1, 2)                   # (b, l, c)


def short_conv(channels: int, width: int, bias: bool) -> nn.Module:
    """A causal conv of this width, or for width 0 none (the paper's "conv removed")."""
    return CausalConv1d(channels, width, bias) if width else nn.Identity()


def causal_long_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal (not circular) convolution with a filter as long as the sequence, the official
    FFTs' maths:  y[:, t, j] = Σ_{s<=t} k[j, t-s] · u[:, s, j],  u: (b, l, c), k: (c, l)."""
    x = F.pad(u.transpose(1, 2), (u.shape[1] - 1, 0))            # (b, c, 2l-1)
    return F.conv1d(x, k.flip(-1)[:, None], groups=len(k)).transpose(1, 2)


def filter_time_grid():
    """The implicit filters' input z (L_MAX, 3), one band f = 1e-4, and t:
    z_j = [t_j, cos(2π f j / L_MAX), -sin(2π f j / L_MAX)], t_j = j / (L_MAX-1)."""
    t = torch.linspace(0, 1, L_MAX)
    w = 2 * math.pi * torch.arange(L_MAX) / L_MAX * 1e-4
    return torch.stack([t, torch.cos(w), -torch.sin(w)], dim=-1), t


# 3. The seven sequence mixers, each (b, l, d) -> (b, l, d) ---------------------------------
class Attention(nn.Module):
    """Causal softmax attention per head (one by default), out_proj(softmax(q kᵀ/√d_h + M)
    v). Official implementation: aryamanarora/zoology, zoology/mixers/attention.py (MHA).
    Differences: a -inf mask for -10000 (equal in fp32)."""

    def __init__(self, d: int, n_head: int = 1):
        super().__init__()
        self.n_head = n_head
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        b, l, d = x.shape
        h = self.n_head
        # q, k, v: (b, h, l, d/h) each
        q, k, v = self.Wqkv(x).view(b, l, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)                 # (b, h, l, l)
        future = torch.ones(l, l, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(b, l, d))     # (b, l, d)


class ImplicitLongConv(nn.Module):
    """conv(u) = K * u + u, a length-l filter K[:, j] = MLP(z_j), MLP 3 -> 16 -> d with ReLU.
    Official implementation: zoology/mixers/convolution.py (ImplicitLongConvolution)."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("z", filter_time_grid()[0], persistent=False)
        self.mlp = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, d))

    def forward(self, u):                                   # u: (b, l, d)
        k = self.mlp(self.z[:u.shape[1]]).T                 # the filter: (d, l)
        return causal_long_conv(u, k) + u


class BaseConv(nn.Module):
    """BaseConv: y = conv(u) ⊙ (W u + b) + u, conv short and causal or (width None) implicit
    and long. Official implementation: aryamanarora/zoology, zoology/mixers/base_conv.py."""

    def __init__(self, d: int, width: int | None):
        super().__init__()
        self.projection = nn.Linear(d, d)
        self.conv = ImplicitLongConv(d) if width is None else CausalConv1d(d, width)

    def forward(self, u):
        return self.conv(u) * self.projection(u) + u


class TaylorLinearAttention(nn.Module):
    """Based's linear attention: exp(s), s = q·k/√f, becomes 1 + s + s²/2 = φ(q)·φ(k)
    for φ(x) = [1, x/f^(1/4), vec(x xᵀ)/(√2 √f)], f = feature_dim; in quadratic form,
        y_n = Σ_{m<=n} (φ(q_n)·φ(k_m)) v_m  /  (Σ_{m<=n} φ(q_n)·φ(k_m) + ε).
    Official implementation: aryamanarora/zoology, zoology/mixers/based.py (TaylorExp)."""

    def __init__(self, d: int, feature_dim: int = 8, eps: float = 1e-12):
        super().__init__()
        self.feature_dim, self.eps = feature_dim, eps
        self.proj_q, self.proj_k = (nn.Linear(d, feature_dim, bias=False) for _ in range(2))
        self.proj_v, self.proj_o = (nn.Linear(d, d, bias=False) for _ in range(2))

    def forward(self, x):
        q, k, v = self.proj_q(x), self.proj_k(x), self.proj_v(x)
        s = q @ k.transpose(1, 2) / math.sqrt(self.feature_dim)   # (b, l, f) -> (b, l, l)
        A = (1 + s + s * s / 2).tril()                            # φ(q_n)·φ(k_m), m <= n
        return self.proj_o((A @ v) / (A.sum(-1, keepdim=True) + self.eps))


class H3(nn.Module):
    """H3 with d_state N = 1024 and head_dim p = 2 (H = d/p heads):
        k' = K_shift * k + D_k ⊙ k                 shift SSM: a learned causal filter
        kv[i, j, h] = k'[h p + i] · v[h p + j]     per-head outer product
        Y = K_diag,h * kv + D_h kv                 diagonal SSM (S4D), a kernel per head
        out[j H + h] = Σ_i q[h p + i] · Y[i, j, h]
    Official implementation: aryamanarora/zoology, zoology/mixers/h3/ (h3.py, ss_kernel_*.py;
    "diag-lin" init). Differences: long convolutions applied directly, not by FFT."""

    def __init__(self, d: int, d_state: int = L_MAX, head_dim: int = 2):
        super().__init__()
        self.p, self.H, N = head_dim, d // head_dim, d_state
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d) for _ in range(3))
        bound = 1 / math.sqrt(N)  # shift SSM on k: B = e_1, C kaiming-uniform, D_k ~ N(0, 1)
        self.shift_B = nn.Parameter(F.one_hot(torch.zeros(d, dtype=torch.long), N).float())
        self.shift_C = nn.Parameter(torch.empty(d, N).uniform_(-bound, bound))
        self.shift_D = nn.Parameter(torch.randn(d))
        H, modes = self.H, N // 2  # diagonal SSM: N/2 complex modes, as (..., 2) reals
        self.log_dt = nn.Parameter(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.inv_A_real = nn.Parameter(torch.full((H, modes), math.log(0.5)))  # A = -exp(.)
        self.A_imag = nn.Parameter(math.pi * torch.arange(modes).float().repeat(H, 1))
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, modes, dtype=torch.cfloat)))
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, modes, dtype=torch.cfloat)))
        self.D = nn.Parameter(torch.randn(H))
        self.output_linear = nn.Linear(d, d)

    def shift_kernel(self, l):
        """(d, l): K[:, t] = Σ_j B[:, j] C[:, j + t] by FFT, padded to 2N: no wrap-around."""
        n = 2 * self.shift_B.shape[1]
        B, C = torch.fft.rfft(self.shift_B, n=n), torch.fft.rfft(self.shift_C, n=n)
        K = torch.fft.irfft(B.conj() * C, n=n)[:, :min(l, n // 2)]
        return F.pad(K, (0, max(0, l - n // 2)))

    def diag_kernel(self, l):
        """(H, l): S4D, bilinear: dA = (1 + ΔA/2)/(1 - ΔA/2), C' = B C Δ/(1 - ΔA/2),
        K[t] = 2 Re Σ_n C'_n dA_n^t. For t = s j + i, s ≈ √l, a matmul of two tables
        of √l powers, Σ_n (C'_n dA_n^(s j)) dA_n^i (a table of l is 1.8-2.5x slower)."""
        dt = self.log_dt.exp()[:, None]                                     # (H, 1)
        dtA = torch.complex(-self.inv_A_real.exp(), self.A_imag) * dt       # ΔA: (H, N/2)
        dA = (1 + dtA / 2) / (1 - dtA / 2)
        C = torch.view_as_complex(self.B) * torch.view_as_complex(self.C) * dt / (1 - dtA / 2)
        s = math.isqrt(l - 1) + 1
        log_r, theta = dA.abs().log()[..., None], dA.angle()[..., None]     # (H, N/2, 1)
        small = torch.arange(s, device=dt.device)                           # i < s
        big = s * torch.arange(-(-l // s), device=dt.device)                # s j, j < l / s
        small_pow = torch.polar(torch.exp(small * log_r), small * theta)     # dA^i
        X = C[..., None] * torch.polar(torch.exp(big * log_r), big * theta)  # C dA^(s j)
        K = 2 * (X.transpose(1, 2) @ small_pow).real                        # 2 Re Σ_n
        return K.flatten(1)[:, :l]                                          # (H, l)

    def forward(self, u):
        b, l, d = u.shape
        H, p = self.H, self.p
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)            # (b, l, d) each
        k = causal_long_conv(k, self.shift_kernel(l)) + self.shift_D * k
        q, k, v = (x.view(b, l, H, p) for x in (q, k, v))                   # (b, l, H, p)
        kv = (k[..., :, None] * v[..., None, :]).flatten(2)                 # (b, l, H p p)
        # a head's S4D kernel, and its D, serve all p x p products of the head
        K = self.diag_kernel(l).repeat_interleave(p * p, 0)                 # (H p p, l)
        Y = causal_long_conv(kv, K) + self.D.repeat_interleave(p * p) * kv
        Y = Y.view(b, l, H, p, p)                                           # Y[..., h, i, j]
        y = (q[..., None] * Y).sum(-2)                                      # (b, l, H, p)
        return self.output_linear(y.transpose(2, 3).reshape(b, l, d))       # channel j H + h


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter h (d, l), an MLP of the time grid z with sine activations,
        h[:, j] = out(Sin(lin3(Sin(lin2(Sin(lin1(z_j))))))),   Sin(x) = sin(ω x),
    decayed: h[c, j] *= exp(-t_j |δ_c|), δ = linspace(ln(0.01)/1.5, ln(0.01)/0.3, d).
    Official implementation: aryamanarora/zoology, zoology/mixers/hyena.py (Filter)."""

    def __init__(self, d: int, order: int = 64):
        super().__init__()
        z, t = filter_time_grid()
        self.z = nn.Parameter(z)  # trainable, as officially
        self.register_buffer("t", t, persistent=False)
        deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, d)
        self.register_buffer("deltas", deltas, persistent=False)
        self.omega = nn.Parameter(torch.ones(order))
        self.lin = nn.ModuleList(nn.Linear(3 if i == 0 else order, order) for i in range(3))
        self.out = nn.Linear(order, d, bias=False)

    def forward(self, l):
        h = self.z[:l]                                           # (l, 3)
        for lin in self.lin:
            h = torch.sin(self.omega * lin(h))                   # (l, order)
        return (self.out(h) * torch.exp(-self.t[:l, None] * self.deltas.abs())).T  # (d, l)


class Hyena(nn.Module):
    """Hyena of order 2 (1 head), with h the implicit filter and D a skip:
        x1, x2, v = split(short_conv_3(in_proj(u)))      a width-3 conv on all 3d channels
        v = x2 ⊙ (h * (x1 ⊙ v) + D ⊙ (x1 ⊙ v));   y = out_proj(v)
    Official implementation: aryamanarora/zoology, zoology/mixers/hyena.py (Hyena)."""

    def __init__(self, d: int, d_skip: bool = True, filter_order: int = 64):
        super().__init__()
        self.in_proj = nn.Linear(d, 3 * d)
        self.short_filter = CausalConv1d(3 * d, 3)
        self.filter = HyenaFilter(d, filter_order)
        self.D, self.d_skip = nn.Parameter(torch.randn(d)), d_skip  # official: D zeroed
        self.out_proj = nn.Linear(d, d)

    def forward(self, u):
        x1, x2, v = self.short_filter(self.in_proj(u)).chunk(3, dim=-1)    # (b, l, d) each
        v = v * x1
        v = causal_long_conv(v, self.filter(u.shape[1])) + self.d_skip * self.D * v
        return self.out_proj(v * x2)


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False):
    """Mamba's selective scan, a loop over time in fp32 (or fp64), as mamba-ssm's
    selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py) for Mamba's uses:
        u, delta, z: (b, c, l)  A: (c, n)  B, C: (b, n, l)  D, delta_bias: (c,)  -> (b, c, l)
        Δ = softplus(delta + delta_bias)   (softplus only if delta_softplus)
        h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t,   h_{-1} = 0,   state (b, c, n)
        y_t = C_t · h_t + D u_t;   out = y ⊙ SiLU(z)   (if z is given)
    It is the continuous SSM h'(t) = A h(t) + B u(t) sampled at steps Δ: A by zero-order
    hold, exp(Δ A), exact while u holds still between samples; B by a simplified Euler step,
    Δ B, as the official kernels (A matters more: ZOH's B changes little)."""
    dtype = u.dtype
    u, delta, A, B, C, D, z, delta_bias = (  # float32 at least (float64 stays), None stays
        x if x is None else x.to(torch.promote_types(x.dtype, torch.float32))
        for x in (u, delta, A, B, C, D, z, delta_bias))
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)                                  # threshold 20, as upstream
    decay = torch.exp(delta[..., None] * A[:, None, :])            # (b, c, l, n): exp(Δ_t A)
    write = (delta * u)[..., None] * B.transpose(1, 2)[:, None]    # Δ_t u_t B_t
    h, ys = u.new_zeros(*u.shape[:2], A.shape[1]), []              # state (b, c, n), outputs
    # unbind, not [:, :, t]: indexing's backward builds a full-size zero tensor every step
    for decay_t, write_t, C_t in zip(decay.unbind(2), write.unbind(2), C.unbind(2)):
        h = decay_t * h + write_t
        ys.append((h * C_t[:, None]).sum(-1))                      # C_t: (b, n)
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(u.shape)    # (b, c, l)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y.to(dtype)


SCAN_BACKENDS = ("auto", "ext", "ref")  # "ref" the loop above, "ext" scan_ext/'s kernel


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   backend="auto"):
    """selective_scan_ref's maths: "auto" the kernel if it builds, else the loop."""
    if backend not in SCAN_BACKENDS:
        raise ValueError(f"selective_scan: unknown backend {backend!r}; "
                         f"choose from {', '.join(SCAN_BACKENDS)}")
    (b, c, l), n = u.shape, A.shape[-1]
    for name, x in (("B", B), ("C", C)):
        if x.shape != (b, n, l):  # mamba-ssm's constant (c, n) and grouped forms: not here
            raise ValueError(f"selective_scan: {name} must be per token, (b, n, l) = "
                             f"{(b, n, l)}, not {tuple(x.shape)}")
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    if backend != "ref":
        kernel = scan_ext.kernel(u.device, required=backend == "ext")
        if kernel:
            return kernel(*args)
    return selective_scan_ref(*args)


class Mamba(nn.Module):
    """Mamba (selective SSM), d_state N = 16, d_inner = E d = 2d, dt_rank R = ceil(d/16):
        x, z = split(in_proj(u))                 (b, l, d_inner) each
        x = SiLU(conv(x))                        short causal conv, width d_conv (0 = none)
        δ, B, C = split(x_proj(x))               (b, l, R), (b, l, N), (b, l, N)
        y = selective_scan(x, softplus(dt_proj(δ)), A = -exp(A_log), B, C, D) ⊙ SiLU(z)
    and out = out_proj(y). Section 6 patches the conv at conv_out (the paper's v3).
    Official implementation: state-spaces/mamba, mamba_ssm/modules/mamba_simple.py (2.2.4);
    d_conv: tinylang/model/arch/mamba.py. Differences: no conv parameters when d_conv = 0."""
    mamba_block = True  # it sits in Mamba's block (section 4): RMSNorm, no MLP, its own init

    def __init__(self, d: int, d_conv: int = 4, d_state: int = 16, expand: int = 2,
                 scan: str = "auto", dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        d_in, N, R = expand * d, d_state, math.ceil(d / 16)
        self.d_inner, self.d_state, self.dt_rank, self.scan = d_in, N, R, scan
        self.in_proj = nn.Linear(d, 2 * d_in, bias=False)
        self.conv1d = short_conv(d_in, d_conv, bias=True)
        self.conv_out = nn.Identity()
        self.sites = {"conv_output": "conv_out"} if d_conv else {}  # section 6's extra site
        self.x_proj = nn.Linear(d_in, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, d_in, bias=True)
        self.out_proj = nn.Linear(d_in, d, bias=False)
        # Mamba's init (init_weights skips dt_proj.bias): Δ log-uniform, S4D-real A, D = 1
        nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)
        dt = torch.exp(torch.rand(d_in) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=1e-4)
        self.dt_proj.bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1.0)).repeat(d_in, 1))
        self.D = nn.Parameter(torch.ones(d_in))

    def forward(self, u):
        x, z = self.in_proj(u).chunk(2, dim=-1)                   # (b, l, d_in) each
        x = F.silu(self.conv_out(self.conv1d(x)))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        # dt_proj's weight only: the scan adds its bias, then softplus (as in mamba_simple.py)
        dt, A = dt @ self.dt_proj.weight.T, -torch.exp(self.A_log)  # (b, l, d_in), (d_in, N)
        x, dt, B, C, z = (t.transpose(1, 2) for t in (x, dt, B, C, z))  # (b, channels, l)
        y = selective_scan(x, dt, A, B, C, self.D, z, delta_bias=self.dt_proj.bias,
                           delta_softplus=True, backend=self.scan)  # (b, d_in, l)
        return self.out_proj(y.transpose(1, 2))                   # (b, l, d)


def delta_rule(q, k, v, beta):
    """The delta rule S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ, o_t = S_tᵀ q_t,
    S_0 = 0, in FLA's chunked (WY) form with one chunk: S_t = Σ_{s<=t} k_s u_sᵀ, where
        u_t = β_t (v_t - Σ_{s<t} (k_t·k_s) u_s),     o_t = Σ_{s<=t} (q_t·k_s) u_s,
    (I + tril(β k kᵀ, -1)) U = β V solved exactly, not step by step as the tests' oracle.
    q, k: (..., l, d_k), v: (..., l, d_v), beta: (..., l) -> like v."""
    l = q.shape[-2]
    ones = torch.ones(l, l, dtype=torch.bool, device=q.device)
    lhs = (beta[..., None] * (k @ k.transpose(-2, -1))).masked_fill(~ones.tril(-1), 0)
    lhs = lhs + torch.eye(l, device=q.device, dtype=q.dtype)
    U = torch.linalg.solve_triangular(lhs, beta[..., None] * v, upper=False,
                                      unitriangular=True)
    return (q @ k.transpose(-2, -1)).masked_fill(~ones.tril(), 0) @ U


class DeltaNet(nn.Module):
    """DeltaNet (the paper's v3): linear attention with a delta-rule fast-weight state,
        q, k, v = SiLU(conv(W_q x)), SiLU(conv(W_k x)), SiLU(conv(W_v x))
        q, k = q/‖q‖, k/‖k‖;   β = sigmoid(W_β x)   (per head)
        o = delta_rule(q / √d_k, k, v, β);   y = o_proj(RMSNorm(o))
    Official implementation: fla-org/flash-linear-attention, fla/layers/delta_net.py (its
    defaults). Differences: fp32, not bf16 for Triton; an exact triangular solve."""

    def __init__(self, d: int, n_head: int = 1, d_conv: int = 4):
        super().__init__()
        self.n_head = n_head
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False)
                                                 for _ in range(3))
        self.b_proj = nn.Linear(d, n_head, bias=False)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (short_conv(d, d_conv, bias=False)
                                                       for _ in range(3))
        self.o_norm = nn.RMSNorm(d // n_head, eps=1e-5)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, l, d = x.shape
        h = self.n_head
        q = F.silu(self.q_conv1d(self.q_proj(x))).view(b, l, h, d // h).transpose(1, 2)
        k = F.silu(self.k_conv1d(self.k_proj(x))).view(b, l, h, d // h).transpose(1, 2)
        v = F.silu(self.v_conv1d(self.v_proj(x))).view(b, l, h, d // h).transpose(1, 2)
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)               # (b, h, l)
        o = delta_rule(q * (d // h) ** -0.5, k, v, beta)                    # (b, h, l, d/h)
        return self.o_proj(self.o_norm(o).transpose(1, 2).reshape(b, l, d))


# 4. The model: blocks, the registry of mixers, the run's Config, initialisation -------------
class Block(nn.Module):
    """A pre-norm residual block; a mamba_block mixer's (Mamba's): RMSNorm and no MLP."""

    def __init__(self, d: int, mixer: nn.Module):
        super().__init__()
        self.mamba = getattr(mixer, "mamba_block", False)
        self.norm1 = nn.RMSNorm(d, eps=1e-5) if self.mamba else nn.LayerNorm(d)
        self.mixer = mixer
        self.norm2 = None if self.mamba else nn.LayerNorm(d)
        self.mlp = None if self.mamba else MLP(d)

    def forward(self, x):
        x = x + self.mixer(self.norm1(x))                                # sequence mixing
        return x if self.mlp is None else x + self.mlp(self.norm2(x))   # per-position MLP


# The sites section 6 patches: site -> (module in the block, its input "in" or output "out")
SITES = {
    "block_input": ("", "in"), "block_output": ("", "out"),  # the residual stream
    "mixer_input": ("mixer", "in"), "mixer_output": ("mixer", "out"),  # before the add
    "mlp_input": ("mlp", "in"), "mlp_output": ("mlp", "out")}


def base_conv_layer(cfg, i: int) -> BaseConv:
    """zoology's BaseConv: short convs at even layers, long at odd (--long-conv: all)."""
    return BaseConv(cfg.d_model, None if cfg.long_conv or i % 2 == 1 else cfg.d_conv)


# The architectures: name -> (cfg: the run's Config, below; layer) -> a (b, l, d) mixer
MIXERS = {
    "attention": lambda cfg, i: Attention(cfg.d_model, cfg.n_head),
    "base_conv": base_conv_layer,
    "based": lambda cfg, i: (TaylorLinearAttention(cfg.d_model) if i % 2
                             else base_conv_layer(cfg, i)),
    "h3": lambda cfg, i: H3(cfg.d_model),
    "hyena": lambda cfg, i: Hyena(cfg.d_model, d_skip=cfg.hyena_d_skip),
    "mamba": lambda cfg, i: Mamba(cfg.d_model, d_conv=cfg.d_conv, scan=cfg.scan),
    "delta_net": lambda cfg, i: DeltaNet(cfg.d_model, cfg.n_head, d_conv=cfg.d_conv)}
DEFAULT_DCONV = {"mamba": 4, "delta_net": 4, "based": 3, "base_conv": 3}  # short-conv widths
MIXER_CODE = {}  # arch -> the hash of the --mixer-file that registered it (the appendix's)


def register_mixer(name: str, factory, d_conv: int | None = None, mamba_block=False) -> None:
    """A mixer of your own (README, "Your own mixer"): factory(cfg, layer) -> a causal module
    (b, l, d) -> (b, l, d); d_conv: its short conv's width (--dconv); mamba_block: Mamba's
    block and init. Sites of its own: SITES. check_mixers tries it as a run trains."""
    if name in MIXERS:
        raise ValueError(f"mixer {name!r} is taken ({', '.join(MIXERS)}); choose another")

    def build(cfg, layer):
        mixer = factory(cfg, layer)
        if mamba_block:
            mixer.mamba_block = True
        return mixer
    MIXERS[name] = build
    if d_conv is not None:
        DEFAULT_DCONV[name] = d_conv


def option(default, help: str, flag=None, choices=None, limits=None):
    """A Config field: default, --help text, flag if not --<name>, choices or limits."""
    allowed = dict(help=help, flag=flag, choices=choices, limits=limits)
    return dataclasses.field(default=default, metadata=allowed)


def field_type(f: dataclasses.Field) -> type:
    """The type of a field's values: int for `int | None`."""
    return getattr(f.type, "__args__", (f.type,))[0]


# Fields read only where another has this value: elsewhere Config refuses all but defaults
APPLIES = (dict.fromkeys(["num_kv", "n_pairs"], ("task", "ar"))
           | dict.fromkeys(["atr", "atr_query", "held_out", "grammar_seed"], ("task", "atr"))
           | dict(hyena_d_skip=("arch", "hyena"), decay_frac=("schedule", "wsd"),
                  d_conv=("long_conv", False), bucket=("fresh_data", False)))


@dataclasses.dataclass
class Config:
    """Everything that defines a run, each field a flag (--d-model for d_model): Config(arch=
    A, task=T) is `mech.py --arch A --task T`; both refuse a bad value in the same words."""
    task: str = option("ar", "the task", choices=("ar", "atr"))  # -- what to train
    arch: str = option("attention", "the architecture, a name in MIXERS")
    preset: str = option("cpu", "fills 'from --preset': cpu (2 cores), paper (its protocol), "
                         "class (a claim in minutes)", choices=("cpu", "paper", "class"))
    d_model: int | None = option(None, "model width d (paper: 16 .. 256)", limits=(1, 1024))
    n_layer: int = option(2, "number of blocks (the paper: 2)", "--layers", limits=(1, 16))
    n_head: int = option(1, "attention / DeltaNet heads", "--heads", limits=(1, 64))
    pos_emb: bool | None = option(None, "learned position embedding (attention's default)")
    d_conv: int | None = option(None, "short-conv width, 0: none (mamba, delta_net: 4; "
                                "based, base_conv: 3)", "--dconv", limits=(0, L_MAX))
    long_conv: bool = option(False, "based / base_conv: the long conv for the short one")
    hyena_d_skip: bool = option(True, "Hyena's D skip (the official bias=False zeroed it)")
    value_corruption: str = option("value", "a corrupted Value becomes a value or (official) "
                                   "a key", choices=("value", "key"))
    scan: str = option("auto", "Mamba's scan: scan_ext's kernel (ext), the loop (ref), or "
                       "ext if it builds (auto)", choices=SCAN_BACKENDS)
    num_kv: int = option(8192, "AR: key + value tokens", limits=(4, 10 ** 6))  # -- data
    n_pairs: int | None = option(None, "AR: key-value pairs per document", limits=(1, 500))
    atr: str = option("easy", "ATR setting (easy: Lmax 5, |Σ| 20; medium: Lmax 10; 8192: "
                      "|Σ|)", choices=("easy", "medium", "8192"))
    atr_query: str = option("parent", "ATR: ask the word's parent or its rightmost sibling",
                            choices=("parent", "sibling"))
    held_out: float = option(0.0, "ATR: share of label pairs test-only", limits=(0.0, 0.9))
    grammar_seed: int = option(42, "ATR: the grammar's seed (42: the official grammars)",
                               limits=(0, 2 ** 32 - 1))  # numpy's legacy RNG takes 32 bits
    n_train: int | None = option(None, "training documents, replayed", limits=(1, 10 ** 6))
    fresh_data: bool | None = option(None, "a fresh batch every step, not the fixed set")
    bucket: int | None = option(None, "batch documents by length in windows of this many "
                                "batches", limits=(0, 10 ** 5))
    n_eval: int = option(320, "test documents evaluated (paper: 320)", limits=(1, 10 ** 5))
    steps: int | None = option(None, "optimizer steps (or --epochs)",  # -- training
                               limits=(1, 10 ** 7))
    epochs: int | None = option(None, "passes over the training set", limits=(1, 10 ** 4))
    batch_size: int = option(32, "training batch size", limits=(1, 4096))
    lr: float | None = option(None, "peak learning rate (paper: 3e-5 .. 3e-2)", limits=(0, 1))
    warmup_frac: float | None = option(None, "share of the steps in warmup", limits=(0, 0.99))
    schedule: str | None = option(None, "after warmup (wsd: hold the peak, then decay)",
                                  choices=("cosine", "linear", "wsd"))
    decay_frac: float = option(0.2, "wsd: share of the steps decaying", limits=(0.001, 1.0))
    weight_decay: float = option(0.0, "AdamW weight decay (the paper: 0)", limits=(0.0, 1.0))
    eval_every: int | None = option(None, "steps between evaluations", limits=(1, 10 ** 7))
    seed: int = option(42, "seed of the data and the weights", limits=(0, 2 ** 32 - 1))

    def __post_init__(self):
        self.check()  # what was given, before the preset reads it
        for name, value in self.defaults().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.check()
        problem = next(self.problems(), None)
        if problem:
            raise ValueError(problem)

    def defaults(self) -> dict:
        """The values of the fields left None: the architecture's, then the preset's. paper:
        its protocol (tinylang experiments/*.yaml; it reports the best of 5-7 rates). cpu: the
        paper's data at d = 64 on a schedule fit to 2 CPU cores, longer where the calibration
        (figures/README.md) found that short. class: cpu cut to show each claim in minutes."""
        task, arch = self.task, self.arch
        out = dict(pos_emb=arch == "attention", d_conv=DEFAULT_DCONV.get(arch), d_model=64,
                   n_pairs=16, n_train=100_032, warmup_frac=0.1, lr=1e-3, fresh_data=False)
        if self.preset == "paper":
            out.update(epochs=16 if task == "ar" else 32, steps=None, bucket=0,
                       eval_every=200, schedule="linear" if self.held_out else "cosine")
        else:
            out.update(steps=15_000, epochs=None, schedule="wsd", eval_every=500,
                       bucket=16 if task == "atr" else 0)
            if (task, arch) == ("ar", "attention"):  # its induction forms late
                out.update(steps=30_000)
            if (task, arch) == ("atr", "attention"):  # else it stays on copying
                out.update(warmup_frac=0.5)
            if (task, arch) == ("ar", "mamba"):  # else it memorises the fixed set
                out.update(steps=20_000, lr=3e-3, fresh_data=True)
            if (task, arch, self.pos_emb) == ("ar", "based", True):  # else it memorises too
                out.update(lr=3e-4)
        if self.preset == "class":
            slow = (task, arch) in (("ar", "attention"), ("ar", "mamba"), ("atr", "mamba"))
            out.update(steps=15_000 if slow else 10_000)  # some seeds' mechanism forms late
            if task == "ar" and arch in ("attention", "based"):
                out.update(d_model=32, n_pairs=8, n_train=50_000)
            if (task, arch) == ("atr", "mamba"):
                out.update(lr=5e-3, warmup_frac=0.6)
        if self.steps is not None or self.epochs is not None:  # a given length wins
            del out["steps"], out["epochs"]
        return out

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return self.epochs * (self.n_train // self.batch_size)

    def check(self):
        """Refuse, in one line, a value of the wrong type or outside what its field allows."""
        for f in dataclasses.fields(self):
            value, allowed, kind = getattr(self, f.name), f.metadata, field_type(f)
            kinds = (int, float) if kind is float else kind  # a float field takes 1 for 1.0
            if value is None and f.default is None:
                continue
            if not isinstance(value, kinds) or isinstance(value, bool) != (kind is bool):
                raise ValueError(f"{f.name} must be {kind.__name__}, got {value!r}")
            choices = allowed["choices"] or (MIXERS if f.name == "arch" else ())
            if choices and value not in choices:
                raise ValueError(f"unknown {f.name} {value!r}; choose from "
                                 f"{', '.join(choices)}")
            low, high = allowed["limits"] or (value, value)
            if not low <= value <= high:  # NaN fails too
                raise ValueError(f"{f.name} must be in [{low:,}, {high:,}], got {value}")

    def problems(self):
        """In words: combinations that cannot train, fields given where not read (APPLIES)."""
        d, arch, defaults = self.d_model, self.arch, self.defaults()
        if self.steps is not None and self.epochs is not None:
            yield f"give steps ({self.steps}) or epochs ({self.epochs}), not both"
        for name, (where, value) in APPLIES.items():
            default = defaults.get(name, Config.__dataclass_fields__[name].default)
            if getattr(self, where) != value and getattr(self, name) != default:
                yield f"{name} applies where {where} is {value}, not {getattr(self, where)}"
        if d % self.n_head:
            yield f"d_model {d} is not divisible by n_head {self.n_head}"
        if self.n_head != 1 and arch not in ("attention", "delta_net"):
            yield f"n_head {self.n_head}: only attention and delta_net have heads"
        if arch == "h3" and d % 2:
            yield f"d_model {d}: h3 needs an even width (head_dim 2)"
        if self.d_conv is not None and arch not in DEFAULT_DCONV:
            yield (f"d_conv {self.d_conv}: {arch} has no short conv (these have: "
                   f"{', '.join(DEFAULT_DCONV)})")
        if self.d_conv == 0 and arch in ("based", "base_conv"):  # conv(u) ⊙ (W u + b) + u
            yield f"d_conv 0: {arch}'s short-conv layers mix positions by that conv alone"
        if self.long_conv and arch not in ("based", "base_conv"):
            yield f"long_conv applies to based and base_conv, not {arch}"
        if self.task == "ar" and (self.num_kv % 2 or self.n_pairs > self.num_kv // 2):
            yield (f"AR needs an even num_kv (got {self.num_kv}) with a key for each of the "
                   f"n_pairs {self.n_pairs} (num_kv / 2)")
        if self.n_train < self.batch_size:
            yield f"n_train {self.n_train} is smaller than one batch ({self.batch_size})"


def init_weights(model: nn.Module, cfg: Config):
    """The official init, after the modules' own. zoology (not Mamba): Linear and embedding
    weights ~ N(0, 0.02), biases 0, and weights *named* out_proj.weight, fc2.weight or
    output_linear.0.weight ~ N(0, 0.02/√(2 n_layer)) (not H3's output_linear, Based proj_o).
    Mamba's blocks, as mamba_ssm: biases (not dt_proj's) 0, out_proj kaiming / √n_layer."""
    in_mamba = tuple(f"blocks.{i}." for i, block in enumerate(model.blocks) if block.mamba)
    rescaled = ("out_proj.weight", "fc2.weight", "output_linear.0.weight")
    for name, m in model.named_modules():
        mamba = name.startswith(in_mamba)
        if isinstance(m, nn.Embedding) or isinstance(m, nn.Linear) and not mamba:
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None and not name.endswith("dt_proj"):
            nn.init.zeros_(m.bias)
    for name, w in model.named_parameters():
        mamba = name.startswith(in_mamba)
        if mamba and name.endswith("out_proj.weight"):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            w.data /= math.sqrt(cfg.n_layer)  # .data: an init, not a step autograd should see
        elif not mamba and name.endswith(rescaled):
            nn.init.normal_(w, std=0.02 / math.sqrt(2 * cfg.n_layer))


class LanguageModel(nn.Module):
    """Embeddings, blocks, LayerNorm, tied head. Official: tinylang/model/arch/zoology.py."""

    def __init__(self, cfg: Config, vocab_size: int):
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab_size, d)
        self.pos_emb = nn.Embedding(L_MAX, d) if cfg.pos_emb else None
        self.blocks = nn.ModuleList(Block(d, MIXERS[cfg.arch](cfg, i))
                                    for i in range(cfg.n_layer))
        self.norm_f = nn.LayerNorm(d)
        init_weights(self, cfg)

    def forward(self, ids, at=None):
        """Logits (b, l, V), or (b, V) at the positions `at` (b,): the head costs the most."""
        if ids.shape[1] > L_MAX:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds L_MAX = {L_MAX}")
        x = self.tok_emb(ids)                                       # (b, l, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)                                            # (b, l, d)
        if at is not None:
            x = x[torch.arange(len(x), device=x.device), at]        # (b, d)
        return F.linear(self.norm_f(x), self.tok_emb.weight)        # (b, [l,] V), tied


def build_model(cfg: Config, vocab_size: int) -> LanguageModel:
    """The model of cfg, its weights drawn from cfg.seed; a mixer's own error in one line."""
    torch.manual_seed(cfg.seed)
    try:
        return LanguageModel(cfg, vocab_size)
    except Exception as e:
        raise ValueError(f"mixer {cfg.arch!r} fails: {type(e).__name__}: {e}") from None


@torch.no_grad()
def check_mixers(model: LanguageModel, arch: str, length: int) -> None:
    """Refuse in one line a mixer that mixer_problem (below) finds wrong, in eval mode."""
    g = torch.Generator().manual_seed(0)  # the probe's own random inputs
    x = torch.randn(1, length, model.tok_emb.embedding_dim, generator=g)    # (1, l, d)
    for layer, mixer in enumerate(block.mixer for block in model.blocks):
        was_training = getattr(mixer, "training", False)
        try:  # its own error, in one line; the run's random numbers stay as they were
            with torch.random.fork_rng(devices=[]):
                problem = mixer_problem(mixer.eval(), x.to(model.tok_emb.weight.device), g)
        except Exception as e:
            problem = f"fails: {type(e).__name__}: {e}"
        finally:
            if isinstance(mixer, nn.Module):
                mixer.train(was_training)
        if problem:
            raise ValueError(f"mixer {arch!r} (layer {layer}) {problem}")


def mixer_problem(mixer: nn.Module, x: torch.Tensor, g: torch.Generator) -> str | None:
    """What is wrong with a mixer on x (1, l, d), in words, if anything: it must keep (b, l,
    d), stay finite, name no block's site, output (b, l, ·) at its own, and be causal."""
    own, outs = getattr(mixer, "sites", {}), {}
    if set(own) & set(SITES):
        return f"names a site {', '.join(set(own) & set(SITES))}, a block's; choose another"
    hooks = [mixer.get_submodule(path).register_forward_hook(
             lambda m, args, out, site=site: outs.setdefault(site, out))
             for site, path in own.items()]
    y = mixer(x)
    for hook in hooks:
        hook.remove()
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        return f"maps {tuple(x.shape)} to {shape}; a mixer keeps (b, l, d)"
    if not y.isfinite().all():
        return "returns NaN or inf on a random input"
    for site in own:
        out = outs.get(site)
        if not isinstance(out, torch.Tensor) or out.shape[:2] != y.shape[:2]:
            return f"has a site {site!r} whose output is no (b, l, ...) tensor"
    l = x.shape[1]
    later = torch.arange(l)[:, None] <= torch.arange(l)                    # (l, l): i <= t
    for rows in torch.arange(l).split(64):  # document i: x with its positions i.. another's
        other = torch.randn(len(rows), l, x.shape[2], generator=g).to(x.device)
        xs = torch.where(later[rows, :, None].to(x.device), other, x)      # (rows, l, d)
        moved = (mixer(xs) - y).abs().amax(-1).cpu() > 1e-4 * (1 + y.abs().max().item())
        i, t = (moved & ~later[rows]).nonzero().T
        if len(i):
            return (f"is not causal: its output at position {t[0]} changes with the input at "
                    f"position {rows[i[0]]}")
    return None


# 5. Training ------------------------------------------------------------------------------
class RunError(RuntimeError):
    """A run that cannot go on (it diverged, a file is damaged), said in one line."""


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup (the first update at rate 0), then cosine or linear decay to 0 as the
    paper's get_cosine_schedule_with_warmup; "wsd" holds the peak, then decays at the end."""
    total, warm = cfg.total_steps, int(cfg.warmup_frac * cfg.total_steps)
    if step < warm:
        return cfg.lr * step / warm
    if cfg.schedule == "wsd":
        return cfg.lr * min(1.0, (total - step) / max(1, int(cfg.decay_frac * total)))
    past = (step - warm) / max(1, total - warm)  # the share of the decay behind
    if cfg.schedule == "linear":
        return cfg.lr * max(0.0, 1 - past)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * past))


@torch.no_grad()
def evaluate(model: LanguageModel, data: Examples, batch_size: int = 64) -> dict:
    """Accuracy (argmax over the full vocabulary at the Query position) and mean loss."""
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        logits = model(batch.ids, at=batch.pos["query"])
        correct += (logits.argmax(-1) == batch.answer).sum().item()
        loss += F.cross_entropy(logits, batch.answer, reduction="sum").item()
    model.train(was_training)
    return dict(accuracy=correct / len(data), loss=loss / len(data))


def batch_documents(length: np.ndarray, n_batches: int, batch_size: int, bucket: int,
                    rng: Generator) -> np.ndarray:
    """(n_batches, batch_size) document indices: the paper's order or, with buckets, each
    window of `bucket` batches sorted by length, re-cut and shuffled (less padding)."""
    batches = np.arange(n_batches * batch_size).reshape(n_batches, batch_size)
    for w in range(0, n_batches, bucket) if bucket else ():  # no buckets: the paper's order
        docs = batches[w:w + bucket].ravel()
        docs = docs[np.argsort(length[docs], kind="stable")].reshape(-1, batch_size)
        batches[w:w + bucket] = docs[rng.permutation(len(docs))]
    return batches


def training_batches(cfg: Config, task, device) -> tuple:
    """(batch_at, longest): batch_at(step) is a function of (seed, step), so that a resumed
    run sees the same batches; longest, the longest training document (0: not known yet)."""
    if cfg.fresh_data:
        def batch_at(step):
            rng = rng_for(cfg.seed, f"train-step-{step}")
            return task.sample(cfg.batch_size, rng).to(device)
        return batch_at, 0
    per_epoch = cfg.n_train // cfg.batch_size
    train_set = task.sample(cfg.n_train, rng_for(cfg.seed, "train"))
    order = batch_documents(train_set.pos["answer"].numpy(), per_epoch, cfg.batch_size,
                            cfg.bucket, rng_for(cfg.seed, "buckets"))
    # one padded tensor per batch: ATR's rare long sentences pad only their own batch
    batches = [train_set[torch.from_numpy(i)].trim() for i in order]
    return (lambda step: batches[step % per_epoch].to(device)), train_set.trim().ids.shape[1]


def engine(model: LanguageModel, device) -> dict:
    """What decides a run's numbers besides its Config (metrics.json keeps it, a resume checks
    it): device, CPU vector width and torch (how it rounds), threads (the order it sums), and
    Mamba's scan: the kernel's build key, the loop (None) or no scan ("")."""
    mambas = [m for m in model.modules() if isinstance(m, Mamba)]
    scan = None if mambas else ""
    if mambas and mambas[0].scan != "ref":
        try:
            if scan_ext.kernel(torch.device(device), required=mambas[0].scan == "ext"):
                scan = scan_ext.build_key
        except RuntimeError as e:  # --scan ext where it cannot build: one line
            raise RunError(str(e)) from None
    return dict(device=torch.device(device).type, cpu=torch.backends.cpu.get_cpu_capability(),
                threads=torch.get_num_threads(), torch=str(torch.__version__), scan=scan)


# A run's folder: config.json (first), checkpoint.pt (while training), model.pt, metrics.json
def stored(cfg: Config) -> dict:
    """config.json: the fields, and the hash of the --mixer-file that registered the arch."""
    code = {"mixer_code": MIXER_CODE[cfg.arch]} if cfg.arch in MIXER_CODE else {}
    return dataclasses.asdict(cfg) | code


def identity(cfg: Config) -> dict:
    """What makes two runs the same run: config.json, the length in steps (however given)."""
    return stored(cfg) | {"preset": None, "epochs": None, "steps": cfg.total_steps}


def in_one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def save(path: str, obj) -> None:
    """Write a .tmp file, then rename it: a stop, kill or full disk leaves no half file."""
    tmp = path + ".tmp"
    try:
        if path.endswith(".json"):
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=1)
        else:
            torch.save(obj, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save's is a RuntimeError
        raise RunError(f"{path} could not be written ({in_one_line(e)})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def reading(path: str):
    """`with reading(path):` use a run's file; a damaged one ends in one line naming it."""
    try:
        yield
    except Exception as e:
        raise RunError(f"{path} cannot be used ({in_one_line(e)}); repair or move it, or "
                       "choose another --out") from None


def stored_identity(out: str) -> dict | None:
    """identity() of the run whose config.json is in `out` (None: there is none)."""
    path = os.path.join(out, "config.json")
    if not os.path.exists(path):
        return None
    with reading(path), open(path) as f:
        fields = json.load(f)
        code = fields.pop("mixer_code", None)
        theirs = identity(Config(**fields))
    theirs.pop("mixer_code", None)  # this process's, if it registered the arch: not theirs
    return theirs | ({"mixer_code": code} if code else {})


def differences(theirs: dict, mine: dict, name: str) -> str:
    return ", ".join(f"{k} {theirs.get(k)} ({name}: {mine.get(k)})" for k in theirs | mine
                     if theirs.get(k) != mine.get(k))


def claim(out: str, cfg: Config) -> None:
    """Make `out` this run's folder (a new or empty one gets config.json), or refuse it."""
    os.makedirs(out, exist_ok=True)
    theirs = stored_identity(out)
    files = [f for f in os.listdir(out) if not f.endswith(".tmp")]  # .tmp: a kill -9's
    if theirs is None and files:
        raise RunError(f"{out} holds {', '.join(sorted(files))} but no config.json of a run; "
                       "choose another --out")
    if theirs is None:
        save(os.path.join(out, "config.json"), stored(cfg))
    elif theirs != identity(cfg):
        diff = differences(theirs, identity(cfg), "asked")
        raise RunError(f"{out} holds another run ({diff}); choose another --out")


def finished(out: str, cfg: Config, task, device) -> tuple | None:
    """(model, metrics) if `out` holds this run finished (model None without its model.pt)."""
    path, model = os.path.join(out, "metrics.json"), None
    if stored_identity(out) != identity(cfg) or not os.path.exists(path):
        return None
    with reading(path), open(path) as f:
        metrics = json.load(f)
        if not {"accuracy", "curve"} <= metrics.keys():
            raise ValueError("no metrics of a mech.py run")
    path = os.path.join(out, "model.pt")
    if os.path.exists(path):
        with reading(path):
            model = build_model(cfg, task.vocab_size).to(device)
            model.load_state_dict(torch.load(path, device))
    return model, metrics


def train(cfg: Config, out=None, device="cpu", log=print, dynamics=True) -> tuple:
    """Train one model -> (model, metrics). In the folder `out`, a stopped run resumes exactly
    from its last evaluation; a finished one is loaded (model None without model.pt)."""
    task = make_task(cfg)
    shown = None if out is None else finished(out, cfg, task, device)
    if shown is not None:
        log(f"{out} already holds this run")
        return shown
    batch_at, longest = training_batches(cfg, task, device)
    test = task.sample(cfg.n_eval, rng_for(cfg.seed, "test"), split="test").to(device)
    dev_docs = None  # --held-out: the test documents ask held-out pairs only, dev ones others
    if cfg.held_out:
        dev_docs = task.sample(cfg.n_eval, rng_for(cfg.seed, "dev"), split="dev").to(device)
    length = max(longest, test.ids.shape[1])  # the longest document (fresh data: the test's)
    model = build_model(cfg, task.vocab_size).to(device)
    now = engine(model, device)  # before the probe, which may build Mamba's scan
    check_mixers(model, cfg.arch, length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.weight_decay, fused=True)
    step, elapsed, curve = 0, 0.0, []
    loss_sum = torch.zeros((), device=device)
    checkpoint = None if out is None else os.path.join(out, "checkpoint.pt")
    if out is not None:
        claim(out, cfg)
    if checkpoint is not None and os.path.exists(checkpoint):  # resume the run
        with reading(checkpoint):
            state = torch.load(checkpoint, device)
            if state["identity"] != identity(cfg):
                raise ValueError("a checkpoint of another run")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step, curve, elapsed = state["step"], state["curve"], float(state["elapsed"])
            if not isinstance(step, int) or step != (curve[-1]["step"] if curve else 0):
                raise ValueError(f"its step {step!r} is not its last evaluation's")
            loss_sum.fill_(state["loss_sum"])
            torch.set_rng_state(state["rng"].cpu())  # for a mixer of your own that draws
            then, refused = dict(state["engine"]), state["refused"]
        if refused:
            raise RunError(refused)
        if then != now:  # another thread count, scan or CPU: not this run's numbers
            raise RunError(f"{checkpoint} was trained to step {step:,} with "
                           f"{differences(then, now, 'here')}; resume it with the same "
                           "(--threads), or --force to start over")
        log(f"resuming {out} at step {step:,}")
    n_params = sum(w.numel() for w in model.parameters())
    log(f"{cfg.arch} on {cfg.task}: d={cfg.d_model}, {cfg.n_layer} layers, {n_params:,} "
        f"parameters, {cfg.total_steps:,} steps, lr {cfg.lr:g}, {now['device']}, "
        f"{now['threads']} thread(s)")
    start, t0, cpu0, told = step, time.time(), time.process_time(), False

    def busy() -> str:  # where the machine gave the run < 80 % of a core: a hint, once
        seconds, cpu = time.time() - t0, time.process_time() - cpu0
        if now["threads"] == 1 or cpu >= 0.8 * seconds:
            return ""
        return (f" | this busy machine gave the run {cpu / seconds:.0%} of a core: --threads "
                "1 may be faster (its numbers are another run's)")

    def save_checkpoint(step: int, refused: str = ""):  # all that resumes the run exactly
        if out is not None:
            save(checkpoint, dict(
                model=model.state_dict(), optimizer=optimizer.state_dict(), step=step,
                curve=curve, loss_sum=loss_sum.item(), elapsed=elapsed + time.time() - t0,
                identity=identity(cfg), rng=torch.get_rng_state(), engine=now,
                refused=refused))

    for step in range(start, cfg.total_steps):
        batch = batch_at(step)  # one optimisation step
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach()  # no .item() here: it would wait for a GPU every step
        done = step + 1
        if done % cfg.eval_every and done != cfg.total_steps:
            if not told and time.time() - t0 > 30:  # no evaluation yet: the pace, now
                told = True
                rate, first = (done - start) / (time.time() - t0), start + cfg.eval_every
                log(f"step {done:,}/{cfg.total_steps:,} | {rate:5.1f} steps/s | the first "
                    f"evaluation at step {first - first % cfg.eval_every:,}" + busy())
            continue
        train_loss = loss_sum.item() / (done - (curve[-1]["step"] if curve else 0))
        loss_sum.zero_()
        uniform = math.log(task.vocab_size)  # the loss of a uniform guess
        if not train_loss < 2 * uniform:  # NaN too
            raise RunError(f"the training loss reached {train_loss:.4g} by step {done} (a "
                           f"uniform guess: {uniform:.2f}): it diverged (a lower --lr than "
                           f"{cfg.lr:g} may help) or the model computes NaN or inf")
        ev = evaluate(model, test)
        point = dict(step=done, train_loss=round(train_loss, 5),
                     test_loss=round(ev["loss"], 5), accuracy=ev["accuracy"],
                     time_s=round(elapsed + time.time() - t0, 2))
        if dev_docs is not None:
            point["dev_accuracy"] = evaluate(model, dev_docs)["accuracy"]
        if dynamics:  # the mechanism while it forms: watch_mechanism, section 6 (ahead)
            point["attrib"] = watch_mechanism(model, task, test, cfg)
        curve.append(point)
        try:  # a mixer may learn to look ahead: still causal as trained so far?
            check_mixers(model, cfg.arch, length)
        except ValueError as e:
            refused = f"{e} by step {done:,}: the run is refused, its results unreported"
            save_checkpoint(done, refused)
            raise RunError(refused) from None
        rate = (done - start) / (time.time() - t0)  # progress_line: below; PAPER_FILTER: §6
        log(progress_line(point, cfg.total_steps, rate, PAPER_FILTER[cfg.task])
            + ("" if told else busy()))
        told = True
        save_checkpoint(done)  # so that a stop or a kill -9 loses at most eval_every steps
    # finished: the metrics (the last evaluation's), the model; the checkpoint goes last
    run_time, final = time.time() - t0, curve[-1]
    metrics = {k: final[k] for k in ("accuracy", "test_loss", "dev_accuracy") if k in final}
    metrics.update(steps=cfg.total_steps, wall_time_s=round(elapsed + run_time, 2),
                   steps_per_s=round((cfg.total_steps - start) / run_time, 2),
                   n_params=n_params, **now, curve=curve)
    if out is not None:
        save(os.path.join(out, "model.pt"), model.state_dict())
        save(os.path.join(out, "metrics.json"), metrics)
        os.unlink(checkpoint)
    return model, metrics


def progress_line(point: dict, total: int, rate: float, min_effect: float) -> str:
    """A line per evaluation: loss, accuracy, Attribs where the Key matters, time left."""
    dev = f" (dev {point['dev_accuracy']:.3f})" if "dev_accuracy" in point else ""
    a, attrib = point.get("attrib"), ""
    if a is not None:
        attrib = f" | Key effect {a['effect']:.3f}"
    if a is not None and a["effect"] >= min_effect:
        attrib += ", Attrib K/V/Q " + "/".join(f"{x:.2f}" for x in a["main"].values())
    return (f"step {point['step']:>7,}/{total:,} | loss {point['train_loss']:.4f} | test acc "
            f"{point['accuracy']:.3f}{dev}{attrib} | {rate:5.1f} steps/s | ETA "
            f"{(total - point['step']) / rate / 60:5.1f} min")


# 6. Interventions: the mechanistic evaluation -----------------------------------------------
# An interchange intervention asks where the information deciding the answer lives: corrupt
# the Key, run again, but at one site (SITES) and one position put back the clean activation:
#     Attrib = (mean p_patched - mean p_corrupted) / (mean p_clean - mean p_corrupted)
# At the last layer's input, Attrib@Value ≈ 1 is induction (earlier layers stored "this
# value follows that key" at the Value; the last matches the Query against it); @Query ≈ 1:
# the answer was retrieved already; @Key ≈ 1: the last layer reads the Key position itself.
# Official implementation: aryamanarora/tinylang, tinylang/eval/interchange.py (with pyvene).
POSITIONS = ("key", "value", "value+1", "value+2", "divider", "query")  # the patched ones
PAPER_FILTER = {"ar": 0.01, "atr": 0.1}  # Key effects below: noise, out of the paper's plots
VERDICT_MIN_EFFECT = 0.1  # the verdict (below) asks more on AR: 0.01 is ~3 documents in 320
VERDICT_DOMINANT = 0.6  # the named position restores >= 0.6, the others <= 0.4 (1.5x any)


def positions(data: Examples, name: str) -> torch.Tensor:
    """(n,) the position `name` in each document; "value+k": Value + k."""
    base, _, k = name.partition("+")
    return data.pos[base] + (int(k) if k else 0)


def distinct(data: Examples, name: str) -> torch.Tensor:
    """(n,) bool: the documents where position `name` is no other named position."""
    return torch.stack([positions(data, name) != data.pos[other]
                        for other in POSITIONS if "+" not in other and other != name]).all(0)


def sites_in(model: LanguageModel) -> dict:
    """{(site, layer): (path, "in" or "out")}: SITES but absent MLPs', and the mixers' own."""
    out = {}
    for layer, block in enumerate(model.blocks):
        for site, where in SITES.items():
            if where[0] != "mlp" or block.mlp is not None:
                out[site, layer] = where
        for site, path in getattr(block.mixer, "sites", {}).items():
            out[site, layer] = ("mixer." + path, "out")
    return out


def intervene(model: LanguageModel, site: str, layer: int, fn):
    """Hook act = fn(act) (act: b, l, width) on (site, layer); `with` or .remove() ends it."""
    path, side = sites_in(model)[site, layer]
    module = model.blocks[layer].get_submodule(path)
    if side == "in":
        return module.register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:]))
    return module.register_forward_hook(lambda m, args, out: fn(out))


def patched(pos: torch.Tensor, values: torch.Tensor):
    """An intervention: act[b, pos[b]] = values[b] for each document b."""
    return lambda act: act.index_put((torch.arange(len(act), device=act.device), pos), values)


def p_answer(model: LanguageModel, data: Examples, ids=None) -> torch.Tensor:
    """(n,) probability of the correct answer at the Query position."""
    logits = model(data.ids if ids is None else ids, at=data.pos["query"])
    return logits.softmax(-1)[torch.arange(len(data), device=logits.device), data.answer]


def corrupt(task, data: Examples, what: str, rng: Generator, value_corruption: str = "value"):
    """ids with pos[what]'s token replaced by another of its kind (see --value-corruption)."""
    rows, pos = torch.arange(len(data), device=data.ids.device), data.pos[what]
    kind = "key" if what == "key" or value_corruption == "key" else "value"
    return data.ids.index_put((rows, pos), task.other_token(kind, data.ids[rows, pos], rng))


@torch.no_grad()
def interchange(model: LanguageModel, task, data: Examples, corrupted="key", seed=0,
                value_corruption="value", batch_size=64, cells=None) -> list:
    """A row per (site, layer, position) cell (default: all), over its distinct documents."""
    was_training = model.training
    model.eval()
    rng = rng_for(seed, f"corrupt-{corrupted}")
    if cells is None:
        cells = [(site, layer, position) for site, layer in sites_in(model)
                 for position in POSITIONS]
    clean, corr = [], []  # p(answer) per batch
    patch = {cell: [] for cell in cells}
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        bad_ids = corrupt(task, batch, corrupted, rng, value_corruption)
        cache, rows = {}, torch.arange(len(batch), device=batch.ids.device)
        hooks = [intervene(model, site, layer,  # changes nothing, keeps it in cache[at]
                           lambda act, at=(site, layer): cache.setdefault(at, act))
                 for site, layer in dict.fromkeys((site, layer) for site, layer, _ in cells)]
        clean.append(p_answer(model, batch).double())  # records the clean activations
        for hook in hooks:
            hook.remove()
        corr.append(p_answer(model, batch, bad_ids).double())
        for site, layer, position in patch:
            where = positions(batch, position)
            clean_act = cache[site, layer][rows, where]
            with intervene(model, site, layer, patched(where, clean_act)):
                patch[site, layer, position].append(p_answer(model, batch, bad_ids).double())
    model.train(was_training)
    clean, corr = torch.cat(clean), torch.cat(corr)  # (n,) per document
    out = []
    for (site, layer, position), ps in patch.items():
        m = distinct(data, position)
        p_clean, p_corr, p_patch = (x[m].mean().item() for x in (clean, corr, torch.cat(ps)))
        effect = p_clean - p_corr or math.nan  # no effect (or no document): undefined
        out.append(dict(corrupted=corrupted, site=site, layer=layer, position=position,
                        n=int(m.sum()), p_clean=p_clean, p_corr=p_corr, p_patch=p_patch,
                        attrib=(p_patch - p_corr) / effect))
    return out


def verdict_site(n_layer: int) -> tuple:
    """(site, layer) the verdict reads: the last layer's input; with one layer, whose input is
    the embedding (patching the Key there undoes the corruption), its mixer's output."""
    return ("mixer_output", 0) if n_layer == 1 else ("block_input", n_layer - 1)


def verdict_attribs(rows: list, n_layer: int, layer: int | None = None) -> dict:
    """{position: Attrib} at verdict_site (or block_input[layer]), the Key corrupted."""
    site, layer = verdict_site(n_layer) if layer is None else ("block_input", layer)
    return {r["position"]: r["attrib"] for r in rows
            if r["corrupted"] == "key" and r["site"] == site and r["layer"] == layer}


def key_effect(rows: list) -> float:
    """mean p_clean - mean p_corrupted over all documents, Key corrupted."""
    return next(r["p_clean"] - r["p_corr"] for r in rows if r["corrupted"] == "key"
                and r["position"] == "query")


def dominant(a: dict) -> str | None:
    """The position (key, value or query) that names the mechanism, if one does."""
    a = {k: 0.0 if math.isnan(a[k]) else a[k] for k in ("key", "value", "query")}
    top, second = sorted(a, key=a.get, reverse=True)[:2]
    if a[top] >= VERDICT_DOMINANT and a[second] <= 1 - VERDICT_DOMINANT:
        return top
    return None


def verdict_layer(rows: list, n_layer: int) -> int | None:
    """The verdict's layer: the first past 0 whose input lacks the Key; None: the last."""
    return next((i for i in range(1, n_layer)
                 if verdict_attribs(rows, n_layer, i)["key"] < VERDICT_DOMINANT), None)


def verdict(rows: list, n_layer: int) -> str:
    """The mechanism in words, from Attrib at verdict_layer's input (in deeper models the last
    layer's input shows @Query 1.00 for induction too)."""
    effect = key_effect(rows)
    if math.isnan(effect):
        return "no verdict: p(answer) is NaN"
    if effect < VERDICT_MIN_EFFECT:
        return (f"not learned: corrupting the Key moves p(answer) by only {effect:.3f} "
                f"(< {VERDICT_MIN_EFFECT}), too little to attribute")
    layer = verdict_layer(rows, n_layer)
    a = verdict_attribs(rows, n_layer, layer)
    last = layer in (None, n_layer - 1)
    where = "before the last layer" if last else f"before layer {layer}"
    if n_layer == 1:
        where = "by the one layer's mixer"
    names = {"value": "induction: the key-value binding is stored at the Value position "
                      + where,
             "query": "direct retrieval at the last position: the answer is computed at the "
                      "Query " + where,
             "key": "direct retrieval, late: the last layer reads the Key position itself"}
    top = dominant(a)
    if top:
        return names[top]
    return "mixed: " + ", ".join(f"Attrib@{k.capitalize()} {a[k]:.2f}"
                                 for k in ("key", "value", "query"))


def mechanism_report(rows: list, n_layer: int) -> str:
    """The printed table of Attrib, Key corrupted, and the verdict."""
    lines = ["Attrib (Key corrupted; rows: site[layer], columns: the patched position)",
             f"{'':16s}" + "".join(f"{'@' + position:>10s}" for position in POSITIONS)]
    key_rows = [r for r in rows if r["corrupted"] == "key"]
    table = {}  # (site, layer) -> {position: Attrib}
    for r in key_rows:
        table.setdefault((r["site"], r["layer"]), {})[r["position"]] = r["attrib"]
    layer = verdict_layer(rows, n_layer) if n_layer > 1 else None
    read = verdict_site(n_layer) if layer is None else ("block_input", layer)
    for (site, layer), cells in table.items():
        mark = " <- verdict" if (site, layer) == read else ""
        lines.append(f"{site + f'[{layer}]':16s}"
                     + "".join(f"{cells[position]:10.3f}" for position in POSITIONS) + mark)
    lines.append("p(answer): clean {p_clean:.3f}, Key corrupted {p_corr:.3f}".format(
        **next(r for r in key_rows if r["position"] == "query")))
    n = {r["position"]: r["n"] for r in key_rows}  # documents averaged
    fewer = [f"@{name} {n[name]}" for name in POSITIONS if n[name] < n["query"]]
    if fewer:
        lines.append(f"documents averaged: {', '.join(fewer)} of {n['query']} "
                     "(in the others that position is another named one)")
    conv = table.get(("conv_output", 0))
    if conv and key_effect(rows) >= VERDICT_MIN_EFFECT:
        line = (f"layer 0's short conv output restores Attrib {conv['key']:.2f} at the Key, "
                f"{conv['value']:.2f} at the Value, {conv['value+1']:.2f} at Value+1")
        if conv["value+1"] >= VERDICT_DOMINANT:
            line += ("; here the conv at the token after the Value (its window spans Key and "
                     "Value) carries the association")
        lines.append(line)
    return "\n".join(lines + ["verdict: " + verdict(rows, n_layer)])


def analyse(model: LanguageModel, cfg: Config, split: str = "test") -> dict:
    """Mechanistic evaluation on the test (--held-out: held-out pairs) or dev documents."""
    task, device = make_task(cfg), next(model.parameters()).device
    data = task.sample(cfg.n_eval, rng_for(cfg.seed, split), split=split).to(device)
    rows = (interchange(model, task, data, "key", cfg.seed, cfg.value_corruption)
            + interchange(model, task, data, "value", cfg.seed, cfg.value_corruption))
    return dict(rows=rows, n_docs=len(data), main=verdict_attribs(rows, cfg.n_layer),
                verdict=verdict(rows, cfg.n_layer))


# Does the mechanism form before, with or after the accuracy? Each evaluation asks (below).
DYNAMICS_DOCS = 128  # its cost: figures/bench_dynamics.py


def watch_mechanism(model: LanguageModel, task, test: Examples, cfg: Config) -> dict:
    """The Key's effect and Attribs on the first DYNAMICS_DOCS test documents: the verdict's
    cells, each mixer's output at the Query, Mamba's conv at Value(+1)."""
    site, layer = verdict_site(cfg.n_layer)
    conv = [("conv_output", 0, position) for position in ("value", "value+1")]
    cells = ([(site, layer, position) for position in ("key", "value", "query")]  # main first
             + [("mixer_output", i, "query") for i in range(cfg.n_layer)]
             + (conv if ("conv_output", 0) in sites_in(model) else []))
    rows = interchange(model, task, test[:DYNAMICS_DOCS], "key", cfg.seed,
                       cfg.value_corruption, cells=cells)
    a = {(r["site"], r["layer"], r["position"]): r["attrib"] for r in rows}
    return dict(effect=key_effect(rows), main={cell[2]: a[cell] for cell in cells[:3]},
                cells={"%s[%d]@%s" % cell: a[cell] for cell in cells[3:]})


# 7. The second task: Associative Treecall (ATR) ---------------------------------------------
@dataclasses.dataclass
class Tree:
    """One sampled sentence: a dependency tree over its terminals, and the queried pair."""
    labels: list  # terminal labels 0 .. T-1, in sentence order (token id = 3 + label)
    parent: list  # index of each terminal's parent (to its right); -1 for the root's head
    query: int    # index of the queried terminal (the Key is at position 1 + query)
    target: int   # the answer's index: parent[query], or its sibling (the Value: 1 + target)


def legacy_cdf(probs) -> list:
    """The CDF numpy's legacy choice(p=...) builds: drawing by it gives the official draws."""
    c = np.cumsum(probs)
    return (c / c[-1]).tolist()


class ATR:
    """Associative Treecall: recall a terminal's parent in a sentence of a random headed PCFG.
        pos:  0     1 ... n   n+1    n+2      n+3       n+4
        tok:  <bos> t ... t   <eos>  t_query  t_parent  <eos>
    A constituent emits its children, then its head word: their parent (a head word's is the
    enclosing head), so the associations form a tree. The query repeats the rightmost terminal
    of its label (an unambiguous Key); query="sibling" asks its rightmost sibling (App. D.4).

    Official implementation: aryamanarora/tinylang, tinylang/language/pcfg.py (class PCFG);
    multihop/multihop_no_parent.yaml (sibling). Differences: the documents' draws are a numpy
    Generator's, not the official legacy calls (tests/test_atr.py compares the two)."""

    def __init__(self, n_terminals: int = 20, max_rhs_len: int = 5, n_nonterminals: int = 40,
                 max_rules: int = 5, max_depth: int = 10, terminal_occurrence_factor=None,
                 held_out: float = 0.0, grammar_seed: int = 42, max_length: int = 1024,
                 query: str = "parent"):
        self.n_terminals, self.n_nonterminals = n_terminals, n_nonterminals
        self.max_rhs_len, self.max_rules = max_rhs_len, max_rules
        self.max_depth, self.held_out = max_depth, held_out
        self.terminal_occurrence_factor = terminal_occurrence_factor
        self.max_length, self.query = max_length, query
        self.first_terminal, self.vocab_size = 3, n_terminals + 6  # + 3 unused query types
        self.build_grammar(np.random.RandomState(grammar_seed))

    def build_grammar(self, rs: np.random.RandomState):
        """The held-out pairs, then the grammar, from the legacy RNG in the official order.
        Symbols are ints: s < T is terminal s, s >= T is nonterminal s - T."""
        T, NT = self.n_terminals, self.n_nonterminals
        # 1. the held-out (parent label, query label) pairs (T, T), first: the rest follows
        self.held_pairs = rs.rand(T, T) < self.held_out if self.held_out > 0 else None
        # 2. levels 1..max_depth (official: max_depths); a rule uses higher ones only: all end
        self.level = np.array([rs.randint(1, self.max_depth + 1) for _ in range(NT)])
        # 3. 1..max_rules rules of 1..max_rhs_len-1 uniform symbols; an occurrence factor f:
        #    one placeholder of weight f for all terminals, filled later (shapes ignore T)
        placeholder, rules = -1, []
        for nt in range(NT):
            allowed = [T + x for x in range(NT) if self.level[x] > self.level[nt]]
            symbols, probs = allowed + list(range(T)), None
            if self.terminal_occurrence_factor is not None:
                probs = np.append(np.ones(len(allowed)), self.terminal_occurrence_factor)
                symbols, probs = allowed + [placeholder], probs / probs.sum()
            rules.append([])
            for _ in range(rs.randint(1, self.max_rules + 1)):
                rhs = rs.choice(len(symbols), size=rs.randint(1, self.max_rhs_len), p=probs)
                rules[-1].append([symbols[i] for i in rhs])
        self.rules = [[tuple(rs.randint(T) if s == placeholder else s for s in rhs)
                       for rhs in nt_rules] for nt_rules in rules]
        # 4. rule probabilities, 5. head words (of all T terminals): Dirichlet(1)
        self.rule_probs = [rs.dirichlet(np.ones(len(nt_rules))) for nt_rules in self.rules]
        self.head_probs = [rs.dirichlet(np.ones(T)) for _ in range(NT)]
        self.start_cdf = legacy_cdf(np.ones(NT) / NT)  # 6. a uniform start symbol (no draw)
        self.rule_cdf = [legacy_cdf(probs) for probs in self.rule_probs]
        self.head_cdf = [legacy_cdf(probs) for probs in self.head_probs]

    def derive(self, rng: Generator | np.random.RandomState):
        """Expand a start symbol depth-first, left to right, drawing per constituent its rule,
        then its head word, as officially. A Tree without its query; None past max_length."""
        labels, owner = [], []  # owner: the constituent its parent heads
        T, head_at = self.n_terminals, []  # per constituent: the position of its head word
        stack = [(T + bisect_right(self.start_cdf, rng.random()), -1, -1)]
        while stack:
            if len(labels) >= self.max_length:  # and more to come
                return None
            symbol, up, heads = stack.pop()  # its constituent, the one it heads
            if symbol < T:  # a terminal: emit it
                if heads >= 0:
                    head_at[heads] = len(labels)
                labels.append(symbol)
                owner.append(up)
                continue
            c = len(head_at)  # a nonterminal: constituent c, its head word after its rhs
            head_at.append(-1)
            nt = symbol - T
            rhs = self.rules[nt][bisect_right(self.rule_cdf[nt], rng.random())]
            stack.append((bisect_right(self.head_cdf[nt], rng.random()), up, c))
            stack.extend((s, c, -1) for s in reversed(rhs))  # popped in order
        parent = [head_at[c] if c >= 0 else -1 for c in owner]
        return Tree(labels, parent, query=-1, target=-1)

    def eligible_pairs(self, tree: Tree, split: str = "train") -> list:
        """(query, target) pairs that may be asked, by target: a query rightmost of its label;
        a target its parent, or (sibling) the parent's last child if rightmost of its label
        (maybe the query itself, as officially); their labels allowed in this split."""
        if split not in ("train", "dev", "test"):
            raise ValueError(f"split must be 'train', 'dev' or 'test', not {split!r}")
        rightmost = {label: i for i, label in enumerate(tree.labels)}
        held, test = self.held_pairs, split == "test"
        last = {up: i for i, up in enumerate(tree.parent)}  # per parent: its rightmost child
        target = tree.parent if self.query == "parent" else [last[up] for up in tree.parent]
        pairs = sorted((t, q) for q, (label, t) in enumerate(zip(tree.labels, target))
                       if t >= 0 and rightmost[label] == q
                       and (self.query == "parent" or rightmost[tree.labels[t]] == t)
                       and (held is None or held[tree.labels[t], label] == test))
        return [(q, t) for t, q in pairs]

    def trees(self, n: int, rng: Generator, split: str = "train") -> list:
        """n sentences with pairs (redrawn if < 3 terminals, too long or no pair eligible)."""
        out, draws = [], 0
        while len(out) < n:
            draws += 1
            if draws > 100 * n + 10_000:  # else it may never end (few pairs allowed)
                raise RunError(f"{len(out)} of {n} {split} sentences found in {draws - 1:,} "
                               "draws; --held-out leaves too few pairs on one side")
            tree = self.derive(rng)
            if tree is None or len(tree.labels) < 3:
                continue
            pairs = self.eligible_pairs(tree, split)
            if pairs:  # a uniform target, then a uniform query of it (as officially)
                targets = sorted({t for _, t in pairs})
                tree.target = targets[rng.integers(len(targets))]
                queries = [q for q, t in pairs if t == tree.target]
                tree.query = queries[rng.integers(len(queries))]
                out.append(tree)
        return out

    def examples(self, trees: list) -> Examples:
        """Documents <bos> t ... t <eos> t_query t_parent <eos> (right-padded), positions."""
        lengths = np.array([len(tree.labels) for tree in trees])  # terminals per sentence
        ids = np.full((len(trees), lengths.max() + 5), PAD, dtype=np.int64)
        for row, tree in zip(ids, trees):
            m, labels = len(tree.labels), np.add(tree.labels, self.first_terminal)
            row[:m + 5] = (BOS, *labels, EOS, labels[tree.query], labels[tree.target], EOS)
        return Examples.from_numpy(ids, key=1 + np.array([tree.query for tree in trees]),
                                   value=1 + np.array([tree.target for tree in trees]),
                                   divider=lengths + 1, query=lengths + 2, answer=lengths + 3)

    def sample(self, n: int, rng: Generator, split: str = "train") -> Examples:
        return self.examples(self.trees(n, rng, split))

    def other_token(self, kind: str, tokens: torch.Tensor, rng: Generator) -> torch.Tensor:
        """Per token, a uniform *different* terminal (Keys and Values are both terminals)."""
        return other_than(tokens, self.first_terminal, self.n_terminals, rng)


ATR_SETTINGS = {  # §5.2 (tinylang languages/); pcfg_train_test_split: easy, --held-out 0.2
    "easy": dict(n_terminals=20, max_rhs_len=5),  # pcfg_vary_difficulty/pcfg_5_20
    "medium": dict(n_terminals=20, max_rhs_len=10),  # pcfg_vary_difficulty/pcfg_10_20
    "8192": dict(n_terminals=8192, max_rhs_len=5,
                 terminal_occurrence_factor=20)}  # pcfg_vary_rhs_8192


# Appendix: running it ---------------------------------------------------------------------
import argparse  # noqa: E402
import runpy  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from hashlib import sha1  # noqa: E402

RUN_FILES = ("config.json", "checkpoint.pt", "model.pt", "metrics.json",  # --force deletes
             "mechanism.png", "dynamics.png")  # the last two: figures/plots.py's of the run
FLAGS = {f.name: f.metadata["flag"] or "--" + f.name.replace("_", "-")  # field -> its flag
         for f in dataclasses.fields(Config)}


def say(message: str) -> None:
    """print, to a reader that may stop reading (`| head`): then the run goes on, silent."""
    try:
        print(message, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def choose_device(device: str) -> str:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    n = torch.cuda.device_count()
    allowed = ["cpu"] + ["cuda"] * (n > 0) + [f"cuda:{i}" for i in range(n)]
    if device not in allowed:
        raise ValueError(f"unknown device {device!r}; choose from auto, {', '.join(allowed)}")
    return device


HELP = """Train one model of the paper on its task, save the run in --out, and show how it
solved the task. A run is deterministic for a given seed and thread count on one machine (its
CPU, torch and scan kernel: metrics.json names them). Stopped (Ctrl-C, SIGTERM, SIGHUP) or
killed, the same command resumes it exactly from its last evaluation (a checkpoint every
--eval-every steps). Finished, the same command prints its result and table again, with or
without its model.pt. A folder that is not the run's is refused, its files untouched."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse would print the usage first)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    parser = Parser(prog="mech.py", description=HELP,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Config):
        extra = (dict(action=argparse.BooleanOptionalAction) if field_type(f) is bool
                 else dict(type=field_type(f)))
        default = "from --arch or --preset" if f.default is None else f.default
        allowed = f.metadata["choices"] or (tuple(MIXERS) if f.name == "arch" else None)
        allowed = f"; one of {', '.join(allowed)}" if allowed else ""
        if f.metadata["limits"]:
            allowed = "; {:,} .. {:,}".format(*f.metadata["limits"])
        parser.add_argument(*dict.fromkeys((FLAGS[f.name], "--" + f.name.replace("_", "-"))),
                            dest=f.name, default=argparse.SUPPRESS, **extra,
                            help=f"{f.metadata['help']}{allowed} (default: {default})")
    parser.add_argument("--out", help="run folder (default: runs/<task>_<arch>_..._<hash>)")
    parser.add_argument("--device", default="auto", help="auto (cuda if there is one), cpu, "
                        "cuda or cuda:N (default: auto)")
    parser.add_argument("--threads", type=int, help="CPU threads: each count sums in its own "
                        "order, so the same count gives the same numbers (default: torch's)")
    parser.add_argument("--force", action="store_true", help="start the run in --out over "
                        f"(deletes {', '.join(RUN_FILES)} there)")
    switch = dict(default=True, action=argparse.BooleanOptionalAction)
    parser.add_argument("--interventions", **switch,
                        help="after training, the mechanistic evaluation (default: on)")
    parser.add_argument("--dynamics", **switch,
                        help="at each evaluation, the mechanism while it forms (default: on)")
    parser.add_argument("--mixer-file", metavar="FILE", action="append", help="a Python file "
                        "to run first, one that registers a mixer of your own "
                        "(mech.register_mixer)")
    return parser


def run_mixer_files(paths) -> None:
    """--mixer-file: run each file once; the mixers it registers get the hash of its content
    and of the files before it (a file may build on an earlier file's mixers)."""
    code = ""
    for path in paths or ():
        before = set(MIXERS)
        try:
            with open(path, "rb") as f:
                code = sha1(f.read() + code.encode()).hexdigest()
            if code not in MIXER_CODE.values():
                runpy.run_path(path)
        except (Exception, SystemExit) as e:  # its own error or exit, in one line
            raise ValueError(f"--mixer-file {path}: {type(e).__name__}: {e}") from None
        MIXER_CODE.update(dict.fromkeys(set(MIXERS) - before, code))


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config of the flags given (Config refuses what it refuses from Python)."""
    run_mixer_files(args.mixer_file)
    return Config(**{name: value for name, value in vars(args).items() if name in FLAGS})


def default_out(cfg: Config) -> str:
    task = cfg.task if cfg.task == "ar" else f"atr-{cfg.atr}"
    digest = sha1(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join("runs", f"{task}_{cfg.arch}_d{cfg.d_model}_lr{cfg.lr:g}_s{cfg.seed}"
                                f"_{digest}")


def run(cfg: Config, args) -> dict:
    """Train the run of `cfg` (or resume it, or show it if finished), then analyse it."""
    out = args.out or default_out(cfg)
    if args.force and stored_identity(out) is not None:  # only a run's folder: its files go,
        for name in RUN_FILES[1:]:  # then config.json is this run's (a stop half way leaves
            with contextlib.suppress(FileNotFoundError):  # a run's folder)
                os.unlink(os.path.join(out, name))
        save(os.path.join(out, "config.json"), stored(cfg))
    device = choose_device(args.device)
    model, metrics = train(cfg, out, device, log=say, dynamics=args.dynamics)
    path = os.path.join(out, "metrics.json")
    with reading(path):  # a finished run's file is shown whole, or refused in one line
        right, minutes = round(metrics["accuracy"] * cfg.n_eval), metrics["wall_time_s"] / 60
        say(f"{cfg.arch} on {cfg.task}: test accuracy {metrics['accuracy']:.3f} ({right}/"
            f"{cfg.n_eval}) after {metrics['steps']:,} steps in {minutes:.1f} min "
            f"({metrics['steps_per_s']:.1f} steps/s); saved in {out}")
    for key, split in dict(interventions="test", interventions_dev="dev").items():
        if key in metrics or not args.interventions or (split == "dev" and not cfg.held_out):
            continue
        if model is None:
            raise RunError(f"{out} holds this run finished but not its model.pt, which its "
                           f"{key} need; --force trains it again, or choose another --out")
        say(f"{key}: patching each site, layer and position, Key then Value corrupted")
        metrics[key] = analyse(model, cfg, split)
        save(path, metrics)
    if "interventions" in metrics:
        with reading(path):
            say(mechanism_report(metrics["interventions"]["rows"], cfg.n_layer))
        say(f"pictures of it: python figures/plots.py {out}")
    return metrics


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = {}  # the handlers to put back; a SIGHUP ignored (nohup) stays ignored
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if threading.current_thread() is threading.main_thread() and (
                s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN):
            previous[s] = signal.signal(s, signal.default_int_handler)  # each one a Ctrl-C
    try:
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        return run(config_from_args(args), args)
    except ValueError as e:  # a bad flag, or a mixer that cannot run
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:  # every file is whole (save): the last checkpoint stands
        parser.exit(130, f"{parser.prog}: stopped; the same command resumes the run from its "
                    "last evaluation\n")
    except (RunError, OSError) as e:  # a damaged file, a full disk, a folder not writable
        parser.exit(1, f"{parser.prog}: error: {str(e).strip().splitlines()[-1]}\n")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.modules.setdefault("mech", sys.modules["__main__"])  # a --mixer-file's `import mech`
    main()
