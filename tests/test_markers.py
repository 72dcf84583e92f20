"""A rank's result reaches its record whole whatever the launcher's output forwarding does to it.

srun forwards a task's output in messages of at most 1024 bytes, whole lines packed into them, so a
longer line is cut (SLURM_IO_MAX_MSG_LEN, src/common/io_hdr.h; "The cbuf allows whole lines to be
packed into messages if line buffering is requested", slurmstepd/io.c _task_read), and another task's
message can land between two pieces: seen validating four nodes, where an Open MPI verbose line sat
inside a 5 KB netbench result line (issue 34, item 8). The real runs under srun are in
tests/test_fleet_slurm.py; here, the framing against every way of cutting it."""

from __future__ import annotations

import json
import random

import pytest
from helpers import RECORDED_RUNS

from containerbench import fleet, fleetexport, fleetplan
from containerbench.rank import markers
from containerbench.records import UNREADABLE_RESULT, parse_log

SLURM_IO_MAX_MSG_LEN = 1024  # src/common/io_hdr.h
PIPE_BUF = 4096  # a write() of at most this many bytes reaches a pipe's reader whole (pipe(7))
VERBOSE = "[vm:20443] mca: base: close: component tcp closed"  # the line seen spliced (issue 34)


def recorded_result() -> dict:
    log = RECORDED_RUNS / "netbench_bare-metal_tcp-loopback_1x2_rep1.log"
    return next(markers.payload(line, markers.RESULT) for line in log.read_text().splitlines()
                if line.startswith(markers.RESULT))


def framed_lines(payload: dict) -> list[str]:
    return "".join(markers.framed(markers.RESULT, payload)).splitlines()


def test_a_long_result_is_framed_in_parts_that_srun_and_a_pipe_pass_on_whole():
    result = recorded_result()
    assert len(json.dumps(result)) > 4 * SLURM_IO_MAX_MSG_LEN  # the size of the result that was cut
    parts = markers.framed(markers.RESULT, result)
    assert len(parts) > 4 and all(len(part.encode()) < SLURM_IO_MAX_MSG_LEN < PIPE_BUF for part in parts)
    assert all(part.startswith(markers.PART + "result ") and part.endswith("\n") for part in parts)
    [found] = markers.read_payloads(framed_lines(result))
    assert (found.marker, found.payload, found.line) == (markers.RESULT, result, 1)


def test_a_short_payload_stays_one_marker_line_as_older_logs_have_it():
    assert markers.framed(markers.NETBENCH, {"bytes": 4}) == [markers.line(markers.NETBENCH, {"bytes": 4})]


def test_a_line_spliced_into_any_part_at_any_byte_is_taken_out_again():
    result, rng = recorded_result(), random.Random(34)
    lines = framed_lines(result)
    for index, part in enumerate(lines):
        for cut in sorted(rng.sample(range(80, len(part)), 12)) + [len(part)]:  # past the part's header
            # srun: the part's first piece, another task's whole line, then the part's rest.
            spliced = lines[:index] + [part[:cut] + VERBOSE, part[cut:]] + lines[index + 1:]
            assert markers.read_payloads(spliced)[0].payload == result, (index, cut)
            # A pipe read cut short: foreign bytes inside the line, no line break of their own.
            inside = lines[:index] + [part[:cut] + "[vm:20443] mca" + part[cut:]] + lines[index + 1:]
            assert markers.read_payloads(inside)[0].payload == result, (index, cut)


def test_a_part_that_is_lost_makes_the_result_unreadable_and_the_record_says_which(tmp_path):
    log = RECORDED_RUNS / "netbench_bare-metal_tcp-loopback_1x2_rep1.log"
    lines = []
    for line in log.read_text().splitlines():
        lines += framed_lines(markers.payload(line, markers.RESULT)) if line.startswith(markers.RESULT) else [line]
    first = next(number for number, line in enumerate(lines) if line.startswith(markers.PART))
    whole = tmp_path / "whole.log"
    whole.write_text("\n".join(lines) + "\n")
    assert parse_log(whole)["status"] == "ok" and parse_log(whole)["log"]["result_line"] == first + 1
    del lines[first + 2]
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(lines) + "\n")
    record = parse_log(cut)
    count = len(framed_lines(recorded_result()))
    assert record["status"] == "failed"
    assert record["reasons"] == [f"{UNREADABLE_RESULT} (line {first + 1}: part 3 of {count} not found whole)"]


@pytest.mark.parametrize("member", ["link", "node"])
def test_a_run_whose_result_cannot_be_read_is_not_judged_a_fault(recorded_runs, member):
    from helpers import fleet_records

    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2", "n3", "n4")})
    records = fleet_records(recorded_runs, plan.nodes, plan.links)
    hosts = ["n1", "n2"] if member == "link" else ["n1", "n1"]
    for record in records:
        if record["kind"] == "netbench" and record["result"]["hostnames"] == hosts:
            record.update(status="failed", result=None,
                          reasons=[f"{UNREADABLE_RESULT} (line 40: part 3 of 7 not found whole)"])
    summary = fleet.judge(records, plan).summary.set_index("member")
    name = "n1+n2" if member == "link" else "n1"
    assert summary.loc[name, "result"] == fleet.UNREADABLE
    assert summary.loc[name, "reason"].endswith("unreadable (the launcher's output cut it): not judged, run it again")
    assert set(summary.drop(index=name)["result"]) == {"pass"}
    assert fleetexport.format_drain_list(fleet.judge(records, plan)) == ""
