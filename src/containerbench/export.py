"""Results a site feeds into the tools it already runs: ReFrame perflogs, JUnit XML and OpenMetrics.

`containerbench export` (and the workflow's `export` rule) writes, from the run records alone:

- perflogs/SYSTEM/PARTITION/POINT.log: what ReFrame 4's default perflog handler (`filelog`, prefix
  `%(check_system)s/%(check_partition)s`) writes for a test, one line per ok run with all its performance
  variables, under the header line ReFrame puts first. A ReFrame test is a sweep point here, its
  environment is the runtime, and each variable carries the reference and the tolerances of the
  references file, where it has them. A log pipeline that reads ReFrame's perflogs reads these as they are;
  perflogs/httpjson.jsonl has, a run a line, the JSON ReFrame's httpjson handler would post.
- junit.xml: every run as a test case (failed: an error; invalid: a failure; disturbed: skipped, since
  its figure is not compared) and, with references, every judged variable and the slow-node check, in
  the JUnit dialect pytest writes (the Jenkins xUnit plugin's junit-10.xsd).
- metrics.prom and metrics_by_node/NODE.prom: the latest figure of each point, in the OpenMetrics text
  format, by node, runtime and fabric: the files node_exporter's textfile collector reads (no sample
  timestamps, which it refuses; each run's start is a gauge of its own).

Every figure names its run (`run_id`), whose record names its raw log: nothing here is computed anew.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from containerbench import outputs
from containerbench.point import runtime_label
from containerbench.status import Status
from containerbench.validate import Reference, ValidationOutcome, judge, load_references, metric_of, record_variables

PERFLOG_DIR = "perflogs"
HTTPJSON_FILE = "httpjson.jsonl"  # in PERFLOG_DIR: what ReFrame's httpjson handler would have posted, a run a line
JUNIT_FILE = "junit.xml"
METRICS_FILE = "metrics.prom"
BY_NODE_DIR = "metrics_by_node"
PARTITION = "default"  # ReFrame's partition: a sweep has one (its Slurm partition is the config's concern)

# ReFrame 4's default perflog handler (reframe/core/settings.py, `handlers_perflog`): its `format` is
# '%(check_result)s|%(check_job_completion_time)s|%(check_#ALL)s', and `%(check_#ALL)s` stands for the
# test's loggable attributes in sorted order (docs/config_reference.rst, logging.handlers_perflog.format).
# These are a containerbench run's: ReFrame's own names where ReFrame has the attribute, and `check_NAME`
# for what a ReFrame test would declare loggable (the run, its raw log, its provenance hash).
LOGGED_ATTRIBUTES = sorted([
    "check_environ", "check_job_completion_time_unix", "check_job_nodelist", "check_log", "check_name",
    "check_num_tasks", "check_num_tasks_per_node", "check_partition", "check_perfvalues", "check_provenance",
    "check_run_id", "check_system",
])
PERFLOG_FORMAT = "%(check_result)s|%(check_job_completion_time)s|" + "|".join(f"%({a})s" for a in LOGGED_ATTRIBUTES)
# The same handler's `format_perfvars`; its last character separates the variables from what follows.
PERFLOG_FORMAT_PERFVARS = ("%(check_perf_value)s|%(check_perf_unit)s|%(check_perf_ref)s|"
                           "%(check_perf_lower_thres)s|%(check_perf_upper_thres)s|")
PERFLOG_DATEFMT = "%Y-%m-%dT%H:%M:%S"  # the handler's default datefmt, '%FT%T', spelled for strftime
_PLACEHOLDER = re.compile(r"%\((.*?)\)s(.*?(?=%|$))?")  # a placeholder and the delimiter after it


@dataclass(frozen=True)
class PerfValue:
    """One performance variable of one run, as ReFrame keeps it (`_perfvalues`): value, reference, unit."""

    name: str  # ReFrame's variable name: the metric, with @bytes for a netbench size
    variable: str  # containerbench's full name (validate.VARIABLE_PATTERN)
    value: float
    unit: str
    reference: Reference | None

    @property
    def result(self) -> str:
        # ReFrame checks a variable with no reference against (0, None, None): it passes.
        return "pass" if self.reference is None or self.reference.admits(self.value) else "fail"

    def fields(self) -> dict:
        ref = self.reference
        return {"check_perf_var": self.name, "check_perf_value": self.value, "check_perf_unit": self.unit,
                "check_perf_ref": ref.reference if ref else 0, "check_perf_lower_thres": ref.lower if ref else None,
                "check_perf_upper_thres": ref.upper if ref else None, "check_perf_result": self.result}


def run_figures(records: list[dict], references: dict[str, Reference]) -> dict[str, list[PerfValue]]:
    """run_id -> the performance variables its record measured (ok runs only, as validation reads them)."""
    figures: dict[str, list[PerfValue]] = defaultdict(list)
    for run_id, variable, value, unit in record_variables(records).itertuples(index=False):
        name = variable.rsplit("/", 1)[1]
        figures[run_id].append(PerfValue(name, variable, float(value), unit, references.get(variable)))
    return dict(figures)


def reframe_test(values: list[PerfValue]) -> str:
    """The ReFrame test of a run: its sweep point, the variable's name without the metric."""
    return values[0].variable.rsplit("/", 1)[0]


def _logged(value) -> str:
    """How ReFrame writes an attribute (logging._xfmt): strings as they are, lists joined by commas, else JSON."""
    if isinstance(value, (list, tuple)):
        return ",".join(item if isinstance(item, str) else json.dumps(item) for item in value)
    return value if isinstance(value, str) else json.dumps(value)


def _nodes(result: dict) -> tuple[str, ...]:
    """The run's nodes, each once, in rank order (the result names each rank's host)."""
    return tuple(dict.fromkeys(result.get("hostnames") or []))


def _completion_unix(record: dict) -> float | None:
    if record.get("started_unix") is None:
        return None
    return float(record["started_unix"]) + float(record.get("wall_s") or 0)


def perflog_fields(record: dict, values: list[PerfValue], system: str) -> dict:
    """The log record ReFrame would hand its perflog handler for this run."""
    spec, result = record["spec"], record.get("result") or {}
    return {
        "check_result": "pass" if all(value.result == "pass" for value in values) else "fail",
        "check_job_completion_time_unix": _completion_unix(record),
        "check_environ": runtime_label(spec.get("runtime"), spec.get("mpi_model")),
        "check_job_nodelist": list(_nodes(result)),
        "check_log": (record.get("log") or {}).get("path"),
        "check_name": reframe_test(values),
        "check_num_tasks": spec.get("ranks"),
        "check_num_tasks_per_node": spec.get("ranks_per_node"),
        "check_partition": PARTITION,
        "check_perfvalues": values,
        "check_provenance": (result.get("provenance") or {}).get("hash"),
        "check_run_id": record["run_id"],
        "check_system": system,
    }


def perflog_line(fields: dict) -> str:
    """One line, as ReFrame's CheckFieldFormatter formats it: perf values by `format_perfvars` (Python's %s),
    every other attribute by _logged, the completion time by the handler's datefmt in local time."""
    proxy = {key: _logged(value) for key, value in fields.items() if key != "check_perfvalues"}
    delimiter = PERFLOG_FORMAT_PERFVARS[-1]
    proxy["check_perfvalues"] = delimiter.join(PERFLOG_FORMAT_PERFVARS[:-1] % value.fields()
                                               for value in fields["check_perfvalues"])
    completed = fields["check_job_completion_time_unix"]
    proxy["check_job_completion_time"] = (
        "null" if completed is None else datetime.fromtimestamp(completed).astimezone().strftime(PERFLOG_DATEFMT))
    return PERFLOG_FORMAT % proxy


def perflog_header(values: list[PerfValue]) -> str:
    """The first line of a perflog, as ReFrame's MultiFileHandler makes it from the format: each attribute
    without `check_`, and each variable's fields named VARIABLE_value, VARIABLE_unit, ..."""
    header = ""
    for attribute, delimiter in _PLACEHOLDER.findall(PERFLOG_FORMAT):
        if attribute == "check_perfvalues":
            header += PERFLOG_FORMAT_PERFVARS[-1].join(
                "|".join(field.replace("check_perf", value.name) for field, _ in
                         _PLACEHOLDER.findall(PERFLOG_FORMAT_PERFVARS)) for value in values)
        else:
            header += attribute.removeprefix("check_")
        header += delimiter
    return header


def file_name(name: str) -> str:
    """A point's or a node's name as one file name: any other character than [A-Za-z0-9_.-] becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def perflog_file(system: str, test: str) -> str:
    """A test's file below the handler's prefix: its name made a file name (ReFrame: the test's variant name)."""
    return f"{system}/{PARTITION}/{file_name(test)}.log"


def httpjson_record(fields: dict) -> dict:
    """The JSON ReFrame's httpjson handler posts for this log record (reframe/core/logging.py, _record_to_json):
    each attribute as it is, and each performance variable flattened into check_perf_NAME_value, _ref,
    _lower_thres, _upper_thres, _unit and _result, NAME with every non-word character made '_'."""
    posted = {key: value for key, value in fields.items() if key != "check_perfvalues"}
    completed = fields["check_job_completion_time_unix"]  # the record's own spelling: RFC 3339, '%FT%T%:z'
    posted["check_job_completion_time"] = (None if completed is None else
                                           datetime.fromtimestamp(completed).astimezone().isoformat(timespec="seconds"))
    for value in fields["check_perfvalues"]:
        name = re.sub(r"\W", "_", value.name)
        perf = value.fields()
        for part in ("value", "ref", "lower_thres", "upper_thres", "unit", "result"):
            posted[f"check_perf_{name}_{part}"] = perf[f"check_perf_{part}"]
    return posted


def write_perflogs(records: list[dict], figures: dict[str, list[PerfValue]], system: str, out_dir: Path) -> list[Path]:
    """One file per sweep point, its runs in the order they ended (ReFrame appends as tests complete). Where a
    run's variables change the header, ReFrame moves the file aside as NAME.log.h0, .h1, ...: so here too."""
    by_test: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    for record in records:
        values = figures.get(record["run_id"])
        if values:
            fields = perflog_fields(record, values, system)
            by_test[reframe_test(values)].append(
                (fields["check_job_completion_time_unix"] or 0.0, perflog_header(values), perflog_line(fields)))
    written = [out_dir / HTTPJSON_FILE]
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_text(written[0], "".join(json.dumps(httpjson_record(perflog_fields(record, figures[record["run_id"]],
                                                                                     system))) + "\n"
                                           for record in records if figures.get(record["run_id"])))
    for test, entries in sorted(by_test.items()):
        entries.sort(key=lambda entry: entry[0])
        segments: list[list[str]] = []  # header, then its lines
        for _, header, line in entries:
            if not segments or segments[-1][0] != header:
                segments.append([header])
            segments[-1].append(line)
        path = out_dir / perflog_file(system, test)
        path.parent.mkdir(parents=True, exist_ok=True)
        names = [path.with_name(f"{path.name}.h{index}") for index in range(len(segments) - 1)] + [path]
        for name, lines in zip(names, segments):
            outputs.write_text(name, "\n".join(lines) + "\n")
            written.append(name)
    return written


# A run's status -> the JUnit element that says so (None: it passed). A disturbed run is a valid measurement
# of a busy machine: kept, not compared, so neither a failure nor a pass.
JUNIT_OUTCOME = {Status.FAILED: "error", Status.INVALID: "failure", Status.DISTURBED: "skipped"}


def _seconds(value) -> str:
    return f"{float(value or 0):.3f}"


def junit_suite(parent: ET.Element, name: str, cases: list[ET.Element], started_unix: float | None,
                system: str) -> None:
    """A <testsuite> with the counts and attributes pytest writes (pytest's _pytest/junitxml.py)."""
    counts = {kind: sum(case.find(kind) is not None for case in cases) for kind in ("error", "failure", "skipped")}
    stamp = datetime.fromtimestamp(started_unix or 0, timezone.utc).astimezone().isoformat(timespec="seconds")
    suite = ET.SubElement(parent, "testsuite", name=name, errors=str(counts["error"]),
                          failures=str(counts["failure"]), skipped=str(counts["skipped"]), tests=str(len(cases)),
                          time=_seconds(sum(float(case.get("time")) for case in cases)), timestamp=stamp,
                          hostname=system)
    suite.extend(cases)


def junit_case(classname: str, name: str, seconds, outcome: str | None = None, message: str = "",
          out: str = "") -> ET.Element:
    case = ET.Element("testcase", classname=classname, name=name, time=_seconds(seconds))
    if outcome:
        ET.SubElement(case, outcome, message=message).text = message
    if out:
        ET.SubElement(case, "system-out").text = out
    return case


def _run_case(record: dict) -> ET.Element:
    log = record.get("log") or {}
    point = record["run_id"].rsplit("_rep", 1)[0]  # the run's sweep point, as its file names spell it
    reasons = "; ".join(record.get("reasons") or []) or record["status"]
    outcome = JUNIT_OUTCOME.get(record["status"])
    return junit_case(f"containerbench.runs.{point}", record["run_id"], record.get("wall_s"), outcome,
                 f"{record['status']}: {reasons}" if outcome else "",
                 f"raw log: {log.get('path')} (sha256 {log.get('sha256')})")


def _verdict_cases(outcome: ValidationOutcome) -> list[ET.Element]:
    cases = []
    for row in outcome.verdict.itertuples():
        bounds = f"allowed {row.lower_bound} .. {row.upper_bound} {row.unit}"
        if row.result == "pass":
            kind, message = None, ""
        elif row.failed:
            kind, message = "failure", f"{row.result}: measured {row.measured} {row.unit}, {bounds}"
        else:  # no reference, and not strict: not judged
            kind, message = "skipped", "no reference"
        cases.append(junit_case("containerbench.validation", row.variable, 0, kind, message))
    slow = [f"slow node {row.node}: {row.shortfall_percent:.1f}% below the median of its peers in run {row.run_id}"
            for row in outcome.slow_nodes.itertuples()]
    cases.append(junit_case("containerbench.validation", "slow nodes", 0, "failure" if slow else None,
                            "; ".join(slow)))
    return cases


def junit_document(records: list[dict], outcome: ValidationOutcome | None, system: str) -> ET.ElementTree:
    root = ET.Element("testsuites")
    started = min((record["started_unix"] for record in records if record.get("started_unix")), default=None)
    cases = [_run_case(record) for record in sorted(records, key=lambda record: record["run_id"])]
    junit_suite(root, "runs", cases, started, system)
    if outcome is not None:
        junit_suite(root, "validation", _verdict_cases(outcome), started, system)
    return ET.ElementTree(root)


# A metric of validate.UNITS -> its OpenMetrics family (base units, as Prometheus' naming asks) and the
# factor from the unit records keep.
FAMILIES = {
    "images_per_sec": ("containerbench_training_images_per_second", 1.0, "Training throughput of the run"),
    "pingpong_latency_us": ("containerbench_pingpong_latency_seconds", 1e-6, "MPI ping-pong latency"),
    "pingpong_bandwidth_MBps": ("containerbench_pingpong_bandwidth_bytes_per_second", 1e6, "MPI ping-pong bandwidth"),
    "allreduce_busbw_GBps": ("containerbench_allreduce_bus_bandwidth_bytes_per_second", 1e9,
                             "All-reduce bus bandwidth"),
}
POINT_LABELS = ["system", "point", "runtime", "fabric", "nodes"]  # nodes: the run's hosts, comma-separated


@dataclass(frozen=True)
class Sample:
    family: str
    labels: dict
    value: float
    hosts: tuple[str, ...]  # the nodes whose file it goes in


def latest_runs(records: list[dict], figures: dict[str, list[PerfValue]]) -> list[dict]:
    """Each point's newest ok run (by its start): the figures a dashboard shows now."""
    newest: dict[str, dict] = {}
    for record in records:
        values = figures.get(record["run_id"])
        if values:
            point = reframe_test(values)
            # A record older than its start time (records.ADDED_KEYS: None) counts as the oldest.
            if point not in newest or (record.get("started_unix") or 0) >= (newest[point].get("started_unix") or 0):
                newest[point] = record
    return [newest[point] for point in sorted(newest)]


def metric_samples(records: list[dict], figures: dict[str, list[PerfValue]], system: str) -> list[Sample]:
    samples = []
    for record in latest_runs(records, figures):
        values, spec, result = figures[record["run_id"]], record["spec"], record.get("result") or {}
        hosts = _nodes(result)
        labels = {"system": system, "point": reframe_test(values),
                  "runtime": runtime_label(spec.get("runtime"), spec.get("mpi_model")),
                  "fabric": str(spec.get("fabric")), "nodes": ",".join(hosts)}
        for value in values:
            family, factor, _ = FAMILIES[metric_of(value.variable)]
            size = {"bytes": value.name.split("@", 1)[1]} if "@" in value.name else {}
            samples.append(Sample(family, {**labels, **size}, value.value * factor, hosts))
        if record["kind"] == "train":
            per_node: dict[str, float] = defaultdict(float)
            for rank in result.get("per_rank") or []:
                per_node[rank["hostname"]] += float(rank["images_per_sec"])
            for node, rate in sorted(per_node.items()):
                samples.append(Sample("containerbench_node_training_images_per_second", {**labels, "node": node},
                                      rate, (node,)))
        if record.get("started_unix") is not None:
            samples.append(Sample("containerbench_run_start_timestamp_seconds", labels,
                                  float(record["started_unix"]), hosts))
        samples.append(Sample("containerbench_run_info", {**labels, "run_id": record["run_id"],
                                                     "provenance": str((result.get("provenance") or {}).get("hash"))},
                              1.0, hosts))
    return samples


HELP = {
    **{family: text for family, _, text in FAMILIES.values()},
    "containerbench_node_training_images_per_second": "Training throughput of the run's ranks on this node",
    "containerbench_run_start_timestamp_seconds": "When the run whose figures these are started",
    "containerbench_run_info": "The run the point's figures come from (its record names its raw log)",
    "containerbench_validation_passed": "1 if the validation verdict passed, 0 if it failed",
}


class _Samples:
    """A prometheus_client collector of fixed samples: the library writes the exposition."""

    def __init__(self, samples: list[Sample], helps: dict[str, str]):
        self.samples, self.helps = samples, helps

    def collect(self):
        by_family: dict[str, list[Sample]] = defaultdict(list)
        for sample in self.samples:
            by_family[sample.family].append(sample)
        for family, members in sorted(by_family.items()):
            names = sorted({key for sample in members for key in sample.labels})
            metric = GaugeMetricFamily(family, self.helps[family], labels=names)
            for sample in members:
                metric.add_metric([str(sample.labels.get(key, "")) for key in names], sample.value)
            yield metric


def exposition(samples: list[Sample], helps: dict[str, str] | None = None) -> str:
    """OpenMetrics text of these samples, every family a gauge with its HELP line (from HELP, then `helps`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Samples(samples, {**HELP, **(helps or {})}))
    return generate_latest(registry).decode()


def write_metrics(samples: list[Sample], out_dir: Path) -> list[Path]:
    """Every sample in one file, and each node's in its own (its runs' figures), for its textfile collector."""
    written = [out_dir / METRICS_FILE]
    outputs.write_text(written[0], exposition(samples))
    nodes = sorted({host for sample in samples for host in sample.hosts})
    (out_dir / BY_NODE_DIR).mkdir(parents=True, exist_ok=True)
    for node in nodes:
        path = out_dir / BY_NODE_DIR / f"{file_name(node)}.prom"
        outputs.write_text(path, exposition([sample for sample in samples if node in sample.hosts]))
        written.append(path)
    return written


def export(records: list[dict], out_dir: str | Path, system: str, references_path: str | Path | None = None,
           strict: bool = False, slow_fraction: float = 0.10) -> list[Path]:
    """Write every format; the paths written. A references file makes the validation verdict part of each."""
    out_dir = Path(out_dir)
    references = load_references(references_path, system) if references_path else {}
    outcome = judge(records, references, strict, slow_fraction) if references_path else None
    figures = run_figures(records, references)
    written = write_perflogs(records, figures, system, out_dir / PERFLOG_DIR)
    junit = out_dir / JUNIT_FILE
    with outputs.replacing(junit) as partial:
        junit_document(records, outcome, system).write(partial, encoding="utf-8", xml_declaration=True)
    samples = metric_samples(records, figures, system)
    if outcome is not None:
        samples.append(Sample("containerbench_validation_passed", {"system": system}, float(outcome.passed),
                              tuple(sorted({h for s in samples for h in s.hosts}))))
    written += [junit, *write_metrics(samples, out_dir)]
    _remove_stale(out_dir, written)
    return written


def _remove_stale(out_dir: Path, written: list[Path]) -> None:
    """A perflog or node file an earlier export left, for a point or node these records no longer have, would be
    read as current (a textfile collector reads every file in its directory)."""
    (out_dir / PERFLOG_DIR).mkdir(parents=True, exist_ok=True)  # made even with no ok run: the workflow's output
    kept = {path.resolve() for path in written}
    for directory in (PERFLOG_DIR, BY_NODE_DIR):
        for path in (out_dir / directory).rglob("*"):
            if path.is_file() and path.resolve() not in kept:
                path.unlink()
