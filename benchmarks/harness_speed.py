"""Is our harness as fast as the reference ways to run the same training?

Side by side in one process per rank count, interleaved round by round so a
drift of the machine hits every method alike:

- ours:    containerbench.rank.bench's Horovod step and measuring loop (per-step
           timing, per-step sync, rank 0's line per step);
- horovod: the method of Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py
           (softmax model, SGD, DistributedGradientTape in a tf.function, timeit
           over batches with no per-step sync);
- keras:   plain Keras `model.fit` on the same synthetic batch (1 rank only:
           Horovod 0.28's Keras optimizer wrapper predates the Keras 2.11+ optimizers).

Also: the harness overhead (time in our loop outside the compiled step, and the
cost of calling + syncing a compiled step, per measured step, as a share of step
time) and the CV of each method's rate across rounds.

Each rank count runs twice, ours built first and then the references built first,
and the ratios pool both: on this VM the same step built twice in one process
differs by about 2% (memory placement), so a single build order would put that
into the ratio. The ratio of each order is printed too.

    .venv-bench/bin/python benchmarks/harness_speed.py [--quick] [--ranks 1 2]

Prints images/s per method (median of rounds), the ratios ours/theirs (median of the
per-round ratios) and the overhead; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "harness-speed "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps per round (model.fit is timed per round)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds; ours and Horovod's method alternate "
                                                              "step by step, rounds x steps pairs")
    parser.add_argument("--model", choices=("resnet50", "cnn_smoke"), default="resnet50")
    parser.add_argument("--quick", action="store_true", help="CI: cnn_smoke, 32 px, batch 2, 3 steps, 2 rounds, one "
                        "build order (the script proven to run, in a fraction of the time; not the ratios to quote)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--references-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.image_size, args.batch_size, args.steps, args.rounds = "cnn_smoke", 32, 2, 3, 2
    return args


def keras_model(tf, name: str, shape, classifier_activation):
    from containerbench.rank import bench

    constructor = bench.cnn_smoke if name == "cnn_smoke" else tf.keras.applications.ResNet50
    return constructor(weights=None, input_shape=shape, classes=1000, classifier_activation=classifier_activation)


def bootstrap_median_ci(values: list[float], resamples: int = 2000, seed: int = 7) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median: how far noise alone moves the ratio."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def worker(args) -> dict:
    """One rank: build each method, then time them round-robin."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from containerbench.rank import bench

    ours_args = bench.parse_args(["--model", args.model, "--image-size", str(args.image_size),
                                  "--batch-size", str(args.batch_size),
                                  "--warmup-steps", "0", "--steps", str(args.steps)])
    bench.configure_devices(tf, bench.local_rank_hint(), 0)
    from containerbench.rank.distribution import Horovod

    mode = Horovod(ours_args)
    shape = (args.image_size, args.image_size, 3)

    def build_ours():
        """Ours, exactly as bench.train builds it."""
        model, optimizer, _ = bench.build_model(tf, ours_args)
        optimizer.build(model.trainable_variables)
        next_batch, source = bench.input_source(tf, mode, ours_args, shape)
        step = mode.make_step(tf, model, optimizer, next_batch, ours_args)
        mode.start(model, optimizer)
        return step, source

    if not args.references_first:
        ours_step, source = build_ours()

    def ours(steps):
        ours_args.steps = steps
        with contextlib.redirect_stdout(io.StringIO()):  # rank 0's per-step lines, kept off the terminal
            _, step_times, outside, _, _ = bench.measure(ours_step, lambda: source, ours_args, hvd.rank(),
                                                         args.batch_size)
        return sum(step_times) * (1 + outside)  # the loop's wall time

    # Horovod's tensorflow2_synthetic_benchmark.py method
    ref_model = keras_model(tf, args.model, shape, "softmax")
    ref_opt = tf.optimizers.SGD(0.01 * hvd.size())
    ref_loss = tf.losses.SparseCategoricalCrossentropy()
    data = tf.random.uniform([args.batch_size, *shape])
    target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)

    @tf.function
    def benchmark_step(first_batch):
        with tf.GradientTape() as tape:
            probs = ref_model(data, training=True)
            loss = ref_loss(target, probs)
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, ref_model.trainable_variables)
        ref_opt.apply_gradients(zip(gradients, ref_model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(ref_model.variables, root_rank=0)
            hvd.broadcast_variables(ref_opt.variables(), root_rank=0)

    def horovod(steps):
        return timeit.timeit(lambda: benchmark_step(first_batch=False), number=steps)

    methods = {"ours": ours, "horovod": horovod}
    if hvd.size() == 1:
        fit_model = keras_model(tf, args.model, shape, None)
        fit_model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        dataset = tf.data.Dataset.from_tensors(bench.input_source(tf, mode, ours_args, shape)[0]()).repeat()

        def keras(steps):
            started = time.perf_counter()
            fit_model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
            return time.perf_counter() - started

        methods["keras"] = keras

    if args.references_first:
        ours_step, source = build_ours()

    # Warm up every method (tracing, allocation), then interleave. Against Horovod's method
    # step by step (a pair per step, the order flipping): a drift of this shared machine
    # lands on both. Against model.fit round by round (a fit call has a fixed cost per call).
    benchmark_step(first_batch=True)
    for method in methods.values():
        method(1)
    times = {name: [] for name in methods}
    for pair in range(args.rounds * args.steps):
        for name in ("ours", "horovod") if pair % 2 == 0 else ("horovod", "ours"):
            times[name].append(methods[name](1))
    if "keras" in methods:
        times["ours_rounds"], times["keras"] = [], []
        for round_ in range(args.rounds):
            for name in ("ours", "keras") if round_ % 2 == 0 else ("keras", "ours"):
                times["ours_rounds" if name == "ours" else name].append(methods[name](args.steps) / args.steps)
    paired = {"horovod": [t / o for o, t in zip(times["ours"], times["horovod"])]}
    if "keras" in times:
        paired["keras"] = [t / o for o, t in zip(times["ours_rounds"], times["keras"])]
    rates = {name: [args.batch_size / t for t in series] for name, series in times.items() if name != "ours_rounds"}

    # Harness overhead: our loop's time outside the step call, plus the cost of calling
    # a compiled step and syncing on its result (an empty step measures that).
    ours_args.steps = args.steps
    with contextlib.redirect_stdout(io.StringIO()):
        _, steps, outside, _, _ = bench.measure(ours_step, lambda: source, ours_args, hvd.rank(), args.batch_size)
    empty = tf.function(lambda: tf.constant(0.0))
    float(empty())
    call_s = min(timeit.repeat(lambda: float(empty()), number=200, repeat=5)) / 200
    step_s = statistics.median(steps)
    gathered = hvd.allgather_object(rates)
    totals = {name: [sum(g[name][i] for g in gathered) for i in range(len(series))] for name, series in rates.items()}
    return {
        "ranks": hvd.size(), "references_first": args.references_first,
        "images_per_sec": totals,  # per pair (ours, horovod) or per round (keras), total over ranks
        "paired_ratios": paired,  # ours/theirs within each pair (rank 0's): a drift between pairs cancels out
        "loop_outside_step_fraction": outside,
        "call_and_sync_fraction": call_s / step_s,
        "step_s_median": step_s,
        "tensorflow": tf.__version__, "numpy": np.__version__,
    } if hvd.rank() == 0 else {}


def summarize(runs: list[dict]) -> dict:
    """Pool the build orders: medians, CVs and bootstrap intervals over every pair of both runs."""
    rates = {name: [r for run in runs for r in run["images_per_sec"][name]] for name in runs[0]["images_per_sec"]}
    ratios = {name: [x for run in runs for x in run["paired_ratios"][name]] for name in runs[0]["paired_ratios"]}
    return {
        "images_per_sec": {name: statistics.median(r) for name, r in rates.items()},
        "cv_percent": {name: 100 * statistics.stdev(r) / statistics.mean(r) if len(r) > 1 else float("nan")
                       for name, r in rates.items()},
        "paired_ratio": {name: statistics.median(x) for name, x in ratios.items()},
        "paired_ratio_ci95": {name: bootstrap_median_ci(x) for name, x in ratios.items()},
        "by_order": {("references first" if run["references_first"] else "ours first"):
                     {name: statistics.median(x) for name, x in run["paired_ratios"].items()} for run in runs},
        **{key: statistics.mean(run[key] for run in runs)
           for key in ("loop_outside_step_fraction", "call_and_sync_fraction", "step_s_median")},
    }


def launch(args, ranks: int, references_first: bool) -> dict:
    """Run the worker on `ranks` ranks (mpirun, one core each, TCP over loopback as the default config)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp",
           "OMPI_MCA_btl_tcp_if_include": "lo", "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, __file__, "--worker", "--model", args.model, "--image-size", str(args.image_size),
            "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--rounds", str(args.rounds)]
    if references_first:
        argv.append("--references-first")
    mpirun = ["mpirun", "-np", str(ranks), "--bind-to", "core", "--map-by", "core"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    done = subprocess.run(mpirun + [a for n in ("OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include",
                                                "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL") for a in ("-x", n)] + argv,
                          env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"harness_speed: {ranks}-rank worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        result = worker(args)
        if result:
            print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    print(f"{args.model}, {args.image_size} px, batch {args.batch_size}/rank; ours and Horovod's method alternating "
          f"over {args.rounds * args.steps} step pairs, ours and model.fit over {args.rounds} rounds of {args.steps} "
          "steps; images/s total, median (CV); ratios: median of the paired ratios")
    for ranks in args.ranks:
        orders = (False,) if args.quick else (False, True)
        result = summarize([launch(args, ranks, references_first=first) for first in orders])
        rates, cvs = result["images_per_sec"], result["cv_percent"]
        cells = "  ".join(f"{name} {rate:7.2f} (CV {cvs[name]:4.1f}%)" for name, rate in rates.items())
        ratios = "  ".join(f"ours/{name} = {ratio:.3f} (95% CI {low:.3f}..{high:.3f})"
                           for (name, ratio), (low, high) in zip(result["paired_ratio"].items(),
                                                                 result["paired_ratio_ci95"].values()))
        print(f"{ranks} rank(s): {cells}\n           {ratios}")
        print("           by build order: " + "; ".join(
            f"{order}: " + ", ".join(f"ours/{name} = {ratio:.3f}" for name, ratio in ratios_.items())
            for order, ratios_ in result["by_order"].items()))
        print(f"           harness overhead per step: {100 * result['loop_outside_step_fraction']:.3f}% in the loop "
              f"outside the step + {100 * result['call_and_sync_fraction']:.3f}% calling and syncing the compiled "
              f"step = {100 * (result['loop_outside_step_fraction'] + result['call_and_sync_fraction']):.3f}% "
              f"of a {result['step_s_median'] * 1000:.0f} ms step (target < 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
