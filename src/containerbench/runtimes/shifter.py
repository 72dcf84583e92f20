"""Shifter: an image its gateway pulled from a registry, entered by each rank of the step."""

from __future__ import annotations

import sys

from containerbench.runtimes.base import (
    PINNED,
    RANK_PREFIXES,
    RANKEXEC,
    SLURM_GPU_VARS,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    move_binds,
    pass_flags,
    register,
)


@register
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
    placeholder_image = "id:SHIFTERIMG_LOOKUP_ID"  # its gateway serves images: a site's (MPICH-based for native)

    # Native: the site's mpich module (udiRoot.conf module_mpich_*) swaps in its MPICH-ABI libmpi.
    native_support = "module"
    # srun's PMIx client directory, where Open MPI makes its session directory (rank/rankexec.py), must be where
    # every instance has it: the host's /tmp and /var/tmp are always bound (shifter_core.c, "mount /tmp", "mount
    # /var/tmp"), and so are udiRoot.conf's siteFs paths (site_fs). Nothing else can bring it in: a user volume's
    # source must already be inside the container (shifter_core.c, "Invalid source %s, not allowed"), and volumes
    # given to a rank's shifter set up a new instance for it (doc/wlm/slurm.rst). A base elsewhere is refused.
    pmix_refusal = (", outside the /tmp and /var/tmp Shifter binds and images.shifter.site_fs",
                    "a PMIxCliTmpDirBase or TmpFS under /tmp or /var/tmp, or images.shifter.site_fs naming the "
                    "udiRoot.conf siteFs path that holds it")

    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable,
                 site_fs=(), **settings):
        """site_fs: the paths udiRoot.conf's siteFs binds at their own paths on the site's nodes."""
        super().__init__(image, python, extra_args, **settings)
        self.host_python, self.site_fs = host_python, tuple(site_fs)

    binds_at_own_paths = False  # they go to MOUNT_POINTS

    @property
    def shared_paths(self) -> tuple[str, ...]:
        return ("/tmp", "/var/tmp", *self.site_fs)

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

    def allocation_options(self, request: RunRequest) -> list[str]:
        # setupRoot runs in the job's prolog at allocation time, once a node, from the allocation's
        # --image/--volume/--module (doc/wlm/slurm.rst: "ideal performance is realized if the --image and
        # ALL --volume options are supplied in the batch submission script"; PrologFlags=alloc); every
        # step's `shifter` then enters that one instance.
        return self.step_options(request) if self.in_slurm_step and request.own_allocation else []

    def launcher_options(self, request: RunRequest) -> list[str]:
        # In an allocation not the run's own (a site's session) they can only be the step's.
        return self.step_options(request) if self.in_slurm_step and not request.own_allocation else []

    def rank_argv(self, request: RunRequest) -> list[str]:
        names = self.container_variables(request)
        shim = [self.host_python, "-m", RANKEXEC, "--env-form", "value", "--insert-after", "shifter",
                *pass_flags(RANK_PREFIXES + SLURM_GPU_VARS), *(w for n in names for w in ("--pass-name", n)), "--"]
        own = [] if self.in_slurm_step else self.step_options(request)
        self.pmix_options(request)  # none to give: a base outside what every instance binds is refused
        return [*shim, "shifter", "--clearenv", *own, "--workdir=/", *self.extra_args, "--", *self.command(request)]

