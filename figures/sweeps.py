"""The paper's sweeps of runs: each run a list of mech.py's flags, its folder's name, its command
line, and a sweep run in local processes that stop at a checkpoint when the sweep is stopped.
figures/experiments.py is the command line (--sweep, --print-commands)."""
import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from hashlib import sha1

import mech

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
    # your own mixer, registered in mech.MIXERS: the architecture is the whole sweep's (mech.py's
    # --arch, given to the sweep) on AR and ATR easy
    "mixer": [(dict(task="ar"), LR5), (dict(task="atr", atr="easy"), LR5)],
}
# the learning rates a sweep tries at CPU scale (the others take the preset's one): where the paper
# chooses the rate on dev accuracy, the CPU sweep needs a choice too
CPU_LRS = {"atr-gen": (3e-4, 1e-3, 3e-3)}
SCALES = ("cpu", "paper")


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


def run_config(run: dict, extra=(), prog: str = "mech.py", here: bool = False) -> mech.Config:
    """The configuration mech.py makes of a run's flags followed by the sweep's, refusing what
    mech.py refuses before it trains (ValueError): its parser, mech.config_from_args, --threads
    (mech.main) and, with here (the run goes on this machine), the device (mech.choose_device)."""
    args = run_parser(prog).parse_args(run_args(run) + list(extra))
    if args.threads is not None and args.threads < 1:  # mech.main's own check, in its words
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    cfg = mech.config_from_args(args)
    if here:
        mech.choose_device(args.device)
    return cfg


def run_command(run: dict, out: str, python: str = "python", script: str = "mech.py",
                extra=()) -> list:
    """A run's command line; extra: mech.py flags given to the whole sweep (after the run's own
    flags, so they override them)."""
    return [python, script, *run_args(run), *extra, "--out", out]


def finished(folder: str, cfg: mech.Config) -> bool:
    """Whether folder holds the run of cfg, finished: a metrics.json beside a config.json of the
    same run (mech.identity), not merely a run of the same name."""
    if not os.path.exists(os.path.join(folder, "metrics.json")):
        return False
    try:
        return mech.stored_identity(folder) == mech.identity(cfg)
    except (mech.RunError, OSError):  # damaged, foreign or missing: mech.py will say which
        return False


class Stopped(Exception):
    """The sweep was told to stop by a signal."""
    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_requests():
    """A list that Ctrl-C, SIGTERM and SIGHUP append to: the sweep stops where it chooses, never
    between starting a run and noting it down (a run it does not know of would outlive it). An
    ignored SIGHUP (nohup) stays ignored."""
    stop, previous = [], {}
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, lambda signum, frame: stop.append(signum))
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def say(*args) -> None:
    """print, except that a reader who stops reading (`| head`) does not stop the sweep: the rest
    of its output goes to /dev/null, and its runs go on."""
    try:
        print(*args, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run_sweep(runs: list, root: str, jobs: int, extra=(), log=say) -> list:
    """Run the runs that are not finished (see `finished`) in `jobs` local processes, splitting the
    CPU threads between them; each process writes its output to <run folder>.log beside it. Returns the
    folders of the runs that failed (or that another process runs). On Ctrl-C, SIGTERM or SIGHUP
    (then Stopped) or any error, the runs still going are stopped first (each resumes from its
    last checkpoint), so that none outlives the sweep."""
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
                    proc = start_run(run, out, extra, threads)
                    if proc is None:  # another process runs it: two would chain checkpoints
                        log(f"FAILED (running in another process, its {out}.log locked)")
                        failed.append(out)
                    else:
                        running[proc] = out
                time.sleep(0.1)
                failed += ended_runs(running, log)
        except BaseException:
            stop_runs(list(running))  # signals that come meanwhile are noted, not obeyed
            raise
    return failed


def start_run(run: dict, out: str, extra, threads: int) -> subprocess.Popen | None:
    """Start a run's process, its output appended to out.log, beside the folder that mech.py
    keeps for the run's own files; None where out.log is locked: another sweep runs it (the run
    holds the lock on its log while it lives). It gets a process group of its own: a Ctrl-C in
    the terminal reaches the sweep only, which then stops every run the same way (stop_runs),
    each with the processes it may have started."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    cmd = run_command(run, out, sys.executable, os.path.abspath(mech.__file__), extra)
    if not any(a == "--threads" or a.startswith("--threads=") for a in extra):  # else: the user's
        cmd += ["--threads", str(threads)]
    with open(out + ".log", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the child inherits it with the file
        except BlockingIOError:
            return None
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def ended_runs(running: dict, log) -> list:
    """Take the runs that have ended out of running ({process: run folder}), each reported in one
    line; returns the folders of those that failed."""
    failed = []
    for proc in [p for p in running if p.poll() is not None]:
        out = running.pop(proc)
        code = proc.returncode
        log(f"{f'FAILED (exit {code}, see {out}.log)' if code else 'done'}: "
            f"{shlex.join(proc.args[1:])}")
        if code:
            failed.append(out)
    return failed


def stop_runs(procs: list, grace_s: float = 30) -> None:
    """Stop runs with SIGTERM (mech.py exits 130; the same command resumes from its last
    evaluation's checkpoint), killing those still there after grace_s seconds."""
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
