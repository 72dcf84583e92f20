"""Container runtimes: each turns a rank's run request into an argv and environment.

One small class per runtime (the shape of ReFrame's containers.py). A runtime
only knows how to start ONE rank; the launcher (launch.py) puts mpirun or srun
in front, so `srun --mpi=pmix <runtime argv> python3 -m containerbench.bench`
composes for every runtime the same way. The MPI model is the hybrid one: the
MPI library lives in the image and is wired up by the host's srun (PMIx/PMI2)
or mpirun, so every runtime shares the host's network, PIDs and shared memory.

Hooks a launcher uses:
  rank_argv(request)        the words that start one rank
  environment(request)      variables the launcher sets on the host and forwards (mpirun -x)
  launcher_options(request) options the launcher inserts before rank_argv (Enroot: srun's Pyxis options)
  requires_launcher         "srun" for Enroot (Pyxis is a Slurm plugin); check_launcher(kind) raises
  probe / usable()          a quick command that succeeds only where the runtime can run here

Each container runtime passes into the image only what the run needs: the
variables the launcher sets for the rank (RANK_PREFIXES), the benchmark's own
(request.env), PYTHONNOUSERSITE (a ~/.local site-packages on a bound home must
not shadow the image's) and PMIX_MCA_gds=hash (the PMIx server's shared-memory
datastore lives in a host directory the container does not see; hash needs only
the server's socket: apptainer/singularity#5195; Enroot's 50-slurm-pmix hook
binds that directory instead). Rank variable names are only known when the rank
starts; where a runtime cannot pass them by prefix, rankexec.py does it on the node.
"""

from __future__ import annotations

import functools
import getpass
import inspect
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from containerbench.config import ConfigError

# Set by mpirun (Open MPI, MPICH Hydra) or srun for each rank; the MPI/PMI library in the image needs them.
RANK_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
# Slurm's per-task GPU binding, for runtimes whose ranks stay in the task's device cgroup.
SLURM_GPU_VARS = ("CUDA_VISIBLE_DEVICES",)
RANKEXEC = "containerbench.rankexec"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class RunRequest:
    """What one rank must run, independent of where it runs."""

    module: str  # e.g. "containerbench.bench"
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # fabric and benchmark variables for the rank
    workdir: str = "."  # bound at the same path in containers, and the rank starts there
    gpus: bool = False  # give the rank the node's NVIDIA GPUs
    binds: tuple[str, ...] = ()  # further host paths bound at the same path (data sets)
    infiniband: bool = False  # give the rank the RDMA devices and unlimited locked memory


def host_environment() -> dict[str, str]:
    """This process's environment, with USER set: ch-run refuses to start without it (CI may not set it)."""
    return {**os.environ, "USER": os.environ.get("USER") or getpass.getuser()}


def engine_env(engine: str) -> dict[str, str]:
    """The environment an engine's own commands (build, save, convert) need here."""
    env = dict(os.environ)
    if engine == "docker":
        env["DOCKER_BUILDKIT"] = "0"  # Debian's docker.io has no buildx
    if engine == "charliecloud":
        env.setdefault("USER", pwd.getpwuid(os.getuid()).pw_name)  # ch-run refuses an unset $USER
        env["PATH"] = "/usr/bin:" + env.get("PATH", DEFAULT_PATH)  # ch-image needs Debian's python3 (lark)
    return env


def run_probe(argv: tuple[str, ...] | list[str], env: dict[str, str] | None = None,
              timeout: float = 20) -> tuple[bool, str]:
    """Run a runtime's quick check: (True, its first output line) or (False, a one-line reason).
    A one-word probe only checks that the program is installed."""
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]} is not installed (not on PATH)"
    if len(argv) == 1:
        return True, ""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              env=env or host_environment())
    except subprocess.TimeoutExpired:
        return False, f"`{shlex.join(argv)}` did not answer within {timeout:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"`{shlex.join(argv)}` failed: {last[:200]}"
    return True, (done.stdout.strip().splitlines() or [""])[0]


# Options of images.<runtime> that are about launching, not about the runtime's own argv.
LAUNCH_OPTIONS = ("srun_mpi", "available", "package")


class Runtime:
    """Base class: the argv that starts one rank, and the variables it needs."""

    name = ""
    requires_launcher: str | None = None  # the only launcher kind this runtime works under, if any
    # srun's MPI plugin for this runtime's runs (None: launcher.srun_mpi). An image's MPI decides it:
    # PMIx for Open MPI, PMI2 for MPICH (Slurm's mpi_guide, "srun --mpi").
    srun_mpi: str | None = None
    # "compute-nodes": not installed where the workflow runs (a login node without Apptainer, say),
    # so the pre-flight check probes it on a compute node instead of the planning step here.
    available: str = "everywhere"
    # "clone": the ranks import containerbench from the workflow's clone, bound into the container
    # (an image the site supplies, e.g. a vendor's, has TensorFlow and Horovod but not this package).
    package: str = "image"

    def rank_argv(self, request: RunRequest) -> list[str]:
        raise NotImplementedError

    def environment(self, request: RunRequest) -> dict[str, str]:
        return {"CONTAINERBENCH_RUNTIME": self.name, **request.env}

    def launcher_options(self, request: RunRequest) -> list[str]:
        return []

    def check_launcher(self, kind: str) -> None:
        if self.requires_launcher and kind != self.requires_launcher:
            raise ValueError(f"runtime {self.name!r} needs launcher {self.requires_launcher!r}, not {kind!r}")

    probe: tuple[str, ...] = ()  # a quick command that succeeds only where the runtime can run here

    def usable(self) -> tuple[bool, str]:
        """Can this runtime start a container on this machine? (ok, one-line reason if not)"""
        if not self.probe:
            return True, ""
        ok, detail = run_probe(self.probe)
        return ok, "" if ok else detail


class BareMetal(Runtime):
    """The reference every container is compared with: the venv's Python on the host."""

    name = "bare-metal"

    def __init__(self, python: str):
        self.python = python

    def rank_argv(self, request: RunRequest) -> list[str]:
        return [self.python, "-m", request.module, *request.args]


def _pass_flags(prefixes) -> list[str]:
    return [word for prefix in prefixes for word in ("--pass-prefix", prefix)]


# A registry reference pinned to one image: NAME@sha256:<64 hex digits> (OCI image spec, "Digests").
PINNED = re.compile(r"@sha256:[0-9a-f]{64}$")
IMAGE_FILE_SUFFIXES = (".sif", ".sqsh", ".squashfs", ".tar", ".tar.gz")


def is_image_path(image: str) -> bool:
    """A file or directory (SIF, squashfs, unpacked tree), not a registry reference."""
    return image.startswith(("/", "./", "../")) or image.endswith(IMAGE_FILE_SUFFIXES)


class ContainerRuntime(Runtime):
    """Runs the benchmark with the image's Python; `image` is the runtime's own image reference."""

    pmix_gds_hash = True
    # A command that succeeds when `image` (appended) is in this machine's local image store.
    in_local_store: tuple[str, ...] = ()

    def site_image_problem(self) -> str | None:
        """What is wrong with an image the site supplies instead of the built one, in one line:
        a file must exist (checked on the compute nodes too, by the pre-flight check), and a registry
        reference must be pinned by digest, so every run of the sweep measures the same image."""
        where = f"'images.{self.name}.image' = {self.image!r}"
        if is_image_path(self.image):
            if self.available == "everywhere" and not os.path.exists(self.image):
                return f"{where} does not exist; allowed: an existing file or directory, or a pinned reference"
            return None
        if PINNED.search(self.image):
            return None
        if self.in_local_store and self.available == "everywhere":
            found = subprocess.run([*self.in_local_store, self.image], capture_output=True, timeout=60,
                                   env=engine_env(self.in_local_store[0]))
            if found.returncode == 0:
                return None  # an image built here, in the engine's own store, by id or tag
        return (f"{where} is neither a file nor pinned by digest; allowed: NAME@sha256:<digest>, "
                "a path, or an image in the local store")

    def __init__(self, image: str, python: str = "python3", extra_args=()):
        self.image, self.python, self.extra_args = image, python, list(extra_args)

    def command(self, request: RunRequest) -> list[str]:
        return [self.python, "-m", request.module, *request.args]

    def environment(self, request: RunRequest) -> dict[str, str]:
        extra = {"PMIX_MCA_gds": "hash"} if self.pmix_gds_hash else {}
        return {**super().environment(request), "PYTHONNOUSERSITE": "1", **extra}

    @staticmethod
    def workdir(request: RunRequest) -> str:
        return os.path.abspath(request.workdir)

    def mounts(self, request: RunRequest) -> list[str]:
        return list(dict.fromkeys([self.workdir(request), *map(os.path.abspath, request.binds)]))


class OciEngine(ContainerRuntime):
    """Docker-style engines: the container is a fresh namespace set, so the run opts back into the host's."""

    binary = ""
    shared_paths: tuple[str, ...] = ("/tmp",)  # Open MPI/PMIx session directories live under /tmp

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None):
        super().__init__(image, python, extra_args)
        # Numeric ids fixed at plan time: outputs on bound paths belong to the user, not root.
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid

    def engine_args(self) -> list[str]:
        return [self.binary, "run"]

    def user_args(self) -> list[str]:
        return ["--user", f"{self.uid}:{self.gid}"]

    def gpu_args(self) -> list[str]:
        raise NotImplementedError

    def env_args(self, request: RunRequest) -> list[str]:
        """`--env NAME` (value copied from the engine's environment) for what no rank prefix covers."""
        names = sorted(name for name in self.environment(request) if not name.startswith(RANK_PREFIXES))
        return [word for name in names for word in ("--env", name)]

    def run_argv(self, request: RunRequest) -> list[str]:
        # Host network/IPC/PIDs: NCCL and MPI reach peers and share memory as on bare metal. With
        # --ipc host Docker mounts the host's /dev/shm (moby daemon setupIpcDirs), which NCCL needs to
        # use SHM/P2P between containers (NVIDIA/nccl#248); --pid host keeps peer PIDs valid for
        # cross-memory attach (Sarus user guide, "PID namespace"). No name: ranks run in parallel.
        argv = [*self.engine_args(), "--rm", "--network", "host", "--ipc", "host", "--pid", "host",
                *self.user_args(),
                # `run` attaches to the container's streams, not to the engine's log store
                # (docker/compose-cli#1615; conmon "none", containers/conmon#172): no second copy.
                "--log-driver", "none"]
        # NVIDIA Container Toolkit: NVIDIA_VISIBLE_DEVICES=void behaves as runc, no GPU even where the
        # image says "all" and nvidia is the default runtime (toolkit docs, "GPU Enumeration").
        argv += self.gpu_args() if request.gpus else ["--env", "NVIDIA_VISIBLE_DEVICES=void"]
        if request.infiniband:
            # A --device directory adds every device node under it (moby and podman DevicesFromPath);
            # verbs memory registration needs locked memory: unlimited, with CAP_IPC_LOCK; never --privileged.
            argv += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
        for path in dict.fromkeys([*self.shared_paths, *self.mounts(request)]):
            argv += ["--volume", f"{path}:{path}"]
        argv += ["--workdir", self.workdir(request), *self.env_args(request)]
        return [*argv, *self.extra_args, self.image, *self.command(request)]

    def rank_argv(self, request: RunRequest) -> list[str]:
        return self.run_argv(request)


class Docker(OciEngine):
    """docker run. The client passes no environment, and names must be explicit (no wildcard), so the
    rank variables are added on the node by the rankexec shim, run with the workflow's own Python."""

    name = binary = "docker"
    probe = ("docker", "info", "--format", "{{.ServerVersion}}")  # the daemon must answer
    in_local_store = ("docker", "image", "inspect", "--format", "{{.Id}}")

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, host_python: str = sys.executable):
        super().__init__(image, python, extra_args, uid, gid)
        self.host_python = host_python

    def gpu_args(self) -> list[str]:
        # The daemon creates the container outside the Slurm task's device cgroup: it sees every GPU,
        # and Slurm's CUDA_VISIBLE_DEVICES (renumbered under ConstrainDevices) would point elsewhere, so
        # it is not passed; each rank pins GPU local_rank (bench.configure_devices).
        return ["--gpus", "all"]  # NVIDIA Container Toolkit, "docker run --gpus" (Docker >= 19.03)

    def rank_argv(self, request: RunRequest) -> list[str]:
        # The rank's CPU binding, passed on by the shim: dockerd starts the container outside it.
        return [self.host_python, "-m", RANKEXEC, *_pass_flags(RANK_PREFIXES), "--cpuset-from-affinity", "--",
                *self.run_argv(request)]


class Podman(OciEngine):
    """podman run. `--env 'PREFIX*'` copies every host variable with that prefix (podman-run(1)
    --env), so no shim. oci_runtime picks the OCI runtime (e.g. "runc" where crun fails on hybrid
    cgroups); None keeps the site's default."""

    name = binary = "podman"
    probe = ("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}")
    in_local_store = ("podman", "image", "exists")  # podman-image-exists(1)
    shared_paths = ("/tmp", "/dev/shm")  # podman-hpc's MPI modules bind /dev/shm besides --ipc=host

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, oci_runtime: str | None = None):
        super().__init__(image, python, extra_args, uid, gid)
        self.oci_runtime = oci_runtime

    def engine_args(self) -> list[str]:
        return [self.binary, *(["--runtime", self.oci_runtime] if self.oci_runtime else []), "run"]

    def user_args(self) -> list[str]:
        # Rootless podman maps the user to root by default; keep-id maps UID:GID to themselves
        # (podman-run(1) --userns; not allowed for root, who needs no mapping).
        keep_id = ["--userns", "keep-id"] if self.uid != 0 else []
        return [*keep_id, *super().user_args()]

    def gpu_args(self) -> list[str]:
        return ["--device", "nvidia.com/gpu=all"]  # CDI spec from `nvidia-ctk cdi generate` (toolkit docs)

    def env_args(self, request: RunRequest) -> list[str]:
        patterns = [prefix + "*" if prefix.endswith("_") else prefix for prefix in RANK_PREFIXES]
        return [*(word for pattern in patterns for word in ("--env", pattern)), *super().env_args(request)]


class PodmanHPC(Podman):
    """NERSC's podman-hpc wrapper (rootless podman, squashed images). Its own --mpi/--openmpi-pmix
    modules add --privileged (etc/modules.d/*.yaml), so this class passes the host namespaces and
    rank variables itself, as they do, and uses only the --gpu module."""

    name = binary = "podman-hpc"
    probe = ("podman-hpc", "info")
    in_local_store = ()  # podman-hpc runs its squashed copies, not podman's store

    # No oci_runtime: podman-hpc picks crun or runc itself (podman_hpc/siteconfig.py).
    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None):
        super().__init__(image, python, extra_args, uid, gid)

    def gpu_args(self) -> list[str]:
        return ["--gpu"]  # module gpu.yaml: driver libraries, /dev/nvidia*, NVIDIA_VISIBLE_DEVICES


class Apptainer(ContainerRuntime):
    """apptainer (or singularity) exec of a .sif. The host environment passes by default; --cleanenv
    drops it, and APPTAINERENV_NAME on the host still sets NAME inside (user guide, "Environment and
    Metadata"), also for values with commas that --env would split. The launcher sets the benchmark's
    variables in that form; the rankexec shim exports the rank variables so on the node."""

    def __init__(self, image: str, python: str = "python3", extra_args=(), binary: str = "apptainer",
                 host_python: str = sys.executable):
        if binary not in ("apptainer", "singularity"):
            raise ValueError(f"runtime 'apptainer': binary {binary!r} is not allowed; allowed: apptainer, singularity")
        super().__init__(image, python, extra_args)
        self.name, self.host_python = binary, host_python
        self.probe = (binary, "--version")
        self.env_prefix = f"{binary.upper()}ENV_"

    def environment(self, request: RunRequest) -> dict[str, str]:
        return {self.env_prefix + name: value for name, value in super().environment(request).items()}

    def rank_argv(self, request: RunRequest) -> list[str]:
        shim = [self.host_python, "-m", RANKEXEC, "--env-prefix", self.env_prefix,
                *_pass_flags(RANK_PREFIXES + SLURM_GPU_VARS), "--"]
        # Host /dev (so /dev/infiniband and /dev/shm), /tmp and the network are shared by default;
        # --nv binds the host's NVIDIA driver libraries (user guide, "GPU Support").
        argv = [self.name, "exec", "--cleanenv", *(["--nv"] if request.gpus else [])]
        for path in self.mounts(request):
            argv += ["--bind", path]
        return [*shim, *argv, "--pwd", self.workdir(request), *self.extra_args, self.image, *self.command(request)]


class Shifter(ContainerRuntime):
    """shifter --image=docker:name:tag (or id:...). Shifter passes the whole host environment, the
    image's ENV overriding it, and has no option to clean it (shifter(1) usage, "Environmental
    Transfer"); it shares the host's network, /dev and memlock limit. --volume mount points must exist
    in the image and may not lie under /dev, /etc, /opt/udiImage, /proc or /var."""

    name = "shifter"
    probe = ("shifter",)

    def __init__(self, image: str, python: str = "python3", extra_args=(), mpi_hook: bool = False):
        super().__init__(image, python, extra_args)
        self.mpi_hook = mpi_hook

    def site_image_problem(self) -> str | None:
        # An image id from `shifterimg lookup` pins the image (shifter(1): --image=id:<id>).
        if self.image.startswith("id:") or PINNED.search(self.image):
            return None
        return (f"'images.shifter.image' = {self.image!r} is not pinned; allowed: id:<id> from `shifterimg lookup`, "
                "or docker:NAME@sha256:<digest>")

    def rank_argv(self, request: RunRequest) -> list[str]:
        # Modules (udiRoot.conf): gpu injects the driver, mpich swaps the site's MPICH-ABI libmpi in.
        # Naming modules replaces the site's defaultModules, so with none we say "none": nothing is
        # swapped in behind the benchmark's back.
        modules = [*(["gpu"] if request.gpus else []), *(["mpich"] if self.mpi_hook else [])]
        argv = ["shifter", f"--image={self.image}", f"--module={','.join(modules) or 'none'}"]
        argv += [f"--volume={path}:{path}" for path in self.mounts(request)]
        return [*argv, f"--workdir={self.workdir(request)}", *self.extra_args, "--", *self.command(request)]


@functools.cache
def ch_run_has_write_fake() -> bool:
    try:
        shown = subprocess.run(["ch-run", "--help"], capture_output=True, text=True, timeout=20, env=host_environment())
    except (OSError, subprocess.TimeoutExpired):
        return True  # not installed here: print what current Charliecloud takes
    return "--write-fake" in shown.stdout + shown.stderr


class Charliecloud(ContainerRuntime):
    """ch-run on an image directory or SquashFS. Host network, /dev, /sys, /tmp are shared; the host
    environment passes unless unset (ch-run(1), "Environment variables"); the image's ENV, loaded
    after the unset, wins over a host value of the same name. GPU libraries are injected
    into the image beforehand (ch-fromhost --nvidia), so nothing is needed at run time. write_fake
    overlays a tmpfs so bind mount points can be created (kernel >= 5.11); without it they must exist."""

    name = "charliecloud"
    probe = ("ch-run", "--version")
    MOUNT_POINTS = ("/mnt", "/media", "/srv")  # empty in Debian/Ubuntu bases

    def __init__(self, image: str, python: str = "python3", extra_args=(), write_fake: bool | None = None):
        super().__init__(image, python, extra_args)
        # None: use it where this ch-run has it (0.32 and later; Debian 12 ships 0.31).
        self.write_fake = ch_run_has_write_fake() if write_fake is None else write_fake

    def keep_glob(self, request: RunRequest) -> str:
        """Extended glob of the variables to keep (`ch-run --feature=extglob` must succeed)."""
        keep = [prefix + "*" if prefix.endswith("_") else prefix for prefix in RANK_PREFIXES]
        own = sorted(name for name in self.environment(request) if not name.startswith(RANK_PREFIXES))
        return "!(" + "|".join([*keep, *SLURM_GPU_VARS, "HOME", *own]) + ")"

    def moved_binds(self, request: RunRequest) -> dict[str, str]:
        """Without --write-fake (ch-run < 0.32) a bind needs its mount point in the image ("can't mkdir:
        Read-only file system"): each bind goes to an empty directory every Debian-based image has, and
        the arguments and variables naming it (a dataset, the clone's src/ on PYTHONPATH, the telemetry
        directory) are rewritten to match."""
        if self.write_fake:
            return {}
        sources = list(dict.fromkeys(map(os.path.abspath, request.binds)))
        if len(sources) > len(self.MOUNT_POINTS):
            raise ValueError(f"runtime 'charliecloud': {len(sources)} binds need --write-fake (ch-run >= 0.32); "
                             f"allowed without it: at most {len(self.MOUNT_POINTS)}")
        return dict(zip(sources, self.MOUNT_POINTS))

    def environment(self, request: RunRequest) -> dict[str, str]:
        moved = self.moved_binds(request)
        return {name: moved.get(value, value) for name, value in super().environment(request).items()}

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --join: ranks of a node share one container, else cross-memory attach between them fails.
        # --unset-env and --set-env apply in command-line order: drop all but what is kept, then load
        # the image's ENV from /ch/environment (written by ch-image).
        argv = ["ch-run", "--join", f"--unset-env={self.keep_glob(request)}", "--set-env",
                *(["--write-fake"] if self.write_fake else [])]
        if self.write_fake:
            argv += [f"--bind={path}" for path in self.mounts(request)]
            return [*argv, f"--cd={self.workdir(request)}", *self.extra_args, self.image, "--", *self.command(request)]
        # The benchmark needs nothing else from the work directory.
        moved = self.moved_binds(request)
        argv += [f"--bind={source}:{target}" for source, target in moved.items()]
        command = [moved.get(word, word) for word in self.command(request)]
        return [*argv, "--cd=/", *self.extra_args, self.image, "--", *command]


class Enroot(ContainerRuntime):
    """Enroot images run through Pyxis: `srun --container-image=IMAGE ... python3 -m ...`, so the
    runtime contributes srun options (launcher_options) and requires launcher srun. Pyxis sets the
    task's whole environment in the container, the image's values winning except for names given to
    --container-env (pyxis args.c). Enroot hooks do the rest from variables: 98-nvidia.sh exposes
    NVIDIA_VISIBLE_DEVICES (void: none), 99-mellanox.sh the HCAs in MELLANOX_VISIBLE_DEVICES, and
    50-slurm-pmix.sh binds the PMIx server directories."""

    name = "enroot"
    probe = ("enroot", "version")
    requires_launcher = "srun"
    pmix_gds_hash = False

    def environment(self, request: RunRequest) -> dict[str, str]:
        env = super().environment(request)
        if request.gpus:  # the hook's default capability is utility only: compute brings libcuda
            env |= {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        if request.infiniband:
            env["MELLANOX_VISIBLE_DEVICES"] = "all"
        return env

    def launcher_options(self, request: RunRequest) -> list[str]:
        mounts = ",".join(f"{path}:{path}" for path in self.mounts(request))
        return [f"--container-image={self.image}", f"--container-mounts={mounts}",
                f"--container-workdir={self.workdir(request)}",
                f"--container-env={','.join(sorted(self.environment(request)))}", *self.extra_args]

    def rank_argv(self, request: RunRequest) -> list[str]:
        return self.command(request)


class Sarus(ContainerRuntime):
    """sarus run. The host environment passes, the image's ENV overrides it, and `--env NAME` without
    a value takes the host's value back (user guide, "Environment"); GPUs follow CUDA_VISIBLE_DEVICES
    through the NVIDIA hook, set by Slurm. mpi_hook adds --mpi: the site's MPICH-ABI MPI is swapped
    in. Devices are denied unless given one by one with --device, so the rankexec shim adds the
    node's RDMA devices (those Enroot's 99-mellanox.sh mounts) at rank start."""

    name = "sarus"
    probe = ("sarus", "--version")
    rdma_devices = ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs*")

    def __init__(self, image: str, python: str = "python3", extra_args=(), mpi_hook: bool = False,
                 host_python: str = sys.executable):
        super().__init__(image, python, extra_args)
        self.mpi_hook, self.host_python = mpi_hook, host_python

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --pid host is Sarus's default; --mount destinations and --workdir are created if missing.
        argv = ["sarus", "run", *(["--mpi"] if self.mpi_hook else [])]
        argv += [f"--mount=type=bind,source={path},destination={path}" for path in self.mounts(request)]
        argv += [f"--workdir={self.workdir(request)}"]
        argv += [word for name in sorted(self.environment(request)) for word in ("--env", name)]
        argv += [*self.extra_args, self.image, *self.command(request)]
        if not request.infiniband:
            return argv
        devices = [word for pattern in self.rdma_devices for word in ("--device-glob", pattern)]
        return [self.host_python, "-m", RANKEXEC, *devices, "--", *argv]


CONTAINER_RUNTIMES = {"docker": Docker, "podman": Podman, "apptainer": Apptainer, "singularity": Apptainer,
                      "shifter": Shifter, "charliecloud": Charliecloud, "enroot": Enroot, "sarus": Sarus,
                      "podman-hpc": PodmanHPC}
RUNTIME_NAMES = ("bare-metal", *CONTAINER_RUNTIMES)


def runtime_for(name: str, config: dict) -> Runtime:
    """The runtime called `name`; container runtimes read config["images"][name] = {image: ..., options}."""
    if name == "bare-metal":
        return BareMetal(config["bare_metal"]["python"])
    if name not in CONTAINER_RUNTIMES:
        raise ValueError(f"runtime {name!r} is not supported; allowed: {', '.join(RUNTIME_NAMES)}")
    options = dict((config.get("images") or {}).get(name) or {})
    launch_options = {key: options.pop(key) for key in LAUNCH_OPTIONS if key in options}
    image = options.pop("image", None)
    if not isinstance(image, str) or not image:
        raise ValueError(f"runtime {name!r} needs an image reference: set images.{name}.image in the config")
    cls = CONTAINER_RUNTIMES[name]
    allowed = sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "image", "binary"})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"runtime {name!r}: unknown option {', '.join(map(repr, unknown))} in images.{name}; "
                         f"allowed: image, {', '.join(allowed)}")
    if cls is Apptainer:
        options["binary"] = name
    runtime = cls(image, **options)
    for key, value in launch_options.items():
        setattr(runtime, key, value)
    return runtime



def engine_usable(engine: str) -> tuple[bool, str]:
    """Can `engine` build or convert images here? Its runtime class's own probe (for docker:
    the daemon answers), run in the environment the image steps use."""
    ok, detail = run_probe(CONTAINER_RUNTIMES[engine].probe, env=engine_env(engine), timeout=30)
    if not ok and engine == "docker" and shutil.which("docker"):  # installed, but which daemon was asked
        detail += f" (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'the default socket')})"
    return ok, detail


def check_launchers(config: dict) -> None:
    """Every runtime of the sweep takes its options and runs under the configured launcher (Enroot
    needs srun); ValueError names the one that does not."""
    for name in config["runtimes"]:
        runtime_for(name, config).check_launcher(config["launcher"]["kind"])


def select_runtimes(config: dict, built: dict[str, str]) -> dict[str, str]:
    """Probe each container runtime (and, for those that run the built image, the build engine);
    apply runtime_policy. Return {skipped runtime: reason}.

    Under `require` an unusable runtime is a ConfigError; under `skip-unusable` it
    is removed from config["runtimes"] and its reason returned for the report.
    """
    build_ok, build_reason = engine_usable(config["images"]["build"]["engine"]) if built else (True, "")
    unusable = {}
    for name in config["runtimes"]:
        if name == "bare-metal":
            continue
        runtime = runtime_for(name, config)
        if runtime.available == "compute-nodes":
            continue  # the pre-flight check probes it where it runs (containerbench.preflight)
        ok, reason = runtime.usable()
        if ok and name in built and not build_ok:
            ok, reason = False, f"the image cannot be built here: {build_reason}"
        if not ok:
            unusable[name] = reason
    if unusable and config["runtime_policy"] == "require":
        name, reason = next(iter(unusable.items()))
        raise ConfigError(f"config: runtime {name!r} cannot run here: {reason}; allowed: install it, give "
                          "images.<runtime>.image, or set runtime_policy: skip-unusable")
    config["runtimes"] = [name for name in config["runtimes"] if name not in unusable]
    return unusable
