"""A mixer of your own: registered from outside mech.py, then trained, analysed and swept."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import mech
from conftest import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIXER_FILE = '''
import torch, torch.nn as nn
import mech


class RunningMean(nn.Module):  # (b, l, d) -> (b, l, d): the mean of the positions so far
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        n = torch.arange(1, x.shape[1] + 1, device=x.device)[:, None]
        return self.proj(x.cumsum(1) / n)


mech.register_mixer("mean", lambda cfg, layer: RunningMean(cfg.d_model))
'''
BOTH_TASKS = ["--d-model", "16", "--n-train", "256", "--steps", "20", "--eval-every", "10",
              "--n-eval", "32"]
TINY = [*BOTH_TASKS, "--num-kv", "64", "--threads", "1"]


def test_a_mixer_from_a_file_trains_and_is_analysed_with_a_verdict(tmp_path):
    (tmp_path / "my_mixer.py").write_text(MIXER_FILE)
    p = subprocess.run([sys.executable, "mech.py", "--mixer-file", str(tmp_path / "my_mixer.py"),
                        "--arch", "mean", "--task", "ar", *TINY, "--out", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "mean on ar" in p.stdout and "verdict: " in p.stdout
    assert f"python figures/plots.py {tmp_path / 'run'}" in p.stdout


def test_a_sweep_runs_a_registered_mixer(tmp_path):
    (tmp_path / "my_mixer.py").write_text(MIXER_FILE)
    p = subprocess.run([sys.executable, os.path.join("figures", "experiments.py"), "--sweep",
                        "mixer", "--seeds", "1", "--mixer-file", str(tmp_path / "my_mixer.py"),
                        "--arch", "mean", *BOTH_TASKS, "--no-interventions", "--sweep-dir",
                        str(tmp_path / "sweep"), "--figures-dir", str(tmp_path / "figs")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "2 runs collected" in p.stdout


@pytest.fixture
def registry(monkeypatch):
    """Mixers registered in this test (by mech.register_mixer or a --mixer-file) leave with it."""
    for name in ("MIXERS", "DEFAULT_DCONV", "MIXER_CODE"):
        monkeypatch.setattr(mech, name, dict(getattr(mech, name)))


RUN = [*TINY, "--no-interventions", "--no-dynamics"]
MODULE = """
import torch
import torch.nn as nn

import mech


class Mixer(nn.Module):  # the mean of the positions so far, and what the case adds
    def __init__(self, d):
        super().__init__()
        self.proj, self.drop = nn.Linear(d, d), nn.Dropout(0.5)
        self.sites = %s

    def forward(self, x):
        y = self.proj(self.drop(x)).cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]
        return %s


mech.register_mixer(%r, %s)
"""
CASES = {  # name -> (its sites, what forward returns, its factory, the one line it gets)
    "causal": ("{}", "y", "lambda cfg, i: Mixer(cfg.d_model)", None),  # dropout: eval mode
    "leaky": ("{}", "y + x.roll(-1, 1) if x.shape[1] > 8 else y",
              "lambda cfg, i: Mixer(cfg.d_model)", "'leaky' (layer 0) is not causal: its output at"),
    "nan": ("{}", "y * float('nan')", "lambda cfg, i: Mixer(cfg.d_model)", "'nan' (layer 0) returns NaN"),
    "shrinks": ("{}", "y[..., :-1]", "lambda cfg, i: Mixer(cfg.d_model)", ", 15); a mixer keeps"),
    "nomodule": ("{}", "y", "lambda cfg, i: 'a string'", "'nomodule' (layer 0) fails: AttributeError: 'str' object has no attribute 'eval'"),
    "clash": ("{'block_input': 'proj'}", "y", "lambda cfg, i: Mixer(cfg.d_model)",
              "'clash' (layer 0) names a site block_input"),
}


def mixer_file(folder, name, body=None):
    """A --mixer-file that registers CASES[name] (or another forward's body) as `name`."""
    sites, returns, factory, _ = CASES[name]
    path = folder / f"{name}.py"
    path.write_text(MODULE % (sites, body or returns, name, factory))
    return str(path)


@pytest.mark.parametrize("name", CASES)
def test_a_mixer_is_tried_as_the_run_uses_it_and_a_wrong_one_refused_in_one_line(
        name, registry, tmp_path, capsys):
    """In eval mode (its dropout off), at the run's length (37 tokens: a leak past 8 shows),
    every position against every later one; NaN, no module, a block's site name: one line."""
    out = tmp_path / "run"
    code, _, err = cli(["--mixer-file", mixer_file(tmp_path, name), "--arch", name, *RUN,
                        "--out", str(out)], capsys)
    needle = CASES[name][3]
    if needle is None:
        assert code == 0, err
        assert os.path.exists(out / "metrics.json")
        return
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert not out.exists()  # refused before anything is written


def test_a_mixer_with_dropout_resumes_exactly(registry, tmp_path, capsys, monkeypatch):
    """Its dropout masks come from torch's RNG, kept in each checkpoint: a run stopped at step 13
    resumes from step 10's and ends as an uninterrupted one."""
    file = mixer_file(tmp_path, "causal")
    args = ["--mixer-file", file, "--arch", "causal", *RUN]
    assert cli([*args, "--out", str(tmp_path / "full")], capsys)[0] == 0
    lr_at = mech.lr_at

    def stop_during_step_13(step, cfg):
        if step == 13:
            raise KeyboardInterrupt  # as Ctrl-C, SIGTERM or SIGHUP does
        return lr_at(step, cfg)
    monkeypatch.setattr(mech, "lr_at", stop_during_step_13)
    assert cli([*args, "--out", str(tmp_path / "stopped")], capsys)[0] == 130
    monkeypatch.setattr(mech, "lr_at", lr_at)
    assert cli([*args, "--out", str(tmp_path / "stopped")], capsys)[0] == 0
    curves = [json.loads((tmp_path / run / "metrics.json").read_text())["curve"]
              for run in ("full", "stopped")]
    assert [[{k: v for k, v in p.items() if k != "time_s"} for p in c] for c in curves] == [
        [{k: v for k, v in p.items() if k != "time_s"} for p in curves[0]]] * 2


def test_an_edited_mixer_file_is_another_run(registry, tmp_path, capsys, monkeypatch):
    args = ["--arch", "causal", *RUN, "--out", str(tmp_path / "run")]
    code, _, err = cli(["--mixer-file", mixer_file(tmp_path, "causal"), *args], capsys)
    assert code == 0, err
    first, cfg = mech.MIXER_CODE["causal"], mech.Config(arch="causal")
    folder = mech.default_out(cfg)
    monkeypatch.setattr(mech, "MIXERS", {k: v for k, v in mech.MIXERS.items() if k != "causal"})
    edited = mixer_file(tmp_path, "causal", body="2 * y")  # as a new process would run it
    code, _, err = cli(["--mixer-file", edited, *args], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "another run" in err and f"mixer_code {first} (asked: " in err, err
    assert mech.MIXER_CODE["causal"] != first and mech.default_out(cfg) != folder


def test_a_registered_mixer_trains_in_python(monkeypatch):
    monkeypatch.setattr(mech, "MIXERS", dict(mech.MIXERS))  # leave the registry as it was
    mech.register_mixer("identity", lambda cfg, i: nn.Identity())
    torch.set_num_threads(1)
    cfg = mech.Config(arch="identity", d_model=16, num_kv=64, n_train=256, steps=10,
                      eval_every=10, n_eval=16)
    model, metrics = mech.train(cfg, device="cpu", log=lambda m: None)
    assert metrics["steps"] == 10 and "verdict" in mech.analyse(model, cfg)


class ConvThenMean(nn.Module):  # a short conv whose output is a site of its own, then a mean
    def __init__(self, d, d_conv):
        super().__init__()
        self.conv1d, self.conv_out = mech.short_conv(d, d_conv, bias=True), nn.Identity()
        self.sites = {"conv_output": "conv_out"} if d_conv else {}

    def forward(self, x):
        x = self.conv_out(self.conv1d(x.transpose(1, 2))).transpose(1, 2)
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


def test_a_mixer_takes_dconv_and_names_a_site_of_its_own(monkeypatch):
    monkeypatch.setattr(mech, "MIXERS", dict(mech.MIXERS))
    monkeypatch.setattr(mech, "DEFAULT_DCONV", dict(mech.DEFAULT_DCONV))
    mech.register_mixer("conv_mean", lambda cfg, i: ConvThenMean(cfg.d_model, cfg.d_conv), d_conv=3)
    for d_conv, has_site in ((None, True), (0, False)):
        cfg = mech.Config(arch="conv_mean", d_model=16, num_kv=64, n_train=64, d_conv=d_conv)
        assert cfg.d_conv == (3 if d_conv is None else 0)
        model = mech.build_model(cfg, 70)
        assert (("conv_output", 0) in mech.sites_in(model)) == has_site
    with pytest.raises(ValueError, match="'attention' is taken"):
        mech.register_mixer("attention", lambda cfg, i: nn.Identity())


class Pair(nn.Module):
    def forward(self, x):
        return x, x


class WithSites(nn.Module):  # a running mean, its sites as given
    def __init__(self, d, sites):
        super().__init__()
        self.proj, self.pair, self.unused, self.sites = nn.Linear(d, d), Pair(), nn.Linear(d, d), sites

    def forward(self, x):
        self.pair(x)
        return self.proj(x).cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]


@pytest.mark.parametrize("sites, needle", [
    ({"mine": "nowhere"}, "(layer 0) fails: AttributeError"),
    ({"mine": "pair"}, "(layer 0) has a site 'mine' whose output is no (b, l, ...) tensor"),
    ({"mine": "unused"}, "(layer 0) has a site 'mine' whose output is no (b, l, ...) tensor")])
def test_a_site_that_is_no_submodule_or_gives_no_tensor_is_refused_before_training(
        sites, needle, registry, tmp_path, capsys, monkeypatch):
    mech.register_mixer("sited", lambda cfg, i: WithSites(cfg.d_model, sites))
    monkeypatch.setattr(mech, "lr_at", lambda *a: pytest.fail("it trained"))
    code, _, err = cli(["--arch", "sited", *RUN, "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "run").exists()
