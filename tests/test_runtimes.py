"""Container runtimes: the exact argv and environment of one rank, the rankexec shim, the factory.

No container binary is needed: argv lists are compared word for word, and the
shim is run for real with a harmless program in place of docker.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import ROOT, example_request

from containerbench.config import RunSpec
from containerbench.launchers import Mpirun, Srun
from containerbench.runtimes import (
    Apptainer,
    BareMetal,
    BuiltImage,
    Charliecloud,
    Docker,
    Enroot,
    NativeMpi,
    Podman,
    PodmanHPC,
    RunRequest,
    Sarus,
    Shifter,
    Singularity,
    runtime_for,
)

HOST_PY = "/venv/bin/python"  # the workflow's interpreter, which runs the rankexec shim on the node
BENCH_ARGS = ("--model", "resnet50", "--batch-size", "64")
IN_IMAGE = ["python3", "-m", "containerbench.rank.bench", *BENCH_ARGS]

# (a) a GPU + InfiniBand rank of the example site, (b) a CPU rank on one machine.
SITE_ENV = {"PYTHONUNBUFFERED": "1", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "UCX_TLS": "rc,sm,self", "OMPI_MCA_pml": "ucx"}
SITE = RunRequest(module="containerbench.rank.bench", args=BENCH_ARGS, env=SITE_ENV,
                  workdir="/scratch/proj/containerbench", gpus=True, binds=("/datasets/imagenet",), infiniband=True)
CPU_ENV = {"OMPI_MCA_btl": "self,tcp", "NCCL_SOCKET_IFNAME": "lo"}
CPU = RunRequest(module="containerbench.rank.bench", args=BENCH_ARGS, env=CPU_ENV, workdir="/work/x")

WD = "/scratch/proj/containerbench"
PASS_RANK_VARS = ["--pass-prefix", "OMPI_", "--pass-prefix", "PMIX_", "--pass-prefix", "PMI_",
                  "--pass-prefix", "SLURM_", "--pass-prefix", "HYDRA_",
                  "--pass-prefix", "MPI_LOCALRANKID", "--pass-prefix", "MPI_LOCALNRANKS"]
PODMAN_RANK_VARS = ["--env", "OMPI_*", "--env", "PMIX_*", "--env", "PMI_*", "--env", "SLURM_*", "--env", "HYDRA_*",
                    "--env", "MPI_LOCALRANKID", "--env", "MPI_LOCALNRANKS"]
HOST_NS = ["--rm", "--network", "host", "--ipc", "host", "--pid", "host"]
RDMA = ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
SITE_VOLUMES = ["--volume", f"{WD}:{WD}", "--volume", "/datasets/imagenet:/datasets/imagenet"]
SITE_OWN_ENV = ["--env", "CONTAINERBENCH_RUNTIME", "--env", "NCCL_IB_HCA", "--env", "PYTHONNOUSERSITE",
                "--env", "PYTHONUNBUFFERED", "--env", "UCX_TLS"]
CPU_OWN_ENV = ["--env", "CONTAINERBENCH_RUNTIME", "--env", "NCCL_SOCKET_IFNAME", "--env", "PYTHONNOUSERSITE"]
NO_GPU = ["--env", "NVIDIA_VISIBLE_DEVICES=void"]
# keep-id: each rank's own user namespace; UCX shares posix shm by file name (openucx/ucx#4224).
PODMAN_SITE_ENV = ["--env", "CONTAINERBENCH_RUNTIME", "--env", "NCCL_IB_HCA", "--env", "PYTHONNOUSERSITE",
                   "--env", "PYTHONUNBUFFERED", "--env", "UCX_POSIX_USE_PROC_LINK", "--env", "UCX_TLS"]
PODMAN_CPU_ENV = [*CPU_OWN_ENV, "--env", "UCX_POSIX_USE_PROC_LINK"]
# podman-hpc's openmpi-pmix module's binds and variables, without its --privileged.
HPC_SLURM = ["--volume", "/var/spool/slurmd:/var/spool/slurmd", "--volume", "/run/munge:/run/munge"]
HPC_RANK_VARS = [*PODMAN_RANK_VARS, "--env", "SLURMD_*"]


def container_env(name: str, base: dict, gds: bool = True) -> dict:
    return {"CONTAINERBENCH_RUNTIME": name, **base, "PYTHONNOUSERSITE": "1",
            **({"PMIX_MCA_gds": "hash"} if gds else {})}


def under_srun(runtime):
    """podman-hpc binds slurmd's spool and munge only under srun."""
    runtime.launcher = "srun"
    return runtime


def native(runtime):
    """Shifter and Sarus are shown in the native MPI model (their mpich module, their MPI hook)."""
    runtime.mpi_model = "native"
    return runtime


def native_env(name: str, base: dict) -> dict:
    """A native rank's: also the variable the launch sets to the host MPI closure's names (hostmpi.py), and mpi4py's
    MPI4PY_LIBMPI, the ABI's name for the loader to find (mpi4py 4.1.2 src/mpi4py/_mpiabi.py, _get_mpiabi)."""
    return {**container_env(name, base), "CONTAINERBENCH_HOST_MPI_LIBS": "", "MPI4PY_LIBMPI": "libmpi.so.12"}


def podman_env(name: str, base: dict) -> dict:
    return {**container_env(name, base), "UCX_POSIX_USE_PROC_LINK": "n"}


def podman_hpc_env(base: dict) -> dict:
    # For podman-hpc's fuse-overlayfs-wrap on the host, which podman starts with its environment: its waiter
    # tries to unmount the image's squashfuse UMOUNT_WAIT_RETRIES times, 1 s apart (1.2.2 bin/fuse-overlayfs-wrap,
    # `wait`); not passed into the container.
    return {**podman_env("podman-hpc", base), "UMOUNT_WAIT_RETRIES": "3600"}


PODMAN_SHIM = [HOST_PY, "-m", "containerbench.rank.rankexec", "--label-client", "--insert-after", "run", "--"]

RUNTIMES = {
    "docker": lambda: Docker("containerbench:latest", uid=1000, gid=1000, host_python=HOST_PY),
    "podman": lambda: Podman("containerbench:latest", uid=1000, gid=1000, oci_runtime="runc", host_python=HOST_PY),
    "podman-hpc": lambda: under_srun(PodmanHPC("containerbench:latest", uid=1000, gid=1000)),
    "apptainer": lambda: Apptainer("/images/containerbench.sif", host_python=HOST_PY),
    "singularity": lambda: Singularity("/images/containerbench.sif", host_python=HOST_PY),
    "shifter": lambda: native(Shifter("id:0123abcd", host_python=HOST_PY)),
    "charliecloud": lambda: Charliecloud("/images/containerbench.sqfs", write_fake=True),
    "enroot": lambda: Enroot("/images/containerbench.sqsh"),
    "sarus": lambda: native(Sarus("containerbench:latest", host_python=HOST_PY)),
}

CASES = {
    # --- docker: the shim adds the rank variables after `run` at rank start ---
    ("docker", "site"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", *PASS_RANK_VARS,
         "--cpuset-from-affinity", "--memory-from-cgroup", "--memory-share=1", "--label-client", "--",
         "docker", "run", *HOST_NS, "--user", "1000:1000", "--log-driver", "none", "--gpus", "all", *RDMA,
         "--volume", "/tmp:/tmp", *SITE_VOLUMES, "--workdir", WD, *SITE_OWN_ENV, "containerbench:latest", *IN_IMAGE],
        container_env("docker", SITE_ENV)),
    ("docker", "cpu"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", *PASS_RANK_VARS,
         "--cpuset-from-affinity", "--memory-from-cgroup", "--memory-share=1", "--label-client", "--",
         "docker", "run", *HOST_NS, "--user", "1000:1000", "--log-driver", "none", *NO_GPU,
         "--volume", "/tmp:/tmp", "--volume", "/work/x:/work/x", "--workdir", "/work/x", *CPU_OWN_ENV,
         "containerbench:latest", *IN_IMAGE],
        container_env("docker", CPU_ENV)),
    # --- podman: wildcards instead of the shim's variables (it labels the container with its client, as docker's,
    # since conmon keeps it running when the client is killed); rootless keep-id; CDI GPUs ---
    ("podman", "site"): (
        [*PODMAN_SHIM, "podman", "--runtime=runc", "run", *HOST_NS, "--userns", "keep-id", "--user", "1000:1000",
         "--log-driver", "none", "--device", "nvidia.com/gpu=all", *RDMA,
         "--volume", "/tmp:/tmp", "--volume", "/dev/shm:/dev/shm", *SITE_VOLUMES, "--workdir", WD,
         *PODMAN_RANK_VARS, *PODMAN_SITE_ENV, "containerbench:latest", *IN_IMAGE],
        podman_env("podman", SITE_ENV)),
    ("podman", "cpu"): (
        [*PODMAN_SHIM, "podman", "--runtime=runc", "run", *HOST_NS, "--userns", "keep-id", "--user", "1000:1000",
         "--log-driver", "none", *NO_GPU, "--volume", "/tmp:/tmp", "--volume", "/dev/shm:/dev/shm",
         "--volume", "/work/x:/work/x", "--workdir", "/work/x", *PODMAN_RANK_VARS, *PODMAN_CPU_ENV,
         "containerbench:latest", *IN_IMAGE],
        podman_env("podman", CPU_ENV)),
    # podman-hpc 1.2.2 podman_hpc.py, shared_run's help: "the recommended way to launch a container from a
    # parallel launcher such as Slurm srun or mpirun" (one container per node, each rank an exec into it).
    ("podman-hpc", "site"): (
        ["podman-hpc", "shared-run", *HOST_NS, "--userns", "keep-id", "--user", "1000:1000", "--log-driver", "none",
         "--gpu", *RDMA, "--volume", "/tmp:/tmp", "--volume", "/dev/shm:/dev/shm", *HPC_SLURM,
         "--volume", "/etc/libibverbs.d:/etc/libibverbs.d", *SITE_VOLUMES, "--workdir", WD,
         *HPC_RANK_VARS, *PODMAN_SITE_ENV, "containerbench:latest", *IN_IMAGE],
        podman_hpc_env(SITE_ENV)),
    ("podman-hpc", "cpu"): (
        ["podman-hpc", "shared-run", *HOST_NS, "--userns", "keep-id", "--user", "1000:1000", "--log-driver", "none",
         *NO_GPU, "--volume", "/tmp:/tmp", "--volume", "/dev/shm:/dev/shm", *HPC_SLURM,
         "--volume", "/work/x:/work/x", "--workdir", "/work/x", *HPC_RANK_VARS, *PODMAN_CPU_ENV,
         "containerbench:latest", *IN_IMAGE],
        podman_hpc_env(CPU_ENV)),
    # --- apptainer/singularity: --cleanenv, variables through APPTAINERENV_/SINGULARITYENV_ ---
    ("apptainer", "site"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-prefix", "APPTAINERENV_", *PASS_RANK_VARS,
         "--pass-prefix", "CUDA_VISIBLE_DEVICES", "--",
         "apptainer", "exec", "--cleanenv", "--nv", "--bind", WD, "--bind", "/datasets/imagenet", "--pwd", WD,
         "/images/containerbench.sif", *IN_IMAGE],
        {"APPTAINERENV_" + k: v
         for k, v in container_env("apptainer", {**SITE_ENV, "UCX_TLS": "rc,sysv,self"}).items()}),
    ("apptainer", "cpu"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-prefix", "APPTAINERENV_", *PASS_RANK_VARS,
         "--pass-prefix", "CUDA_VISIBLE_DEVICES", "--",
         "apptainer", "exec", "--cleanenv", "--bind", "/work/x", "--pwd", "/work/x",
         "/images/containerbench.sif", *IN_IMAGE],
        {"APPTAINERENV_" + k: v for k, v in container_env("apptainer", CPU_ENV).items()}),
    ("singularity", "site"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-prefix", "SINGULARITYENV_", *PASS_RANK_VARS,
         "--pass-prefix", "CUDA_VISIBLE_DEVICES", "--",
         "singularity", "exec", "--cleanenv", "--nv", "--bind", WD, "--bind", "/datasets/imagenet", "--pwd", WD,
         "/images/containerbench.sif", *IN_IMAGE],
        {"SINGULARITYENV_" + k: v
         for k, v in container_env("singularity", {**SITE_ENV, "UCX_TLS": "rc,sysv,self"}).items()}),
    ("singularity", "cpu"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-prefix", "SINGULARITYENV_", *PASS_RANK_VARS,
         "--pass-prefix", "CUDA_VISIBLE_DEVICES", "--",
         "singularity", "exec", "--cleanenv", "--bind", "/work/x", "--pwd", "/work/x",
         "/images/containerbench.sif", *IN_IMAGE],
        {"SINGULARITYENV_" + k: v for k, v in container_env("singularity", CPU_ENV).items()}),
    # --- shifter (no launcher here: the image, modules and volumes go on the shifter command) ---
    ("shifter", "site"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-form", "value", "--insert-after", "shifter",
         *PASS_RANK_VARS, "--pass-prefix", "CUDA_VISIBLE_DEVICES",
         "--pass-name", "CONTAINERBENCH_HOST_MPI_LIBS", "--pass-name", "CONTAINERBENCH_RUNTIME",
         "--pass-name", "MPI4PY_LIBMPI",
         "--pass-name", "NCCL_IB_HCA", "--pass-name", "PYTHONNOUSERSITE",
         "--pass-name", "PYTHONUNBUFFERED", "--pass-name", "UCX_TLS", "--",
         "shifter", "--clearenv", "--image=id:0123abcd", "--module=gpu,mpich", "--volume=/datasets/imagenet:/mnt",
         "--workdir=/", "--", *IN_IMAGE],
        native_env("shifter", SITE_ENV)),
    ("shifter", "cpu"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--env-form", "value", "--insert-after", "shifter",
         *PASS_RANK_VARS, "--pass-prefix", "CUDA_VISIBLE_DEVICES",
         "--pass-name", "CONTAINERBENCH_HOST_MPI_LIBS", "--pass-name", "CONTAINERBENCH_RUNTIME",
         "--pass-name", "MPI4PY_LIBMPI",
         "--pass-name", "NCCL_SOCKET_IFNAME",
         "--pass-name", "PYTHONNOUSERSITE",
         "--", "shifter", "--clearenv", "--image=id:0123abcd", "--module=mpich", "--workdir=/", "--", *IN_IMAGE],
        native_env("shifter", CPU_ENV)),
    # --- charliecloud: keep only what is needed, then the image's ENV ---
    ("charliecloud", "site"): (
        ["ch-run", "--join",
         "--unset-env=!(OMPI_*|PMIX_*|PMI_*|SLURM_*|HYDRA_*|MPI_LOCALRANKID|MPI_LOCALNRANKS|CUDA_VISIBLE_DEVICES|HOME"
         "|CONTAINERBENCH_RUNTIME|NCCL_IB_HCA|PYTHONNOUSERSITE|PYTHONUNBUFFERED|UCX_TLS)",
         "--set-env", "--write-fake", f"--bind={WD}", "--bind=/datasets/imagenet", f"--cd={WD}",
         "/images/containerbench.sqfs", "--", *IN_IMAGE],
        container_env("charliecloud", SITE_ENV)),
    ("charliecloud", "cpu"): (
        ["ch-run", "--join",
         "--unset-env=!(OMPI_*|PMIX_*|PMI_*|SLURM_*|HYDRA_*|MPI_LOCALRANKID|MPI_LOCALNRANKS|CUDA_VISIBLE_DEVICES|HOME"
         "|CONTAINERBENCH_RUNTIME|NCCL_SOCKET_IFNAME|PYTHONNOUSERSITE)",
         "--set-env", "--write-fake", "--bind=/work/x", "--cd=/work/x", "/images/containerbench.sqfs", "--", *IN_IMAGE],
        container_env("charliecloud", CPU_ENV)),
    # --- enroot: the image's Python is the rank argv; Pyxis options go to srun ---
    ("enroot", "site"): (
        IN_IMAGE,
        {**container_env("enroot", SITE_ENV, gds=False), "NVIDIA_VISIBLE_DEVICES": "all",
         "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "MELLANOX_VISIBLE_DEVICES": "all"}),
    ("enroot", "cpu"): (IN_IMAGE, {**container_env("enroot", CPU_ENV, gds=False), "NVIDIA_VISIBLE_DEVICES": "void"}),
    # --- sarus: --env NAME so the benchmark's values win; RDMA devices added on the node ---
    ("sarus", "site"): (
        [HOST_PY, "-m", "containerbench.rank.rankexec", "--device-glob", "/dev/infiniband/rdma_cm",
         "--device-glob", "/dev/infiniband/uverbs*", "--",
         "sarus", "run", "--mpi", f"--mount=type=bind,source={WD},destination={WD}",
         "--mount=type=bind,source=/datasets/imagenet,destination=/datasets/imagenet", f"--workdir={WD}",
         "--env", "CONTAINERBENCH_HOST_MPI_LIBS", "--env", "CONTAINERBENCH_RUNTIME", "--env", "MPI4PY_LIBMPI",
         "--env", "NCCL_IB_HCA",
         "--env", "OMPI_MCA_pml", "--env", "PMIX_MCA_gds",
         "--env", "PYTHONNOUSERSITE", "--env", "PYTHONUNBUFFERED", "--env", "UCX_TLS",
         "containerbench:latest", *IN_IMAGE],
        native_env("sarus", SITE_ENV)),
    ("sarus", "cpu"): (
        ["sarus", "run", "--mpi", "--mount=type=bind,source=/work/x,destination=/work/x", "--workdir=/work/x",
         "--env", "CONTAINERBENCH_HOST_MPI_LIBS", "--env", "CONTAINERBENCH_RUNTIME", "--env", "MPI4PY_LIBMPI",
         "--env", "NCCL_SOCKET_IFNAME",
         "--env", "OMPI_MCA_btl",
         "--env", "PMIX_MCA_gds", "--env", "PYTHONNOUSERSITE", "containerbench:latest", *IN_IMAGE],
        native_env("sarus", CPU_ENV)),
}
REQUESTS = {"site": SITE, "cpu": CPU}


@pytest.mark.parametrize("name, kind", sorted(CASES), ids=[f"{n}-{k}" for n, k in sorted(CASES)])
def test_rank_argv_and_environment_are_exact(name, kind):
    runtime, (argv, env) = RUNTIMES[name](), CASES[(name, kind)]
    assert runtime.rank_argv(REQUESTS[kind]) == argv
    assert runtime.environment(REQUESTS[kind]) == env


def test_every_runtime_has_both_cases():
    assert {name for name, _ in CASES} == set(RUNTIMES)


def test_enroot_contributes_the_pyxis_options_and_requires_srun():
    enroot = RUNTIMES["enroot"]()
    assert enroot.requires_launcher == "srun"
    assert enroot.launcher_options(SITE) == [
        "--container-image=/images/containerbench.sqsh",
        f"--container-mounts={WD}:{WD},/datasets/imagenet:/datasets/imagenet",
        f"--container-workdir={WD}",
        "--container-env=CONTAINERBENCH_RUNTIME,MELLANOX_VISIBLE_DEVICES,NCCL_IB_HCA,NVIDIA_DRIVER_CAPABILITIES,"
        "NVIDIA_VISIBLE_DEVICES,OMPI_MCA_pml,PYTHONNOUSERSITE,PYTHONUNBUFFERED,UCX_TLS",
    ]
    enroot.check_launcher("srun")
    with pytest.raises(ValueError) as error:
        enroot.check_launcher("mpirun")
    assert str(error.value) == "runtime 'enroot' needs launcher 'srun', not 'mpirun'"
    # The srun launcher inserts its extra args right before the rank argv: that is where they belong.
    spec = RunSpec("train", "enroot", "infiniband", 2, 4, 1, 64)
    argv = Srun("pmix", "socket", enroot.launcher_options(SITE)).wrap(enroot.rank_argv(SITE), spec, [])
    assert argv == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=1",
                    "--cpu-bind=sockets",
                    "--export=ALL", *enroot.launcher_options(SITE), *IN_IMAGE]


@pytest.mark.parametrize("name", sorted(set(RUNTIMES) - {"enroot"}))
def test_other_runtimes_compose_under_any_launcher(name):
    runtime = RUNTIMES[name]()
    assert runtime.requires_launcher is None and runtime.launcher_options(SITE) == []
    for kind in ("mpirun", "srun", "none"):
        runtime.check_launcher(kind)
    spec = RunSpec("train", name, "infiniband", 2, 4, 1, 64)
    env = runtime.environment(SITE)
    argv = Mpirun("core").wrap(runtime.rank_argv(SITE), spec, sorted(env))
    assert argv[-len(runtime.rank_argv(SITE)):] == runtime.rank_argv(SITE)
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "-x"] == sorted(env)


def test_privileged_never_appears():
    for make in RUNTIMES.values():
        runtime = make()
        for request in (SITE, CPU, example_request(), example_request(gpus=False, infiniband=False)):
            words = [*runtime.launcher_options(request), *runtime.rank_argv(request)]
            assert not any("privileged" in word for word in words), runtime.name


def test_podman_as_root_needs_no_userns_and_keeps_the_sites_oci_runtime():
    argv = Podman("img", uid=0, gid=0).rank_argv(CPU)
    argv = argv[argv.index("--") + 1:]  # the shim's words before
    assert argv[:13] == ["podman", "run", *HOST_NS, "--user", "0:0", "--log-driver", "none"]
    assert not any(word.startswith("--runtime") for word in argv) and "--userns" not in argv


def test_docker_ids_default_to_the_planning_user():
    import os

    argv = Docker("img", host_python=HOST_PY).rank_argv(CPU)
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"


def test_relative_workdir_and_duplicate_binds_are_resolved_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request = RunRequest(module="m", workdir=".", binds=(str(tmp_path), "/data", "/data"))
    argv = Podman("img", uid=0, gid=0).rank_argv(request)
    volumes = [argv[i + 1] for i, word in enumerate(argv) if word == "--volume"]
    assert volumes == ["/tmp:/tmp", "/dev/shm:/dev/shm", f"{tmp_path}:{tmp_path}", "/data:/data"]
    assert argv[argv.index("--workdir") + 1] == str(tmp_path)


def test_charliecloud_without_write_fake_and_with_extra_args():
    argv = Charliecloud("/img", python="/usr/bin/python3", extra_args=["-v"], write_fake=False).rank_argv(CPU)
    assert "--write-fake" not in argv
    assert argv[-10:] == ["-v", "/img", "--", "/usr/bin/python3", "-m", "containerbench.rank.bench", *BENCH_ARGS]


def test_charliecloud_without_write_fake_binds_a_dataset_at_an_existing_mount_point():
    """ch-run 0.31 cannot create /datasets/imagenet in a read-only image: it goes to /mnt instead."""
    request = RunRequest(module="containerbench.rank.bench", args=("--data-dir", "/datasets/imagenet"), env=CPU_ENV,
                         workdir="/work/x", binds=("/datasets/imagenet",))
    argv = Charliecloud("/img", write_fake=False).rank_argv(request)
    assert "--bind=/datasets/imagenet:/mnt" in argv
    assert argv[-8:] == ["--cd=/", "/img", "--", "python3", "-m", "containerbench.rank.bench", "--data-dir", "/mnt"]
    with pytest.raises(ValueError, match="4 binds need images.charliecloud.write_fake: true"):
        Charliecloud("/img", write_fake=False).rank_argv(
            RunRequest(module="m", args=(), env={}, binds=("/a", "/b", "/c", "/d")))


def test_singularity_is_apptainer_under_its_own_name_and_prefix():
    assert issubclass(Singularity, Apptainer) and Singularity.env_prefix == "SINGULARITYENV_"
    with pytest.raises(ValueError, match="unknown option 'binary' in images.apptainer"):
        runtime_for("apptainer", {"images": {"apptainer": {"image": "/i.sif", "binary": "docker"}}})


# --- the rankexec shim, really run (a harmless program stands in for docker) ---

def run_shim(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "containerbench.rank.rankexec", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_shim_inserts_env_names_after_run_and_execs_the_command():
    env = {"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "OTHER": "x"}
    result = run_shim("--pass-prefix", "OMPI_", "--pass-prefix", "PMIX_", "--",
                      "/bin/sh", "-c", 'echo "$@"', "sh", "run", "--rm", "img", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "run --env OMPI_COMM_WORLD_RANK --env PMIX_RANK --rm img\n"


def test_shim_exports_prefixed_names_for_apptainer():
    env = {"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_RANK": "3", "SLURM_PROCID": "5"}
    result = run_shim("--env-prefix", "APPTAINERENV_", "--pass-prefix", "OMPI_", "--pass-prefix", "SLURM_", "--",
                      "/bin/sh", "-c", 'echo "$APPTAINERENV_OMPI_COMM_WORLD_RANK $APPTAINERENV_SLURM_PROCID $*"',
                      "sh", "exec", "img", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "3 5 exec img\n"


def test_shim_adds_the_devices_present_on_the_node(tmp_path):
    for name in ("rdma_cm", "uverbs1", "uverbs0", "umad0"):
        (tmp_path / name).touch()
    result = run_shim("--device-glob", str(tmp_path / "rdma_cm"), "--device-glob", str(tmp_path / "uverbs*"),
                      "--device-glob", str(tmp_path / "missing*"), "--",
                      "/bin/sh", "-c", 'echo "$@"', "sh", "run", "img", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"run --device={tmp_path}/rdma_cm --device={tmp_path}/uverbs0 "
                             f"--device={tmp_path}/uverbs1 img\n")


def test_shim_gives_docker_the_cpus_the_rank_is_bound_to():
    """docker run reference, "--cpuset-cpus": CPUs in which to allow execution (0-3, 0,1)."""
    def shim_on(cpus: str) -> str:
        done = subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "containerbench.rank.rankexec",
                               "--cpuset-from-affinity", "--", "/bin/sh", "-c", 'echo "$@"', "sh", "run", "img"],
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert shim_on("0") == "run --cpuset-cpus=0 img\n"
    assert shim_on(f"0-{os.cpu_count() - 1}") == "run img\n"  # every CPU: nothing to pin


def test_shim_moves_sruns_pmi2_socket_to_fd_3_and_has_podman_keep_it():
    """Slurm's pmi2 plugin gives each task its socket as an inherited fd named by PMI_FD
    (SchedMD/slurm@284c3b95: src/plugins/mpi/pmi2/mpi_pmi2.c, mpi_p_slurmstepd_task); podman passes fds
    3..3+N-1 to the container and no other (containers/podman@c6580b4a:
    docs/source/markdown/options/preserve-fds.md: "Pass down to the process N additional file descriptors
    (in addition to 0, 1, 2). The total FDs are 3+N."). So the shim moves it to 3 and asks for one, as
    podman-hpc 1.2.2 does (podman_hpc/podman_hpc.py, pmi_fd)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"pmi2 says hello\n")
    os.close(write_end)
    moved = fcntl.fcntl(read_end, fcntl.F_DUPFD, 20)  # a free fd past 3, as srun's number for a task is
    done = subprocess.run([sys.executable, "-m", "containerbench.rank.rankexec", "--pmi-fd", "--",
                           "/bin/sh", "-c", 'echo "$PMI_FD $*"; cat <&3', "sh", "run", "img"],
                          env={"PATH": "/usr/bin:/bin", "PMI_FD": str(moved)}, pass_fds=(moved,),
                          capture_output=True, text=True, timeout=60)
    os.close(read_end), os.close(moved)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3 run --preserve-fds=1 img\npmi2 says hello\n"
    # Without PMI_FD (pmix, or mpirun) the shim inserts nothing.
    assert run_shim("--pmi-fd", "--", "/bin/sh", "-c", 'echo "$*"', "sh", "run", "img",
                    env={"PATH": "/usr/bin:/bin"}).stdout == "run img\n"


def pmix_step(tmp_path, **more) -> dict:
    """A rank's environment in a step of srun --mpi=pmix as Slurm 22.05's plugin left it on the test cluster
    (test_slurm reads a real one): PMIX_SYSTEM_TMPDIR=/tmp whatever TmpFS is, the server's directory in the spool.
    The client directory is made under TmpFS (here outside /tmp, as a site's may be, %n the node) and the server's,
    as slurmstepd makes them before the tasks start (pmixp_libpmix_init)."""
    base, spool = tmp_path / "local" / "n1", tmp_path / "spool" / "pmix.41.0"
    (base / "spmix_appdir_1000_41.0").mkdir(parents=True), spool.mkdir(parents=True)
    return {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_JOB_UID": "1000",
            "SLURMD_NODENAME": "n1", "SLURM_MPI_TYPE": "pmix", "PMIX_RANK": "0", "PMIX_SYSTEM_TMPDIR": "/tmp",
            "PMIX_SERVER_TMPDIR": f"{spool}/", **more}


def test_shim_binds_the_pmix_directories_of_the_step_that_no_shared_path_holds(tmp_path):
    """NVIDIA/enroot conf/hooks/extra/50-slurm-pmi.sh (what Pyxis's containers get, its tests/mpi.bats "PMIx
    mount": findmnt "$PMIX_SERVER_TMPDIR" in the container) binds the step's
    spmix_appdir_${SLURM_JOB_UID}_${JOB}.${STEP} and ${PMIX_SERVER_TMPDIR}, whose places are the site's. Slurm
    makes the first under SLURM_PMIX_TMPDIR, else mpi.conf's PMIxCliTmpDirBase, else TmpFS with %n expanded
    (SchedMD/slurm src/plugins/mpi/pmix/pmixp_info.c), which the plan reads (--pmix-base). docker-run(1) and
    podman-run(1): --volume SRC:DEST."""
    env = pmix_step(tmp_path)
    echo = ["--", "/bin/sh", "-c", 'echo "$*"', "sh", "run", "img"]
    bind = ["--bind-pmix=--volume {path}:{path}", "--pmix-base", f"{tmp_path}/local/%n"]
    done = run_shim(*bind, "--shared-path", "/tmp/elsewhere", *echo, env=env)
    appdir, spool = f"{tmp_path}/local/n1/spmix_appdir_1000_41.0", f"{tmp_path}/spool/pmix.41.0"
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"run --volume {appdir}:{appdir} --volume {spool}:{spool} img\n"
    # One under a path the runtime binds already is left out (a second bind of it would be a duplicate).
    done = run_shim(*bind, "--shared-path", f"{tmp_path}/spool", *echo, env=env)
    assert done.stdout == f"run --volume {appdir}:{appdir} img\n"
    # Where the plan could not read the base, only the server's is found: PMIX_SYSTEM_TMPDIR does not name TmpFS.
    done = run_shim("--bind-pmix=--volume {path}:{path}", *echo, env=env)
    assert done.stdout == f"run --volume {spool}:{spool} img\n"
    # %h is the node's NodeHostname: its NodeName unless set, else typically `hostname -s` (slurm.conf(5),
    # NodeHostname). Here the node's name, n1, is not this host's name: found under either.
    for host_dir in ("n1", socket.gethostname().split(".")[0]):
        (tmp_path / "by-host" / host_dir / "spmix_appdir_1000_41.0").mkdir(parents=True)
        done = run_shim("--bind-pmix=--volume {path}:{path}", "--pmix-base", f"{tmp_path}/by-host/%h",
                        "--shared-path", f"{tmp_path}/spool", *echo, env=env)
        found = f"{tmp_path}/by-host/{host_dir}/spmix_appdir_1000_41.0"
        assert done.stdout == f"run --volume {found}:{found} img\n"
        shutil.rmtree(tmp_path / "by-host")
    # A job's SLURM_PMIX_TMPDIR comes first; the older name (no uid) is found as Enroot finds it.
    (tmp_path / "job").mkdir(), (tmp_path / "job" / "spmix_appdir_41.0").mkdir()
    env = pmix_step(tmp_path / "older", SLURM_PMIX_TMPDIR=str(tmp_path / "job"))
    done = run_shim(*bind, "--shared-path", f"{tmp_path}/older/spool", *echo, env=env)
    assert done.stdout == f"run --volume {tmp_path}/job/spmix_appdir_41.0:{tmp_path}/job/spmix_appdir_41.0 img\n"


def test_shim_adds_the_pmix_directories_to_apptainers_bind_variable(tmp_path):
    """Apptainer user guide, appendix "Apptainer's environment variables": APPTAINER_BIND, a comma-separated
    list of source[:dest] paths to bind; the default binds (/tmp, /var/tmp: "Bind Paths and Mounts") are shared."""
    env = pmix_step(tmp_path, APPTAINER_BIND="/data")
    done = run_shim("--bind-pmix-variable=APPTAINER_BIND", "--pmix-base", f"{tmp_path}/local/%n", "--",
                    "/bin/sh", "-c", 'echo "$APPTAINER_BIND $*"', "sh", "exec", "img", env=env)
    assert done.returncode == 0, done.stderr
    appdir, spool = f"{tmp_path}/local/n1/spmix_appdir_1000_41.0", f"{tmp_path}/spool/pmix.41.0"
    assert done.stdout == f"/data,{appdir},{spool} exec img\n"


def test_shim_binds_nothing_outside_a_pmix_step(tmp_path):
    """Enroot's hook acts only in a Slurm step (SLURM_JOB_ID and SLURM_STEP_ID) whose SLURM_MPI_TYPE is pmix* or
    unset, with PMIX_* variables: not under srun --mpi=pmi2, not under mpirun (its PMIx server is Open MPI's)."""
    echo = ["--bind-pmix=--volume {path}:{path}", "--", "/bin/sh", "-c", 'echo "$*"', "sh", "run", "img"]
    for env in (pmix_step(tmp_path / "a", SLURM_MPI_TYPE="pmi2"),
                {k: v for k, v in pmix_step(tmp_path / "b").items() if k != "SLURM_STEP_ID"},
                {k: v for k, v in pmix_step(tmp_path / "c").items() if not k.startswith("PMIX_")}):
        assert run_shim(*echo, env=env).stdout == "run img\n"


def test_under_sruns_pmix_each_runtime_has_the_shim_bind_the_directories_its_own_binds_miss():
    """Under srun --mpi=pmix the PMIx directories are the node's (the shim tests above): docker, podman and
    podman-hpc get `--volume` after their verb (podman-hpc's is shared-run, podman_hpc.py 1.2.2, which passes
    its run options on to podman), Apptainer and Singularity their BIND variable (appendix, APPTAINER_BIND;
    SingularityCE's SINGULARITY_BIND), Sarus a `--mount` (its user guide, "Mounting custom files and directories",
    as its own binds), Charliecloud with write_fake a `--bind`, each told the paths it binds already; a runtime that
    cannot bind one refuses a base it does not share. Under pmi2 or mpirun: nothing."""
    request = dataclasses.replace(CPU, pmix_server=True, pmix_base="/local/%n")  # TmpFS, as the plan read it
    base = ["--pmix-base", "/local/%n"]
    volume = ["--bind-pmix=--volume {path}:{path}", *base]
    def shared(*paths):
        return [word for path in paths for word in ("--shared-path", path)]
    docker = Docker("containerbench:latest", uid=1000, gid=1000, host_python=HOST_PY).rank_argv(request)
    assert docker[docker.index("--label-client") + 1:docker.index("--")] == [*volume, *shared("/tmp", "/work/x")]
    podman = Podman("containerbench:latest", uid=1000, gid=1000, host_python=HOST_PY).rank_argv(request)
    assert podman[:podman.index("--") + 3] == [HOST_PY, "-m", "containerbench.rank.rankexec", "--label-client", *volume,
                                               *shared("/tmp", "/dev/shm", "/work/x"), "--insert-after", "run",
                                               "--", "podman", "run"]
    hpc = under_srun(PodmanHPC("containerbench:latest", uid=1000, gid=1000, host_python=HOST_PY)).rank_argv(request)
    assert hpc[:hpc.index("--") + 3] == [HOST_PY, "-m", "containerbench.rank.rankexec", *volume,
                                         *shared("/tmp", "/dev/shm", "/var/spool/slurmd", "/run/munge", "/work/x"),
                                         "--insert-after", "shared-run", "--", "podman-hpc", "shared-run"]
    for runtime, variable in ((Apptainer, "APPTAINER_BIND"), (Singularity, "SINGULARITY_BIND")):
        argv = runtime("/images/containerbench.sif", host_python=HOST_PY).rank_argv(request)
        assert argv[argv.index(f"--bind-pmix-variable={variable}"):argv.index("--")] == [
            f"--bind-pmix-variable={variable}", *base, *shared("/tmp", "/var/tmp", "/work/x")]
    # Sarus's default sarus.json refuses destinations under /etc, /var, /opt/sarus (configuration reference,
    # "userMounts": notAllowedPrefixesOfPath): they are passed as not to bind.
    sarus = Sarus("containerbench:latest", host_python=HOST_PY).rank_argv(request)  # user guide, "Mounting custom..."
    assert sarus[:sarus.index("--") + 2] == [HOST_PY, "-m", "containerbench.rank.rankexec",
                                             "--bind-pmix=--mount=type=bind,source={path},destination={path}", *base,
                                             *shared("/etc", "/var", "/opt/sarus", "/work/x"), "--", "sarus"]
    # ch-run(1) "--bind=SRC[:DST]": with --write-fake "DST will be created as an empty directory", but "cannot
    # enter a previous bind mount" ("/tmp is shared with the host via bind-mount"): those under /tmp are left out.
    ch = Charliecloud("/images/containerbench.sqfs", write_fake=True, host_python=HOST_PY).rank_argv(request)
    assert ch[:ch.index("--") + 2] == [HOST_PY, "-m", "containerbench.rank.rankexec", "--bind-pmix=--bind={path}",
                                       *base, *shared("/tmp", "/work/x"), "--insert-after", "ch-run", "--", "ch-run"]
    # Without write_fake no mount point can be made ("With a read-only image (the default), DST must exist"):
    # a base outside /tmp is refused in one line; one under /tmp is shared already.
    with pytest.raises(ValueError) as refused:
        Charliecloud("/images/containerbench.sqfs").rank_argv(request)
    assert str(refused.value) == ("runtime 'charliecloud' cannot bind srun's PMIx client directory, which Slurm "
                                  "makes under '/local/%n', outside the /tmp ch-run shares, without write_fake; "
                                  "allowed: images.charliecloud.write_fake: true, or a PMIxCliTmpDirBase or TmpFS "
                                  "under /tmp")
    under_tmp = dataclasses.replace(request, pmix_base="/tmp/slurm-%n")
    assert Charliecloud("/images/containerbench.sqfs").rank_argv(under_tmp)[0] == "ch-run"
    # Nor is a base under the work directory shared: without write_fake it is not bound (move_binds), its ranks
    # start in / (a review's finding). With write_fake it is bound at its own path: the shim is told it is shared.
    under_workdir = dataclasses.replace(request, pmix_base=f"{request.workdir}/pmix-%n")
    with pytest.raises(ValueError, match="^runtime 'charliecloud' cannot bind srun's PMIx client directory"):
        Charliecloud("/images/containerbench.sqfs").rank_argv(under_workdir)
    with_fake = Charliecloud("/images/containerbench.sqfs", write_fake=True).rank_argv(under_workdir)
    assert with_fake[with_fake.index("--insert-after") - 2:with_fake.index("--insert-after")] == [
        "--shared-path", request.workdir]
    # A base Sarus may not bind (its default refuses /etc, /var, /opt/sarus) is refused in one line.
    with pytest.raises(ValueError) as refused:
        Sarus("containerbench:latest").rank_argv(dataclasses.replace(request, pmix_base="/var/tmp/slurm"))
    assert str(refused.value) == ("runtime 'sarus' cannot bind srun's PMIx client directory, which Slurm makes "
                                  "under '/var/tmp/slurm': its default sarus.json refuses mount destinations under "
                                  "/etc, /var, /opt/sarus; allowed: a PMIxCliTmpDirBase or TmpFS elsewhere")
    # Shifter always binds the host's /tmp and /var/tmp (shifter_core.c at 84b7d34, "mount /tmp", "mount /var/tmp")
    # and udiRoot.conf's siteFs; a user volume's source must already be in the container ("Invalid source %s, not
    # allowed") and a rank's own --volume sets up a new instance (doc/wlm/slurm.rst): nothing to add, a base under
    # those is shared, one elsewhere refused in one line.
    shifter = under_srun(Shifter("id:0123abcd", host_python=HOST_PY))
    for base_under in ("/tmp/slurm-%n", "/var/tmp/slurm-%n"):
        argv = shifter.rank_argv(dataclasses.replace(request, pmix_base=base_under))
        assert not any(word.startswith("--bind-pmix") for word in argv)
    with pytest.raises(ValueError) as refused:
        shifter.rank_argv(request)
    assert str(refused.value) == ("runtime 'shifter' cannot bind srun's PMIx client directory, which Slurm makes "
                                  "under '/local/%n', outside the /tmp and /var/tmp Shifter binds and "
                                  "images.shifter.site_fs; allowed: a PMIxCliTmpDirBase or TmpFS under /tmp or "
                                  "/var/tmp, or images.shifter.site_fs naming the udiRoot.conf siteFs path that holds "
                                  "it")
    assert under_srun(Shifter("id:0123abcd", site_fs=["/local"], host_python=HOST_PY)).rank_argv(request)
    with pytest.raises(ValueError, match="^runtime 'shifter' cannot bind"):  # its work directory is not bound
        shifter.rank_argv(dataclasses.replace(request, pmix_base=f"{request.workdir}/pmix-%n"))
    for make in (lambda: Docker("containerbench:latest", host_python=HOST_PY), lambda: Podman("containerbench:latest"),
                 lambda: under_srun(PodmanHPC("containerbench:latest")), lambda: Sarus("containerbench:latest"),
                 lambda: Apptainer("/images/containerbench.sif", host_python=HOST_PY),
                 lambda: Singularity("/images/containerbench.sif", host_python=HOST_PY),
                 lambda: Charliecloud("/images/containerbench.sqfs", write_fake=True, host_python=HOST_PY)):
        assert not any(word.startswith("--bind-pmix") for word in make().rank_argv(CPU))


def outside_shared_paths() -> Path:
    """A directory that none of the runtimes shares or refuses (/tmp, /dev/shm, /var, /etc): the clone's build/,
    or the user's home where the clone is under one of them (a CI clone in /tmp)."""
    for candidate in (ROOT / "build", Path.home()):
        if not str(candidate.resolve()).startswith(("/tmp/", "/dev/shm/", "/var/", "/etc/")):
            candidate.mkdir(exist_ok=True)
            return Path(tempfile.mkdtemp(dir=candidate, prefix="pmix-test-"))
    raise AssertionError(f"no directory outside /tmp, /dev/shm, /var and /etc to make one in: {ROOT}, {Path.home()}")


# Each runtime's bind in its own words, after its verb: docker-run(1)/podman-run(1) --volume, podman-hpc's shared-run
# passing its run options on, Sarus's --mount (user guide), ch-run(1) --bind with --write-fake.
SHIM_BINDS = {"docker": ("run", lambda d: ["--volume", f"{d}:{d}"]),
              "podman": ("run", lambda d: ["--volume", f"{d}:{d}"]),
              "podman-hpc": ("shared-run", lambda d: ["--volume", f"{d}:{d}"]),
              "sarus": ("run", lambda d: [f"--mount=type=bind,source={d},destination={d}"]),
              "charliecloud": ("ch-run", lambda d: [f"--bind={d}"]), "apptainer": (None, None)}


@pytest.mark.parametrize("name", sorted(SHIM_BINDS))
def test_each_runtimes_shim_really_runs_its_pmix_options_and_binds_the_steps_directories(name):
    """The shim, run with the options each runtime's rank_argv gives it under srun --mpi=pmix (a harmless program
    before the runtime's own words, which it prints with what the shim inserted): every form parses (a form is
    itself an option: Sarus's --mount=..., ch-run's --bind=...) and both directories of the step are bound, in the
    runtime's words, right after its verb (last of what the shim inserts), or in APPTAINER_BIND."""
    outside = outside_shared_paths()
    try:
        env = pmix_step(outside)
        request = dataclasses.replace(CPU, pmix_server=True, pmix_base=f"{outside}/local/%n")
        runtime = {"docker": lambda: Docker("img", host_python=sys.executable),
                   "podman": lambda: Podman("img", host_python=sys.executable),
                   "podman-hpc": lambda: under_srun(PodmanHPC("img", host_python=sys.executable)),
                   "apptainer": lambda: Apptainer("/i.sif", host_python=sys.executable),
                   "sarus": lambda: Sarus("img", host_python=sys.executable),
                   "charliecloud": lambda: Charliecloud("/i.sqfs", write_fake=True, host_python=sys.executable)}[name]()
        argv = runtime.rank_argv(request)
        at = argv.index("--")
        command = argv[at + 1:]
        done = subprocess.run([*argv[:at + 1], "/bin/sh", "-c", 'echo "$APPTAINER_BIND|$*"', "sh", *command],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        bound, printed = done.stdout.rstrip("\n").split("|", 1)
        appdir, spool = f"{outside}/local/n1/spmix_appdir_1000_41.0", f"{outside}/spool/pmix.41.0"
        verb, words = SHIM_BINDS[name]
        if verb is None:
            assert (bound, printed) == (f"{appdir},{spool}", " ".join(command))
        else:
            after = command.index(verb) + 1
            tail = [*words(appdir), *words(spool), *command[after:]]
            assert bound == "" and printed.split(" ")[:after] == command[:after]
            assert printed.split(" ")[-len(tail):] == tail
    finally:
        shutil.rmtree(outside)


def test_shim_passes_the_exit_status_and_refuses_a_missing_command():
    assert run_shim("--", "/bin/sh", "-c", "exit 7", env={"PATH": "/usr/bin:/bin"}).returncode == 7
    result = run_shim("--pass-prefix", "OMPI_", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "give the command after --" in result.stderr
    result = run_shim("--pass-prefix", "OMPI_", "--", "/bin/true", "exec", env={"PATH": "/bin", "OMPI_X": "1"})
    assert result.returncode == 2 and "no 'run' word" in result.stderr


# --- the factory ---

IMAGES = {"docker": {"image": "containerbench:latest"},
          "podman": {"image": "containerbench:latest", "oci_runtime": "runc"},
          "podman-hpc": {"image": "containerbench:latest"}, "apptainer": {"image": "/images/cb.sif"},
          "singularity": {"image": "/images/cb.sif"}, "shifter": {"image": "docker:containerbench:latest",
                                                                 "mpi_model": "native"},
          "charliecloud": {"image": "/images/cb.sqfs", "write_fake": False}, "enroot": {"image": "/images/cb.sqsh"},
          "sarus": {"image": "containerbench:latest", "python": "/opt/venv/bin/python"}}
CLASSES = {"docker": Docker, "podman": Podman, "podman-hpc": PodmanHPC, "apptainer": Apptainer,
           "singularity": Singularity, "shifter": Shifter, "charliecloud": Charliecloud, "enroot": Enroot,
           "sarus": Sarus}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_runtime_for_builds_each_runtime_from_its_images_section(name):
    runtime = runtime_for(name, {"images": IMAGES, "bare_metal": {"python": "py"}})
    assert type(runtime) is CLASSES[name] and runtime.name == name and runtime.image == IMAGES[name]["image"]
    for option, value in IMAGES[name].items():
        if option != "image":
            assert getattr(runtime, option) == value


def test_runtime_for_keeps_bare_metal_as_it_was():
    runtime = runtime_for("bare-metal", {"bare_metal": {"python": "/venv-bench/bin/python"}})
    assert type(runtime) is BareMetal and runtime.rank_argv(CPU) == ["/venv-bench/bin/python", "-m",
                                                                     "containerbench.rank.bench", *BENCH_ARGS]
    assert runtime.environment(CPU) == {"CONTAINERBENCH_RUNTIME": "bare-metal", **CPU_ENV}


@pytest.mark.parametrize("name, config, message", [
    ("lxc", {}, "runtime 'lxc' is not supported; allowed: bare-metal, docker, podman, apptainer, singularity, "
                "shifter, charliecloud, enroot, sarus, podman-hpc"),
    ("docker", {}, "runtime 'docker' needs an image reference: set images.docker.image in the config"),
    ("sarus", {"images": {"docker": {"image": "x"}}},
     "runtime 'sarus' needs an image reference: set images.sarus.image in the config"),
    ("enroot", {"images": {"enroot": {"python": "python3"}}},
     "runtime 'enroot' needs an image reference: set images.enroot.image in the config"),
    ("podman-hpc", {"images": {"podman-hpc": {"image": "x", "oci_runtime": "runc"}}},
     "runtime 'podman-hpc': unknown option 'oci_runtime' in images.podman-hpc; allowed: image, extra_args, gid, "
     "python, slurm_paths, uid"),
])
def test_runtime_for_rejects_in_one_line(name, config, message):
    with pytest.raises(ValueError) as error:
        runtime_for(name, config)
    assert str(error.value) == message and "\n" not in message


def test_charliecloud_without_write_fake_binds_no_work_directory():
    """Without --write-fake ch-run cannot create mount points: only dataset binds, started in /."""
    argv = Charliecloud("/img", write_fake=False).rank_argv(SITE)
    assert "--bind=/datasets/imagenet:/mnt" in argv and not any(a.startswith("--bind=/scratch") for a in argv)
    assert "--cd=/" in argv


def test_runtime_for_gives_the_launch_settings_to_the_constructor():
    config = {"images": {"podman": {"image": "x", "mpi_model": "native", "available": "compute-nodes"}},
              "launcher": {"kind": "srun"}, "native_mpi": {"library": "/host/libmpich.so.12"}}
    expected = Podman("x", launcher="srun", mpi_model="native", srun_mpi="pmi2", available="compute-nodes",
                      native_mpi=NativeMpi(library="/host/libmpich.so.12"))
    assert vars(runtime_for("podman", config)) == vars(expected)


HOST_MPI = NativeMpi(library="/opt/mpich/lib/libmpi.so.12", library_dirs=("/opt/mpich/lib", "/opt/fabric/lib64"))
HOST_MPI_PATH = "/opt/mpich/lib:/opt/fabric/lib64:/opt/containerbench/venv/lib"


@pytest.mark.parametrize("engine", [Docker, Podman])
def test_the_bind_model_binds_the_host_mpis_directories_read_only_at_their_paths_and_searches_them_first(engine):
    """Issue 32, finding 3: the host's libmpi alone was bound, and what it loads came from the image. The host MPI's
    directories (native_mpi.library_dirs) go in whole, as Apptainer's bind model binds the host's MPI installation
    (user guide, "MPI": "Bind model") and podman-hpc's mpich module binds its library directories and puts them on
    LD_LIBRARY_PATH (etc/modules.d/mpich.yaml, `bind:` and `-e LD_LIBRARY_PATH=`): `--volume SRC:DST:ro`
    (docker run reference, "--volume"; podman-run(1), "--volume": options after the second colon)."""
    runtime = engine("containerbench:latest", uid=1000, gid=1000, mpi_model="native", native_mpi=HOST_MPI)
    argv = runtime.rank_argv(CPU)
    binds = [argv[i + 1] for i, word in enumerate(argv) if word == "--volume" and argv[i + 1].startswith("/opt/")]
    assert binds == ["/opt/mpich/lib/libmpi.so.12:/opt/containerbench/venv/lib/libmpi.so.12:ro",
                     "/opt/mpich/lib:/opt/mpich/lib:ro", "/opt/fabric/lib64:/opt/fabric/lib64:ro"]
    env = runtime.environment(CPU)
    assert env["LD_LIBRARY_PATH"] == HOST_MPI_PATH and env["CONTAINERBENCH_HOST_MPI_LIBS"] == ""


def test_apptainer_binds_the_host_mpis_directories_as_its_bind_model_does():
    """Apptainer user guide, "Bind Paths and Mounts": `--bind src[:dest[:opts]]`, opts `ro`; "MPI", "Bind model"."""
    runtime = Apptainer("/images/cb.sif", host_python=HOST_PY, mpi_model="native", native_mpi=HOST_MPI)
    argv = runtime.rank_argv(CPU)
    binds = [argv[i + 1] for i, word in enumerate(argv) if word == "--bind" and argv[i + 1].startswith("/opt/")]
    assert binds == ["/opt/mpich/lib/libmpi.so.12:/opt/containerbench/venv/lib/libmpi.so.12",
                     "/opt/mpich/lib:/opt/mpich/lib:ro", "/opt/fabric/lib64:/opt/fabric/lib64:ro"]
    assert runtime.environment(CPU)["APPTAINERENV_LD_LIBRARY_PATH"] == HOST_MPI_PATH


def test_charliecloud_binds_the_host_mpis_directories_onto_the_images_mount_points_without_write_fake():
    """ch-run(1), "-b, --bind=SRC[:DST]": without --write-fake DST must exist in the image, so the directories take
    the mount points every image has (/mnt, /media, /srv) beside the dataset's, and LD_LIBRARY_PATH names them
    there; with --write-fake they keep their host paths."""
    moved = Charliecloud("/img", write_fake=False, mpi_model="native", native_mpi=HOST_MPI)
    argv = moved.rank_argv(SITE)
    assert ["--bind=/datasets/imagenet:/mnt", "--bind=/opt/mpich/lib:/media", "--bind=/opt/fabric/lib64:/srv"] == [
        word for word in argv if word.startswith("--bind=") and not word.endswith("/libmpi.so.12")]
    assert moved.environment(SITE)["LD_LIBRARY_PATH"] == "/media:/srv:/opt/containerbench/venv/lib"
    kept = Charliecloud("/img", write_fake=True, mpi_model="native", native_mpi=HOST_MPI)
    argv = kept.rank_argv(SITE)
    assert "--bind=/opt/mpich/lib" in argv and "--bind=/opt/fabric/lib64" in argv
    assert kept.environment(SITE)["LD_LIBRARY_PATH"] == HOST_MPI_PATH
    two_datasets = RunRequest(**{**vars(SITE), "binds": ("/datasets/a", "/datasets/b")})
    with pytest.raises(ValueError) as refused:
        moved.rank_argv(two_datasets)
    assert str(refused.value) == ("runtime 'charliecloud': 4 binds need images.charliecloud.write_fake: true (ch-run "
                                  "0.38 or later, unprivileged overlayfs on every node); allowed: at most 3 (/mnt, "
                                  "/media, /srv)")


def test_the_module_and_hook_runtimes_leave_the_host_mpis_binds_to_the_sites_configuration():
    """podman-hpc's --mpi module (etc/modules.d/mpich.yaml), Shifter's mpich module (udiRoot.conf) and Sarus's MPI hook
    (doc/config/mpi-hook.rst: MPI_LIBS, MPI_DEPENDENCY_LIBS) bind the host MPI as the site set them: no bind of ours,
    but the ranks still report what they mapped, and the node's closure is still read (hostmpi.py)."""
    for runtime in (PodmanHPC("containerbench:latest", uid=1000, gid=1000, mpi_model="native", native_mpi=HOST_MPI),
                    native(Sarus("containerbench:latest", host_python=HOST_PY, native_mpi=HOST_MPI))):
        argv, env = runtime.rank_argv(CPU), runtime.environment(CPU)
        assert not [word for word in argv if "/opt/mpich" in word or "/opt/fabric" in word], runtime.name
        assert "LD_LIBRARY_PATH" not in env and env["CONTAINERBENCH_HOST_MPI_LIBS"] == "", runtime.name


def test_the_clones_podman_settings_reach_podman_however_the_workflow_is_started(tmp_path):
    # containers.conf(5): CONTAINERS_CONF names the file podman reads. `make setup` writes ours
    # (scripts/container-engines.sh podman-conf); snakemake or containerbench called without make used to
    # run podman without it (issue 36: "error setting rlimit type 7" in every podman run).
    assert Podman.engine_environment(tmp_path, environ={}) == {}  # a clone without it: the site's own settings
    conf = tmp_path / "build" / "engines" / "containers.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text('[engine]\nruntime = "runc"\n')
    assert Podman.engine_environment(tmp_path, environ={}) == {"CONTAINERS_CONF": str(conf)}
    assert Podman.engine_environment(tmp_path, environ={"CONTAINERS_CONF": "/etc/mine.conf"}) == {}  # the user's wins


def test_podman_hpc_removal_unmounts_the_images_squashfuse_mounts_only(tmp_path, monkeypatch):
    """A squashfuse mount fuse-overlayfs-wrap left (1.2.2 bin/fuse-overlayfs-wrap mounts LAYER's squash file at the
    lower directory podman names: overlay/LAYER/diff or its link overlay/l/LINK, both seen in /proc/mounts here) is
    unmounted before `rmsqi` (release_prepared), last mounted first; another image's, and what is not squashfuse,
    are left. The image is the one rmsqi takes for the tag (get_img_info: a short name as localhost/NAME:latest
    among others). The mount table as proc(5) writes it (optional fields, octal escapes, resolved paths: SQUASH_DIR
    here is a link); the store as podman-hpc's migrate lays it out (images.json, link). The real leak and its
    removal: test_containers."""
    store = tmp_path / "sq uash"
    (tmp_path / "scratch").symlink_to(store)
    monkeypatch.setenv("SQUASH_DIR", str(tmp_path / "scratch"))
    (store / "overlay-images").mkdir(parents=True)
    (store / "overlay-images" / "images.json").write_text(json.dumps(
        [{"id": "1" * 64, "names": ["localhost/cb:latest"], "layer": "a" * 64},
         {"id": "2" * 64, "names": ["localhost/other:1"], "layer": "b" * 64},
         {"id": "3" * 64, "names": ["localhost/unlinked:1"], "layer": "c" * 64}]))
    for layer, link in (("a", "LINKA"), ("b", "LINKB"), ("c", "")):
        (store / "overlay" / (layer * 64)).mkdir(parents=True)
        (store / "overlay" / (layer * 64) / "link").write_text(link)
    root = str(store).replace(" ", "\\040")
    mountinfo = "\n".join([
        "22 1 0:21 / / rw shared:1 - ext4 /dev/vda rw",
        f"90 22 0:50 / {root}/overlay/{'a' * 64}/diff rw,nosuid shared:40 - fuse.squashfuse_ll squashfuse_ll rw",
        f"91 22 0:51 / {root}/overlay/l/LINKA rw,nosuid shared:41 master:3 - fuse.squashfuse_ll squashfuse_ll rw",
        f"92 22 0:52 / {root}/overlay/l/LINKB rw,nosuid - fuse.squashfuse squashfuse rw",
        f"93 22 0:53 / {root}/overlay/{'a' * 64}/merged rw - fuse.fuse-overlayfs fuse-overlayfs rw"])
    assert PodmanHPC.squash_mounts("cb", mountinfo) == [f"{store}/overlay/l/LINKA", f"{store}/overlay/{'a' * 64}/diff"]
    assert PodmanHPC.remove_prepared_commands(BuiltImage("cb")) == [["podman-hpc", "rmsqi", "cb"]]
    # A layer whose link file is empty: its own directory only, never all of overlay/l.
    assert PodmanHPC.squash_mounts("localhost/unlinked:1", mountinfo) == []
    # No store there (nothing migrated): none.
    monkeypatch.setenv("SQUASH_DIR", str(tmp_path / "none"))
    assert PodmanHPC.squash_mounts("cb", mountinfo) == []


def test_podman_hpc_prepares_and_removals_take_turns_on_a_lock_in_squash_dir(tmp_path, monkeypatch):
    """migrate and rmsqi rewrite SQUASH_DIR's images.json in place with no lock (1.2.2 migrate2scratch.py,
    upsert_image and del_rec: `json.dump(data, open(path, "w"))`); the two flavours' migrates at once failed in the
    workflow here ("JSONDecodeError: Extra data"). Another process's migrate, rmsqi or read-back waits for the lock
    in SQUASH_DIR, which every host that migrates shares; its load and rmi, which touch only this host's store
    (podman locks that itself), do not wait."""
    monkeypatch.setenv("SQUASH_DIR", str(tmp_path / "squash"))

    def other(step: list[str] | None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "from containerbench.runtimes import PodmanHPC\n"
                                 f"with PodmanHPC.store_lock({step!r}):\n    print('took it', flush=True)"],
                                stdout=subprocess.PIPE, text=True)

    with PodmanHPC.store_lock(["podman-hpc", "migrate", "cb"]):
        unlocked = [other(["podman-hpc", verb, "cb"]).communicate(timeout=60)[0] for verb in ("load", "rmi")]
        waiting = [other(step) for step in (None, ["podman-hpc", "migrate", "cb"], ["podman-hpc", "rmsqi", "cb"])]
        for process in waiting:
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.5)
    assert unlocked == ["took it\n"] * 2
    assert [process.communicate(timeout=60)[0] for process in waiting] == ["took it\n"] * 3
    assert (tmp_path / "squash" / ".containerbench-lock").is_file()


def test_podman_hpc_shared_run_containers_whose_starter_ended_are_orphans():
    """shared-run names the node's container uid-UID-pid-PPID after the process that started the rank's podman-hpc
    (1.2.2 podman_hpc.py, _shared_run); `podman ps --format {{.Pid}}` gives the container's first process. An
    orphan: its starter is gone, or the pid belongs to a process started after that first process (reused), by
    /proc's start ticks. A live starter's, another user's (for a user; root judges all), and a container of
    another name are left."""
    me, started = os.getuid(), []
    for _ in range(3):  # early, live, late: each at least one clock tick after the one before
        started.append(subprocess.Popen(["sleep", "60"]))
        time.sleep(0.1)
    early, live, late = started
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        listing = "\n".join(f"{name} {pid} localhost/cb:{tag}" for tag, (name, pid) in enumerate([
            (f"uid-{me}-pid-{live.pid}", late.pid), (f"uid-{me}-pid-{gone.pid}", late.pid),
            (f"uid-{me}-pid-{live.pid}", early.pid),  # the pid taken since that container started
            (f"uid-{me + 1}-pid-{gone.pid}", late.pid), ("quirky_name", late.pid)])) + "\nError: no such thing"
        others = {f"uid-{me + 1}-pid-{gone.pid}": "localhost/cb:3"} if me == 0 else {}
        assert PodmanHPC.orphaned_shared_runs(listing) == {f"uid-{me}-pid-{gone.pid}": "localhost/cb:1",
                                                           f"uid-{me}-pid-{live.pid}": "localhost/cb:2", **others}
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_an_orphan_whose_removal_failed_is_a_failure_only_while_it_is_still_there(tmp_path, monkeypatch):
    """The node-image step, --orphans-only and rmsqi's release share one removal (Runtime.remove_orphans): list,
    `podman-hpc rm --force` the orphans (podman-rm(1): a running one is killed first), then unmount what they held.
    A failed rm is listed again: a container gone meanwhile (shared-run's own --rm, another node-image step) is no
    failure; one still there is, with what `rm` said."""
    monkeypatch.setenv("SQUASH_DIR", str(tmp_path / "squash"))  # no images.json: nothing of theirs is mounted
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = f"uid-{os.getuid()}-pid-{gone.pid}"
    listings, calls = [], []

    def run(argv: list[str]) -> str:
        calls.append(argv[1])
        if argv[1] == "rm":
            raise ValueError("`podman-hpc rm --force` failed: no such container")
        return listings.pop(0)

    listings[:] = [f"{orphan} {os.getpid()} localhost/cb:t\n", ""]
    assert PodmanHPC.remove_orphans(run) == [orphan] and calls == ["ps", "rm", "ps"]
    listings[:] = [f"{orphan} {os.getpid()} localhost/cb:t\n"] * 2
    with pytest.raises(ValueError, match="no such container"):
        PodmanHPC.remove_orphans(run)
    listings[:], calls[:] = ["Error: nothing here\n"], []
    assert PodmanHPC.remove_orphans(run) == [] and calls == ["ps"]


