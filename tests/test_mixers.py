"""A mixer of your own: registered from outside mech.py, then trained, analysed and swept."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import mech

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
    assert os.path.exists(tmp_path / "run" / "mechanism.png")


def test_a_sweep_runs_a_registered_mixer(tmp_path):
    (tmp_path / "my_mixer.py").write_text(MIXER_FILE)
    p = subprocess.run([sys.executable, os.path.join("figures", "experiments.py"), "--sweep",
                        "mixer", "--seeds", "1", "--mixer-file", str(tmp_path / "my_mixer.py"),
                        "--arch", "mean", *BOTH_TASKS, "--no-interventions", "--sweep-dir",
                        str(tmp_path / "sweep"), "--figures-dir", str(tmp_path / "figs")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "2 runs collected" in p.stdout


class Shrinks(nn.Module):
    def forward(self, x):
        return x[..., :-1]


class Peeks(nn.Module):  # each position sees the next one: not causal
    def forward(self, x):
        return x + x.roll(-1, dims=1)


@pytest.mark.parametrize("name, factory, needle", [
    ("attention", lambda cfg, i: nn.Identity(), "'attention' is taken"),
    ("shrinks", lambda cfg, i: Shrinks(), "maps (2, 7, 16) to (2, 7, 15)"),
    ("peeks", lambda cfg, i: Peeks(), "'peeks' is not causal")])
def test_registration_errors_are_one_line(name, factory, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        mech.register_mixer(name, factory)
    assert name == "attention" or name not in mech.MIXERS


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
        assert (("conv_output", 0) in mech.sites_of(model)) == has_site
    with pytest.raises(ValueError, match="names a site block_input"):
        mech.register_mixer("clash", lambda cfg, i: type("C", (nn.Identity,), {
            "sites": {"block_input": "x"}})())
