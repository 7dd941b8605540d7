"""
mech.py: a single-file reproduction of "Mechanistic evaluation of Transformers and state space
models" (Arora, Rathi, Selvam, Csordás, Jurafsky, Potts; arXiv 2505.15105).

The paper trains tiny 2-layer language models of seven architectures (Attention, BaseConv, Based,
H3, Hyena, Mamba, DeltaNet) on Associative Recall (AR): a document lists 16 key-value pairs, then
repeats one key, and the model must output its value; and on Associative Treecall (ATR): recall a
word's parent in a sentence of a random tree grammar. It then asks *how* each model solved the task
with interchange interventions. This file holds all of it, to be read top to bottom:

    0. utilities                         3. training (AdamW, warmup + cosine, evaluation, runs on disk)
    1. the tasks (AR, ATR)               4. interventions (the mechanistic evaluation)
    2. the seven architectures           5. experiments: sweeps and figures
                                         6. the command line

Every sequence mixer maps (B, L, d) -> (B, L, d) and sits in a residual block,
    Block(x) = x + mixer(norm(x)), then x + MLP(norm(x))     (Mamba blocks have no MLP),
so that "the residual stream entering layer l" is a plain tensor that can be read and patched.

What is guaranteed: the tasks, architectures and training protocol follow the official code
(aryamanarora/tinylang, its zoology fork, mamba-ssm 2.2.4, FLA's DeltaNet) in their maths; where
the official code has a quirk, the paper's intent is the default and the quirk is a flag (see
Config). What is not: bit-identical data or initial weights (other RNG call orders), and the speed
of fused CUDA kernels (the optional scan extension in scan_ext/ covers Mamba's hot loop).

Reading list: the paper (arXiv 2505.15105); Zoology (arXiv 2312.04927) for AR, BaseConv and Based;
H3 (arXiv 2212.14052); Hyena (arXiv 2302.10866); Mamba (arXiv 2312.00752) and mamba-minimal;
DeltaNet (arXiv 2406.06484); nanoGPT for the shape of this file.

Glossary (code name: paper notation, meaning)
    d_model, d         "Model dimension": the width of the residual stream
    n_layer            number of blocks (2 in the main results)
    pos_emb            PE / NoPE: learned absolute position embedding on or off
    pos["key"]         Key: the in-context occurrence of the queried key (ATR: of the queried word)
    pos["value"]       Value: the value stored next to it (ATR: the word's parent), the answer in context
    pos["divider"]     the <eos> before the query
    pos["query"]       Query: the repeated key; the prediction is read here
    pos["answer"]      the answer token (what follows the Query)
    d_conv             "Conv.": width of the short causal convolution (0 = none)
    d_state            N: SSM state size per channel
    d_inner            D = E * d (Mamba's expanded width, Algorithm 2)
    dt_rank            R: rank of the projection that produces delta
    delta              Δ: Mamba's input-dependent step size
    A, B, C, D         SSM parameters: A and D per channel, B and C per token (Mamba)
    phi                φ: Based's 2nd-order Taylor feature map, φ(q)·φ(k) ≈ exp(q·k/√f)
    feature_dim        f = 8: width of Based's q and k
    max_rhs_len        Lmax: ATR rules have 1 .. Lmax-1 children plus a head word
    n_terminals        |Σ|: ATR's word vocabulary (20 or 8192)
    beta, S            β, S: DeltaNet's write strength and fast-weight state

Run it:
    python mech.py --arch mamba --task ar --dconv 4         # CPU preset: ~8 min on 2 cores
    python mech.py --arch attention --d-model 128 --lr 3e-3
    python mech.py --arch based --task atr --atr easy       # Associative Treecall
    python mech.py --sweep ar-dconv --jobs 2                # a sweep of the paper (section 5), 3 seeds
    python mech.py --preset paper --arch based --d-model 64 --lr 1e-3   # the paper's exact protocol
    python mech.py --help
"""

import argparse
import bisect
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 0. Utilities
# ─────────────────────────────────────────────────────────────────────────────────────────────

def rng_for(seed: int, stream: str) -> np.random.Generator:
    """An independent, reproducible numpy RNG per (seed, purpose): train data, test data, ..."""
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


def distinct_ints(rng: np.random.Generator, n: int, k: int, high: int) -> np.ndarray:
    """(n, k) array: each row is k distinct integers drawn uniformly from [0, high), in random order."""
    if k * k > 2 * high:  # repeats would be common: take the first k of a shuffle of the (small) range
        return np.argsort(rng.random((n, high)), axis=1)[:, :k]
    x = rng.integers(0, high, (n, k))
    while True:  # redraw the rows that hold a repeat (about 3% of them for 16 keys out of 4096)
        s = np.sort(x, axis=1)
        bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not bad.any():
            return x
        x[bad] = rng.integers(0, high, (int(bad.sum()), k))


_warned = set()


def warn_once(msg: str) -> None:
    """A one-line warning on stderr, once per process."""
    if msg not in _warned:
        _warned.add(msg)
        print(f"mech.py: warning: {msg}", file=sys.stderr)


def atomic_write(path: str, write) -> None:
    """Call write(tmp_path), then rename over `path`: readers never see a half-written file."""
    tmp = f"{path}.tmp{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=1))


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 1. The tasks: Associative Recall (AR) and Associative Treecall (ATR)
# ─────────────────────────────────────────────────────────────────────────────────────────────

@dataclass
class Examples:
    """A set of documents with their named positions (one position per document and name)."""
    ids: torch.Tensor  # (n, L) token ids, right-padded with PAD when lengths differ
    pos: dict          # name -> (n,) LongTensor: key, value, divider, query, answer

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):  # a slice or an index tensor selects documents
        return Examples(self.ids[i], {name: p[i] for name, p in self.pos.items()})

    def to(self, device):
        return Examples(self.ids.to(device), {name: p.to(device) for name, p in self.pos.items()})

    def trim(self):
        """The same documents without the right padding that none of them needs (ATR's lengths vary:
        a batch is cut to its longest document, not the longest of the whole set). All models are
        causal, so padding after a document changes none of its predictions; trimming only saves time."""
        return Examples(self.ids[:, :int(self.pos["answer"].max()) + 2], self.pos)

    @property
    def answer(self) -> torch.Tensor:  # (n,) the token the model must predict at pos["query"]
        return self.ids[torch.arange(len(self.ids), device=self.ids.device), self.pos["answer"]]


PAD, BOS, EOS = 0, 1, 2


class AR:
    """Associative Recall, as the paper's AR-32.

        pos:  0     1   2   3   4  ...  31   32   33    34   35   36
        tok:  <bos> k1  v1  k2  v2 ...  k16  v16  <eos> kq   vq   <eos>

    16 keys and 16 values are drawn without replacement from disjoint halves of the num_kv = 8192
    key/value tokens and paired in order; there is no global key -> value map, so the association
    exists only in context. One pair i is queried: the model sees k_i after the divider and must
    output v_i. Loss and accuracy are read at the Query position only, over the full vocabulary.
    Vocabulary: PAD 0, BOS 1, EOS 2, keys 3 .. 3+num_kv/2-1, then values, then one unused id, so
    that V = num_kv + 4 = 8196 as in the official code (whose parameter counts we check).

    Official implementation: aryamanarora/tinylang, tinylang/language/ar.py (class AR),
    config languages/ar_vary_kv/ar_32.yaml.
    Differences: numpy's PCG64 instead of the official torch/numpy/random calls, so the documents
    are from the same distribution but not the same ones.
    """

    def __init__(self, num_kv: int = 8192, n_pairs: int = 16):
        self.n_keys = num_kv // 2  # keys and values each get half of num_kv
        self.n_pairs = n_pairs
        self.first_key, self.first_value = 3, 3 + self.n_keys
        self.vocab_size = num_kv + 4
        self.length = 2 * n_pairs + 5

    def sample(self, n: int, rng: np.random.Generator, split: str = "train") -> Examples:
        """n documents. AR has no held-out split: train and test documents differ only by their rng."""
        P = self.n_pairs
        keys = self.first_key + distinct_ints(rng, n, P, self.n_keys)        # (n, P)
        values = self.first_value + distinct_ints(rng, n, P, self.n_keys)    # (n, P)
        i = rng.integers(0, P, n)                                            # queried pair
        rows = np.arange(n)
        ids = np.empty((n, self.length), dtype=np.int64)
        ids[:, 0] = BOS
        ids[:, 1:2 * P + 1:2] = keys
        ids[:, 2:2 * P + 2:2] = values
        ids[:, 2 * P + 1] = EOS                   # divider
        ids[:, 2 * P + 2] = keys[rows, i]         # Query
        ids[:, 2 * P + 3] = values[rows, i]       # answer
        ids[:, 2 * P + 4] = EOS
        L = self.length
        pos = dict(key=2 * i + 1, value=2 * i + 2, divider=np.full(n, L - 4),
                   query=np.full(n, L - 3), answer=np.full(n, L - 2))
        return Examples(torch.from_numpy(ids), {k: torch.from_numpy(v).long() for k, v in pos.items()})

    def other_token(self, kind: str, tokens: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        """For each token, a uniformly drawn *different* token of the same kind ("key" or "value"):
        the counterfactual inputs of the interventions."""
        first = {"key": self.first_key, "value": self.first_value}[kind]
        r = torch.from_numpy(rng.integers(0, self.n_keys - 1, len(tokens))).to(tokens.device)
        return first + r + (r >= tokens - first)  # skip the original: uniform over the n_keys - 1 others


@dataclass
class Tree:
    """One sampled sentence as a dependency tree over its terminals, and the pair that was queried."""
    labels: list  # terminal labels 0 .. T-1, in sentence order (token id = 3 + label)
    parent: list  # index of each terminal's parent terminal (always to its right); -1 for the root's head
    depth: list   # depth of each terminal in the derivation (the root's head and children: 1)
    query: int    # index of the queried terminal (the Key is at position 1 + query)
    target: int   # parent[query] (the Value is at position 1 + target)


class ATR:
    """Associative Treecall: recall a terminal's parent in a sentence of a random headed PCFG.

        pos:  0     1 ... n   n+1    n+2      n+3       n+4
        tok:  <bos> t ... t   <eos>  t_query  t_parent  <eos>

    The grammar (built once, from its own seed): n_nonterminals nonterminals, each with a level in
    1..max_depth, 1..max_rules rules whose right-hand sides hold 1..max_rhs_len-1 symbols drawn with
    replacement from the terminals and the nonterminals of strictly higher level (so derivations
    end), Dirichlet(1) rule probabilities, and a Dirichlet(1) distribution over all terminals for
    its head word. A sentence expands a uniformly drawn start nonterminal: each constituent emits
    its children in order, then one head word at its right end. A terminal's parent is the head word
    of its constituent (the head word's own parent is the head of the enclosing constituent; the
    root's head has none), so parents lie to the right of their children and one parent can have
    many children: associations are tree-shaped, not adjacent pairs as in AR. The query repeats a
    terminal that is the rightmost occurrence of its type in the sentence (so the Key is
    unambiguous), chosen by first drawing the parent uniformly among those with an eligible child,
    then the child among them; the model must output the parent's token. Sentences with fewer than 3
    or more than max_length terminals, or with no eligible pair, are redrawn.
    With split > 0, a fraction `split` of the T x T (parent label, query label) pairs is held out:
    "train" and "dev" documents never query a held-out pair, "test" documents only query those.
    Vocabulary: PAD 0, BOS 1, EOS 2, terminals 3 .. T+2, then 3 query-type tokens (parent, child,
    sibling) that the official code emits only when several query types are on, never here:
    V = T + 6 (26 for T = 20, 8198 for T = 8192).

    Official implementation: aryamanarora/tinylang, tinylang/language/pcfg.py (class PCFG), configs
    languages/pcfg_vary_difficulty/pcfg_{5,10}_20.yaml, languages/pcfg_vary_rhs_8192/pcfg_easy_8192.yaml,
    languages/pcfg_train_test_split/pcfg.yaml.
    Differences: none in the grammar: it is built with the official sequence of legacy-numpy calls
    (RandomState(grammar_seed) standing in for np.random.seed(42)), so the easy, medium, 8192 and
    split grammars are the official ones (easy: 110 rules, RHS lengths {1: 27, 2: 22, 3: 28, 4: 33};
    medium: 124 rules; split: 90 of 400 pairs held out). Documents come from the numpy Generator
    passed to sample(), so they follow the official distribution but are not the official documents
    (fed the official legacy stream instead, derive() and the query choice give PAPER.md's worked
    examples token for token: the tests check it). Only parent queries, with unambiguous queries and
    sample_first="target", as in all paper runs. Sentences are capped at L_MAX - 5 terminals so that
    every document fits the position grid (the official cap is 1024; 100k easy sentences reach ~420).
    """

    def __init__(self, n_terminals: int = 20, max_rhs_len: int = 5, n_nonterminals: int = 40,
                 max_rules: int = 5, max_depth: int = 10, terminal_occurrence_factor=None,
                 split: float = 0.0, grammar_seed: int = 42, max_length: int = 1024):
        self.n_terminals, self.max_rhs_len, self.n_nonterminals = n_terminals, max_rhs_len, n_nonterminals
        self.max_rules, self.max_depth, self.max_length = max_rules, max_depth, max_length
        self.terminal_occurrence_factor, self.split = terminal_occurrence_factor, split
        self.first_terminal = 3
        self.vocab_size = n_terminals + 6
        self.build_grammar(np.random.RandomState(grammar_seed))

    def build_grammar(self, rs: np.random.RandomState):
        """Draw the held-out pairs and the grammar from the legacy RNG, in the official order.
        Symbols are ints: s < T is terminal s, s >= T is nonterminal s - T."""
        T, N = self.n_terminals, self.n_nonterminals
        # 1. held-out (parent label, query label) pairs; drawn first, so a split changes the grammar (Q11)
        self.held_out = rs.rand(T, T) < self.split if self.split > 0 else None
        # 2. levels: a rule may only use nonterminals of strictly higher level (official name: max_depths)
        self.level = np.array([rs.randint(1, self.max_depth + 1) for _ in range(N)])
        # 3. rules: RHS length in 1..max_rhs_len-1 (numpy's exclusive high), symbols drawn with replacement
        #    uniformly over (allowed nonterminals + all terminals); or, with a terminal_occurrence_factor f,
        #    over (allowed nonterminals, weight 1 each) + one terminal placeholder of weight f, the
        #    placeholders being filled with uniform terminals afterwards (so the tree shape does not
        #    depend on T)
        PLACEHOLDER = -1
        self.rules = []
        for nt in range(N):
            n_rules = rs.randint(1, self.max_rules + 1)
            allowed = [T + x for x in range(N) if self.level[x] > self.level[nt]]
            rules = []
            for _ in range(n_rules):
                length = rs.randint(1, self.max_rhs_len)
                if self.terminal_occurrence_factor is None:
                    symbols = allowed + list(range(T))
                    rhs = [symbols[i] for i in rs.choice(len(symbols), size=length)]
                else:
                    weights = np.ones(len(allowed) + 1)
                    weights[-1] = self.terminal_occurrence_factor
                    symbols = allowed + [PLACEHOLDER]
                    rhs = [symbols[i] for i in rs.choice(len(symbols), size=length, p=weights / weights.sum())]
                rules.append(rhs)
            self.rules.append(rules)
        self.rules = [[tuple(s if s != PLACEHOLDER else rs.randint(T) for s in rhs) for rhs in rules]
                      for rules in self.rules]
        # 4. rule probabilities, 5. head-word distributions (over all T terminals), both Dirichlet(1)
        self.rule_probs = [rs.dirichlet(np.ones(len(rules))) for rules in self.rules]
        self.head_probs = [rs.dirichlet(np.ones(T)) for _ in range(N)]
        # 6. the start symbol is uniform over the nonterminals (no draw). Sampling by inverse CDF, with
        #    the CDF that numpy's legacy choice(p=...) builds, so a legacy stream gives the official draws.
        cdf = lambda p: (np.cumsum(p) / np.cumsum(p)[-1]).tolist()
        self.start_cdf = cdf(np.ones(N) / N)
        self.rule_cdf = [cdf(p) for p in self.rule_probs]
        self.head_cdf = [cdf(p) for p in self.head_probs]

    def derive(self, rng):
        """Expand a start symbol depth-first, left to right (the official order of draws: per
        constituent, its rule, then its head word). Returns a Tree without its query, or None when the
        sentence would grow past max_length terminals (the official generator gives up at that point).
        rng: anything with .random() -- a numpy Generator, or a legacy RandomState."""
        T = self.n_terminals
        labels, owner, depth = [], [], []  # per terminal: label; constituent whose head is its parent; depth
        head_at = []                       # per constituent: position of its head word
        start = T + bisect.bisect_right(self.start_cdf, rng.random())
        stack = [(start, -1, -1, 0)]       # (symbol, enclosing constituent, constituent it heads or -1, depth)
        while stack:
            if len(labels) >= self.max_length:  # and more to come
                return None
            symbol, up, heads, d = stack.pop()
            if symbol < T:  # a terminal: emit it
                if heads >= 0:
                    head_at[heads] = len(labels)
                labels.append(symbol)
                owner.append(up)
                depth.append(d)
                continue
            c = len(head_at)  # a nonterminal: a new constituent c
            head_at.append(-1)
            rhs = self.rules[symbol - T][bisect.bisect_right(self.rule_cdf[symbol - T], rng.random())]
            head = bisect.bisect_right(self.head_cdf[symbol - T], rng.random())
            stack.append((head, up, c, d + 1))  # c's head word, out after the children (right-headed)
            stack.extend((s, c, -1, d + 1) for s in reversed(rhs))  # the children, popped in order
        parent = [head_at[c] if c >= 0 else -1 for c in owner]
        return Tree(labels, parent, depth, query=-1, target=-1)

    def eligible_pairs(self, tree: Tree, split: str = "train") -> list:
        """The (query, target) index pairs that may be asked, sorted by target then query: target is the
        query's parent, the query is the rightmost occurrence of its label, and the (target label,
        query label) pair is allowed in this split."""
        if split not in ("train", "dev", "test"):
            raise ValueError(f"split must be 'train', 'dev' or 'test', not {split!r}")
        rightmost = {label: i for i, label in enumerate(tree.labels)}
        pairs = []
        for q, (label, t) in enumerate(zip(tree.labels, tree.parent)):
            if t < 0 or rightmost[label] != q:
                continue
            if self.held_out is not None and self.held_out[tree.labels[t], label] != (split == "test"):
                continue
            pairs.append((t, q))
        return [(q, t) for t, q in sorted(pairs)]

    @staticmethod
    def choose_pair(pairs: list, rng: np.random.Generator) -> tuple:
        """(query, target): the target uniformly among the eligible targets, then the query uniformly
        among that target's eligible queries (sample_first="target"). Not uniform over pairs: a query
        whose parent has few eligible children is more likely."""
        targets = sorted({t for _, t in pairs})
        target = targets[rng.integers(len(targets))]
        queries = [q for q, t in pairs if t == target]
        return queries[rng.integers(len(queries))], target

    def trees(self, n: int, rng: np.random.Generator, split: str = "train") -> list:
        """n sentences with their queried pair; sentences that are too short (< 3 terminals), too long,
        or have no eligible pair are redrawn."""
        out = []
        while len(out) < n:
            tree = self.derive(rng)
            if tree is None or len(tree.labels) < 3:
                continue
            pairs = self.eligible_pairs(tree, split)
            if pairs:
                tree.query, tree.target = self.choose_pair(pairs, rng)
                out.append(tree)
        return out

    def examples(self, trees: list) -> Examples:
        """Documents <bos> t ... t <eos> t_query t_parent <eos>, right-padded with PAD, and their positions."""
        n, first = len(trees), self.first_terminal
        lengths = np.array([len(tree.labels) for tree in trees])  # terminals per sentence
        ids = np.full((n, lengths.max() + 5), PAD, dtype=np.int64)
        for row, tree in zip(ids, trees):
            m = len(tree.labels)
            row[0] = BOS
            row[1:m + 1] = np.add(tree.labels, first)
            row[m + 1:m + 5] = EOS, first + tree.labels[tree.query], first + tree.labels[tree.target], EOS
        pos = dict(key=1 + np.array([tree.query for tree in trees]),
                   value=1 + np.array([tree.target for tree in trees]),
                   divider=lengths + 1, query=lengths + 2, answer=lengths + 3)
        return Examples(torch.from_numpy(ids), {k: torch.from_numpy(v).long() for k, v in pos.items()})

    def sample(self, n: int, rng: np.random.Generator, split: str = "train") -> Examples:
        return self.examples(self.trees(n, rng, split))

    def other_token(self, kind: str, tokens: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        """For each token, a uniformly drawn *different* terminal (Keys and Values are both terminals)."""
        T, first = self.n_terminals, self.first_terminal
        r = torch.from_numpy(rng.integers(0, T - 1, len(tokens))).to(tokens.device)
        return first + r + (r >= tokens - first)  # skip the original: uniform over the T - 1 others


ATR_SETTINGS = {  # the paper's three ATR settings (PAPER.md §3.1); its generalisation runs are easy
    "easy": dict(n_terminals=20, max_rhs_len=5),      # "Lmax=5, |Σ|=20": pcfg_vary_difficulty/pcfg_5_20
    "medium": dict(n_terminals=20, max_rhs_len=10),   # "Lmax=10, |Σ|=20": pcfg_vary_difficulty/pcfg_10_20
    "8192": dict(n_terminals=8192, max_rhs_len=5, terminal_occurrence_factor=20),  # pcfg_vary_rhs_8192/
}                                                     # ... with --held-out 0.2 (pcfg_train_test_split/pcfg)


def make_task(cfg: "Config"):
    return TASKS[cfg.task](cfg)


TASKS = {  # task name -> Config -> task object with .vocab_size, .sample(n, rng, split), .other_token
    "ar": lambda cfg: AR(cfg.num_kv, cfg.n_pairs),
    "atr": lambda cfg: ATR(**ATR_SETTINGS[cfg.atr], split=cfg.held_out, grammar_seed=cfg.grammar_seed,
                           max_length=L_MAX - 5),
}


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 2. Architectures
# ─────────────────────────────────────────────────────────────────────────────────────────────
# 2a. Shared pieces: MLP, causal convolutions (short and long), the implicit filters' time grid.

L_MAX = 1024  # n_positions: the largest sequence; also the time grid of the implicit filters and H3


class MLP(nn.Module):
    """fc2(GELU(fc1(x))) with a 4x hidden layer. Official: aryamanarora/zoology, zoology/mixers/mlp.py."""

    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class CausalConv1d(nn.Conv1d):
    """The short convolution shared by BaseConv, Hyena, Mamba and DeltaNet: depthwise and causal,
        y[t, c] = bias[c] + Σ_{i<k} w[c, i] · x[t - (k-1) + i, c]      (x before position 0 is 0),
    i.e. nn.Conv1d(C, C, k, groups=C, padding=k-1) truncated to the first L outputs (whose weights
    and init it keeps), computed on (B, L, C) as k shifted multiply-adds: 2x faster on a CPU here.
    """

    def __init__(self, channels: int, width: int, bias: bool = True):
        super().__init__(channels, channels, width, groups=channels, padding=width - 1, bias=bias)

    def forward(self, x):                                   # x: (B, L, C)
        k, L = self.kernel_size[0], x.shape[1]
        x = F.pad(x, (0, 0, k - 1, 0))                      # (B, k-1+L, C): zeros before position 0
        y = sum(self.weight[:, 0, i] * x[:, i:i + L] for i in range(k))
        return y + self.bias if self.bias is not None else y


def short_conv(channels: int, width: int, bias: bool) -> nn.Module:
    """A width-k causal conv, or nothing at all for width 0 (the paper's 'conv removed' ablation)."""
    return CausalConv1d(channels, width, bias) if width > 0 else nn.Identity()


def causal_long_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Exact causal (linear, not circular) convolution with a filter as long as the sequence:
        y[b, t, c] = Σ_{s<=t} k[c, t-s] · u[b, s, c]
    u: (B, L, C), k: (C, L) -> (B, L, C). The official code multiplies FFTs of size 2L; for the short
    sequences here a Toeplitz matmul is faster on a CPU, and it is exactly causal (no FFT round-off
    leaks from later positions into earlier ones, which matters when we patch activations).
    """
    L = u.shape[1]
    # T[c, t, s] = k[c, t-s] (0 for s > t): row t of this Toeplitz matrix is a window of the reversed,
    # left-padded filter, so unfold builds all rows as one view
    T = F.pad(k, (L - 1, 0)).flip(-1).unfold(-1, L, 1).flip(1).contiguous()    # (C, L, L)
    return (T @ u.permute(2, 1, 0).contiguous()).permute(2, 1, 0)              # (C, L, B) -> (B, L, C)


def filter_time_grid():
    """The input of the implicit filters (Hyena, BaseConv long conv) at positions j = 0 .. L_MAX-1:
    z_j = [t_j, cos(2π f j / L_MAX), -sin(2π f j / L_MAX)] with t_j = j / (L_MAX-1) and a single band
    f = 1e-4, so that z is, in effect, normalised time. Returns z (L_MAX, 3) and t (L_MAX,)."""
    t = torch.linspace(0, 1, L_MAX)
    w = 2 * math.pi * torch.arange(L_MAX) / L_MAX * 1e-4
    return torch.stack([t, torch.cos(w), -torch.sin(w)], dim=-1), t


# 2b. The sequence mixers. Each maps (B, L, d) -> (B, L, d).

class Attention(nn.Module):
    """Causal softmax attention:  y = out_proj(softmax(q kᵀ / √d_head + M) v)  per head.

    Wqkv has no bias (the official config passes bias=False); out_proj has one. 1 head in the paper.
    Position information comes only from the learned position embedding (no RoPE).
    Official implementation: aryamanarora/zoology, zoology/mixers/attention.py (class MHA).
    Differences: the causal mask is -inf where the official code adds -10000 (equal in fp32).
    """

    def __init__(self, d: int, n_head: int = 1):
        super().__init__()
        self.n_head = n_head
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        B, L, d = x.shape
        h = self.n_head
        q, k, v = self.Wqkv(x).view(B, L, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, L, d/h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)                       # (B, h, L, L)
        future = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, L, d)                             # (B, L, d)
        return self.out_proj(y)


class ImplicitLongConv(nn.Module):
    """conv(u) = K * u + u with a length-L filter K[:, j] = MLP(z_j) (Linear(3,16), ReLU, Linear(16,d)).
    Official implementation: HazyResearch/zoology, zoology/mixers/convolution.py (ImplicitLongConvolution)."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("z", filter_time_grid()[0], persistent=False)  # fixed input grid
        self.mlp = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, d))

    def forward(self, u):                                   # u: (B, L, d)
        k = self.mlp(self.z[:u.shape[1]]).T                 # (d, L)
        return causal_long_conv(u, k) + u


class BaseConv(nn.Module):
    """BaseConv: a convolution gated by a linear map, with its own skip,
        y = conv(u) ⊙ (W u + b) + u,
    where conv is a short causal conv (width k, with bias) or, for width None, an implicit long conv.
    Official implementation: aryamanarora/zoology, zoology/mixers/base_conv.py (BaseConv).
    """

    def __init__(self, d: int, width: Optional[int]):
        super().__init__()
        self.projection = nn.Linear(d, d)
        self.conv = CausalConv1d(d, width) if width else ImplicitLongConv(d)

    def forward(self, u):
        return self.conv(u) * self.projection(u) + u


class TaylorLinearAttention(nn.Module):
    """Based's linear attention: softmax attention with exp replaced by its 2nd-order Taylor series.

    With f = feature_dim = 8 and the feature map  φ(x) = [1, x / f^(1/4), vec(x xᵀ) / (√2 √f)]  (1 + f + f²
    dims), φ(q)·φ(k) = 1 + s + s²/2 where s = q·k / √f, and causal normalised linear attention is
        y_n = Σ_{m<=n} (φ(q_n)·φ(k_m)) v_m  /  (Σ_{m<=n} φ(q_n)·φ(k_m) + ε).
    A recurrent model would keep the running sums S = Σ φ(k) vᵀ and z = Σ φ(k) (a fixed-size state);
    for training we use the identical "quadratic" view and form 1 + s + s²/2 directly.
    Official implementation: aryamanarora/zoology, zoology/mixers/based.py (Based, TaylorExp).
    """

    def __init__(self, d: int, feature_dim: int = 8, eps: float = 1e-12):
        super().__init__()
        self.feature_dim, self.eps = feature_dim, eps
        self.proj_q = nn.Linear(d, feature_dim, bias=False)
        self.proj_k = nn.Linear(d, feature_dim, bias=False)
        self.proj_v = nn.Linear(d, d, bias=False)
        self.proj_o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        L = x.shape[1]
        q, k, v = self.proj_q(x), self.proj_k(x), self.proj_v(x)          # (B, L, f), (B, L, f), (B, L, d)
        s = q @ k.transpose(1, 2) / math.sqrt(self.feature_dim)            # (B, L, L)
        A = (1 + s + s * s / 2).tril()                                     # φ(q_n)·φ(k_m) for m <= n
        y = (A @ v) / (A.sum(-1, keepdim=True) + self.eps)                 # (B, L, d)
        return self.proj_o(y)


class H3(nn.Module):
    """H3 ("Hungry Hungry Hippos") with d_state N = 1024 and head_dim p = 2 (H = d/p heads).

        k' = K_shift * k + D_k ⊙ k                   shift SSM: a learned causal FIR filter on k
        kv[i, j, h] = k'[h p + i] · v[h p + j]       per-head outer product
        Y = K_diag,h * kv + D_h kv                   diagonal SSM (S4D), one kernel per head
        out[j, h] = Σ_i q[h p + i] · Y[i, j, h]      read-out; channel j H + h, then output_linear

    The shift kernel is the cross-correlation of two learned vectors, K_shift[c, l] = Σ_j B_cj C_c,j+l
    (B starts as e_1, so at init K_shift = C). The S4D kernel has N/2 complex modes per head,
    bilinear discretisation:  dA = (1 + ΔA/2)/(1 - ΔA/2),  C' = B C Δ/(1 - ΔA/2),  K[l] = 2 Re Σ_n C'_n dA_n^l.
    Official implementation: aryamanarora/zoology, zoology/mixers/h3/h3.py, ss_kernel_shift.py,
    ss_kernel_diag.py ("diag-lin" init: A = -1/2 + iπn, B = 1, C ~ complex normal, Δ ~ logU[1e-3, 1e-1]).
    Differences: both long convolutions are Toeplitz matmuls instead of FFTs (the same maths).
    """

    def __init__(self, d: int, d_state: int = L_MAX, head_dim: int = 2):
        super().__init__()
        self.p, self.H, N = head_dim, d // head_dim, d_state
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        # shift SSM on k: B_shift = e_1, C_shift ~ U(±1/√N) (kaiming-uniform on (d, 1, N)), D_k ~ N(0, 1)
        self.shift_B = nn.Parameter(F.one_hot(torch.zeros(d, dtype=torch.long), N).float())  # (d, N)
        self.shift_C = nn.Parameter(torch.empty(d, N).uniform_(-1 / math.sqrt(N), 1 / math.sqrt(N)))
        self.shift_D = nn.Parameter(torch.randn(d))
        # diagonal SSM: N/2 complex modes per head; complex tensors are stored as (..., 2) real pairs
        H, M = self.H, N // 2
        self.log_dt = nn.Parameter(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.inv_A_real = nn.Parameter(torch.full((H, M), math.log(0.5)))         # Re A = -exp(.)
        self.A_imag = nn.Parameter(math.pi * torch.arange(M).float().repeat(H, 1))
        self.B = nn.Parameter(torch.view_as_real(torch.ones(H, M, dtype=torch.cfloat)).clone())
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, M, dtype=torch.cfloat)).clone())
        self.D = nn.Parameter(torch.randn(H))
        self.output_linear = nn.Linear(d, d)

    def shift_kernel(self, L):  # (d, L): K[c, l] = Σ_j B[c, j] C[c, j + l], a cross-correlation (by FFT)
        N = self.shift_B.shape[1]      # zero-padded to 2N, so that the FFT's wrap-around adds nothing
        spectrum = torch.fft.rfft(self.shift_B, n=2 * N).conj() * torch.fft.rfft(self.shift_C, n=2 * N)
        return F.pad(torch.fft.irfft(spectrum, n=2 * N)[:, :min(L, N)], (0, max(0, L - N)))  # 0 past lag N-1

    def diag_kernel(self, L):   # (H, L), S4D with bilinear discretisation
        dt = self.log_dt.exp()[:, None]                                         # (H, 1)
        A = torch.complex(-self.inv_A_real.exp(), self.A_imag)                  # (H, N/2)
        dtA = A * dt
        dA = (1 + dtA / 2) / (1 - dtA / 2)
        C = torch.view_as_complex(self.B) * torch.view_as_complex(self.C) * dt / (1 - dtA / 2)
        # The Vandermonde sum, without an (H, N/2, L) table of powers: write l = s j + i with s ≈ √L,
        # so dA^l = dA^(s j) dA^i and K[s j + i] = 2 Re Σ_n (C_n dA_n^(s j)) dA_n^i, one small matmul
        # per head over two tables of √L powers each. Powers are |dA|^l (cos lθ + i sin lθ), θ = arg
        # dA, in real arithmetic: complex exp and matmul are many times slower on a CPU.
        s = math.isqrt(L - 1) + 1
        J = -(-L // s)
        log_r, theta = dA.abs().log()[..., None], dA.angle()[..., None]          # (H, N/2, 1)

        def powers(exponents):  # dA^l for each l in exponents: real and imaginary parts (H, N/2, len)
            mag, ang = torch.exp(exponents * log_r), exponents * theta
            return mag * torch.cos(ang), mag * torch.sin(ang)
        small_re, small_im = powers(torch.arange(s, device=dt.device))           # dA^i, i < s
        big_re, big_im = powers(s * torch.arange(J, device=dt.device))           # dA^(s j), j < J
        Cr, Ci = C.real[..., None], C.imag[..., None]
        X_re, X_im = Cr * big_re - Ci * big_im, Cr * big_im + Ci * big_re        # C dA^(s j)
        K = 2 * (X_re.transpose(1, 2) @ small_re - X_im.transpose(1, 2) @ small_im)  # (H, J, s)
        return K.flatten(1)[:, :L]

    def forward(self, u):
        B, L, d = u.shape
        p, H = self.p, self.H
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)                # (B, L, d) each
        k = causal_long_conv(k, self.shift_kernel(L)) + self.shift_D * k
        # heads last and contiguous: with p = 2 innermost, every elementwise op below would crawl
        q, k, v = (x.view(B, L, H, p).transpose(2, 3).contiguous() for x in (q, k, v))  # (B, L, p, H)
        kv = k[:, :, :, None] * v[:, :, None]                                   # (B, L, p_i, p_j, H)
        # one S4D kernel per head, shared by its p x p products: fold (i, j) into the batch
        kv_h = kv.permute(0, 2, 3, 1, 4).reshape(B * p * p, L, H)              # (B p p, L, H)
        Y = causal_long_conv(kv_h, self.diag_kernel(L)).view(B, p, p, L, H).permute(0, 3, 1, 2, 4)
        Y = Y + self.D * kv                                                     # (B, L, p_i, p_j, H)
        y = (q[:, :, :, None] * Y).sum(2)                                       # (B, L, p_j, H)
        return self.output_linear(y.reshape(B, L, d))                           # channel j H + h


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter h (d, L): an MLP of the time grid z with sine activations,
        h[:, j] = Linear(64, d)(Sin(Linear(64, 64)(Sin(Linear(64, 64)(Sin(Linear(3, 64)(z_j)))))))
    with Sin(x) = sin(ω x) (one ω ∈ R^64 shared by the three, init 1), then exponentially decayed:
    h[c, j] *= exp(-t_j |δ_c|), δ = linspace(ln(0.01)/1.5, ln(0.01)/0.3, d).
    The grid z is trainable, as in the official runs (its tiny-LR hint was ignored there).
    """

    def __init__(self, d: int, order: int = 64):
        super().__init__()
        z, t = filter_time_grid()
        self.z = nn.Parameter(z)
        self.register_buffer("t", t, persistent=False)
        self.register_buffer("deltas", torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, d),
                             persistent=False)
        self.omega = nn.Parameter(torch.ones(order))
        self.lin = nn.ModuleList([nn.Linear(3, order), nn.Linear(order, order), nn.Linear(order, order)])
        self.out = nn.Linear(order, d, bias=False)

    def forward(self, L):
        h = self.z[:L]                                           # (L, 3)
        for lin in self.lin:
            h = torch.sin(self.omega * lin(h))                   # (L, order)
        h = self.out(h) * torch.exp(-self.t[:L, None] * self.deltas.abs())  # (L, d)
        return h.T                                               # (d, L)


class Hyena(nn.Module):
    """Hyena of order 2 (1 head):
        x1, x2, v = split(short_conv_3(in_proj(u)))         width-3 causal conv on all 3d channels
        v = x2 ⊙ (h * (x1 ⊙ v) + D ⊙ (x1 ⊙ v))               implicit long filter h, skip D
        y = out_proj(v)
    Official implementation: aryamanarora/zoology, zoology/mixers/hyena.py (Hyena, Filter).
    Quirk: the official runs pass bias=False into the Filter, which multiplies D by 0, so the paper's
    Hyena has no D skip; d_skip=False (--no-hyena-d-skip) reproduces that, the default keeps it.
    """

    def __init__(self, d: int, d_skip: bool = True, filter_order: int = 64):
        super().__init__()
        self.in_proj = nn.Linear(d, 3 * d)
        self.short_filter = CausalConv1d(3 * d, 3)
        self.filter = HyenaFilter(d, filter_order)
        self.D = nn.Parameter(torch.randn(d))
        self.d_skip = d_skip
        self.out_proj = nn.Linear(d, d)

    def forward(self, u):
        x1, x2, v = self.short_filter(self.in_proj(u)).chunk(3, dim=-1)    # (B, L, d) each
        v = v * x1
        v = causal_long_conv(v, self.filter(u.shape[1])) + self.d_skip * self.D * v
        return self.out_proj(v * x2)


# 2c. The selective scan: Mamba's recurrence, behind one function with swappable backends.

def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   backend="auto"):
    """Mamba's selective scan, with the signature, shapes and semantics of mamba-ssm's
    selective_scan_ref (mamba_ssm/ops/selective_scan_interface.py), so code written for it runs here:

        u, delta, z: (b, d, l)    A: (d, n)    B, C: (b, n, l)    D, delta_bias: (d,)    -> (b, d, l)

        Δ = softplus(delta + delta_bias)   (softplus only if delta_softplus)
        h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t u_t B_t          h_{-1} = 0, state (b, d, n)
        y_t = C_t · h_t + D u_t
        out = y ⊙ SiLU(z)                                  (if z is given)

    backend: "ref" is the readable loop below (the oracle); "ext" the compiled C++/CUDA kernel of
    scan_ext/ (an error if it cannot be built); "auto" the kernel if it builds, else the loop.
    """
    if backend not in SCAN_BACKENDS:
        raise ValueError(f"selective_scan: unknown backend {backend!r}; choose from {', '.join(SCAN_BACKENDS)}")
    if backend != "ref":
        try:
            ext = scan_extension()
            if u.is_cuda and not ext.has_cuda():
                raise RuntimeError("it was built without its CUDA kernel (no nvcc, or torch without CUDA)")
        except RuntimeError as e:
            if backend == "ext":
                raise RuntimeError(f"scan backend 'ext' is unavailable: {e}") from None
            warn_once(f"the scan extension is unavailable ({e}); using the reference loop")
        else:
            return SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


SCAN_BACKENDS = ("auto", "ext", "ref")
_scan_ext = None   # the compiled module, or the exception its build raised (not retried)


def scan_extension():
    """Compile scan_ext/ with torch.utils.cpp_extension.load on first use (about a minute), or load
    the cached build (under ~/.cache/torch_extensions, outside the repository)."""
    global _scan_ext
    if _scan_ext is None:
        from torch.utils.cpp_extension import CUDA_HOME, load
        src = os.path.join(HERE, "scan_ext")
        cuda = torch.cuda.is_available() and CUDA_HOME is not None
        # -march=native code runs only on CPUs like this one: name the build after the CPU, so that
        # a cache shared with other machines never hands them a binary they cannot execute
        cpu = zlib.crc32(platform.processor().encode() + cpu_flags().encode())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _scan_ext = load(name=f"mech_scan{'_cuda' if cuda else ''}_{cpu:08x}",
                                 sources=[os.path.join(src, "selective_scan.cpp")]
                                 + ([os.path.join(src, "selective_scan_cuda.cu")] if cuda else []),
                                 extra_cflags=["-O3", "-fopenmp", "-ffast-math", "-march=native"]
                                 + (["-DWITH_CUDA"] if cuda else []),
                                 extra_ldflags=["-fopenmp"], extra_cuda_cflags=["-O3"], verbose=False)
        except Exception as e:  # a missing compiler, ninja or header: remember why
            _scan_ext = RuntimeError(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
    if isinstance(_scan_ext, Exception):
        raise _scan_ext
    return _scan_ext


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), or '' where /proc/cpuinfo does not exist."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


class SelectiveScanFn(torch.autograd.Function):
    """The extension's forward and backward as one autograd op. The kernel wants B and C as
    (b, l, n) contiguous: for Mamba, whose x_proj produces (B, L, N), the transposes are free."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus):
        dtype = u.dtype
        if dtype not in (torch.float32, torch.float64):  # the kernel computes in fp32, like upstream
            u, delta, A, B, C, D, z, delta_bias = (None if x is None else x.float()
                                                    for x in (u, delta, A, B, C, D, z, delta_bias))
        A, D, delta_bias = (None if x is None else x.contiguous() for x in (A, D, delta_bias))
        B, C = B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous()  # (b, l, n)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias)
        ctx.delta_softplus, ctx.dtype = delta_softplus, dtype
        return scan_extension().fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus).to(dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernel has no double backward
    def backward(ctx, dout):
        u, delta, A, B, C, D, z, delta_bias = ctx.saved_tensors
        grads = scan_extension().bwd(dout.to(u.dtype), u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus)
        du, ddelta, dA, dB, dC, dD, dz, dbias = (None if g is None else g.to(ctx.dtype) for g in grads)
        return du, ddelta, dA, dB.transpose(1, 2), dC.transpose(1, 2), dD, dz, dbias, None


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The scan as a loop over time, in fp32 (or fp64) whatever the input dtype. See selective_scan."""
    dtype = u.dtype
    up = lambda x: None if x is None else x.to(torch.promote_types(x.dtype, torch.float32))
    u, delta, A, B, C, D, z, delta_bias = map(up, (u, delta, A, B, C, D, z, delta_bias))
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)                                   # threshold 20, as upstream
    decay = torch.exp(delta[..., None] * A[:, None, :])             # (b, d, l, n): exp(Δ_t A)
    write = (delta * u)[..., None] * B.transpose(1, 2)[:, None]     # (b, d, l, n): Δ_t u_t B_t
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])             # (b, d, n)
    ys = []
    # unbind, not [:, :, t]: the backward of indexing builds a full-size zero tensor at every step
    for decay_t, write_t, C_t in zip(decay.unbind(2), write.unbind(2), C.unbind(2)):
        h = decay_t * h + write_t
        ys.append(torch.einsum("bdn,bn->bd", h, C_t))
    y = torch.stack(ys, dim=-1) if ys else u.new_zeros(u.shape)    # (b, d, l)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * F.silu(z)
    return y.to(dtype)


class Mamba(nn.Module):
    """Mamba (selective SSM), d_state N = 16, expand E = 2 (d_inner = 2d), dt_rank R = ceil(d/16):

        x, z = split(in_proj(u))                   (B, L, d_inner) each
        x = SiLU(conv(x))                          short causal conv of width d_conv (0 = none)
        δ, B, C = split(x_proj(x))                 (B, L, R), (B, L, N), (B, L, N)
        Δ = softplus(dt_proj(δ))                   (B, L, d_inner)
        y = selective_scan(x, Δ, A = -exp(A_log), B, C, D) ⊙ SiLU(z)
        out = out_proj(y)

    d_conv is the paper's ablation knob: 4 by default, 0 removes the conv (SiLU kept), 1 is a
    per-channel scale and bias. conv_in, conv_out (before SiLU) and act_out are identity modules:
    named places to read or patch the conv's input and output.
    Official implementation: state-spaces/mamba, mamba_ssm/modules/mamba_simple.py (Mamba, 2.2.4);
    conv ablations aryamanarora/tinylang, tinylang/model/arch/mamba.py.
    Differences: nn.Conv1d for every width, and no unused conv parameters when d_conv = 0.
    """

    def __init__(self, d: int, d_conv: int = 4, d_state: int = 16, expand: int = 2, scan: str = "auto",
                 dt_min: float = 1e-3, dt_max: float = 0.1):
        super().__init__()
        self.d_inner, self.d_state, self.dt_rank = expand * d, d_state, math.ceil(d / 16)
        self.scan = scan
        D_in, N, R = self.d_inner, d_state, self.dt_rank
        self.in_proj = nn.Linear(d, 2 * D_in, bias=False)
        self.conv_in, self.conv_out, self.act_out = nn.Identity(), nn.Identity(), nn.Identity()
        self.conv1d = short_conv(D_in, d_conv, bias=True)
        self.x_proj = nn.Linear(D_in, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, D_in, bias=True)
        self.out_proj = nn.Linear(D_in, d, bias=False)
        # Mamba's own init: Δ starts log-uniform in [dt_min, dt_max] (through softplus⁻¹ as the bias),
        # A is S4D-real (A_n = -(n+1)), D = 1. The generic re-init below must not touch dt_proj.bias.
        nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)
        dt = torch.exp(torch.rand(D_in) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=1e-4)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.dt_proj.bias._no_reinit = True
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1).float()).repeat(D_in, 1))  # (D_in, N)
        self.D = nn.Parameter(torch.ones(D_in))

    def forward(self, u):
        x, z = self.in_proj(u).chunk(2, dim=-1)                          # (B, L, D_in) each
        x = self.act_out(F.silu(self.conv_out(self.conv1d(self.conv_in(x)))))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = dt @ self.dt_proj.weight.T                                  # (B, L, D_in); bias in the scan
        A = -torch.exp(self.A_log)                                       # (D_in, N)
        y = selective_scan(x.transpose(1, 2), dt.transpose(1, 2), A, B.transpose(1, 2),
                           C.transpose(1, 2), self.D, z.transpose(1, 2), delta_bias=self.dt_proj.bias,
                           delta_softplus=True, backend=self.scan)       # (B, D_in, L)
        return self.out_proj(y.transpose(1, 2))                          # (B, L, d)


def delta_rule(q, k, v, beta):
    """The delta rule  S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ,  o_t = S_tᵀ q_t,  S_0 = 0,
    computed for the whole sequence at once. Writing S_t = Σ_{s<=t} k_s u_sᵀ, the values actually
    written are  u_t = β_t (v_t - Σ_{s<t} (k_t·k_s) u_s):  a unit lower-triangular linear system
    (I + tril(β k kᵀ, -1)) U = β V, solved exactly; then  o_t = Σ_{s<=t} (q_t·k_s) u_s.
    q, k: (..., L, d_k), v: (..., L, d_v), beta: (..., L) -> (..., L, d_v).
    This is FLA's chunked (WY) form with one chunk; the per-step loop is in the tests as the oracle.
    """
    L = q.shape[-2]
    ones = torch.ones(L, L, dtype=torch.bool, device=q.device)
    M = (beta[..., None] * (k @ k.transpose(-2, -1))).masked_fill(~ones.tril(-1), 0)  # (..., L, L)
    M = M + torch.eye(L, device=q.device, dtype=q.dtype)
    U = torch.linalg.solve_triangular(M, beta[..., None] * v, upper=False, unitriangular=True)
    return (q @ k.transpose(-2, -1)).masked_fill(~ones.tril(), 0) @ U


class DeltaNet(nn.Module):
    """DeltaNet (v3 of the paper): linear attention whose fast-weight state is edited by the delta rule.

        q, k, v = SiLU(conv(W_q x)), SiLU(conv(W_k x)), SiLU(conv(W_v x))   short convs, no bias
        q, k = q/‖q‖, k/‖k‖;   β = sigmoid(W_β x)                             per head
        o = delta_rule(q / √d_k, k, v, β);   y = o_proj(RMSNorm(o))

    Official implementation: fla-org/flash-linear-attention, fla/layers/delta_net.py (DeltaNet with
    its defaults: use_beta, short conv 4, silu q/k activation, l2 q/k norm, no gate).
    Differences: fp32 (the official v3 code casts to bf16 for Triton), an exact triangular solve
    instead of chunked Triton kernels.
    """

    def __init__(self, d: int, n_head: int = 1, d_conv: int = 4):
        super().__init__()
        self.n_head = n_head
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.b_proj = nn.Linear(d, n_head, bias=False)
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (short_conv(d, d_conv, bias=False) for _ in range(3))
        self.o_norm = nn.RMSNorm(d // n_head, eps=1e-5)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        B, L, d = x.shape
        h = self.n_head
        heads = lambda y: y.view(B, L, h, d // h).transpose(1, 2)          # (B, h, L, d/h)
        q = heads(F.silu(self.q_conv1d(self.q_proj(x))))
        k = heads(F.silu(self.k_conv1d(self.k_proj(x))))
        v = heads(F.silu(self.v_conv1d(self.v_proj(x))))
        q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)               # (B, h, L)
        o = delta_rule(q * (d // h) ** -0.5, k, v, beta)                    # (B, h, L, d/h)
        return self.o_proj(self.o_norm(o).transpose(1, 2).reshape(B, L, d))


# 2d. Blocks, the language model, initialisation, and the registry of architectures.

class Block(nn.Module):
    """A pre-norm residual block that maps the residual stream to the residual stream."""

    def __init__(self, d: int, mixer: nn.Module, mamba: bool):
        super().__init__()
        self.norm1 = nn.RMSNorm(d, eps=1e-5) if mamba else nn.LayerNorm(d)
        self.mixer = mixer
        self.norm2, self.mlp = (None, None) if mamba else (nn.LayerNorm(d), MLP(d))  # Mamba: no MLP

    def forward(self, x):                      # x: (B, L, d)
        x = x + self.mixer(self.norm1(x))      # sequence mixing
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))    # per-position MLP
        return x


# arch -> (cfg, layer index) -> mixer. The layer index matters only for the two hybrids, which
# alternate by layer exactly as zoology's Hybrid does: BaseConv is [short k=3, long, short, ...] and
# Based is [BaseConv short conv, Taylor linear attention, BaseConv, ...].
MIXERS = {
    "attention": lambda cfg, i: Attention(cfg.d_model, cfg.n_head),
    "base_conv": lambda cfg, i: BaseConv(cfg.d_model, None if cfg.long_conv or i % 2 else (cfg.d_conv or 3)),
    "based": lambda cfg, i: TaylorLinearAttention(cfg.d_model) if i % 2 else
                            BaseConv(cfg.d_model, None if cfg.long_conv else cfg.d_conv),
    "h3": lambda cfg, i: H3(cfg.d_model),
    "hyena": lambda cfg, i: Hyena(cfg.d_model, d_skip=cfg.hyena_d_skip),
    "mamba": lambda cfg, i: Mamba(cfg.d_model, d_conv=cfg.d_conv, scan=cfg.scan),
    "delta_net": lambda cfg, i: DeltaNet(cfg.d_model, cfg.n_head, d_conv=cfg.d_conv),
}
DEFAULT_DCONV = {"mamba": 4, "delta_net": 4, "based": 3}  # archs whose short conv --dconv sets


class LanguageModel(nn.Module):
    """ids (B, L) -> token embedding (+ position embedding) -> blocks -> LayerNorm -> logits,
    with the output head tied to the token embedding.
    Official implementation: aryamanarora/tinylang, tinylang/model/arch/zoology.py (residual-only blocks).
    """

    def __init__(self, cfg: "Config", vocab_size: int):
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(vocab_size, d)
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
        x = self.tok_emb(ids)                                                  # (B, L, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:ids.shape[1]]
        for block in self.blocks:
            x = block(x)                                                       # (B, L, d)
        if at is not None:
            x = x[torch.arange(len(x), device=x.device), at]                  # (B, d)
        return F.linear(self.norm_f(x), self.tok_emb.weight)                   # (B, [L,] V), tied head


def init_weights(model: nn.Module, cfg: "Config"):
    """The official initialisation (applied after the modules' own inits, like the official code).

    All but Mamba (zoology's _init_weights): Linear weights and embeddings ~ N(0, 0.02), Linear
    biases 0, and any weight *named* out_proj.weight, fc2.weight or output_linear.0.weight redrawn
    from N(0, 0.02/√(2 n_layer)). The rule goes by name, which is why H3's output_linear, Based's
    proj_o, BaseConv's projection and DeltaNet's o_proj are not rescaled: we keep the official names.
    Mamba (mamba_ssm's _init_weights): Linear weights keep PyTorch's default, biases 0 except
    dt_proj.bias, embeddings ~ N(0, 0.02), out_proj.weight kaiming-uniform / √n_layer.
    """
    mamba = cfg.arch == "mamba"
    for m in model.modules():
        if isinstance(m, nn.Linear):
            if not mamba:
                nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None and not getattr(m.bias, "_no_reinit", False):
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
    for name, p in model.named_parameters():
        if mamba and name.endswith("out_proj.weight"):
            nn.init.kaiming_uniform_(p, a=math.sqrt(5))
            with torch.no_grad():
                p /= math.sqrt(cfg.n_layer)
        elif not mamba and name.endswith(("out_proj.weight", "fc2.weight", "output_linear.0.weight")):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 3. Training
# ─────────────────────────────────────────────────────────────────────────────────────────────

def opt(default, help, flag=None):
    """A Config field with its --help text (and, if it differs from the field name, its flag)."""
    return field(default=default, metadata=dict(help=help, flag=flag))


@dataclass
class Config:
    """Everything that defines a run. Each field is a command-line flag (--d-model for d_model, ...).
    The official code's quirks are flags whose default follows the paper's intent (PAPER.md §11)."""
    # what to train
    task: str = opt("ar", "the task: " + ", ".join(TASKS))
    arch: str = opt("attention", "the architecture: " + ", ".join(MIXERS))
    d_model: int = opt(64, "model width d (paper grid: 16, 32, 64, 128, 256)")
    n_layer: int = opt(2, "number of blocks (the paper: 2; appendix: 1 and 3)", "--layers")
    n_head: int = opt(1, "attention / DeltaNet heads (the paper: 1)", "--heads")
    pos_emb: Optional[bool] = opt(None, "learned absolute position embedding (default: on for attention only)")
    d_conv: Optional[int] = opt(None, "short-conv width of mamba, delta_net (default 4), based's BaseConv layer "
                                      "(default 3) and base_conv's short layers (default 3); 0 = no conv", "--dconv")
    long_conv: bool = opt(False, "replace based's (or base_conv's) short conv by the implicit long conv")
    hyena_d_skip: bool = opt(True, "Hyena's D skip term; the official runs had it zeroed by a bug (use --no-...)")
    value_corruption: str = opt("value", "interventions: a corrupted Value becomes another value (the paper's "
                                         "intent) or, as the official code does, a key")
    scan: str = opt("auto", "Mamba's selective-scan backend: ext (scan_ext/, compiled on first use), ref "
                            "(the PyTorch loop) or auto (ext if it builds, else ref)")
    # the data
    num_kv: int = opt(8192, "AR: number of key + value tokens (keys and values get half each)")
    n_pairs: int = opt(16, "AR: key-value pairs per document")
    atr: str = opt("easy", "ATR setting: easy (Lmax 5, |Σ| 20 terminals), medium (Lmax 10, |Σ| 20) or 8192 "
                           "(Lmax 5, |Σ| 8192)")
    held_out: float = opt(0.0, "ATR: fraction of (parent, child) label pairs never asked in training; the test "
                               "documents ask only those (the paper's generalisation runs: 0.2)")
    grammar_seed: int = opt(42, "ATR: seed of the grammar (42 gives the official grammars)")
    n_train: int = opt(100_032, "training documents, generated once and replayed in order every epoch")
    fresh_data: bool = opt(False, "sample a fresh batch every step instead of replaying the fixed training set")
    bucket: int = opt(0, "batch the fixed training set's documents by length within windows of this many "
                         "batches, in a shuffled order (0 = off, the paper): less padding, faster ATR")
    n_eval: int = opt(320, "test documents evaluated (the paper: the first 320)")
    # optimisation
    steps: Optional[int] = opt(None, "optimizer steps (default: epochs x n_train / batch_size)")
    epochs: int = opt(16, "passes over the training set, if --steps is not given")
    batch_size: int = opt(32, "training batch size")
    lr: float = opt(1e-3, "peak learning rate (paper grid: 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)")
    warmup_frac: float = opt(0.1, "fraction of the steps spent in linear warmup")
    schedule: str = opt("cosine", "after warmup: cosine or linear decay to 0 over the remaining steps, or wsd "
                                  "(warmup-stable-decay: hold the peak, then decay linearly to 0 over the last decay_frac)")
    decay_frac: float = opt(0.2, "wsd: fraction of the steps spent decaying at the end")
    weight_decay: float = opt(0.0, "AdamW weight decay (the paper: 0)")
    eval_every: int = opt(500, "steps between evaluations on the test documents")
    seed: int = opt(42, "seed for the data and the initial weights")

    def __post_init__(self):
        if self.pos_emb is None:
            self.pos_emb = self.arch == "attention"
        if self.d_conv is None:
            self.d_conv = DEFAULT_DCONV.get(self.arch)
        check(self)

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.epochs * (self.n_train // self.batch_size)


def check(cfg: Config):
    """Reject bad values with a one-line message that names the value and what is allowed."""
    def need(ok, msg):
        if not ok:
            raise ValueError(msg)
    need(cfg.task in TASKS, f"unknown task {cfg.task!r}; choose from {', '.join(TASKS)}")
    need(cfg.arch in MIXERS, f"unknown arch {cfg.arch!r}; choose from {', '.join(MIXERS)}")
    need(cfg.bucket >= 0, f"bucket must be >= 0, got {cfg.bucket}")
    for name in ("d_model", "n_layer", "n_head", "batch_size", "n_eval", "eval_every", "epochs"):
        need(getattr(cfg, name) >= 1, f"{name} must be >= 1, got {getattr(cfg, name)}")
    need(cfg.d_model % cfg.n_head == 0, f"d_model {cfg.d_model} is not divisible by n_head {cfg.n_head}")
    need(cfg.n_head == 1 or cfg.arch in ("attention", "delta_net"),
         f"n_head {cfg.n_head}: only attention and delta_net have heads (use 1 for {cfg.arch})")
    need(cfg.arch != "h3" or cfg.d_model % 2 == 0, f"d_model {cfg.d_model}: h3 needs an even width (head_dim 2)")
    if cfg.d_conv is not None:
        need(cfg.arch in DEFAULT_DCONV or cfg.arch == "base_conv",
             f"--dconv {cfg.d_conv} does not apply to {cfg.arch}; it applies to {', '.join(DEFAULT_DCONV)}, base_conv")
        need(cfg.d_conv >= (1 if cfg.arch in ("based", "base_conv") else 0),
             f"d_conv must be >= 0 (>= 1 for based and base_conv), got {cfg.d_conv}")
    need(not cfg.long_conv or cfg.arch in ("based", "base_conv"),
         f"--long-conv applies to based and base_conv, not {cfg.arch}")
    need(cfg.value_corruption in ("value", "key"),
         f"unknown value_corruption {cfg.value_corruption!r}; choose from value, key")
    need(cfg.scan in SCAN_BACKENDS, f"unknown scan backend {cfg.scan!r}; choose from {', '.join(SCAN_BACKENDS)}")
    need(cfg.atr in ATR_SETTINGS, f"unknown ATR setting {cfg.atr!r}; choose from {', '.join(ATR_SETTINGS)}")
    need(0 <= cfg.held_out < 1, f"held_out must be in [0, 1), got {cfg.held_out}")
    need(cfg.held_out == 0 or cfg.task == "atr", f"--held-out {cfg.held_out} applies to --task atr only")
    need(cfg.num_kv >= 2 and cfg.num_kv % 2 == 0, f"num_kv must be an even number >= 2, got {cfg.num_kv}")
    need(1 <= cfg.n_pairs <= cfg.num_kv // 2,
         f"n_pairs {cfg.n_pairs} must be between 1 and num_kv/2 = {cfg.num_kv // 2} (the number of keys)")
    need(2 * cfg.n_pairs + 5 <= L_MAX, f"n_pairs {cfg.n_pairs} makes documents longer than {L_MAX} tokens")
    need(cfg.n_train >= cfg.batch_size or cfg.fresh_data,
         f"n_train {cfg.n_train} is smaller than one batch ({cfg.batch_size})")
    need(cfg.steps is None or cfg.steps >= 1, f"steps must be >= 1, got {cfg.steps}")
    need(cfg.lr > 0, f"lr must be > 0, got {cfg.lr}")
    need(0 <= cfg.warmup_frac < 1, f"warmup_frac must be in [0, 1), got {cfg.warmup_frac}")
    need(cfg.schedule in ("cosine", "linear", "wsd"),
         f"unknown schedule {cfg.schedule!r}; choose from cosine, linear, wsd")
    need(0 < cfg.decay_frac <= 1 - cfg.warmup_frac,
         f"decay_frac must be in (0, 1 - warmup_frac], got {cfg.decay_frac}")
    need(cfg.weight_decay >= 0, f"weight_decay must be >= 0, got {cfg.weight_decay}")


def build_model(cfg: Config, vocab_size: int) -> LanguageModel:
    torch.manual_seed(cfg.seed)
    return LanguageModel(cfg, vocab_size)


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup over int(warmup_frac * total) steps, then cosine (or linear) decay to 0, as
    HuggingFace's get_cosine_schedule_with_warmup (the paper's): the first update has learning rate 0.
    "wsd" holds the peak after warmup and decays linearly to 0 over the last decay_frac of the steps."""
    total = cfg.total_steps
    warm = int(cfg.warmup_frac * total)
    if step < warm:
        return cfg.lr * step / warm
    if cfg.schedule == "wsd":
        decay = int(cfg.decay_frac * total)
        return cfg.lr * min(1.0, (total - step) / max(1, decay))
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
                    rng: np.random.Generator) -> np.ndarray:
    """(n_batches, batch_size) indices of the training documents in each batch. Without buckets, the
    paper's order: batch i holds documents i*batch_size ... (i+1)*batch_size - 1. With buckets, each
    window of `bucket` batches is re-cut after sorting its documents by length, and those batches come
    in a random order: every document is still seen once per epoch, but batches pad far less (ATR easy:
    a mean padded length of 23 instead of 69 tokens with windows of 16 batches)."""
    batches = np.arange(n_batches * batch_size).reshape(n_batches, batch_size)
    for w in range(0, n_batches, bucket or n_batches):
        if bucket:
            docs = batches[w:w + bucket].ravel()
            docs = docs[np.argsort(length[docs], kind="stable")].reshape(-1, batch_size)
            batches[w:w + bucket] = docs[rng.permutation(len(docs))]
    return batches


class Diverged(RuntimeError):
    pass


def config_id(cfg: Config) -> str:
    return hashlib.sha1(json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()).hexdigest()[:8]


def default_out(cfg: Config) -> str:
    conv = f"_dconv{cfg.d_conv}" if cfg.arch in DEFAULT_DCONV else ""
    task = cfg.task + (f"-{cfg.atr}" + (f"-heldout{cfg.held_out:g}" if cfg.held_out else "") if cfg.task == "atr" else "")
    return os.path.join("runs", f"{task}_{cfg.arch}{conv}_d{cfg.d_model}_lr{cfg.lr:g}_s{cfg.seed}_{config_id(cfg)}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ValueError(f"unknown device {device!r}; choose from auto, cpu, cuda, cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this torch build sees no CUDA device; use --device cpu or auto")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return torch.device(device)


def train(cfg: Config, out: Optional[str] = None, device: str = "auto", log=print,
          checkpoint_every_s: float = 60.0) -> dict:
    """Train one model; write config.json, metrics.json and model.pt to `out` (atomically).

    The training set is generated once and replayed in the same order every epoch (the paper's
    protocol; --fresh-data samples every batch anew). Batch s is a pure function of (seed, s), and a
    checkpoint is kept while training, so an interrupted run resumes exactly where it stopped.
    Returns the trained model and the metrics dict (also in metrics.json).
    """
    dev = resolve_device(device)
    if out is not None:
        os.makedirs(out, exist_ok=True)
        write_json(os.path.join(out, "config.json"), dataclasses.asdict(cfg))
    task = make_task(cfg)
    model = build_model(cfg, task.vocab_size).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.weight_decay, fused=dev.type in ("cpu", "cuda"))
    test = task.sample(cfg.n_eval, rng_for(cfg.seed, "test"), split="test").to(dev)
    # with held-out pairs, the test set asks only those; dev documents come from the training distribution
    dev_set = task.sample(cfg.n_eval, rng_for(cfg.seed, "dev"), split="dev").to(dev) if cfg.held_out else None
    per_epoch, bs = cfg.n_train // cfg.batch_size, cfg.batch_size
    if not cfg.fresh_data:  # one padded tensor per batch: ATR's rare long sentences pad only their own
        train_set = task.sample(cfg.n_train, rng_for(cfg.seed, "train"))
        batches = batch_documents(train_set.pos["answer"].numpy(), per_epoch, bs, cfg.bucket,
                                  rng_for(cfg.seed, "buckets"))
        train_batches = [train_set[torch.from_numpy(i)].trim() for i in batches]
        del train_set

    def batch_at(step):
        if cfg.fresh_data:
            return task.sample(bs, rng_for(cfg.seed, f"train-step-{step}")).to(dev)
        return train_batches[step % per_epoch].to(dev)

    total, start, curve, elapsed = cfg.total_steps, 0, [], 0.0
    ckpt_path = out and os.path.join(out, "checkpoint.pt")
    if ckpt_path and os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=dev)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start, curve, elapsed = ckpt["step"], ckpt["curve"], ckpt["elapsed"]
        log(f"resuming {out} at step {start}")

    n_params = sum(p.numel() for p in model.parameters())
    log(f"{cfg.arch} on {cfg.task}: d={cfg.d_model}, {cfg.n_layer} layers, {n_params:,} parameters, "
        f"{total:,} steps, lr {cfg.lr:g}, {dev.type}, {torch.get_num_threads()} threads")
    model.train()
    t_start, last_save, since = time.time(), time.time(), start
    loss_sum = torch.zeros((), device=dev)
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
        if done % cfg.eval_every and done != total:
            continue
        train_loss = loss_sum.item() / (done - since)
        if not math.isfinite(train_loss):
            raise Diverged(f"the training loss became {train_loss} by step {done}; try a lower --lr than {cfg.lr:g}")
        loss_sum.zero_()
        since = done
        ev = evaluate(model, test)
        run_time = time.time() - t_start
        rate = (done - start) / run_time
        curve.append(dict(step=done, train_loss=round(train_loss, 5), test_loss=round(ev["loss"], 5),
                          accuracy=ev["accuracy"], time_s=round(elapsed + run_time, 2)))
        if dev_set is not None:
            curve[-1]["dev_accuracy"] = evaluate(model, dev_set)["accuracy"]
        if ckpt_path and done < total and time.time() - last_save >= checkpoint_every_s:
            state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), step=done,
                         curve=curve, elapsed=elapsed + run_time)
            atomic_write(ckpt_path, lambda tmp: torch.save(state, tmp))
            last_save = time.time()
        dev_acc = f" (dev {curve[-1]['dev_accuracy']:.3f})" if dev_set is not None else ""
        log(f"step {done:>7,}/{total:,} | loss {train_loss:.4f} | test acc {ev['accuracy']:.3f}{dev_acc} | "
            f"{rate:5.1f} steps/s | ETA {(total - done) / rate / 60:5.1f} min")

    run_time = time.time() - t_start
    final = curve[-1]  # the loop always evaluates after the last step
    metrics = dict(accuracy=final["accuracy"], test_loss=final["test_loss"], steps=total,
                   **({"dev_accuracy": final["dev_accuracy"]} if dev_set is not None else {}),
                   wall_time_s=round(elapsed + run_time, 2), steps_per_s=round((total - start) / run_time, 2),
                   n_params=n_params, threads=torch.get_num_threads(), device=dev.type,
                   torch=torch.__version__, curve=curve)
    if out is not None:
        atomic_write(os.path.join(out, "model.pt"), lambda tmp: torch.save(model.state_dict(), tmp))
        write_json(os.path.join(out, "metrics.json"), metrics)
        if os.path.exists(ckpt_path):
            os.remove(ckpt_path)
    return model, metrics


def load_run(path: str, device: str = "cpu"):
    """(model, cfg) of a finished run folder, for notebooks: model, cfg = mech.load_run('runs/...')."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = Config(**json.load(f))
    model = build_model(cfg, make_task(cfg).vocab_size)
    model.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location=device))
    return model.to(device).eval(), cfg


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 4. Interventions: the mechanistic evaluation
# ─────────────────────────────────────────────────────────────────────────────────────────────
# An interchange intervention asks where the information that decides the answer lives. Corrupt
# one token of the document (the Key: replace it by another key), so that the model no longer
# knows which value to return; run the corrupted document, but at one site (e.g. the residual
# stream entering layer l) and one position, put back the activation from the clean run; see how
# much of the answer's probability at the Query comes back:
#
#     Attrib = (mean p_patched - mean p_corrupted) / (mean p_clean - mean p_corrupted)
#
# (a ratio of means over the evaluation documents, as the paper computes it). At the input of the
# last layer of a 2-layer model, Attrib@Value ≈ 1 means layer 0 already wrote "this value follows
# that key" at the Value position, and the last layer matches the Query against it: induction.
# Attrib@Query ≈ 1 means layer 0 already retrieved the answer at the last position; Attrib@Key ≈ 1
# that the last layer itself reads the key's position.
# Official implementation: aryamanarora/tinylang, tinylang/eval/interchange.py (with pyvene).

SITES = {  # site -> (module inside blocks[l], hook on its input "in" or its output "out")
    "block_input": ("", "in"),            # the residual stream entering block l
    "block_output": ("", "out"),          # ... leaving it (= block_input of l+1)
    "mixer_input": ("mixer", "in"),       # the normed input of the sequence mixer
    "mixer_output": ("mixer", "out"),     # the mixer's output, before the residual add
    "mlp_input": ("mlp", "in"),
    "mlp_output": ("mlp", "out"),
    "conv_output": ("mixer.conv_out", "out"),  # Mamba: its short conv's output, before SiLU (d_inner wide)
}
POSITIONS = ("key", "value", "value+1", "value+2", "divider", "query")  # value+1 is AR's "next key"
MAIN = ("block_input", "key")  # the paper's main setting: the last layer's input, Key corrupted
VERDICT_MIN_EFFECT = 0.1  # mean p_clean - mean p_corrupted below this: the model did not learn the task
VERDICT_DOMINANT = 0.6    # an Attrib this high, with the others below 1 - it, names the mechanism


def positions(data: Examples, name: str) -> torch.Tensor:
    """(n,) positions of a named place; "value+k" counts k tokens on from the Value."""
    base, _, k = name.partition("+")
    return data.pos[base] + (int(k) if k else 0)


def sites_of(model: LanguageModel) -> list:
    """The (site, layer) pairs this model has: no MLP in Mamba blocks, a conv only in Mamba's."""
    have = []
    for layer, block in enumerate(model.blocks):
        for site, (path, _) in SITES.items():
            try:
                block.get_submodule(path)
            except AttributeError:  # e.g. a Mamba block's mlp (None), an attention mixer's conv_out
                continue
            if not (site == "conv_output" and isinstance(block.mixer.conv1d, nn.Identity)):  # d_conv = 0
                have.append((site, layer))
    return have


@contextlib.contextmanager
def intervene(model: LanguageModel, site: str, layer: int, fn):
    """Run the model with fn(activation) -> activation at (site, layer); the hook is always removed.
    Activations are (B, L, width) tensors; fn may read them (and return them unchanged) or edit a copy."""
    path, side = SITES[site]
    module = model.blocks[layer].get_submodule(path)
    if side == "in":
        handle = module.register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda m, args, out: fn(out))
    try:
        yield
    finally:
        handle.remove()


def patched(pos: torch.Tensor, values: torch.Tensor):
    """An intervention that writes values[b] (the clean activation) at position pos[b] of row b."""
    def fn(act):
        act = act.clone()
        act[torch.arange(len(act), device=act.device), pos] = values
        return act
    return fn


def p_answer(model: LanguageModel, data: Examples, ids=None) -> torch.Tensor:
    """(n,) probability of the correct answer at the Query position."""
    logits = model(data.ids if ids is None else ids, at=data.pos["query"])
    return logits.softmax(-1)[torch.arange(len(data), device=logits.device), data.answer]


def corrupt(task, data: Examples, what: str, rng: np.random.Generator, value_corruption: str = "value"):
    """A copy of the documents with the token at pos[what] replaced by another of its kind. The
    official code replaces a corrupted Value by a *key* token (PAPER.md Q2): value_corruption="key"."""
    ids = data.ids.clone()
    rows, pos = torch.arange(len(ids), device=ids.device), data.pos[what]
    kind = "key" if what == "key" or value_corruption == "key" else "value"
    ids[rows, pos] = task.other_token(kind, ids[rows, pos], rng)
    return ids


@torch.no_grad()
def interchange(model: LanguageModel, task, data: Examples, corrupted: str = "key", seed: int = 0,
                value_corruption: str = "value", batch_size: int = 64) -> list:
    """Patch every (site, layer, position) of the corrupted run with the clean run's activation.
    Returns rows dict(corrupted, site, layer, position, p_clean, p_corr, p_patch, attrib) of means over
    the documents. One corruption per document, drawn from `seed`, is shared by all cells."""
    was_training = model.training
    model.eval()
    rng = rng_for(seed, f"corrupt-{corrupted}")
    grid = [(site, layer, p) for site, layer in sites_of(model) for p in POSITIONS]
    sums = {cell: 0.0 for cell in grid}
    clean_sum = corr_sum = 0.0
    for i in range(0, len(data), batch_size):
        batch = data[i:i + batch_size].trim()
        bad_ids = corrupt(task, batch, corrupted, rng, value_corruption)
        cache = {}

        def record(key):
            def fn(act):
                cache[key] = act
                return act
            return fn
        with contextlib.ExitStack() as stack:  # one clean run records every site
            for site, layer in sites_of(model):
                stack.enter_context(intervene(model, site, layer, record((site, layer))))
            clean_sum += p_answer(model, batch).sum().item()
        corr_sum += p_answer(model, batch, bad_ids).sum().item()
        rows = torch.arange(len(batch), device=batch.ids.device)
        for site, layer, p in grid:
            pos = positions(batch, p)
            with intervene(model, site, layer, patched(pos, cache[site, layer][rows, pos])):
                sums[site, layer, p] += p_answer(model, batch, bad_ids).sum().item()
    model.train(was_training)
    n = len(data)
    p_clean, p_corr = clean_sum / n, corr_sum / n
    effect = p_clean - p_corr
    return [dict(corrupted=corrupted, site=site, layer=layer, position=p, p_clean=p_clean, p_corr=p_corr,
                 p_patch=sums[site, layer, p] / n,
                 attrib=(sums[site, layer, p] / n - p_corr) / effect if effect != 0 else float("nan"))
            for site, layer, p in grid]


def main_setting(rows: list, n_layer: int, layer: int | None = None) -> dict:
    """Attrib at the paper's main setting: the last layer's block_input (or `layer`'s), Key corrupted."""
    site, corrupted = MAIN
    layer = n_layer - 1 if layer is None else layer
    return {r["position"]: r["attrib"] for r in rows
            if r["corrupted"] == corrupted and r["site"] == site and r["layer"] == layer}


def verdict(rows: list, n_layer: int) -> str:
    """The mechanism in words, from the main setting (thresholds VERDICT_*).

    With more than two layers the last layer's input can show @Query 1.00 for an induction model too
    (layer 1 already moved the answer from the Value to the Query), so the verdict reads the first
    layer whose input no longer holds the association at the Key; with two layers that is the last."""
    key_rows = [r for r in rows if r["corrupted"] == "key"]
    effect = key_rows[0]["p_clean"] - key_rows[0]["p_corr"]
    if effect < VERDICT_MIN_EFFECT:
        return (f"not learned: corrupting the Key moves p(answer) by only {effect:.3f} "
                f"(< {VERDICT_MIN_EFFECT}), too little to attribute")
    layer = next((l for l in range(1, n_layer) if main_setting(rows, n_layer, l)["key"] < VERDICT_DOMINANT),
                 n_layer - 1)
    a = main_setting(rows, n_layer, layer)
    where = "the last layer" if layer == n_layer - 1 else f"layer {layer}"
    names = {"value": f"induction: the key-value binding is stored at the Value position before {where}",
             "query": f"direct retrieval at the last position: the answer is computed at the Query before {where}",
             "key": "direct retrieval, late: the last layer reads the Key position itself"}
    best = max(names, key=lambda p: a[p])
    if a[best] >= VERDICT_DOMINANT and all(a[p] <= 1 - VERDICT_DOMINANT for p in names if p != best):
        return names[best]
    return "mixed: " + ", ".join(f"Attrib@{p.capitalize()} {a[p]:.2f}" for p in ("key", "value", "query"))


def mechanism_report(rows: list, n_layer: int) -> str:
    """The printed table: Attrib per site and layer (rows) and position (columns), Key corrupted."""
    lines = ["Attrib (Key corrupted; rows: site[layer], columns: the patched position)",
             f"{'':16s}" + "".join(f"{'@' + p:>10s}" for p in POSITIONS)]
    table = {}
    for r in rows:
        if r["corrupted"] == "key":
            table.setdefault((r["site"], r["layer"]), {})[r["position"]] = r["attrib"]
    for (site, layer), cells in table.items():
        mark = " <- main" if (site, layer) == (MAIN[0], n_layer - 1) else ""
        lines.append(f"{site + f'[{layer}]':16s}" + "".join(f"{cells[p]:10.3f}" for p in POSITIONS) + mark)
    first = next(r for r in rows if r["corrupted"] == "key")
    lines.append(f"p(answer): clean {first['p_clean']:.3f}, Key corrupted {first['p_corr']:.3f}")
    conv = {r["position"]: r["attrib"] for r in rows
            if r["corrupted"] == "key" and r["site"] == "conv_output" and r["layer"] == 0}
    if conv:
        lines.append(f"Mamba conv: patching layer 0's conv output restores Attrib {conv['value']:.2f} at the Value, "
                     f"{conv['value+1']:.2f} at Value+1 (v3: Mamba's induction lives in its short convolution)")
    lines.append("verdict: " + verdict(rows, n_layer))
    return "\n".join(lines)


def plot_mechanism(rows: list, path: str, title: str) -> None:
    """A heatmap per site: layers x positions, Attrib (Key corrupted), saved as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sites = list(dict.fromkeys(r["site"] for r in rows))
    layers = sorted({r["layer"] for r in rows})
    fig, axes = plt.subplots(1, len(sites), figsize=(2.6 * len(sites), 0.6 * len(layers) + 1.6), squeeze=False)
    for ax, site in zip(axes[0], sites):
        grid = np.full((len(layers), len(POSITIONS)), np.nan)
        for r in rows:
            if r["corrupted"] == "key" and r["site"] == site:
                grid[r["layer"], POSITIONS.index(r["position"])] = r["attrib"]
        ax.imshow(grid, vmin=-0.2, vmax=1.2, cmap="viridis", aspect="auto")
        for (y, x), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
        ax.set_title(site, fontsize=9)
        ax.set_xticks(range(len(POSITIONS)), ["@" + p for p in POSITIONS], rotation=60, fontsize=7)
        ax.set_yticks(range(len(layers)), [f"layer {l}" for l in layers], fontsize=7)
    fig.suptitle(title + "\nAttrib: share of p(answer) restored by patching the clean activation (Key corrupted)",
                 fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def analyse(model: LanguageModel, cfg: "Config") -> dict:
    """The mechanistic evaluation of a trained model on its test documents, Key and Value corrupted."""
    task = make_task(cfg)
    data = task.sample(cfg.n_eval, rng_for(cfg.seed, "test"), split="test").to(next(model.parameters()).device)
    rows = (interchange(model, task, data, "key", cfg.seed, cfg.value_corruption)
            + interchange(model, task, data, "value", cfg.seed, cfg.value_corruption))
    return dict(rows=rows, main=main_setting(rows, cfg.n_layer), verdict=verdict(rows, cfg.n_layer))


def analyse_run(out: str, model: LanguageModel, cfg: "Config", log=print) -> dict:
    """Analyse, print the table, and add it to the run folder: metrics.json and mechanism.png."""
    analysis = analyse(model, cfg)
    log(mechanism_report(analysis["rows"], cfg.n_layer))
    path = os.path.join(out, "metrics.json")
    with open(path) as f:
        metrics = json.load(f)
    metrics["interventions"] = analysis
    write_json(path, metrics)
    plot_mechanism(analysis["rows"], os.path.join(out, "mechanism.png"),
                   f"{cfg.arch} on {cfg.task}, d={cfg.d_model}, test accuracy {metrics['accuracy']:.3f}")
    return metrics


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 5. Experiments: the paper's sweeps, and the figures made from their results
# ─────────────────────────────────────────────────────────────────────────────────────────────
# A sweep is a list of runs and a run is a list of this file's flags, so one sweep runs here in
# parallel processes (--jobs), or anywhere else from the commands it prints (--print-commands): a
# SLURM array, GNU parallel, a cluster's queue. Runs are resumable: a finished run folder is skipped,
# an interrupted one continues from its checkpoint. --collect reads every run folder under a
# directory, whoever made it, and draws the figures.

WIDTHS = (16, 32, 64, 128, 256)                       # the paper's grid of d
LR5 = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)                  # its learning rates (PAPER.md §5)
LR7 = LR5 + (1e-2, 3e-2)
ARCHS = tuple(MIXERS)                                 # the paper's six, and DeltaNet (v3)

# sweep -> [(flags shared by a family of runs, the paper's learning rates for it)]
SWEEPS = {
    # R1: every architecture on AR (attention from the PE sweep with LR5, the others NoPE with LR7)
    "ar-main": [(dict(task="ar", arch=a), LR5 if a == "attention" else LR7) for a in ARCHS],
    # R3, R12: Mamba's short convolution, width 0 (none) to 4
    "ar-dconv": [(dict(task="ar", arch="mamba", d_conv=k), LR7) for k in range(5)],
    # R4: Based with its BaseConv kernel 1..4 or the long conv, and BaseConv with long convs only
    "ar-based-conv": [(dict(task="ar", arch="based", d_conv=k), LR5) for k in (1, 2, 3, 4)]
                     + [(dict(task="ar", arch=a, long_conv=True), LR5) for a in ("based", "base_conv")],
    # R2, R11: depth. 2 layers are ar-main's runs (the paper's 2-layer panel is R1); no 1-layer Based:
    # its one layer would be a BaseConv layer, the 1-layer BaseConv run
    "ar-layers": [(dict(task="ar", arch=a, n_layer=n), LR7) for n in (1, 3) for a in ARCHS
                  if (a, n) != ("based", 1)],
    # R6, R13: the three ATR settings
    "atr-main": [(dict(task="atr", atr=s, arch=a), LR5) for s in ATR_SETTINGS for a in ARCHS],
    # C7 (v3): Mamba with d_conv 0..4 on ATR easy
    "atr-mamba-dconv": [(dict(task="atr", atr="easy", arch="mamba", d_conv=k), LR7) for k in range(5)],
    # R5: Attention without its position embedding on ATR (the others are NoPE in atr-main already)
    "atr-attention-nope": [(dict(task="atr", atr=s, arch="attention", pos_emb=False), LR5) for s in ("easy", "medium")],
}
SCALES = ("cpu", "paper")
MIN_EFFECT = dict(ar=0.01, atr=0.1)  # the paper's filters for its mechanism plots: p_clean - p_corrupted


def sweep_runs(sweep: str, scale: str, seeds: int) -> list:
    """[(run name, flags)] of a sweep. scale "paper": every (d, lr) of the paper's grid with the paper
    protocol (its one seed, 42, or more with seeds > 1); scale "cpu": the calibrated CPU preset (its
    d and lr) with seeds 42, 43, ..."""
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; choose from {', '.join(SWEEPS)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    runs = []
    for flags, lrs in SWEEPS[sweep]:
        grid = [dict(d_model=d, lr=lr) for d in WIDTHS for lr in lrs] if scale == "paper" else [{}]
        for point in grid:
            for seed in range(42, 42 + seeds):
                run = dict(preset=scale, **flags, **point, seed=seed)
                runs.append((run_name(run), run))
    return runs


def run_name(run: dict) -> str:
    short = dict(d_conv="dconv", n_layer="layers", d_model="d", long_conv="long", pos_emb="pe", seed="s")
    parts = [(short[k] if v else "no" + short[k]) if isinstance(v, bool) else f"{short.get(k, '')}{v}"
             for k, v in run.items() if k != "preset"]
    return "_".join(p for p in parts if p)


def run_args(run: dict) -> list:
    """The command-line arguments of a run: dict(arch="mamba", d_conv=0, long_conv=True) ->
    ["--arch", "mamba", "--dconv", "0", "--long-conv"]."""
    flags = {f.name: f.metadata["flag"] or "--" + f.name.replace("_", "-") for f in dataclasses.fields(Config)}
    flags["preset"] = "--preset"
    args = []
    for k, v in run.items():
        if isinstance(v, bool):
            args.append(flags[k] if v else "--no-" + flags[k][2:])
        else:
            args += [flags[k], f"{v:g}" if isinstance(v, float) else str(v)]
    return args


def run_command(run: dict, out: str, python: str = "python", script: str = "mech.py") -> list:
    return [python, script, *run_args(run), "--out", out, "--quiet"]


def run_sweep(runs: list, root: str, jobs: int, log=print) -> None:
    """Run the runs that have no result yet in `jobs` local processes, splitting the CPU threads
    between them; each process writes its output to <run folder>/log.txt."""
    todo = [(name, run) for name, run in runs if not os.path.exists(os.path.join(root, name, "metrics.json"))]
    log(f"{len(runs) - len(todo)} of {len(runs)} runs already done; running {len(todo)} in {jobs} processes")
    threads = max(1, (os.cpu_count() or 1) // jobs)

    def one(item):
        name, run = item
        out = os.path.join(root, name)
        os.makedirs(out, exist_ok=True)
        cmd = run_command(run, out, sys.executable, os.path.join(HERE, "mech.py")) + ["--threads", str(threads)]
        with open(os.path.join(out, "log.txt"), "a") as f:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        log(f"{'done' if code == 0 else f'FAILED (exit {code}, see {out}/log.txt)'}: {shlex.join(cmd[1:])}")
        return code
    with ThreadPoolExecutor(jobs) as pool:
        failed = sum(code != 0 for code in pool.map(one, todo))
    if failed:
        raise RuntimeError(f"{failed} of {len(todo)} runs failed; rerun the same command to retry them")


def collect(root: str) -> list:
    """One record per finished run folder under root: its config, accuracy and main Attribs."""
    records = []
    for folder, _, files in sorted(os.walk(root)):
        if "metrics.json" not in files or "config.json" not in files:
            continue
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(folder, "metrics.json")) as f:
            m = json.load(f)
        rec = dict(cfg, folder=os.path.relpath(folder, root), accuracy=m["accuracy"],
                   dev_accuracy=m.get("dev_accuracy"), wall_time_s=m["wall_time_s"])
        if "interventions" in m:
            rows = m["interventions"]["rows"]
            first = next(r for r in rows if r["corrupted"] == "key")
            key = {(r["site"], r["layer"], r["position"]): r["attrib"] for r in rows if r["corrupted"] == "key"}
            rec.update(attrib=m["interventions"]["main"], effect=first["p_clean"] - first["p_corr"],
                       conv={p: a for (site, layer, p), a in key.items() if (site, layer) == ("conv_output", 0)},
                       # R11: which layer's mixer brings the answer to the Query
                       query_by_layer=[key.get(("mixer_output", l, "query"), float("nan"))
                                       for l in range(cfg["n_layer"])])
        records.append(rec)
    return records


def summary_table(records: list) -> str:
    """Markdown, one row per configuration (runs that differ only in their seed): the test accuracy as
    mean ± sample standard deviation over seeds (min-max), and the main-setting Attribs averaged over
    the seeds whose answer reacts to the corruption (p_clean - p_corrupted >= MIN_EFFECT, as in the
    figures), with how many seeds those are."""
    groups = {}
    for r in records:
        task = r["task"] + (f" {r['atr']}" if r["task"] == "atr" else "")
        groups.setdefault((task, r["arch"] + conv_variant(r) + pe_variant(r), r["n_layer"], r["d_model"], r["lr"]),
                          []).append(r)
    lines = ["| task | model | layers | d | lr | seeds | accuracy | Attrib Key / Value / Query (seeds) |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for (task, model, n_layer, d, lr), rs in sorted(groups.items()):
        acc = [r["accuracy"] for r in rs]
        spread = f" ± {np.std(acc, ddof=1):.3f} ({min(acc):.3f}-{max(acc):.3f})" if len(acc) > 1 else ""
        act = [r for r in rs if "attrib" in r and r["effect"] >= MIN_EFFECT[r["task"]]]
        attrib = (" / ".join(f"{np.mean([r['attrib'][p] for r in act]):.2f}" for p in ("key", "value", "query"))
                  + f" ({len(act)})") if act else "- (0)"
        lines.append(f"| {task} | {model} | {n_layer} | {d} | {lr:g} | {len(rs)} | {np.mean(acc):.3f}{spread} | {attrib} |")
    return "\n".join(lines)


def conv_variant(r: dict) -> str:
    """How a run's convolutions depart from the architecture in the paper's main results ('' if not)."""
    if r["long_conv"]:
        return " long conv"
    default = DEFAULT_DCONV.get(r["arch"]) if r["arch"] != "base_conv" else None
    return "" if r["d_conv"] == default else f" d_conv {r['d_conv']}"


def pe_variant(r: dict) -> str:
    """The same for the position embedding, which the paper's main results give to Attention only."""
    return "" if r["pos_emb"] == (r["arch"] == "attention") else (" PE" if r["pos_emb"] else " NoPE")


def best_over_lr(records: list, *keys) -> dict:
    """The paper's reported accuracy: per (keys..., d_model, seed), the run with the best final accuracy
    over learning rates (by dev accuracy where there is one, as the paper does for ATR generalisation).
    Returns {(keys..., d_model): [best record per seed]}."""
    best = {}
    for r in records:
        k = tuple(r[key] for key in keys) + (r["d_model"], r["seed"])
        score = r["dev_accuracy"] if r["dev_accuracy"] is not None else r["accuracy"]
        if k not in best or score > best[k][0]:
            best[k] = (score, r)
    out = {}
    for k, (_, r) in sorted(best.items(), key=lambda kv: str(kv[0])):
        out.setdefault(k[:-1], []).append(r)
    return out


def plot_figures(records: list, out_dir: str) -> list:
    """Draw every figure the records allow (AR accuracy and mechanism, the Mamba d_conv and Based conv
    ablations, depth and its per-layer mechanism, ATR accuracy and mechanism, Mamba's conv-internal
    restoration) as PNGs in out_dir.
    Seeds are drawn as points, their mean as a line or bar. Returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    colors = {a: plt.get_cmap("tab10")(i) for i, a in enumerate(ARCHS)}
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
        plt.close(fig)
        written.append(path)

    def points(ax, x, ys, color, label=None, marker="o", width=0.3):  # the seeds as dots, their mean as a bar
        ax.scatter([x] * len(ys), ys, color=color, s=14, alpha=0.6, marker=marker)
        ax.hlines(np.mean(ys), x - width, x + width, color=color, lw=2, label=label)

    ar = [r for r in records if r["task"] == "ar"]
    atr = [r for r in records if r["task"] == "atr"]
    main_ar = [r for r in ar if r["n_layer"] == 2 and not conv_variant(r) + pe_variant(r)]

    # 1. AR accuracy by width (the paper's ar_32), max over learning rates, per seed
    if main_ar:
        fig, ax = plt.subplots(figsize=(6, 4))
        best = best_over_lr(main_ar, "arch")
        widths = sorted({d for _, d in best})
        for i, arch in enumerate(ARCHS):
            groups = {d: [r["accuracy"] for r in rs] for (a, d), rs in best.items() if a == arch}
            if len(widths) == 1 and groups:  # one width (the CPU preset): one column per architecture
                points(ax, i, groups[widths[0]], colors[arch])
            elif groups:
                ds = sorted(groups)
                ax.plot(ds, [np.mean(groups[d]) for d in ds], "-o", color=colors[arch], label=arch, ms=4)
                for d in ds:
                    ax.scatter([d] * len(groups[d]), groups[d], color=colors[arch], s=10, alpha=0.5)
        if len(widths) == 1:
            ax.set_xticks(range(len(ARCHS)), ARCHS, rotation=45, fontsize=8)
            ax.set(xlabel=f"architecture (d = {widths[0]})")
        else:
            ax.set_xscale("log", base=2)
            ax.set(xlabel="model width d")
            ax.legend(fontsize=8)
        ax.set(ylabel="test accuracy (best learning rate)", ylim=(-0.02, 1.02),
               title="Associative Recall: accuracy by architecture (2 layers)")
        save(fig, "ar_accuracy.png")

    # 2. AR mechanism scatters (the paper's ar_32_diff): every run whose corruption matters (filter 0.01)
    analysed = [r for r in main_ar if "attrib" in r and r["effect"] >= MIN_EFFECT["ar"]]
    if analysed:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
        for ax, (x, y) in zip(axes, (("query", "value"), ("key", "query"))):
            for arch in ARCHS:
                rs = [r for r in analysed if r["arch"] == arch]
                if rs:
                    ax.scatter([r["attrib"][x] for r in rs], [r["attrib"][y] for r in rs], color=colors[arch],
                               label=arch, s=18, alpha=0.8)
            for v in (0, 1):
                ax.axhline(v, color="grey", ls="--", lw=0.6)
                ax.axvline(v, color="grey", ls="--", lw=0.6)
            ax.set(xlabel=f"Attrib@{x.capitalize()}", ylabel=f"Attrib@{y.capitalize()}",
                   title=f"@{y.capitalize()} vs @{x.capitalize()}")
        axes[0].legend(fontsize=8)
        fig.suptitle("AR mechanism: where patching the last layer's input restores the answer (Key corrupted)")
        save(fig, "ar_mechanism.png")

    # 3. the Mamba d_conv ablation, on AR and on ATR easy: accuracy and mechanism by conv width
    # (Attribs only of runs whose corruption matters: the paper's filters, 0.01 on AR and 0.1 on ATR)
    for task, rs_task, name in (("AR", ar, "ar_mamba_dconv.png"), ("ATR easy", atr, "atr_mamba_dconv.png")):
        rs = [r for r in rs_task if r["arch"] == "mamba" and r["n_layer"] == 2 and r.get("atr", "easy") == "easy"]
        widths = sorted({r["d_conv"] for r in rs})
        if len(widths) < 2:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        best = best_over_lr(rs, "d_conv")
        labelled = set()
        for k in widths:
            points(axes[0], k, [r["accuracy"] for (kk, _), group in best.items() if kk == k for r in group], "C0")
            for j, (p, m) in enumerate((("key", "s"), ("query", "^"), ("value", "o"))):
                ys = [r["attrib"][p] for (kk, _), group in best.items() if kk == k for r in group
                      if "attrib" in r and r["effect"] >= MIN_EFFECT[r["task"]]]
                if ys:
                    label = None if p in labelled else f"@{p.capitalize()}"  # one legend entry each
                    labelled.add(p)
                    points(axes[1], k + 0.25 * (j - 1), ys, f"C{j + 1}", label, m)
        axes[0].set(xlabel="d_conv (0 = no convolution)", ylabel="test accuracy", ylim=(-0.02, 1.02),
                    title=f"Mamba on {task}: accuracy by short-conv width")
        axes[1].set(xlabel="d_conv", ylabel="Attrib (last layer's input, Key corrupted)",
                    title=f"Mamba on {task}: mechanism by short-conv width")
        if labelled:
            axes[1].legend(fontsize=8)
        else:
            axes[1].text(0.5, 0.5, "no run moved p(answer) enough to attribute", ha="center",
                         transform=axes[1].transAxes)
        for ax in axes:
            ax.set_xticks(widths)
        save(fig, name)

    # 4. Mamba's conv-internal restoration (v3): patching layer 0's conv output at the Value / Value+1
    rs = [r for r in records if r["arch"] == "mamba" and r["n_layer"] == 2 and r.get("conv")
          and r["effect"] >= MIN_EFFECT[r["task"]]]
    if rs:
        setting = lambda r: (r["task"].upper() + (f" {r['atr']}" if r["task"] == "atr" else ""), r["d_conv"])
        keys = sorted({setting(r) for r in rs})
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(keys)), 4))
        for i, key in enumerate(keys):
            for j, p in enumerate(("value", "value+1")):
                ys = [r["conv"][p] for r in rs if setting(r) == key]
                points(ax, i + 0.3 * j - 0.15, ys, f"C{j}", f"@{p.capitalize()}" if i == 0 else None)
        ax.set_xticks(range(len(keys)), [f"{t}\nd_conv {k}" for t, k in keys], fontsize=8)
        ax.set(ylabel="Attrib of layer 0's conv output (Key corrupted)",
               title="Mamba: patching its short conv's output in layer 0")
        ax.legend(fontsize=8)
        save(fig, "mamba_conv_restored.png")

    # 5. Based's conv ablation (R4): kernel 1..4 or the implicit long conv
    rs = [r for r in ar if r["arch"] == "based" and r["n_layer"] == 2]
    kinds = sorted({"long" if r["long_conv"] else r["d_conv"] for r in rs}, key=str)
    if len(kinds) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, kind in enumerate(kinds):
            group = [r for r in rs if ("long" if r["long_conv"] else r["d_conv"]) == kind]
            points(ax, i, [r["accuracy"] for g in best_over_lr(group, "arch").values() for r in g], "C0")
        ax.set_xticks(range(len(kinds)), [f"kernel {k}" if k != "long" else "long conv" for k in kinds])
        ax.set(ylabel="test accuracy", ylim=(-0.02, 1.02), title="Based on AR: its BaseConv layer's convolution")
        save(fig, "based_conv.png")

    # 6. depth (R2): accuracy by number of layers
    rs = [r for r in ar if not conv_variant(r) + pe_variant(r)]
    if len({r["n_layer"] for r in rs}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        layers = sorted({r["n_layer"] for r in rs})
        labelled = set()
        for i, arch in enumerate(ARCHS):
            for n in layers:
                ys = [r["accuracy"] for g in best_over_lr([r for r in rs if r["arch"] == arch and r["n_layer"] == n],
                                                          "arch").values() for r in g]
                if ys:
                    points(ax, i + 0.25 * (n - 2), ys, f"C{n - 1}",
                           None if n in labelled else f"{n} layer{'s' if n > 1 else ''}")  # one legend entry each
                    labelled.add(n)
        ax.set_xticks(range(len(ARCHS)), ARCHS, fontsize=8)
        ax.set(xlabel="architecture", ylabel="test accuracy", ylim=(-0.02, 1.02), title="Associative Recall by depth")
        ax.legend(fontsize=8)
        save(fig, "ar_layers.png")

        # R11: per layer, Attrib@Query of the mixer's output: the layer that fetches the answer to the
        # Query scores 1, the layers before and after it 0 (filter 0.01, as the paper's)
        analysed = [r for r in rs if r.get("query_by_layer") and r["effect"] >= MIN_EFFECT["ar"]]
        if analysed:
            fig, axes = plt.subplots(1, len(layers), figsize=(4.5 * len(layers), 4), squeeze=False, sharey=True)
            for ax, n in zip(axes[0], layers):
                for i, arch in enumerate(ARCHS):
                    for l in range(n):
                        ys = [r["query_by_layer"][l] for r in analysed if r["arch"] == arch and r["n_layer"] == n]
                        if ys:
                            points(ax, i + 0.25 * (l - (n - 1) / 2), ys, f"C{l}", width=0.1)
                for l in range(n):
                    ax.plot([], [], "s", color=f"C{l}", label=f"layer {l}")
                for v in (0, 1):
                    ax.axhline(v, color="grey", ls="--", lw=0.6)
                ax.set_xticks(range(len(ARCHS)), ARCHS, rotation=45, ha="right", fontsize=8)
                ax.set(title=f"{n} layer{'s' if n > 1 else ''}", xlabel="architecture")
                ax.legend(fontsize=7)
            axes[0][0].set(ylabel="Attrib@Query of the layer's mixer output")
            fig.suptitle("AR by depth: which layer brings the answer to the Query (Key corrupted)")
            save(fig, "ar_layers_attrib.png")

    # 7. ATR accuracy per setting, and its mechanism as box plots (R6, R13; filter 0.1); a model run with
    # the other position-embedding choice (R5, e.g. Attention NoPE) gets a column of its own
    main_atr = [r for r in atr if r["n_layer"] == 2 and not conv_variant(r) and not r["held_out"]]
    settings = [s for s in ATR_SETTINGS if any(r["atr"] == s for r in main_atr)]
    model = lambda r: r["arch"] + pe_variant(r)
    models = [a + v for a in ARCHS for v in ("", " PE", " NoPE") if any(model(r) == a + v for r in main_atr)]
    color = lambda name: colors[name.split()[0]]
    if settings:
        # the paper's axis starts at 0.4; ours drops lower where a seed failed, rather than hide it
        bottom = min([0.3] + [r["accuracy"] - 0.03 for r in main_atr])
        fig, axes = plt.subplots(1, len(settings), figsize=(max(6.5, 5 * len(settings)), 4.2), squeeze=False)
        for ax, s in zip(axes[0], settings):
            for i, name in enumerate(models):
                best = best_over_lr([r for r in main_atr if r["atr"] == s and model(r) == name], "arch")
                ys = [r["accuracy"] for g in best.values() for r in g]
                if ys:
                    points(ax, i, ys, color(name))
            ax.set_xticks(range(len(models)), models, rotation=45, ha="right", fontsize=8)
            ax.set(ylabel="test accuracy", ylim=(bottom, 1.02), title=f"ATR {s}")
        fig.suptitle("Associative Treecall: accuracy by architecture (2 layers)")
        save(fig, "atr_accuracy.png")
        fig, axes = plt.subplots(1, len(settings), figsize=(max(6.5, 5 * len(settings)), 4.2), squeeze=False)
        for ax, s in zip(axes[0], settings):
            for i, name in enumerate(models):
                rs = [r for r in main_atr if r["atr"] == s and model(r) == name and "attrib" in r
                      and r["effect"] >= MIN_EFFECT["atr"]]
                for j, p in enumerate(("key", "query", "value")):
                    ys = [r["attrib"][p] for r in rs]
                    x = i + 0.25 * (j - 1)
                    if len(ys) >= 3:
                        ax.boxplot([ys], positions=[x], widths=0.2, patch_artist=True, showfliers=False,
                                   boxprops=dict(facecolor=f"C{j + 1}", alpha=0.5), medianprops=dict(color="k"))
                    ax.scatter([x] * len(ys), ys, color=f"C{j + 1}", s=14, zorder=3)
            for j, p in enumerate(("key", "query", "value")):
                ax.plot([], [], "s", color=f"C{j + 1}", label=f"@{p.capitalize()}")
            for v in (0, 1):
                ax.axhline(v, color="grey", ls="--", lw=0.6)
            ax.set_xticks(range(len(models)), models, rotation=45, ha="right", fontsize=8)
            ax.set(ylabel="Attrib (last layer's input, Key corrupted)", title=f"ATR {s}")
            ax.legend(fontsize=7)
        fig.suptitle("ATR mechanism: which position restores the answer")
        save(fig, "atr_mechanism.png")
    return written


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 6. Command line
# ─────────────────────────────────────────────────────────────────────────────────────────────

# A preset fills in Config defaults per task; explicit flags override it.
PRESETS = {
    "paper": {  # the paper's protocol (PAPER.md §5): a fixed set of 100,032 documents replayed every epoch,
                # batch 32, 10% warmup then cosine to 0; AR 16 epochs (50,016 steps), ATR 32 (100,032)
        "ar": dict(num_kv=8192, n_train=100_032, epochs=16, batch_size=32, schedule="cosine", eval_every=200),
        "atr": dict(n_train=100_032, epochs=32, batch_size=32, schedule="cosine", eval_every=200),
    },
    "cpu": {  # calibrated on 2 CPU cores (README, "The CPU preset"): the paper's task, documents, loss,
              # batch and a paper width (d = 64); a shorter schedule that holds the peak, then decays
        "ar": dict(num_kv=8192, n_train=100_032, batch_size=32, d_model=64, lr=1e-3, schedule="wsd",
                   steps=15_000, eval_every=500),
        "atr": dict(n_train=100_032, batch_size=32, d_model=64, lr=1e-3, schedule="wsd",
                    steps=15_000, eval_every=500, bucket=16),
    },
}
CPU_RECIPES = {  # (task, arch) -> where the CPU preset differs, and why (measured: README)
    # attention crosses its plateau (induction) only at step 13-17k: it needs the longest schedule
    ("ar", "attention"): dict(steps=30_000),
    # Mamba learns gradually and overfits the fixed set (train loss 0.03, test 0.66 at 25k steps):
    # fresh documents every step and its best learning rate of 1e-3 .. 1e-2 (3e-3) do better
    ("ar", "mamba"): dict(steps=20_000, lr=3e-3, fresh_data=True),
}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse would print the whole usage first)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    p = Parser(prog="mech.py", description="Train one model of the paper on its task and save the run. "
               "Every Config field is a flag; --preset sets the defaults.",
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="cpu", help="defaults to start from: " + ", ".join(PRESETS))
    for f in dataclasses.fields(Config):
        kind = next((t for t in getattr(f.type, "__args__", (f.type,)) if t is not type(None)))
        names = [f.metadata["flag"]] if f.metadata["flag"] else []
        names.append("--" + f.name.replace("_", "-"))
        extra = dict(action=argparse.BooleanOptionalAction) if kind is bool else dict(type=kind)
        p.add_argument(*names, dest=f.name, default=argparse.SUPPRESS, help=f.metadata["help"], **extra)
    p.add_argument("--out", help="run folder (default: runs/<task>_<arch>_..._<config hash>)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--force", action="store_true", help="retrain even if the run folder holds a finished run")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--interventions", action=argparse.BooleanOptionalAction, default=True,
                   help="after training, run the mechanistic evaluation (interchange interventions)")
    p.add_argument("--load", metavar="RUN_DIR", help="analyse a finished run instead of training "
                   "(with --interventions): python mech.py --load RUN_DIR --interventions")
    s = p.add_argument_group("experiments", "run a named sweep of the paper instead of one run")
    s.add_argument("--sweep", help="the sweep: " + ", ".join(SWEEPS))
    s.add_argument("--scale", default="cpu", help="cpu (the calibrated CPU presets) or paper (its grid and protocol)")
    s.add_argument("--seeds", type=int, help="seeds per run (default: 3 at scale cpu, 1 at scale paper)")
    s.add_argument("--jobs", type=int, default=1, help="runs at a time, in local processes sharing the CPU threads")
    s.add_argument("--print-commands", action="store_true", help="print one command per run (for a scheduler) "
                   "instead of running them")
    s.add_argument("--sweep-dir", help="where the sweep's run folders go (default: sweeps/<sweep>-<scale>)")
    s.add_argument("--collect", metavar="DIR", help="gather the finished runs under DIR into results.json "
                   "and draw the figures")
    s.add_argument("--figures-dir", default="figures", help="where --sweep and --collect draw the figures")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    names = {f.name for f in dataclasses.fields(Config)}
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
    given = {k: v for k, v in vars(args).items() if k in names}
    task, arch = given.get("task", Config.task), given.get("arch", Config.arch)
    preset = dict(PRESETS[args.preset].get(task, {}))
    if args.preset == "cpu":
        preset.update(CPU_RECIPES.get((task, arch), {}))
    if args.preset == "paper" and given.get("held_out"):
        preset["schedule"] = "linear"  # the paper's generalisation runs (pcfg_gen) decay linearly
    return Config(**{**preset, **given})


def experiments(args, parser) -> list:
    """--sweep (run it, or print its commands) and --collect (results.json and figures)."""
    if args.sweep:
        try:
            if args.jobs < 1:
                raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
            seeds = args.seeds if args.seeds is not None else 3 if args.scale == "cpu" else 1
            runs = sweep_runs(args.sweep, args.scale, seeds)
            # Config flags given with --sweep apply to every run (e.g. --steps 2000 for a quick look)
            extra = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config) if hasattr(args, f.name)}
            runs = [(name, {**run, **extra}) for name, run in runs]
            for _, run in runs:
                config_from_args(build_parser().parse_args(run_args(run)))  # bad values fail here, not in a job
        except ValueError as e:
            parser.error(str(e))
        root = args.sweep_dir or os.path.join("sweeps", f"{args.sweep}-{args.scale}")
        if args.print_commands:
            for name, run in runs:
                print(shlex.join(run_command(run, os.path.join(root, name))))
            return []
        run_sweep(runs, root, args.jobs)
    root = args.collect or root  # --collect DIR, or the sweep just run
    if not os.path.isdir(root):
        parser.error(f"--collect {root}: no such directory")
    records = collect(root)
    write_json(os.path.join(root, "results.json"), records)
    table = summary_table(records)
    write_text(os.path.join(root, "summary.md"), table + "\n")
    paths = plot_figures(records, args.figures_dir)
    print(f"{table}\n\n{len(records)} runs collected into {os.path.join(root, 'results.json')} (table: "
          f"{os.path.join(root, 'summary.md')}); figures: {', '.join(paths) or 'none'}")
    return records


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sweep or args.collect:
        return experiments(args, parser)
    if args.load:  # analyse a saved run, no training
        missing = [f for f in ("config.json", "model.pt", "metrics.json") if not os.path.exists(os.path.join(args.load, f))]
        if missing:
            parser.error(f"--load {args.load}: no finished run there ({', '.join(missing)} missing)")
        if not args.interventions:
            parser.error("--load analyses a saved run: it needs --interventions")
        return analyse_run(args.load, *load_run(args.load))
    try:
        cfg = config_from_args(args)
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        resolve_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    out = args.out or default_out(cfg)
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, flush=True))
    done = os.path.join(out, "metrics.json")
    if os.path.exists(done) and not args.force:
        with open(os.path.join(out, "config.json")) as f:
            same = json.load(f) == json.loads(json.dumps(dataclasses.asdict(cfg)))
        if same:
            with open(done) as g:
                m = json.load(g)
            print(f"{out} already holds this run: test accuracy {m['accuracy']:.3f} (--force retrains)")
            if args.interventions and "interventions" not in m:
                m = analyse_run(out, *load_run(out))
            return m
    if args.force:
        for name in ("checkpoint.pt", "metrics.json"):
            if os.path.exists(os.path.join(out, name)):
                os.remove(os.path.join(out, name))
    try:
        model, m = train(cfg, out, device=args.device, log=log)
    except Diverged as e:
        parser.exit(1, f"{parser.prog}: {e}\n")
    n = cfg.n_eval
    print(f"{cfg.arch} on {cfg.task}: test accuracy {m['accuracy']:.3f} ({round(m['accuracy'] * n)}/{n}) "
          f"after {m['steps']:,} steps in {m['wall_time_s'] / 60:.1f} min ({m['steps_per_s']:.1f} steps/s); "
          f"saved in {out}")
    return analyse_run(out, model, cfg) if args.interventions else m


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # output piped into a reader that stopped early, e.g. `| head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
