"""`containerbench remeasure`: runs set aside whole, never overwritten, always listed (attempts.py).
The workflow round trip (a real disturbed run measured again, ok) is test_resume's."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from helpers import RECORDED_RUNS

from containerbench.attempts import RemeasureError, index, set_aside
from containerbench.cli import main
from containerbench.records import write_record

FAILED = "train_bare-metal_tcp-loopback_1x2_b2_rep1"  # its log cut before the result: a real failed record


def digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in root.rglob("*") if path.is_file()}


@pytest.fixture
def results(tmp_path) -> Path:
    """A results directory as the workflow leaves it: three recorded runs, one of them failed."""
    results = tmp_path / "results"
    for log in sorted(RECORDED_RUNS.glob("*.log")):
        run_id = log.stem
        (results / "runs").mkdir(parents=True, exist_ok=True)
        text = log.read_text()
        if run_id == FAILED:  # cut where a killed node would have cut it
            text = "\n".join(line for line in text.splitlines() if "containerbench-" not in line
                             or line.startswith("containerbench-launch")) + "\n"
        (results / "runs" / f"{run_id}.log").write_text(text)
        (results / "telemetry").mkdir(exist_ok=True)
        shutil.copy(log.with_suffix(".telemetry.csv"), results / "telemetry" / f"{run_id}.csv")
        for step in ("launch", "parse"):
            (results / "logs" / step).mkdir(parents=True, exist_ok=True)
            (results / "logs" / step / f"{run_id}.txt").write_text(f"{step} of {run_id}\n")
        write_record(results / "runs" / f"{run_id}.log", results / "runs" / f"{run_id}.json",
                     results / "telemetry" / f"{run_id}.csv")
    assert json.loads((results / "runs" / f"{FAILED}.json").read_text())["status"] == "failed"
    return results


def test_a_failed_run_is_set_aside_whole_and_listed_and_the_others_stay(results, capsys):
    before = digests(results)
    assert main(["remeasure", "--results", str(results), "--status", "failed"]) == 0
    attempt = results / "superseded" / FAILED / "attempt-1"
    assert capsys.readouterr().out == (f"containerbench: {FAILED} (failed) set aside in {attempt}: the next snakemake "
                                       "measures it again (where its sweep still plans it)\n")
    after = digests(results)
    moved = {name: digest for name, digest in before.items() if FAILED in name}
    assert len(moved) == 5  # record, raw log, telemetry, launch and parse logs
    assert {f"superseded/{FAILED}/attempt-1/{name}": digest for name, digest in moved.items()}.items() <= after.items()
    assert {k: v for k, v in before.items() if FAILED not in k}.items() <= after.items()  # the ok runs stay
    assert json.loads((results / "superseded" / "index.json").read_text()) == [
        {"run_id": FAILED, "attempt": f"superseded/{FAILED}/attempt-1", "status": "failed"}]
    assert main(["remeasure", "--results", str(results), "--status", "failed"]) == 0  # nothing left to set aside
    assert capsys.readouterr().out == f"containerbench: no run in {results} is failed\n"


def test_each_attempt_gets_a_directory_of_its_own_and_nothing_is_overwritten(results):
    kept = results / "superseded" / FAILED
    (kept / "attempt-1").mkdir(parents=True)
    (kept / "attempt-3" / "runs").mkdir(parents=True)
    (kept / "attempt-3" / "runs" / f"{FAILED}.json").write_text('{"status": "disturbed"}')
    (kept / "attempt-x").mkdir()  # not ours: neither counted nor listed
    record = (results / "runs" / f"{FAILED}.json").read_bytes()
    [(run_id, status, attempt)] = set_aside(results, ["failed"])
    assert (run_id, status, attempt) == (FAILED, "failed", kept / "attempt-4")
    assert (attempt / "runs" / f"{FAILED}.json").read_bytes() == record
    assert (kept / "attempt-3" / "runs" / f"{FAILED}.json").read_text() == '{"status": "disturbed"}'
    assert [(e["attempt"].rpartition("/")[2], e["status"]) for e in index(results)] == [
        ("attempt-1", None), ("attempt-3", "disturbed"), ("attempt-4", "failed")]


@pytest.mark.parametrize("status, message", [
    (["ok"], "remeasure: --status 'ok' is not allowed; allowed: failed, invalid, disturbed"),
    (["slow"], "remeasure: --status 'slow' is not allowed; allowed: failed, invalid, disturbed"),
])
def test_a_status_that_is_not_a_verdict_to_measure_again_is_refused_in_one_line(results, status, message):
    before = digests(results)
    with pytest.raises(RemeasureError) as refused:
        set_aside(results, status)
    assert str(refused.value) == message and digests(results) == before


def test_a_directory_the_workflow_did_not_write_is_refused_in_one_line(tmp_path, capsys):
    assert main(["remeasure", "--results", str(tmp_path / "elsewhere")]) == 2
    assert capsys.readouterr().err == (f"containerbench: remeasure: --results '{tmp_path / 'elsewhere'}' has no "
                                       "runs/ directory; allowed: a results directory the workflow wrote\n")


def test_runs_named_alone_are_set_aside_and_a_name_without_such_a_record_moves_nothing(results, capsys):
    """`--run` (as helpers.remeasure_disturbed names the runs it needs measured again): two failed runs, one named."""
    netbench = "netbench_bare-metal_tcp-loopback_1x2_rep1"
    log = results / "runs" / f"{netbench}.log"
    log.write_text("\n".join(line for line in log.read_text().splitlines() if "containerbench-" not in line
                             or line.startswith("containerbench-launch")) + "\n")
    write_record(log, results / "runs" / f"{netbench}.json", results / "telemetry" / f"{netbench}.csv")
    assert json.loads((results / "runs" / f"{netbench}.json").read_text())["status"] == "failed"
    ok = "train_bare-metal_tcp-loopback_1x1_b2_rep1"
    before = digests(results)
    assert main(["remeasure", "--results", str(results), "--status", "failed", "--run", FAILED, "--run", ok]) == 2
    assert capsys.readouterr().err == (f"containerbench: remeasure: --run '{ok}' (ok) in '{results / 'runs'}'; "
                                       "allowed: the run id of a record of status failed (its file name, without "
                                       ".json)\n")
    with pytest.raises(RemeasureError) as refused:
        set_aside(results, ["failed"], ["train_typo"])
    assert str(refused.value).startswith("remeasure: --run 'train_typo' (no record) in ")
    with pytest.raises(RemeasureError) as refused:
        set_aside(results, ["failed"], [])
    assert str(refused.value) == "remeasure: --run names no run; allowed: one run id or more, or no --run for them all"
    assert digests(results) == before
    assert main(["remeasure", "--results", str(results), "--status", "failed", "--run", FAILED]) == 0
    assert capsys.readouterr().out.startswith(f"containerbench: {FAILED} (failed) set aside in ")
    assert [entry["run_id"] for entry in index(results)] == [FAILED]
    assert json.loads((results / "runs" / f"{netbench}.json").read_text())["status"] == "failed"  # not named: stays
