"""Hybrids (figures/mixers/hybrids.py): each layer a pure model's mixer in its own block and
init, each layer probed for causality, and the per-layer interventions the report reads."""
import os
from hashlib import sha1

import pytest
import torch
import torch.nn as nn

import mech

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = [os.path.join(ROOT, "figures", "mixers", f) for f in ("gated_deltanet.py", "hybrids.py")]
PATTERNS = {"attention_mamba": ("attention", "mamba"), "mamba_attention": ("mamba", "attention"),
            "attention_gdn": ("attention", "gated_deltanet"),
            "gdn_attention": ("gated_deltanet", "attention"),
            "gdn3_attention": ("gated_deltanet",) * 3 + ("attention",)}


@pytest.fixture(scope="module")
def registry():
    """The two files run, as `mech.py --mixer-file ... --mixer-file ...` does, into copies of
    the registries."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MIXERS", "DEFAULT_DCONV", "MIXER_CODE"):
            mp.setattr(mech, name, dict(getattr(mech, name)))
        mech.run_mixer_files(FILES)
        yield


def model_of(name, **fields):
    cfg = mech.Config(arch=name, d_model=16, num_kv=64, n_train=64, scan="ref",
                      n_layer=len(PATTERNS[name]), **fields)
    return cfg, mech.build_model(cfg, 70)


@pytest.mark.parametrize("name", PATTERNS)
def test_each_layer_is_its_pure_models_mixer_in_its_own_block_and_init(registry, name):
    cfg, model = model_of(name)
    for layer, (block, arch) in enumerate(zip(model.blocks, PATTERNS[name])):
        pure = mech.build_model(mech.Config(arch=arch, d_model=16, num_kv=64, n_train=64,
                                            scan="ref", n_layer=cfg.n_layer), 70)
        assert type(block.mixer) is type(pure.blocks[layer].mixer)
        assert block.mamba == (arch == "mamba") and (block.mlp is None) == (arch == "mamba")
        for (n, w), (n_pure, w_pure) in zip(block.named_parameters(),
                                            pure.blocks[layer].named_parameters()):
            assert n == n_pure and w.shape == w_pure.shape
            if n.endswith(("out_proj.weight", "fc2.weight")):  # the rescaled inits, by kind
                assert abs(w.std() / w_pure.std() - 1) < 0.35, (layer, n)
    assert cfg.pos_emb is False and cfg.d_conv == 4  # NoPE; the linear layers' conv
    gdn, hybrids = (sha1(open(f, "rb").read()).hexdigest() for f in FILES)
    assert mech.MIXER_CODE["gated_deltanet"] == gdn  # the hybrids' code covers the file before
    assert mech.MIXER_CODE[name] == sha1(open(FILES[1], "rb").read() + gdn.encode()).hexdigest()


def test_a_pattern_needs_its_length_and_its_files(registry):
    with pytest.raises(ValueError, match="--layers must be a multiple of 4, not 2"):
        mech.build_model(mech.Config(arch="gdn3_attention", d_model=16), 70)


class Leaks(nn.Module):
    """A mixer and what it adds of the next position's input: causal no more."""
    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer
        self.sites = {site: "mixer." + path for site, path in getattr(mixer, "sites", {}).items()}

    def forward(self, x):
        return self.mixer(x) + 0.5 * torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)


@pytest.mark.parametrize("name", PATTERNS)
def test_the_probe_finds_a_leak_in_the_last_layer_alone(registry, name):
    cfg, model = model_of(name)
    mech.check_mixers(model, name, 37)  # as built: causal in every layer
    last = len(model.blocks) - 1
    model.blocks[last].mixer = Leaks(model.blocks[last].mixer)
    with pytest.raises(ValueError, match=rf"mixer '{name}' \(layer {last}\) is not causal"):
        mech.check_mixers(model, name, 37)


def test_the_interventions_read_every_layers_input_and_each_linear_layers_conv(registry):
    cfg, model = model_of("gdn3_attention")
    sites = mech.sites_in(model)
    assert all(("block_input", layer) in sites for layer in range(4))
    assert [layer for site, layer in sites if site == "conv_output"] == [0, 1, 2]
    task = mech.make_task(cfg)
    data = task.sample(16, mech.rng_for(0, "test"), split="test")
    rows = mech.interchange(model, task, data, "key")
    cells = {(r["site"], r["layer"], r["position"]) for r in rows}
    assert {("block_input", layer, "value") for layer in range(4)} <= cells
