"""What every runtime shares: the run request, the built image, the Runtime and ContainerRuntime
base classes with their hooks, and the registry a runtime class joins with @register."""

from __future__ import annotations

import abc
import contextlib
import getpass
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from containerbench import hostmpi
from containerbench.launchers import NoLauncher, launcher_class
from containerbench.rank.rankexec import bind_pmix_options, outside
from containerbench.runtimes.node import NativeMpi, NodeRequirement

# Set by mpirun (Open MPI, MPICH Hydra) or srun for each rank; the MPI/PMI library in the image needs them.
RANK_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
# Slurm's per-task GPU binding, for runtimes whose ranks stay in the task's device cgroup.
SLURM_GPU_VARS = ("CUDA_VISIBLE_DEVICES",)
RANKEXEC = "containerbench.rank.rankexec"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class RunRequest:
    """What one rank must run, independent of where it runs."""

    module: str  # e.g. "containerbench.rank.bench"
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # fabric and benchmark variables for the rank
    workdir: str = "."  # bound at the same path in containers, and the rank starts there
    gpus: bool = False  # give the rank the node's NVIDIA GPUs
    binds: tuple[str, ...] = ()  # further host paths bound at the same path (data sets)
    infiniband: bool = False  # give the rank the RDMA devices and unlimited locked memory
    ranks_per_node: int = 1  # the rank's peers on its node, itself included
    # srun's pmi2 plugin hands each task a socket it inherited, named by PMI_FD (Slurm's
    # src/plugins/mpi/pmi2/mpi_pmi2.c): a runtime must keep it open into the container.
    inherited_pmi_fd: bool = False
    pmix_server: bool = False  # srun's pmix plugin serves the ranks: its directories are the node's (rankexec)
    pmix_base: str = ""  # where it makes them: PMIxCliTmpDirBase or TmpFS (slurm.pmix_client_base)
    # The run asks salloc for an allocation of its own (launchers.Allocation.PER_RUN): what a Slurm plugin
    # reads when the allocation is made (Shifter's image) goes there (Runtime.allocation_options).
    own_allocation: bool = False


def host_environment() -> dict[str, str]:
    """This process's environment, with USER set: ch-run refuses to start without it (CI may not set it)."""
    return {**os.environ, "USER": os.environ.get("USER") or getpass.getuser()}


def run_probe(argv: tuple[str, ...] | list[str], env: dict[str, str] | None = None,
              timeout: float = 20, whole: bool = False) -> tuple[bool, str]:
    """Run a runtime's quick check: (True, its first output line; with `whole`, all it printed, stdout
    then stderr) or (False, a one-line reason). A one-word probe only checks that the program is installed."""
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
    return True, done.stdout + done.stderr if whole else (done.stdout.strip().splitlines() or [""])[0]


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


class Runtime(abc.ABC):
    """Base class: the argv that starts one rank, and the variables it needs. The class holds what
    the runtime is (its documented facts); the constructor takes how the config runs it."""

    name = ""
    requires_launcher: str | None = None  # the only launcher kind this runtime works under, if any
    default_mpi_model = "hybrid"  # the model when the config names none
    # How this runtime swaps the host's MPICH-ABI libmpi in for the native model, by its documentation;
    # None: it cannot.
    native_support: str | None = None
    probe: tuple[str, ...] = ()  # a quick command that succeeds only where the runtime can run here
    # Host processes that serve its containers while they run (names as /proc/PID/stat gives them, cut to
    # 15 characters): their CPU is this runtime's cost, counted apart, not as a disturbance of the run.
    service_processes: tuple[str, ...] = ()

    def __init__(self, *, launcher: str = NoLauncher.kind, mpi_model: str | None = None, srun_mpi: str | None = None,
                 available: str = "everywhere", package: str = "image", native_mpi: NativeMpi = NativeMpi()):
        """launcher: the launcher kind its ranks start under. mpi_model: hybrid, the image's own MPI wired
        up by the host's launcher, or native, the host's libmpi swapped in (native_mpi). srun_mpi: srun's
        MPI plugin for its runs (None: launcher.srun_mpi); an image's MPI decides it, PMIx for Open MPI,
        PMI2 for MPICH (Slurm's mpi_guide, "srun --mpi"). available: "compute-nodes" where it is not
        installed where the workflow runs (a login node without Apptainer, say), so the pre-flight check
        probes it on a compute node instead of the planning step here. package: "clone" where the ranks
        import containerbench from the workflow's clone, bound into the container (an image the site
        supplies, e.g. a vendor's, has TensorFlow and Horovod but not this package)."""
        self.launcher, self.mpi_model = launcher, mpi_model or self.default_mpi_model
        self.srun_mpi, self.available, self.package, self.native_mpi = srun_mpi, available, package, native_mpi

    @abc.abstractmethod
    def rank_argv(self, request: RunRequest) -> list[str]:
        """The words that start one rank."""

    def environment(self, request: RunRequest) -> dict[str, str]:
        """The variables the launcher sets on the host and forwards (mpirun -x)."""
        return {"CONTAINERBENCH_RUNTIME": self.name, **request.env, **self.native_env(request)}

    # Names in environment() for the runtime's own program on the host, kept out of the container.
    engine_only_variables: tuple[str, ...] = ()

    def container_variables(self, request: RunRequest) -> list[str]:
        """The names of environment() a rank inside the container gets beyond what RANK_PREFIXES covers."""
        return sorted(name for name in self.environment(request)
                      if not name.startswith(RANK_PREFIXES) and name not in self.engine_only_variables)

    @property
    def in_slurm_step(self) -> bool:
        """Do its ranks start as a Slurm job step (launcher srun), which Slurm's plugins (SPANK) see?"""
        return launcher_class(self.launcher).slurm_step

    @property
    def native(self) -> bool:
        return self.mpi_model == "native"

    def native_env(self, request: RunRequest | None = None) -> dict[str, str]:
        """What the native model adds to a rank's environment: the bind model's LD_LIBRARY_PATH, and the name of
        the variable that tells every rank which of its libraries to report (set at launch from the nodes'
        answers: hostmpi.py)."""
        if not self.native:
            return {}
        # mpi4py's ABI wheels dlopen the MPI of their own venv by its full path before the loader's search (mpi4py
        # 4.1.2 src/mpi4py/_mpiabi.py: _dlopen_rpath puts sys.prefix/lib first), so a module's LD_LIBRARY_PATH
        # (podman-hpc's and Shifter's mpich modules) never reached it: podman-hpc --mpi ran the image's MPICH on the
        # host's UCX (seen here). MPI4PY_LIBMPI (its _get_mpiabi) makes it ask the loader for the ABI's name instead.
        env = {hostmpi.NAMES_VARIABLE: "", "MPI4PY_LIBMPI": os.path.basename(self.native_mpi.image_library)}
        if self.native_support == "bind":
            env["LD_LIBRARY_PATH"] = self.native_mpi.library_path(self.library_dir_targets(request))
        return env

    def library_dir_targets(self, request: RunRequest | None) -> list[str]:
        """Where the bind model binds native_mpi.library_dirs in the container: at their own paths."""
        return list(self.native_mpi.library_dirs)

    def check_mpi_model(self) -> None:
        if self.mpi_model not in MPI_MODELS:
            raise ValueError(f"runtime {self.name!r}: mpi_model {self.mpi_model!r} is not allowed; "
                             f"allowed: {', '.join(MPI_MODELS)}")
        if self.native and self.native_support is None:
            raise ValueError(f"runtime {self.name!r} has no documented way to swap the host's MPI in; "
                             "allowed: mpi_model hybrid")

    def launcher_options(self, request: RunRequest) -> list[str]:
        """Options the launcher inserts before rank_argv (Enroot: srun's Pyxis options)."""
        return []

    def allocation_options(self, request: RunRequest) -> list[str]:
        """Options for the allocation a run asks for (salloc), read by a Slurm plugin when it is made."""
        return []

    def check_launcher(self, kind: str) -> None:
        if self.requires_launcher and kind != self.requires_launcher:
            raise ValueError(f"runtime {self.name!r} needs launcher {self.requires_launcher!r}, not {kind!r}")

    # -- the image it runs: made from the built image by its prepare commands --
    # True where the artifact is a stamp naming an image in the runtime's own store (written after the
    # prepare commands), not the file they make.
    artifact_is_stamp = False
    # What `images prepare` makes the artifact from, running prepare_commands (the workflow's files:
    # "archive", docker save's; "store", the build engine's image; "definition", the Singularity
    # definition, made beside it). Empty: not that step (docker/podman load and Charliecloud have their own).
    prepare_from: tuple[str, ...] = ()
    # Where two runtimes run the same artifact (apptainer's and singularity's .sif), the workflow makes it
    # with the one the sweep names, and with the owner's commands when the sweep names both or neither.
    artifact_owner = True
    # What a site names in images.<name>.image where the workflow cannot build the image (e.g. Shifter's
    # gateway): shown by `plan --every-runtime`.
    placeholder_image: str | None = None

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

    @classmethod
    def after_prepared_commands(cls, built: BuiltImage) -> list[list[str]]:
        """Run once the prepared artifact is read back (read_prepared): what the prepare left that no run needs."""
        return []

    # Can its image be made where the runtime is not installed (for `available: compute-nodes`), by
    # containerbench doing what the runtime's own import does (imagebuild.WITHOUT_THE_RUNTIME)?
    converts_without_itself = False
    conversion_tools: tuple[str, ...] = ()  # the programs that conversion needs here, checked when planning

    @classmethod
    def remove_prepared_commands(cls, built: BuiltImage) -> list[list[str]]:
        """What removes the copy the prepare commands put in a store of the runtime's own (`make clean-images`);
        [] where the artifact file is the copy, removed with the other files."""
        return []

    @classmethod
    def store_lock(cls, step: Sequence[str] | None = None) -> contextlib.AbstractContextManager:
        """Held around a prepare or removal `step` that writes a store every host shares and which takes no lock of
        its own, and (`step` None) around reading that store back or a whole removal; a no-op for any other step.
        Not re-entrant: one process holds it once."""
        return contextlib.nullcontext()

    # Do all nodes run one copy on a shared filesystem (shared_copy), not one in a store of each node's own?
    shares_one_copy = False

    @classmethod
    def shared_copy(cls, image: str, wanted: str | None, run) -> tuple[str, dict]:
        """Where shares_one_copy: the id of the copy of `image` this node's ranks will run, as this node sees it,
        and what more its answer holds; nothing is loaded. `wanted`: the id the workflow made, or None; `run(argv)`
        returns a command's output. A ValueError names what is wrong here and what is allowed."""
        raise NotImplementedError(f"{cls.name} keeps no shared copy")

    # Do its containers outlive the ranks that started them, holding the node's GPUs, memory and mounts until
    # they are removed (remove_orphans: the node-image step, a Slurm epilog's --orphans-only)? Such a runtime is an
    # engine whose `binary rm --force` kills and removes a container.
    leaves_orphans = False

    @classmethod
    def orphans(cls, run) -> dict[str, str]:
        """This host's running containers of ours whose starter has surely ended: id or name -> its image ("" where
        the listing does not say). `run(argv)` returns a command's output, and raises where it fails."""
        return {}

    @classmethod
    def release_orphans(cls, images) -> None:
        """After the orphans of `images` are removed: let go of what they held here that nothing else would."""
        return None

    @classmethod
    def remove_orphans(cls, run) -> list[str]:
        """Remove this host's orphans (docker-rm(1), podman-rm(1) --force: a running one is killed first), then
        what they held; their ids or names. A removal that fails is listed again: one gone meanwhile (its own
        --rm, another node-image step) is no failure."""
        orphans = cls.orphans(run)
        if orphans:
            try:
                run([cls.binary, "rm", "--force", *orphans])
            except (ValueError, RuntimeError, OSError):  # what `run` raised, raised again if one is still there
                if set(orphans) & set(cls.orphans(run)):
                    raise
        cls.release_orphans(orphans.values())
        return list(orphans)

    @classmethod
    def release_prepared(cls, built: BuiltImage) -> None:
        """Before remove_prepared_commands: let go of what holds the copy on this host; a ValueError names what
        still does and what is allowed."""
        return None

    @classmethod
    def read_prepared(cls, built: BuiltImage, run) -> dict[str, str]:
        """What the prepare commands made, read back for the artifact's stamp where their exit status does not
        tell (`run(argv)` returns a command's output); {"image_id": ...} is held against the build's."""
        return {}

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        """What its runs need on each node beyond its probe (versions, hooks, device specs); `gpus`: the
        sweep's runs get GPUs."""
        return []

    @property
    def stores_images_per_node(self) -> bool:
        """Does each node keep its own store of this runtime's images (a dockerd, podman's graphroot)?"""
        return False

    def node_prepare_argv(self, python: str, stamp: str | None = None, archive: str | None = None) -> list[str] | None:
        """The command that makes the image present on the node it runs on, run once on every node of a run
        before its ranks (containerbench.nodeimages); None where every node reads the artifact itself."""
        return None

    def usable(self) -> tuple[bool, str]:
        """Can this runtime start a container on this machine? (ok, one-line reason if not)"""
        if not self.probe:
            return True, ""
        ok, detail = run_probe(self.probe)
        return ok, "" if ok else detail


def move_binds(runtime: str, request: RunRequest, mount_points: tuple[str, ...],
               remedy: str = "fewer binds", also: tuple[str, ...] = ()) -> dict[str, str]:
    """For a runtime that binds only onto mount points the image already has: each bind goes to an
    empty directory every Debian/Ubuntu image has, and the arguments and variables naming it (a
    dataset, the clone's src/ on PYTHONPATH, the telemetry directory) are rewritten to match. The
    work directory is not bound: the benchmark needs nothing else from it. `also`: host directories
    bound beside the request's (the host MPI's, native_mpi.library_dirs)."""
    sources = list(dict.fromkeys(map(os.path.abspath, [*request.binds, *also])))
    if len(sources) > len(mount_points):
        raise ValueError(f"runtime {runtime!r}: {len(sources)} binds need {remedy}; "
                         f"allowed: at most {len(mount_points)} ({', '.join(mount_points)})")
    return dict(zip(sources, mount_points))


def pass_flags(prefixes) -> list[str]:
    """The rankexec shim's options that pass every host variable starting with one of `prefixes`."""
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

    def __init__(self, image: str, python: str = "python3", extra_args=(), **settings):
        super().__init__(**settings)
        self.image, self.python, self.extra_args = image, python, list(extra_args)

    @classmethod
    def tool_environment(cls, env: dict[str, str]) -> dict[str, str]:
        """`env` (this process's) made fit for the runtime's own tools (build, save, convert) here."""
        return env

    @classmethod
    def probe_failure_hint(cls) -> str:
        """What to add to a failed probe's reason: where the runtime looked, where that is not obvious."""
        return ""

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

    # Under srun's pmix plugin, its directories lie where the site put them (rank/rankexec.py): the host paths
    # every rank sees at the same path unasked, how the shim binds one where they do not (argv words, {path}
    # filled, or a variable listing binds; neither: it cannot, and the base must lie under a shared path), and
    # the destinations the runtime refuses, with why and what is allowed where a base lies there.
    shared_paths: tuple[str, ...] = ()
    binds_at_own_paths = True  # False where binds move to the image's mount points (move_binds; no work directory)
    pmix_bind_form: str | None = None
    pmix_bind_variable: str | None = None
    refused_bind_prefixes: tuple[str, ...] = ()
    pmix_refusal: tuple[str, str] = ("", "a PMIxCliTmpDirBase or TmpFS elsewhere")

    def same_path_binds(self, request: RunRequest) -> list[str]:
        """The host paths its ranks see at their own path: those it shares unasked, then its binds that keep theirs."""
        own = self.mounts(request) if self.binds_at_own_paths else []
        return list(dict.fromkeys([*self.shared_paths, *own]))

    def pmix_options(self, request: RunRequest) -> list[str]:
        """The shim's options that bind the step's PMIx directories outside what the rank sees, or a ValueError
        in one line where the runtime cannot bind the client directory's base (request.pmix_base)."""
        if not request.pmix_server:
            return []
        shared = self.same_path_binds(request)
        base = os.path.normpath(request.pmix_base) if request.pmix_base else ""
        unbindable = not (self.pmix_bind_form or self.pmix_bind_variable) and outside([base], shared)
        if base and (unbindable or not outside([base], self.refused_bind_prefixes)):
            why, allowed = self.pmix_refusal
            raise ValueError(f"runtime {self.name!r} cannot bind srun's PMIx client directory, which Slurm makes "
                             f"under {request.pmix_base!r}{why}; allowed: {allowed}")
        if not (self.pmix_bind_form or self.pmix_bind_variable):
            return []
        return bind_pmix_options(request.pmix_base, [*self.refused_bind_prefixes, *shared], self.pmix_bind_form,
                                 self.pmix_bind_variable)


# Every container runtime by its name (the config's key), in the order plans and `images
# print-commands` show them: the order the package's __init__ imports their modules.
CONTAINER_RUNTIMES: dict[str, type[ContainerRuntime]] = {}


def register(cls: type[ContainerRuntime]) -> type[ContainerRuntime]:
    """Class decorator: the runtime joins CONTAINER_RUNTIMES under its `name`."""
    if not cls.name or cls.name in CONTAINER_RUNTIMES:
        raise ValueError(f"runtime class {cls.__name__}: name {cls.name!r} is empty or taken")
    CONTAINER_RUNTIMES[cls.name] = cls
    return cls


def engine_env(engine: str) -> dict[str, str]:
    """The environment an engine's own commands (build, save, convert) need here."""
    return CONTAINER_RUNTIMES[engine].tool_environment(dict(os.environ))
