"""Hybrids, as production models interleave attention with linear layers (Jamba: Mamba and
attention 7:1; Qwen3-Next: Gated DeltaNet and gated attention 3:1; Kimi Linear: KDA and MLA 3:1).
Each layer is a pure model's mixer, built by its own factory, in its own block with its own init:
attention in mech.py's LayerNorm-MLP block with zoology's init, Mamba in Mamba's block (RMSNorm, no
MLP) with mamba_ssm's init (mech.Block and mech.init_weights read mixer.mamba_block), Gated
DeltaNet as its pure model here has it (figures/mixers/gated_deltanet.py: LayerNorm-MLP). By layer:
    attention_mamba          attention, Mamba
    mamba_attention          Mamba, attention
    attention_gdn            attention, Gated DeltaNet
    gdn_attention            Gated DeltaNet, attention
    gdn3_attention           Gated DeltaNet x 3, attention (Qwen3-Next's and Kimi Linear's 3:1)
A model of more layers repeats the pattern; --layers must be a multiple of its length (4 for the
last). --dconv sets the linear layers' short conv (Mamba's, Gated DeltaNet's: 4; 0 removes it).
The Gated DeltaNet hybrids need its file first, whose hash joins theirs (mech.run_mixer_files):
    python mech.py --mixer-file figures/mixers/gated_deltanet.py \\
                   --mixer-file figures/mixers/hybrids.py --arch gdn_attention --task ar
Official designs: Jamba (arXiv 2403.19887); Qwen3-Next (Qwen/Qwen3-Next-80B-A3B-Instruct's
config.json, full_attention_interval 4: every fourth layer attention); Kimi Linear (arXiv
2510.26692); fla-org/flash-linear-attention interleaves the same way through
GatedDeltaNetConfig(attn={"layers": ...}) (fla/models/gated_deltanet/). Differences: mech.py's
plain softmax attention, one head (not gated attention, MLA or GQA); no position embedding (NoPE,
as Kimi Linear and Jamba; Qwen3-Next's attention has partial RoPE; attention alone here learns
one); d = 64 and 2 or 4 layers, not tens; no MoE; each layer keeps its pure model's block, where
the production models share one."""
import mech

HYBRIDS = {  # name -> the arch of each layer, in order
    "attention_mamba": ("attention", "mamba"),
    "mamba_attention": ("mamba", "attention"),
    "attention_gdn": ("attention", "gated_deltanet"),
    "gdn_attention": ("gated_deltanet", "attention"),
    "gdn3_attention": ("gated_deltanet",) * 3 + ("attention",)}


def hybrid(name: str, pattern: tuple):
    def factory(cfg, layer: int):
        if cfg.n_layer % len(pattern):
            raise ValueError(f"{name} repeats {len(pattern)} layers ({', '.join(pattern)}); "
                             f"--layers must be a multiple of {len(pattern)}, not {cfg.n_layer}")
        if any(arch not in mech.MIXERS for arch in pattern):
            raise ValueError(f"{name} needs --mixer-file figures/mixers/gated_deltanet.py "
                             "before figures/mixers/hybrids.py")
        return mech.MIXERS[pattern[layer % len(pattern)]](cfg, layer)
    return factory


for name, pattern in HYBRIDS.items():
    mech.register_mixer(name, hybrid(name, pattern), d_conv=4)
