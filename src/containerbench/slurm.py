"""What a Slurm site's config asks of its cluster, and how runs get their nodes.

`job_resources` turns the config's `slurm` section into the resources of the
Snakemake executor plugin; `check_time_limit` and `check_cluster` refuse,
before anything is submitted, what cannot work or what the cluster cannot give.
The node queries (hostlists, node and partition states) and sacct's word on an
ended job live here too. `allocation_argv` and `run_allocated` give a run (or a
fleet job's runs) its own allocation with the launcher outside it: when Slurm
ends the allocation, the launcher is still there to record why.

Every node query takes `via`, an argv prefix that runs the Slurm client elsewhere
(the tests' controller namespace); empty on a site. The plan's one read of the
config (pmix_client_base) is made where the plan is.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from containerbench.config import ConfigError


class QueryError(ValueError):
    """A node selection Slurm refuses; the message is one line for the user."""


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


def time_limit_minutes(text: str) -> int | None:
    """sinfo's %l (days-hours:minutes:seconds, hours:minutes:seconds, minutes:seconds or minutes) in
    whole minutes; None for no limit ("infinite", "UNLIMITED", "n/a")."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        return None
    days, first, second, third = (int(part) if part else 0 for part in match.groups())
    if match.group(4) is not None:  # [days-]hours:minutes:seconds
        return days * 1440 + first * 60 + second + (third > 0)
    if match.group(1) is not None:  # days-hours[:minutes]
        return days * 1440 + first * 60 + second
    return first + (second > 0)  # minutes[:seconds]


@dataclass(frozen=True)
class Partition:
    nodes: int
    gpus: int  # the most on one node
    max_minutes: int | None  # MaxTime; None: no limit
    max_job_nodes: int | None = None  # MaxNodes, the most nodes one job may have; None: no limit


def job_size_limit(text: str) -> int | None:
    """sinfo's %s, a partition's job sizes in nodes as MIN-MAX ("1-infinite", "2-64") or one number: the
    most, None for no limit."""
    most = text.strip().rsplit("-", 1)[-1]
    return int(most) if most.isdigit() else None


# srun's word for tasks that ended before their step did (Slurm 22.05, src/plugins/launch/slurm/launch_slurm.c,
# _task_finish: error("%s: %s %s: %s%s", hosts, "task" or "tasks", their ids, strsignal(), " (core dumped)"), and
# "... Exited with exit code %d"): "srun: error: n1: task 0: Segmentation fault". The first is the cause; the
# ones after it are the step being torn down ("task 1: Killed").
SRUN_TASK_ENDED = re.compile(r"srun: error: (?P<hosts>\S+): (?P<which>tasks?) (?P<ids>[\d,\-]+): (?P<how>.+)")
# What srun says next, when it ends the step itself (src/api/step_launch.c, slurm_step_launch_wait_finish: it asks
# for the step's SIGKILL, then "Job step aborted: Waiting up to %d seconds for job step to finish.", then "Timed out
# waiting for job step to complete"): how long it means to wait. 32 s in Slurm 22.05's logs (tests/data/crashes).
SRUN_STEP_WAIT = re.compile(r"srun: Job step aborted: Waiting up to (?P<seconds>\d+) seconds")
SRUN_DEFAULT_STEP_WAIT_S = 32  # where srun has not said yet

# One GRES of sinfo's %G, as Slurm writes it (src/interfaces/gres.c, _build_node_gres_str and
# _core_bitmap2str; bit_fmt in src/common/bitstring.c for the socket list):
# name[:type][:no_consume]:count[K|M|G|T|P][(S:sockets)], sockets a comma-separated list of numbers and
# ranges ("0-1", "0,2"); GresUsed writes (IDX:...) in the same place. GRES are separated by commas.
GRES_ITEM = re.compile(r"(?P<name>[^:,()]+)(?::(?P<type>[^:,()]+))??(?::no_consume)?:(?P<count>\d+)(?P<unit>[KMGTP]?)"
                       r"(?:\((?:S|IDX):[\d,\-]*\))?(?:,|$)")
GRES_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def gres_counts(field: str) -> dict[tuple[str, str | None], int]:
    """sinfo's GRES field (%G) as {(name, type): count}; "(null)" (no GRES) is empty. QueryError, one
    line naming the field and the text, for what is not Slurm's GRES list."""
    counts: dict[tuple[str, str | None], int] = {}
    text, position = field.strip(), 0
    if text in ("", "(null)"):
        return counts
    while position < len(text):
        item = GRES_ITEM.match(text, position)
        if item is None or item.end() == position:
            raise QueryError(f"sinfo's GRES field (%G) {text!r} is not a list of name[:type]:count[(S:sockets)] "
                             f"at {text[position:]!r}; allowed: what Slurm writes, e.g. gpu:h100:4(S:0-1),nvme:1")
        key = (item["name"], item["type"])
        counts[key] = counts.get(key, 0) + int(item["count"]) * GRES_UNITS[item["unit"]]
        position = item.end()
    if text.endswith(","):
        raise QueryError(f"sinfo's GRES field (%G) {text!r} ends with a comma; allowed: what Slurm writes, e.g. "
                         "gpu:h100:4(S:0-1),nvme:1")
    return counts


def gpus_of(field: str) -> int:
    """The GPUs one node of sinfo's line has: every type's count of GRES gpu."""
    return sum(count for (name, _), count in gres_counts(field).items() if name == "gpu")


def partitions(via: tuple[str, ...] = ()) -> dict[str, Partition] | None:
    """Each partition's nodes, GPUs (the most on one node) and time limit, from sinfo; None where sinfo
    cannot answer. QueryError for a GRES field that is not Slurm's."""
    try:
        listing = subprocess.run([*via, "sinfo", "-h", "-o", "%R|%D|%G|%l|%s"], capture_output=True, text=True,
                                 timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0:
        return None
    found: dict[str, Partition] = {}
    for line in listing.stdout.split():
        name, nodes, gres, limit, sizes = line.split("|")
        gpus = gpus_of(gres)
        known = found.get(name, Partition(0, 0, time_limit_minutes(limit), job_size_limit(sizes)))
        found[name] = Partition(known.nodes + int(nodes), max(known.gpus, gpus), known.max_minutes,
                                known.max_job_nodes)
    return found


def job_partition(settings: dict, found: dict) -> str | None:
    """The partition a job goes to: the slurm section's, else the first sinfo lists."""
    return settings["partition"] or next(iter(found), None)


def job_partition_limits(settings: dict, found: dict | None) -> tuple[str | None, Partition | None]:
    """The partition a job goes to and what sinfo says of it (None where sinfo cannot answer)."""
    name = job_partition(settings, found or {})
    return name, (found or {}).get(name)


NOT_CHECKED = ("containerbench: note: sinfo cannot answer here: the partition, node count, GPUs and time limit are not "
               "checked before submitting (Slurm refuses what it cannot give when each job is submitted)")


def check_cluster(config: dict, runs: list, via: tuple[str, ...] = ()) -> None:
    """Refuse, before anything is submitted, a partition, node count, GPU count or time limit this
    cluster cannot give (ConfigError, one line). Where sinfo cannot answer nothing is checked, and one
    line on stderr says so."""
    slurm = config["slurm"]
    try:
        found = partitions(via)
    except QueryError as error:
        raise ConfigError(f"config: {error}") from None
    if found is None:
        print(NOT_CHECKED, file=sys.stderr)
        return
    name = job_partition(slurm, found)
    if slurm["partition"] and name not in found:
        raise ConfigError(f"config: 'slurm.partition' = {name!r} is not a partition of this cluster; "
                          f"allowed: {', '.join(sorted(found))}")
    if name is None:
        return
    partition = found[name]
    most = max(r.nodes for r in runs) if runs else 0
    if most > partition.nodes:
        raise ConfigError(f"config: 'scaling.nodes' asks for {most} nodes, partition {name!r} has {partition.nodes}; "
                          f"allowed: at most {partition.nodes}")
    if slurm["gpus_per_node"] > partition.gpus:
        raise ConfigError(f"config: 'slurm.gpus_per_node' = {slurm['gpus_per_node']}, nodes of partition {name!r} "
                          f"have {partition.gpus} GPU(s); allowed: at most {partition.gpus}")
    if partition.max_minutes is not None and slurm["runtime_minutes"] > partition.max_minutes:
        raise ConfigError(f"config: 'slurm.runtime_minutes' = {slurm['runtime_minutes']} is beyond partition "
                          f"{name!r}'s time limit; allowed: at most {partition.max_minutes}")


# The nodes of a batch to validate, and their states.

# sinfo's node states (%T) in which a node cannot take a job: reported, never waited for.
UNAVAILABLE_STATES = ("down", "drain", "fail", "maint", "future", "unknown", "not_responding", "reboot",
                      "power", "inval")


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's %T, e.g. "idle", "drained", "down*"
    reason: str = ""  # sinfo's %E

    @property
    def available(self) -> bool:
        return not self.state.endswith("*") and self.usable_when_it_answers

    @property
    def usable_when_it_answers(self) -> bool:
        """Its state, the '*' of a node not answering slurmctld's ping for now set aside: not down, drained, ..."""
        state = self.state.lower().rstrip("*~#!%$@^-")
        return not any(state.startswith(bad) for bad in UNAVAILABLE_STATES)


def query(argv: list[str], key: str, value: str, via: tuple[str, ...] = ()) -> str:
    """A Slurm client's output; a client missing or failing is refused in one line naming the key."""
    try:
        done = subprocess.run([*via, *argv], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise QueryError(f"'{key}' = {value!r} needs Slurm's {argv[0]}, which is not installed here") from None
    except subprocess.TimeoutExpired:  # slurmctld not answering: the caller goes on as where Slurm cannot say
        raise QueryError(f"'{key}' = {value!r}: {shlex.join(argv[:3])} did not answer in 60 s") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise QueryError(f"'{key}' = {value!r}: {shlex.join(argv[:3])} failed: {why}")
    return done.stdout


@functools.cache
def pmix_client_base() -> str:
    """Where srun's pmix plugin makes each step's client directory (spmix_appdir_*), as the cluster is configured:
    mpi.conf's PMIxCliTmpDirBase, else slurm.conf's TmpFS, %n and %h unexpanded (the node expands them; a job's
    SLURM_PMIX_TMPDIR, read on the node, comes first: Slurm's mpi/pmix pmixp_info.c). "" where scontrol cannot tell."""
    try:
        done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    settings = dict(re.findall(r"^(PMIxCliTmpDirBase|TmpFS)\s+=\s+(\S+)", done.stdout, re.MULTILINE))
    return next((value for value in (settings.get("PMIxCliTmpDirBase"), settings.get("TmpFS"))
                 if value and value != "(null)"), "")


# Slurm's own bound (src/common/hostlist.h: MAX_RANGE is MAX_SLURM_NODES, "64K Hosts").
MAX_SLURM_NODES = 64 * 1024


def expand_hostlist(expression: str, via: tuple[str, ...] = ()) -> list[str]:
    """The node names of a Slurm hostlist expression (n[001-064]), in order, each once."""
    names = query(["scontrol", "show", "hostnames", expression], "validation.nodes", expression, via).split()
    if not names or any(set(name) & set("[],") for name in names):
        raise QueryError(f"'validation.nodes' = {expression!r} expands to no node names; "
                         "allowed: a Slurm hostlist such as n[001-064] or n1,n2")
    if len(names) > MAX_SLURM_NODES:
        raise QueryError(f"'validation.nodes' = {expression!r} expands to {len(names):,} names, more nodes than a "
                         f"Slurm cluster can have ({MAX_SLURM_NODES:,}); allowed: the hostlist of the new nodes")
    return list(dict.fromkeys(names))


SINFO_FORMAT = "%N|%T|%E"


def _parse_sinfo(text: str) -> dict[str, NodeState]:
    states = {}
    for line in text.splitlines():
        name, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if name and name not in states:  # a node in several partitions has a line in each
            states[name] = NodeState(name, state, "" if reason == "none" else reason)
    return states


def node_states(names: list[str], via: tuple[str, ...] = (), expression: str | None = None) -> dict[str, NodeState]:
    """sinfo's state of each named node, in the order given; a name Slurm does not know is refused.
    `expression`: the hostlist as the config gave it, which a refusal names (else the names)."""
    joined = ",".join(names)
    states = _parse_sinfo(query(["sinfo", "--noheader", "--Node", "--nodes", joined, "--format", SINFO_FORMAT],
                                "validation.nodes", expression or joined, via))
    unknown = [name for name in names if name not in states]
    if unknown:
        in_all = f" ({len(unknown)} unknown in all)" if len(unknown) > 1 else ""
        raise QueryError(f"'validation.nodes' names {unknown[0]!r}, which Slurm does not know (sinfo); "
                         f"allowed: nodes of this cluster{in_all}")
    return {name: states[name] for name in names}


def partition_states(partition: str, via: tuple[str, ...] = ()) -> dict[str, NodeState]:
    """The nodes sinfo lists in a partition, with their states (sinfo's order); a partition that does not
    exist is refused."""
    states = _parse_sinfo(query(["sinfo", "--noheader", "--Node", "--partition", partition, "--format", SINFO_FORMAT],
                                "validation.partition", partition, via))
    if not states:
        known = sorted(set(query(["sinfo", "--noheader", "--format", "%R"], "validation.partition", partition,
                                 via).split()))
        raise QueryError(f"'validation.partition' = {partition!r} is not a partition with nodes; "
                         f"allowed: {', '.join(known) or 'none'}")
    return states


# An allocation per job, with the launcher outside it.

# Slurm's ExitCode of its own errors in salloc (an allocation refused, revoked while pending), told apart
# from the command's (salloc(1), ENVIRONMENT: SLURM_EXIT_ERROR).
SALLOC_ERROR_EXIT = 75
# Minutes an allocation holds beyond its runs' timeouts: each failed run may wait for sacct (job_state).
ALLOCATION_SLACK_MINUTES = 2


def in_allocation() -> bool:
    """Whether this process runs inside a Slurm allocation (a job's, or salloc's), where runs are its steps."""
    return "SLURM_JOB_ID" in os.environ


def allocation_argv(settings: dict, nodes: int, ranks_per_node: int, minutes: int, name: str,
                    nodelist: tuple[str, ...] = (), exclusive: bool | None = None) -> list[str]:
    """salloc for one job of runs: its nodes (exactly these, with a nodelist), exclusively where the slurm
    section says so (or `exclusive`), with its partition, account, QoS, constraint, memory and GPUs."""
    argv = ["salloc", f"--nodes={nodes}", *([f"--nodelist={','.join(nodelist)}"] if nodelist else []),
            *(["--exclusive"] if (settings["exclusive"] if exclusive is None else exclusive) else []),
            f"--ntasks-per-node={ranks_per_node}", f"--cpus-per-task={settings['cpus_per_rank']}",
            f"--time={minutes}", f"--job-name={name}"]
    for key, option in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                        ("constraint", "--constraint")):
        if settings[key]:
            argv.append(f"{option}={settings[key]}")
    if settings["mem_mb_per_node"]:
        argv.append(f"--mem={settings['mem_mb_per_node']}")
    if settings["gpus_per_node"]:
        argv.append(f"--gres=gpu:{settings['gpus_per_node']}")
    return argv


def run_allocated(allocation: list[str], command: list[str], echo=sys.stderr) -> tuple[int, str | None]:
    """Run `command` in a new allocation (salloc `allocation` `command`), from here: (the command's exit
    status, None), or (SALLOC_ERROR_EXIT, why) when Slurm gave no allocation or revoked it before the
    command ran: salloc's own error, and sacct's state where salloc named its job.

    stdin is /dev/null: salloc from a terminal, in a job not in the foreground (Snakemake's), would stop
    on SIGTTIN (salloc.c asks the terminal for its process group)."""
    process = subprocess.Popen([*allocation, *command], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, errors="replace",
                               env={**os.environ, "SLURM_EXIT_ERROR": str(SALLOC_ERROR_EXIT)})
    said: list[str] = []

    def copy() -> None:
        for line in process.stderr:
            said.append(line) if line.startswith("salloc: ") else None
            echo.write(line)

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    returncode = process.wait()
    reader.join(timeout=10)
    if returncode != SALLOC_ERROR_EXIT:
        return returncode, None
    errors = [line.removeprefix("salloc: ").strip() for line in said if "error" in line.lower() or "revoked" in line]
    job = next((match.group(1) for line in said if (match := re.search(r"job allocation (\d+)", line, re.I))), None)
    ended = job_state(job, wait_s=5) if job else None
    why = ("; ".join(errors[-1:] + ([f"Slurm job {job} {ended['state']}"] if ended else []))
           or f"salloc exit {returncode}")
    return returncode, f"no allocation: {why}"


# sacct's job states in which the job no longer runs (sacct(1), "JOB STATE CODES").
ENDED_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "TIMEOUT")


def job_state(job_id: str, via: tuple[str, ...] = (), wait_s: float = 15.0) -> dict | None:
    """Slurm's own word on an allocation that ended under a run: its state and reason from sacct, once
    they say it ended (the accounting lags the event by a few seconds); None while it still runs, or
    where sacct cannot answer."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            listing = subprocess.run([*via, "sacct", "--jobs", str(job_id), "--allocations", "--noheader",
                                      "--parsable2", "--format", "State,Reason,ExitCode"],
                                     capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        fields = (listing.stdout.strip().splitlines() or [""])[0].split("|") if listing.returncode == 0 else []
        if len(fields) == 3 and fields[0].split()[:1] and fields[0].split()[0] in ENDED_STATES:
            return {"job": str(job_id), "state": fields[0], "reason": fields[1], "exit_code": fields[2]}
        if time.monotonic() > deadline:
            return None
        time.sleep(1)
