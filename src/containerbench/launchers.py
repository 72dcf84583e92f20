"""Launchers: what starts a run's ranks (none, mpirun or Hydra's mpiexec, srun), one class per
kind the config names (launcher.kind), and the Slurm allocation strategy a sweep's runs take.

The allocation strategy is decided once, when planning (allocation_for): with srun from outside any
allocation each run asks salloc for its own; inside an allocation already held (a site's salloc
session, a job) each run is a job step of it; a fleet job's runs share the one allocation their job
asks for. execution.run_plans carries it out.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod

from containerbench import slurm
from containerbench.config import RunSpec


class Launcher(ABC):
    """Wraps one rank's argv into the command that starts every rank of a run."""

    kind: str  # launcher.kind in the config
    program: str | None  # the program a run's argv starts with (None: the rank's own argv)
    slurm_step = False  # its ranks are a Slurm job step: Slurm's plugins (SPANK) and the step's paths reach them
    # Its own processes on the ranks' nodes (as Runtime.service_processes): they relay the ranks' output
    # and wire them up, a cost every run under it pays, counted apart from what disturbs a run.
    service_processes: tuple[str, ...] = ()
    core_per_rank: tuple[str, ...] = ()  # the words of its argv that bind each rank to a core of its own

    @abstractmethod
    def wrap(self, rank_argv: list[str], spec: RunSpec, env_names: list[str], runtime_options=()) -> list[str]:
        """The run's argv: `env_names` are the variables the ranks get, `runtime_options` what a runtime
        contributes to the launcher itself (Pyxis: srun --container-image)."""

    def on_each_node(self, argv: list[str], spec: RunSpec) -> list[str]:
        """`argv` once on every node of the run, before its ranks start: here, where the ranks start too."""
        return argv

    @classmethod
    @abstractmethod
    def configured(cls, config: dict, runtime) -> Launcher:
        """The launcher of this kind as the config's launcher section sets it, for `runtime`'s runs."""


class NoLauncher(Launcher):
    kind, program = "none", None

    def wrap(self, rank_argv: list[str], spec: RunSpec, env_names: list[str], runtime_options=()) -> list[str]:
        if spec.ranks != 1:
            raise ValueError(f"launcher 'none' starts one rank, {spec.run_id} needs {spec.ranks}")
        return rank_argv

    @classmethod
    def configured(cls, config: dict, runtime) -> Launcher:
        return cls()


class Mpirun(Launcher):
    """Open MPI's mpirun: one node here, or the nodes of the enclosing allocation."""

    kind = program = "mpirun"
    service_processes = ("mpirun", "orterun", "orted", "prterun", "prted")  # Open MPI 4 (ORTE) and 5 (PRRTE)
    core_per_rank = ("--bind-to", "core")

    def __init__(self, bind: str = "core", extra_args=()):
        self.bind, self.extra_args = bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        argv = [self.program, "-np", str(spec.ranks), "--map-by", f"ppr:{spec.ranks_per_node}:node",
                "--bind-to", self.bind, "--report-bindings"]
        for name in env_names:  # -x forwards each variable to remote ranks too
            argv += ["-x", name]
        return argv + self.extra_args + rank_argv


    @classmethod
    def configured(cls, config: dict, runtime) -> Launcher:
        settings = config["launcher"]
        if getattr(runtime, "native", False):  # the native MPI model's libmpi is the host's MPICH
            return Hydra(config["native_mpi"]["mpiexec"], settings.get("bind", "core"))
        return cls(settings.get("bind", "core"), settings.get("extra_args", []))


class Hydra(Launcher):
    """The host MPICH's mpiexec (Hydra), for runs in the native MPI model: the ranks' libmpi is the
    host's MPICH, which Open MPI's mpirun cannot wire up. Hydra passes the whole environment by
    default (mpiexec -genvall). -pmi-port: ranks reach their PMI server by PMI_PORT (TCP) instead of
    an inherited socket (PMI_FD), which podman run does not hand to the container (measured: without
    it MPI_Init fails, "PMI_Get_appnum returned -1")."""

    kind, program = "mpirun", "mpiexec"  # what launcher mpirun starts for native runs (launcher.mpiexec's)
    service_processes = ("mpiexec", "mpiexec.hydra", "mpiexec.mpich", "hydra_pmi_proxy")
    core_per_rank = ("-bind-to", "core")

    def __init__(self, mpiexec: str = "mpiexec.mpich", bind: str = "core", extra_args=()):
        self.mpiexec, self.bind, self.extra_args = mpiexec, bind, list(extra_args)

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        return [self.mpiexec, "-pmi-port", "-n", str(spec.ranks), "-ppn", str(spec.ranks_per_node),
                "-bind-to", self.bind,  # launcher.bind's values are Hydra's own
                *self.extra_args, *rank_argv]


    @classmethod
    def configured(cls, config: dict, runtime) -> Launcher:
        return Mpirun.configured(config, runtime)


class Srun(Launcher):
    """Slurm's srun inside the job's allocation; the MPI plugin comes from the config."""

    kind = program = "srun"
    slurm_step = True
    service_processes = ("srun", "slurmstepd")
    core_per_rank = ("--cpu-bind=cores",)

    def __init__(self, mpi: str = "pmix", bind: str = "core", extra_args=(), cpus_per_rank: int = 1,
                 gpus_per_node: int = 0):
        self.mpi, self.bind, self.extra_args = mpi, bind, list(extra_args)
        self.cpus_per_rank, self.gpus_per_node = cpus_per_rank, gpus_per_node

    def wrap(self, rank_argv, spec, env_names, runtime_options=()):
        cpu_bind = {"core": "cores", "socket": "sockets", "none": "none"}[self.bind]
        # Explicit sizes: Snakemake's job-step plugin strips the allocation's SLURM_* defaults.
        # Every GPU of a node is visible to its ranks; the benchmark pins one per local rank
        # (no --ntasks-per-gpu: it clashes with SLURM_TRES_PER_TASK, a known plugin trap).
        gpus = self.gres
        # runtime_options: what a runtime contributes to srun itself (Pyxis: --container-image, ...)
        return [self.program, f"--mpi={self.mpi}", f"--nodes={spec.nodes}", *self.pinned(spec),
                f"--ntasks={spec.ranks}", f"--ntasks-per-node={spec.ranks_per_node}",
                f"--cpus-per-task={self.cpus_per_rank}", *gpus, f"--cpu-bind={cpu_bind}", "--export=ALL",
                *self.extra_args, *runtime_options, *rank_argv]


    @property
    def gres(self) -> list[str]:
        """The GPUs each node's step asks for: a step sees only its GRES (Slurm's device cgroup)."""
        return [f"--gres=gpu:{self.gpus_per_node}"] if self.gpus_per_node else []

    def on_each_node(self, argv: list[str], spec: RunSpec) -> list[str]:
        # One task on each node of the run (Slurm places it in the run's allocation), with none of the
        # ranks' MPI plugin or binding: a step of its own before the ranks' step.
        return self.node_step(argv, spec.nodes, self.pinned(spec))

    @staticmethod
    def pinned(spec: RunSpec) -> list[str]:
        """A fleet run's steps on its own nodes (spec.nodelist): its allocation may hold the other jobs of its
        round too, each on nodes of its own (fleetrounds)."""
        return [f"--nodelist={','.join(spec.nodelist)}"] if spec.nodelist else []

    def node_step(self, argv: list[str], nodes: int, options=()) -> list[str]:
        """`argv` as one task on each of `nodes` nodes of the allocation, with srun `options` of its own."""
        return [self.program, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", *options,
                "--export=ALL", *argv]

    @classmethod
    def configured(cls, config: dict, runtime) -> Launcher:
        settings, slurm_settings = config["launcher"], config["slurm"]
        mpi = getattr(runtime, "srun_mpi", None) or settings.get("srun_mpi", "pmix")  # a runtime may name its own
        return cls(mpi, settings.get("bind", "core"), settings.get("extra_args", []),
                   slurm_settings["cpus_per_rank"], slurm_settings["gpus_per_node"])


def asks_a_core_per_rank(argv: list[str] | None) -> bool:
    """Does this launch line bind each rank to a core of its own, in any launcher's words?"""
    words = argv or []
    return any(words[i:i + len(cls.core_per_rank)] == list(cls.core_per_rank)
               for cls in (Mpirun, Hydra, Srun) for i in range(len(words)))


# launcher.kind -> its launcher (Hydra is what kind mpirun starts for native MPI runs).
LAUNCHERS: dict[str, type[Launcher]] = {cls.kind: cls for cls in (NoLauncher, Mpirun, Srun)}


def launcher_class(kind: str | None) -> type[Launcher]:
    """The launcher of launcher.kind `kind` (the schema allows no other; none where it is unset)."""
    return LAUNCHERS.get(kind, NoLauncher)


def uses_slurm(config: dict) -> bool:
    """Do the config's runs start as Slurm job steps (launcher srun)?"""
    return launcher_class(config["launcher"]["kind"]).slurm_step


def launcher_for(config: dict, runtime=None) -> Launcher:
    """The configured launcher, for `runtime`'s runs (a runtime may name its own srun MPI plugin)."""
    return launcher_class(config["launcher"]["kind"]).configured(config, runtime)


class Allocation(enum.Enum):
    """Where a sweep's runs get their nodes: the one Slurm allocation strategy, decided when planning."""

    NONE = "none"  # no Slurm (launcher none or mpirun): the ranks start from this node
    STEP = "step"  # srun inside an allocation already held: each run is a job step of it
    PER_RUN = "per-run"  # srun from outside any allocation: each run asks salloc for its own
    PER_JOB = "per-job"  # a fleet job: its runs share the one allocation their job asks salloc for

    @property
    def asks_salloc(self) -> bool:
        return self in (Allocation.PER_RUN, Allocation.PER_JOB)


def allocation_for(config: dict, *, job_of_runs: bool = False) -> Allocation:
    """The allocation strategy of the config's runs; `job_of_runs`: for the runs of one fleet job.
    With srun from outside an allocation each run's launcher outlives its allocation, so a run Slurm
    ends (scancel, time limit, node failure, preemption) is recorded with sacct's state and reason
    instead of vanishing with its job."""
    if job_of_runs:
        return Allocation.PER_JOB
    if not uses_slurm(config):
        return Allocation.NONE
    return Allocation.STEP if slurm.in_allocation() else Allocation.PER_RUN
