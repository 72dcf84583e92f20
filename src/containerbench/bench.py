"""Synthetic data-parallel training benchmark (TensorFlow + Horovod).

In the spirit of Horovod's tensorflow2_synthetic_benchmark.py, with what a
reviewer needs on top: every step timed on every rank after warmup, a result
gathered from all ranks (total = sum of the ranks' rates), and a checksum of the
trained weights from every rank that proves gradients really were averaged.

    python -m containerbench.bench --batch-size 8 --image-size 64 --steps 10
    mpirun -np 2 python -m containerbench.bench ...   (or srun, or horovodrun)

Rank 0 prints one human line per measured step and, at the end, one line
`containerbench-result {json}` that the workflow parses into the run record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import socket
import sys
import time

ENTRY_UNIX_TIME = time.time()  # before TensorFlow's import: start-up cost counts

MODELS = ("resnet50", "resnet101", "resnet152", "inception_v3", "vgg16")
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")
RESULT_PREFIX = "containerbench-result "


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
    parser.add_argument("--probe-steps", type=int, default=0,
                        help="after the measured steps, time this many local steps with no communication, "
                             "per rank: finds a slow node that synchronous training hides")
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads; 0 = the CPUs this rank may use")
    parser.add_argument("--runtime", default=os.environ.get("CONTAINERBENCH_RUNTIME", "bare-metal"))
    args = parser.parse_args(argv)
    for name in ("batch_size", "image_size", "steps", "warmup_steps", "probe_steps"):
        if getattr(args, name) < (0 if name in ("warmup_steps", "probe_steps") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
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

        mpi4py.rc.initialize = False  # Horovod initialises MPI itself
        from mpi4py import MPI

        # Open MPI ends the string with a NUL; keep the record clean.
        return MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    except ImportError:
        return None


def configure_devices(tf, hvd, threads: int) -> list[str]:
    """Pin one GPU per local rank; size TF's thread pool to this rank's CPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    cpus = threads or len(os.sched_getaffinity(0))
    tf.config.threading.set_intra_op_parallelism_threads(cpus)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return [gpu.name for gpu in gpus]


def build_model(tf, args):
    if args.precision != "fp32":
        tf.keras.mixed_precision.set_global_policy(args.precision)
    tf.keras.backend.set_image_data_format(args.data_format)
    side = args.image_size
    shape = (side, side, 3) if args.data_format == "channels_last" else (3, side, side)
    constructor = {
        "resnet50": tf.keras.applications.ResNet50,
        "resnet101": tf.keras.applications.ResNet101,
        "resnet152": tf.keras.applications.ResNet152,
        "inception_v3": tf.keras.applications.InceptionV3,
        "vgg16": tf.keras.applications.VGG16,
    }[args.model]
    # Logits out, loss in float32: the softmax must not run in float16.
    return constructor(weights=None, input_shape=shape, classes=1000, classifier_activation=None), shape


def weights_checksum(np, variables) -> dict:
    digest = hashlib.sha256()
    sums = []
    for variable in variables:
        values = variable.numpy()
        digest.update(values.tobytes())
        sums.append(float(np.sum(values, dtype=np.float64)))
    return {"sha256": digest.hexdigest()[:16], "sum": float(np.sum(sums)), "abs_sum": float(np.sum(np.abs(sums)))}


def local_compute_rate(tf, model, images, labels, args) -> float:
    """Images/s of forward + backward on this rank alone, no allreduce, no update.

    In synchronous training every rank waits in the allreduce for the slowest,
    so per-rank step times converge; this probe shows each node's own speed.
    """

    @tf.function(jit_compile=args.xla)
    def local_step():
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in gradients])  # waits for every gradient

    float(local_step())  # tracing, not measured
    started = time.perf_counter()
    for _ in range(args.probe_steps):
        float(local_step())
    return args.batch_size * args.probe_steps / (time.perf_counter() - started)


def run(args) -> dict | None:
    import numpy as np
    import tensorflow as tf
    import horovod
    import horovod.tensorflow as hvd

    mpi_version = mpi_library()
    hvd.init()
    gpu_names = configure_devices(tf, hvd, args.threads)
    model, shape = build_model(tf, args)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    if args.precision == "mixed_float16":
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)

    # Each rank trains on its own random batch: if gradients were not averaged,
    # the ranks' weights would drift apart and the checksum would show it.
    tf.random.set_seed(1234 + hvd.rank())
    images = tf.random.uniform((args.batch_size, *shape))
    labels = tf.random.uniform((args.batch_size,), maxval=1000, dtype=tf.int64)
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

    @tf.function(jit_compile=args.xla)
    def train_step():
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            scaled = optimizer.get_scaled_loss(loss) if args.precision == "mixed_float16" else loss
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(scaled, model.trainable_variables)
        if args.precision == "mixed_float16":
            gradients = optimizer.get_unscaled_gradients(gradients)
        update = optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        # Returning a value ordered after the update makes the host wait for
        # the whole step, so the wall time covers it (GPU streams included).
        with tf.control_dependencies([update]):
            return tf.identity(loss)

    rank, size = hvd.rank(), hvd.size()
    setup_s = time.time() - ENTRY_UNIX_TIME
    if rank == 0:
        print(f"containerbench: {args.model} {args.image_size}px batch {args.batch_size}/rank, "
              f"{size} rank(s), {args.precision}{', XLA' if args.xla else ''}, "
              f"{args.warmup_steps} warmup + {args.steps} measured steps", flush=True)
    warmup_times, step_times = [], []
    for step in range(args.warmup_steps + args.steps):
        started = time.perf_counter()
        loss = float(train_step())
        elapsed = time.perf_counter() - started
        measured = step >= args.warmup_steps
        (step_times if measured else warmup_times).append(elapsed)
        if rank == 0:
            label = f"step {step - args.warmup_steps + 1}/{args.steps}" if measured else f"warmup {step + 1}/{args.warmup_steps}"
            print(f"  {label}: {elapsed:.3f} s  {args.batch_size / elapsed:8.2f} img/s (rank 0)  loss {loss:.3f}", flush=True)

    probe_rate = local_compute_rate(tf, model, images, labels, args) if args.probe_steps else None
    gpu_peak = None
    if gpu_names:
        gpu_peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    mine = {
        "rank": rank,
        "local_rank": hvd.local_rank(),
        "hostname": socket.gethostname(),
        "entry_unix_time": ENTRY_UNIX_TIME,
        "setup_s": setup_s,
        "warmup_step_s": warmup_times,
        "step_s": step_times,
        "images_per_sec": args.batch_size * args.steps / sum(step_times),
        "probe_images_per_sec": probe_rate,
        "peak_host_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_gpu_memory_bytes": gpu_peak,
        "cpus": len(os.sched_getaffinity(0)),
        "weights": weights_checksum(np, model.trainable_variables),
    }
    ranks = hvd.allgather_object(mine)
    if rank != 0:
        return None

    sums = [r["weights"]["sum"] for r in ranks]
    scale = max(max(r["weights"]["abs_sum"] for r in ranks), 1e-30)
    result = {
        "kind": "train",
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "precision": args.precision,
        "xla": args.xla,
        "data_format": args.data_format,
        "data": "synthetic",
        "mode": "horovod",
        "ranks": size,
        "nodes": len({r["hostname"] for r in ranks}),
        "hostnames": [r["hostname"] for r in ranks],
        "launcher": detect_launcher(),
        "runtime": args.runtime,
        "images_per_sec": sum(r["images_per_sec"] for r in ranks),
        "per_rank": ranks,
        "weights_identical": len({r["weights"]["sha256"] for r in ranks}) == 1,
        "weights_max_relative_spread": (max(sums) - min(sums)) / scale,
        "gpus": gpu_names,
        "versions": {
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "horovod": horovod.__version__,
            "mpi": mpi_version,
        },
        "horovod": {
            "controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "cpu_operations": os.environ.get("HOROVOD_CPU_OPERATIONS", "mpi" if hvd.mpi_built() else "gloo"),
            "mpi_built": bool(hvd.mpi_built()),
            "gloo_built": bool(hvd.gloo_built()),
            "nccl_built": bool(hvd.nccl_built()),
        },
    }
    spread = max(r["images_per_sec"] for r in ranks) - min(r["images_per_sec"] for r in ranks)
    print(f"containerbench: total {result['images_per_sec']:.2f} img/s over {size} rank(s) "
          f"(per rank {result['images_per_sec'] / size:.2f}, spread {spread:.2f}); "
          f"weights identical on all ranks: {result['weights_identical']}", flush=True)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    from containerbench.provenance import provenance

    result = run(args)
    if result is not None:
        result["provenance"] = provenance()
        print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
