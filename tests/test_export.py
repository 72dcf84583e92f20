"""`containerbench export`: the records of real tiny runs in three formats, each read back by a reader other than ours.

- ReFrame perflogs: ReFrame 4's default perflog handler, reframe-hpc/reframe at 75479718cf69,
  reframe/core/settings.py (`handlers_perflog`: type filelog, prefix '%(check_system)s/%(check_partition)s',
  `format` and `format_perfvars` below), the header rule of reframe/core/logging.py (MultiFileHandler's
  `__generate_header`) as its unittests/test_perflogging.py::test_perf_logging asserts it, and the
  placeholders of docs/config_reference.rst (logging.handlers_perflog.format).
- JUnit XML: the dialect pytest writes, which its _pytest/junitxml.py says conforms to the Jenkins xUnit plugin's
  junit-10.xsd. No JUnit schema or parser installs from this machine's package index, so the elements and
  attributes allowed are read from a document pytest itself writes here, with a pass, a failure, an error and a skip.
- OpenMetrics: prometheus_client's OpenMetrics parser and its Prometheus text-format parser, and (as root)
  node_exporter's own textfile collector, installed from Debian and scraped over loopback.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest
import yaml
from helpers import assert_junit_as_pytest_writes
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families

from containerbench import export
from containerbench.cli import main
from containerbench.validate import performance_variables, write_baseline

# reframe/core/settings.py at 75479718cf69, logging[0].handlers_perflog[0]
REFRAME_FORMAT = "%(check_result)s|%(check_job_completion_time)s|%(check_#ALL)s"
REFRAME_FORMAT_PERFVARS = ("%(check_perf_value)s|%(check_perf_unit)s|%(check_perf_ref)s|"
                           "%(check_perf_lower_thres)s|%(check_perf_upper_thres)s|")
# docs/config_reference.rst, logging.handlers_perflog.format: the placeholders ReFrame defines for a test
REFRAME_PLACEHOLDERS = {"check_environ", "check_job_completion_time_unix", "check_job_nodelist", "check_name",
                        "check_num_tasks", "check_num_tasks_per_node", "check_partition", "check_perfvalues",
                        "check_system"}
ONE_RANK = "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x1/b2"
NET = "netbench/bare-metal/tcp-loopback/1x2"


def _with_status(record: dict, status: str, reason: str) -> dict:
    changed = copy.deepcopy(record)
    changed["run_id"] = f"{record['run_id']}-{status}"
    changed["spec"]["run_id"] = changed["run_id"]
    changed["status"], changed["reasons"] = status, [reason]
    return changed


@pytest.fixture(scope="module")
def records(recorded_runs) -> list[dict]:
    """The three real records (two training runs and a netbench) and one of each other status."""
    train = recorded_runs[("train", 1)]
    return [*recorded_runs.values(), _with_status(train, "failed", "exit code 1 before the first step"),
            _with_status(train, "invalid", "weights differ between ranks"),
            _with_status(train, "disturbed", "another process took 40% of a CPU")]


@pytest.fixture(scope="module")
def references(recorded_runs, tmp_path_factory):
    """A baseline of the runs, with the 1-rank point's reference raised until its run fails it."""
    path = tmp_path_factory.mktemp("refs") / "references.yaml"
    write_baseline(performance_variables(list(recorded_runs.values())), "ci", path)
    document = yaml.safe_load(path.read_text())
    document["systems"]["ci"][f"{ONE_RANK}/images_per_sec"]["reference"] *= 10
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def exported(records, references, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    export.export(records, out, "ci", references)
    return out


def test_the_perflog_format_is_reframes_default_with_its_all_placeholder_expanded():
    # `%(check_#ALL)s` is the test's loggable attributes, sorted, joined by the format's one delimiter.
    expanded = REFRAME_FORMAT.replace("%(check_#ALL)s", "|".join(f"%({name})s" for name in
                                                                 sorted(export.LOGGED_ATTRIBUTES)))
    assert export.PERFLOG_FORMAT == expanded
    assert export.PERFLOG_FORMAT_PERFVARS == REFRAME_FORMAT_PERFVARS
    # ReFrame's own placeholders where it has one; the rest are `check_NAME` of a loggable test variable.
    assert REFRAME_PLACEHOLDERS <= set(export.LOGGED_ATTRIBUTES)
    assert set(export.LOGGED_ATTRIBUTES) - REFRAME_PLACEHOLDERS == {"check_log", "check_provenance", "check_run_id"}


def _perflog(exported, test: str) -> list[dict]:
    path = exported / "perflogs" / "ci" / "default" / f"{test.replace('/', '_')}.log"
    with open(path) as handle:
        return list(csv.DictReader(handle, delimiter="|"))


def test_each_ok_run_is_one_perflog_line_under_reframes_header_with_its_reference(exported, recorded_runs):
    path = exported / "perflogs" / "ci" / "default" / f"{ONE_RANK.replace('/', '_')}.log"
    header = path.read_text().splitlines()[0]
    # The header rule: each attribute without `check_`, each variable's fields named VAR_value, VAR_unit, ...
    # (test_perf_logging asserts 'job_completion_time,version,...,perf0_value,perf0_unit,...').
    assert header == ("result|job_completion_time|environ|job_completion_time_unix|job_nodelist|log|name|num_tasks|"
                      "num_tasks_per_node|partition|images_per_sec_value|images_per_sec_unit|images_per_sec_ref|"
                      "images_per_sec_lower_thres|images_per_sec_upper_thres|provenance|run_id|system")
    record = recorded_runs[("train", 1)]
    (line,) = _perflog(exported, ONE_RANK)  # the failed, invalid and disturbed copies measured nothing
    assert float(line["images_per_sec_value"]) == record["result"]["images_per_sec"]
    assert line["images_per_sec_unit"] == "img/s"
    assert line["result"] == "fail"  # its reference was raised tenfold
    assert float(line["images_per_sec_ref"]) > 9 * float(line["images_per_sec_value"])
    assert (line["images_per_sec_lower_thres"], line["images_per_sec_upper_thres"]) == ("-0.1", "None")
    assert (line["run_id"], line["log"]) == (record["run_id"], record["log"]["path"])
    assert line["provenance"] == record["result"]["provenance"]["hash"]
    assert (line["environ"], line["name"], line["system"], line["partition"]) == ("bare-metal", ONE_RANK, "ci",
                                                                                 "default")
    assert float(line["job_completion_time_unix"]) == pytest.approx(record["started_unix"] + record["wall_s"])


def test_a_netbench_run_logs_each_variable_at_its_message_size_and_passes_its_baseline(exported, recorded_runs):
    (line,) = _perflog(exported, NET)
    record = recorded_runs[("netbench", 2)]
    smallest = min(point["bytes"] for point in record["result"]["pingpong"])
    assert line["result"] == "pass"
    assert line[f"pingpong_latency_us@{smallest}_unit"] == "us"
    assert float(line[f"pingpong_latency_us@{smallest}_value"]) > 0
    assert line["job_nodelist"] == ",".join(dict.fromkeys(record["result"]["hostnames"]))


def test_the_junit_xml_uses_only_what_pytest_writes_and_says_each_runs_status(exported, records, tmp_path):
    ours = ET.parse(exported / "junit.xml").getroot()
    assert_junit_as_pytest_writes(ours, tmp_path)
    runs, validation = ours.findall("testsuite")
    outcome = {case.get("name"): [child.tag for child in case if child.tag != "system-out"]
               for case in runs.findall("testcase")}
    assert outcome == {record["run_id"]: {"ok": [], "failed": ["error"], "invalid": ["failure"],
                                          "disturbed": ["skipped"]}[record["status"]] for record in records}
    raw_logs = [case.find("system-out").text for case in runs.findall("testcase")]
    assert all("raw log: " in text and "sha256" in text for text in raw_logs)
    failed = {case.get("name"): case.find("failure").get("message") for case in validation.findall("testcase")
              if case.find("failure") is not None}
    assert list(failed) == [f"{ONE_RANK}/images_per_sec"]
    assert failed[f"{ONE_RANK}/images_per_sec"].startswith("fail: measured ")


def _samples(text: str, parse) -> dict:
    return {family.name: family.samples for family in parse(text)}


def test_the_metrics_parse_as_openmetrics_and_prometheus_text_with_the_records_figures(exported, recorded_runs):
    text = (exported / "metrics.prom").read_text()
    assert text.endswith("# EOF\n")
    families = _samples(text, openmetrics_families)
    assert _samples(text, prometheus_families).keys() == families.keys()
    assert all(sample.timestamp is None for samples in families.values() for sample in samples)  # textfile: none
    training = {sample.labels["point"]: sample.value
                for sample in families["containerbench_training_images_per_second"]}
    for ranks in (1, 2):
        record = recorded_runs[("train", ranks)]
        assert training[f"train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x{ranks}/b2"] == pytest.approx(
            record["result"]["images_per_sec"])
    record = recorded_runs[("netbench", 2)]
    smallest = min(record["result"]["pingpong"], key=lambda point: point["bytes"])
    (latency,) = families["containerbench_pingpong_latency_seconds"]
    assert latency.labels["bytes"] == str(smallest["bytes"])
    assert latency.value == pytest.approx(smallest["latency_us"] * 1e-6)
    nodes = families["containerbench_node_training_images_per_second"]
    for sample in nodes:  # a node's share is the sum of its ranks' rates
        record = recorded_runs[("train", int(sample.labels["point"].split("/1x")[1].split("/")[0]))]
        assert sample.value == pytest.approx(sum(rank["images_per_sec"] for rank in record["result"]["per_rank"]
                                                 if rank["hostname"] == sample.labels["node"]))
    (passed,) = families["containerbench_validation_passed"]
    assert passed.value == 0  # the raised reference fails
    runs = {sample.labels["run_id"] for sample in families["containerbench_run_info"]}
    assert runs == {record["run_id"] for record in recorded_runs.values()}


def test_each_nodes_file_holds_the_runs_that_ran_on_it(exported, recorded_runs):
    hosts = {host for record in recorded_runs.values() for host in record["result"]["hostnames"]}
    files = sorted((exported / "metrics_by_node").iterdir())
    assert [path.stem for path in files] == sorted(hosts)
    for path in files:
        families = _samples(path.read_text(), openmetrics_families)
        assert all(path.stem in sample.labels["nodes"].split(",") for samples in families.values()
                   for sample in samples if "nodes" in sample.labels)


def test_the_command_exports_without_references_and_refuses_a_bad_references_file(records, tmp_path, capsys):
    paths = []
    for record in records:
        paths.append(str(tmp_path / f"{record['run_id']}.json"))
        with open(paths[-1], "w") as handle:
            json.dump(record, handle)
    assert main(["export", *paths, "--out-dir", str(tmp_path / "out")]) == 0
    assert "exported 6 run records" in capsys.readouterr().out
    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert [suite.get("name") for suite in root] == ["runs"]  # no references: no verdict
    (row,) = _perflog_at(tmp_path / "out", records[0]["spec"]["system"], ONE_RANK)
    assert (row["result"], row["images_per_sec_ref"], row["images_per_sec_lower_thres"]) == ("pass", "0", "None")
    bad = tmp_path / "bad.yaml"
    bad.write_text("systems: {ci: {train/x: {reference: 1}}}\n")
    assert main(["export", *paths, "--out-dir", str(tmp_path / "out2"), "--references", str(bad),
                 "--system", "ci"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "bad.yaml" in error and "systems.ci" in error


def _perflog_at(out, system: str, test: str) -> list[dict]:
    with open(out / "perflogs" / system / "default" / f"{test.replace('/', '_')}.log") as handle:
        return list(csv.DictReader(handle, delimiter="|"))


NODE_EXPORTER = "prometheus-node-exporter"  # Debian's package and command (node_exporter 1.5)


@pytest.fixture
def node_exporter_command():
    if os.geteuid() != 0:
        pytest.skip("needs root: installs Debian's prometheus-node-exporter")
    if shutil.which(NODE_EXPORTER) is None:
        apt = {"capture_output": True, "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, "timeout": 600}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", NODE_EXPORTER]
        if subprocess.run(install, **apt).returncode != 0:  # package lists not fetched yet on a fresh machine
            subprocess.run(["apt-get", "update", "-qq"], check=True, **apt)
            subprocess.run(install, check=True, **apt)
        # The package's service is not ours to leave running where the machine's policy let it start.
        subprocess.run(["invoke-rc.d", NODE_EXPORTER, "stop"], **apt)
    return shutil.which(NODE_EXPORTER)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.root
def test_node_exporters_textfile_collector_reads_a_nodes_file(exported, node_exporter_command, tmp_path):
    node_file = next((exported / "metrics_by_node").iterdir())
    shutil.copy(node_file, tmp_path / node_file.name)
    port = _free_port()
    server = subprocess.Popen([node_exporter_command, "--collector.disable-defaults", "--collector.textfile",
                               f"--collector.textfile.directory={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, scraped = time.monotonic() + 30, None
        while scraped is None and time.monotonic() < deadline:
            try:
                scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.2)
        assert scraped is not None, "node_exporter did not answer"
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    families = _samples(scraped, prometheus_families)
    assert [sample.value for sample in families["node_textfile_scrape_error"]] == [0]
    ours = _samples(node_file.read_text(), openmetrics_families)
    for name, samples in ours.items():
        assert sorted(sample.value for sample in families[name]) == sorted(sample.value for sample in samples), name


def test_the_readmes_line_of_each_format_is_one_each_reader_takes():
    from helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    block = readme.split("one line of each", 1)[1].split("```\n", 2)[1]
    perflog, testcase, metric = block.splitlines()
    fields = perflog.split("|")
    header = export.perflog_header([export.PerfValue("images_per_sec", "", 0.0, "img/s", None)]).split("|")
    assert len(fields) == len(header)
    assert dict(zip(header, fields))["images_per_sec_unit"] == "img/s"
    case = ET.fromstring(testcase + "</testcase>")
    assert case.tag == "testcase" and case.get("name") == dict(zip(header, fields))["run_id"]
    (family,) = prometheus_families(metric + "\n")
    assert family.name == "containerbench_training_images_per_second"
    assert family.samples[0].value == float(dict(zip(header, fields))["images_per_sec_value"])


def test_an_export_again_leaves_no_file_of_a_point_or_node_the_records_no_longer_have(records, tmp_path):
    export.export(records, tmp_path, "ci")
    assert list((tmp_path / "perflogs").rglob("*.log")) and list((tmp_path / "metrics_by_node").iterdir())
    failed_only = [record for record in records if record["status"] == "failed"]
    export.export(failed_only, tmp_path, "ci")
    assert [path.name for path in (tmp_path / "perflogs").rglob("*") if path.is_file()] == ["httpjson.jsonl"]
    assert (tmp_path / "perflogs" / "httpjson.jsonl").read_text() == ""
    assert not list((tmp_path / "metrics_by_node").iterdir())
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert [case.get("name") for case in root.iter("testcase")] == [failed_only[0]["run_id"]]


def test_the_httpjson_lines_are_what_reframes_httpjson_handler_posts(exported, recorded_runs):
    posted = {line["check_run_id"]: line for line in map(json.loads, (exported / "perflogs" / "httpjson.jsonl")
                                                          .read_text().splitlines())}
    assert set(posted) == {record["run_id"] for record in recorded_runs.values()}  # the ok runs
    one = posted[recorded_runs[("train", 1)]["run_id"]]
    # reframe/core/logging.py, _record_to_json: the record's attributes, check_perfvalues flattened into
    # check_perf_NAME_{value,ref,lower_thres,upper_thres,unit,result}; _update_check_extras spells the
    # completion time '%FT%T%:z'.
    assert "check_perfvalues" not in one
    assert one["check_perf_images_per_sec_value"] == recorded_runs[("train", 1)]["result"]["images_per_sec"]
    assert (one["check_perf_images_per_sec_unit"], one["check_perf_images_per_sec_result"],
            one["check_perf_images_per_sec_lower_thres"], one["check_perf_images_per_sec_upper_thres"]) == (
        "img/s", "fail", -0.1, None)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", one["check_job_completion_time"])
    net = posted[recorded_runs[("netbench", 2)]["run_id"]]
    smallest = min(point["bytes"] for point in recorded_runs[("netbench", 2)]["result"]["pingpong"])
    assert net[f"check_perf_pingpong_latency_us_{smallest}_unit"] == "us"  # '@' is not a word character


def test_records_from_before_runs_had_a_start_time_export_too(recorded_runs, tmp_path):
    # records.ADDED_KEYS gives a record older than the field `started_unix: None`.
    old = [{**copy.deepcopy(record), "started_unix": None} for record in recorded_runs.values()]
    export.export(old + [{**old[0], "run_id": old[0]["run_id"] + "-again"}], tmp_path, "ci")
    families = _samples((tmp_path / "metrics.prom").read_text(), openmetrics_families)
    assert "containerbench_run_start_timestamp_seconds" not in families
    assert len(families["containerbench_training_images_per_second"]) == 2
    (line,) = _perflog_at(tmp_path, "ci", ONE_RANK)
    assert (line["job_completion_time"], line["job_completion_time_unix"]) == ("null", "null")
