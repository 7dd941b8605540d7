"""The paper's experiments: its sweeps of runs, and the table and figures made from their results.

mech.py trains and analyses one model of "Mechanistic evaluation of Transformers and state space
models" (arXiv 2505.15105). This script runs the paper's sweeps of such runs, each one a separate
`python mech.py ...` process, and draws the paper's figures from the finished runs:

    python figures/experiments.py --sweep ar-dconv --jobs 2   # Mamba d_conv 0..4 x 3 seeds, CPU
    python figures/experiments.py --sweep ar-dconv --steps 2000   # mech.py flags apply to every run
    python figures/experiments.py --sweep ar-main --scale paper --print-commands > jobs.txt
    python figures/experiments.py --collect sweeps/   # sweeps/results.json, summary.md, figures/
    python figures/experiments.py --collect figures/runs --figures-dir figures  # committed

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
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from hashlib import sha1

import matplotlib
matplotlib.use("Agg")  # figures are files: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, with mech.py
sys.path.insert(0, ROOT)
import mech  # noqa: E402

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
}
SCALES = ("cpu", "paper")
# the paper's filters for its mechanism plots, on p_clean - p_corrupted: below them a run's answer
# does not react enough to the corruption for its Attribs to mean anything
MIN_EFFECT = dict(ar=0.01, atr=0.1)


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
        grid = [dict(d_model=d, lr=lr) for d in WIDTHS for lr in lrs] if scale == "paper" else [{}]
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
                 seed="s")
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
    with open(os.path.join(out, "log.txt"), "a") as f:
        return subprocess.Popen(cmd + ["--threads", str(threads)], stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


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

def collect(root: str) -> list:
    """One record per finished run folder under root: its config, accuracy and main Attribs."""
    records = []
    for folder, _, files in sorted(os.walk(root)):
        if "metrics.json" not in files or "config.json" not in files:
            continue
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(folder, "metrics.json")) as f:
            m = json.load(f)
        rec = dict(cfg, folder=os.path.relpath(folder, root), accuracy=m["accuracy"],
                   dev_accuracy=m.get("dev_accuracy"), wall_time_s=m["wall_time_s"])
        if "interventions" in m:
            rows = m["interventions"]["rows"]
            first = next(r for r in rows if r["corrupted"] == "key")
            key = {(r["site"], r["layer"], r["position"]): r["attrib"]
                   for r in rows if r["corrupted"] == "key"}
            rec.update(attrib=m["interventions"]["main"], effect=first["p_clean"] - first["p_corr"],
                       conv={p: a for (site, layer, p), a in key.items()
                             if (site, layer) == ("conv_output", 0)},
                       # App. D.3 (ar_32_layers_attrib): which layer's mixer brings the answer to
                       # the Query
                       query_by_layer=[key.get(("mixer_output", l, "query"), float("nan"))
                                       for l in range(cfg["n_layer"])])
        records.append(rec)
    return records


def reacts(r: dict) -> bool:
    """Whether a run's answer reacts to the corruption enough for its Attribs to mean something."""
    return "attrib" in r and r["effect"] >= MIN_EFFECT[r["task"]]


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
        task = r["task"] + (f" {r['atr']}" if r["task"] == "atr" else "")
        model = r["arch"] + conv_variant(r) + pe_variant(r)
        by_row.setdefault((task, model, r["n_layer"], r["d_model"], r["lr"]), []).append(
            (dict(key), rs))
    rows = sorted(((columns + (told,), rs) for columns, same in by_row.items()
                   for told, (_, rs) in zip(told_apart([c for c, _ in same]), same)),
                  key=lambda row: row[0])
    lines = ["| task | model | layers | d | lr | seeds | accuracy "
             "| Attrib Key / Value / Query (seeds) |", "|---|---|---:|---:|---:|---:|---|---|"]
    for (task, model, n_layer, d, lr, told), rs in rows:
        lines.append(f"| {task} | {model}{told} | {n_layer} | {d} | {lr:g} | {len(rs)} "
                     f"| {accuracy_cell(rs)} | {attrib_cell(rs)} |")
    return "\n".join(lines)


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
    act = [r for r in rs if reacts(r)]
    if not act:
        return "- (0)"
    return (" / ".join(f"{np.mean([r['attrib'][p] for r in act]):.2f}"
                       for p in ("key", "value", "query")) + f" ({len(act)})")


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
#    hold no run for it) and returning the paths it wrote. Seeds are dots, their mean a bar.
# ─────────────────────────────────────────────────────────────────────────────────────────────

COLORS = {a: plt.get_cmap("tab10")(i) for i, a in enumerate(ARCHS)}  # one colour per architecture
# the positions whose Attribs the mechanism panels show, in colours C1, C2, C3
SHOWN = (("key", "s"), ("query", "^"), ("value", "o"))  # (position, marker)


def save(fig, out_dir: str, name: str) -> list:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    mech.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return [path]


def points(ax, x, ys, color, label=None, marker="o", width=0.3):
    """The seeds as dots at x, their mean as a bar."""
    ax.scatter([x] * len(ys), ys, color=color, s=14, alpha=0.6, marker=marker)
    ax.hlines(np.mean(ys), x - width, x + width, color=color, lw=2, label=label)


def guides(ax, vertical=False):
    """Dashed lines at Attrib 0 (the position restores nothing) and 1 (it restores the answer)."""
    for v in (0, 1):
        ax.axhline(v, color="grey", ls="--", lw=0.6)
        if vertical:
            ax.axvline(v, color="grey", ls="--", lw=0.6)


def square_legend(ax, entries):
    """A legend of coloured squares, [(label, colour)], for panels whose artists carry no label."""
    for label, color in entries:
        ax.plot([], [], "s", color=color, label=label)
    ax.legend(fontsize=7)


def at(position: str) -> str:
    return f"@{position.capitalize()}"


def layers_label(n: int) -> str:
    return f"{n} layer{'s' if n > 1 else ''}"


def best_accuracies(records: list) -> list:
    """The test accuracy of each seed (and width) at its best learning rate."""
    return [r["accuracy"] for g in best_over_lr(records, "arch").values() for r in g]


def main_variant(r: dict) -> bool:
    """Whether a run has the paper's position-embedding choice and no held-out label pairs: what
    the figures on convolutions hold fixed."""
    return not pe_variant(r) and not r.get("held_out")


def main_ar(records: list) -> list:
    """The runs of the paper's main AR results: 2 layers, its convolutions and PE choice."""
    return [r for r in records if r["task"] == "ar" and r["n_layer"] == 2
            and not conv_variant(r) + pe_variant(r)]


def ar_accuracy(records: list, out_dir: str) -> list:
    """§5.1 (ar_32): AR accuracy by architecture and width, each seed at its best learning rate."""
    best = best_over_lr(main_ar(records), "arch")
    if not best:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    widths = sorted({d for _, d in best})
    for i, arch in enumerate(ARCHS):
        groups = {d: [r["accuracy"] for r in rs] for (a, d), rs in best.items() if a == arch}
        if len(widths) == 1 and groups:  # one width (the CPU preset): one column per architecture
            points(ax, i, groups[widths[0]], COLORS[arch])
        elif groups:
            ds = sorted(groups)
            ax.plot(ds, [np.mean(groups[d]) for d in ds], "-o", color=COLORS[arch], label=arch,
                    ms=4)
            for d in ds:
                ax.scatter([d] * len(groups[d]), groups[d], color=COLORS[arch], s=10, alpha=0.5)
    if len(widths) == 1:
        ax.set_xticks(range(len(ARCHS)), ARCHS, rotation=45, fontsize=8)
        ax.set(xlabel=f"architecture (d = {widths[0]})")
    else:
        ax.set_xscale("log", base=2)
        ax.set(xlabel="model width d")
        ax.legend(fontsize=8)
    ax.set(ylabel="test accuracy (best learning rate)", ylim=(-0.02, 1.02),
           title="Associative Recall: accuracy by architecture (2 layers)")
    return save(fig, out_dir, "ar_accuracy.png")


def ar_mechanism(records: list, out_dir: str) -> list:
    """§5.1 (ar_32_diff): the main Attribs of every AR run whose answer reacts to the corruption,
    Attrib@Value against Attrib@Query and Attrib@Query against Attrib@Key."""
    analysed = [r for r in main_ar(records) if reacts(r)]
    if not analysed:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (x, y) in zip(axes, (("query", "value"), ("key", "query"))):
        for arch in ARCHS:
            rs = [r for r in analysed if r["arch"] == arch]
            if rs:
                ax.scatter([r["attrib"][x] for r in rs], [r["attrib"][y] for r in rs],
                           color=COLORS[arch], label=arch, s=18, alpha=0.8)
        guides(ax, vertical=True)
        ax.set(xlabel=f"Attrib{at(x)}", ylabel=f"Attrib{at(y)}", title=f"{at(y)} vs {at(x)}")
    axes[0].legend(fontsize=8)
    fig.suptitle("AR mechanism: where patching the last layer's input restores the answer "
                 "(Key corrupted)")
    return save(fig, out_dir, "ar_mechanism.png")


def mamba_dconv(records: list, out_dir: str) -> list:
    """Mamba's short-conv ablation, accuracy and mechanism by conv width: on AR (§5.4, mamba_ar_32
    and mamba_ar_box) and on ATR easy (arXiv 2505.15105v3: without the conv, induction)."""
    paths = []
    for task, name, title in (("ar", "ar_mamba_dconv.png", "AR"),
                              ("atr", "atr_mamba_dconv.png", "ATR easy")):
        rs = [r for r in records if r["task"] == task and r["arch"] == "mamba" and r["n_layer"] == 2
              and r.get("atr", "easy") == "easy" and main_variant(r)]
        widths = sorted({r["d_conv"] for r in rs})
        if len(widths) < 2:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        best = best_over_lr(rs, "d_conv")
        labelled = set()
        for k in widths:
            seeds = [r for (kk, _), group in best.items() if kk == k for r in group]
            points(axes[0], k, [r["accuracy"] for r in seeds], "C0")
            for j, (p, m) in enumerate(SHOWN):
                ys = [r["attrib"][p] for r in seeds if reacts(r)]
                if ys:
                    points(axes[1], k + 0.25 * (j - 1), ys, f"C{j + 1}",
                           None if p in labelled else at(p), m)  # one legend entry each
                    labelled.add(p)
        axes[0].set(xlabel="d_conv (0 = no convolution)", ylabel="test accuracy",
                    ylim=(-0.02, 1.02), title=f"Mamba on {title}: accuracy by short-conv width")
        axes[1].set(xlabel="d_conv", ylabel="Attrib (last layer's input, Key corrupted)",
                    title=f"Mamba on {title}: mechanism by short-conv width")
        if labelled:
            axes[1].legend(fontsize=8)
        else:
            axes[1].text(0.5, 0.5, "no run moved p(answer) enough to attribute", ha="center",
                         transform=axes[1].transAxes)
        for ax in axes:
            ax.set_xticks(widths)
        paths += save(fig, out_dir, name)
    return paths


def mamba_conv_restored(records: list, out_dir: str) -> list:
    """arXiv 2505.15105v3, Mamba's induction lives in its short convolution: the Attrib of patching
    layer 0's conv output at the Value and at Value+1, per task and conv width."""
    rs = [r for r in records if r["arch"] == "mamba" and r["n_layer"] == 2 and r.get("conv")
          and main_variant(r) and reacts(r)]
    if not rs:
        return []

    def setting(r):
        return r["task"].upper() + (f" {r['atr']}" if r["task"] == "atr" else ""), r["d_conv"]
    keys = sorted({setting(r) for r in rs})
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(keys)), 4))
    for i, key in enumerate(keys):
        for j, p in enumerate(("value", "value+1")):
            ys = [r["conv"][p] for r in rs if setting(r) == key]
            points(ax, i + 0.3 * j - 0.15, ys, f"C{j}", at(p) if i == 0 else None)
    ax.set_xticks(range(len(keys)), [f"{t}\nd_conv {k}" for t, k in keys], fontsize=8)
    ax.set(ylabel="Attrib of layer 0's conv output (Key corrupted)",
           title="Mamba: patching its short conv's output in layer 0")
    ax.legend(fontsize=8)
    return save(fig, out_dir, "mamba_conv_restored.png")


def based_conv(records: list, out_dir: str) -> list:
    """§5.4 (based_ar_32): Based on AR with its BaseConv kernel 1..4 or the implicit long conv."""
    rs = [r for r in records if r["task"] == "ar" and r["arch"] == "based" and r["n_layer"] == 2
          and main_variant(r)]

    def kind(r):
        return "long" if r["long_conv"] else r["d_conv"]
    kinds = sorted({kind(r) for r in rs}, key=str)
    if len(kinds) < 2:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, k in enumerate(kinds):
        points(ax, i, best_accuracies([r for r in rs if kind(r) == k]), "C0")
    ax.set_xticks(range(len(kinds)), [f"kernel {k}" if k != "long" else "long conv" for k in kinds])
    ax.set(ylabel="test accuracy", ylim=(-0.02, 1.02),
           title="Based on AR: its BaseConv layer's convolution")
    return save(fig, out_dir, "based_conv.png")


def depth_runs(records: list) -> tuple:
    """The AR runs with the paper's convolutions and position embeddings, and their depths, if they
    cover more than one depth (App. D.2/D.3); else nothing to draw."""
    rs = [r for r in records if r["task"] == "ar" and not conv_variant(r) + pe_variant(r)]
    layers = sorted({r["n_layer"] for r in rs})
    return (rs, layers) if len(layers) > 1 else ([], [])


def ar_layers(records: list, out_dir: str) -> list:
    """App. D.2 (ar_32_layers_with_3): AR accuracy by architecture and number of layers."""
    rs, layers = depth_runs(records)
    if not rs:
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    labelled = set()
    for i, arch in enumerate(ARCHS):
        for n in layers:
            ys = best_accuracies([r for r in rs if r["arch"] == arch and r["n_layer"] == n])
            if ys:
                points(ax, i + 0.25 * (n - 2), ys, f"C{n - 1}",
                       None if n in labelled else layers_label(n))  # one legend entry each
                labelled.add(n)
    ax.set_xticks(range(len(ARCHS)), ARCHS, fontsize=8)
    ax.set(xlabel="architecture", ylabel="test accuracy", ylim=(-0.02, 1.02),
           title="Associative Recall by depth")
    ax.legend(fontsize=8)
    return save(fig, out_dir, "ar_layers.png")


def ar_layers_attrib(records: list, out_dir: str) -> list:
    """App. D.3 (ar_32_layers_attrib): per layer, Attrib@Query of its mixer's output: the layer that
    fetches the answer to the Query scores 1, the layers before and after it 0."""
    rs, layers = depth_runs(records)
    analysed = [r for r in rs if r.get("query_by_layer") and reacts(r)]
    if not analysed:
        return []
    fig, axes = plt.subplots(1, len(layers), figsize=(4.5 * len(layers), 4), squeeze=False,
                             sharey=True)
    for ax, n in zip(axes[0], layers):
        for i, arch in enumerate(ARCHS):
            for l in range(n):
                ys = [r["query_by_layer"][l] for r in analysed
                      if r["arch"] == arch and r["n_layer"] == n]
                if ys:
                    points(ax, i + 0.25 * (l - (n - 1) / 2), ys, f"C{l}", width=0.1)
        square_legend(ax, [(f"layer {l}", f"C{l}") for l in range(n)])
        guides(ax)
        ax.set_xticks(range(len(ARCHS)), ARCHS, rotation=45, ha="right", fontsize=8)
        ax.set(title=layers_label(n), xlabel="architecture")
    axes[0][0].set(ylabel="Attrib@Query of the layer's mixer output")
    fig.suptitle("AR by depth: which layer brings the answer to the Query (Key corrupted)")
    return save(fig, out_dir, "ar_layers_attrib.png")


def atr_model(r: dict) -> str:
    """A model on ATR: a run with the other position-embedding choice (App. D.1, pos_embed, e.g.
    Attention NoPE) is a model of its own."""
    return r["arch"] + pe_variant(r)


def main_atr(records: list) -> tuple:
    """The runs of the paper's main ATR results (2 layers, its convolutions, no held-out label
    pairs), the ATR settings and the models they cover."""
    rs = [r for r in records if r["task"] == "atr" and r["n_layer"] == 2 and not conv_variant(r)
          and not r["held_out"]]
    settings = [s for s in mech.ATR_SETTINGS if any(r["atr"] == s for r in rs)]
    models = [a + v for a in ARCHS for v in ("", " PE", " NoPE")
              if any(atr_model(r) == a + v for r in rs)]
    return rs, settings, models


def setting_panels(settings: list):
    """One panel per ATR setting."""
    fig, axes = plt.subplots(1, len(settings), figsize=(max(6.5, 5 * len(settings)), 4.2),
                             squeeze=False)
    return fig, zip(axes[0], settings)


def atr_accuracy(records: list, out_dir: str) -> list:
    """§5.2 (atr): ATR accuracy by architecture, one panel per setting, each seed at its best
    learning rate."""
    rs, settings, models = main_atr(records)
    if not settings:
        return []
    # the paper's axis starts at 0.4; ours drops lower where a seed failed, rather than hide it
    bottom = min([0.3] + [r["accuracy"] - 0.03 for r in rs])
    fig, panels = setting_panels(settings)
    for ax, s in panels:
        for i, name in enumerate(models):
            ys = best_accuracies([r for r in rs if r["atr"] == s and atr_model(r) == name])
            if ys:
                points(ax, i, ys, COLORS[name.split()[0]])
        ax.set_xticks(range(len(models)), models, rotation=45, ha="right", fontsize=8)
        ax.set(ylabel="test accuracy", ylim=(bottom, 1.02), title=f"ATR {s}")
    fig.suptitle("Associative Treecall: accuracy by architecture (2 layers)")
    return save(fig, out_dir, "atr_accuracy.png")


def atr_mechanism(records: list, out_dir: str) -> list:
    """§5.2 (atr_box): the main Attribs of the ATR runs whose answer reacts to the corruption, as
    box plots where there are 3 seeds or more."""
    rs, settings, models = main_atr(records)
    if not settings:
        return []
    fig, panels = setting_panels(settings)
    for ax, s in panels:
        for i, name in enumerate(models):
            analysed = [r for r in rs if r["atr"] == s and atr_model(r) == name and reacts(r)]
            for j, (p, _) in enumerate(SHOWN):
                ys = [r["attrib"][p] for r in analysed]
                x = i + 0.25 * (j - 1)
                if len(ys) >= 3:
                    ax.boxplot([ys], positions=[x], widths=0.2, patch_artist=True, showfliers=False,
                               boxprops=dict(facecolor=f"C{j + 1}", alpha=0.5),
                               medianprops=dict(color="k"))
                ax.scatter([x] * len(ys), ys, color=f"C{j + 1}", s=14, zorder=3)
        square_legend(ax, [(at(p), f"C{j + 1}") for j, (p, _) in enumerate(SHOWN)])
        guides(ax)
        ax.set_xticks(range(len(models)), models, rotation=45, ha="right", fontsize=8)
        ax.set(ylabel="Attrib (last layer's input, Key corrupted)", title=f"ATR {s}")
    fig.suptitle("ATR mechanism: which position restores the answer")
    return save(fig, out_dir, "atr_mechanism.png")


FIGURES = (ar_accuracy, ar_mechanism, mamba_dconv, mamba_conv_restored, based_conv, ar_layers,
           ar_layers_attrib, atr_accuracy, atr_mechanism)


# what the figures compare runs by (their panels, columns and points); the other fields but the
# seed and the learning rate (which the figures take the best of) are the training protocol
COMPARED = ("task", "atr", "arch", "n_layer", "d_model", "d_conv", "long_conv", "pos_emb",
            "held_out")


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


def plot_figures(records: list, out_dir: str, log=print) -> list:
    """Draw every figure the records allow as PNGs in out_dir; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    records = one_protocol(records, log)
    return [path for figure in FIGURES for path in figure(records, out_dir)]


# ─────────────────────────────────────────────────────────────────────────────────────────────
# 4. Command line
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
    mech.write_json(os.path.join(root, "results.json"), records)
    table = summary_table(records)
    mech.write_text(os.path.join(root, "summary.md"), table + "\n")
    paths = plot_figures(records, figures_dir)
    print(f"{table}\n\n{len(records)} runs collected into {os.path.join(root, 'results.json')} "
          f"(table: {os.path.join(root, 'summary.md')}); figures: {', '.join(paths) or 'none'}")
    return records


def main(argv=None) -> list:
    """--sweep: run a sweep (or print its commands), then collect it; --collect DIR: collect DIR.
    Returns the collected records."""
    parser = build_parser()
    args, run_flags = parser.parse_known_args(argv)
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
