"""A control for the hybrids whose first layer is attention: the same model, its first block
(attention, its two norms, its MLP) frozen at its init, so that only the embedding and the linear
layer behind it learn. Run under the arch `<hybrid>_frozen`, with mech.py's flags:
    python figures/frozen.py --arch attention_gdn_frozen --task ar --fresh-data --steps 20000 \\
        --lr 3e-4 --seed 42
A run is mech.py's in all else: resumed after a stop, shown again once finished, analysed the same
way. Its config.json names the arch `<hybrid>_frozen` and, as mixer_code, the hash of this file and
of the hybrids' files, so a trained run's folder refuses it (figures/README.md, "Beyond the paper:
hybrids", reads the runs)."""
import os
import sys
from hashlib import sha1

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mech  # noqa: E402

MIXERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixers")
FILES = [os.path.join(MIXERS_DIR, f) for f in ("gated_deltanet.py", "hybrids.py")]
FROZEN = ("attention_mamba", "attention_gdn")  # the hybrids whose first layer is attention
SUFFIX = "_frozen"
build_model = mech.build_model  # mech.py's, before main puts build_frozen in its place


def register() -> None:
    """Run the hybrids' files, then register each of FROZEN under its frozen name."""
    mech.run_mixer_files(FILES)
    with open(__file__, "rb") as f:
        code = sha1(f.read() + mech.MIXER_CODE["attention_gdn"].encode()).hexdigest()
    for name in FROZEN:
        mech.register_mixer(name + SUFFIX, mech.MIXERS[name], d_conv=mech.DEFAULT_DCONV[name])
        mech.MIXER_CODE[name + SUFFIX] = code


def build_frozen(cfg: mech.Config, vocab_size: int) -> mech.LanguageModel:
    """mech.build_model, and a frozen arch's first block out of training: no gradient reaches
    it, so AdamW (which skips a parameter without one) leaves it at its init."""
    model = build_model(cfg, vocab_size)
    if cfg.arch.endswith(SUFFIX):
        model.blocks[0].requires_grad_(False)
    return model


def main(argv=None) -> dict:
    register()
    mech.build_model = build_frozen  # mech.train builds (and a finished run loads) through it
    return mech.main(argv)


if __name__ == "__main__":
    main()
