"""The paper's figures, drawn from the records of collect.py: one function per figure, each drawing
what the records allow (nothing if they hold no run for it) and returning the paths it wrote. Each
stands alone: a title, axes labelled, a caption with our scale (read off the runs drawn) and the
filter applied, every run a marker of its own, and the paper's number (paper.py) beside ours
wherever the paper has one. figures/experiments.py --collect draws them all (plot_figures)."""
import collections
import dataclasses
import io
import os
import statistics
import textwrap
from collections.abc import Callable

import matplotlib
matplotlib.use("Agg")  # figures are files: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as transforms  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

import mech  # noqa: E402
from figures import plots  # noqa: E402
from figures.collect import (CONV, HYBRID_TASKS, MIN_EFFECT, all_documents,  # noqa: E402
                             archs_of, atr_model, atr_query, best_runs, config_key, configuration,
                             conv_variant, copy_next_token, data_regime, final_position, followed,
                             hybrid_of, input_means, layer_archs, layer_conv_cell, layer_verdict,
                             main_ar, main_atr, main_question, main_variant, moments_of, of_arch,
                             one_protocol, one_width, pe_variant, reacts, task_label, TODAY,
                             watched_runs)
from figures.paper import PAPER  # noqa: E402
from figures.sweeps import ARCHS, LR5, LR7, WIDTHS  # noqa: E402

SPLIT = 0.5   # runs further apart than this have no summary mark: they split, none stands for all
SLOTS = 0.84  # the share of a column taken by its slots, one per series
# within a slot (of width 1 here): the runs spread over [-0.38, 0.14], the paper's x at 0.36, apart
SEEDS_AT, SEEDS_SPREAD, PAPER_AT = -0.12, 0.26, 0.36
SHOWN = ("key", "query", "value")  # the positions of the mechanism panels
STYLE = {"key": ("C1", "s"), "query": ("C2", "^"), "value": ("C3", "o"),
         "value+1": ("C4", "D")}  # a position's (colour, marker), the same in every figure
LAYER_COLORS = ("#1b9e77", "#d95f02", "#7570b3")  # layer (or depth) 0, 1, 2
ACCURACY_YLIM = (-0.03, 1.05)  # every accuracy axis: the whole range, so panels compare
MARKS = ("Hollow markers: one run (seed) each, spread left to right in seed order so that runs "
         "with the same value stay apart; the paper's x to their right. Bar: the median run, "
         f"drawn only for 3 runs or more within {SPLIT} of each other (else they split, and no "
         "one value stands for them).")
BEST_LABEL = "paper (one seed, its best learning rate)"
MEDIAN_LABEL = "paper (median of its runs past the filter)"
DEFAULTS = {f.name: f.default for f in dataclasses.fields(mech.Config)}


@dataclasses.dataclass
class Series:
    """One kind of marker in every column: what it draws of a run, and how."""
    label: str
    color: str
    marker: str
    value: Callable                     # a run's record -> the number drawn
    keep: Callable = lambda r: True     # the runs of a column that it draws
    faded: Callable = lambda r: False   # runs drawn grey (each figure says why)
    empty: str = "not run"  # what a slot says where its column has runs but none of its own


@dataclasses.dataclass
class Column:
    """One tick of the x-axis: its runs, the paper's number for each series (None: it has none),
    what the column says when it has no run to draw, and a note at its foot."""
    label: str
    runs: list
    paper: tuple = ()
    empty: str = "not run"
    note: str = ""


ACCURACY = Series("ours: one run", "C0", "o", lambda r: r["accuracy"])


def position_series(read: str, positions=SHOWN) -> list:
    """A series per position, of the Attribs in a record's field `read` (attrib, conv)."""
    return [Series(at(p), *STYLE[p], value=lambda r, p=p: r[read][p]) for p in positions]


def save(fig, out_dir: str, name: str, caption: list) -> list:
    """Lay the figure out with its caption below the axes (the figure grows to hold it) and save
    it as out_dir/name."""
    width, height = fig.get_size_inches()
    text = "\n".join(textwrap.fill(paragraph, int(width * 16)) for paragraph in caption)
    extra = (text.count("\n") + 1) * 8 * 1.35 / 72 + 0.2  # 8-point lines, in inches
    fig.set_size_inches(width, height + extra)
    if fig.get_suptitle():  # 0.1 inch from the top, as a short figure has it, not 2 % of a tall one
        fig.suptitle(fig.get_suptitle(), y=1 - 0.1 / (height + extra))
    fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))
    fig.text(0.01, (extra - 0.1) / (height + extra), text, fontsize=8, va="top", ha="left")
    path = os.path.join(out_dir, name)
    png = io.BytesIO()
    fig.savefig(png, dpi=120, format="png")
    plots.write_file(path, png.getvalue())
    plt.close(fig)
    return [path]


def strip_panel(ax, columns: list, series: list) -> None:
    """Columns of slots, one slot per series: a marker per run, their median's bar, the paper's
    number as a black x; an empty column (or slot) says why."""
    width = SLOTS / len(series)
    for i, col in enumerate(columns):
        if not col.runs:
            empty_label(ax, i, col.empty)
        ax.text(i, 0.03, col.note, ha="center", fontsize=7, color="dimgrey",
                transform=x_data_y_axes(ax))
        for j, s in enumerate(series):
            x = i + width * (j - (len(series) - 1) / 2)
            runs = [r for r in col.runs if s.keep(r)]
            if runs:
                seed_markers(ax, x, runs, s, width)
            elif col.runs and s.empty:  # the column has runs, this series none
                empty_label(ax, x, s.empty)
            if j < len(col.paper) and col.paper[j] is not None:
                ax.scatter([x + PAPER_AT * width], [col.paper[j]], marker="x", color="k", s=30,
                           linewidths=1.5, zorder=4)
    ax.set_xticks(range(len(columns)), [c.label for c in columns], fontsize=8)
    ax.set_xlim(-0.6, len(columns) - 0.4)


def seed_markers(ax, x: float, runs: list, s: Series, width: float) -> None:
    """A hollow marker per run at its own x (spread_x), and the bar of their median run."""
    runs = sorted(runs, key=lambda r: (r["seed"], r["lr"], r["folder"]))
    ys = [s.value(r) for r in runs]
    ax.scatter(spread_x(x, len(runs), width), ys, marker=s.marker, s=20, linewidths=1.2,
               facecolors="none", edgecolors=["grey" if s.faded(r) else s.color for r in runs],
               zorder=3)
    faded = {bool(s.faded(r)) for r in runs}
    middle = summary_mark(ys) if len(faded) == 1 else None  # no bar over two kinds of reading
    if middle is not None:
        centre, half = x + SEEDS_AT * width, (SEEDS_SPREAD + 0.08) * width
        ax.hlines(middle, centre - half, centre + half, color="grey" if faded.pop() else s.color,
                  lw=2, zorder=2)


def spread_x(x: float, n: int, width: float) -> np.ndarray:
    """n positions across the runs' part of a slot of this width centred at x, in order: a small
    deterministic jitter, so that runs with the same value are still told apart."""
    return x + width * (SEEDS_AT + SEEDS_SPREAD * (np.linspace(-1, 1, n) if n > 1
                                                   else np.zeros(1)))


def summary_mark(ys: list):
    """The value of the median run, the bar drawn over a slot, or None: a summary must be one of
    the runs and stand for them all, so none for fewer than 3 runs (no middle one) or for runs
    that split (max - min > SPLIT). With an even number of runs, the lower of the middle two."""
    if len(ys) < 3 or max(ys) - min(ys) > SPLIT:
        return None
    return statistics.median_low(ys)


def empty_label(ax, x: float, text: str) -> None:
    """Why a column or slot is empty, written up it (the paper's x, if any, stays on top)."""
    ax.text(x, 0.5, text, rotation=90, ha="center", va="center", fontsize=7, color="dimgrey",
            transform=x_data_y_axes(ax), zorder=1,
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.7, pad=1))


def x_data_y_axes(ax):
    """Coordinates for text in a column: x in data (the column), y in the axes (0 to 1), so that
    it sits at the same height whatever the panel's y-range."""
    return transforms.blended_transform_factory(ax.transData, ax.transAxes)


def legend(ax, series: list, paper: str = "", extra=()) -> None:
    """The figure's key, right of ax: each series' marker, the median bar, the paper's x."""
    handles = [Line2D([], [], ls="none", marker=s.marker, mfc="none", mec=s.color, mew=1.3,
                      label=s.label) for s in series]
    handles.append(Line2D([], [], color="grey", lw=2, label="median run (bar)"))
    if paper:
        handles.append(Line2D([], [], ls="none", marker="x", color="k", mew=1.6, label=paper))
    ax.legend(handles=handles + list(extra), loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=8, frameon=False)


def attrib_axes(axes: list, panels: list, ylabel: str) -> None:
    """Attrib axes: dashed lines at 0 (the position restores nothing) and 1 (all of the answer),
    and one y-range for all of them, that of every run and paper number drawn in the panels,
    [(columns, series)]."""
    ys = [s.value(r) for columns, series in panels for c in columns for s in series
          for r in c.runs if s.keep(r)]
    ys += [v for columns, _ in panels for c in columns for v in c.paper if v is not None]
    for ax in axes:
        for v in (0, 1):
            ax.axhline(v, color="grey", ls="--", lw=0.6, zorder=0)
        ax.set(ylim=(min([-0.1] + ys) - 0.05, max([1.1] + ys) + 0.05), ylabel=ylabel)


def stacked_panels(n: int, width: float = 10, height: float = 2.6):
    """n panels above each other, sharing their columns and their y-scale."""
    fig, axes = plt.subplots(n, 1, figsize=(width, height * n), sharex=True, sharey=True,
                             squeeze=False)
    return fig, list(axes[:, 0])


# ── captions: what the runs drawn are, read off their records ─────────────────────────────────

def scale_note(runs: list) -> str:
    """Our scale: width, preset, training steps, learning rates and seeds of the runs."""
    rate, fmt = (lambda r: r["lr"]), "{:g}".format
    seeds, models = {}, {}  # (configuration but seed and lr, seed) -> its learning rates
    for r in runs:
        seeds.setdefault((config_key(r, ("seed", "lr")), r["seed"]), set()).add(r["lr"])
    for (k, _), rates in seeds.items():  # configuration -> the rates of all its seeds
        models[k] = models.get(k, set()) | rates
    if max(map(len, models.values())) == 1:
        lr = f"one learning rate per model, {by_model(runs, rate, fmt)}"
    else:  # the rates tried, then the one each seed kept
        grids = {tuple(sorted(rates)) for rates in models.values()}
        tried = ", ".join(map(fmt, grids.pop())) if len(grids) == 1 else by_model(runs, rate, fmt)
        lr = (f"each seed at its best of the learning rates {tried} (kept: "
              f"{by_model(best_runs(runs), rate, fmt)})")
        full = {s for (k, s), rates in seeds.items() if rates == models[k]}
        if partial := {s for _, s in seeds} - full:
            lr += (f"; seed{'s' * (len(partial) > 1)} {span(partial)} only at seed "
                   f"{span(full)}'s kept rate")
    steps = by_model(runs, lambda r: configuration(r)["steps"], "{:,}".format)
    warmup = by_model(runs, lambda r: round(configuration(r)["steps"]
                                            * configuration(r)["warmup_frac"]), "{:,}".format)
    presets = " / ".join(sorted({r.get("preset") or DEFAULTS["preset"] for r in runs}))
    per_model = [len({s for k, s in seeds if k == model}) for model in models]  # seeds each
    return (f"Ours: d = {span(r['d_model'] for r in runs)}, mech.py --preset {presets}, {steps} "
            f"training steps ({warmup} of them warmup), {lr}; {span(per_model)} "
            f"seed{'s' * (span(per_model) != '1')} per model "
            f"({span(r['seed'] for r in runs)}).")


def by_model(runs: list, value, fmt) -> str:
    """A setting over runs: the value of most runs, then the architectures (with their task, if
    the runs span two) whose runs differ, e.g. "15,000 (attention 30,000; mamba 20,000)"."""
    two_tasks = len({r["task"] for r in runs}) > 1
    values = {}
    for r in runs:
        model = f"{r['task'].upper()} {r['arch']}" if two_tasks else r["arch"]
        values.setdefault(model, set()).add(value(r))
    common = collections.Counter(map(value, runs)).most_common(1)[0][0]
    odd = [f"{m} {', '.join(map(fmt, sorted(vs)))}" for m, vs in values.items() if vs != {common}]
    return fmt(common) + (f" ({'; '.join(odd)})" if odd else "")


def span(values) -> str:
    """"64", or "42-44" for a range."""
    values = sorted(set(values))
    return f"{values[0]}" if len(values) == 1 else f"{values[0]}-{values[-1]}"


def filter_note(runs: list, readings=(("", lambda runs: runs),)) -> str:
    """The filter the mechanism panels apply, and how many of the runs pass it; readings: (name,
    runs -> the records read) per set of documents the panels read, e.g. dev and test."""
    rule = ", ".join(f"≥ {MIN_EFFECT[t]} on {t.upper()}" for t in sorted({r["task"] for r in runs}))
    passed = "; ".join(f"{name + ': ' if name else ''}{sum(map(reacts, read(runs)))} of "
                       f"{len(runs)} runs pass" for name, read in readings)
    return (f"Attribs only of the runs whose answer reacts to corrupting the Key: p_clean − "
            f"p_corrupted {rule} (the paper's filter); {passed}.")


MEDIANS_NOTE = "the median over its runs that pass the filter (all its widths and learning rates)"


def paper_best(runs: list) -> str:
    """What the paper's accuracies beside the runs are."""
    return (f"its one seed at d = {span(r['d_model'] for r in runs)}, the best of its "
            f"{len(LR5)}-{len(LR7)} learning rates after "
            f"{mech.Config(task=runs[0]['task'], preset='paper').total_steps:,} steps")


def paper_note(source: str, what: str, panels: list, filtered: bool = False) -> str:
    """Where the paper's x come from and what they are, and the columns without one, by panel:
    panels [(name, columns)] (one unnamed panel: [("", columns)]); filtered: the paper's x are of
    the runs past its filter, so that a column may lack one for want of such runs."""
    missing = [(name, [c.label.replace("\n", " ") for c in columns
                       if all(v is None for v in c.paper)]) for name, columns in panels]
    missing = "; ".join(f"{name}{': ' if name else ''}{', '.join(labels)}"
                        for name, labels in missing if labels)
    why = "no number in the paper" + (", or none of its runs passes the filter" if filtered else "")
    return f"x: the paper ({source}): {what}." + (f" No x ({why}): {missing}." if missing else "")


# ── labels and columns: what a figure's x-axis holds ─────────────────────────────────────────

def at(position: str) -> str:
    return f"@{position.capitalize()}"


def layers_label(n: int) -> str:
    return f"{n} layer{'s' if n > 1 else ''}"


def paper_accuracy(values, runs: list) -> tuple:
    """The paper's accuracy at the width of the runs, as the paper tuple of a one-series column:
    (value,), or (None,) where it has none."""
    d = runs[0]["d_model"] if runs else None
    return (values[WIDTHS.index(d)] if values and d in WIDTHS else None,)


def mechanism_column(label: str, runs: list, paper: tuple) -> Column:
    """A column of the runs whose answer reacts to the corruption; empty, it says why, and where
    only some runs pass, how many."""
    passed = [r for r in runs if reacts(r)]
    why = f"no run passes\nthe {MIN_EFFECT[runs[0]['task']]} filter" if runs else "not run"
    some = f"{len(passed)} of {len(runs)} pass" if 0 < len(passed) < len(runs) else ""
    return Column(label, passed, paper, why, some)


def by_position(paper) -> tuple:
    """A paper Attrib dict as the paper tuple of a column of SHOWN positions."""
    return tuple(paper.get(p) if paper else None for p in SHOWN)


# ── the figures ───────────────────────────────────────────────────────────────────────────────

def ar_accuracy(records: list, out_dir: str) -> list:
    """§5.1 (ar_32): AR accuracy by architecture, beside the paper's."""
    rs = main_ar(records)
    if not rs:
        return []
    columns = [Column(a, best_runs(of_arch(rs, a)),
                      paper_accuracy(PAPER["ar_accuracy"].get(a), rs)) for a in archs_of(rs)]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    strip_panel(ax, columns, [ACCURACY])
    ax.set(xlabel="architecture (2 layers; Attention with a position embedding, the others "
           "without)", ylabel="test accuracy", ylim=ACCURACY_YLIM)
    legend(ax, [ACCURACY], BEST_LABEL)
    fig.suptitle("Associative Recall (AR): test accuracy of each architecture")
    return save(fig, out_dir, "ar_accuracy.png",
                [MARKS, scale_note(rs), paper_note("ar_32.pdf, §5.1", paper_best(rs),
                                                   [("", columns)])])


def ar_mechanism(records: list, out_dir: str) -> list:
    """§5.1 (ar_32_diff): where patching the last layer's input restores the answer, per
    architecture: Attrib at the Key, Query and Value."""
    rs = main_ar(records)
    if not any(map(reacts, rs)):
        return []
    columns = [mechanism_column(a, of_arch(rs, a), by_position(PAPER["ar_mechanism"].get(a)))
               for a in archs_of(rs)]
    series = position_series("attrib")
    fig, ax = plt.subplots(figsize=(11, 3.8))
    strip_panel(ax, columns, series)
    attrib_axes([ax], [(columns, series)], "Attrib (last layer's input)")
    ax.set(xlabel="architecture (2 layers)")
    single = [a for a in archs_of(rs) if a in PAPER["ar_mechanism_one_run"]]
    legend(ax, series, MEDIAN_LABEL + "".join(f";\n{a}: its one run" for a in single))
    fig.suptitle("AR mechanism: the share of the answer's probability that patching one position "
                 "of the\nlast layer's input restores (Key corrupted): @Value = induction, "
                 "@Query or @Key = direct retrieval")
    return save(fig, out_dir, "ar_mechanism.png",
                [MARKS, filter_note(rs), scale_note(rs),
                 paper_note("ar_32_diff_query_item_orig.pdf and its _q.pdf, §5.1",
                            MEDIANS_NOTE, [("", columns)], True)]
                + [f"{', '.join(single)}: only one of the paper's runs passes its filter, so its x "
                   "is that run's value, not a median." for _ in single[:1]])


def mamba_paper(task: str, k: int, runs: list) -> tuple:
    """The paper's accuracy (as a column's paper tuple) and Attribs of Mamba with short conv
    width k on task: on AR by width (mamba_ar_32, mamba_ar_box); on ATR only the default width,
    the main ATR runs (atr, atr_box)."""
    if task == "ar":
        return (paper_accuracy(PAPER["ar_mamba_dconv"].get(k), runs),
                by_position(PAPER["ar_mamba_dconv_mechanism"].get(k)))
    main = k == mech.DEFAULT_DCONV["mamba"]
    return (paper_accuracy(PAPER["atr_accuracy"][("easy", "mamba")] if main else None, runs),
            by_position(PAPER["atr_mechanism"][("easy", "mamba")] if main else None))


def mamba_dconv(records: list, out_dir: str) -> list:
    """Mamba's short-conv ablation, accuracy and mechanism by conv width: on AR (§5.4, mamba_ar_32
    and mamba_ar_box) and on ATR easy (arXiv 2505.15105v3: without the conv, induction)."""
    paths = []
    for task, name, title, source in (
            ("ar", "ar_mamba_dconv.png", "AR", "mamba_ar_32.pdf and mamba_ar_box.pdf, §5.4"),
            ("atr", "atr_mamba_dconv.png", "ATR easy",
             "atr.pdf and atr_box.pdf, §5.2: the default d_conv 4 only; v3's ATR ablation gives "
             "no numbers")):
        rs = [r for r in records if r["task"] == task and r["arch"] == "mamba" and r["n_layer"] == 2
              and r.get("atr", "easy") == "easy" and main_variant(r)]
        widths = sorted({r["d_conv"] for r in rs})
        if len(widths) < 2:
            continue
        accuracy, attribs = [], []
        for k in widths:
            runs = [r for r in rs if r["d_conv"] == k]
            paper = mamba_paper(task, k, runs)
            accuracy.append(Column(str(k), best_runs(runs), paper[0]))
            attribs.append(mechanism_column(str(k), runs, paper[1]))
        claims = [(widths.index(k), "value", v) for k, v in PAPER["atr_mamba_dconv_claim"].items()
                  if task == "atr" and k in widths]
        paths += dconv_figure(accuracy, attribs, rs, f"Mamba on {title}", source, name, out_dir,
                              claims)
    return paths


def dconv_figure(accuracy: list, attribs: list, rs: list, title: str, source: str, name: str,
                 out_dir: str, claims=()) -> list:
    """A conv-width ablation: accuracy (left) and Attribs (right) by d_conv; claims: (column,
    position, value) of a claim the paper states in words, drawn as a black star."""
    series = position_series("attrib")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6), width_ratios=(1, 1.5))
    strip_panel(left, accuracy, [ACCURACY])
    strip_panel(right, attribs, series)
    width = SLOTS / len(series)
    for column, position, value in claims:  # at the paper's x place of that position's slot
        x = column + width * (SHOWN.index(position) - (len(series) - 1) / 2 + PAPER_AT)
        right.scatter([x], [value], marker="*", s=90, facecolors="none", edgecolors="k",
                      linewidths=1.2, zorder=4)
    claim = [Line2D([], [], ls="none", marker="*", mfc="none", mec="k", ms=10,
                    label="the paper's claim in words (v3:\nMamba without its conv, @Value ≈ 1)")]
    left.set(xlabel="d_conv: short-conv width (0 = none; 4 = default)", ylabel="test accuracy",
             ylim=ACCURACY_YLIM, title="accuracy")
    attrib_axes([right], [(attribs, series)], "Attrib (last layer's input)")
    right.set(xlabel="d_conv", title="mechanism: Attrib per position (Key corrupted)")
    legend(right, [ACCURACY] + series, "paper (its best run / median of its runs)",
           claim if claims else ())
    fig.suptitle(f"{title}: accuracy and mechanism by the width of its short convolution")
    return save(fig, out_dir, name,
                [MARKS, filter_note(rs), scale_note(rs),
                 paper_note(source, f"accuracy: {paper_best(rs)}; Attribs: {MEDIANS_NOTE}",
                            [("accuracy at d_conv", accuracy), ("Attribs at d_conv", attribs)],
                            True)]
                + ["Star: the claim this ablation tests, arXiv 2505.15105v3's abstract (\"Mamba "
                   "can learn Attention-like induction on ATR when short convolutions are "
                   "removed\"), drawn at @Value 1 for d_conv 0: a claim in words, not a number "
                   "read off a figure." for _ in claims[:1]])


def mamba_conv_restored(records: list, out_dir: str) -> list:
    """arXiv 2505.15105v3, Mamba's induction lives in its short convolution: the Attrib of
    patching layer 0's conv output at the Key, the Value and Value+1, per task and conv width."""
    rs = [r for r in records if r["arch"] == "mamba" and r["n_layer"] == 2 and r.get("conv")
          and main_variant(r)]
    if not any(map(reacts, rs)):
        return []

    def setting(r):
        return r["task"].upper() + (f" {r['atr']}" if r["task"] == "atr" else ""), r["d_conv"]
    series = position_series("conv", ("key", "value", "value+1"))
    # an older analysis averaged Value+1 over all documents, the divider's position in 38-48 %
    # of ATR ones and in AR's last pair: grey, so that no such point passes for a new one
    series[-1].faded = lambda r: all_documents(r, "value+1")
    columns = [mechanism_column(f"{t}\nd_conv {k}", [r for r in rs if setting(r) == (t, k)], ())
               for t, k in sorted({setting(r) for r in rs})]
    fig, ax = plt.subplots(figsize=(13, 3.8))
    strip_panel(ax, columns, series)
    attrib_axes([ax], [(columns, series)], "Attrib of layer 0's conv output")
    ax.set(xlabel="task and Mamba's short-conv width d_conv (d_conv 0: no convolution to patch)")
    shown = [r for c in columns for r in c.runs]
    old = sum(all_documents(r, "value+1") for r in shown)
    grey = [Line2D([], [], ls="none", marker="D", mfc="none", mec="grey",
                   label="@Value+1 over all documents\n(older analysis; its bar grey)")]
    legend(ax, series, extra=grey if any(map(series[-1].faded, shown)) else ())
    fig.suptitle("Mamba: patching the output of its short convolution in layer 0 at one position "
                 "(Key corrupted)")
    return save(fig, out_dir, "mamba_conv_restored.png", [
        MARKS, f"@Value+1: {len(shown) - old} of the {len(shown)} runs drawn were analysed over "
        f"the documents where Value+1 is distinct (neither the divider nor the Query), {old} over "
        "all documents (an older analysis, grey: in ATR Value+1 is the divider in 38-48 % of "
        "documents, in AR after the last pair only, 1 document in 16).",
        filter_note(rs), scale_note(rs),
        "No paper marks: the paper (v3) reports this without numbers."])


def based_conv(records: list, out_dir: str) -> list:
    """§5.4 (based_ar_32): Based on AR with its BaseConv kernel 1..4 or the implicit long conv,
    and BaseConv with long convs only."""
    rs = [r for r in records if r["task"] == "ar" and r["n_layer"] == 2 and main_variant(r)
          and (r["arch"] == "based" or r["arch"] == "base_conv" and r["long_conv"])]

    def kind(r):
        return r["arch"], "long" if r["long_conv"] else r["d_conv"]
    kinds = sorted({kind(r) for r in rs}, key=lambda k: (k[0] != "based", str(k[1])))
    if len(kinds) < 2:
        return []
    names = {("based", mech.DEFAULT_DCONV["based"]): "kernel 3\n(default)",
             ("based", "long"): "long conv", ("base_conv", "long"): "BaseConv,\nlong convs only"}
    columns = []
    for k in kinds:
        runs = [r for r in rs if kind(r) == k]
        paper = PAPER["based_conv"].get(k[1]) if k[0] == "based" else None
        columns.append(Column(names.get(k, f"kernel {k[1]}"), best_runs(runs),
                              paper_accuracy(paper, runs)))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    strip_panel(ax, columns, [ACCURACY])
    ax.set(xlabel="Based's BaseConv layer: a short conv of this kernel, or a long conv",
           ylabel="test accuracy", ylim=ACCURACY_YLIM)
    legend(ax, [ACCURACY], BEST_LABEL)
    fig.suptitle("Based on AR (2 layers) by its BaseConv layer's convolution")
    return save(fig, out_dir, "based_conv.png",
                [MARKS, scale_note(rs), paper_note("based_ar_32.pdf, §5.4", paper_best(rs),
                                                   [("", columns)])])


def depth_runs(records: list) -> tuple:
    """The AR runs with the paper's convolutions and position embeddings, and their depths, if they
    cover more than one depth (App. D.2/D.3); else nothing to draw."""
    rs = [r for r in records if r["task"] == "ar" and not conv_variant(r) + pe_variant(r)]
    layers = sorted({r["n_layer"] for r in rs})
    return (rs, layers) if len(layers) > 1 else ([], [])


def depth_panel(ax, rs: list, layers: list, paper) -> tuple:
    """Accuracy by architecture (columns) and depth (a slot per number of layers), each seed at its
    best learning rate; paper(arch, n): the paper's accuracies by width, or None. Returns the
    panel's (columns, series)."""
    series = [Series(layers_label(n), LAYER_COLORS[i % 3], "o", lambda r: r["accuracy"],
                     keep=lambda r, n=n: r["n_layer"] == n) for i, n in enumerate(layers)]
    columns = [Column(a, best_runs(of_arch(rs, a)),
                      tuple(paper_accuracy(paper(a, n), rs)[0] for n in layers))
               for a in archs_of(rs)]
    strip_panel(ax, columns, series)
    ax.set(xlabel=f"architecture (slots: {', '.join(map(str, layers))} "
                  f"layer{'s' * (list(layers) != [1])})",
           ylabel="test accuracy", ylim=ACCURACY_YLIM)
    return columns, series


def dashed(ax, y: float, label: str) -> Line2D:
    """A reference line across a panel (a baseline), and its key for the legend."""
    ax.axhline(y, color="grey", ls="--", lw=1, zorder=0)
    return Line2D([], [], color="grey", ls="--", lw=1, label=label)


def not_run_note(columns: list, series: list, sweep: str) -> list:
    """The caption's word on the empty slots of a depth figure: the 1-layer Based, never run, and
    any other (a sweep still running)."""
    gaps = [f"{c.label}, {s.label}" for c in columns for s in series
            if not any(map(s.keep, c.runs))]
    never = f"based, {layers_label(1)}"
    return ([f"\"not run\" ({never}): the sweep {sweep} runs no 1-layer Based, whose one layer "
             "would be its BaseConv layer (the 1-layer BaseConv)."] if never in gaps else []) + (
        [f"\"not run\" ({'; '.join(g for g in gaps if g != never)}): not among the runs collected "
         f"(yet: see the report for the sweep {sweep}'s progress)."] if set(gaps) - {never} else [])


def depth_figure(rs: list, paper, out_dir: str, name: str, title: str, source: str, sweep: str,
                 line=None, zoom: bool = False) -> list:
    """A figure of accuracy by architecture and depth (depth_panel), beside the paper's; line:
    (y, its label, its caption) of a dashed reference line, if any; zoom: the axis from just below
    the lowest number drawn (a run, the paper's, the line) to 1, so that the report's gaps of a
    few hundredths can be read."""
    layers = sorted({r["n_layer"] for r in rs})
    fig, ax = plt.subplots(figsize=(11, 4.6 if zoom else 3.6))
    columns, series = depth_panel(ax, rs, layers, paper)
    legend(ax, series, BEST_LABEL, [dashed(ax, *line[:2])] if line else ())
    notes = []
    if zoom:
        ys = ([s.value(r) for c in columns for s in series for r in c.runs if s.keep(r)]
              + [y for c in columns for y in c.paper if y is not None]
              + ([line[0]] if line else []))
        low = np.floor((min(ys) - 0.02) * 20) / 20  # a multiple of 0.05 below every number
        ax.set_ylim(low, 1.0)
        ax.yaxis.set_major_locator(plt.MultipleLocator(0.05))
        ax.grid(axis="y", color="0.9", lw=0.6)
        notes = [f"The accuracy axis runs from {low:.2f} to 1 (ticks every 0.05), not from 0, so "
                 "that gaps of 0.01–0.05 between ours and the paper's can be read."]
    fig.suptitle(title)
    return save(fig, out_dir, name, [MARKS, scale_note(rs),
                                     paper_note(source, paper_best(rs), [("", columns)])]
                + not_run_note(columns, series, sweep) + ([line[2]] if line else []) + notes)


def ar_layers(records: list, out_dir: str) -> list:
    """App. D.2 (ar_32_layers_with_3): AR accuracy by architecture and number of layers."""
    rs, _ = depth_runs(records)
    if not rs:
        return []
    return depth_figure(
        rs, lambda a, n: PAPER["ar_accuracy"].get(a) if n == 2 else PAPER["ar_layers"].get((a, n)),
        out_dir, "ar_layers.png",
        "Associative Recall by depth: test accuracy with 1, 2 and 3 layers",
        "ar_32_layers_with_3.pdf, App. D.2; 2 layers: ar_32.pdf", "ar-layers")


def ar_layers_attrib(records: list, out_dir: str) -> list:
    """App. D.3 (ar_32_layers_attrib): per layer, Attrib@Query of its mixer output: the layer that
    fetches the answer to the Query scores 1, the layers before and after it 0."""
    rs, layers = depth_runs(records)
    if not any(r.get("query_by_layer") and reacts(r) for r in rs):
        return []
    fig, axes = stacked_panels(len(layers), width=12)
    panels = []  # (columns, series) of each
    for ax, n in zip(axes, layers):
        series = [Series(f"layer {l}", LAYER_COLORS[l % 3], "o",
                         lambda r, l=l: r["query_by_layer"][l]) for l in range(n)]
        at_depth = [r for r in rs if r["n_layer"] == n]
        columns = [mechanism_column(a, of_arch(at_depth, a),
                                    PAPER["ar_layers_attrib"].get((n, a), ()))
                   for a in archs_of(rs)]
        strip_panel(ax, columns, series)
        ax.set_title(f"{layers_label(n)} (slots: layer {', '.join(map(str, range(n)))})",
                     fontsize=9)
        panels.append((columns, series))
    attrib_axes(axes, panels, "Attrib@Query")
    legend(axes[-1], panels[-1][1], MEDIAN_LABEL)
    axes[-1].set(xlabel="architecture")
    fig.suptitle("AR by depth: which layer's mixer brings the answer to the Query\n"
                 "(Attrib@Query of each layer's mixer output, Key corrupted)")
    return save(fig, out_dir, "ar_layers_attrib.png", [
        MARKS, filter_note(rs), scale_note(rs),
        paper_note("ar_32_layers_attrib.pdf, App. D.3", MEDIANS_NOTE,
                   [(layers_label(n), cs) for n, (cs, _) in zip(layers, panels)], True)])


ATR_MODELS = "model (2 layers; attention: with a position embedding, NoPE: without one)"


def setting_title(s: str) -> str:
    grammar = mech.ATR_SETTINGS[s]
    return (f"ATR {s}: rules of up to {grammar['max_rhs_len']} symbols, "
            f"{grammar['n_terminals']} terminals")


def atr_accuracy(records: list, out_dir: str) -> list:
    """§5.2 (atr): ATR accuracy by model, one panel per setting, beside the paper's and the
    copy-next-token baseline."""
    rs, settings, models = main_atr(records)
    if not settings:
        return []
    fig, axes = stacked_panels(len(settings))
    panels = []  # (setting, its columns)
    for ax, s in zip(axes, settings):
        runs = {m: [r for r in rs if r["atr"] == s and atr_model(r) == m] for m in models}
        panel = [Column(m, best_runs(runs[m]), paper_accuracy(PAPER["atr_accuracy"].get((s, m)),
                                                              runs[m])) for m in models]
        strip_panel(ax, panel, [ACCURACY])
        baseline = dashed(ax, copy_next_token(s), COPY_NEXT_TOKEN)
        ax.set(ylabel="test accuracy", ylim=ACCURACY_YLIM)
        ax.set_title(setting_title(s), fontsize=9)
        panels.append((s, panel))
    axes[-1].set(xlabel=ATR_MODELS)
    legend(axes[0], [ACCURACY], BEST_LABEL, [baseline])
    fig.suptitle("Associative Treecall (ATR): test accuracy of each model, per setting")
    return save(fig, out_dir, "atr_accuracy.png", [
        MARKS, scale_note(rs),
        paper_note("atr.pdf, §5.2; Attention NoPE: pos_embed.pdf, App. D.1", paper_best(rs),
                   panels), copy_next_token_note(settings)])


COPY_NEXT_TOKEN = "copy-next-token baseline"


def copy_next_token_note(settings: list) -> str:
    baselines = ", ".join(f"{s} {copy_next_token(s):.2f}" for s in settings)
    return (f"Dashed: the copy-next-token baseline ({baselines}): answering with the token after "
            "the Query's one earlier occurrence (the Key), on the test documents of "
            "seeds 42-44; a model must beat it to have learned anything of the tree.")


def atr_mechanism(records: list, out_dir: str) -> list:
    """§5.2 (atr_box): the main Attribs of the ATR runs whose answer reacts to the corruption,
    one panel per setting."""
    rs, settings, models = main_atr(records)
    if not any(map(reacts, rs)):
        return []
    series = position_series("attrib")
    fig, axes = stacked_panels(len(settings), width=12)
    panels = []  # (setting, its columns)
    for ax, s in zip(axes, settings):
        panel = [mechanism_column(m, [r for r in rs if r["atr"] == s and atr_model(r) == m],
                                  by_position(PAPER["atr_mechanism"].get((s, m))))
                 for m in models]
        strip_panel(ax, panel, series)
        ax.set_title(setting_title(s), fontsize=9)
        panels.append((s, panel))
    attrib_axes(axes, [(panel, series) for _, panel in panels], "Attrib (last layer's input)")
    axes[-1].set(xlabel=ATR_MODELS)
    legend(axes[0], series, MEDIAN_LABEL)
    fig.suptitle("ATR mechanism: the share of the answer's probability that patching one "
                 "position of the\nlast layer's input restores (Key corrupted): @Value = "
                 "induction, @Query or @Key = direct retrieval")
    return save(fig, out_dir, "atr_mechanism.png", [
        MARKS, filter_note(rs), scale_note(rs),
        paper_note("atr_box.pdf, §5.2", MEDIANS_NOTE, panels, True)])


# ── the paper's other findings: position embeddings, depth, generalisation, the sibling task ──

PE_SETTINGS = ("ar", "easy", "medium")  # the panels of pos_embed.pdf (App. D.1)
PE_SERIES = [Series("with a position embedding (PE)", "C0", "o", lambda r: r["accuracy"],
                    keep=lambda r: r["pos_emb"]),
             Series("without one (NoPE)", "C1", "s", lambda r: r["accuracy"],
                    keep=lambda r: not r["pos_emb"])]


def pe_setting(r: dict) -> str:
    return r["atr"] if r["task"] == "atr" else r["task"]


def pe_settings(rs: list) -> list:
    """The settings with runs of the pos-embed sweep: an architecture's other PE choice. ATR
    Attention NoPE alone (the sweep atr-attention-nope) is not enough: atr_accuracy draws it."""
    return [s for s in PE_SETTINGS
            if any(pe_setting(r) == s and pe_variant(r)
                   and (r["task"] == "ar" or r["arch"] != "attention") for r in rs)]


def pos_embed(records: list, out_dir: str) -> list:
    """App. D.1 (pos_embed): accuracy with and without the position embedding, per architecture,
    one panel per setting (AR, ATR easy, ATR medium)."""
    rs = [r for r in records if r["n_layer"] == 2 and not conv_variant(r) and main_question(r)
          and pe_setting(r) in PE_SETTINGS]
    settings = pe_settings(rs)
    if not settings:
        return []
    fig, axes = stacked_panels(len(settings))
    panels, drawn = [], []  # (setting, its columns); the runs of the panels
    archs = archs_of([r for r in rs if pe_setting(r) in settings])  # the panels share columns
    for ax, s in zip(axes, settings):
        runs = [r for r in rs if pe_setting(r) == s]
        columns = [Column(a, best_runs(of_arch(runs, a)),
                          tuple(paper_accuracy(PAPER["pos_embed"].get((s, a, pe)), runs)[0]
                                for pe in ("PE", "NoPE"))) for a in archs]
        strip_panel(ax, columns, PE_SERIES)
        ax.set(ylabel="test accuracy", ylim=ACCURACY_YLIM)
        ax.set_title("AR" if s == "ar" else setting_title(s), fontsize=9)
        panels.append(("AR" if s == "ar" else f"ATR {s}", columns))
        drawn += runs
    axes[-1].set(xlabel="architecture (2 layers; slots: PE, NoPE)")
    legend(axes[0], PE_SERIES, BEST_LABEL)
    fig.suptitle("Position embeddings: test accuracy with (PE) and without (NoPE) one; the main "
                 "results\ngive Attention a position embedding and the others none")
    return save(fig, out_dir, "pos_embed.png", [
        MARKS, scale_note(drawn),
        paper_note("pos_embed.pdf, App. D.1", f"its one seed at d = "
                   f"{span(r['d_model'] for r in drawn)}, the best of its {len(LR5)} learning "
                   "rates", panels)])


def atr_layers(records: list, out_dir: str) -> list:
    """App. D.2 (atr_layers): ATR easy accuracy by architecture with 1 and 2 layers."""
    rs = [r for r in records if r["task"] == "atr" and r["atr"] == "easy" and r["n_layer"] in (1, 2)
          and main_variant(r) and not conv_variant(r)]
    if not any(r["n_layer"] == 1 for r in rs):
        return []
    return depth_figure(
        rs, lambda a, n: PAPER["atr_layers"].get(a) if n == 1
        else PAPER["atr_accuracy"].get(("easy", a)),
        out_dir, "atr_layers.png", f"{setting_title('easy')}: test accuracy with 1 and 2 layers",
        "atr_layers.pdf, App. D.2; 2 layers: atr.pdf, §5.2", "atr-layers",
        (copy_next_token("easy"), COPY_NEXT_TOKEN, copy_next_token_note(["easy"])),
        zoom=True)


def atr_sibling(records: list, out_dir: str) -> list:
    """App. D.4 (multihop): the sibling task's accuracy by architecture with 1, 2 and 3 layers."""
    rs = [r for r in records if r["task"] == "atr" and atr_query(r) == "sibling"
          and not r.get("held_out") and not conv_variant(r) + pe_variant(r)]
    if not rs:
        return []
    copy = PAPER["atr_sibling_copy_query"]
    return depth_figure(
        rs, lambda a, n: PAPER["atr_sibling"].get((a, n)), out_dir, "atr_sibling.png",
        "ATR's sibling task: the Query's rightmost sibling asked (ATR easy), by depth",
        "multihop.pdf, App. D.4", "atr-sibling",
        (copy, "copying the Query", f"Dashed: {copy}, what answering with the Query itself "
         f"scores in the paper: its Query is its own rightmost sibling in {copy:.1%} of "
         "documents."), zoom=True)


# where the main setting reads a model of 1, 2 and 3 (or more) layers in atr_gen's panels
READ_AT = {1: "Attrib (its mixer's output)", 2: "Attrib (last layer's input)",
           3: "Attrib (2nd layer's input)"}
GEN_SERIES = [Series("dev: the training's label pairs", "C0", "o", lambda r: r["dev_accuracy"]),
              Series("test: held-out label pairs", "C3", "D", lambda r: r["accuracy"])]


def gen_paper(arch: str, n: int, runs: list) -> tuple:
    """The paper's (dev, test) accuracy at the width of the runs: atr_gen.pdf has 2 layers only."""
    table = PAPER["atr_gen"].get(arch) if n == 2 else None
    return tuple(paper_accuracy(table[k] if table else None, runs)[0] for k in ("dev", "test"))


def atr_gen(records: list, out_dir: str) -> list:
    """§5.3 (atr_gen, atr_gen_box): ATR easy with label pairs held out of training, per depth:
    dev vs test accuracy (top) and the main Attribs on the dev and on the test documents (below),
    each seed at the learning rate of its best dev accuracy among those it ran."""
    rs = [r for r in records if r["task"] == "atr" and r.get("held_out")
          and atr_query(r) == "parent" and not conv_variant(r) + pe_variant(r)]
    if not rs:
        return []
    layers = sorted({r["n_layer"] for r in rs})
    fig, axes = plt.subplots(3, len(layers), figsize=(5 * len(layers) + 2.5, 10.2),
                             squeeze=False, sharey="row")
    series, accuracy, attribs, boxes, best = position_series("attrib"), [], [], [], []
    on_dev = lambda runs: [r | r["dev"] for r in runs if "dev" in r]  # the dev reading, same keys
    readings = (("dev", on_dev), ("test", lambda runs: runs))
    # past 2 layers the second layer's input: at the last one's, the induction models have already
    # moved the answer to the Query, which would hide their induction
    second = lambda runs, n: runs if n < 3 else [r | {"attrib": r["attrib_second"]} for r in runs]
    for top, middle, bottom, n in zip(*axes, layers):
        runs = best_runs([r for r in rs if r["n_layer"] == n])  # by dev accuracy (best_over_lr)
        archs = archs_of(runs)
        accuracy.append((layers_label(n), [Column(a, of_arch(runs, a), gen_paper(a, n, runs))
                                           for a in archs]))
        strip_panel(top, accuracy[-1][1], GEN_SERIES)
        top.set_title(f"{layers_label(n)}: accuracy", fontsize=9)
        for ax, (docs, read) in zip((middle, bottom), readings):
            paper = lambda a: PAPER["atr_gen_mechanism"].get((docs, a)) if n == 2 else None
            attribs.append([mechanism_column(a, second(read(of_arch(runs, a)), n),
                                             by_position(paper(a))) for a in archs])
            strip_panel(ax, attribs[-1], series)
            ax.set_title(f"{layers_label(n)}: mechanism on {docs} documents"
                         + (" (2nd layer's input)" if n > 2 else ""), fontsize=9)
            if n == 2:  # the paper's only held-out depth
                boxes.append((docs, attribs[-1]))
        bottom.set(xlabel="architecture")
        best += runs
    axes[0][0].set(ylabel="accuracy", ylim=ACCURACY_YLIM)
    attrib_axes(list(axes[1]) + list(axes[2]), [(cs, series) for cs in attribs],
                "Attrib (last layer's input)")
    for middle, bottom, n in zip(axes[1], axes[2], layers):  # each column names the input it reads
        for ax in (middle, bottom):
            ax.set_ylabel(READ_AT[min(n, 3)])
    legend(axes[0][-1], GEN_SERIES, "paper (one seed, the rate\nof its best dev accuracy)")
    legend(axes[2][-1], series, "paper (2 layers: the median\nof all its runs, unfiltered)")
    fig.suptitle(f"ATR generalisation: {rs[0]['held_out']:.0%} of the (parent, query) label "
                 "pairs held out of training\nand asked only by the test documents (ATR easy)")
    return save(fig, out_dir, "atr_gen.png", [
        MARKS, "The learning rate is chosen on dev accuracy (documents asking the training's "
        "label pairs), as the paper chooses it, among the rates a seed ran (which: below). Test: "
        "documents asking held-out pairs.",
        scale_note(rs), filter_note(best, readings),
        paper_note("atr_gen.pdf, §5.3", f"its one seed at d = {span(r['d_model'] for r in rs)}, "
                   "2 layers, at the learning rate of its best dev accuracy", accuracy),
        "Attribs (middle, bottom): the main setting (Key corrupted) on the dev and on the test "
        "documents, each row filtered on its own documents' effect; past 2 layers at the second "
        "layer's input (where a 2-layer model's last layer reads), since by the last layer's the "
        "induction models have moved the answer to the Query.",
        paper_note("atr_gen_box.pdf, §5.3", "the median over all its 2-layer runs (all its "
                   "widths and learning rates), unfiltered; it trains no other depth held out",
                   boxes)])


# ── C3 for Hyena at the widths where the paper's Hyena learns AR (both protocols) ─────────────

def hyena_widths(groups: list, out_dir: str) -> list:
    """C3 for Hyena on AR (collect.hyena_groups: [(d, protocol, runs)], the CPU preset and the
    paper's protocol): accuracy per width beside the paper's ar_32 at that width, and the Attribs
    (Key, Value, Query at the last layer's input) of each width and protocol."""
    runs = [r for _, _, rs in groups for r in rs]
    if not runs:
        return []
    paper = lambda r: r.get("preset") == "paper"
    best = {}  # width -> the paper protocol's most accurate rate there (its rule: the best rate)
    for d in sorted({r["d_model"] for r in runs if paper(r)}):
        rates = {r["lr"] for r in runs if paper(r) and r["d_model"] == d}
        best[d] = max(rates, key=lambda lr: statistics.mean(
            r["accuracy"] for r in runs if paper(r) and (r["d_model"], r["lr"]) == (d, lr)))
    at_best = lambda r: paper(r) and r["lr"] == best[r["d_model"]]
    rates = ", ".join(f"{lr:g} at d = {' and '.join(str(d) for d in best if best[d] == lr)}"
                      for lr in sorted(set(best.values())))
    others = sorted({(r["d_model"], r["lr"]) for r in runs if paper(r) and not at_best(r)})
    series = [Series("CPU preset (lr 1e-3, 15,000 steps)", "C0", "o", lambda r: r["accuracy"],
                     keep=lambda r: not paper(r)),
              Series(f"paper's protocol, its best rate here ({rates})", "C1", "s",
                     lambda r: r["accuracy"], keep=at_best),
              Series("paper's protocol, the other rates ("
                     + ", ".join(f"{lr:g}" for _, lr in others) + ")", "C7", "D",
                     lambda r: r["accuracy"], keep=lambda r: paper(r) and not at_best(r))]
    widths = sorted({d for d, _, _ in groups})
    columns = []
    for d in widths:
        rs = [r for r in runs if r["d_model"] == d]
        x = PAPER["ar_accuracy"]["hyena"][WIDTHS.index(d)]
        first = next(i for i, s in enumerate(series) if any(map(s.keep, rs)))
        columns.append(Column(f"d = {d}", rs, (None,) * first + (x,)))  # once, its first slot
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.8), height_ratios=(1, 1.1))
    strip_panel(ax, columns, series)
    top = max([s.value(r) for c in columns for s in series for r in c.runs if s.keep(r)]
              + [v for c in columns for v in c.paper if v is not None])
    ax.set(ylabel="test accuracy", ylim=(-0.01, round(top + 0.06, 1)),
           xlabel="width d (2 layers, AR)")
    legend(ax, series, BEST_LABEL + " at that width")
    short = lambda protocol: ("CPU" if protocol.startswith("CPU") else
                              "paper's,\nlr " + protocol.rsplit(" ", 1)[1])
    attribs = [mechanism_column(f"d = {d}\n{short(protocol)}", rs,
                                by_position(PAPER["ar_mechanism"]["hyena"]))
               for d, protocol, rs in groups]
    positions = position_series("attrib")
    strip_panel(bx, attribs, positions)
    attrib_axes([bx], [(attribs, positions)], "Attrib (last layer's input)")
    bx.set(xlabel="width and protocol (CPU: the CPU preset, lr 1e-3; paper's: the paper's "
           "protocol at that learning rate)")
    legend(bx, positions, MEDIAN_LABEL)
    fig.suptitle("C3 for Hyena on AR at the widths where the paper's Hyena learns it: accuracy "
                 "and where the answer is computed (Key corrupted)")
    line = {r["task"] for r in runs} == {"ar"} and 0.5
    return save(fig, out_dir, "hyena_widths.png", [
        MARKS,
        f"Accuracy axis from -0.01 to {round(top + 0.06, 1)}: every run and every paper number "
        f"here lies below AR's line between learning and not ({line}); the paper's x (one per "
        "width, beside our first runs there) is its one seed at that width, the best of its "
        "learning rates (ar_32.pdf, §5.1).",
        "Ours: the CPU preset (mech.py --preset cpu, 15,000 steps, lr 1e-3), "
        + runs_by_width([r for r in runs if not paper(r)])
        + "; the paper's protocol (mech.py --preset paper, 50,016 steps, 10 % warmup then "
        "cosine), " + runs_by_width([r for r in runs if paper(r)]) + "; no paper-protocol run "
        f"at d = {', '.join(str(d) for d in widths if d not in best)}.",
        filter_note(runs) + " Attrib x: the paper's Hyena, " + MEDIANS_NOTE
        + ", drawn at every column."])


def runs_by_width(runs: list) -> str:
    """"d = 128: lr 0.001, 0.003, seed 42; d = 256: ...": the rates and seeds run at each width."""
    words = []
    for d in sorted({r["d_model"] for r in runs}):
        at_d = [r for r in runs if r["d_model"] == d]
        seeds = {r["seed"] for r in at_d}
        words.append(f"d = {d}: lr {', '.join(f'{lr:g}' for lr in sorted({r['lr'] for r in at_d}))}"
                     f", seed{'s' * (len(seeds) > 1)} {span(seeds)}")
    return "; ".join(words)


# ── the mechanism while it forms (curves of the runs watched while they trained) ─────────────────

def mechanism_dynamics(records: list, out_dir: str) -> list:
    """Beyond the paper (it analyses trained models only): accuracy and the final position's Attrib
    (final_position) along training, one panel per model, every seed, with the moments marked."""
    panels = watched_runs(records)
    if not panels:
        return []
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.7 * len(panels)), squeeze=False)
    dashes = ("-", "--", "-.", ":")
    for ax, (title, rs) in zip(axes[:, 0], panels):
        for i, r in enumerate(rs):
            points, ls, gate = r["dynamics"], dashes[i % len(dashes)], MIN_EFFECT[r["task"]]
            steps, accuracy = [p["step"] for p in points], [p["accuracy"] for p in points]
            ax.plot(steps, accuracy, color="k", ls=ls, lw=1.2)
            for name, color in zip(followed(r), ("C3", "C4")):
                ys = [plots.watched(p, name) if p["attrib"]["effect"] >= gate else np.nan
                      for p in points]
                ax.plot(steps, ys, color=color, ls=ls, lw=1.5)
            if (rises := moments_of(r, None)["accuracy"]) is not None:
                half = (accuracy[0] + accuracy[-1]) / 2
                ax.plot(rises, half, marker="o", color="k", ms=6, mfc="none")
        for step, marks in formation_marks(rs).items():
            for k, (r, _, color) in enumerate(marks):  # those of one step stacked, from 0.5 up
                ax.plot(step, 0.5 + STACKED * k, marker="^", color=color, ms=7, mfc="none")
                if len(marks) > 1:
                    ax.annotate(str(r["seed"]), (step, 0.5 + STACKED * k), xytext=(5, -3),
                                textcoords="offset points", fontsize=6, color=color,
                                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0))
        ax.set(title=title, ylabel="accuracy / Attrib", ylim=(-0.3, 1.6))
        ax.axhline(0.5, color="grey", lw=0.5, ls=":")
    axes[-1, 0].set(xlabel="training step")
    seeds = [Line2D([], [], color="grey", ls=dashes[i], label=f"seed {s}") for i, s in
             enumerate(sorted({r["seed"] for _, rs in panels for r in rs}))]
    kinds = [Line2D([], [], color="k", label="test accuracy"),
             Line2D([], [], color="C3", label="Attrib at the run's final position\n"
                    "(its largest at the end; last layer's input)"),
             Line2D([], [], color="C4", label="Mamba: Attrib of layer 0's conv output @Value+1"),
             Line2D([], [], ls="none", marker="^", color="k", mfc="none",
                    label="an Attrib reaches 0.5: the mechanism has formed"),
             Line2D([], [], ls="none", marker="o", color="k", mfc="none",
                    label="accuracy reaches halfway from its first to its final value")]
    axes[0, 0].legend(handles=kinds + seeds, loc="upper left", bbox_to_anchor=(1.01, 1),
                      fontsize=8, frameon=False)
    fig.suptitle("The mechanism while it forms: accuracy and Attrib (Key corrupted) at every "
                 "evaluation, on 128 test documents")
    runs = [r for _, rs in panels for r in rs]
    return save(fig, out_dir, "mechanism_dynamics.png", [
        "Attribs are drawn where the Key matters (p_clean − p_corrupted ≥ 0.01 on AR, ≥ 0.1 on "
        "ATR, the paper's filters); before that they are noise. Each run follows the position "
        "(Key, Value or Query) with the largest Attrib in its final analysis, whether or not that "
        "one names its verdict (a run whose final Attribs are mixed is drawn too)"
        + (f": {mixed}" if (mixed := mixed_note(runs)) else "") + ". The mechanism has formed at "
        "the first evaluation where that Attrib reaches 0.5 with the Key mattering. Which comes "
        "first, in steps: runs/cpu_preset/summary.md." + coinciding_note(panels),
        scale_note(runs)])


STACKED = 0.12  # the height between formation markers that share a step


def formation_marks(rs: list) -> dict:
    """{step: [(run, what, colour)]}: a panel's formation markers (followed: the final position's,
    red, then Mamba's conv, purple) by the step each forms at; those of one step in the order they
    are stacked, the final position's below the conv's, each in seed order."""
    marks = [((k, r["seed"], r["lr"]), moments_of(r, name)["mechanism"], r,
              "conv @Value+1" if name == CONV else f"@{name.capitalize()}", color)
             for r in rs for k, (name, color) in enumerate(zip(followed(r), ("C3", "C4")))]
    steps = {}
    for _, step, r, what, color in sorted((m for m in marks if m[1] is not None),
                                          key=lambda m: m[0]):
        steps.setdefault(step, []).append((r, what, color))
    return dict(sorted(steps.items()))


def coinciding_note(panels: list) -> str:
    """The caption's words for the formation markers that share a step (drawn stacked)."""
    words = []
    for title, rs in panels:
        for step, marks in formation_marks(rs).items():
            if len(marks) > 1:
                whats = list(dict.fromkeys(what for _, what, _ in marks))
                who = "; ".join(f"{what}, seed" + "s" * (len(seeds) > 1) + " " + ", ".join(seeds)
                                for what in whats for seeds in [[str(r["seed"]) for r, w, _
                                                                 in marks if w == what]])
                words.append(f"{title.split(' (')[0]} at step {step:,} ({who})")
    return (" Formation markers that share a step are stacked upwards from 0.5 (the final "
            "position's, red, below the conv's, purple, each in seed order) and labelled with "
            "their seeds: " + "; ".join(words) + ". They form at the same evaluation, not one "
            "after the other.") if words else ""


def mixed_note(runs: list) -> str:
    """The runs drawn whose final Attribs name no verdict (mech.dominant): which, and at what."""
    return "; ".join(f"{r['task'].upper()} {r['arch']} d_conv {r['d_conv']} seed {r['seed']} ends "
                     "mixed (Key / Value / Query " + " / ".join(f"{r['attrib'][p]:.2f}" for p in
                                                             ("key", "value", "query"))
                     + f", followed at @{final_position(r).capitalize()})"
                     for r in runs if reacts(r) and mech.dominant(r["attrib"]) is None)


# ── beyond the paper: today's mixers beside the paper's seven ────────────────────────────────

def conv_series(layer: int, color: str, marker: str) -> Series:
    """Today's mixers' short conv at Value+1, in one layer (collect.conv_value1)."""
    def value(r):
        return r["conv_value1"][layer]
    return Series(f"conv_output[{layer}] @Value+1", color, marker, value,
                  keep=lambda r: value(r) is not None, empty="")


def today_mixers(cpu: list, groups: list, out_dir: str) -> list:
    """Today's mixers (collect.today_groups: Mamba-2, Gated DeltaNet, KDA, with their short conv
    and without) beside the paper's seven (the CPU preset's main runs at d = 64) on AR and ATR
    easy: accuracy, and the Attribs at Key, Query and Value with each layer's conv at Value+1."""
    if not any(arch != "mamba" for arch, *_ in groups):
        return []
    cpu = [r for r in cpu if r["d_model"] == 64]
    mechanism = position_series("attrib") + [conv_series(0, "C4", "D"), conv_series(1, "C5", "v")]
    fig, axes = plt.subplots(4, 1, figsize=(14, 11), sharex=True)
    panels = []  # (task, accuracy columns, mechanism columns)
    for task, ax, bx in zip(("ar", "atr easy"), axes[::2], axes[1::2]):
        main = [r for r in (main_ar(cpu) if task == "ar" else main_atr(cpu)[0])
                if task_label(r) == task and not pe_variant(r)]
        accuracy, attribs = [], []
        for label, runs, acc, where in today_columns(task, main, groups):
            accuracy.append(Column(label, runs, acc))
            attribs.append(mechanism_column(label, runs, where))
        strip_panel(ax, accuracy, [ACCURACY])
        strip_panel(bx, attribs, mechanism)
        ax.set(ylabel="test accuracy", ylim=ACCURACY_YLIM)
        ax.set_title(f"{'AR' if task == 'ar' else setting_title('easy')}: accuracy", fontsize=9)
        bx.set_title("mechanism: Attrib per position (Key corrupted)", fontsize=9)
        panels.append((task, accuracy, attribs))
    attrib_axes(axes[1::2], [(attribs, mechanism) for _, _, attribs in panels],
                "Attrib (last layer's input;\nconv: its output)")
    for ax in axes:
        ax.axvline(len(ARCHS) - 1.5, color="grey", lw=0.8)  # the paper's six | Mamba and today's
    legend(axes[0], [ACCURACY], BEST_LABEL)
    legend(axes[1], mechanism, MEDIAN_LABEL)
    fig.suptitle("Today's mixers beside the paper's seven: accuracy, and where the answer is "
                 "computed (right of the line: Mamba and today's mixers, with and without their "
                 "short conv)")
    runs = [r for _, accuracy, _ in panels for c in accuracy for r in c.runs]
    return save(fig, out_dir, "today_mixers.png", [
        MARKS, filter_note(runs), scale_note(runs),
        "conv_output[l] @Value+1: patching layer l's short conv output at the token after the "
        "Value, over the documents where that token is not the divider; Mamba's and Mamba-2's "
        "conv sit in Mamba's block, Gated DeltaNet's and KDA's in a Transformer block. A conv "
        "may carry the association at another position (Value+2): numbers.md's table gives each "
        "run's largest conv cell. "
        "x: the paper's numbers for its seven (ar_32.pdf, ar_32_diff, atr.pdf, atr_box.pdf; Mamba "
        "d_conv 0: mamba_ar_32.pdf); today's mixers have none."])


def today_columns(task: str, main: list, groups: list) -> list:
    """[(label, runs, the paper's accuracy, its Attribs)], the columns of today_mixers on task:
    the paper's seven but Mamba (main: their runs), then Mamba and each of today's mixers with
    its short conv and without (groups: collect.today_groups)."""
    columns = [(a, of_arch(main, a), *seven_paper(task[:3], a, of_arch(main, a)))
               for a in ARCHS if a != "mamba"]
    for arch in ("mamba",) + TODAY:
        for conv in (True, False):
            runs = next((rs for a, t, k, rs in groups if (a, t, k > 0) == (arch, task, conv)), [])
            label = arch.replace("_", "_\n") if arch in TODAY else arch
            label += "" if conv else "\nd_conv 0"
            if arch == "mamba":
                k = mech.DEFAULT_DCONV["mamba"] if conv else 0
                columns.append((label, runs, *mamba_paper(task[:3], k, runs)))
            else:  # the paper has no number for today's mixers
                columns.append((label, runs, (None,), ()))
    return columns


def seven_paper(task: str, arch: str, runs: list) -> tuple:
    """The paper's accuracy (as a column's paper tuple) and Attribs of one of its seven on AR or
    ATR easy (its main results)."""
    key = arch if task == "ar" else ("easy", arch)
    return (paper_accuracy(PAPER[f"{task}_accuracy"].get(key), runs),
            by_position(PAPER[f"{task}_mechanism"].get(key)))


# ── beyond the paper: hybrids, layer by layer ──────────────────────────────────────────────

def seed_lines(runs: list) -> str:
    """Each seed's verdict and conv cell, a line each, wrapped to a half-width panel."""
    return "\n".join(textwrap.fill(f"seed {x['seed']}: {', '.join(layer_verdict(x))}; "
                                   f"conv {layer_conv_cell(x)}", 130) for x in runs)


def hybrids(groups: list, out_dir: str) -> list:
    """The hybrids (collect.hybrid_groups; their pure models are the table's): per hybrid (a row
    per configuration, its frozen runs' too: figures/frozen.py; one row, a variant's on both
    tasks) and task (columns), a heat map of the Attrib (Key corrupted) at every layer's input but
    the embedding (block_input[1..n-1]) by position, the mean over the seeds past the filter, and
    each seed's verdict (collect.layer_verdict) and conv cell below it; nothing without a hybrid
    run."""
    panels = {}  # hybrid -> its variant (arch, d_conv) -> task -> its groups (configurations)
    for name, task, runs in groups:
        if hybrid_of(runs[0]["arch"]) == name:
            variant = (runs[0]["arch"], runs[0]["d_conv"])
            panels.setdefault(name, {}).setdefault(variant, {}).setdefault(task, []).append(runs)
    if not panels:
        return []
    rows = [[(tasks.get(task, [])[k:] or [None])[0] for task in HYBRID_TASKS]
            for variants in panels.values() for tasks in variants.values()
            for k in range(max(map(len, tasks.values())))]
    # each row as tall as its heat maps' layers and the seeds' verdict lines below them
    heights = [1.4 + max(0.55 * (runs[0]["n_layer"] - 1)
                         + 0.15 * (seed_lines(runs).count("\n") + 1) for runs in row if runs)
               for row in rows]
    fig, axes = plt.subplots(len(rows), len(HYBRID_TASKS), squeeze=False,
                             figsize=(15, sum(heights)), height_ratios=heights)
    for row, row_axes in zip(rows, axes):
        for task, runs, ax in zip(HYBRID_TASKS, row, row_axes):
            if runs is None:
                ax.set_axis_off()
                continue
            r = runs[0]
            layers = range(1, r["n_layer"])
            grid = np.array([[input_means(runs, layer, mech.POSITIONS)[p]
                              for p in mech.POSITIONS] for layer in layers])
            plots.heat_map(ax, grid, mech.POSITIONS,
                           [f"block_input[{layer}]\n(into {layer_archs(r)[layer]})"
                            for layer in layers])
            if np.isnan(grid).all():
                ax.text(0.5, 0.5, "no seed past the filter", ha="center",
                        transform=ax.transAxes, color="grey")
            ax.set_title(f"{r['arch']} on {'AR' if task == 'ar' else 'ATR easy'}: "
                         f"{data_regime(r)}, lr {r['lr']:g}, d_conv {r['d_conv']}; "
                         f"{sum(map(reacts, runs))} of {len(runs)} seeds past the filter",
                         fontsize=8)
            ax.set_xlabel(seed_lines(runs), fontsize=7)
    fig.suptitle("Beyond the paper: hybrids, where each layer leaves the answer (Attrib at every "
                 "layer's input, Key corrupted)")
    runs = [r for _, _, rs in groups for r in rs if hybrid_of(r["arch"]) in panels]
    return save(fig, out_dir, "hybrids.png", [
        "Cells: the mean over the seeds past the filter of the share of p(answer) restored by "
        "patching the clean activation at that layer's input and position (block_input[l]: "
        "layer l-1's output); block_input[0], the embedding, restores the Key alone by "
        "construction and is left out.", filter_note(runs),
        "Verdicts (collect.layer_verdict, mech.py's thresholds: Key effect >= "
        f"{mech.VERDICT_MIN_EFFECT}, a dominant position >= {mech.VERDICT_DOMINANT}): the answer "
        "reaches the Query at the first input l >= 1 where @Query is dominant, so layer l-1 "
        "forms it (none: the last layer); layer 0 retrieves it at the Query, a later layer is "
        "read at its own input (@Value: induction; @Key: it reads the Key itself; else mixed). "
        "conv: the short conv cell that restores most, [layer] @position, and that layer's "
        "arch. The pure models beside them: numbers.md's table."])


FIGURES = (ar_accuracy, ar_mechanism, mamba_dconv, mamba_conv_restored, based_conv, ar_layers,
           ar_layers_attrib, atr_accuracy, atr_mechanism, pos_embed, atr_layers, atr_gen,
           atr_sibling, mechanism_dynamics)


def plot_figures(records: list, out_dir: str, log=print) -> list:
    """Draw every figure the records allow as PNGs in out_dir; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    records = one_width(one_protocol(records, log), log)
    return [path for figure in FIGURES for path in figure(records, out_dir)]
