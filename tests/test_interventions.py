"""The interchange-intervention machinery (mech.py section 4): hooks, patches, Attrib, verdict, report.

Four groups:
  1. identities that any correct patching code satisfies, on small random models of several
     architectures (exact equalities: the same floating-point operations on the same inputs);
  2. a transformer whose weights are set BY HAND to solve AR with an induction circuit (a
     previous-token head, then an induction head): the interventions must find induction there,
     and must not find it in the contrast models. This is the test that the machinery measures
     what the paper says it measures;
  3. the verdict on synthetic rows;
  4. the report and the run folder (metrics.json, the table shown again, --no-interventions).
"""
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import mech

ARCHS = ("attention", "mamba", "based")  # softmax attention with PE, an SSM, a conv + linear-attention hybrid


# ── helpers ──────────────────────────────────────────────────────────────────────────────────

def randomised(model, gain=2.0, seed=0):
    """Redraw every Linear and Embedding weight at O(1) scale. With the official N(0, 0.02) init the
    untrained models are nearly constant (p_clean - p_corr ~ 1e-7); at this scale corrupting the Key
    moves p(answer) by 1e-4 .. 1e-2, so that Attrib is a well-defined ratio."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * gain / math.sqrt(m.in_features))
            elif isinstance(m, nn.Embedding):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))
    return model


def small(arch, n_layer=2, **kw):
    """(model, cfg, task, data): a random 2-layer model, d = 16, 32 keys and 32 values, 6 documents."""
    cfg = mech.Config(**{**dict(arch=arch, d_model=16, n_layer=n_layer, num_kv=64, scan="ref", seed=3), **kw})
    task = mech.make_task(cfg)
    model = randomised(mech.build_model(cfg, task.vocab_size)).eval()
    data = task.sample(6, mech.rng_for(0, "x"))
    return model, cfg, task, data


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    return small(request.param)


def no_hooks(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@torch.no_grad()
def clean_cache(model, data, sites):
    """{(site, layer): the clean run's activation (B, L, width)} via intervene with a reading fn."""
    cache = {}
    for site, layer in sites:
        def read(act, key=(site, layer)):
            cache[key] = act.clone()
            return act
        with mech.intervene(model, site, layer, read):
            model(data.ids)
    return cache


def bad_ids_of(task, data, seed=0):
    return mech.corrupt(task, data, "key", mech.rng_for(seed, "corrupt-key"))


def row(rows, site, layer, position, corrupted="key"):
    (r,) = [r for r in rows if (r["corrupted"], r["site"], r["layer"], r["position"]) == (corrupted, site, layer, position)]
    return r


# ── 1. identities on random models ───────────────────────────────────────────────────────────

@torch.no_grad()
def test_patching_the_whole_residual_stream_reproduces_the_clean_run(setup):
    model, cfg, task, data = setup
    bad = bad_ids_of(task, data)
    assert not torch.equal(bad, data.ids)
    p_clean, p_corr = mech.p_answer(model, data), mech.p_answer(model, data, bad)
    assert not torch.equal(p_clean, p_corr)  # the corruption matters to this model
    residual = [(s, l) for s, l in list(mech.sites_in(model)) if s in ("block_input", "block_output")]
    assert len(residual) == 2 * cfg.n_layer
    cache = clean_cache(model, data, residual)
    for site, layer in residual:  # every position at once: the corrupted run becomes the clean run
        with mech.intervene(model, site, layer, lambda act, c=cache[site, layer]: c):
            assert torch.equal(mech.p_answer(model, data, bad), p_clean), (site, layer)
            logits = model(bad)
        if (site, layer) == ("block_input", 0):
            assert torch.equal(logits, model(data.ids))
    assert no_hooks(model)


@torch.no_grad()
def test_without_a_patch_the_corrupted_run_is_unchanged_and_hooks_are_removed(setup):
    model, cfg, task, data = setup
    bad = bad_ids_of(task, data)
    logits = model(bad, at=data.pos["query"])
    p_corr = logits.softmax(-1)[torch.arange(len(data)), data.answer]
    assert torch.equal(mech.p_answer(model, data, bad), p_corr)
    seen = []
    for site, layer in list(mech.sites_in(model)):
        with mech.intervene(model, site, layer, lambda act: seen.append(act.shape) or act):
            assert torch.equal(mech.p_answer(model, data, bad), p_corr), (site, layer)
        assert no_hooks(model), (site, layer)
        # the hook goes away also when the body raises, and the exception is not swallowed
        with pytest.raises(ZeroDivisionError):
            with mech.intervene(model, site, layer, lambda act: act):
                assert not no_hooks(model)
                1 / 0
        assert no_hooks(model), (site, layer)
    assert len(seen) == len(list(mech.sites_in(model)))  # each hook ran exactly once per forward
    # every site at once (as interchange records the clean run): still the plain corrupted run
    from contextlib import ExitStack
    with ExitStack() as stack:
        for site, layer in list(mech.sites_in(model)):
            stack.enter_context(mech.intervene(model, site, layer, lambda act: act))
        assert torch.equal(mech.p_answer(model, data, bad), p_corr)
    assert no_hooks(model)


@torch.no_grad()
def test_patching_after_the_query_changes_nothing(setup):
    model, cfg, task, data = setup
    bad = bad_ids_of(task, data)
    p_corr = mech.p_answer(model, data, bad)
    answer = data.pos["query"] + 1
    assert torch.equal(answer, data.pos["answer"])
    rows = torch.arange(len(data))
    cache = clean_cache(model, data, list(mech.sites_in(model)))
    for (site, layer), act in cache.items():
        with mech.intervene(model, site, layer, mech.patched(answer, act[rows, answer])):
            assert torch.equal(mech.p_answer(model, data, bad), p_corr), (site, layer)
        # and a patch that really differs there (noise) changes nothing either: causality
        noise = torch.randn(act[rows, answer].shape, generator=torch.Generator().manual_seed(1)) * 10
        with mech.intervene(model, site, layer, mech.patched(answer, noise)):
            assert torch.equal(mech.p_answer(model, data, bad), p_corr), (site, layer)


@torch.no_grad()
def test_patching_clean_activations_into_the_clean_run_is_bit_identical(setup):
    model, cfg, task, data = setup
    want = model(data.ids)
    rows = torch.arange(len(data))
    cache = clean_cache(model, data, list(mech.sites_in(model)))
    for (site, layer), act in cache.items():
        for name in mech.POSITIONS:
            pos = mech.positions(data, name)
            with mech.intervene(model, site, layer, mech.patched(pos, act[rows, pos])):
                assert torch.equal(model(data.ids), want), (site, layer, name)


@torch.no_grad()
def test_every_patch_reaches_the_output(setup):
    """A patch is not silently dropped: noise written at the Query at any site changes p(answer)."""
    model, cfg, task, data = setup
    p_clean = mech.p_answer(model, data)
    query = data.pos["query"]
    for site, layer in list(mech.sites_in(model)):
        width = model.blocks[layer].mixer.d_inner if site == "conv_output" else cfg.d_model
        noise = torch.randn(len(data), width, generator=torch.Generator().manual_seed(2)) * 3
        with mech.intervene(model, site, layer, mech.patched(query, noise)):
            assert not torch.equal(mech.p_answer(model, data), p_clean), (site, layer)


@torch.no_grad()
def test_sites_are_the_tensors_they_name(setup):
    """The hooked tensors satisfy the block's own equations: mixer_input = norm1(block_input), and
    block_output = block_input + mixer_output + mlp_output (Mamba: no MLP)."""
    model, cfg, task, data = setup
    cache = clean_cache(model, data, list(mech.sites_in(model)))
    x = model.tok_emb(data.ids) + (model.pos_emb.weight[:data.ids.shape[1]] if model.pos_emb is not None else 0)
    assert torch.equal(cache["block_input", 0], x)
    for l, block in enumerate(model.blocks):
        c = lambda site: cache[site, l]
        assert torch.equal(c("mixer_input"), block.norm1(c("block_input")))
        assert torch.equal(c("mixer_output"), block.mixer(c("mixer_input")))
        h = c("block_input") + c("mixer_output")
        if block.mlp is not None:
            assert torch.equal(c("mlp_input"), block.norm2(h))
            assert torch.equal(c("mlp_output"), block.mlp(c("mlp_input")))
            h = h + c("mlp_output")
        assert torch.equal(c("block_output"), h)
        if l + 1 < cfg.n_layer:
            assert torch.equal(cache["block_input", l + 1], c("block_output"))
        if ("conv_output", l) in cache:  # Mamba: the short conv of the x half of in_proj, before SiLU
            x_half = block.mixer.in_proj(c("mixer_input")).chunk(2, dim=-1)[0]
            assert torch.equal(c("conv_output"), block.mixer.conv1d(x_half))


def test_interchange_identities(setup):
    model, cfg, task, data = setup
    model.train()  # interchange must evaluate in eval mode and give the mode back
    rows = mech.interchange(model, task, data, "key")
    assert model.training and no_hooks(model)
    model.eval()
    assert len(rows) == len(list(mech.sites_in(model))) * len(mech.POSITIONS)
    # p_clean and p_corr are the plain runs, with the documented seeded corruption
    # (over the documents where the patched position is distinct: see the test of coinciding positions)
    bad = bad_ids_of(task, data)
    for r in rows:
        m = mech.distinct(data, r["position"])
        assert r["n"] == m.sum()
        assert r["p_clean"] == pytest.approx(mech.p_answer(model, data)[m].mean().item(), abs=1e-7)
        assert r["p_corr"] == pytest.approx(mech.p_answer(model, data, bad)[m].mean().item(), abs=1e-7)
        assert r["attrib"] == pytest.approx((r["p_patch"] - r["p_corr"]) / (r["p_clean"] - r["p_corr"]), rel=1e-9)
    effect = rows[0]["p_clean"] - rows[0]["p_corr"]
    assert abs(effect) > 1e-5, effect
    # block_output[l] and block_input[l+1] are one tensor: identical rows
    for l in range(cfg.n_layer - 1):
        for p in mech.POSITIONS:
            a, b = row(rows, "block_output", l, p), row(rows, "block_input", l + 1, p)
            assert a["p_patch"] == b["p_patch"] and a["attrib"] == b["attrib"], (l, p)
    # the embedding at the Key is the only difference between the two documents: restoring it
    # restores the clean run exactly; the other embeddings are equal in both runs, so patching them is a no-op
    key0 = row(rows, "block_input", 0, "key")
    assert key0["p_patch"] == pytest.approx(key0["p_clean"], abs=1e-9)
    assert key0["attrib"] == pytest.approx(1.0, abs=1e-6)
    for p in mech.POSITIONS[1:]:
        r = row(rows, "block_input", 0, p)
        assert r["p_patch"] == r["p_corr"] and r["attrib"] == 0.0, p
    # the last block's output at the Query is what the head reads: restoring it restores the answer
    last = row(rows, "block_output", cfg.n_layer - 1, "query")
    assert last["attrib"] == pytest.approx(1.0, abs=1e-5)


def test_interchange_in_batches_gives_the_same_means(setup):
    model, cfg, task, data = setup
    one = mech.interchange(model, task, data, "key", batch_size=64)
    three = mech.interchange(model, task, data, "key", batch_size=4)  # batches of 4 and 2
    assert three[0]["p_clean"] == pytest.approx(one[0]["p_clean"], abs=1e-7)
    for r in three:
        if r["site"] == "block_input" and r["layer"] == 0:
            assert r["attrib"] == pytest.approx(1.0 if r["position"] == "key" else 0.0, abs=1e-6)


def test_positions_counts_on_from_the_value():
    task = mech.AR(64, 16)
    data = task.sample(50, mech.rng_for(0, "x"))
    for name in ("key", "value", "divider", "query"):
        assert torch.equal(mech.positions(data, name), data.pos[name])
    assert torch.equal(mech.positions(data, "value+1"), data.pos["value"] + 1)
    assert torch.equal(mech.positions(data, "value+2"), data.pos["value"] + 2)
    rows = torch.arange(len(data))
    nxt = data.ids[rows, mech.positions(data, "value+1")]  # AR's "next key", or the divider after the last pair
    last = data.pos["value"] == data.pos["divider"] - 1
    assert ((nxt >= task.first_key) & (nxt < task.first_value))[~last].all() and (nxt[last] == mech.EOS).all()
    assert (mech.positions(data, "value+2") <= data.pos["query"]).all()  # every patched position is causal


def test_corrupt_changes_exactly_one_token_to_another_of_its_kind():
    task = mech.AR(64, 16)
    data = task.sample(400, mech.rng_for(0, "x"))
    before = data.ids.clone()
    rows = torch.arange(len(data))
    keys = lambda t: (t >= task.first_key) & (t < task.first_value)
    values = lambda t: (t >= task.first_value) & (t < task.first_value + task.n_keys)
    for what, value_corruption, kind in (("key", "value", keys), ("value", "value", values),
                                         ("key", "key", keys), ("value", "key", keys)):
        bad = mech.corrupt(task, data, what, np.random.default_rng(1), value_corruption)
        assert torch.equal(data.ids, before)  # a copy: the clean documents are untouched
        changed = bad != data.ids
        assert (changed.sum(1) == 1).all(), (what, value_corruption)
        assert changed[rows, data.pos[what]].all()
        new = bad[rows, data.pos[what]]
        assert kind(new).all(), (what, value_corruption)  # value_corruption="key": a Value becomes a key
        assert (new != data.ids[rows, data.pos[what]]).all()
    # the replacement key is uniform over the other keys: every other key occurs, none dominates
    single = mech.AR(8, 2)  # 4 keys
    d = single.sample(3000, mech.rng_for(0, "y"))
    orig = d.ids[torch.arange(3000), d.pos["key"]]
    new = mech.corrupt(single, d, "key", np.random.default_rng(2))[torch.arange(3000), d.pos["key"]]
    for k in range(single.first_key, single.first_value):
        counts = torch.bincount(new[orig == k] - single.first_key, minlength=4)
        assert counts[k - single.first_key] == 0 and (counts.sum() - counts).min() > 0
        others = counts[torch.arange(4) != k - single.first_key].float()
        assert others.min() > 0.8 * others.mean(), counts


def test_interchange_corruption_is_seeded_and_shared_by_all_cells():
    model, cfg, task, data = small("attention")
    a = mech.interchange(model, task, data, "key", seed=5)
    b = mech.interchange(model, task, data, "key", seed=5)
    c = mech.interchange(model, task, data, "key", seed=6)
    assert a == b
    assert a[0]["p_corr"] != c[0]["p_corr"]
    every_doc = [r for r in a if r["n"] == len(data)]
    assert len({r["p_corr"] for r in every_doc}) == 1 and len({r["p_clean"] for r in every_doc}) == 1
    v = mech.interchange(model, task, data, "value")
    assert all(r["corrupted"] == "value" for r in v)
    bad = mech.corrupt(task, data, "value", mech.rng_for(0, "corrupt-value"))
    assert v[0]["p_corr"] == pytest.approx(mech.p_answer(model, data, bad).mean().item(), abs=1e-7)


def test_sites_of_each_architecture():
    def sites(arch, layer=0, **kw):
        cfg = mech.Config(arch=arch, d_model=16, num_kv=64, scan="ref", **kw)
        model = mech.build_model(cfg, mech.make_task(cfg).vocab_size)
        return {s for s, l in list(mech.sites_in(model)) if l == layer}, model
    every = {"block_input", "block_output", "mixer_input", "mixer_output"}
    assert sites("attention")[0] == every | {"mlp_input", "mlp_output"}
    assert sites("mamba", d_conv=4)[0] == every | {"conv_output"}
    assert sites("mamba", d_conv=1)[0] == every | {"conv_output"}
    assert sites("mamba", d_conv=0)[0] == every  # no conv, nothing to patch there
    for arch in mech.MIXERS:
        s, model = sites(arch, layer=1)
        assert "conv_output" not in s or arch == "mamba", arch
        assert ("mlp_input" in s) == (arch != "mamba"), arch
        assert len(list(mech.sites_in(model))) == 2 * len(s), arch


@torch.no_grad()
@pytest.mark.parametrize("arch", list(mech.MIXERS))
def test_every_site_of_every_architecture_can_be_patched(arch):
    cfg = mech.Config(arch=arch, d_model=16, num_kv=64, n_pairs=4, scan="ref", seed=1)
    task = mech.make_task(cfg)
    model = mech.build_model(cfg, task.vocab_size).eval()
    data = task.sample(3, mech.rng_for(0, "x"))
    B, L = data.ids.shape
    bad = bad_ids_of(task, data)
    rows = torch.arange(B)
    for site, layer in list(mech.sites_in(model)):
        width = model.blocks[layer].mixer.d_inner if site == "conv_output" else cfg.d_model
        seen = []
        with mech.intervene(model, site, layer, lambda act: seen.append(act) or act):
            model(data.ids)
        (act,) = seen
        assert act.shape == (B, L, width), (site, layer, act.shape)
        pos = data.pos["key"]
        with mech.intervene(model, site, layer, mech.patched(pos, act[rows, pos])):
            p = mech.p_answer(model, data, bad)
        assert p.shape == (B,) and torch.isfinite(p).all()
    assert no_hooks(model)


# ── 2. a hand-built induction transformer ─────────────────────────────────────────────────────

def build_induction_model(n_layer=2, previous_token_head=True):
    """A 2-layer attention LanguageModel (1 head, PE) whose weights are set by hand to solve AR by
    induction, with no training. Returns (model, cfg, task).

    The residual stream (d = 128) is split into orthogonal subspaces, one coordinate per item:
        TOK  [0, V)          one-hot of the token at this position (the token embedding); layer 1
                             also writes the answer here, because the tied head reads these coordinates
        PREV [V, 2V)         one-hot of the PREVIOUS token, written by layer 0
        POS  [2V, 2V+L)      one-hot of the position (the position embedding)
        BAL  2V+L            a balance coordinate: each vector written to the stream also puts minus
                             its coordinate sum here, so every residual vector sums to 0.
    With zero mean, LayerNorm (weight 1, bias 0) is x / rms(x): it keeps every direction and only
    scales a position by s = 1/rms(x), which is the same at every position (see s0, s1 below).

    Layer 0, previous-token head: position i queries POS(i-1) and every position j keys POS(j),
    so i attends (hard) to i-1; the value is the token j's TOK one-hot, which out_proj moves into
    PREV. After layer 0, the Value position of pair i holds PREV = k_i: "this value follows k_i".
    Layer 1, induction head: the query reads TOK (at the Query, k_i) and the keys read PREV, so the
    Query attends to the position whose previous token is k_i: the Value position; the value read
    there is its TOK one-hot v_i, which out_proj writes into TOK with weight c = 10, larger than the
    Query's own token (1), so the tied head logits = norm_f(h) @ E^T rank v_i first.
    The MLPs are switched off (all their weights 0, so they output exactly 0). Layers after the
    second (n_layer = 3) are all zeros: they add nothing. previous_token_head=False zeros layer 0's
    out_proj: then nothing binds a value to its key.
    """
    cfg = mech.Config(arch="attention", d_model=128, n_layer=n_layer, n_head=1, pos_emb=True,
                      num_kv=32, n_pairs=8, n_eval=64, seed=0)
    task = mech.make_task(cfg)
    V, L, d = task.vocab_size, task.length, cfg.d_model  # 36 tokens, 21 positions
    TOK, PREV, POS, BAL = 0, V, 2 * V, 2 * V + L
    assert BAL < d
    a = 4.0    # layer 0 query/key weight: attention logit 1.9 a^2 = 30 for the previous position, 0 else
    b = 6.0    # layer 1 query/key weight: logit 0.94 b^2 = 34 where PREV matches the Query's token
    c = 10.0   # size of the answer written into TOK (the Query's own token there has size 1)
    # LayerNorm's scale at each layer's input: sum of squares 1 (TOK) + 1 (POS) + 2^2 (BAL) = 6 at
    # layer 0; layer 0 adds 1 (PREV) and -1 to BAL: 1 + 1 + 1 + 3^2 = 12 at layer 1
    s0 = 1 / math.sqrt(6 / d + 1e-5)
    s1 = 1 / math.sqrt(12 / d + 1e-5)
    model = mech.build_model(cfg, V)
    with torch.no_grad():
        for p in model.parameters():       # start from all zeros: MLPs, biases, unused blocks off
            p.zero_()
        for block in model.blocks:         # pre-norm LayerNorms: x / rms(x) on zero-mean vectors
            block.norm1.weight.fill_(1.0)
            block.norm2.weight.fill_(1.0)
        model.norm_f.weight.fill_(2.0)     # sharpens the output softmax: logit margin 2 s_f (c - 1) = 12
        # embeddings: token t -> TOK[t], position i -> POS[i]; each balanced by -1 on BAL
        E, P = model.tok_emb.weight, model.pos_emb.weight
        for t in range(V):
            E[t, TOK + t], E[t, BAL] = 1.0, -1.0
        for i in range(L):
            P[i, POS + i], P[i, BAL] = 1.0, -1.0
        # layer 0: the previous-token head
        att = model.blocks[0].mixer
        Wq, Wk, Wv = att.Wqkv.weight.view(3, d, d)  # rows of Wqkv: q, then k, then v
        for i in range(1, L):
            Wq[POS + i - 1, POS + i] = a              # q_i = a s0 POS(i-1)
        for j in range(L):
            Wk[POS + j, POS + j] = a                  # k_j = a s0 POS(j)
        for t in range(V):
            Wv[TOK + t, TOK + t] = 1.0                # v_j = s0 TOK(token at j)
            if previous_token_head:                   # output: PREV(token at i-1), balanced on BAL
                att.out_proj.weight[PREV + t, TOK + t] = 1 / s0
                att.out_proj.weight[BAL, TOK + t] = -1 / s0
        # layer 1: the induction head
        att = model.blocks[1].mixer
        Wq, Wk, Wv = att.Wqkv.weight.view(3, d, d)
        for t in range(V):
            Wq[t, TOK + t] = b                        # q_i = b s1 (one-hot of the token at i)
            Wk[t, PREV + t] = b                       # k_j = b s1 (one-hot of the token before j)
            Wv[t, TOK + t] = 1.0                      # v_j = s1 (one-hot of the token at j)
            att.out_proj.weight[TOK + t, t] = c / s1  # output: c TOK(attended token), balanced
            att.out_proj.weight[BAL, t] = -c / s1
    return model.eval(), cfg, task


@pytest.fixture(scope="module")
def induction():
    model, cfg, task = build_induction_model()
    data = task.sample(cfg.n_eval, mech.rng_for(cfg.seed, "test"))
    return model, cfg, task, data, mech.interchange(model, task, data, "key")


def test_hand_built_model_solves_associative_recall(induction):
    model, cfg, task, data, rows = induction
    assert mech.evaluate(model, data)["accuracy"] >= 0.95
    # and it does so by the intended attention patterns
    att = {}
    for l in range(2):
        def grab(m, args, out, l=l):
            x = args[0]
            q, k, _ = m.Wqkv(x).view(*x.shape[:2], 3, cfg.d_model).unbind(2)
            s = (q @ k.transpose(1, 2) / math.sqrt(cfg.d_model)).masked_fill(
                torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1), float("-inf"))
            att[l] = s.softmax(-1)
        handle = model.blocks[l].mixer.register_forward_hook(grab)
        try:
            with torch.no_grad():
                model(data.ids)
        finally:
            handle.remove()
    L, rows_ = data.ids.shape[1], torch.arange(len(data))
    assert (att[0][:, torch.arange(1, L), torch.arange(L - 1)] > 0.999).all()  # previous token
    assert (att[1][rows_, data.pos["query"], data.pos["value"]] > 0.999).all()   # induction: the Value


def test_interventions_find_induction_in_the_hand_built_model(induction):
    model, cfg, task, data, rows = induction
    first = rows[0]
    assert first["p_clean"] > 0.99 and first["p_corr"] < 0.1
    main = mech.verdict_attribs(rows, cfg.n_layer)  # block_input[1], Key corrupted
    assert main["value"] > 0.9, main
    assert abs(main["query"]) < 0.1 and abs(main["key"]) < 0.1, main
    assert mech.verdict(rows, cfg.n_layer).startswith("induction"), mech.verdict(rows, cfg.n_layer)
    A = lambda site, layer, p: row(rows, site, layer, p)["attrib"]
    # the other sites tell the same story, which checks that each site is hooked where it says:
    assert A("block_input", 0, "key") == pytest.approx(1.0, abs=1e-6)  # the corrupted token itself
    assert A("mixer_input", 0, "key") > 0.99 and abs(A("mixer_output", 0, "key")) < 0.05
    assert A("mixer_output", 0, "value") > 0.99   # layer 0's head writes the binding at the Value
    assert A("mixer_input", 1, "value") > 0.99    # ... which layer 1's head reads there
    assert A("mixer_output", 1, "query") > 0.99 and A("block_output", 1, "query") > 0.99  # the answer
    assert abs(A("mixer_output", 1, "value")) < 0.05
    for site in ("mlp_input", "mlp_output"):      # the MLPs output 0 whatever their input
        for l in range(2):
            for p in mech.POSITIONS:
                assert A(site, l, p) == 0.0, (site, l, p)
    # value+2 is the Query for the documents whose queried pair is the last one: those are left out
    # of its cell, which would otherwise restore their share of the answer
    coincide = int((data.pos["value"] + 2 == data.pos["query"]).sum())
    assert 0 < coincide < len(data) and row(rows, "block_output", 1, "value+2")["n"] == len(data) - coincide
    assert abs(A("block_output", 1, "value+2")) < 0.02
    assert abs(A("block_output", 1, "value+1")) < 0.02  # the divider or the next key: nothing there


def test_without_the_previous_token_head_there_is_no_induction():
    model, cfg, task = build_induction_model(previous_token_head=False)
    data = task.sample(32, mech.rng_for(cfg.seed, "test"))
    assert mech.evaluate(model, data)["accuracy"] < 0.2
    rows = mech.interchange(model, task, data, "key")
    v = mech.verdict(rows, cfg.n_layer)
    assert not v.startswith("induction") and v.startswith("not learned"), v


def test_induction_one_layer_earlier_is_still_induction():
    """The same circuit in the first two of three layers: before the last layer the answer is already
    at the Query (the main setting reads Attrib@Query = 1, @Value = 0), yet the mechanism is induction,
    visible entering layer 1, and the verdict must say so."""
    model, cfg, task = build_induction_model(n_layer=3)
    data = task.sample(32, mech.rng_for(cfg.seed, "test"))
    assert mech.evaluate(model, data)["accuracy"] >= 0.95
    rows = mech.interchange(model, task, data, "key")
    main = mech.verdict_attribs(rows, cfg.n_layer)  # block_input[2]
    assert main["query"] > 0.99 and abs(main["value"]) < 0.02 and abs(main["key"]) < 0.02, main
    assert row(rows, "block_input", 1, "value")["attrib"] > 0.99
    assert mech.verdict(rows, cfg.n_layer) == ("induction: the key-value binding is stored at the Value "
                                               "position before layer 1")


# ── 3. the verdict on synthetic rows ──────────────────────────────────────────────────────────

def synthetic(attrib, p_clean=0.9, p_corr=0.1, n_layer=2, corrupted="key", layer=None):
    """Rows as interchange returns them: block_input of `layer` (default the last) gets `attrib`
    (position -> value); the block inputs before it hold the association at the Key, as an embedding
    does; every other cell gets a distractor (1.0 at the Value), so that a verdict read off the wrong
    cell fails."""
    main = mech.verdict_site(n_layer) if layer is None else ("block_input", layer)
    rows = []
    for site in ("block_input", "block_output", "mixer_output"):
        for l in range(n_layer):
            for p in mech.POSITIONS:
                if (site, l) == main:
                    a = attrib.get(p, 0.0)
                elif site == "block_input" and (l < main[1] or l == 0):  # the embedding, too
                    a = 1.0 if p == "key" else 0.0
                else:
                    a = 1.0 if p == "value" else 0.0
                rows.append(dict(corrupted=corrupted, site=site, layer=l, position=p, n=32,
                                 p_clean=p_clean, p_corr=p_corr,
                                 p_patch=p_corr + a * (p_clean - p_corr), attrib=a))
    return rows


@pytest.mark.parametrize("n_layer", [1, 2, 3])
def test_verdict_names_the_dominant_position(n_layer):
    V = lambda **a: mech.verdict(synthetic(a, n_layer=n_layer), n_layer)
    assert V(value=0.98, query=0.01, key=-0.02).startswith("induction")
    assert V(query=1.0, value=0.0, key=0.0).startswith("direct retrieval at the last position")
    assert V(key=0.95, value=0.05, query=0.1).startswith("direct retrieval, late")
    # thresholds: dominant >= VERDICT_DOMINANT, all others <= 1 - VERDICT_DOMINANT
    hi, lo = mech.VERDICT_DOMINANT, 1 - mech.VERDICT_DOMINANT
    assert V(value=hi, query=lo, key=lo).startswith("induction")
    assert V(value=hi - 0.01, query=0.0, key=0.0).startswith("mixed")
    assert V(value=0.9, query=lo + 0.01, key=0.0).startswith("mixed")
    m = V(query=0.55, key=0.45, value=0.0)
    assert m.startswith("mixed") and "Attrib@Query 0.55" in m and "Attrib@Key 0.45" in m and "Attrib@Value 0.00" in m
    assert V(value=0.5, query=0.5).startswith("mixed")
    # an undefined Attrib (no effect on the documents where Key / Value are distinct, as in a sibling
    # task whose Key is its Value in 68 % of documents) names nothing and lets the others decide
    nan = float("nan")
    assert V(query=1.0, value=nan, key=nan).startswith("direct retrieval at the last position")
    assert V(value=nan, key=nan, query=0.5).startswith("mixed")
    assert mech.dominant(dict(key=nan, value=nan, query=nan)) is None


def test_verdict_of_a_deep_model_reads_the_first_layer_past_the_key():
    # a 3-layer induction model: the Value holds the binding entering layer 1, and layer 1 already
    # moves the answer to the Query, so the last layer's input alone would look like direct retrieval
    rows = synthetic(dict(value=1.0), n_layer=3, layer=1)
    for r in rows:
        if (r["site"], r["layer"]) == ("block_input", 2):
            r["attrib"] = float(r["position"] == "query")
    assert mech.verdict_attribs(rows, 3)["query"] == 1.0
    assert mech.verdict(rows, 3) == ("induction: the key-value binding is stored at the Value position "
                                     "before layer 1")
    # direct retrieval already entering layer 1
    assert mech.verdict(synthetic(dict(query=1.0), n_layer=3, layer=1), 3).endswith("before layer 1")
    # the Key holds the association entering layer 1: the verdict reads the last layer, as with 2 layers
    v = mech.verdict(synthetic(dict(value=0.9), n_layer=3, layer=2), 3)
    assert v.startswith("induction") and v.endswith("before the last layer")
    assert mech.verdict(synthetic(dict(key=0.95), n_layer=3), 3).startswith("direct retrieval, late")


def test_verdict_not_learned_below_the_minimum_effect():
    small_effect = 0.9 * mech.VERDICT_MIN_EFFECT
    for a in (dict(value=1.0), dict(query=1.0), dict(key=1.0)):
        v = mech.verdict(synthetic(a, p_clean=0.2 + small_effect, p_corr=0.2), 2)
        assert v.startswith("not learned"), v
        assert mech.verdict(synthetic(a, p_clean=0.2 + 1.1 * mech.VERDICT_MIN_EFFECT, p_corr=0.2), 2)[:3] != "not"
    # a corruption that raises p(answer) is no effect either
    assert mech.verdict(synthetic(dict(value=1.0), p_clean=0.1, p_corr=0.6), 2).startswith("not learned")
    # the effect is read from the Key-corrupted rows, whatever their order among the Value-corrupted ones
    rows = synthetic(dict(value=1.0), p_clean=0.95, p_corr=0.05, corrupted="value") + synthetic(
        dict(value=1.0), p_clean=0.3, p_corr=0.28)
    assert mech.verdict(rows, 2).startswith("not learned")
    rows = synthetic(dict(query=1.0), p_clean=0.3, p_corr=0.28, corrupted="value") + synthetic(dict(value=1.0))
    assert mech.verdict(rows, 2).startswith("induction")


def test_main_setting_reads_the_last_layers_block_input():
    rows = synthetic(dict(key=0.1, value=0.7, query=0.2), n_layer=3) + synthetic(dict(value=0.0), corrupted="value")
    assert mech.verdict_attribs(rows, 3) == {p: dict(key=0.1, value=0.7, query=0.2).get(p, 0.0) for p in mech.POSITIONS}


def test_mechanism_report_marks_the_main_row_and_ends_with_the_verdict():
    rows = synthetic(dict(value=1.0), p_clean=0.9, p_corr=0.1)
    text = mech.mechanism_report(rows, 2)
    lines = text.splitlines()
    (main,) = [line for line in lines if "<- verdict" in line]
    assert main.startswith("block_input[1]")
    assert lines[-1] == "verdict: " + mech.verdict(rows, 2)
    assert "p(answer): clean 0.900, Key corrupted 0.100" in text
    assert "short conv" not in text


def test_mechanism_report_reads_p_from_the_key_corrupted_rows():
    """The report's "Key corrupted" line must come from the Key-corrupted rows even when the
    Value-corrupted rows come first in the list (the table and the verdict already filter on them)."""
    rows = synthetic(dict(value=1.0), p_clean=0.95, p_corr=0.55, corrupted="value") + synthetic(
        dict(value=1.0), p_clean=0.9, p_corr=0.1)
    text = mech.mechanism_report(rows, 2)
    assert "p(answer): clean 0.900, Key corrupted 0.100" in text, text.splitlines()[-2]


def test_one_layer_verdict_reads_its_mixer_output():
    """A 1-layer model's only block input is the embedding, where patching the Key undoes the
    corruption itself (@Key = 1 by construction): the verdict reads the layer's mixer output."""
    rows = synthetic(dict(query=1.0), n_layer=1)
    assert row(rows, "block_input", 0, "key")["attrib"] == 1.0
    assert mech.verdict_attribs(rows, 1) == {p: float(p == "query") for p in mech.POSITIONS}
    assert mech.verdict(rows, 1) == ("direct retrieval at the last position: the answer is computed at "
                                     "the Query by the one layer's mixer")
    (main,) = [line for line in mech.mechanism_report(rows, 1).splitlines() if "<- verdict" in line]
    assert main.startswith("mixer_output[0]")
    assert mech.verdict(synthetic({}, n_layer=1), 1).startswith("mixed")  # the embedding's @Key 1: no verdict
    model, cfg, task, data = small("mamba", n_layer=1)  # and on a real model's rows
    real = mech.interchange(model, task, data, "key")
    assert mech.verdict_attribs(real, 1) == {p: row(real, "mixer_output", 0, p)["attrib"] for p in mech.POSITIONS}


def test_value_plus_k_is_averaged_only_where_it_is_not_the_divider_or_the_query():
    model, cfg, task, data = small("attention")
    data = task.sample(40, mech.rng_for(0, "coincide"))
    last = data.pos["value"] + 1 == data.pos["divider"]  # the queried pair is the last one
    assert 0 < last.sum() < len(data)
    rows = mech.interchange(model, task, data, "key")
    bad, keep = bad_ids_of(task, data), ~last
    clean, corr = mech.p_answer(model, data).double(), mech.p_answer(model, data, bad).double()
    cache = clean_cache(model, data, [("block_input", 1)])["block_input", 1]
    for p, shift in (("value+1", 1), ("value+2", 2)):
        r = row(rows, "block_input", 1, p)
        pos = data.pos["value"] + shift
        with torch.no_grad(), mech.intervene(model, "block_input", 1,
                                             mech.patched(pos, cache[torch.arange(len(data)), pos])):
            patch = mech.p_answer(model, data, bad).double()
        want = (patch[keep].mean() - corr[keep].mean()) / (clean[keep].mean() - corr[keep].mean())
        assert r["n"] == keep.sum() and r["attrib"] == pytest.approx(want.item(), rel=1e-6)
        assert r["p_clean"] == pytest.approx(clean[keep].mean().item(), rel=1e-6)
    assert row(rows, "block_input", 1, "divider")["n"] == row(rows, "block_input", 1, "query")["n"] == 40
    n = int(keep.sum())
    assert f"documents averaged: @value+1 {n}, @value+2 {n} of 40" in mech.mechanism_report(rows, 2)
    # ATR: Value+1 is the divider (and Value+2 the Query) in a large share of documents
    atr = mech.make_task(mech.Config(task="atr"))
    docs = atr.sample(400, mech.rng_for(7, "test"), split="test")
    at_divider = docs.pos["value"] + 1 == docs.pos["divider"]
    assert 0.3 < at_divider.float().mean() < 0.6
    assert torch.equal(mech.distinct(docs, "value+1"), ~at_divider)
    assert (docs.pos["value"][at_divider] + 2 == docs.pos["query"][at_divider]).all()


def test_the_conv_gloss_says_what_this_run_shows_and_only_when_it_reacts():
    def with_conv(rows, k=0.0, v=0.0, v1=1.0):
        at = dict(key=k, value=v, **{"value+1": v1})
        return rows + [dict(r, site="conv_output", layer=0, attrib=at.get(r["position"], 0.0))
                       for r in rows if (r["site"], r["layer"]) == ("block_input", 0)]
    text = mech.mechanism_report(with_conv(synthetic(dict(query=1.0))), 2)
    assert ("layer 0's short conv output restores Attrib 0.00 at the Key, 0.00 at the Value, 1.00 at "
            "Value+1; here the conv at the token after the Value") in text and "paper" not in text
    partial = mech.mechanism_report(with_conv(synthetic(dict(query=1.0)), k=0.9, v1=0.2), 2)
    assert "0.90 at the Key" in partial and "here the conv" not in partial
    weak = synthetic(dict(query=1.0), p_clean=0.2 + 0.5 * mech.VERDICT_MIN_EFFECT, p_corr=0.2)
    assert "short conv" not in mech.mechanism_report(with_conv(weak), 2)  # an untrained model: no gloss


# ── 4. the report and the run folder ──────────────────────────────────────────────────────────

TINY = ["--arch", "attention", "--d-model", "16", "--num-kv", "64", "--n-train", "256", "--steps", "30",
        "--eval-every", "10", "--n-eval", "32", "--threads", "1", "--no-dynamics"]


def read_metrics(out):
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == y[k] or (isinstance(x[k], float) and math.isnan(x[k]) and math.isnan(y[k])), (x, y, k)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("interventions") / "run")
    mech.main([*TINY, "--out", out])
    torch.set_num_threads(1)
    return out


def test_a_run_records_its_interventions(run_dir):
    m = read_metrics(run_dir)
    iv = m["interventions"]
    assert set(iv) >= {"rows", "main", "verdict"}
    rows = iv["rows"]
    n_cells = 2 * 6 * len(mech.POSITIONS)  # 2 layers x 6 sites x positions, for each corruption
    assert len(rows) == 2 * n_cells
    assert {r["corrupted"] for r in rows} == {"key", "value"}
    assert set(rows[0]) == {"corrupted", "site", "layer", "position", "n", "p_clean", "p_corr", "p_patch",
                            "attrib"}
    assert iv["n_docs"] == 32 and {r["n"] for r in rows if "+" not in r["position"]} == {32}
    assert iv["main"] == mech.verdict_attribs(rows, 2)
    assert set(iv["main"]) == set(mech.POSITIONS)
    assert iv["verdict"] == mech.verdict(rows, 2)
    # and they are the interventions of the saved model on the run's test documents
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = mech.Config(**json.load(f))
    model, _ = mech.train(cfg, run_dir, log=lambda m: None)  # a finished run is loaded
    task = mech.make_task(cfg)
    data = task.sample(cfg.n_eval, mech.rng_for(cfg.seed, "test"))
    same_rows(json.loads(json.dumps(mech.interchange(model, task, data, "key", cfg.seed))), rows[:n_cells])


def test_the_same_command_prints_the_table_again_from_metrics_json(run_dir, capsys,
                                                                  monkeypatch):
    before = read_metrics(run_dir)
    monkeypatch.setattr(mech, "analyse", lambda *a: pytest.fail("analysed again"))
    capsys.readouterr()
    m = mech.main([*TINY, "--out", run_dir])
    printed = capsys.readouterr().out
    assert "verdict:" in printed and "<- verdict" in printed
    assert ("verdict: " + before["interventions"]["verdict"]) in printed
    (main_line,) = [line for line in printed.splitlines() if "<- verdict" in line]
    assert main_line.startswith("block_input[1]")
    assert mech.mechanism_report(before["interventions"]["rows"], 2) in printed
    same_rows(json.loads(json.dumps(m["interventions"]["rows"])), before["interventions"]["rows"])
    assert json.dumps(read_metrics(run_dir)) == json.dumps(before)  # unchanged


def test_no_interventions_writes_no_table(tmp_path, capsys):
    out = str(tmp_path / "run")
    m = mech.main([*TINY, "--out", out, "--no-interventions"])
    assert "interventions" not in m and "interventions" not in read_metrics(out)
    assert os.path.exists(os.path.join(out, "model.pt"))
    assert "verdict:" not in capsys.readouterr().out


def test_a_nan_effect_is_no_verdict():
    """p(answer) NaN (a broken model): no mechanism is named, not even "mixed"."""
    rows = synthetic({"value": 1.0}, p_clean=math.nan)
    assert mech.verdict(rows, 2) == "no verdict: p(answer) is NaN"
