"""Benchmark: what watching the mechanism at every evaluation costs (mech.py, --no-dynamics).

    python figures/bench_dynamics.py                    # every architecture, AR and ATR easy
    python figures/bench_dynamics.py --arch mamba --task ar --repeats 5
    python figures/bench_dynamics.py --arch attention --task ar --repeats 1 --eval-every 2  # a look

At each evaluation (every `eval_every` steps of the CPU preset) train() runs one light interchange
analysis, mech.watch_mechanism. This times, in one process and one thread, interleaved, the
preset's `eval_every` training steps and one watch_mechanism call on the same model, and prints
the medians and their ratio: the time a default run takes longer (target: at most 10 %). The
evaluation itself (accuracy on the test documents) is there with or without it. Not a test.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import mech  # noqa: E402


def timings(cfg: mech.Config, repeats: int) -> tuple:
    """Median seconds of eval_every training steps, and of one watch_mechanism call."""
    task = mech.make_task(cfg)
    model = mech.build_model(cfg, task.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    test = task.sample(cfg.n_eval, mech.rng_for(cfg.seed, "test"), split="test")
    batch_at, _ = mech.training_batches(cfg, task, torch.device("cpu"))
    train_s, watch_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for step in range(cfg.eval_every):
            batch = batch_at(step)
            loss = F.cross_entropy(model(batch.ids, at=batch.pos["query"]), batch.answer)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        train_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        mech.watch_mechanism(model, task, test, cfg)
        watch_s.append(time.perf_counter() - t)
    return statistics.median(train_s), statistics.median(watch_s)


def main(argv=None):
    p = mech.Parser(description=__doc__.splitlines()[0])  # bad input: one line, as mech.py
    p.add_argument("--arch", nargs="*", default=list(mech.MIXERS), choices=list(mech.MIXERS))
    p.add_argument("--task", nargs="*", default=["ar", "atr"], choices=["ar", "atr"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval-every", type=int, help="training steps timed per repeat (default: the "
                   "CPU preset's eval_every); fewer make a quick look, or a test, of this script")
    args = p.parse_args(argv)
    try:  # bad input: one line, as mech.py says it, not a traceback
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        cfgs = [mech.Config(arch=arch, task=task, n_train=4096, scan="auto",
                            eval_every=args.eval_every) for task in args.task for arch in args.arch]
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(1)
    print("| task | arch | eval_every training steps (s) | watch_mechanism (s) | overhead |\n"
          "|---|---|---:|---:|---:|")
    for cfg in cfgs:
        train_s, watch_s = timings(cfg, args.repeats)
        print(f"| {cfg.task} | {cfg.arch} | {train_s:.2f} ({cfg.eval_every}) | {watch_s:.3f} "
              f"| {100 * watch_s / train_s:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
