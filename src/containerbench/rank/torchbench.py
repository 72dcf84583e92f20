"""Data-parallel training benchmark, PyTorch: DistributedDataParallel, the same record as bench.py.

The TensorFlow harness's twin, so that frameworks compare like with like: the same model
(torchmodels.py), warmup apart, every step timed on every rank, total = sum of the ranks'
rates, the weights' checksum from every rank, the local compute probe, and one result
marker line that the workflow parses into the same run record.

Ranks come from the launcher (mpirun, srun, none) through MPI; rank 0 picks the rendezvous
address on the fabric's interface and sends it to the others over MPI, so no host list is
written anywhere. Backend: nccl on GPUs, gloo on CPUs.

    python -m containerbench.rank.torchbench --batch-size 8 --image-size 64 --steps 10
    mpirun -np 2 python -m containerbench.rank.torchbench --precision mixed_bfloat16 ...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import socket
import sys
import time

from containerbench.rank import telemetry
from containerbench.rank.bench import (  # measure: the TensorFlow harness's loop, shared
    batch_digest_bytes,
    local_rank_hint,
    measure,
    mpi_library,
    run_and_report,
    total_line,
    weights_digest,
)
from containerbench.rank.distribution import BackendUnavailable, choose_backend, rendezvous
from containerbench.rank.stepclocks import HostClock

ENTRY_UNIX_TIME = time.time()  # before torch's import: start-up cost counts

MODES = ("ddp", "local")  # local: no gradient exchange (the compute-only bound; ranks must diverge)
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")  # the TF harness's names, for one config
BACKENDS = ("auto", "gloo", "nccl")


def parse_args(argv=None):
    from containerbench.rank.torchmodels import MODELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="resnet50")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup-steps", type=int, default=10, help="run, not measured (allocation, compilation)")
    parser.add_argument("--steps", type=int, default=100, help="measured steps")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="mixed_*: autocast to float16 (with a GradScaler) or bfloat16")
    parser.add_argument("--data-format", choices=("channels_last", "channels_first"), default="channels_last",
                        help="the memory format of the model and its input")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--mode", choices=MODES, default="ddp")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl on GPUs, gloo on CPUs")
    parser.add_argument("--probe-steps", type=int, default=0,
                        help="after the measured steps, time this many local steps with no communication")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads; 0 = the CPUs this rank may use")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--data-dir", help="ImageNet TFRecords (as TensorFlow's --data-dir); default: synthetic data")
    parser.add_argument("--data-workers", type=int, default=0,
                        help="DataLoader worker processes per rank; 0 = one fewer than the CPUs this rank may use "
                             "(at least 1)")
    parser.add_argument("--runtime", default=os.environ.get("CONTAINERBENCH_RUNTIME", "bare-metal"))
    parser.add_argument("--telemetry-dir", help="each node's local rank 0 samples the node into DIR/<host>.csv")
    parser.add_argument("--telemetry-interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--telemetry-services", default="",
                        help="comma-separated names of the runtime's and launcher's processes on the node")
    args = parser.parse_args(argv)
    for name in ("batch_size", "image_size", "steps", "warmup_steps", "probe_steps", "data_workers"):
        if getattr(args, name) < (0 if name in ("warmup_steps", "probe_steps", "data_workers") else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def synthetic_batch(torch, args, device, rank: int):
    """Each rank its own random batch: had gradients not been averaged, weights would drift apart."""
    generator = torch.Generator().manual_seed(args.seed + rank)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(0, 1000, (args.batch_size,), generator=generator)
    return images.to(device, memory_format=memory_format(torch, args)), labels.to(device)


def input_batches(torch, args, device, ranks):
    """(next_batch, what a batch is): one random batch held on the device (synthetic, as TF's), or
    this rank's share of the TFRecords through DataLoader workers, each batch copied to the device
    as the step takes it (its wait is in the step's time, as tf.data's is in TF's step)."""
    if not args.data_dir:
        batch = synthetic_batch(torch, args, device, ranks.rank)
        return (lambda: batch), "synthetic data"
    from containerbench.rank import torchdata

    workers = args.data_workers or max(1, len(os.sched_getaffinity(0)) - 1)
    batches = torchdata.loader(args.data_dir, args.batch_size, args.image_size, ranks.rank, ranks.size, args.seed,
                               workers, pin_memory=device.type == "cuda")

    def next_batch():
        images, labels = next(batches)
        return (images.to(device, memory_format=memory_format(torch, args), non_blocking=True),
                labels.to(device, non_blocking=True))

    return next_batch, f"data {args.data_dir} ({workers} DataLoader worker(s) per rank)"


def memory_format(torch, args):
    return torch.channels_last if args.data_format == "channels_last" else torch.contiguous_format


def data_parallel(torch, model, device):
    """The model in DistributedDataParallel, as every run of the harness wraps it (DDP's defaults; with its
    gradients as views into the all-reduce buckets, two runs of benchmarks/torch_harness_speed.py at 224 px moved
    ours/reference by +4% and -6%: within this VM's noise, so not taken)."""
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)


def make_step(torch, model, optimizer, args, device):
    """One step: forward under autocast, backward (DDP all-reduces the gradients as they are ready), update."""
    dtype = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "mixed_float16")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(images).float(), labels)  # the loss in float32, as on the TF side
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()  # read by measure(): at once on a CPU, a step later on a GPU

    return step


class CudaClock:
    """GPU: CUDA events on the stream around each step; the host reads step i (its time and loss)
    once step i+1 is queued, so that the GPU need not drain between steps, as in a plain training
    loop. (With a per-step .item() our loop ran at 0.92-0.95 of a plain one on an H200 at batch 256;
    with this clock, 1.001 on an H100: docs/frameworks.md.)"""
    name = "cuda_events"
    lag = 1
    running = staticmethod(contextlib.nullcontext)

    def __init__(self, torch):
        self.torch = torch

    def mark(self):
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def hold(loss):
        """The loss copied to the host in the stream's order, behind its step: reading it later
        waits for that step, not for everything queued after it (as .item() would)."""
        return loss.to("cpu", non_blocking=True)

    @staticmethod
    def seconds(start, end, held) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000


def clock_for(torch, device):
    return CudaClock(torch) if device.type == "cuda" else HostClock


def local_compute_rate(torch, model, batch, args) -> float:
    """Images/s of forward + backward on this rank alone, no all-reduce, no update (bench.local_compute_rate)."""
    module = getattr(model, "module", model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def local_step():
        module.zero_grad(set_to_none=True)
        loss_fn(module(batch[0]).float(), batch[1]).backward()
        return sum(float(p.grad.sum()) for p in module.parameters() if p.grad is not None)

    local_step()  # not measured
    started = time.perf_counter()
    for _ in range(args.probe_steps):
        local_step()
    return args.batch_size * args.probe_steps / (time.perf_counter() - started)


def train(torch, ranks, args, device, backend: str) -> tuple[dict, dict]:
    """This rank's part (bench.train's fields) and the run's distribution settings."""
    from containerbench.rank.torchmodels import build

    mine = {"rank": ranks.rank, "local_rank": ranks.local_rank, "hostname": socket.gethostname(),
            "entry_unix_time": ENTRY_UNIX_TIME, "cpus": len(os.sched_getaffinity(0)),
            "context": telemetry.rank_context()}
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model, source = build(args.model)
    model = model.to(device, memory_format=memory_format(torch, args))
    distribution = {"backend": backend if args.mode == "ddp" else "none", "model_source": source,
                    "compile": args.compile}
    if args.mode == "ddp":  # at one rank too: the harness costs what it costs at every size
        address = rendezvous(ranks, torch, backend)
        distribution.update(rendezvous=f"tcp://{address['host']}:{address['port']}", socket_host=address["host"],
                            socket_interface=address["interface"], socket_host_from=address["from"])
        model = data_parallel(torch, model, device)
    if args.compile:
        model = torch.compile(model)
    # Plain SGD, as on the TF side (Horovod's synthetic benchmark, tf_cnn_benchmarks).
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    next_batch, input_description = input_batches(torch, args, device, ranks)
    mine["setup_s"] = time.time() - ENTRY_UNIX_TIME
    if ranks.rank == 0:
        print(f"containerbench: {args.model} {args.image_size}px batch {args.batch_size}/rank, {ranks.size} rank(s), "
              f"PyTorch {args.mode} over {distribution['backend']}, {input_description}, {args.precision}, "
              f"{args.data_format}{', torch.compile' if args.compile else ''}, "
              f"{args.warmup_steps} warmup + {args.steps} measured steps", flush=True)
    step, clock = make_step(torch, model, optimizer, args, device), clock_for(torch, device)
    if clock is not HostClock:  # a key only GPU runs have, as the TensorFlow harness's QueuedClock
        distribution["step_clock"] = clock.name
    (mine["warmup_step_s"], mine["step_s"], mine["harness_overhead_fraction"], mine["window"],
     mine["loss"]) = measure(step, next_batch, args, ranks.rank, args.batch_size, clock)
    mine["images_per_sec"] = args.batch_size * args.steps / sum(mine["step_s"])
    # One batch of this rank's input, outside the timed steps: the evidence that each rank had its own data.
    batch = next_batch()
    mine["batch_digest"] = batch_digest_bytes(batch[0].cpu().numpy().tobytes(), batch[1].cpu().numpy().tobytes())
    mine["probe_images_per_sec"] = local_compute_rate(torch, model, batch, args) if args.probe_steps else None
    parameters = [p.detach().float().cpu().numpy() for p in getattr(model, "module", model).parameters()]
    mine["weights"] = weights_digest(parameters)
    mine["parameters"] = int(sum(p.size for p in parameters))
    mine["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    mine["peak_host_memory_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return mine, distribution


def versions(torch, mpi_version: str | None) -> dict:
    from containerbench.rank.torchmodels import torchvision_version

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision_version(),
            "cuda": torch.version.cuda, "nccl": nccl, "mpi": mpi_version}


def run(args) -> dict | None:
    """Train on every rank; rank 0 returns the run's result (the others None)."""
    import torch

    from containerbench.rank.bench import run_result
    from containerbench.rank.distribution import MpiRanks

    mpi_version = mpi_library()
    ranks = MpiRanks()
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    backend = choose_backend(torch, args.backend)
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    device = torch.device("cuda", local_rank_hint() % len(gpus)) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(device)
    mine, distribution = train(torch, ranks, args, device, backend)
    everyone = ranks.allgather(mine)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if ranks.rank != 0:
        return None
    result = run_result(args, ranks.size, distribution, everyone, gpus, versions(torch, mpi_version))
    result.update(framework="pytorch", torch_compile=args.compile, xla=False)
    print(total_line(result, distribution["backend"]), flush=True)
    return result


def main(argv=None) -> int:
    return run_and_report(parse_args(argv), run, (BackendUnavailable,))


if __name__ == "__main__":
    sys.exit(main())
