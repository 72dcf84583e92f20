"""Record the raw logs the fast tests read: real tiny runs, as the suite's tiny_runs makes them.

    .venv/bin/python tests/data/regenerate.py

Trains ResNet-50 (32 px, batch 2) on 1 and 2 ranks and runs netbench on 2 ranks,
bare metal with mpirun, and keeps the three raw logs and their telemetry samples in tests/data/runs. Run it
again when the log format changes; tests/test_records.py checks (slow) that a fresh
run still parses into records of the same shape.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
from helpers import RECORDED_RUNS, run_and_parse, tiny_config  # noqa: E402

from containerbench import config as cb_config  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        config = tiny_config(workdir)
        runs = [r for r in cb_config.plan_runs(config) if r.repetition == 1]
        RECORDED_RUNS.mkdir(parents=True, exist_ok=True)
        for old in [*RECORDED_RUNS.glob("*.log"), *RECORDED_RUNS.glob("*.telemetry.csv")]:
            old.unlink()
        for spec, record in run_and_parse(runs, config, workdir):
            if record["status"] != "ok":
                print(f"{spec.run_id}: {record['status']}: {record['reasons']}", file=sys.stderr)
                return 1
            shutil.copy(workdir / f"{spec.run_id}.log", RECORDED_RUNS / f"{spec.run_id}.log")
            shutil.copy(record["telemetry"]["file"], RECORDED_RUNS / f"{spec.run_id}.telemetry.csv")
            print(RECORDED_RUNS / f"{spec.run_id}.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
