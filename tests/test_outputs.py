"""Every file the workflow writes for a reader appears whole or not at all (issue 34, item 6): a writer
killed in the middle leaves the previous file as it was. benchmarks/atomic_outputs.py kills the real
tables, store and report steps at random moments many times; tests/test_benchmarks.py runs it briefly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from containerbench import outputs

HALF_WRITTEN = """
import sys, time
from containerbench import outputs
with outputs.replacing(sys.argv[1]) as partial:
    with open(partial, "w") as out:
        out.write("the new table's first half\\n")
        out.flush()
        print("half", flush=True)
        time.sleep(60)
        out.write("and its second\\n")
"""


def test_a_writer_killed_half_way_leaves_the_old_file_whole_and_its_partial_hidden(tmp_path):
    table = tmp_path / "summary.csv"
    table.write_text("the old table, whole\n")
    writer = subprocess.Popen([sys.executable, "-c", HALF_WRITTEN, str(table)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "half\n"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert table.read_text() == "the old table, whole\n"
    [left] = tmp_path.glob(f".*{outputs.PARTIAL}")
    assert left.name == f".summary.csv.{writer.pid}{outputs.PARTIAL}"
    # The next writer takes the name whole, and clears what the killed one left.
    outputs.write_text(table, "the new table, whole\n")
    assert table.read_text() == "the new table, whole\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["summary.csv"]


def test_an_error_while_writing_leaves_the_old_file_and_no_partial(tmp_path):
    record = tmp_path / "run.json"
    record.write_text("{}\n")
    try:
        with outputs.replacing(record) as partial:
            partial.write_text('{"half": ')
            raise RuntimeError("the writer failed")
    except RuntimeError:
        pass
    assert record.read_text() == "{}\n" and sorted(tmp_path.iterdir()) == [record]
