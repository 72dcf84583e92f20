"""TensorFlow's two step clocks side by side on a CPU: does the GPU clock time what it claims?

On a GPU a TensorFlow call queues its step and returns; bench.CompletionClock reads step i's loss once
step i+1 is queued and times a step from one loss reaching the host to the next. A CPU runs a call to
its end (the host clock's case), unless TensorFlow executes asynchronously
(`tf.config.experimental.set_synchronous_execution(False)`): then a call returns once the step is
queued, as on a GPU. So, per round, two processes of one rank each, in alternating order:

- host:       synchronous execution, bench.HostClock (what every CPU run uses);
- completion: asynchronous execution, bench.CompletionClock (what a GPU run uses).

Both train the same model with the same bench.measure loop. The script prints each clock's rate
(median of rounds), the ratio completion/host with a bootstrap 95% interval, and how long a call
took to return as a share of a step (near 1 when the call runs the step, near 0 when it only queues
it: the evidence that the completion clock really timed steps it did not wait for).

    .venv-bench/bin/python benchmarks/tf_clock.py [--rounds 6] [--quick]

Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from harness_speed import bootstrap_median_ci  # noqa: E402 - the scripts share one interval

RESULT_PREFIX = "tf-clock "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet50", "cnn_smoke"), default="resnet50")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="CI: cnn_smoke, 32 px, batch 2, 1 warmup + 3 steps, "
                        "1 round (the script proven to run; not the figures to quote)")
    parser.add_argument("--worker", choices=("host", "completion"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.image_size, args.batch_size, args.warmup_steps, args.steps, args.rounds = (
            "cnn_smoke", 32, 2, 1, 3, 1)
    return args


def worker(args) -> dict:
    import tensorflow as tf

    if args.worker == "completion":
        tf.config.experimental.set_synchronous_execution(False)  # a call returns once its step is queued
    import io
    from contextlib import redirect_stdout

    from containerbench.rank import bench
    from containerbench.rank.distribution import Horovod

    bench_args = bench.parse_args(["--model", args.model, "--image-size", str(args.image_size), "--batch-size",
                                   str(args.batch_size), "--warmup-steps", str(args.warmup_steps),
                                   "--steps", str(args.steps)])
    bench.configure_devices(tf, bench.local_rank_hint(), 0)
    mode = Horovod(bench_args)
    model, optimizer, shape = bench.build_model(tf, bench_args)
    optimizer.build(model.trainable_variables)
    next_batch, source = bench.input_source(tf, mode, bench_args, shape)
    step = mode.make_step(tf, model, optimizer, next_batch, bench_args)
    mode.start(model, optimizer)
    returned = []  # seconds each call took to return

    def timed_call(*arguments):
        started = time.perf_counter()
        loss = step(*arguments)
        returned.append(time.perf_counter() - started)
        return loss

    clock = bench.CompletionClock() if args.worker == "completion" else bench.HostClock
    with redirect_stdout(io.StringIO()):
        _, step_s, _, _, _ = bench.measure(timed_call, lambda: source, bench_args, 0, args.batch_size, clock)
    measured_calls = returned[args.warmup_steps:]
    return {"images_per_sec": args.batch_size * args.steps / sum(step_s),
            "call_share": statistics.median(call / step for call, step in zip(measured_calls, step_s))}


def main() -> int:
    args = parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(worker(args)), flush=True)
        return 0
    rates = {"host": [], "completion": []}
    shares = {"host": [], "completion": []}
    passthrough = ["--model", args.model, "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
                   "--warmup-steps", str(args.warmup_steps), "--steps", str(args.steps)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for round_index in range(args.rounds):
        order = ("host", "completion") if round_index % 2 == 0 else ("completion", "host")
        for clock in order:
            done = subprocess.run([sys.executable, __file__, "--worker", clock, *passthrough], capture_output=True,
                                  text=True, env=env, timeout=900)
            line = next((text for text in done.stdout.splitlines() if text.startswith(RESULT_PREFIX)), None)
            if done.returncode != 0 or line is None:
                print(f"{clock} worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            result = json.loads(line[len(RESULT_PREFIX):])
            rates[clock].append(result["images_per_sec"])
            shares[clock].append(result["call_share"])
    ratios = [completion / host for host, completion in zip(rates["host"], rates["completion"])]
    low, high = bootstrap_median_ci(ratios)
    print(f"{args.model}, {args.image_size} px, batch {args.batch_size}, 1 rank, {args.rounds} round(s) of "
          f"{args.steps} steps")
    for clock in ("host", "completion"):
        print(f"{clock:10s} clock: {statistics.median(rates[clock]):.2f} img/s (median of rounds); a call returned "
              f"after {statistics.median(shares[clock]):.2f} of a step")
    print(f"completion/host = {statistics.median(ratios):.3f} (95% CI {low:.3f}..{high:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
