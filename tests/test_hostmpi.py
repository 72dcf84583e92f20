"""The host MPI of a native run, read on the node (containerbench.hostmpi): this machine's real MPICH, opened in a
fresh process as on a compute node, in the directory `make setup` lays out for config/native.yaml and where Debian
installs it. Marked bench: it needs the system MPICH that setup installs beside Open MPI."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from helpers import ROOT

from containerbench import hostmpi
from containerbench.execution import node_answers
from containerbench.records import Verdict, judge_host_mpi_closure

pytestmark = pytest.mark.bench
DEBIAN_MPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The host MPI in a directory of its own, made by the script `make setup` runs."""
    if not os.path.exists(DEBIAN_MPICH):
        pytest.skip(f"no {DEBIAN_MPICH}: scripts/install-system-deps.sh installs it")
    out = tmp_path_factory.mktemp("host-mpi") / "mpich"
    subprocess.run([str(ROOT / "scripts" / "host-mpi-tree.sh"), DEBIAN_MPICH, str(out)], check=True)
    return out / "lib"


def maps_device(path) -> str:
    """st_dev as /proc/PID/maps writes it, major:minor in hex (proc(5), "dev")."""
    dev = os.stat(path).st_dev
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def test_the_node_reads_every_library_the_host_mpi_loads_with_its_device_and_inode(tree):
    found = hostmpi.closure(str(tree / "libmpich.so.12"), [str(tree)])
    library = found["library"]
    assert library["path"] == str(tree / "libmpich.so.12") and library["version"].startswith("MPICH Version:")
    assert (library["device"], library["inode"]) == (maps_device(library["path"]), os.stat(library["path"]).st_ino)
    names = {each["name"] for each in found["closure"]}
    # Debian's libmpich12 links UCX, hwloc, numa and udev (ldd); none of the C runtime, the image's, is listed.
    assert {"libucp.so.0", "libucs.so.0", "libuct.so.0", "libucm.so.0", "libhwloc.so.15", "libnuma.so.1"} <= names
    assert not [name for name in names if hostmpi.is_c_runtime(name)]
    for each in found["closure"]:
        assert os.path.dirname(each["path"]) == str(tree), each
        assert (each["device"], each["inode"]) == (maps_device(each["path"]), os.stat(each["path"]).st_ino)


def test_a_host_mpi_that_loads_from_a_system_directory_is_refused_on_the_node_in_one_line():
    """Debian's own MPICH loads UCX from /usr/lib/x86_64-linux-gnu, which the image has too: no bind can make
    those the host's, so the node refuses before any rank starts, naming the library and the way out."""
    if not os.path.exists(DEBIAN_MPICH):
        pytest.skip(f"no {DEBIAN_MPICH}")
    done = subprocess.run([sys.executable, "-m", "containerbench", "node-mpi", "--library", DEBIAN_MPICH],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"containerbench: node-mpi: {os.uname().nodename}: the host MPI {DEBIAN_MPICH} loads ")
    assert line.endswith("which is in no directory of native_mpi.library_dirs (empty), so a rank would load the "
                         "image's; allowed: every directory of the host MPI's libraries in native_mpi.library_dirs, "
                         "each bound into every container at its path: directories of the MPI's own, not a system "
                         "one the image has too")


def test_the_node_step_prints_its_answer_as_one_line_the_launch_reads_back(tree):
    done = subprocess.run([sys.executable, "-m", "containerbench", "node-mpi", "--library",
                           str(tree / "libmpich.so.12"), "--library-dir", str(tree)],
                          capture_output=True, text=True, check=True)
    [answer] = node_answers(done.stdout, hostmpi.LINE)
    assert answer == hostmpi.closure(str(tree / "libmpich.so.12"), [str(tree)])
    assert hostmpi.names([answer]) == sorted(each["name"] for each in answer["closure"])


def test_two_nodes_answers_cut_and_interleaved_as_srun_forwards_them_are_read_back_whole(tree):
    """Found on the Slurm test cluster (1 run in 3): slurmstepd forwards a task's output a line at a time, but a
    line longer than 1 kB (SLURM_IO_MAX_MSG_LEN) in pieces, between other tasks' lines, so two nodes' answers of
    1.3 kB each came back cut into each other, and neither was read. The answer goes out in lines of under 900
    bytes (rank/markers.py: numbered parts, each checked), which arrive whole in any order."""
    from containerbench.rank import markers

    answer = hostmpi.closure(str(tree / "libmpich.so.12"), [str(tree)])
    first, second = ({**answer, "host": host} for host in ("n1", "n2"))
    parts = [markers.framed(hostmpi.LINE, first), markers.framed(hostmpi.LINE, second)]
    assert len(parts[0]) > 1 and all(len(part.encode()) < 1024 for each in parts for part in each)
    interleaved = [line for pair in zip(*reversed(parts)) for line in pair]  # n2's first part first
    assert node_answers("".join(interleaved), hostmpi.LINE) == [first, second]
    # What the cluster printed: one line of 1.3 kB each, cut at 1 kB and interleaved; neither is taken.
    whole = [markers.line(hostmpi.LINE, each) for each in (first, second)]
    mangled = whole[0][:1024] + whole[1][:1024] + "\n" + whole[0][1024:] + whole[1][1024:]
    assert node_answers(mangled, hostmpi.LINE) == []


def test_a_rank_whose_host_did_not_answer_is_not_taken_on_trust(tree):
    answer = hostmpi.closure(str(tree / "libmpich.so.12"), [str(tree)])
    verdict = Verdict()
    judge_host_mpi_closure([answer], {"processes": [{"rank": 1, "hostname": "other-node", "context": {}}]}, verdict)
    assert verdict.reasons == [f"native MPI: rank 1 ran on other-node, where the host MPI was not read (node-mpi "
                               f"answered from {answer['host']})"]


def test_the_preflight_check_refuses_a_host_mpi_the_nodes_cannot_bind_before_any_job(tmp_path, tree):
    """Before any job, not run by run (issue 32, finding 10): each native runtime's need, the host MPI as its ranks
    will load it, is asked on each node by the pre-flight check with the same node-mpi step each run takes."""
    from helpers import tiny_config

    from containerbench import preflight, runtimes

    def needs(native_mpi: dict) -> list:
        config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud"], native_mpi=native_mpi,
                             images={"charliecloud": {"image": str(tmp_path / "image.ch"),
                                                             "mpi_model": ["hybrid", "native"]}})
        return [need for need in runtimes.node_requirements(config) if need.source == "hostmpi.py"]

    [bound] = needs({"library": str(tree / "libmpich.so.12"), "library_dirs": [str(tree)]})
    assert bound.argv == (sys.executable, "-m", "containerbench", "node-mpi", "--library",
                          str(tree / "libmpich.so.12"), "--library-dir", str(tree))
    assert preflight.check_requirements([bound]) == []
    [system] = needs({"library": DEBIAN_MPICH})
    [problem] = preflight.check_requirements([system])
    assert problem.startswith("runtime 'charliecloud' needs the host MPI with every library it loads in "
                              f"native_mpi.library_dirs: `{shlex.join(system.argv)}` failed: containerbench: "
                              f"node-mpi: {os.uname().nodename}: the host MPI {DEBIAN_MPICH} loads "), problem
    assert problem.endswith(" (hostmpi.py)") and "\n" not in problem
