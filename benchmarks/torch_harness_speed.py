"""Is our PyTorch harness as fast as a plain DDP training loop over the same ResNet-50?

Side by side in one launch per rank count, interleaved round by round (the order reversed every other
round) so that a drift of the machine hits each alike, on one batch per rank:

- ours:      containerbench.rank.torchbench's step and measuring loop (autocast context, GradScaler, a
             loss read back every step, per-step timing, rank 0's line per step);
- reference: the loop of PyTorch's DDP tutorial, written out below: zero_grad, forward, loss,
             backward, step, timed over the round with one synchronisation at its end;
- plain:     at one rank, the same loop on the model without DDP, which one process does not need
             (DDP's own cost there).

Each method has its own model, built from one seed.

Also the harness overhead: time in our loop outside the timed steps, as a share of step time.

    .venv-bench-torch/bin/python benchmarks/torch_harness_speed.py [--quick] [--ranks 1 2]

Prints images/s per method (median of rounds), the ratios ours/reference and ours/plain (median of the
per-round ratios) and the overhead; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "torch-harness-speed "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="steps per round and method")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: a GPU per rank where torch sees one (NCCL), else the CPU (Gloo)")
    parser.add_argument("--precision", choices=("fp32", "mixed_float16", "mixed_bfloat16"), default="fp32")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 32 px, batch 2, 3 steps, 2 rounds "
                             "(the script proven to run; not the ratios to quote)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.image_size, args.batch_size, args.steps, args.rounds = 32, 2, 3, 2
    return args


def reference_round(torch, model, optimizer, images, labels, steps: int, precision: str = "fp32") -> float:
    """PyTorch's DDP tutorial loop (with its AMP recipe's autocast and GradScaler for mixed
    precision); seconds for `steps` steps, synchronised once at the end."""
    loss_fn = torch.nn.CrossEntropyLoss()
    dtype = {"mixed_float16": torch.float16, "mixed_bfloat16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(images.device.type, enabled=precision == "mixed_float16")
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(images.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    float(loss)
    if images.device.type == "cuda":  # the loss is ready before its step's backward and update: wait for them
        torch.cuda.synchronize()
    return time.perf_counter() - started


def worker(args) -> None:
    import torch

    from containerbench.rank import torchbench
    from containerbench.rank.distribution import MpiRanks, choose_backend
    from containerbench.rank.torchmodels import build

    ranks = MpiRanks()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    on_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    backend = choose_backend(torch, "nccl" if on_gpu else "gloo")
    device = torch.device("cuda", ranks.local_rank % torch.cuda.device_count()) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    bench_args = torchbench.parse_args(["--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
                                        "--warmup-steps", "0", "--steps", str(args.steps),
                                        "--precision", args.precision])
    torchbench.rendezvous(ranks, torch, backend)

    def resnet50():
        torch.manual_seed(0)  # the same weights in every method's model
        return build("resnet50")[0].to(device, memory_format=torch.channels_last)

    # Ours wrapped as the harness wraps it; the reference as PyTorch's DDP tutorial does; at one rank also the
    # tutorial's loop without DDP, which one process does not need (what DDP itself costs there).
    ours_model = torchbench.data_parallel(torch, resnet50(), device)
    ours_step = torchbench.make_step(torch, ours_model, torch.optim.SGD(ours_model.parameters(), lr=0.01),
                                     bench_args, device)
    models = {"reference": torch.nn.parallel.DistributedDataParallel(resnet50(),
                                                                     device_ids=[device.index] if on_gpu else None)}
    if ranks.size == 1:
        models["plain"] = resnet50()
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.01) for name, model in models.items()}
    batch = torchbench.synthetic_batch(torch, bench_args, device, ranks.rank)
    for _ in range(2):  # warmup of every method, not measured
        ours_step(*batch)
        for name, model in models.items():
            reference_round(torch, model, optimizers[name], *batch, 1, args.precision)
    rates = {"ours": [], **{name: [] for name in models}}
    ratios, overheads = [], []
    def ours_round():
        with contextlib.redirect_stdout(io.StringIO()):  # rank 0's step lines are part of the cost, not the output
            _, step_s, outside, _, _ = torchbench.measure(ours_step, lambda: batch, bench_args, ranks.rank,
                                                          args.batch_size, torchbench.clock_for(torch, device))
        overheads.append(outside)
        # The loop's wall time: the steps and what the loop adds between them.
        return args.batch_size * args.steps / (sum(step_s) * (1 + outside))

    def reference_rate(name):
        return args.batch_size * args.steps / reference_round(torch, models[name], optimizers[name], *batch,
                                                              args.steps, args.precision)

    order = ["ours", *models]
    for round_number in range(args.rounds):
        # The order reversed in every other round: whatever the first of a round pays, each pays alike.
        for name in order if round_number % 2 == 0 else order[::-1]:
            rates[name].append(ours_round() if name == "ours" else reference_rate(name))
        ratios.append({name: rates["ours"][-1] / rates[name][-1] for name in models})
    everyone = ranks.allgather({"rates": rates, "ratios": ratios, "overheads": overheads})
    torch.distributed.destroy_process_group()
    if ranks.rank == 0:
        total = {name: statistics.median(sum(r["rates"][name][i] for r in everyone) for i in range(args.rounds))
                 for name in rates}
        ratio = {name: statistics.median(statistics.mean(r["ratios"][i][name] for r in everyone)
                                         for i in range(args.rounds)) for name in models}
        overhead = statistics.median(o for r in everyone for o in r["overheads"])
        print(RESULT_PREFIX + json.dumps({"ranks": ranks.size, "device": device.type, "images_per_sec": total,
                                          "ratio": ratio, "overhead": overhead,
                                          "rounds": {name: [round(sum(r["rates"][name][i] for r in everyone), 2)
                                                            for i in range(args.rounds)] for name in rates}}),
              flush=True)


def launch(ranks: int, args) -> dict:
    command = [sys.executable, __file__, "--worker", "--image-size", str(args.image_size),
               "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--rounds", str(args.rounds),
               "--device", args.device, "--precision", args.precision]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMPI_MCA_btl": "self,tcp",
           "OMPI_MCA_btl_tcp_if_include": "lo", "NCCL_SOCKET_IFNAME": "lo", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    mpirun = [shutil.which("mpirun") or "mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
              "-np", str(ranks), "--bind-to", "core" if ranks <= (os.cpu_count() or 1) else "none"]
    done = subprocess.run([*mpirun, *command], capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        sys.exit(f"torch_harness_speed: {ranks} rank(s) failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return json.loads(lines[0][len(RESULT_PREFIX):])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    print(f"ResNet-50, {args.image_size} px, batch {args.batch_size}/rank, {args.precision}, device {args.device}, "
          f"{args.rounds} rounds x {args.steps} steps per method, interleaved")
    for ranks in args.ranks:
        result = launch(ranks, args)
        rates = result["images_per_sec"]
        print(f"{ranks} rank(s) on {result['device']}: ours {rates['ours']:.2f} img/s, "
              f"reference DDP loop {rates['reference']:.2f} img/s; "
              f"ratio ours/reference {result['ratio']['reference']:.3f}; harness overhead per step "
              f"{100 * result['overhead']:.2f}%")
        if "plain" in rates:
            print(f"{ranks} rank(s) on {result['device']}: the reference loop without DDP {rates['plain']:.2f} img/s; "
                  f"ratio ours/plain {result['ratio']['plain']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
