"""The PyTorch side: the same ResNet-50 as torchvision, DDP training on 1 and 2 ranks with the same record
as TensorFlow's, and the torch.distributed netbench on 2 ranks; the framework axis of the sweep."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import tiny_config

from containerbench import config as cb_config
from containerbench.config import ConfigError
from containerbench.launch import plan
from containerbench.markers import FAILURE

# torchvision's model pages (pytorch.org/vision/stable/models/generated/torchvision.models.<name>.html),
# "num_params" of each model's IMAGENET1K_V1 weights (1000 classes).
TORCHVISION_NUM_PARAMS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "resnet152": 60_192_808,
                          "vgg16": 138_357_544}


def test_models_have_torchvisions_parameter_counts(torch_python):
    code = ("import json; from containerbench import torchmodels as t; "
            "print(json.dumps({n: [sum(p.numel() for p in t.build(n)[0].parameters()), t.build(n)[1]] "
            "for n in t.MODELS}))")
    counts = json.loads(subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True,
                                       check=True, timeout=300).stdout)
    assert {name: count for name, (count, _) in counts.items()} == TORCHVISION_NUM_PARAMS
    # This venv's torch has no importable torchvision (envs/bench-torch.txt): the plain torch.nn definitions ran.
    assert {source for _, source in counts.values()} == {"containerbench.torchmodels (torchvision's definition)"}


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_pytorch_training_record_carries_every_field(torch_runs, ranks):
    record = torch_runs[("train", ranks)]
    assert record["status"] == "ok", record["reasons"]
    result = record["result"]
    assert (result["framework"], result["mode"], result["launcher"], result["runtime"]) == (
        "pytorch", "ddp", "mpirun", "bare-metal")
    assert (result["model"], result["image_size"], result["batch_size"], result["precision"]) == ("resnet50", 32, 2, "fp32")
    assert result["parameters"] == TORCHVISION_NUM_PARAMS["resnet50"]
    assert result["distribution"]["backend"] == "gloo" and result["torch_compile"] is False
    for rank, entry in enumerate(result["per_rank"]):
        assert entry["rank"] == rank and entry["cpus"] == 1
        assert len(entry["warmup_step_s"]) == 1 and len(entry["step_s"]) == 2  # warmup kept apart
        assert entry["images_per_sec"] == pytest.approx(2 * 2 / sum(entry["step_s"]))
        assert len(entry["loss"]) == 3 and all(loss > 0 for loss in entry["loss"])
        assert entry["probe_images_per_sec"] > 0 and entry["peak_gpu_memory_bytes"] is None
        assert entry["peak_host_memory_bytes"] > 100 * 2**20
    assert result["images_per_sec"] == pytest.approx(sum(r["images_per_sec"] for r in result["per_rank"]))
    assert result["weights_identical"] is True  # DDP averaged the gradients of different batches
    assert result["batches_distinct"] is True
    assert result["versions"]["torch"] == "2.13.0+cpu" and "Open MPI" in result["versions"]["mpi"]
    assert result["provenance"]["packages"]["torch"] == "2.13.0+cpu"
    assert "tensorflow-cpu" not in result["provenance"]["packages"]
    if ranks == 2:  # Gloo's sockets were bound on the fabric's interface (tcp-loopback: lo)
        assert record["fabric_check"]["status"] == "ok", record["fabric_check"]
        assert "gloo: tcp over lo (127.0.0.1)" in record["fabric_check"]["reason"]


@pytest.mark.slow
def test_both_pytorch_rank_counts_share_one_provenance_hash(torch_runs):
    hashes = {torch_runs[("train", ranks)]["result"]["provenance"]["hash"] for ranks in (1, 2)}
    assert len(hashes) == 1 and torch_runs[("netbench", 2)]["result"]["provenance"]["hash"] in hashes


@pytest.mark.slow
def test_torch_distributed_netbench_on_two_ranks(torch_runs):
    record = torch_runs[("netbench", 2)]
    assert record["status"] == "ok", record["reasons"]
    assert record["spec"]["framework"] == "pytorch" and record["run_id"].endswith("_pytorch_rep1")
    result = record["result"]
    assert result["backend"] == "gloo" and result["distribution"]["socket_interface"] == "lo"
    assert [p["bytes"] for p in result["pingpong"]] == [2**i for i in range(17)]
    for point in result["allreduce"]:
        # nccl-tests' convention: bus bandwidth = algorithm bandwidth x 2(n-1)/n.
        assert point["algbw_GBps"] == pytest.approx(point["bytes"] / (point["time_us"] * 1e-6) / 1e9)
        assert point["busbw_GBps"] == pytest.approx(point["algbw_GBps"] * 2 * (2 - 1) / 2)
    assert record["fabric_check"]["status"] == "ok", record["fabric_check"]


def test_nccl_without_gpus_is_a_failed_run_with_its_reason(torch_python, root):
    done = subprocess.run([str(torch_python), "-m", "containerbench.torchbench", "--backend", "nccl",
                           "--image-size", "32", "--batch-size", "2", "--steps", "1", "--warmup-steps", "0"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 3
    assert f"{FAILURE}backend nccl needs GPUs and a torch built with NCCL; this rank has 0 GPU(s)" in done.stdout


# -- the framework axis, planned --------------------------------------------------------------


def test_frameworks_sweep_both_side_by_side(tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["tensorflow", "pytorch"], "modes": ["horovod", "local"]})
    runs = [r for r in cb_config.plan_runs(config) if r.repetition == 1]
    assert [r.run_id for r in runs] == [
        "train_bare-metal_tcp-loopback_1x1_b2_rep1", "train_bare-metal_tcp-loopback_1x1_b2_local_rep1",
        "train_bare-metal_tcp-loopback_1x2_b2_rep1", "train_bare-metal_tcp-loopback_1x2_b2_local_rep1",
        "train_bare-metal_tcp-loopback_1x1_b2_pytorch_rep1", "train_bare-metal_tcp-loopback_1x1_b2_pytorch_local_rep1",
        "train_bare-metal_tcp-loopback_1x2_b2_pytorch_rep1", "train_bare-metal_tcp-loopback_1x2_b2_pytorch_local_rep1",
        "netbench_bare-metal_tcp-loopback_1x2_rep1", "netbench_bare-metal_tcp-loopback_1x2_pytorch_rep1"]
    torch_train = plan(runs[6], config)
    python, module = torch_train["argv"][torch_train["argv"].index("-m") - 1:][:2], "containerbench.torchbench"
    assert python == [config["bare_metal"]["torch_python"], "-m"] and module in torch_train["argv"]
    assert torch_train["spec"]["framework"] == "pytorch" and torch_train["spec"]["torch_compile"] is False
    assert "xla" not in torch_train["spec"]
    argv = torch_train["argv"]
    assert argv[argv.index("--runtime"):][:4] == ["--runtime", "bare-metal", "--backend", "auto"]
    net = plan(runs[-1], config)["argv"]
    assert net[net.index("-m") + 1:][:5] == ["containerbench.netbench", "--max-bytes", "65536", "--backend", "torch-auto"]


def test_the_modes_of_tensorflow_are_one_ddp_point_for_pytorch(tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["pytorch"], "modes": ["horovod", "collective"]},
                         netbench={"enabled": False})
    assert {(r.framework, r.mode) for r in cb_config.plan_runs(config)} == {("pytorch", "ddp")}


@pytest.mark.parametrize("overrides, message", [
    ({"benchmark": {"model": "inception_v3"}},
     "config: 'benchmark.model' = 'inception_v3' has no PyTorch version here; allowed with frameworks pytorch: "
     "resnet50, resnet101, resnet152, vgg16, or allowed: benchmark.frameworks [tensorflow]"),
    ({"benchmark": {"data": ["synthetic", "real"]}},
     "config: 'benchmark.data' = real: the PyTorch side reads synthetic data only so far"),
    ({"runtimes": ["bare-metal", "podman"]},
     "config: 'benchmark.frameworks' has pytorch, which runs bare-metal only so far (no PyTorch image flavour yet), "
     "but runtimes has podman"),
    ({"benchmark": {"torch_backend": "nccl"}},
     "config: 'benchmark.torch_backend' = nccl needs GPUs, but slurm.gpus_per_node is 0; allowed: auto or gloo"),
])
def test_what_the_pytorch_side_cannot_run_is_refused_in_one_line(tmp_path, overrides, message):
    overrides = {**overrides, "benchmark": {"frameworks": ["tensorflow", "pytorch"], **overrides.get("benchmark", {})}}
    config = tiny_config(tmp_path, **overrides)
    with pytest.raises(ConfigError) as refused:
        cb_config.check_runs(config, cb_config.plan_runs(config))  # as launch.prepare does before any run
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_an_unknown_framework_is_refused_by_the_schema(tmp_path):
    with pytest.raises(ConfigError, match=r"benchmark\.frameworks.*'mxnet'.*tensorflow, pytorch"):
        tiny_config(tmp_path, benchmark={"frameworks": ["mxnet"]})
