"""The paper's numbers (arXiv 2505.15105, one seed each), which the figures (drawing.py) draw
beside ours and the report's verdicts (collect.report_numbers) weigh ours against. They are read
off its figure files in the official repository aryamanarora/tinylang, folder notebooks/figs/,
named below with the paper's section. Accuracies: the final test accuracy at d = 16, 32, 64, 128,
256 (sweeps.WIDTHS), the best over the paper's learning rates. Attribs: the median over the
paper's runs (every width and learning rate) that pass its filter (collect.MIN_EFFECT), Key
corrupted, at the last layer's input; 0.0 and 1.0 are clusters the figure shows at 0 and 1. None:
the paper has no number there (DeltaNet, added in v3, has figures without numbers; in an Attrib
table, no run passed)."""

PAPER = {
    # §5.1, ar_32.pdf: AR, 2 layers; Attention with its position embedding, the others without
    "ar_accuracy": dict(attention=(0.066, 1.000, 1.000, 1.000, 1.000),
                        base_conv=(0.000, 0.009, 0.038, 0.066, 0.097),
                        based=(0.244, 0.931, 0.991, 0.988, 0.991),
                        h3=(0.009, 0.006, 0.019, 0.025, 0.016),
                        hyena=(0.006, 0.009, 0.028, 0.138, 0.297),
                        mamba=(0.100, 0.769, 0.806, 0.897, 0.912),
                        delta_net=None),
    # §5.1, ar_32_diff_query_item_orig.pdf (@Value, @Query) and ar_32_diff_query_item_orig_q.pdf
    # (@Query, @Key): BaseConv's is its one run past the filter, Mamba's the medians of its 15
    "ar_mechanism": dict(attention=dict(key=0.0, value=1.0, query=0.0),
                         base_conv=dict(key=0.100, value=0.571, query=0.000),
                         based=dict(key=0.0, value=1.0, query=0.0),
                         h3=None,
                         hyena=dict(key=0.0, value=0.0, query=1.0),
                         mamba=dict(key=0.003, value=0.0, query=1.0),
                         delta_net=None),
    # the architectures whose ar_mechanism entry is one run, not a median (the only one past the
    # paper's filter)
    "ar_mechanism_one_run": ("base_conv",),
    # App. D.2, ar_32_layers_with_3.pdf: AR at 1 and 3 layers, by (architecture, layers); its
    # 2-layer panel is ar_32.pdf's; no 1-layer Based (its one layer would be a BaseConv layer)
    "ar_layers": {("attention", 1): (0.012, 0.066, 0.091, 0.084, 0.062),
                  ("base_conv", 1): (0.025, 0.025, 0.028, 0.025, 0.019),
                  ("h3", 1): (0.006, 0.019, 0.025, 0.028, 0.031),
                  ("hyena", 1): (0.003, 0.012, 0.022, 0.078, 0.316),
                  ("mamba", 1): (0.106, 0.472, 0.831, 0.869, 0.962),
                  ("based", 1): None, ("delta_net", 1): None, ("delta_net", 3): None,
                  ("attention", 3): (0.131, 0.997, 1.000, 1.000, 1.000),
                  ("base_conv", 3): (0.003, 0.022, 0.031, 0.075, 0.081),
                  ("based", 3): (0.375, 0.909, 0.991, 0.987, 0.994),
                  ("h3", 3): (0.009, 0.012, 0.012, 0.016, 0.019),
                  ("hyena", 3): (0.006, 0.012, 0.034, 0.084, 0.200),
                  ("mamba", 3): (0.084, 0.131, 0.766, 0.869, 0.900)},
    # App. D.3, ar_32_layers_attrib.pdf: Attrib@Query of each layer's mixer output (layer 0, 1,
    # ...), by (layers, architecture)
    "ar_layers_attrib": {(1, "h3"): (1.000,), (1, "hyena"): (1.000,), (1, "mamba"): (1.000,),
                         (2, "attention"): (0.0, 1.000), (2, "base_conv"): (0.0, 1.000),
                         (2, "based"): (0.0, 1.000), (2, "h3"): (-0.022, 1.002),
                         (2, "hyena"): (1.000, 0.000), (2, "mamba"): (1.000, 0.000),
                         (3, "attention"): (0.0, 0.999, 0.004), (3, "base_conv"): (0.0, 0.998, 0.0),
                         (3, "based"): (0.0, 0.998, 0.086), (3, "hyena"): (1.000, 0.0, 0.0),
                         (3, "mamba"): (1.000, 0.000, 0.000)},
    # §5.4, mamba_ar_32.pdf: Mamba on AR by its short-conv width d_conv (4, the default: ar_32's)
    "ar_mamba_dconv": {0: (0.009, 0.037, 0.028, 0.037, 0.056),
                       1: (0.009, 0.031, 0.022, 0.028, 0.028),
                       2: (0.044, 0.187, 0.909, 0.391, 0.944),
                       3: (0.119, 0.709, 0.909, 0.941, 0.922),
                       4: (0.100, 0.769, 0.806, 0.897, 0.912)},
    # §5.4, mamba_ar_box.pdf: its Attribs by d_conv (the figure shows d_conv 2-4)
    "ar_mamba_dconv_mechanism": {2: dict(key=0.199, value=0.008, query=0.042),
                                 3: dict(key=0.183, value=0.000, query=0.752),
                                 4: dict(key=0.000, value=0.000, query=1.000)},
    # §5.4, based_ar_32.pdf: Based by the kernel of its BaseConv layer's short conv (3: the
    # default), or the implicit long conv instead ("long"); BaseConv with long convs only is in
    # no figure of the paper
    "based_conv": {1: (0.009, 0.028, 0.034, 0.037, 0.062),
                   2: (0.187, 0.947, 0.988, 0.988, 0.984),
                   3: (0.244, 0.931, 0.991, 0.988, 0.991),
                   4: (0.284, 0.856, 0.972, 0.975, 0.981),
                   "long": (0.003, 0.016, 0.037, 0.059, 0.091)},
    # §5.2, atr.pdf: ATR, 2 layers, by (setting, model) (no H3 on medium); Attention without its
    # position embedding: App. D.1, pos_embed.pdf (easy and medium only)
    "atr_accuracy": {("easy", "attention"): (0.684, 0.903, 0.938, 0.953, 0.962),
                     ("easy", "base_conv"): (0.675, 0.756, 0.825, 0.869, 0.900),
                     ("easy", "based"): (0.822, 0.912, 0.919, 0.931, 0.922),
                     ("easy", "h3"): (0.819, 0.878, 0.900, 0.941, 0.941),
                     ("easy", "hyena"): (0.759, 0.809, 0.853, 0.925, 0.938),
                     ("easy", "mamba"): (0.912, 0.944, 0.962, 0.969, 0.962),
                     ("easy", "attention NoPE"): (0.809, 0.875, 0.900, 0.922, 0.916),
                     ("easy", "delta_net"): None,
                     ("8192", "attention"): (0.725, 0.841, 0.894, 0.869, 0.866),
                     ("8192", "base_conv"): (0.425, 0.466, 0.559, 0.597, 0.662),
                     ("8192", "based"): (0.684, 0.831, 0.866, 0.875, 0.866),
                     ("8192", "h3"): (0.494, 0.634, 0.725, 0.759, 0.762),
                     ("8192", "hyena"): (0.459, 0.578, 0.647, 0.691, 0.700),
                     ("8192", "mamba"): (0.703, 0.781, 0.872, 0.872, 0.884),
                     ("8192", "attention NoPE"): None, ("8192", "delta_net"): None,
                     ("medium", "attention"): (0.509, 0.569, 0.756, 0.806, 0.809),
                     ("medium", "base_conv"): (0.559, 0.616, 0.653, 0.706, 0.688),
                     ("medium", "based"): (0.631, 0.716, 0.700, 0.709, 0.731),
                     ("medium", "hyena"): (0.578, 0.638, 0.625, 0.663, 0.684),
                     ("medium", "mamba"): (0.772, 0.878, 0.863, 0.900, 0.922),
                     ("medium", "attention NoPE"): (0.556, 0.631, 0.694, 0.738, 0.734),
                     ("medium", "h3"): None, ("medium", "delta_net"): None},
    # §5.2, atr_box.pdf: ATR Attribs (filter 0.1), by (setting, model)
    "atr_mechanism": {("easy", "attention"): dict(key=0.056, query=0.046, value=1.025),
                      ("easy", "base_conv"): dict(key=0.495, query=0.000, value=0.415),
                      ("easy", "based"): dict(key=0.148, query=0.000, value=0.927),
                      ("easy", "h3"): dict(key=0.435, query=0.523, value=0.024),
                      ("easy", "hyena"): dict(key=0.483, query=0.495, value=0.078),
                      ("easy", "mamba"): dict(key=0.552, query=0.289, value=0.032),
                      ("8192", "attention"): dict(key=0.364, query=0.004, value=0.901),
                      ("8192", "base_conv"): dict(key=0.819, query=0.000, value=0.204),
                      ("8192", "based"): dict(key=0.135, query=0.000, value=0.951),
                      ("8192", "h3"): dict(key=0.819, query=0.090, value=0.037),
                      ("8192", "hyena"): dict(key=0.421, query=0.309, value=0.151),
                      ("8192", "mamba"): dict(key=0.871, query=0.056, value=0.030),
                      ("medium", "attention"): dict(key=0.023, query=-0.100, value=1.109),
                      ("medium", "base_conv"): dict(key=0.344, query=0.000, value=0.560),
                      ("medium", "based"): dict(key=0.126, query=0.000, value=0.816),
                      ("medium", "hyena"): dict(key=0.092, query=0.818, value=0.052),
                      ("medium", "mamba"): dict(key=0.294, query=0.451, value=0.027)},
    # arXiv 2505.15105v3's abstract, in words (no figure numbers): Mamba without its short conv
    # (d_conv 0) learns Attention-like induction on ATR easy, i.e. Attrib@Value ≈ 1
    "atr_mamba_dconv_claim": {0: 1.0},
    # ATR's copy-next-token baseline, by setting: predict the token after the Query's last
    # earlier occurrence (Key+1), measured on the official generator's documents (seed 42, about
    # 1,000 of them); the 1-layer BaseConv and Based of atr_layers.pdf (App. D.2) sit on it
    "atr_copy_next_token": {"easy": 0.52, "medium": 0.43, "8192": 0.49},
    # App. D.1, pos_embed.pdf: 2 layers, by (setting, architecture, "PE" or "NoPE"), one learning
    # rate grid (LR5, so Mamba's AR NoPE is below ar_32.pdf's, which adds two rates); no H3 on
    # ATR medium
    "pos_embed": {
        ("ar", "attention", "NoPE"): (0.044, 0.072, 0.091, 0.059, 0.056),
        ("ar", "attention", "PE"): (0.066, 1.000, 1.000, 1.000, 1.000),
        ("ar", "based", "NoPE"): (0.238, 0.931, 0.991, 0.988, 0.991),
        ("ar", "based", "PE"): (0.131, 0.794, 0.912, 0.919, 0.984),
        ("ar", "mamba", "NoPE"): (0.047, 0.434, 0.716, 0.897, 0.912),
        ("ar", "mamba", "PE"): (0.034, 0.122, 0.522, 0.809, 0.922),
        ("ar", "hyena", "NoPE"): (0.006, 0.009, 0.025, 0.103, 0.297),
        ("ar", "hyena", "PE"): (0.012, 0.012, 0.037, 0.050, 0.147),
        ("ar", "base_conv", "NoPE"): (0.000, 0.009, 0.031, 0.066, 0.097),
        ("ar", "base_conv", "PE"): (0.003, 0.016, 0.028, 0.050, 0.078),
        ("ar", "h3", "NoPE"): (0.009, 0.006, 0.019, 0.025, 0.016),
        ("ar", "h3", "PE"): (0.009, 0.012, 0.019, 0.028, 0.025),
        ("easy", "attention", "NoPE"): (0.809, 0.875, 0.900, 0.922, 0.916),
        ("easy", "attention", "PE"): (0.684, 0.903, 0.938, 0.953, 0.962),
        ("easy", "base_conv", "NoPE"): (0.675, 0.756, 0.825, 0.869, 0.900),
        ("easy", "base_conv", "PE"): (0.666, 0.753, 0.800, 0.856, 0.881),
        ("easy", "based", "NoPE"): (0.822, 0.912, 0.919, 0.931, 0.922),
        ("easy", "based", "PE"): (0.844, 0.884, 0.925, 0.934, 0.938),
        ("easy", "h3", "NoPE"): (0.819, 0.878, 0.900, 0.941, 0.941),
        ("easy", "h3", "PE"): (0.825, 0.872, 0.906, 0.938, 0.941),
        ("easy", "hyena", "NoPE"): (0.759, 0.809, 0.853, 0.925, 0.938),
        ("easy", "hyena", "PE"): (0.734, 0.791, 0.862, 0.928, 0.938),
        ("easy", "mamba", "NoPE"): (0.912, 0.944, 0.962, 0.969, 0.962),
        ("easy", "mamba", "PE"): (0.884, 0.931, 0.959, 0.959, 0.969),
        ("medium", "attention", "NoPE"): (0.556, 0.631, 0.694, 0.738, 0.734),
        ("medium", "attention", "PE"): (0.509, 0.569, 0.756, 0.806, 0.809),
        ("medium", "base_conv", "NoPE"): (0.559, 0.616, 0.653, 0.706, 0.688),
        ("medium", "base_conv", "PE"): (0.519, 0.578, 0.597, 0.600, 0.641),
        ("medium", "based", "NoPE"): (0.631, 0.716, 0.700, 0.709, 0.731),
        ("medium", "based", "PE"): (0.584, 0.772, 0.734, 0.713, 0.747),
        ("medium", "h3", "NoPE"): None, ("medium", "h3", "PE"): None,
        ("medium", "hyena", "NoPE"): (0.578, 0.638, 0.625, 0.663, 0.684),
        ("medium", "hyena", "PE"): (0.503, 0.581, 0.609, 0.713, 0.634),
        ("medium", "mamba", "NoPE"): (0.772, 0.878, 0.863, 0.900, 0.922),
        ("medium", "mamba", "PE"): (0.766, 0.831, 0.822, 0.888, 0.900),
        **{(s, "delta_net", pe): None for s in ("ar", "easy", "medium") for pe in ("PE", "NoPE")}},
    # App. D.2, atr_layers.pdf: ATR easy with 1 layer (its 2-layer panel is atr.pdf's); a 1-layer
    # Based is its BaseConv layer, and the 1-layer BaseConv and Based sit on the copy-next-token
    # baseline
    "atr_layers": dict(attention=(0.656, 0.697, 0.738, 0.713, 0.747),
                       base_conv=(0.513, 0.516, 0.516, 0.513, 0.516),
                       based=(0.513, 0.516, 0.516, 0.516, 0.513),
                       h3=(0.688, 0.819, 0.853, 0.872, 0.897),
                       hyena=(0.700, 0.775, 0.825, 0.866, 0.894),
                       mamba=(0.853, 0.875, 0.916, 0.934, 0.944),
                       delta_net=None),
    # §5.3, atr_gen.pdf: ATR easy with 20 % of the label pairs held out of training, 2 layers,
    # the learning rate chosen on dev accuracy: dev (training's pairs) and test (held-out pairs)
    # accuracy; the paper trains no other depth held out
    "atr_gen": dict(attention=dict(dev=(0.869, 0.912, 0.950, 0.959, 0.956),
                                   test=(0.350, 0.534, 0.600, 0.681, 0.681)),
                    base_conv=dict(dev=(0.741, 0.812, 0.844, 0.894, 0.916),
                                   test=(0.238, 0.166, 0.197, 0.241, 0.272)),
                    based=dict(dev=(0.841, 0.916, 0.922, 0.931, 0.934),
                               test=(0.356, 0.425, 0.484, 0.463, 0.472)),
                    h3=dict(dev=(0.819, 0.884, 0.884, 0.912, 0.919),
                            test=(0.478, 0.441, 0.494, 0.544, 0.569)),
                    hyena=dict(dev=(0.800, 0.822, 0.891, 0.922, 0.916),
                               test=(0.241, 0.134, 0.341, 0.428, 0.453)),
                    mamba=dict(dev=(0.897, 0.931, 0.969, 0.975, 0.981),
                               test=(0.525, 0.325, 0.466, 0.594, 0.650)),
                    delta_net=None),
    # §5.3, atr_gen_box.pdf: the same runs' Attribs on dev and on test documents, by (documents,
    # architecture): the median over all its runs (every width and rate), unfiltered
    "atr_gen_mechanism": {
        ("dev", "attention"): dict(key=0.011, query=0.002, value=1.019),
        ("dev", "base_conv"): dict(key=0.434, query=0.0, value=0.522),
        ("dev", "based"): dict(key=0.149, query=0.0, value=0.936),
        ("dev", "h3"): dict(key=0.540, query=0.595, value=0.026),
        ("dev", "hyena"): dict(key=0.591, query=0.578, value=0.067),
        ("dev", "mamba"): dict(key=0.549, query=0.291, value=0.066),
        ("test", "attention"): dict(key=0.019, query=0.013, value=1.221),
        ("test", "base_conv"): dict(key=0.700, query=0.0, value=0.138),
        ("test", "based"): dict(key=0.107, query=0.0, value=0.870),
        ("test", "h3"): dict(key=0.229, query=0.630, value=0.007),
        ("test", "hyena"): dict(key=0.354, query=0.329, value=0.044),
        ("test", "mamba"): dict(key=0.347, query=0.335, value=0.001)},
    # App. D.4, multihop.pdf: the sibling task (ATR easy, the Query's rightmost sibling asked),
    # by (architecture, layers); Attention's 1-layer point at d = 128 is missing from the figure;
    # a 1-layer Based is its BaseConv layer (the figure's equal series)
    "atr_sibling": {("attention", 1): (0.853, 0.912, 0.916, None, 0.925),
                    ("attention", 2): (0.906, 0.928, 0.941, 0.944, 0.950),
                    ("attention", 3): (0.894, 0.928, 0.934, 0.950, 0.953),
                    ("base_conv", 1): (0.759, 0.750, 0.753, 0.744, 0.744),
                    ("base_conv", 2): (0.894, 0.934, 0.922, 0.959, 0.959),
                    ("base_conv", 3): (0.912, 0.947, 0.941, 0.956, 0.959),
                    ("based", 1): (0.759, 0.750, 0.753, 0.744, 0.744),
                    ("based", 2): (0.919, 0.928, 0.928, 0.937, 0.944),
                    ("based", 3): (0.916, 0.916, 0.941, 0.944, 0.953),
                    ("h3", 1): (0.887, 0.928, 0.959, 0.931, 0.966),
                    ("h3", 2): (0.919, 0.934, 0.937, 0.969, 0.975),
                    ("h3", 3): (0.925, 0.931, 0.953, 0.953, 0.972),
                    ("hyena", 1): (0.887, 0.916, 0.931, 0.941, 0.937),
                    ("hyena", 2): (0.937, 0.937, 0.934, 0.956, 0.966),
                    ("hyena", 3): (0.931, 0.931, 0.941, 0.959, 0.981),
                    ("mamba", 1): (0.872, 0.944, 0.953, 0.966, 0.972),
                    ("mamba", 2): (0.922, 0.959, 0.981, 0.981, 0.984),
                    ("mamba", 3): (0.962, 0.956, 0.975, 0.981, 0.994),
                    **{("delta_net", n): None for n in (1, 2, 3)}},
    # App. D.4: copying the Query scores at least the share of documents whose Query is its own
    # rightmost sibling
    "atr_sibling_copy_query": 0.675,
}
