"""A run's folder and its promises (issue 48): the same command gives the same numbers, resumes a
stopped or killed run exactly, completes what a stop left undone, never leaves half a file, shows
a finished run again without training, and refuses what it cannot use in one line.

Most tests run `python mech.py ...` in this process (mech.main); the two that need a real process
(a hangup, a kill -9) wait for the line the run prints, never for a time."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest
import torch

import mech
from conftest import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(arch="attention", d_model=16, num_kv=64, n_train=256, steps=40, eval_every=10,
            n_eval=32, seed=5)


def command(out, *extra, **fields) -> list:
    """The arguments of `python mech.py` for the TINY run (fields changed) in `out`."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, **fields}.items()]
    return [*flags, "--threads=1", "--no-dynamics", "--out", str(out), *extra]


def one_line(err, *needles):
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def result(out) -> tuple:
    """(metrics.json without the clock's numbers, as text; model.pt's tensors) of a run."""
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    m = {k: v for k, v in m.items() if k not in ("wall_time_s", "steps_per_s")}
    m["curve"] = [{k: v for k, v in p.items() if k != "time_s"} for p in m["curve"]]
    return json.dumps(m, sort_keys=True), torch.load(os.path.join(out, "model.pt"))  # NaN == NaN


def assert_same_run(out, reference):
    """The curve, metrics and interventions equal, the weights bit for bit."""
    (m, w), (m_ref, w_ref) = result(out), result(reference)
    assert m == m_ref
    assert w.keys() == w_ref.keys() and all(torch.equal(w[k], w_ref[k]) for k in w)
    assert not any(f.endswith(".tmp") or f == "checkpoint.pt" for f in os.listdir(out))


def files(out) -> dict:
    return {f: (out / f).read_bytes() for f in os.listdir(out)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, interventions included: what every stopped run must end as."""
    out = tmp_path_factory.mktemp("reference") / "run"
    mech.main(command(out))
    return out


@pytest.fixture
def finished(reference, tmp_path):
    """A copy of the finished reference run, to change."""
    return shutil.copytree(reference, tmp_path / "run")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped at step 14 (a stop during step 13): its folder holds a checkpoint."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as mp:
        stop_during_step(mp, 13)
        with pytest.raises(SystemExit):
            mech.main(command(out))
    return out


@pytest.fixture
def hangup_not_ignored():
    """SIGHUP as in a terminal, even if these tests run under nohup."""
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, before)


def stop_during_step(monkeypatch, step, signum=None):
    """During training step `step`, a stop arrives: the signal signum to this process, or (None)
    one appended to mech.STOP, as the signal handler does."""
    lr_at = mech.lr_at

    def hook(s, cfg):
        if s == step:
            if signum is None:
                mech.STOP.append(signal.SIGTERM)
            else:
                os.kill(os.getpid(), signum)
        return lr_at(s, cfg)
    monkeypatch.setattr(mech, "lr_at", hook)


# ── same command, same numbers ───────────────────────────────────────────────────────────────

def test_the_same_command_gives_the_same_numbers(reference, tmp_path, capsys):
    code, _, err = cli(command(tmp_path / "again"), capsys)
    assert code == 0, err
    assert_same_run(tmp_path / "again", reference)
    code, _, err = cli(command(tmp_path / "seed6", "--no-interventions", seed=6), capsys)
    assert code == 0, err
    assert result(tmp_path / "seed6")[0] != result(reference)[0]  # and the seed matters


# ── stopped is resumable, exactly ────────────────────────────────────────────────────────────

@pytest.mark.parametrize("signum", [None, signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_during_a_step_takes_effect_after_it_and_the_same_command_resumes_exactly(
        signum, reference, tmp_path, monkeypatch, capsys, hangup_not_ignored):
    out = tmp_path / "run"
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    stop_during_step(monkeypatch, 13, signum)
    code, _, err = cli(command(out), capsys)
    assert code == 130
    one_line(err, "stopped at step 14 of 40", "the same command resumes")
    state = torch.load(out / "checkpoint.pt")  # step 13 done, then the stop: 10 steps of 40
    assert state["step"] == 14 and [p["step"] for p in state["curve"]] == [10]
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "config.json"] and not mech.STOP
    assert handlers == [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                      signal.SIGHUP)]  # the caller's, restored
    monkeypatch.undo()
    code, stdout, err = cli(command(out), capsys)
    assert code == 0, err
    assert f"resuming {out} at step 14" in stdout
    assert_same_run(out, reference)


def test_under_nohup_a_hangup_is_ignored_and_the_run_goes_on(reference, tmp_path, monkeypatch,
                                                             capsys):
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup python mech.py ...`
    try:
        stop_during_step(monkeypatch, 13, signal.SIGHUP)
        code, _, err = cli(command(tmp_path / "run"), capsys)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    assert code == 0 and err == "", err
    assert_same_run(tmp_path / "run", reference)


def signal_in(monkeypatch, owner, name, when, signum=signal.SIGTERM):
    """owner.name sends signum to this process (a real signal, a real handler) when when(*args)."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if when(*args):
            os.kill(os.getpid(), signum)
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, wrapped)


def half_then(monkeypatch, signum=None, error=None):
    """json.dump of the interventions writes half its text, then a signal or an error comes."""
    dump = json.dump

    def half(obj, f, **kwargs):
        if "interventions" not in obj:
            return dump(obj, f, **kwargs)
        text = json.dumps(obj, **kwargs)
        f.write(text[:len(text) // 2])
        f.flush()
        if signum is not None:
            os.kill(os.getpid(), signum)
        raise error
    monkeypatch.setattr(json, "dump", half)


ALWAYS = lambda *args: True  # noqa: E731
MOMENTS = {  # a stop outside a training step: where (the function that receives it), and when
    "before training": lambda mp: signal_in(mp, mech, "choose_device", ALWAYS),
    "making the data": lambda mp: signal_in(mp, mech, "training_batches", ALWAYS),
    "writing model.pt": lambda mp: signal_in(
        mp, mech, "save", lambda path, obj: path.endswith("model.pt")),
    "writing metrics.json": lambda mp: signal_in(
        mp, mech, "save", lambda path, obj: path.endswith("metrics.json")
        and "interventions" not in obj),
    "the analysis": lambda mp: signal_in(mp, mech, "analyse", ALWAYS),
    "writing the interventions": lambda mp: half_then(mp, signal.SIGINT, AssertionError()),
}


@pytest.mark.parametrize("moment", MOMENTS)
def test_a_stop_at_any_other_moment_exits_130_and_the_same_command_completes_the_run(
        moment, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    MOMENTS[moment](monkeypatch)
    code, _, err = cli(command(out), capsys)
    assert code == 130
    one_line(err, "stopped")
    assert "error" not in err  # a stop, not a failure
    assert not out.exists() or not any(f.endswith(".tmp") for f in os.listdir(out))
    monkeypatch.undo()
    code, _, err = cli(command(out), capsys)
    assert code == 0, err
    assert_same_run(out, reference)


HOOK = '''# not a mixer: it makes the run wait at step $WAIT_AT, until a signal comes or a kill
import os
import time

import mech

lr_at = mech.lr_at


def wait_at(step, cfg):
    if step == int(os.environ["WAIT_AT"]):
        print("waiting at step", step, flush=True)
        deadline = time.time() + 300  # guards a test that lost its process against a hang
        while not mech.STOP and time.time() < deadline:
            time.sleep(0.01)
    return lr_at(step, cfg)


mech.lr_at = wait_at
'''


def start_waiting(out, hook, wait_at):
    """`python mech.py` of the TINY run in a process of its own, once it waits at step wait_at;
    its lines before that. SIGHUP as in a terminal."""
    p = subprocess.Popen([sys.executable, "mech.py", *command(out, "--mixer-file", str(hook))],
                         cwd=ROOT, env=dict(os.environ, WAIT_AT=str(wait_at)), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    lines, hang = [], threading.Timer(300, p.kill)  # guards against a hang only
    hang.start()
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("waiting at step"):
                return p, lines
    finally:
        hang.cancel()
    p.wait(timeout=300)
    pytest.fail(f"it never got to step {wait_at}: {''.join(lines)} {p.stderr.read()}")


def test_a_closed_terminal_then_a_kill_lose_at_most_a_few_steps_and_the_run_ends_as_one(
        reference, tmp_path, capsys):
    out, hook = tmp_path / "run", tmp_path / "hook.py"
    hook.write_text(HOOK)  # registers no mixer: the same run as without it
    p, _ = start_waiting(out, hook, 13)
    p.send_signal(signal.SIGHUP)  # the terminal closes during step 13
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    one_line(err, "stopped at step 14 of 40", "the same command resumes")
    assert torch.load(out / "checkpoint.pt")["step"] == 14
    p, lines = start_waiting(out, hook, 27)  # the same command goes on ...
    assert any(f"resuming {out} at step 14" in line for line in lines), lines
    p.kill()  # ... and is killed during step 27: the checkpoint of step 20 is left
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL
    assert torch.load(out / "checkpoint.pt")["step"] == 20
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "config.json"]
    code, stdout, err = cli(command(out), capsys)
    assert code == 0, err
    assert f"resuming {out} at step 20" in stdout
    assert_same_run(out, reference)


# ── finished means complete ──────────────────────────────────────────────────────────────────

def no_training(monkeypatch):
    def fail(*args):
        raise AssertionError("trained again")
    monkeypatch.setattr(mech, "lr_at", fail)


def test_metrics_without_interventions_get_them_without_training(finished, reference,
                                                                  monkeypatch, capsys):
    with open(finished / "metrics.json") as f:
        metrics = json.load(f)
    del metrics["interventions"]  # as a stop during the analysis leaves it
    mech.save(str(finished / "metrics.json"), metrics)
    model = (finished / "model.pt").stat().st_mtime_ns
    no_training(monkeypatch)
    code, stdout, err = cli(command(finished), capsys)
    assert code == 0, err
    assert not any(line.startswith(("step", "resuming")) for line in stdout.splitlines())
    assert "interventions: patching" in stdout and "verdict: " in stdout
    assert (finished / "model.pt").stat().st_mtime_ns == model
    assert_same_run(finished, reference)


class Killed(BaseException):
    """The process dies here (kill -9): nothing after it runs."""


def test_a_run_killed_between_its_last_files_is_not_finished_and_is_completed(
        reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    save = mech.save

    def killed_before_the_metrics(path, obj):
        if path.endswith("metrics.json"):
            raise Killed
        save(path, obj)
    monkeypatch.setattr(mech, "save", killed_before_the_metrics)
    with pytest.raises(Killed):
        mech.main(command(out))
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "config.json", "model.pt"]
    code, stdout, err = cli(command(out), capsys)
    assert code == 0, err
    assert f"resuming {out} at step 40" in stdout and "already holds" not in stdout
    assert_same_run(out, reference)


def test_a_finished_run_without_its_model_is_trained_again(finished, reference, capsys):
    os.unlink(finished / "model.pt")
    code, stdout, err = cli(command(finished), capsys)
    assert code == 0, err
    assert "already holds" not in stdout and "step      40/40" in stdout
    assert_same_run(finished, reference)


# ── nothing half-written ─────────────────────────────────────────────────────────────────────

def full_disk(monkeypatch, owner, name, when):
    """owner.name writes part of its file, then the disk is full, when when(obj, path)."""
    original = getattr(owner, name)

    def partly(obj, f, *args, **kwargs):
        if not when(obj, f if isinstance(f, str) else f.name):
            return original(obj, f, *args, **kwargs)
        if isinstance(f, str):
            with open(f, "wb") as g:
                g.write(b"PK\x03\x04 half a file")
        else:
            f.write('{"accuracy": ')
            f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(owner, name, partly)


FULL = {  # where the disk fills -> (what is kept, at what step the checkpoint is then)
    "a checkpoint": (lambda mp: full_disk(mp, torch, "save", lambda obj, path: obj.get(
        "step") == 20), ["checkpoint.pt", "config.json"], 10),
    "model.pt": (lambda mp: full_disk(mp, torch, "save", lambda obj, path: path.endswith(
        "model.pt.tmp")), ["checkpoint.pt", "config.json"], 40),
    "metrics.json": (lambda mp: full_disk(mp, json, "dump", lambda obj, path: "curve" in obj),
                     ["checkpoint.pt", "config.json", "model.pt"], 40),
    "the interventions": (lambda mp: half_then(mp, error=OSError(
        errno.ENOSPC, os.strerror(errno.ENOSPC))), ["config.json", "metrics.json", "model.pt"],
        None),
}


@pytest.mark.parametrize("where", FULL)
def test_a_full_disk_ends_in_one_line_keeps_the_last_checkpoint_and_no_temporary_file(
        where, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    fill, kept, step = FULL[where]
    fill(monkeypatch)
    code, _, err = cli(command(out), capsys)
    assert code == 1
    one_line(err, "No space left on device")
    assert sorted(os.listdir(out)) == kept  # whole files only, nothing .tmp
    if step is not None:
        assert torch.load(out / "checkpoint.pt")["step"] == step
    monkeypatch.undo()
    code, stdout, err = cli(command(out), capsys)
    assert code == 0, err
    assert_same_run(out, reference)


# ── finished is not retrained; --force; another configuration ─────────────────────────────────

def test_a_finished_run_prints_its_result_and_table_again_without_training(finished, monkeypatch,
                                                                          capsys):
    before = files(finished)
    model = (finished / "model.pt").stat().st_mtime_ns
    no_training(monkeypatch)
    monkeypatch.setattr(mech, "analyse", lambda *a: pytest.fail("analysed again"))
    code, stdout, err = cli(command(finished), capsys)
    assert code == 0 and err == "", err
    metrics = json.loads(before["metrics.json"])
    assert f"{finished} already holds this run" in stdout
    assert f"test accuracy {metrics['accuracy']:.3f}" in stdout
    assert mech.mechanism_report(metrics["interventions"]["rows"], 2) in stdout
    assert files(finished) == before and (finished / "model.pt").stat().st_mtime_ns == model


def test_another_configuration_is_refused_in_one_line_that_names_the_difference(finished,
                                                                               capsys):
    before = files(finished)
    code, _, err = cli(command(finished, lr=3e-3), capsys)
    assert code == 1
    one_line(err, str(finished), "another run", "lr 0.001 (asked: 0.003)")
    assert "steps" not in err and "--force" not in err
    code, _, err = cli(command(finished, steps=50), capsys)
    assert code == 1
    one_line(err, "steps 40 (asked: 50)")
    assert files(finished) == before


def test_force_starts_over_and_deletes_only_the_run_files(finished, capsys):
    (finished / "notes.txt").write_text("mine")
    code, _, err = cli(command(finished, "--force", "--no-interventions", lr=3e-3), capsys)
    assert code == 0, err
    assert sorted(os.listdir(finished)) == ["config.json", "metrics.json", "model.pt", "notes.txt"]
    assert json.loads((finished / "config.json").read_text())["lr"] == 3e-3
    assert (finished / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("config", ['{"title": "my thesis"}', "[1, 2]", "not json"])
def test_force_deletes_nothing_where_config_json_is_not_a_runs(config, tmp_path, capsys):
    out = tmp_path / "theirs"
    out.mkdir()
    for name in mech.RUN_FILES:
        (out / name).write_text("theirs")
    (out / "config.json").write_text(config)
    before = files(out)
    code, _, err = cli(command(out, "--force"), capsys)
    assert code == 1
    one_line(err, "config.json")
    assert "--force" not in err and files(out) == before


# ── a damaged or foreign file gets one line that names it ────────────────────────────────────

def another_architecture():
    cfg = mech.Config(**{**TINY, "arch": "hyena"})
    return mech.build_model(cfg, mech.make_task(cfg).vocab_size).state_dict()


def checkpoint_of(**fields):
    """A checkpoint of another run: the same shapes, another seed."""
    cfg = mech.Config(**{**TINY, **fields})
    model = mech.build_model(cfg, mech.make_task(cfg).vocab_size)
    optimizer = torch.optim.AdamW(model.parameters())
    return dict(model=model.state_dict(), optimizer=optimizer.state_dict(), step=14, curve=[],
                loss_sum=0.0, elapsed=0.0, identity=mech.identity(cfg))


WRITE = {  # how a file is damaged: (bytes) -> the damaged file
    "truncated": lambda name, data: data[:len(data) // 2],
    "garbage": lambda name, data: b"\x00\xff not a file of mech.py \x80" * 20,
    "foreign": lambda name, data: {"config.json": b'{"title": "my thesis"}',
                                   "metrics.json": b"[1, 2]"}.get(name),
}
FOREIGN_PT = {"model.pt": [another_architecture, lambda: [1, 2]],
              "checkpoint.pt": [lambda: dict(checkpoint_of(arch="hyena")), lambda: [1, 2],
                                lambda: {"step": 3}, lambda: checkpoint_of(seed=6)]}


def damages():
    for name in ("config.json", "metrics.json", "model.pt", "checkpoint.pt"):
        for how in WRITE:
            if how != "foreign" or name.endswith(".json"):
                yield name, how, None
        for i in range(len(FOREIGN_PT.get(name, ()))):
            yield name, "foreign", i
    yield "metrics.json", "foreign", "{}"  # a JSON object, not a run's metrics


@pytest.mark.parametrize("name, how, which", list(damages()))
def test_a_damaged_or_foreign_file_gets_one_line_that_names_it(name, how, which, finished,
                                                              stopped, tmp_path, capsys):
    out = finished if name != "checkpoint.pt" else shutil.copytree(stopped, tmp_path / "s")
    path = out / name
    if isinstance(which, int):
        torch.save(FOREIGN_PT[name][which](), path)
    elif isinstance(which, str):
        path.write_text(which)
    else:
        path.write_bytes(WRITE[how](name, path.read_bytes()))
    before = files(out)
    code, _, err = cli(command(out), capsys)
    assert code == 1
    one_line(err, str(path), "cannot be used")
    assert "--force" not in err and files(out) == before


def test_an_out_that_is_a_file_ends_in_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code, _, err = cli(command(tmp_path / "file"), capsys)
    assert code == 1
    one_line(err, "error:", "file")


def test_divergence_ends_in_one_line(tmp_path, capsys):
    code, _, err = cli(command(tmp_path / "run", lr=1.0), capsys)
    assert code == 1
    one_line(err, "training loss reached", "uniform guess", "lower --lr than 1")


# ── output that a reader closes early ────────────────────────────────────────────────────────

def test_output_into_a_closed_pipe_does_not_stop_the_run(reference, tmp_path, monkeypatch):
    read, write = os.pipe()
    os.close(read)  # `python mech.py ... | head -1`, once head has exited
    with os.fdopen(write, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        mech.main(command(tmp_path / "run"))
        monkeypatch.undo()
    assert_same_run(tmp_path / "run", reference)
