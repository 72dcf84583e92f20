"""The host MPI on each node of a native run: the library and every library it loads, as the ranks must map them.

In the native MPI model a rank loads the host's MPICH-ABI libmpi in place of the image's. That library
needs others (UCX or libfabric, hwloc, a vendor PMI), and a rank resolves those inside the container: from
the image, unless the host's are bound in. An image built on the same distribution hides this; a vendor
MPI's fabric library from the image's distribution is a different build, or none. So the host MPI's
directories (native_mpi.library_dirs) are bound into every container and put on LD_LIBRARY_PATH (Apptainer
user guide, "MPI", the bind model; Sarus's MPI hook, MPI_DEPENDENCY_LIBS; podman-hpc's modules.d/mpich.yaml),
and it is checked, not assumed: before a native run's ranks start, `containerbench node-mpi` runs once on
every node of the run (srun, one task a node, as node-image does) and opens the host library there in a
fresh process, with those directories on LD_LIBRARY_PATH as the ranks have them. Every file that opening
maps (/proc/self/maps: path, device, inode) is the host MPI's closure on that node. A node whose closure
takes a library from outside the configured directories refuses the run in one line: a rank would take
that one from the image. Each rank then reports the files it mapped under those names (rank/telemetry.py,
loaded_mpi), and the parser holds them against its node's closure, device and inode (records.judge_native_mpi).

    python -m containerbench node-mpi --library /opt/mpich/lib/libmpi.so.12 --library-dir /opt/mpich/lib
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from containerbench.processes import run_group

# The C and C++ runtimes come from the image: one dynamic loader and one libc per process, the image's, which
# the rank's Python already has when libmpi is opened (Sarus's MPI hook also takes glibc from the image and
# checks only that the host's libraries need none newer).
C_RUNTIME = ("ld-linux", "libc.so", "libm.so", "libmvec.so", "libpthread.so", "libdl.so", "librt.so", "libresolv.so",
             "libutil.so", "libgcc_s.so", "libstdc++.so")
# The variable that names, to each rank, the closure's files to report (rank/telemetry.py reads it).
NAMES_VARIABLE = "CONTAINERBENCH_HOST_MPI_LIBS"
LINE = "containerbench-node-mpi "
OPEN_TIMEOUT_S = 60

# Run in a fresh interpreter: what opening the library maps, beyond what Python mapped before.
_OPEN_AND_LIST = """
import ctypes, json, sys
def mapped():
    files = {}
    for line in open("/proc/self/maps"):
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            files.setdefault(fields[5].strip(), [fields[3], int(fields[4])])
    return files
before = mapped()
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)
files = {path: found for path, found in mapped().items() if path not in before}
# MPI_Get_library_version, which the MPI standard allows before MPI_Init: what the ranks must report too.
text, length = ctypes.create_string_buffer(8192), ctypes.c_int(0)
ok = lib.MPI_Get_library_version(text, ctypes.byref(length)) == 0
version = text.value.decode(errors="replace").replace("\\0", "").splitlines()[0].strip() if ok else None
print(json.dumps({"files": files, "version": version}))
"""


def node_argv(library: str, library_dirs, python: str = sys.executable) -> list[str]:
    """`containerbench node-mpi` for this host MPI: run on every node of a native run before its ranks (plans.py),
    and by the pre-flight check on each node before any job (runtimes.node_requirements)."""
    return [python, "-m", "containerbench", "node-mpi", "--library", library,
            *(word for path in library_dirs for word in ("--library-dir", path))]


class HostMpiError(RuntimeError):
    """The host MPI cannot be what a native run's ranks load on this node: one line naming the node and the library."""


def is_c_runtime(name: str) -> bool:
    return name.startswith(C_RUNTIME)


def within(path: str, directories: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, os.path.realpath(d)]) == os.path.realpath(d) for d in directories)


def closure(library: str, library_dirs: list[str], python: str = sys.executable) -> dict:
    """This node's host MPI as a rank must load it: {"host", "library": {path, device, inode, version}, "closure":
    [{name, path, device, inode}...]} (the libraries opening it maps, but the C runtime; name: the file's own name, as
    /proc/PID/maps shows it in a container that binds the directory). Raises HostMpiError where it cannot be
    opened, or where a library of its closure lies outside library_dirs."""
    host = socket.gethostname()
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(library_dirs)}
    try:
        done = run_group([python, "-c", _OPEN_AND_LIST, library], timeout=OPEN_TIMEOUT_S, env=env,
                         stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise HostMpiError(f"{host}: opening {library} took over {OPEN_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HostMpiError(f"{host}: the host MPI {library} cannot be opened here: {last[:300]}")
    opened = json.loads(done.stdout)
    mapped = opened["files"]
    real = os.path.realpath(library)
    if real not in mapped:
        raise HostMpiError(f"{host}: opening {library} mapped no {real}")
    device, inode = mapped.pop(real)
    found = [{"name": os.path.basename(path), "path": path, "device": dev, "inode": ino}
             for path, (dev, ino) in sorted(mapped.items()) if not is_c_runtime(os.path.basename(path))]
    outside = [each for each in found if not within(each["path"], library_dirs)]
    if outside:
        first = outside[0]
        raise HostMpiError(
            f"{host}: the host MPI {library} loads {first['name']} from {first['path']}"
            f"{f' (and {len(outside) - 1} more outside)' if len(outside) > 1 else ''}, which is in no directory of "
            f"native_mpi.library_dirs ({', '.join(library_dirs) or 'empty'}), so a rank would load the image's; "
            "allowed: every directory of the host MPI's libraries in native_mpi.library_dirs, each bound into every "
            "container at its path: directories of the MPI's own, not a system one the image has too")
    slurm_node = {"slurm_node": os.environ["SLURMD_NODENAME"]} if os.environ.get("SLURMD_NODENAME") else {}
    return {"host": host, **slurm_node, "closure": found,
            "library": {"path": real, "device": device, "inode": inode, "version": opened["version"]}}


def names(answers: list[dict]) -> list[str]:
    """The file names every rank reports: those of the nodes' closures."""
    return sorted({each["name"] for answer in answers for each in answer.get("closure") or []})
