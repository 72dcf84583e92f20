"""What a Slurm site's config asks of its cluster: job resources, checked against sinfo.

`job_resources` turns the config's `slurm` section into the resources of the
Snakemake executor plugin; `check_time_limit` and `check_cluster` refuse,
before anything is submitted, what cannot work or what the cluster cannot give.
"""

from __future__ import annotations

import subprocess

from containerbench.config import ConfigError, RunSpec


def job_resources(settings: dict) -> dict:
    """The per-job Slurm settings a site puts in its config, as executor-plugin resources.

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


def check_time_limit(config: dict) -> None:
    """A job must outlive the runs' own timeouts, or a hung run is killed by Slurm unrecorded."""
    minutes = config["slurm"]["runtime_minutes"]
    key, limit = max((("benchmark.timeout_s", config["benchmark"]["timeout_s"]),
                      ("netbench.timeout_s", config["netbench"]["timeout_s"])), key=lambda item: item[1])
    if limit >= minutes * 60:
        raise ConfigError(f"config: 'slurm.runtime_minutes' = {minutes} ends before '{key}' = {limit} s; allowed: "
                          f"more than {limit // 60} minutes, so a hung run is recorded as failed instead of "
                          "killed by Slurm")


def partitions(sinfo=("sinfo",)) -> dict[str, tuple[int, int]] | None:
    """partition -> (nodes, most GPUs on one node), from sinfo; None where sinfo cannot answer."""
    try:
        listing = subprocess.run([*sinfo, "-h", "-o", "%R|%D|%G"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0:
        return None
    found: dict[str, tuple[int, int]] = {}
    for line in listing.stdout.split():
        name, nodes, gres = line.split("|")
        gpus = max((int(g.split(":")[-1].split("(")[0]) for g in gres.split(",") if g.startswith("gpu")), default=0)
        known = found.get(name, (0, 0))
        found[name] = (known[0] + int(nodes), max(known[1], gpus))
    return found


def check_cluster(config: dict, runs: list[RunSpec], sinfo=("sinfo",)) -> None:
    """Refuse, before anything is submitted, a partition, node count or GPU count this cluster
    cannot give (ConfigError, one line). Nothing is checked where sinfo cannot answer."""
    slurm = config["slurm"]
    found = partitions(sinfo)
    if found is None:
        return
    name = slurm["partition"] or next(iter(found), None)
    if slurm["partition"] and name not in found:
        raise ConfigError(f"config: 'slurm.partition' = {name!r} is not a partition of this cluster; "
                          f"allowed: {', '.join(sorted(found))}")
    if name is None:
        return
    nodes, gpus = found[name]
    most = max(r.nodes for r in runs) if runs else 0
    if most > nodes:
        raise ConfigError(f"config: 'scaling.nodes' asks for {most} nodes, partition {name!r} has {nodes}; "
                          f"allowed: at most {nodes}")
    if slurm["gpus_per_node"] > gpus:
        raise ConfigError(f"config: 'slurm.gpus_per_node' = {slurm['gpus_per_node']}, nodes of partition {name!r} "
                          f"have {gpus} GPU(s); allowed: at most {gpus}")


# sacct's job states in which the job no longer runs (sacct(1), "JOB STATE CODES").
ENDED_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "TIMEOUT")


def job_state(job_id: str, sacct=("sacct",), wait_s: float = 15.0) -> dict | None:
    """Slurm's own word on an allocation that ended under a run: its state and reason from sacct, once
    they say it ended (the accounting lags the event by a few seconds); None while it still runs, or
    where sacct cannot answer."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            listing = subprocess.run([*sacct, "--jobs", str(job_id), "--allocations", "--noheader", "--parsable2",
                                      "--format", "State,Reason,ExitCode"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        fields = (listing.stdout.strip().splitlines() or [""])[0].split("|") if listing.returncode == 0 else []
        if len(fields) == 3 and fields[0].split()[:1] and fields[0].split()[0] in ENDED_STATES:
            return {"job": str(job_id), "state": fields[0], "reason": fields[1], "exit_code": fields[2]}
        if time.monotonic() > deadline:
            return None
        time.sleep(1)
