"""The paper's experiments: its sweeps of runs, and the table and figures made from their results.

mech.py trains and analyses one model of "Mechanistic evaluation of Transformers and state space
models" (arXiv 2505.15105). This script runs the paper's sweeps of such runs, each one a separate
`python mech.py ...` process, and draws the paper's figures from the finished runs:

    python figures/experiments.py --sweep ar-dconv --jobs 2   # Mamba d_conv 0..4 x 3 seeds, CPU
    python figures/experiments.py --sweep ar-dconv --steps 2000   # mech.py flags apply to every run
    python figures/experiments.py --sweep ar-main --scale paper --print-commands > jobs.txt
    python figures/experiments.py --collect sweeps/   # sweeps/results.json, summary.md, figures/
    python figures/experiments.py --collect figures/runs/cpu_preset --figures-dir figures
    python figures/experiments.py --numbers figures/runs --figures-dir figures   # runs/numbers.md
    python figures/experiments.py --sweep mixer --arch mamba   # AR and ATR easy for one --arch

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

This file is the command line only. The work is done by one module per job, beside it: sweeps.py
(the sweeps, their runs and running them), collect.py (the records, the tables and the report's
numbers), drawing.py (the figures) and paper.py (the paper's numbers drawn beside ours).
"""
import os
import shlex
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, with mech.py
sys.path.insert(0, ROOT)
import mech  # noqa: E402
from figures.collect import (collect, dynamics_table, generated_tables,  # noqa: E402
                             hybrid_groups, hyena_groups, numbers_md, refused_runs,
                             report_numbers, summary_table, today_groups)
from figures import plots  # noqa: E402
from figures.drawing import hybrids, hyena_widths, plot_figures, today_mixers  # noqa: E402
from figures.sweeps import (SWEEPS, Stopped, run_command, run_config, run_sweep,  # noqa: E402
                            sweep_overrides, sweep_runs)


def build_parser() -> mech.Parser:
    # no abbreviations: mech.py's --seed must pass through to the runs, not be taken for --seeds
    p = mech.Parser(prog="experiments.py", allow_abbrev=False,
                    description="Run a sweep of the paper's runs, or collect finished runs into a "
                    "table and figures. Any other flag is mech.py's (python mech.py --help) and "
                    "applies to every run of the sweep.")
    p.add_argument("--sweep", help="the sweep: " + ", ".join(SWEEPS) + " (mixer: AR and ATR easy "
                   "for the architecture given with --arch, your own mixer, say)")
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
                   "ones: --numbers figures/runs); with --figures-dir, also draw there the figure "
                   "that sets the two protocols side by side (hyena_widths.png), that of "
                   "today's mixers in DIR/mixers (today_mixers.png) and that of the hybrids in "
                   "DIR/hybrids (hybrids.png, once they have runs)")
    p.add_argument("--figures-dir", help="where the figures go (default: DIR/figures of the "
                   "collected DIR; the committed ones: figures)")
    return p


def checked_runs(args, run_flags: list, parser: mech.Parser) -> list:
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
        for _, run in runs:  # the device is checked where the runs go: here, unless printed
            run_config(run, run_flags, parser.prog, here=not args.print_commands)
    except (ValueError, mech.RunError) as e:
        parser.error(str(e))
    return runs


def sweep_or_exit(runs: list, root: str, jobs: int, run_flags: list, parser: mech.Parser) -> None:
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
                    "above with its .log; the same command retries them, and with --force (a "
                    "mech.py flag) starts over those whose folder holds another configuration\n")


def collect_and_draw(root: str, figures_dir: str, parser: mech.Parser) -> list:
    """results.json, summary.md (also printed) and the figures of the finished runs under root."""
    if not os.path.isdir(root):
        parser.error(f"--collect {root}: no such directory")
    records = collect(root)
    table = "\n\n".join(filter(None, (summary_table(records), dynamics_table(records))))
    try:
        mech.save(os.path.join(root, "results.json"), records)
        plots.write_file(os.path.join(root, "summary.md"), table + "\n")
        paths = plot_figures(records, figures_dir)
    except (OSError, mech.RunError) as e:  # a read-only or full directory
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(f"{table}\n\n{len(records)} runs collected into {os.path.join(root, 'results.json')} "
          f"(table: {os.path.join(root, 'summary.md')}); figures: {', '.join(paths) or 'none'}")
    return records


def write_numbers(root: str, parser: mech.Parser, figures_dir: str | None = None) -> None:
    """--numbers DIR: recount the report's numbers from DIR/cpu_preset and DIR/paper_protocol into
    DIR/numbers.md (also printed), and with figures_dir draw hyena_widths.png, today_mixers.png
    and hybrids.png (if DIR/hybrids holds runs) there; a DIR without both, or without runs, or
    with a damaged run (or under cpu_preset a foreign one: collect.refused_runs) is refused in
    one line, nothing written."""
    for sub in ("cpu_preset", "paper_protocol"):
        if not os.path.isdir(os.path.join(root, sub)):
            parser.error(f"--numbers {root}: no folder {os.path.join(root, sub)} (the committed "
                         "runs: --numbers figures/runs)")
    cpu = collect(os.path.join(root, "cpu_preset"), lambda line: None)  # damaged: refused below
    refused = refused_runs(root, cpu)
    if refused:  # the committed runs are the report's data: one damaged or foreign is corruption
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        parser.exit(1, f"{parser.prog}: error: --numbers {root}: {refused[0]}{more}; the report "
                    "is recounted from its runs, whole, or not at all\n")
    if not cpu:
        parser.error(f"--numbers {root}: no finished runs under {os.path.join(root, 'cpu_preset')}")
    try:
        with warnings.catch_warnings():  # Python 3.10 has no catch_warnings(action=...)
            # numpy warns of a mean over no runs: numbers_md refuses its nan, in one line
            warnings.simplefilter("ignore", RuntimeWarning)
            text = numbers_md(report_numbers(root, cpu), generated_tables(root, cpu))
        plots.write_file(os.path.join(root, "numbers.md"), text)
        if figures_dir:  # C3's Hyena at the paper's widths (both protocols); beyond the paper
            os.makedirs(figures_dir, exist_ok=True)
            hyena_widths(hyena_groups(root, cpu), figures_dir)
            today_mixers(cpu, today_groups(root, cpu), figures_dir)
            hybrids(hybrid_groups(root, cpu), figures_dir)
    except (KeyError, ValueError, IndexError, ZeroDivisionError) as e:  # runs the report lacks
        parser.exit(1, f"{parser.prog}: error: --numbers {root}: the runs there are not the "
                    f"report's ({type(e).__name__}: {e})\n")
    except (OSError, mech.RunError) as e:  # a read-only or full directory
        parser.exit(1, f"{parser.prog}: error: {e}\n")
    print(text)


def main(argv=None) -> list:
    """--sweep: run a sweep (or print its commands), then collect it; --collect DIR: collect DIR.
    Returns the collected records."""
    parser = build_parser()
    args, run_flags = parser.parse_known_args(argv)
    if args.numbers:
        write_numbers(args.numbers, parser, args.figures_dir)
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
