"""Kill the tables, store and report steps at random moments, many times, and read back what they leave.

A controller killed at any moment must never leave a truncated record, table, store or report
visible (issue 34, item 6): each file appears whole or not at all (containerbench.outputs), and the
SQLite store's transactions do the rest (history.py). This script runs each step once to know its
whole output, then, for each of --kills rounds (seeded), starts one step over its last output (a
rerun replaces files), SIGKILLs its whole session at a random moment of its run, and checks every
file of that step under its final name:

- tables and report-side files: absent, or byte for byte the whole file (the report, which holds the
  time it was made, must end its page);
- the store: absent, or passing `PRAGMA integrity_check` with every session holding all its records.

    .venv/bin/python benchmarks/atomic_outputs.py [--kills 200] [--seed 34] [--records 300]

Prints how many kills landed while a step was writing (a partial file left under its hidden name)
and how many partial files were read back: that must be 0 (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from containerbench import outputs
from containerbench.processes import kill_session
from containerbench.results import TABLE_FILES

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_RECORDS = ROOT / "tests" / "data" / "golden" / "records"
CLI = [sys.executable, "-m", "containerbench"]


def write_records(directory: Path, count: int) -> list[Path]:
    """`count` records: copies of the recorded real runs' records, each a run of its own (run id, repetition
    and log digest), so that the store takes them all as new."""
    templates = [json.loads(path.read_text()) for path in sorted(GOLDEN_RECORDS.glob("*.json"))]
    directory.mkdir(parents=True)
    paths = []
    for index in range(count):
        record = copy.deepcopy(templates[index % len(templates)])
        repetition = index // len(templates) + 1
        record["spec"]["repetition"] = repetition
        record["run_id"] = record["spec"]["run_id"] = f"{record['run_id'].rsplit('_rep', 1)[0]}_rep{repetition}"
        record["log"]["sha256"] = hashlib.sha256(f"{record['run_id']}".encode()).hexdigest()
        path = directory / f"{record['run_id']}.json"
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        paths.append(path)
    return paths


class Steps:
    """The three steps' command lines, and what a whole output of each is."""

    def __init__(self, work: Path, records: list[Path]):
        self.work, self.records = work, [str(path) for path in records]
        self.tables_dir = work / "tables"
        self.tables = [self.tables_dir / name for name in TABLE_FILES.values()]

    def argv(self, step: str, store: Path | None = None) -> list[str]:
        if step == "tables":
            return [*CLI, "tables", *self.records, "--out-dir", str(self.tables_dir)]
        if step == "report":
            csvs = [str(path) for path in self.tables if path.suffix == ".csv"]
            return [*CLI, "report", *self.records, "--tables", *csvs, "--out", str(self.work / "report.html")]
        return [*CLI, "store", *self.records, "--store", str(store), "--system", "atomic"]

    def files(self, step: str, store: Path | None = None) -> list[Path]:
        return {"tables": self.tables, "report": [self.work / "report.html"], "store": [store]}[step]


def whole_store(path: Path, records: int) -> str | None:
    """None when the store is whole: SQLite's own check passes, and each session holds all its records."""
    with sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True) as connection:
        checked = connection.execute("PRAGMA integrity_check").fetchone()[0]
        if checked != "ok":
            return f"integrity_check: {checked}"
        for session, wanted in connection.execute("SELECT id, records FROM sessions"):
            held = connection.execute("SELECT count(*) FROM records WHERE session = ?", (session,)).fetchone()[0]
            if held != wanted or wanted != records:
                return f"session {session} holds {held} of {wanted} records (stored {records})"
    return None


def check(step: str, files: list[Path], reference: dict[str, bytes], records: int) -> list[str]:
    """What is wrong with the files under their final names: a partial file read back."""
    problems = []
    for path in files:
        if not path.exists():
            continue
        if step == "store":
            if (problem := whole_store(path, records)) is not None:
                problems.append(f"{path.name}: {problem}")
        elif step == "report":
            if not path.read_bytes().rstrip().endswith(b"</html>"):
                problems.append(f"{path.name}: the page is cut off")
        elif path.read_bytes() != reference[path.name]:
            problems.append(f"{path.name}: not the whole table")
    return problems


def run_killed(argv: list[str], after_s: float) -> bool:
    """Start `argv` in a session of its own and SIGKILL the whole session `after_s` later; whether it was
    still running then."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        process.wait(timeout=after_s)
        return False
    except subprocess.TimeoutExpired:
        kill_session(process.pid)
        process.wait()
        return True


def partial_files(directory: Path) -> list[Path]:
    return list(directory.rglob(f".*{outputs.PARTIAL}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--records", type=int, default=300, help="records the steps read (more: longer writes)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="atomic-outputs-"))
    try:
        steps = Steps(work, write_records(work / "records", args.records))
        durations = {}
        for step in ("tables", "report", "store"):  # each once whole: its length, and the tables' bytes
            started = time.monotonic()
            subprocess.run(steps.argv(step, work / "reference.sqlite"), check=True, capture_output=True)
            durations[step] = time.monotonic() - started
        reference = {path.name: path.read_bytes() for path in steps.tables}
        whole = ", ".join(f"{step} {seconds:.2f} s" for step, seconds in durations.items())
        print(f"{args.records} records; whole steps: {whole}")
        killed = writing = 0
        problems = []
        for round_number in range(1, args.kills + 1):
            step = rng.choice(("tables", "report", "store"))
            store = work / f"store-{round_number}.sqlite" if step == "store" else None
            # Most of a step is starting Python and reading; its writes come at the end.
            after_s = rng.uniform(0.3, 1.05) * durations[step]
            before = set(partial_files(work))
            killed += run_killed(steps.argv(step, store), after_s)
            writing += bool(set(partial_files(work)) - before)
            for problem in check(step, steps.files(step, store), reference, args.records):
                problems.append(f"round {round_number} ({step} killed after {after_s:.2f} s): {problem}")
            if store is not None:
                for path in work.glob(f"{store.name}*"):
                    path.unlink()
        print(f"{args.kills} kills (seed {args.seed}): {killed} while the step ran, {writing} while it was "
              f"writing (a partial file left under its hidden name); partial outputs read back: {len(problems)}")
        for problem in problems:
            print(f"  {problem}")
        return 1 if problems else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
