"""TensorFlow's ParameterServerStrategy: every worker updates one copy of the weights, held by parameter servers.

Rank 0 coordinates (the chief), every rank is a worker, and the servers run inside worker processes spread over
the nodes (co-located, which the CSCS study found faster). Each worker applies its own batch's gradients to the
servers' weights; nothing is averaged between workers.

- parameter_server: synchronous rounds, as tf_cnn_benchmarks' parameter_server mode: the coordinator schedules
  one step per worker and waits for all of them before the next round. A measured step is one round.
- parameter_server_async: every worker at its own pace, as Keras' Model.fit drives a ClusterCoordinator: the
  run's steps are scheduled up to AHEAD_ROUNDS rounds ahead, a free worker takes the next one, and none waits
  for another. The coordinator reads the rounds' results in order, so rank 0 still prints a line per round;
  the measured steps are timed by the updates' completions on the workers (completed_steps), not by those
  reads, which lag behind workers that run ahead.

Both train the same number of batches ((warmup + measured steps) x workers) and record what asynchrony costs:
- each update's staleness: how many other workers' updates were counted on the servers between its read of
  the weights and its own (a version counter on the servers, read before the forward pass and incremented
  once the update's gradients exist, just before they are applied; the increment and its read-back are two
  ops, so another worker's increment landing between them counts once too many);
- the loss of the servers' final weights on one fixed batch (the harness's): the loss at equal images;
- the weights as every worker reads them from the servers: one model, whatever each worker's step count.
"""

from __future__ import annotations

import collections
import os
import socket

from containerbench.rank.distribution import Mode, ModeUnsupported, TensorFlowCluster, gradients_fn, training_loss

# Rounds the asynchronous coordinator keeps scheduled beyond the one it reads: a worker waits for the others
# only if it gets this far ahead (Model.fit schedules a whole epoch; the queue itself holds 256 Ki closures).
AHEAD_ROUNDS = 64


class ParameterServer(TensorFlowCluster, Mode):
    """Synchronous rounds: one step per worker, joined (module docstring)."""

    name = "parameter_server"

    def __init__(self, args):
        import tensorflow as tf

        if not hasattr(tf.distribute.experimental, "ParameterServerStrategy") or \
                not hasattr(tf.distribute, "coordinator"):
            raise ModeUnsupported(f"mode {self.name} is not supported with TF {tf.__version__}")
        if args.xla:  # XLA cannot reach a variable on another device (TF's XLA "known issues")
            raise ModeUnsupported(f"mode {self.name} cannot use XLA: the compiled step would read variables "
                                  "that live on the parameter servers")
        super().__init__()
        hosts = self.allgather(socket.gethostname())
        nodes = list(dict.fromkeys(hosts))
        if args.parameter_servers > self.size:
            raise ModeUnsupported(f"{args.parameter_servers} parameter servers need as many ranks; "
                                  f"this run has {self.size}")
        # Parameter server i goes to node i mod N, on that node's next rank: co-located and spread.
        by_node = {node: [r for r, h in enumerate(hosts) if h == node] for node in nodes}
        self.ps_ranks = []
        for i in range(args.parameter_servers):
            ranks_here = by_node[nodes[i % len(nodes)]]
            self.ps_ranks.append(ranks_here[(i // len(nodes)) % len(ranks_here)])
        addresses = self.addresses(3)  # worker, ps, chief port per rank (not all used)
        self.cluster = {"chief": [addresses[0][2]], "worker": [a[0] for a in addresses],
                        "ps": [addresses[r][1] for r in self.ps_ranks]}
        threads = args.threads or len(os.sched_getaffinity(0))
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=2)
        spec = tf.train.ClusterSpec(self.cluster)
        self.servers = [tf.distribute.Server(spec, job_name="worker", task_index=self.rank, protocol="grpc",
                                             config=config, start=True)]
        self.servers += [tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc", config=config,
                                              start=True) for i, r in enumerate(self.ps_ranks) if r == self.rank]
        self.coordinator = self.rank == 0
        self.measures_all_ranks = False
        self.rounds, self.warmup_rounds = args.warmup_steps + args.steps, args.warmup_steps
        self.batch_size = args.batch_size
        self.rounds_read: list[list[tuple[float, int, float]]] = []  # per round: (loss, staleness, ended) per update
        if self.coordinator:
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                spec, task_type="chief", task_id=0, rpc_layer="grpc")
            self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
            self.cluster_coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)

    def scope(self):
        return self.strategy.scope()

    def input_source(self, tf, real_data, random_batch):
        """A per-worker iterator: each worker makes its batches itself, nothing travels from the chief."""
        if real_data:
            def make_dataset():
                return real_data(0, 1)  # every worker reads the whole (shuffled) dataset
        else:
            def make_dataset():
                return tf.data.Dataset.from_tensors(random_batch(1234)).repeat()
        return next, (iter(self.cluster_coordinator.create_per_worker_dataset(make_dataset)),)

    def make_step(self, tf, model, optimizer, next_batch, args):
        strategy = self.strategy
        gradients_of = gradients_fn(tf, model, optimizer, args)
        with strategy.scope():  # on a parameter server, beside the weights
            version = tf.Variable(0, dtype=tf.int64, trainable=False, name="containerbench_weights_version")

        def after(value, first):
            """`value`, made to wait for `first` by a use of it that is always zero: a control dependency
            from a server's op to a worker's is not kept in the partitioned function (measured)."""
            return value + tf.cast(tf.minimum(tf.cast(tf.math.is_nan(tf.cast(first, tf.float32)), tf.int64), 0),
                                   value.dtype)

        def replica_step(images, labels):
            read = version.read_value()
            loss, gradients = gradients_of(after(images, read), labels)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            # Counted once this update's gradients exist: the first layer's come last in the backward pass.
            applied = version.assign_add(after(tf.constant(1, tf.int64), tf.reduce_sum(gradients[0])))
            # The clock read in a branch taken on `applied`: an op without inputs may run at any time.
            return loss, applied - read - 1, tf.cond(applied >= 0, tf.timestamp, tf.timestamp)

        @tf.function
        def worker_step(iterator):
            images, labels = next_batch(iterator)
            return strategy.run(replica_step, args=(images, labels))

        return self.rounds_of(lambda iterator: [self.cluster_coordinator.schedule(worker_step, args=(iterator,))
                                                for _ in range(self.size)])

    def rounds_of(self, schedule_round):
        """The harness's step: one round, scheduled and joined."""
        def train_step(iterator):
            scheduled = schedule_round(iterator)
            self.cluster_coordinator.join()
            return self.read_round(scheduled)

        return train_step

    def read_round(self, scheduled) -> float:
        """A round's updates, kept in order; its mean loss is the step's."""
        updates = [tuple(value.fetch()) for value in scheduled]
        self.rounds_read.append([(float(loss), int(stale), float(ended)) for loss, stale, ended in updates])
        return sum(update[0] for update in self.rounds_read[-1]) / len(updates)

    def updates(self, tf, model, window: dict, fixed_batch) -> dict:
        """Staleness of the measured updates, the servers' weights as the coordinator and every worker read them
        (one reduction, the same on each), and their loss on `fixed_batch()` (last: training=True moves batch
        norm's moving averages, which are not among the weights read); asynchronous, also the measured steps as
        the workers completed them (completed_steps)."""
        import numpy as np

        self.cluster_coordinator.join()
        measured = [update for round_ in self.rounds_read[self.warmup_rounds:] for update in round_]
        staleness = [stale for _, stale, _ in measured]

        @tf.function
        def per_variable_sums():
            return tf.stack([tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.trainable_variables])

        # One read per worker, run on that worker: ClusterCoordinator's own per-worker path (its
        # create_per_worker_dataset uses it), as schedule() would send the function to whichever worker is free.
        per_worker = self.cluster_coordinator._create_per_worker_resources(per_variable_sums)
        reads = [np.asarray(value.fetch()) for value in per_worker._values]
        here = np.asarray(per_variable_sums())
        images, labels = fixed_batch()
        return {
            "staleness_mean": float(np.mean(staleness)) if staleness else None,
            "staleness_max": max(staleness, default=None),
            "staleness_counts": {str(k): n for k, n in sorted(collections.Counter(staleness).items())},
            "measured_updates": len(measured),
            "step_s_completed": self.completed_steps(window),
            # Warmup included: the same in both modes, so their final losses are at equal images.
            "images_trained": self.batch_size * sum(len(round_) for round_ in self.rounds_read),
            "coordinator_weights": {"sum": float(here.sum()), "abs_sum": float(np.abs(here).sum())},
            "worker_weights": [{"worker": i, "sum": float(sums.sum()), "abs_sum": float(np.abs(sums).sum())}
                               for i, sums in enumerate(reads)],
            "loss_at_equal_images": float(training_loss(tf, model, images, labels)),
        }

    def completed_steps(self, window: dict) -> list[float] | None:
        """None: a joined round is timed as the coordinator read it."""
        return None

    # No start: one copy of the variables, on the parameter servers.

    def finish(self):
        self.ranks.wait_all()  # workers serve until the coordinator is done

    def describe(self, gpus: bool) -> dict:
        return {"backend": "grpc", "cluster": self.cluster, "parameter_server_ranks": self.ps_ranks,
                "grpc_host": self.host, "grpc_interface": self.interface, "grpc_host_from": self.host_choice,
                "synchronous_rounds": self.name == ParameterServer.name}


class ParameterServerAsync(ParameterServer):
    """Every worker at its own pace: rounds scheduled ahead, read in order, never joined (module docstring)."""

    name = "parameter_server_async"

    def rounds_of(self, schedule_round):
        pending: collections.deque = collections.deque()
        scheduled = 0

        def train_step(iterator):
            nonlocal scheduled
            while scheduled < self.rounds and len(pending) <= AHEAD_ROUNDS:
                pending.append(schedule_round(iterator))
                scheduled += 1
            return self.read_round(pending.popleft())

        return train_step

    def completed_steps(self, window: dict) -> list[float]:
        """The measured steps as the workers completed them: the updates in the order they ended (each update's
        worker's clock, read once its version was counted; nodes' clocks as synchronised as NTP keeps them), a
        step per `size` of them after the first warmup x size; the first starts at the last warmup update's end
        (or, with no warmup, which the workflow never asks, when the coordinator began). The coordinator reads
        rounds in order, behind workers that run ahead: its times would count work done during warmup as
        measured, or, where the workers finished every round before it read the last warmup one, nothing."""
        ended = sorted(end for round_ in self.rounds_read for _, _, end in round_)
        first = self.warmup_rounds * self.size
        bounds = [ended[first - 1] if first else window["start_unix"], *ended[first + self.size - 1::self.size]]
        return [end - start for start, end in zip(bounds, bounds[1:])]
