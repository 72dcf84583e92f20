"""Configuration: schema rejections give one line naming key, value and what is allowed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from helpers import tiny_config

from containerbench import config as cb_config
from containerbench import slurm
from containerbench.point import Point


@pytest.fixture(scope="module")
def default_config(root):
    with open(root / "config" / "config.yaml") as handle:
        return yaml.safe_load(handle)


def with_change(config: dict, path: str, value):
    changed = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return changed


DELETE = object()

# (change, words the one-line message must contain)
BAD_CONFIGS = [
    ("runtimes", ["dockr"], ["'runtimes[0]'", "'dockr'", "bare-metal"]),
    ("images.podman", {"mpi_model": ["hybrid", "nativ"]},
     ["'images.podman.mpi_model[1]'", "'nativ'", "hybrid, native"]),
    ("benchmark.model", "resnet51", ["'benchmark.model'", "'resnet51'", "resnet50", "vgg16"]),
    ("benchmark.precision", "fp8", ["'benchmark.precision'", "'fp8'", "mixed_float16"]),
    ("benchmark.stepz", 5, ["unknown key 'stepz'", "'benchmark'", "steps"]),
    ("benchmark.batch_sizes", [0], ["'benchmark.batch_sizes[0]'", "0", "minimum 1"]),
    ("benchmark.batch_sizes", [], ["'benchmark.batch_sizes'", "minItems 1"]),
    ("benchmark.warmup_steps", 0, ["'benchmark.warmup_steps'", "minimum 1"]),
    ("benchmark.image_size", "64", ["'benchmark.image_size'", "'64'", "integer"]),
    ("scaling.ranks_per_node", [1, 1], ["'scaling.ranks_per_node'", "uniqueItems"]),
    ("scaling.nodes", DELETE, ["'scaling'", "'nodes' is a required property"]),
    ("launcher.kind", "mpiexec", ["'launcher.kind'", "'mpiexec'", "mpirun", "srun", "none"]),
    ("fabrics.tcp-loopback.env", {"1BAD": "x"}, ["'fabrics.tcp-loopback.env'", "'1BAD'"]),
    ("fabrics.tcp-loopback.enviroment", {}, ["unknown key 'enviroment'", "env"]),
    ("colour", "blue", ["unknown key 'colour'", "the top level", "benchmark"]),
    ("netbench.max_bytes", 2, ["'netbench.max_bytes'", "minimum 4"]),
    ("benchmark.modes", ["allreduce"], ["'benchmark.modes[0]'", "'allreduce'", "horovod", "collective",
                                        "parameter_server"]),
    ("benchmark.data", ["imagenet"], ["'benchmark.data[0]'", "'imagenet'", "synthetic", "real"]),
    ("benchmark.collective_implementation", "mpi", ["'benchmark.collective_implementation'", "ring", "nccl"]),
    ("benchmark.parameter_servers", 0, ["'benchmark.parameter_servers'", "minimum 1"]),
]


@pytest.mark.parametrize("path,value,words", BAD_CONFIGS, ids=[b[0] for b in BAD_CONFIGS])
def test_bad_config_is_rejected_in_one_line(default_config, path, value, words):
    with pytest.raises(cb_config.ConfigError) as caught:
        cb_config.check(with_change(default_config, path, value))
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_default_and_site_example_configs_are_valid(root):
    for names in (["config.yaml"], ["site.example.yaml"], ["config.yaml", "full.yaml"], ["config.yaml", "native.yaml"]):
        config = cb_config.load([str(root / "config" / name) for name in names])
        assert config["benchmark"]["threads_per_rank"] == 0  # a schema default was filled in


def test_sweep_is_repetition_major_with_readable_ids(root):
    config = cb_config.load([str(root / "config" / "config.yaml")])
    runs = cb_config.plan_runs(config)
    train = [r for r in runs if r.kind == "train"]
    runtimes = ["bare-metal", "podman", "charliecloud", "docker"]
    # Every runtime's repetition 1 comes before any repetition 2: container and bare-metal runs interleave; the
    # parameter-server pair beside bare metal's Horovod point on 2 ranks (benchmark.modes_at).
    assert [r.run_id for r in train] == [
        run_id for rep in (1, 2, 3) for runtime in runtimes for n in (1, 2)
        for run_id in [f"train_{runtime}_tcp-loopback_1x{n}_b8_rep{rep}"] + (
            [f"train_bare-metal_tcp-loopback_1x2_b8_{mode}_rep{rep}" for mode in ("parameter_server",
                                                                                   "parameter_server_async")]
            if (runtime, n) == ("bare-metal", 2) else [])
    ]
    assert [r.run_id for r in runs if r.kind == "netbench"] == [
        f"netbench_{runtime}_tcp-loopback_1x2_rep1" for runtime in runtimes]


def test_site_example_sweep_crosses_fabrics_nodes_and_batches(root):
    config = cb_config.load([str(root / "config" / "site.example.yaml")])
    runs = cb_config.plan_runs(config)
    train = [r for r in runs if r.kind == "train"]
    assert len(train) == 3 * 2 * 4 * 1 * 2 * 5  # runtimes x fabrics x nodes x ranks/node x batches x repetitions
    assert {r.ranks for r in train} == {4, 8, 16, 32}
    assert {r.runtime for r in train} == {"bare-metal", "apptainer", "enroot"}
    net = [r for r in runs if r.kind == "netbench"]
    # At every node count: 2 ranks on one node, else one rank per node.
    assert {(r.fabric, r.nodes, r.ranks_per_node) for r in net} == {
        (fabric, nodes, 2 if nodes == 1 else 1) for fabric in ("infiniband", "ethernet") for nodes in (1, 2, 4, 8)}
    assert len(net) == 3 * 2 * 4 * 3  # runtimes x fabrics x node counts x repetitions


def test_launcher_none_with_several_ranks_is_rejected(root, tmp_path):
    override = tmp_path / "o.yaml"
    override.write_text("launcher: {kind: none}\n")
    config = cb_config.load([str(root / "config" / "config.yaml"), str(override)])
    with pytest.raises(cb_config.ConfigError, match=r"'launcher.kind' = 'none' runs one rank.*\[2\]"):
        cb_config.check_runs(config, cb_config.plan_runs(config))


def test_modes_and_data_sources_are_sweep_axes_with_readable_ids(root, tmp_path):
    config = tiny_config(tmp_path, benchmark={"modes": ["horovod", "parameter_server"], "data": ["synthetic", "real"]},
                         netbench={"enabled": False})
    ids = [r.run_id for r in cb_config.plan_runs(config) if r.repetition == 1 and r.ranks == 2]
    # The defaults keep the ids of earlier sweeps; the others name themselves.
    assert ids == ["train_bare-metal_tcp-loopback_1x2_b2_rep1", "train_bare-metal_tcp-loopback_1x2_b2_real_rep1",
                   "train_bare-metal_tcp-loopback_1x2_b2_parameter_server_rep1",
                   "train_bare-metal_tcp-loopback_1x2_b2_parameter_server_real_rep1"]


def test_the_default_runs_its_parameter_server_pair_at_one_small_point_beside_horovod(root):
    """benchmark.modes_at: the modes other than the baseline run bare metal on 2 ranks only, Horovod everywhere."""
    config = cb_config.load([str(root / "config" / "config.yaml")])
    runs = [r for r in cb_config.plan_runs(config) if r.kind == "train" and r.repetition == 1]
    others = {(r.mode, r.runtime, r.ranks) for r in runs if r.mode != "horovod"}
    assert others == {("parameter_server", "bare-metal", 2), ("parameter_server_async", "bare-metal", 2)}
    assert {(r.runtime, r.ranks) for r in runs if r.mode == "horovod"} == {
        (runtime, ranks) for runtime in config["runtimes"] for ranks in (1, 2)}
    cb_config.check_modes_at(config)


@pytest.mark.parametrize(("key", "value", "allowed"), [("runtimes", ["podman-hpc"], "['bare-metal', 'podman', "
                                                        "'charliecloud', 'docker']"), ("ranks", [4], "[1, 2]")])
def test_modes_at_a_point_the_sweep_lacks_is_rejected_before_any_run(root, tmp_path, key, value, allowed):
    override = tmp_path / "o.yaml"
    override.write_text(yaml.safe_dump({"benchmark": {"modes_at": {key: value}}}))
    config = cb_config.load([str(root / "config" / "config.yaml"), str(override)])
    with pytest.raises(cb_config.ConfigError) as refused:
        cb_config.check_modes_at(config)
    assert str(refused.value) == (f"config: 'benchmark.modes_at.{key}' = {value} names what the sweep does not run; "
                                  f"allowed: {allowed}")


@pytest.mark.parametrize("mode", ["parameter_server", "parameter_server_async"])
def test_more_parameter_servers_than_ranks_is_rejected_before_any_run(tmp_path, mode):
    config = tiny_config(tmp_path, benchmark={"modes": [mode], "parameter_servers": 2})
    with pytest.raises(cb_config.ConfigError,
                       match=r"'benchmark.parameter_servers' = 2 .* on \[1\] rank\(s\); allowed: at most 1"):
        cb_config.check_runs(config, cb_config.plan_runs(config))


def test_more_ranks_per_node_than_the_gpus_a_job_asks_for_is_rejected_before_any_run(tmp_path):
    # Each job asks for --gres=gpu:<gpus_per_node> (slurm.job_resources): 8 ranks on 4 GPUs would share them,
    # whatever the node holds, so the config says so before a node is asked.
    config = tiny_config(tmp_path, scaling={"nodes": [1], "ranks_per_node": [4, 8]}, slurm={"gpus_per_node": 4})
    with pytest.raises(cb_config.ConfigError, match=(
            r"^config: 'scaling.ranks_per_node' has \[8\] ranks per node, and each job asks for 'slurm.gpus_per_node' "
            r"= 4 GPUs: ranks would share a GPU; allowed: at most 4 ranks per node, one per GPU$")):
        cb_config.check_runs(config, cb_config.plan_runs(config))
    config["scaling"]["ranks_per_node"] = [4]
    cb_config.check_runs(config, cb_config.plan_runs(config))


def test_a_site_dataset_without_tfrecords_is_rejected(tmp_path):
    config = tiny_config(tmp_path, benchmark={"data": ["real"]}, dataset={"path": str(tmp_path)})
    with pytest.raises(cb_config.ConfigError, match=r"'dataset.path' = .* holds no ImageNet TFRecords"):
        cb_config.check_dataset(config)
    (tmp_path / "train-00000-of-00001").write_bytes(b"")
    cb_config.check_dataset(config)


def test_xla_with_parameter_servers_is_rejected_before_any_run(tmp_path):
    config = tiny_config(tmp_path, benchmark={"modes": ["horovod", "parameter_server", "parameter_server_async"],
                                              "xla": True})
    with pytest.raises(cb_config.ConfigError, match=r"^config: 'benchmark.xla' = true cannot run mode "
                                                    r"parameter_server, parameter_server_async \(XLA"):
        cb_config.check_runs(config, cb_config.plan_runs(config))


@pytest.mark.parametrize("name", ["config.yaml", "site.example.yaml"])
def test_defaults_are_filled_in_as_snakemakes_validate_fills_them(root, name):
    from snakemake.utils import validate

    raw = yaml.safe_load((root / "config" / name).read_text())
    theirs = copy.deepcopy(raw)
    validate(theirs, str(Path(cb_config.__file__).parent / "schemas" / "config.schema.yaml"))
    assert cb_config.validated(copy.deepcopy(raw)) == theirs


def test_config_files_that_cannot_be_read_are_refused_in_one_line(tmp_path):
    with pytest.raises(cb_config.ConfigError, match=r"^config: cannot read .*missing.yaml: No such file or directory$"):
        cb_config.load([tmp_path / "missing.yaml"])
    (tmp_path / "broken.yaml").write_text("benchmark: {steps: [\n")
    with pytest.raises(cb_config.ConfigError, match=r"^config: .*broken.yaml is not valid YAML: "):
        cb_config.load([tmp_path / "broken.yaml"])


def test_a_slurm_time_limit_inside_a_runs_own_timeout_names_the_key_that_set_it(tmp_path):
    config = tiny_config(tmp_path, slurm={"runtime_minutes": 15}, benchmark={"timeout_s": 600},
                         netbench={"timeout_s": 900})
    with pytest.raises(cb_config.ConfigError) as caught:
        slurm.check_time_limit(config)
    assert str(caught.value) == (
        "config: 'slurm.runtime_minutes' = 15 ends before 'netbench.timeout_s' = 900 s; allowed: more than "
        "15 minutes, so a hung run is recorded as failed instead of killed by Slurm")
    config["slurm"]["runtime_minutes"] = 16
    slurm.check_time_limit(config)


def test_slurm_settings_become_the_executor_plugins_resources(tmp_path):
    # Names from the SLURM resource table of Snakemake's cluster docs (docs/executing/cluster.rst,
    # "Executing on SLURM clusters": slurm_partition, slurm_account, runtime in minutes, constraint,
    # mem_mb, slurm_extra for any other sbatch flag) and snakemake-executor-plugin-slurm (qos).
    config = tiny_config(tmp_path, slurm={"partition": "gpu", "account": "proj", "qos": "normal", "constraint": "a100",
                                          "runtime_minutes": 90, "mem_mb_per_node": 64000, "gpus_per_node": 4,
                                          "cpus_per_rank": 8, "exclusive": True})
    assert slurm.job_resources(config["slurm"]) == {
        "runtime": 90, "cpus_per_task": 8, "slurm_partition": "gpu", "slurm_account": "proj", "qos": "normal",
        "constraint": "a100", "mem_mb": 64000, "slurm_extra": "--exclusive --gres=gpu:4"}
    # Only what is set: the embedded default asks for nothing but time and CPUs (exclusive is on by default).
    default = tiny_config(tmp_path)["slurm"]
    assert slurm.job_resources(default) == {"runtime": 60, "cpus_per_task": 1, "slurm_extra": "--exclusive"}


AUTO = {"repetitions": "auto", "target_ci_percent": 2}


@pytest.mark.parametrize("benchmark,message", [
    ({"repetitions": "auto"},
     "config: 'benchmark.target_ci_percent' is required with benchmark.repetitions auto; allowed: a number above 0"),
    ({**AUTO, "target_ci_percent": 0},
     "config: 'benchmark.target_ci_percent' = 0 is not allowed; allowed: exclusiveMinimum: 0"),
    ({**AUTO, "min_repetitions": 5, "max_repetitions": 4},
     "config: 'benchmark.max_repetitions' = 4 is below 'benchmark.min_repetitions' = 5; allowed: at least 5"),
    ({**AUTO, "min_repetitions": 1}, "config: 'benchmark.min_repetitions' = 1 is not allowed; allowed: minimum 2"),
    ({"repetitions": "many"},
     "config: 'benchmark.repetitions' = 'many' is not allowed; allowed: type integer minimum 1, or 'auto'"),
], ids=["no target", "target 0", "max below min", "min 1", "not a number"])
def test_bad_auto_repetitions_are_refused_in_one_line_naming_the_key(tmp_path, benchmark, message):
    with pytest.raises(cb_config.ConfigError) as caught:
        tiny_config(tmp_path, benchmark=benchmark)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_auto_repetitions_plan_every_run_up_to_the_most_and_first_the_fewest(tmp_path):
    config = tiny_config(tmp_path, benchmark={**AUTO, "max_repetitions": 5})
    assert cb_config.repetition_bounds(config["benchmark"]) == (3, 5)  # min_repetitions defaults to 3
    runs = cb_config.plan_runs(config)
    train = [r for r in runs if r.kind == "train"]
    # Still repetition-major: each point's next repetition before any point's following one.
    assert [(r.repetition, r.ranks) for r in train] == [(rep, n) for rep in range(1, 6) for n in (1, 2)]
    assert {r.point_id for r in train} == {"train_bare-metal_tcp-loopback_1x1_b2",
                                           "train_bare-metal_tcp-loopback_1x2_b2"}
    assert all(Point.id_of(r.run_id) == r.point_id for r in runs)
    first = cb_config.first_runs(config, runs)
    assert [r.run_id for r in first if r.kind == "train"] == [r.run_id for r in train if r.repetition <= 3]
    # Netbench keeps its own fixed count.
    assert [r.run_id for r in first if r.kind == "netbench"] == ["netbench_bare-metal_tcp-loopback_1x2_rep1"]


def test_numeric_repetitions_plan_as_before(tmp_path):
    config = tiny_config(tmp_path, benchmark={"repetitions": 4})
    runs = cb_config.plan_runs(config)
    assert cb_config.repetition_bounds(config["benchmark"]) == (4, 4)
    assert cb_config.first_runs(config, runs) == runs
    assert max(r.repetition for r in runs) == 4 and len(runs) == 4 * 2 + 1


@pytest.mark.parametrize("gpus_per_node, gpus", [(0, 8), (4, 8)], ids=["none asked", "more than asked"])
def test_hardware_gpus_beyond_what_the_node_jobs_ask_for_are_refused_in_one_line(tmp_path, gpus_per_node, gpus):
    # A step sees only the GPUs its job asked for (srun(1) --gres; Slurm's gres.conf(5), ConstrainDevices): a
    # hardware step counting 8 in a job of 4 would fail every node "fewer than 8".
    with pytest.raises(cb_config.ConfigError) as caught:
        tiny_config(tmp_path, slurm={"gpus_per_node": gpus_per_node}, validation={"hardware": {"gpus": gpus}})
    assert str(caught.value) == (
        f"config: 'validation.hardware.gpus' = {gpus} is more than 'slurm.gpus_per_node' ({gpus_per_node}), the GPUs "
        "the node jobs ask for and their hardware step sees; allowed: at most slurm.gpus_per_node, or null "
        "(slurm.gpus_per_node)")
    # Off, it asks nothing of them; at most as many, it is kept.
    off = tiny_config(tmp_path, slurm={"gpus_per_node": 4}, validation={"hardware": {"gpus": 8, "enabled": False}})
    assert off["validation"]["hardware"]["gpus"] == 8
    assert tiny_config(tmp_path, slurm={"gpus_per_node": 4},
                       validation={"hardware": {"gpus": 2}})["validation"]["hardware"]["gpus"] == 2
