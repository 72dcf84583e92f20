"""NERSC's podman-hpc: podman with its site modules, of which this runtime uses only what the
benchmark needs (no --privileged)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from containerbench.launchers import Mpirun
from containerbench.processes import ended, start_ticks
from containerbench.runtimes.base import (
    RANK_PREFIXES,
    BuiltImage,
    RunRequest,
    register,
    run_probe,
)
from containerbench.runtimes.node import NodeRequirement
from containerbench.runtimes.oci import Podman


def mount_table() -> str:
    """This host's /proc/self/mountinfo; empty where there is none."""
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""


@register
class PodmanHPC(Podman):
    """NERSC's podman-hpc wrapper (rootless podman, squashed images). Its --openmpi-pmix module adds
    --privileged (etc/modules.d/*.yaml), so in the hybrid model this class passes the host namespaces,
    binds and rank variables itself, as that module does, and uses only the --gpu module; the native
    model is its --mpi module."""

    name = binary = "podman-hpc"
    probe = ("podman-hpc", "info")
    in_local_store = ()  # podman-hpc runs its squashed copies, not podman's store
    # Besides podman's: a migrated image's root is squashfuse_ll's mount (squashfuse where that is missing)
    # under fuse-overlayfs, both started by its fuse-overlayfs-wrap script (cut to 15 characters in /proc),
    # which waits in inotifywait to unmount them (1.2.2 bin/fuse-overlayfs-wrap; seen in /proc here).
    # Each rank's podman-hpc waits on its `podman exec` (and rank 0's on the container) through the run.
    service_processes = (*Podman.service_processes, "podman-hpc", "fuse-overlayfs-", "inotifywait", "squashfuse_ll",
                         "squashfuse")
    prepare_from = ("archive",)

    SLURM_PATHS = ("/var/spool/slurmd", "/run/munge")

    # No oci_runtime: podman-hpc takes no --runtime before its command, and the OCI runtime it finds on PATH
    # it never passes to podman (1.2.2 siteconfig.py, self.runtime): containers.conf's [engine] runtime decides.
    def __init__(self, image: str, python: str = "python3", extra_args=(), uid: int | None = None,
                 gid: int | None = None, slurm_paths=SLURM_PATHS, **settings):
        super().__init__(image, python, extra_args, uid, gid, **settings)
        self.slurm_paths = tuple(slurm_paths)

    @classmethod
    def prepare_commands(cls, built: BuiltImage, registry: str = "REGISTRY") -> list[list[str]]:
        # Load into podman-hpc's own store (its graph_root, node-local), then squash it into SQUASH_DIR, the
        # shared store every node's runs read (podman-hpc README; 1.2.2 migrate2scratch.py reads graph_root).
        return [["podman-hpc", "load", "-i", built.archive], ["podman-hpc", "migrate", built.tag]]

    @classmethod
    def after_prepared_commands(cls, built: BuiltImage) -> list[list[str]]:
        # The loaded copy in the planning host's own store: no compute node sees it, and where it is left the
        # planning host's runs would take it before SQUASH_DIR's (its graph_root is podman's main store; the
        # squashed copy an additional one). `rmi` removes only the main store's copy (podman-hpc images: seen).
        return [["podman-hpc", "rmi", built.tag]]

    @classmethod
    def remove_prepared_commands(cls, built: BuiltImage) -> list[list[str]]:
        # SQUASH_DIR is read-only to podman (an additional store), so its `rmi` cannot take the squashed copy;
        # `rmsqi` "Removes a squashed image" (1.2.2 podman_hpc.py), after release_prepared.
        return [["podman-hpc", "rmsqi", built.tag]]

    @classmethod
    def release_prepared(cls, built: BuiltImage) -> None:
        # rmsqi deletes the image's layer directory with rmtree, which fails inside a squashfuse mount left there
        # ("OSError: [Errno 38] Function not implemented", exit 1, seen in CI). An orphaned shared-run container,
        # which holds the mount, goes first; then what is still mounted is unmounted. umount(8) without -l refuses a
        # mount a live container holds ("target is busy"): the removal then stops in one line naming it.
        if not cls.squash_mounts(built.tag, mount_table()):
            return

        def run(argv: list[str]) -> str:
            done, said = run_probe(argv, whole=True, timeout=300)
            if not done:
                raise ValueError(said)
            return said

        with contextlib.suppress(ValueError, OSError):  # what still holds the mount is named below
            cls.remove_orphans(run)
        if left := cls.unmount_released([built.tag]):
            raise ValueError(f"{left[0]} stays mounted (umount: target is busy); allowed: the removal once no "
                             f"container of {built.tag} runs on this host (podman-hpc ps)")

    # migrate and rmsqi rewrite SQUASH_DIR's overlay-images/images.json in place (`json.dump(data, open(path, "w"))`)
    # with no lock (1.2.2 migrate2scratch.py, upsert_image, del_rec): two flavours' migrates at once failed here
    # ("JSONDecodeError: Extra data" reading it), and either could lose the other's record. Ours, and our reads of it,
    # take turns; load and rmi touch only this host's own store (graph_root; podman-hpc adds SQUASH_DIR as an
    # additional store for run, images and pull only: siteconfig.py), which podman locks itself, and run beside them.
    SHARED_STORE_STEPS = ("migrate", "rmsqi")

    @classmethod
    def store_lock(cls, step: Sequence[str] | None = None) -> contextlib.AbstractContextManager:
        # Every podman-hpc command first lays out a SQUASH_DIR that is not there (init_storage, a check then
        # os.mkdir of each folder): two at once could fail. Made here first, as the lock always did, it is skipped.
        with contextlib.suppress(OSError):
            cls.squash_dir().mkdir(exist_ok=True)
        if step is not None and step[1] not in cls.SHARED_STORE_STEPS:
            return contextlib.nullcontext()
        return cls._squash_dir_lock()

    @classmethod
    @contextlib.contextmanager
    def _squash_dir_lock(cls):
        # In SQUASH_DIR, which every host that migrates shares; where its filesystem takes no flock (Lustre without
        # -o flock), in this host's temporary directory.
        handle = None
        try:
            handle = open(cls.squash_dir() / ".containerbench-lock", "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                handle.close()
            handle = open(Path(tempfile.gettempdir()) / f"containerbench-squash-{os.getuid()}.lock", "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        with handle:
            yield

    # shared-run names the node's container uid-UID-pid-PPID, PPID the process that started the rank's podman-hpc (the
    # launcher's proxy), and rank 0's monitor stops it once every local rank has reported back (1.2.2 podman_hpc.py,
    # _shared_run and monitor). Ranks stopped before they report (a run hung at exit or timed out, which the launch
    # stops) leave it running `sleep infinity`, with the image's mount and what the ranks held (seen here): an orphan
    # once that process has ended, or its pid belongs to a process started after the container.
    SHARED_RUN_NAME = re.compile(r"uid-(\d+)-pid-(\d+)")
    SHARED_RUNS_ARGV = ("podman-hpc", "ps", "--format", "{{.Names}} {{.Pid}} {{.Image}}")

    leaves_orphans = True
    labels_client = False  # one container for the node's ranks, found by its name

    @classmethod
    def orphans(cls, run) -> dict[str, str]:
        return cls.orphaned_shared_runs(run(list(cls.SHARED_RUNS_ARGV)))

    @classmethod
    def release_orphans(cls, images) -> None:
        cls.unmount_released([image for image in images if image])  # one another container holds is left

    @classmethod
    def orphaned_shared_runs(cls, listing: str) -> dict[str, str]:
        """The containers of SHARED_RUNS_ARGV's `listing` whose starting process has ended here (this user's, or
        anyone's for root): name -> its image. Ended: no such process, or one started after the container's own
        first process (the pid taken since), both by /proc's start ticks, one clock. A process this user may not
        see (/proc mounted hidepid; slurmstepd is root's) counts as running."""
        orphans = {}
        for words in map(str.split, listing.splitlines()):
            named = cls.SHARED_RUN_NAME.fullmatch(words[0]) if len(words) == 3 and words[1].isdigit() else None
            if not named or (int(named[1]) != os.getuid() and os.getuid() != 0):
                continue
            starter, container = start_ticks(int(named[2])), start_ticks(int(words[1]))
            if starter is None and not ended(int(named[2])):
                continue
            if starter is None or (container is not None and starter > container):
                orphans[words[0]] = words[2]
        return orphans

    @classmethod
    def unmount_released(cls, images, wait_s: float = 10) -> list[str]:
        """Unmount the squashfuse mounts of `images` once their orphans are removed: the launch that stopped the
        ranks stopped the wrap's waiter with them (it runs in their session), so none would (seen here).
        fuse-overlayfs may hold one a moment after its container is gone: tried for `wait_s`. A mount another
        container holds is refused by umount(8) without -l, and left; what is left is returned."""
        deadline, roots = time.monotonic() + wait_s, [root for image in set(images) for root in cls.squash_roots(image)]
        while True:
            for path in cls.mounts_under(roots, mount_table()):
                try:
                    subprocess.run(["umount", path], capture_output=True, timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            left = cls.mounts_under(roots, mount_table())
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    @staticmethod
    def squash_dir() -> Path:
        """The migrate store podman-hpc uses here: SQUASH_DIR, else $SCRATCH/storage (1.2.2 siteconfig.py)."""
        return Path(os.environ.get("SQUASH_DIR", f"{os.environ.get('SCRATCH', '/tmp')}/storage"))

    @staticmethod
    def long_names(tag: str) -> list[str]:
        """The names rmsqi finds an image by, in its order (1.2.2 migrate2scratch.py, get_img_info)."""
        name = tag if ":" in tag else f"{tag}:latest"
        first = name.split("/", 1)[0]
        if not ("/" in name and ("." in first or ":" in first or first == "localhost")):
            return [name, f"docker.io/{name}", f"docker.io/library/{name}", f"localhost/{name}"]
        # Its docker.io/library/ branch follows a docker.io/ one that takes every such name: never reached.
        if name.startswith("docker.io/") and "/" not in name.removeprefix("docker.io/"):
            return [name, f"docker.io/library/{name.removeprefix('docker.io/')}"]
        return [name]

    @classmethod
    def squash_mounts(cls, tag: str, mountinfo: str) -> list[str]:
        """The squashfuse mounts of `tag`'s squashed layers on this host (`mountinfo`: /proc/self/mountinfo's text),
        the last mounted first."""
        return cls.mounts_under(cls.squash_roots(tag), mountinfo)

    @classmethod
    def squash_roots(cls, tag: str) -> list[Path]:
        """Where fuse-overlayfs-wrap mounts `tag`'s squash file: at the lower directory podman names, the layer's diff
        or its short link under overlay/l (1.2.2 bin/fuse-overlayfs-wrap; both seen in /proc/mounts here)."""
        store = cls.squash_dir().resolve()
        try:
            records = json.loads((store / "overlay-images" / "images.json").read_text())
        except (OSError, ValueError):
            return []
        # The image rmsqi takes: the first whose id starts with the tag, else the first by name (get_img_info).
        found = next((record for record in records if record["id"].startswith(tag)), None) or next(
            (record for name in cls.long_names(tag) for record in records if name in record.get("names", ())), None)
        if not found:
            return []
        link = store / "overlay" / found["layer"] / "link"
        short = link.read_text().strip() if link.is_file() else ""
        return [store / "overlay" / found["layer"], *([store / "overlay" / "l" / short] if short else [])]

    @staticmethod
    def mounts_under(roots: list[Path], mountinfo: str) -> list[str]:
        """The squashfuse mounts at or under `roots` in `mountinfo`, the last mounted first: one mounted over another
        is taken before it."""
        mounts = []
        for line in mountinfo.splitlines():  # proc(5): ID PARENT DEV ROOT MOUNTPOINT ... - FSTYPE SOURCE ...
            fields, _, after = line.partition(" - ")
            point = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), fields.split()[4])
            if after.startswith("fuse.squashfuse") and any(Path(point).is_relative_to(root) for root in roots):
                mounts.append(point)
        return mounts[::-1]

    shares_one_copy = True

    @classmethod
    def shared_copy(cls, image: str, wanted: str | None, run) -> tuple[str, dict]:
        # Every copy a run could take: the squashed one in SQUASH_DIR, and any in the node's own store (its
        # graph_root, the main store beside SQUASH_DIR's additional one), held to the migrated id.
        copies = cls.listed_copies(run(cls.listing_argv(image)))
        held = sorted(set(copies["own"] + copies["squashed"]))
        if not held:
            raise ValueError(f"no squashed copy of {image} in SQUASH_DIR ({cls.squash_dir()}) here; allowed: a "
                             "SQUASH_DIR every node mounts at the same path, set for the run, migrated to by the "
                             "workflow")
        if len(held) > 1 or (wanted is not None and held != [wanted]):
            listed = "; ".join(f"{store} {', '.join(ids)}" for store, ids in copies.items() if ids)
            raise ValueError(f"podman-hpc here holds {image} as {listed}, and the workflow migrated {wanted}; "
                             f"allowed: the SQUASH_DIR the workflow migrated to ({cls.squash_dir()}), with no "
                             f"other copy of {image} in the node's own store (`podman-hpc rmi {image}`)")
        return held[0], {"stores": [store for store, ids in copies.items() if ids]}

    @staticmethod
    def listing_argv(tag: str) -> list[str]:
        """Every copy of `tag` podman-hpc would run: `images` lists SQUASH_DIR's copies as read-only beside its own
        store's (siteconfig.py adds SQUASH_DIR as additionalimagestore to `images` and `run` only)."""
        return ["podman-hpc", "images", "--no-trunc", "--filter", f"reference={tag}",
                "--format", "{{.ID}} {{.ReadOnly}}"]

    @staticmethod
    def listed_copies(listing: str) -> dict[str, list[str]]:
        """`listing_argv`'s answer: {"squashed": ids in SQUASH_DIR, "own": ids in the store of the host it ran on},
        each as sha256:..."""
        copies = {"squashed": [], "own": []}
        for words in map(str.split, listing.splitlines()):
            if words:
                image_id = words[0] if words[0].startswith("sha256:") else f"sha256:{words[0]}"
                copies["squashed" if words[1:] == ["true"] else "own"].append(image_id)
        return copies

    @classmethod
    def read_prepared(cls, built: BuiltImage, run) -> dict[str, str]:
        """migrate exits 0 whatever happened (1.2.2 podman_hpc.py, `migrate`: migrate_image's result is
        dropped), so the squashed copy is read back."""
        argv = cls.listing_argv(built.tag)
        listed = run(argv)
        squashed = cls.listed_copies(listed)["squashed"]
        if not squashed:
            raise ValueError(f"podman-hpc migrate {built.tag}: no squashed copy in SQUASH_DIR "
                             f"({cls.squash_dir()}); `{shlex.join(argv)}` "
                             f"listed {listed.strip() or 'nothing'}; migrate exits 0 when it fails, and logs why "
                             "at --log-level info")
        return {"image_id": squashed[0]}

    def node_prepare_argv(self, python: str, stamp: str | None = None, archive: str | None = None) -> list[str] | None:
        # Nothing to load: each node is asked which copy it would run, from the SQUASH_DIR it mounts (nodeimages), of
        # an image the workflow migrated (`stamp`). A site's image is pinned by digest, and podman-hpc pulls it where
        # a node lacks it, as before: no step.
        if stamp is None:
            return None
        return [python, "-m", "containerbench", "node-image", "--engine", self.binary, "--image", self.image,
                "--stamp", stamp]

    # What podman-hpc's openmpi-pmix module adds for a Slurm-launched Open MPI rank, without its
    # --privileged (etc/modules.d/openmpi-pmix.yaml): slurmd's spool (the PMIx server's rendezvous
    # files), munge's socket, and the SLURMD_* variables besides SLURM_*/PMIX_*/PMI_*.
    rank_prefixes = (*RANK_PREFIXES, "SLURMD_")
    # Its run moves srun's pmi2 socket to fd 3 and adds --preserve-fds 1 (podman_hpc.py, pmi_fd, 1.2.2).
    moves_pmi_fd = True

    @property
    def shared_paths(self) -> tuple[str, ...]:
        # Only under srun: a bind whose source is missing makes `podman run` fail (slurm_paths: the
        # site's SlurmdSpoolDir and munge socket directory, where they differ).
        return ("/tmp", "/dev/shm", *(self.slurm_paths if self.in_slurm_step else ()))

    def mounts(self, request: RunRequest) -> list[str]:
        # The host's verbs provider configuration, which the image's libibverbs reads (the same modules).
        return [*(["/etc/libibverbs.d"] if request.infiniband else []), *super().mounts(request)]

    # Native: the mpich module (etc/modules.d/mpich.yaml, `--mpi`) binds the site's MPICH into
    # /opt/udiImage/modules/mpich and sets LD_LIBRARY_PATH; it also adds --privileged and turns the
    # run into shared-run, which is podman-hpc's own choice, not ours.
    native_support = "module"

    def gpu_args(self) -> list[str]:
        return ["--gpu"]  # module gpu.yaml: driver libraries, /dev/nvidia*, NVIDIA_VISIBLE_DEVICES

    def node_requirements(self, gpus: bool = False) -> list[NodeRequirement]:
        # Its --gpu module binds the driver itself: no CDI. Under srun every rank binds slurm_paths, and `podman run`
        # fails on a bind whose source is missing ("statfs /var/spool/slurmd: no such file or directory", seen on
        # the test cluster, whose SlurmdSpoolDir is elsewhere): each must be on every node.
        source = "podman-hpc 1.2.2 etc/modules.d/openmpi-pmix.yaml, its binds; podman-run(1), --volume"
        return [NodeRequirement(self.name, f"{path}, which each rank binds under srun (images.podman-hpc.slurm_paths: "
                                "the site's SlurmdSpoolDir and munge socket directory)", paths=(path,), source=source)
                for path in (self.slurm_paths if self.in_slurm_step else ())]

    def native_args(self) -> list[str]:
        return ["--mpi"] if self.native else []

    def namespace_args(self) -> list[str]:
        # The mpich module adds --ipc=host --network=host --pid=host (mpich.yaml additional_args), and podman
        # refuses a second --network: "cannot set multiple networks without bridge network mode" (seen here).
        return [] if self.native else super().namespace_args()

    # Every rank goes through `shared-run`, "the recommended way to launch a container from a parallel launcher
    # such as Slurm srun or mpirun" (1.2.2 podman_hpc.py, shared_run's help; --mpi makes a run one too, mpich.yaml
    # shared_run): a node's ranks share one container, named after their parent process and started by the rank
    # whose local id is 0, the others exec into it (_shared_run). With a `run` per rank, each container mounts
    # the squashed image at the same path (bin/fuse-overlayfs-wrap); two ranks that ended 4 s apart left one
    # squashfuse_ll mounted, and mpiexec did not return (seen here).
    # The local id and count are SLURM_LOCALID and SLURM_STEP_TASKS_PER_NODE unless PODMANHPC_LOCALID_VAR and
    # PODMANHPC_TASKS_PER_NODE_VAR name others (siteconfig.py, localid_var, tasks_per_node_var). Under mpirun
    # neither is set, so every rank started a container of the same name and one waited forever (seen here):
    # the launcher's own are named, Hydra's for native runs, Open MPI's for hybrid ones.
    LOCAL_RANK = {True: ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # native: MPICH's Hydra
                  False: ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")}  # hybrid: Open MPI

    def engine_args(self) -> list[str]:
        return [self.binary, "shared-run"]

    # fuse-overlayfs-wrap leaves a waiter that unmounts the image's squashfuse once the container's overlay is
    # gone, trying UMOUNT_WAIT_RETRIES times UMOUNT_WAIT_DELAY s apart and then giving up (1.2.2
    # bin/fuse-overlayfs-wrap, `wait`; defaults 5 and 1 s). A mount held 5 s longer (a second container of the
    # image ending later; fuse-overlayfs or conmon slow to end on a busy node) stays mounted for good: one per run,
    # and `rmsqi` then fails in it. The waiter inherits podman's environment (its LOG and retries seen here) and
    # ends once the unmount succeeds, so a long bound costs only a sleeping shell while the mount is held.
    UMOUNT_WAIT_RETRIES = "3600"
    engine_only_variables = ("UMOUNT_WAIT_RETRIES",)

    def environment(self, request: RunRequest) -> dict[str, str]:
        env = super().environment(request)
        env["UMOUNT_WAIT_RETRIES"] = os.environ.get("UMOUNT_WAIT_RETRIES", self.UMOUNT_WAIT_RETRIES)
        if self.launcher == Mpirun.kind:
            local_id, local_count = self.LOCAL_RANK[self.native]
            env.update(PODMANHPC_LOCALID_VAR=local_id, PODMANHPC_TASKS_PER_NODE_VAR=local_count)
        return env

