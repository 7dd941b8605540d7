"""The paper's experiments: its sweeps of runs, and the table and figures made from their results.

mech.py trains and analyses one model of "Mechanistic evaluation of Transformers and state space
models" (arXiv 2505.15105). This script runs the paper's sweeps of such runs, each one a separate
`python mech.py ...` process, and draws the paper's figures from the finished runs:

    python figures/experiments.py --sweep ar-dconv --jobs 2   # Mamba d_conv 0..4 x 3 seeds, CPU
    python figures/experiments.py --sweep ar-dconv --steps 2000   # mech.py flags apply to every run
    python figures/experiments.py --sweep ar-main --scale paper --print-commands > jobs.txt
    python figures/experiments.py --collect sweeps/   # sweeps/results.json, summary.md, figures/
    python figures/experiments.py --collect figures/runs/cpu_preset --figures-dir figures  # committed
    python figures/experiments.py --numbers figures/runs   # the report's numbers: runs/numbers.md

A sweep is a list of runs and a run is a list of mech.py's flags, so a sweep runs here in parallel
processes (--jobs), or anywhere else from the commands it prints (--print-commands, to be run from
the repository root): a SLURM array, GNU parallel, a cluster's queue. Runs are resumable: a run
folder that holds this very run finished is skipped, an interrupted one continues from its
checkpoint; mech.py flags given to the whole sweep add a hash of them to the run names, so that
such a sweep never takes another's folders for its own. A sweep that is stopped (Ctrl-C, SIGTERM,
SIGHUP) stops its runs at a checkpoint first: the same command resumes it. --collect reads every
run folder under a directory, whoever made it, writes DIR/results.json and DIR/summary.md (a row
per configuration, its seeds averaged) and draws the figures into DIR/figures; the committed
figures/*.png change only when asked for, with --figures-dir figures.
"""
import argparse
import collections
import contextlib
import dataclasses
import io
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from hashlib import sha1

import matplotlib
matplotlib.use("Agg")  # figures are files: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as transforms  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, with mech.py
sys.path.insert(0, ROOT)
import mech  # noqa: E402
from figures import plots  # noqa: E402

# ─────────────────────────────────────────────────────────────────────────────────────────────
# 1. Sweeps: the paper's runs, as mech.py command lines
# ─────────────────────────────────────────────────────────────────────────────────────────────

WIDTHS = (16, 32, 64, 128, 256)        # the paper's grid of d
LR5 = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)   # its learning rates
LR7 = LR5 + (1e-2, 3e-2)
ARCHS = tuple(mech.MIXERS)             # the paper's six, and DeltaNet (arXiv 2505.15105v3)

# sweep -> [(flags shared by a family of runs, the paper's learning rates for it)]. The paper's
# figures are named as in its code (aryamanarora/tinylang, notebooks/figs/ar_32.pdf etc.).
SWEEPS = {
    # §5.1, ar_32 and ar_32_diff: every architecture on AR (Attention with the position embedding
    # and LR5, as in the paper's PE sweep; the others NoPE with LR7)
    "ar-main": [(dict(task="ar", arch=a), LR5 if a == "attention" else LR7) for a in ARCHS],
    # §5.4, mamba_ar_32 and mamba_ar_box: Mamba's short convolution, width 0 (none) to 4
    "ar-dconv": [(dict(task="ar", arch="mamba", d_conv=k), LR7) for k in range(5)],
    # §5.4, based_ar_32: Based with its BaseConv kernel 1..4 or the long conv, and BaseConv with
    # long convs only
    "ar-based-conv": [(dict(task="ar", arch="based", d_conv=k), LR5) for k in (1, 2, 3, 4)]
                     + [(dict(task="ar", arch=a, long_conv=True), LR5)
                        for a in ("based", "base_conv")],
    # App. D.2/D.3, ar_32_layers_with_3 and ar_32_layers_attrib: depth. 2 layers are ar-main's runs
    # (the paper's 2-layer panel is ar_32); no 1-layer Based: its one layer would be a BaseConv
    # layer, the 1-layer BaseConv run
    "ar-layers": [(dict(task="ar", arch=a, n_layer=n), LR7) for n in (1, 3) for a in ARCHS
                  if (a, n) != ("based", 1)],
    # §5.2, atr and atr_box: the three ATR settings
    "atr-main": [(dict(task="atr", atr=s, arch=a), LR5) for s in mech.ATR_SETTINGS for a in ARCHS],
    # the abstract of arXiv 2505.15105v3: Mamba learns attention-like induction on ATR when its
    # short convolutions are removed; d_conv 0..4 on ATR easy
    "atr-mamba-dconv": [(dict(task="atr", atr="easy", arch="mamba", d_conv=k), LR7)
                        for k in range(5)],
    # App. D.1, pos_embed: Attention without its position embedding on ATR (the others are NoPE in
    # atr-main already)
    "atr-attention-nope": [(dict(task="atr", atr=s, arch="attention", pos_emb=False), LR5)
                           for s in ("easy", "medium")],
    # App. D.1, pos_embed: every architecture with the other position-embedding choice than its
    # main results' (Attention NoPE, the others PE) on AR and ATR easy and medium; LR5
    "pos-embed": [(dict(task=t, **where, arch=a, pos_emb=a != "attention"), LR5)
                  for t, where in (("ar", {}), ("atr", dict(atr="easy")),
                                   ("atr", dict(atr="medium")))
                  for a in ARCHS],
    # App. D.2, atr_layers: every architecture with one layer on ATR easy (2 layers: atr-main's);
    # no 1-layer Based, its one layer would be a BaseConv layer (the paper's equal series)
    "atr-layers": [(dict(task="atr", atr="easy", arch=a, n_layer=1), LR5) for a in ARCHS
                   if a != "based"],
    # §5.3, atr_gen and atr_gen_box: 20 % of the (parent, query) label pairs held out of training;
    # 1, 2 and 3 layers; each seed's learning rate chosen on dev accuracy (CPU_LRS at CPU scale)
    "atr-gen": [(dict(task="atr", atr="easy", held_out=0.2, arch=a, n_layer=n), LR5)
                for n in (1, 2, 3) for a in ARCHS if (a, n) != ("based", 1)],
    # App. D.4, multihop: the query's rightmost sibling (itself in 67.5 % of documents); 1-3 layers
    "atr-sibling": [(dict(task="atr", atr="easy", atr_query="sibling", arch=a, n_layer=n), LR5)
                    for n in (1, 2, 3) for a in ARCHS if (a, n) != ("based", 1)],
}
# the learning rates a sweep tries at CPU scale (the others take the preset's one): where the paper
# chooses the rate on dev accuracy, the CPU sweep needs a choice too
CPU_LRS = {"atr-gen": (3e-4, 1e-3, 3e-3)}
SCALES = ("cpu", "paper")
# the paper's filters for its mechanism plots, on p_clean - p_corrupted: below them a run's answer
# does not react enough to the corruption for its Attribs to mean anything
MIN_EFFECT = mech.PAPER_FILTER


def sweep_runs(sweep: str, scale: str, seeds: int, overrides=None) -> list:
    """[(run name, flags)] of a sweep. scale "paper": every (d, lr) of the paper's grid with the
    paper protocol (its one seed, 42, or more with seeds > 1); scale "cpu": the calibrated CPU
    preset (its d and lr) with seeds 42, 43, ...; overrides: the Config fields that mech.py flags
    given to the whole sweep set (see sweep_overrides), which the run names then tell apart."""
    if sweep not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep!r}; choose from {', '.join(SWEEPS)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    runs = []
    for flags, lrs in SWEEPS[sweep]:
        grid = ([dict(d_model=d, lr=lr) for d in WIDTHS for lr in lrs] if scale == "paper"
                else [dict(lr=lr) for lr in CPU_LRS.get(sweep, ())] or [{}])
        for point in grid:
            for seed in range(42, 42 + seeds):
                run = dict(preset=scale, **flags, **point, seed=seed)
                runs.append((run_name(run, overrides), run))
    return runs


def run_name(run: dict, overrides=None) -> str:
    """A run's folder name, its flags' values in order: e.g. ar_mamba_dconv0_s42; with overrides,
    a hash of them too (ar_mamba_dconv0_s42_x3f9a1c2e), so that a sweep with --steps 1500 never
    takes the plain sweep's folders for its own, nor the plain sweep its."""
    short = dict(d_conv="dconv", n_layer="layers", d_model="d", long_conv="long", pos_emb="pe",
                 held_out="heldout", lr="lr", seed="s")
    parts = [(short[k] if v else "no" + short[k]) if isinstance(v, bool)
             else f"{short.get(k, '')}{v}" for k, v in run.items() if k != "preset"]
    if overrides:
        parts.append("x" + sha1(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8])
    return "_".join(p for p in parts if p)


def run_args(run: dict) -> list:
    """The command-line arguments of a run: dict(arch="mamba", d_conv=0, long_conv=True) ->
    ["--arch", "mamba", "--dconv", "0", "--long-conv"]."""
    flags = {f.name: f.metadata["flag"] or "--" + f.name.replace("_", "-")
             for f in dataclasses.fields(mech.Config)}
    flags["preset"] = "--preset"
    args = []
    for k, v in run.items():
        if isinstance(v, bool):
            args.append(flags[k] if v else "--no-" + flags[k][2:])
        else:
            args += [flags[k], f"{v:g}" if isinstance(v, float) else str(v)]
    return args


def run_parser(prog: str) -> mech.Parser:
    """mech.py's parser, its one-line errors naming prog (the script that was run)."""
    parser = mech.build_parser()
    parser.prog = prog
    return parser


def sweep_overrides(extra, prog: str = "mech.py") -> dict:
    """The Config fields that the mech.py flags given to a whole sweep set: ["--steps", "1500",
    "--force"] -> {"steps": 1500}; flags that do not change what is trained (--force, --device)
    leave the run names alone. An error if mech.py refuses a flag, or for --out."""
    args = run_parser(prog).parse_args(list(extra))
    if args.out is not None:
        raise ValueError("--out: each run's folder is <sweep dir>/<run name>; "
                         "choose the sweep dir with --sweep-dir")
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(mech.Config)
            if hasattr(args, f.name)}


def run_config(run: dict, extra=(), prog: str = "mech.py") -> mech.Config:
    """The configuration mech.py makes of a run's flags followed by the sweep's (ValueError if it
    refuses them)."""
    return mech.config_from_args(run_parser(prog).parse_args(run_args(run) + list(extra)))


def run_command(run: dict, out: str, python: str = "python", script: str = "mech.py",
                extra=()) -> list:
    """A run's command line; extra: mech.py flags given to the whole sweep (after the run's own
    flags, so they override them)."""
    return [python, script, *run_args(run), *extra, "--out", out, "--quiet"]


def finished(folder: str, cfg: mech.Config) -> bool:
    """Whether folder holds the run of cfg, finished: a metrics.json beside a config.json of the
    same run (mech.identity), not merely a run of the same name."""
    if not os.path.exists(os.path.join(folder, "metrics.json")):
        return False
    try:
        return mech.identity(mech.stored_config(folder)) == mech.identity(cfg)
    except (mech.RunError, OSError):  # damaged, foreign or missing: mech.py will say which
        return False


# SIGTERM (a scheduler), SIGINT (Ctrl-C), SIGHUP (the terminal closed): the sweep stops its runs
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(Exception):
    """The sweep was told to stop by a signal."""
    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_requests():
    """A list that the STOP_SIGNALS append to: the sweep stops where it chooses, never between
    starting a run and noting it down (a run it does not know of would outlive it)."""
    stop = []
    main = threading.current_thread() is threading.main_thread()  # the only one signals reach
    # a signal ignored already stays so: under nohup, a closed terminal does not stop the sweep
    old = {s: signal.signal(s, lambda signum, _: stop.append(signum)) for s in STOP_SIGNALS
           if main and signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run_sweep(runs: list, root: str, jobs: int, extra=(), log=print) -> list:
    """Run the runs that are not finished (see `finished`) in `jobs` local processes, splitting the
    CPU threads between them; each process writes its output to <run folder>/log.txt. Returns the
    folders of the runs that failed. On a STOP_SIGNAL (then Stopped) or any error, the runs still
    going are stopped at a checkpoint first, so that none outlives the sweep: a sweep started again
    would otherwise run the same folders at the same time."""
    todo = [(name, run) for name, run in runs
            if not finished(os.path.join(root, name), run_config(run, extra))]
    log(f"{len(runs) - len(todo)} of {len(runs)} runs already done; "
        f"running {len(todo)} in {jobs} processes")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    running, failed = {}, []  # running: {process: its run folder}
    with stop_requests() as stop:
        try:
            while todo or running:
                if stop:
                    raise Stopped(stop[0])
                while todo and len(running) < jobs:
                    name, run = todo.pop(0)
                    out = os.path.join(root, name)
                    running[start_run(run, out, extra, threads)] = out
                time.sleep(0.1)
                failed += ended_runs(running, log)
        except BaseException:
            stop_runs(list(running))  # signals that come meanwhile are noted, not obeyed
            raise
    return failed


def start_run(run: dict, out: str, extra, threads: int) -> subprocess.Popen:
    """Start a run's process, its output appended to out/log.txt. It gets a process group of its
    own: a Ctrl-C in the terminal reaches the sweep only, which then stops every run the same way
    (stop_runs), each with the processes it may have started."""
    os.makedirs(out, exist_ok=True)
    cmd = run_command(run, out, sys.executable, os.path.join(ROOT, "mech.py"), extra)
    if not any(a == "--threads" or a.startswith("--threads=") for a in extra):  # else: the user's
        cmd += ["--threads", str(threads)]
    with open(os.path.join(out, "log.txt"), "a") as f:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def ended_runs(running: dict, log) -> list:
    """Take the runs that have ended out of running ({process: run folder}), each reported in one
    line; returns the folders of those that failed."""
    failed = []
    for proc in [p for p in running if p.poll() is not None]:
        out = running.pop(proc)
        code = proc.returncode
        log(f"{f'FAILED (exit {code}, see {out}/log.txt)' if code else 'done'}: "
            f"{shlex.join(proc.args[1:])}")
        if code:
            failed.append(out)
    return failed


def stop_runs(procs: list, grace_s: float = 30) -> None:
    """Stop runs as mech.py stops on SIGTERM (it saves a checkpoint, exit code 130), killing those
    still there after grace_s seconds."""
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.time() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # its group has ended already
        os.killpg(proc.pid, sig)


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 2. Collecting: one record per finished run, and the summary table
# ─────────────────────────────────────────────────────────────────────────────────────────────

def collect(root: str, log=print) -> list:
    """One record per finished run folder under root: its config, accuracy and main Attribs. A
    folder whose files are damaged or not a run of mech.py is skipped, in one line that names it."""
    records = []
    for folder, _, files in sorted(os.walk(root)):
        if "metrics.json" not in files or "config.json" not in files:
            continue
        try:
            records.append(record(folder, root))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            log(f"skipped {folder}: not a finished run of this mech.py ({type(e).__name__}: {e})")
    return records


def record(folder: str, root: str) -> dict:
    """A run folder's record (KeyError, ValueError, ... if its files are not a run's)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(folder, "metrics.json")) as f:
        m = json.load(f)
    rec = dict(cfg, folder=os.path.relpath(folder, root), accuracy=m["accuracy"],
               dev_accuracy=m.get("dev_accuracy"), wall_time_s=m["wall_time_s"])
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
    Attribs are recomputed from the rows with mech.main_setting rather than read from the stored
    "main", so that runs analysed by an older mech.py get today's reading (in a 1-layer model the
    layer's own mixer output, not the embedding, where patching the Key undoes the corruption)."""
    rows = interventions["rows"]
    key = {(r["site"], r["layer"], r["position"]): r for r in rows if r["corrupted"] == "key"}
    conv = {p: r for (site, layer, p), r in key.items() if (site, layer) == ("conv_output", 0)}
    main = {p: r for (site, layer, p), r in key.items() if (site, layer) == mech.main_site(n_layer)}
    return dict(attrib=mech.main_setting(rows, n_layer),
                # the Key's effect over the documents each main cell averages: in the sibling task
                # the Key and Value cells average only those where the two are distinct positions,
                # so their filter must be read there, not over all documents
                effects={p: r["p_clean"] - r["p_corr"] for p, r in main.items()},
                # deeper models: the second layer's input too, where a 2-layer model's last reads
                attrib_second=mech.main_setting(rows, n_layer, 1) if n_layer > 2 else None,
                effect=mech.key_effect(rows),  # over all documents
                conv={p: r["attrib"] for p, r in conv.items()},
                # how many documents each conv cell averages; None: an older analysis, over all
                # of them, Value+1 included where it is the divider (42-48 % of ATR documents)
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


# the Config fields, which a record holds (those its mech.py knew of) beside its results
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(mech.Config))


def configuration(r: dict) -> dict:
    """A record's run as mech.py tells runs apart (mech.identity): fields that an older mech.py did
    not write take their defaults; a record that makes no Config keeps its own fields."""
    fields = {k: r[k] for k in CONFIG_FIELDS if k in r}
    try:
        return mech.identity(mech.Config(**fields))
    except (TypeError, ValueError):
        return fields


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
    notes = ["", "Attrib: the main setting (mech.main_setting: Key corrupted, the last layer's "
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
                     "Value+1 included where it is the divider (42-48 % of ATR documents, AR's "
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
    default = mech.DEFAULT_DCONV.get(r["arch"]) if r["arch"] != "base_conv" else None
    return "" if r["d_conv"] == default else f" d_conv {r['d_conv']}"


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


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 3. Figures: one function per figure, each drawing what the records allow (nothing if they
#    hold no run for it) and returning the paths it wrote. Each stands alone: a title, axes
#    labelled, a caption with our scale (read off the runs drawn) and the filter applied, every
#    run a marker of its own, and the paper's number beside ours wherever the paper has one.
# ─────────────────────────────────────────────────────────────────────────────────────────────

# The paper's numbers (arXiv 2505.15105, one seed each), read off its figure files in the
# official repository aryamanarora/tinylang, folder notebooks/figs/, named below with the
# paper's section. Accuracies: the final test accuracy at d = 16, 32, 64, 128, 256 (WIDTHS), the
# best over the paper's learning rates. Attribs: the median over the paper's runs (every width
# and learning rate) that pass its filter (MIN_EFFECT), Key corrupted, at the last layer's input;
# 0.0 and 1.0 are clusters the figure shows at 0 and 1. None: the paper has no number there
# (DeltaNet, added in v3, has figures without numbers; in an Attrib table, no run passed).
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
    fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))
    fig.text(0.01, (extra - 0.1) / (height + extra), text, fontsize=8, va="top", ha="left")
    path = os.path.join(out_dir, name)
    png = io.BytesIO()
    fig.savefig(png, dpi=120, format="png")
    mech.atomic_write(path, png.getvalue())
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
            elif col.runs:  # the column has runs, this series none
                empty_label(ax, x, "not run")
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


# ── which runs a figure draws ─────────────────────────────────────────────────────────────────

def at(position: str) -> str:
    return f"@{position.capitalize()}"


def layers_label(n: int) -> str:
    return f"{n} layer{'s' if n > 1 else ''}"


def best_runs(runs: list) -> list:
    """The run of each seed (and configuration) at its best learning rate."""
    return [r for group in best_over_lr(runs, "arch").values() for r in group]


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
    # an older analysis averaged Value+1 over all documents, the divider's position in 42-48 %
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
        "all documents (an older analysis, grey: in ATR Value+1 is the divider in 42-48 % of "
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
                 line=None) -> list:
    """A figure of accuracy by architecture and depth (depth_panel), beside the paper's; line:
    (y, its label, its caption) of a dashed reference line, if any."""
    layers = sorted({r["n_layer"] for r in rs})
    fig, ax = plt.subplots(figsize=(11, 3.6))
    columns, series = depth_panel(ax, rs, layers, paper)
    legend(ax, series, BEST_LABEL, [dashed(ax, *line[:2])] if line else ())
    fig.suptitle(title)
    return save(fig, out_dir, name, [MARKS, scale_note(rs),
                                     paper_note(source, paper_best(rs), [("", columns)])]
                + not_run_note(columns, series, sweep) + ([line[2]] if line else []))


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


def atr_model(r: dict) -> str:
    """A model on ATR: a run with the other position-embedding choice (App. D.1, pos_embed, e.g.
    Attention NoPE) is a model of its own."""
    return r["arch"] + pe_variant(r)


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
        baseline = dashed(ax, PAPER["atr_copy_next_token"][s], COPY_NEXT_TOKEN)
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
    baselines = ", ".join(f"{s} {PAPER['atr_copy_next_token'][s]}" for s in settings)
    return (f"Dashed: the copy-next-token baseline ({baselines}): answering with the token after "
            "the Query's last earlier occurrence, measured on the official ATR generator's "
            "documents; a model must beat it to have learned anything of the tree.")


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
        (PAPER["atr_copy_next_token"]["easy"], COPY_NEXT_TOKEN, copy_next_token_note(["easy"])))


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
         f"scores: the Query is its own rightmost sibling in {copy:.1%} of documents."))


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


# ── the mechanism while it forms (curves of the runs watched while they trained) ─────────────────

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
    and Mamba's conv at Value+1), the step it first passes 0.5 with the Key's effect past the
    filter, and the step accuracy passes halfway from its first evaluation to its final value
    (plots.moments), and which comes first."""
    lines = ["| model | seed | lr | Attrib | passes 0.5 at | accuracy passes halfway at | "
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
                if (formed := moments_of(r, name)["mechanism"]) is not None:
                    ax.plot(formed, 0.5, marker="^", color=color, ms=7, mfc="none")
            if (rises := moments_of(r, None)["accuracy"]) is not None:
                half = (accuracy[0] + accuracy[-1]) / 2
                ax.plot(rises, half, marker="o", color="k", ms=6, mfc="none")
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
                    label="an Attrib passes 0.5: the mechanism has formed"),
             Line2D([], [], ls="none", marker="o", color="k", mfc="none",
                    label="accuracy passes halfway from its first to its final value")]
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
        "the first evaluation where that Attrib passes 0.5 with the Key mattering. Which comes "
        "first, in steps: runs/cpu_preset/summary.md.", scale_note(runs)])


def mixed_note(runs: list) -> str:
    """The runs drawn whose final Attribs name no verdict (mech.dominant): which, and at what."""
    return "; ".join(f"{r['task'].upper()} {r['arch']} d_conv {r['d_conv']} seed {r['seed']} ends "
                     "mixed (Key / Value / Query " + " / ".join(f"{r['attrib'][p]:.2f}" for p in
                                                             ("key", "value", "query"))
                     + f", followed at @{final_position(r).capitalize()})"
                     for r in runs if reacts(r) and mech.dominant(r["attrib"]) is None)


FIGURES = (ar_accuracy, ar_mechanism, mamba_dconv, mamba_conv_restored, based_conv, ar_layers,
           ar_layers_attrib, atr_accuracy, atr_mechanism, pos_embed, atr_layers, atr_gen,
           atr_sibling, mechanism_dynamics)


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


def plot_figures(records: list, out_dir: str, log=print) -> list:
    """Draw every figure the records allow as PNGs in out_dir; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    records = one_width(one_protocol(records, log), log)
    return [path for figure in FIGURES for path in figure(records, out_dir)]


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 4. The report's numbers: recounted from the committed runs into one generated table, which
#    figures/README.md and README.md quote (tests/test_report_numbers.py checks both ways)
# ─────────────────────────────────────────────────────────────────────────────────────────────

# The verdict rule of the report, made a rule a reader can recount. Size: a mean accuracy within
# ACC_SIZE of the paper's number at d = 64 (its best learning rate, one seed); each mean Attrib
# within ATTRIB_SIZE of the paper's median (pooled over all its widths and rates). Direction: an
# accuracy on the same side as the paper's of the task's line between learning and not (AR: 0.5;
# ATR: the copy-next-token baseline; the sibling task: copying the Query); a mechanism of the same
# class as the paper's (induction: the Value's Attrib is the largest of Key, Value and Query;
# retrieval: the Key's or the Query's is).
ACC_SIZE = 0.05
ATTRIB_SIZE = 0.1
POSITIONS3 = ("key", "value", "query")
MAIN_SWEEPS = ("ar-main", "ar-dconv", "ar-based-conv", "ar-layers", "atr-main", "atr-mamba-dconv",
               "atr-attention-nope")
OTHER_SWEEPS = ("pos-embed", "atr-layers", "atr-gen", "atr-sibling")


def label(direction: bool, size: bool) -> str:
    return "reproduced" if direction and size else "direction only" if direction \
        else "not reproduced"


def mean_sd(values) -> str:
    values = list(values)
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def passing_means(runs: list) -> dict:
    """Key / Value / Query means over the runs past the filter at each cell (attrib_cell's)."""
    means = {}
    for p in POSITIONS3:
        act = [r["attrib"][p] for r in runs if reacts_at(r, p)]
        means[p] = float(np.mean(act)) if act else float("nan")
    return means


def attribs_text(means: dict) -> str:
    return " / ".join(f"{means[p]:.2f}" for p in POSITIONS3)


def mechanism_class(a: dict) -> str:
    return "induction" if max(POSITIONS3, key=lambda p: a.get(p, -9)) == "value" else "retrieval"


def accuracy_item(name: str, runs: list, paper: float, line: float) -> tuple:
    ours = np.mean([r["accuracy"] for r in runs])
    return (name, mean_sd(r["accuracy"] for r in runs), f"{paper:.3f}",
            label((ours > line) == (paper > line), abs(ours - paper) <= ACC_SIZE))


def mechanism_item(name: str, runs: list, paper: dict) -> tuple:
    ours = passing_means(runs)
    size = all(abs(ours[p] - paper[p]) <= ATTRIB_SIZE for p in POSITIONS3)
    return (name, attribs_text(ours), attribs_text(paper),
            label(mechanism_class(ours) == mechanism_class(paper), size))


def report_numbers(runs_root: str, cpu=None) -> list:
    """[(id, ours, paper, verdict)] of the report's headline numbers and verdicts, recounted from
    runs_root/cpu_preset (or its records, cpu, if collected already) and runs_root/paper_protocol
    by the rule above ("-": none)."""
    cpu = cpu if cpu is not None else collect(os.path.join(runs_root, "cpu_preset"))
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
    for k in range(5):
        runs = [r for r in group(cpu, task="ar", arch="mamba", n_layer=2, d_conv=k)
                if main_variant(r)]
        items.append(accuracy_item(f"C4 AR mamba d_conv {k}", runs,
                                   at64(PAPER["ar_mamba_dconv"][k]), 0.5))
    # C5: the conv at Value+1 carries the association (>= 0.9) in how many Mamba AR runs
    conv_runs = [r for r in ar if r["arch"] == "mamba"] + [
        r for r in pp if r["task"] == "ar" and r["arch"] == "mamba" and reacts(r)]
    carried = [r for r in conv_runs if r["conv"].get("value+1", 0) >= 0.9]
    items.append(("C5 conv_output[0] @Value+1 >= 0.9", f"{len(carried)} of {len(conv_runs)} runs",
                  "-", "partly" if 0 < len(carried) < len(conv_runs) else
                  "reproduced" if carried else "not reproduced"))
    atr, _, models = main_atr(cpu)
    for s in mech.ATR_SETTINGS:
        for m in models:
            runs = [r for r in atr if r["atr"] == s and atr_model(r) == m]
            if runs and (paper := PAPER["atr_accuracy"].get((s, m))) is not None:
                items.append(accuracy_item(f"C6 ATR {s} {m}", runs, at64(paper),
                                           PAPER["atr_copy_next_token"][s]))
            if any(map(reacts, runs)) and (paper := PAPER["atr_mechanism"].get((s, m))):
                items.append(mechanism_item(f"C6 ATR {s} {m} Attribs", runs, paper))
    # C7: Mamba without its conv on ATR easy, @Value against v3's "≈ 1"
    claim = PAPER["atr_mamba_dconv_claim"][0]
    for name, runs in (("CPU preset", group(cpu, task="atr", arch="mamba", d_conv=0)),
                       ("paper protocol lr 3e-3", group(pp, task="atr", arch="mamba", d_conv=0,
                                                        lr=3e-3))):
        means = passing_means(runs)
        items.append((f"C7 ATR easy mamba d_conv 0 @Value, {name}", f"{means['value']:.2f}",
                      f"≈ {claim:g}", label(mechanism_class(means) == "induction",
                                            abs(means["value"] - claim) <= ATTRIB_SIZE)))
    # the three scales: Attention (PE) on ATR easy under the paper's protocol at its best rate
    runs = group(pp, task="atr", atr="easy", arch="attention", lr=1e-3)
    items.append(accuracy_item("C6 ATR easy attention, paper protocol", runs,
                               at64(PAPER["atr_accuracy"]["easy", "attention"]),
                               PAPER["atr_copy_next_token"]["easy"]))
    # App. D.1: Attention without its position embedding on ATR, and its gap to PE
    for s in ("easy", "medium"):
        nope = [r for r in atr if r["atr"] == s and atr_model(r) == "attention NoPE"]
        pe = [r for r in atr if r["atr"] == s and atr_model(r) == "attention"]
        paper = PAPER["pos_embed"]
        gap = np.mean([r["accuracy"] for r in pe]) - np.mean([r["accuracy"] for r in nope])
        paper_gap = at64(paper[s, "attention", "PE"]) - at64(paper[s, "attention", "NoPE"])
        items.append((f"D.1 ATR {s} attention PE - NoPE", f"{gap:+.3f}", f"{paper_gap:+.3f}",
                      label(gap * paper_gap > 0, abs(gap - paper_gap) <= ACC_SIZE)))
    # App. D.2: one layer on ATR easy
    for a in ARCHS:
        runs = [r for r in group(cpu, task="atr", atr="easy", arch=a, n_layer=1)
                if main_variant(r)]
        if runs and (paper := PAPER["atr_layers"].get(a)) is not None:
            items.append(accuracy_item(f"D.2 ATR easy 1 layer {a}", runs, at64(paper),
                                       PAPER["atr_copy_next_token"]["easy"]))
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
    # what the CPU runs cost: runs and run-minutes per sweep, each committed run counted once
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
    return items


NUMBERS_HEAD = ("# The report's numbers and verdicts, recounted from the runs\n\n"
                "Generated by `python figures/experiments.py --numbers figures/runs` "
                "(experiments.report_numbers); do not edit. Verdict rule: size holds where a "
                f"mean accuracy is within {ACC_SIZE} of the paper's at d = 64 and each mean "
                f"Attrib within {ATTRIB_SIZE} of the paper's median (pooled over all its widths "
                "and learning rates); direction holds where the accuracy lies on the paper's side "
                "of the task's line (AR 0.5, ATR the copy-next-token baseline, the sibling task "
                "copying the Query; held out: test at least 0.2 below dev) and the mechanism is "
                "of the paper's class (induction: the Value's Attrib the largest; retrieval: the "
                "Key's or the Query's). Attribs are Key / Value / Query means over the seeds past "
                "the paper's filter on the documents each cell averages. formation: the step the "
                "final position's Attrib passes 0.5 / the step accuracy passes halfway. cost: "
                "each committed run counted once, in the first sweep that holds it.\n\n")


def numbers_table(items: list) -> str:
    lines = ["| id | ours | paper | verdict |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(item)} |" for item in items]) + "\n"


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 5. Command line
# ─────────────────────────────────────────────────────────────────────────────────────────────

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse would print the whole usage first)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    # no abbreviations: mech.py's --seed must pass through to the runs, not be taken for --seeds
    p = Parser(prog="experiments.py", allow_abbrev=False,
               description="Run a sweep of the paper's runs, or collect finished runs into a table "
               "and figures. Any other flag is mech.py's (python mech.py --help) and applies to "
               "every run of the sweep.")
    p.add_argument("--sweep", help="the sweep: " + ", ".join(SWEEPS))
    p.add_argument("--scale", default="cpu",
                   help="cpu (the calibrated CPU presets; default) or paper (its grid, protocol)")
    p.add_argument("--seeds", type=int,
                   help="seeds per run (default: 3 at scale cpu, 1 at scale paper)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at a time, in local processes sharing the CPU threads (default: 1)")
    p.add_argument("--print-commands", action="store_true",
                   help="print one command per run (for a scheduler) instead of running them")
    p.add_argument("--sweep-dir",
                   help="where the sweep's run folders go (default: sweeps/<sweep>-<scale>)")
    p.add_argument("--collect", metavar="DIR", help="gather the finished runs under DIR into "
                   "DIR/results.json and DIR/summary.md and draw the figures (with --sweep: DIR "
                   "instead of the sweep's directory)")
    p.add_argument("--numbers", metavar="DIR", help="recount the report's numbers and verdicts "
                   "from DIR/cpu_preset and DIR/paper_protocol into DIR/numbers.md (the committed "
                   "ones: --numbers figures/runs)")
    p.add_argument("--figures-dir", help="where the figures go (default: DIR/figures of the "
                   "collected DIR; the committed ones: figures)")
    return p


def checked_runs(args, run_flags: list, parser: Parser) -> list:
    """The sweep's runs, each checked as mech.py will read it (with the flags given to the whole
    sweep), so that a bad value fails here, once, rather than in every job."""
    try:
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        seeds = args.seeds if args.seeds is not None else 3 if args.scale == "cpu" else 1
        overrides = sweep_overrides(run_flags, parser.prog)
        runs = sweep_runs(args.sweep, args.scale, seeds, overrides)
        per_run = sorted({k for _, run in runs for k in run} & set(overrides))
        if per_run:  # a run's folder is named by these: an override would belie the name
            flags = ", ".join("--" + k.replace("_", "-") for k in per_run)
            raise ValueError(f"{flags}: the sweep sets this per run and names the run folders by "
                             "it" + ("; give --seeds N for seeds 42, 43, ..." if "seed" in per_run
                                     else ""))
        for _, run in runs:
            run_config(run, run_flags, parser.prog)
    except ValueError as e:
        parser.error(str(e))
    return runs


def sweep_or_exit(runs: list, root: str, jobs: int, run_flags: list, parser: Parser) -> None:
    """Run a sweep; if it stops short, say so in one line and how to go on (exit code 1, or 128 +
    the signal's number, as a shell reports a process that a signal ended)."""
    resume = "the same command resumes the sweep"
    try:
        failed = run_sweep(runs, root, jobs, run_flags)
    except Stopped as e:
        parser.exit(128 + e.signum, f"{parser.prog}: {e}, and its runs with it; {resume}\n")
    except Exception as e:  # its runs are stopped; one line, as for a failed run
        parser.exit(1, f"{parser.prog}: error: {type(e).__name__}: {e}; {resume}\n")
    if failed:
        parser.exit(1, f"{parser.prog}: {len(failed)} of {len(runs)} runs failed, each named "
                    "above with its log.txt; the same command retries them, and with --force (a "
                    "mech.py flag) starts over those whose folder holds another configuration\n")


def collect_and_draw(root: str, figures_dir: str, parser: Parser) -> list:
    """results.json, summary.md (also printed) and the figures of the finished runs under root."""
    if not os.path.isdir(root):
        parser.error(f"--collect {root}: no such directory")
    records = collect(root)
    table = "\n\n".join(filter(None, (summary_table(records), dynamics_table(records))))
    try:
        mech.write_json(os.path.join(root, "results.json"), records)
        mech.atomic_write(os.path.join(root, "summary.md"), table + "\n")
        paths = plot_figures(records, figures_dir)
    except (OSError, mech.RunError) as e:  # a read-only or full directory
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(f"{table}\n\n{len(records)} runs collected into {os.path.join(root, 'results.json')} "
          f"(table: {os.path.join(root, 'summary.md')}); figures: {', '.join(paths) or 'none'}")
    return records


def main(argv=None) -> list:
    """--sweep: run a sweep (or print its commands), then collect it; --collect DIR: collect DIR.
    Returns the collected records."""
    parser = build_parser()
    args, run_flags = parser.parse_known_args(argv)
    if args.numbers:
        table = numbers_table(report_numbers(args.numbers))
        mech.atomic_write(os.path.join(args.numbers, "numbers.md"), NUMBERS_HEAD + table)
        print(table)
        if not args.sweep and not args.collect:
            return []
    if not args.sweep and not args.collect:
        parser.error("give --sweep NAME (to run a sweep) or --collect DIR (to collect its runs)")
    if run_flags and not args.sweep:
        parser.error(f"unrecognized arguments: {' '.join(run_flags)} "
                     "(mech.py's flags go with --sweep)")
    if args.sweep:
        runs = checked_runs(args, run_flags, parser)
        root = args.sweep_dir or os.path.join("sweeps", f"{args.sweep}-{args.scale}")
        if args.print_commands:
            for name, run in runs:
                print(shlex.join(run_command(run, os.path.join(root, name), extra=run_flags)))
            return []
        sweep_or_exit(runs, root, args.jobs, run_flags, parser)
    root = args.collect or root  # --collect DIR, or the sweep just run
    return collect_and_draw(root, args.figures_dir or os.path.join(root, "figures"), parser)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # output piped into a reader that stopped early (`| head`): no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
