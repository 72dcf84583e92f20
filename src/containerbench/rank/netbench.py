"""Network microbenchmark: ping-pong (NetPIPE-style) and Allreduce (nccl-tests-style).

Over MPI (the default), or over torch.distributed's collectives (--backend torch-gloo,
torch-nccl, torch-auto): the path PyTorch's gradients take, on GPU buffers with NCCL, which
shows InfiniBand against Ethernet on GPU nodes directly. Either way the launcher starts the
ranks and MPI coordinates them (iteration counts, barriers, the slowest rank's time).

Run with >= 2 ranks, e.g. ``mpirun -np 2 python -m containerbench.rank.netbench``.
Rank 0 prints a human line and a netbench marker line (JSON) per measurement,
then one result marker line with the whole result (markers.py).
"""

import argparse
import os
import socket
import sys
import time

import mpi4py
import numpy as np
from mpi4py import MPI

from containerbench.rank import faults, markers, telemetry
from containerbench.rank.provenance import provenance

WARMUP_ITERATIONS = 2
PINGPONG_TAG = 17


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(prog="netbench", description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=positive_int, default=1)
    parser.add_argument("--max-bytes", type=positive_int, default=16 * 1024 * 1024)
    parser.add_argument("--target-bytes", type=positive_int, default=256 * 1024 * 1024,
                        help="bytes to move per size; sets iterations = target / size")
    parser.add_argument("--min-iters", type=positive_int, default=5)
    parser.add_argument("--max-iters", type=positive_int, default=1000)
    parser.add_argument("--seconds-per-size", type=float, default=0.5,
                        help="time budget per message size, estimated from the warmup")
    parser.add_argument("--backend", choices=("mpi", "torch-auto", "torch-gloo", "torch-nccl"), default="mpi",
                        help="what moves the bytes: MPI, or torch.distributed (auto: nccl on GPUs, gloo on CPUs)")
    parser.add_argument("--nccl-ring", action="store_true",
                        help="torch-nccl: force NCCL's ring algorithm (NCCL_ALGO=Ring), as NVIDIA advises for "
                             "two nodes: other algorithms can report more bus bandwidth than the NIC carries")
    parser.add_argument("--no-pingpong", action="store_true")
    parser.add_argument("--no-allreduce", action="store_true")
    parser.add_argument("--telemetry-dir", help="each node's local rank 0 samples the node into DIR/<host>.csv")
    parser.add_argument("--telemetry-interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--telemetry-services", default="",
                        help="comma-separated names of the runtime's and launcher's processes on the node")
    return parser


def parse_options(parser, argv):
    options = parser.parse_args(argv)
    if options.min_bytes > options.max_bytes:
        parser.error("--min-bytes must not exceed --max-bytes")
    if options.min_iters > options.max_iters:
        parser.error("--min-iters must not exceed --max-iters")
    return options


def powers_of_two(lowest, highest):
    size = 1
    while size < lowest:
        size *= 2
    sizes = []
    while size <= highest:
        sizes.append(size)
        size *= 2
    return sizes


def iterations_for(size, options, warmup_seconds_per_iteration):
    # Move roughly the same volume per size (many iterations for small messages,
    # few for big ones), but never spend much more than --seconds-per-size on one
    # size: a shaped or broken link must not stall the whole run.
    by_volume = options.target_bytes // size
    by_time = int(options.seconds_per_size / max(warmup_seconds_per_iteration, 1e-9))
    return max(options.min_iters, min(options.max_iters, by_volume, by_time))


def report(human_line, record):
    print(human_line, flush=True)
    markers.emit(markers.NETBENCH, record)


class MpiTransport:
    """The bytes move through MPI, on host buffers."""

    backend = "mpi"

    def __init__(self, comm):
        self.comm = comm

    def buffer(self, count: int, fill: float = 0, dtype=np.uint8):
        return np.full(count, fill, dtype=dtype)

    def send(self, buffer, peer: int):
        self.comm.Send(buffer, dest=peer, tag=PINGPONG_TAG)

    def recv(self, buffer, peer: int):
        self.comm.Recv(buffer, source=peer, tag=PINGPONG_TAG)

    def allreduce(self, send, received):
        self.comm.Allreduce(send, received, op=MPI.SUM)

    def all_equal(self, buffer, value: float) -> bool:
        return bool(np.all(buffer == value))

    def wait(self):
        """Until every operation issued so far has completed (MPI's calls are blocking)."""

    def describe(self) -> dict:
        return {"backend": self.backend}


class TorchTransport:
    """The bytes move through torch.distributed: Gloo on host tensors, NCCL on this rank's GPU."""

    def __init__(self, comm, requested: str, nccl_ring: bool):
        import torch

        from containerbench.rank.distribution import MpiRanks, choose_backend, rendezvous

        if nccl_ring:
            os.environ["NCCL_ALGO"] = "Ring"  # before NCCL's communicator is made
        self.torch, self.dist = torch, torch.distributed
        self.backend = choose_backend(torch, requested)
        ranks = MpiRanks()
        gpus = torch.cuda.device_count() if self.backend == "nccl" else 0
        self.device = torch.device("cuda", ranks.local_rank % gpus) if gpus else torch.device("cpu")
        if gpus:
            torch.cuda.set_device(self.device)
        self.gpus = [torch.cuda.get_device_name(self.device)] if gpus else []
        self.address = rendezvous(ranks, torch, self.backend)
        self.nccl_algo = os.environ.get("NCCL_ALGO") if self.backend == "nccl" else None

    def buffer(self, count: int, fill: float = 0, dtype=np.uint8):
        kind = self.torch.uint8 if dtype == np.uint8 else self.torch.float32
        return self.torch.full((count,), fill, dtype=kind, device=self.device)

    def send(self, buffer, peer: int):
        self.dist.send(buffer, dst=peer)

    def recv(self, buffer, peer: int):
        self.dist.recv(buffer, src=peer)

    def allreduce(self, send, received):
        # In place, as torch.distributed has it: the bytes moved are the same as out of place. The timed
        # buffer holds zeros (from all_equal's check), so repeated sums stay finite.
        self.dist.all_reduce(received)

    def all_equal(self, buffer, value: float) -> bool:
        ok = bool((buffer == value).all())
        buffer.zero_()
        return ok

    def wait(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def describe(self) -> dict:
        return {"backend": self.backend, "torch": self.torch.__version__, "nccl_algo": self.nccl_algo,
                "nccl": ".".join(map(str, self.torch.cuda.nccl.version())) if self.gpus else None,
                "rendezvous": f"tcp://{self.address['host']}:{self.address['port']}",
                "socket_host": self.address["host"], "socket_interface": self.address["interface"],
                "socket_host_from": self.address["from"]}

    def close(self):
        self.dist.destroy_process_group()


def measure_pingpong(comm, transport, size, options):
    """Round trips between ranks 0 and 1; returns (iterations, elapsed seconds on this rank)."""
    buffer = transport.buffer(size)
    is_initiator = comm.Get_rank() == 0
    peer = 1 if is_initiator else 0

    def round_trips(count):
        for _ in range(count):
            if is_initiator:
                transport.send(buffer, peer)
                transport.recv(buffer, peer)
            else:
                transport.recv(buffer, peer)
                transport.send(buffer, peer)
        transport.wait()

    start = MPI.Wtime()
    round_trips(WARMUP_ITERATIONS)  # connection setup and cache warming stay out of the timing
    warmup = (MPI.Wtime() - start) / WARMUP_ITERATIONS
    # Rank 0 decides the count and tells its peer: both must run the same number.
    if is_initiator:
        iterations = iterations_for(size, options, warmup)
        comm.send(iterations, dest=peer, tag=PINGPONG_TAG)
    else:
        iterations = comm.recv(source=peer, tag=PINGPONG_TAG)
    start = MPI.Wtime()
    round_trips(iterations)
    return iterations, MPI.Wtime() - start


def measure_allreduce(comm, transport, size, options):
    """Checks the sum once, then returns (iterations, the slowest rank's elapsed seconds)."""
    ranks = comm.Get_size()
    send = transport.buffer(size // 4, comm.Get_rank() + 1, np.float32)
    received = transport.buffer(size // 4, comm.Get_rank() + 1, np.float32)

    transport.allreduce(send, received)
    expected = ranks * (ranks + 1) / 2  # exact in float32 for any realistic rank count
    if not transport.all_equal(received, expected):
        raise RuntimeError(f"allreduce of {size} B gave wrong result, expected {expected} everywhere")

    def timed_calls(count):
        comm.Barrier()  # start the clock together so early ranks don't wait inside the timing
        start = MPI.Wtime()
        for _ in range(count):
            transport.allreduce(send, received)
        transport.wait()
        # The slowest rank's time, identical on every rank.
        return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX)

    iterations = iterations_for(size, options, timed_calls(WARMUP_ITERATIONS) / WARMUP_ITERATIONS)
    return iterations, timed_calls(iterations)


def run_pingpong(comm, transport, options):
    results = []
    if comm.Get_rank() <= 1:
        for size in powers_of_two(options.min_bytes, options.max_bytes):
            iterations, elapsed = measure_pingpong(comm, transport, size, options)
            latency_us = elapsed / iterations / 2 * 1e6
            record = {"test": "pingpong", "bytes": size, "iterations": iterations,
                      "latency_us": latency_us, "bandwidth_MBps": size / latency_us}
            results.append(record)
            if comm.Get_rank() == 0:
                report(f"pingpong  {size:8d} B   lat {latency_us:10.2f} us   "
                       f"bw {record['bandwidth_MBps']:10.1f} MB/s   iters {iterations}", record)
    comm.Barrier()  # ranks >= 2 wait here until the pair is done
    return results


def run_allreduce(comm, transport, options):
    ranks = comm.Get_size()
    results = []
    for size in powers_of_two(max(4, options.min_bytes), options.max_bytes):
        iterations, elapsed = measure_allreduce(comm, transport, size, options)
        time_s = elapsed / iterations
        algbw = size / time_s / 1e9
        busbw = algbw * 2 * (ranks - 1) / ranks  # nccl-tests: traffic per link of a ring allreduce
        record = {"test": "allreduce", "bytes": size, "iterations": iterations,
                  "time_us": time_s * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw, "ranks": ranks}
        results.append(record)
        if comm.Get_rank() == 0:
            report(f"allreduce {size:8d} B   time {time_s * 1e6:10.2f} us   "
                   f"algbw {algbw:.3f} GB/s   busbw {busbw:.3f} GB/s   iters {iterations}", record)
    return results


def run(options, comm, transport=None):
    """Runs the enabled benchmarks on every rank of comm and returns the result dict on all ranks."""
    transport = transport or MpiTransport(comm)
    started = time.perf_counter()
    hostnames = comm.allgather(socket.gethostname())
    if comm.Get_rank() == 0:
        print(f"netbench: {comm.Get_size()} ranks on {len(set(hostnames))} node(s), backend {transport.backend}",
              flush=True)
    window = {"start_unix": time.time(), "cpu_s": telemetry.cpu_seconds()}
    pingpong = [] if options.no_pingpong else run_pingpong(comm, transport, options)
    allreduce = [] if options.no_allreduce else run_allreduce(comm, transport, options)
    window = {**window, "end_unix": time.time(), "cpu_s": telemetry.cpu_seconds() - window["cpu_s"]}
    processes = comm.allgather({"rank": comm.Get_rank(), "hostname": socket.gethostname(), "window": window,
                                "context": telemetry.rank_context()})
    result = {
        "kind": "netbench",
        "ranks": comm.Get_size(),
        "hostnames": hostnames,
        # Open MPI pads the version string with a NUL terminator; keep the JSON clean.
        "mpi_library": MPI.Get_library_version().replace("\0", "").splitlines()[0].strip(),
        "mpi4py": mpi4py.__version__,
        "backend": transport.backend,
        "distribution": transport.describe(),
        "gpus": getattr(transport, "gpus", []),
        "runtime": os.environ.get("CONTAINERBENCH_RUNTIME", "bare-metal"),
        "provenance": provenance(),
        "pingpong": pingpong,
        "allreduce": allreduce,
        "processes": processes,
        "wall_s": time.perf_counter() - started,
    }
    result = comm.bcast(result, root=0)  # rank 0 holds the ping-pong view everyone should share
    if comm.Get_rank() == 0:
        markers.emit(markers.RESULT, result)
        faults.after_result()
    return result


def main(argv=None):
    options = parse_options(build_parser(), argv)
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print(f"netbench needs at least 2 ranks, got {comm.Get_size()}", file=sys.stderr)
        raise SystemExit(2)
    sampler = None
    if options.telemetry_dir:
        telemetry.register_rank(options.telemetry_dir)
        if comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank() == 0:  # one sampler per node
            sampler = telemetry.start_sampler(options.telemetry_dir, options.telemetry_interval,
                                                options.telemetry_services)
    try:
        if options.backend == "mpi":
            run(options, comm)
        else:
            from containerbench.rank.distribution import BackendUnavailable

            try:
                transport = TorchTransport(comm, options.backend.removeprefix("torch-"), options.nccl_ring)
            except (BackendUnavailable, ImportError) as error:  # a failed run with its reason
                print(markers.FAILURE + str(error), flush=True)
                raise SystemExit(3) from None
            run(options, comm, transport)
            transport.close()
    finally:
        telemetry.stop_sampler(sampler)


if __name__ == "__main__":
    main()
