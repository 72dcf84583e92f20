"""The GPU benchmark environment (benchmark_env: gpu), as far as a machine without a GPU goes.

The fast tests check how the config chooses it. The `gpu_env` tests (`make test-gpu-env`, opt-in:
they install CUDA 11.8's toolkit and build a 5 GB venv and image) build it for real: TensorFlow
with CUDA, Horovod compiled with NCCL operations (hvd.nccl_built()), the benchmark run on it, and
the GPU image built offline from the same lock with the same provenance hash. What needs a GPU
(a CUDA device, NCCL's transports) cannot run here: TensorFlow finds no GPU and runs on the CPU.
"""

import json
import subprocess
import time

import pytest
from helpers import ROOT, tiny_config

from containerbench import config as cb_config
from containerbench import images, wheelhouse
from containerbench.plans import plan_sweep
from containerbench.processes import run_group
from containerbench.rank import markers

GPU_PYTHON = ROOT / ".venv-bench-gpu" / "bin" / "python"
GPU_TAG = "localhost/containerbench:gpu-test"


def test_each_environment_has_one_lock_for_bare_metal_and_image():
    for env in cb_config.BENCH_ENVS.values():
        assert (ROOT / env.lock).is_file() and (ROOT / env.pins).is_file()
        assert wheelhouse.horovod_version(ROOT, env) == ("0.28.1" if env.framework == "tensorflow" else None)
    gpu = cb_config.BENCH_ENVS["gpu"]
    pins = (ROOT / gpu.lock).read_text()
    assert "tensorflow==2.14.1" in pins and "nvidia-nccl-cu11==2.16.5" in pins and "tensorflow-cpu" not in pins


def test_the_gpu_environment_without_its_horovod_wheel_stops_before_any_job(tmp_path):
    config = tiny_config(tmp_path, benchmark_env="gpu", runtimes=["bare-metal", "podman"])
    with pytest.raises(cb_config.ConfigError) as caught:
        plan_sweep(config, tmp_path, probe=True)  # a clone where `make gpu-env` has not run
    assert str(caught.value).splitlines() == [
        "config: 'benchmark_env' = 'gpu' builds its image with the Horovod wheel that `make gpu-env` puts in "
        "build/wheelhouse-gpu (NCCL operations, compiled by CUDA 11.8's nvcc), and there is none; allowed: run "
        "`make gpu-env` first, or benchmark_env: cpu"]


def test_the_native_model_on_the_gpu_image_is_refused_without_a_site_image(tmp_path):
    # The MPICH flavour's Horovod is compiled here without NCCL operations (make gpu-env compiles only the
    # Open MPI one): native GPU runs would average gradients through the host and look slow for it.
    config = tiny_config(tmp_path, benchmark_env="gpu", runtimes=["bare-metal", "podman"],
                         images={"podman": {"mpi_model": ["hybrid", "native"]}})
    artifacts = images.resolve_images(config, tmp_path / "build" / "images")
    with pytest.raises(cb_config.ConfigError) as caught:
        images.check_bench_env(config, tmp_path, artifacts)
    assert str(caught.value) == (
        "config: podman (native) would run the MPICH flavour of the 'gpu' image, whose Horovod the workflow can "
        "only build without NCCL operations; allowed: images.podman.native_image naming a site's MPICH-based GPU "
        "image, or mpi_model hybrid")
    config = tiny_config(tmp_path, benchmark_env="gpu", runtimes=["bare-metal", "podman"], images={
        "podman": {"mpi_model": ["hybrid", "native"], "native_image": "localhost/site-mpich:gpu"}})
    artifacts = images.resolve_images(config, tmp_path / "build" / "images")
    assert sorted(artifacts) == [("podman", "hybrid", "tensorflow")]
    with pytest.raises(cb_config.ConfigError, match="'benchmark_env' = 'gpu' builds its image with the Horovod wheel"):
        images.check_bench_env(config, tmp_path, artifacts)  # the hybrid image still needs make gpu-env's wheel


def test_the_workflow_builds_the_image_from_the_environment_it_names(tmp_path):
    from helpers import snakemake

    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("benchmark_env: gpu\nruntimes: [bare-metal]\n")  # no image to build: no wheel needed
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), str(gpu), "--dry-run",
                     "--printshellcmds", "--forceall", str(ROOT / "build" / "images" / "wheelhouse.gpu.done"),
                     images.image_files("localhost/containerbench:latest", ROOT / "build" / "images")["definition"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--env gpu --step-timeout 3600 wheelhouse" in done.stdout
    assert "--build-arg LOCK=envs/bench-gpu.lock.txt --build-arg WHEELHOUSE=build/wheelhouse-gpu" in done.stdout


gpu_env = pytest.mark.gpu_env


@gpu_env
def test_the_gpu_venv_has_cuda_tensorflow_and_horovod_with_nccl():
    check = ("import json, tensorflow as tf, horovod.tensorflow as hvd; "
             "print(json.dumps({'tf': tf.__version__, 'cuda': tf.test.is_built_with_cuda(), "
             "'cuda_version': tf.sysconfig.get_build_info()['cuda_version'], 'nccl': hvd.nccl_built(), "
             "'mpi': hvd.mpi_built(), 'gloo': hvd.gloo_built()}))")
    done = subprocess.run([str(GPU_PYTHON), "-c", check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    built = json.loads(done.stdout.splitlines()[-1])
    # nccl_built() is the NCCL version Horovod was built against: 2.16.5, the lock's nvidia-nccl-cu11.
    assert built == {"tf": "2.14.1", "cuda": True, "cuda_version": "11.8", "nccl": 21605, "mpi": True, "gloo": True}
    provenance = json.loads(subprocess.run([str(GPU_PYTHON), "-m", "containerbench.rank.provenance"],
                                           capture_output=True, text=True, timeout=300, check=True).stdout)
    assert provenance["packages"]["nvidia-nccl-cu11"] == "2.16.5" and provenance["packages"]["horovod"] == "0.28.1"


@gpu_env
def test_the_benchmark_trains_on_two_ranks_in_the_gpu_venv(tmp_path):
    # No GPU here: TensorFlow runs the same code on the CPU; Horovod averages over MPI.
    done = run_group(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl", "self,tcp",
                      "--mca", "btl_tcp_if_include", "lo", str(GPU_PYTHON), "-m", "containerbench.rank.bench",
                      "--model", "resnet50", "--image-size", "32", "--batch-size", "2", "--warmup-steps", "1",
                      "--steps", "2", "--runtime", "bare-metal"], timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [result] = markers.payloads_of(done.stdout.splitlines(), markers.RESULT)
    assert result["ranks"] == 2 and result["weights_identical"] and result["versions"]["tensorflow"] == "2.14.1"


@gpu_env
def test_the_gpu_image_builds_offline_with_nccl_and_the_venvs_provenance(tmp_path, container_engines):
    steps = [str(ROOT / ".venv" / "bin" / "python"), "-m", "containerbench", "image", "--engine", "podman",
             "--tag", GPU_TAG, "--bench-python", str(GPU_PYTHON), "--repo", str(ROOT), "--env", "gpu"]
    try:
        for step in (["wheelhouse"], ["build", "--stamp", str(tmp_path / "stamp.json")]):
            started = time.monotonic()
            done = run_group([*steps, *step], timeout=3600, env=container_engines)
            assert done.returncode == 0, done.stderr[-3000:]
            print(f"GPU image step {step[0]}: {time.monotonic() - started:.0f} s")
        stamp = json.loads((tmp_path / "stamp.json").read_text())
        host = json.loads(subprocess.run([str(GPU_PYTHON), "-m", "containerbench.rank.provenance"], capture_output=True,
                                         text=True, timeout=300, check=True).stdout)["hash"]
        assert stamp["measured_provenance"] == stamp["host_provenance"] == host  # build_image refuses otherwise
        inside = run_group(["podman", "run", "--rm", "--network", "none", GPU_TAG, "python3", "-c",
                            "import horovod.tensorflow as hvd; print(hvd.nccl_built())"],
                           timeout=600, env=container_engines)
        assert inside.returncode == 0 and inside.stdout.strip().splitlines()[-1] == "21605", inside.stderr[-2000:]
        size = run_group(["podman", "image", "inspect", "--format", "{{.Size}}", GPU_TAG], timeout=60,
                         env=container_engines)
        print(f"GPU image {GPU_TAG}: {int(size.stdout) / 1e9:.2f} GB")
    finally:  # 8 GB: not left behind
        run_group(["podman", "rmi", "--force", GPU_TAG], timeout=600, env=container_engines)
