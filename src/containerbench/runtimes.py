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
the server's socket: apptainer/singularity#5195; Enroot's 50-slurm-pmi.sh hook
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

from containerbench.config import IMAGE_KEYS, ConfigError, ImageUse, image_key, mpi_models

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
    ranks_per_node: int = 1  # the rank's peers on its node, itself included


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


@dataclass(frozen=True)
class BuiltImage:
    """The one image the workflow builds (containers/Dockerfile, by `engine`) and where the files
    made from it go. Every file is named after the tag, so a file made from another image (or by
    hand) is never taken for this one."""

    tag: str
    engine: str = "podman"
    build_dir: str = "build/images"
    gpus: bool = False  # runs give the ranks GPUs: a runtime may need the host's driver in its image

    @property
    def name(self) -> str:
        """NAME:TAG, the tag without its registry."""
        return self.tag.rsplit("/", 1)[-1]

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)

    def file(self, suffix: str) -> str:
        return f"{self.build_dir}/{self.slug}{suffix}"

    @property
    def archive(self) -> str:
        """The docker archive every converting runtime starts from."""
        return self.file(".tar")

    @property
    def definition(self) -> str:
        """containers/Dockerfile as a Singularity definition (containerbench.singularity)."""
        return self.file(".def")


# Options of images.<runtime> that are about launching, not about the runtime's own argv.
LAUNCH_OPTIONS = ("srun_mpi", "available", "package", "mpi_model")
MPI_MODELS = ("hybrid", "native")


@dataclass(frozen=True)
class NativeMpi:
    """The native MPI model: the image's MPICH-ABI libmpi is replaced at run time by the host's.
    `library` is the host's (on every node, at this path), `image_library` the file in the image it
    replaces; the rank loads the host's under the image's file name, which LD_LIBRARY_PATH finds
    for every later library that links libmpi.so.12 (the host's file has its own soname, e.g.
    Debian's libmpich.so.12)."""

    library: str = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"
    image_library: str = "/opt/containerbench/venv/lib/libmpi.so.12"

    @property
    def bind(self) -> tuple[str, str]:
        return self.library, self.image_library

    @property
    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": os.path.dirname(self.image_library)}


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
    launcher: str = "none"  # the launcher kind its ranks start under (runtime_for sets the config's)
    # hybrid: the image's own MPI, wired up by the host's launcher; native: the host's MPICH-ABI libmpi
    # swapped in (native_mpi). native_support says how this runtime does it, by its documentation;
    # None: it cannot.
    mpi_model: str = "hybrid"
    native_mpi: NativeMpi = NativeMpi()
    native_support: str | None = None

    def rank_argv(self, request: RunRequest) -> list[str]:
        raise NotImplementedError

    def environment(self, request: RunRequest) -> dict[str, str]:
        return {"CONTAINERBENCH_RUNTIME": self.name, **request.env, **self.native_env()}

    @property
    def native(self) -> bool:
        return self.mpi_model == "native"

    def native_env(self) -> dict[str, str]:
        """What the native model adds to a rank's environment (the bind model's LD_LIBRARY_PATH)."""
        return self.native_mpi.env if self.native and self.native_support == "bind" else {}

    def check_mpi_model(self) -> None:
        if self.mpi_model not in MPI_MODELS:
            raise ValueError(f"runtime {self.name!r}: mpi_model {self.mpi_model!r} is not allowed; "
                             f"allowed: {', '.join(MPI_MODELS)}")
        if self.native and self.native_support is None:
            raise ValueError(f"runtime {self.name!r} has no documented way to swap the host's MPI in; "
                             "allowed: mpi_model hybrid")

    def launcher_options(self, request: RunRequest) -> list[str]:
        return []

    def check_launcher(self, kind: str) -> None:
        if self.requires_launcher and kind != self.requires_launcher:
            raise ValueError(f"runtime {self.name!r} needs launcher {self.requires_launcher!r}, not {kind!r}")

    probe: tuple[str, ...] = ()  # a quick command that succeeds only where the runtime can run here

    # -- the image it runs: made from the built image by its prepare commands --
    # True where the artifact is a stamp naming an image in the runtime's own store (written after the
    # prepare commands), not the file they make.
    artifact_is_stamp = False

    @classmethod
    def artifact(cls, built: BuiltImage) -> str | None:
        """The file made from the built image that this runtime's runs depend on (a Snakemake
        output); None where it cannot take a local build (Shifter's gateway pulls from a registry)."""
        return None

    @classmethod
    def reference(cls, built: BuiltImage) -> str | None:
        """What a rank's argv names to run the built image: by default the artifact itself."""
        return cls.artifact(built)

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        """The commands that make the artifact from the built image (ReFrame's emit_prepare_commands)."""
        return []

    def usable(self) -> tuple[bool, str]:
        """Can this runtime start a container on this machine? (ok, one-line reason if not)"""
        if not self.probe:
            return True, ""
        ok, detail = run_probe(self.probe)
        return ok, "" if ok else detail


class BareMetal(Runtime):
    """The reference every container is compared with: the venv's Python on the host."""

    name = "bare-metal"
    mpi_model = "host"  # the venv's mpi4py and Horovod with the host's MPI: no container to swap it into

    def __init__(self, python: str):
        self.python = python

    def rank_argv(self, request: RunRequest) -> list[str]:
        return [self.python, "-m", request.module, *request.args]


def move_binds(runtime: str, request: RunRequest, mount_points: tuple[str, ...],
               remedy: str = "fewer binds") -> dict[str, str]:
    """For a runtime that binds only onto mount points the image already has: each bind goes to an
    empty directory every Debian/Ubuntu image has, and the arguments and variables naming it (a
    dataset, the clone's src/ on PYTHONPATH, the telemetry directory) are rewritten to match. The
    work directory is not bound: the benchmark needs nothing else from it."""
    sources = list(dict.fromkeys(map(os.path.abspath, request.binds)))
    if len(sources) > len(mount_points):
        raise ValueError(f"runtime {runtime!r}: {len(sources)} binds need {remedy}; "
                         f"allowed: at most {len(mount_points)} ({', '.join(mount_points)})")
    return dict(zip(sources, mount_points))


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

    @staticmethod
    def image_is_file(image: str) -> bool:
        """Does the runtime read `image` as a file (or directory) rather than a registry reference?"""
        return is_image_path(image)

    def site_image_problem(self) -> str | None:
        """What is wrong with an image the site supplies instead of the built one, in one line:
        a file must exist (checked on the compute nodes too, by the pre-flight check), and a registry
        reference must be pinned by digest, so every run of the sweep measures the same image."""
        where = f"'images.{self.name}.image' = {self.image!r}"
        if self.image_is_file(self.image):
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

    def moved_binds(self, request: RunRequest) -> dict[str, str]:
        """Host path -> where it is bound, for a runtime that cannot bind at the same path (move_binds);
        the command's words and the variables naming a moved path follow it."""
        return {}

    def command(self, request: RunRequest) -> list[str]:
        moved = self.moved_binds(request)
        return [moved.get(word, word) for word in (self.python, "-m", request.module, *request.args)]

    def environment(self, request: RunRequest) -> dict[str, str]:
        extra = {"PMIX_MCA_gds": "hash"} if self.pmix_gds_hash else {}
        moved = self.moved_binds(request)
        env = {**super().environment(request), "PYTHONNOUSERSITE": "1", **extra}
        return {name: moved.get(value, value) for name, value in env.items()}

    @staticmethod
    def workdir(request: RunRequest) -> str:
        return os.path.abspath(request.workdir)

    def mounts(self, request: RunRequest) -> list[str]:
        return list(dict.fromkeys([self.workdir(request), *map(os.path.abspath, request.binds)]))


class OciEngine(ContainerRuntime):
    """Docker-style engines: the container is a fresh namespace set, so the run opts back into the host's."""

    binary = ""
    native_support = "bind"  # the host's libmpi bound over the image's (a file bind: --volume FILE:FILE)
    artifact_is_stamp = True
    shared_paths: tuple[str, ...] = ("/tmp",)  # Open MPI/PMIx session directories live under /tmp

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None):
        super().__init__(image, python, extra_args)
        # Numeric ids fixed at plan time: outputs on bound paths belong to the user, not root.
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        """The stamp written once the image is in this engine's store (its id and measured provenance)."""
        return f"{built.build_dir}/{cls.name}-{built.slug}.json"

    @classmethod
    def reference(cls, built: BuiltImage) -> str:
        return built.tag

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # The build engine has the image already; the other loads its archive (docker-load(1), podman-load(1)).
        return [] if built.engine == cls.binary else [[cls.binary, "load", "-i", built.archive]]

    def engine_args(self) -> list[str]:
        return [self.binary, "run"]

    def user_args(self) -> list[str]:
        return ["--user", f"{self.uid}:{self.gid}"]

    def gpu_args(self) -> list[str]:
        raise NotImplementedError

    def native_args(self) -> list[str]:
        host, image = self.native_mpi.bind
        return ["--volume", f"{host}:{image}:ro"] if self.native else []

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
        argv += self.native_args()
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
        # The rank's CPU binding and memory limit, passed on by the shim: dockerd starts the container
        # outside the Slurm step's cgroup (nebius/soperator#563), so bare metal and docker ranks would differ.
        return [self.host_python, "-m", RANKEXEC, *_pass_flags(RANK_PREFIXES), "--cpuset-from-affinity",
                "--memory-from-cgroup", "--",
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

    rank_prefixes = RANK_PREFIXES

    def environment(self, request: RunRequest) -> dict[str, str]:
        env = super().environment(request)
        if self.uid != 0:
            # keep-id puts each rank's container in its own user namespace, where UCX's posix shared
            # memory cannot open a peer's /proc/<pid>/fd link (openucx/ucx#4224): the maintainers'
            # workaround shares the segment by its file name in the bound /dev/shm instead. Open MPI's
            # own CMA skips itself across user namespaces (open-mpi/ompi#6844, in 4.0.2 and later).
            env["UCX_POSIX_USE_PROC_LINK"] = "n"
        return env

    def env_args(self, request: RunRequest) -> list[str]:
        patterns = [prefix + "*" if prefix.endswith("_") else prefix for prefix in self.rank_prefixes]
        return [*(word for pattern in patterns for word in ("--env", pattern)), *super().env_args(request)]


class PodmanHPC(Podman):
    """NERSC's podman-hpc wrapper (rootless podman, squashed images). Its --openmpi-pmix module adds
    --privileged (etc/modules.d/*.yaml), so in the hybrid model this class passes the host namespaces,
    binds and rank variables itself, as that module does, and uses only the --gpu module; the native
    model is its --mpi module."""

    name = binary = "podman-hpc"
    probe = ("podman-hpc", "info")
    in_local_store = ()  # podman-hpc runs its squashed copies, not podman's store

    SLURM_PATHS = ("/var/spool/slurmd", "/run/munge")

    # No oci_runtime: podman-hpc picks crun or runc itself (podman_hpc/siteconfig.py).
    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, slurm_paths=SLURM_PATHS):
        super().__init__(image, python, extra_args, uid, gid)
        self.slurm_paths = tuple(slurm_paths)

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # Load into podman-hpc's podman, then squash it where the compute nodes read it (podman-hpc README).
        return [["podman-hpc", "load", "-i", built.archive], ["podman-hpc", "migrate", built.tag]]

    # What podman-hpc's openmpi-pmix module adds for a Slurm-launched Open MPI rank, without its
    # --privileged (etc/modules.d/openmpi-pmix.yaml): slurmd's spool (the PMIx server's rendezvous
    # files), munge's socket, and the SLURMD_* variables besides SLURM_*/PMIX_*/PMI_*.
    rank_prefixes = (*RANK_PREFIXES, "SLURMD_")

    @property
    def shared_paths(self) -> tuple[str, ...]:
        # Only under srun: a bind whose source is missing makes `podman run` fail (slurm_paths: the
        # site's SlurmdSpoolDir and munge socket directory, where they differ).
        return ("/tmp", "/dev/shm", *(self.slurm_paths if self.launcher == "srun" else ()))

    def mounts(self, request: RunRequest) -> list[str]:
        # The host's verbs provider configuration, which the image's libibverbs reads (the same modules).
        return [*(["/etc/libibverbs.d"] if request.infiniband else []), *super().mounts(request)]

    # Native: the mpich module (etc/modules.d/mpich.yaml, `--mpi`) binds the site's MPICH into
    # /opt/udiImage/modules/mpich and sets LD_LIBRARY_PATH; it also adds --privileged and turns the
    # run into shared-run, which is podman-hpc's own choice, not ours.
    native_support = "module"

    def gpu_args(self) -> list[str]:
        return ["--gpu"]  # module gpu.yaml: driver libraries, /dev/nvidia*, NVIDIA_VISIBLE_DEVICES

    def native_args(self) -> list[str]:
        return ["--mpi"] if self.native else []


class Apptainer(ContainerRuntime):
    """apptainer (or singularity) exec of a .sif. The host environment passes by default; --cleanenv
    drops it, and APPTAINERENV_NAME on the host still sets NAME inside (user guide, "Environment and
    Metadata"), also for values with commas that --env would split. The launcher sets the benchmark's
    variables in that form; the rankexec shim exports the rank variables so on the node."""

    name = binary = "apptainer"
    probe = ("apptainer", "--version")
    env_prefix = "APPTAINERENV_"
    # The user guide's "Bind model" (MPI page): the host's MPI bound into the container, found by
    # LD_LIBRARY_PATH.
    native_support = "bind"

    # userns: ranks run in unprivileged user namespaces (the default without a setuid installation,
    # "apptainer buildcfg" / --userns); false for a setuid installation, where UCX needs no workaround.
    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable,
                 userns: bool = True):
        super().__init__(image, python, extra_args)
        self.host_python, self.userns = host_python, userns

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        return built.file(".sif")

    @classmethod
    def build_argv(cls, sif: str, source: str) -> list[str]:
        # No --fakeroot: an unprivileged build of a definition file implies it, and a build from an
        # archive runs nothing inside the image (user guide, "Fakeroot feature").
        return [cls.binary, "build", sif, source]

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # The archive `docker save` wrote, in the form the user guide documents ("docker-archive:FILE").
        return [cls.build_argv(cls.artifact(built), f"docker-archive:{built.archive}")]

    def environment(self, request: RunRequest) -> dict[str, str]:
        env = super().environment(request)
        if "UCX_TLS" in env and self.userns:
            # Each rank's container is its own unprivileged user namespace, where UCX's shared-memory
            # transports fail; the user guide's workaround is the sysv transport (MPI page, "UCX_TLS=sysv,ib",
            # apptainer#769): sm (every shared-memory transport), posix and cma become sysv.
            kept = [tl for tl in env["UCX_TLS"].split(",") if tl not in ("sm", "posix", "cma", "sysv")]
            shared = any(tl in ("sm", "posix", "cma", "sysv") for tl in env["UCX_TLS"].split(","))
            env["UCX_TLS"] = ",".join([*kept[:1], *(["sysv"] if shared else []), *kept[1:]])
        return {self.env_prefix + name: value for name, value in env.items()}

    def rank_argv(self, request: RunRequest) -> list[str]:
        shim = [self.host_python, "-m", RANKEXEC, "--env-prefix", self.env_prefix,
                *_pass_flags(RANK_PREFIXES + SLURM_GPU_VARS), "--"]
        # Host /dev (so /dev/infiniband and /dev/shm), /tmp and the network are shared by default;
        # --nv binds the host's NVIDIA driver libraries (user guide, "GPU Support").
        argv = [self.name, "exec", "--cleanenv", *(["--nv"] if request.gpus else [])]
        for path in self.mounts(request):
            argv += ["--bind", path]
        if self.native:
            argv += ["--bind", ":".join(self.native_mpi.bind)]
        return [*shim, *argv, "--pwd", self.workdir(request), *self.extra_args, self.image, *self.command(request)]


class Singularity(Apptainer):
    """SingularityCE (or Singularity before the rename): Apptainer's CLI under its old name."""

    name = binary = "singularity"
    probe = ("singularity", "--version")
    env_prefix = "SINGULARITYENV_"


class Shifter(ContainerRuntime):
    """Shifter: an image its gateway pulled from a registry (no local build), named docker:NAME:TAG
    or id:ID (`shifterimg lookup` prints the id). Under srun the image, volumes and modules are the
    step's (the shifter_slurm SPANK options --image/--volume/--module, which srun takes like sbatch
    and salloc; Shifter's docs, wlm/slurm.rst "Basic Job Submission and Usage"): the node's
    container is set up once, and each rank's plain `shifter` enters it, reading SHIFTER_IMAGE from
    the plugin. Options given to the shifter command instead build a new instance per rank (same
    page), which mpirun cannot avoid. --clearenv drops the host environment (shifter usage text,
    "--clearenv"); the rankexec shim passes what the rank needs as --env=NAME=VALUE when the rank
    starts. A --volume mount point must already exist in the image (usage text, "Volume
    Mapping"), so binds go to directories every Debian/Ubuntu image has, and the rank starts in /."""

    name = "shifter"
    probe = ("shifter",)
    MOUNT_POINTS = ("/mnt", "/media", "/srv")

    # Native: the site's mpich module (udiRoot.conf module_mpich_*) swaps in its MPICH-ABI libmpi.
    native_support = "module"

    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable):
        super().__init__(image, python, extra_args)
        self.host_python = host_python

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # The gateway pulls from a registry only: push there, pull, then look the id up to pin the runs
        # (`shifterimg lookup` prints the image's identifier; shifterimg.c MODE_LOOKUP).
        remote = f"{registry}/{built.name}"
        push = ([["podman", "push", built.tag, remote]] if built.engine == "podman"
                else [["docker", "tag", built.tag, remote], ["docker", "push", remote]])
        return [*push, ["shifterimg", "pull", f"docker:{remote}"], ["shifterimg", "lookup", f"docker:{remote}"]]

    def site_image_problem(self) -> str | None:
        # An image id from `shifterimg lookup` pins the image (shifter(1): --image=id:<id>).
        if self.image.startswith("id:") or PINNED.search(self.image):
            return None
        return (f"'images.shifter.image' = {self.image!r} is not pinned; allowed: id:<id> from `shifterimg lookup`, "
                "or docker:NAME@sha256:<digest>")

    def moved_binds(self, request: RunRequest) -> dict[str, str]:
        return move_binds(self.name, request, self.MOUNT_POINTS)

    def modules(self, request: RunRequest) -> str:
        # Naming modules replaces the site's defaultModules; "none" turns them all off (usage text,
        # "--module"), so nothing is swapped in behind the benchmark's back.
        modules = [*(["gpu"] if request.gpus else []), *(["mpich"] if self.native else [])]
        return ",".join(modules) or "none"

    def step_options(self, request: RunRequest) -> list[str]:
        volumes = ";".join(f"{source}:{target}" for source, target in self.moved_binds(request).items())
        return [f"--image={self.image}", f"--module={self.modules(request)}",
                *([f"--volume={volumes}"] if volumes else [])]

    def launcher_options(self, request: RunRequest) -> list[str]:
        return self.step_options(request) if self.launcher == "srun" else []

    def rank_argv(self, request: RunRequest) -> list[str]:
        names = sorted(name for name in self.environment(request) if not name.startswith(RANK_PREFIXES))
        shim = [self.host_python, "-m", RANKEXEC, "--env-form", "value", "--insert-after", "shifter",
                *_pass_flags(RANK_PREFIXES + SLURM_GPU_VARS), *(w for n in names for w in ("--pass-name", n)), "--"]
        own = [] if self.launcher == "srun" else self.step_options(request)
        return [*shim, "shifter", "--clearenv", *own, "--workdir=/", *self.extra_args, "--", *self.command(request)]


# ch-run's --write-fake arrived in Charliecloud 0.36 (PR #1793); Debian 12 ships 0.31.
WRITE_FAKE_SINCE = (0, 36)


@functools.cache
def ch_run_version() -> tuple[int, int] | None:
    """The installed ch-run's version, or None where it is not installed here."""
    try:
        shown = subprocess.run(["ch-run", "--version"], capture_output=True, text=True, timeout=20,
                               env=host_environment())
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(\d+)\.(\d+)", shown.stdout + shown.stderr)
    return (int(found[1]), int(found[2])) if found else None


class Charliecloud(ContainerRuntime):
    """ch-run on an image directory or SquashFS. Host network, /dev, /sys, /tmp are shared; the host
    environment passes unless unset (ch-run(1), "Environment variables"); the image's ENV, loaded
    after the unset, wins over a host value of the same name. GPU libraries are injected
    into the image beforehand (ch-fromhost --nvidia), so nothing is needed at run time. write_fake
    overlays a tmpfs so bind mount points can be created (kernel >= 5.11); without it they must exist."""

    name = "charliecloud"
    probe = ("ch-run", "--version")
    MOUNT_POINTS = ("/mnt", "/media", "/srv")  # empty in Debian/Ubuntu bases
    # Native: the host's libmpi bound onto the image's file (ch-run --bind takes a file onto an existing
    # file). ch-fromhost --path would copy it in under the host's own file name, beside the image's
    # libmpi.so.12, which mpi4py would still load first.
    native_support = "bind"

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        # GPU runs depend on the marker ch-fromhost's step leaves (on a GPU node), the rest on the directory.
        return built.file(".ch.nvidia") if built.gpus else built.file(".ch")

    @classmethod
    def reference(cls, built: BuiltImage) -> str:
        return built.file(".ch")

    @staticmethod
    def export_argvs(engine: str, tag: str, container: str, flat_tar: str) -> list[list[str]]:
        """The image as one flat tarball: what `ch-convert -i podman` (or docker) does first (bin/ch-convert,
        dockman_to_tar: create --read-only, export, rm), without what it does next: gzip it, only to unpack it
        again (its own comment: "FIXME: needlessly compresses"). For a 2 GB image that is 72 s of one core here."""
        return [[engine, "create", "--read-only", "--name", container, tag, "/bin/true"],
                [engine, "export", "--output", flat_tar, container],
                [engine, "rm", container]]

    @staticmethod
    def convert_argv(flat_tar: str, out: str) -> list[str]:
        # ch-convert(1), FMT tar: "the output of docker export works". It unpacks without /dev and adds
        # the mount points ch-run needs (dir_fixup), as from podman's store.
        return ["ch-convert", "-i", "tar", "-o", "dir", flat_tar, out]

    @staticmethod
    def environment_file(out: str) -> str:
        """The image's ENV, one NAME=VALUE a line: what `ch-run --set-env` reads when given no file
        (ch-run(1), "--set-env": "the file /ch/environment within the image"), written from the engine's
        inspect (Config.Env), as ch-convert's own export does."""
        return f"{out}/ch/environment"

    @staticmethod
    def export_paths(out: str) -> tuple[str, str]:
        """The container and flat tarball a conversion into OUT uses, named after it."""
        return f"{os.path.basename(out)}-export", f"{out}.tar"

    @staticmethod
    def nvidia_argv(image_dir: str) -> list[str]:
        # The host's libcuda and friends, copied into the image directory (ch-fromhost(1), --nvidia):
        # ch-run binds nothing of the host's driver at run time.
        return ["ch-fromhost", "--nvidia", image_dir]

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # Then the image's ENV into environment_file(out) (images.charliecloud_image), and the tarball removed.
        out = cls.reference(built)
        container, flat_tar = cls.export_paths(out)
        return [*cls.export_argvs(built.engine, built.tag, container, flat_tar), cls.convert_argv(flat_tar, out),
                *([cls.nvidia_argv(out)] if built.gpus else [])]

    def __init__(self, image: str, python: str = "python3", extra_args=(), write_fake: bool | None = None):
        super().__init__(image, python, extra_args)
        # None: use it where this ch-run has it; where none is installed here, print what current ch-run takes.
        if write_fake is None:
            write_fake = (ch_run_version() or WRITE_FAKE_SINCE) >= WRITE_FAKE_SINCE
        self.write_fake = write_fake

    def usable(self) -> tuple[bool, str]:
        """ch-run runs, and its --unset-env takes extended globs: without them the keep-list pattern
        matches nothing and the host environment passes whole (ch-run(1), "--unset-env"; the
        `--feature=extglob` query exists since 0.28 and exits non-zero when the feature is off)."""
        ok, reason = super().usable()
        if ok and not run_probe(("ch-run", "--feature=extglob"))[0]:
            return False, ("`ch-run --feature=extglob` failed: this ch-run has no extended globs, so "
                           "--unset-env cannot keep only the rank's variables")
        return ok, reason

    def keep_glob(self, request: RunRequest) -> str:
        """Extended glob of the variables to keep (`ch-run --feature=extglob` must succeed)."""
        keep = [prefix + "*" if prefix.endswith("_") else prefix for prefix in RANK_PREFIXES]
        own = sorted(name for name in self.environment(request) if not name.startswith(RANK_PREFIXES))
        return "!(" + "|".join([*keep, *SLURM_GPU_VARS, "HOME", *own]) + ")"

    def moved_binds(self, request: RunRequest) -> dict[str, str]:
        """Without --write-fake (ch-run < 0.36) a bind needs its mount point in the image ("can't mkdir:
        Read-only file system"), so binds move (move_binds)."""
        return {} if self.write_fake else move_binds(self.name, request, self.MOUNT_POINTS, "--write-fake (ch-run >= 0.36)")

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --join: ranks of a node share one container, else cross-memory attach between them fails.
        # --unset-env and --set-env apply in command-line order: drop all but what is kept, then load
        # the image's ENV from /ch/environment (written by ch-image).
        # ch-run counts a node's peers from OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_STEP_TASKS_PER_NODE or
        # SLURM_CPUS_ON_NODE; MPICH's Hydra (native runs under mpirun) sets none, so they are given.
        join = (["--join", f"--join-ct={request.ranks_per_node}"] if self.native and self.launcher == "mpirun"
                else ["--join"])
        argv = ["ch-run", *join, f"--unset-env={self.keep_glob(request)}", "--set-env",
                *(["--write-fake"] if self.write_fake else []),
                *([f"--bind={':'.join(self.native_mpi.bind)}"] if self.native else [])]
        if self.write_fake:
            argv += [f"--bind={path}" for path in self.mounts(request)]
            return [*argv, f"--cd={self.workdir(request)}", *self.extra_args, self.image, "--", *self.command(request)]
        # The benchmark needs nothing else from the work directory.
        argv += [f"--bind={source}:{target}" for source, target in self.moved_binds(request).items()]
        return [*argv, "--cd=/", *self.extra_args, self.image, "--", *self.command(request)]


class Enroot(ContainerRuntime):
    """Enroot images run through Pyxis: `srun --container-image=IMAGE ... python3 -m ...`, so the
    runtime contributes srun options (launcher_options) and requires launcher srun. Pyxis sets the
    task's whole environment in the container, the image's values winning except for names given to
    --container-env (pyxis args.c). Enroot hooks do the rest from variables: 98-nvidia.sh exposes
    NVIDIA_VISIBLE_DEVICES (void: none), 99-mellanox.sh the HCAs in MELLANOX_VISIBLE_DEVICES. The
    PMI hook, 50-slurm-pmi.sh, copies the SLURM_*/PMIX_*/PMI_* variables and binds the PMIx server's
    directory; it ships among enroot's extra hooks (conf/hooks/extra), installed where enroot does
    not read them, so an admin enables it: usable() checks that it is in the hooks directory."""

    name = "enroot"
    probe = ("enroot", "version")
    requires_launcher = "srun"
    pmix_gds_hash = False

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        return built.file(".sqsh")

    @classmethod
    def reference(cls, built: BuiltImage) -> str:
        # Pyxis takes --container-image as a squashfs file only when it starts with "/" or ".";
        # anything else is a registry reference (pyxis_slurmstepd.c).
        return os.path.abspath(cls.artifact(built))

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        scheme = {"docker": "dockerd", "podman": "podman"}[built.engine]  # enroot-import(1) URI schemes
        return [["enroot", "import", "-o", cls.artifact(built), f"{scheme}://{built.tag}"]]

    @staticmethod
    def image_is_file(image: str) -> bool:
        return image.startswith(("/", "."))

    def site_image_problem(self) -> str | None:
        if not self.image_is_file(self.image) and self.image.endswith(IMAGE_FILE_SUFFIXES):
            return (f"'images.enroot.image' = {self.image!r} would be pulled from a registry: Pyxis reads an image "
                    "as a file only when it starts with / or .; allowed: an absolute path, or ./ before a relative one")
        return super().site_image_problem()

    def environment(self, request: RunRequest) -> dict[str, str]:
        env = super().environment(request)
        if request.gpus:  # the hook's default capability is utility only: compute brings libcuda
            env |= {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
        else:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        if request.infiniband:
            env["MELLANOX_VISIBLE_DEVICES"] = "all"
        return env

    @staticmethod
    def pmi_hook() -> str:
        # enroot's src/runtime.sh reads hooks from ${ENROOT_SYSCONF_PATH}/hooks.d (default /etc/enroot);
        # the Makefile installs the extra hooks into $(DATADIR)/hooks.d instead.
        return os.path.join(os.environ.get("ENROOT_SYSCONF_PATH", "/etc/enroot"), "hooks.d", "50-slurm-pmi.sh")

    def usable(self) -> tuple[bool, str]:
        ok, reason = super().usable()
        if ok and not os.path.exists(self.pmi_hook()):
            return False, (f"enroot's PMI hook {self.pmi_hook()} is not enabled (an extra hook, shipped in "
                           "/usr/share/enroot/hooks.d): without it the ranks cannot reach srun's PMIx server")
        return ok, reason

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
    through the NVIDIA hook, set by Slurm. The native model adds --mpi: the site's MPICH-ABI MPI is swapped
    in. Devices are denied unless given one by one with --device, so the rankexec shim adds the
    node's RDMA devices (those Enroot's 99-mellanox.sh mounts) at rank start."""

    name = "sarus"
    probe = ("sarus", "--version")
    artifact_is_stamp = True

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        return f"{built.build_dir}/sarus-{built.slug}.json"  # names the image once it is in Sarus's store

    @classmethod
    def reference(cls, built: BuiltImage) -> str:
        # `sarus load ARCHIVE NAME:TAG` stores the image as load/library/NAME:TAG, and that is the name
        # `sarus run` takes (user guide, "Loading images from tar archives").
        return f"load/library/{built.name}"

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        return [["sarus", "load", built.archive, built.name]]
    rdma_devices = ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs*")

    native_support = "hook"  # `sarus run --mpi`: the site's MPI hook (user guide, "Native MPI support")

    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable):
        super().__init__(image, python, extra_args)
        self.host_python = host_python

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --pid host is Sarus's default; --mount destinations and --workdir are created if missing.
        argv = ["sarus", "run", *(["--mpi"] if self.native else [])]
        argv += [f"--mount=type=bind,source={path},destination={path}" for path in self.mounts(request)]
        argv += [f"--workdir={self.workdir(request)}"]
        argv += [word for name in sorted(self.environment(request)) for word in ("--env", name)]
        argv += [*self.extra_args, self.image, *self.command(request)]
        if not request.infiniband:
            return argv
        devices = [word for pattern in self.rdma_devices for word in ("--device-glob", pattern)]
        return [self.host_python, "-m", RANKEXEC, *devices, "--", *argv]


CONTAINER_RUNTIMES = {"docker": Docker, "podman": Podman, "apptainer": Apptainer, "singularity": Singularity,
                      "shifter": Shifter, "charliecloud": Charliecloud, "enroot": Enroot, "sarus": Sarus,
                      "podman-hpc": PodmanHPC}
RUNTIME_NAMES = ("bare-metal", *CONTAINER_RUNTIMES)


def runtime_for(name: str, config: dict, mpi_model: str | None = None, framework: str | None = None) -> Runtime:
    """The runtime called `name`, in `mpi_model` (default: its first); container runtimes read
    config["images"][name] = {image: ..., native_image: ..., options}. Bare metal runs the
    framework's own venv (bare_metal.python, bare_metal.torch_python), a container runtime the
    framework's image (images.<name>.torch_image and torch_native_image for PyTorch). Without a
    framework: the sweep's first (what probes and launcher checks need is the same in each)."""
    framework = framework or ((config.get("benchmark") or {}).get("frameworks") or ["tensorflow"])[0]
    if name == "bare-metal":
        return BareMetal(config["bare_metal"]["torch_python" if framework == "pytorch" else "python"])
    if name not in CONTAINER_RUNTIMES:
        raise ValueError(f"runtime {name!r} is not supported; allowed: {', '.join(RUNTIME_NAMES)}")
    options = dict((config.get("images") or {}).get(name) or {})
    launch_options = {key: options.pop(key) for key in LAUNCH_OPTIONS if key in options}
    models = launch_options.get("mpi_model", "hybrid")
    launch_options["mpi_model"] = model = mpi_model or (models[0] if isinstance(models, list) else models)
    images = {key: options.pop(key) for key in IMAGE_KEYS if key in options}
    key, native_key = image_key("hybrid", framework), image_key("native", framework)
    if model == "native" and (images.get(native_key) or not images.get(key)):
        key = native_key  # a native-only runtime's `image` is its MPICH-ABI image
    image = images.get(key)
    if not isinstance(image, str) or not image:
        raise ValueError(f"runtime {name!r} needs an image reference: set images.{name}.{key} in the config")
    cls = CONTAINER_RUNTIMES[name]
    allowed = sorted(set(inspect.signature(cls.__init__).parameters) - {"self", "image"})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"runtime {name!r}: unknown option {', '.join(map(repr, unknown))} in images.{name}; "
                         f"allowed: image, {', '.join(allowed)}")
    runtime = cls(image, **options)
    for key, value in launch_options.items():
        setattr(runtime, key, value)
    runtime.launcher = config.get("launcher", {}).get("kind", "none")
    native = config.get("native_mpi") or {}
    runtime.native_mpi = NativeMpi(**{key: native[key] for key in ("library", "image_library") if key in native})
    runtime.check_mpi_model()
    if runtime.native and "srun_mpi" not in launch_options:
        runtime.srun_mpi = native.get("srun_mpi", "pmi2")  # an MPICH libmpi speaks PMI2 to srun (mpi_guide)
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
        for model in mpi_models(config, name):
            runtime_for(name, config, model).check_launcher(config["launcher"]["kind"])


def select_runtimes(config: dict, built: dict[ImageUse, str]) -> dict[str, str]:
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
        runs_built = any(use.runtime == name for use in built)
        if ok and runs_built and not build_ok:
            ok, reason = False, f"the image cannot be built here: {build_reason}"
        if not ok:
            unusable[name] = reason
    if unusable and config["runtime_policy"] == "require":
        name, reason = next(iter(unusable.items()))
        raise ConfigError(f"config: runtime {name!r} cannot run here: {reason}; allowed: install it, give "
                          "images.<runtime>.image (and torch_image), or set runtime_policy: skip-unusable")
    config["runtimes"] = [name for name in config["runtimes"] if name not in unusable]
    return unusable
