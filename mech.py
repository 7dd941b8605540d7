"""mech.py: a single-file reproduction of "Mechanistic evaluation of Transformers and state space
models" (Arora, Rathi, Selvam, Csordás, Jurafsky, Potts; arXiv 2505.15105).

The paper trains tiny 2-layer models of seven architectures (Attention, BaseConv, Based, H3, Hyena,
Mamba, DeltaNet) on Associative Recall (AR: the value of a repeated key among 16 key-value pairs)
and Associative Treecall (ATR: a word's parent in a sentence of a random tree grammar), then asks
*how* each solved it with interchange interventions. All of it here, read along one AR document:
    1. the first task: Associative Recall       5. training (AdamW, warmup + schedule, evaluation)
    2. building blocks (MLP, causal convs)      6. interventions (the mechanistic evaluation)
    3. the seven sequence mixers                7. the second task: Associative Treecall
    4. blocks and the language model            8. the command line
Every sequence mixer maps (B, L, d) -> (B, L, d) and sits in a residual block,
    Block(x) = x + mixer(norm(x)), then x + MLP(norm(x))     (Mamba blocks have no MLP),
so that "the residual stream entering layer l" is a plain tensor that can be read and patched.
Guaranteed: tasks, architectures and training follow the official code's maths (named with each
component; an official quirk is a flag defaulting to the paper's intent). Not: bit-identical data or
initial weights (other RNG call orders), nor fused CUDA kernels' speed (scan_ext/ compiles Mamba's
hot loop). Sweeps, figures, report: figures/. Reading: the paper (v3 added DeltaNet, conv-internal
patching); Zoology (arXiv 2312.04927: AR, BaseConv, Based); H3 (2212.14052); Hyena (2302.10866);
Mamba (2312.00752), mamba-minimal; DeltaNet (2406.06484); nanoGPT (this file's shape).
Glossary (code name: paper notation, meaning)
    d_model, d         "Model dimension": the width of the residual stream
    n_layer            number of blocks (2 in the main results)
    pos_emb            PE / NoPE: learned absolute position embedding on or off
    pos["key"]         Key: the in-context occurrence of the queried key (ATR: of the queried word)
    pos["value"]       Value: the value stored next to it (ATR: the word's parent), the answer
    pos["divider"]     the <eos> before the query
    pos["query"]       Query: the repeated key; the prediction is read here
    pos["answer"]      the answer token (what follows the Query)
    d_conv             "Conv.": width of the short causal convolution (0 = none)
    d_state, d_inner   N: SSM state size per channel; D = E * d, Mamba's expanded width (Alg. 2)
    dt_rank, delta     R: rank of the projection producing Δ, Mamba's input-dependent step size
    A, B, C, D         SSM parameters: A and D per channel, B and C per token (Mamba)
    phi                φ: Based's 2nd-order Taylor feature map, φ(q)·φ(k) ≈ exp(q·k/√f)
    feature_dim        f = 8: width of Based's q and k
    beta, S            β, S: DeltaNet's write strength and fast-weight state
    max_rhs_len        Lmax: ATR rules have 1 .. Lmax-1 children plus a head word
    n_terminals        |Σ|: ATR's word vocabulary (20 or 8192)
Run it:
    python mech.py --arch mamba --task ar --dconv 4         # CPU preset: ~7 min on 2 cores
    python mech.py --arch based --task atr --atr easy       # Associative Treecall
    python mech.py --preset paper --arch based --lr 1e-3    # the paper's exact protocol
    python mech.py --load runs/<run> --interventions        # analyse a saved run again
    python figures/experiments.py --sweep ar-dconv --jobs 2 # a sweep of the paper, 3 seeds"""

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import pathlib
import pickle
import signal
import time
import zlib
from bisect import bisect_right
from hashlib import sha1

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from numpy.random import Generator

import scan_ext

PAD, BOS, EOS = 0, 1, 2  # the special tokens of both tasks
L_MAX = 1024  # n_positions: the largest sequence; also the time grid of the implicit filters and H3
SCAN_BACKENDS = ("auto", "ext", "ref")  # Mamba's selective scan: see selective_scan
TASKS = {"ar": lambda cfg: AR(cfg.num_kv, cfg.n_pairs)}  # name -> Config -> task; ATR: section 7


# 1. The first task: Associative Recall (AR) -----------------------------------------------------
# The rest of the file sees a task only through its documents (ids, named positions): ATR plugs in.
def rng_for(seed: int, stream: str) -> Generator:  # an independent RNG per (seed, purpose)
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


def distinct_ints(rng: Generator, n: int, k: int, high: int) -> np.ndarray:
    """(n, k): each row k distinct integers drawn uniformly from [0, high), in random order."""
    if k * k > 2 * high:  # repeats would be common: the first k of a shuffle of the small range
        return np.argsort(rng.random((n, high)), axis=1)[:, :k]
    x = rng.integers(0, high, (n, k))  # then redraw the rows with a repeat (~3% for 16 of 4096)
    while (bad := (np.diff(np.sort(x, axis=1), axis=1) == 0).any(axis=1)).any():
        x[bad] = rng.integers(0, high, (int(bad.sum()), k))
    return x


def other_than(tokens: torch.Tensor, first: int, n: int, rng: Generator) -> torch.Tensor:
    """For each of the tokens (ids in first .. first+n-1), another id of that range, uniformly."""
    r = torch.from_numpy(rng.integers(0, n - 1, len(tokens))).to(tokens.device)
    return first + r + (r >= tokens - first)  # skip the original: uniform over the n - 1 others


@dataclasses.dataclass
class Examples:  # documents with their named positions (one per document and name)
    ids: torch.Tensor  # (n, L) token ids, right-padded with PAD when lengths differ
    pos: dict          # name -> (n,) LongTensor: key, value, divider, query, answer
    @classmethod
    def from_numpy(cls, ids: np.ndarray, **pos: np.ndarray) -> "Examples":
        return cls(torch.from_numpy(ids), {k: torch.from_numpy(v).long() for k, v in pos.items()})
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):  # a slice or an index tensor selects documents
        return Examples(self.ids[i], {name: p[i] for name, p in self.pos.items()})
    def to(self, device):
        return Examples(self.ids.to(device), {name: p.to(device) for name, p in self.pos.items()})
    def trim(self):  # drop padding no document needs (ATR): causal models predict the same
        return Examples(self.ids[:, :int(self.pos["answer"].max()) + 2], self.pos)
    @property
    def answer(self) -> torch.Tensor:  # (n,) the token the model must predict at pos["query"]
        return self.ids[torch.arange(len(self.ids), device=self.ids.device), self.pos["answer"]]


class AR:
    """Associative Recall, as the paper's AR-32.
        pos:  0     1   2   3   4  ...  31   32   33    34   35   36
        tok:  <bos> k1  v1  k2  v2 ...  k16  v16  <eos> kq   vq   <eos>
    16 keys and 16 values, drawn without replacement from disjoint halves of the num_kv = 8192
    key/value tokens, are paired in order: no global key -> value map, the association exists only
    in context; the model sees k_i after the divider and must output v_i. Vocabulary: PAD 0, BOS 1,
    EOS 2, keys, values, one unused id: V = num_kv + 4 = 8196, as officially (parameter counts too).
    Official implementation: tinylang/language/ar.py (class AR), languages/ar_vary_kv/ar_32.yaml.
    Differences: numpy's PCG64, not the official torch/numpy/random calls: the same distribution."""
    def __init__(self, num_kv: int = 8192, n_pairs: int = 16):
        self.n_keys, self.n_pairs = num_kv // 2, n_pairs  # keys and values each get half of num_kv
        self.first_key, self.first_value = 3, 3 + self.n_keys
        self.vocab_size, self.length = num_kv + 4, 2 * n_pairs + 5
    def sample(self, n: int, rng: Generator, split: str = "train") -> Examples:
        """n documents. AR has no held-out split: train and test documents differ by their rng."""
        P, L = self.n_pairs, self.length
        keys = self.first_key + distinct_ints(rng, n, P, self.n_keys)        # (n, P)
        values = self.first_value + distinct_ints(rng, n, P, self.n_keys)    # (n, P)
        i, rows = rng.integers(0, P, n), np.arange(n)                        # queried pair, rows
        ids = np.empty((n, L), dtype=np.int64)
        ids[:, 1:2 * P + 1:2], ids[:, 2:2 * P + 2:2] = keys, values
        ids[:, 0], ids[:, [2 * P + 1, 2 * P + 4]] = BOS, EOS  # the start; the divider, the end
        ids[:, 2 * P + 2], ids[:, 2 * P + 3] = keys[rows, i], values[rows, i]  # Query, answer
        return Examples.from_numpy(ids, key=2 * i + 1, value=2 * i + 2, divider=np.full(n, L - 4),
                                   query=np.full(n, L - 3), answer=np.full(n, L - 2))
    def other_token(self, kind: str, tokens: torch.Tensor, rng: Generator) -> torch.Tensor:
        """Per token, a uniform *different* token of its kind ("key" or "value"): counterfactual."""
        first = {"key": self.first_key, "value": self.first_value}[kind]
        return other_than(tokens, first, self.n_keys, rng)


def make_task(cfg: "Config"):
    return TASKS[cfg.task](cfg)


# 2. Building blocks: the MLP, causal convolutions (short and long), the implicit filters' grid --
class MLP(nn.Module):  # fc2(GELU(fc1(x))), a 4x hidden layer. Official: zoology/mixers/mlp.py
    def __init__(self, d: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CausalConv1d(nn.Conv1d):
    """The short convolution shared by BaseConv, Hyena, Mamba and DeltaNet: depthwise and causal,
        y[t, c] = bias[c] + Σ_{i<k} w[c, i] · x[t - (k-1) + i, c]      (x before position 0 is 0):
    nn.Conv1d(C, C, k, groups=C, padding=k-1)'s first L outputs (same weights, init) as k shifted
    multiply-adds on (B, L, C); Mamba, Hyena train ~1.15x faster on a CPU than with transposes."""
    def __init__(self, channels: int, width: int, bias: bool = True):
        super().__init__(channels, channels, width, groups=channels, padding=width - 1, bias=bias)
    def forward(self, x):                                   # x: (B, L, C)
        k, L = self.kernel_size[0], x.shape[1]
        x = F.pad(x, (0, 0, k - 1, 0))                      # (B, k-1+L, C): zeros before position 0
        y = sum(self.weight[:, 0, i] * x[:, i:i + L] for i in range(k))
        return y + self.bias if self.bias is not None else y


def short_conv(channels: int, width: int, bias: bool) -> nn.Module:
    """A width-k causal conv, or nothing at all for width 0 (the paper's "conv removed")."""
    return CausalConv1d(channels, width, bias) if width > 0 else nn.Identity()


def causal_long_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Exact causal (linear, not circular) convolution with a filter as long as the sequence:
        y[b, t, c] = Σ_{s<=t} k[c, t-s] · u[b, s, c]
    u: (B, L, C), k: (C, L) -> (B, L, C), one matmul with the Toeplitz T[c, t, s] = k[c, t-s]: the
    official FFTs' maths, but exactly causal and faster on a CPU here (H3 trains 1.6x faster)."""
    L = u.shape[1]
    lag = torch.arange(L, device=u.device)[:, None] - torch.arange(L, device=u.device)   # t - s
    T = k[:, lag.clamp(min=0)] * (lag >= 0)                         # (C, L, L)
    return (T @ u.permute(2, 1, 0).contiguous()).permute(2, 1, 0)  # (C, L, B) -> (B, L, C)


def filter_time_grid():
    """The implicit filters' input z (L_MAX, 3), one band f = 1e-4 (in effect, normalised time):
    z_j = [t_j, cos(2π f j / L_MAX), -sin(2π f j / L_MAX)], t_j = j / (L_MAX-1), returned as t."""
    t, w = torch.linspace(0, 1, L_MAX), 2 * math.pi * torch.arange(L_MAX) / L_MAX * 1e-4
    return torch.stack([t, torch.cos(w), -torch.sin(w)], dim=-1), t


# 3. The seven sequence mixers, each (B, L, d) -> (B, L, d) --------------------------------------
class Attention(nn.Module):
    """Causal softmax attention: y = out_proj(softmax(q kᵀ / √d_head + M) v) per head (1 in the
    paper). Wqkv has no bias (officially bias=False); positions only from the position embedding.
    Official implementation: aryamanarora/zoology, zoology/mixers/attention.py (class MHA).
    Differences: the causal mask is -inf where the official code adds -10000 (equal in fp32)."""
    def __init__(self, d: int, n_head: int = 1):
        super().__init__()
        self.n_head = n_head
        self.Wqkv, self.out_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d)
    def forward(self, x):
        (B, L, d), h = x.shape, self.n_head
        q, k, v = self.Wqkv(x).view(B, L, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, L, d/h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)                       # (B, h, L, L)
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(B, L, d))           # (B, L, d)


class ImplicitLongConv(nn.Module):
    """conv(u) = K * u + u, a length-L filter K[:, j] = MLP(z_j): Linear(3,16), ReLU, Linear(16,d).
    Official implementation: zoology/mixers/convolution.py (ImplicitLongConvolution)."""
    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("z", filter_time_grid()[0], persistent=False)  # fixed input grid
        self.mlp = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, d))
    def forward(self, u):                                   # u: (B, L, d)
        return causal_long_conv(u, self.mlp(self.z[:u.shape[1]]).T) + u  # the filter: (d, L)


class BaseConv(nn.Module):
    """BaseConv, a gated convolution with its own skip: y = conv(u) ⊙ (W u + b) + u, where conv
    is a short causal conv (width k) or, for width None, an implicit long conv.
    Official implementation: aryamanarora/zoology, zoology/mixers/base_conv.py (BaseConv)."""
    def __init__(self, d: int, width: int | None):
        super().__init__()
        self.projection = nn.Linear(d, d)
        self.conv = CausalConv1d(d, width) if width else ImplicitLongConv(d)
    def forward(self, u):
        return self.conv(u) * self.projection(u) + u


class TaylorLinearAttention(nn.Module):
    """Based's linear attention: softmax attention with exp replaced by its 2nd-order Taylor series.
    With φ(x) = [1, x / f^(1/4), vec(x xᵀ) / (√2 √f)] (1 + f + f² dims, f = feature_dim = 8)
    and s = q·k / √f, φ(q)·φ(k) = 1 + s + s²/2, and causal normalised linear attention is
        y_n = Σ_{m<=n} (φ(q_n)·φ(k_m)) v_m  /  (Σ_{m<=n} φ(q_n)·φ(k_m) + ε):
    a fixed-size recurrent state (S = Σ φ(k) vᵀ, z = Σ φ(k)), trained in its "quadratic" form.
    Official implementation: aryamanarora/zoology, zoology/mixers/based.py (Based, TaylorExp)."""
    def __init__(self, d: int, feature_dim: int = 8, eps: float = 1e-12):
        super().__init__()
        self.feature_dim, self.eps = feature_dim, eps
        self.proj_q, self.proj_k = (nn.Linear(d, feature_dim, bias=False) for _ in range(2))
        self.proj_v, self.proj_o = (nn.Linear(d, d, bias=False) for _ in range(2))
    def forward(self, x):
        q, k, v = self.proj_q(x), self.proj_k(x), self.proj_v(x)  # (B, L, f), (B, L, f), (B, L, d)
        s = q @ k.transpose(1, 2) / math.sqrt(self.feature_dim)   # (B, L, L)
        A = (1 + s + s * s / 2).tril()                            # φ(q_n)·φ(k_m) for m <= n
        return self.proj_o((A @ v) / (A.sum(-1, keepdim=True) + self.eps))  # proj_o of (B, L, d)


class H3(nn.Module):
    """H3 ("Hungry Hungry Hippos") with d_state N = 1024 and head_dim p = 2 (H = d/p heads):
        k' = K_shift * k + D_k ⊙ k                   shift SSM: a learned causal FIR filter on k
        kv[i, j, h] = k'[h p + i] · v[h p + j]       per-head outer product
        Y = K_diag,h * kv + D_h kv                   diagonal SSM (S4D), one kernel per head
        out[j, h] = Σ_i q[h p + i] · Y[i, j, h]      read-out; channel j H + h, then output_linear
    K_shift cross-correlates two learned vectors (B = e_1 at init); S4D, bilinear discretisation:
        dA = (1 + ΔA/2)/(1 - ΔA/2),   C' = B C Δ/(1 - ΔA/2),   K[l] = 2 Re Σ_n C'_n dA_n^l.
    Official implementation: aryamanarora/zoology, zoology/mixers/h3/ (h3.py, ss_kernel_shift.py,
    ss_kernel_diag.py; "diag-lin" init: A = -1/2 + iπn, B = 1, C ~ CN(0, 1), Δ ~ logU[1e-3, 0.1]).
    Differences: both long convolutions are Toeplitz matmuls instead of FFTs (the same maths)."""
    def __init__(self, d: int, d_state: int = L_MAX, head_dim: int = 2):
        super().__init__()
        self.p, self.H, N = head_dim, d // head_dim, d_state
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        # shift SSM on k: B_shift = e_1, C_shift ~ U(±1/√N) (kaiming-uniform), D_k ~ N(0, 1)
        self.shift_B = nn.Parameter(F.one_hot(torch.zeros(d, dtype=torch.long), N).float())
        self.shift_C = nn.Parameter(torch.empty(d, N).uniform_(-1 / math.sqrt(N), 1 / math.sqrt(N)))
        self.shift_D = nn.Parameter(torch.randn(d))
        H, M = self.H, N // 2  # diagonal SSM: M = N/2 complex modes per head, as (..., 2) reals
        self.log_dt = nn.Parameter(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.inv_A_real = nn.Parameter(torch.full((H, M), math.log(0.5)))         # Re A = -exp(.)
        self.A_imag = nn.Parameter(math.pi * torch.arange(M).float().repeat(H, 1))
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, M, dtype=torch.cfloat)).clone())
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, M, dtype=torch.cfloat)).clone())
        self.D, self.output_linear = nn.Parameter(torch.randn(H)), nn.Linear(d, d)
    def shift_kernel(self, L):  # (d, L): K[c, l] = Σ_j B[c, j] C[c, j + l], by FFT
        N = self.shift_B.shape[1]  # zero-padded to 2N, so that the FFT's wrap-around adds nothing
        fft = lambda x: torch.fft.rfft(x, n=2 * N)
        K = torch.fft.irfft(fft(self.shift_B).conj() * fft(self.shift_C), n=2 * N)[:, :min(L, N)]
        return F.pad(K, (0, max(0, L - N)))  # 0 past lag N-1
    def diag_kernel(self, L):   # (H, L), S4D with bilinear discretisation
        dt = self.log_dt.exp()[:, None]                                         # (H, 1)
        dtA = torch.complex(-self.inv_A_real.exp(), self.A_imag) * dt           # ΔA: (H, N/2)
        dA = (1 + dtA / 2) / (1 - dtA / 2)
        C = torch.view_as_complex(self.B) * torch.view_as_complex(self.C) * dt / (1 - dtA / 2)
        # The Vandermonde sum without an (H, N/2, L) table of powers (the plain form, the tests'
        # oracle, made H3 train 6x slower here): with l = s j + i, s ≈ √L, K[s j + i] =
        # 2 Re Σ_n (C_n dA_n^(s j)) dA_n^i, one small matmul per head over two tables of √L
        # powers |dA|^l (cos lθ + i sin lθ), θ = arg dA, in real arithmetic.
        s = math.isqrt(L - 1) + 1
        J = -(-L // s)
        log_r, theta = dA.abs().log()[..., None], dA.angle()[..., None]          # (H, N/2, 1)
        polar = lambda mag, ang: (mag * torch.cos(ang), mag * torch.sin(ang))  # real, imaginary
        powers = lambda e: polar(torch.exp(e * log_r), e * theta)  # dA^e for each e: (H, N/2, len)
        small_re, small_im = powers(torch.arange(s, device=dt.device))           # dA^i, i < s
        big_re, big_im = powers(s * torch.arange(J, device=dt.device))           # dA^(s j), j < J
        Cr, Ci = C.real[..., None], C.imag[..., None]
        X_re, X_im = Cr * big_re - Ci * big_im, Cr * big_im + Ci * big_re        # C dA^(s j)
        K = 2 * (X_re.transpose(1, 2) @ small_re - X_im.transpose(1, 2) @ small_im)  # (H, J, s)
        return K.flatten(1)[:, :L]
    def forward(self, u):
        (B, L, d), p, H = u.shape, self.p, self.H
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)              # (B, L, d) each
        k = causal_long_conv(k, self.shift_kernel(L)) + self.shift_D * k
        # (B, L, p, H), heads last and contiguous: with p = 2 innermost, elementwise ops would crawl
        q, k, v = (x.view(B, L, H, p).transpose(2, 3).contiguous() for x in (q, k, v))
        kv = k[:, :, :, None] * v[:, :, None]                                 # (B, L, p_i, p_j, H)
        # one S4D kernel per head, shared by its p x p products: fold (i, j) into the batch
        kv_h = kv.permute(0, 2, 3, 1, 4).reshape(B * p * p, L, H)             # (B p p, L, H)
        Y = causal_long_conv(kv_h, self.diag_kernel(L)).view(B, p, p, L, H).permute(0, 3, 1, 2, 4)
        Y = Y + self.D * kv                                                   # (B, L, p_i, p_j, H)
        y = (q[:, :, :, None] * Y).sum(2)                                     # (B, L, p_j, H)
        return self.output_linear(y.reshape(B, L, d))                         # channel j H + h


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter h (d, L): an MLP of the time grid z with sine activations,
        h[:, j] = Linear(64, d)(Sin(Linear(64, 64)(Sin(Linear(64, 64)(Sin(Linear(3, 64)(z_j)))))))
    with Sin(x) = sin(ω x) (one ω ∈ R^64 for all three, init 1), then exponentially decayed,
        h[c, j] *= exp(-t_j |δ_c|),   δ = linspace(ln(0.01)/1.5, ln(0.01)/0.3, d)."""
    def __init__(self, d: int, order: int = 64):
        super().__init__()
        z, t = filter_time_grid()
        self.z = nn.Parameter(z)  # trainable, as officially (its tiny-LR hint was ignored there)
        self.register_buffer("t", t, persistent=False)
        deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, d)
        self.register_buffer("deltas", deltas, persistent=False)
        self.omega = nn.Parameter(torch.ones(order))
        self.lin = nn.ModuleList(nn.Linear(3 if i == 0 else order, order) for i in range(3))
        self.out = nn.Linear(order, d, bias=False)
    def forward(self, L):
        h = self.z[:L]                                           # (L, 3)
        for lin in self.lin:
            h = torch.sin(self.omega * lin(h))                   # (L, order)
        return (self.out(h) * torch.exp(-self.t[:L, None] * self.deltas.abs())).T  # (d, L)


class Hyena(nn.Module):
    """Hyena of order 2 (1 head):
        x1, x2, v = split(short_conv_3(in_proj(u)))         width-3 causal conv on all 3d channels
        v = x2 ⊙ (h * (x1 ⊙ v) + D ⊙ (x1 ⊙ v));   y = out_proj(v)  implicit filter h, skip D
    Official implementation: aryamanarora/zoology, zoology/mixers/hyena.py (Hyena, Filter).
    Quirk: the official bias=False, passed to the Filter, zeroes D; --no-hyena-d-skip does too."""
    def __init__(self, d: int, d_skip: bool = True, filter_order: int = 64):
        super().__init__()
        self.in_proj, self.short_filter = nn.Linear(d, 3 * d), CausalConv1d(3 * d, 3)
        self.filter = HyenaFilter(d, filter_order)
        self.D, self.d_skip, self.out_proj = nn.Parameter(torch.randn(d)), d_skip, nn.Linear(d, d)
    def forward(self, u):
        x1, x2, v = self.short_filter(self.in_proj(u)).chunk(3, dim=-1)    # (B, L, d) each
        v = v * x1
        v = causal_long_conv(v, self.filter(u.shape[1])) + self.d_skip * self.D * v
        return self.out_proj(v * x2)


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       return_last_state=False):
    """Mamba's selective scan as a loop over time in fp32 (or fp64), with the signature, shapes and
    semantics of mamba-ssm's selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py):
        u, delta, z: (b, d, l)   A: (d, n)   B, C: (b, n, l)   D, delta_bias: (d,)   -> (b, d, l)
        Δ = softplus(delta + delta_bias)   (softplus only if delta_softplus)
        h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t          h_{-1} = 0, state (b, d, n)
        y_t = C_t · h_t + D u_t;   out = y ⊙ SiLU(z)         (the latter if z is given)
    Its other forms too: B or C constant over time, (d, n), or grouped, (b, g, n, l) with d/g
    channels per group; return_last_state returns (out, h_{l-1}). Real A only."""
    def per_step(X, d, l):  # B or C as (b or 1, d or 1, l, n), for each of their forms
        if X.dim() == 2:  # constant (d, n)
            return X[None, :, None, :].expand(1, d, l, X.shape[1])
        if X.dim() == 3:  # (b, n, l)
            return X.transpose(1, 2)[:, None]
        if d % X.shape[1]:  # grouped (b, g, n, l)
            raise ValueError(f"selective_scan: {X.shape[1]} groups do not divide {d} channels")
        return X.transpose(2, 3).repeat_interleave(d // X.shape[1], dim=1)
    dtype, (b, d, l) = u.dtype, u.shape
    up = lambda x: None if x is None else x.to(torch.promote_types(x.dtype, torch.float32))
    u, delta, A, B, C, D, z, delta_bias = map(up, (u, delta, A, B, C, D, z, delta_bias))
    delta = delta if delta_bias is None else delta + delta_bias[:, None]
    delta = F.softplus(delta) if delta_softplus else delta          # threshold 20, as upstream
    decay = torch.exp(delta[..., None] * A[:, None, :])             # (b, d, l, n): exp(Δ_t A)
    write = (delta * u)[..., None] * per_step(B, d, l)              # (b, d, l, n): Δ_t u_t B_t
    h, ys = u.new_zeros(b, d, A.shape[1]), []                       # state (b, d, n), outputs
    # unbind, not [:, :, t]: the backward of indexing builds a full-size zero tensor at every step
    for decay_t, write_t, C_t in zip(decay.unbind(2), write.unbind(2), per_step(C, d, l).unbind(2)):
        h = decay_t * h + write_t
        ys.append((h * C_t).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(u.shape)    # (b, d, l)
    y = y if D is None else y + D[:, None] * u
    y = y if z is None else y * F.silu(z)
    return (y.to(dtype), h) if return_last_state else y.to(dtype)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, backend="auto"):
    """selective_scan_ref's maths on a backend: "ref" the loop above (the oracle), "ext" scan_ext/'s
    compiled C++/CUDA kernel (an error if it cannot be built), "auto" the kernel, else the loop. The
    kernel takes Mamba's form only (B, C: (b, n, l), no return_last_state; "ext" refuses others)."""
    if backend not in SCAN_BACKENDS:
        raise ValueError(f"selective_scan: unknown backend {backend!r}; "
                         f"choose from {', '.join(SCAN_BACKENDS)}")
    kernel_form = B.dim() == C.dim() == 3 and not return_last_state
    if backend == "ext" and not kernel_form:
        raise ValueError("selective_scan: backend 'ext' takes B and C of shape (b, n, l) and no "
                         "return_last_state; use backend 'ref' or 'auto' for the other forms")
    fast = backend != "ref" and kernel_form and scan_ext.kernel(u.device, required=backend == "ext")
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return fast(*args) if fast else selective_scan_ref(*args, return_last_state)


class Mamba(nn.Module):
    """Mamba (selective SSM), d_state N = 16, expand E = 2 (d_inner = 2d), dt_rank R = ceil(d/16):
        x, z = split(in_proj(u))                   (B, L, d_inner) each
        x = SiLU(conv(x))                          short causal conv of width d_conv (0 = none)
        δ, B, C = split(x_proj(x))                 (B, L, R), (B, L, N), (B, L, N)
        Δ = softplus(dt_proj(δ))                   (B, L, d_inner)
        y = selective_scan(x, Δ, A = -exp(A_log), B, C, D) ⊙ SiLU(z);   out = out_proj(y)
    d_conv is the paper's ablation knob: 4 by default, 0 removes the conv (SiLU kept), 1 is a
    per-channel scale and bias. conv_in, conv_out (before SiLU), act_out: identities to hook.
    Official implementation: state-spaces/mamba, mamba_ssm/modules/mamba_simple.py (Mamba, 2.2.4);
    conv ablations aryamanarora/tinylang, tinylang/model/arch/mamba.py.
    Differences: nn.Conv1d for every width, and no unused conv parameters when d_conv = 0."""
    def __init__(self, d: int, d_conv: int = 4, d_state: int = 16, expand: int = 2,
                 scan: str = "auto", dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        D_in, N, R = expand * d, d_state, math.ceil(d / 16)
        self.d_inner, self.d_state, self.dt_rank, self.scan = D_in, N, R, scan
        self.in_proj = nn.Linear(d, 2 * D_in, bias=False)
        self.conv_in, self.conv_out, self.act_out = nn.Identity(), nn.Identity(), nn.Identity()
        self.conv1d = short_conv(D_in, d_conv, bias=True)
        self.x_proj = nn.Linear(D_in, R + 2 * N, bias=False)
        self.dt_proj, self.out_proj = nn.Linear(R, D_in, bias=True), nn.Linear(D_in, d, bias=False)
        # Mamba's own init: Δ log-uniform in [dt_min, dt_max] (softplus⁻¹ of it as the bias), A
        # S4D-real (A_n = -(n+1)), D = 1. The generic re-init (init_weights) skips dt_proj.bias.
        nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)
        dt = torch.exp(torch.rand(D_in) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=1e-4)
        self.dt_proj.bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1.0)).repeat(D_in, 1))  # (D_in, N)
        self.D = nn.Parameter(torch.ones(D_in))
    def forward(self, u):
        x, z = self.in_proj(u).chunk(2, dim=-1)                   # (B, L, D_in) each
        x = self.act_out(F.silu(self.conv_out(self.conv1d(self.conv_in(x)))))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt, A = dt @ self.dt_proj.weight.T, -torch.exp(self.A_log)  # (B, L, D_in), (D_in, N)
        x, dt, B, C, z = (t.transpose(1, 2) for t in (x, dt, B, C, z))  # (B, channels, L)
        y = selective_scan(x, dt, A, B, C, self.D, z, delta_bias=self.dt_proj.bias,
                           delta_softplus=True, backend=self.scan)  # (B, D_in, L)
        return self.out_proj(y.transpose(1, 2))                   # (B, L, d)


def delta_rule(q, k, v, beta):
    """The delta rule, computed for the whole sequence at once:
        S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,   o_t = S_tᵀ q_t,   S_0 = 0.
    Writing S_t = Σ_{s<=t} k_s u_sᵀ, the values actually written, and the outputs, are
        u_t = β_t (v_t - Σ_{s<t} (k_t·k_s) u_s),     o_t = Σ_{s<=t} (q_t·k_s) u_s,
    the u a unit lower-triangular linear system (I + tril(β k kᵀ, -1)) U = β V, solved exactly.
    q, k: (..., L, d_k), v: (..., L, d_v), beta: (..., L) -> (..., L, d_v). This is FLA's chunked
    (WY) form with one chunk; the per-step loop is in the tests as the oracle."""
    L = q.shape[-2]
    ones = torch.ones(L, L, dtype=torch.bool, device=q.device)
    M = (beta[..., None] * (k @ k.transpose(-2, -1))).masked_fill(~ones.tril(-1), 0)  # (..., L, L)
    M = M + torch.eye(L, device=q.device, dtype=q.dtype)
    U = torch.linalg.solve_triangular(M, beta[..., None] * v, upper=False, unitriangular=True)
    return (q @ k.transpose(-2, -1)).masked_fill(~ones.tril(), 0) @ U


class DeltaNet(nn.Module):
    """DeltaNet (added in the paper's v3): linear attention with a delta-rule fast-weight state.
        q, k, v = SiLU(conv(W_q x)), SiLU(conv(W_k x)), SiLU(conv(W_v x))   short convs, no bias
        q, k = q/‖q‖, k/‖k‖;   β = sigmoid(W_β x)                             per head
        o = delta_rule(q / √d_k, k, v, β);   y = o_proj(RMSNorm(o))
    Official implementation: fla-org/flash-linear-attention, fla/layers/delta_net.py (DeltaNet with
    its defaults: use_beta, short conv 4, silu q/k activation, l2 q/k norm, no gate).
    Differences: fp32 (v3 code casts to bf16 for Triton); an exact triangular solve, no Triton."""
    def __init__(self, d: int, n_head: int = 1, d_conv: int = 4):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.b_proj, self.n_head = nn.Linear(d, n_head, bias=False), n_head
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (short_conv(d, d_conv, bias=False)
                                                       for _ in range(3))
        self.o_norm, self.o_proj = nn.RMSNorm(d // n_head, eps=1e-5), nn.Linear(d, d, bias=False)
    def forward(self, x):
        (B, L, d), h = x.shape, self.n_head
        heads = lambda y: y.view(B, L, h, d // h).transpose(1, 2)          # (B, h, L, d/h)
        q = heads(F.silu(self.q_conv1d(self.q_proj(x))))
        k = heads(F.silu(self.k_conv1d(self.k_proj(x))))
        v = heads(F.silu(self.v_conv1d(self.v_proj(x))))
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)               # (B, h, L)
        o = delta_rule(q * (d // h) ** -0.5, k, v, beta)                    # (B, h, L, d/h)
        return self.o_proj(self.o_norm(o).transpose(1, 2).reshape(B, L, d))


# 4. Blocks, the language model, initialisation, and the registry of architectures ---------------
class Block(nn.Module):  # a pre-norm residual block: residual stream -> residual stream
    def __init__(self, d: int, mixer: nn.Module, mamba: bool):
        super().__init__()
        self.norm1, self.mixer = (nn.RMSNorm(d, eps=1e-5) if mamba else nn.LayerNorm(d)), mixer
        self.norm2, self.mlp = (None, None) if mamba else (nn.LayerNorm(d), MLP(d))  # Mamba: no MLP
    def forward(self, x):                      # x: (B, L, d)
        x = x + self.mixer(self.norm1(x))      # sequence mixing
        return x if self.mlp is None else x + self.mlp(self.norm2(x))  # per-position MLP


# arch -> (cfg, layer index) -> mixer. The hybrids alternate by layer as zoology's Hybrid: BaseConv
# [short k=3, long, short, ...], Based [BaseConv short conv, Taylor linear attention, BaseConv...].
MIXERS = {
    "attention": lambda cfg, i: Attention(cfg.d_model, cfg.n_head),
    "base_conv": lambda cfg, i: BaseConv(cfg.d_model,
                                         None if cfg.long_conv or i % 2 else (cfg.d_conv or 3)),
    "based": lambda cfg, i: TaylorLinearAttention(cfg.d_model) if i % 2 else
                            BaseConv(cfg.d_model, None if cfg.long_conv else cfg.d_conv),
    "h3": lambda cfg, i: H3(cfg.d_model),
    "hyena": lambda cfg, i: Hyena(cfg.d_model, d_skip=cfg.hyena_d_skip),
    "mamba": lambda cfg, i: Mamba(cfg.d_model, d_conv=cfg.d_conv, scan=cfg.scan),
    "delta_net": lambda cfg, i: DeltaNet(cfg.d_model, cfg.n_head, d_conv=cfg.d_conv)}
DEFAULT_DCONV = {"mamba": 4, "delta_net": 4, "based": 3}  # archs whose short conv --dconv sets


class LanguageModel(nn.Module):
    """ids (B, L) -> token embedding (+ position embedding) -> blocks -> LayerNorm -> logits, the
    output head tied to the token embedding. Official: tinylang/model/arch/zoology.py (tinylang)."""
    def __init__(self, cfg: "Config", vocab_size: int):
        super().__init__()
        d, self.tok_emb = cfg.d_model, nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(L_MAX, d) if cfg.pos_emb else None
        self.blocks = nn.ModuleList(Block(d, MIXERS[cfg.arch](cfg, i), mamba=cfg.arch == "mamba")
                                    for i in range(cfg.n_layer))
        self.norm_f = nn.LayerNorm(d)
        init_weights(self, cfg)
    def forward(self, ids, at=None):
        """ids: (B, L). Returns logits (B, L, V), or (B, V) at one position per row if `at` (B,) is
        given: the task is scored at the Query only, and the (V x d) head is most of the cost."""
        if ids.shape[1] > L_MAX:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds the model's maximum {L_MAX}")
        x = self.tok_emb(ids)                                               # (B, L, d)
        x = x if self.pos_emb is None else x + self.pos_emb.weight[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)                                                    # (B, L, d)
        x = x if at is None else x[torch.arange(len(x), device=x.device), at]  # (B, d) if `at`
        return F.linear(self.norm_f(x), self.tok_emb.weight)                # (B, [L,] V), tied head


def init_weights(model: nn.Module, cfg: "Config"):
    """The official initialisation, after the modules' own inits. All but Mamba (zoology): Linear
    weights and embeddings ~ N(0, 0.02), biases 0, and weights *named* out_proj.weight, fc2.weight
    or output_linear.0.weight ~ N(0, 0.02/√(2 n_layer)) (so not H3's output_linear, Based's
    proj_o, BaseConv's projection or DeltaNet's o_proj). Mamba (mamba_ssm): the same embeddings and
    biases (but dt_proj.bias), PyTorch's Linear weights, out_proj kaiming-uniform / √n_layer."""
    mamba = cfg.arch == "mamba"
    rescaled = ("out_proj.weight", "fc2.weight", "output_linear.0.weight")  # zoology's name rule
    for name, m in model.named_modules():
        if isinstance(m, nn.Embedding) or isinstance(m, nn.Linear) and not mamba:
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None and not name.endswith("dt_proj"):
            nn.init.zeros_(m.bias)
    for name, p in model.named_parameters():
        if mamba and name.endswith("out_proj.weight"):
            nn.init.kaiming_uniform_(p, a=math.sqrt(5))
            p.data /= math.sqrt(cfg.n_layer)  # .data: an init, not a step autograd should see
        elif not mamba and name.endswith(rescaled):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))


# 5. Training ------------------------------------------------------------------------------------
def opt(default, help, flag=None):  # a Config field, its --help text and (if not its name) flag
    return dataclasses.field(default=default, metadata=dict(help=help, flag=flag))


@dataclasses.dataclass
class Config:
    """Everything that defines a run; each field is a flag (--d-model for d_model): Config(arch=A,
    task=T) is the run `mech.py --arch A --task T`, None fields taking the preset's value."""
    task: str = opt("ar", "the task: ar or atr")  # -- what to train
    arch: str = opt("attention", "attention, base_conv, based, h3, hyena, mamba or delta_net")
    preset: str = opt("cpu", "defaults: cpu (calibrated on 2 CPU cores) or paper (its protocol)")
    d_model: int = opt(64, "model width d (paper grid: 16, 32, 64, 128, 256)")
    n_layer: int = opt(2, "number of blocks (the paper: 2; appendix: 1 and 3)", "--layers")
    n_head: int = opt(1, "attention / DeltaNet heads (the paper: 1)", "--heads")
    pos_emb: bool | None = opt(None, "learned position embedding (default: attention only)")
    d_conv: int | None = opt(None, "short-conv width (0 = none) of mamba, delta_net (4), based "
                                   "and base_conv (3)", "--dconv")
    long_conv: bool = opt(False, "based / base_conv: the implicit long conv for the short one")
    hyena_d_skip: bool = opt(True, "Hyena's D skip (the official runs had it zeroed by a bug)")
    value_corruption: str = opt("value", "a corrupted Value becomes a value, or a key (official)")
    scan: str = opt("auto", "Mamba's scan: ext (compiled scan_ext/), ref (loop) or auto")
    num_kv: int = opt(8192, "AR: number of key + value tokens (half keys, half values)")  # -- data
    n_pairs: int = opt(16, "AR: key-value pairs per document")
    atr: str = opt("easy", "ATR setting: easy (Lmax 5, |Σ| 20), medium (Lmax 10) or 8192 (|Σ|)")
    atr_query: str = opt("parent", "ATR: ask the word's parent, or (sibling) its rightmost sibling")
    held_out: float = opt(0.0, "ATR: fraction of label pairs asked only by test documents")
    grammar_seed: int = opt(42, "ATR: seed of the grammar (42: the official grammars)")
    n_train: int = opt(100_032, "training documents, generated once and replayed every epoch")
    fresh_data: bool | None = opt(None, "a fresh batch every step instead of the fixed set")
    bucket: int | None = opt(None, "batch documents by length in windows of this many batches")
    n_eval: int = opt(320, "test documents evaluated (the paper: the first 320)")
    steps: int | None = opt(None, "optimizer steps (wins over --epochs)")  # -- optimisation
    epochs: int | None = opt(None, "passes over the training set, if --steps is not given")
    batch_size: int = opt(32, "training batch size")
    lr: float | None = opt(None, "peak learning rate (paper grid: 3e-5 .. 3e-2)")
    warmup_frac: float | None = opt(None, "fraction of the steps spent in linear warmup")
    schedule: str | None = opt(None, "after warmup: cosine, linear, or wsd (hold, then decay)")
    decay_frac: float = opt(0.2, "wsd: fraction of the steps spent decaying at the end")
    weight_decay: float = opt(0.0, "AdamW weight decay (the paper: 0)")
    eval_every: int | None = opt(None, "steps between evaluations on the test documents")
    seed: int = opt(42, "seed for the data and the initial weights")
    def __post_init__(self):
        presets = {"cpu": cpu_preset, "paper": paper_preset}  # defined below
        if self.preset not in presets:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {', '.join(presets)}")
        arch_defaults = dict(pos_emb=self.arch == "attention", d_conv=DEFAULT_DCONV.get(self.arch))
        defaults = {**arch_defaults, **presets[self.preset](self)}  # for the fields left None
        if self.steps is not None or self.epochs is not None:  # a given length wins
            defaults = {k: v for k, v in defaults.items() if k not in ("steps", "epochs")}
        vars(self).update({name: v for name, v in defaults.items() if getattr(self, name) is None})
        check(self)
    @property
    def total_steps(self) -> int:
        return self.epochs * (self.n_train // self.batch_size) if self.steps is None else self.steps


def paper_preset(cfg: Config) -> dict:
    """The paper's protocol (tinylang experiments/*.yaml; the best of 5-7 learning rates): Config's
    data, batch, warmup; cosine to 0 (linear if held out); AR 16 epochs (50,016 steps), ATR 32."""
    return dict(epochs=16 if cfg.task == "ar" else 32, lr=1e-3, bucket=0, eval_every=200,
                schedule="linear" if cfg.held_out else "cosine", fresh_data=False, warmup_frac=0.1)


def cpu_preset(cfg: Config) -> dict:
    """The paper's task, data and batch at d = 64, on a wsd schedule fit to 2 CPU cores (README)."""
    out = dict(steps=15_000, lr=1e-3, schedule="wsd", fresh_data=False, eval_every=500,
               warmup_frac=0.1, bucket=16 if cfg.task == "atr" else 0)  # ATR: 3x fewer tokens
    if cfg.arch == "attention":  # AR: it crosses its plateau (induction forms) only at 13-17k;
        # ATR: with 1.5k warmup steps it stays on the copy heuristic (0.65; the paper's: 10k)
        out.update(dict(steps=30_000) if cfg.task == "ar" else dict(warmup_frac=0.5))
    if (cfg.task, cfg.arch) == ("ar", "mamba"):  # it memorises the fixed set (train loss 0.03,
        out.update(steps=20_000, lr=3e-3, fresh_data=True)  # test 0.66 at 25k); 3e-3: its best
    if (cfg.task, cfg.arch, cfg.pos_emb) == ("ar", "based", True):  # at 1e-3 it memorises too
        out.update(lr=3e-4)  # (train loss 2.2, test 8.4: 0.03); 3e-4: 0.90, as its paper protocol
    return out


def check(cfg: Config):  # reject bad values in one line that names the value and what is allowed
    def need(ok, msg):
        if not ok:
            raise ValueError(msg)
    c, d, P = cfg, cfg.d_model, cfg.n_pairs  # short names, so that most checks fit one line
    for name, allowed in (("task", TASKS), ("arch", MIXERS), ("atr", ATR_SETTINGS),
                          ("atr_query", ("parent", "sibling")),
                          ("scan", SCAN_BACKENDS), ("value_corruption", ("value", "key")),
                          ("schedule", ("cosine", "linear", "wsd"))):
        value = getattr(c, name)
        need(value in allowed, f"unknown {name} {value!r}; choose from {', '.join(allowed)}")
    for name in ("d_model", "n_layer", "n_head", "batch_size", "n_eval", "eval_every", "steps",
                 "epochs", "bucket"):
        value, low = getattr(c, name), 0 if name == "bucket" else 1
        need(value is None or value >= low, f"{name} must be >= {low}, got {value}")
    need(d % c.n_head == 0, f"d_model {d} is not divisible by n_head {c.n_head}")
    need(c.n_head == 1 or c.arch in ("attention", "delta_net"),
         f"n_head {c.n_head}: only attention and delta_net have heads (use 1 for {c.arch})")
    need(c.arch != "h3" or d % 2 == 0, f"d_model {d}: h3 needs an even width (head_dim 2)")
    if c.d_conv is not None:
        need(c.arch in DEFAULT_DCONV or c.arch == "base_conv", f"--dconv {c.d_conv} does not "
             f"apply to {c.arch}; it applies to {', '.join(DEFAULT_DCONV)}, base_conv")
        need(c.d_conv >= (1 if c.arch in ("based", "base_conv") else 0),
             f"d_conv must be >= 0 (>= 1 for based and base_conv), got {c.d_conv}")
    need(not c.long_conv or c.arch in ("based", "base_conv"),
         f"--long-conv applies to based and base_conv, not {c.arch}")
    need(0 <= c.held_out < 1, f"held_out must be in [0, 1), got {c.held_out}")
    need(c.held_out == 0 or c.task == "atr", f"--held-out {c.held_out} applies to --task atr only")
    need(c.num_kv >= 2 and c.num_kv % 2 == 0, f"num_kv must be an even number >= 2, got {c.num_kv}")
    need(1 <= P <= c.num_kv // 2, f"n_pairs {P} must be in [1, num_kv/2 = {c.num_kv // 2} keys]")
    need(2 * P + 5 <= L_MAX, f"n_pairs {P} makes documents longer than {L_MAX} tokens")
    need(c.n_train >= c.batch_size or c.fresh_data,
         f"n_train {c.n_train} is smaller than one batch ({c.batch_size})")
    need(c.lr > 0, f"lr must be > 0, got {c.lr}")
    need(0 <= c.warmup_frac < 1, f"warmup_frac must be in [0, 1), got {c.warmup_frac}")
    need(0 < c.decay_frac <= 1 - c.warmup_frac,
         f"decay_frac must be in (0, 1 - warmup_frac], got {c.decay_frac}")
    need(c.weight_decay >= 0, f"weight_decay must be >= 0, got {c.weight_decay}")


def build_model(cfg: Config, vocab_size: int) -> LanguageModel:
    torch.manual_seed(cfg.seed)
    return LanguageModel(cfg, vocab_size)


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup (the first update at rate 0), then cosine or linear decay to 0 as the paper's
    get_cosine_schedule_with_warmup; "wsd" holds the peak, then decays over the last decay_frac."""
    total, warm = cfg.total_steps, int(cfg.warmup_frac * cfg.total_steps)
    if step < warm:
        return cfg.lr * step / warm
    if cfg.schedule == "wsd":
        return cfg.lr * min(1.0, (total - step) / max(1, int(cfg.decay_frac * total)))
    progress = (step - warm) / max(1, total - warm)
    if cfg.schedule == "linear":
        return cfg.lr * max(0.0, 1 - progress)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model: LanguageModel, data: Examples, batch_size: int = 64) -> dict:
    """Accuracy (argmax over the full vocabulary at the Query position) and mean loss."""
    was_training, correct, loss = model.training, 0, 0.0
    model.eval()
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        logits = model(batch.ids, at=batch.pos["query"])
        correct += (logits.argmax(-1) == batch.answer).sum().item()
        loss += F.cross_entropy(logits, batch.answer, reduction="sum").item()
    model.train(was_training)
    return dict(accuracy=correct / len(data), loss=loss / len(data))


def batch_documents(length: np.ndarray, n_batches: int, batch_size: int, bucket: int,
                    rng: Generator) -> np.ndarray:
    """(n_batches, batch_size) training-document indices per batch: the paper's consecutive order,
    or with buckets each window of `bucket` batches re-cut after sorting by length, then shuffled:
    each document still once an epoch, less padding (ATR easy, windows of 16: 23 tokens, not 69)."""
    batches = np.arange(n_batches * batch_size).reshape(n_batches, batch_size)
    for w in range(0, n_batches, bucket) if bucket else ():  # no buckets: the paper's order
        docs = batches[w:w + bucket].ravel()
        docs = docs[np.argsort(length[docs], kind="stable")].reshape(-1, batch_size)
        batches[w:w + bucket] = docs[rng.permutation(len(docs))]
    return batches


class RunError(RuntimeError):  # a run that cannot go on: one line for the CLI to print, exit `code`
    code = 1


class Interrupted(RunError):
    code = 130


def identity(cfg: Config) -> dict:
    """What makes two runs the same run: every field, the length in steps (not the preset)."""
    return {**dataclasses.asdict(cfg), "preset": None, "epochs": None, "steps": cfg.total_steps}


def read(path: str, load=lambda p: json.loads(pathlib.Path(p).read_text())):
    """A run file, or one line saying that it is damaged (a crash while writing, a full disk)."""
    try:
        return load(path)
    except (ValueError, EOFError, KeyError, RuntimeError, pickle.UnpicklingError):
        raise RunError(f"{path} is corrupt or truncated; --force starts the run over") from None


def stored_config(out: str) -> Config:
    try:
        return Config(**read(os.path.join(out, "config.json")))
    except (TypeError, ValueError) as e:
        raise RunError(f"{out}/config.json is no configuration of this mech.py ({e}); --force "
                       "starts the run over") from None


def claim_folder(out: str, cfg: Config, force: bool = False):
    """Make `out` this run's folder and hold it with an OS lock (which a killed process does not
    leave behind) while the returned file is open. Refused while another process holds it, or when
    it holds another configuration's run, unless `force` clears it; config.json is written once."""
    os.makedirs(out, exist_ok=True)
    lock = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RunError(f"{out} is in use by another process; wait for it or choose another --out")
    names = ("config.json", "checkpoint.pt", "metrics.json", "model.pt", "mechanism.png",
             "dynamics.png")
    for name in names if force else ():
        pathlib.Path(out, name).unlink(missing_ok=True)
    path, mine = os.path.join(out, "config.json"), identity(cfg)
    if not os.path.exists(path):
        write_json(path, dataclasses.asdict(cfg))
    elif (theirs := identity(stored_config(out))) != mine:
        lock.close()  # released now, not when the garbage collector finds it
        diff = ", ".join(f"{k} {v} (asked: {mine[k]})" for k, v in theirs.items() if v != mine[k])
        raise RunError(f"{out} holds another run ({diff}); choose another --out, or --force to "
                       "start it over")
    return lock


def resolve_device(device: str) -> torch.device:
    name = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ValueError(f"unknown device {device!r}; choose from auto, cpu, cuda, cuda:N")
    if kind == "cuda" and int(index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this torch sees {torch.cuda.device_count()} CUDA "
                         "device(s); use --device cpu or auto")
    return torch.device(kind + (":" + index if index else ""))


def training_batches(cfg: Config, task, dev: torch.device):
    """batch_at(step): that step's batch, a pure function of (seed, step) (a resumed run sees the
    same): the fixed set, replayed in order every epoch, or with --fresh-data a new batch."""
    if cfg.fresh_data:
        return lambda s: task.sample(cfg.batch_size, rng_for(cfg.seed, f"train-step-{s}")).to(dev)
    per_epoch = cfg.n_train // cfg.batch_size
    train_set = task.sample(cfg.n_train, rng_for(cfg.seed, "train"))
    batches = batch_documents(train_set.pos["answer"].numpy(), per_epoch, cfg.batch_size,
                              cfg.bucket, rng_for(cfg.seed, "buckets"))
    # one padded tensor per batch: ATR's rare long sentences pad only their own batch
    train_batches = [train_set[torch.from_numpy(i)].trim() for i in batches]
    return lambda step: train_batches[step % per_epoch].to(dev)


def atomic_write(path: str, write) -> None:  # write(tmp), then rename: no reader sees half a file
    write(tmp := f"{path}.tmp{os.getpid()}")
    os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
    atomic_write(path, lambda tmp: pathlib.Path(tmp).write_text(text))


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=1))


def save_checkpoint(path: str, model, optimizer, cfg: Config, **state) -> None:
    state.update(model=model.state_dict(), optimizer=optimizer.state_dict(), identity=identity(cfg))
    atomic_write(path, lambda tmp: torch.save(state, tmp))


@contextlib.contextmanager
def stop_requests():  # a list Ctrl-C or SIGTERM append to, instead of killing the run mid-step
    stop = []
    with contextlib.ExitStack() as restore:  # puts the old handlers back on the way out
        with contextlib.suppress(ValueError):  # handlers can only be set in the main thread
            for s in (signal.SIGINT, signal.SIGTERM):
                restore.callback(signal.signal, s, signal.signal(s, lambda *a: stop.append(s)))
        yield stop


def curve_point(model, test, dev_set, step, train_loss, elapsed, t_start, watch=None) -> dict:
    ev = evaluate(model, test)
    point = dict(step=step, train_loss=round(train_loss, 5), test_loss=round(ev["loss"], 5),
                 accuracy=ev["accuracy"], time_s=round(elapsed + time.time() - t_start, 2))
    if dev_set is not None:
        point["dev_accuracy"] = evaluate(model, dev_set)["accuracy"]
    if watch:  # the mechanism at this step (section 6)
        point["attrib"] = watch(model)
    return point


def progress_line(point: dict, total: int, rate: float, min_effect: float = 0.0) -> str:
    dev_acc = f" (dev {point['dev_accuracy']:.3f})" if "dev_accuracy" in point else ""
    a = point.get("attrib")
    watched = "" if a is None else " | Attrib K/V/Q " + (
        "/".join(f"{a['main'][p]:.2f}" for p in ("key", "value", "query"))
        if a["effect"] >= min_effect else f"- (Key effect {a['effect']:.3f})")
    return (f"step {point['step']:>7,}/{total:,} | loss {point['train_loss']:.4f} | test acc "
            f"{point['accuracy']:.3f}{dev_acc}{watched} | {rate:5.1f} steps/s | "
            f"ETA {(total - point['step']) / rate / 60:5.1f} min")


def train(cfg: Config, out: str | None = None, device: str = "auto", log=print,
          checkpoint_every_s: float = 60.0, force: bool = False, dynamics: bool = True) -> tuple:
    """Train one model -> (model, metrics); in `out` (claim_folder), atomically: config.json,
    metrics.json, model.pt and a checkpoint that a killed (Ctrl-C, SIGTERM) run resumes exactly."""
    dev = resolve_device(device)
    folder = claim_folder(out, cfg, force) if out else contextlib.nullcontext()  # a held lock
    with folder, stop_requests() as stop:
        task = make_task(cfg)
        model = build_model(cfg, task.vocab_size).to(dev)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                      weight_decay=cfg.weight_decay, fused=True)
        test = task.sample(cfg.n_eval, rng_for(cfg.seed, "test"), split="test").to(dev)
        dev_set = (task.sample(cfg.n_eval, rng_for(cfg.seed, "dev"), split="dev").to(dev)
                   if cfg.held_out else None)  # test: only held-out pairs; dev: training's pairs
        if cfg.arch == "mamba" and cfg.scan != "ref":  # compile the scan now, not on the clock
            scan_ext.kernel(dev, required=cfg.scan == "ext")
        batch_at, total = training_batches(cfg, task, dev), cfg.total_steps
        watch = dynamics and (lambda m: watch_mechanism(m, task, test, cfg))  # at each evaluation
        ckpt_path = out and os.path.join(out, "checkpoint.pt")
        state = dict(step=0, curve=[], elapsed=0.0, since=0, loss_sum=0.0)
        if ckpt_path and os.path.exists(ckpt_path):  # resume it: only this configuration's
            state = read(ckpt_path, lambda p: torch.load(p, map_location=dev))
            if state.get("identity") != identity(cfg):
                raise RunError(f"{ckpt_path} was made by another configuration; --force starts "
                               "the run over")
            model.load_state_dict(state.pop("model"))
            optimizer.load_state_dict(state.pop("optimizer"))
            log(f"resuming {out} at step {state['step']}")
        start, curve, elapsed, since = (state[k] for k in ("step", "curve", "elapsed", "since"))
        n_params, threads = sum(p.numel() for p in model.parameters()), torch.get_num_threads()
        log(f"{cfg.arch} on {cfg.task}: d={cfg.d_model}, {cfg.n_layer} layers, {n_params:,} "
            f"parameters, {total:,} steps, lr {cfg.lr:g}, {dev.type}, {threads} threads")
        model.train()
        t_start = last_save = time.time()
        loss_sum, uniform = torch.tensor(state["loss_sum"], device=dev), math.log(task.vocab_size)
        save = lambda step: ckpt_path and save_checkpoint(  # without `out`, nothing to save
            ckpt_path, model, optimizer, cfg, step=step, curve=curve, since=since,
            loss_sum=loss_sum.item(), elapsed=elapsed + time.time() - t_start)
        for step in range(start, total):
            batch = batch_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()  # no .item() here: it would sync a GPU every step
            done = step + 1
            if stop:  # Ctrl-C or SIGTERM: stop between two steps, resumable
                save(done)
                raise Interrupted(f"stopped at step {done:,} of {total:,}; " + (
                    "the same command resumes from there" if out else "nothing saved (no --out)"))
            if done % cfg.eval_every and done != total:
                continue
            train_loss = loss_sum.item() / (done - since)
            if not train_loss < 2 * uniform:  # NaN too; uniform: the loss of a uniform guess, log V
                raise RunError(f"the training loss reached {train_loss:.4g} by step {done} (a "
                               f"uniform guess: {uniform:.2f}); try a lower --lr than {cfg.lr:g}")
            loss_sum.zero_()
            since = done
            curve.append(curve_point(model, test, dev_set, done, train_loss, elapsed, t_start,
                                     watch))
            rate = (done - start) / (time.time() - t_start)
            if ckpt_path and done < total and time.time() - last_save >= checkpoint_every_s:
                save(done)
                last_save = time.time()
            log(progress_line(curve[-1], total, rate, PAPER_FILTER.get(cfg.task, 0.0)))
        run_time, final = time.time() - t_start, curve[-1]  # the metrics: the last evaluation's
        metrics = dict(accuracy=final["accuracy"], test_loss=final["test_loss"], steps=total,
                       **{k: final[k] for k in ("dev_accuracy",) if k in final},
                       wall_time_s=round(elapsed + run_time, 2),
                       steps_per_s=round((total - start) / run_time, 2), n_params=n_params,
                       threads=threads, device=dev.type, torch=torch.__version__, curve=curve)
        if out is not None:
            atomic_write(os.path.join(out, "model.pt"), lambda t: torch.save(model.state_dict(), t))
            write_json(os.path.join(out, "metrics.json"), metrics)
            pathlib.Path(out, "checkpoint.pt").unlink(missing_ok=True)  # no longer needed
        return model, metrics


def load_run(path: str, device: str = "cpu"):  # a finished run: model, cfg = load_run('runs/...')
    model = build_model(cfg := stored_config(path), make_task(cfg).vocab_size)
    model.load_state_dict(read(os.path.join(path, "model.pt"), lambda p: torch.load(p, device)))
    return model.to(device).eval(), cfg


# 6. Interventions: the mechanistic evaluation ---------------------------------------------------
# An interchange intervention asks where the information that decides the answer lives: corrupt
# one token (the Key: another key instead), so the model no longer knows which value to return;
# run the corrupted document, but at one site (e.g. the residual stream entering layer l) and one
# position put back the clean run's activation; see how much of p(answer) at the Query comes back,
#     Attrib = (mean p_patched - mean p_corrupted) / (mean p_clean - mean p_corrupted)
# At the input of the last layer of a 2-layer model, Attrib@Value ≈ 1 means layer 0 already wrote
# "this value follows that key" at the Value position, and the last layer matches the Query
# against it: induction. Attrib@Query ≈ 1 means layer 0 already retrieved the answer at the last
# position; Attrib@Key ≈ 1 that the last layer itself reads the key's position.
# Official implementation: aryamanarora/tinylang, tinylang/eval/interchange.py (with pyvene).
SITES = {  # site -> (module inside blocks[l], hook on its input "in" or its output "out")
    "block_input": ("", "in"), "block_output": ("", "out"),  # residual stream: into, out of block l
    "mixer_input": ("mixer", "in"), "mixer_output": ("mixer", "out"),  # normed in; before the add
    "mlp_input": ("mlp", "in"), "mlp_output": ("mlp", "out"),  # block_output[l] = block_input[l+1]
    "conv_output": ("mixer.conv_out", "out")}  # Mamba's short conv output, before SiLU (d_inner)
POSITIONS = ("key", "value", "value+1", "value+2", "divider", "query")  # value+1 is AR's "next key"
# Value+1 / Value+2 can be the divider / the Query (AR: the last pair; ATR: 42-48 % of documents),
# where patching them is patching those: their cells average only the documents where they are not
MAIN = ("block_input", "key")  # the paper's main setting: the last layer's input, Key corrupted
VERDICT_MIN_EFFECT = 0.1  # mean p_clean - mean p_corrupted below this: the task was not learned
PAPER_FILTER = {"ar": 0.01, "atr": 0.1}  # the paper's: below this effect, a run's Attribs are noise
VERDICT_DOMINANT = 0.6    # an Attrib this high, with the others below 1 - it, names the mechanism


def positions(data: Examples, name: str) -> torch.Tensor:  # (n,); "value+k": Value + k
    base, _, k = name.partition("+")
    return data.pos[base] + (int(k) if k else 0)


def distinct(data: Examples, name: str) -> torch.Tensor:
    """(n,) bool: the documents where position `name` is a place of its own (no other named one)."""
    return torch.stack([positions(data, name) != data.pos[p]
                        for p in POSITIONS if "+" not in p and p != name]).all(0)


def sites_of(model: LanguageModel) -> list:  # (site, layer)s: no MLP in Mamba, a conv only there
    return [(site, layer) for layer, block in enumerate(model.blocks)
            for site, (path, _) in SITES.items()
            if path in dict(block.named_modules())  # not a Mamba block's mlp (None), ...
            and not (site == "conv_output" and isinstance(block.mixer.conv1d, nn.Identity))]


@contextlib.contextmanager
def intervene(model: LanguageModel, site: str, layer: int, fn):
    """Run the model with fn(activation) -> activation at (site, layer); the hook is always removed.
    Activations are (B, L, width); fn may read them (and return them unchanged) or edit a copy."""
    path, side = SITES[site]
    module = model.blocks[layer].get_submodule(path)
    with (module.register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:]))
          if side == "in" else module.register_forward_hook(lambda m, args, out: fn(out))):
        yield  # leaving the with removes the hook


def patched(pos: torch.Tensor, values: torch.Tensor):  # an intervention: act[b, pos[b]] = values[b]
    return lambda act: act.index_put((torch.arange(len(act), device=act.device), pos), values)


def p_answer(model: LanguageModel, data: Examples, ids=None) -> torch.Tensor:
    """(n,) probability of the correct answer at the Query position."""
    logits = model(data.ids if ids is None else ids, at=data.pos["query"])
    return logits.softmax(-1)[torch.arange(len(data), device=logits.device), data.answer]


def corrupt(task, data: Examples, what: str, rng: Generator, value_corruption: str = "value"):
    """ids with pos[what]'s token replaced by another of its kind (officially, a Value by a key)."""
    rows, pos = torch.arange(len(data), device=data.ids.device), data.pos[what]
    kind = "key" if what == "key" or value_corruption == "key" else "value"
    return data.ids.index_put((rows, pos), task.other_token(kind, data.ids[rows, pos], rng))


@torch.no_grad()
def interchange(model: LanguageModel, task, data: Examples, corrupted: str = "key", seed: int = 0,
                value_corruption: str = "value", batch_size: int = 64, cells=None) -> list:
    """Patch each (site, layer, position) cell (default: all) of the corrupted run with the clean
    run's activation -> rows: means over the n documents where the position is distinct, each
    document corrupted once (from `seed`)."""
    was_training = model.training
    model.eval()
    rng, clean, corr = rng_for(seed, f"corrupt-{corrupted}"), [], []
    cells = cells or [(site, layer, p) for site, layer in sites_of(model) for p in POSITIONS]
    patch = {cell: [] for cell in cells}
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        bad_ids = corrupt(task, batch, corrupted, rng, value_corruption)
        cache, rows = {}, torch.arange(len(batch), device=batch.ids.device)  # clean activations
        with contextlib.ExitStack() as stack:  # one clean run records every site patched
            for site, layer in dict.fromkeys((site, layer) for site, layer, _ in cells):
                record = lambda act, key=(site, layer): cache.setdefault(key, act)  # returns act
                stack.enter_context(intervene(model, site, layer, record))
            clean.append(p_answer(model, batch).double())
        corr.append(p_answer(model, batch, bad_ids).double())
        for site, layer, p in patch:
            pos = positions(batch, p)
            with intervene(model, site, layer, patched(pos, cache[site, layer][rows, pos])):
                patch[site, layer, p].append(p_answer(model, batch, bad_ids).double())
    model.train(was_training)
    clean, corr, out = torch.cat(clean), torch.cat(corr), []  # (n,) per document
    mask = {p: distinct(data, p) for p in POSITIONS}  # the documents where p is a place of its own
    for (site, layer, p), ps in patch.items():
        m = mask[p]
        p_clean, p_corr, p_patch = (x[m].mean().item() for x in (clean, corr, torch.cat(ps)))
        effect = p_clean - p_corr or math.nan  # no effect (or no document): Attrib is undefined
        out.append(dict(corrupted=corrupted, site=site, layer=layer, position=p, n=int(m.sum()),
                        p_clean=p_clean, p_corr=p_corr, p_patch=p_patch,
                        attrib=(p_patch - p_corr) / effect))
    return out


def main_site(n_layer: int) -> tuple:
    """(site, layer) the verdict reads: the last layer's input; with one layer, whose input is the
    embedding (patching the Key there undoes the corruption itself), its mixer's output."""
    return (MAIN[0], n_layer - 1) if n_layer > 1 else ("mixer_output", 0)


def main_setting(rows: list, n_layer: int, layer: int | None = None) -> dict:
    """Attrib at the main setting (main_site; or block_input[layer]), Key corrupted."""
    site, layer = main_site(n_layer) if layer is None else (MAIN[0], layer)
    return {r["position"]: r["attrib"] for r in rows
            if r["corrupted"] == MAIN[1] and r["site"] == site and r["layer"] == layer}


def key_effect(rows: list) -> float:
    """mean p_clean - mean p_corrupted over all documents (the Query's cells), Key corrupted."""
    return next(r["p_clean"] - r["p_corr"] for r in rows if r["corrupted"] == "key"
                and r["position"] == "query")


def verdict(rows: list, n_layer: int) -> str:
    """The mechanism in words, from Attrib at the first layer whose input lacks the Key association
    (thresholds VERDICT_*): in deeper models the last one can show @Query 1.00 for induction too."""
    if (effect := key_effect(rows)) < VERDICT_MIN_EFFECT:
        return (f"not learned: corrupting the Key moves p(answer) by only {effect:.3f} "
                f"(< {VERDICT_MIN_EFFECT}), too little to attribute")
    layer = next((l for l in range(1, n_layer)
                  if main_setting(rows, n_layer, l)["key"] < VERDICT_DOMINANT), None)
    a = main_setting(rows, n_layer, layer)
    where = ("by the one layer's mixer" if n_layer == 1 else "before the last layer"
             if layer in (None, n_layer - 1) else f"before layer {layer}")
    names = {"value": f"induction: the key-value binding is stored at the Value position {where}",
             "query": "direct retrieval at the last position: the answer is computed at the Query "
                      + where,
             "key": "direct retrieval, late: the last layer reads the Key position itself"}
    if top := dominant(a):
        return names[top]
    return "mixed: " + ", ".join(f"Attrib@{p.capitalize()} {a[p]:.2f}"
                                 for p in ("key", "value", "query"))


def dominant(a: dict) -> str | None:
    """The position (key, value or query) whose Attrib names the mechanism, if one does: it is
    at least VERDICT_DOMINANT and the other two at most 1 - VERDICT_DOMINANT."""
    a = {p: 0.0 if math.isnan(a[p]) else a[p] for p in ("key", "value", "query")}  # NaN: no effect
    top, second, _ = sorted(a, key=a.get, reverse=True)  # where distinct (sibling self-pairs)
    return top if a[top] >= VERDICT_DOMINANT and a[second] <= 1 - VERDICT_DOMINANT else None


def mechanism_report(rows: list, n_layer: int) -> str:  # the printed table of Attrib, Key corrupted
    lines = ["Attrib (Key corrupted; rows: site[layer], columns: the patched position)",
             f"{'':16s}" + "".join(f"{'@' + p:>10s}" for p in POSITIONS)]
    key_rows, table = [r for r in rows if r["corrupted"] == "key"], {}  # table: cells by row
    for r in key_rows:
        table.setdefault((r["site"], r["layer"]), {})[r["position"]] = r["attrib"]
    for (site, layer), cells in table.items():
        mark = " <- main" if (site, layer) == main_site(n_layer) else ""
        lines.append(f"{site + f'[{layer}]':16s}"
                     + "".join(f"{cells[p]:10.3f}" for p in POSITIONS) + mark)
    lines.append("p(answer): clean {p_clean:.3f}, Key corrupted {p_corr:.3f}".format(
        **next(r for r in key_rows if r["position"] == "query")))
    n = {r["position"]: r.get("n", 0) for r in key_rows}  # documents averaged (0: not counted)
    if fewer := [f"@{p} {n[p]}" for p in POSITIONS if n[p] < n["query"]]:
        lines.append(f"documents averaged: {', '.join(fewer)} of {n['query']} (in the others that "
                     "position is another named one)")
    if (conv := table.get(("conv_output", 0))) and key_effect(rows) >= VERDICT_MIN_EFFECT:
        lines.append(f"layer 0's short conv output restores Attrib {conv['key']:.2f} at the Key, "
                     f"{conv['value']:.2f} at the Value, {conv['value+1']:.2f} at Value+1"
                     + ("; here the conv at the token after the Value (its window spans Key and "
                        "Value) carries the association" if conv["value+1"] >= VERDICT_DOMINANT
                        else ""))
    return "\n".join(lines + ["verdict: " + verdict(rows, n_layer)])


def analyse(model: LanguageModel, cfg: "Config", split: str = "test") -> dict:
    """Mechanistic evaluation on the test (--held-out: held-out pairs) or dev documents."""
    task, dev = make_task(cfg), next(model.parameters()).device
    data = task.sample(cfg.n_eval, rng_for(cfg.seed, split), split=split).to(dev)
    rows = (interchange(model, task, data, "key", cfg.seed, cfg.value_corruption)
            + interchange(model, task, data, "value", cfg.seed, cfg.value_corruption))
    return dict(rows=rows, n_docs=len(data), main=main_setting(rows, cfg.n_layer),
                verdict=verdict(rows, cfg.n_layer))


def analyse_run(out: str, model: LanguageModel, cfg: "Config", log=print) -> dict:
    """Analyse, print the table, and add it to the run folder: metrics.json and mechanism.png."""
    analysis = analyse(model, cfg)
    log(mechanism_report(analysis["rows"], cfg.n_layer))
    path = os.path.join(out, "metrics.json")
    metrics = json.loads(pathlib.Path(path).read_text()) | {"interventions": analysis} | (
        {"interventions_dev": analyse(model, cfg, "dev")} if cfg.held_out else {})  # §5.3's dev
    write_json(path, metrics)
    from figures import plots  # the drawing; what the figures show is computed here
    title = f"{cfg.arch} on {cfg.task}, d={cfg.d_model}, test accuracy {metrics['accuracy']:.3f}"
    png = lambda name: lambda fig: atomic_write(os.path.join(out, name), lambda tmp: fig.savefig(
        tmp, dpi=120, format="png"))
    plots.mechanism(analysis["rows"], POSITIONS, title, png("mechanism.png"))
    if points := [p for p in metrics["curve"] if "attrib" in p]:  # not --no-dynamics
        learned, gate = key_effect(analysis["rows"]) >= VERDICT_MIN_EFFECT, PAPER_FILTER[cfg.task]
        name = dominant(analysis["main"]) if learned else None  # the verdict's position, if any
        plots.dynamics(points, dynamics_series(points, "%s[%d]" % main_site(cfg.n_layer), gate),
                       moments(points, name, gate), name, gate, title, png("dynamics.png"))
    return metrics


# The mechanism while it forms: at every evaluation, train() runs a light interchange (Key
# corrupted, DYNAMICS_DOCS test documents, a few cells) and stores it with the curve, so that a
# run shows whether its mechanism forms before, with or after its accuracy rises.
DYNAMICS_DOCS = 128  # a fixed subset of the test documents (measured: +1-3 % time AR, 5-10 % ATR)


def watched_cells(model: LanguageModel, n_layer: int) -> list:
    """The verdict's site at Key, Value and Query, each layer's mixer output at the Query, and
    Mamba's layer-0 conv output at the Value and Value+1 (where its induction may live)."""
    site, layer = main_site(n_layer)
    conv = [("conv_output", 0, p) for p in ("value", "value+1")]
    return ([(site, layer, p) for p in ("key", "value", "query")]
            + [("mixer_output", l, "query") for l in range(n_layer)]
            + (conv if ("conv_output", 0) in sites_of(model) else []))


def watch_mechanism(model: LanguageModel, task, test: Examples, cfg: "Config") -> dict:
    """{"effect": the Key's, "main": {position: Attrib}, "cells": {"site[layer]@position": Attrib}}
    on the first DYNAMICS_DOCS test documents: the full analysis's numbers there."""
    cells = watched_cells(model, cfg.n_layer)  # the main ones first: (site, layer, position)
    rows = interchange(model, task, test[:DYNAMICS_DOCS], "key", cfg.seed, cfg.value_corruption,
                       cells=cells)
    a = {(r["site"], r["layer"], r["position"]): r["attrib"] for r in rows}
    return dict(effect=key_effect(rows), main={cell[2]: a[cell] for cell in cells[:3]},
                cells={"%s[%d]@%s" % cell: a[cell] for cell in cells[3:]})


def watched(point: dict, name: str) -> float:  # a main position ("value") or a cell's name
    a = point["attrib"]
    return a["main"][name] if name in a["main"] else a["cells"][name]


def dynamics_series(points: list, main: str, min_effect: float) -> dict:
    """{label: the watched Attrib at each point}, NaN where the Key does not matter (its effect is
    below min_effect: that Attrib is noise)."""
    a = points[0]["attrib"]
    return {f"{main} @{n}" if n in a["main"] else n:
            [watched(p, n) if p["attrib"]["effect"] >= min_effect else math.nan
             for p in points] for n in [*a["main"], *a["cells"]]}


def moments(curve: list, name: str | None, min_effect: float) -> dict:
    """The steps where the mechanism forms (the first evaluation where the Key matters and the
    watched Attrib `name`, the verdict's, passes 0.5) and where accuracy rises (halfway from its
    first evaluation to a higher last one; ATR starts near a copy baseline); None if never."""
    points = [p for p in curve if "attrib" in p]
    formed = (p["step"] for p in points if name and p["attrib"]["effect"] >= min_effect
              and watched(p, name) >= 0.5)
    half = (points[0]["accuracy"] + points[-1]["accuracy"]) / 2
    rises = (p["step"] for p in points if p["accuracy"] >= half > points[0]["accuracy"])
    return dict(mechanism=next(formed, None), accuracy=next(rises, None))


# 7. The second task: Associative Treecall (ATR) -------------------------------------------------
@dataclasses.dataclass
class Tree:  # one sampled sentence: a dependency tree over its terminals, the queried pair
    labels: list  # terminal labels 0 .. T-1, in sentence order (token id = 3 + label)
    parent: list  # index of each terminal's parent (always to its right); -1 for the root's head
    depth: list   # depth of each terminal in the derivation (the root's head and children: 1)
    query: int    # index of the queried terminal (the Key is at position 1 + query)
    target: int   # the answer's index: parent[query], or its sibling (the Value: 1 + target)


class ATR:
    """Associative Treecall: recall a terminal's parent in a sentence of a random headed PCFG.
        pos:  0     1 ... n   n+1    n+2      n+3       n+4
        tok:  <bos> t ... t   <eos>  t_query  t_parent  <eos>
    A constituent emits its children, then its head word; a terminal's parent is its constituent's
    head word (a head word's: the enclosing one's), so parents lie right of their many children:
    tree-shaped associations, not AR's adjacent pairs. The query repeats the rightmost terminal of
    its label (an unambiguous Key), drawn parent first. With split > 0, that fraction of (parent,
    query) label pairs is held out: only "test" documents ask them. Vocabulary: PAD 0, BOS 1, EOS 2,
    terminals 3 .. T+2, 3 official query-type tokens (unused): V = T + 6 (26, 8198).
    Official implementation: aryamanarora/tinylang, tinylang/language/pcfg.py (class PCFG).
    Differences: none in the grammars (the official easy (110 rules), medium (124), 8192 and split
    (90 of 400 pairs held out): the same legacy-numpy calls) or documents (a legacy stream gives the
    official ones: tested). At most L_MAX - 5 terminals (100k easy: ~420). query="sibling": the
    rightmost sibling instead of the parent (App. D.4; multihop/multihop_no_parent.yaml)."""
    def __init__(self, n_terminals: int = 20, max_rhs_len: int = 5, n_nonterminals: int = 40,
                 max_rules: int = 5, max_depth: int = 10, terminal_occurrence_factor=None,
                 split: float = 0.0, grammar_seed: int = 42, max_length: int = 1024,
                 query: str = "parent"):
        self.n_terminals, self.max_rhs_len, self.query = n_terminals, max_rhs_len, query
        self.n_nonterminals, self.max_rules, self.max_depth = n_nonterminals, max_rules, max_depth
        self.terminal_occurrence_factor, self.split = terminal_occurrence_factor, split
        self.first_terminal, self.vocab_size, self.max_length = 3, n_terminals + 6, max_length
        self.build_grammar(np.random.RandomState(grammar_seed))
    def build_grammar(self, rs: np.random.RandomState):
        """Draw the held-out pairs and the grammar from the legacy RNG, in the official order.
        Symbols are ints: s < T is terminal s, s >= T is nonterminal s - T."""
        T, N = self.n_terminals, self.n_nonterminals
        # 1. held-out (parent label, query label) pairs; drawn first, so a split changes the grammar
        self.held_out = rs.rand(T, T) < self.split if self.split > 0 else None
        if self.held_out is not None and self.held_out.sum() in (0, T * T):
            raise RunError(f"--held-out {self.split:g} holds out {self.held_out.sum()} of the "
                           f"{T * T} (parent, query) label pairs: no split (the paper: 0.2)")
        # 2. levels 1..max_depth (official: max_depths); rules use only higher ones: derivations end
        self.level = np.array([rs.randint(1, self.max_depth + 1) for _ in range(N)])
        # 3. 1..max_rules rules of 1..max_rhs_len-1 symbols, uniform over allowed nonterminals and
        #    terminals; with a terminal_occurrence_factor f, one terminal placeholder of weight f,
        #    filled afterwards with uniform terminals (so the tree shape does not depend on T)
        PLACEHOLDER, factor, self.rules = -1, self.terminal_occurrence_factor, []
        for nt in range(N):
            n_rules = rs.randint(1, self.max_rules + 1)
            allowed = [T + x for x in range(N) if self.level[x] > self.level[nt]]
            symbols, p = allowed + list(range(T)), None
            if factor is not None:
                p = np.append(np.ones(len(allowed)), factor)  # weights
                symbols, p = allowed + [PLACEHOLDER], p / p.sum()
            rhs = lambda: rs.choice(len(symbols), size=rs.randint(1, self.max_rhs_len), p=p)
            self.rules.append([[symbols[i] for i in rhs()] for _ in range(n_rules)])
        fill = lambda s: rs.randint(T) if s == PLACEHOLDER else s
        self.rules = [[tuple(fill(s) for s in rhs) for rhs in rules] for rules in self.rules]
        # 4. rule probabilities, 5. head-word distributions over all T terminals: Dirichlet(1)
        self.rule_probs = [rs.dirichlet(np.ones(len(rules))) for rules in self.rules]
        self.head_probs = [rs.dirichlet(np.ones(T)) for _ in range(N)]
        # 6. a uniform start symbol (no draw). We sample by inverse CDF, with the CDF that numpy's
        #    legacy choice(p=...) builds, so that a legacy stream gives the official draws.
        cdf = lambda p: (np.cumsum(p) / np.cumsum(p)[-1]).tolist()
        self.start_cdf, self.rule_cdf = cdf(np.ones(N) / N), [cdf(p) for p in self.rule_probs]
        self.head_cdf = [cdf(p) for p in self.head_probs]
    def derive(self, rng):
        """Expand a start symbol depth-first, left to right (the official order of draws: per
        constituent, its rule, then its head word), with a numpy Generator or legacy RandomState.
        Returns a Tree without its query, or None past max_length terminals (as officially)."""
        labels, owner, depth = [], [], []  # per terminal; owner: the constituent its parent heads
        T, head_at = self.n_terminals, []  # per constituent: position of its head word
        stack = [(T + bisect_right(self.start_cdf, rng.random()), -1, -1, 0)]  # the start symbol
        while stack:
            if len(labels) >= self.max_length:  # and more to come
                return None
            symbol, up, heads, d = stack.pop()  # its constituent, the one it heads or -1, depth
            if symbol < T:  # a terminal: emit it
                if heads >= 0:
                    head_at[heads] = len(labels)
                labels.append(symbol)
                owner.append(up)
                depth.append(d)
                continue
            c = len(head_at)  # a nonterminal: a new constituent c, its head word out after its rhs
            head_at.append(-1)
            rhs = self.rules[symbol - T][bisect_right(self.rule_cdf[symbol - T], rng.random())]
            stack.append((bisect_right(self.head_cdf[symbol - T], rng.random()), up, c, d + 1))
            stack.extend((s, c, -1, d + 1) for s in reversed(rhs))  # the children, popped in order
        parent = [head_at[c] if c >= 0 else -1 for c in owner]
        return Tree(labels, parent, depth, query=-1, target=-1)
    def eligible_pairs(self, tree: Tree, split: str = "train") -> list:
        """(query, target) index pairs that may be asked, by target then query: the query the
        rightmost of its label; the target its parent or (sibling) the rightmost terminal of the
        same parent, itself if none lies to its right, also the rightmost of its label (the root's
        head is its own sibling: 67.5 % of sibling documents ask the query itself, as officially);
        their label pair allowed in this split."""
        if split not in ("train", "dev", "test"):
            raise ValueError(f"split must be 'train', 'dev' or 'test', not {split!r}")
        rightmost, test = {label: i for i, label in enumerate(tree.labels)}, split == "test"
        last = {p: i for i, p in enumerate(tree.parent)}  # per parent: its rightmost child
        target = tree.parent if self.query == "parent" else [last[p] for p in tree.parent]
        pairs = sorted((t, q) for q, (label, t) in enumerate(zip(tree.labels, target))
                       if t >= 0 and rightmost[label] == q
                       and (self.query == "parent" or rightmost[tree.labels[t]] == t)
                       and (self.held_out is None or self.held_out[tree.labels[t], label] == test))
        return [(q, t) for t, q in pairs]
    @staticmethod
    def choose_pair(pairs: list, rng: Generator) -> tuple:
        """(query, target): the target uniform among eligible targets, then the query uniform among
        its eligible queries (sample_first="target"): a query whose parent has few is likelier."""
        targets = sorted({t for _, t in pairs})
        target = targets[rng.integers(len(targets))]
        queries = [q for q, t in pairs if t == target]
        return queries[rng.integers(len(queries))], target
    def trees(self, n: int, rng: Generator, split: str = "train") -> list:
        """n sentences and queried pairs (redrawn if < 3 terminals, too long or none eligible)."""
        out, draws = [], 0
        while len(out) < n:
            if (draws := draws + 1) > 100 * n + 10_000:  # else it may never end (few allowed pairs)
                raise RunError(f"{len(out)} of {n} {split} sentences found in {draws - 1:,} draws; "
                               "--held-out leaves too few pairs on one side")
            tree = self.derive(rng)
            pairs = tree and len(tree.labels) >= 3 and self.eligible_pairs(tree, split)
            if pairs:
                tree.query, tree.target = self.choose_pair(pairs, rng)
                out.append(tree)
        return out
    def examples(self, trees: list) -> Examples:
        """Documents <bos> t ... t <eos> t_query t_parent <eos> (right-padded), with positions."""
        lengths, first = np.array([len(tree.labels) for tree in trees]), self.first_terminal
        ids = np.full((len(trees), lengths.max() + 5), PAD, dtype=np.int64)  # lengths: terminals
        for row, tree in zip(ids, trees):
            m, labels = len(tree.labels), np.add(tree.labels, first)  # its terminals' token ids
            row[:m + 5] = (BOS, *labels, EOS, labels[tree.query], labels[tree.target], EOS)
        return Examples.from_numpy(ids, key=1 + np.array([tree.query for tree in trees]),
                                   value=1 + np.array([tree.target for tree in trees]),
                                   divider=lengths + 1, query=lengths + 2, answer=lengths + 3)
    def sample(self, n: int, rng: Generator, split: str = "train") -> Examples:
        return self.examples(self.trees(n, rng, split))
    def other_token(self, kind: str, tokens: torch.Tensor, rng: Generator) -> torch.Tensor:
        """For each token, a uniformly drawn *different* terminal (Keys and Values are both)."""
        return other_than(tokens, self.first_terminal, self.n_terminals, rng)


ATR_SETTINGS = {  # §5.2's three (tinylang languages/); pcfg_train_test_split: easy --held-out 0.2
    "easy": dict(n_terminals=20, max_rhs_len=5),  # Lmax=5, |Σ|=20: pcfg_vary_difficulty/pcfg_5_20
    "medium": dict(n_terminals=20, max_rhs_len=10),  # Lmax=10, |Σ|=20: .../pcfg_10_20
    "8192": dict(n_terminals=8192, max_rhs_len=5,
                 terminal_occurrence_factor=20)}  # pcfg_vary_rhs_8192
TASKS["atr"] = lambda cfg: ATR(**ATR_SETTINGS[cfg.atr], split=cfg.held_out, query=cfg.atr_query,
                               grammar_seed=cfg.grammar_seed, max_length=L_MAX - 5)


# 8. The command line ----------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse would print the whole usage first)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    p = Parser(prog="mech.py", description="Train one model of the paper on its task, save the run "
               "and show how it solved the task. Every Config field is a flag.",
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        kind = next((t for t in getattr(f.type, "__args__", (f.type,)) if t is not type(None)))
        extra = dict(action=argparse.BooleanOptionalAction) if kind is bool else dict(type=kind)
        p.add_argument(*filter(None, (f.metadata["flag"], "--" + f.name.replace("_", "-"))),
                       dest=f.name, default=argparse.SUPPRESS, help=f.metadata["help"], **extra)
    p.add_argument("--out", help="run folder (default: runs/<task>_<arch>_..._<config hash>)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--force", action="store_true", help="retrain a finished run's folder")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--interventions", default=True, help="after training, run the mechanistic "
                   "evaluation (interchange interventions)", action=argparse.BooleanOptionalAction)
    p.add_argument("--dynamics", default=True, help="at each evaluation, a light interchange "
                   "analysis (the mechanism while it forms)", action=argparse.BooleanOptionalAction)
    p.add_argument("--load", metavar="RUN_DIR", help="analyse a finished run instead of training "
                   "(with --interventions): python mech.py --load RUN_DIR --interventions")
    return p


def default_out(cfg: Config) -> str:
    conv = f"_dconv{cfg.d_conv}" if cfg.arch in DEFAULT_DCONV else ""
    task = cfg.task + (f"-{cfg.atr}" + (f"-heldout{cfg.held_out:g}" if cfg.held_out else "")
                       + (f"-{cfg.atr_query}" if cfg.atr_query != "parent" else "")
                       if cfg.task == "atr" else "")
    digest = sha1(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join("runs", f"{task}_{cfg.arch}{conv}_d{cfg.d_model}_lr{cfg.lr:g}"
                                f"_s{cfg.seed}_{digest}")


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config of the flags given, refusing flags that contradict or do not apply here."""
    given = {f.name: vars(args)[f.name] for f in dataclasses.fields(Config) if f.name in vars(args)}
    if "steps" in given and "epochs" in given:
        raise ValueError(f"give --steps ({args.steps}) or --epochs ({args.epochs}), not both")
    cfg = Config(**given)
    applies = dict(num_kv=("task", "ar"), n_pairs=("task", "ar"), atr=("task", "atr"),  # flag ->
                   atr_query=("task", "atr"), held_out=("task", "atr"),  # where it applies
                   grammar_seed=("task", "atr"), scan=("arch", "mamba"),
                   hyena_d_skip=("arch", "hyena"), decay_frac=("schedule", "wsd"))
    for name, (where, value) in applies.items():
        if name in given and getattr(cfg, where) != value:
            raise ValueError(f"--{name.replace('_', '-')} applies to --{where} {value} only, not "
                             f"to --{where} {getattr(cfg, where)}")
    return cfg


def main(argv=None):
    args = (parser := build_parser()).parse_args(argv)
    try:
        cfg = None if args.load else config_from_args(args)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads or min(torch.get_num_threads(), idle_cores()))
        resolve_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    try:
        return load_and_analyse(args, parser) if args.load else run(cfg, args)
    except RunError as e:
        parser.exit(e.code, f"{parser.prog}: {e}\n")
    except (OSError, MemoryError, RuntimeError) as e:  # a folder not to be written, no memory
        if isinstance(e, RuntimeError) and not any(m in str(e) for m in ("alloc", "scan backend")):
            raise
        parser.exit(1, f"{parser.prog}: error: {str(e).strip().splitlines()[-1]}\n")


def idle_cores(seconds: float = 0.25) -> int:
    """The cores other processes leave idle (/proc/stat): a torch thread on a busy core crawls."""
    def idle_total():  # (idle + iowait, all) CPU ticks since boot
        ticks = [int(x) for x in pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)
    try:
        (idle0, total0), (idle1, total1) = idle_total(), time.sleep(seconds) or idle_total()
    except (OSError, IndexError, ValueError):  # not Linux: trust torch's default
        return os.cpu_count() or 1
    return max(1, round((idle1 - idle0) / max(1, total1 - total0) * (os.cpu_count() or 1)))


def load_and_analyse(args, parser) -> dict:  # --load RUN_DIR: analyse a saved run as it was trained
    given = [k for k in vars(args) if k in {f.name for f in dataclasses.fields(Config)}]
    if given or args.out or args.force or not args.interventions:
        parser.error(f"--load analyses a saved run as it was trained: it takes no "
                     f"{', '.join(given) or '--out, --force or --no-interventions'}")
    if missing := [f for f in ("config.json", "model.pt", "metrics.json")
                   if not os.path.exists(os.path.join(args.load, f))]:
        parser.error(f"--load {args.load}: no finished run there ({', '.join(missing)} missing)")
    lock = claim_folder(args.load, stored_config(args.load))  # noqa: F841 (held while analysing)
    return analyse_run(args.load, *load_run(args.load))


def run(cfg: Config, args) -> dict:
    """Train the run of `cfg` in its folder (or resume it, or report it if finished), analyse it."""
    out = args.out or default_out(cfg)
    done = os.path.join(out, "metrics.json")  # written last, by a finished run
    if not args.force and os.path.exists(done) and identity(stored_config(out)) == identity(cfg):
        m = read(done)
        print(f"{out} already holds this run: test accuracy {m['accuracy']:.3f} (--force retrains)")
        if args.interventions and "interventions" not in m:
            lock = claim_folder(out, cfg)  # noqa: F841 (held while analysing)
            m = analyse_run(out, *load_run(out))
        return m
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, flush=True))
    model, m = train(cfg, out, device=args.device, log=log, force=args.force,
                     dynamics=args.dynamics)
    print(f"{cfg.arch} on {cfg.task}: test accuracy {m['accuracy']:.3f} "
          f"({round(m['accuracy'] * cfg.n_eval)}/{cfg.n_eval}) after {m['steps']:,} steps in "
          f"{m['wall_time_s'] / 60:.1f} min ({m['steps_per_s']:.1f} steps/s); saved in {out}")
    return analyse_run(out, model, cfg) if args.interventions else m


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # output piped into a reader that stopped early (`| head`): no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # fd 1, stdout: exit 0 without a message
