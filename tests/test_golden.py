"""The recorded real runs parse to the records and tables kept beside them, byte for byte: a refactor of the
parsers or the tables that changes a figure, a column or its order fails here.

    .venv/bin/python tests/test_golden.py      # records the golden files again, after a deliberate change
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import RECORDED_RUNS, ROOT  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "golden"
CLI = [sys.executable, "-m", "containerbench"]


def parse_and_tabulate(out: Path) -> None:
    """What the workflow's parse and tables rules run, on every recorded run; paths relative to the clone."""
    (out / "records").mkdir(parents=True)
    for log in sorted(RECORDED_RUNS.glob("*.log")):
        telemetry = log.with_name(log.name.replace(".log", ".telemetry.csv"))
        subprocess.run([*CLI, "parse", str(log.relative_to(ROOT)), "--telemetry", str(telemetry.relative_to(ROOT)),
                        "--out", str(out / "records" / f"{log.stem}.json")], cwd=ROOT, check=True)
    records = sorted((out / "records").glob("*.json"))
    subprocess.run([*CLI, "tables", "--out-dir", str(out / "tables"), *map(str, records)], cwd=ROOT, check=True)


def kept_files(root: Path) -> list[Path]:
    return sorted(path.relative_to(root) for path in root.rglob("*")
                  if path.is_file() and "tensorboard" not in path.parts)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    parse_and_tabulate(out)
    return out


def test_the_recorded_runs_give_the_same_files(fresh):
    assert kept_files(fresh) == kept_files(GOLDEN)


@pytest.mark.parametrize("name", [str(path) for path in kept_files(GOLDEN)])
def test_each_record_and_table_is_byte_identical(fresh, name):
    assert (fresh / name).read_bytes() == (GOLDEN / name).read_bytes(), f"{name} changed"


if __name__ == "__main__":
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        parse_and_tabulate(Path(scratch))
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for name in kept_files(Path(scratch)):
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(scratch) / name, GOLDEN / name)
    print(f"recorded {GOLDEN}")
