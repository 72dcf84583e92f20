"""The ways to train data-parallel that the studies compare, behind one interface.

- horovod: ring all-reduce through Horovod (NCCL on GPUs, MPI or Gloo on CPUs);
- collective: TensorFlow's MultiWorkerMirroredStrategy (ring or NCCL collectives);
- parameter_server, parameter_server_async: TensorFlow's ParameterServerStrategy
  (parameterservers.py), in rounds or with every worker at its own pace.
- local: no gradient exchange, every rank trains alone on its own batches: the
  compute-only bound (communication overhead = 1 - horovod/local), and the run
  whose ranks' weights must drift apart (the weight checksum is shown to catch it).

Each mode gives the harness (bench.py) the same things, written down as the
abstract class `Mode`: rank and size, a scope to build the model in, who reads
the input (every rank its own share, or each worker for a coordinator), a
compiled training step, a way to gather per-rank results, and a description of
its backend for the record. Ranks come from the
launcher (mpirun, srun) through MPI; TensorFlow's own modes get their cluster
description from an exchange over MPI, never from a hand-written host list.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import fcntl
import json
import os
import socket
import struct
import time

from containerbench.rank import faults

LOCAL = "local"  # no gradient exchange: each rank trains alone (records and results judge it apart)
MODES = ("horovod", "collective", "parameter_server", "parameter_server_async", LOCAL)


class ModeUnsupported(RuntimeError):
    """This TensorFlow cannot train in the requested mode."""


def training_loss(tf, model, images, labels, global_batch: int | None = None):
    """Cross-entropy from the model's logits, in float32; averaged over `global_batch` when given."""
    logits = tf.cast(model(images, training=True), tf.float32)  # softmax never in float16
    per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    if global_batch is None:
        return tf.reduce_mean(per_example)
    return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)


def _scaled_gradients(tape, optimizer, loss, variables, mixed_float16: bool, exchange=lambda gradients: gradients):
    """The gradients, through `exchange` (the ranks' all-reduce) before a loss scale is taken off them."""
    if not mixed_float16:
        return exchange(tape.gradient(loss, variables))
    with tape:  # the scaling recorded too: scaled outside the tape, the loss had no gradient (no run could train)
        scaled = optimizer.get_scaled_loss(loss)
    return optimizer.get_unscaled_gradients(exchange(tape.gradient(scaled, variables)))


def gradients_fn(tf, model, optimizer, args, global_batch: int | None = None):
    """Loss and gradients of one replica's batch; XLA-compiled when asked (the update stays
    outside: in TF's own modes it holds the cross-worker aggregation)."""
    mixed = args.precision == "mixed_float16"

    def gradients(images, labels):
        with tf.GradientTape() as tape:
            loss = training_loss(tf, model, images, labels, global_batch)
        return loss, _scaled_gradients(tape, optimizer, loss, model.trainable_variables, mixed)

    return tf.function(gradients, jit_compile=True) if args.xla else gradients


def _tape_step(tf, model, optimizer, next_batch, args, exchange):
    """One batch, its gradients through `exchange(gradients)` (Horovod's all-reduce, or none), one update."""
    mixed = args.precision == "mixed_float16"

    @tf.function(jit_compile=args.xla)
    def train_step(*source):
        images, labels = next_batch(*source)
        with tf.GradientTape() as tape:
            loss = training_loss(tf, model, images, labels)
        gradients = _scaled_gradients(tape, optimizer, loss, model.trainable_variables, mixed, exchange)
        update = optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        # A value ordered after the update makes the host wait for the whole step. (Keras' loss-scale optimizer returns
        # no op; tf.function orders every value it returns after the step's stateful ops all the same: mark_as_return.)
        with tf.control_dependencies([update] if update is not None else []):
            return tf.identity(loss)

    return train_step


def interface_address(name: str) -> str:
    """IPv4 address of a network interface (SIOCGIFADDR), for TF's gRPC servers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def grpc_host() -> tuple[str, str | None, str]:
    """(address, interface, how it was chosen): the fabric's interface, as NCCL/Gloo were told,
    else the hostname (interface None: the parser then cannot confirm the fabric for gRPC)."""
    for variable in ("CONTAINERBENCH_GRPC_IFACE", "NCCL_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE"):
        value = os.environ.get(variable, "").lstrip("=^").split(",")[0]
        if value and not os.environ.get(variable, "").startswith("^"):
            try:
                return interface_address(value), value, f"{variable}={value}"
            except OSError:
                continue
    return socket.gethostname(), None, "hostname"


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


# -- PyTorch's process group (torchbench.py, netbench's torch.distributed backend) ------------------

class BackendUnavailable(RuntimeError):
    """This torch or node cannot run the requested backend."""


def choose_backend(torch, requested: str) -> str:
    gpus = torch.cuda.is_available()
    backend = requested if requested != "auto" else "nccl" if gpus else "gloo"
    if backend == "nccl" and not (gpus and torch.distributed.is_nccl_available()):
        raise BackendUnavailable("backend nccl needs GPUs and a torch built with NCCL; this rank has "
                                 f"{torch.cuda.device_count()} GPU(s), torch {torch.__version__}")
    if not torch.distributed.is_available() or (backend == "gloo" and not torch.distributed.is_gloo_available()):
        raise BackendUnavailable(f"backend {backend} is not built into torch {torch.__version__}")
    return backend


def rendezvous(ranks, torch, backend: str) -> dict:
    """PyTorch's process group: rank 0's address on the fabric's interface, sent to all over MPI
    (`ranks`: MpiRanks), never a host list."""
    address = None
    if ranks.rank == 0:
        host, interface, chosen = grpc_host()
        address = {"host": host, "port": free_port(host), "interface": interface, "from": chosen}
    address = ranks.comm.bcast(address, root=0)
    # Gloo binds the interface GLOO_SOCKET_IFNAME names, else the hostname's address: the fabric's, as NCCL's.
    if address["interface"] and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = address["interface"]
    torch.distributed.init_process_group(backend, init_method=f"tcp://{address['host']}:{address['port']}",
                                         rank=ranks.rank, world_size=ranks.size)
    return address


class MpiRanks:
    """Rank, size and local rank from the launcher, through MPI (works under mpirun and srun)."""

    def __init__(self):
        from mpi4py import MPI

        if not MPI.Is_initialized():  # bench.py imported mpi4py with automatic initialisation off
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
            atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.local_rank = self.comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def wait_all(self, poll_s: float = 0.05):
        """A barrier that sleeps: a busy-polling MPI barrier would take a core from TF's servers."""
        request = self.comm.Ibarrier()
        while not request.Test():
            time.sleep(poll_s)


class Mode(abc.ABC):
    """How ranks cooperate in training: what every mode gives the harness."""

    name: str
    rank: int
    size: int
    local_rank: int
    coordinator: bool  # this rank runs the step loop (in the parameter-server mode, rank 0 alone)
    measures_all_ranks: bool  # a measured step is one batch of this rank; else one batch on every worker

    @abc.abstractmethod
    def scope(self):
        """The context to build the model and optimizer in."""

    @abc.abstractmethod
    def input_source(self, tf, real_data, random_batch):
        """(next_batch, step arguments). real_data(shard, shards) makes a tf.data pipeline, or is None
        for synthetic data; random_batch(seed) makes one random batch."""

    @abc.abstractmethod
    def make_step(self, tf, model, optimizer, next_batch, args):
        """The compiled training step: takes the step arguments, returns the loss once the update is done."""

    def start(self, model, optimizer) -> None:  # noqa: B027 - a hook: modes that need none inherit this no-op
        """After the model is built, before the first step (e.g. broadcast the initial weights)."""

    def finish(self) -> None:  # noqa: B027 - a hook, as start
        """After the last step, before the results are gathered."""

    def updates(self, tf, model, window: dict, fixed_batch) -> dict | None:
        """After the measured steps, on the coordinator: what the mode knows of its updates that the step times do
        not say (the parameter servers' staleness, loss on `fixed_batch()` and weights as every worker reads them);
        None here."""
        return None

    @abc.abstractmethod
    def allgather(self, obj) -> list:
        """`obj` from every rank, in rank order, on every rank."""

    @abc.abstractmethod
    def describe(self, gpus: bool) -> dict:
        """The backend and its settings, for the record."""


class _EveryRankTrains(Mode):
    """Input for modes where every rank runs the step loop on its own batches."""

    def input_source(self, tf, real_data, random_batch):
        if real_data:
            return next, (iter(real_data(self.rank, self.size)),)
        # Each rank its own random batch: had gradients not been averaged, weights would drift apart.
        batch = random_batch(1234 + self.rank)
        return (lambda: batch), ()


class Horovod(_EveryRankTrains):
    name = "horovod"

    def __init__(self, args):
        import horovod.tensorflow as hvd

        hvd.init()
        self.hvd = hvd
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.coordinator = True  # every rank runs the step loop
        self.measures_all_ranks = True

    def scope(self):
        return contextlib.nullcontext()

    def make_step(self, tf, model, optimizer, next_batch, args):
        exchange = faults.gradient_exchange(self.average, self.rank, self.size)  # a test aid
        return _tape_step(tf, model, optimizer, next_batch, args, exchange=exchange)

    def average(self, gradients: list) -> list:
        """Each gradient averaged over the ranks by an all-reduce of its own, as tf_cnn_benchmarks does it
        (benchmark_cnn.py, "All-reduce gradients using Horovod"), and one rank exchanges nothing, as
        DistributedGradientTape. The tape, by wrapping each all-reduce in a tf.cond on the world size
        (horovod/tensorflow/__init__.py, _allreduce_cond), made ResNet-50's 214 gradients 214 conditionals:
        6-8 s more to trace in every run, for the same step time (benchmarks/README.md)."""
        if self.size == 1:
            return gradients
        hvd = self.hvd
        return [None if gradient is None else hvd.allreduce(gradient, op=hvd.Average) for gradient in gradients]

    def start(self, model, optimizer):
        self.hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

    def allgather(self, obj):
        return self.hvd.allgather_object(obj)

    def describe(self, gpus: bool) -> dict:
        hvd = self.hvd
        cpu_ops = os.environ.get("HOROVOD_CPU_OPERATIONS", "mpi" if hvd.mpi_built() else "gloo").lower()
        return {"backend": "nccl" if gpus and hvd.nccl_built() else cpu_ops,
                "controller": "mpi" if hvd.mpi_enabled() else "gloo",
                "mpi_built": bool(hvd.mpi_built()), "gloo_built": bool(hvd.gloo_built()),
                "nccl_built": bool(hvd.nccl_built())}


class Local(_EveryRankTrains):
    """Every rank trains alone: Horovod's step without the all-reduce, a plain local update.

    MPI gives the ranks, starts them from rank 0's initial weights (once, before
    the first step) and gathers the results; nothing else crosses between ranks.
    So each rank's own batches make its weights drift from the others': a run of
    this mode whose ranks end identical did exchange, or trained on the same data.
    """

    name = LOCAL

    def __init__(self, args):
        self.ranks = MpiRanks()
        self.rank, self.size, self.local_rank = self.ranks.rank, self.ranks.size, self.ranks.local_rank
        self.coordinator = True
        self.measures_all_ranks = True

    def scope(self):
        return contextlib.nullcontext()

    def make_step(self, tf, model, optimizer, next_batch, args):
        return _tape_step(tf, model, optimizer, next_batch, args, exchange=lambda gradients: gradients)

    def start(self, model, optimizer):
        # The same start as Horovod's broadcast: the ranks' weights then differ by their training alone.
        for variable in model.variables + optimizer.variables:
            variable.assign(self.ranks.comm.bcast(variable.numpy() if self.rank == 0 else None, root=0))

    def allgather(self, obj):
        return self.ranks.allgather(obj)

    def describe(self, gpus: bool) -> dict:
        return {"backend": "none: no gradient exchange", "initial_weights": "broadcast from rank 0 over MPI"}


class TensorFlowCluster:
    """Shared by TF's own modes: ranks through MPI, gRPC addresses exchanged over it."""

    def __init__(self):
        self.ranks = MpiRanks()
        self.rank, self.size, self.local_rank = self.ranks.rank, self.ranks.size, self.ranks.local_rank
        self.host, self.interface, self.host_choice = grpc_host()
        self.cluster: dict = {}

    def allgather(self, obj):
        return self.ranks.allgather(obj)

    def addresses(self, ports_per_rank: int) -> list[list[str]]:
        """Every rank's `ports_per_rank` free host:port pairs, in rank order."""
        mine = [f"{self.host}:{free_port(self.host)}" for _ in range(ports_per_rank)]
        return self.ranks.allgather(mine)


class Collective(TensorFlowCluster, _EveryRankTrains):
    name = "collective"

    def __init__(self, args):
        import tensorflow as tf

        super().__init__()
        self.implementation = args.collective
        if self.size > 1:
            workers = [pair[0] for pair in self.addresses(1)]
            self.cluster = {"worker": workers}
            os.environ["TF_CONFIG"] = json.dumps({"cluster": self.cluster,
                                                  "task": {"type": "worker", "index": self.rank}})
        # Gradients packed into few large all-reduces, as Horovod fuses them (its 64 MiB fusion
        # buffer): unpacked, each of ResNet-50's 214 tensors is a collective of its own.
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=args.pack_bytes,
            implementation=getattr(tf.distribute.experimental.CommunicationImplementation, self.implementation.upper()))
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        self.coordinator = True
        self.measures_all_ranks = True

    def scope(self):
        return self.strategy.scope()

    def make_step(self, tf, model, optimizer, next_batch, args):
        strategy = self.strategy
        gradients_of = gradients_fn(tf, model, optimizer, args, global_batch=args.batch_size * self.size)

        def replica_step(images, labels):
            loss, gradients = gradients_of(images, labels)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # all-reduces across workers
            return loss

        @tf.function
        def train_step(*source):
            images, labels = next_batch(*source)
            return strategy.reduce("SUM", strategy.run(replica_step, args=(images, labels)), axis=None)

        return train_step

    # No start: variables are created identical on every worker (MWMS broadcasts initial values).

    def describe(self, gpus: bool) -> dict:
        return {"backend": self.implementation, "cluster": self.cluster, "grpc_host": self.host,
                "grpc_interface": self.interface, "grpc_host_from": self.host_choice}

