"""Sarus: `sarus run` of an image loaded into Sarus's own store, with its MPI hook for the native model."""

from __future__ import annotations

import sys

from containerbench.runtimes.base import RANKEXEC, BuiltImage, ContainerRuntime, RunRequest, register
from containerbench.runtimes.node import NodeRequirement


@register
class Sarus(ContainerRuntime):
    """sarus run. The host environment passes, the image's ENV overrides it, and `--env NAME` without
    a value takes the host's value back (user guide, "Environment"); GPUs follow CUDA_VISIBLE_DEVICES
    through the NVIDIA hook, set by Slurm. The native model adds --mpi: the site's MPICH-ABI MPI is swapped
    in. Devices are denied unless given one by one with --device, so the rankexec shim adds the
    node's RDMA devices (those Enroot's 99-mellanox.sh mounts) at rank start."""

    name = "sarus"
    probe = ("sarus", "--version")
    artifact_is_stamp = True
    prepare_from = ("archive",)

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

    @classmethod
    def read_prepared(cls, built: BuiltImage, run) -> dict[str, str]:
        """The loaded copy, read back from `sarus images`: its row names the reference in its first two columns,
        REPOSITORY and TAG (user guide, "Loading images from tar archives"), then the first 12 characters of the
        image's config digest: IMAGE ID since 1.5.0 (CHANGELOG [1.5.0]; src/cli/CommandImages.hpp, OCIImage.cpp),
        headed DIGEST in 1.4 (the loaded archive's config file), `<none>` where Sarus stored none. Kept in the
        stamp, not held against the build's id: nothing here shows that `sarus load` keeps the config as it is."""
        repository, tag = cls.listed_name(built)
        listed = run(["sarus", "images"])
        for line in listed.splitlines()[1:]:
            if (fields := line.split())[:2] == [repository, tag]:
                return {"sarus_image_id": fields[2]} if len(fields) > 2 and fields[2] != "<none>" else {}
        raise ValueError(f"`sarus images` lists no {repository}:{tag} ({len(listed.splitlines()[1:])} image(s) listed)")

    @classmethod
    def listed_name(cls, built: BuiltImage) -> tuple[str, str]:
        """(REPOSITORY, TAG) as `sarus images` lists the loaded copy; a name without a tag is loaded as latest."""
        repository, colon, tag = cls.reference(built).rpartition(":")
        return (repository, tag) if colon else (cls.reference(built), "latest")

    @classmethod
    def remove_prepared_commands(cls, built: BuiltImage) -> list[list[str]]:
        # A loaded image is removed by the reference `sarus images` shows (user guide, "Removing images":
        # `sarus rmi load/library/my_debian`); Sarus's store is the user's own (~/.sarus), not the engine's.
        return [["sarus", "rmi", ":".join(cls.listed_name(built))]]
    rdma_devices = ("/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs*")

    native_support = "hook"  # `sarus run --mpi`: the site's MPI hook (user guide, "Native MPI support")

    def __init__(self, image: str, python: str = "python3", extra_args=(), host_python: str = sys.executable,
                 **settings):
        super().__init__(image, python, extra_args, **settings)
        self.host_python = host_python

    # srun's PMIx directories are bound as our mounts are. Its default sarus.json refuses a destination under /etc,
    # /var or /opt/sarus (configuration reference, "userMounts": notAllowedPrefixesOfPath), where the spool's server
    # directory is: not needed (gds hash).
    pmix_bind_form = "--mount=type=bind,source={path},destination={path}"
    refused_bind_prefixes = ("/etc", "/var", "/opt/sarus")
    pmix_refusal = (f": its default sarus.json refuses mount destinations under {', '.join(refused_bind_prefixes)}",
                    ContainerRuntime.pmix_refusal[1])

    # `sarus run --env NAME` and `--device` arrived in 1.4.0 (CHANGELOG.md, "[1.4.0]"; 1.4.0's CommandRun.hpp).
    SINCE = "1.4.0"

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        return [NodeRequirement(self.name, f"Sarus {self.SINCE} or later (sarus run --env, --device)",
                                ("sarus", "--version"), at_least=self.SINCE,
                                source="eth-cscs/sarus CHANGELOG.md [1.4.0]")]

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --pid host is Sarus's default; --mount destinations and --workdir are created if missing.
        argv = ["sarus", "run", *(["--mpi"] if self.native else [])]
        argv += [f"--mount=type=bind,source={path},destination={path}" for path in self.mounts(request)]
        argv += [f"--workdir={self.workdir(request)}"]
        argv += [word for name in sorted(self.environment(request)) for word in ("--env", name)]
        argv += [*self.extra_args, self.image, *self.command(request)]
        pmix = self.pmix_options(request)  # srun's PMIx directories outside our mounts (rank/rankexec.py)
        if not (request.infiniband or pmix):
            return argv
        devices = [word for pattern in self.rdma_devices for word in ("--device-glob", pattern)]
        return [self.host_python, "-m", RANKEXEC, *(devices if request.infiniband else []), *pmix, "--", *argv]
