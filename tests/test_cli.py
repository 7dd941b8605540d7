import contextlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import mech

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ── command line: bad values ─────────────────────────────────────────────────────────────────

BAD = {  # case -> (arguments, strings the one-line message must contain)
    "arch": (["--arch", "foo"], ["'foo'", "arch"]),
    "task": (["--task", "foo"], ["'foo'", "task"]),
    "dconv-negative": (["--arch", "mamba", "--dconv", "-1"], ["-1", "d_conv"]),
    "dconv-attention": (["--arch", "attention", "--dconv", "3"], ["--dconv 3", "attention"]),
    "heads": (["--d-model", "10", "--heads", "3"], ["10", "3", "divisible"]),
    "pairs": (["--n-pairs", "100", "--num-kv", "64"], ["100", "n_pairs"]),
    "lr": (["--lr", "-1"], ["-1", "lr"]),
    "threads": (["--threads", "0"], ["--threads", "0"]),
    "preset": (["--preset", "foo"], ["'foo'", "preset"]),
}


def run_cli(args, timeout=120):
    return subprocess.run([sys.executable, "mech.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """All the bad command lines at once, in parallel: each pays Python's and torch's start-up."""
    out = tmp_path_factory.mktemp("cli")  # should a bad value be accepted, nothing lands in the repo
    procs = {name: subprocess.Popen([sys.executable, "mech.py", *args, "--out", str(out / name)], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (args, _) in BAD.items()}
    results = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # it was accepted and is training: a failure, stop it
            p.kill()
            stdout, stderr = p.communicate()
        results[name] = (p.returncode, stdout, stderr)
    return results


@pytest.mark.parametrize("case", list(BAD))
def test_bad_value_exits_2_with_one_line(bad_runs, case):
    rc, stdout, stderr = bad_runs[case]
    assert rc == 2, (rc, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for needle in BAD[case][1]:
        assert needle in lines[0], (needle, lines[0])
    assert stdout == ""


def test_help():
    r = run_cli(["--help"])
    assert r.returncode == 0, r.stderr
    for flag in ("--dconv", "--d-model", "--layers", "--lr", "--steps", "--epochs", "--batch-size", "--seed",
                 "--device", "--threads", "--num-kv", "--out", "--preset", "--fresh-data"):
        assert flag in r.stdout, flag


@pytest.mark.parametrize("args, needle", [
    (["--d-model", "abc"], "'abc'"),                 # argparse's own errors take the same one-line path
    (["--bogus"], "--bogus"),
    (["--arch", "mamba", "--dconv", "-2"], "-2"),
    (["--arch", "based", "--dconv", "0"], "0"),      # based needs a conv of width >= 1
    (["--arch", "h3", "--d-model", "15"], "15"),
    (["--arch", "mamba", "--heads", "2"], "n_head 2"),
    (["--steps", "0"], "steps"),
    (["--device", "tpu"], "tpu"),
])
def test_bad_values_in_process(capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        mech.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_cuda_device_is_rejected(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        mech.main(["--device", "cuda:0", "--d-model", "16", "--num-kv", "64", "--n-train", "64", "--steps", "2",
                   "--n-eval", "8", "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    assert "cuda:0" in capsys.readouterr().err


def test_config_rejects_bad_values_directly():
    with pytest.raises(ValueError, match="num_kv"):
        mech.Config(num_kv=7)
    with pytest.raises(ValueError, match="warmup_frac"):
        mech.Config(warmup_frac=1.0)


# ── learning-rate schedule ───────────────────────────────────────────────────────────────────

def schedule(total, **kw):
    cfg = mech.Config(steps=total, lr=1e-3, **{"schedule": "cosine", **kw})
    return cfg, [mech.lr_at(s, cfg) for s in range(total + 1)]


@pytest.mark.parametrize("total", [1000, 37])
def test_cosine_schedule(total):
    cfg, lrs = schedule(total)
    warm = int(0.1 * total)
    assert lrs[0] == 0
    assert lrs[warm] == pytest.approx(1e-3)
    assert max(lrs) == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(lrs[:warm], lrs[1:warm + 1]))          # warmup rises linearly
    assert lrs[warm // 2] == pytest.approx(1e-3 * (warm // 2) / warm)
    assert all(a > b for a, b in zip(lrs[warm:total], lrs[warm + 1:total + 1]))  # then falls
    assert lrs[total - 1] < 1e-3 * 0.01
    assert lrs[total] == pytest.approx(0, abs=1e-15)
    mid = warm + (total - warm) / 2
    if mid == int(mid):
        assert lrs[int(mid)] == pytest.approx(0.5e-3)


def test_linear_schedule():
    cfg, lrs = schedule(200, schedule="linear")
    assert lrs[0] == 0 and lrs[20] == pytest.approx(1e-3)
    decay = lrs[20:]
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert all(s == pytest.approx(1e-3 / 180) for s in steps)  # a straight line to 0
    assert lrs[199] == pytest.approx(1e-3 / 180) and lrs[200] == 0


@pytest.mark.parametrize("task", ["ar", "atr"])
@pytest.mark.parametrize("arch", list(mech.MIXERS))
def test_config_is_what_the_command_line_trains(arch, task):
    """mech.Config(arch=A, task=T) is exactly the run of `python mech.py --arch A --task T`: the CPU
    preset and its per-architecture recipes are Config's defaults."""
    cfg = mech.Config(arch=arch, task=task)
    assert mech.config_from_args(mech.build_parser().parse_args(["--arch", arch, "--task", task])) == cfg
    recipe = {("ar", "attention"): (30_000, 1e-3, False), ("ar", "mamba"): (20_000, 3e-3, True)}
    assert (cfg.steps, cfg.lr, cfg.fresh_data) == recipe.get((task, arch), (15_000, 1e-3, False))
    assert (cfg.preset, cfg.schedule, cfg.d_model, cfg.bucket) == ("cpu", "wsd", 64, 16 if task == "atr" else 0)
    paper = mech.Config(arch=arch, task=task, preset="paper")
    assert paper.total_steps == (50_016 if task == "ar" else 100_032)
    assert (paper.schedule, paper.lr, paper.fresh_data, paper.bucket) == ("cosine", 1e-3, False, 0)


@pytest.mark.parametrize("task", ["ar", "atr"])
@pytest.mark.parametrize("arch", list(mech.MIXERS))
def test_the_class_preset_is_the_cpu_preset_cut_short(arch, task):
    """--preset class (README: "The paper in one class") is the command line's run too: the CPU
    preset's recipe in 10,000 steps; on AR, attention and Based at d = 32 on 8 pairs and 50,000
    documents; on ATR, Mamba at 5e-3 after a warmup of 60 % of its steps; attention on AR and
    Mamba on ATR in 15,000 steps."""
    cfg = mech.Config(arch=arch, task=task, preset="class")
    args = ["--preset", "class", "--arch", arch, "--task", task]
    assert mech.config_from_args(mech.build_parser().parse_args(args)) == cfg
    cpu = mech.Config(arch=arch, task=task)
    small = task == "ar" and arch in ("attention", "based")
    assert (cfg.d_model, cfg.n_pairs, cfg.n_train) == ((32, 8, 50_000) if small else (64, 16, 100_032))
    assert cfg.steps == (15_000 if (task, arch) in (("ar", "attention"), ("atr", "mamba"))
                         else 10_000)
    assert (cfg.lr, cfg.warmup_frac) == ((5e-3, 0.6) if (task, arch) == ("atr", "mamba")
                                         else (cpu.lr, cpu.warmup_frac))
    assert (cfg.schedule, cfg.fresh_data, cfg.bucket) == (cpu.schedule, cpu.fresh_data, cpu.bucket)
    assert mech.identity(cfg) != mech.identity(cpu)  # another run, in another folder


def test_based_with_a_position_embedding_gets_its_own_rate_on_ar_only():
    """The CPU preset gives Based with PE on AR 3e-4 (at 1e-3 it memorises); --lr still wins, and
    Based without PE, or on ATR, or under the paper preset keeps 1e-3."""
    parse = lambda *a: mech.config_from_args(mech.build_parser().parse_args(list(a)))
    assert parse("--arch", "based", "--task", "ar", "--pos-emb").lr == 3e-4
    assert parse("--arch", "based", "--task", "ar", "--pos-emb", "--lr", "1e-3").lr == 1e-3
    assert parse("--arch", "based", "--task", "ar").lr == 1e-3
    assert parse("--arch", "based", "--task", "atr", "--pos-emb").lr == 1e-3
    assert parse("--arch", "based", "--task", "ar", "--pos-emb", "--preset", "paper").lr == 1e-3


def test_an_explicit_length_wins_over_the_presets():
    assert mech.Config(arch="attention", epochs=1, n_train=64).total_steps == 2
    assert mech.Config(arch="attention", preset="paper", steps=7).total_steps == 7
    with pytest.raises(ValueError, match="'laptop'"):
        mech.Config(preset="laptop")


def test_schedule_length_from_epochs():
    cfg = mech.Config(epochs=3, n_train=320, batch_size=32)
    assert cfg.total_steps == 30
    assert mech.lr_at(3, cfg) == pytest.approx(cfg.lr) and mech.lr_at(2, cfg) < cfg.lr


# ── end to end ───────────────────────────────────────────────────────────────────────────────

TINY = ["--arch", "attention", "--d-model", "16", "--num-kv", "64", "--n-train", "256", "--steps", "30",
        "--eval-every", "10", "--n-eval", "32", "--quiet", "--no-interventions"]


@contextlib.contextmanager
def one_thread():
    """Training runs use one thread, as the calibration runs do (--threads 1): on a loaded 2-core
    machine torch's 2-thread kernels are up to 30x slower for models this small. Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_main(args):
    with one_thread():
        return mech.main([*args, "--threads", "1"])


def without_time(curve):
    return [{k: v for k, v in point.items() if k != "time_s"} for point in curve]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "run"
    return out, run_main([*TINY, "--out", str(out)])


def test_main_writes_a_run(tiny_run):
    out, m = tiny_run
    assert {"config.json", "metrics.json", "model.pt"} <= set(os.listdir(out))
    assert "checkpoint.pt" not in os.listdir(out)
    with open(out / "metrics.json") as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(m))
    for key in ("accuracy", "curve", "wall_time_s", "steps_per_s", "test_loss", "n_params", "steps"):
        assert key in m, key
    assert m["steps"] == 30 and 0 <= m["accuracy"] <= 1
    assert [p["step"] for p in m["curve"]] == [10, 20, 30]
    assert m["accuracy"] == m["curve"][-1]["accuracy"]
    assert all(math.isfinite(p["train_loss"]) and math.isfinite(p["test_loss"]) for p in m["curve"])
    assert m["wall_time_s"] > 0 and m["steps_per_s"] > 0
    assert m["threads"] == 1  # --threads reached torch
    with open(out / "config.json") as f:
        cfg = json.load(f)
    assert cfg["arch"] == "attention" and cfg["d_model"] == 16 and cfg["steps"] == 30 and cfg["num_kv"] == 64


def test_load_run_reproduces_the_saved_accuracy(tiny_run):
    out, m = tiny_run
    model, cfg = mech.load_run(str(out))
    assert not model.training
    test = mech.make_task(cfg).sample(cfg.n_eval, mech.rng_for(cfg.seed, "test"))
    ev = mech.evaluate(model, test)
    assert ev["accuracy"] == m["accuracy"]
    assert ev["loss"] == pytest.approx(m["test_loss"], abs=1e-5)


def test_finished_run_is_not_retrained(tiny_run, monkeypatch, capsys):
    out, m = tiny_run

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")
    monkeypatch.setattr(mech, "train", no_training)
    assert run_main([*TINY, "--out", str(out)]) == json.loads(json.dumps(m))
    assert "already holds this run" in capsys.readouterr().out


def test_same_seed_same_curve(tiny_run, tmp_path):
    _, m = tiny_run
    again = run_main([*TINY, "--out", str(tmp_path / "again")])
    assert without_time(again["curve"]) == without_time(m["curve"])
    other_seed = run_main([*TINY, "--seed", "7", "--out", str(tmp_path / "seed7")])
    assert without_time(other_seed["curve"]) != without_time(m["curve"])


def test_fresh_data(tiny_run, tmp_path, monkeypatch):
    _, m = tiny_run
    batches = []
    sample = mech.AR.sample

    def recording_sample(self, n, rng, split="train"):
        ex = sample(self, n, rng, split)
        if n == 32:  # a training batch (the test set has 32 documents too, but is drawn first)
            batches.append(ex.ids)
        return ex
    monkeypatch.setattr(mech.AR, "sample", recording_sample)
    no_training_set = [a for a in TINY if a not in ("--n-train", "256")]  # --n-train: refused
    fresh = run_main([*no_training_set, "--fresh-data", "--out", str(tmp_path / "fresh")])
    batches = batches[1:]  # drop the test set
    assert len(batches) == 30  # one new batch per step, no fixed training set
    assert len({tuple(b.flatten().tolist()) for b in batches}) == 30
    assert os.path.exists(tmp_path / "fresh" / "model.pt")
    assert [p["step"] for p in fresh["curve"]] == [10, 20, 30]
    with open(tmp_path / "fresh" / "config.json") as f:
        assert json.load(f)["fresh_data"] is True
    # the same test set and initial weights, other training batches
    assert [p["train_loss"] for p in fresh["curve"]] != [p["train_loss"] for p in m["curve"]]


# ── resuming an interrupted run ──────────────────────────────────────────────────────────────

def resume_cfg():
    return mech.Config(arch="attention", d_model=16, num_kv=64, n_train=256, steps=40, eval_every=10,
                       n_eval=32, seed=3)


@pytest.fixture
def single_thread():
    with one_thread():
        yield


def test_interrupted_run_resumes_exactly(tmp_path, single_thread):
    cfg = resume_cfg()
    _, full = mech.train(cfg, str(tmp_path / "full"), device="cpu", log=lambda msg: None)
    assert not os.path.exists(tmp_path / "full" / "checkpoint.pt")

    out = tmp_path / "interrupted"
    progress = []

    def interrupt_on_second_progress_line(msg):
        if msg.startswith("step"):
            progress.append(msg)
            if len(progress) == 2:
                raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):  # checkpoint_every_s=0: a checkpoint before every step
        mech.train(cfg, str(out), device="cpu", log=interrupt_on_second_progress_line, checkpoint_every_s=0)
    assert os.path.exists(out / "checkpoint.pt") and not os.path.exists(out / "metrics.json")
    assert torch.load(out / "checkpoint.pt")["step"] == 19  # the last one before the crash at 20

    lines = []
    _, resumed = mech.train(cfg, str(out), device="cpu", log=lines.append)
    assert any(line.startswith("resuming") and "step 19" in line for line in lines), lines
    assert not os.path.exists(out / "checkpoint.pt")
    assert [p["step"] for p in resumed["curve"]] == [10, 20, 30, 40]
    assert resumed["accuracy"] == full["accuracy"]
    assert resumed["test_loss"] == full["test_loss"]
    assert without_time(resumed["curve"]) == without_time(full["curve"])
    with open(out / "metrics.json") as f:
        assert json.load(f)["accuracy"] == full["accuracy"]
    a, b = torch.load(out / "model.pt"), torch.load(tmp_path / "full" / "model.pt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
