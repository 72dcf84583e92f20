"""Raw log -> run record: the first step of the one-way flow (log -> record -> table -> report).

`parse_log` reads only the raw log execution.execute wrote and turns it into a run
record (JSON): the spec, the benchmark's result line, the exit status, which
network each layer really used, and the verdict (ok, failed or invalid, with
its reasons and the evidence line). Each step below is one question asked of
the log; the verdict is the sum of their answers.

`load_records` reads records back for every reader and migrates an older record
to the current shape (`migrate`), so readers can trust every key. The shape is
the record's schema (package data, schemas/record.schema.yaml): `check_record`
holds a record to it, as the tests do with every kind of record written here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from containerbench import outputs
from containerbench.config import describe, load_schema
from containerbench.fabrics import check_grpc, verify
from containerbench.launchers import asks_a_core_per_rank
from containerbench.rank import markers
from containerbench.rank.distribution import LOCAL
from containerbench.runtimes import BareMetal
from containerbench.slurm import SRUN_TASK_ENDED
from containerbench.status import Check, Status
from containerbench.usage import read_telemetry

# The version is the major number of ReFrame's DATA_VERSION: a reader of one version cannot read a
# record of another. It stays 1 while keys are only added (ADDED_KEYS, filled in on load), so every
# record written keeps its bytes; a key that changes meaning or type bumps it, with a step in migrate.
RECORD_VERSION = 1
RECORD_FORMAT = f"containerbench.record/{RECORD_VERSION}"
# The keys records of this version gained after the first ones were written (the first parser,
# 6fabfc2), with the value readers took for a record without them; the commit that added each.
ADDED_KEYS = {
    "image": None,  # 9e80371: the image a container runtime ran
    "fabric_check": None,  # 9e80371: the transport check; null, not a check, in a record made before it
    "started_unix": None,  # 3ea4052
    "launch_context": None,  # 269ee2c
    "telemetry": None,  # 269ee2c
    "hung_at_exit": None,  # a run stopped after its result (execution.ExitGuard)
    "node_images": None,  # the image id each node of the run held or saw (nodeimages)
    "node_mpi": None,  # the host MPI each node of a native run read, library and closure (hostmpi)
    "taken_out": None,  # the nodes Slurm had taken out when a fleet run's allocation was asked for (fleetjobs.not_run)
}
# Ranks that averaged their gradients hold the same weights to rounding; others drift apart by far more than this.
WEIGHT_SPREAD_TOLERANCE = 1e-6
# What the parser checks against the plan: a run that ran something else is invalid.
PLANNED_KEYS = ("model", "image_size", "precision", "batch_size", "warmup_steps", "steps", "mode", "data", "framework",
                "torch_compile")

UNREADABLE_RESULT = "result unreadable"  # a result printed but not readable back: not a slow run (fleet.py)
log = logging.getLogger(__name__)


@dataclass
class LogLines:
    """The marker lines of one raw log (the first launch line, the last result and exit lines)."""

    lines: list[str]
    launch: dict | None = None
    exit: dict | None = None
    result: dict | None = None
    result_line: int | None = None  # 1-based; set even when the JSON on it is unreadable
    failure: str | None = None  # the benchmark's own reason for not running
    result_problem: str | None = None  # why the result is unreadable
    task_ended: str | None = None  # srun's word for the first task that ended before its step (slurm.SRUN_TASK_ENDED)

    @classmethod
    def read(cls, lines: list[str]) -> LogLines:
        found = cls(lines)
        for line in lines:
            if line.startswith(markers.LAUNCH) and found.launch is None:
                found.launch = markers.payload(line, markers.LAUNCH)
            elif line.startswith(markers.EXIT):
                found.exit = markers.payload(line, markers.EXIT)
            elif markers.FAILURE in line and found.failure is None:
                found.failure = line[line.index(markers.FAILURE) + len(markers.FAILURE):].strip()
            elif found.task_ended is None and (ended := SRUN_TASK_ENDED.match(line)):
                found.task_ended = (f"Slurm's srun: {ended['which']} {ended['ids']} on {ended['hosts']} ended first: "
                                    f"{ended['how']}")
        # The result: a line, or parts put back together (markers.py), read where its marker starts on the line.
        for result in (item for item in markers.read_payloads(lines) if item.marker == markers.RESULT):
            found.result, found.result_line, found.result_problem = result.payload, result.line, result.problem
        return found


@dataclass
class Verdict:
    status: Status = Status.OK
    reasons: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.status = Status.FAILED
        self.reasons.append(reason)

    def invalidate(self, *reasons: str) -> None:
        """Only an ok run becomes invalid: a failed one stays failed, with its first reasons."""
        if self.status == Status.OK and reasons:
            self.status = Status.INVALID
            self.reasons.extend(reasons)

    def disturb(self, reason: str) -> None:
        """A valid measurement of a machine that was busy with something else: kept, not compared."""
        if self.status == Status.OK:
            self.status = Status.DISTURBED
            self.reasons.append(f"disturbed: {reason}")

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


# A Python exception named in a line (ModuleNotFoundError, RuntimeError, ...): the cause, where
# the launcher's own summary after it ("the job has been aborted") only says that something failed.
PYTHON_EXCEPTION = re.compile(r"\b[A-Z]\w*(Error|Exception)\b")


def evidence_line(lines: list[str]) -> str | None:
    """The line most likely to explain a failure: the last Python exception, else the last error-looking one."""
    candidates = [line.strip() for line in lines if line.strip() and not line.startswith("containerbench-")]
    for line in reversed(candidates):
        if PYTHON_EXCEPTION.search(line):
            return line[:500]
    for line in reversed(candidates):
        if any(word in line for word in ("Error", "error:", "ERROR", "Killed", "Abort", "abort")):
            return line[:500]
    return candidates[-1][:500] if candidates else None


def judge_exit(found: LogLines, verdict: Verdict) -> None:
    """Did the run start, end, and leave a result?"""
    if found.launch is None:
        verdict.fail("log has no readable launch line: not written by containerbench launch, or corrupt")
    if found.exit is None:
        verdict.fail("log ends without an exit line: the run was killed or is still running")
    elif found.exit.get("not_run"):  # a run after its allocation ended, or whose allocation Slurm never gave
        verdict.fail(f"not run: {found.exit['not_run']}")
    elif found.exit.get("slurm"):  # its allocation ended under it: Slurm's own state and reason (sacct)
        ended = found.exit["slurm"]
        verdict.fail(f"Slurm job {ended['job']} {ended['state']}" + (
            f" (reason {ended['reason']})" if ended.get("reason") not in (None, "", "None") else "") + " (sacct)")
    elif found.exit.get("timed_out"):
        verdict.fail(f"timed out after {(found.launch or {}).get('timeout_s')} s")
    elif found.exit.get("step_stopped"):  # execution.StepGuard: a task ended and the rest of the step did not
        stopped = found.exit["step_stopped"]
        verdict.fail(f"the step was still running {stopped['after_task_ended_s']:.0f} s after that (srun's own wait "
                     f"{stopped['srun_wait_s']:.0f} s, then {stopped['grace_s']:.0f} s of grace): stopped")
    elif found.exit.get("hung_at_exit") and found.result is not None:
        pass  # its ranks all finished and it is measured: stopped in its teardown (hung_at_exit in the record)
    elif found.exit.get("returncode") != 0:
        verdict.fail(f"exit code {found.exit.get('returncode')}")
    if found.failure:
        verdict.reasons.append(found.failure)
    ended_outside = bool(found.exit and (found.exit.get("not_run") or found.exit.get("slurm")))
    if found.task_ended and verdict.status == Status.FAILED and not ended_outside:
        verdict.reasons.insert(0, found.task_ended)  # what ended first, before "timed out" or an exit code
    if found.result is None and not ended_outside:  # else the reason above says why there is none
        verdict.fail("no result line" if found.result_line is None
                     else f"{UNREADABLE_RESULT} (line {found.result_line}: {found.result_problem})")


def judge_against_plan(spec: dict, result: dict, verdict: Verdict) -> None:
    """Did it run what was planned: the rank count, and for training every planned setting?"""
    if result.get("ranks") != spec.get("ranks"):
        verdict.invalidate(f"ran on {result.get('ranks')} rank(s), the plan asked for {spec.get('ranks')}")
    elif result.get("kind") == "train":
        verdict.invalidate(*(f"ran {key}={result.get(key)!r}, the plan asked for {spec[key]!r}"
                             for key in PLANNED_KEYS if key in spec and result.get(key) != spec[key]))


def judge_weights(result: dict, verdict: Verdict) -> None:
    """Ranks that averaged their gradients end with the same weights; in mode local (no exchange,
    each rank its own batches) they must have drifted apart. Parameter servers hold one copy: every worker read it."""
    if result.get("kind") != "train":
        return
    spread = result.get("weights_max_relative_spread", 0.0)
    diverged = not result.get("weights_identical") and spread > WEIGHT_SPREAD_TOLERANCE
    if result.get("mode") == LOCAL:
        if result.get("ranks", 1) > 1 and not diverged:
            verdict.invalidate(f"mode local, yet the ranks ended with the same weights (relative spread {spread:.2e}): "
                               "they exchanged gradients or trained on the same data")
    elif diverged:
        verdict.invalidate(f"ranks ended with different weights (relative spread {spread:.2e}): "
                           "gradients were not averaged, this was not data-parallel training")
    elif result.get("updates") and (read := len(result["updates"]["worker_weights"])) != result["ranks"]:
        verdict.invalidate(f"{read} of {result['ranks']} workers read the parameter servers' weights at the end: "
                           "that they trained one model is not shown")


def judge_batches(result: dict, verdict: Verdict) -> None:
    """Each rank trains on its own batches: two ranks with the same batch digest were not data parallel."""
    digests = [(r["rank"], r["batch_digest"]) for r in result.get("per_rank") or [] if r.get("batch_digest")]
    first_with = {}
    for rank, digest in digests:
        key = (digest.get("images"), digest.get("labels"))
        if key in first_with:
            verdict.invalidate(f"ranks {first_with[key]} and {rank} trained on the same batch (images digest "
                               f"{key[0]}, labels {key[1]}): data-parallel training on the same data is not "
                               "data parallel")
            return
        first_with[key] = rank


def check_fabric(found: LogLines, spec: dict) -> dict:
    """Which network each layer really used, from its own log lines, against what the fabric asked for."""
    launch, result = found.launch or {}, found.result or {}
    fabric = launch.get("fabric") or {"env": launch.get("env") or {}}
    check = verify(found.lines, fabric, layers=("nccl",) if result.get("gpus") else ("mpi",)).as_dict()
    distribution = result.get("distribution") or {}
    if "grpc_host" in distribution:  # TensorFlow's own modes: the gradients travel over gRPC
        check = check_grpc(check, distribution.get("grpc_interface"), distribution["grpc_host"],
                           f"result line {found.result_line}: distribution.grpc_host {distribution['grpc_host']} "
                           f"from {distribution.get('grpc_host_from')}")
    elif distribution.get("backend") == "gloo" and distribution.get("socket_host"):  # PyTorch's Gloo sockets
        check = check_grpc(check, distribution.get("socket_interface"), distribution["socket_host"],
                           f"result line {found.result_line}: distribution.socket_host {distribution['socket_host']} "
                           f"from {distribution.get('socket_host_from')}", layer="gloo")
    if spec.get("ranks") == 1:  # one rank never touches the network
        return {"status": Check.NOT_APPLICABLE, "reason": "one rank: no traffic between ranks",
                "evidence": [], "expected": check["expected"], "observed": {}}
    return check


def ran_on_the_host(process: dict, launch: dict) -> bool:
    """A rank with no container marker the launching host lacks and its host's mount namespace: the launching
    host's, or on another node the one its node-image step answered from there (nodeimages). Without that answer
    a rank on another node is judged by its markers alone, which a host that has them too (a node that is itself
    a container, with /.dockerenv) cannot tell apart."""
    context, host = process.get("context") or {}, launch.get("launch_context") or {}
    new_markers = set(context.get("markers") or []) - set(host.get("markers") or [])
    if process.get("hostname") == launch.get("host"):
        return not new_markers and context.get("mnt_ns") == host.get("mnt_ns")
    nodes = {answer["host"]: answer.get("mnt_ns") for answer in launch.get("node_images") or []}
    node_namespace = nodes.get(process.get("hostname"))
    return not new_markers and (node_namespace is None or context.get("mnt_ns") == node_namespace)


def judge_container(launch: dict, spec: dict, result: dict, verdict: Verdict) -> None:
    """A container run's ranks prove from inside that they ran in a container (telemetry.rank_context)."""
    if spec.get("runtime") in (None, BareMetal.name) or not launch.get("launch_context"):
        return
    on_host = [p for p in result.get("processes") or [] if p.get("context") and ran_on_the_host(p, launch)]
    for process in on_host[:1]:
        verdict.invalidate(f"ran on the host, not in {spec['runtime']}: rank {process['rank']} on "
                           f"{process['hostname']} has the host's mount namespace "
                           f"({process['context']['mnt_ns']}) and no container marker the host lacks")


def judge_node_images(launch: dict, result: dict, verdict: Verdict) -> None:
    """A run whose plan put the image on its nodes first (nodeimages) ran one image, on those nodes: each rank's
    host answered with the image's id, and every node with the same one."""
    if "node_images" not in launch:
        return
    held = {answer["host"]: answer["image_id"] for answer in launch["node_images"]}
    if len(set(held.values())) > 1:
        verdict.invalidate("the nodes held different images under the tag: "
                           + ", ".join(f"{host} {image_id}" for host, image_id in sorted(held.items())))
    for process in result.get("processes") or []:
        if process.get("hostname") not in held:
            verdict.invalidate(f"rank {process.get('rank')} ran on {process.get('hostname')}, where the image was not "
                               f"checked (node-image answered from {', '.join(sorted(held)) or 'no node'})")
            return


def judge_native_mpi(launch: dict, spec: dict, result: dict, verdict: Verdict) -> None:
    """A run in the native MPI model really ran on the host's MPI: every rank's loaded library reports
    the version the host's library file reports (MPI_Get_library_version), read on the rank's own node
    (node_mpi, with every library the host's loads: judge_host_mpi_closure) or, in a log older than that
    step, where the run was launched. A run that silently kept the image's library is invalid, with the
    rank's own line as evidence."""
    if spec.get("mpi_model") != "native":
        return
    if "node_mpi" in launch:
        judge_host_mpi_closure(launch["node_mpi"], result, verdict)
        return
    host = (launch.get("launch_context") or {}).get("native_mpi") or {}
    if not host.get("version"):
        verdict.invalidate(f"native MPI: the host's library {host.get('library')} did not report its version "
                           "where the run was launched")
        return
    for process in result.get("processes") or []:
        if not _same_version(process, host["version"], host["library"], verdict):
            return


def _same_version(process: dict, version: str, library: str, verdict: Verdict) -> bool:
    mpi = (process.get("context") or {}).get("mpi") or {}
    if mpi.get("version") == version:
        return True
    files = ", ".join(f"{f['path']} (inode {f['inode']})" for f in mpi.get("files") or []) or "no libmpi"
    verdict.invalidate(f"native MPI not swapped in: rank {process.get('rank')} on {process.get('hostname')} "
                       f"loaded {files}, which reports {mpi.get('version')!r}, not the host's {version!r} ({library})")
    return False


def _where(found: dict) -> str:
    return f"{found['path']} (device {found['device']}, inode {found['inode']})"


def judge_host_mpi_closure(answers: list[dict], result: dict, verdict: Verdict) -> None:
    """Every library of the host MPI came from the host (hostmpi.py): each rank's libmpi reports the version its
    node's host library reports, and the rank mapped that library and every library of the node's closure from
    the very files the node read (device and inode), not the image's files of the same names."""
    nodes = {answer["host"]: answer for answer in answers}
    for process in result.get("processes") or []:
        rank, host = process.get("rank"), process.get("hostname")
        mpi = (process.get("context") or {}).get("mpi") or {}
        node = nodes.get(host)
        if node is None:
            verdict.invalidate(f"native MPI: rank {rank} ran on {host}, where the host MPI was not read (node-mpi "
                               f"answered from {', '.join(sorted(nodes)) or 'no node'})")
            return
        library = node["library"]
        if not library.get("version"):
            verdict.invalidate(f"native MPI: the host's library {library['path']} did not report its version on {host}")
            return
        if not _same_version(process, library["version"], library["path"], verdict):
            return
        files = mpi.get("files") or []
        if not any((f.get("device"), f.get("inode")) == (library["device"], library["inode"]) for f in files):
            mapped = ", ".join(map(_where, [f for f in files if "device" in f])) or "no libmpi"
            verdict.invalidate(f"native MPI: rank {rank} on {host} mapped {mapped}, not the host's library "
                               f"{_where(library)}")
            return
        mapped = mpi.get("closure") or {}
        for needed in node.get("closure") or []:
            found = mapped.get(needed["name"])
            if found is None or (found["device"], found["inode"]) != (needed["device"], needed["inode"]):
                taken = f"loaded {needed['name']} from {_where(found)}" if found else f"mapped no {needed['name']}"
                verdict.invalidate(f"native MPI: rank {rank} on {host} {taken}, not the host's {_where(needed)}, which "
                                   "the host's library loads there; allowed: its directory in native_mpi.library_dirs")
                return


def judge_binding(argv: list[str] | None, result: dict, verdict: Verdict) -> None:
    """Ranks bound a core each (launcher.bind core, the default) never share one: two ranks of one node
    whose CPU affinities, as each saw its own, overlap were bound otherwise than the launch line asked, by
    something in the launch (a wrapper's taskset, an Open MPI cpu set), and measured each other."""
    if not asks_a_core_per_rank(argv):
        return
    by_host: dict[str, list[dict]] = {}
    for process in sorted(result.get("processes") or [], key=lambda p: p.get("rank", 0)):
        if (process.get("context") or {}).get("affinity") is not None:
            by_host.setdefault(process.get("hostname"), []).append(process)
    for host, processes in sorted(by_host.items(), key=lambda item: str(item[0])):
        for i, first in enumerate(processes):
            for second in processes[i + 1:]:
                shared = sorted(set(first["context"]["affinity"]) & set(second["context"]["affinity"]))
                if shared:
                    verdict.invalidate(f"ranks {first['rank']} and {second['rank']} on {host} shared CPU "
                                       f"{','.join(map(str, shared))} though launcher.bind core asked a core each: "
                                       "the launch bound them otherwise (a wrapper's taskset, an Open MPI cpu "
                                       "set, a Slurm without task/affinity or task/cgroup, two tasks on one core's "
                                       "hardware threads: srun --hint=nomultithread)")
                    return


def judge_telemetry(launch: dict, found: LogLines, spec: dict, verdict: Verdict,
                    telemetry_file: str | Path | None = None) -> dict | None:
    """The nodes' samples of the measured window: traffic on the wrong wire invalidates, a busy machine disturbs.
    The samples are read from `telemetry_file`, else from where the launch line says they were merged."""
    settings = launch.get("telemetry")
    samples = telemetry_file or (settings or {}).get("file")
    if not settings or not samples or not Path(samples).is_file():
        return None
    fabric = launch.get("fabric") or {"env": launch.get("env") or {}}
    block = read_telemetry(samples, found.result, spec, fabric, settings)
    if block["traffic_check"]["status"] == Check.MISMATCH:
        verdict.invalidate(f"traffic: {block['traffic_check']['reason']}")
    if block["disturbed"] and settings["exclude_disturbed"]:
        verdict.disturb(block["disturbed"])
    return block


def startup_seconds(launch: dict, result: dict | None) -> float | None:
    """From the launch to the earliest rank's first line of Python: what a runtime adds to start-up."""
    per_rank = (result or {}).get("per_rank") or []
    started = launch.get("started_unix")
    return min(r["entry_unix_time"] for r in per_rank) - started if per_rank and started else None


def parse_log(log_path: str | Path, telemetry_file: str | Path | None = None) -> dict:
    log_path = Path(log_path)
    raw = log_path.read_bytes()
    found = LogLines.read(raw.decode("utf-8", errors="replace").splitlines())
    verdict = Verdict()
    judge_exit(found, verdict)
    launch = found.launch or {}
    spec = launch.get("spec", {})
    if verdict.ok:
        judge_against_plan(spec, found.result, verdict)
        judge_weights(found.result, verdict)
        judge_batches(found.result, verdict)
        judge_container(launch, spec, found.result, verdict)
        judge_native_mpi(launch, spec, found.result, verdict)
        judge_node_images(launch, found.result, verdict)
        judge_binding(launch.get("argv"), found.result, verdict)
    fabric_check = check_fabric(found, spec)
    if fabric_check["status"] == Check.MISMATCH:
        verdict.invalidate(f"fabric: {fabric_check['reason']}")
    telemetry = judge_telemetry(launch, found, spec, verdict, telemetry_file) if found.result else None
    evidence = None
    if verdict.status == Status.FAILED:
        evidence = evidence_line(found.lines)
    elif verdict.status == Status.INVALID and fabric_check["status"] == Check.MISMATCH:
        evidence = (fabric_check["evidence"] or [None])[0]
    return {
        "record": RECORD_FORMAT,
        "run_id": launch.get("run_id", log_path.stem),
        "kind": spec.get("kind", (found.result or {}).get("kind")),
        "status": verdict.status,
        "reasons": verdict.reasons,
        "evidence": evidence,
        "spec": spec,
        "argv": launch.get("argv"),
        "env": launch.get("env"),
        "host": launch.get("host"),
        "returncode": (found.exit or {}).get("returncode"),
        "wall_s": (found.exit or {}).get("wall_s"),
        "hung_at_exit": (found.exit or {}).get("hung_at_exit"),
        "taken_out": (found.exit or {}).get("taken_out"),
        "started_unix": launch.get("started_unix"),  # which of a point's runs is the last (cost.estimate)
        "startup_s": startup_seconds(launch, found.result),
        "result": found.result,
        "image": launch.get("image"),
        "node_images": launch.get("node_images"),
        "node_mpi": launch.get("node_mpi"),
        "launch_context": launch.get("launch_context"),
        "fabric_check": fabric_check,
        "telemetry": telemetry,
        "log": {"path": str(log_path), "sha256": hashlib.sha256(raw).hexdigest(), "result_line": found.result_line},
    }


def write_record(log_path: str | Path, out: str | Path, telemetry_file: str | Path | None = None) -> dict:
    record = parse_log(log_path, telemetry_file)
    outputs.write_text(out, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def record_paths(paths) -> list[str]:
    """The paths given, with each `@FILE` replaced by the paths FILE lists, one a line: how a workflow
    passes thousands of records (a command line holds 128 KiB in one argument, 2 MiB in all)."""
    found = []
    for path in map(str, paths):
        if path.startswith("@"):
            found += [line.strip() for line in Path(path[1:]).read_text().splitlines() if line.strip()]
        else:
            found.append(path)
    return found


def migrate(record: dict) -> dict:
    """The record in the current shape, in place: the keys it lacked with their defaults, its status a Status.
    ValueError for a record of another format or version."""
    if not isinstance(record, dict) or record.get("record") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    for key, default in ADDED_KEYS.items():
        record.setdefault(key, default)
    record["status"] = Status(record.get("status"))
    return record


@functools.cache
def _validator():  # a jsonschema Validator
    import jsonschema  # here, not at the top: see config.LAZY_IMPORTS

    return jsonschema.Draft202012Validator(load_schema("record"))


def check_record(record: dict) -> None:
    """ValueError naming the record's first violation of its schema, in one line."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(record))
    if error is not None:
        raise ValueError(f"not a valid {RECORD_FORMAT} record: {describe(error)[:300]}")


def load_records(paths) -> tuple[list[dict], list[tuple[str, str]]]:
    """Read run records, migrated to the current shape; a corrupt one is reported with its path and skipped."""
    records, problems = [], []
    for path in sorted(record_paths(paths)):
        try:
            with open(path) as handle:
                record = migrate(json.load(handle))
            records.append(record)
        except (OSError, ValueError) as error:
            log.warning("skipping %s: %s", path, error)
            problems.append((path, str(error)))
    return records, problems
