"""The HTML report renders from the tables, self-contained, with tables and plots."""

from __future__ import annotations

import json
import re

import pandas as pd

from containerbench.report import MODE_COLUMNS, SYNC_COLUMNS, mode_columns, render
from containerbench.results import write_tables


def test_report_shows_throughput_scaling_network_and_failures(recorded_runs, tmp_path):
    paths = []
    for record in recorded_runs.values():
        path = tmp_path / f"{record['run_id']}.json"
        path.write_text(json.dumps(record))
        paths.append(path)
    failed = dict(recorded_runs[("train", 2)], run_id="train_failed_example", status="failed",
                  reasons=["exit code 137"], evidence="Killed")
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    paths.append(tmp_path / "failed.json")

    write_tables(paths, tmp_path)
    render(sorted(tmp_path.glob("*.csv")), paths, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()

    plots = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}">', page)
    assert plots == ["throughput and scaling efficiency",
                     "every run's throughput against its point's median, by start time",  # the recorded runs' order
                     "training loss against step per runtime",
                     "ping-pong latency, bandwidth and allreduce bus bandwidth",
                     "CPU use and packets per node over time"]  # the recorded runs' losses and telemetry samples
    assert "http://" not in page and "https://" not in page  # nothing fetched: readable offline
    for section in ("Environment", "Training throughput", "Container overhead", "Loss curves", "Interconnects",
                    "Input pipeline",
                    "Memory", "Table 1", "Network", "Utilisation and traffic", "Every training run",
                    "Failed, invalid and disturbed runs"):
        assert f"<h2>{section}</h2>" in page
    assert page.count("<table") == 6  # environment, summary, memory, table 1, runs, failures (the rest: no rows here)
    assert "transport check" in page and "not applicable" in page  # one rank: no traffic to check
    assert "scaling eff. %" in page and "img/s median" in page and "peak host GiB/rank" in page
    # Each figure beside its own interval (issue 37): the median's distribution-free, the mean's Student's t.
    assert all(label in page for label in ("median CI95 low", "img/s mean", "mean CI95 high"))
    assert ('<p class="headline">No container runtime was measured against bare metal at the same point.</p>'
            in page)  # bare metal only here; tests/test_results.py has the sentence with runtimes
    assert "fabric tcp-loopback" in page and "OMPI_MCA_btl=self,tcp" in page
    assert "command of train_" in page and "containerbench.bench" in page  # the recorded runs predate rank/
    assert "2.15.1" in page and "0.28.1" in page  # versions shown
    provenance = recorded_runs[("train", 1)]["result"]["provenance"]["hash"]
    assert provenance in page
    assert "train_failed_example" in page and "exit code 137" in page and "Killed" in page
    assert "1 failed" in page


def test_the_modes_table_shows_the_asynchronous_columns_only_where_a_run_has_its_synchronous_rounds():
    """A modes.csv written before the columns, or one with no asynchronous run, shows the table as it was."""
    without = {name: heading for name, heading in MODE_COLUMNS.items() if name not in SYNC_COLUMNS}
    assert mode_columns(pd.DataFrame(columns=["mode", "ratio_to_baseline_of_means"])) == without
    assert mode_columns(pd.DataFrame({"mode": ["collective"], "sync_mode": [None]})) == without
    paired = pd.DataFrame({"mode": ["parameter_server_async"], "sync_mode": ["parameter_server"]})
    assert mode_columns(paired) == MODE_COLUMNS and "sync_runs" in SYNC_COLUMNS
