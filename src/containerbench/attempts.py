"""A run measured again: its earlier attempt set aside, whole, so the workflow measures it anew.

A disturbed run is a valid measurement of a machine that was busy with something else: kept, never
compared. Where the noise has passed (a neighbour's job ended, the hypervisor calmed), a site measures
those points again, and only those. `set_aside` moves every file of each such run (its raw log, record,
telemetry, launch and parse logs) under RESULTS/superseded/RUN_ID/attempt-N/, with the same relative
paths, and lists the attempt in RESULTS/superseded/index.json. The workflow's tables depend on that
index, so the next `snakemake` remakes them, measuring first the runs whose records are missing, and
then the report. Nothing measured is deleted, and the attempt keeps what
traces its figures to its log.

    containerbench remeasure --results results --status disturbed
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from containerbench import outputs
from containerbench.status import Status

SUPERSEDED = "superseded"
INDEX = f"{SUPERSEDED}/index.json"  # every attempt set aside; the workflow's tables depend on it
# A run's files, relative to the results directory, by what they hold.
RUN_FILES = ("runs/{}.json", "runs/{}.log", "telemetry/{}.csv", "logs/launch/{}.txt", "logs/parse/{}.txt")
ALLOWED = tuple(status for status in Status if status is not Status.OK)


class RemeasureError(ValueError):
    """Bad input to remeasure: one line naming what is wrong and what is allowed."""


def attempts(results: Path, run_id: str) -> list[Path]:
    """The run's attempts set aside so far, oldest first."""
    kept = results / SUPERSEDED / run_id
    return sorted(kept.glob("attempt-*"), key=lambda path: int(path.name.partition("-")[2]))


def set_aside(results: str | Path, statuses: list[str]) -> list[tuple[str, str, Path]]:
    """Move the files of every run whose record has one of `statuses` into its next attempt
    directory: (run_id, status, attempt directory) for each, in run-id order."""
    results = Path(results)
    for status in statuses:
        if status not in ALLOWED:
            raise RemeasureError(f"remeasure: --status {status!r} is not allowed; allowed: {', '.join(ALLOWED)}")
    if not (results / "runs").is_dir():
        raise RemeasureError(f"remeasure: --results {str(results)!r} has no runs/ directory; "
                             "allowed: a results directory the workflow wrote")
    chosen = []
    for path in sorted((results / "runs").glob("*.json")):
        try:
            status = json.loads(path.read_text())["status"]
        except (OSError, ValueError, KeyError, TypeError):  # not a record: left for the parser to judge
            continue
        if status in statuses:
            chosen.append((path.stem, status))
    moved = []
    for run_id, status in chosen:
        done = attempts(results, run_id)
        if done and not (done[-1] / RUN_FILES[0].format(run_id)).exists():
            attempt = done[-1]  # one set aside when it was interrupted: finished there
        else:
            attempt = results / SUPERSEDED / run_id / f"attempt-{len(done) + 1}"
        # The record last: a run interrupted here still has a record, and is chosen again next time.
        for pattern in reversed(RUN_FILES):
            source = results / pattern.format(run_id)
            if source.exists():
                target = attempt / pattern.format(run_id)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        moved.append((run_id, status, attempt))
    if moved:
        index = results / INDEX
        entries = json.loads(index.read_text()) if index.exists() else []
        entries += [{"run_id": run_id, "status": status, "attempt": str(attempt.relative_to(results)),
                     "set_aside_unix": round(time.time(), 3)} for run_id, status, attempt in moved]
        outputs.write_text(index, json.dumps(entries, indent=1) + "\n")
    return moved
