"""Is our TensorFlow harness as fast as tf_cnn_benchmarks, the fastest public way to train ResNet-50 on TensorFlow?

Side by side, each run its own processes under mpirun, the two alternating first and second round by round so
that a drift of the machine hits both alike, at each rank count:

- ours: containerbench.rank.bench, mode horovod (Keras' ResNet-50, our step and measuring loop);
- peer: tf_cnn_benchmarks (tensorflow/benchmarks at 8fb7907, vendored unmodified under benchmarks/third_party/),
        --variable_update=horovod, its own ResNet-50 in a TF1 graph and session.

Both: ResNet-50 at 224 px (the peer's fixed size), the same batch per rank, fp32, NHWC, synthetic data, plain SGD
without weight decay (the peer's default adds an L2 term our loss has not), warmup excluded. One rank runs unbound
(TensorFlow takes both cores), more ranks get a core each. Per method: mean img/s over runs and its CV; then
ours/peer over the rounds' pairs (the two runs of a round), with the interval of paired ratios
(containerbench.intervals.paired_ratio_interval: a drift of the machine between rounds cancels within each pair).

--causes then measures the one difference of the networks, in one process on one core, step by step alternating:
our step on Keras' ResNet-50, and on the same network rebuilt as the peer's ResNet-50 builds its layers
(models/resnet_model.py, convnet_builder.py): convolutions without a bias, which the batch norm after each makes
redundant. Both have a scale and an offset in every batch norm.

    .venv/bin/python benchmarks/tf_peer_speed.py [--quick] [--ranks 1 2] [--rounds 3] [--causes]

Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "benchmarks" / "third_party" / "tf_cnn_benchmarks" / "tf_cnn_benchmarks.py"
# Every rank prints its own view of the total: rank 0's is read, from its own file (mpirun --output-filename; in
# one stream, --tag-output once split the line between two reads and lost it).
PEER_RATE = re.compile(r"^total images/sec: (\d+\.\d+)$", re.M)
IMAGE_SIZE = 224  # tf_cnn_benchmarks' ResNet-50 input; it has no flag for another
CAUSE_PREFIX = "tf-peer-cause "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2], help="none: --causes alone")
    parser.add_argument("--rounds", type=int, default=3, help="runs per method and rank count")
    parser.add_argument("--batch-size", type=int, default=8, help="images per rank per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--causes", action="store_true", help="also measure the model definition's share")
    parser.add_argument("--cause-pairs", type=int, default=20, help="--causes: step pairs timed")
    parser.add_argument("--bench-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                        help="the benchmark venv's interpreter, which runs the ranks")
    parser.add_argument("--quick", action="store_true",
                        help="CI: batch 1, 1 warmup + 1 step, 1 rank, one round, 2 cause pairs (the script proven "
                             "to run; not the figures to quote)")
    parser.add_argument("--cause-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.steps, args.warmup_steps, args.ranks, args.rounds, args.cause_pairs = 1, 1, 1, [1], 1, 2
    return args


def mpirun(ranks: int) -> list[str]:
    binding = ["--bind-to", "none"] if ranks == 1 else ["--bind-to", "core", "--map-by", "core"]
    return ["mpirun", "--allow-run-as-root", "-np", str(ranks), *binding, "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", "lo", "--mca", "pml", "ob1"]


def launch(method: str, ranks: int, args) -> float:
    """One run of `method` on `ranks` ranks: its total img/s over the ranks, warmup excluded."""
    from containerbench.rank import markers

    if method == "ours":
        command = [args.bench_python, "-m", "containerbench.rank.bench", "--mode", "horovod", "--model", "resnet50",
                   "--image-size", str(IMAGE_SIZE), "--batch-size", str(args.batch_size), "--steps",
                   str(args.steps), "--warmup-steps", str(args.warmup_steps)]
    else:
        command = [args.bench_python, str(PEER), "--model=resnet50", f"--batch_size={args.batch_size}",
                   f"--num_batches={args.steps}", f"--num_warmup_batches={args.warmup_steps}", "--device=cpu",
                   "--data_format=NHWC", "--variable_update=horovod", "--optimizer=sgd", "--weight_decay=0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as outputs:
        per_rank = ["--output-filename", outputs] if method == "peer" else []
        done = subprocess.run([*mpirun(ranks), *per_rank, *command], capture_output=True, text=True, timeout=1800,
                              env=env)
        if method == "ours":
            results = markers.payloads_of(done.stdout.splitlines(), markers.RESULT)
            rate = results[0]["images_per_sec"] if len(results) == 1 else None
        else:
            found = [float(x) for path in Path(outputs).glob("*/rank.0/stdout")
                     for x in PEER_RATE.findall(path.read_text())]
            rate = found[0] if len(found) == 1 else None
    if done.returncode != 0 or rate is None:
        raise SystemExit(f"{method} on {ranks} rank(s): exit {done.returncode}, "
                         f"{'no rate' if rate is None else 'rate'} found: {done.stderr[-2000:]}")
    return rate


def peer_layer_choices(tf, layer):
    """The layer as tf_cnn_benchmarks' ResNet builds it: a convolution followed by a batch norm has no bias
    (convnet_builder.conv with use_batch_norm=True; its batch norms keep their scale, resnet_model's
    batch_norm_config)."""
    config = layer.get_config()
    if isinstance(layer, tf.keras.layers.Conv2D):
        config["use_bias"] = False
    return layer.__class__.from_config(config)


def cause_worker(args) -> dict:
    """In one process on one core: our step on Keras' ResNet-50 and on it rebuilt with the peer's convolutions."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import tensorflow as tf

    from containerbench.rank import bench
    from containerbench.rank.distribution import Horovod

    ours_args = bench.parse_args(["--model", "resnet50", "--image-size", str(IMAGE_SIZE), "--batch-size",
                                  str(args.batch_size), "--warmup-steps", "0", "--steps", "1"])
    bench.configure_devices(tf, bench.local_rank_hint(), 0)
    mode = Horovod(ours_args)
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    steps, weights = {}, {}
    for name in ("keras", "peer_layers"):
        model, optimizer, _ = bench.build_model(tf, ours_args)
        if name == "peer_layers":
            model = tf.keras.models.clone_model(model, clone_function=lambda layer: peer_layer_choices(tf, layer))
        optimizer.build(model.trainable_variables)
        next_batch, source = bench.input_source(tf, mode, ours_args, shape)
        steps[name] = (mode.make_step(tf, model, optimizer, next_batch, ours_args), source)
        weights[name] = {"trainable_tensors": len(model.trainable_variables), "weights": model.count_params()}

    def one_step(name: str) -> float:
        step, source = steps[name]
        with contextlib.redirect_stdout(io.StringIO()):  # the per-step line, kept off the terminal
            _, step_times, _, _, _ = bench.measure(step, lambda: source, ours_args, 0, args.batch_size)
        return step_times[0]

    for name in steps:
        one_step(name)  # tracing and allocation, not timed
    times = {name: [] for name in steps}
    for pair in range(args.cause_pairs):
        for name in ("keras", "peer_layers") if pair % 2 == 0 else ("peer_layers", "keras"):
            times[name].append(one_step(name))
    ratios = [k / p for k, p in zip(times["keras"], times["peer_layers"])]
    return {"step_s": {name: statistics.median(series) for name, series in times.items()},
            "keras_over_peer_layers": ratios, **{f"{name}_model": w for name, w in weights.items()}}


def measure_causes(args) -> None:
    from containerbench.intervals import paired_ratio_interval

    argv = [args.bench_python, __file__, "--cause-worker", "--batch-size", str(args.batch_size),
            "--cause-pairs", str(args.cause_pairs)]
    done = subprocess.run([*mpirun(1), *argv], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT / "src")})
    lines = [line for line in done.stdout.splitlines() if line.startswith(CAUSE_PREFIX)]
    if done.returncode != 0 or len(lines) != 1:
        raise SystemExit(f"the cause worker failed (exit {done.returncode}): {done.stderr[-2000:]}")
    found = json.loads(lines[0][len(CAUSE_PREFIX):])
    ratios = found["keras_over_peer_layers"]
    interval = paired_ratio_interval(ratios, [1.0] * len(ratios))
    for name in ("keras", "peer_layers"):
        model = found[f"{name}_model"]
        print(f"tf-peer: model definition, one core: {name:<11} step {found['step_s'][name]:.3f} s (median), "
              f"{model['trainable_tensors']} trainable tensors, {model['weights']:,} weights", flush=True)
    print(f"tf-peer: model definition: Keras' step / the peer's layer choices' {interval.ratio:.3f} "
          f"({interval.low:.3f}..{interval.high:.3f}, {len(ratios)} paired steps, paired 95%)", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cause_worker:
        print(CAUSE_PREFIX + json.dumps(cause_worker(args)), flush=True)
        return 0
    from containerbench.intervals import paired_ratio_interval

    if args.ranks:  # the runs' settings; --causes alone prints its own
        print(f"tf-peer: resnet50 {IMAGE_SIZE}px batch {args.batch_size}/rank fp32, {args.warmup_steps} warmup + "
              f"{args.steps} measured steps, {args.rounds} round(s), synthetic data", flush=True)
    methods = ("ours", "peer")
    for ranks in args.ranks:
        rates = {method: [] for method in methods}
        for round_ in range(args.rounds):
            for method in (methods if round_ % 2 == 0 else methods[::-1]):
                rates[method].append(launch(method, ranks, args))
        binding = "unbound" if ranks == 1 else "a core per rank"
        for method in methods:
            series = rates[method]
            spread = statistics.stdev(series) / statistics.mean(series) if len(series) > 1 else float("nan")
            print(f"tf-peer: {ranks} rank(s) ({binding}) {method:<4} {statistics.mean(series):7.2f} img/s "
                  f"(CV {100 * spread:.1f}%; runs: {', '.join(f'{x:.2f}' for x in series)})", flush=True)
        interval = paired_ratio_interval(rates["ours"], rates["peer"])
        print(f"tf-peer: {ranks} rank(s) ours/peer {interval.ratio:.3f} ({interval.low:.3f}..{interval.high:.3f}, "
              f"{args.rounds} paired rounds, paired 95%), {interval.significance()}", flush=True)
    if args.causes:
        measure_causes(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
