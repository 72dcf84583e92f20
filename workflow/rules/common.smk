# Configuration checked before any job starts, and the sweep expanded into plans.
import json
import sys
from pathlib import Path

from snakemake.utils import validate

from containerbench import config as cb_config
from containerbench.launch import check_slurm_request, plan as make_plan

try:
    cb_config.check(config)  # one line naming the key, the value and what is allowed
    validate(config, "../schemas/config.schema.yaml")  # fills the schema's defaults
    # runtime -> the built image it runs; images belong to the repository (see images.smk)
    IMAGE_ARTIFACTS = cb_config.resolve_images(config, str(Path(workflow.basedir) / cb_config.BUILD_DIR))
    # Probing runtimes is for the process that plans; a job re-reads this file on its node.
    SKIPPED_RUNTIMES = cb_config.select_runtimes(config, IMAGE_ARTIFACTS) if workflow.is_main_process else {}
    # Real data without a site dataset: the sample data.smk writes (the runs depend on it).
    cb_config.check_dataset(config)
    SAMPLE_DIR = str(Path(workflow.basedir) / cb_config.SAMPLE_DIR)  # anchored at the repository
    DATASET_SAMPLE = None
    if "real" in config["benchmark"]["data"] and not config["dataset"]["path"]:
        DATASET_SAMPLE = config["dataset"]["path"] = SAMPLE_DIR
    RUNS = cb_config.plan_runs(config)
    cb_config.check_runs(config, RUNS)
    if workflow.is_main_process and config["launcher"]["kind"] == "srun":
        check_slurm_request(config, RUNS)  # what sinfo says this cluster can give
except (cb_config.ConfigError, ValueError) as error:
    # Stop before any job starts, with the one line and no traceback.
    sys.exit(f"containerbench: {error}")
PLANS = {run.run_id: make_plan(run, config) for run in RUNS}

RESULTS = config["results_dir"]
CB = f"{sys.executable} -m containerbench"


wildcard_constraints:
    run_id=r"(train|netbench)_[^/]+_rep\d+",  # ids are made by config.RunSpec.run_id


def slurm_resources(settings: dict) -> dict:
    """The per-job Slurm settings a site puts in its config (resources of the executor plugin).

    Only what is set is passed. GPUs go through slurm_extra, not the plugin's `gpu`
    resource, which would turn tasks into --ntasks-per-gpu.
    """
    resources = {"runtime": settings["runtime_minutes"], "cpus_per_task": settings["cpus_per_rank"]}
    for key, resource in (("partition", "slurm_partition"), ("account", "slurm_account"),
                          ("qos", "qos"), ("constraint", "constraint")):
        if settings[key]:
            resources[resource] = settings[key]
    if settings["mem_mb_per_node"]:
        resources["mem_mb"] = settings["mem_mb_per_node"]
    extra = (["--exclusive"] if settings["exclusive"] else []) + (
        [f"--gres=gpu:{settings['gpus_per_node']}"] if settings["gpus_per_node"] else [])
    if extra:
        resources["slurm_extra"] = " ".join(extra)
    return resources


SLURM_RESOURCES = slurm_resources(config["slurm"])
