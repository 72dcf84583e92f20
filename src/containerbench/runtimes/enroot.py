"""Enroot, through Slurm's Pyxis plugin: the image is srun's (--container-image), so the runtime
contributes srun options rather than words of its own."""

from __future__ import annotations

import os
import shlex

from containerbench.launchers import Srun
from containerbench.runtimes.base import (
    IMAGE_FILE_SUFFIXES,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    register,
)
from containerbench.runtimes.node import NodeRequirement


@register
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
    requires_launcher = Srun.kind
    pmix_gds_hash = False
    prepare_from = ("store",)  # enroot import reads the build engine's store (prepare_commands)

    @classmethod
    def artifact(cls, built: BuiltImage) -> str:
        return built.file(".sqsh")

    @classmethod
    def reference(cls, built: BuiltImage) -> str:
        # Pyxis takes --container-image as a squashfs file only when it starts with "/" or ".";
        # anything else is a registry reference (pyxis_slurmstepd.c).
        return os.path.abspath(cls.artifact(built))

    SCHEMES = {"docker": "dockerd", "podman": "podman"}  # enroot-import(1): a local engine's image

    @classmethod
    def import_uri(cls, engine: str, tag: str) -> str:
        return f"{cls.SCHEMES[engine]}://{tag}"

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        return [["enroot", "import", "-o", cls.artifact(built), cls.import_uri(built.engine, built.tag)]]

    # Where Enroot is on the compute nodes only (available: compute-nodes), the image is made where the workflow
    # builds it, without Enroot, the way `enroot import dockerd://` and `podman://` make it (NVIDIA/enroot
    # src/docker.sh, docker::daemon::import): the engine's export unpacked without dev/* and .dockerenv, the
    # image's config written into it (docker::configure, configured_files), and mksquashfs -all-root with
    # enroot.conf's default ENROOT_SQUASH_OPTIONS. Its import on a node would need the engine there, and the
    # image in that node's store.
    converts_without_itself = True
    conversion_tools = ("tar", "mksquashfs")
    SQUASH_OPTIONS = ("-comp", "lzo", "-noD", "-exit-on-error")  # enroot.conf's ENROOT_SQUASH_OPTIONS default

    @staticmethod
    def unpack_argv(flat_tar: str, rootfs: str) -> list[str]:
        return ["tar", "-C", rootfs, "--warning=no-timestamp", "--anchored", "--exclude=dev/*",
                "--exclude=.dockerenv", "-px", "-f", flat_tar]

    @classmethod
    def squash_argv(cls, rootfs: str, out: str, environ=os.environ) -> list[str]:
        # -noappend: enroot refuses a file that exists; a conversion here replaces its own. A site's
        # ENROOT_SQUASH_OPTIONS (enroot.conf(5), or the environment) is taken, as enroot takes it.
        options = shlex.split(environ["ENROOT_SQUASH_OPTIONS"]) if environ.get("ENROOT_SQUASH_OPTIONS") else \
            list(cls.SQUASH_OPTIONS)
        return ["mksquashfs", rootfs, out, "-all-root", "-noappend", *options]

    @staticmethod
    def configured_files(config: dict, uri: str) -> dict[str, str]:
        """The files docker::configure writes into the root filesystem from the image's config (`inspect`'s
        Config): /etc/fstab (a bind per volume, ${ENROOT_ROOTFS} left for enroot to expand), /etc/environment
        (the image's ENV, which Pyxis loads), /etc/rc (provenance and labels as comments, then cd to the working
        directory and exec the entrypoint with the command) and an empty /etc/rc.local. Words are quoted
        '...' where bash's ${word@Q} may choose $'...': the same words to the shell."""
        def quoted(words: list[str]) -> str:
            return " ".join("'" + word.replace("'", "'\\''") + "'" for word in words)

        entrypoint, cmd = list(config.get("Entrypoint") or []), list(config.get("Cmd") or [])
        if not entrypoint and not cmd:
            cmd = ["/bin/sh"]
        workdir = config.get("WorkingDir") or "/"
        labels = "".join(f"# {key} {str(value).replace(chr(10), ' ')}\n"
                         for key, value in (config.get("Labels") or {}).items())
        rc = (f"# enroot-provenance: {uri}\n{labels}\n"
              f'mkdir -p "{workdir}" 2> /dev/null\ncd "{workdir}" && unset OLDPWD || exit 1\n\n'
              "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
              f'if [ $# -gt 0 ]; then\n    exec {quoted(entrypoint)} "$@"\nelse\n'
              f"    exec {quoted(entrypoint)} {quoted(cmd)}\nfi\n")
        return {"etc/fstab": "".join(f"${{ENROOT_ROOTFS}}{volume} {volume} none x-create=dir,bind,rw,nosuid,nodev\n"
                                     for volume in sorted(config.get("Volumes") or {})),
                "etc/environment": "".join(f"{pair}\n" for pair in config.get("Env") or []),
                "etc/rc": rc,
                "etc/rc.local": "# This file is sourced by /etc/rc when the container starts.\n# It can be used to "
                                "manipulate the entrypoint or the command of the container.\n"}

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

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        """The PMI hook enabled on every node (usable() looks only here), and a Pyxis that takes
        --container-env (NVIDIA/pyxis v0.15.0, commit 5164d82): srun lists the SPANK plugin's options
        in its --help."""
        return [NodeRequirement(self.name, "enroot's PMI hook enabled (cp /usr/share/enroot/hooks.d/50-slurm-pmi.sh "
                                "/etc/enroot/hooks.d/)", paths=(self.pmi_hook(),),
                                source="NVIDIA/enroot Makefile HOOKS_EXTRA; pyxis wiki, Setup"),
                NodeRequirement(self.name, "Pyxis 0.15 or later (srun --container-env)", (Srun.program, "--help"),
                                holds="--container-env", source="NVIDIA/pyxis v0.15.0 args.c")]

    def launcher_options(self, request: RunRequest) -> list[str]:
        mounts = ",".join(f"{path}:{path}" for path in self.mounts(request))
        return [f"--container-image={self.image}", f"--container-mounts={mounts}",
                f"--container-workdir={self.workdir(request)}",
                f"--container-env={','.join(sorted(self.environment(request)))}", *self.extra_args]

    def rank_argv(self, request: RunRequest) -> list[str]:
        return self.command(request)

