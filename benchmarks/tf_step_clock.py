"""Does the TensorFlow harness's GPU clock time what it claims, and does it move the figures on CPUs?

On a GPU the harness times its steps with stepclocks.QueuedClock: steps queued one ahead under eager's
asynchronous executor, an eager copy of each loss to the host queued between its step and the next, each step
timed from the last one's completion to its own. Every CPU run keeps stepclocks.HostClock. Two checks, on this
machine's CPUs:

--logic: steps of known length (a busy loop of 200-360 ms in the step's graph, which stamps its own start and end
         with tf.timestamp) behind a host that works 50 ms before each step (as a host preparing the next batch).
         Per clock: the largest difference between a measured step and the true interval between two steps' ends,
         and the device's idle gaps between steps. HostClock leaves the device idle while the host works;
         QueuedClock must not, and must still time each step as it ran. This checks the clock's bookkeeping (which
         step is read when, and with which loss); what a GPU's streams do is not shown on CPUs.
--ranks: ResNet-50 side by side, `bench --step-clock host` and `--step-clock queued`, each run its own processes
         under mpirun (tf_peer_speed's binding: 1 rank unbound, more a core each), alternating first and second
         round by round; queued/host over the rounds' pairs (intervals.paired_ratio_interval).

    .venv/bin/python benchmarks/tf_step_clock.py [--quick] [--logic] [--ranks 1 2] [--rounds 3]

Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tf_peer_speed import ROOT, mpirun  # noqa: E402

LOGIC_PREFIX = "tf-clock-logic "
# The first two are the warmup. Each step outlasts the host's work by 150 ms or more: the host queues the next step
# in time even on a busy machine.
STEP_SECONDS = (0.20, 0.30, 0.22, 0.36, 0.20, 0.28, 0.34, 0.24)
HOST_SECONDS = 0.05


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2], help="none: --logic alone")
    parser.add_argument("--rounds", type=int, default=3, help="runs per clock and rank count")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=8, help="images per rank per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--logic", action="store_true", help="also time steps of known length with both clocks")
    parser.add_argument("--bench-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                        help="the benchmark venv's interpreter, which runs the ranks")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 32 px, batch 2, 1 warmup + 2 steps, 1 rank, one round (the script proven to run; "
                             "not the figures to quote)")
    parser.add_argument("--logic-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.image_size, args.batch_size, args.warmup_steps, args.steps, args.ranks, args.rounds = 32, 2, 1, 2, [1], 1
    return args


def logic_worker() -> dict:
    """Both clocks on steps of known length (STEP_SECONDS), each behind HOST_SECONDS of host work."""
    import tensorflow as tf

    from containerbench.rank import bench, stepclocks

    def timed(clock) -> dict:
        stamps = tf.Variable(tf.zeros([len(STEP_SECONDS), 2], tf.float64))
        lengths = tf.constant(STEP_SECONDS, tf.float64)

        @tf.function
        def step(index):
            started = tf.timestamp()
            with tf.control_dependencies([started]):  # busy, on one core, until the step's length has passed
                tf.while_loop(lambda waited: waited < lengths[index], lambda waited: tf.timestamp() - started,
                              [tf.constant(0.0, tf.float64)])
            stamps.scatter_nd_update([[index]], [tf.stack([started, tf.timestamp()])])
            return tf.cast(index, tf.float32)

        indices = iter(range(len(STEP_SECONDS)))

        def next_batch():
            time.sleep(HOST_SECONDS)
            return (tf.constant(next(indices)),)

        args = types.SimpleNamespace(warmup_steps=2, steps=len(STEP_SECONDS) - 2)
        with clock.running():
            _, measured, _, _, losses = bench.measure(step, next_batch, args, 1, 1, clock)
        started, ended = zip(*stamps.numpy().tolist())
        true = [ended[i] - ended[i - 1] for i in range(args.warmup_steps, len(ended))]
        return {"measured": measured, "true": true, "losses": losses,
                "gaps": [started[i] - ended[i - 1] for i in range(1, len(ended))]}

    return {"queued": timed(stepclocks.QueuedClock(tf)), "host": timed(stepclocks.HostClock)}


def check_logic(args) -> dict:
    done = subprocess.run([args.bench_python, __file__, "--logic-worker"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in done.stdout.splitlines() if line.startswith(LOGIC_PREFIX)]
    if done.returncode != 0 or len(lines) != 1:
        raise SystemExit(f"the logic worker: exit {done.returncode}: {done.stderr[-2000:]}")
    found = json.loads(lines[0][len(LOGIC_PREFIX):])
    print(f"tf-clock: steps of {', '.join(f'{1000 * s:.0f}' for s in STEP_SECONDS[2:])} ms, each behind "
          f"{1000 * HOST_SECONDS:.0f} ms of host work", flush=True)
    for name, run in found.items():
        error = max(abs(m - t) for m, t in zip(run["measured"], run["true"]))
        print(f"tf-clock: {name:<6} largest |measured - true| {1000 * error:5.1f} ms; the device idle between "
              f"steps {1000 * statistics.median(run['gaps']):5.1f} ms (median), {1000 * max(run['gaps']):5.1f} ms "
              "(largest)", flush=True)
    print(LOGIC_PREFIX + json.dumps(found), flush=True)
    return found


def launch(clock: str, ranks: int, args) -> float:
    """One run of the harness with `clock` on `ranks` ranks: its total img/s, warmup excluded."""
    from containerbench.rank import markers

    command = [args.bench_python, "-m", "containerbench.rank.bench", "--mode", "horovod", "--model", "resnet50",
               "--image-size", str(args.image_size), "--batch-size", str(args.batch_size), "--steps",
               str(args.steps), "--warmup-steps", str(args.warmup_steps), "--step-clock", clock]
    done = subprocess.run([*mpirun(ranks), *command], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    results = markers.payloads_of(done.stdout.splitlines(), markers.RESULT)
    if done.returncode != 0 or len(results) != 1:
        raise SystemExit(f"--step-clock {clock} on {ranks} rank(s): exit {done.returncode}: {done.stderr[-2000:]}")
    named = results[0]["distribution"].get("step_clock", "host")  # only a clock other than the host's is named
    if named != clock:
        raise SystemExit(f"--step-clock {clock} on {ranks} rank(s): the record names clock {named}")
    return results[0]["images_per_sec"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.logic_worker:
        print(LOGIC_PREFIX + json.dumps(logic_worker()), flush=True)
        return 0
    from containerbench.intervals import paired_ratio_interval

    if args.logic:
        check_logic(args)
    if args.ranks:
        print(f"tf-clock: resnet50 {args.image_size}px batch {args.batch_size}/rank fp32, {args.warmup_steps} warmup "
              f"+ {args.steps} measured steps, {args.rounds} round(s), synthetic data, mode horovod", flush=True)
    clocks = ("host", "queued")
    for ranks in args.ranks:
        rates = {clock: [] for clock in clocks}
        for round_ in range(args.rounds):
            for clock in (clocks if round_ % 2 == 0 else clocks[::-1]):
                rates[clock].append(launch(clock, ranks, args))
        for clock in clocks:
            series = rates[clock]
            spread = statistics.stdev(series) / statistics.mean(series) if len(series) > 1 else float("nan")
            print(f"tf-clock: {ranks} rank(s) {clock:<6} {statistics.mean(series):7.2f} img/s (CV {100 * spread:.1f}%; "
                  f"runs: {', '.join(f'{x:.2f}' for x in series)})", flush=True)
        interval = paired_ratio_interval(rates["queued"], rates["host"])
        print(f"tf-clock: {ranks} rank(s) queued/host {interval.ratio:.3f} ({interval.low:.3f}..{interval.high:.3f}, "
              f"{args.rounds} paired rounds, paired 95%), {interval.significance()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
