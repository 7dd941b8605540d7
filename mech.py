"""mech.py: a single-file reproduction of "Mechanistic evaluation of Transformers and state space
models" (Arora, Rathi, Selvam, Csordás, Jurafsky, Potts; arXiv 2505.15105).

The paper trains tiny 2-layer models of seven architectures (Attention, BaseConv, Based, H3, Hyena,
Mamba, DeltaNet) on Associative Recall (AR: the value of a repeated key among 16 key-value pairs)
and Associative Treecall (ATR: a word's parent in a sentence of a random tree grammar), then asks
*how* each solved it with interchange interventions. The lesson, in reading order:
    1. the first task: Associative Recall       5. training (AdamW, warmup + schedule, evaluation)
    2. building blocks (MLP, causal convs)      6. interventions (the mechanistic evaluation)
    3. the seven sequence mixers                7. the second task: Associative Treecall
    4. blocks and the language model
and an appendix that only *runs* it (run folders, signals, devices, threads, the command line).
Every sequence mixer maps (b, l, d) -> (b, l, d) and sits in a residual block,
    Block(x) = x + mixer(norm(x)), then x + MLP(norm(x))     (Mamba blocks have no MLP),
so that "the residual stream entering layer i" is a plain tensor that can be read and patched.
Guaranteed: the official code's maths (named with each component; an official quirk is a flag, the
paper's intent its default). Not: the official RNG call order (so not its data or initial weights),
nor fused CUDA speed (scan_ext/ compiles Mamba's scan). Sweeps, figures, the report: figures/.
Reading: Zoology (arXiv 2312.04927), H3 (2212.14052), Hyena (2302.10866), Mamba (2312.00752) and
mamba-minimal, DeltaNet (2406.06484), nanoGPT (this file's shape).
Shapes in comments are lower-case: b batch, l length, d width, c channels, n state size, h heads;
upper-case letters are the paper's matrices (Mamba's A, B, C, D).
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
    d_state, d_inner   N: SSM state size per channel; E * d, Mamba's expanded width (Alg. 2)
    dt_rank, delta     R: rank of the projection producing Δ, Mamba's input-dependent step size
    A, B, C, D         SSM parameters: A and D per channel, B and C per token (Mamba)
    phi                φ: Based's 2nd-order Taylor feature map, φ(q)·φ(k) ≈ exp(q·k/√f)
    feature_dim        f = 8: width of Based's q and k
    beta, S            β, S: DeltaNet's write strength and fast-weight state
    max_rhs_len        Lmax: ATR rules have 1 .. Lmax-1 children plus a head word
    n_terminals        |Σ|: ATR's word vocabulary (20 or 8192)
Run it: python mech.py --arch mamba --task ar --dconv 4 (more in --help and README.md)."""

import dataclasses
import math
import zlib
from bisect import bisect_right

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from numpy.random import Generator

import scan_ext

PAD, BOS, EOS = 0, 1, 2  # the special tokens of both tasks
L_MAX = 1024  # n_positions: the largest sequence; also the time grid of the implicit filters and H3


# 1. The first task: Associative Recall (AR) -----------------------------------------------------
# The rest of the file sees a task only through its documents (ids, named positions) and two
# methods, sample and other_token: ATR (section 7) plugs in the same way.
def rng_for(seed: int, stream: str) -> Generator:
    """A random stream per (seed, purpose): test documents never depend on the training draws."""
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


def distinct_ints(rng: Generator, n: int, k: int, high: int) -> np.ndarray:
    """(n, k): each row k distinct integers drawn uniformly from [0, high), in random order."""
    if k * k > 2 * high:  # repeats would be common: the first k of a shuffle
        return np.argsort(rng.random((n, high)), axis=1)[:, :k]
    x = rng.integers(0, high, (n, k))
    while True:  # redraw the rows with a repeat (~3 % of them for 16 of 4096)
        repeats = (np.diff(np.sort(x, axis=1), axis=1) == 0).any(axis=1)
        if not repeats.any():
            return x
        x[repeats] = rng.integers(0, high, (int(repeats.sum()), k))


def other_than(tokens: torch.Tensor, first: int, n: int, rng: Generator) -> torch.Tensor:
    """For each of the tokens (ids in first .. first+n-1), another id of that range, uniformly."""
    r = torch.from_numpy(rng.integers(0, n - 1, len(tokens))).to(tokens.device)
    return first + r + (r >= tokens - first)  # skip the original: uniform over the n - 1 others


@dataclasses.dataclass
class Examples:
    """Documents with their named positions (one per document and name)."""
    ids: torch.Tensor  # (n, l) token ids, right-padded with PAD when lengths differ
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

    def trim(self):  # drop the padding no document needs (ATR): a causal model predicts the same
        return Examples(self.ids[:, :int(self.pos["answer"].max()) + 2], self.pos)

    @property
    def answer(self) -> torch.Tensor:  # (n,) the token the model must predict at pos["query"]
        return self.ids[torch.arange(len(self.ids), device=self.ids.device), self.pos["answer"]]


class AR:
    """Associative Recall, as the paper's AR-32.
        pos:  0     1   2   3   4  ...  31   32   33    34   35   36
        tok:  <bos> k1  v1  k2  v2 ...  k16  v16  <eos> kq   vq   <eos>
    16 keys and 16 values, drawn without replacement from disjoint halves of the num_kv = 8192
    key/value tokens, are paired in order: the association exists only in context; the model sees
    k_i after the divider and must output v_i. Vocabulary: PAD 0, BOS 1, EOS 2, keys, values, one
    unused id: V = num_kv + 4 = 8196, as officially. Official implementation: aryamanarora/tinylang,
    tinylang/language/ar.py (class AR), languages/ar_vary_kv/ar_32.yaml. Differences: numpy's PCG64
    for the official torch/numpy/random calls (the same distribution)."""

    def __init__(self, num_kv: int = 8192, n_pairs: int = 16):
        self.n_keys = num_kv // 2  # keys and values each get half of the num_kv tokens
        self.n_pairs = n_pairs
        self.first_key, self.first_value = 3, 3 + self.n_keys
        self.vocab_size = num_kv + 4
        self.length = 2 * n_pairs + 5

    def sample(self, n: int, rng: Generator, split: str = "train") -> Examples:
        """n documents; AR has no held-out split (train and test differ by their rng)."""
        p, length = self.n_pairs, self.length
        keys = self.first_key + distinct_ints(rng, n, p, self.n_keys)        # (n, p)
        values = self.first_value + distinct_ints(rng, n, p, self.n_keys)    # (n, p)
        i = rng.integers(0, p, n)                                            # the queried pair
        rows = np.arange(n)
        ids = np.empty((n, length), dtype=np.int64)
        ids[:, 1:2 * p + 1:2] = keys
        ids[:, 2:2 * p + 2:2] = values
        ids[:, 0] = BOS
        ids[:, [2 * p + 1, 2 * p + 4]] = EOS                    # the divider, the end
        ids[:, 2 * p + 2] = keys[rows, i]                       # the Query repeats key i ...
        ids[:, 2 * p + 3] = values[rows, i]                     # ... and value i answers it
        return Examples.from_numpy(ids, key=2 * i + 1, value=2 * i + 2,
                                   divider=np.full(n, length - 4), query=np.full(n, length - 3),
                                   answer=np.full(n, length - 2))

    def other_token(self, kind: str, tokens: torch.Tensor, rng: Generator) -> torch.Tensor:
        """Per token, a uniform *different* token of its kind ("key" or "value"): counterfactual."""
        first = {"key": self.first_key, "value": self.first_value}[kind]
        return other_than(tokens, first, self.n_keys, rng)


# 2. Building blocks: the MLP, causal convolutions (short and long), the implicit filters' grid --
class MLP(nn.Module):
    """fc2(GELU(fc1(x))), a 4x hidden layer. Official implementation: zoology/mixers/mlp.py."""

    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CausalConv1d(nn.Conv1d):
    """The short convolution shared by BaseConv, Hyena, Mamba and DeltaNet: depthwise and causal,
        y[t, j] = bias[j] + Σ_{i<k} w[j, i] · x[t - (k-1) + i, j]      (x before position 0 is 0):
    nn.Conv1d(c, c, k, groups=c) over k-1 zeros and x, on (b, l, c) (official: on (b, c, l))."""

    def __init__(self, channels: int, width: int, bias: bool = True):
        super().__init__(channels, channels, width, groups=channels, bias=bias)

    def forward(self, x):                                   # x: (b, l, c)
        x = F.pad(x.transpose(1, 2), (self.kernel_size[0] - 1, 0))  # (b, c, k-1+l): zeros first
        return super().forward(x).transpose(1, 2)                   # (b, l, c)


def short_conv(channels: int, width: int, bias: bool) -> nn.Module:
    """A causal conv of this width, or for width 0 none at all (the paper's "conv removed")."""
    return CausalConv1d(channels, width, bias) if width else nn.Identity()


def causal_long_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Exact causal (linear, not circular) convolution with a filter as long as the sequence,
        y[:, t, j] = Σ_{s<=t} k[j, t-s] · u[:, s, j],   u: (b, l, c), k: (c, l) -> (b, l, c),
    a depthwise conv1d over l-1 zeros and u (it correlates: the filter flipped), the maths of the
    official FFTs."""
    x = F.pad(u.transpose(1, 2), (u.shape[1] - 1, 0))            # (b, c, 2l-1): zeros before 0
    return F.conv1d(x, k.flip(-1)[:, None], groups=len(k)).transpose(1, 2)


def filter_time_grid():
    """The implicit filters' input z (L_MAX, 3), one band f = 1e-4 (in effect, normalised time):
    z_j = [t_j, cos(2π f j / L_MAX), -sin(2π f j / L_MAX)], t_j = j / (L_MAX-1), returned as t."""
    t = torch.linspace(0, 1, L_MAX)
    w = 2 * math.pi * torch.arange(L_MAX) / L_MAX * 1e-4
    return torch.stack([t, torch.cos(w), -torch.sin(w)], dim=-1), t


# 3. The seven sequence mixers, each (b, l, d) -> (b, l, d) --------------------------------------
class Attention(nn.Module):
    """Causal softmax attention, y = out_proj(softmax(q kᵀ / √d_head + M) v) per head (1 in the
    paper); Wqkv has no bias. Official implementation: aryamanarora/zoology,
    zoology/mixers/attention.py (MHA). Differences: a -inf mask for -10000 (equal in fp32)."""

    def __init__(self, d: int, n_head: int = 1):
        super().__init__()
        self.n_head = n_head
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        b, l, d = x.shape
        h = self.n_head
        q, k, v = self.Wqkv(x).view(b, l, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x (b, h, l, d/h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)                       # (b, h, l, l)
        future = torch.ones(l, l, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(b, l, d))           # (b, l, d)


class ImplicitLongConv(nn.Module):
    """conv(u) = K * u + u, a length-l filter K[:, j] = MLP(z_j): Linear(3,16), ReLU, Linear(16,d).
    Official implementation: zoology/mixers/convolution.py (ImplicitLongConvolution)."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("z", filter_time_grid()[0], persistent=False)  # fixed input grid
        self.mlp = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, d))

    def forward(self, u):                                   # u: (b, l, d)
        k = self.mlp(self.z[:u.shape[1]]).T                 # the filter: (d, l)
        return causal_long_conv(u, k) + u


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
    With φ(x) = [1, x / f^(1/4), vec(x xᵀ) / (√2 √f)] (f = feature_dim = 8)
    and s = q·k / √f, φ(q)·φ(k) = 1 + s + s²/2, and causal normalised linear attention is
        y_n = Σ_{m<=n} (φ(q_n)·φ(k_m)) v_m  /  (Σ_{m<=n} φ(q_n)·φ(k_m) + ε),
    a fixed-size state (Σ φ(k) vᵀ, Σ φ(k)) in recurrence, trained in its "quadratic" form.
    Official implementation: aryamanarora/zoology, zoology/mixers/based.py (Based, TaylorExp)."""

    def __init__(self, d: int, feature_dim: int = 8, eps: float = 1e-12):
        super().__init__()
        self.feature_dim, self.eps = feature_dim, eps
        self.proj_q = nn.Linear(d, feature_dim, bias=False)
        self.proj_k = nn.Linear(d, feature_dim, bias=False)
        self.proj_v = nn.Linear(d, d, bias=False)
        self.proj_o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        q, k, v = self.proj_q(x), self.proj_k(x), self.proj_v(x)  # (b, l, f), (b, l, f), (b, l, d)
        s = q @ k.transpose(1, 2) / math.sqrt(self.feature_dim)   # (b, l, l)
        A = (1 + s + s * s / 2).tril()                            # φ(q_n)·φ(k_m) for m <= n
        return self.proj_o((A @ v) / (A.sum(-1, keepdim=True) + self.eps))  # proj_o of (b, l, d)


def polar(magnitude: torch.Tensor, angle: torch.Tensor) -> tuple:  # magnitude · e^(i angle)
    return magnitude * torch.cos(angle), magnitude * torch.sin(angle)


class H3(nn.Module):
    """H3 ("Hungry Hungry Hippos") with d_state N = 1024 and head_dim p = 2 (H = d/p heads):
        k' = K_shift * k + D_k ⊙ k                   shift SSM: a learned causal FIR filter on k
        kv[i, j, h] = k'[h p + i] · v[h p + j]       per-head outer product
        Y = K_diag,h * kv + D_h kv                   diagonal SSM (S4D), one kernel per head
        out[j, h] = Σ_i q[h p + i] · Y[i, j, h]      read-out; channel j H + h, then output_linear
    K_shift cross-correlates two learned vectors (B = e_1 at init); S4D, bilinear discretisation:
        dA = (1 + ΔA/2)/(1 - ΔA/2),   C' = B C Δ/(1 - ΔA/2),   K[t] = 2 Re Σ_n C'_n dA_n^t.
    Official implementation: aryamanarora/zoology, zoology/mixers/h3/ (h3.py, ss_kernel_shift.py,
    ss_kernel_diag.py; "diag-lin" init: A = -1/2 + iπn, B = 1, C ~ CN(0, 1), Δ ~ logU[1e-3, 0.1]).
    Differences: both long convolutions are direct (conv1d), not FFTs (the same maths)."""

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
        self.D = nn.Parameter(torch.randn(H))
        self.output_linear = nn.Linear(d, d)

    def shift_kernel(self, l):
        """(d, l): K[:, t] = Σ_j B[:, j] C[:, j + t], a cross-correlation by FFT, zero-padded to
        2N so that the wrap-around adds nothing; 0 past lag N-1."""
        n = 2 * self.shift_B.shape[1]
        B, C = torch.fft.rfft(self.shift_B, n=n), torch.fft.rfft(self.shift_C, n=n)
        K = torch.fft.irfft(B.conj() * C, n=n)[:, :min(l, n // 2)]
        return F.pad(K, (0, max(0, l - n // 2)))

    def diag_kernel(self, l):
        """(H, l): S4D with bilinear discretisation, plainly K[t] = 2 Re Σ_n C'_n dA_n^t (its
        (H, N/2, l) table of powers makes H3's training step 1.8-2.5x slower, CPU, 1 thread). With
        t = s j + i, s ≈ √l: K[s j + i] = 2 Re Σ_n (C'_n dA_n^(s j)) dA_n^i, one matmul per head
        over two tables of √l powers |dA|^t (cos tθ + i sin tθ), θ = arg dA."""
        dt = self.log_dt.exp()[:, None]                                         # (H, 1)
        dtA = torch.complex(-self.inv_A_real.exp(), self.A_imag) * dt           # ΔA: (H, N/2)
        dA = (1 + dtA / 2) / (1 - dtA / 2)
        C = torch.view_as_complex(self.B) * torch.view_as_complex(self.C) * dt / (1 - dtA / 2)
        s = math.isqrt(l - 1) + 1
        log_r, theta = dA.abs().log()[..., None], dA.angle()[..., None]          # (H, N/2, 1)
        small = torch.arange(s, device=dt.device)                                # i < s
        big = s * torch.arange(-(-l // s), device=dt.device)                     # s j, j < l / s
        small_re, small_im = polar(torch.exp(small * log_r), small * theta)      # dA^i
        big_re, big_im = polar(torch.exp(big * log_r), big * theta)              # dA^(s j)
        Cr, Ci = C.real[..., None], C.imag[..., None]
        X_re, X_im = Cr * big_re - Ci * big_im, Cr * big_im + Ci * big_re        # C dA^(s j)
        K = 2 * (X_re.transpose(1, 2) @ small_re - X_im.transpose(1, 2) @ small_im)  # (H, l/s, s)
        return K.flatten(1)[:, :l]

    def forward(self, u):
        b, l, d = u.shape
        p, H = self.p, self.H
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)              # (b, l, d) each
        k = causal_long_conv(k, self.shift_kernel(l)) + self.shift_D * k
        # (b, l, p, H), heads last and contiguous: with p = 2 innermost, elementwise ops would crawl
        q, k, v = (x.view(b, l, H, p).transpose(2, 3).contiguous() for x in (q, k, v))
        kv = k[:, :, :, None] * v[:, :, None]                                 # (b, l, p_i, p_j, H)
        # one S4D kernel per head, shared by its p x p products: fold (i, j) into the batch
        kv_h = kv.permute(0, 2, 3, 1, 4).reshape(b * p * p, l, H)             # (b p p, l, H)
        Y = causal_long_conv(kv_h, self.diag_kernel(l)).view(b, p, p, l, H).permute(0, 3, 1, 2, 4)
        Y = Y + self.D * kv                                                   # (b, l, p_i, p_j, H)
        y = (q[:, :, :, None] * Y).sum(2)                                     # (b, l, p_j, H)
        return self.output_linear(y.reshape(b, l, d))                         # channel j H + h


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter h (d, l): an MLP of the time grid z with sine activations,
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

    def forward(self, l):
        h = self.z[:l]                                           # (l, 3)
        for lin in self.lin:
            h = torch.sin(self.omega * lin(h))                   # (l, order)
        return (self.out(h) * torch.exp(-self.t[:l, None] * self.deltas.abs())).T  # (d, l)


class Hyena(nn.Module):
    """Hyena of order 2 (1 head):
        x1, x2, v = split(short_conv_3(in_proj(u)))         width-3 causal conv on all 3d channels
        v = x2 ⊙ (h * (x1 ⊙ v) + D ⊙ (x1 ⊙ v));   y = out_proj(v)  implicit filter h, skip D
    Official implementation: aryamanarora/zoology, zoology/mixers/hyena.py (Hyena, Filter).
    Quirk: the official bias=False, passed to the Filter, zeroes D; --no-hyena-d-skip does too."""

    def __init__(self, d: int, d_skip: bool = True, filter_order: int = 64):
        super().__init__()
        self.in_proj = nn.Linear(d, 3 * d)
        self.short_filter = CausalConv1d(3 * d, 3)
        self.filter = HyenaFilter(d, filter_order)
        self.D, self.d_skip = nn.Parameter(torch.randn(d)), d_skip
        self.out_proj = nn.Linear(d, d)

    def forward(self, u):
        x1, x2, v = self.short_filter(self.in_proj(u)).chunk(3, dim=-1)    # (b, l, d) each
        v = v * x1
        v = causal_long_conv(v, self.filter(u.shape[1])) + self.d_skip * self.D * v
        return self.out_proj(v * x2)


def at_least_fp32(x):
    """x in float32 at least (float64 stays), or None: the scan accumulates in fp32."""
    return None if x is None else x.to(torch.promote_types(x.dtype, torch.float32))


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Mamba's selective scan as a loop over time in fp32 (or fp64), with the semantics of
    mamba-ssm's selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py) in Mamba's form:
        u, delta, z: (b, c, l)   A: (c, n)   B, C: (b, n, l)   D, delta_bias: (c,)   -> (b, c, l)
        Δ = softplus(delta + delta_bias)   (softplus only if delta_softplus)
        h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t          h_{-1} = 0, state (b, c, n)
        y_t = C_t · h_t + D u_t;   out = y ⊙ SiLU(z)         (the latter if z is given)
    (c: the channels, Mamba's d_inner.) Upstream's reference also takes B and C grouped or constant
    over time and can return the last state; Mamba uses none of these, so neither does this one."""
    dtype = u.dtype
    u, delta, A, B, C, D, z, delta_bias = map(at_least_fp32, (u, delta, A, B, C, D, z, delta_bias))
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)                                   # threshold 20, as upstream
    decay = torch.exp(delta[..., None] * A[:, None, :])             # (b, c, l, n): exp(Δ_t A)
    write = (delta * u)[..., None] * B.transpose(1, 2)[:, None]     # (b, c, l, n): Δ_t u_t B_t
    h, ys = u.new_zeros(*u.shape[:2], A.shape[1]), []               # state (b, c, n), outputs
    # unbind, not [:, :, t]: the backward of indexing builds a full-size zero tensor at every step
    for decay_t, write_t, C_t in zip(decay.unbind(2), write.unbind(2), C.unbind(2)):
        h = decay_t * h + write_t
        ys.append((h * C_t[:, None]).sum(-1))                      # C_t: (b, n) for every channel
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(u.shape)    # (b, c, l)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y.to(dtype)


SCAN_BACKENDS = ("auto", "ext", "ref")  # "ref" the loop above, "ext" scan_ext/'s kernel


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   backend="auto"):
    """selective_scan_ref's maths on a backend: "ref" the loop above (the oracle), "ext" scan_ext/'s
    compiled C++/CUDA kernel (an error if it cannot be built), "auto" the kernel, else the loop."""
    if backend not in SCAN_BACKENDS:
        raise ValueError(f"selective_scan: unknown backend {backend!r}; "
                         f"choose from {', '.join(SCAN_BACKENDS)}")
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    kernel = None if backend == "ref" else scan_ext.kernel(u.device, required=backend == "ext")
    if kernel:  # None where it cannot be built
        return kernel(*args)
    return selective_scan_ref(*args)


class Mamba(nn.Module):
    """Mamba (selective SSM), d_state N = 16, expand E = 2 (d_inner = 2d), dt_rank R = ceil(d/16):
        x, z = split(in_proj(u))                   (b, l, d_inner) each
        x = SiLU(conv(x))                          short causal conv of width d_conv (0 = none)
        δ, B, C = split(x_proj(x))                 (b, l, R), (b, l, N), (b, l, N)
        Δ = softplus(dt_proj(δ))                   (b, l, d_inner)
        y = selective_scan(x, Δ, A = -exp(A_log), B, C, D) ⊙ SiLU(z);   out = out_proj(y)
    d_conv is the paper's ablation knob: 4 by default, 0 removes the conv (SiLU kept), 1 is a
    per-channel scale and bias. conv_out, an identity on the conv's output (before SiLU), is where
    section 6 patches the conv (the paper's v3 conv-internal patching). Official implementation:
    state-spaces/mamba, mamba_ssm/modules/mamba_simple.py (Mamba, 2.2.4); the conv ablations
    aryamanarora/tinylang, tinylang/model/arch/mamba.py. Differences: no conv parameters at all
    when d_conv = 0."""

    def __init__(self, d: int, d_conv: int = 4, d_state: int = 16, expand: int = 2,
                 scan: str = "auto", dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        d_in, N, R = expand * d, d_state, math.ceil(d / 16)
        self.d_inner, self.d_state, self.dt_rank, self.scan = d_in, N, R, scan
        self.in_proj = nn.Linear(d, 2 * d_in, bias=False)
        self.conv1d = short_conv(d_in, d_conv, bias=True)
        self.conv_out = nn.Identity()
        self.sites = {"conv_output": "conv_out"} if d_conv else {}  # section 6's site of its own
        self.x_proj = nn.Linear(d_in, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, d_in, bias=True)
        self.out_proj = nn.Linear(d_in, d, bias=False)
        # Mamba's own init: Δ log-uniform in [dt_min, dt_max] (softplus⁻¹ of it as the bias), A
        # S4D-real (A_n = -(n+1)), D = 1. The generic re-init (init_weights) skips dt_proj.bias.
        nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)
        dt = torch.exp(torch.rand(d_in) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=1e-4)
        self.dt_proj.bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1.0)).repeat(d_in, 1))  # (d_in, N)
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
    """The delta rule, computed for the whole sequence at once:
        S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,   o_t = S_tᵀ q_t,   S_0 = 0.
    Writing S_t = Σ_{s<=t} k_s u_sᵀ, the values actually written, and the outputs, are
        u_t = β_t (v_t - Σ_{s<t} (k_t·k_s) u_s),     o_t = Σ_{s<=t} (q_t·k_s) u_s,
    the u a unit lower-triangular linear system (I + tril(β k kᵀ, -1)) U = β V, solved exactly.
    q, k: (..., l, d_k), v: (..., l, d_v), beta: (..., l) -> (..., l, d_v). FLA's chunked (WY)
    form with one chunk: the per-step loop (the tests' oracle) makes DeltaNet's training step
    1.8-2.5x slower (CPU, 1 thread)."""
    l = q.shape[-2]
    ones = torch.ones(l, l, dtype=torch.bool, device=q.device)
    M = (beta[..., None] * (k @ k.transpose(-2, -1))).masked_fill(~ones.tril(-1), 0)  # (..., l, l)
    M = M + torch.eye(l, device=q.device, dtype=q.dtype)
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
        self.n_head = n_head
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.b_proj = nn.Linear(d, n_head, bias=False)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (short_conv(d, d_conv, bias=False)
                                                       for _ in range(3))
        self.o_norm = nn.RMSNorm(d // n_head, eps=1e-5)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, l, d = x.shape
        h = self.n_head
        q, k, v = (F.silu(conv(proj(x))).view(b, l, h, d // h).transpose(1, 2)  # (b, h, l, d/h)
                   for proj, conv in ((self.q_proj, self.q_conv1d), (self.k_proj, self.k_conv1d),
                                      (self.v_proj, self.v_conv1d)))
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)               # (b, h, l)
        o = delta_rule(q * (d // h) ** -0.5, k, v, beta)                    # (b, h, l, d/h)
        return self.o_proj(self.o_norm(o).transpose(1, 2).reshape(b, l, d))


# 4. Blocks, the language model, initialisation, and the registry of architectures ---------------
class Block(nn.Module):
    """A pre-norm residual block: residual stream (b, l, d) -> residual stream (b, l, d)."""

    def __init__(self, d: int, mixer: nn.Module, mamba: bool):
        super().__init__()
        self.norm1 = nn.RMSNorm(d, eps=1e-5) if mamba else nn.LayerNorm(d)
        self.mixer = mixer
        self.norm2 = None if mamba else nn.LayerNorm(d)  # Mamba blocks have no MLP
        self.mlp = None if mamba else MLP(d)

    def forward(self, x):
        x = x + self.mixer(self.norm1(x))      # sequence mixing
        if self.mlp is None:
            return x
        return x + self.mlp(self.norm2(x))     # per-position MLP


def base_conv_layer(cfg, i: int) -> BaseConv:
    """zoology's BaseConv model alternates a short conv (k = 3) and a long one by layer."""
    long = cfg.long_conv or i % 2 == 1
    return BaseConv(cfg.d_model, None if long else (cfg.d_conv or 3))


def based_layer(cfg, i: int) -> nn.Module:
    """zoology's Based hybrid: a BaseConv layer (short conv), then Taylor linear attention, ..."""
    if i % 2 == 1:
        return TaylorLinearAttention(cfg.d_model)
    return BaseConv(cfg.d_model, None if cfg.long_conv else cfg.d_conv)


# The registry of architectures: name -> (config, layer index) -> a mixer (b, l, d) -> (b, l, d).
# A mixer of your own is one more entry, checked by register_mixer (README: "Your own mixer").
MIXERS = {
    "attention": lambda cfg, i: Attention(cfg.d_model, cfg.n_head),
    "base_conv": base_conv_layer,
    "based": based_layer,
    "h3": lambda cfg, i: H3(cfg.d_model),
    "hyena": lambda cfg, i: Hyena(cfg.d_model, d_skip=cfg.hyena_d_skip),
    "mamba": lambda cfg, i: Mamba(cfg.d_model, d_conv=cfg.d_conv, scan=cfg.scan),
    "delta_net": lambda cfg, i: DeltaNet(cfg.d_model, cfg.n_head, d_conv=cfg.d_conv)}
DEFAULT_DCONV = {"mamba": 4, "delta_net": 4, "based": 3}  # archs whose short conv --dconv sets


def init_weights(model: nn.Module, cfg):
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


class LanguageModel(nn.Module):
    """ids (b, l) -> token embedding (+ position embedding) -> blocks -> LayerNorm -> logits, the
    output head tied to the token embedding. Official: tinylang/model/arch/zoology.py (tinylang)."""

    def __init__(self, cfg, vocab_size: int):
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab_size, d)
        self.pos_emb = nn.Embedding(L_MAX, d) if cfg.pos_emb else None
        self.blocks = nn.ModuleList(Block(d, MIXERS[cfg.arch](cfg, i), mamba=cfg.arch == "mamba")
                                    for i in range(cfg.n_layer))
        self.norm_f = nn.LayerNorm(d)
        init_weights(self, cfg)

    def forward(self, ids, at=None):
        """ids: (b, l). Returns logits (b, l, V), or (b, V) at one position per row if `at` (b,) is
        given: the task is scored at the Query only, and the (V x d) head is most of the cost."""
        if ids.shape[1] > L_MAX:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds the model's maximum {L_MAX}")
        x = self.tok_emb(ids)                                               # (b, l, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)                                                    # (b, l, d)
        if at is not None:
            x = x[torch.arange(len(x), device=x.device), at]                # (b, d)
        return F.linear(self.norm_f(x), self.tok_emb.weight)                # (b, [l,] V), tied


# 5. Training ------------------------------------------------------------------------------------
def opt(default, help: str, flag: str | None = None, choices: tuple | None = None):
    """A Config field: its default, --help text, flag if not --<name>, and allowed values."""
    return dataclasses.field(default=default, metadata=dict(help=help, flag=flag, choices=choices))


@dataclasses.dataclass
class Config:
    """Everything that defines a run. Each field is a flag (--d-model for d_model): Config(arch=A,
    task=T) is the run `mech.py --arch A --task T`. A field left None takes its architecture's or
    its preset's value; then every field is checked, so that a bad value is refused here."""
    task: str = opt("ar", "the task", choices=("ar", "atr"))  # -- what to train
    arch: str = opt("attention", "the architecture, a name in MIXERS")
    preset: str = opt("cpu", "where the fields marked 'from --preset' get their values (cpu: "
                      "calibrated on 2 CPU cores; paper: its protocol; class: each headline claim "
                      "in minutes)", choices=("cpu", "paper", "class"))
    d_model: int | None = opt(None, "model width d (cpu, paper: 64; paper grid: 16 .. 256)")
    n_layer: int = opt(2, "number of blocks (the paper: 2; appendix: 1 and 3)", "--layers")
    n_head: int = opt(1, "attention / DeltaNet heads (the paper: 1)", "--heads")
    pos_emb: bool | None = opt(None, "learned position embedding (attention's default)")
    d_conv: int | None = opt(None, "short-conv width (0 = none) of mamba and delta_net (4), based "
                                   "and base_conv (3)", "--dconv")
    long_conv: bool = opt(False, "based / base_conv: the implicit long conv for the short one")
    hyena_d_skip: bool = opt(True, "Hyena's D skip (the official runs had it zeroed by a bug)")
    value_corruption: str = opt("value", "a corrupted Value becomes a value, or a key (official)",
                                choices=("value", "key"))
    scan: str = opt("auto", "Mamba's scan (ext: compiled scan_ext/; ref: the loop; auto: ext if "
                    "it builds)", choices=SCAN_BACKENDS)
    num_kv: int = opt(8192, "AR: number of key + value tokens (half keys, half values)")  # -- data
    n_pairs: int | None = opt(None, "AR: key-value pairs per document (cpu, paper: 16)")
    atr: str = opt("easy", "ATR setting (easy: Lmax 5, |Σ| 20; medium: Lmax 10; 8192: |Σ|)",
                   choices=("easy", "medium", "8192"))
    atr_query: str = opt("parent", "ATR: ask the word's parent or its rightmost sibling",
                         choices=("parent", "sibling"))
    held_out: float = opt(0.0, "ATR: fraction of label pairs asked only by test documents")
    grammar_seed: int = opt(42, "ATR: seed of the grammar (42: the official grammars)")
    n_train: int | None = opt(None, "training documents, generated once and replayed every "
                              "epoch (cpu, paper: 100,032)")
    fresh_data: bool | None = opt(None, "a fresh batch every step instead of the fixed set")
    bucket: int | None = opt(None, "batch documents by length in windows of this many batches")
    n_eval: int = opt(320, "test documents evaluated (the paper: the first 320)")
    steps: int | None = opt(None, "optimizer steps (command line: this or --epochs)")  # -- training
    epochs: int | None = opt(None, "passes over the training set, if steps is None")
    batch_size: int = opt(32, "training batch size")
    lr: float | None = opt(None, "peak learning rate (paper grid: 3e-5 .. 3e-2)")
    warmup_frac: float | None = opt(None, "fraction of the steps spent in linear warmup")
    schedule: str | None = opt(None, "after warmup (wsd: hold the peak, then decay)",
                               choices=("cosine", "linear", "wsd"))
    decay_frac: float = opt(0.2, "wsd: fraction of the steps spent decaying at the end")
    weight_decay: float = opt(0.0, "AdamW weight decay (the paper: 0)")
    eval_every: int | None = opt(None, "steps between evaluations on the test documents")
    seed: int = opt(42, "seed for the data and the initial weights")

    def __post_init__(self):
        presets = {"cpu": self.cpu_preset, "paper": self.paper_preset, "class": self.class_preset}
        preset = presets.get(self.preset)
        if preset is None:
            raise ValueError(f"unknown preset {self.preset!r}; choose from cpu, paper, class")
        defaults = dict(pos_emb=self.arch == "attention", d_conv=DEFAULT_DCONV.get(self.arch))
        defaults.update(preset())
        if self.steps is not None or self.epochs is not None:  # a given length wins
            del defaults["steps"], defaults["epochs"]
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        check_config(self)  # bad values are refused in one line (appendix)

    def paper_preset(self) -> dict:
        """The paper's protocol (tinylang experiments/*.yaml; the best of 5-7 learning rates):
        Config's data, batch, warmup; cosine to 0 (linear if held out); AR 16 epochs (50,016
        steps), ATR 32."""
        return dict(steps=None, epochs=16 if self.task == "ar" else 32, lr=1e-3, bucket=0,
                    eval_every=200, schedule="linear" if self.held_out else "cosine",
                    fresh_data=False, warmup_frac=0.1, d_model=64, n_pairs=16, n_train=100_032)

    def cpu_preset(self) -> dict:
        """The paper's task, data and batch at d = 64, on a wsd schedule fit to 2 CPU cores (its
        calibration: figures/README.md)."""
        out = dict(steps=15_000, epochs=None, lr=1e-3, schedule="wsd", fresh_data=False,
                   eval_every=500, warmup_frac=0.1, bucket=16 if self.task == "atr" else 0,
                   d_model=64, n_pairs=16, n_train=100_032)
        if self.arch == "attention":  # AR: it crosses its plateau (induction forms) only at
            # 13-17k; ATR: with 1.5k warmup steps it stays on the copy heuristic (0.65)
            out.update(dict(steps=30_000) if self.task == "ar" else dict(warmup_frac=0.5))
        if (self.task, self.arch) == ("ar", "mamba"):  # it memorises the fixed set (train loss
            out.update(steps=20_000, lr=3e-3, fresh_data=True)  # 0.03, test 0.66 at 25k)
        if (self.task, self.arch, self.pos_emb) == ("ar", "based", True):  # at 1e-3 it
            out.update(lr=3e-4)  # memorises too (train loss 2.2, test 8.4: 0.03); 3e-4: 0.90
        return out

    def class_preset(self) -> dict:
        """The CPU preset cut to show each headline claim in a class, in 1-4 minutes a run on 2 CPU
        cores (its calibration: figures/README.md, "The class preset"): 10,000 steps; on AR,
        attention and Based at d = 32 on 8 pairs and 50,000 training documents (Mamba learns
        neither at d = 32 nor, in every seed, on 8 pairs); on ATR, Mamba at 5e-3 after a long
        warmup. Attention on AR and Mamba on ATR train 15,000 steps: in 10,000 some seeds have not
        yet formed their mechanism."""
        out = self.cpu_preset()
        out.update(steps=10_000)
        if self.task == "ar" and self.arch in ("attention", "based"):
            out.update(d_model=32, n_pairs=8, n_train=50_000)
        if (self.task, self.arch) in (("ar", "attention"), ("atr", "mamba")):
            out.update(steps=15_000)
        if (self.task, self.arch) == ("atr", "mamba"):
            out.update(lr=5e-3, warmup_frac=0.6)
        return out

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return self.epochs * (self.n_train // self.batch_size)


class RunError(RuntimeError):
    """A run that cannot go on (it diverged; a file is damaged): one line for the command line."""
    code = 1  # the exit code


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
    """(n_batches, batch_size) training-document indices per batch: the paper's consecutive order,
    or with buckets each window of `bucket` batches re-cut after sorting by length, then shuffled:
    each document still once an epoch, less padding (ATR easy, windows of 16: 23 tokens, not 69)."""
    batches = np.arange(n_batches * batch_size).reshape(n_batches, batch_size)
    for w in range(0, n_batches, bucket) if bucket else ():  # no buckets: the paper's order
        docs = batches[w:w + bucket].ravel()
        docs = docs[np.argsort(length[docs], kind="stable")].reshape(-1, batch_size)
        batches[w:w + bucket] = docs[rng.permutation(len(docs))]
    return batches


def training_batches(cfg: Config, task, device: torch.device):
    """batch_at(step): that step's batch, a pure function of (seed, step), so that a resumed run
    sees the same: the fixed set, replayed in order every epoch, or with --fresh-data a new one."""
    if cfg.fresh_data:
        def batch_at(step):
            return task.sample(cfg.batch_size, rng_for(cfg.seed, f"train-step-{step}")).to(device)
        return batch_at
    per_epoch = cfg.n_train // cfg.batch_size
    train_set = task.sample(cfg.n_train, rng_for(cfg.seed, "train"))
    order = batch_documents(train_set.pos["answer"].numpy(), per_epoch, cfg.batch_size,
                            cfg.bucket, rng_for(cfg.seed, "buckets"))
    # one padded tensor per batch: ATR's rare long sentences pad only their own batch
    batches = [train_set[torch.from_numpy(i)].trim() for i in order]
    return lambda step: batches[step % per_epoch].to(device)


def train(cfg: Config, out: str | None = None, device: str = "auto", log=print,
          checkpoint_every_s: float = 60.0, force: bool = False, dynamics: bool = True) -> tuple:
    """Train one model -> (model, metrics). With `out`, the run lives in that folder (appendix:
    RunFolder): a stopped run resumes where it stopped, a finished one is returned as saved."""
    # the task (section 1, or 7 for ATR), its documents, the model and its optimizer
    dev = choose_device(device, cfg)
    task = make_task(cfg)
    model = build_model(cfg, task.vocab_size).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.weight_decay, fused=True)
    batch_at = training_batches(cfg, task, dev)
    test = task.sample(cfg.n_eval, rng_for(cfg.seed, "test"), split="test").to(dev)
    dev_set = None  # --held-out: the test documents ask held-out pairs only, dev ones the others
    if cfg.held_out:
        dev_set = task.sample(cfg.n_eval, rng_for(cfg.seed, "dev"), split="dev").to(dev)
    with RunFolder(out, cfg, force, checkpoint_every_s, log) as run:
        run.resume(model, optimizer)  # a stopped run's step, curve and loss sum, if there is one
        if run.finished:
            return model, run.metrics
        for step in range(run.step, cfg.total_steps):
            run.pause_point()  # a checkpoint each minute; Ctrl-C, SIGTERM and SIGHUP stop here
            # one optimisation step
            batch = batch_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            run.step_done(loss)  # counts the step and sums its loss for the next evaluation
            if run.step % cfg.eval_every and run.step != cfg.total_steps:
                continue
            # every eval_every steps and at the end: evaluate, watch the mechanism, log
            train_loss = run.mean_loss()  # since the last evaluation
            uniform = math.log(task.vocab_size)  # the loss of a uniform guess
            if not train_loss < 2 * uniform:  # NaN too
                raise RunError(f"the training loss reached {train_loss:.4g} by step {run.step} (a "
                               f"uniform guess: {uniform:.2f}); try a lower --lr than {cfg.lr:g}")
            ev = evaluate(model, test)
            point = dict(step=run.step, train_loss=round(train_loss, 5),
                         test_loss=round(ev["loss"], 5), accuracy=ev["accuracy"],
                         time_s=run.clock())
            if dev_set is not None:
                point["dev_accuracy"] = evaluate(model, dev_set)["accuracy"]
            if dynamics:  # the mechanism while it forms (section 6)
                point["attrib"] = watch_mechanism(model, task, test, cfg)
            run.log_point(point)  # the curve, and a progress line
        return model, run.finish(model)


# 6. Interventions: the mechanistic evaluation ---------------------------------------------------
# An interchange intervention asks where the information that decides the answer lives: corrupt
# one token (the Key: another key instead), so the model no longer knows which value to return;
# run the corrupted document, but at one site (e.g. the residual stream entering layer i) and one
# position put back the clean run's activation; see how much of p(answer) at the Query comes back,
#     Attrib = (mean p_patched - mean p_corrupted) / (mean p_clean - mean p_corrupted)
# At the input of the last layer of a 2-layer model, Attrib@Value ≈ 1 means layer 0 already wrote
# "this value follows that key" at the Value position, and the last layer matches the Query
# against it: induction. Attrib@Query ≈ 1 means layer 0 already retrieved the answer at the last
# position; Attrib@Key ≈ 1 that the last layer itself reads the key's position.
# Official implementation: aryamanarora/tinylang, tinylang/eval/interchange.py (with pyvene).
SITES = {  # site -> (module inside blocks[i], hook on its input "in" or its output "out")
    "block_input": ("", "in"), "block_output": ("", "out"),  # residual stream: into, out of block i
    "mixer_input": ("mixer", "in"), "mixer_output": ("mixer", "out"),  # normed in; before the add
    "mlp_input": ("mlp", "in"), "mlp_output": ("mlp", "out")}  # block_output[i] = block_input[i+1]
# A mixer adds sites of its own by a dict `sites` {site: its submodule whose output is patched}:
# Mamba's {"conv_output": "conv_out"}, its short conv's output before SiLU (d_inner wide).
POSITIONS = ("key", "value", "value+1", "value+2", "divider", "query")  # value+1 is AR's "next key"
# Value+1 / Value+2 can be the divider / the Query (AR: the last pair; ATR: often, a parent ends
# its sentence), where patching them is patching those: their cells average only the documents
# where they are not.
MAIN = ("block_input", "key")  # the paper's main setting: the last layer's input, Key corrupted
# The paper's filters for its mechanism plots: below this effect (mean p_clean - mean p_corrupted),
# a run's Attribs are ratios of noise.
PAPER_FILTER = {"ar": 0.01, "atr": 0.1}
# The verdict in words asks for the ATR filter on both tasks, an effect of 0.1 of p(answer): on
# 320 test documents the AR filter's 0.01 is about three documents' worth of p(answer), too little
# to name a mechanism in words.
VERDICT_MIN_EFFECT = 0.1
# An Attrib of at least 0.6, with the other two at most 1 - 0.6 = 0.4, names the mechanism: the
# named position restores at least 1.5 times as much as any other, and no two can be named.
VERDICT_DOMINANT = 0.6


def positions(data: Examples, name: str) -> torch.Tensor:
    """(n,) the position `name` in each document; "value+k": Value + k."""
    base, _, k = name.partition("+")
    return data.pos[base] + (int(k) if k else 0)


def distinct(data: Examples, name: str) -> torch.Tensor:
    """(n,) bool: the documents where position `name` is a place of its own (no other named one)."""
    return torch.stack([positions(data, name) != data.pos[p]
                        for p in POSITIONS if "+" not in p and p != name]).all(0)


def site_paths(block: Block) -> dict:
    """{site: (module path inside the block, "in" or "out")}: SITES but an absent MLP (Mamba's),
    then the mixer's own sites."""
    paths = {site: where for site, where in SITES.items()
             if where[0] != "mlp" or block.mlp is not None}
    return paths | {site: ("mixer." + path, "out")
                    for site, path in getattr(block.mixer, "sites", {}).items()}


def sites_of(model: LanguageModel) -> list:
    """The (site, layer)s of this model."""
    return [(site, layer) for layer, block in enumerate(model.blocks) for site in site_paths(block)]


def intervene(model: LanguageModel, site: str, layer: int, fn):
    """Run the model with fn(activation) -> activation at (site, layer); `with intervene(...):`
    removes the hook on the way out (so does handle.remove()). Activations are (b, l, width); fn
    may read them (and return them unchanged) or edit a copy."""
    path, side = site_paths(model.blocks[layer])[site]
    module = model.blocks[layer].get_submodule(path)
    if side == "in":
        return module.register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:]))
    return module.register_forward_hook(lambda m, args, out: fn(out))


def patched(pos: torch.Tensor, values: torch.Tensor):
    """An intervention: act[b, pos[b]] = values[b] for each document b."""
    return lambda act: act.index_put((torch.arange(len(act), device=act.device), pos), values)


def recorded(cache: dict, key):
    """An intervention that changes nothing and keeps the activation in cache[key]."""
    return lambda act: cache.setdefault(key, act)


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
    rng = rng_for(seed, f"corrupt-{corrupted}")
    if cells is None:
        cells = [(site, layer, p) for site, layer in sites_of(model) for p in POSITIONS]
    clean, corr, patch = [], [], {cell: [] for cell in cells}  # p(answer) per batch
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        bad_ids = corrupt(task, batch, corrupted, rng, value_corruption)
        cache, rows = {}, torch.arange(len(batch), device=batch.ids.device)  # clean activations
        hooks = [intervene(model, site, layer, recorded(cache, (site, layer)))
                 for site, layer in dict.fromkeys((site, layer) for site, layer, _ in cells)]
        clean.append(p_answer(model, batch).double())  # one clean run records every site patched
        for hook in hooks:
            hook.remove()
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
    if n_layer == 1:
        return ("mixer_output", 0)
    return (MAIN[0], n_layer - 1)


def main_setting(rows: list, n_layer: int, layer: int | None = None) -> dict:
    """Attrib at the main setting (main_site; or block_input[layer]), Key corrupted."""
    site, layer = main_site(n_layer) if layer is None else (MAIN[0], layer)
    return {r["position"]: r["attrib"] for r in rows
            if r["corrupted"] == MAIN[1] and r["site"] == site and r["layer"] == layer}


def key_effect(rows: list) -> float:
    """mean p_clean - mean p_corrupted over all documents (the Query's cells), Key corrupted."""
    return next(r["p_clean"] - r["p_corr"] for r in rows if r["corrupted"] == "key"
                and r["position"] == "query")


def dominant(a: dict) -> str | None:
    """The position (key, value or query) whose Attrib names the mechanism, if one does: it is
    at least VERDICT_DOMINANT and the other two at most 1 - VERDICT_DOMINANT."""
    a = {p: 0.0 if math.isnan(a[p]) else a[p] for p in ("key", "value", "query")}  # NaN: no effect
    top, second, _ = sorted(a, key=a.get, reverse=True)  # where distinct (sibling self-pairs)
    if a[top] >= VERDICT_DOMINANT and a[second] <= 1 - VERDICT_DOMINANT:
        return top
    return None


def verdict(rows: list, n_layer: int) -> str:
    """The mechanism in words, from Attrib at the first layer whose input lacks the Key association
    (thresholds VERDICT_*): in deeper models the last one can show @Query 1.00 for induction too."""
    effect = key_effect(rows)
    if effect < VERDICT_MIN_EFFECT:
        return (f"not learned: corrupting the Key moves p(answer) by only {effect:.3f} "
                f"(< {VERDICT_MIN_EFFECT}), too little to attribute")
    layer = next((i for i in range(1, n_layer)
                  if main_setting(rows, n_layer, i)["key"] < VERDICT_DOMINANT), None)
    a = main_setting(rows, n_layer, layer)
    if n_layer == 1:
        where = "by the one layer's mixer"
    elif layer in (None, n_layer - 1):
        where = "before the last layer"
    else:
        where = f"before layer {layer}"
    names = {"value": f"induction: the key-value binding is stored at the Value position {where}",
             "query": "direct retrieval at the last position: the answer is computed at the Query "
                      + where,
             "key": "direct retrieval, late: the last layer reads the Key position itself"}
    top = dominant(a)
    if top:
        return names[top]
    return "mixed: " + ", ".join(f"Attrib@{p.capitalize()} {a[p]:.2f}"
                                 for p in ("key", "value", "query"))


def mechanism_report(rows: list, n_layer: int) -> str:
    """The printed table of Attrib, Key corrupted: a row per site[layer], a column per position."""
    lines = ["Attrib (Key corrupted; rows: site[layer], columns: the patched position)",
             f"{'':16s}" + "".join(f"{'@' + p:>10s}" for p in POSITIONS)]
    key_rows = [r for r in rows if r["corrupted"] == "key"]
    table = {}  # (site, layer) -> {position: Attrib}
    for r in key_rows:
        table.setdefault((r["site"], r["layer"]), {})[r["position"]] = r["attrib"]
    for (site, layer), cells in table.items():
        mark = " <- main" if (site, layer) == main_site(n_layer) else ""
        lines.append(f"{site + f'[{layer}]':16s}"
                     + "".join(f"{cells[p]:10.3f}" for p in POSITIONS) + mark)
    lines.append("p(answer): clean {p_clean:.3f}, Key corrupted {p_corr:.3f}".format(
        **next(r for r in key_rows if r["position"] == "query")))
    n = {r["position"]: r.get("n", 0) for r in key_rows}  # documents averaged (0: not counted)
    fewer = [f"@{p} {n[p]}" for p in POSITIONS if n[p] < n["query"]]
    if fewer:
        lines.append(f"documents averaged: {', '.join(fewer)} of {n['query']} (in the others that "
                     "position is another named one)")
    conv = table.get(("conv_output", 0))
    if conv and key_effect(rows) >= VERDICT_MIN_EFFECT:
        lines.append(f"layer 0's short conv output restores Attrib {conv['key']:.2f} at the Key, "
                     f"{conv['value']:.2f} at the Value, {conv['value+1']:.2f} at Value+1"
                     + ("; here the conv at the token after the Value (its window spans Key and "
                        "Value) carries the association" if conv["value+1"] >= VERDICT_DOMINANT
                        else ""))
    return "\n".join(lines + ["verdict: " + verdict(rows, n_layer)])


def analyse(model: LanguageModel, cfg: Config, split: str = "test") -> dict:
    """Mechanistic evaluation on the test (--held-out: held-out pairs) or dev documents."""
    task, dev = make_task(cfg), next(model.parameters()).device
    data = task.sample(cfg.n_eval, rng_for(cfg.seed, split), split=split).to(dev)
    rows = (interchange(model, task, data, "key", cfg.seed, cfg.value_corruption)
            + interchange(model, task, data, "value", cfg.seed, cfg.value_corruption))
    return dict(rows=rows, n_docs=len(data), main=main_setting(rows, cfg.n_layer),
                verdict=verdict(rows, cfg.n_layer))


# The mechanism while it forms: at every evaluation, train() runs a light interchange (Key
# corrupted, DYNAMICS_DOCS test documents, a few cells) and stores it with the curve, so that a
# run shows whether its mechanism forms before, with or after its accuracy rises (figures/plots.py
# marks both moments in each run's dynamics.png).
DYNAMICS_DOCS = 128  # a fixed subset of the test documents (its cost: figures/bench_dynamics.py)


def watched_cells(model: LanguageModel, n_layer: int) -> list:
    """The verdict's site at Key, Value and Query, each layer's mixer output at the Query, and
    Mamba's layer-0 conv output at the Value and Value+1 (where its induction may live)."""
    site, layer = main_site(n_layer)
    conv = [("conv_output", 0, p) for p in ("value", "value+1")]
    return ([(site, layer, p) for p in ("key", "value", "query")]
            + [("mixer_output", i, "query") for i in range(n_layer)]
            + (conv if ("conv_output", 0) in sites_of(model) else []))


def watch_mechanism(model: LanguageModel, task, test: Examples, cfg: Config) -> dict:
    """{"effect": the Key's, "main": {position: Attrib}, "cells": {"site[layer]@position": Attrib}}
    on the first DYNAMICS_DOCS test documents: the full analysis's numbers there."""
    cells = watched_cells(model, cfg.n_layer)  # the main ones first: (site, layer, position)
    rows = interchange(model, task, test[:DYNAMICS_DOCS], "key", cfg.seed, cfg.value_corruption,
                       cells=cells)
    a = {(r["site"], r["layer"], r["position"]): r["attrib"] for r in rows}
    return dict(effect=key_effect(rows), main={cell[2]: a[cell] for cell in cells[:3]},
                cells={"%s[%d]@%s" % cell: a[cell] for cell in cells[3:]})


# 7. The second task: Associative Treecall (ATR) -------------------------------------------------
@dataclasses.dataclass
class Tree:
    """One sampled sentence: a dependency tree over its terminals, and the queried pair."""
    labels: list  # terminal labels 0 .. T-1, in sentence order (token id = 3 + label)
    parent: list  # index of each terminal's parent (always to its right); -1 for the root's head
    depth: list   # depth of each terminal in the derivation (the root's head and children: 1)
    query: int    # index of the queried terminal (the Key is at position 1 + query)
    target: int   # the answer's index: parent[query], or its sibling (the Value: 1 + target)


def legacy_cdf(p) -> list:
    """The CDF that numpy's legacy choice(p=...) builds: inverse-CDF draws with it give the
    official draws from a legacy stream."""
    c = np.cumsum(p)
    return (c / c[-1]).tolist()


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
        self.first_terminal = 3
        self.vocab_size = n_terminals + 6
        self.max_length = max_length
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
        placeholder, factor, rules = -1, self.terminal_occurrence_factor, []
        for nt in range(N):
            n_rules = rs.randint(1, self.max_rules + 1)
            allowed = [T + x for x in range(N) if self.level[x] > self.level[nt]]
            symbols, p = allowed + list(range(T)), None
            if factor is not None:
                p = np.append(np.ones(len(allowed)), factor)  # weights
                symbols, p = allowed + [placeholder], p / p.sum()
            rules.append([])
            for _ in range(n_rules):
                rhs = rs.choice(len(symbols), size=rs.randint(1, self.max_rhs_len), p=p)
                rules[-1].append([symbols[i] for i in rhs])
        self.rules = [[tuple(rs.randint(T) if s == placeholder else s for s in rhs)
                       for rhs in nt_rules] for nt_rules in rules]
        # 4. rule probabilities, 5. head-word distributions over all T terminals: Dirichlet(1)
        self.rule_probs = [rs.dirichlet(np.ones(len(nt_rules))) for nt_rules in self.rules]
        self.head_probs = [rs.dirichlet(np.ones(T)) for _ in range(N)]
        # 6. a uniform start symbol (no draw); all draws by inverse CDF (legacy_cdf)
        self.start_cdf = legacy_cdf(np.ones(N) / N)
        self.rule_cdf = [legacy_cdf(p) for p in self.rule_probs]
        self.head_cdf = [legacy_cdf(p) for p in self.head_probs]

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
        rightmost = {label: i for i, label in enumerate(tree.labels)}
        test = split == "test"
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
            draws += 1
            if draws > 100 * n + 10_000:  # else it may never end (few allowed pairs)
                raise RunError(f"{len(out)} of {n} {split} sentences found in {draws - 1:,} draws; "
                               "--held-out leaves too few pairs on one side")
            tree = self.derive(rng)
            if tree is None or len(tree.labels) < 3:
                continue
            pairs = self.eligible_pairs(tree, split)
            if pairs:
                tree.query, tree.target = self.choose_pair(pairs, rng)
                out.append(tree)
        return out

    def examples(self, trees: list) -> Examples:
        """Documents <bos> t ... t <eos> t_query t_parent <eos> (right-padded), with positions."""
        lengths = np.array([len(tree.labels) for tree in trees])  # terminals per sentence
        ids = np.full((len(trees), lengths.max() + 5), PAD, dtype=np.int64)
        for row, tree in zip(ids, trees):
            m, labels = len(tree.labels), np.add(tree.labels, self.first_terminal)  # token ids
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

# The tasks by Config.task: both are now defined.
TASKS = {
    "ar": lambda cfg: AR(cfg.num_kv, cfg.n_pairs),
    "atr": lambda cfg: ATR(**ATR_SETTINGS[cfg.atr], split=cfg.held_out, query=cfg.atr_query,
                           grammar_seed=cfg.grammar_seed, max_length=L_MAX - 5)}


def make_task(cfg: Config):
    return TASKS[cfg.task](cfg)


# Appendix: running it ---------------------------------------------------------------------------
# Everything below only *runs* the lesson above: the run folder (a lock, resuming, checkpoints on
# the clock, whole-file writes, damaged files), stop signals, the device and thread choice,
# progress lines, and the command line. Its imports are its own.
import argparse  # noqa: E402
import contextlib  # noqa: E402
import errno  # noqa: E402
import fcntl  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import runpy  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from hashlib import sha1  # noqa: E402


class Interrupted(RunError):
    """A run stopped by Ctrl-C, SIGTERM or SIGHUP, resumable: exit code 130."""
    code = 130


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def on_stop_signals(handler):
    """Ctrl-C, SIGTERM (a scheduler) and SIGHUP (a closed terminal) call handler(signum) instead
    of ending the process, until the with-block ends. A SIGHUP ignored already stays ignored (a run
    under nohup outlives its terminal); outside the main thread no handler can be set."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN:
                old[s] = signal.signal(s, lambda signum, frame: handler(signum))
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


def stop_now(signum: int):
    """The command line's handler outside the training loop, where nothing is left unsaved."""
    raise Interrupted(f"stopped by {signal.Signals(signum).name}; what was done is saved: the same "
                      "command goes on from there")


def atomic_write(path: str, data) -> None:
    """Write data (bytes or str) to a temporary file, then rename it: no reader sees half a file.
    A failed write leaves no temporary file behind, and the old file, if any, as it was."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RunError(f"no space left on the device to write {path}; the last checkpoint is "
                           "kept: free some space and run the same command again") from None
        raise


def write_json(path: str, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=1))


def torch_bytes(obj) -> bytes:  # torch.save to memory: a full disk then fails in atomic_write
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def damaged(path: str, what: str = "corrupt or truncated") -> RunError:
    return RunError(f"{path} is {what}; --force starts the run over")


def read_json(path: str, needs: tuple = ()) -> dict:
    """A run's JSON file, a dict with the keys `needs`, or a RunError naming it."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise damaged(path) from None
    if not isinstance(obj, dict) or any(k not in obj for k in needs):
        raise damaged(path, f"no {os.path.basename(path)} of this mech.py (it lacks "
                            f"{', '.join(needs)})")
    return obj


def read_torch(path: str, device) -> dict:
    """A run's torch file (weights, a checkpoint) as a dict, or a RunError naming it."""
    try:
        obj = torch.load(path, map_location=device)
    except MemoryError:
        raise
    except Exception:  # torch names many ways a file can be cut short (EOFError, OSError, ...)
        raise damaged(path) from None
    if not isinstance(obj, dict):
        raise damaged(path, "no weights or checkpoint of this mech.py")
    return obj


def load_weights(module: nn.Module, state: dict, path: str) -> None:
    try:
        module.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:  # another model's weights
        first = str(e).strip().splitlines()[0]
        raise damaged(path, f"not this run's model ({first})") from None


def identity(cfg: Config) -> dict:
    """What makes two runs the same run: every field, the length in steps (not the preset), and
    the content of the --mixer-file that registered its arch, if one did."""
    code = {"mixer_code": MIXER_CODE[cfg.arch]} if cfg.arch in MIXER_CODE else {}
    return {**dataclasses.asdict(cfg), "preset": None, "epochs": None, "steps": cfg.total_steps,
            **code}


def stored_identity(out: str) -> dict:
    """identity() of the run in `out`, with the mixer code it was trained with."""
    theirs = identity(stored_config(out))
    theirs.pop("mixer_code", None)
    code = read_json(os.path.join(out, "config.json")).get("mixer_code")
    return theirs | ({"mixer_code": code} if code else {})


def stored_config(out: str) -> Config:
    fields = read_json(os.path.join(out, "config.json"))
    fields.pop("mixer_code", None)
    try:
        return Config(**fields)
    except (TypeError, ValueError) as e:
        raise damaged(os.path.join(out, "config.json"),
                      f"no configuration of this mech.py ({e})") from None


def finished_metrics(out: str, cfg: Config) -> dict | None:
    """metrics.json of this very run in `out`, if it finished there; None if not (yet)."""
    path = os.path.join(out, "metrics.json")
    if not os.path.exists(path) or stored_identity(out) != identity(cfg):
        return None
    return read_json(path, needs=("accuracy", "steps", "curve"))


RUN_FILES = ("config.json", "checkpoint.pt", "metrics.json", "model.pt", "mechanism.png",
             "dynamics.png")


def claim(out: str, cfg: Config, force: bool = False):
    """Make `out` this run's folder and hold it with an OS lock (which a killed process does not
    leave behind) while the returned file is open. Refused while another process holds it, or when
    it holds another configuration's run, unless `force` clears it; config.json is written once."""
    os.makedirs(out, exist_ok=True)
    lock = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if force:
            for name in RUN_FILES:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(out, name))
        path, mine = os.path.join(out, "config.json"), identity(cfg)
        if not os.path.exists(path):
            code = {k: mine[k] for k in mine if k == "mixer_code"}
            write_json(path, dataclasses.asdict(cfg) | code)
        theirs = stored_identity(out)
        if theirs != mine:
            diff = ", ".join(f"{k} {theirs.get(k)} (asked: {mine.get(k)})"
                             for k in {**theirs, **mine} if theirs.get(k) != mine.get(k))
            raise RunError(f"{out} holds another run ({diff}); choose another --out, or --force "
                           "to start it over")
    except BlockingIOError:
        lock.close()
        raise RunError(f"{out} is in use by another process; wait for it or choose another "
                       "--out") from None
    except BaseException:
        lock.close()  # released now, not when the garbage collector finds it
        raise
    return lock


class RunFolder:
    """The state a training run has reached, and the folder `out` it lives in (None: in memory
    only). The folder holds config.json (written once), checkpoint.pt (each minute of training,
    and on a stop), and at the end model.pt and metrics.json, whose presence means "finished";
    the analysis adds mechanism.png and dynamics.png. Each file is written whole (atomic_write).
    While it trains, the run holds the folder's lock, and a stop signal ends it at the next step
    with a checkpoint (Interrupted): the same train() call then resumes it exactly."""

    def __init__(self, out: str | None, cfg: Config, force: bool = False,
                 checkpoint_every_s: float = 60.0, log=print):
        self.out, self.cfg, self.force, self.log = out, cfg, force, log
        self.checkpoint_every_s = checkpoint_every_s
        self.step = 0  # optimizer steps done
        self.since = 0  # the step of the last evaluation: the loss is summed since
        self.curve = []  # the evaluations
        self.elapsed = 0.0  # seconds of training before this process resumed it
        self.finished, self.metrics = False, None
        self.stops = []  # the stop signals received

    def __enter__(self):
        self.exits = contextlib.ExitStack()
        if self.out is not None:
            self.exits.enter_context(claim(self.out, self.cfg, self.force))
        self.exits.enter_context(on_stop_signals(self.stops.append))
        return self

    def __exit__(self, *exc):
        self.exits.close()

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def resume(self, model: LanguageModel, optimizer: torch.optim.Optimizer):
        """Load the run as far as it went: a finished run's model (and its metrics), or the last
        checkpoint's model, optimizer, step, curve and loss sum; then start the clock."""
        self.model, self.optimizer = model, optimizer
        device = next(model.parameters()).device
        self.loss_sum = torch.zeros((), device=device)
        self.metrics = None if self.out is None else finished_metrics(self.out, self.cfg)
        if self.metrics is not None:
            load_weights(model, read_torch(self.path("model.pt"), device), self.path("model.pt"))
            self.finished = True
            self.log(f"{self.out} already holds this run: test accuracy "
                     f"{self.metrics['accuracy']:.3f}")
            return
        if self.out is not None and os.path.exists(self.path("checkpoint.pt")):
            self.load_checkpoint(read_torch(self.path("checkpoint.pt"), device))
            self.log(f"resuming {self.out} at step {self.step}")
        self.n_params = sum(p.numel() for p in model.parameters())
        cfg = self.cfg
        self.log(f"{cfg.arch} on {cfg.task}: d={cfg.d_model}, {cfg.n_layer} layers, "
                 f"{self.n_params:,} parameters, {cfg.total_steps:,} steps, lr {cfg.lr:g}, "
                 f"{device.type}, {torch.get_num_threads()} thread(s)")
        self.start_step = self.step
        self.t_start = self.last_save = time.time()

    def load_checkpoint(self, state: dict):
        path = self.path("checkpoint.pt")
        keys = ("model", "optimizer", "step", "curve", "since", "loss_sum", "elapsed", "identity")
        if any(k not in state for k in keys):
            raise damaged(path, "no checkpoint of this mech.py")
        if state["identity"] != identity(self.cfg):
            raise damaged(path, "made by another configuration")
        load_weights(self.model, state["model"], path)
        load_weights(self.optimizer, state["optimizer"], path)
        self.step, self.since = state["step"], state["since"]
        self.curve, self.elapsed = state["curve"], state["elapsed"]
        self.loss_sum.fill_(state["loss_sum"])

    def save_checkpoint(self):
        if self.out is not None:
            atomic_write(self.path("checkpoint.pt"), torch_bytes(dict(
                step=self.step, curve=self.curve, since=self.since, loss_sum=self.loss_sum.item(),
                elapsed=self.elapsed + time.time() - self.t_start, identity=identity(self.cfg),
                model=self.model.state_dict(), optimizer=self.optimizer.state_dict())))
        self.last_save = time.time()

    def pause_point(self):
        """Between two steps (every evaluation before it logged): save a checkpoint if a minute
        has passed since the last; after a stop signal, save one and stop."""
        if self.stops:
            self.save_checkpoint()
            total, saved = self.cfg.total_steps, "the same command resumes from there"
            raise Interrupted(f"stopped at step {self.step:,} of {total:,}; "
                              + (saved if self.out else "nothing saved (no --out)"))
        if time.time() - self.last_save >= self.checkpoint_every_s:
            self.save_checkpoint()

    def step_done(self, loss: torch.Tensor):
        self.step += 1
        self.loss_sum += loss.detach()  # no .item() here: it would wait for a GPU every step

    def mean_loss(self) -> float:
        """The mean training loss since the last evaluation; the sum then starts over."""
        mean = self.loss_sum.item() / (self.step - self.since)
        self.loss_sum.zero_()
        self.since = self.step
        return mean

    def clock(self) -> float:
        """Seconds of training so far, over every resumed part of the run."""
        return round(self.elapsed + time.time() - self.t_start, 2)

    def log_point(self, point: dict):
        self.curve.append(point)
        rate = (self.step - self.start_step) / (time.time() - self.t_start)
        self.log(progress_line(point, self.cfg.total_steps, rate,
                               PAPER_FILTER.get(self.cfg.task, 0.0)))

    def finish(self, model: LanguageModel) -> dict:
        """The metrics (the last evaluation's), saved with the model; the checkpoint goes last.
        A stop that came during the last steps is obeyed now, with everything saved."""
        run_time, total = time.time() - self.t_start, self.cfg.total_steps
        final = self.curve[-1]
        metrics = dict(accuracy=final["accuracy"], test_loss=final["test_loss"], steps=total,
                       **{k: final[k] for k in ("dev_accuracy",) if k in final},
                       wall_time_s=round(self.elapsed + run_time, 2),
                       steps_per_s=round((total - self.start_step) / run_time, 2),
                       n_params=self.n_params, threads=torch.get_num_threads(),
                       device=next(model.parameters()).device.type, torch=torch.__version__,
                       curve=self.curve)
        if self.out is not None:
            atomic_write(self.path("model.pt"), torch_bytes(model.state_dict()))
            write_json(self.path("metrics.json"), metrics)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path("checkpoint.pt"))  # no longer needed
        if self.stops:
            saved = f"{self.out} holds the finished run: the same command goes on from there"
            raise Interrupted("stopped at the end of training; "
                              + (saved if self.out else "nothing saved (no --out)"))
        return metrics


def choose_device(device: str, cfg: Config | None = None) -> torch.device:
    """auto, cpu, cuda or cuda:N as a torch.device; for cfg's Mamba, its scan compiled now."""
    name = device
    if device == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ValueError(f"unknown device {device!r}; choose from auto, cpu, cuda, cuda:N")
    if kind == "cuda" and int(index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this torch sees {torch.cuda.device_count()} CUDA "
                         "device(s); use --device cpu or auto")
    dev = torch.device(name)
    if cfg is not None and cfg.arch == "mamba" and cfg.scan != "ref":
        scan_ext.kernel(dev, required=cfg.scan == "ext")  # compile the scan now, off the clock
    return dev


def idle_cores(seconds: float = 0.25) -> int:
    """The cores other processes leave idle (/proc/stat): a torch thread on a busy core crawls."""
    def idle_total():  # (idle + iowait, all) CPU ticks since boot
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)

    try:
        idle0, total0 = idle_total()
        time.sleep(seconds)
        idle1, total1 = idle_total()
    except (OSError, IndexError, ValueError):  # not Linux: trust torch's default
        return os.cpu_count() or 1
    return max(1, round((idle1 - idle0) / max(1, total1 - total0) * (os.cpu_count() or 1)))


def choose_threads(asked: int | None) -> int:
    """--threads, at most one per core (more only slow the run down); by default the idle cores."""
    cores = os.cpu_count() or 1
    if asked is None:
        return min(torch.get_num_threads(), idle_cores())
    if asked < 1:
        raise ValueError(f"--threads must be >= 1, got {asked}")
    if asked > cores:
        print(f"mech.py: note: --threads {asked} is more than this machine's {cores} cores; "
              f"using {cores}", file=sys.stderr)
        return cores
    return asked


def say(message: str) -> None:
    """print, for output that a reader may close early (`| head`): then the run goes on, silent."""
    try:
        print(message, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def progress_line(point: dict, total: int, rate: float, min_effect: float = 0.0) -> str:
    dev_acc = f" (dev {point['dev_accuracy']:.3f})" if "dev_accuracy" in point else ""
    a = point.get("attrib")
    watched_ = ""
    if a is not None and a["effect"] >= min_effect:
        watched_ = " | Attrib K/V/Q " + "/".join(f"{a['main'][p]:.2f}"
                                                 for p in ("key", "value", "query"))
    elif a is not None:
        watched_ = f" | Attrib K/V/Q - (Key effect {a['effect']:.3f})"
    return (f"step {point['step']:>7,}/{total:,} | loss {point['train_loss']:.4f} | test acc "
            f"{point['accuracy']:.3f}{dev_acc}{watched_} | {rate:5.1f} steps/s | "
            f"ETA {(total - point['step']) / rate / 60:5.1f} min")


def load_run(path: str, device: str = "cpu"):
    """A finished run: model, cfg = load_run('runs/...')."""
    cfg = stored_config(path)
    model = build_model(cfg, make_task(cfg).vocab_size)
    weights = os.path.join(path, "model.pt")
    load_weights(model, read_torch(weights, device), weights)
    return model.to(device).eval(), cfg


def analyse_run(out: str, model: LanguageModel, cfg: Config, log=print) -> dict:
    """Analyse a finished run (section 6) and add it to its folder: metrics.json (written first),
    mechanism.png and dynamics.png; then print the table."""
    from figures import plots  # the drawing; what the figures show is computed here
    with claim(out, cfg):
        log(f"interventions: patching every site, layer and position of {cfg.n_eval} test "
            "documents, Key and then Value corrupted (on 2 CPU cores: seconds to a few minutes)")
        t = time.time()
        analysis = analyse(model, cfg)
        metrics = read_json(os.path.join(out, "metrics.json"), needs=("accuracy", "curve"))
        metrics["interventions"] = analysis
        if cfg.held_out:  # §5.3 reads the dev documents too
            metrics["interventions_dev"] = analyse(model, cfg, "dev")
        write_json(os.path.join(out, "metrics.json"), metrics)
        title = (f"{cfg.arch} on {cfg.task}, d={cfg.d_model}, "
                 f"test accuracy {metrics['accuracy']:.3f}")
        learned = key_effect(analysis["rows"]) >= VERDICT_MIN_EFFECT
        name = dominant(analysis["main"]) if learned else None  # the verdict's position, if any
        site = "%s[%d]" % main_site(cfg.n_layer)
        for file, png in plots.run_figures(analysis["rows"], metrics["curve"], name, site,
                                           PAPER_FILTER[cfg.task], POSITIONS, title):
            atomic_write(os.path.join(out, file), png)
    log(mechanism_report(analysis["rows"], cfg.n_layer))
    log(f"(the interventions took {time.time() - t:.0f} s; saved in {out}/metrics.json)")
    return metrics


def check_config(cfg: Config):
    """Refuse a bad value with a ValueError of one line that names it and what is allowed."""
    for f in dataclasses.fields(cfg):
        value = typed(f, getattr(cfg, f.name))
        setattr(cfg, f.name, value)
        if f.metadata["choices"] and value not in f.metadata["choices"]:
            raise ValueError(f"unknown {f.name} {value!r}; choose from "
                             f"{', '.join(f.metadata['choices'])}")
    if cfg.arch not in MIXERS:
        raise ValueError(f"unknown arch {cfg.arch!r}; choose from {', '.join(MIXERS)}")
    problem = next(problems(cfg), None)
    if problem:
        raise ValueError(problem)


def problems(cfg: Config):
    """The ranges, and the combinations that cannot be trained, in words."""
    d, p, kv = cfg.d_model, cfg.n_pairs, cfg.num_kv
    for name in ("d_model", "n_layer", "n_head", "batch_size", "n_eval", "eval_every",
                 "steps", "epochs", "n_train", "bucket"):
        low = 0 if name == "bucket" else 1
        if getattr(cfg, name) is not None and getattr(cfg, name) < low:
            yield f"{name} must be >= {low}, got {getattr(cfg, name)}"
    for name in ("seed", "grammar_seed"):  # numpy's legacy grammar RNG takes 32 bits
        if not 0 <= getattr(cfg, name) < 2 ** 32:
            yield f"{name} must be in [0, 2**32), got {getattr(cfg, name)}"
    if d % cfg.n_head:
        yield f"d_model {d} is not divisible by n_head {cfg.n_head}"
    if cfg.n_head != 1 and cfg.arch not in ("attention", "delta_net"):
        yield f"n_head {cfg.n_head}: only attention and delta_net have heads (use 1)"
    if cfg.arch == "h3" and d % 2:
        yield f"d_model {d}: h3 needs an even width (head_dim 2)"
    if cfg.d_conv is not None and cfg.arch not in (*DEFAULT_DCONV, "base_conv"):
        yield (f"--dconv {cfg.d_conv} does not apply to {cfg.arch}; it applies to "
               f"{', '.join(DEFAULT_DCONV)}, base_conv")
    if cfg.d_conv is not None and cfg.d_conv < (cfg.arch in ("based", "base_conv")):
        yield f"d_conv must be >= 0 (>= 1 for based and base_conv), got {cfg.d_conv}"
    if cfg.long_conv and cfg.arch not in ("based", "base_conv"):
        yield f"--long-conv applies to based and base_conv, not {cfg.arch}"
    if not 0 <= cfg.held_out < 1:
        yield f"held_out must be in [0, 1), got {cfg.held_out}"
    if cfg.held_out and cfg.task != "atr":
        yield f"--held-out {cfg.held_out} applies to --task atr only"
    if kv < 4 or kv % 2:  # the Key corruption (section 6) needs a second key to swap in
        yield f"num_kv must be an even number >= 4 (two keys at least), got {kv}"
    if not 1 <= p <= kv // 2:
        yield f"n_pairs {p} must be in [1, num_kv/2 = {kv // 2} keys]"
    if 2 * p + 5 > L_MAX:
        yield f"n_pairs {p} makes documents longer than {L_MAX} tokens"
    if cfg.n_train < cfg.batch_size and not cfg.fresh_data:
        yield f"n_train {cfg.n_train} is smaller than one batch ({cfg.batch_size})"
    if cfg.n_train >= 1 and cfg.total_steps < 1:
        yield (f"{cfg.epochs} epoch(s) of {cfg.n_train} documents in batches of "
               f"{cfg.batch_size} make no step; give more --epochs or --steps")
    if not 0 < cfg.lr < math.inf:
        yield f"lr must be a finite number > 0, got {cfg.lr}"
    if not 0 <= cfg.warmup_frac < 1:
        yield f"warmup_frac must be in [0, 1), got {cfg.warmup_frac}"
    if cfg.schedule == "wsd" and not 0 < cfg.decay_frac <= 1 - cfg.warmup_frac + 1e-9:
        yield (f"decay_frac must be in (0, 1 - warmup_frac = {1 - cfg.warmup_frac:g}], "
               f"got {cfg.decay_frac}")  # 1e-9: 0.2 is 1 - 0.8 in decimals, not in floats
    if cfg.weight_decay < 0:
        yield f"weight_decay must be >= 0, got {cfg.weight_decay}"


def typed(field: dataclasses.Field, value):
    """value as its field's type (an int for a float field becomes a float: 1 and 1.0 are one
    run), or a ValueError: an int field takes no 2.5 and no True."""
    kinds = getattr(field.type, "__args__", (field.type,))  # `int | None`: (int, NoneType)
    kind = kinds[0]
    if value is None:
        ok = type(None) in kinds
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ValueError(f"{field.name} must be {kind.__name__}, got {value!r}")
    if kind is float and value is not None:
        return float(value)
    return value


# The command line -------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # --lr -1e-3 is a (bad) value, not a flag: argparse knows -1 and -.5 only
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message):  # one line, exit code 2 (argparse would print the whole usage first)
        self.exit(2, f"{self.prog}: error: {message}\n")


EXAMPLES = """examples:
  python mech.py --arch mamba --task ar --dconv 4      # Mamba on AR with its short conv
  python mech.py --arch attention --task atr --atr easy --seed 43
  python mech.py --preset class --arch attention       # a finding in a minute (README)
  python mech.py --load runs/<run folder>              # print a saved run's analysis again
Sweeps of many runs (the paper's figures, 3 seeds, a cluster):
  python figures/experiments.py --help"""


def build_parser() -> Parser:
    p = Parser(prog="mech.py", description="Train one model of the paper on its task, save the "
               "run and show how it solved the task.\nEvery field of mech.Config is a flag.",
               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Config):
        kind = getattr(f.type, "__args__", (f.type,))[0]
        extra = dict(action=argparse.BooleanOptionalAction) if kind is bool else dict(type=kind)
        if f.default is None:
            default = "from --arch" if f.name in ("pos_emb", "d_conv") else "from --preset"
        else:
            default = f.default
        choices = f.metadata["choices"] or (tuple(MIXERS) if f.name == "arch" else None)
        one_of = f"; one of {', '.join(choices)}" if choices else ""
        p.add_argument(*dict.fromkeys((flag_of(f.name), "--" + f.name.replace("_", "-"))),
                       dest=f.name, default=argparse.SUPPRESS, **extra,
                       help=f"{f.metadata['help']}{one_of} (default: {default})")
    p.add_argument("--out", help="run folder (default: runs/<task>_<arch>_..._<config hash>)")
    p.add_argument("--device", default="auto", help="auto (cuda if there is one), cpu, cuda or "
                   "cuda:N (default: auto)")
    p.add_argument("--threads", type=int, help="CPU threads for torch, at most the cores "
                   "(default: the cores other processes leave idle)")
    p.add_argument("--force", action="store_true", help="start the run in --out over")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--interventions", default=True, help="after training, run the mechanistic "
                   "evaluation (interchange interventions; default: on)",
                   action=argparse.BooleanOptionalAction)
    p.add_argument("--dynamics", default=True, help="at each evaluation, a light interchange "
                   "analysis: the mechanism while it forms (default: on)",
                   action=argparse.BooleanOptionalAction)
    p.add_argument("--load", metavar="RUN_DIR", help="analyse a finished run again instead of "
                   "training one")
    p.add_argument("--mixer-file", metavar="FILE", action="append", help="a Python file to run "
                   "first, one that registers a mixer of your own (mech.register_mixer)")
    return p


def register_mixer(name: str, factory, d_conv: int | None = None) -> None:
    """Add an architecture to MIXERS: factory(cfg, layer) -> a module (b, l, d) -> (b, l, d) that
    is causal. d_conv: the default width of its short conv, which --dconv then sets (cfg.d_conv).
    Tried on a small input first: a taken name, another output shape, an output that depends on
    later positions or a site named like a block's (SITES) is refused in one line (ValueError)."""
    if name in MIXERS:
        raise ValueError(f"mixer {name!r} is taken ({', '.join(MIXERS)}); choose another name")
    x = torch.randn(2, 7, 16)
    mixer = factory(Config(d_model=16), 0)
    clash = set(getattr(mixer, "sites", {})) & set(SITES)
    if clash:
        raise ValueError(f"mixer {name!r} names a site {', '.join(clash)}, which is a block's; "
                         "choose another name")
    y = mixer(x)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"mixer {name!r} maps (2, 7, 16) to {shape}; a mixer keeps (b, l, d)")
    if not torch.allclose(mixer(torch.cat([x[:, :6], -x[:, 6:]], 1))[:, :6], y[:, :6]):
        raise ValueError(f"mixer {name!r} is not causal: position 5's output changes with 6's "
                         "input")
    MIXERS[name] = factory
    if d_conv is not None:
        DEFAULT_DCONV[name] = d_conv


def run_mixer_files(paths) -> None:
    """--mixer-file: run each Python file once (it registers its mixers with register_mixer)."""
    for path in paths or ():
        if os.path.abspath(path) in MIXER_FILES:
            continue
        MIXER_FILES.add(os.path.abspath(path))
        before = set(MIXERS)
        try:
            runpy.run_path(path)
        except Exception as e:  # its own error, in one line
            raise ValueError(f"--mixer-file {path}: {type(e).__name__}: {e}") from None
        with open(path, "rb") as f:
            code = sha1(f.read()).hexdigest()
        MIXER_CODE.update(dict.fromkeys(set(MIXERS) - before, code))


MIXER_FILES = set()  # the files run_mixer_files has run
MIXER_CODE = {}  # arch -> sha1 of the --mixer-file that registered it: an edited mixer, a new run


def flag_of(name: str) -> str:
    """A Config field's flag: --d-model for d_model, --dconv for d_conv."""
    field = next(f for f in dataclasses.fields(Config) if f.name == name)
    return field.metadata["flag"] or "--" + name.replace("_", "-")


def default_out(cfg: Config) -> str:
    conv = f"_dconv{cfg.d_conv}" if cfg.arch in DEFAULT_DCONV else ""
    task = cfg.task
    if cfg.task == "atr":
        task += f"-{cfg.atr}" + (f"-heldout{cfg.held_out:g}" if cfg.held_out else "")
        task += f"-{cfg.atr_query}" if cfg.atr_query != "parent" else ""
    digest = sha1(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.join("runs", f"{task}_{cfg.arch}{conv}_d{cfg.d_model}_lr{cfg.lr:g}"
                                f"_s{cfg.seed}_{digest}")


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config of the flags given, refusing flags that contradict or do not apply here."""
    run_mixer_files(getattr(args, "mixer_file", None))
    given = {f.name: vars(args)[f.name] for f in dataclasses.fields(Config) if f.name in vars(args)}
    if "steps" in given and "epochs" in given:
        raise ValueError(f"give --steps ({args.steps}) or --epochs ({args.epochs}), not both")
    cfg = Config(**given)
    applies = dict(num_kv=("task", "ar"), n_pairs=("task", "ar"), atr=("task", "atr"),  # flag ->
                   atr_query=("task", "atr"), held_out=("task", "atr"),  # where it applies
                   grammar_seed=("task", "atr"), scan=("arch", "mamba"),
                   hyena_d_skip=("arch", "hyena"), decay_frac=("schedule", "wsd"),
                   d_conv=("long_conv", False))
    for name, (where, value) in applies.items():
        if name in given and getattr(cfg, where) != value:
            flag = flag_of(where)
            here = f"{flag} {value}" if not isinstance(value, bool) else f"--no-{flag[2:]}"
            there = f"{flag} {getattr(cfg, where)}" if not isinstance(value, bool) else flag
            raise ValueError(f"{flag_of(name)} applies to {here} only, not to {there}")
    unused = [flag_of(name) for name in unused_with_fresh_data(cfg, given)]
    if unused and "fresh_data" in given:
        verb = "does" if len(unused) == 1 else "do"
        raise ValueError(f"{' and '.join(unused)} {verb} not apply with --fresh-data: every step "
                         "draws new documents")
    return cfg


def unused_with_fresh_data(cfg: Config, given: dict) -> list:
    """The flags given that a run on fresh data has no use for (the training set's)."""
    if not cfg.fresh_data:
        return []
    return [name for name in ("bucket", "n_train") if name in given
            and (name == "bucket" or cfg.epochs is None)]  # epochs count n_train's documents


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = None if args.load else config_from_args(args)
        given = {name: value for name, value in vars(args).items() if hasattr(cfg, name)}
        for name in unused_with_fresh_data(cfg, given) if cfg else ():  # from the preset
            print(f"mech.py: note: {flag_of(name)} is not used: this run trains on "
                  "fresh documents every step (--preset's choice; --no-fresh-data to change it)",
                  file=sys.stderr)
        torch.set_num_threads(choose_threads(args.threads))
        choose_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    try:
        with on_stop_signals(stop_now):
            if args.load:
                return load_and_analyse(args, parser)
            return run(cfg, args)
    except RunError as e:
        parser.exit(e.code, f"{parser.prog}: {e}\n")
    except (OSError, MemoryError, RuntimeError) as e:  # a folder not to be written, no memory
        if isinstance(e, RuntimeError) and not any(m in str(e) for m in ("alloc", "scan backend")):
            raise
        parser.exit(1, f"{parser.prog}: error: {str(e).strip().splitlines()[-1]}\n")


def load_and_analyse(args, parser) -> dict:
    """--load RUN_DIR: analyse a saved run as it was trained."""
    run_mixer_files(args.mixer_file)
    given = [k for k in vars(args) if k in {f.name for f in dataclasses.fields(Config)}]
    if given or args.out or args.force or not args.interventions:
        parser.error(f"--load analyses a saved run as it was trained: it takes no "
                     f"{', '.join(given) or '--out, --force or --no-interventions'}")
    missing = [f for f in ("config.json", "model.pt", "metrics.json")
               if not os.path.exists(os.path.join(args.load, f))]
    if missing:
        parser.error(f"--load {args.load}: no finished run there ({', '.join(missing)} missing)")
    model, cfg = load_run(args.load)
    accuracy = read_json(os.path.join(args.load, "metrics.json"), needs=("accuracy",))["accuracy"]
    say(f"loaded {args.load}: {cfg.arch} on {cfg.task}, d={cfg.d_model}, test accuracy "
        f"{accuracy:.3f}")
    return analyse_run(args.load, model, cfg, say)


def run(cfg: Config, args) -> dict:
    """Train the run of `cfg` in its folder (or resume it, or report it if finished), analyse it."""
    out = args.out or default_out(cfg)
    metrics = None if args.force or not os.path.isdir(out) else finished_metrics(out, cfg)
    model = None
    if metrics is not None:
        say(f"{out} already holds this run: test accuracy {metrics['accuracy']:.3f} (--force "
            "retrains)")
    else:
        log = (lambda message: None) if args.quiet else say
        model, metrics = train(cfg, out, device=args.device, log=log, force=args.force,
                               dynamics=args.dynamics)
        say(f"{cfg.arch} on {cfg.task}: test accuracy {metrics['accuracy']:.3f} "
            f"({round(metrics['accuracy'] * cfg.n_eval)}/{cfg.n_eval}) after {metrics['steps']:,} "
            f"steps in {metrics['wall_time_s'] / 60:.1f} min ({metrics['steps_per_s']:.1f} "
            f"steps/s); saved in {out}")
    if args.interventions and "interventions" not in metrics:
        if model is None:
            model = load_run(out, args.device if args.device != "auto" else "cpu")[0]
        metrics = analyse_run(out, model, cfg, say)
    return metrics


if __name__ == "__main__":
    sys.modules.setdefault("mech", sys.modules["__main__"])  # a --mixer-file's `import mech`
    try:
        main()
    except BrokenPipeError:  # --help piped into a reader that stopped early (`| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
