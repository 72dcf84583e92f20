"""Every distribution mode and both data sources really train on 2 ranks, and their
records say which mode, backend and data source produced the number."""

from __future__ import annotations

import json

import pytest
from helpers import SMOKE_MODEL, measured, run_and_parse, tiny_config

from containerbench import config as cb_config
from containerbench.config import RunSpec
from containerbench.execution import execute
from containerbench.plans import plan_run
from containerbench.records import WEIGHT_SPREAD_TOLERANCE, Verdict, judge_batches, judge_weights, parse_log
from containerbench.results import build_tables

pytestmark = pytest.mark.slow

BACKENDS = {"horovod": "mpi", "collective": "ring", "parameter_server": "grpc", "parameter_server_async": "grpc"}
PARAMETER_SERVERS = ("parameter_server", "parameter_server_async")


@pytest.fixture(scope="module")
def sample(imagenet_sample):
    return imagenet_sample


@pytest.fixture(scope="module")
def mode_records(tmp_path_factory, sample):
    """2 ranks, each mode x {synthetic, real}: eight real trainings."""
    workdir = tmp_path_factory.mktemp("modes")
    config = tiny_config(workdir, benchmark={"modes": list(BACKENDS),
                                             "data": ["synthetic", "real"], "collective_implementation": "ring",
                                             "repetitions": 1, "node_probe_steps": 0, "model": SMOKE_MODEL},
                         scaling={"nodes": [1], "ranks_per_node": [2]}, dataset={"path": str(sample)},
                         netbench={"enabled": False})
    runs = cb_config.plan_runs(config)
    cb_config.check_runs(config, runs)
    # Not stolen_kept: test_tables_put_modes_and_data_sources_side_by_side compares their figures.
    return {(spec.mode, spec.data): record for spec, record in run_and_parse(runs, config, workdir)}


@pytest.fixture(scope="module")
def local_records(tmp_path_factory, sample):
    """2 ranks in mode local (no gradient exchange), synthetic and real data: two real trainings."""
    workdir = tmp_path_factory.mktemp("local")
    # ResNet-50: in 3 steps the smoke network's ranks drift apart by less than the margin asserted below.
    config = tiny_config(workdir, benchmark={"modes": ["local"], "data": ["synthetic", "real"], "repetitions": 1,
                                             "node_probe_steps": 0},
                         scaling={"nodes": [1], "ranks_per_node": [2]}, dataset={"path": str(sample)},
                         netbench={"enabled": False})
    runs = cb_config.plan_runs(config)
    cb_config.check_runs(config, runs)
    return {spec.data: record for spec, record in run_and_parse(runs, config, workdir, stolen_kept=True)}


def test_generator_writes_imagenet_shaped_shards(sample):
    manifest = json.loads((sample / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [f"train-{i:05d}-of-00003" for i in range(3)]
    assert manifest["images"] == 24 and all(size > 24 * 100 // 3 for size in manifest["files"].values())


@pytest.mark.parametrize("mode", sorted(BACKENDS))
@pytest.mark.parametrize("data", ["synthetic", "real"])
def test_each_mode_trains_on_two_ranks_and_says_so(mode_records, sample, mode, data):
    record = mode_records[(mode, data)]
    assert measured(record), (record["reasons"], record["evidence"])
    result = record["result"]
    assert (result["mode"], result["data"], result["ranks"]) == (mode, data, 2)
    assert result["distribution"]["backend"] == BACKENDS[mode]
    assert result["data_dir"] == (str(sample) if data == "real" else None)
    assert result["images_per_sec"] > 0 and len(result["processes"]) == 2
    # The run id and the plan carry the variant, so tables group by it.
    assert record["spec"]["mode"] == mode and record["spec"]["data"] == data
    if mode in PARAMETER_SERVERS:
        # One copy of the weights, on the servers; the coordinator times rounds of one batch per worker.
        assert [r["rank"] for r in result["per_rank"]] == [0]
        assert result["distribution"]["parameter_server_ranks"] == [0]
        assert len(result["distribution"]["cluster"]["worker"]) == 2
        assert result["distribution"]["synchronous_rounds"] is (mode == "parameter_server")
    else:
        # Each rank trained on its own batch; identical weights prove the gradients were averaged.
        assert [r["rank"] for r in result["per_rank"]] == [0, 1] and result["weights_identical"] is True
    if mode != "horovod":
        # Gradients went over gRPC, bound on the fabric's interface (lo): verified beside MPI's lines.
        assert result["distribution"]["cluster"]["worker"][0].startswith("127.0.0.1:")
        assert record["fabric_check"]["status"] == "ok"
        assert record["fabric_check"]["reason"].endswith("; grpc: tcp over lo (127.0.0.1)")


def test_tables_put_modes_and_data_sources_side_by_side(mode_records):
    tables = build_tables(list(mode_records.values()))
    modes = tables["modes"]
    assert sorted(modes["mode"]) == sorted(["collective", *PARAMETER_SERVERS] * 2)
    assert (modes["ratio_to_baseline_of_means"] > 0).all() and modes["note"].isna().all()
    # Asynchronous against synchronous rounds at each data source: throughput and what it cost in learning.
    against = modes[modes["mode"] == "parameter_server_async"]
    assert (against["sync_mode"] == "parameter_server").all() and (against["ratio_to_sync_of_means"] > 0).all()
    assert against[["mode_loss_at_equal_images", "sync_loss_at_equal_images", "mode_staleness_mean",
                    "sync_staleness_mean"]].notna().all().all()
    inputs = tables["input"]
    assert sorted(inputs["mode"]) == sorted(BACKENDS) and inputs["input_overhead_percent_of_means"].notna().all()


@pytest.mark.parametrize("data", ["synthetic", "real"])
def test_local_ranks_train_alone_and_the_weight_checksum_sees_them_drift_apart(local_records, data):
    """No gradient exchange, each rank its own batches, the same start: the ranks' weights must differ,
    and in this mode that is the expected, valid outcome."""
    record = local_records[data]
    assert measured(record), (record["reasons"], record["evidence"])
    result = record["result"]
    assert (result["mode"], result["data"], result["ranks"]) == ("local", data, 2)
    assert result["distribution"]["backend"] == "none: no gradient exchange"
    assert [r["rank"] for r in result["per_rank"]] == [0, 1] and result["images_per_sec"] > 0
    assert result["weights_identical"] is False
    assert len({r["weights"]["sha256"] for r in result["per_rank"]}) == 2
    # Real divergence, orders of magnitude past the rounding the averaging modes are allowed.
    assert result["weights_max_relative_spread"] > 1000 * WEIGHT_SPREAD_TOLERANCE


@pytest.mark.parametrize("mode", ["horovod", "collective"])
@pytest.mark.parametrize("data", ["synthetic", "real"])
def test_every_rank_trains_on_its_own_batches(mode_records, local_records, mode, data):
    """Data parallel means different data per rank: synthetic batches by a seed per rank, real ones
    by a shard per rank; the per-rank digests show it, beside the weights averaging made identical."""
    result = mode_records[(mode, data)]["result"]
    digests = [r["batch_digest"] for r in result["per_rank"]]
    assert len(digests) == 2 and digests[0]["images"] != digests[1]["images"] and result["batches_distinct"] is True
    assert result["weights_identical"] is True and result["weights_max_relative_spread"] <= WEIGHT_SPREAD_TOLERANCE
    local = local_records[data]["result"]
    assert local["batches_distinct"] is True
    assert local["per_rank"][0]["batch_digest"] != local["per_rank"][1]["batch_digest"]


def test_the_checksum_rules_judge_the_real_weights_of_each_mode(mode_records, local_records):
    """The parser's rules applied to real results: horovod's identical weights pass and local's diverged
    ones pass, each in its own mode; local ranks that end identical, or ranks sharing a batch, do not.
    (The last two are this run's own per-rank parts taken twice: no 2-rank run here makes them.)"""
    horovod, local = mode_records[("horovod", "synthetic")]["result"], local_records["synthetic"]["result"]
    for result in (horovod, local):
        verdict = Verdict()
        judge_weights(result, verdict)
        judge_batches(result, verdict)
        assert verdict.ok, verdict.reasons
    twice = {**local, "per_rank": [local["per_rank"][0], {**local["per_rank"][0], "rank": 1}],
             "weights_identical": True, "weights_max_relative_spread": 0.0}
    verdict = Verdict()
    judge_weights(twice, verdict)
    assert verdict.status == "invalid" and verdict.reasons[0].startswith("mode local, yet the ranks ended with the "
                                                                         "same weights")
    verdict = Verdict()
    judge_batches(twice, verdict)
    digest = local["per_rank"][0]["batch_digest"]["images"]
    assert verdict.status == "invalid" and f"ranks 0 and 1 trained on the same batch (images digest {digest}" \
        in verdict.reasons[0]


@pytest.mark.parametrize("data", ["synthetic", "real"])
def test_parameter_servers_count_each_updates_staleness_and_every_worker_reads_one_model(mode_records, data):
    """Both parameter-server modes train as many images, (warmup + steps) x workers batches; each update's staleness
    is counted on the servers (in joined rounds of 2 workers at most 1), the final weights' loss is taken on one
    fixed batch, and every worker reads the servers' weights as the coordinator does. A record with a worker's read
    missing is invalid: one model is then not shown."""
    trained = {mode_records[(mode, data)]["result"]["updates"]["images_trained"] for mode in PARAMETER_SERVERS}
    assert len(trained) == 1, trained
    for mode in PARAMETER_SERVERS:
        result = mode_records[(mode, data)]["result"]
        updates, [coordinator] = result["updates"], result["per_rank"]
        assert updates["measured_updates"] == result["steps"] * 2 == sum(updates["staleness_counts"].values())
        # Asynchronous: the steps as the workers completed them, not as the coordinator read them behind them.
        assert len(coordinator["step_s"]) == result["steps"] and sum(coordinator["step_s"]) > 0
        assert ("step_s_read" in coordinator) is (mode == "parameter_server_async")
        assert updates["loss_at_equal_images"] > 0
        assert [read["worker"] for read in updates["worker_weights"]] == [0, 1]
        assert result["weights_max_relative_spread"] <= WEIGHT_SPREAD_TOLERANCE
        assert updates["coordinator_weights"]["sum"] == pytest.approx(coordinator["weights"]["sum"], rel=1e-9)
        verdict = Verdict()
        judge_weights(result, verdict)
        assert verdict.ok, verdict.reasons
        one_read = {**result, "updates": {**updates, "worker_weights": updates["worker_weights"][:1]}}
        judge_weights(one_read, verdict)
        assert verdict.status == "invalid" and verdict.reasons == [
            "1 of 2 workers read the parameter servers' weights at the end: that they trained one model is not shown"]
    # A round is joined before the next is scheduled: no update of 2 workers' rounds is more than 1 version behind.
    rounds = mode_records[("parameter_server", data)]["result"]["updates"]
    assert rounds["staleness_max"] <= 1 and set(rounds["staleness_counts"]) <= {"0", "1"}, rounds


def test_a_mode_the_run_cannot_do_is_a_failed_record_with_its_reason(tmp_path):
    """Three parameter servers on one rank: the run fails with the reason, nothing else is lost."""
    config = tiny_config(tmp_path, benchmark={"parameter_servers": 3})
    spec = RunSpec("train", "bare-metal", "tcp-loopback", 1, 1, 1, 2, "parameter_server", "synthetic")
    log = tmp_path / "ps.log"
    assert execute(plan_run(spec, config), log, echo=None) == 3
    record = parse_log(log)
    assert record["status"] == "failed"
    assert "3 parameter servers need as many ranks; this run has 1" in record["reasons"]
