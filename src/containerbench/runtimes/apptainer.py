"""Apptainer and SingularityCE: `exec` of a .sif with a clean environment, the rank's variables
passed as APPTAINERENV_* (SINGULARITYENV_*)."""

from __future__ import annotations

import sys

from containerbench.runtimes.base import (
    RANK_PREFIXES,
    RANKEXEC,
    SLURM_GPU_VARS,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    pass_flags,
    register,
)


@register
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
    # The .sif is built from the archive; the Singularity definition is made beside it, for a site that
    # builds the same image with Apptainer (workflow/rules/images.smk).
    prepare_from = ("archive", "definition")
    # srun's PMIx directories, where the default binds (user guide, "Bind Paths and Mounts": /tmp, /var/tmp)
    # and ours do not hold them, are bound by APPTAINER_BIND (appendix, "Apptainer's environment variables").
    shared_paths = ("/tmp", "/var/tmp")

    @property
    def pmix_bind_variable(self) -> str:
        return f"{self.binary.upper()}_BIND"

    # userns: ranks run in unprivileged user namespaces (the default without a setuid installation,
    # "apptainer buildcfg" / --userns); false for a setuid installation, where UCX needs no workaround.
    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable,
                 userns: bool = True, **settings):
        super().__init__(image, python, extra_args, **settings)
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
                *pass_flags(RANK_PREFIXES + SLURM_GPU_VARS), *self.pmix_options(request), "--"]
        # Host /dev (so /dev/infiniband and /dev/shm), /tmp and the network are shared by default;
        # --nv binds the host's NVIDIA driver libraries (user guide, "GPU Support").
        argv = [self.name, "exec", "--cleanenv", *(["--nv"] if request.gpus else [])]
        for path in self.mounts(request):
            argv += ["--bind", path]
        if self.native:
            argv += ["--bind", ":".join(self.native_mpi.bind)]
            argv += [word for path in self.native_mpi.library_dirs for word in ("--bind", f"{path}:{path}:ro")]
        return [*shim, *argv, "--pwd", self.workdir(request), *self.extra_args, self.image, *self.command(request)]


@register
class Singularity(Apptainer):
    """SingularityCE (or Singularity before the rename): Apptainer's CLI under its old name."""

    name = binary = "singularity"
    probe = ("singularity", "--version")
    env_prefix = "SINGULARITYENV_"
    artifact_owner = False  # Apptainer's .sif

