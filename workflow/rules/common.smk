# Configuration checked before any job starts, and the sweep expanded into plans.
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import (
    attempts,
    cost,
    export,
    fleet,
    fleetexport,
    fleetplan,
    fleetjobs,
    fleetrounds,
    history,
    launchers,
    plans,
    preflight,
    processes,
    results,
    runtimes,
    slurm,
)
from containerbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from containerbench.point import Point

REPO = Path(workflow.basedir)  # the image, the wheelhouse and the data sample belong to the clone
try:
    cb_config.validated(config)  # one line naming the key, the value and what is allowed; defaults filled in
    # The clone's podman settings for this host (runtimes.Podman.engine_environment), when the runs are
    # launched here, before the runtimes are probed: every job inherits them, whether Snakemake was started
    # by `make` or not. Not on Slurm: CONTAINERS_CONF replaces every other containers.conf (containers.conf(5)),
    # and the compute nodes' podman is the site's, configured there.
    if not launchers.uses_slurm(config):
        os.environ.update(runtimes.Podman.engine_environment(REPO))
    # Probing runtimes and sinfo is for the process that plans; a job re-reads this file on its node, and
    # leaves out the runtimes that process left out (a run: block's estimate counts the same runs).
    PROBED = {} if workflow.is_main_process else json.loads(os.environ.get(plans.SKIPPED_VARIABLE, "{}"))
    SWEEP = plans.plan_sweep(config, REPO, probe=workflow.is_main_process, probed=PROBED)
    if workflow.is_main_process:
        os.environ[plans.SKIPPED_VARIABLE] = json.dumps(SWEEP.skipped)
    # The config as planned (images resolved, runtimes that cannot run here left out, the data sample):
    # what the rules use; `config` stays as the user wrote it (with defaults), for its digest.
    PLANNED = SWEEP.config
except cb_config.ConfigError as error:
    # Stop before any job starts, with the one line and no traceback.
    sys.exit(f"containerbench: {error}")

# A controller killed outright (SIGKILL, a lost login session) leaves its lock behind, and its jobs:
# each job's launcher stops its run once the controller named here is gone (execution.execute), and
# the next invocation removes the lock when its recorded owner is gone (Snakemake leaves that to
# `--unlock`: its lock files do not say who holds them), once its jobs have stopped. Jobs on other
# nodes ignore the name: with Slurm the lock stays while the dead controller's jobs are in squeue.
SNAKEMAKE_LOCKS = Path(".snakemake", "locks")
# The planning process of a run or a dry run; not --lint (Snakemake's lint alone parses with check_envvars off).
PLANS_A_RUN = workflow.is_main_process and workflow.check_envvars
# Only a run changes anything here; a dry run and --lint read and check. The stale lock cannot wait
# for onstart: Snakemake refuses a locked directory before its hooks run.
RUNS_FOR_REAL = PLANS_A_RUN and not workflow.output_settings.dryrun
if workflow.is_main_process:
    os.environ[processes.CONTROLLER_VARIABLE] = processes.identity(os.getpid())  # this process's, for its jobs
if RUNS_FOR_REAL:
    if stale := processes.remove_stale_lock(SNAKEMAKE_LOCKS, slurm=launchers.uses_slurm(config)):
        print(stale, file=sys.stderr)
    # Two controllers in one directory (two validations, a sweep and a validation) would measure beside
    # each other; Snakemake refuses only overlapping outputs, and with a page of text.
    if busy := processes.held_by_another(SNAKEMAKE_LOCKS):
        sys.exit(busy)


PLANS = SWEEP.plans
RESULTS = config["results_dir"]
PYTHON = sys.executable  # the workflow's interpreter, with this package installed
CB = shlex.join([PYTHON, "-m", "containerbench"])


def in_clone(path: Path) -> Path:
    """A path given relative to the clone (.venv-bench/bin/python) is the clone's, where it is there."""
    return REPO / path if not path.is_absolute() and (REPO / path).exists() else path


def job_shape(plans):
    """Inside a site's allocation (launchers.Allocation.STEP) runs are its job steps, through the executor
    plugin, with the shape of their plans (run id -> RunPlan); elsewhere no resources."""
    if SWEEP.allocation is not launchers.Allocation.STEP:
        return {}
    return {
        "nodes": lambda wildcards: plans[wildcards.run_id].spec["nodes"],
        "tasks": lambda wildcards: plans[wildcards.run_id].spec["ranks"],
        "mpi": lambda wildcards: launchers.Srun.program if plans[wildcards.run_id].spec["ranks"] > 1 else None,
        **SLURM_RESOURCES,
    }


def fleet_asked() -> bool:
    """Whether this invocation asks for the batch: validate_nodes, a fleet rule or a file of results/fleet
    among the targets on its command line (Snakemake's own parser reads them; the Snakefile is not told).
    A command line that is not Snakemake's asks for everything."""
    from snakemake.cli import get_argument_parser

    try:
        targets = get_argument_parser().parse_known_args(sys.argv[1:])[0].targets or []
    except SystemExit:
        return True
    return any(
        target == "validate_nodes" or target.startswith("fleet_") or f"{RESULTS}/fleet/" in target for target in targets
    )


# Each framework's bare-metal interpreter (bare_metal.python, bare_metal.torch_python).
FRAMEWORK_PYTHON = {
    name: in_clone(Path(config["bare_metal"][each.bare_metal_key])) for name, each in FRAMEWORKS.items()
}
BENCH_PYTHON = FRAMEWORK_PYTHON[DEFAULT_FRAMEWORK]  # benchmark_env's venv: the data sample, the base image
SLURM_RESOURCES = slurm.job_resources(config["slurm"])
# The results store outlives every run (history.DEFAULT_STORE says where, when the config does not).
HISTORY_STORE = history.store_path(config)
# The whole merged config, defaults filled in: what the store's sessions are told apart by.
CONFIG_DIGEST = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
if workflow.is_main_process:
    try:  # a store that is not ours, or a tag no selector could name, is refused before any job
        history.check_tag(config["history"]["tag"])
        history.check_store(HISTORY_STORE)
    except history.HistoryError as error:
        sys.exit(f"containerbench: config: 'history': {error}")
if PLANS_A_RUN:
    # What the sweep costs, once, before anything is submitted; on stderr, so a dry run shows it too
    # (here, not in onstart: Snakemake runs no hook in a dry run). Its expected figure reads the system's
    # last sweeps in the results store, checked above.
    print(
        cost.cost_summary(SWEEP, stored=history.newest_sweep_records(HISTORY_STORE, config["system"])), file=sys.stderr
    )
# Runtimes installed only on the compute nodes: probed by the pre-flight job there, and their
# images converted by jobs there too (images.smk).
ON_COMPUTE_NODES = {
    name for name in PLANNED["runtimes"] if runtimes.runtime_for(name, PLANNED).available == "compute-nodes"
}
# Of those, the ones whose image is converted on a node; Enroot's is made here without it (converts_without_itself).
CONVERTED_ON_NODES = {
    name for name in ON_COMPUTE_NODES if not runtimes.CONTAINER_RUNTIMES[name].converts_without_itself
}
# A one-node, one-task job's resources on Slurm (the pre-flight job, conversions on the nodes).
ON_A_NODE = {"nodes": 1, "tasks": 1, **SLURM_RESOURCES} if launchers.uses_slurm(config) else {}
# What the runs need (images, the data sample) is made before the first measurement: otherwise the
# bare-metal runs, ready first, would all run before any container run, and the runtimes would be
# measured at different times instead of interleaved by repetition (benchmark.smk).
BEFORE_ANY_MEASUREMENT = 1_000_000


wildcard_constraints:
    run_id=Point.run_id_pattern(),  # ids are made by point.Point.run_id


# What the compute nodes must see (the clone and the bare-metal Python at the same path, the
# runtimes installed only there, the site's image files, the fabrics' devices, room for a node's
# ranks), checked on one of them before any job
# is submitted; not in a dry run. A hook, not a rule: see containerbench/preflight.py.
BARE_METAL = runtimes.BareMetal.name in PLANNED["runtimes"]
PREFLIGHT = preflight.check_argv(
    PLANNED,
    REPO,
    PYTHON,
    {name: FRAMEWORK_PYTHON[name] for name in config["benchmark"]["frameworks"] if BARE_METAL},
    {name: list(runtimes.runtime_for(name, PLANNED).probe) for name in sorted(ON_COMPUTE_NODES)},
    plans.site_image_files(PLANNED, SWEEP.artifacts),
    SWEEP.runs,
    runtimes.node_requirements(PLANNED),
)


onstart:
    if workflow.execution_settings.lock:  # the locks are held now: say whose they are
        processes.record_lock_owner(SNAKEMAKE_LOCKS)
    # Only when something is to be measured (not for `snakemake report`, or images alone); a
    # round of `repetitions: auto` may add runs that are not in the DAG yet.
    if any(
        job.rule.name.startswith("measure_") or job.rule.name == "repetition_round"
        for job in workflow.dag.needrun_jobs()
    ):
        preflight.run_before_jobs(PREFLIGHT)
