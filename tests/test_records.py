"""Raw log -> record: the verdict and its evidence, read from recorded logs of real tiny runs and
from copies of them changed where a real failure would change them; the record's schema, the
migration of older records, and the status's round trip through JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from helpers import RECORDED_RUNS, ROOT

from containerbench import execution
from containerbench.config import load_schema
from containerbench.plans import RunPlan
from containerbench.rank import markers
from containerbench.records import (
    ADDED_KEYS,
    RECORD_FORMAT,
    UNREADABLE_RESULT,
    check_record,
    load_records,
    migrate,
    parse_log,
    ran_on_the_host,
    write_record,
)
from containerbench.status import Check, Status


def recorded_log(kind: str, ranks: int) -> list[str]:
    shape = {1: "1x1_b2", 2: "1x2_b2"}[ranks] if kind == "train" else "1x2"
    return (RECORDED_RUNS / f"{kind}_bare-metal_tcp-loopback_{shape}_rep1.log").read_text().splitlines()


def parse_lines(tmp_path, lines: list[str], name: str = "changed") -> dict:
    path = tmp_path / f"{name}.log"
    path.write_text("\n".join(lines) + "\n")
    return parse_log(path)


def rewrite(lines: list[str], marker: str, change) -> list[str]:
    """The log with `change` applied to the JSON of its `marker` lines."""
    out = []
    for line in lines:
        if line.startswith(marker):
            payload = markers.payload(line, marker)
            change(payload)
            line = markers.line(marker, payload).rstrip("\n")
        out.append(line)
    return out


def test_recorded_runs_are_ok_and_their_transport_verified(recorded_runs):
    for (kind, ranks), record in recorded_runs.items():
        assert record["record"] == RECORD_FORMAT and record["status"] == "ok", record["reasons"]
        assert record["reasons"] == [] and record["evidence"] is None
        expected = "not applicable" if ranks == 1 else "ok"
        assert record["fabric_check"]["status"] == expected, (kind, ranks, record["fabric_check"]["reason"])
        assert record["log"]["result_line"] and len(record["log"]["sha256"]) == 64
        assert record["started_unix"] > 0  # when it was launched: the last run of a point is the freshest rate
    train = recorded_runs[("train", 2)]
    assert train["startup_s"] > 0 and train["wall_s"] > train["startup_s"]


def test_a_run_that_did_not_run_what_was_planned_is_invalid(tmp_path):
    lines = rewrite(recorded_log("train", 1), markers.LAUNCH, lambda launch: launch["spec"].update(image_size=224))
    record = parse_lines(tmp_path, lines)
    assert record["status"] == "invalid" and record["reasons"] == ["ran image_size=32, the plan asked for 224"]


def test_every_setting_that_differs_from_the_plan_is_named(tmp_path):
    lines = rewrite(recorded_log("train", 1), markers.LAUNCH,
                    lambda launch: launch["spec"].update(image_size=224, steps=100))
    assert parse_lines(tmp_path, lines)["reasons"] == ["ran image_size=32, the plan asked for 224",
                                                       "ran steps=2, the plan asked for 100"]


def test_ranks_whose_weights_differ_are_marked_invalid(tmp_path):
    """If gradients were not averaged (the Keras 3 + Horovod trap), the run must not count."""
    def diverge(result):
        result["per_rank"][1]["weights"]["sha256"] = "0" * 16
        result["weights_identical"] = False
        result["weights_max_relative_spread"] = 3.2e-2

    record = parse_lines(tmp_path, rewrite(recorded_log("train", 2), markers.RESULT, diverge))
    assert record["status"] == "invalid"
    assert "different weights" in record["reasons"][0] and "not data-parallel" in record["reasons"][0]


def test_a_log_cut_off_before_its_exit_line_is_failed_with_the_last_line_as_evidence(tmp_path):
    lines = recorded_log("train", 2)
    cut = [line for line in lines if not line.startswith((markers.EXIT, markers.RESULT))]
    record = parse_lines(tmp_path, cut)
    assert record["status"] == "failed"
    assert record["reasons"] == ["log ends without an exit line: the run was killed or is still running",
                                 "no result line"]
    assert record["evidence"] == cut[-1].strip()[:500]
    assert record["kind"] == "train" and record["spec"]["ranks"] == 2  # still belongs to its sweep point


def test_a_result_line_behind_a_ranks_partial_stderr_line_is_still_read(tmp_path, recorded_runs):
    """Seen in a fresh-clone suite: mpirun forwarded rank 0's stderr "[" (the start of Horovod's
    debug line "[2026-... Shutting down background thread") just before its next stdout line."""
    lines = ["[" + line if line.startswith(markers.RESULT) else line for line in recorded_log("train", 2)]
    record = parse_lines(tmp_path, lines)
    assert record["status"] == "ok", record["reasons"]
    assert record["result"] == recorded_runs[("train", 2)]["result"]


def test_an_unreadable_result_line_fails_the_run_and_says_so(tmp_path):
    lines = [line[:80] if line.startswith(markers.RESULT) else line for line in recorded_log("netbench", 2)]
    record = parse_lines(tmp_path, lines)
    assert record["status"] == "failed"
    assert record["reasons"] == [f"{UNREADABLE_RESULT} (line {record['log']['result_line']}: its JSON is not valid)"]
    assert record["log"]["result_line"] is not None


def test_a_failed_run_stays_failed_whatever_else_is_wrong(tmp_path):
    lines = rewrite(recorded_log("train", 2), markers.EXIT, lambda footer: footer.update(returncode=1))
    lines = rewrite(lines, markers.LAUNCH, lambda launch: launch["spec"].update(ranks=4))
    record = parse_lines(tmp_path, lines)
    assert record["status"] == "failed" and record["reasons"] == ["exit code 1"]


def test_a_file_that_is_no_run_log_is_a_failed_record_not_a_crash(tmp_path):
    record = parse_lines(tmp_path, ["hello"], name="train_x_rep1")
    assert record["status"] == "failed" and record["run_id"] == "train_x_rep1"
    assert record["reasons"][0].startswith("log has no readable launch line")


@pytest.mark.slow
def test_a_fresh_run_parses_into_records_of_the_recorded_shape(tiny_runs, recorded_runs):
    """The recorded logs the fast tests read still look like what the benchmark writes today
    (telemetry's per-host blocks are keyed by this machine's host name: left out of the shape;
    `disturbed` is a reason where the node was busy and None where it was quiet, and a check's `reason` is None
    where it is ok: either is its shape)."""
    def shape(value):
        if isinstance(value, dict):
            return {key: "str or none" if key in ("disturbed", "reason") and isinstance(item, (str, type(None)))
                    else shape(item)
                    for key, item in value.items() if key not in ("packages", "env", "observed", "nodes", "series")}
        if isinstance(value, list):
            return [shape(value[0])] if value and isinstance(value[0], (dict, list)) else "list"
        return type(value).__name__ if value is not None else "none"

    for key, fresh in tiny_runs.items():
        assert shape(fresh) == shape(recorded_runs[key]), f"{key}: run tests/data/regenerate.py"


HOST_MPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"  # scripts/install-system-deps.sh (libmpich12)


def native_log(rank_version) -> list[str]:
    """A recorded 2-rank netbench log as a native-model run: launched with the host's real MPICH as the
    library to swap in, its ranks reporting `rank_version` (None: what they really reported)."""
    from containerbench.rank.telemetry import library_mpi_version

    def launched(launch):
        launch["spec"]["mpi_model"] = "native"
        launch["launch_context"]["native_mpi"] = {"library": HOST_MPICH, "version": library_mpi_version(HOST_MPICH)}

    def reported(result):
        for process in result["processes"]:
            process["context"]["mpi"] = {"files": [{"path": "/opt/containerbench/venv/lib/libmpi.so.12", "inode": 7}],
                                         "version": rank_version or result["mpi_library"]}

    return rewrite(rewrite(recorded_log("netbench", 2), markers.LAUNCH, launched), markers.RESULT, reported)


@pytest.mark.skipif(not Path(HOST_MPICH).exists(), reason="needs Debian's libmpich12 (make setup installs it as root)")
def test_a_native_run_whose_ranks_kept_the_images_mpi_is_invalid_with_their_line(tmp_path):
    from containerbench.rank.telemetry import library_mpi_version

    host = library_mpi_version(HOST_MPICH)  # the real library's own answer, before MPI_Init
    assert host.startswith("MPICH Version:")
    assert library_mpi_version("/usr/lib/x86_64-linux-gnu/libmpi.so.40").startswith("Open MPI v4.1")
    kept = parse_lines(tmp_path, native_log(None), "kept")
    assert kept["status"] == "invalid"
    assert kept["reasons"] == [
        "native MPI not swapped in: rank 0 on vm loaded /opt/containerbench/venv/lib/libmpi.so.12 (inode 7), which "
        f"reports 'Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022', not the "
        f"host's {host!r} ({HOST_MPICH})"]
    assert parse_lines(tmp_path, native_log(host), "swapped")["status"] == "ok"


def test_loaded_mpi_names_the_mapped_library_file_and_its_inode():
    from containerbench.rank.telemetry import loaded_mpi

    maps = ("7f1 r--p 00000000 fd:01 4242 /opt/containerbench/venv/lib/libmpi.so.12\n"
            "7f2 r-xp 00001000 fd:01 4242 /opt/containerbench/venv/lib/libmpi.so.12\n"
            "7f3 r--p 00000000 fd:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7f4 r--p 00000000 fd:02 77 /opt/mpich/lib/libucp.so.0\n"
            "7f5 r--p 00000000 fd:01 78 /usr/lib/x86_64-linux-gnu/libhwloc.so.15.6.1\n")
    assert loaded_mpi(maps, names="")["files"] == [{"path": "/opt/containerbench/venv/lib/libmpi.so.12", "inode": 4242}]
    assert "closure" not in loaded_mpi(maps, names="")  # a hybrid run names none: nothing more to report
    # A native run names its host MPI's closure (hostmpi.NAMES_VARIABLE): where each one was mapped from.
    native = loaded_mpi(maps, names="libucp.so.0:libhwloc.so.15:libnuma.so.1")
    assert native["files"] == [{"path": "/opt/containerbench/venv/lib/libmpi.so.12", "device": "fd:01", "inode": 4242}]
    assert native["closure"] == {
        "libhwloc.so.15": {"path": "/usr/lib/x86_64-linux-gnu/libhwloc.so.15.6.1", "device": "fd:01", "inode": 78},
        "libucp.so.0": {"path": "/opt/mpich/lib/libucp.so.0", "device": "fd:02", "inode": 77}}


def test_the_rank_reads_the_closures_names_from_the_variable_the_launch_sets():
    from containerbench import hostmpi
    from containerbench.rank import telemetry

    assert telemetry.HOST_MPI_NAMES == hostmpi.NAMES_VARIABLE  # spelled twice: the rank side imports no workflow


# The run record's schema and version: every record the parser writes is valid, an older record is
# migrated on load to a valid current one, and a status is the same string before and after JSON.
GOLDEN_RECORDS = ROOT / "tests" / "data" / "golden" / "records"
# What the first parser (6fabfc2, results.parse_log) wrote from the oldest recorded log (056116c).
OLDEST_RECORD = ROOT / "tests" / "data" / "records" / "train_bare-metal_tcp-loopback_1x1_b2_rep1.6fabfc2.json"


def test_the_schema_names_every_status_and_check_outcome():
    schema = load_schema("record")
    assert schema["properties"]["status"]["enum"] == [status.value for status in Status]
    assert schema["$defs"]["check"]["enum"] == [check.value for check in Check]
    assert schema["properties"]["record"]["const"] == RECORD_FORMAT
    assert set(ADDED_KEYS) <= set(schema["required"])


def test_every_recorded_run_gives_a_valid_record(recorded_runs):
    for record in recorded_runs.values():
        check_record(record)


def test_the_golden_records_load_unchanged():
    """A current record gains nothing on load: its bytes are what the parser wrote."""
    records, problems = load_records(sorted(GOLDEN_RECORDS.glob("*.json")))
    assert problems == [] and len(records) == 3
    for record in records:
        path = GOLDEN_RECORDS / f"{record['run_id']}.json"
        assert json.dumps(record, indent=1, sort_keys=True) + "\n" == path.read_text()
        check_record(record)


def launch_payload(kind: str, ranks: int) -> dict:
    line = next(line for line in recorded_log(kind, ranks) if line.startswith(markers.LAUNCH))
    return markers.payload(line, markers.LAUNCH)


@pytest.mark.parametrize("why", [
    {"not_run": "no allocation: Job allocation 7 has been revoked"},
    {"not_run": "its allocation ended before it: Slurm job 7 TIMEOUT",
     "slurm": {"job": "7", "state": "TIMEOUT", "reason": "None"}},
])
def test_a_run_that_never_started_gives_a_valid_failed_record(tmp_path, why):
    log = tmp_path / "not-run.log"
    execution.write_not_run(RunPlan.from_json(launch_payload("train", 2)), log, why)
    record = parse_log(log)
    assert record["status"] == Status.FAILED and record["reasons"][0] == f"not run: {why['not_run']}"
    check_record(record)


def failed_and_invalid_logs() -> dict[str, list[str]]:
    train = recorded_log("train", 2)
    return {
        "cut off": [line for line in train if not line.startswith((markers.EXIT, markers.RESULT))],
        "exit code": rewrite(train, markers.EXIT, lambda footer: footer.update(returncode=1)),
        "timed out": rewrite(train, markers.EXIT, lambda footer: footer.update(timed_out=True, returncode=-9)),
        "not a log": ["hello"],
        "unreadable result": [line[:80] if line.startswith(markers.RESULT) else line
                              for line in recorded_log("netbench", 2)],
        "other plan": rewrite(train, markers.LAUNCH, lambda launch: launch["spec"].update(image_size=224)),
    }


@pytest.mark.parametrize("case", sorted(failed_and_invalid_logs()))
def test_failed_and_invalid_records_are_valid(tmp_path, case):
    record = parse_lines(tmp_path, failed_and_invalid_logs()[case])
    assert record["status"] in (Status.FAILED, Status.INVALID) and record["reasons"]
    check_record(record)


def test_a_disturbed_record_is_valid_and_one_without_its_reason_is_not(recorded_runs):
    record = copy.deepcopy(recorded_runs[("train", 2)])
    record["telemetry"]["disturbed"] = "vm: other processes used 40% of the CPU"
    record.update(status=Status.DISTURBED, reasons=["disturbed: vm: other processes used 40% of the CPU"])
    check_record(record)
    with pytest.raises(ValueError, match="'reasons' = \\[\\] is not allowed"):
        check_record({**record, "reasons": []})


def test_a_record_off_its_schema_is_named_in_one_line(recorded_runs):
    with pytest.raises(ValueError) as raised:
        check_record({**recorded_runs[("netbench", 2)], "wall_s": "fast"})
    assert str(raised.value) == ("not a valid containerbench.record/1 record: 'wall_s' = 'fast' is not allowed; "
                                 "allowed: type ['number', 'null']")


@pytest.mark.parametrize("content, problem", [
    ({"record": "containerbench.record/2"}, "not a containerbench.record/1 record"),
    ([1, 2], "not a containerbench.record/1 record"),
    ({"record": RECORD_FORMAT, "status": "great"}, "'great' is not a valid Status"),
])
def test_a_record_of_another_version_or_status_is_skipped(tmp_path, content, problem):
    path = tmp_path / "record.json"
    path.write_text(json.dumps(content))
    assert load_records([path]) == ([], [(str(path), problem)])


def test_the_oldest_record_migrates_to_a_valid_current_one():
    oldest = json.loads(OLDEST_RECORD.read_text())
    assert set(ADDED_KEYS).isdisjoint(oldest)  # the shape the first parser wrote
    (record,), problems = load_records([OLDEST_RECORD])
    assert problems == []
    assert {key: record[key] for key in ADDED_KEYS} == ADDED_KEYS
    assert record["status"] is Status.OK
    assert {key: value for key, value in record.items() if key not in ADDED_KEYS} == oldest
    check_record(record)


def test_migrating_twice_changes_nothing():
    once = migrate(json.loads(OLDEST_RECORD.read_text()))
    assert migrate(copy.deepcopy(once)) == once


@pytest.mark.parametrize("word", [*Status, *Check])
def test_a_status_is_its_string_through_json_and_back(word):
    kind = type(word)
    assert json.dumps({"status": word}) == json.dumps({"status": word.value})
    assert kind(json.loads(json.dumps(word))) is word
    assert str(word) == f"{word}" == word.value and word == word.value


def test_a_parsed_record_written_and_loaded_keeps_its_status(tmp_path):
    log = sorted(RECORDED_RUNS.glob("train_*1x2*.log"))[0]
    out = tmp_path / "record.json"
    written = write_record(log, out, log.with_suffix(".telemetry.csv"))
    assert type(written["status"]) is Status and '"status": "ok"' in out.read_text()
    (loaded,), _ = load_records([out])
    assert loaded == json.loads(json.dumps(written)) and loaded["status"] is Status.OK  # JSON: tuples as lists


def test_a_rank_that_crashed_under_srun_is_named_before_the_timeout_that_followed():
    """A real log (the chaos sweep on the 4-node cluster, 2026-11-28): rank 0 of a 2-node run segfaulted in
    Open MPI's TCP connect, srun said so and began to end the step, but the step only ended when the launcher's
    300 s timeout stopped it. The record names what ended first, in srun's words, then the timeout."""
    record = parse_log(ROOT / "tests" / "data" / "crashes" / "srun-task-segfault-then-timeout.log")
    assert record["status"] == "failed"
    assert record["reasons"] == ["Slurm's srun: task 0 on n1 ended first: Segmentation fault",
                                 "timed out after 300 s", "no result line"]
    assert record["returncode"] == 139 and record["wall_s"] == pytest.approx(300.139)


def test_a_rank_on_another_node_is_held_to_that_nodes_own_mount_namespace():
    """Issue 32, on the separated test cluster: the machine the suite runs on is itself a docker container (it has
    /.dockerenv), so a docker rank on a node showed no marker its host lacks, and was judged to have run on the host.
    Where the node-image step answered from the rank's node (nodeimages.ensure: the node's own mount namespace), the
    rank's namespace is held to that instead: another one is a container's, the node's own is the host."""
    launch = {"host": "login", "launch_context": {"markers": ["docker"], "mnt_ns": "mnt:[1]"},
              "node_images": [{"host": "n1", "mnt_ns": "mnt:[2]"}]}
    in_docker = {"hostname": "n1", "context": {"markers": ["docker"], "mnt_ns": "mnt:[3]"}}
    on_node = {"hostname": "n1", "context": {"markers": ["docker"], "mnt_ns": "mnt:[2]"}}
    assert not ran_on_the_host(in_docker, launch)
    assert ran_on_the_host(on_node, launch)
    # Without the node's answer (a log older than the step, or a runtime without it) only markers can tell.
    assert ran_on_the_host(in_docker, {**launch, "node_images": None})
    assert not ran_on_the_host({"hostname": "n1", "context": {"markers": ["docker", "podman"], "mnt_ns": "mnt:[2]"}},
                               {**launch, "node_images": None})
