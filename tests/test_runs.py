"""A run folder holds one run; faults and interruptions end in one line and lose nothing."""
import fcntl
import json
import os
import signal

import pytest
import torch

import mech

TINY = ["--arch", "attention", "--d-model", "16", "--num-kv", "64", "--n-train", "256", "--steps",
        "30", "--eval-every", "10", "--n-eval", "32", "--quiet", "--no-interventions",
        "--threads", "1"]


def run(args, capsys):
    """(exit code, stderr) of mech.main(args); 0 if it returned."""
    before = torch.get_num_threads()
    try:
        mech.main(args)
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        torch.set_num_threads(before)
    return code, capsys.readouterr().err


def one_line(err, *needles):
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_a_folder_with_another_configuration_is_refused_and_kept(tmp_path, capsys):
    out = str(tmp_path / "x")
    assert run([*TINY, "--out", out], capsys)[0] == 0
    before = {f: open(os.path.join(out, f), "rb").read() for f in ("config.json", "metrics.json")}
    code, err = run([*TINY, "--lr", "3e-3", "--out", out], capsys)
    assert code == 1
    one_line(err, out, "holds another run", "lr 0.001 (asked: 0.003)", "--force")
    assert before == {f: open(os.path.join(out, f), "rb").read() for f in before}  # untouched
    code, err = run([*TINY, "--lr", "3e-3", "--out", out, "--force"], capsys)
    assert code == 0, err
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["lr"] == 3e-3


def test_a_checkpoint_resumes_only_the_configuration_that_made_it(tmp_path):
    cfg = mech.Config(arch="attention", d_model=16, num_kv=64, n_train=256, steps=40,
                      eval_every=10, n_eval=32)
    other = mech.Config(**{**cfg.__dict__, "lr": 3e-3})
    a, b = tmp_path / "a", tmp_path / "b"
    mech.train(other, str(b), device="cpu", log=lambda m: None, checkpoint_every_s=0)
    os.makedirs(a)
    mech.claim(str(a), cfg).close()
    model = mech.build_model(other, 68)
    opt = torch.optim.AdamW(model.parameters())
    torch.save(dict(step=20, curve=[], elapsed=0.0, since=20, loss_sum=0.0, model=model.state_dict(),
                    optimizer=opt.state_dict(), identity=mech.identity(other)), a / "checkpoint.pt")
    with pytest.raises(mech.RunError, match="made by another configuration"):
        mech.train(cfg, str(a), device="cpu", log=lambda m: None)


def test_a_second_process_on_the_same_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "x"
    os.makedirs(out)
    with open(out / ".lock", "w") as held:  # another live process holds the folder
        fcntl.flock(held, fcntl.LOCK_EX)
        code, err = run([*TINY, "--out", str(out)], capsys)
        assert code == 1
        one_line(err, "in use by another process")
    assert run([*TINY, "--out", str(out)], capsys)[0] == 0  # released: a dead one leaves no lock


@pytest.mark.parametrize("args, needles", [
    (["--steps", "10", "--epochs", "1"], ["--steps", "--epochs", "not both"]),
    (["--task", "atr", "--num-kv", "64"], ["--num-kv", "--task ar"]),
    (["--atr", "medium"], ["--atr", "--task atr"]),
    (["--held-out", "0.2"], ["--held-out", "atr"]),
    (["--scan", "ref"], ["--scan", "--arch mamba"]),
    (["--arch", "mamba", "--hyena-d-skip"], ["--hyena-d-skip", "--arch hyena"]),
    (["--decay-frac", "0.3", "--schedule", "cosine"], ["--decay-frac", "--schedule wsd"]),
    (["--load", "somewhere", "--lr", "1e-3"], ["--load", "lr"]),
])
def test_contradictory_or_inapplicable_flags_are_refused(args, needles, tmp_path, capsys):
    code, err = run([*args, "--out", str(tmp_path / "x")], capsys)
    assert code == 2
    one_line(err, *needles)


@pytest.mark.parametrize("held_out", ["1e-9", "0.9999"])
def test_a_held_out_fraction_that_splits_nothing_is_refused(held_out, tmp_path, capsys):
    code, err = run(["--task", "atr", "--held-out", held_out, "--steps", "5", "--d-model", "16",
                     "--n-train", "64", "--n-eval", "8", "--out", str(tmp_path / "x")], capsys)
    assert code == 1
    one_line(err, f"--held-out {float(held_out):g}", "of the 400")


def test_an_explicit_epochs_wins_over_the_presets_steps(tmp_path):
    cfg = mech.config_from_args(mech.build_parser().parse_args(["--epochs", "1", "--n-train", "64"]))
    assert cfg.total_steps == 2 and cfg.steps is None


def test_divergence_far_above_a_uniform_guess_stops_the_run(tmp_path, capsys):
    code, err = run([*TINY, "--lr", "100", "--out", str(tmp_path / "x")], capsys)
    assert code == 1
    one_line(err, "training loss reached", "uniform guess", "lower --lr than 100")


@pytest.mark.parametrize("name, damage", [
    ("config.json", lambda b: b[:len(b) // 2]), ("metrics.json", lambda b: b[:10]),
    ("model.pt", lambda b: b[:100])])
def test_damaged_files_end_in_one_line_that_suggests_force(name, damage, tmp_path, capsys):
    out = str(tmp_path / "x")
    assert run([*TINY, "--out", out], capsys)[0] == 0
    path = os.path.join(out, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    args = ["--load", out] if name == "model.pt" else [*TINY, "--out", out, "--interventions"]
    code, err = run(args, capsys)
    assert code == 1
    one_line(err, name, "corrupt or truncated", "--force")


def test_an_out_that_is_a_file_ends_in_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, err = run([*TINY, "--out", str(tmp_path / "file")], capsys)
    assert code == 1
    one_line(err, "error:", "file")


def test_sigint_saves_a_checkpoint_and_the_rerun_ends_where_an_uninterrupted_run_does(tmp_path,
                                                                                       monkeypatch):
    cfg = mech.Config(arch="attention", d_model=16, num_kv=64, n_train=256, steps=40,
                      eval_every=10, n_eval=32, seed=3)
    torch.set_num_threads(1)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under nohup ... &
    _, full = mech.train(cfg, str(tmp_path / "full"), device="cpu", log=lambda m: None)
    out = str(tmp_path / "stopped")
    lines = []
    lr_at = mech.lr_at

    def ctrl_c_during_the_eleventh_step(step, cfg):
        if step == 10:
            os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C: handled, not a traceback
        return lr_at(step, cfg)
    monkeypatch.setattr(mech, "lr_at", ctrl_c_during_the_eleventh_step)
    with pytest.raises(mech.Interrupted, match="stopped at step 11 of 40; the same command"):
        mech.train(cfg, out, device="cpu", log=lines.append)
    monkeypatch.setattr(mech, "lr_at", lr_at)
    assert torch.load(os.path.join(out, "checkpoint.pt"))["step"] == 11  # between two evaluations
    _, resumed = mech.train(cfg, out, device="cpu", log=lines.append)
    assert any("resuming" in m and "step 11" in m for m in lines)
    strip = lambda curve: [{k: v for k, v in p.items() if k != "time_s"} for p in curve]
    assert strip(resumed["curve"]) == strip(full["curve"])
    a, b = torch.load(os.path.join(out, "model.pt")), torch.load(tmp_path / "full" / "model.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler restored


def test_a_model_that_cannot_fit_in_memory_ends_in_one_line(tmp_path):
    """The process's address space is capped at 6 GiB, so that the model (d 2,000,000: 65 GB of
    embedding alone) is refused by the allocator without this machine's memory being touched."""
    import resource
    import subprocess
    import sys

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2 ** 30, 6 * 2 ** 30))
    p = subprocess.run([sys.executable, "mech.py", *TINY, "--d-model", "2000000", "--out",
                        str(tmp_path / "x")], cwd=os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__))), capture_output=True, text=True,
                       timeout=300, preexec_fn=cap)
    assert p.returncode == 1, p.stderr
    one_line(p.stderr, "can't allocate memory")


def test_scan_ext_without_a_compiler_ends_in_one_line(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, CXX="no-such-compiler", MECH_SCAN_CACHE=str(tmp_path / "cache"))
    tiny = [a for a in TINY[2:] if a not in ("--n-train", "256")]  # Mamba on AR: fresh data
    p = subprocess.run([sys.executable, "mech.py", "--arch", "mamba", "--scan", "ext", *tiny,
                        "--out", str(tmp_path / "x")], cwd=os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__))), env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1
    one_line(p.stderr, "scan backend 'ext' is unavailable", "no C++ compiler")


# ── issue 38: every fault ends in a result, one line, or a resumable stop ────────────────────
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(arch="attention", d_model=16, num_kv=64, n_train=256, steps=30, eval_every=10,
             n_eval=32, seed=5)


def without_time(curve):
    return [{k: v for k, v in p.items() if k != "time_s"} for p in curve]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of SMALL: what every stopped and resumed run must end as."""
    torch.set_num_threads(1)
    _, metrics = mech.train(mech.Config(**SMALL), str(tmp_path_factory.mktemp("ref") / "run"),
                            device="cpu", log=lambda m: None)
    return metrics


def signal_during(monkeypatch, name, when, sig=signal.SIGTERM):
    """Make mech.<name> send sig to this process on the calls where when(args, kwargs) is true."""
    original = getattr(mech, name)

    def wrapped(*args, **kwargs):
        if when(args, kwargs):
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)
    monkeypatch.setattr(mech, name, wrapped)


def small_args(out, *extra):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    return [*flags, "--out", str(out), "--quiet", "--threads", "1", *extra]


@pytest.mark.parametrize("where", ["data generation", "last step", "interventions"])
def test_a_stop_at_any_moment_resumes_to_the_same_final_metrics(where, reference, tmp_path,
                                                                monkeypatch, capsys):
    out = tmp_path / "run"
    if where == "data generation":
        signal_during(monkeypatch, "training_batches", lambda args, kwargs: True)
    elif where == "last step":  # lr_at(step, cfg)
        signal_during(monkeypatch, "lr_at", lambda args, kwargs: args[0] == SMALL["steps"] - 1)
    else:  # the analysis's interchange, not the light one of each evaluation (cells=...)
        signal_during(monkeypatch, "interchange", lambda args, kwargs: "cells" not in kwargs)
    code, err = run(small_args(out, "--interventions"), capsys)
    assert code == 130
    one_line(err, "stopped")
    monkeypatch.undo()
    code, err = run(small_args(out, "--interventions"), capsys)
    assert code == 0, err
    with open(out / "metrics.json") as f:
        metrics = json.load(f)
    assert without_time(metrics["curve"]) == without_time(reference["curve"])
    assert "interventions" in metrics and not os.path.exists(out / "checkpoint.pt")


def test_a_closed_terminal_saves_a_checkpoint_and_says_so(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "run"
    args = small_args(out, "--no-interventions")
    args[args.index("--steps=30")] = "--steps=3000"
    # a terminal's run: SIGHUP not ignored, as it is (and stays, for mech.py) under nohup
    p = subprocess.Popen([sys.executable, "mech.py", *[a for a in args if a != "--quiet"]],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    while not p.stdout.readline().startswith("step"):  # training has begun
        pass
    p.send_signal(signal.SIGHUP)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130
    one_line(err, "stopped at step", "the same command resumes")
    assert torch.load(out / "checkpoint.pt")["step"] >= 10


def test_checkpoints_follow_the_clock_not_the_evaluations(tmp_path, monkeypatch):
    cfg = mech.Config(**{**SMALL, "eval_every": 30})  # one evaluation, at the end
    saved = []

    class Clock:  # mech's clock: 7 seconds pass at each reading
        now = 0

        @classmethod
        def time(cls):
            cls.now += 7
            return cls.now

    def save_checkpoint(run):
        saved.append(run.step)
        run.last_save = Clock.now
    monkeypatch.setattr(mech, "time", Clock)
    monkeypatch.setattr(mech.RunFolder, "save_checkpoint", save_checkpoint)
    mech.train(cfg, str(tmp_path / "run"), device="cpu", log=lambda m: None)
    assert saved and saved[0] < 30  # a checkpoint long before the first evaluation


def test_a_full_disk_says_so_keeps_the_last_checkpoint_and_leaves_no_temporary_file(
        reference, tmp_path, monkeypatch):
    import errno
    out = tmp_path / "run"
    real_open = open

    def full_disk_for_the_model(path, mode="r", *args, **kwargs):
        if "model.pt.tmp" in str(path) and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr(mech, "open", full_disk_for_the_model, raising=False)
    with pytest.raises(mech.RunError, match="no space left on the device to write .*model.pt"):
        mech.train(mech.Config(**SMALL), str(out), device="cpu", log=lambda m: None,
                   checkpoint_every_s=0)
    assert os.path.exists(out / "checkpoint.pt")
    assert not [f for f in os.listdir(out) if ".tmp" in f]
    monkeypatch.undo()
    _, metrics = mech.train(mech.Config(**SMALL), str(out), device="cpu", log=lambda m: None)
    assert without_time(metrics["curve"]) == without_time(reference["curve"])


def test_output_that_a_reader_closes_early_neither_kills_the_run_nor_loses_it(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "run"
    args = [a for a in small_args(out, "--interventions") if a != "--quiet"]
    p = subprocess.Popen([sys.executable, "mech.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()  # `| head -1`
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 0 and err == b"", err
    with open(out / "metrics.json") as f:
        assert "interventions" in json.load(f)


def test_train_on_a_finished_folder_returns_it_as_saved(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(small_args(out, "--interventions"), capsys)[0] == 0
    before = (out / "metrics.json").read_bytes()
    lines = []
    _, metrics = mech.train(mech.Config(**SMALL), str(out), device="cpu", log=lines.append)
    assert "interventions" in metrics and (out / "metrics.json").read_bytes() == before
    assert any("already holds this run" in line for line in lines)


def test_threads_above_the_cores_are_capped_in_one_line(tmp_path, capsys):
    code, err = run(small_args(tmp_path / "run", "--threads", "100000000"), capsys)
    assert code == 0
    one_line(err, "--threads 100000000", f"using {os.cpu_count()}")
    with open(tmp_path / "run" / "metrics.json") as f:
        assert json.load(f)["threads"] == os.cpu_count()


@pytest.mark.parametrize("make, needles", [
    (lambda run: mech.build_model(mech.Config(arch="hyena", d_model=16, num_kv=64), 68),
     ["model.pt", "not this run's model", "--force"]),
])
def test_another_architectures_weights_end_in_one_line(make, needles, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(small_args(out), capsys)[0] == 0
    torch.save(make(out).state_dict(), out / "model.pt")
    code, err = run(["--load", str(out)], capsys)
    assert code == 1
    one_line(err, *needles)


@pytest.mark.parametrize("name, content", [
    ("metrics.json", "{}"), ("metrics.json", "[1, 2]"), ("metrics.json", '{"accuracy": 0.5}'),
    ("checkpoint.pt", [1, 2]), ("checkpoint.pt", {"step": 3}),
    ("model.pt", 5000), ("model.pt", 20000), ("checkpoint.pt", 5000)])
def test_files_of_the_wrong_shape_or_cut_short_end_in_one_line(name, content, tmp_path, capsys):
    out = tmp_path / "run"
    args = small_args(out, "--interventions")
    if name == "checkpoint.pt":  # a run stopped part-way, then its checkpoint damaged
        mech.claim(str(out), mech.Config(**SMALL)).close()
        model = mech.build_model(mech.Config(**SMALL), 68)
        torch.save(dict(model=model.state_dict()), out / name)
    else:  # a finished run whose analysis is still to come
        assert run(small_args(out, "--no-interventions"), capsys)[0] == 0
    path = out / name
    if isinstance(content, int):
        path.write_bytes(path.read_bytes()[:content])
    elif name.endswith(".json"):
        path.write_text(content)
    else:
        torch.save(content, path)
    code, err = run(args, capsys)
    assert code == 1
    one_line(err, name, "--force")


@pytest.mark.parametrize("args, needles", [
    (["--lr", "-1e-3"], ["lr must be a finite number > 0", "-0.001"]),
    (["--num-kv", "2", "--n-pairs", "1"], ["num_kv", "two keys"]),
    (["--n-train", "-50"], ["n_train must be >= 1"]),
    (["--fresh-data", "--epochs", "1", "--n-train", "16"], ["1 epoch", "16 documents", "no step"]),
    (["--fresh-data", "--bucket", "4"], ["--bucket", "--fresh-data"]),
    (["--arch", "based", "--long-conv", "--dconv", "2"], ["--dconv", "--long-conv"]),
    (["--seed", "-1"], ["seed", "-1"]), (["--seed", "18446744073709551616"], ["seed"]),
    (["--task", "atr", "--grammar-seed", "4294967296"], ["grammar_seed"]),
])
def test_bad_values_that_once_failed_deep_inside_are_refused_in_one_line(args, needles, tmp_path,
                                                                          capsys):
    code, err = run([*args, "--out", str(tmp_path / "x")], capsys)
    assert code == 2
    one_line(err, *needles)


@pytest.mark.parametrize("fields, needle", [
    (dict(n_layer=2.5), "n_layer must be int"), (dict(epochs=1.5), "epochs must be int"),
    (dict(d_conv=2.0, arch="mamba"), "d_conv must be int"), (dict(seed=1.5), "seed must be int"),
    (dict(seed=-1), "seed must be in"), (dict(num_kv=2), "num_kv must be"),
    (dict(pos_emb="yes"), "pos_emb must be bool"), (dict(lr=True), "lr must be float")])
def test_config_checks_its_own_fields(fields, needle):
    with pytest.raises(ValueError, match=needle):
        mech.Config(**fields)


@pytest.mark.parametrize("fields", [dict(warmup_frac=0.8),
                                    dict(warmup_frac=0.9, decay_frac=0.1),
                                    dict(schedule="cosine", warmup_frac=0.9)])
def test_long_warmups_are_accepted(fields):
    cfg = mech.Config(**fields)
    assert mech.lr_at(cfg.total_steps - 1, cfg) >= 0
