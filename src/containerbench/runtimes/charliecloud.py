"""Charliecloud: ch-run on an image directory converted from the built image (ch-convert), with
its variables filtered by an extended glob."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

from containerbench.launchers import Mpirun
from containerbench.runtimes.base import (
    DEFAULT_PATH,
    RANK_PREFIXES,
    RANKEXEC,
    SLURM_GPU_VARS,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    move_binds,
    register,
    run_probe,
)
from containerbench.runtimes.node import NodeRequirement

# ch-run's --write-fake arrived in Charliecloud 0.36 (PR #1793); Debian 12 ships 0.31. A node is asked whether its
# ch-run has unprivileged overlayfs with --feature=overlayfs, which 0.38 added (PR #1892; bin/ch-run.c at v0.36 and
# v0.37 has no such feature): 0.38 is what a node needs for write_fake.
WRITE_FAKE_SINCE = (0, 38)


@register
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
    # srun's PMIx directories outside /tmp and our binds, by the shim: ch-run(1) --bind=SRC binds at the same path,
    # and with --write-fake "DST will be created", but "cannot enter a previous bind mount". Without it, "With a
    # read-only image (the default), DST must exist": a base outside /tmp, where Open MPI makes its session
    # directory (MPI_Init fails without it: rank/rankexec.py), is refused.
    shared_paths = ("/tmp",)
    pmix_refusal = (", outside the /tmp ch-run shares, without write_fake",
                    "images.charliecloud.write_fake: true, or a PMIxCliTmpDirBase or TmpFS under /tmp")

    @property
    def pmix_bind_form(self) -> str | None:
        return "--bind={path}" if self.write_fake else None

    @property
    def binds_at_own_paths(self) -> bool:
        return self.write_fake  # without it they go to MOUNT_POINTS

    @classmethod
    def tool_environment(cls, env: dict[str, str]) -> dict[str, str]:
        env.setdefault("USER", pwd.getpwuid(os.getuid()).pw_name)  # ch-run refuses an unset $USER
        env["PATH"] = "/usr/bin:" + env.get("PATH", DEFAULT_PATH)  # ch-image needs Debian's python3 (lark)
        return env

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

    shares_one_copy = True

    @classmethod
    def shared_copy(cls, image: str, wanted: str | None, run) -> tuple[str, dict]:
        # The id of the image the directory was converted from, kept beside it; held to the build by its reader.
        marker = Path(cls.image_id_file(image))
        if not (Path(image) / "ch").is_dir() or not marker.is_file():
            raise ValueError(f"the image directory {image} (with {marker.name} beside it) is not here; "
                             "allowed: a clone on a filesystem every node mounts at the same path")
        return marker.read_text().strip(), {}

    @staticmethod
    def image_id_file(out: str) -> str:
        """Beside the image directory OUT: the id of the image it was converted from (imagebuild.charliecloud_image),
        which each node of a run reads back (nodeimages.shared_copy)."""
        return f"{out}.image-id"

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

    def __init__(self, image: str, python: str = "python3", extra_args=(), write_fake: bool = False,
                 host_python: str = sys.executable, **settings):
        """write_fake: the site's choice, never this host's guess. Without it the binds go to mount points every
        image has (moved_binds), which any ch-run on any kernel runs; with it, every node is asked for it
        (node_requirements). No ch-run here or on a node can answer for the others: the planning host's
        version chose it before, and a node without unprivileged overlayfs then failed every rank."""
        super().__init__(image, python, extra_args, **settings)
        self.write_fake, self.host_python = write_fake, host_python

    def node_prepare_argv(self, python: str, stamp: str | None = None, archive: str | None = None) -> list[str] | None:
        # Nothing to load: each node is asked for the directory as it sees it (nodeimages.shared_copy), where the
        # workflow made it (`stamp`, its artifact) and so kept the id of its image beside it; a site's own is not.
        if stamp is None:
            return None
        return [python, "-m", "containerbench", "node-image", "--engine", self.name, "--image", self.image]

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        """Extended globs on every node (usable() asks only here); with --write-fake, a ch-run that has it and
        was built where the kernel has unprivileged overlayfs: `--feature=overlayfs` (ch-run(1), "--feature",
        0.38 and later; it reports configure's result); without that the container fails to start with
        "operation not permitted" (ch-run(1), "Writeable overlay with --write-fake", kernel 5.11 or later)."""
        found = [NodeRequirement(self.name, "a ch-run with extended globs (--unset-env keeps the rank's variables)",
                                 ("ch-run", "--feature=extglob"), source="ch-run(1), --feature")]
        if self.write_fake:
            since, instead = ".".join(map(str, WRITE_FAKE_SINCE)), "or set images.charliecloud.write_fake: false"
            overlay = 'ch-run(1), --feature and "Writeable overlay with --write-fake"'
            found += [NodeRequirement(self.name, f"ch-run {since} or later (--write-fake, and --feature=overlayfs to "
                                      f"ask for it; {instead})", ("ch-run", "--version"), at_least=since,
                                      source="hpc/charliecloud PR #1793 (v0.36) and PR #1892 (v0.38)"),
                      NodeRequirement(self.name, f"unprivileged overlayfs for --write-fake ({instead})",
                                      ("ch-run", "--feature=overlayfs"), source=overlay)]
        return found

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
        return "!(" + "|".join([*keep, *SLURM_GPU_VARS, "HOME", *self.container_variables(request)]) + ")"

    def moved_binds(self, request: RunRequest) -> dict[str, str]:
        """Without --write-fake (the default) a bind needs its mount point in the image ("can't mkdir:
        Read-only file system"), so binds move (move_binds)."""
        remedy = "images.charliecloud.write_fake: true (ch-run 0.38 or later, unprivileged overlayfs on every node)"
        also = self.native_mpi.library_dirs if self.native else ()
        return {} if self.write_fake else move_binds(self.name, request, self.MOUNT_POINTS, remedy, also)

    def library_dir_targets(self, request: RunRequest | None) -> list[str]:
        # Without --write-fake the host MPI's directories are bound onto the image's mount points too.
        moved = self.moved_binds(request) if request is not None else {}
        return [moved.get(os.path.abspath(path), path) for path in self.native_mpi.library_dirs]

    def rank_argv(self, request: RunRequest) -> list[str]:
        # --join: ranks of a node share one container, else cross-memory attach between them fails.
        # --unset-env and --set-env apply in command-line order: drop all but what is kept, then load
        # the image's ENV from /ch/environment (written by ch-image).
        # ch-run counts a node's peers from OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_STEP_TASKS_PER_NODE or
        # SLURM_CPUS_ON_NODE; MPICH's Hydra (native runs under mpirun) sets none, so they are given.
        join = (["--join", f"--join-ct={request.ranks_per_node}"] if self.native and self.launcher == Mpirun.kind
                else ["--join"])
        argv = ["ch-run", *join, f"--unset-env={self.keep_glob(request)}", "--set-env",
                *(["--write-fake"] if self.write_fake else []),
                *([f"--bind={':'.join(self.native_mpi.bind)}"] if self.native else [])]
        if self.write_fake:
            library_dirs = list(self.native_mpi.library_dirs) if self.native else []
            argv += [f"--bind={path}" for path in dict.fromkeys([*self.mounts(request), *library_dirs])]
            argv += [f"--cd={self.workdir(request)}", *self.extra_args, self.image, "--", *self.command(request)]
            pmix = self.pmix_options(request)
            return [self.host_python, "-m", RANKEXEC, *pmix, "--insert-after", "ch-run", "--", *argv] if pmix else argv
        self.pmix_options(request)  # no mount point can be made: a base outside /tmp is refused
        # The benchmark needs nothing else from the work directory.
        argv += [f"--bind={source}:{target}" for source, target in self.moved_binds(request).items()]
        return [*argv, "--cd=/", *self.extra_args, self.image, "--", *self.command(request)]
