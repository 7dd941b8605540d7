import numpy as np
import pytest
import torch

import mech


def sample(n=500, num_kv=8192, n_pairs=16, seed=0, stream="test"):
    return mech.AR(num_kv, n_pairs).sample(n, mech.rng_for(seed, stream))


def pair_tokens(ex, n_pairs=16):
    keys = ex.ids[:, 1:2 * n_pairs + 1:2]
    values = ex.ids[:, 2:2 * n_pairs + 2:2]
    return keys, values


def assert_distinct_rows(x):
    s = x.sort(dim=1).values
    assert (s[:, 1:] != s[:, :-1]).all()


def test_layout():
    task = mech.AR()
    ex = sample()
    assert task.vocab_size == 8196 and task.length == 37
    assert ex.ids.shape == (500, 37) and ex.ids.dtype == torch.long
    assert (ex.ids[:, 0] == mech.BOS).all()
    assert (ex.ids[:, 33] == mech.EOS).all()  # divider
    assert (ex.ids[:, 36] == mech.EOS).all()
    assert (ex.ids != mech.PAD).all()
    keys, values = pair_tokens(ex)
    assert ((keys >= 3) & (keys < 3 + 4096)).all()
    assert ((values >= 4099) & (values < 8195)).all()
    assert ((ex.ids[:, 34] >= 3) & (ex.ids[:, 34] < 4099)).all()
    assert ((ex.ids[:, 35] >= 4099) & (ex.ids[:, 35] < 8195)).all()
    assert ex.ids.max() < task.vocab_size


def test_keys_and_values_distinct_within_document():
    keys, values = pair_tokens(sample(2000))
    assert_distinct_rows(keys)
    assert_distinct_rows(values)


def test_named_positions():
    ex = sample()
    n = len(ex)
    assert set(ex.pos) >= {"key", "value", "divider", "query", "answer"}
    for name, p in ex.pos.items():
        assert p.shape == (n,) and p.dtype == torch.long, name
    rows = torch.arange(n)
    assert (ex.pos["divider"] == 33).all()
    assert (ex.pos["query"] == 34).all()
    assert (ex.pos["answer"] == 35).all()
    assert (ex.pos["value"] == ex.pos["key"] + 1).all()
    assert ((ex.pos["key"] % 2 == 1) & (ex.pos["key"] >= 1) & (ex.pos["key"] <= 31)).all()
    # the query repeats the key at pos["key"]; the answer is the value stored next to it
    assert (ex.ids[rows, ex.pos["query"]] == ex.ids[rows, ex.pos["key"]]).all()
    assert (ex.ids[rows, ex.pos["answer"]] == ex.ids[rows, ex.pos["value"]]).all()
    assert torch.equal(ex.answer, ex.ids[:, 35])
    # and the queried key occurs nowhere else among the keys
    keys, _ = pair_tokens(ex)
    assert ((keys == ex.ids[:, 34:35]).sum(1) == 1).all()


def test_same_seed_same_data_other_seed_or_stream_differs():
    a, b = sample(seed=3), sample(seed=3)
    assert torch.equal(a.ids, b.ids)
    for name in a.pos:
        assert torch.equal(a.pos[name], b.pos[name])
    assert not torch.equal(a.ids, sample(seed=4).ids)
    assert not torch.equal(a.ids, sample(seed=3, stream="train").ids)


def test_rng_for_streams_are_independent_and_reproducible():
    x = mech.rng_for(1, "train").integers(0, 2**31, 8)
    assert np.array_equal(x, mech.rng_for(1, "train").integers(0, 2**31, 8))
    assert not np.array_equal(x, mech.rng_for(1, "test").integers(0, 2**31, 8))
    assert not np.array_equal(x, mech.rng_for(2, "train").integers(0, 2**31, 8))


def test_rng_for_distinguishes_streams_with_a_common_prefix():
    # train() names its per-step streams "train-step-<s>": each step must get its own generator
    names = ["train", "train-step-0", "train-step-1", "train-step-10", "test", "test-2"]
    draws = [mech.rng_for(42, name).integers(0, 2**62) for name in names]
    assert len(set(draws)) == len(names), dict(zip(names, draws))


def test_examples_indexing_keeps_positions_aligned():
    ex = sample(20)
    for index in (slice(3, 9), torch.tensor([7, 0, 19, 7]), torch.arange(20) % 2 == 0):
        sub = ex[index]
        assert torch.equal(sub.ids, ex.ids[index])
        for name in ex.pos:
            assert torch.equal(sub.pos[name], ex.pos[name][index]), name
        rows = torch.arange(len(sub))
        assert (sub.ids[rows, sub.pos["query"]] == sub.ids[rows, sub.pos["key"]]).all()
        assert torch.equal(sub.answer, ex.answer[index])
    assert len(ex[2:5]) == 3
    moved = ex.to("cpu")
    assert torch.equal(moved.ids, ex.ids) and torch.equal(moved.pos["key"], ex.pos["key"])


def test_small_vocabulary_uses_shuffle_path_and_stays_distinct():
    num_kv, P = 40, 16  # 20 keys: 16 * 16 > 2 * 20, so distinct_ints shuffles the range
    task = mech.AR(num_kv, P)
    ex = task.sample(1000, mech.rng_for(0, "small"))
    keys, values = pair_tokens(ex)
    assert_distinct_rows(keys)
    assert_distinct_rows(values)
    assert ((keys >= 3) & (keys < 23)).all()
    assert ((values >= 23) & (values < 43)).all()
    assert task.vocab_size == 44
    rows = torch.arange(len(ex))
    assert (ex.ids[rows, ex.pos["query"]] == ex.ids[rows, ex.pos["key"]]).all()
    assert (ex.answer == ex.ids[rows, ex.pos["value"]]).all()
    # every key id shows up: the shuffle covers the whole range, not a prefix of it
    assert set(keys.unique().tolist()) == set(range(3, 23))


@pytest.mark.parametrize("k, high", [(16, 20), (16, 4096), (5, 5), (1, 1), (3, 1000)])
def test_distinct_ints(k, high):
    x = mech.distinct_ints(mech.rng_for(0, "d"), 300, k, high)
    assert x.shape == (300, k)
    assert x.min() >= 0 and x.max() < high
    s = np.sort(x, axis=1)
    assert (s[:, 1:] != s[:, :-1]).all()


def test_distinct_ints_uniform_over_range():
    x = mech.distinct_ints(mech.rng_for(0, "u"), 4000, 4, 8)  # shuffle path
    counts = np.bincount(x.ravel(), minlength=8)
    assert np.abs(counts / counts.sum() - 1 / 8).max() < 0.02
    first = np.bincount(x[:, 0], minlength=8)  # and in random order, not sorted
    assert np.abs(first / first.sum() - 1 / 8).max() < 0.03


def test_queried_pair_roughly_uniform():
    n = 4000
    ex = sample(n, seed=7)
    i = (ex.pos["key"] - 1) // 2
    counts = torch.bincount(i, minlength=16).double()
    assert len(counts) == 16
    expected = n / 16
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 50, counts  # 15 degrees of freedom: p < 1e-5 above 50
