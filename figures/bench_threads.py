"""Benchmark: thread counts on a shared machine.

    python figures/bench_threads.py                 # attention on AR, 1,500 steps, 3 repeats
    python figures/bench_threads.py --arch mamba --busy 1 --repeats 5

mech.py takes torch's default thread count (one per core) unless --threads is given. This runs
the same short training with the default and with each explicit --threads, interleaved, while
`--busy` other processes each keep one core busy, and prints the median steps/s of each and the
default's ratio to the best explicit count: what a run on a busy machine gains by --threads.
Not a test: pytest does not collect it.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import mech  # noqa: E402  (its Parser: bad input in one line)


def steps_per_s(flags: list, out: str) -> float:
    subprocess.run([sys.executable, os.path.join(ROOT, "mech.py"), *flags, "--out", out,
                    "--no-interventions", "--force"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    return m["steps_per_s"], m["threads"]


def main():
    p = mech.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="attention")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--busy", type=int, default=1, help="other processes, each spinning on a core")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    for name, least in (("steps", 1), ("busy", 0), ("repeats", 1)):  # one line, not a traceback
        if getattr(args, name) < least:
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    flags = ["--arch", args.arch, "--steps", str(args.steps), "--eval-every", str(args.steps)]
    settings = {"default": []} | {f"--threads {n}": ["--threads", str(n)]
                                  for n in range(1, (os.cpu_count() or 1) + 1)}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.busy)]
    rates, threads = {name: [] for name in settings}, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeats):  # interleaved: the machine's drift hits every setting
                for name, extra in settings.items():
                    try:
                        rate, threads[name] = steps_per_s(flags + extra, os.path.join(tmp, "run"))
                    except subprocess.CalledProcessError as e:
                        p.exit(1, f"{p.prog}: error: a run failed (exit {e.returncode}): "
                               f"{shlex.join(e.cmd)}\n")
                    rates[name].append(rate)
    finally:
        for s in spinners:
            s.kill()
    median = {name: statistics.median(r) for name, r in rates.items()}
    best = max((m, name) for name, m in median.items() if name != "default")
    print(f"{args.arch}, {args.steps} steps, {args.busy} busy core(s) of {os.cpu_count()}, "
          f"medians of {args.repeats}:")
    for name, m in median.items():
        print(f"  {name:12s} {m:6.1f} steps/s  ({threads[name]} threads; runs: "
              f"{', '.join(f'{r:.1f}' for r in rates[name])})")
    print(f"default / best explicit ({best[1]}): {median['default'] / best[0]:.2f}")


if __name__ == "__main__":
    main()
