"""Node validation: variables from recorded real tiny runs, baselines, verdicts, slow nodes, bad references files."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import yaml

from containerbench.records import load_records
from containerbench.validate import (
    UNITS,
    VARIABLE_PATTERN,
    Reference,
    ReferencesError,
    format_outcome,
    load_references,
    performance_variables,
    slow_nodes,
    validate,
    verdict,
    write_baseline,
)

TRAIN = "train/resnet50-32px-fp32/bare-metal/tcp-loopback"
NET = "netbench/bare-metal/tcp-loopback/1x2"
ONE_RANK = f"{TRAIN}/1x1/b2/images_per_sec"


@pytest.fixture(scope="module")
def record_paths(recorded_runs, tmp_path_factory):
    directory = tmp_path_factory.mktemp("records")
    paths = []
    for record in recorded_runs.values():
        paths.append(directory / f"{record['run_id']}.json")
        paths[-1].write_text(json.dumps(record))
    return paths


@pytest.fixture
def baseline(record_paths, tmp_path):
    """A references file written from the tiny runs themselves, for the config's system `ci`."""
    records, _ = load_records(record_paths)
    path = tmp_path / "refs.yaml"
    write_baseline(performance_variables(records), "ci", path, source="the tiny runs")
    return path


def edit(path, change) -> None:
    """Apply `change` to the references of system `ci` in the file at `path`."""
    document = yaml.safe_load(path.read_text())
    change(document["systems"]["ci"])
    path.write_text(yaml.safe_dump(document))


def test_variables_of_real_runs_have_expected_names_units_and_values(recorded_runs):
    variables = performance_variables(list(recorded_runs.values())).set_index("variable")
    assert variables["unit"].to_dict() == {
        f"{TRAIN}/1x1/b2/images_per_sec": "img/s",
        f"{TRAIN}/1x2/b2/images_per_sec": "img/s",
        f"{TRAIN}/1x2/b2/scaling_efficiency": "%",  # the 1x1 point is the scaling base: no efficiency of its own
        f"{NET}/pingpong_latency_us@1": "us",
        f"{NET}/pingpong_bandwidth_MBps@65536": "MB/s",
        f"{NET}/allreduce_busbw_GBps@65536": "GB/s",
    }
    assert (variables["runs"] == 1).all() and (variables["value"] > 0).all()
    assert variables.loc[ONE_RANK, "value"] == recorded_runs[("train", 1)]["result"]["images_per_sec"]
    latency = [p["latency_us"] for p in recorded_runs[("netbench", 2)]["result"]["pingpong"] if p["bytes"] == 1]
    assert variables.loc[f"{NET}/pingpong_latency_us@1", "value"] == latency[0]


def test_each_framework_mode_data_and_netbench_backend_is_a_variable_of_its_own(recorded_runs):
    """A sweep over frameworks, modes, data or netbench backends: every point its own variable (the
    default's names unchanged), never two points' runs judged as one."""
    def variant(key, run_id, spec=None, result=None):
        record = copy.deepcopy(recorded_runs[key])
        record["run_id"] = run_id
        record["spec"].update(spec or {})
        record["result"].update(result or {})
        return record

    records = [recorded_runs[("train", 1)], recorded_runs[("netbench", 2)],
               variant(("train", 1), "t-pytorch", {"framework": "pytorch", "mode": "ddp"}),
               variant(("train", 1), "t-local", {"mode": "local"}),
               variant(("train", 1), "t-real", {"data": "real"}),
               variant(("netbench", 2), "n-gloo", result={"backend": "gloo"})]
    names = set(performance_variables(records)["variable"])
    assert {name for name in names if name.startswith("train/")} == {
        f"train/resnet50-32px-fp32{suffix}/bare-metal/tcp-loopback/1x1/b2/images_per_sec"
        for suffix in ("", "-pytorch", "-local", "-real")}
    assert {name.split("/", 1)[0] for name in names if "@" in name} == {"netbench", "netbench-gloo"}
    assert all(VARIABLE_PATTERN.fullmatch(name) for name in names), names


def test_variables_are_medians_of_ok_repetitions(recorded_runs):
    records = []
    for repetition, rate, status in [(1, 10.0, "ok"), (2, 12.0, "ok"), (3, 11.0, "ok"), (4, 99.0, "failed")]:
        record = copy.deepcopy(recorded_runs[("train", 1)])
        record["run_id"], record["spec"]["repetition"] = f"one-rep{repetition}", repetition
        record["result"]["images_per_sec"], record["status"] = rate, status
        records.append(record)
    variables = performance_variables(records).set_index("variable")
    assert list(variables.index) == [ONE_RANK]
    assert variables.loc[ONE_RANK, "value"] == 11.0 and variables.loc[ONE_RANK, "runs"] == 3


def test_baseline_validates_the_runs_it_was_written_from(record_paths, baseline):
    assert baseline.read_text().startswith("# written by `containerbench baseline` on ")
    references = load_references(baseline, "ci")
    latency = references[f"{NET}/pingpong_latency_us@1"]
    assert latency.lower is None and latency.upper == 0.10  # lower is better: bounded from above
    assert references[ONE_RANK].lower == -0.10 and references[ONE_RANK].upper is None

    outcome = validate(record_paths, baseline, "ci")
    assert outcome.passed and outcome.problems == [] and outcome.slow_nodes.empty
    assert set(outcome.verdict["result"]) == {"pass"} and len(outcome.verdict) == 6
    assert format_outcome(outcome).endswith("VERDICT: PASS")


def test_measurement_below_the_bound_fails(record_paths, baseline):
    edit(baseline, lambda refs: refs[ONE_RANK].update(reference=refs[ONE_RANK]["reference"] * 2))
    outcome = validate(record_paths, baseline, "ci")
    row = outcome.verdict.set_index("variable").loc[ONE_RANK]
    assert row["result"] == "fail" and row["measured"] < row["lower_bound"] and row["upper_bound"] is None
    assert not outcome.passed
    assert format_outcome(outcome).splitlines()[-1] == "VERDICT: FAIL (1 failed, 0 no reference, 0 slow node(s))"


def test_variable_without_reference_fails_only_when_strict(record_paths, baseline):
    edit(baseline, lambda refs: refs.pop(ONE_RANK))
    lenient = validate(record_paths, baseline, "ci")
    assert lenient.verdict.set_index("variable").loc[ONE_RANK, "result"] == "no reference"
    assert lenient.passed
    strict = validate(record_paths, baseline, "ci", strict=True)
    assert not strict.passed
    assert format_outcome(strict).splitlines()[-1] == "VERDICT: FAIL (0 failed, 1 no reference, 0 slow node(s))"


def test_referenced_variable_the_run_lacks_fails(record_paths, baseline):
    missing = f"{TRAIN}/2x1/b2/images_per_sec"
    edit(baseline, lambda refs: refs.update({missing: dict(refs[ONE_RANK])}))
    outcome = validate(record_paths, baseline, "ci")
    row = outcome.verdict.set_index("variable").loc[missing]
    assert row["result"] == "not measured" and row["measured"] is None
    assert not outcome.passed


def test_verdict_bounds_follow_the_tolerances():
    measured = pd.DataFrame([{"variable": f"{NET}/pingpong_latency_us@1", "value": 130.0,
                              "unit": UNITS["pingpong_latency_us"], "runs": 1}])
    references = {f"{NET}/pingpong_latency_us@1": Reference(100.0, None, 0.2, "us")}
    row = verdict(measured, references, strict=False).iloc[0]
    assert row["lower_bound"] is None and row["upper_bound"] == pytest.approx(120.0)
    assert row["result"] == "fail" and row["failed"]


def four_hosts(record: dict, rates: list[float], probe: str = "present") -> dict:
    """A real record as a 4-node run on n1..n4 whose ranks ran at `rates` (probe present, null or absent)."""
    copied = copy.deepcopy(record)
    copied["run_id"] = "train_four_nodes"
    copied["spec"].update(nodes=4, ranks_per_node=1, ranks=4)
    ranks = []
    for number, rate in enumerate(rates):
        rank = dict(copied["result"]["per_rank"][0], rank=number, hostname=f"n{number + 1}")
        rank.pop("probe_images_per_sec", None)
        if probe == "present":
            rank["probe_images_per_sec"] = rate  # training rates stay equal: the allreduce evens them out
        else:
            rank["images_per_sec"] = rate
            if probe == "null":
                rank["probe_images_per_sec"] = None
        ranks.append(rank)
    copied["result"]["per_rank"], copied["result"]["hostnames"] = ranks, [r["hostname"] for r in ranks]
    return copied


@pytest.mark.parametrize("probe", ["present", "null", "absent"])
def test_slow_node_is_named_from_probe_or_training_rates(recorded_runs, probe):
    slow = slow_nodes([four_hosts(recorded_runs[("train", 2)], [100, 101, 99, 70], probe)], fraction=0.10)
    assert len(slow) == 1
    row = slow.iloc[0]
    assert row["node"] == "n4" and row["run_id"] == "train_four_nodes"
    assert row["peers_median"] == 100 and row["shortfall_percent"] == pytest.approx(30.0)


def test_single_host_runs_have_no_slow_nodes(recorded_runs):
    one_host = four_hosts(recorded_runs[("train", 2)], [100, 101, 99, 70])
    for rank in one_host["result"]["per_rank"]:
        rank["hostname"] = "vm"
    assert slow_nodes([recorded_runs[("train", 2)], one_host], fraction=0.10).empty


def test_slow_node_fails_validation_and_is_named(record_paths, baseline, recorded_runs, tmp_path):
    four = tmp_path / "four.json"
    four.write_text(json.dumps(four_hosts(recorded_runs[("train", 2)], [100, 101, 99, 70])))
    outcome = validate([*record_paths, four], baseline, "ci")
    text = format_outcome(outcome)
    assert not outcome.passed
    assert ("slow node n4: 70.0 img/s, 30.0% below the median of its peers (100.0) in run train_four_nodes"
            in text)
    assert text.splitlines()[-1].endswith("1 slow node(s))")


VARIABLE = "train/resnet50-64px-fp32/bare-metal/tcp-loopback/1x1/b8/images_per_sec"


def good_references() -> dict:
    return {"systems": {"local": {
        VARIABLE: {"reference": 32.4, "lower": -0.10, "upper": None, "unit": "img/s"},
        "netbench/bare-metal/tcp-loopback/1x2/pingpong_latency_us@1": {"reference": 65.0, "lower": None,
                                                                        "upper": 0.2, "unit": "us"},
    }}}


def test_good_references_load(tmp_path):
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump(good_references()))
    references = load_references(path, "local")
    assert references[VARIABLE].lower_bound == pytest.approx(29.16) and references[VARIABLE].upper_bound is None


def set_entry(key, value):
    return lambda doc: doc["systems"]["local"][VARIABLE].__setitem__(key, value)


def rename_variable(doc):
    doc["systems"]["local"]["train/resnet50/images_per_sec"] = doc["systems"]["local"].pop(VARIABLE)


# (change to a good file, or raw text; system asked for; words the one-line message must contain)
BAD_REFERENCES = {
    "unknown key": (set_entry("tolerance", 0.1), "local", ["unknown key 'tolerance'", VARIABLE, "upper"]),
    "top-level typo": (lambda doc: doc.update(sytems=doc.pop("systems")), "local", ["unknown key 'sytems'"]),
    "bad unit": (set_entry("unit", "GB/s"), "local", [f"'systems.local.{VARIABLE}.unit' = 'GB/s'", "allowed: img/s"]),
    "positive lower": (set_entry("lower", 0.1), "local", [f"{VARIABLE}.lower' = 0.1", "maximum 0"]),
    "missing system": (lambda doc: None, "x", ["no references for system 'x'", "systems there: local"]),
    "bad variable": (rename_variable, "local", ["'train/resnet50/images_per_sec'", "allowed: train/{model}"]),
    "malformed YAML": ("systems: {local: [\n", "local", ["not valid YAML", "line 2"]),
}


@pytest.mark.parametrize("case", BAD_REFERENCES)
def test_bad_references_are_rejected_in_one_line(case, tmp_path):
    change, system, words = BAD_REFERENCES[case]
    path = tmp_path / "refs.yaml"
    if isinstance(change, str):
        path.write_text(change)
    else:
        document = good_references()
        change(document)
        path.write_text(yaml.safe_dump(document))
    with pytest.raises(ReferencesError) as raised:
        load_references(path, system)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message
    assert isinstance(raised.value, ValueError)


def test_cli_baseline_then_validate_exits_0_on_pass_1_on_fail_2_on_bad_references(recorded_runs, tmp_path, capsys):
    from containerbench.cli import main

    paths = []
    for record in recorded_runs.values():
        path = tmp_path / f"{record['run_id']}.json"
        path.write_text(json.dumps(record))
        paths.append(str(path))
    refs = tmp_path / "refs.yaml"
    assert main(["baseline", *paths, "--out", str(refs)]) == 0
    assert main(["validate", *paths, "--references", str(refs)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "VERDICT: PASS"

    raised = yaml.safe_load(refs.read_text())
    for entry in raised["systems"]["ci"].values():
        entry["reference"] *= 10 if entry["lower"] is not None else 0.1
    refs.write_text(yaml.safe_dump(raised))
    assert main(["validate", *paths, "--references", str(refs), "--out", str(tmp_path / "verdict.txt")]) == 1
    assert (tmp_path / "verdict.txt").read_text().splitlines()[-1].startswith("VERDICT: FAIL (6 failed")

    refs.write_text("systems: {ci: {bogus/name: {reference: 1, lower: -0.1, upper: null, unit: img/s}}}\n")
    assert main(["validate", *paths, "--references", str(refs)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "bogus/name" in error
