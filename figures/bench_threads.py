"""Benchmark: thread counts and how torch's OpenMP threads wait, on an idle and a busy machine.

    python figures/bench_threads.py                  # Mamba on AR, 60 steps, 3 repeats
    python figures/bench_threads.py --arch attention --steps 600 --busy 4 --repeats 5

mech.py sets GOMP_SPINCOUNT=3000 before torch loads (unless it is set already): a waiting thread
of libgomp (the OpenMP of torch's Linux builds) spins 3,000 times, not libgomp's default 300,000,
before it sleeps. This runs the same short training with torch's default thread count under that
setting, under libgomp's default (torch alone), under OMP_WAIT_POLICY=PASSIVE (sleep at once) and
with --threads 1, each on the idle machine and beside `--busy` processes that each keep a core
busy, interleaved (the machine's drift hits every setting), and prints the median steps/s of each
and its ratio to --threads 1 under the same load. Not a test: pytest does not collect it.
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

SETTINGS = {  # name -> (mech.py flags, the environment set for libgomp)
    "default (mech.py)": ([], dict(GOMP_SPINCOUNT="3000")),
    "default, torch alone": ([], dict(GOMP_SPINCOUNT="300000")),  # libgomp's own default
    "default, passive": ([], dict(OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="0")),
    "--threads 1": (["--threads", "1"], dict(GOMP_SPINCOUNT="3000"))}


def steps_per_s(flags: list, policy: dict, out: str) -> tuple:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    subprocess.run([sys.executable, os.path.join(ROOT, "mech.py"), *flags, "--out", out,
                    "--no-interventions", "--no-dynamics", "--force"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    return m["steps_per_s"], m["threads"]


def main(argv=None):
    p = mech.Parser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="mamba")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--busy", type=int, default=2, help="other processes, each spinning on a core")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    for name, least in (("steps", 1), ("busy", 1), ("repeats", 1)):  # one line, not a traceback
        if getattr(args, name) < least:
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    flags = ["--arch", args.arch, "--steps", str(args.steps), "--eval-every", str(args.steps)]
    loads = {"idle": 0, f"{args.busy} busy": args.busy}
    rates = {(name, load): [] for name in SETTINGS for load in loads}
    threads = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for load, n in loads.items():
                spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                            for _ in range(n)]
                try:
                    for name, (extra, policy) in SETTINGS.items():
                        rate, threads[name] = steps_per_s(flags + extra, policy,
                                                          os.path.join(tmp, "run"))
                        rates[name, load].append(rate)
                except subprocess.CalledProcessError as e:
                    p.exit(1, f"{p.prog}: error: a run failed (exit {e.returncode}): "
                           f"{shlex.join(e.cmd)}\n")
                finally:
                    for s in spinners:
                        s.kill()
    median = {key: statistics.median(r) for key, r in rates.items()}
    print(f"{args.arch}, {args.steps} steps, {os.cpu_count()} cores, medians of {args.repeats} "
          "(steps/s; in brackets: / --threads 1 under the same load)")
    print(f"  {'':24s}" + "".join(f"{load:>22s}" for load in loads))
    for name in SETTINGS:
        cells = [f"{median[name, load]:8.1f} ({median[name, load] / one:5.2f})"
                 for load, one in ((load, median["--threads 1", load]) for load in loads)]
        print(f"  {name:24s}" + "".join(f"{c:>22s}" for c in cells)
              + f"   ({threads[name]} threads)")
    for (name, load), runs in rates.items():
        print(f"  runs, {name}, {load}: " + ", ".join(f"{r:.1f}" for r in runs))


if __name__ == "__main__":
    main()
