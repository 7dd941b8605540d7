"""A run's folder and its promises (issues 48, 59): the same command gives the same numbers,
resumes a stopped or killed run exactly from its last evaluation, completes what a stop left
undone, never leaves half a file, shows a finished run again without training (even without its
model.pt), never overwrites a folder that is not the run's, and refuses what it cannot use in one
line.

Most tests run `python mech.py ...` in this process (mech.main); those that need a real process
(a hangup, a kill -9, a stop while torch loads) wait for what the run prints or maps, never for
a time."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

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
    """A run stopped during step 13: its folder holds the checkpoint of step 10."""
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
    a KeyboardInterrupt, as Ctrl-C gives."""
    lr_at = mech.lr_at

    def hook(s, cfg):
        if s == step and signum is None:
            raise KeyboardInterrupt
        if s == step:
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
def test_a_stop_during_a_step_exits_130_and_the_same_command_resumes_exactly(
        signum, reference, tmp_path, monkeypatch, capsys, hangup_not_ignored):
    out = tmp_path / "run"
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    stop_during_step(monkeypatch, 13, signum)
    code, _, err = cli(command(out), capsys)
    assert code == 130
    one_line(err, "stopped", "the same command resumes the run from its last evaluation")
    state = torch.load(out / "checkpoint.pt")  # the evaluation of step 10 is the last
    assert state["step"] == 10 and [p["step"] for p in state["curve"]] == [10]
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "config.json"]
    assert handlers == [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM,
                                                      signal.SIGHUP)]  # the caller's, restored
    monkeypatch.undo()
    code, stdout, err = cli(command(out), capsys)
    assert code == 0, err
    assert f"resuming {out} at step 10" in stdout
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
        while time.time() < deadline:  # until a signal's KeyboardInterrupt, or a kill
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
    one_line(err, "stopped", "the same command resumes")
    assert torch.load(out / "checkpoint.pt")["step"] == 10
    p, lines = start_waiting(out, hook, 27)  # the same command goes on ...
    assert any(f"resuming {out} at step 10" in line for line in lines), lines
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


def test_a_finished_run_without_its_model_is_shown_not_trained(finished, monkeypatch, capsys):
    """As every committed run in figures/runs is: its metrics.json is what a user sees."""
    os.unlink(finished / "model.pt")
    before = files(finished)
    no_training(monkeypatch)
    code, stdout, err = cli(command(finished, "--threads=2"), capsys)
    assert code == 0 and err == "", err
    assert "already holds this run" in stdout and "verdict: " in stdout
    assert not any(line.startswith(("step", "resuming")) for line in stdout.splitlines())
    assert files(finished) == before


def test_a_finished_run_without_its_model_nor_its_analysis_asks_for_force(finished, monkeypatch,
                                                                          capsys):
    os.unlink(finished / "model.pt")
    metrics = json.loads((finished / "metrics.json").read_text())
    del metrics["interventions"]
    mech.save(str(finished / "metrics.json"), metrics)
    before = files(finished)
    no_training(monkeypatch)
    code, _, err = cli(command(finished), capsys)
    assert code == 1
    one_line(err, str(finished), "model.pt", "--force", "another --out")
    assert files(finished) == before
    code, stdout, err = cli(command(finished, "--no-interventions"), capsys)  # shown as it is
    assert code == 0 and "test accuracy" in stdout and files(finished) == before, err


def test_a_held_out_run_missing_its_dev_analysis_gets_it(tmp_path, capsys):
    args = ["--task=atr", "--held-out=0.2", "--arch=attention", "--d-model=16", "--n-train=64",
            "--steps=4", "--eval-every=4", "--n-eval=16", "--threads=1", "--no-dynamics"]
    out = tmp_path / "run"
    assert cli([*args, "--out", str(out)], capsys)[0] == 0
    metrics = json.loads((out / "metrics.json").read_text())
    dev = metrics.pop("interventions_dev")  # as a stop between the two analyses leaves it
    mech.save(str(out / "metrics.json"), metrics)
    code, stdout, err = cli([*args, "--out", str(out)], capsys)
    assert code == 0 and "interventions_dev: patching" in stdout, err
    assert json.loads((out / "metrics.json").read_text())["interventions_dev"] == dev


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
    for picture in ("mechanism.png", "dynamics.png"):  # figures/plots.py's, of the old run
        (finished / picture).write_text("old")
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


# ── a folder is a run's only if its config.json says so (issue 59) ───────────────────────────

@pytest.mark.parametrize("force", [False, True])
def test_a_folder_without_a_runs_config_is_refused_and_left_as_it_was(force, finished, capsys):
    """A finished run whose config.json is gone, asked for another run: nothing is overwritten."""
    os.unlink(finished / "config.json")
    (finished / "results.csv").write_text("a user's own")
    before = files(finished)
    code, _, err = cli(command(finished, *["--force"] * force, arch="hyena"), capsys)
    assert code == 1
    one_line(err, str(finished), "metrics.json", "model.pt", "results.csv", "no config.json",
             "choose another --out")
    assert "move" not in err and files(finished) == before


def test_a_run_of_a_mixer_file_named_without_its_file_is_refused_untouched(finished, capsys):
    config = json.loads((finished / "config.json").read_text())
    (finished / "config.json").write_text(json.dumps({**config, "arch": "kda",
                                                      "mixer_code": "0" * 40}))
    before = files(finished)
    code, _, err = cli(command(finished), capsys)
    assert code == 1
    one_line(err, "config.json cannot be used", "unknown arch 'kda'")
    assert files(finished) == before


METRICS_DAMAGE = {  # a finished run's metrics.json, changed: what the same command must refuse
    "accuracy a string": lambda m: m.update(accuracy="0.5"),
    "accuracy null": lambda m: m.update(accuracy=None),
    "no wall_time_s": lambda m: m.pop("wall_time_s"),
    "interventions {}": lambda m: m.update(interventions={}),
    "interventions null": lambda m: m.update(interventions=None),
    "rows []": lambda m: m["interventions"].update(rows=[]),
    "rows without attrib": lambda m: [r.pop("attrib") for r in m["interventions"]["rows"]],
}


@pytest.mark.parametrize("damage", METRICS_DAMAGE)
def test_a_finished_runs_damaged_metrics_get_one_line_that_names_the_file(damage, finished,
                                                                         capsys):
    metrics = json.loads((finished / "metrics.json").read_text())
    METRICS_DAMAGE[damage](metrics)
    (finished / "metrics.json").write_text(json.dumps(metrics))
    before = files(finished)
    code, _, err = cli(command(finished), capsys)
    assert code == 1
    one_line(err, str(finished / "metrics.json"), "cannot be used")
    assert files(finished) == before


@pytest.mark.parametrize("change", [dict(step="10"), dict(step=3), dict(curve=None),
                                    dict(elapsed="x"), dict(engine=None), dict(rng=[1])])
def test_a_crafted_checkpoint_gets_one_line(change, stopped, tmp_path, capsys):
    out = shutil.copytree(stopped, tmp_path / "s")
    torch.save({**torch.load(out / "checkpoint.pt"), **change}, out / "checkpoint.pt")
    code, _, err = cli(command(out), capsys)
    assert code == 1
    one_line(err, str(out / "checkpoint.pt"), "cannot be used")


def test_a_resume_on_another_thread_count_is_refused_in_one_line(stopped, tmp_path, capsys):
    out = shutil.copytree(stopped, tmp_path / "s")
    before = files(out)
    code, _, err = cli([*command(out), "--threads=2"], capsys)  # the later flag wins
    assert code == 1
    one_line(err, "trained to step 10 with threads 1 (here: 2)", "--threads", "--force")
    assert files(out) == before


def test_torchs_own_write_error_ends_in_one_line(tmp_path, monkeypatch, capsys):
    def fails(obj, f, *args, **kwargs):  # as torch.save fails on a full disk or ulimit -f
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64\n"
                           "PytorchStreamWriter failed writing file data/0: file write failed")
    monkeypatch.setattr(torch, "save", fails)
    code, _, err = cli(command(tmp_path / "run"), capsys)
    assert code == 1
    one_line(err, "checkpoint.pt could not be written", "RuntimeError")
    assert sorted(os.listdir(tmp_path / "run")) == ["config.json"]


LEARNS_TO_PEEK = '''
import torch, torch.nn as nn
import mech


class Peeks(nn.Module):  # a running mean, plus alpha times the next token: causal until trained
    def __init__(self, d):
        super().__init__()
        self.proj, self.alpha = nn.Linear(d, d), nn.Parameter(torch.zeros(()))

    def forward(self, x):
        ahead = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)
        n = torch.arange(1, x.shape[1] + 1)[:, None]
        return self.proj(x.cumsum(1) / n) + self.alpha * ahead


mech.register_mixer("peeks", lambda cfg, layer: Peeks(cfg.d_model))
'''


def test_a_mixer_that_learns_to_look_ahead_is_refused_and_stays_refused(tmp_path, capsys,
                                                                       monkeypatch):
    for name in ("MIXERS", "DEFAULT_DCONV", "MIXER_CODE"):
        monkeypatch.setattr(mech, name, dict(getattr(mech, name)))
    (tmp_path / "peeks.py").write_text(LEARNS_TO_PEEK)
    args = command(tmp_path / "run", "--mixer-file", str(tmp_path / "peeks.py"), arch="peeks")
    code, _, err = cli(args, capsys)
    assert code == 1
    one_line(err, "mixer 'peeks' (layer 0) is not causal", "by step 10", "unreported")
    assert "metrics.json" not in os.listdir(tmp_path / "run")
    code, stdout, again = cli(args, capsys)  # marked: the same command refuses at once
    assert code == 1 and again == err and "step" not in stdout


def test_a_mixer_file_that_exits_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")
    code, _, err = cli(command(tmp_path / "run", "--mixer-file", str(tmp_path / "exits.py")),
                       capsys)
    assert code == 2
    one_line(err, "exits.py: SystemExit: 0")


class Clock:
    """time.time and time.process_time of a machine where each reading is 4 s later and the
    run got a tenth of a core."""
    def __init__(self):
        self.now = 0.0

    def time(self):
        self.now += 4.0
        return self.now

    def process_time(self):
        return self.now / 10


@pytest.mark.parametrize("threads", [1, 2])
def test_a_slow_start_is_said_within_half_a_minute_and_a_busy_machine_named_once(
        threads, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mech, "time", Clock())
    code, stdout, err = cli([*command(tmp_path / "run", "--no-interventions", eval_every=20),
                             f"--threads={threads}"], capsys)
    assert code == 0, err
    first = next(line for line in stdout.splitlines() if line.startswith("step"))
    assert "| the first evaluation at step 20" in first and "steps/s" in first
    busy = [line for line in stdout.splitlines() if "this busy machine" in line]
    assert busy == ([first] if threads == 2 else [])  # said once, where it can help


def test_a_stop_while_torch_loads_exits_130_without_a_traceback(tmp_path):
    """Ctrl-C in the first seconds, before the appendix installs its handlers."""
    p = subprocess.Popen([sys.executable, "mech.py", *command(tmp_path / "run")], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline:  # until torch's library is mapped
        with open(f"/proc/{p.pid}/maps") as f:
            if "libtorch" in f.read():
                break
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err, err


def test_a_resume_where_the_scan_kernel_cannot_load_is_refused(tmp_path, monkeypatch, capsys):
    """--scan auto took the kernel until the stop; the loop would sum otherwise: refused."""
    import scan_ext
    out, mamba = tmp_path / "run", dict(arch="mamba", steps=20)
    stop_during_step(monkeypatch, 13)
    assert cli(command(out, **mamba), capsys)[0] == 130
    monkeypatch.undo()
    assert torch.load(out / "checkpoint.pt")["engine"]["scan"] == scan_ext.build_key
    monkeypatch.setattr(scan_ext, "_module", scan_ext.BuildError("no C++ compiler"))
    monkeypatch.setattr(scan_ext, "_warned", True)
    before = files(out)
    code, _, err = cli(command(out, **mamba), capsys)
    assert code == 1
    one_line(err, f"with scan {scan_ext.build_key} (here: None)", "--force")
    assert files(out) == before
