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
    mech.claim_folder(str(a), cfg).close()
    model, optimizer = mech.build_model(other, 68), None
    opt = torch.optim.AdamW(model.parameters())
    mech.save_checkpoint(str(a / "checkpoint.pt"), model, opt, other, step=20, curve=[],
                         elapsed=0.0, since=20, loss_sum=0.0)
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


def test_sigint_saves_a_checkpoint_and_the_rerun_ends_where_an_uninterrupted_run_does(tmp_path):
    cfg = mech.Config(arch="attention", d_model=16, num_kv=64, n_train=256, steps=40,
                      eval_every=10, n_eval=32, seed=3)
    torch.set_num_threads(1)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under nohup ... &
    _, full = mech.train(cfg, str(tmp_path / "full"), device="cpu", log=lambda m: None)
    out = str(tmp_path / "stopped")
    lines = []

    def ctrl_c_after_first_evaluation(msg):
        lines.append(msg)
        if msg.startswith("step") and len([m for m in lines if m.startswith("step")]) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C: handled, not a traceback
    with pytest.raises(mech.Interrupted, match="stopped at step 11 of 40; the same command"):
        mech.train(cfg, out, device="cpu", log=ctrl_c_after_first_evaluation)
    assert torch.load(os.path.join(out, "checkpoint.pt"))["step"] == 11  # between two evaluations
    _, resumed = mech.train(cfg, out, device="cpu", log=lines.append)
    assert any("resuming" in m and "step 11" in m for m in lines)
    strip = lambda curve: [{k: v for k, v in p.items() if k != "time_s"} for p in curve]
    assert strip(resumed["curve"]) == strip(full["curve"])
    a, b = torch.load(os.path.join(out, "model.pt")), torch.load(tmp_path / "full" / "model.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler restored


@pytest.mark.skipif(open("/proc/sys/vm/overcommit_memory").read().strip() != "0",
                    reason="only the kernel's heuristic overcommit refuses an impossible allocation")
def test_a_model_that_cannot_fit_in_memory_ends_in_one_line(tmp_path, capsys):
    code, err = run([*TINY, "--d-model", "2000000", "--out", str(tmp_path / "x")], capsys)
    assert code == 1
    one_line(err, "can't allocate memory")


def test_scan_ext_without_a_compiler_ends_in_one_line(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, CXX="no-such-compiler", MECH_SCAN_CACHE=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "mech.py", "--arch", "mamba", "--scan", "ext", *TINY[2:],
                        "--out", str(tmp_path / "x")], cwd=os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__))), env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1
    one_line(p.stderr, "scan backend 'ext' is unavailable", "no C++ compiler")
