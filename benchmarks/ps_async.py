"""Asynchronous parameter servers against synchronous rounds: what asynchrony buys in throughput and costs in learning.

Both modes of containerbench.rank.parameterservers, each run its own processes under mpirun, as the workflow
launches them (a core per rank where there are enough, else oversubscribed and unbound, said in the output), the
two modes alternating first and second round by round so that a drift of the machine hits both alike, at each
worker count. Per mode and worker count: mean img/s and its CV, the loss of the final weights on the fixed batch
after the same images (loss at equal images), the updates' mean staleness; then async / sync with Fieller's 95%
interval (containerbench.intervals.ratio_interval), as the modes table computes it.

    .venv/bin/python benchmarks/ps_async.py [--quick] [--ranks 2 3] [--rounds 3] [--bench-python PYTHON]

Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from containerbench.intervals import ratio_interval
from containerbench.rank import markers

MODES = ("parameter_server", "parameter_server_async")
ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3], help="workers (each rank is one)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode and worker count")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--data-dir", help="ImageNet TFRecords; default synthetic data")
    parser.add_argument("--bench-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                        help="the benchmark venv's interpreter, which runs the ranks")
    parser.add_argument("--quick", action="store_true",
                        help="CI: the smoke network at 32 px, 2 workers, 3 steps, one round (the script proven to "
                             "run; not the figures to quote)")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.image_size, args.ranks, args.steps, args.warmup_steps, args.rounds = (
            "cnn_smoke", 32, [2], 3, 1, 1)
    return args


def launch(mode: str, ranks: int, args) -> dict:
    """One run of the benchmark in `mode` on `ranks` ranks; its result line's payload."""
    bound = ranks <= len(os.sched_getaffinity(0))
    binding = ["--bind-to", "core", "--map-by", "core"] if bound else ["--oversubscribe", "--bind-to", "none"]
    argv = ["mpirun", "--allow-run-as-root", "-np", str(ranks), *binding, "--mca", "btl", "self,tcp", "--mca",
            "btl_tcp_if_include", "lo", "--mca", "pml", "ob1", args.bench_python, "-m", "containerbench.rank.bench",
            "--mode", mode, "--model", args.model, "--image-size", str(args.image_size), "--batch-size",
            str(args.batch_size), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
            *(["--data-dir", args.data_dir] if args.data_dir else [])]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CONTAINERBENCH_GRPC_IFACE": "lo"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    results = markers.payloads_of(done.stdout.splitlines(), markers.RESULT)
    if done.returncode != 0 or len(results) != 1:
        raise SystemExit(f"{mode} on {ranks} ranks failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return {**results[0], "bound": bound}


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"ps-async: {args.model} {args.image_size}px batch {args.batch_size}/worker, {args.warmup_steps} warmup + "
          f"{args.steps} measured steps, {args.rounds} round(s), data {args.data_dir or 'synthetic'}", flush=True)
    for ranks in args.ranks:
        runs = {mode: [] for mode in MODES}
        for round_ in range(args.rounds):
            for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                runs[mode].append(launch(mode, ranks, args))
        bound = "a core per rank" if runs[MODES[0]][0]["bound"] else "oversubscribed, unbound"
        for mode in MODES:
            rates = [r["images_per_sec"] for r in runs[mode]]
            losses = [r["updates"]["loss_at_equal_images"] for r in runs[mode]]
            stale = [r["updates"]["staleness_mean"] for r in runs[mode]]
            spread = statistics.stdev(rates) / statistics.mean(rates) if len(rates) > 1 else float("nan")
            print(f"ps-async: {ranks} workers ({bound}) {mode:<23} {statistics.mean(rates):8.2f} img/s "
                  f"(CV {100 * spread:.1f}%), loss at equal images {statistics.mean(losses):.4f} "
                  f"(runs: {', '.join(f'{x:.4f}' for x in losses)}), staleness {statistics.mean(stale):.2f}",
                  flush=True)
        interval = ratio_interval([r["images_per_sec"] for r in runs[MODES[1]]],
                                  [r["images_per_sec"] for r in runs[MODES[0]]], MODES[0])
        print(f"ps-async: {ranks} workers async/sync {interval.ratio:.3f} "
              f"({interval.low:.3f}..{interval.high:.3f}, Fieller 95%), {interval.significance()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
