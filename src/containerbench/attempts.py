"""A run measured again: its earlier attempt set aside, whole, so the workflow measures it anew.

A disturbed run is a valid measurement of a machine that was busy with something else: kept, never
compared. Where the noise has passed (a neighbour's job ended, the hypervisor calmed), a site measures
those points again, and only those. `set_aside` moves every file of each such run (its raw log, record,
telemetry, launch and parse logs) under RESULTS/superseded/RUN_ID/attempt-N/, with the same relative
paths, and lists every attempt in RESULTS/superseded/index.json. The workflow's tables depend on that
index, so the next `snakemake` remakes them, measuring first the runs of its plan whose records are
missing, and then the report. With `benchmark.repetitions: auto` the rounds are decided again from the
new records, so a point may get more repetitions. Run it while no workflow runs in that directory.
Nothing measured is deleted, and each attempt keeps what traces its figures to its log.

    containerbench remeasure --results results --status disturbed

`--run RUN_ID` (set_aside's run_ids) narrows it to the runs named, each of which must have such a record.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from containerbench import outputs
from containerbench.status import Status

SUPERSEDED = "superseded"
INDEX = f"{SUPERSEDED}/index.json"  # every attempt set aside; the workflow's tables depend on it
# A run's files, relative to the results directory, by what they hold.
RUN_FILES = ("runs/{}.json", "runs/{}.log", "telemetry/{}.csv", "logs/launch/{}.txt", "logs/parse/{}.txt")
ALLOWED = tuple(status for status in Status if status is not Status.OK)
ATTEMPT = re.compile(r"attempt-\d+")


class RemeasureError(ValueError):
    """Bad input to remeasure: one line naming what is wrong and what is allowed."""


def attempts(results: Path, run_id: str) -> list[Path]:
    """The run's attempts set aside so far, oldest first."""
    kept = [path for path in (results / SUPERSEDED / run_id).glob("attempt-*") if ATTEMPT.fullmatch(path.name)]
    return sorted(kept, key=lambda path: int(path.name.partition("-")[2]))


def index(results: Path) -> list[dict]:
    """Every attempt set aside, read from the directories themselves (so an interrupted remeasure, or an
    index file lost, leaves nothing unlisted): run id, attempt directory, the status its record had."""
    entries = []
    for run in sorted(path for path in (results / SUPERSEDED).glob("*") if path.is_dir()):
        for attempt in attempts(results, run.name):
            try:
                status = json.loads((attempt / RUN_FILES[0].format(run.name)).read_text())["status"]
            except (OSError, ValueError, KeyError, TypeError):
                status = None  # set aside before its record was, or a record no longer readable
            entries.append({"run_id": run.name, "attempt": str(attempt.relative_to(results)), "status": status})
    return entries


def set_aside(results: str | Path, statuses: list[str],
              run_ids: list[str] | None = None) -> list[tuple[str, str, Path]]:
    """Move the files of every run whose record has one of `statuses` (of `run_ids` alone, where given) into a new
    attempt directory: (run_id, status, attempt directory) for each, in run-id order. Nothing is ever overwritten."""
    results = Path(results)
    for status in statuses:
        if status not in ALLOWED:
            raise RemeasureError(f"remeasure: --status {status!r} is not allowed; allowed: {', '.join(ALLOWED)}")
    if not (results / "runs").is_dir():
        raise RemeasureError(f"remeasure: --results {str(results)!r} has no runs/ directory; "
                             "allowed: a results directory the workflow wrote")
    if run_ids is not None and not run_ids:  # an empty selection would read as "nothing of that status"
        raise RemeasureError("remeasure: --run names no run; allowed: one run id or more, or no --run for them all")
    chosen, found = [], {}
    for path in sorted((results / "runs").glob("*.json")):
        try:
            status = json.loads(path.read_text())["status"]
        except (OSError, ValueError, KeyError, TypeError):  # not a record: left for the parser to judge
            continue
        found[path.stem] = status
        if status in statuses and (run_ids is None or path.stem in run_ids):
            chosen.append((path.stem, status))
    # A run named that is not there with such a status is refused before anything moves: a typo, or a run already
    # measured again, must not pass as done.
    if missing := sorted(set(run_ids or ()) - {run_id for run_id, _ in chosen}):
        named = ", ".join(f"{run_id!r} ({found[run_id] if run_id in found else 'no record'})" for run_id in missing)
        raise RemeasureError(f"remeasure: --run {named} in {str(results / 'runs')!r}; allowed: the run id of a record "
                             f"of status {' or '.join(statuses)} (its file name, without .json)")
    moved = []
    for run_id, status in chosen:
        done = attempts(results, run_id)
        attempt = results / SUPERSEDED / run_id / f"attempt-{int(done[-1].name.partition('-')[2]) + 1 if done else 1}"
        # The record last: a run interrupted here still has its record, and is chosen again next time
        # (into an attempt of its own: the files already moved stay where they went).
        for pattern in reversed(RUN_FILES):
            source, target = results / pattern.format(run_id), attempt / pattern.format(run_id)
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        moved.append((run_id, status, attempt))
        outputs.write_text(results / INDEX, json.dumps(index(results), indent=1) + "\n")  # after each run
    return moved
