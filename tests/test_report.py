"""The HTML report renders from the tables, self-contained, with tables and plots."""

from __future__ import annotations

import json
import re

import pytest

from containerbench.report import render
from containerbench.results import write_tables

pytestmark = pytest.mark.slow


def test_report_shows_throughput_scaling_network_and_failures(tiny_runs, tmp_path):
    paths = []
    for (kind, ranks), record in tiny_runs.items():
        path = tmp_path / f"{record['run_id']}.json"
        path.write_text(json.dumps(record))
        paths.append(path)
    failed = dict(tiny_runs[("train", 2)], run_id="train_failed_example", status="failed",
                  reasons=["exit code 137"], evidence="Killed")
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    paths.append(tmp_path / "failed.json")

    write_tables(paths, tmp_path)
    render(tmp_path, paths, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()

    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}">', page)) == 2
    assert "http://" not in page and "https://" not in page  # nothing fetched: readable offline
    assert page.count("<table") == 3  # environment, summary, failures
    assert "scaling eff. %" in page and "img/s median" in page
    assert "2.15.1" in page and "0.28.1" in page  # versions shown
    provenance = tiny_runs[("train", 1)]["result"]["provenance"]["hash"]
    assert provenance in page
    assert "train_failed_example" in page and "exit code 137" in page and "Killed" in page
    assert "1 failed" in page
