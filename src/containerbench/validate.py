"""Node validation: measured performance variables judged against a site's references.

Run records become named performance variables (ReFrame style, e.g.
`train/resnet50-224px-fp32/bare-metal/ib/2x4/b32/images_per_sec`), each judged
against the references of its system: a reference value with lower and upper
tolerances as fractions. Multi-node training runs are also searched for a node
slower than its peers. `write_baseline` turns a good run into a references file.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import yaml

from containerbench import outputs
from containerbench.config import describe, load_schema
from containerbench.fabrics import RAIL_SEPARATOR
from containerbench.point import Point, runtime_label
from containerbench.records import load_records
from containerbench.runtables import SERIES, runs_table, summary_table
from containerbench.status import Status

# Metric (a variable's last part, without "@bytes") -> unit: the one place units
# are defined; variables take theirs from here and references are checked against it.
UNITS = {
    "images_per_sec": "img/s",
    "scaling_efficiency": "%",
    "pingpong_latency_us": "us",
    "pingpong_bandwidth_MBps": "MB/s",
    "allreduce_busbw_GBps": "GB/s",
}
TRAIN_METRICS = ("images_per_sec", "scaling_efficiency")
NETBENCH_METRICS = tuple(metric for metric in UNITS if metric not in TRAIN_METRICS)
LOWER_IS_BETTER = {"pingpong_latency_us"}  # a baseline bounds these from above

# Netbench variables: (test, column, metric, which message size). Latency at the
# smallest message is pure overhead; bandwidth at the largest is closest to the link's peak.
NETBENCH_PICKS = [
    ("pingpong", "latency_us", "pingpong_latency_us", min),
    ("pingpong", "bandwidth_MBps", "pingpong_bandwidth_MBps", max),
    ("allreduce", "busbw_GBps", "allreduce_busbw_GBps", max),
]

_PART = r"[^/@\s]+"
VARIABLE_PATTERN = re.compile(
    rf"train/{_PART}-\d+px-{_PART}/{_PART}/{_PART}/\d+x\d+/b\d+/({'|'.join(TRAIN_METRICS)})"
    rf"|netbench(-gloo|-nccl)?/{_PART}/{_PART}/\d+x\d+/({'|'.join(NETBENCH_METRICS)})@\d+")
VARIABLE_FORMS = (
    "train/{model}-{image_size}px-{precision}[-{framework}][-{mode}][-real]/{runtime}/{fabric}/"
    f"{{nodes}}x{{ranks_per_node}}/b{{batch_size}}/{{{'|'.join(TRAIN_METRICS)}}} or netbench[-gloo|-nccl]/"
    f"{{runtime}}/{{fabric}}/{{nodes}}x{{ranks_per_node}}/{{{'|'.join(NETBENCH_METRICS)}}}@{{bytes}}")

VARIABLE_COLUMNS = ["variable", "value", "unit", "runs"]
VERDICT_COLUMNS = ["variable", "measured", "reference", "lower_bound", "upper_bound", "unit", "result", "failed"]
SLOW_NODE_COLUMNS = ["run_id", "node", "node_images_per_sec", "peers_median", "shortfall_percent"]


def metric_of(variable: str) -> str:
    return variable.rsplit("/", 1)[-1].split("@", 1)[0]


def rail_of(variable: str) -> str:
    """The rail (FABRIC.RAIL) a variable measured alone; "" where it measured its fabric whole."""
    parts = variable.split("/")
    fabric = parts[2] if parts[0].startswith("netbench") else parts[3]  # netbench_variable, Point.variable
    return fabric if RAIL_SEPARATOR in fabric else ""


def figure_name(variable: str) -> str:
    """A variable as a verdict's reason names it: its metric, and the rail where it measured one alone."""
    rail = rail_of(variable)
    return f"{metric_of(variable)} over rail {rail}" if rail else metric_of(variable)


def train_variable(row) -> str:
    """A training point's variable name, without its metric (`row`: a row of the run or summary table);
    Point.variable says how it is spelled."""
    return Point.from_row(row).variable(row.model, row.image_size, row.precision)


def netbench_variable(runtime: str, fabric: str, nodes, ranks, backend: str = "mpi") -> str:
    """MPI's netbench as it always was; torch.distributed's under netbench-gloo or netbench-nccl."""
    kind = "netbench" if backend == "mpi" else f"netbench-{backend}"
    return f"{kind}/{runtime}/{fabric}/{int(nodes)}x{int(ranks) // int(nodes)}"


def _variable(name: str, metric: str, value: float, runs: int, at: str = "") -> dict:
    return {"variable": f"{name}/{metric}{at}", "value": float(value), "unit": UNITS[metric], "runs": int(runs)}


def performance_variables(records: list[dict]) -> pd.DataFrame:
    """One row per variable of the ok records: the median over repetitions, and how many there were."""
    return pd.DataFrame(_train_variables(records) + _netbench_variables(records), columns=VARIABLE_COLUMNS)


def _train_variables(records: list[dict]) -> list[dict]:
    summary = summary_table(runs_table(records))  # per point: median of ok repetitions, scaling
    if summary.empty:
        return []
    summary = summary.dropna(subset=["images_per_sec_median"]).copy()
    # The fewest-rank point of a series is the scaling base: 100% by definition, not a measurement.
    summary["fewest_ranks"] = summary.groupby(SERIES, dropna=False)["ranks"].transform("min")
    rows = []
    for point in summary.itertuples():
        name = train_variable(point)
        rows.append(_variable(name, "images_per_sec", point.images_per_sec_median, point.repetitions))
        if point.ranks > point.fewest_ranks:
            rows.append(_variable(name, "scaling_efficiency", point.scaling_efficiency_percent, point.repetitions))
    return rows


PICK_COLUMNS = ["run_id", "runtime", "fabric", "nodes", "ranks", "backend", "bytes", "value", "metric"]


def _netbench_picks(records: list[dict]) -> pd.DataFrame:
    """Per ok netbench run and metric of NETBENCH_PICKS: the value at the picked message size, with its
    variable's `name`. Read from the records, not the long table: a fleet's thousands of runs go through here."""
    rows = []
    for record in records:
        if record["kind"] != "netbench" or record["status"] != Status.OK:
            continue
        spec = record["spec"]
        runtime = runtime_label(spec.get("runtime"), spec.get("mpi_model"))
        for test, column, metric, pick in NETBENCH_PICKS:
            points = record["result"].get(test) or []
            if points:
                size = pick(point["bytes"] for point in points)
                value = float(statistics.median(point[column] for point in points if point["bytes"] == size))
                rows.append((record["run_id"], runtime, spec.get("fabric"), spec.get("nodes"), spec.get("ranks"),
                             record["result"].get("backend", "mpi"), size, value, metric))
    picked = pd.DataFrame(rows, columns=PICK_COLUMNS)
    picked["name"] = [f"{netbench_variable(*point)}/{metric}@{int(size)}" for *point, size, _, metric in zip(
        picked["runtime"], picked["fabric"], picked["nodes"], picked["ranks"], picked["backend"], picked["bytes"],
        picked["value"], picked["metric"])]
    return picked


def _netbench_variables(records: list[dict]) -> list[dict]:
    picked = _netbench_picks(records)
    points = picked.groupby(["name", "metric"], sort=False).agg(value=("value", "median"), runs=("run_id", "nunique"))
    return [{"variable": name, "value": float(point.value), "unit": UNITS[metric], "runs": int(point.runs)}
            for (name, metric), point in points.iterrows()]


RECORD_VARIABLE_COLUMNS = ["run_id", "variable", "value", "unit"]


def record_variables(records: list[dict]) -> pd.DataFrame:
    """What each ok record measured, one row per variable, not aggregated over repetitions: the
    per-run figures the fleet verdict sets side by side (scaling efficiency needs two points, so none)."""
    runs = runs_table(records)
    runs = runs[runs["status"] == Status.OK].dropna(subset=["images_per_sec"])
    train = pd.DataFrame({"run_id": runs["run_id"],
                          "variable": [f"{train_variable(run)}/images_per_sec" for run in runs.itertuples()],
                          "value": runs["images_per_sec"].astype(float), "unit": UNITS["images_per_sec"]})
    picked = _netbench_picks(records)
    netbench = pd.DataFrame({"run_id": picked["run_id"], "variable": picked["name"],
                             "value": picked["value"].astype(float), "unit": picked["metric"].map(UNITS)})
    return pd.concat([frame for frame in (train, netbench) if not frame.empty] or [train],
                     ignore_index=True)[RECORD_VARIABLE_COLUMNS]


class ReferencesError(ValueError):
    """A references file that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Reference:
    """Expected value of one variable; tolerances are fractions of it, None for no bound."""

    reference: float
    lower: float | None
    upper: float | None
    unit: str

    @property
    def lower_bound(self) -> float | None:
        return None if self.lower is None else self.reference * (1 + self.lower)

    @property
    def upper_bound(self) -> float | None:
        return None if self.upper is None else self.reference * (1 + self.upper)

    def admits(self, value: float) -> bool:
        return ((self.lower_bound is None or value >= self.lower_bound)
                and (self.upper_bound is None or value <= self.upper_bound))


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return " ".join(f"{getattr(error, 'problem', None) or error}{where}".split())


def load_references(path: str | Path, system: str) -> dict[str, Reference]:
    """The references of `system`; ReferencesError names the first problem anywhere in the file."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ReferencesError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ReferencesError(f"{path}: not valid YAML: {_yaml_problem(error)}") from None
    import jsonschema  # here, not at the top: see config.LAZY_IMPORTS

    validator = jsonschema.Draft202012Validator(load_schema("references"))
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        raise ReferencesError(f"{path}: {describe(error)}")
    # What the schema cannot say: names follow the variables, units follow UNITS.
    for name, entries in document["systems"].items():
        for variable, entry in entries.items():
            if not VARIABLE_PATTERN.fullmatch(variable):
                raise ReferencesError(f"{path}: 'systems.{name}' has variable {variable!r}, which is not allowed; "
                                      f"allowed: {VARIABLE_FORMS}")
            if entry["unit"] != UNITS[metric_of(variable)]:
                raise ReferencesError(f"{path}: 'systems.{name}.{variable}.unit' = {entry['unit']!r} is not allowed; "
                                      f"allowed: {UNITS[metric_of(variable)]}")
    if system not in document["systems"]:
        raise ReferencesError(f"no references for system {system!r} in {path}; "
                              f"systems there: {', '.join(document['systems']) or 'none'}")
    return {variable: Reference(**entry) for variable, entry in document["systems"][system].items()}


def verdict(measured: pd.DataFrame, references: dict[str, Reference], strict: bool = False) -> pd.DataFrame:
    """Every measured or referenced variable with its result; `failed` applies `strict` to "no reference"."""
    values = dict(zip(measured["variable"], measured["value"]))
    units = dict(zip(measured["variable"], measured["unit"]))
    rows = []
    for variable in [*values, *(v for v in references if v not in values)]:
        value, reference = values.get(variable), references.get(variable)
        if reference is None:
            result = "no reference"
        elif value is None:
            result = "not measured"  # a node that cannot run a benchmark is not healthy
        else:
            result = "pass" if reference.admits(value) else "fail"
        rows.append({"variable": variable, "measured": value,
                     "reference": reference.reference if reference else None,
                     "lower_bound": reference.lower_bound if reference else None,
                     "upper_bound": reference.upper_bound if reference else None,
                     "unit": reference.unit if reference else units[variable], "result": result,
                     "failed": result in ("fail", "not measured") or (strict and result == "no reference")})
    table = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    numbers = ["measured", "reference", "lower_bound", "upper_bound"]
    table[numbers] = table[numbers].astype(object).where(table[numbers].notna(), None)  # missing: None, not NaN
    return table


def _node_rates(per_rank: list[dict]) -> dict[str, float]:
    """Each host's median rank rate: from the local compute probe when every rank ran it.

    In synchronous data-parallel training every rank waits in the allreduce for
    the slowest one, so per-rank step times converge and hide the slow node; the
    probe computes alone, without communication. Probe and training rates are
    never mixed in one run: they are not comparable.
    """
    use_probe = all(rank.get("probe_images_per_sec") is not None for rank in per_rank)
    key = "probe_images_per_sec" if use_probe else "images_per_sec"
    by_node: dict[str, list[float]] = {}
    for rank in per_rank:
        by_node.setdefault(rank["hostname"], []).append(rank[key])
    return {node: statistics.median(rates) for node, rates in sorted(by_node.items())}


def slow_nodes(records: list[dict], fraction: float = 0.10) -> pd.DataFrame:
    """Nodes of ok multi-node training runs more than `fraction` below the median of their peers."""
    rows = []
    for record in records:
        if record["kind"] != "train" or record["status"] != Status.OK:
            continue
        rates = _node_rates(record["result"].get("per_rank") or [])
        if len(rates) < 2:
            continue  # a single host has no peers to compare with
        for node, rate in rates.items():
            peers = statistics.median(r for other, r in rates.items() if other != node)
            if rate < (1 - fraction) * peers:
                rows.append({"run_id": record["run_id"], "node": node, "node_images_per_sec": rate,
                             "peers_median": peers, "shortfall_percent": 100 * (1 - rate / peers)})
    return pd.DataFrame(rows, columns=SLOW_NODE_COLUMNS)


def write_baseline(measured: pd.DataFrame, system: str, path: str | Path, lower: float | None = -0.10,
                   upper: float | None = None, source: str | None = None) -> None:
    """A references file holding every measured variable, with these tolerances."""
    entries = {}
    for variable, value, unit in zip(measured["variable"], measured["value"], measured["unit"]):
        low, high = lower, upper
        if metric_of(variable) in LOWER_IS_BETTER:  # smaller is better: the slack goes above instead
            low, high = (None if upper is None else -abs(upper)), (None if lower is None else abs(lower))
        entries[variable] = {"reference": float(f"{value:.4g}"), "lower": low, "upper": high, "unit": unit}
    written = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"# written by `containerbench baseline` on {written} from {len(entries)} performance variables "
              f"of {source or 'a good run'}; edit to suit the site\n"
              "# lower/upper: tolerance as a fraction of the reference (-0.10: at most 10% below); null: no bound\n")
    body = yaml.safe_dump({"systems": {system: entries}}, sort_keys=False, default_flow_style=None, width=1_000_000)
    outputs.write_text(path, header + body)


@dataclass
class ValidationOutcome:
    verdict: pd.DataFrame
    slow_nodes: pd.DataFrame
    problems: list[tuple[str, str]]  # (path, why) of records that could not be read
    passed: bool


def validate(record_paths, references_path: str | Path, system: str, strict: bool = False,
             slow_fraction: float = 0.10) -> ValidationOutcome:
    references = load_references(references_path, system)  # a bad file fails before any record is read
    records, problems = load_records(record_paths)
    return judge(records, references, strict, slow_fraction, problems)


def judge(records: list[dict], references: dict[str, Reference], strict: bool = False, slow_fraction: float = 0.10,
          problems: list[tuple[str, str]] | None = None) -> ValidationOutcome:
    """The verdict on records already read: every variable against its reference, and the slow nodes."""
    table = verdict(performance_variables(records), references, strict)
    slow = slow_nodes(records, slow_fraction)
    return ValidationOutcome(table, slow, problems or [], passed=not table["failed"].any() and slow.empty)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _bounds(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "any"
    if high is None:
        return f">= {low:.4g}"
    return f"<= {high:.4g}" if low is None else f"{low:.4g} .. {high:.4g}"


def format_outcome(outcome: ValidationOutcome) -> str:
    """Plain text with fixed columns, stable in logs; the last line is the verdict."""
    header = ("variable", "measured", "reference", "bounds", "unit", "result")
    cells = [(row.variable, _number(row.measured), _number(row.reference), _bounds(row.lower_bound, row.upper_bound),
              row.unit, row.result) for row in outcome.verdict.itertuples()]
    widths = [max(map(len, column)) for column in zip(header, *cells)]
    align = "<>><<<"
    lines = ["  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(line, align, widths)).rstrip()
             for line in [header, *cells]]
    lines.append("")
    for row in outcome.slow_nodes.itertuples():
        lines.append(f"slow node {row.node}: {row.node_images_per_sec:.1f} img/s, {row.shortfall_percent:.1f}% below "
                     f"the median of its peers ({row.peers_median:.1f}) in run {row.run_id}")
    if outcome.slow_nodes.empty:
        lines.append("slow nodes: none")
    lines += [f"unreadable record {path}: {why}" for path, why in outcome.problems]
    if outcome.passed:
        lines.append("VERDICT: PASS")
    else:
        results = outcome.verdict["result"]
        failed = int(results.isin(["fail", "not measured"]).sum())
        no_reference = int((results == "no reference").sum())
        lines.append(f"VERDICT: FAIL ({failed} failed, {no_reference} no reference, "
                     f"{len(outcome.slow_nodes)} slow node(s))")
    return "\n".join(lines)
