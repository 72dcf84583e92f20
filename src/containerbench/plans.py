"""Planning: the sweep made ready and each RunSpec turned into a RunPlan (argv + environment).

`plan_sweep` is what the workflow and `containerbench plan` both do before any job: check the config,
resolve each runtime's image, probe the runtimes, expand the sweep and plan every run. It leaves the
config it is given as it is: what planning resolved (the images, the runtimes that cannot run here,
the data sample) is in the Sweep it returns, with the config as planned (Sweep.config).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

from containerbench import config as cb_config
from containerbench import hostmpi, slurm
from containerbench.config import RunSpec, dataset_dir
from containerbench.fabrics import debug_environment, expected_transport, fabric_settings
from containerbench.frameworks import FRAMEWORKS, framework
from containerbench.images import IMAGES, check_bench_env, resolve_images
from containerbench.launchers import Allocation, allocation_for, launcher_class, launcher_for, uses_slurm
from containerbench.runtimes import (
    BareMetal,
    BuiltImage,
    RunRequest,
    check_launchers,
    runtime_for,
    select_runtimes,
)

# Always set in every rank: unbuffered output keeps the log in step order, and
# TensorFlow's INFO chatter would bury the lines that matter.
RANK_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1"}

NETBENCH = "containerbench.rank.netbench"
# The runtimes the workflow's planning process left out, and why (JSON): its jobs' processes plan the same sweep.
SKIPPED_VARIABLE = "CONTAINERBENCH_SKIPPED_RUNTIMES"
# What the tables set side by side at one point: runs of a repetition that differ only in these form a block,
# whose order rotates from one repetition to the next (run_order).
COMPARED = ("runtime", "mpi_model", "fabric", "framework", "mode", "data")


def benchmark_modules() -> tuple[str, ...]:
    """Every module a run's ranks may run: each framework's harness, and the network benchmark."""
    return (*(each.harness for each in FRAMEWORKS.values()), NETBENCH)


def benchmark_args_in(argv) -> tuple[str, ...] | None:
    """What the benchmark was given, from an argv alone: the words after its last `-m <benchmark module>`.
    Only for what keeps no RunPlan: the run records of earlier runs, and plan files read back."""
    argv = list(argv or [])
    # Records from before the rank side had its own package name the modules without `rank.`.
    unprefixed = {module.replace(".rank.", ".", 1) for module in benchmark_modules()}
    for index in range(len(argv) - 2, -1, -1):
        if argv[index] == "-m" and argv[index + 1].replace(".rank.", ".", 1) in unprefixed:
            return tuple(argv[index + 2:])
    return None


@dataclass(frozen=True)
class RunPlan:
    """Everything needed to start one run. Its JSON (as_dict, to_json) is what the workflow passes to
    `containerbench launch` and what the raw log's launch line holds, unchanged by this class: a field
    None among OPTIONAL is left out, and benchmark_args (a part of argv) is not written."""

    run_id: str
    spec: dict  # the RunSpec, the system, the launcher, the MPI model and the benchmark's settings
    argv: list[str]
    env: dict[str, str]
    timeout_s: float
    image: str | None = None  # what a container runtime runs
    fabric: dict | None = None  # name, env and what the parser expects of it
    telemetry: dict | None = None  # telemetry_settings
    benchmark_args: tuple[str, ...] = ()  # what the benchmark module is given, at the end of argv
    native_mpi: dict | None = None  # the host MPICH the ranks load, in the native MPI model
    allocation: list[str] | None = None  # salloc's argv, where the run asks for its own (Allocation.PER_RUN)
    launch_context: dict | None = None  # where the launch ran (execution.measure adds it)
    node_prepare: list[str] | None = None  # run on every node of the run before its ranks (nodeimages)
    node_mpi: list[str] | None = None  # native runs: the host MPI read on every node before the ranks (hostmpi)
    allocation_options: list[str] | None = None  # the runtime's words in `allocation` (Runtime.allocation_options)
    exit_grace_s: float = 30.0  # how long a run that printed its result may take to exit (execution.ExitGuard)

    OPTIONAL = ("native_mpi", "allocation", "launch_context", "node_prepare", "node_mpi", "allocation_options")
    NOT_WRITTEN = ("benchmark_args",)

    @property
    def strategy(self) -> Allocation:
        """The allocation strategy planned for the run, as its plan file says."""
        if self.allocation:
            return Allocation.PER_RUN
        return Allocation.STEP if launcher_class(self.spec.get("launcher")).slurm_step else Allocation.NONE

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.NOT_WRITTEN
                and not (f.name in self.OPTIONAL and getattr(self, f.name) is None)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, data: str | dict) -> RunPlan:
        """A plan from its JSON (text or parsed); keys it does not know (a log's host, ...) are left out."""
        data = json.loads(data) if isinstance(data, str) else data
        known = {f.name for f in fields(cls)} - set(cls.NOT_WRITTEN)
        return cls(**{key: value for key, value in data.items() if key in known},
                   benchmark_args=benchmark_args_in(data.get("argv")) or ())


def benchmark_args(spec: RunSpec, config: dict) -> list[str]:
    if spec.kind == "netbench":
        # Ping-pong is always ranks 0 and 1, i.e. the first two nodes: the 2-node run has
        # measured that pair, so larger allocations measure only the all-reduce.
        return ["--max-bytes", str(config["netbench"]["max_bytes"]), *framework(spec.framework).netbench_args(config),
                *(["--no-pingpong"] if spec.nodes > 2 else [])]
    bench = config["benchmark"]
    args = ["--model", bench["model"], "--batch-size", str(spec.batch_size),
            "--image-size", str(bench["image_size"]), "--warmup-steps", str(bench["warmup_steps"]),
            "--steps", str(bench["steps"]), "--precision", bench["precision"],
            "--data-format", bench["data_format"], "--threads", str(bench["threads_per_rank"]),
            "--probe-steps", str(bench["node_probe_steps"]),
            "--mode", spec.mode, "--runtime", spec.runtime]
    data = ["--data-dir", os.path.abspath(dataset_dir(config))] if spec.data == "real" else []  # every framework's
    harness = framework(spec.framework)
    return args + harness.mode_args(spec, bench) + data + harness.setting_args(bench)


def clone_sources() -> str:
    """The src/ directory of the clone this package runs from, for `package: clone`."""
    source = Path(__file__).resolve().parent.parent
    if not (source.name == "src" and (source.parent / "pyproject.toml").is_file()):
        raise ValueError(f"package: clone needs containerbench run from a clone (editable install), "
                         f"not from {source}")
    return str(source)


def rdma_fabric(fabric: dict) -> bool:
    """Does this fabric ask for InfiniBand/RoCE? Then containers get the RDMA devices and memlock."""
    return expected_transport(fabric).transport == "ib"


def telemetry_settings(spec: RunSpec, config: dict) -> dict | None:
    """Where the run's samplers write (one CSV per node, merged into `file` after the run) and
    the limits its record is judged by; None with `telemetry: false`."""
    settings = config["telemetry"]
    if not settings["enabled"]:
        return None
    root = Path(config["results_dir"], "telemetry").absolute()
    return {"dir": str(root / spec.run_id), "file": str(root / f"{spec.run_id}.csv"),
            **{key: settings[key] for key in ("interval_s", "disturbed_cpu_share", "max_steal_share",
                                                "exclude_disturbed")}}


def node_archive(runtime, artifact: str | None, config: dict) -> str | None:
    """The archive a run's nodes load the built image from where their store lacks it: under Slurm, for a
    runtime with a store per node (docker, podman); None where the ranks run where the workflow loaded it."""
    if not artifact or not uses_slurm(config) or not runtime.stores_images_per_node:
        return None
    return BuiltImage(runtime.image, build_dir=os.path.dirname(artifact)).archive  # as the artifact is written


def plan_run(spec: RunSpec, config: dict, allocation: Allocation | None = None,
             artifact: str | None = None) -> RunPlan:
    """Everything needed to start the run. `allocation`: the strategy of the sweep's runs (default:
    allocation_for(config)); only a run with an allocation of its own (PER_RUN) carries salloc's argv.
    `artifact`: the file the workflow made for the run's runtime from the built image (Sweep.artifacts)."""
    allocation = allocation_for(config) if allocation is None else allocation
    module = NETBENCH if spec.kind == "netbench" else framework(spec.framework).harness
    fabric = fabric_settings(config, spec.fabric)
    fabric_env = {k: str(v) for k, v in fabric["env"].items()}
    # Every layer logs which network it chose, so the parser can verify the fabric.
    rank_env = {**RANK_ENV, **debug_environment(fabric_env), **fabric_env}
    runtime = runtime_for(spec.runtime, config, spec.mpi_model, spec.framework)
    binds = tuple(config["images"]["binds"]) + ((dataset_dir(config),) if spec.data == "real" else ())
    if runtime.package == "clone":
        source = clone_sources()
        binds, rank_env = binds + (source,), {**rank_env, "PYTHONPATH": source}
    arguments = benchmark_args(spec, config)
    telemetry = telemetry_settings(spec, config)
    launcher = launcher_for(config, runtime)
    if telemetry:
        services = sorted({*runtime.service_processes, *launcher.service_processes})
        arguments += ["--telemetry-dir", telemetry["dir"], "--telemetry-interval", str(telemetry["interval_s"]),
                      *(["--telemetry-services", ",".join(services)] if services else [])]
        binds += (telemetry["dir"],)  # the samplers write it from inside the container
    # srun's pmix plugin: where it makes its directories, which a container rank binds (rankexec), asked of Slurm once
    srun_mpi = str(getattr(launcher, "mpi", ""))  # srun's plugin; none under mpirun
    pmix = srun_mpi.startswith("pmix") and not isinstance(runtime, BareMetal)
    request = RunRequest(module=module, args=tuple(arguments), env=rank_env,
                         workdir=os.getcwd(), binds=binds,
                         gpus=config["slurm"]["gpus_per_node"] > 0, infiniband=rdma_fabric(fabric),
                         ranks_per_node=spec.ranks_per_node, inherited_pmi_fd=srun_mpi == "pmi2",
                         pmix_server=pmix, pmix_base=slurm.pmix_client_base() if pmix else "",
                         own_allocation=allocation is Allocation.PER_RUN)
    env = runtime.environment(request)
    argv = launcher.wrap(runtime.rank_argv(request), spec, sorted(env), runtime.launcher_options(request))
    timeout = config["netbench" if spec.kind == "netbench" else "benchmark"]["timeout_s"]
    settings = {}
    if spec.kind == "train":
        bench = config["benchmark"]
        settings = {key: bench[key] for key in framework(spec.framework).planned_settings}
    own_allocation = runtime.allocation_options(request)
    stamp = os.path.abspath(artifact) if artifact else None
    archive = node_archive(runtime, artifact, config)
    node_prepare = runtime.node_prepare_argv(sys.executable, stamp, os.path.abspath(archive) if archive else None)
    if node_prepare and not launcher.slurm_step and not runtime.stores_images_per_node and (
            spec.nodes > 1 or slurm.in_allocation()):
        # Every node reads the shared copy, and no step of its own reaches the ranks' nodes: on several, or on one
        # that mpirun in an allocation may place away from here. The run goes without the answer, as before.
        node_prepare = None
    if node_prepare and spec.nodes > 1 and not launcher.slurm_step:
        raise ValueError(f"runtime {runtime.name!r} on {spec.nodes} nodes under launcher {launcher.kind!r}: its image "
                         "must first be put in each node's own store, which only srun reaches; allowed: launcher "
                         "srun, or one node")
    native = getattr(runtime, "native", False)
    if native and spec.nodes > 1 and not launcher.slurm_step:
        raise ValueError(f"runtime {runtime.name!r} native on {spec.nodes} nodes under launcher {launcher.kind!r}: the "
                         "host MPI must first be read on each node, which only srun reaches; allowed: launcher srun, "
                         "or one node")
    return RunPlan(
        run_id=spec.run_id,
        spec={**spec.as_dict(), "system": config["system"], "launcher": config["launcher"]["kind"],
              "mpi_model": runtime.mpi_model, **settings},
        argv=argv,
        env=env,
        timeout_s=timeout,
        exit_grace_s=config["netbench" if spec.kind == "netbench" else "benchmark"]["exit_grace_s"],
        image=getattr(runtime, "image", None),
        fabric={"name": spec.fabric, "env": fabric_env, "expect": fabric.get("expect")},
        telemetry=telemetry,
        benchmark_args=tuple(arguments),
        native_mpi={"library": runtime.native_mpi.library, "library_dirs": list(runtime.native_mpi.library_dirs)}
        if native else None,
        allocation=[*slurm.allocation_argv(config["slurm"], spec.nodes, spec.ranks_per_node,
                                           config["slurm"]["runtime_minutes"], f"containerbench-{spec.run_id}",
                                           spec.nodelist), *own_allocation]
        if allocation is Allocation.PER_RUN else None,
        node_prepare=launcher.on_each_node(node_prepare, spec) if node_prepare else None,
        node_mpi=launcher.on_each_node(hostmpi.node_argv(runtime.native_mpi.library, runtime.native_mpi.library_dirs),
                                       spec) if native else None,
        allocation_options=own_allocation or None,
    )


@dataclass
class Sweep:
    """The sweep made ready to run: every run planned, and what the plans depend on."""

    runs: list[RunSpec]
    plans: dict[str, RunPlan]  # run id -> plan
    artifacts: dict[cb_config.ImageUse, str] = field(default_factory=dict)  # who runs a built image -> its file
    skipped: dict[str, str] = field(default_factory=dict)  # runtime -> why it cannot run here
    dataset_sample: str | None = None  # the sample directory to generate for real-data runs, if any
    # The config as planned: each runtime's image resolved, the runtimes that cannot run here left out,
    # the dataset path set to the sample. The config given to plan_sweep stays as the user wrote it.
    config: dict = field(default_factory=dict)
    allocation: Allocation = Allocation.NONE  # the runs' Slurm allocation strategy

    @functools.cached_property
    def _node_archives(self) -> dict[cb_config.ImageUse, str | None]:
        """Who runs a built image -> the archive its runs' nodes load it from (node_archive), once each."""
        return {use: node_archive(runtime_for(use.runtime, self.config, use.mpi_model, use.framework), image,
                                  self.config) for use, image in self.artifacts.items()}

    @functools.cached_property
    def inputs(self) -> dict[str, dict[str, str]]:
        """run id -> the files the run needs first (inputs_of)."""
        return {run.run_id: self.inputs_of(run) for run in self.runs}

    def inputs_of(self, run: RunSpec) -> dict[str, str]:
        """The files a run needs first: its runtime's built image, the generated sample."""
        needs = {}
        use = cb_config.ImageUse.of(run)
        image = self.artifacts.get(use)
        if image:
            needs["image"] = image
            if archive := self._node_archives.get(use):
                needs["archive"] = archive
        if self.dataset_sample and run.data == "real":
            needs["data"] = self.dataset_sample
        return needs


def check_site_images(config: dict, artifacts: dict[cb_config.ImageUse, str]) -> None:
    """An image the site supplies (not one the workflow builds) exists, or is pinned by digest."""
    for runtime in site_images(config, artifacts):
        problem = runtime.site_image_problem()
        if problem:
            raise cb_config.ConfigError(f"config: {problem}")


def site_images(config: dict, artifacts: dict[cb_config.ImageUse, str]) -> list:
    """The runtimes (one per MPI model and framework) that run an image the site supplies."""
    uses = [cb_config.ImageUse(name, model, framework) for name in config["runtimes"] if name != BareMetal.name
            for framework in config["benchmark"]["frameworks"] for model in cb_config.mpi_models(config, name)]
    return [runtime_for(use.runtime, config, use.mpi_model, use.framework) for use in uses if use not in artifacts]


def site_image_files(config: dict, artifacts: dict[cb_config.ImageUse, str]) -> list[str]:
    """The image files the site supplies: the pre-flight check checks that the compute nodes see them."""
    return sorted({os.path.abspath(runtime.image) for runtime in site_images(config, artifacts)
                   if runtime.image_is_file(runtime.image)})




def plan_sweep(config: dict, repo: Path, *, probe: bool = True, probed: dict[str, str] | None = None) -> Sweep:
    """Everything checked before any job: runtimes' images and launchers, the dataset, the sweep,
    and (with `probe`) which runtimes can run here and what the Slurm cluster can give. Without
    `probe`, `probed` says which runtimes a probe elsewhere left out, and why (a job's process plans
    the sweep its workflow's planning process probed: SKIPPED_VARIABLE). `config` must be validated
    (config.validated) and is left unchanged: the Sweep holds the config as planned. Raises ConfigError."""
    planned = copy.deepcopy(config)
    try:
        artifacts = resolve_images(planned, repo / IMAGES)  # fills in the images the workflow builds
        check_launchers(planned)  # before any probe: an option a runtime does not take is a config error
        cb_config.check_modes_at(planned)  # before unusable runtimes are skipped
        skipped = select_runtimes(planned, artifacts) if probe else dict(probed or {})  # dropped from runtimes
        planned["runtimes"] = [name for name in planned["runtimes"] if name not in skipped]
        if probe:
            check_site_images(planned, artifacts)
            if artifacts:
                check_bench_env(planned, repo, artifacts)
        artifacts = {use: path for use, path in artifacts.items() if use.runtime in planned["runtimes"]}
        cb_config.check_dataset(planned)
        sample = None
        if "real" in planned["benchmark"]["data"] and not planned["dataset"]["path"]:
            sample = planned["dataset"]["path"] = str(repo / cb_config.SAMPLE_DIR)  # one sample for every results dir
        runs = cb_config.plan_runs(planned)
        cb_config.check_runs(planned, runs)
        if uses_slurm(planned):
            slurm.check_time_limit(planned)
            if probe:
                slurm.check_cluster(planned, runs)
        allocation = allocation_for(planned)
        plans = {run.run_id: plan_run(run, planned, allocation, artifacts.get(cb_config.ImageUse.of(run)))
                 for run in runs}
    except cb_config.ConfigError:
        raise
    except ValueError as error:  # a runtime refusing what the config asks (an option, a launcher, a bind)
        raise cb_config.ConfigError(f"config: {error}") from None
    return Sweep(runs, plans, artifacts, skipped, sample, planned, allocation)


def _rotated(items: list, repetition: int) -> list:
    shift = (repetition - 1) % len(items)
    return items[shift:] + items[:shift]


def run_order(runs: list[RunSpec]) -> dict[str, int]:
    """Each run's place (0: first) among the runs of its repetition, counterbalanced: the runs that differ
    only in what is compared (COMPARED) form a block, and in repetition r the blocks, and the runs inside
    each, are rotated by r - 1 from their sorted order (a cyclic Latin square). Over as many repetitions as
    a block has runs each of them runs first once, so a drift or a load within a repetition falls on every
    runtime alike instead of on the ones that happen to sort first."""
    order: dict[str, int] = {}
    for repetition in sorted({run.repetition for run in runs}):
        blocks: dict[str, list[RunSpec]] = {}
        for run in sorted((run for run in runs if run.repetition == repetition), key=lambda run: run.run_id):
            block = [(f.name, getattr(run, f.name)) for f in fields(run) if f.name not in (*COMPARED, "repetition")]
            blocks.setdefault(repr(block), []).append(run)
        ordered = [run for key in _rotated(sorted(blocks), repetition) for run in _rotated(blocks[key], repetition)]
        order.update({run.run_id: place for place, run in enumerate(ordered)})
    return order


def measurement_priorities(runs: list[RunSpec], below: int) -> dict[str, int]:
    """Snakemake priorities (higher first) that measure the repetitions in turn, earlier first, and each in
    run_order's order; all under `below` (the steps every measurement waits for). They order the jobs, and
    are not a rule's params: a run's place changes with the sweep, and that must not measure it again."""
    order = run_order(runs)
    width = max(Counter(run.repetition for run in runs).values(), default=1)
    last = max((run.repetition for run in runs), default=1)
    priorities = {run.run_id: (last - run.repetition) * width + width - 1 - order[run.run_id] for run in runs}
    if max(priorities.values(), default=0) >= below:
        raise cb_config.ConfigError(f"config: {len(runs)} runs in {last} repetitions are too many to order by "
                                    f"priority below {below}; allowed: fewer runs or repetitions per sweep")
    return priorities

