"""The PyTorch side: the same ResNet-50 as torchvision, DDP training on 1 and 2 ranks with the same record
as TensorFlow's, and the torch.distributed netbench on 2 ranks; the framework axis of the sweep."""

from __future__ import annotations

import json
import math
import random
import subprocess

import pytest
from helpers import ROOT, SMOKE_MODEL, TINY, measured, run_and_parse, tiny_config

from containerbench import config as cb_config
from containerbench.config import ConfigError
from containerbench.plans import plan_run
from containerbench.rank import torchbench, torchdata
from containerbench.rank.markers import FAILURE

# torchvision's model pages (pytorch.org/vision/stable/models/generated/torchvision.models.<name>.html),
# "num_params" of each model's IMAGENET1K_V1 weights (1000 classes).
TORCHVISION_NUM_PARAMS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "resnet152": 60_192_808,
                          "vgg16": 138_357_544}


def test_models_have_torchvisions_parameter_counts(torch_python):
    code = ("import json; from containerbench.rank import torchmodels as t; "
            "print(json.dumps({n: [sum(p.numel() for p in t.build(n)[0].parameters()), t.build(n)[1]] "
            "for n in t.MODELS}))")
    counts = json.loads(subprocess.run([str(torch_python), "-c", code], capture_output=True, text=True,
                                       check=True, timeout=300).stdout)
    smoke = counts.pop("cnn_smoke")
    assert {name: count for name, (count, _) in counts.items()} == TORCHVISION_NUM_PARAMS
    # This venv's torch has no importable torchvision (envs/bench-torch.txt): the plain torch.nn definitions ran.
    assert {source for _, source in counts.values()} == {"containerbench.rank.torchmodels (torchvision's definition)"}
    assert smoke[0] == SMOKE_WEIGHTS


# cnn_smoke by hand: 3x3x3x16 + 3x3x16x32 convolution weights, 2x(16+32) batch-norm scales and offsets,
# 32x1000 + 1000 classifier weights and biases.
SMOKE_WEIGHTS = 3 * 3 * 3 * 16 + 3 * 3 * 16 * 32 + 2 * (16 + 32) + 32 * 1000 + 1000


def test_the_smoke_network_has_the_same_weights_in_tensorflow(bench_python):
    code = ("import tensorflow as tf; from containerbench.rank import bench; "
            "model = bench.build_model(tf, bench.parse_args(['--model', 'cnn_smoke', '--image-size', '32']))[0]; "
            "print(sum(int(tf.size(v)) for v in model.trainable_variables))")
    done = subprocess.run([str(bench_python), "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert int(done.stdout.split()[-1]) == SMOKE_WEIGHTS == 38_136


def test_crop_windows_are_drawn_as_tensorflows_sample_distorted_bounding_box():
    """8% to 100% of the area, aspect 3/4 to 4/3 (up to rounding to whole pixels), inside the image;
    the whole image when 10 tries find no such window (datasets._parse_and_augment's arguments)."""
    rng = random.Random(0)
    for _ in range(2000):
        left, top, width, height = torchdata.crop_window(rng, 400, 300)
        assert 0 <= left <= 400 - width and 0 <= top <= 300 - height
        assert 0.08 * 0.98 <= width * height / (400 * 300) <= 1
        assert 3 / 4 * 0.97 <= width / height <= 4 / 3 * 1.03
    assert torchdata.crop_window(rng, 1, 1000) == (0, 0, 1, 1000)  # no window of that aspect fits


def test_each_rank_reads_whole_files_when_there_are_enough_else_every_nth_record():
    files = ["train-0", "train-1", "train-2"]
    assert [torchdata.share(files, rank, 2) for rank in (0, 1)] == [(["train-0", "train-2"], 0, 1),
                                                                     (["train-1"], 0, 1)]
    assert [torchdata.share(files, rank, 4) for rank in range(4)] == [(files, rank, 4) for rank in range(4)]


@pytest.mark.slow
def test_pytorch_reads_the_same_tfrecords_as_tensorflow(tmp_path, imagenet_sample, torch_python):
    """Real data at 2 ranks: each rank its own share of the sample TensorFlow reads, decoded and
    augmented in DataLoader workers; the same record as every training run."""
    config = tiny_config(tmp_path, benchmark={"frameworks": ["pytorch"], "data": ["real"], "repetitions": 1,
                                              "model": SMOKE_MODEL},
                         scaling={"nodes": [1], "ranks_per_node": [2]}, dataset={"path": str(imagenet_sample)},
                         netbench={"enabled": False})
    runs = cb_config.plan_runs(config)
    cb_config.check_runs(config, runs)
    [(spec, record)] = run_and_parse(runs, config, tmp_path, stolen_kept=True)
    assert spec.run_id.endswith("_pytorch_real_rep1") and measured(record), record["reasons"]
    result = record["result"]
    assert (result["framework"], result["data"], result["data_dir"]) == ("pytorch", "real", str(imagenet_sample))
    assert result["batches_distinct"] is True and result["weights_identical"] is True  # own data, one model
    assert all(len(rank["loss"]) == 2 + 1 for rank in result["per_rank"])
    assert "DataLoader worker(s) per rank" in (tmp_path / f"{spec.run_id}.log").read_text()


class StreamClock:
    """A GPU stream's clock as measure() uses it, in the order of use: a mark is an event queued
    behind the work so far, reading a span waits for its end event."""
    lag = torchbench.CudaClock.lag

    def __init__(self, log):
        self.log, self.marks = log, 0

    def mark(self):
        self.marks += 1
        return self.marks

    def hold(self, loss):
        self.log.append(("copy", self.marks))  # queued behind its step, before the step's end mark
        return loss

    def seconds(self, start, end, held):
        self.log.append(("wait", end))
        return 0.25


def test_on_a_gpu_the_host_reads_a_step_only_once_the_next_is_queued(capsys):
    """A per-step .item() waits for all the stream holds, so the GPU can drain every step (our loop
    ran at 0.92-0.95 of a plain DDP loop on an H200, batch 256): each step's loss is copied behind it,
    and step i's time and loss are read once step i+1 is queued; every step is still timed and printed."""
    log = []

    def step():
        log.append(("step", sum(kind == "step" for kind, _ in log)))
        return 7.0 - sum(kind == "step" for kind, _ in log) * 2

    args = torchbench.parse_args(["--warmup-steps", "2", "--steps", "3"])
    warmup, steps, _, _, losses = torchbench.measure(step, tuple, args, 0, 32, StreamClock(log))
    queued = [[("step", i), ("copy", 2 * i + 1)] for i in range(5)]
    assert log == [*queued[0], *queued[1], ("wait", 2), *queued[2], ("wait", 4), *queued[3], ("wait", 6),
                   *queued[4], ("wait", 8), ("wait", 10)]
    assert (warmup, steps) == ([0.25] * 2, [0.25] * 3)
    assert losses == [5.0, 3.0, 1.0, -1.0, -3.0]  # each step's own loss, in order
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["warmup 1/2", "warmup 2/2", "step 1/3", "step 2/3",
                                                              "step 3/3"]


def test_on_a_cpu_each_step_is_read_as_it_returns():
    log = []
    args = torchbench.parse_args(["--warmup-steps", "1", "--steps", "2"])

    def step():
        log.append("step")
        return 1.0

    class Clock(torchbench.HostClock):
        @staticmethod
        def seconds(start, end, held):
            log.append("read")
            return end - start

    warmup, steps, overhead, _, _ = torchbench.measure(step, tuple, args, 1, 32, Clock)
    assert log == ["step", "read"] * 3 and len(warmup) == 1 and len(steps) == 2 and all(t >= 0 for t in steps)


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_pytorch_training_record_carries_every_field(torch_runs, ranks):
    record = torch_runs[("train", ranks)]
    assert measured(record), record["reasons"]
    result = record["result"]
    assert (result["framework"], result["mode"], result["launcher"], result["runtime"]) == (
        "pytorch", "ddp", "mpirun", "bare-metal")
    assert ((result["model"], result["image_size"], result["batch_size"], result["precision"])
            == ("resnet50", 32, 2, "fp32"))
    assert result["parameters"] == TORCHVISION_NUM_PARAMS["resnet50"]
    assert result["distribution"]["backend"] == "gloo" and result["torch_compile"] is False
    for rank, entry in enumerate(result["per_rank"]):
        assert entry["rank"] == rank and entry["cpus"] == 1
        assert len(entry["warmup_step_s"]) == 1 and len(entry["step_s"]) == 2  # warmup kept apart
        assert entry["images_per_sec"] == pytest.approx(2 * 2 / sum(entry["step_s"]))
        # Cross-entropy is never below 0, and is 0.0 in float32 once the right class leads the others by about 17
        # (their probabilities round away): a batch of 2 seen 3 times can get there (a fresh clone's suite,
        # 2026-11-28: 6.15, 2.89, 0.0). What the record must hold is a real loss per step.
        assert len(entry["loss"]) == 3 and all(math.isfinite(loss) and loss >= 0 for loss in entry["loss"])
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
    assert measured(record), record["reasons"]
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
    done = subprocess.run([str(torch_python), "-m", "containerbench.rank.torchbench", "--backend", "nccl",
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
    torch_train = plan_run(runs[6], config)
    python, module = torch_train.argv[torch_train.argv.index("-m") - 1:][:2], "containerbench.rank.torchbench"
    assert python == [config["bare_metal"]["torch_python"], "-m"] and module in torch_train.argv
    assert torch_train.spec["framework"] == "pytorch" and torch_train.spec["torch_compile"] is False
    assert "xla" not in torch_train.spec
    argv = torch_train.argv
    assert argv[argv.index("--runtime"):][:4] == ["--runtime", "bare-metal", "--backend", "auto"]
    net = plan_run(runs[-1], config).argv
    assert net[net.index("-m") + 1:][:5] == ["containerbench.rank.netbench", "--max-bytes", "65536",
                                             "--backend", "torch-auto"]


def test_the_modes_of_tensorflow_are_one_ddp_point_for_pytorch(tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["pytorch"], "modes": ["horovod", "collective"]},
                         netbench={"enabled": False})
    assert {(r.framework, r.mode) for r in cb_config.plan_runs(config)} == {("pytorch", "ddp")}


@pytest.mark.parametrize("overrides, message", [
    ({"benchmark": {"model": "inception_v3"}},
     "config: 'benchmark.model' = 'inception_v3' has no PyTorch version here; allowed with frameworks pytorch: "
     "resnet50, resnet101, resnet152, vgg16, cnn_smoke, or benchmark.frameworks [tensorflow]"),
    ({"benchmark": {"torch_backend": "nccl"}},
     "config: 'benchmark.torch_backend' = nccl needs GPUs, but slurm.gpus_per_node is 0; allowed: auto or gloo"),
])
def test_what_the_pytorch_side_cannot_run_is_refused_in_one_line(tmp_path, overrides, message):
    overrides = {**overrides, "benchmark": {"frameworks": ["tensorflow", "pytorch"], **overrides.get("benchmark", {})}}
    config = tiny_config(tmp_path, **overrides)
    with pytest.raises(ConfigError) as refused:
        cb_config.check_runs(config, cb_config.plan_runs(config))  # as plans.plan_sweep does before any run
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_pytorch_in_a_container_runs_the_pytorch_flavour_of_the_built_image(tmp_path):
    # One image flavour per framework (containers/Dockerfile with .venv-bench-torch's lock, no Horovod): its
    # tag and files end in -torch (-torch-mpich for the native model), TensorFlow's keep their names.
    from containerbench.config import ImageUse
    from containerbench.plans import plan_sweep

    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman", "charliecloud"],
                         benchmark={"frameworks": ["tensorflow", "pytorch"]},
                         images={"podman": {"mpi_model": ["hybrid", "native"]}})
    sweep = plan_sweep(config, ROOT, probe=False)
    built = ROOT / "build" / "images"
    assert sweep.artifacts == {
        ImageUse("podman", "hybrid", "tensorflow"): f"{built}/podman-containerbench-latest.json",
        ImageUse("podman", "native", "tensorflow"): f"{built}/podman-containerbench-latest-mpich.json",
        ImageUse("podman", "hybrid", "pytorch"): f"{built}/podman-containerbench-latest-torch.json",
        ImageUse("podman", "native", "pytorch"): f"{built}/podman-containerbench-latest-torch-mpich.json",
        ImageUse("charliecloud", "hybrid", "tensorflow"): f"{built}/containerbench-latest.ch",
        ImageUse("charliecloud", "hybrid", "pytorch"): f"{built}/containerbench-latest-torch.ch"}
    for run in sweep.runs:
        argv, needs = sweep.plans[run.run_id].argv, sweep.inputs[run.run_id]
        if run.runtime == "bare-metal":
            assert "image" not in needs
            continue
        assert needs["image"] == sweep.artifacts[ImageUse.of(run)]
        image = {"podman": "localhost/containerbench:latest", "charliecloud": f"{built}/containerbench-latest.ch"}[
            run.runtime].replace("latest", "latest" + "-torch" * (run.framework == "pytorch")
                                 + "-mpich" * (run.mpi_model == "native"))
        assert image in argv, (run.run_id, argv)
        module = argv[argv.index("-m", argv.index(image)) + 1]  # the rank's, after the image (a shim's is before)
        assert module == {"train": {"tensorflow": "containerbench.rank.bench",
                                    "pytorch": "containerbench.rank.torchbench"},
                          "netbench": {"tensorflow": "containerbench.rank.netbench",
                                       "pytorch": "containerbench.rank.netbench"}}[run.kind][run.framework]


def test_a_site_pytorch_image_is_run_as_it_is_and_a_gpu_sweep_must_name_one(tmp_path):
    from containerbench.config import ImageUse
    from containerbench.images import check_bench_env, resolve_images
    from containerbench.plans import plan_sweep

    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], benchmark={"frameworks": ["pytorch"]},
                         images={"podman": {"torch_image": "localhost/site-pytorch:24.10"}})
    sweep = plan_sweep(config, ROOT, probe=False)  # a PyTorch-only sweep: no TensorFlow image is asked for
    assert sweep.artifacts == {}  # nothing to build: the site's image runs as it is
    podman = [run for run in sweep.runs if run.runtime == "podman"]
    assert podman and all("localhost/site-pytorch:24.10" in sweep.plans[run.run_id].argv for run in podman)
    bare = [run for run in sweep.runs if run.runtime == "bare-metal"]
    assert all(sweep.plans[run.run_id].argv.count(TINY["bare_metal"]["torch_python"]) for run in bare)
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], benchmark={"frameworks": ["pytorch"]})
    assert list(plan_sweep(config, ROOT, probe=False).artifacts) == [ImageUse("podman", "hybrid", "pytorch")]
    # A GPU sweep's PyTorch ranks need CUDA's torch; the built flavour has the CPU wheel of envs/bench-torch.lock.txt.
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], benchmark={"frameworks": ["pytorch"]},
                         slurm={"gpus_per_node": 1})
    artifacts = resolve_images(config, tmp_path)
    assert list(artifacts) == [ImageUse("podman", "hybrid", "pytorch")]
    with pytest.raises(ConfigError) as refused:
        check_bench_env(config, tmp_path, artifacts)
    assert str(refused.value) == (
        "config: 'images.podman.torch_image' is missing: a GPU sweep's PyTorch ranks need CUDA's torch, and the "
        "image the workflow builds has the CPU one of envs/bench-torch.lock.txt; allowed: a site's CUDA PyTorch "
        "image there (e.g. NGC's), or runtimes [bare-metal] for pytorch")


def test_an_unknown_framework_is_refused_by_the_schema(tmp_path):
    with pytest.raises(ConfigError, match=r"benchmark\.frameworks.*'mxnet'.*tensorflow, pytorch"):
        tiny_config(tmp_path, benchmark={"frameworks": ["mxnet"]})
