"""The sweep point: every name it gives parses back to it, the tables' columns keep their order, and
validate's variable is spelled as the references expect."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from helpers import RECORDED_RUNS, ROOT

from containerbench import config as cb_config
from containerbench.point import Point
from containerbench.runtables import RUN_COLUMNS, runs_table, summary_table

GOLDEN_RECORDS = ROOT / "tests" / "data" / "golden" / "records"

# Names as each part came into the run ids: the first sweeps had no mode, data or MPI model in them, then
# each was named only where it is not the default; the first netbench of PyTorch, the first pinned runs.
OLDER_NAMES = {
    "train_bare-metal_tcp-loopback_1x2_b2_rep1": Point("train", "bare-metal", "tcp-loopback", 1, 2, 2),
    "train_apptainer_infiniband_8x4_b128_rep5": Point("train", "apptainer", "infiniband", 8, 4, 128),
    "netbench_bare-metal_ethernet_2x1_rep3": Point("netbench", "bare-metal", "ethernet", 2, 1),
    "train_bare-metal_tcp-loopback_1x2_b2_parameter_server_real_rep1": Point(
        "train", "bare-metal", "tcp-loopback", 1, 2, 2, mode="parameter_server", data="real"),
    "train_podman_tcp-loopback_1x2_b8_native_rep1": Point("train", "podman", "tcp-loopback", 1, 2, 8,
                                                          mpi_model="native"),
    "train_bare-metal_tcp-loopback_1x1_b2_pytorch_local_rep1": Point(
        "train", "bare-metal", "tcp-loopback", 1, 1, 2, framework="pytorch", mode="local"),
    "netbench_bare-metal_tcp-loopback_1x2_pytorch_rep1": Point("netbench", "bare-metal", "tcp-loopback", 1, 2,
                                                               framework="pytorch"),
    "netbench_charliecloud_tcp-loopback_1x2_native_rep1": Point("netbench", "charliecloud", "tcp-loopback", 1, 2,
                                                                mpi_model="native"),
    "train_bare-metal_fast_2x1_b32_on_n1+n2_rep2": Point("train", "bare-metal", "fast", 2, 1, 32,
                                                         nodelist=("n1", "n2")),
}


def recorded_run_ids() -> list[str]:
    logs = sorted(path.stem for path in RECORDED_RUNS.glob("*.log"))
    records = sorted(json.loads(path.read_text())["run_id"] for path in GOLDEN_RECORDS.glob("*.json"))
    assert logs == records and logs
    return logs


@pytest.mark.parametrize("run_id", recorded_run_ids())
def test_every_recorded_run_id_parses_and_is_named_again_the_same(run_id):
    point, repetition = Point.parse_run_id(run_id)
    assert point.run_id(repetition) == run_id
    assert Point.id_of(run_id) == point.id and Point.run_id_of(point.id, repetition) == run_id


@pytest.mark.parametrize("run_id", sorted(OLDER_NAMES))
def test_older_names_parse_with_the_defaults_they_left_out(run_id):
    point, _ = Point.parse_run_id(run_id)
    assert point == OLDER_NAMES[run_id]
    assert point.run_id(int(run_id.rsplit("_rep", 1)[1])) == run_id


@pytest.mark.parametrize("extra", [None, "frameworks.yaml", "native.yaml", "full.yaml"])
def test_every_planned_run_is_its_point_and_repetition(extra):
    config = cb_config.load([ROOT / "config" / "config.yaml", *([ROOT / "config" / extra] if extra else [])])
    runs = cb_config.plan_runs(config)
    for run in runs:
        assert Point.parse_run_id(run.run_id) == (run.point, run.repetition), run.run_id
    assert {run.point_id for run in runs} == {run.point.id for run in runs}


@pytest.mark.parametrize("name", [
    "train_x_rep1", "train_nothing_rep1", "train_bare-metal_tcp-loopback_1x2_b2",  # no shape; no repetition
    "bench_bare-metal_tcp-loopback_1x2_rep1",  # no such kind
    "train_bare-metal_tcp-loopback_1x2_b2_horovod_rep1",  # a default spelled out: no run is named so
    "train_bare-metal_tcp-loopback_1x2_b2_real_pytorch_rep1",  # the parts out of order
])
def test_a_name_no_run_has_is_refused(name):
    with pytest.raises(ValueError, match="is not a"):
        Point.parse_run_id(name)


def test_the_tables_columns_keep_their_order():
    assert Point.columns() == ["framework", "model", "image_size", "precision", "mode", "data", "runtime", "fabric",
                               "nodes", "ranks", "batch_size"]
    assert Point.columns("nodes", "ranks") == ["framework", "model", "image_size", "precision", "mode", "data",
                                               "runtime", "fabric", "batch_size"]
    assert Point.run_columns() == ["run_id", *Point.columns(), "repetition"]
    assert RUN_COLUMNS[5:5 + len(Point.COLUMNS)] == Point.columns()


def test_the_run_id_pattern_matches_every_run_of_one_repetition():
    import re

    assert Point.run_id_pattern() == r"(train|netbench)_[^/]+_rep\d+"
    assert re.fullmatch(Point.run_id_pattern(2), "train_podman_ib_2x4_b32_rep2")
    assert not re.fullmatch(Point.run_id_pattern(2), "train_podman_ib_2x4_b32_rep12")


def test_the_variable_of_a_summary_row_is_validates_name(recorded_runs):
    summary = summary_table(runs_table([recorded_runs[("train", 1)], recorded_runs[("train", 2)]]))
    names = [Point.from_row(row).variable(row.model, row.image_size, row.precision) for row in summary.itertuples()]
    assert names == ["train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x1/b2",
                     "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x2/b2"]


@pytest.mark.parametrize(("columns", "variable"), [
    ({}, "train/resnet50-224px-fp32/podman/ib/2x4/b32"),
    ({"framework": None, "mode": float("nan"), "data": None}, "train/resnet50-224px-fp32/podman/ib/2x4/b32"),
    ({"framework": "pytorch", "mode": "ddp"}, "train/resnet50-224px-fp32-pytorch/podman/ib/2x4/b32"),
    ({"framework": "pytorch", "mode": "local", "data": "real"},
     "train/resnet50-224px-fp32-pytorch-local-real/podman/ib/2x4/b32"),
    ({"mode": "parameter_server", "runtime": "podman (native)"},
     "train/resnet50-224px-fp32-parameter_server/podman (native)/ib/2x4/b32"),
])
def test_the_variable_names_what_is_not_the_default(columns, variable):
    row = SimpleNamespace(**{"framework": "tensorflow", "model": "resnet50", "image_size": 224.0, "precision": "fp32",
                             "mode": "horovod", "data": "synthetic", "runtime": "podman", "fabric": "ib",
                             "nodes": 2.0, "ranks": 8.0, "batch_size": 32.0, **columns})
    assert Point.from_row(row).variable(row.model, row.image_size, row.precision) == variable
