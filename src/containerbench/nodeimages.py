"""The image on every node of a run: a docker or podman image lives in the node's own store.

The workflow builds and loads the image where it plans (images.smk). At a site each compute node
has its own dockerd, and podman keeps a store per user per node (containers-storage.conf(5):
graphroot under /var/lib/containers, or ~/.local/share/containers rootless), so a rank on
another node would not find the tag. Before a run is timed, its launch (execution.execute) runs
`containerbench node-image` once on every node of the run (srun, one task a node): it asks the
node's engine for the image id, loads the shared archive where the node lacks that image, and
prints one line per node. The launch line keeps what each node answered (`node_images`), so each
record names the image each of its nodes ran, and the seconds a load took are not start-up.
For docker, podman and podman-hpc, it first removes the node's containers of ours whose starter has ended (a
docker or podman rank's container outlives its SIGKILLed client, holding its GPUs: rank/rankexec.py; a podman-hpc
shared-run container, its ranks stopped: the runtime's orphans); `--orphans-only` does only that, a line
for a site's Slurm epilog. podman-hpc's and Charliecloud's nodes read one shared copy (SQUASH_DIR; the
image directory): the step loads nothing there, and answers with the image id as the node sees it
(shared_copy).

    python -m containerbench node-image --engine podman --image localhost/containerbench:TAG \\
        --stamp build/images/podman-containerbench-TAG.json [--archive build/images/containerbench-TAG.tar]
    python -m containerbench node-image --engine docker --orphans-only
    python -m containerbench node-image --engine charliecloud --image build/images/containerbench-TAG.ch
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from containerbench.processes import run_group
from containerbench.runtimes import CONTAINER_RUNTIMES, PINNED, engine_env

# An image query answers in seconds; a load of a 2 GB archive took 40-70 s here.
QUERY_TIMEOUT_S = 120
LOAD_TIMEOUT_S = 1800
# The line each node prints: not a rank's marker (containerbench.rank.markers is in the benchmark's
# provenance), as only the launch reads it, from the node-image step's own output.
LINE = "containerbench-node-image "
# The engines whose containers outlive the ranks that started them (remove_orphans).
LEAVES_ORPHANS = tuple(name for name, runtime in CONTAINER_RUNTIMES.items() if runtime.leaves_orphans)
# The runtimes whose nodes all read one shared copy (shared_copy), not a store of their own (ensure).
SHARED_COPIES = tuple(name for name, runtime in CONTAINER_RUNTIMES.items() if runtime.shares_one_copy)


class NodeImageError(RuntimeError):
    """The image cannot be put on this node: one line naming the node, the image and what is allowed."""


def stored_id(engine: str, image: str, timeout: float = QUERY_TIMEOUT_S) -> str | None:
    """The id (config digest, sha256:...) of `image` in this node's store, or None where it has no such
    image. docker prints the id with its algorithm, podman without (docker-image-inspect(1),
    podman-image-inspect(1): {{.Id}})."""
    argv = [engine, "image", "inspect", "--format", "{{.Id}}", image]
    try:
        done = run_group(argv, timeout=timeout, env=engine_env(engine), stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise NodeImageError(f"{socket.gethostname()}: {engine} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        raise NodeImageError(f"{socket.gethostname()}: `{shlex.join(argv)}` did not answer within {timeout:g} s") \
            from None
    found = done.stdout.strip()
    if done.returncode != 0 or not found:
        return None
    return found if found.startswith("sha256:") else f"sha256:{found}"


def _run(argv: list[str], timeout: float) -> str:
    host = socket.gethostname()
    try:
        done = run_group(argv, timeout=timeout, env=engine_env(argv[0]), stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise NodeImageError(f"{host}: {argv[0]} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        raise NodeImageError(f"{host}: `{shlex.join(argv)}` took over {timeout:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NodeImageError(f"{host}: `{shlex.join(argv)}` failed: {last[:200]}")
    return done.stdout


def remove_orphans(engine: str, timeout: float = QUERY_TIMEOUT_S) -> list[str]:
    """Remove this node's running containers of ours whose starter has surely ended, and what they held (the
    runtime's remove_orphans): dockerd keeps a container running when its client is killed, outside the Slurm step
    that ended, podman's conmon too, and podman-hpc its shared-run one when its ranks are, holding the node's GPUs,
    memory and the image's mount. Returns their ids or names."""
    return CONTAINER_RUNTIMES[engine].remove_orphans(lambda argv: _run(argv, timeout))


def expected_id(stamp: Path | str) -> str:
    """The image id the workflow built or loaded, from its stamp (imagebuild.build_stamp)."""
    try:
        return json.loads(Path(stamp).read_text())["image_id"]
    except (OSError, ValueError, KeyError) as error:
        raise NodeImageError(f"{socket.gethostname()}: the image stamp {stamp} is unreadable here ({error}); "
                             "allowed: a clone on a filesystem every node mounts at the same path") from None


def _lock_path(engine: str, image: str) -> Path:
    # Node-local: two runs starting on one node load the archive once, not twice at the same time.
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", image)
    return Path(tempfile.gettempdir()) / f"containerbench-node-image-{os.getuid()}-{engine}-{slug}.lock"


def ensure(engine: str, image: str, stamp: Path | str | None = None, archive: Path | str | None = None,
           timeout: float = LOAD_TIMEOUT_S) -> dict:
    """Make `image` present in this node's `engine` store, as the stamp says it must be (its id), loading
    `archive` where the node lacks it or holds another image under the tag. Returns what the node ran:
    host, engine, image, image_id, loaded, the seconds it took and the orphans it removed first."""
    orphans = remove_orphans(engine)
    host, started = socket.gethostname(), time.monotonic()
    wanted = expected_id(stamp) if stamp else None
    with open(_lock_path(engine, image), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = stored_id(engine, image)
        loaded = found is None or (wanted is not None and found != wanted)
        if loaded:
            held = "no such image" if found is None else f"another image under the tag ({found})"
            if archive:
                if not Path(archive).is_file():
                    raise NodeImageError(f"{host}: {engine}'s store here holds {held} for {image}, and the archive "
                                         f"{archive} is not here; allowed: a clone on a filesystem every node mounts")
                _run([engine, "load", "-i", str(archive)], timeout)  # docker-load(1), podman-load(1)
            elif PINNED.search(image):  # a site's image, pinned by digest: what `run` would pull, pulled first
                _run([engine, "pull", image], timeout)
            else:
                raise NodeImageError(f"{host}: {engine}'s store here holds {held} for {image}; allowed: the archive "
                                     "to load it from (a run under Slurm is given it), an image pinned by digest "
                                     "(pulled), or the image loaded by hand")
            found = stored_id(engine, image)
        if wanted is not None and found != wanted:
            raise NodeImageError(f"{host}: {engine} holds {image} as {found} after loading {archive}, and the sweep "
                                 f"built {wanted}; allowed: the archive made from that build (rebuild it)")
    return answer(engine, image, found, loaded, started, removed_orphans=orphans)


def answer(engine: str, image: str, image_id: str, loaded: bool, started: float, **more) -> dict:
    """What a node answers for the image its ranks will run."""
    # The node's Slurm name beside its host name (they may differ): the ranks' step is pinned to these nodes.
    slurm_node = {"slurm_node": os.environ["SLURMD_NODENAME"]} if os.environ.get("SLURMD_NODENAME") else {}
    # And the node's own mount namespace, outside any container: each rank's must differ (records.ran_on_the_host).
    return {"host": socket.gethostname(), **slurm_node, "engine": engine, "image": image, "image_id": image_id,
            "loaded": loaded, "seconds": round(time.monotonic() - started, 3), **more,
            "mnt_ns": os.readlink("/proc/self/ns/mnt")}


def shared_copy(engine: str, image: str, stamp: Path | str | None = None) -> dict:
    """The image this node's ranks will run where every node reads one shared copy, as this node sees it; nothing
    is loaded (the runtime's shared_copy: podman-hpc's copies in SQUASH_DIR and its own store, held to the
    stamp's id; Charliecloud's directory and the id of the image it was converted from)."""
    host, started = socket.gethostname(), time.monotonic()
    if engine not in SHARED_COPIES:
        raise NodeImageError(f"{host}: {engine} keeps no shared copy; allowed: {', '.join(SHARED_COPIES)}")
    orphans = {"removed_orphans": remove_orphans(engine)} if engine in LEAVES_ORPHANS else {}
    wanted = expected_id(stamp) if stamp else None
    try:
        image_id, more = CONTAINER_RUNTIMES[engine].shared_copy(image, wanted, lambda argv: _run(argv, QUERY_TIMEOUT_S))
    except ValueError as error:
        raise NodeImageError(f"{host}: {error}") from None
    return answer(engine, image, image_id, False, started, **orphans, **more)
