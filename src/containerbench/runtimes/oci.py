"""Docker-style engines (docker, podman): `ENGINE run` of an image in the engine's store, opted
back into the host's network, IPC and PIDs."""

from __future__ import annotations

import abc
import os
import shutil
import sys
from pathlib import Path

from containerbench.processes import checkable, running
from containerbench.rank.rankexec import CLIENT_LABEL, CLIENT_UID_LABEL
from containerbench.runtimes.base import (
    RANK_PREFIXES,
    RANKEXEC,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    pass_flags,
    register,
)
from containerbench.runtimes.node import NodeRequirement


class OciEngine(ContainerRuntime):
    """Docker-style engines: the container is a fresh namespace set, so the run opts back into the host's."""

    binary = ""
    native_support = "bind"  # the host's libmpi bound over the image's (a file bind: --volume FILE:FILE)
    artifact_is_stamp = True
    # Open MPI's session directories live under /tmp (mpirun's; srun's PMIx ones where TmpFS is: rankexec binds them)
    shared_paths: tuple[str, ...] = ("/tmp",)
    pmix_bind_form = "--volume {path}:{path}"  # docker-run(1), podman-run(1) --volume
    save_options: tuple[str, ...] = ()  # what `save` needs to write an archive every converting runtime reads

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, **settings):
        super().__init__(image, python, extra_args, **settings)
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

    # The engine, not the rank, keeps the container running when its client is killed (a Slurm step's end, an
    # out-of-memory kill): dockerd, or podman's conmon, which leaves the client's process tree (seen here, podman
    # 4.3.1). The shim labels each with its client (--label-client), and the node's next step removes the orphans.
    leaves_orphans = True
    labels_client = True
    # How `ps --format` reads one label: docker's template has a Label function; podman 4.3's has none ("can't
    # evaluate field Label in type containers.psReporter", seen here), its Labels is a map.
    label_template = '{{{{.Label "{}"}}}}'

    @classmethod
    def orphans(cls, run) -> dict[str, str]:
        labels = " ".join(cls.label_template.format(label) for label in (CLIENT_LABEL, CLIENT_UID_LABEL))
        argv = [cls.binary, "ps", "--no-trunc", "--filter", f"label={CLIENT_LABEL}",
                "--format", f"{{{{.ID}}}} {labels}"]
        return {words[0]: "" for words in map(str.split, run(argv).splitlines())
                if len(words) >= 2 and cls.client_ended(words[1], words[2] if len(words) > 2 else "")}

    def shim_options(self, request: RunRequest) -> list[str]:
        """The rankexec shim's options every rank of the engine gets: its client's label, srun's PMIx binds."""
        return [*(["--label-client"] if self.labels_client else []), *self.pmix_options(request)]

    @staticmethod
    def client_ended(client: str, owner: str) -> bool:
        """Has the client that labelled a container (CLIENT_LABEL, CLIENT_UID_LABEL) surely ended? Only where this
        process can see it: on its host, in its pid namespace, and its own or, for root, any user's (a /proc
        mounted hidepid hides other users' processes, which would look ended)."""
        named = checkable(client)
        mine = owner.isdigit() and (int(owner) == os.getuid() or os.getuid() == 0)
        return named is not None and mine and not running(*named)

    @property
    def stores_images_per_node(self) -> bool:
        # The engine's store is the node's own (a dockerd per node; podman's graphroot per user per node,
        # containers-storage.conf(5)): a tag loaded where the workflow runs is not on the other nodes.
        # podman-hpc runs its squashed copies from a shared directory instead (in_local_store empty).
        return bool(self.in_local_store)

    def node_prepare_argv(self, python: str, stamp: str | None = None, archive: str | None = None) -> list[str] | None:
        if not self.stores_images_per_node:
            return None
        return [python, "-m", "containerbench", "node-image", "--engine", self.binary, "--image", self.image,
                *(["--stamp", stamp] if stamp else []), *(["--archive", archive] if archive else [])]

    def engine_args(self) -> list[str]:
        return [self.binary, "run"]

    def user_args(self) -> list[str]:
        return ["--user", f"{self.uid}:{self.gid}"]

    @abc.abstractmethod
    def gpu_args(self) -> list[str]:
        """The engine's words that give the container the node's NVIDIA GPUs."""

    def native_args(self) -> list[str]:
        if not self.native:
            return []
        host, image = self.native_mpi.bind
        return [word for source, target in [(host, image), *((d, d) for d in self.native_mpi.library_dirs)]
                for word in ("--volume", f"{source}:{target}:ro")]

    def env_args(self, request: RunRequest) -> list[str]:
        """`--env NAME` (value copied from the engine's environment) for what no rank prefix covers."""
        return [word for name in self.container_variables(request) for word in ("--env", name)]

    def namespace_args(self) -> list[str]:
        return ["--network", "host", "--ipc", "host", "--pid", "host"]

    def run_argv(self, request: RunRequest) -> list[str]:
        # Host network/IPC/PIDs: NCCL and MPI reach peers and share memory as on bare metal. With
        # --ipc host Docker mounts the host's /dev/shm (moby daemon setupIpcDirs), which NCCL needs to
        # use SHM/P2P between containers (NVIDIA/nccl#248); --pid host keeps peer PIDs valid for
        # cross-memory attach (Sarus user guide, "PID namespace"). No name: ranks run in parallel.
        argv = [*self.engine_args(), "--rm", *self.namespace_args(), *self.user_args(),
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
        for path in self.same_path_binds(request):
            argv += ["--volume", f"{path}:{path}"]
        argv += self.native_args()
        argv += ["--workdir", self.workdir(request), *self.env_args(request)]
        return [*argv, *self.extra_args, self.image, *self.command(request)]

    def rank_argv(self, request: RunRequest) -> list[str]:
        return self.run_argv(request)


@register
class Docker(OciEngine):
    """docker run. The client passes no environment, and names must be explicit (no wildcard), so the
    rank variables are added on the node by the rankexec shim, run with the workflow's own Python."""

    name = binary = "docker"
    probe = ("docker", "info", "--format", "{{.ServerVersion}}")  # the daemon must answer
    in_local_store = ("docker", "image", "inspect", "--format", "{{.Id}}")
    # The client relays the container's output from dockerd, which has it from the container's
    # containerd-shim-runc-v2 (cut to 15 characters in /proc), started by containerd.
    service_processes = ("docker", "dockerd", "containerd", "containerd-shim")

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, host_python: str = sys.executable, **settings):
        super().__init__(image, python, extra_args, uid, gid, **settings)
        self.host_python = host_python

    @classmethod
    def tool_environment(cls, env: dict[str, str]) -> dict[str, str]:
        env["DOCKER_BUILDKIT"] = "0"  # Debian's docker.io has no buildx
        return env

    @classmethod
    def probe_failure_hint(cls) -> str:
        # Installed, but which daemon was asked.
        return f" (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'the default socket')})" if shutil.which("docker") else ""

    def gpu_args(self) -> list[str]:
        # The daemon creates the container outside the Slurm task's device cgroup: it sees every GPU,
        # and Slurm's CUDA_VISIBLE_DEVICES (renumbered under ConstrainDevices) would point elsewhere, so
        # it is not passed; each rank pins GPU local_rank (bench.configure_devices).
        return ["--gpus", "all"]  # NVIDIA Container Toolkit, "docker run --gpus" (Docker >= 19.03)

    def rank_argv(self, request: RunRequest) -> list[str]:
        if request.inherited_pmi_fd:
            # dockerd, not the rank, starts the container: no fd of the rank's reaches it (docker run has no
            # --preserve-fds; podman-run(1) has).
            raise ValueError("runtime 'docker' cannot pass srun's pmi2 socket (PMI_FD, an fd the rank inherits) "
                             "into its containers, which dockerd starts; allowed: srun_mpi pmix, launcher mpirun, "
                             "or podman (--preserve-fds)")
        # The rank's CPU binding and its share of the step's memory limit (the node's ranks share one),
        # passed on by the shim: dockerd starts the container outside the Slurm step's cgroup
        # (nebius/soperator#563), so bare metal and docker ranks would differ.
        # Its client's id, so that a container whose client was killed is found and removed (rankexec).
        return [self.host_python, "-m", RANKEXEC, *pass_flags(RANK_PREFIXES), "--cpuset-from-affinity",
                "--memory-from-cgroup", f"--memory-share={request.ranks_per_node}", *self.shim_options(request), "--",
                *self.run_argv(request)]


@register
class Podman(OciEngine):
    """podman run. `--env 'PREFIX*'` copies every host variable with that prefix (podman-run(1)
    --env), so the rankexec shim only labels the container with its client (and moves srun's pmi2
    socket, binds srun's PMIx directories). oci_runtime picks the OCI runtime (e.g. "runc" where crun
    fails on hybrid cgroups); None keeps the site's default."""

    name = binary = "podman"
    probe = ("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}")
    in_local_store = ("podman", "image", "exists")  # podman-image-exists(1)
    # The attached client, the container's monitor (conmon(8)), its init where --init asks for one
    # (podman-run(1) --init: catatonit) and rootless storage's mount program (containers-storage.conf(5)
    # mount_program: fuse-overlayfs).
    service_processes = ("podman", "conmon", "catatonit", "fuse-overlayfs")
    label_template = '{{{{index .Labels "{}"}}}}'
    shared_paths = ("/tmp", "/dev/shm")  # podman-hpc's MPI modules bind /dev/shm besides --ipc=host
    save_options = ("--format", "docker-archive")  # readable by docker, sarus, apptainer
    # The engine settings `make setup` writes for a host without systemd (scripts/container-engines.sh
    # podman-conf: runc, cgroupfs, ulimits within the host's), found through CONTAINERS_CONF
    # (containers.conf(5)). The workflow sets it itself when its runs are launched on this host, so that
    # snakemake called directly runs podman as `make run` does.
    engine_conf = Path("build") / "engines" / "containers.conf"

    @classmethod
    def engine_environment(cls, repo, environ=os.environ) -> dict[str, str]:
        """CONTAINERS_CONF for the clone's engine settings, where they exist and no other is set."""
        conf = Path(repo) / cls.engine_conf
        return {"CONTAINERS_CONF": str(conf)} if conf.is_file() and "CONTAINERS_CONF" not in environ else {}

    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, oci_runtime: str | None = None, host_python: str = sys.executable,
                 **settings):
        super().__init__(image, python, extra_args, uid, gid, **settings)
        self.oci_runtime, self.host_python = oci_runtime, host_python

    # podman-hpc moves srun's pmi2 socket itself (podman_hpc.py, pmi_fd); podman needs the shim to.
    moves_pmi_fd = False

    def rank_argv(self, request: RunRequest) -> list[str]:
        shim = [*(["--pmi-fd"] if request.inherited_pmi_fd and not self.moves_pmi_fd else []),
                *self.shim_options(request)]
        if not shim:
            return self.run_argv(request)
        # The shim's words go after the engine's verb: `run`, or podman-hpc's `shared-run`.
        return [self.host_python, "-m", RANKEXEC, *shim, "--insert-after", self.engine_args()[-1], "--",
                *self.run_argv(request)]

    def engine_args(self) -> list[str]:
        # --runtime=NAME, one word: the shim inserts its words after the first `run`, which a runtime might be named.
        return [self.binary, *([f"--runtime={self.oci_runtime}"] if self.oci_runtime else []), "run"]

    def user_args(self) -> list[str]:
        # Rootless podman maps the user to root by default; keep-id maps UID:GID to themselves
        # (podman-run(1) --userns; not allowed for root, who needs no mapping).
        keep_id = ["--userns", "keep-id"] if self.uid != 0 else []
        return [*keep_id, *super().user_args()]

    def gpu_args(self) -> list[str]:
        return ["--device", "nvidia.com/gpu=all"]  # CDI spec from `nvidia-ctk cdi generate` (toolkit docs)

    # NVIDIA's CDI page ("Running a Workload with CDI"): podman takes CDI devices in --device "as of v4.1.0";
    # the spec is what `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` writes on each node (or the
    # toolkit's nvidia-cdi-refresh service, into /var/run/cdi).
    CDI_SINCE = "4.1.0"
    # Any spec file in the directories podman reads (the toolkit names its own; a site may name it otherwise).
    CDI_SPECS = ("/etc/cdi/*.yaml", "/etc/cdi/*.json", "/var/run/cdi/*.yaml", "/var/run/cdi/*.json")

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        if not gpus:
            return []
        source = "NVIDIA/cloud-native-docs container-toolkit/cdi-support.md"
        return [NodeRequirement(self.name, f"podman {self.CDI_SINCE} or later (CDI devices in --device)",
                                ("podman", "--version"), at_least=self.CDI_SINCE, source=source),
                NodeRequirement(self.name, "a CDI spec of the node's GPUs (`nvidia-ctk cdi generate "
                                "--output=/etc/cdi/nvidia.yaml` on each node)", paths=self.CDI_SPECS, source=source)]

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


# The engines that build the image (images.build.engine) and hand it to the others.
ENGINES = (Docker.name, Podman.name)
