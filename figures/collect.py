"""Collecting finished runs: one record per run folder (collect), the summary table of
summary.md (a row per configuration, its seeds averaged) and its table of the runs watched while
they trained, which runs the paper's main results are, and the report's numbers and verdicts
recounted from the committed runs (numbers.md). figures/experiments.py is the command line
(--collect, --numbers)."""
import ast
import collections
import dataclasses
import functools
import json
import os
import re

import numpy as np

import mech
from figures import frozen, plots
from figures.paper import PAPER
from figures.sweeps import ARCHS, SWEEPS, WIDTHS, run_config, run_name, sweep_runs

# the paper's filters for its mechanism plots, on p_clean - p_corrupted: below them a run's answer
# does not react enough to the corruption for its Attribs to mean anything
MIN_EFFECT = mech.PAPER_FILTER


# ── records: one per finished run ────────────────────────────────────────────────────────────

def collect(root: str, log=print) -> list:
    """One record per finished run folder under root: its config, accuracy and main Attribs. A
    folder whose files are damaged or not a run of mech.py is skipped, in one line that names it."""
    records = []
    for folder, _, files in sorted(os.walk(root)):
        if "metrics.json" not in files and "config.json" not in files:
            continue  # not a run's folder; one of the two without the other: unfinished, or damaged
        try:
            rec = record(folder, root)
            # the tables read more of a record than record() does (an accuracy that is a number,
            # a known task, the curve's cells): one that they cannot read alone is skipped here,
            # rather than ending the whole collection later
            summary_table([rec])
            dynamics_table([rec])
            records.append(rec)
        except Exception as e:  # one generic catch: whatever in its files cannot be read
            log(f"skipped {folder}: not a finished run of this mech.py ({plots.in_one_line(e)})")
    return records


def record(folder: str, root: str) -> dict:
    """A run folder's record (KeyError, ValueError, ... if its files are not a run's)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(folder, "metrics.json")) as f:
        m = json.load(f)
    rec = dict(cfg, folder=os.path.relpath(folder, root), accuracy=m["accuracy"],
               dev_accuracy=m.get("dev_accuracy"), wall_time_s=m["wall_time_s"],
               losses=(m["curve"][-1]["train_loss"], m["test_loss"]))  # the last, train / test
    if "interventions" in m:
        rec.update(analysis(m["interventions"], cfg["n_layer"]))
    if "interventions_dev" in m:  # --held-out: the same reading on the dev documents
        rec["dev"] = analysis(m["interventions_dev"], cfg["n_layer"])
    points = [p for p in m.get("curve", []) if "attrib" in p]  # watched while it trained
    if points:
        rec["dynamics"] = points  # mech.watch_mechanism's evaluations
    return rec


NO_CELL = dict(attrib=float("nan"))  # a cell the analysis did not patch


def analysis(interventions: dict, n_layer: int) -> dict:
    """What the table and the figures read of a run's intervention rows (Key corrupted). The main
    Attribs are recomputed from the rows with mech.verdict_attribs rather than read from the stored
    "main", so that runs analysed by an older mech.py get today's reading (in a 1-layer model the
    layer's own mixer output, not the embedding, where patching the Key undoes the corruption)."""
    rows = interventions["rows"]
    key = {(r["site"], r["layer"], r["position"]): r for r in rows if r["corrupted"] == "key"}
    conv = {p: r for (site, layer, p), r in key.items() if (site, layer) == ("conv_output", 0)}
    main = {p: r for (site, layer, p), r in key.items() if (site, layer) == mech.verdict_site(n_layer)}
    return dict(attrib=mech.verdict_attribs(rows, n_layer),
                # the Key's effect over the documents each main cell averages: in the sibling task
                # the Key and Value cells average only those where the two are distinct positions,
                # so their filter must be read there, not over all documents
                effects={p: r["p_clean"] - r["p_corr"] for p, r in main.items()},
                # deeper models: the second layer's input too, where a 2-layer model's last reads
                attrib_second=mech.verdict_attribs(rows, n_layer, 1) if n_layer > 2 else None,
                # every layer's input (the hybrids: which layer brings the answer to the Query)
                inputs=[mech.verdict_attribs(rows, n_layer, l) for l in range(n_layer)],
                effect=mech.key_effect(rows),  # over all documents
                conv={p: r["attrib"] for p, r in conv.items()},
                # every layer's conv at Value+1 (today's mixers: the last layer's may carry it)
                conv_value1=[key[c]["attrib"] if c in key else None
                             for c in (("conv_output", l, "value+1") for l in range(n_layer))],
                # and the conv cell that restores most: [layer, position, Attrib] (None: no conv)
                conv_top=max(([layer, p, r["attrib"]] for (site, layer, p), r in key.items()
                              if site == "conv_output"), key=lambda c: c[2], default=None),
                # how many documents each conv cell averages; None: an older analysis, over all
                # of them, Value+1 included where it is the divider (38-48 % of ATR documents)
                conv_docs={p: r.get("n") for p, r in conv.items()},
                n_docs=interventions.get("n_docs"),
                # App. D.3 (ar_32_layers_attrib): which layer's mixer brings the answer to the Query
                query_by_layer=[key.get(("mixer_output", l, "query"), NO_CELL)["attrib"]
                                for l in range(n_layer)])


def all_documents(r: dict, position: str) -> bool:
    """Whether a run's conv cell at position averages all documents (an older analysis): then
    Value+1 / Value+2 are, in some documents, the divider or the Query themselves."""
    return r["conv_docs"].get(position) is None


def reacts(r: dict) -> bool:
    """Whether a run's answer reacts to the corruption enough for its Attribs to mean something."""
    return "attrib" in r and r["effect"] >= MIN_EFFECT[r["task"]]


def reacts_at(r: dict, position: str) -> bool:
    """reacts, over the documents that the run's main cell at position averages (all of them but
    in the sibling task's Key and Value cells); records without per-cell effects: over all."""
    effect = r.get("effects", {}).get(position, r.get("effect"))
    return "attrib" in r and effect >= MIN_EFFECT[r["task"]]


# ── the summary table: a row per configuration, its seeds averaged ───────────────────────────

# the Config fields, which a record holds (those its mech.py knew of) beside its results
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(mech.Config))


def config_of(fields: dict) -> mech.Config:
    """The mech.Config of a run's config.json fields (ValueError or TypeError: none). Fields that
    an older mech.py did not write take their defaults; it stored its default epochs beside the
    steps that won over them, which mech.py now refuses as both given."""
    fields = {k: fields[k] for k in CONFIG_FIELDS if k in fields}
    if fields.get("steps") is not None:
        fields["epochs"] = None
    return mech.Config(**fields)


def configuration(r: dict) -> dict:
    """A record's run as mech.py tells runs apart (mech.identity); a record that makes no Config
    keeps its own fields."""
    try:
        return mech.identity(config_of(r))
    except (TypeError, ValueError):
        return {k: r[k] for k in CONFIG_FIELDS if k in r}


def config_key(r: dict, ignore=("seed",)) -> tuple:
    """What runs share to be grouped together: their configuration but the fields in ignore."""
    return tuple((k, v) for k, v in configuration(r).items() if k not in ignore)


def summary_table(records: list) -> str:
    """Markdown, one row per configuration (runs that differ only in their seed): the test accuracy
    as mean ± sample standard deviation over seeds (min-max), and the main-setting Attribs averaged
    over the seeds whose answer reacts to the corruption (as in the figures), with how many seeds
    those are. Configurations that the columns do not tell apart have their other differences
    added to the model: mamba (steps 1500)."""
    groups = {}
    for r in records:
        groups.setdefault(config_key(r), []).append(r)
    by_row = {}  # the columns' values -> [(configuration, runs)]
    for key, rs in groups.items():
        r = rs[0]
        model = r["arch"] + conv_variant(r) + pe_variant(r)
        by_row.setdefault((task_label(r), model, r["n_layer"], r["d_model"], r["lr"]), []).append(
            (dict(key), rs))
    rows = sorted(((columns + (told,), rs) for columns, same in by_row.items()
                   for told, (_, rs) in zip(told_apart([c for c, _ in same]), same)),
                  key=lambda row: row[0])
    lines = ["| task | model | layers | d | lr | seeds | accuracy "
             "| Attrib Key / Value / Query (seeds) | Key effect |",
             "|---|---|---:|---:|---:|---:|---|---|---|"]
    for (task, model, n_layer, d, lr, told), rs in rows:
        lines.append(f"| {task} | {model}{told} | {n_layer} | {d} | {lr:g} | {len(rs)} "
                     f"| {accuracy_cell(rs)} | {attrib_cell(rs)} | {effect_cell(rs)} |")
    return "\n".join(lines + table_notes(records))


def table_notes(records: list) -> list:
    """The footnotes under the table: what its Attribs are, and over which documents the Value+1
    cells of results.json were averaged."""
    notes = ["", "Attrib: the main setting (mech.verdict_attribs: Key corrupted, the last layer's "
             "input; in a 1-layer model its mixer's output), averaged over the seeds whose answer "
             f"reacts to the corruption (p_clean - p_corrupted >= {MIN_EFFECT['ar']} on AR, "
             f"{MIN_EFFECT['atr']} on ATR: the paper's filters) on the documents that cell "
             "averages (in the sibling task the Key and Value cells average only the documents "
             "where the two are distinct positions), their number in brackets (one per cell "
             "where they differ). Key effect: p_clean - p_corrupted over all documents, min-max "
             "over the seeds."]
    conv = [r for r in records if r.get("conv")]
    if conv:
        old = sum(all_documents(r, "value+1") for r in conv)
        notes.append(f"Mamba's conv-output cells in results.json (conv; conv_docs: documents "
                     f"averaged): {old} of {len(conv)} runs were analysed over all documents, "
                     "Value+1 included where it is the divider (38-48 % of ATR documents, AR's "
                     f"last pair), {len(conv) - old} over the documents where it is distinct.")
    return notes


def told_apart(configs: list) -> list:
    """For configurations that would print the same row, what tells each apart: e.g.
    [" (steps 1500)", " (steps 15000)"]; for one configuration, [""]."""
    fields = dict.fromkeys(k for c in configs for k in c)
    differ = [k for k in fields if len({repr(c.get(k)) for c in configs}) > 1]
    return [f" ({', '.join(f'{k} {c.get(k)}' for k in differ)})" if differ else ""
            for c in configs]


def accuracy_cell(rs: list) -> str:
    acc = [r["accuracy"] for r in rs]
    spread = (f" ± {np.std(acc, ddof=1):.3f} ({min(acc):.3f}-{max(acc):.3f})"
              if len(acc) > 1 else "")
    return f"{np.mean(acc):.3f}{spread}"


def attrib_cell(rs: list) -> str:
    """Key / Value / Query, each the mean over the seeds that pass the filter on the documents
    that cell averages, and how many those are (one count where the three agree)."""
    act = {p: [r for r in rs if reacts_at(r, p)] for p in ("key", "value", "query")}
    if not any(act.values()):
        return "- (0)"
    means = " / ".join(f"{np.mean([r['attrib'][p] for r in runs]):.2f}" if runs else "-"
                       for p, runs in act.items())
    counts = {len(runs) for runs in act.values()}
    return means + (f" ({counts.pop()})" if len(counts) == 1
                    else f" ({' / '.join(str(len(runs)) for runs in act.values())})")


def effect_cell(rs: list) -> str:
    """The Key's effect on p(answer) over all documents: min-max over the seeds."""
    effects = [r["effect"] for r in rs if "effect" in r]
    if not effects:
        return "-"
    low, high = min(effects), max(effects)
    return f"{low:.3f}" if len(effects) == 1 else f"{low:.3f}-{high:.3f}"


def atr_query(r: dict) -> str:
    """What an ATR run asks: the parent, or (App. D.4) the rightmost sibling; records of an older
    mech.py lack the field, and asked the parent."""
    return r.get("atr_query", "parent")


def task_label(r: dict) -> str:
    """A run's task as the table names it, e.g. "atr easy", "atr easy sibling", "atr easy
    held-out 0.2": runs of the other ATR tasks are never read as the main one's."""
    if r["task"] != "atr":
        return r["task"]
    query = [atr_query(r)] if atr_query(r) != "parent" else []
    held = [f"held-out {r['held_out']:g}"] if r.get("held_out") else []
    return " ".join([r["task"], r["atr"]] + query + held)


def conv_variant(r: dict) -> str:
    """How a run's convolutions depart from the paper's main results ('' if they do not)."""
    if r["long_conv"]:
        return " long conv"
    default = mech.DEFAULT_DCONV.get(r["arch"])  # None: base_conv's runs before it had one
    return "" if r["d_conv"] in (default, None) else f" d_conv {r['d_conv']}"


def pe_variant(r: dict) -> str:
    """The same for the position embedding, which the paper's main results give Attention only."""
    if r["pos_emb"] == (r["arch"] == "attention"):
        return ""
    return " PE" if r["pos_emb"] else " NoPE"


def best_over_lr(records: list, *keys) -> dict:
    """The paper's reported accuracy: per configuration and seed, the run with the best final
    accuracy over learning rates (by dev accuracy where there is one, as the paper does for ATR
    generalisation). Returns {(keys..., d_model): [best record per seed and configuration]}."""
    best = {}
    for r in records:
        k = tuple(r[key] for key in keys) + (r["d_model"], config_key(r, ("seed", "lr")),
                                             r["seed"])
        score = r["dev_accuracy"] if r["dev_accuracy"] is not None else r["accuracy"]
        if k not in best or score > best[k][0]:
            best[k] = (score, r)
    out = {}
    for k, (_, r) in sorted(best.items(), key=lambda kv: str(kv[0])):
        out.setdefault(k[:-2], []).append(r)
    return out


# ── which runs a table or figure reads: the main results, one protocol, one width ────────────

def best_runs(runs: list) -> list:
    """The run of each seed (and configuration) at its best learning rate."""
    return [r for group in best_over_lr(runs, "arch").values() for r in group]


def main_question(r: dict) -> bool:
    """Whether a run asks the paper's main question: AR, or ATR's parent with no label pairs held
    out of training (not §5.3's generalisation, nor App. D.4's sibling task)."""
    return not r.get("held_out") and atr_query(r) == "parent"


def main_variant(r: dict) -> bool:
    """Whether a run has the paper's position-embedding choice and asks its main question: what
    the figures on convolutions hold fixed."""
    return not pe_variant(r) and main_question(r)


def main_ar(records: list) -> list:
    """The runs of the paper's main AR results: 2 layers, its convolutions and PE choice."""
    return [r for r in records if r["task"] == "ar" and r["n_layer"] == 2
            and not conv_variant(r) + pe_variant(r)]


def archs_of(runs: list) -> list:
    return [a for a in ARCHS if any(r["arch"] == a for r in runs)]


def of_arch(runs: list, arch: str) -> list:
    return [r for r in runs if r["arch"] == arch]


def atr_model(r: dict) -> str:
    """A model on ATR: a run with the other position-embedding choice (App. D.1, pos_embed, e.g.
    Attention NoPE) is a model of its own."""
    return r["arch"] + pe_variant(r)


@functools.cache
def copy_next_token(setting: str, seeds: int = 3) -> float:
    """ATR's line between learning and not: the accuracy of answering with the token after the
    Key (the Query's one earlier occurrence), over the test documents of the CPU preset's first
    seeds (42, ...) as mech.py draws them, the documents those runs are scored on."""
    hits = []
    for seed in range(42, 42 + seeds):
        cfg = mech.Config(task="atr", atr=setting, seed=seed)
        test = mech.make_task(cfg).sample(cfg.n_eval, mech.rng_for(seed, "test"), split="test")
        hits += (test.ids[range(len(test)), test.pos["key"] + 1] == test.answer).tolist()
    return float(np.mean(hits))


def main_atr(records: list) -> tuple:
    """The runs of the paper's main ATR results (2 layers, its convolutions, its main question),
    the ATR settings and the models they cover: the paper's PE choice, and Attention NoPE (which
    ATR does not need); the other architectures' PE runs are pos_embed's (App. D.1)."""
    rs = [r for r in records if r["task"] == "atr" and r["n_layer"] == 2 and not conv_variant(r)
          and main_question(r) and (not pe_variant(r) or r["arch"] == "attention")]
    settings = [s for s in mech.ATR_SETTINGS if any(r["atr"] == s for r in rs)]
    models = [a + v for a in ARCHS for v in ("", " PE", " NoPE")
              if any(atr_model(r) == a + v for r in rs)]
    return rs, settings, models


# what the figures compare runs by (their panels, columns and points); the other fields but the
# seed and the learning rate (which the figures take the best of) are the training protocol
COMPARED = ("task", "atr", "arch", "n_layer", "d_model", "d_conv", "long_conv", "pos_emb",
            "held_out", "atr_query")


def one_protocol(records: list, log=print) -> list:
    """The records the figures draw: of each model (its COMPARED fields), the runs of one training
    protocol, the one with the most runs, so that no point averages runs trained otherwise (a quick
    look with --steps 1500 beside the full sweep, say). A note names the runs left out; the summary
    table has them all."""
    protocols = {}
    for r in records:
        model = tuple(configuration(r).get(k) for k in COMPARED)
        protocols.setdefault(model, {}).setdefault(
            config_key(r, COMPARED + ("seed", "lr")), []).append(r)
    drawn = {id(r) for ps in protocols.values() for r in max(ps.values(), key=len)}
    left = [r["folder"] for r in records if id(r) not in drawn]
    if left:
        log(f"figures: {len(left)} runs left out, trained otherwise than most runs of their "
            f"model: {', '.join(left)}")
    return [r for r in records if id(r) in drawn]


def one_width(records: list, log=print) -> list:
    """The records of one width d, the one with the most runs (d = 64 among equals: the width the
    report compares with the paper), so that no column mixes widths and the paper's numbers
    beside ours are at our width. A note names the widths left out; the summary table has them."""
    counts = collections.Counter(r["d_model"] for r in records)
    if len(counts) < 2:
        return records
    d = max(counts, key=lambda w: (counts[w], w == 64))
    log(f"figures: drawn at d = {d}; the runs at d = "
        f"{', '.join(str(w) for w in sorted(counts) if w != d)} are in the summary table only")
    return [r for r in records if r["d_model"] == d]


# ── the mechanism while it forms: the runs watched while they trained ────────────────────────

# the models whose dynamics the report shows: (title, what their records match)
DYNAMICS = (("AR: attention (induction)", dict(task="ar", arch="attention", d_conv=None)),
            ("AR: Based (induction)", dict(task="ar", arch="based", d_conv=3)),
            ("AR: Mamba, d_conv 4 (retrieval at the Query, via its conv)",
             dict(task="ar", arch="mamba", d_conv=4)),
            ("ATR easy: Mamba without its conv, d_conv 0 (induction)",
             dict(task="atr", atr="easy", arch="mamba", d_conv=0)))
CONV = "conv_output[0]@value+1"  # Mamba's conv at the token after the Value (arXiv 2505.15105v3)


def watched_runs(records: list) -> list:
    """[(title, runs)] of the DYNAMICS models that have runs watched while training."""
    panels = [(title, [r for r in records if "dynamics" in r and r["n_layer"] == 2
                       and main_variant(r) and not r["long_conv"]
                       and all(r.get(k) == v for k, v in match.items())])
              for title, match in DYNAMICS]
    return [(title, sorted(rs, key=lambda r: (r["seed"], r["lr"]))) for title, rs in panels if rs]


def final_position(r: dict) -> str | None:
    """The position whose Attrib the formation moment follows: of Key, Value and Query, the one
    with the largest final Attrib (the main setting, all documents), for a run whose answer
    reacts to the Key at the end; None for one that does not. It is the verdict's position where
    the verdict names one (mech.dominant), and a rule a reader can recount where it is mixed."""
    if not reacts(r):
        return None
    a = {p: r["attrib"][p] for p in ("key", "value", "query") if not np.isnan(r["attrib"][p])}
    return max(a, key=a.get) if a else None


def followed(r: dict) -> list:
    """The Attribs a run's dynamics follow: its final position (final_position), and for Mamba
    with a conv, the conv's output at Value+1."""
    name = final_position(r)
    conv = CONV in r["dynamics"][0]["attrib"]["cells"]
    return ([name] if name else []) + ([CONV] if conv else [])


def moments_of(r: dict, name: str | None) -> dict:
    """plots.moments of a record's dynamics, for the Attrib `name` (None: the accuracy's only)."""
    return plots.moments(r["dynamics"], name, MIN_EFFECT[r["task"]])


def dynamics_table(records: list) -> str:
    """Markdown: per watched run and Attrib (followed: the position with the largest final Attrib,
    and Mamba's conv at Value+1), the step it first reaches 0.5 with the Key's effect past the
    filter, and the step accuracy reaches halfway from its first evaluation to its final value
    (plots.moments), and which comes first."""
    lines = ["| model | seed | lr | Attrib | reaches 0.5 at | accuracy reaches halfway at | "
             "first |", "|---|---:|---:|---|---:|---:|---|"]
    for title, rs in watched_runs(records):
        for r in rs:
            run = f"| {title.split(' (')[0]} | {r['seed']} | {r['lr']:g} |"
            if not followed(r):  # its final analysis names no position: nothing to follow
                lines.append(f"{run} none (the Key's final effect is below the filter) "
                             "| - | - | - |")
            for name in followed(r):
                m = moments_of(r, name)
                first = ("-" if None in m.values() else "together"
                         if m["mechanism"] == m["accuracy"] else
                         f"mechanism, by {m['accuracy'] - m['mechanism']:,} steps"
                         if m["mechanism"] < m["accuracy"]
                         else f"accuracy, by {m['mechanism'] - m['accuracy']:,} steps")
                lines.append(f"{run} {name} | {m['mechanism'] or 'never'} | "
                             f"{m['accuracy'] or 'never'} | {first} |")
    return "\n".join(lines) if len(lines) > 2 else ""


# ── the report's numbers, recounted from the committed runs (numbers.md) ─────────────────────
# figures/README.md and README.md quote them; tests/test_report_numbers.py checks both ways

# The verdict rule of the report, stated once (RULE, printed at the head of numbers.md and quoted
# by figures/README.md), applied by accuracy_direction, label and mechanism_item below.
ACC_SIZE = 0.05
ATTRIB_SIZE = 0.1
POSITIONS3 = ("key", "value", "query")
MAIN_SWEEPS = ("ar-main", "ar-dconv", "ar-based-conv", "ar-layers", "atr-main", "atr-mamba-dconv",
               "atr-attention-nope")
OTHER_SWEEPS = ("pos-embed", "atr-layers", "atr-gen", "atr-sibling")


RULE = ("A verdict compares our mean over seeds with the paper's number. Size: an accuracy (or a "
        f"PE - NoPE gap) within {ACC_SIZE} of the paper's at the same width, each Attrib within "
        f"{ATTRIB_SIZE} of the paper's median (pooled over all its widths and learning rates). "
        "Direction: an accuracy on the paper's side of the task's line between learning and not "
        "(AR 0.5, ATR the copy-next-token baseline, the sibling task copying the Query; held "
        "out: test at least 0.2 below dev, as in the paper), and where the paper's accuracy lies "
        "on the failing side of that line, also at least half the paper's value or within "
        f"{ACC_SIZE} of it (so a run that learned nothing fails where the paper's learned a "
        "little); a PE - NoPE gap (App. D.1 compares gaps, not accuracies) of the paper's sign "
        f"(where the paper's is 0, within {ACC_SIZE} of 0); a mechanism of the paper's class "
        "(induction: the Value's Attrib the largest of Key, Value and Query; retrieval: the "
        "Key's or the Query's); C5's share of the conv: conv_output[0] @Value+1 >= 0.9 in every "
        "run. Labels: reproduced (direction and size), direction only (direction, not size), "
        "not reproduced (not direction); a group of items (a claim's models, a preset's seeds) "
        "is partly where its items' labels differ. Two presets agree on a claim where every "
        "seed of both gets the same per-run verdict (mech.py's words) and, for Mamba's conv, "
        "the same C5 label; else they differ.")


def label(direction: bool, size: bool) -> str:
    return "reproduced" if direction and size else "direction only" if direction \
        else "not reproduced"


def group_label(labels) -> str:
    """A group's label: its items' one label, or partly where they differ."""
    labels = set(labels)
    return labels.pop() if len(labels) == 1 else "partly"


def accuracy_direction(ours: float, paper: float, line: float) -> bool:
    """On the paper's side of the task's line; where the paper's accuracy is on the failing side,
    also at least half the paper's value or within ACC_SIZE of it (RULE)."""
    if (ours > line) != (paper > line):
        return False
    return paper > line or ours >= min(paper / 2, paper - ACC_SIZE)


def gap_direction(ours: float, paper: float) -> bool:
    """A PE - NoPE gap of the paper's sign (where the paper's rounds to 0: within ACC_SIZE of 0)."""
    if round(paper, 3) == 0:
        return abs(ours) <= ACC_SIZE
    return ours * paper > 0


def mean_sd(values) -> str:
    """mean ± sample sd, or the one value of a single seed (it has no sd)."""
    values = list(values)
    if len(values) == 1:
        return f"{values[0]:.3f} (1 seed)"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def passing_means(runs: list, positions=POSITIONS3) -> dict:
    """Key / Value / Query (or positions) means over the runs past the filter at each cell
    (attrib_cell's)."""
    means = {}
    for p in positions:
        act = [r["attrib"][p] for r in runs if reacts_at(r, p)]
        means[p] = float(np.mean(act)) if act else float("nan")
    return means


def attribs_text(means: dict) -> str:
    return " / ".join(cell(means[p]) for p in POSITIONS3)  # "-": no seed past the filter


def mechanism_class(a: dict) -> str:
    return "induction" if max(POSITIONS3, key=lambda p: a.get(p, -9)) == "value" else "retrieval"


def accuracy_item(name: str, runs: list, paper: float, line: float) -> tuple:
    ours = np.mean([r["accuracy"] for r in runs])
    return (name, mean_sd(r["accuracy"] for r in runs), f"{paper:.3f}",
            label(accuracy_direction(ours, paper, line), abs(ours - paper) <= ACC_SIZE))


def mechanism_item(name: str, runs: list, paper: dict) -> tuple:
    ours = passing_means(runs)
    if np.isnan(list(ours.values())).any():  # a position with no seed past the filter: no verdict
        return name, attribs_text(ours), attribs_text(paper), "-"
    size = all(abs(ours[p] - paper[p]) <= ATTRIB_SIZE for p in POSITIONS3)
    return (name, attribs_text(ours), attribs_text(paper),
            label(mechanism_class(ours) == mechanism_class(paper), size))


def conv_carries(r: dict) -> bool:
    """C5: Mamba's layer-0 conv at Value+1 carries the association (Attrib >= 0.9)."""
    return r["conv"].get("value+1", 0) >= 0.9


def conv_label(runs: list) -> str:
    """C5's label of a group of runs: reproduced where the conv carries it in every run."""
    return group_label("reproduced" if conv_carries(r) else "not reproduced" for r in runs)


def report_runs() -> dict:
    """{folder name: flags} of the runs the report may read under cpu_preset: the CPU sweeps' (3
    seeds; the mixer sweep's, which name no architecture, go in runs/mixers) and C3's Hyena on AR
    at the paper's other widths."""
    runs = dict(run for sweep in SWEEPS for run in sweep_runs(sweep, "cpu", 3) if "arch" in run[1])
    hyena = [dict(preset="cpu", task="ar", arch="hyena", d_model=d, seed=seed)
             for d in WIDTHS if d != 64 for seed in (42, 43, 44)]
    return runs | {run_name(run): run for run in hyena}


def refused_runs(runs_root: str, cpu: list) -> list:
    """Why the report cannot be recounted from runs_root, one line per run folder ([]: it can): a
    damaged one anywhere under it (collect skips it), and under cpu_preset (cpu: its records) one
    that is not among report_runs, or not the run its name says. The report groups runs by their
    fields: without a seed a group's mean would be over the others, and a foreign run would join
    a group, or make one that holds none of the report's runs (nan)."""
    lines = []
    collect(runs_root, log=lambda line: lines.append(line.replace("skipped", "damaged run", 1)))
    expected = report_runs()
    for r in cpu:
        folder = os.path.join(runs_root, "cpu_preset", r["folder"])
        if r["folder"] not in expected:
            lines.append(f"foreign run {folder}: no CPU sweep of the report names a run so")
            continue
        theirs, named = configuration(r), mech.identity(run_config(expected[r["folder"]]))
        if theirs != named:
            diff = ", ".join(f"{k} {theirs.get(k)} (its name's: {named.get(k)})"
                             for k in theirs | named if theirs.get(k) != named.get(k))
            lines.append(f"foreign run {folder}: not the run its name says ({diff})")
    return lines


def report_numbers(runs_root: str, cpu=None) -> list:
    """[(id, ours, paper, verdict)] of the report's headline numbers and verdicts, recounted from
    runs_root/cpu_preset (or its records, cpu, if collected already) and runs_root/paper_protocol
    by the rule above ("-": none)."""
    cpu = cpu if cpu is not None else collect(os.path.join(runs_root, "cpu_preset"))
    wide = [r for r in cpu if r["d_model"] != 64]  # C3's Hyena where the paper's learns AR
    cpu = [r for r in cpu if r["d_model"] == 64]  # the report's width: the paper's at d = 64
    pp = collect(os.path.join(runs_root, "paper_protocol"))
    at64 = lambda values: values[WIDTHS.index(64)]
    items = []

    def group(records, **match):
        return [r for r in records if all(r.get(k) == v for k, v in match.items())]

    ar = main_ar(cpu)
    for a in archs_of(ar):
        runs = of_arch(ar, a)
        if (paper := PAPER["ar_accuracy"][a]) is not None:
            items.append(accuracy_item(f"C1 AR {a}", runs, at64(paper), 0.5))
        else:
            items.append((f"C1 AR {a}", mean_sd(r["accuracy"] for r in runs), "-", "partly"))
    for a in ("attention", "based"):
        items.append(mechanism_item(f"C2 AR {a} Attribs", of_arch(ar, a),
                                    PAPER["ar_mechanism"][a]))
    items.append(mechanism_item("C3 AR mamba Attribs", of_arch(ar, "mamba"),
                                PAPER["ar_mechanism"]["mamba"]))
    one = group(cpu, task="ar", arch="mamba", n_layer=1)
    items.append(accuracy_item("C3 AR mamba 1 layer", one, at64(PAPER["ar_layers"]["mamba", 1]),
                               0.5))
    for d in sorted({r["d_model"] for r in wide}):  # the paper's accuracy at that width
        runs = [r for r in main_ar(wide) if r["arch"] == "hyena" and r["d_model"] == d]
        paper = PAPER["ar_accuracy"]["hyena"][WIDTHS.index(d)]
        items.append(accuracy_item(f"C3 AR hyena d = {d}", runs, paper, 0.5))
        items.append(mechanism_item(f"C3 AR hyena d = {d} Attribs", runs,
                                    PAPER["ar_mechanism"]["hyena"]))
    wide_pp = group(pp, task="ar", arch="hyena")  # the same, under the paper's protocol
    for d, lr in sorted({(r["d_model"], r["lr"]) for r in wide_pp}):
        runs = group(wide_pp, d_model=d, lr=lr)
        name = f"C3 AR hyena d = {d}, paper protocol lr {lr:g}"
        paper = PAPER["ar_accuracy"]["hyena"][WIDTHS.index(d)]
        items.append(accuracy_item(name, runs, paper, 0.5))
        if any(map(reacts, runs)):  # else no Attrib: the answer ignores the Key
            items.append(mechanism_item(f"{name} Attribs", runs, PAPER["ar_mechanism"]["hyena"]))
    for k in range(5):
        runs = [r for r in group(cpu, task="ar", arch="mamba", n_layer=2, d_conv=k)
                if main_variant(r)]
        items.append(accuracy_item(f"C4 AR mamba d_conv {k}", runs,
                                   at64(PAPER["ar_mamba_dconv"][k]), 0.5))
    # C5: the conv at Value+1 carries the association (>= 0.9) in how many Mamba AR runs
    conv_runs = [r for r in ar if r["arch"] == "mamba"] + [
        r for r in pp if r["task"] == "ar" and r["arch"] == "mamba" and reacts(r)]
    carried = [r for r in conv_runs if conv_carries(r)]
    items.append(("C5 conv_output[0] @Value+1 >= 0.9", f"{len(carried)} of {len(conv_runs)} runs",
                  "-", conv_label(conv_runs)))
    atr, _, models = main_atr(cpu)
    for s in mech.ATR_SETTINGS:
        for m in models:
            runs = [r for r in atr if r["atr"] == s and atr_model(r) == m]
            if runs and (paper := PAPER["atr_accuracy"].get((s, m))) is not None:
                items.append(accuracy_item(f"C6 ATR {s} {m}", runs, at64(paper),
                                           copy_next_token(s)))
            if any(map(reacts, runs)) and (paper := PAPER["atr_mechanism"].get((s, m))):
                items.append(mechanism_item(f"C6 ATR {s} {m} Attribs", runs, paper))
    # C7: Mamba without its conv on ATR easy, @Value against v3's "≈ 1"
    claim = PAPER["atr_mamba_dconv_claim"][0]
    for name, runs in (("CPU preset", group(cpu, task="atr", arch="mamba", d_conv=0)),
                       ("paper protocol lr 3e-3", group(pp, task="atr", arch="mamba", d_conv=0,
                                                        lr=3e-3))):
        means = passing_means(runs)
        items.append((f"C7 ATR easy mamba d_conv 0 @Value, {name}", cell(means["value"]),
                      f"≈ {claim:g}", label(mechanism_class(means) == "induction",
                                            abs(means["value"] - claim) <= ATTRIB_SIZE)))
    # the three scales: Attention (PE) on ATR easy under the paper's protocol at its best rate
    runs = group(pp, task="atr", atr="easy", arch="attention", lr=1e-3)
    items.append(accuracy_item("C6 ATR easy attention, paper protocol", runs,
                               at64(PAPER["atr_accuracy"]["easy", "attention"]),
                               copy_next_token("easy")))
    # App. D.1 compares PE - NoPE gaps (what a position embedding changes), model by model; the
    # NoPE accuracy of Attention is quoted beside them, its verdict C6's (ATR) or none (AR)
    items += pe_gap_items(cpu, atr)
    # App. D.2: one layer on ATR easy
    for a in ARCHS:
        runs = [r for r in group(cpu, task="atr", atr="easy", arch=a, n_layer=1)
                if main_variant(r)]
        if runs and (paper := PAPER["atr_layers"].get(a)) is not None:
            items.append(accuracy_item(f"D.2 ATR easy 1 layer {a}", runs, at64(paper),
                                       copy_next_token("easy")))
    # §5.3: held-out label pairs, 2 layers, each seed at its best dev rate
    gen = best_runs([r for r in cpu if r.get("held_out") and r["n_layer"] == 2])
    for a in archs_of(gen):
        if (paper := PAPER["atr_gen"].get(a)) is None:
            continue
        runs = of_arch(gen, a)
        # direction: the held-out pairs at least 0.2 below the training's, as in the paper
        gap = np.mean([r["dev_accuracy"] - r["accuracy"] for r in runs])
        poor = (gap >= 0.2) == (at64(paper["dev"]) - at64(paper["test"]) >= 0.2)
        for split, read in (("dev", "dev_accuracy"), ("test", "accuracy")):
            ours = np.mean([r[read] for r in runs])
            items.append((f"5.3 ATR held-out {a} {split}", mean_sd(r[read] for r in runs),
                          f"{at64(paper[split]):.3f}",
                          label(poor, abs(ours - at64(paper[split])) <= ACC_SIZE)))
        for split in ("dev", "test"):  # atr_gen_box: the Attribs on each split's documents
            read = [r | r["dev"] for r in runs if "dev" in r] if split == "dev" else runs
            if any(map(reacts, read)) and (box := PAPER["atr_gen_mechanism"].get((split, a))):
                items.append(mechanism_item(f"5.3 ATR held-out {a} {split} Attribs", read, box))
    # App. D.4: the sibling task
    for n in (1, 2, 3):
        for a in ARCHS:
            runs = [r for r in group(cpu, task="atr", arch=a, n_layer=n)
                    if atr_query(r) == "sibling"]
            if runs and (paper := PAPER["atr_sibling"].get((a, n))) is not None:
                items.append(accuracy_item(f"D.4 sibling {n} layers {a}", runs, at64(paper),
                                           PAPER["atr_sibling_copy_query"]))
    for a in ARCHS:  # 2 layers: the Attribs, Key and Value on the documents where they differ
        runs = [r for r in group(cpu, task="atr", arch=a, n_layer=2) if atr_query(r) == "sibling"]
        act = [r for r in runs if reacts_at(r, "value")]
        items.append((f"D.4 sibling 2 layers {a} Attribs (seeds past at Key/Value)",
                      f"{attribs_text(passing_means(runs))} ({len(act)} of {len(runs)})", "-", "-"))
    # the mechanism while it forms: (mechanism, accuracy) steps per watched run
    for title, rs in watched_runs(one_width(one_protocol(cpu, lambda m: None), lambda m: None)):
        for r in rs:
            if name := final_position(r):
                m = moments_of(r, name)
                items.append((f"formation {title.split(' (')[0]} seed {r['seed']} @{name}",
                              f"{m['mechanism'] or 'never'} / {m['accuracy'] or 'never'}",
                              "-", "-"))
    # what the CPU runs cost: runs and run-minutes per group of sweeps, each committed run counted
    # once (in the first group that holds it), and per sweep, all its runs
    by_name = {os.path.basename(r["folder"]): r for r in cpu}
    counted = set()
    for sweeps in (MAIN_SWEEPS, OTHER_SWEEPS):
        names = {n for sw in sweeps for n, _ in sweep_runs(sw, "cpu", 3) if n in by_name}
        new = names - counted
        counted |= names
        minutes = sum(by_name[n]["wall_time_s"] for n in new) / 60
        kind = "main" if sweeps == MAIN_SWEEPS else "other findings"
        items.append((f"cost {kind}: runs, run-minutes", f"{len(new)}, {minutes:,.0f}", "-", "-"))
        for sw in sweeps:
            mine = {n for n, _ in sweep_runs(sw, "cpu", 3) if n in by_name}
            minutes = sum(by_name[n]["wall_time_s"] for n in mine) / 60
            items.append((f"cost {sw}: runs, run-minutes", f"{len(mine)}, {minutes:,.0f}", "-",
                          "-"))
    return items + class_items(runs_root, cpu)


def pe_gap_items(cpu: list, atr: list) -> list:
    """App. D.1 (pos_embed): per setting and model, the PE - NoPE gap of the mean accuracies
    against the paper's, by RULE; Attention's NoPE accuracy on AR is quoted with no verdict."""
    at64 = lambda values: values[WIDTHS.index(64)]
    ar2 = [r for r in cpu if r["task"] == "ar" and r["n_layer"] == 2 and not conv_variant(r)]
    atr2 = [r for r in cpu if r["task"] == "atr" and r["n_layer"] == 2 and not conv_variant(r)
            and main_question(r)]
    items = []
    for s in ("ar", "easy", "medium"):
        rs = ar2 if s == "ar" else [r for r in atr2 if r["atr"] == s]
        where = "AR" if s == "ar" else f"ATR {s}"
        if s == "ar":
            nope = [r for r in rs if r["arch"] == "attention" and not r["pos_emb"]]
            items.append((f"D.1 AR attention NoPE", mean_sd(r["accuracy"] for r in nope),
                          f"{at64(PAPER['pos_embed']['ar', 'attention', 'NoPE']):.3f}", "-"))
        for a in ARCHS:
            pe = [r for r in rs if r["arch"] == a and r["pos_emb"]]
            nope = [r for r in rs if r["arch"] == a and not r["pos_emb"]]
            if not pe or not nope:
                continue
            gap = np.mean([r["accuracy"] for r in pe]) - np.mean([r["accuracy"] for r in nope])
            paper = {v: PAPER["pos_embed"].get((s, a, v)) for v in ("PE", "NoPE")}
            if None in paper.values():
                items.append((f"D.1 {where} {a} PE - NoPE", f"{gap:+.3f}", "-", "-"))
                continue
            paper_gap = at64(paper["PE"]) - at64(paper["NoPE"])
            items.append((f"D.1 {where} {a} PE - NoPE", f"{gap:+.3f}", f"{paper_gap:+.3f}",
                          label(gap_direction(gap, paper_gap), abs(gap - paper_gap) <= ACC_SIZE)))
    return items


# The class preset's claims (README.md, "The paper in one class"): each a model of the main AR or
# ATR easy results, read beside the CPU preset's runs of the same model
CLASS_CLAIMS = (("AR attention", dict(task="ar", arch="attention")),
                ("AR based", dict(task="ar", arch="based")),
                ("AR mamba d_conv 4", dict(task="ar", arch="mamba", d_conv=4)),
                ("AR mamba d_conv 0", dict(task="ar", arch="mamba", d_conv=0)),
                ("AR mamba d_conv 1", dict(task="ar", arch="mamba", d_conv=1)),
                ("ATR easy mamba d_conv 0", dict(task="atr", atr="easy", arch="mamba", d_conv=0)))


def in_words(r: dict) -> str:
    """A run's verdict, as mech.verdict words it for a 2-layer model, in short."""
    if r["effect"] < mech.VERDICT_MIN_EFFECT:
        return "not learned"
    top = mech.dominant(r["attrib"])
    return {"value": "induction", "query": "retrieval at the Query",
            "key": "retrieval at the Key"}.get(top, "mixed")


def counted(words: list) -> str:
    """Verdicts as "induction ×2, mixed ×1", in the order they first come."""
    return ", ".join(f"{w} ×{words.count(w)}" for w in dict.fromkeys(words))


def class_items(runs_root: str, cpu: list) -> list:
    """Per claim of the class preset, its runs (runs_root/class_preset) and the CPU preset's of the
    same model: accuracy, Key / Value / Query, Mamba's conv_output[0] @Value+1 in each seed ("-":
    no conv), the verdicts, the median minutes a run (training); the verdict column says whether
    the verdict most seeds get is the same in the two presets."""
    cls = collect(os.path.join(runs_root, "class_preset"), lambda m: None)
    items = []
    for name, match in CLASS_CLAIMS:
        verdicts, convs = {}, {}
        for preset, records in (("class", cls), ("cpu", cpu)):
            runs = [r for r in records if r["n_layer"] == 2 and main_variant(r)
                    and ("d_conv" in match or not conv_variant(r))
                    and all(r.get(k) == v for k, v in match.items())]
            if not runs:
                continue
            verdicts[preset] = sorted(map(in_words, runs))
            words = counted(verdicts[preset])
            minutes = np.median([r["wall_time_s"] for r in runs]) / 60
            means = passing_means(runs)
            attribs = "-" if all(np.isnan(list(means.values()))) else attribs_text(means)
            conv = ", ".join(f"{r['conv']['value+1']:.2f}" for r in runs if r.get("conv")) or "-"
            if match.get("d_conv") == 4:  # C5's claim: the conv's share at Value+1
                convs[preset] = conv_label(runs)
            same = "-"
            if preset == "cpu" and "class" in verdicts:  # RULE: every seed's verdict, C5's label
                differ = (["the verdicts"] if verdicts["class"] != verdicts["cpu"] else []) + (
                    [f"the conv: {convs['class']} / {convs['cpu']}"]
                    if convs and convs["class"] != convs["cpu"] else [])
                same = f"differs ({'; '.join(differ)})" if differ else "same"
            items.append((f"class {name}, {preset} preset",
                          f"{mean_sd(r['accuracy'] for r in runs)}; "
                          f"{attribs}; {conv}; {words}; {minutes:.1f} min", "-",
                          same))
    return items


# ── the report's generated tables: numbers.md holds them, figures/README.md copies them ──────

def cell(x: float, fmt: str = ".2f") -> str:
    return "-" if x is None or np.isnan(x) else f"{x:{fmt}}"


def paper_accuracy_of(r: dict) -> float | None:
    """The paper's accuracy for a run's model at its width (its best rate), or None."""
    i = WIDTHS.index(r["d_model"]) if r["d_model"] in WIDTHS else None
    if r["task"] == "ar":
        values = (PAPER["ar_mamba_dconv"].get(r["d_conv"]) if r["arch"] == "mamba"
                  else PAPER["pos_embed"].get(("ar", r["arch"], "PE")) if pe_variant(r) == " PE"
                  else PAPER["ar_accuracy"].get(r["arch"]) if not conv_variant(r) else None)
    else:
        values = (None if conv_variant(r) else
                  PAPER["atr_accuracy"].get((r["atr"], atr_model(r))))
    return None if values is None or i is None else values[i]


def run_label(r: dict) -> str:
    task = "AR" if r["task"] == "ar" else f"ATR {r['atr']}"
    width = f", d = {r['d_model']}" if r["d_model"] != 64 else ""
    return (f"{task}, {r['arch']}{conv_variant(r)}{pe_variant(r)}{width}, lr {r['lr']:g}, "
            f"seed {r['seed']}")


def at_step(r: dict, step: int) -> float | None:
    return next((p["accuracy"] for p in r["curve"] if p["step"] == step), None)


def protocol_table(runs_root: str) -> str:
    """Every run of the paper's protocol (runs_root/paper_protocol): accuracy (its maximum along the
    curve, at step 15k), the paper's, wall minutes, the main setting's Attribs, the Key's effect,
    Mamba's conv at Value+1 and mech.py's verdict in short."""
    folder = os.path.join(runs_root, "paper_protocol")
    lines = ["| run | accuracy (max along the curve; at step 15k) | paper (its width, best rate) "
             "| wall (min) | Attrib Key / Value / Query | Value+1 / divider | Key effect "
             "| conv[0] @Value+1 | verdict (mech.py) |",
             "|---|---|---:|---:|---|---|---:|---:|---|"]
    for r in sorted(collect(folder, lambda m: None), key=lambda r: r["folder"]):
        with open(os.path.join(folder, r["folder"], "metrics.json")) as f:
            r["curve"] = json.load(f)["curve"]
        best, mid = max(p["accuracy"] for p in r["curve"]), at_step(r, 15000)
        a = r["attrib"]
        lines.append(f"| {run_label(r)} | {r['accuracy']:.3f} ({best:.3f}; {cell(mid, '.3f')}) "
                     f"| {cell(paper_accuracy_of(r), '.3f')} | {r['wall_time_s'] / 60:.1f} "
                     f"| {attribs_text(a)} | {cell(a['value+1'])} / {cell(a['divider'])} "
                     f"| {r['effect']:.3f} | {cell(r['conv'].get('value+1'))} | {in_words(r)} |")
    return "\n".join(lines) + "\n"


def hyena_groups(runs_root: str, cpu: list) -> list:
    """C3's Hyena on AR where the paper's learns it: [(d, protocol, runs)], the CPU preset at
    d = 64, 128, 256 (3 seeds) and the paper's protocol by width and rate."""
    pp = collect(os.path.join(runs_root, "paper_protocol"), lambda m: None)
    hyena = lambda rs: [r for r in main_ar(rs) if r["arch"] == "hyena"]
    groups = [(d, "CPU preset, lr 1e-3", [r for r in hyena(cpu) if r["d_model"] == d])
              for d in sorted({r["d_model"] for r in hyena(cpu)})]
    groups += [(d, f"paper's protocol, lr {lr:g}",
                [r for r in hyena(pp) if (r["d_model"], r["lr"]) == (d, lr)])
               for d, lr in sorted({(r["d_model"], r["lr"]) for r in hyena(pp)})]
    return groups


def hyena_table(runs_root: str, cpu: list) -> str:
    """C3 for Hyena: per width and protocol, accuracy against the paper's at that width, the
    Key's effect per seed, the Attribs and the largest |Attrib| at the other positions, and the
    verdicts by RULE (accuracy_item, mechanism_item)."""
    lines = ["| d | protocol | seeds | accuracy (paper at d) | Key effect "
             "| Attrib Key / Value / Query "
             "(seeds past the 0.01 filter) | largest abs Attrib at Value+1, Value+2, divider "
             "(those seeds) | verdict: accuracy; mechanism |",
             "|---:|---|---|---|---|---|---:|---|"]
    for d, protocol, runs in hyena_groups(runs_root, cpu):
        paper = PAPER["ar_accuracy"]["hyena"][WIDTHS.index(d)]
        acc = accuracy_item("", runs, paper, 0.5)
        past = [r for r in runs if reacts(r)]
        mech_label = mechanism_item("", runs, PAPER["ar_mechanism"]["hyena"])[3] if past \
            else "no seed past the filter"
        others = max((abs(r["attrib"][p]) for r in past for p in ("value+1", "value+2", "divider")
                      if not np.isnan(r["attrib"][p])), default=float("nan"))
        seeds = ", ".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"]))
        effects = ", ".join(f"{r['effect']:.3f}" for r in sorted(runs, key=lambda r: r["seed"]))
        lines.append(f"| {d} | {protocol} | {seeds} | {acc[1]} ({paper:.3f}) | {effects} "
                     f"| {attribs_text(passing_means(runs)) if past else '-'} "
                     f"({len(past)} of {len(runs)}) | {cell(others, '.3f')} "
                     f"| {acc[3]}; {mech_label} |")
    return "\n".join(lines) + "\n"


# ── beyond the paper: today's mixers (figures/mixers/), beside the CPU preset's Mamba ────────

TODAY = ("mamba2", "gated_deltanet", "kda")  # figures/mixers/<name>.py, runs in runs/mixers
# The fairness rule of the section, which the report states once (the words: its tests). The
# regimes: on AR Mamba's (fresh documents every step, 20,000 steps) at Mamba's 3e-3, or 1e-3 for
# a mixer that fits nothing at 3e-3 (REGIME_LR); on ATR easy the CPU preset's (the fixed set,
# 15,000 steps, 1e-3).
FAIRNESS = ("every row names its data regime, learning rate and steps, read from its runs' "
            "config.json; a row compared with Mamba's shares them, or its last column and the "
            "words name the difference")
REGIME = {"ar": dict(fresh_data=True, steps=20_000), "atr easy": dict(fresh_data=False,
                                                                    steps=15_000)}
REGIME_LR = {("ar", "gated_deltanet"): 1e-3}  # the others: their preset's (Mamba's 3e-3 on AR)


def regime_lr(task: str, arch: str) -> float:
    """The learning rate of arch's rows on task: Mamba's preset's, or REGIME_LR's exception."""
    return REGIME_LR.get((task, arch), 3e-3 if task == "ar" else 1e-3)


def in_regime(r: dict) -> bool:
    """Whether a run of today's mixers (or Mamba) is one of the table's: its task's regime."""
    task = task_label(r)
    return (task in REGIME and all(r[k] == v for k, v in REGIME[task].items())
            and r["lr"] == regime_lr(task, r["arch"]))


def data_regime(r: dict) -> str:
    return "fresh documents" if r.get("fresh_data") else "fixed set"


def regime(runs: list) -> str:
    """The data regime, learning rate and steps of runs, from their config.json."""
    cells = {f"{data_regime(r)}, lr {r['lr']:g}, {r['steps']:,} steps" for r in runs}
    return "; ".join(sorted(cells))


def today_groups(runs_root: str, cpu: list) -> list:
    """[(model, task, d_conv, runs)]: per task (AR, ATR easy) the CPU preset's Mamba and each of
    today's mixers (its runs under runs_root/mixers in the task's regime: REGIME), with its short
    conv (the widest run) and without (d_conv 0); the groups with no run are left out."""
    today = [r for r in collect(os.path.join(runs_root, "mixers"), lambda m: None)
             if in_regime(r)]
    groups = []
    for task in ("ar", "atr easy"):
        for arch in ("mamba",) + TODAY:
            runs = [r for r in (cpu if arch == "mamba" else today) if r["arch"] == arch
                    and task_label(r) == task and r["n_layer"] == 2 and main_variant(r)
                    and not r["long_conv"]]
            widths = {r["d_conv"] for r in runs}
            for k in sorted({max(widths, default=0), 0} & widths, reverse=True):
                groups.append((arch, task, k, [r for r in runs if r["d_conv"] == k]))
    return groups


def conv_cell(r: dict) -> str:
    """A run's conv_output @Value+1, layer by layer ("-": no conv)."""
    cells = [v for v in r["conv_value1"] if v is not None]
    return " / ".join(f"{v:.2f}" for v in cells) or "-"


def conv_top_cell(r: dict) -> str:
    """The conv cell of a run that restores most, e.g. "[1] @Value+2 0.97" ("-": no conv)."""
    if r["conv_top"] is None:
        return "-"
    layer, position, attrib = r["conv_top"]
    return f"[{layer}] @{position.capitalize()} {attrib:.2f}"


def losses(r: dict) -> str:
    """A run's last training loss and its test loss: far apart, it has memorised its documents."""
    return " / ".join(f"{x:.2f}" for x in r["losses"])


def named_sum(r: dict) -> float:
    """The sum of a run's Attribs at the named positions (Key, Value, Value+1, Value+2, the
    divider, the Query) at the last layer's input: the share of the Key's effect they explain
    (nan where the Key moves p(answer) too little to attribute)."""
    if r["effect"] < mech.VERDICT_MIN_EFFECT:
        return float("nan")
    return float(np.nansum(list(r["attrib"].values())))


def today_table(runs_root: str, cpu: list) -> str:
    """The report's table of today's mixers beside Mamba: per model, task and conv width its
    regime (data, lr, steps: from config.json), the seeds' accuracy, Key effect, Key / Value /
    Query (means past the filter), each seed's sum over the named positions (named_sum), its conv
    at Value+1 in every layer and its conv cell that restores most, each seed's verdict (mech.py's words), and where its regime is not
    Mamba's row's, how."""
    lines = ["| model | task | d_conv | regime | seeds | accuracy "
             "| loss train / test (each seed) | Key effect "
             "| Attrib K / V / Q | the named positions' sum (each seed) "
             "| conv @Value+1, layer 0 / 1 (each seed) | the conv's largest "
             "cell (each seed) | verdicts | regime vs Mamba's row |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = today_groups(runs_root, cpu)
    mamba = {(task, k > 0): regime(runs) for arch, task, k, runs in groups if arch == "mamba"}
    for arch, task, k, runs in groups:
        runs = sorted(runs, key=lambda r: r["seed"])
        means = passing_means(runs)
        attribs = "-" if all(np.isnan(list(means.values()))) else attribs_text(means)
        effects = [f"{r['effect']:.3f}" for r in runs]
        theirs = mamba.get((task, k > 0))
        versus = "the same" if regime(runs) == theirs else f"Mamba's: {theirs or 'none'}"
        lines.append(f"| {arch} | {task} | {k} | {regime(runs)} "
                     f"| {', '.join(str(r['seed']) for r in runs)} "
                     f"| {mean_sd(r['accuracy'] for r in runs)} "
                     f"| {'; '.join(map(losses, runs))} | {', '.join(effects)} | {attribs} "
                     f"| {', '.join(cell(named_sum(r)) for r in runs)} "
                     f"| {'; '.join(map(conv_cell, runs))} "
                     f"| {'; '.join(map(conv_top_cell, runs))} "
                     f"| {counted([in_words(r) for r in runs])} | {versus} |")
    return "\n".join(lines) + "\n"


def lr_table(runs_root: str) -> str:
    """Today's mixers' runs outside the table's regimes (the earlier CPU-preset runs on AR, and
    the learning rates tried on seed 42 alone), per model, task, conv width and seed: each
    regime's accuracy and verdict."""
    runs = [r for r in collect(os.path.join(runs_root, "mixers"), lambda m: None)
            if not in_regime(r)]
    key = lambda r: (TODAY.index(r["arch"]), task_label(r), r["d_conv"], r["seed"])
    lines = ["| model | task | d_conv | seed | regime: accuracy, loss train / test, verdict |",
             "|---|---|---|---|---|"]
    for k in sorted({key(r) for r in runs}):
        cells = [f"{regime([r])}: {r['accuracy']:.3f}, {losses(r)}, {in_words(r)}"
                 for r in sorted(runs, key=lambda r: (r["fresh_data"], r["lr"])) if key(r) == k]
        lines.append(f"| {TODAY[k[0]]} | {k[1]} | {k[2]} | {k[3]} | {'; '.join(cells)} |")
    return "\n".join(lines) + "\n"


# ── beyond the paper: hybrids (figures/mixers/hybrids.py), beside their pure models ──────────

HYBRIDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixers", "hybrids.py")
HYBRID_TASKS = ("ar", "atr easy")


@functools.cache
def hybrid_patterns() -> dict:
    """HYBRIDS of figures/mixers/hybrids.py ({name: the arch of each layer}), read from its source:
    running the file would register its mixers in mech.MIXERS, which collecting leaves alone."""
    with open(HYBRIDS_FILE) as f:
        tree = ast.parse(f.read())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["HYBRIDS"])
    return eval(compile(ast.Expression(value), HYBRIDS_FILE, "eval"), {"__builtins__": {}})


def hybrid_of(arch: str) -> str:
    """The hybrid a frozen arch (figures/frozen.py) is; any other arch is its own."""
    return arch.removesuffix(frozen.SUFFIX)


def layer_archs(r: dict) -> tuple:
    """The arch of each layer of a run: a hybrid's pattern (a frozen one's is its hybrid's),
    repeated as its factory repeats it over more layers, or the run's one arch in every layer."""
    pattern = hybrid_patterns().get(hybrid_of(r["arch"]), (r["arch"],))
    return tuple(pattern[layer % len(pattern)] for layer in range(r["n_layer"]))


def layer_verdict(r: dict) -> tuple:
    """(mechanism, reading) of a run of 2 layers or more, naming the layer that forms the answer
    and how, from the Attribs at every layer's input (block_input[l], Key corrupted) and
    mech.py's thresholds:
    - the Key's effect (mech.key_effect) below mech.VERDICT_MIN_EFFECT: "not learned";
    - the answer reaches the Query at the first input l >= 1 where @Query >= mech.VERDICT_DOMINANT:
      layer r = l - 1 forms it (no such input: r = the last layer);
    - r = 0, whose input is the embedding: "retrieval at the Query in the <arch> layer (layer 0)",
      its @Query read at layer 1's input;
    - r >= 1, read at its input block_input[r] (mech.dominant): @Value dominant, "induction in the
      <arch> layer (layer r)" (earlier layers stored the key at the Value, layer r matches the
      Query against it); @Key, "the <arch> layer (layer r) reads the Key itself"; else "mixed at
      layer r (<arch>)", with K/V/Q. (@Query cannot dominate there: r's input would be l's.)
    In a 2-layer model of one arch these are mech.verdict's induction, direct retrieval at the
    Query and late retrieval at the Key."""
    if r["effect"] < mech.VERDICT_MIN_EFFECT:
        return "not learned", f"Key effect {r['effect']:.3f}"
    archs, inputs = layer_archs(r), r["inputs"]
    reached = next((l for l in range(1, len(inputs))
                    if inputs[l]["query"] >= mech.VERDICT_DOMINANT), len(inputs))
    layer = reached - 1
    if layer == 0:
        return (f"retrieval at the Query in the {archs[0]} layer (layer 0)",
                f"@Query {inputs[1]['query']:.2f} (at layer 1's input)")
    a = inputs[layer]
    top = mech.dominant(a)
    if top == "value":
        return f"induction in the {archs[layer]} layer (layer {layer})", f"@Value {a['value']:.2f}"
    if top == "key":
        return (f"the {archs[layer]} layer (layer {layer}) reads the Key itself",
                f"@Key {a['key']:.2f}")
    return f"mixed at layer {layer} ({archs[layer]})", f"K/V/Q {attribs_text(a)}"


def layer_conv_cell(r: dict) -> str:
    """conv_top_cell, and the arch of the layer whose conv it is: "[0] @Value+1 0.99 (mamba)";
    "-" where the run has no conv or its answer does not react to the Key (reacts: its Attribs
    would be ratios of noise)."""
    if r["conv_top"] is None or not reacts(r):
        return "-"
    return f"{conv_top_cell(r)} ({layer_archs(r)[r['conv_top'][0]]})"


def by_configuration(runs: list) -> list:
    """Runs grouped as the summary table groups them (differing only in their seed), each group in
    seed order."""
    groups = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault(config_key(r), []).append(r)
    return list(groups.values())


def pure_runs(records: list, arch: str, hybrid: list) -> list:
    """A pure model's runs beside a hybrid's on one task (hybrid: those runs): of 2 layers or the
    hybrid's, at the hybrid's width and with its short conv (attention has none), asking the
    paper's main question with its PE choice or the hybrid's (so pure attention NoPE too: the
    hybrids' attention layer has no position embedding); of the hybrid's regime (data, lr and
    steps) if any are, else of its data (fresh documents or the fixed set), else all of them (each
    configuration a row of its own)."""
    task = task_label(hybrid[0])
    runs = [r for r in records if r["arch"] == arch and task_label(r) == task
            and r["n_layer"] in {2} | {h["n_layer"] for h in hybrid}
            and main_question(r) and not r["long_conv"]
            and (not pe_variant(r) or r["pos_emb"] in {h["pos_emb"] for h in hybrid})
            and r["d_model"] in {h["d_model"] for h in hybrid}
            and r["d_conv"] in {h["d_conv"] for h in hybrid} | {None}]
    same = [r for r in runs if regime([r]) in {regime([h]) for h in hybrid}]
    same_data = [r for r in runs if data_regime(r) in set(map(data_regime, hybrid))]
    return same or same_data or runs


def hybrid_groups(runs_root: str, cpu: list) -> list:
    """[(hybrid, task, runs)]: per hybrid (HYBRIDS' order) and task (AR, ATR easy) that has runs
    under runs_root/hybrids, a group per configuration of them, then of the hybrid with its first
    block frozen (figures/frozen.py), then of each of its pure models (pure_runs: the paper's
    seven from the CPU preset's runs, cpu; today's mixers from runs_root/mixers); the frozen
    hybrid and pure models with no run are left out."""
    hybrids = collect(os.path.join(runs_root, "hybrids"), lambda m: None)
    mixers = collect(os.path.join(runs_root, "mixers"), lambda m: None)
    groups = []
    for name, pattern in hybrid_patterns().items():
        for task in HYBRID_TASKS:
            mine = [r for r in hybrids if r["arch"] == name and task_label(r) == task]
            if not mine:
                continue
            frozen_runs = [r for r in hybrids if r["arch"] == name + frozen.SUFFIX
                           and task_label(r) == task]
            pure = [pure_runs(cpu if arch in ARCHS else mixers, arch, mine)
                    for arch in dict.fromkeys(pattern)]
            groups += [(name, task, rs) for runs in [mine, frozen_runs] + pure
                       for rs in sorted(by_configuration(runs),  # the widest conv, then 2 layers
                                        key=lambda rs: (-(rs[0]["d_conv"] or 0), rs[0]["n_layer"]))]
    return groups


def input_means(runs: list, layer: int, positions=POSITIONS3) -> dict:
    """passing_means at layer's input (block_input[layer])."""
    return passing_means([r | {"attrib": r["inputs"][layer]} for r in runs], positions)


def hybrids_table(runs_root: str, cpu: list) -> str:
    """The report's table of the hybrids beside their pure models (hybrid_groups): per model,
    task and configuration its short conv's width ("-": none), its data (fresh documents or the
    fixed set), learning rate and steps, the seeds' accuracy and Key effect, Key / Value / Query
    at every layer's input but the embedding (means past the filter), each seed's conv cell that
    restores most (and its layer's arch), and the seeds' verdicts (layer_verdict's mechanism)
    counted; "" with no hybrid run."""
    lines = ["| hybrid | task | model | layers | d_conv | data | lr | steps | seeds | accuracy "
             "| Key effect | Attrib K / V / Q at block_input[l] | the conv's largest cell (each seed) "
             "| verdicts |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, task, runs in hybrid_groups(runs_root, cpu):
        first = runs[0]
        layers = [(layer, input_means(runs, layer)) for layer in range(1, first["n_layer"])]
        attribs = "; ".join(f"[{layer}] {attribs_text(m)}" for layer, m in layers
                            if not all(np.isnan(list(m.values())))) or "-"
        steps = f"{first['steps']:,}" if first.get("steps") else f"{first['epochs']} epochs"
        seeds = ", ".join(str(r["seed"]) for r in runs)
        effects = ", ".join(f"{r['effect']:.3f}" for r in runs)
        model = first["arch"] + pe_variant(first)
        conv = "-" if first["d_conv"] is None else first["d_conv"]
        lines.append(f"| {name} | {task} | {model} | {first['n_layer']} | {conv} "
                     f"| {data_regime(first)} | {first['lr']:g} | {steps} | {seeds} "
                     f"| {mean_sd(r['accuracy'] for r in runs)} | {effects} | {attribs} "
                     f"| {'; '.join(map(layer_conv_cell, runs))} "
                     f"| {counted([layer_verdict(r)[0] for r in runs])} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def generated_tables(runs_root: str, cpu: list) -> dict:
    """{title: markdown} of the report's generated tables, in numbers.md's order."""
    return {"Every run of the paper's protocol": protocol_table(runs_root),
            "C3 for Hyena where the paper's Hyena learns AR": hyena_table(runs_root, cpu),
            "Beyond the paper: today's mixers": today_table(runs_root, cpu),
            "Today's mixers in other regimes, seed by seed": lr_table(runs_root),
            "Beyond the paper: hybrids": hybrids_table(runs_root, cpu)}


def numbers_md(items: list, tables: dict) -> str:
    """numbers.md: the head, the items' table, then each generated table under its title; a
    ValueError where a nan would stand for a number (a mean over no runs, say)."""
    text = NUMBERS_HEAD + numbers_table(items) + "".join(
        f"\n## {title}\n\n{table}" for title, table in tables.items())
    nan = re.search(r".*\bnan\b.*", text)
    if nan:
        raise ValueError(f"a nan where a number goes: {nan.group()}")
    return text


NUMBERS_HEAD = ("# The report's numbers and verdicts, recounted from the runs\n\n"
                "Generated by `python figures/experiments.py --numbers figures/runs` "
                "(collect.report_numbers, collect.generated_tables); do not edit. Verdict rule "
                f"(collect.RULE): {RULE} Attribs are Key / Value / Query means over the seeds "
                "past the paper's filter on the documents each cell averages. formation: the "
                "step the final position's Attrib reaches 0.5 / the step accuracy reaches "
                "halfway. cost: a group's total (main, other findings) counts each committed run "
                "once, in the first group that holds it; a sweep's row counts all its runs, some "
                "of which an earlier group may hold too.\n\n")


def numbers_table(items: list) -> str:
    lines = ["| id | ours | paper | verdict |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(item)} |" for item in items]) + "\n"
