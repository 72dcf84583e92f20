"""Data-parallel training benchmark (TensorFlow; Horovod, collective or parameter-server).

In the spirit of Horovod's tensorflow2_synthetic_benchmark.py, with what a
reviewer needs on top: every step timed on every rank after warmup, a result
gathered from all ranks (total = sum of the ranks' rates), and a checksum of the
trained weights from every rank that proves gradients really were averaged.
How ranks cooperate is the mode (distribution.py); what they train on is
synthetic tensors or ImageNet TFRecords (datasets.py).

    python -m containerbench.rank.bench --batch-size 8 --image-size 64 --steps 10
    mpirun -np 2 python -m containerbench.rank.bench --mode collective --data-dir DIR ...

Rank 0 prints one human line per measured step and, at the end, one result
marker line (markers.RESULT + JSON) that the workflow parses into the run record.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import resource
import socket
import sys
import time

from containerbench.rank import faults, markers, stepclocks, telemetry
from containerbench.rank.distribution import MODES  # no TensorFlow import: parsing stays instant

ENTRY_UNIX_TIME = time.time()  # before TensorFlow's import: start-up cost counts

# cnn_smoke: a plumbing check (every runtime, launcher and fabric path in seconds); its figures say
# nothing of ResNet-50's. torchmodels.cnn_smoke is the same network.
MODELS = ("resnet50", "resnet101", "resnet152", "inception_v3", "vgg16", "cnn_smoke")
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="resnet50")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup-steps", type=int, default=10, help="run, not measured (tracing, allocation)")
    parser.add_argument("--steps", type=int, default=100, help="measured steps")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--xla", action="store_true", help="compile the training step with XLA")
    parser.add_argument("--data-format", choices=("channels_last", "channels_first"), default="channels_last")
    parser.add_argument("--mode", choices=MODES, default="horovod", help="how ranks combine gradients")
    parser.add_argument("--collective", choices=("auto", "ring", "nccl"), default="auto",
                        help="collective mode: TensorFlow's all-reduce implementation")
    parser.add_argument("--pack-bytes", type=int, default=64 * 2**20,
                        help="collective mode: gradients per all-reduce (Horovod's fusion buffer is 64 MiB)")
    parser.add_argument("--parameter-servers", type=int, default=1, help="parameter-server modes: how many")
    parser.add_argument("--data-dir", help="ImageNet TFRecords (train-*-of-*); default: synthetic data")
    parser.add_argument("--probe-steps", type=int, default=0,
                        help="after the measured steps, time this many local steps with no communication, "
                             "per rank: finds a slow node that synchronous training hides")
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads; 0 = the CPUs this rank may use")
    parser.add_argument("--step-clock", choices=stepclocks.CHOICES, default="auto",
                        help="how steps are timed (stepclocks.py); auto: queued on GPUs, host on CPUs")
    parser.add_argument("--seed", type=int, default=1234,
                        help="initial weights: the same in every runtime, so that loss trajectories can be compared")
    parser.add_argument("--runtime", default=os.environ.get("CONTAINERBENCH_RUNTIME", "bare-metal"))
    parser.add_argument("--telemetry-dir", help="each node's local rank 0 samples the node into DIR/<host>.csv")
    parser.add_argument("--telemetry-interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--telemetry-services", default="",
                        help="comma-separated names of the runtime's and launcher's processes on the node")
    args = parser.parse_args(argv)
    for name in ("batch_size", "image_size", "steps", "warmup_steps", "probe_steps", "parameter_servers"):
        if getattr(args, name) < (0 if name in ("warmup_steps", "probe_steps") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.mode.startswith("parameter_server") and args.step_clock == stepclocks.QUEUED:
        parser.error(f"--step-clock queued: mode {args.mode}'s steps are scheduled by its coordinator; "
                     "allowed there: auto, host")
    if args.mode.startswith("parameter_server") and args.precision == "mixed_float16":
        # Keras' loss-scale optimizer refuses ParameterServerStrategy
        # (keras/src/mixed_precision/loss_scale_optimizer.py, _raise_if_strategy_unsupported)
        parser.error(f"--precision mixed_float16: mode {args.mode} cannot scale the loss (Keras' loss-scale "
                     "optimizer refuses ParameterServerStrategy); allowed there: fp32, mixed_bfloat16")
    return args


def detect_launcher() -> str:
    """Who started this rank, judged from the variables each launcher sets."""
    if "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ:
        return "srun"
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return "mpirun"
    if "PMI_RANK" in os.environ or "PMIX_RANK" in os.environ:
        return "mpiexec"
    if "HOROVOD_RANK" in os.environ:
        return "horovodrun"
    return "none"


def mpi_library() -> str | None:
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # the mode initialises MPI (Horovod itself, or mpi4py)
        from mpi4py import MPI

        # Open MPI ends the string with a NUL; keep the record clean.
        return MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    except ImportError:
        return None


def configure_devices(tf, local_rank: int, threads: int) -> list[str]:
    """Pin one GPU per local rank; size TF's thread pool to this rank's CPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    tf.config.threading.set_intra_op_parallelism_threads(threads or len(os.sched_getaffinity(0)))
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return [gpu.name for gpu in gpus]


def local_rank_hint() -> int:
    """The launcher's local rank, known before any mode starts (GPUs are pinned first)."""
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def build_model(tf, args):
    if args.precision != "fp32":
        tf.keras.mixed_precision.set_global_policy(args.precision)
    tf.keras.backend.set_image_data_format(args.data_format)
    side = args.image_size
    shape = (side, side, 3) if args.data_format == "channels_last" else (3, side, side)
    constructor = {
        "cnn_smoke": cnn_smoke,
        "resnet50": tf.keras.applications.ResNet50,
        "resnet101": tf.keras.applications.ResNet101,
        "resnet152": tf.keras.applications.ResNet152,
        "inception_v3": tf.keras.applications.InceptionV3,
        "vgg16": tf.keras.applications.VGG16,
    }[args.model]
    # Logits out, loss in float32: the softmax must not run in float16.
    model = constructor(weights=None, input_shape=shape, classes=1000, classifier_activation=None)
    # Plain SGD, as Horovod's synthetic benchmark and tf_cnn_benchmarks (its default): momentum
    # would add a pass over all weights per step (measured: about 3% at 64 px on a CPU).
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
    if args.precision == "mixed_float16":
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return model, optimizer, shape


def cnn_smoke(weights, input_shape, classes, classifier_activation):
    """Two convolutions with batch norm, global pooling and the classifier (38,136 weights): the
    keyword arguments of tf.keras.applications, so that it is built as the others are."""
    import tensorflow as tf

    layers = tf.keras.layers
    channels = -1 if tf.keras.backend.image_data_format() == "channels_last" else 1
    return tf.keras.Sequential([
        tf.keras.Input(input_shape),
        layers.Conv2D(16, 3, padding="same", use_bias=False), layers.BatchNormalization(axis=channels), layers.ReLU(),
        layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False), layers.BatchNormalization(axis=channels),
        layers.ReLU(), layers.GlobalAveragePooling2D(), layers.Dense(classes, activation=classifier_activation),
    ], name="cnn_smoke")


def input_source(tf, mode, args, shape):
    """(next_batch, step arguments): next_batch runs inside the compiled step, so input costs are in it.

    The harness says what the data is (a TFRecord pipeline for a shard, or a random batch);
    the mode says who reads it (every rank its own share, or each worker for the coordinator).
    """
    from containerbench.rank import datasets

    def real_data(shard: int, shards: int):
        return datasets.imagenet_pipeline(tf, args.data_dir, args.batch_size, args.image_size, shard, shards,
                                          args.data_format == "channels_first")

    def random_batch(seed: int):
        return datasets.synthetic_batch(tf, args.batch_size, shape, seed=seed)

    return mode.input_source(tf, real_data if args.data_dir else None, random_batch)


def fixed_batch(tf, args, shape):
    """One batch, the same in every run of a point: the synthetic batch the parameter servers' workers train on
    (stateless: the same values wherever it is made), or the data's first images unaugmented."""
    from containerbench.rank import datasets

    if args.data_dir:
        return datasets.fixed_batch(tf, args.data_dir, args.batch_size, args.image_size,
                                    args.data_format == "channels_first")
    return datasets.synthetic_batch(tf, args.batch_size, shape, seed=1234)


def weights_digest(arrays) -> dict:
    """Digest and sums of a model's weights (numpy arrays): ranks that averaged gradients agree."""
    digest = hashlib.sha256()
    sums = []
    for values in arrays:
        digest.update(values.tobytes())
        sums.append(float(values.sum(dtype="float64")))
    return {"sha256": digest.hexdigest()[:16], "sum": float(sum(sums)), "abs_sum": float(sum(abs(x) for x in sums))}


def batch_digest_bytes(images: bytes, labels: bytes) -> dict:
    """Short digests of one batch: ranks that trained on the same data show the same ones (records.py)."""
    return {"images": hashlib.sha256(images).hexdigest()[:16], "labels": hashlib.sha256(labels).hexdigest()[:16]}


def local_compute_rate(tf, model, images, labels, args) -> float:
    """Images/s of forward + backward on this rank alone, no allreduce, no update.

    In synchronous training every rank waits in the allreduce for the slowest,
    so per-rank step times converge; this probe shows each node's own speed.
    """

    from containerbench.rank.distribution import training_loss

    @tf.function(jit_compile=args.xla)
    def local_step():
        with tf.GradientTape() as tape:
            loss = training_loss(tf, model, images, labels)
        gradients = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in gradients])  # waits for every gradient

    float(local_step())  # tracing, not measured
    started = time.perf_counter()
    for _ in range(args.probe_steps):
        float(local_step())
    return args.batch_size * args.probe_steps / (time.perf_counter() - started)


def measure(step, next_batch, args, rank: int, images_per_step: int, clock=stepclocks.HostClock):
    """Warmup, then measured steps: `step(*next_batch())` returns a step's loss, which `clock` times (a
    step's wall time includes waiting for its result). Rank 0 prints a line per step. Also the measured
    window (wall clock and this rank's CPU time), for the telemetry."""
    warmup_times, step_times, losses = [], [], []
    spans, held = [], []
    loop_started, window = time.perf_counter(), {"start_unix": time.time(), "cpu_s": telemetry.cpu_seconds()}

    def report(index: int) -> None:
        nonlocal loop_started, window
        elapsed = clock.seconds(*spans[index], held[index])
        loss = float(held[index])
        measured = index >= args.warmup_steps
        (step_times if measured else warmup_times).append(elapsed)
        losses.append(loss)
        if rank == 0:
            label = (f"step {index - args.warmup_steps + 1}/{args.steps}" if measured
                     else f"warmup {index + 1}/{args.warmup_steps}")
            print(f"  {label}: {elapsed:.3f} s  {images_per_step / elapsed:8.2f} img/s (rank 0)  loss {loss:.3f}",
                  flush=True)
        if index + 1 == args.warmup_steps:  # the measured window opens once the last warmup step is reported
            loop_started, window = time.perf_counter(), {"start_unix": time.time(), "cpu_s": telemetry.cpu_seconds()}

    total = args.warmup_steps + args.steps
    for index in range(total):
        started = clock.mark()
        held.append(clock.hold(step(*next_batch())))
        spans.append((started, clock.mark()))
        if index >= clock.lag:
            report(index - clock.lag)
    for index in range(total - clock.lag, total):
        report(index)
    loop_s = time.perf_counter() - loop_started
    window = {**window, "end_unix": time.time(), "cpu_s": telemetry.cpu_seconds() - window["cpu_s"]}
    return warmup_times, step_times, (loop_s - sum(step_times)) / sum(step_times), window, losses


def trace(train_step, source) -> float | None:
    """The compile phase on its own: the step's graph traced (one core's Python; 3-4 s for ResNet-50 on this
    machine's CPUs) before the first warmup step, which then runs that graph, so rank 0's log says what tracing
    cost instead of hiding it in the first step. None where the step is not one tf.function (a parameter-server
    coordinator's)."""
    if not hasattr(train_step, "get_concrete_function"):
        return None
    started = time.perf_counter()
    train_step.get_concrete_function(*source)
    return time.perf_counter() - started


def train(tf, np, mode, args, gpu_names: list[str], clock) -> dict:
    """This rank's part: build, warm up, time the measured steps (by `clock`), probe, checksum the weights."""
    mine = {"rank": mode.rank, "local_rank": mode.local_rank, "hostname": socket.gethostname(),
            "entry_unix_time": ENTRY_UNIX_TIME, "cpus": len(os.sched_getaffinity(0)),
            "context": telemetry.rank_context()}
    if mode.coordinator:
        with mode.scope():
            model, optimizer, shape = build_model(tf, args)
            optimizer.build(model.trainable_variables)
        next_batch, source = input_source(tf, mode, args, shape)
        train_step = mode.make_step(tf, model, optimizer, next_batch, args)
        mode.start(model, optimizer)
        # A parameter-server step is one batch on every worker; the other modes time one rank's batch.
        per_step = args.batch_size * (1 if mode.measures_all_ranks else mode.size)
        mine["setup_s"] = time.time() - ENTRY_UNIX_TIME
        traced_s = trace(train_step, source)
        if mode.rank == 0:
            print(f"containerbench: {args.model} {args.image_size}px batch {args.batch_size}/rank, "
                  f"{mode.size} rank(s), mode {args.mode}, "
                  f"{'data ' + args.data_dir if args.data_dir else 'synthetic data'}, "
                  f"{args.precision}{', XLA' if args.xla else ''}, "
                  f"{args.warmup_steps} warmup + {args.steps} measured steps", flush=True)
            if traced_s is not None:
                print(f"  trace: the training step's graph in {traced_s:.2f} s (not measured)", flush=True)
        with clock.running():
            (mine["warmup_step_s"], mine["step_s"], mine["harness_overhead_fraction"], mine["window"],
             mine["loss"]) = measure(train_step, lambda: source, args, mode.rank, per_step, clock)
        # Parameter servers: staleness, the weights as every worker reads them, the loss at equal images (a key
        # only their records have: the others keep the shape of the recorded runs the fast tests read).
        if (updates := mode.updates(tf, model, mine["window"], lambda: fixed_batch(tf, args, shape))) is not None:
            mine["updates"] = updates
            if completed := updates.pop("step_s_completed", None):  # asynchronous
                mine["step_s_read"], mine["step_s"] = mine["step_s"], completed
                print(f"  the {args.steps} measured steps as the workers completed them: {sum(completed):.3f} s, "
                      f"{per_step * args.steps / sum(completed):.2f} img/s (the lines above: as rank 0 read them)",
                      flush=True)
        mine["images_per_sec"] = per_step * args.steps / sum(mine["step_s"])
        mine["probe_images_per_sec"] = mine["peak_gpu_memory_bytes"] = mine["batch_digest"] = None
        # One batch of this rank's input, outside the timed steps: the evidence that each rank had its
        # own data, and what the probe times this rank's own compute on (a coordinator that only
        # schedules has neither: its workers read their batches themselves).
        if mode.measures_all_ranks:
            images, labels = next_batch(*source)
            mine["batch_digest"] = batch_digest_bytes(images.numpy().tobytes(), labels.numpy().tobytes())
            if args.probe_steps:
                mine["probe_images_per_sec"] = local_compute_rate(tf, model, images, labels, args)
        mine["weights"] = weights_digest([v.numpy() for v in model.trainable_variables])
        mine["parameters"] = int(sum(np.prod(v.shape) for v in model.trainable_variables))
        if gpu_names:
            mine["peak_gpu_memory_bytes"] = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    mode.finish()
    mine["peak_host_memory_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return mine


def run_result(args, size: int, distribution: dict, ranks: list[dict], gpu_names: list[str], versions: dict) -> dict:
    """The run's result, from every rank's part: total = sum of the ranks' rates, weights compared.
    Both frameworks' harnesses (torchbench.py) give the same shape."""
    measured = [r for r in ranks if "step_s" in r]
    # The parameter servers' one copy, as the coordinator and every worker read it (the same reduction); else each
    # rank's own weights.
    updates = next((r["updates"] for r in measured if r.get("updates")), None)
    read = [updates["coordinator_weights"], *updates["worker_weights"]] if updates else [r["weights"] for r in measured]
    sums = [w["sum"] for w in read]
    scale = max(max(w["abs_sum"] for w in read), 1e-30)
    return {
        "kind": "train",
        "framework": "tensorflow",
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "precision": args.precision,
        "xla": getattr(args, "xla", False),
        "data_format": args.data_format,
        "data": "real" if getattr(args, "data_dir", None) else "synthetic",
        "data_dir": getattr(args, "data_dir", None),
        "mode": args.mode,
        "distribution": distribution,
        "ranks": size,
        "nodes": len({r["hostname"] for r in ranks}),
        "hostnames": [r["hostname"] for r in ranks],
        "launcher": detect_launcher(),
        "runtime": args.runtime,
        "images_per_sec": sum(r["images_per_sec"] for r in measured),
        "per_rank": measured,
        "processes": [{k: r[k] for k in ("rank", "hostname", "entry_unix_time", "peak_host_memory_bytes", "context")}
                      for r in ranks],
        # What one step's gradient all-reduce must move (the traffic check, records.py).
        "parameters": sum(r.get("parameters", 0) for r in measured[:1]),
        # Mode local: false. Parameter servers: every worker read the coordinator's weights.
        "weights_identical": len({r["weights"]["sha256"] for r in measured}) == 1 and len(set(sums)) == 1,
        # Each rank trained on its own data (digests of one batch each); None where the ranks that
        # measured read no batch themselves (parameter_server: the workers do).
        "batches_distinct": (len({(r["batch_digest"]["images"], r["batch_digest"]["labels"]) for r in measured})
                             == len(measured) if all(r.get("batch_digest") for r in measured) else None),
        "weights_max_relative_spread": (max(sums) - min(sums)) / scale,
        "gpus": gpu_names,
        "versions": versions,
        **({"updates": updates} if updates else {}),
    }


def run(args) -> dict | None:
    """Train on every rank; rank 0 returns the run's result (the others None)."""
    import numpy as np
    import tensorflow as tf

    from containerbench.rank.distribution import Collective, Horovod, Local
    from containerbench.rank.parameterservers import ParameterServer, ParameterServerAsync

    mpi_version = mpi_library()
    # Before any mode starts: TF's own modes start servers that fix the thread pools.
    gpu_names = configure_devices(tf, local_rank_hint(), args.threads)
    tf.keras.utils.set_random_seed(args.seed)  # Python, NumPy and TF: the same initial weights on every run
    modes = {each.name: each for each in (Horovod, Collective, ParameterServer, ParameterServerAsync, Local)}
    mode = modes[args.mode](args)
    clock = stepclocks.for_tensorflow(tf, args.step_clock, bool(gpu_names), mode.measures_all_ranks)
    ranks = mode.allgather(train(tf, np, mode, args, gpu_names, clock))
    if mode.rank != 0:
        return None
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__, "horovod": _version("horovod"),
                "mpi": mpi_version}
    distribution = mode.describe(bool(gpu_names))
    if clock is not stepclocks.HostClock:  # a key only such runs have: CPU records keep the recorded runs' shape
        distribution["step_clock"] = clock.name
    result = run_result(args, mode.size, distribution, ranks, gpu_names, versions)
    print(total_line(result, result["distribution"]["backend"]), flush=True)
    return result


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def total_line(result: dict, backend: str) -> str:
    """Rank 0's closing human line (both frameworks' harnesses)."""
    rates, size = [r["images_per_sec"] for r in result["per_rank"]], result["ranks"]
    return (f"containerbench: total {result['images_per_sec']:.2f} img/s over {size} rank(s) "
            f"(per rank {result['images_per_sec'] / size:.2f}, spread {max(rates) - min(rates):.2f}), "
            f"backend {backend}; weights identical on all ranks: {result['weights_identical']}")


def run_and_report(args, run, refusals: tuple[type[Exception], ...]) -> int:
    """A harness's life around `run(args)`: the node's sampler, the result line with the provenance hash,
    or, for what this framework cannot do (`refusals`), a failure line with its reason instead of a
    traceback to dig in (exit 3)."""
    from containerbench.rank.provenance import provenance

    sampler = None
    if args.telemetry_dir:
        telemetry.register_rank(args.telemetry_dir)
        if local_rank_hint() == 0:
            sampler = telemetry.start_sampler(args.telemetry_dir, args.telemetry_interval,
                                                args.telemetry_services)
    try:
        result = run(args)
    except refusals as error:
        print(markers.FAILURE + str(error), flush=True)
        return 3
    finally:
        telemetry.stop_sampler(sampler)
    if result is not None:
        result["provenance"] = provenance()
        markers.emit(markers.RESULT, result)
        faults.after_result()
    return 0


def main(argv=None) -> int:
    from containerbench.rank.distribution import ModeUnsupported

    return run_and_report(parse_args(argv), run, (ModeUnsupported,))


if __name__ == "__main__":
    sys.exit(main())
