"""Fabric verification: which transport and interface each layer really used.

Two kinds of evidence, both real:
- NCCL and UCX log excerpts copied line for line from public bug reports (no GPU or
  InfiniBand here); each constant names its source;
- Open MPI 4.1.4 and UCX 1.13 runs of the network benchmark on this machine, inside
  network namespaces made for the test, with two interfaces each on its own subnet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from containerbench.fabrics import debug_environment, expected_transport, keeps_shared_memory, observe_transport, verify
from containerbench.rank import markers

ROOT = Path(__file__).resolve().parents[1]
SITE = yaml.safe_load((ROOT / "config" / "site.example.yaml").read_text())["fabrics"]
LOCAL = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["fabrics"]
INFINIBAND, ETHERNET = SITE["infiniband"], SITE["ethernet"]

# NVIDIA/nccl#707 (NCCL 2.7.6, A100, GPUDirect RDMA on): one process driving 4 GPUs.
NCCL_IB_GDRDMA = """\
10-90-43-152:120890:120890 [0] NCCL INFO Bootstrap : Using [0]ib8:192.168.1.8<0> [1]ib9:192.168.1.9<0> [2]ib10:192.168.1.10<0> [3]ib11:192.168.1.11<0> [4]ib12:192.168.1.12<0> [5]ib14:192.168.1.14<0> [6]ib15:192.168.1.15<0>
10-90-43-152:120890:120890 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
10-90-43-152:120890:120890 [0] NCCL INFO NET/IB : Using [0]mlx5_8:1/IB [1]mlx5_9:1/IB [2]mlx5_10:1/IB [3]mlx5_11:1/IB [4]mlx5_12:1/IB [5]mlx5_14:1/IB [6]mlx5_15:1/IB [7]mlx5_16:1/RoCE [8]mlx5_17:1/RoCE ; OOB ib8:192.168.1.8<0>
10-90-43-152:120890:120890 [0] NCCL INFO Using network IB
NCCL version 2.7.6+cuda11.1
10-90-43-152:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA
10-90-43-152:120890:121563 [3] NCCL INFO Channel 01 : 3[ca000] -> 2[c7000] [send] via NET/IB/2/GDRDMA
10-90-43-152:120890:121560 [0] NCCL INFO Channel 02 : 3[ca000] -> 0[87000] [receive] via NET/IB/4/GDRDMA
"""  # noqa: E501 (the log as quoted)
# Mellanox/nv_peer_memory#56 (NCCL 2.5.6): IB, but GPUDirect RDMA disabled by distance.
NCCL_IB_NO_GDR = """\
master_node:11718:11985 [3] NCCL INFO Ring 00 : 3[3] -> 1[1] via P2P/IPC
master_node:11717:11986 [2] NCCL INFO NET/IB : GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (distance 3 >= 2)
master_node:11717:11986 [2] NCCL INFO Ring 00 : 6 -> 2 [receive] via NET/IB/0
secondary_node:11791:12057 [2] NCCL INFO NET/IB : GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (distance 3 >= 2)
secondary_node:11791:12057 [2] NCCL INFO Ring 00 : 6 -> 2 [send] via NET/IB/0
"""
# horovod/horovod#1523 (NCCL 2.4.7): the first "NET/Socket : Using" is the bootstrap socket.
NCCL_24_BOOTSTRAP = """\
master_node:20:289 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>
master_node:20:289 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
master_node:20:289 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>
NCCL version 2.4.7+cuda10.0
"""
# NVIDIA/nccl#676 (NCCL 2.11.4, NCCL_NET=Socket, NCCL_SOCKET_IFNAME=en).
NCCL_SOCKET = """\
gpu01:124172:124172 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to en
gpu01:124172:124172 [0] NCCL INFO NCCL_SOCKET_IFNAME set to en
gpu01:124172:124172 [0] NCCL INFO Bootstrap : Using enp225s0f1:10.10.10.2<0>
gpu01:124172:124172 [0] NCCL INFO NET/Socket : Using [0]enp225s0f1:10.10.10.2<0>
gpu01:124172:124172 [0] NCCL INFO Using network Socket
NCCL version 2.11.4+cuda11.4
"""
# NVIDIA/nccl#300 (NCCL 2.5.6 under mpirun --tag-output): no IB device, sockets on lo.
NCCL_NO_DEVICE = """\
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO Bootstrap : Using [0]lo:127.0.0.1<0>
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/IB : No device found.
[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
[1,0]<stdout>:NCCL version 2.5.6+cuda10.2
"""  # noqa: E501 (the log as quoted)
# huggingface/accelerate#2183: an environment without libibverbs, two ranks.
NCCL_NO_VERBS = """\
axon:5020:5091 [1] NCCL INFO Failed to open libibverbs.so[.1]
axon:5020:5091 [1] NCCL INFO NET/Socket : Using [0]enp1s0f0:10.144.220.24<0>
axon:5020:5091 [1] NCCL INFO Using network Socket
axon:5021:5090 [2] NCCL INFO Failed to open libibverbs.so[.1]
axon:5021:5090 [2] NCCL INFO NET/Socket : Using [0]enp1s0f0:10.144.220.24<0>
axon:5021:5090 [2] NCCL INFO Using network Socket
"""
# NVIDIA/nccl#952 (IB cluster, "NET/IB : No device found"): the channels went over sockets.
NCCL_SOCKET_CHANNELS = """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
<cluster_name>:926:1151 [7] NCCL INFO Channel 07/0 : 15[7] -> 6[6] [send] via NET/Socket/3
"""
# NVIDIA/nccl-tests#185 (NCCL 2.19.3, H100, RoCE).
NCCL_ROCE = """\
dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0
dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
"""  # noqa: E501 (the log as quoted)
# open-mpi/ompi#9080 (UCX_LOG_LEVEL=info, pml ucx on InfiniBand) and parthenon-hpc-lab/parthenon#1260
# (the newer "cfg#N" form).
UCX_IB = """\
[1624984398.083715] [r39c2t5n1:22453:0]     ucp_worker.c:1720 UCX  INFO  ep_cfg[0]: tag(self/memory rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1);
[1624984398.157904] [r39c2t5n1:22453:1]     ucp_worker.c:1720 UCX  INFO  ep_cfg[1]: tag(rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1);
"""  # noqa: E501 (the log as quoted)
UCX_IB_NEW = """\
[1750940428.181226] [jpbo-007-31:2814548:0]      ucp_worker.c:1903 UCX  INFO    ucp_context_0 inter-node cfg#8 tag(rc_mlx5/mlx5_2:1 rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1 rc_mlx5/mlx5_3:1 rc_mlx5/mlx5_2:1 rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1 rc_mlx5/mlx5_3:1)
"""  # noqa: E501 (the log as quoted)
# Horovod 0.28.1 with HOROVOD_LOG_LEVEL=debug, from a run on this machine (MPI operations),
# and the same line as Horovod prints it when HOROVOD_CPU_OPERATIONS=gloo.
HOROVOD_MPI = ("[2026-11-22 00:40:28.105173: D /tmp/pip-install-peqjst97/horovod_bfdc7dbd475e4a7ba6e35964def824a8/"
               "horovod/common/utils/env_parser.cc:73] Using MPI to perform CPU operations.")
HOROVOD_GLOO = HOROVOD_MPI.replace("Using MPI", "Using Gloo")


def one(observations, layer):
    found = [o for o in observations if o.layer == layer]
    assert len(found) == 1, found
    return found[0]


def fabric_with(base: dict, **env) -> dict:
    return {"env": {**base["env"], **env}}


# --- NCCL ------------------------------------------------------------------------------------------

def test_nccl_ib_with_gdrdma_names_the_devices_the_channels_used():
    nccl = one(observe_transport(NCCL_IB_GDRDMA), "nccl")
    assert nccl.transport == "ib"
    assert nccl.interfaces == ("mlx5_10:1", "mlx5_12:1", "mlx5_14:1")  # devices [2], [4], [5] of the list
    assert "GDRDMA" in nccl.detail and "RoCE" not in nccl.detail
    assert nccl.evidence[0].endswith("[receive] via NET/IB/5/GDRDMA")

    hcas = "mlx5_8,mlx5_9,mlx5_10,mlx5_11,mlx5_12,mlx5_14,mlx5_15"
    assert verify(NCCL_IB_GDRDMA, fabric_with(INFINIBAND, NCCL_IB_HCA=hcas), layers=("nccl",)).ok
    # NCCL_IB_HCA entries are prefixes ("mlx5_1" takes mlx5_10..14); "=" makes the list exact.
    exact = verify(NCCL_IB_GDRDMA, fabric_with(INFINIBAND, NCCL_IB_HCA="=mlx5_0,mlx5_1"), layers=("nccl",))
    assert exact.status == "mismatch" and "interface" in exact.reason
    ethernet = verify(NCCL_IB_GDRDMA, ETHERNET, layers=("nccl",))
    assert ethernet.status == "mismatch" and not ethernet.ok
    assert "asks for tcp" in ethernet.reason and "shows ib" in ethernet.reason
    assert any(line.endswith("via NET/IB/5/GDRDMA") for line in ethernet.evidence)


def test_nccl_ib_without_gdrdma():
    nccl = one(observe_transport(NCCL_IB_NO_GDR), "nccl")
    assert (nccl.transport, nccl.count, nccl.interfaces) == ("ib", 2, ())  # two processes, no device list
    assert "GDRDMA" not in nccl.detail
    assert nccl.evidence == ("master_node:11717:11986 [2] NCCL INFO Ring 00 : 6 -> 2 [receive] via NET/IB/0",)
    assert verify(NCCL_IB_NO_GDR, {"env": {"NCCL_IB_DISABLE": 0}}, layers=("nccl",)).ok
    # IB confirmed, but which HCA is not in these lines: not a pass, not a failure.
    partial = verify(NCCL_IB_NO_GDR, INFINIBAND, layers=("nccl",))
    assert partial.status == "unverified" and "interface" in partial.reason
    assert verify(NCCL_IB_NO_GDR, ETHERNET, layers=("nccl",)).status == "mismatch"


def test_nccl_24_bootstrap_socket_line_is_not_the_data_transport():
    nccl = one(observe_transport(NCCL_24_BOOTSTRAP), "nccl")
    assert (nccl.transport, nccl.interfaces) == ("ib", ("mlx5_0:1",))
    assert verify(NCCL_24_BOOTSTRAP, fabric_with(INFINIBAND, NCCL_IB_HCA="mlx5_0"), layers=("nccl",)).ok


def test_nccl_socket_over_a_named_interface():
    nccl = one(observe_transport(NCCL_SOCKET), "nccl")
    assert (nccl.transport, nccl.interfaces, nccl.addresses) == ("tcp", ("enp225s0f1",), ("10.10.10.2",))
    assert nccl.evidence[0].endswith("NCCL INFO Using network Socket")
    asked = {"env": {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "en"}}
    assert verify(NCCL_SOCKET, asked, layers=("nccl",)).ok
    wrong_interface = verify(NCCL_SOCKET, ETHERNET, layers=("nccl",))  # asks for eth0
    assert wrong_interface.status == "mismatch"
    assert "NCCL_SOCKET_IFNAME=eth0" in wrong_interface.reason and "enp225s0f1" in wrong_interface.reason
    assert NCCL_SOCKET.splitlines()[3] in wrong_interface.evidence  # NET/Socket : Using [0]enp225s0f1:...
    wrong_transport = verify(NCCL_SOCKET, INFINIBAND, layers=("nccl",))
    assert wrong_transport.status == "mismatch" and "asks for ib (NCCL_NET=IB" in wrong_transport.reason


def test_silent_fallback_no_ib_device_then_sockets():
    nccl = one(observe_transport(NCCL_NO_DEVICE), "nccl")
    assert (nccl.transport, nccl.interfaces) == ("tcp", ("lo",))  # not the Bootstrap line's lo: the NET one
    assert "fell back: no IB device" in nccl.detail
    asked_ib = {"env": {"NCCL_IB_DISABLE": 0, "NCCL_IB_HCA": "mlx5_0"}}  # IB allowed, no NCCL_NET=IB guard
    check = verify(NCCL_NO_DEVICE, asked_ib, layers=("nccl",))
    assert check.status == "mismatch" and "fell back" in check.reason
    assert check.evidence == [
        "[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/IB : No device found.",
        "[1,0]<stdout>:5873af64cf59:10158:10560 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
    ]
    assert verify(NCCL_NO_DEVICE, ETHERNET, layers=("nccl",)).status == "mismatch"  # lo, not eth0
    assert verify(NCCL_NO_DEVICE, LOCAL["tcp-loopback"], layers=("nccl",)).ok


def test_silent_fallback_without_libibverbs():
    nccl = one(observe_transport(NCCL_NO_VERBS), "nccl")
    assert (nccl.transport, nccl.interfaces, nccl.count) == ("tcp", ("enp1s0f0",), 2)
    check = verify(NCCL_NO_VERBS, INFINIBAND, layers=("nccl",))
    assert check.status == "mismatch" and "no libibverbs" in check.reason
    assert check.evidence[0] == "axon:5020:5091 [1] NCCL INFO Failed to open libibverbs.so[.1]"


def test_socket_channels_contradict_infiniband():
    nccl = one(observe_transport(NCCL_SOCKET_CHANNELS), "nccl")
    assert nccl.transport == "tcp"
    check = verify(NCCL_SOCKET_CHANNELS, INFINIBAND, layers=("nccl",))
    assert check.status == "mismatch"
    assert check.evidence == [NCCL_SOCKET_CHANNELS.splitlines()[1]]  # the first "via NET/Socket/3" line


def test_roce_counts_as_ib_and_exact_hca_lists():
    nccl = one(observe_transport(NCCL_ROCE), "nccl")
    assert (nccl.transport, nccl.interfaces, nccl.detail) == ("ib", ("mlx5_10:1", "mlx5_11:1"), "RoCE")
    assert verify(NCCL_ROCE, {"env": {"NCCL_NET": "IB", "NCCL_IB_HCA": "=mlx5_10,mlx5_11"}}, layers=("nccl",)).ok
    assert verify(NCCL_ROCE, {"env": {"NCCL_NET": "IB", "NCCL_IB_HCA": "^=mlx5_11"}},
                  layers=("nccl",)).status == "mismatch"


# --- UCX, Horovod, and nothing decisive --------------------------------------------------------------

def test_ucx_endpoint_lines():
    ucx = one(observe_transport(UCX_IB), "ucx")
    assert (ucx.transport, ucx.interfaces) == ("ib", ("mlx5_0:1", "mlx5_1:1"))
    both = fabric_with(INFINIBAND, UCX_NET_DEVICES="mlx5_0:1,mlx5_1:1")
    assert verify(UCX_IB, both).ok  # the MPI layer, served by UCX under pml ucx
    only_first = verify(UCX_IB, fabric_with(INFINIBAND, UCX_NET_DEVICES="mlx5_0:1"))  # one rail alone
    assert only_first.status == "mismatch" and "mlx5_1:1" in only_first.reason
    assert one(observe_transport(UCX_IB_NEW), "ucx").interfaces == ("mlx5_2:1", "mlx5_0:1", "mlx5_1:1", "mlx5_3:1")
    assert verify(UCX_IB, ETHERNET).status == "mismatch"


def test_horovod_gloo_operations_are_tcp_and_name_no_interface():
    assert observe_transport(HOROVOD_MPI) == []  # the MPI layer's own lines decide that case
    gloo = one(observe_transport(HOROVOD_GLOO), "gloo")
    assert gloo.transport == "tcp" and gloo.interfaces == ()
    assert verify(HOROVOD_GLOO, ETHERNET).status == "unverified"  # HOROVOD_GLOO_IFACE=eth0 cannot be checked
    ib = verify(HOROVOD_GLOO, {"env": {}, "expect": {"transport": "ib"}})
    assert ib.status == "mismatch" and ib.evidence == [HOROVOD_GLOO]


def test_no_decisive_line_is_unverified_not_a_pass():
    chatter = "containerbench: resnet50 32px batch 2/rank, 2 rank(s)\n  step 1/2: 1.236 s      1.62 img/s\n"
    check = verify(chatter, ETHERNET)
    assert check.status == "unverified" and not check.ok and "mpi: no line" in check.reason
    nothing_asked = verify(NCCL_SOCKET, {"env": {}}, layers=("nccl",))
    assert nothing_asked.status == "unverified" and "expect block" in nothing_asked.reason
    assert verify(NCCL_SOCKET, {"env": {}, "expect": {"transport": "socket", "interface": "enp225s0f1"}},
                  layers=("nccl",)).ok


# --- expectations and debug variables ----------------------------------------------------------------

def test_expectations_derived_from_the_example_configs():
    ib = expected_transport(INFINIBAND)
    assert (ib.transport, ib.declared) == ("ib", False)
    assert {layer: e.transport for layer, e in ib.layers.items()} == {"nccl": "ib", "ucx": "ib", "mpi": "ib"}
    rails = range(4)  # the example's H100 nodes: four NDR rails
    assert ib.layers["nccl"].interfaces == {"ib": tuple(f"=mlx5_{r}" for r in rails)}  # the example: exact names
    assert ib.layers["ucx"].interfaces == {"ib": tuple(f"=mlx5_{r}:1" for r in rails)}
    eth = expected_transport(ETHERNET)
    assert {layer: e.transport for layer, e in eth.layers.items()} == {"nccl": "tcp", "ucx": "tcp", "mpi": "tcp",
                                                                       "gloo": "tcp"}
    assert eth.layers["mpi"].interfaces == {"tcp": ("=eth0",)}
    assert eth.layers["mpi"].source == "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0"
    loop = expected_transport(LOCAL["tcp-loopback"])
    assert loop.layers["nccl"].transport is None and loop.layers["nccl"].interfaces == {"tcp": ("lo",)}
    declared = expected_transport({"env": INFINIBAND["env"], "expect": {"transport": "socket", "interface": "eth1"}})
    assert declared.declared and declared.transport == "tcp" and declared.interface == ("eth1",)
    assert all(e.interfaces == {"tcp": ("=eth1",)} for e in declared.layers.values())


def test_debug_environment_adds_logging_and_keeps_explicit_settings():
    added = debug_environment(ETHERNET["env"])
    assert added == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV", "UCX_LOG_LEVEL": "info",
                     "HOROVOD_LOG_LEVEL": "debug", "OMPI_MCA_btl_base_verbose": "20",
                     "OMPI_MCA_mpi_show_mca_params": "enviro,file"}
    assert debug_environment(INFINIBAND["env"])["OMPI_MCA_btl_base_verbose"] == "1"  # pml ucx: no TCP BTL
    explicit = {**ETHERNET["env"], "NCCL_DEBUG": "WARN", "OMPI_MCA_btl_base_verbose": 100}
    added = debug_environment(explicit)
    assert "NCCL_DEBUG" not in added and "OMPI_MCA_btl_base_verbose" not in added
    merged = {**added, **{k: str(v) for k, v in explicit.items()}}
    assert merged["NCCL_DEBUG"] == "WARN" and merged["OMPI_MCA_btl_base_verbose"] == "100"
    assert merged["NCCL_DEBUG_SUBSYS"] == "INIT,NET,ENV" and merged["NCCL_SOCKET_IFNAME"] == "eth0"


# --- real Open MPI runs in network namespaces ----------------------------------------------------------

SUBNETS = {"fabA": "10.213.1", "fabB": "10.213.2"}  # private, and only inside the namespaces below


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def netns(bench_python):
    """Namespace `ranks` holds lo plus fabA and fabB, veth pairs whose peers sit in `peers`."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("mpirun") is None:
        pytest.fail("these tests need root, iproute2 (`ip`) and Open MPI's mpirun")
    ranks, peers = f"cbfab-{os.getpid()}-r", f"cbfab-{os.getpid()}-p"
    made = []
    try:
        for ns in (ranks, peers):
            result = _ip("netns", "add", ns)
            if result.returncode:
                pytest.fail(f"cannot create a network namespace ({result.stderr.strip()}); the Open MPI "
                            "interface tests need two interfaces of their own")
            made.append(ns)
        steps = [("-n", ranks, "link", "set", "lo", "up")]
        for name, subnet in SUBNETS.items():
            steps += [("-n", ranks, "link", "add", name, "type", "veth", "peer", "name", name + "p", "netns", peers),
                      ("-n", ranks, "addr", "add", subnet + ".1/24", "dev", name),
                      ("-n", peers, "addr", "add", subnet + ".2/24", "dev", name + "p"),
                      ("-n", ranks, "link", "set", name, "up"), ("-n", peers, "link", "set", name + "p", "up")]
        for step in steps:
            result = _ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        yield ranks
    finally:
        for ns in made:
            _ip("netns", "del", ns)


def run_netbench(netns, bench_python, mca: dict, fabric_env: dict) -> list[str]:
    """The network benchmark on 2 ranks inside the namespace, with the fabric's and the debug variables."""
    argv = ["ip", "netns", "exec", netns, "mpirun", "--allow-run-as-root", "-np", "2"]
    for key, value in mca.items():
        argv += ["--mca", key, value]
    argv += [str(bench_python), "-m", "containerbench.rank.netbench", "--max-bytes", "1024", "--max-iters", "100"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **{k: str(v) for k, v in fabric_env.items()},
           **debug_environment(fabric_env)}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and markers.payloads_of(output.splitlines(), markers.RESULT), output[-3000:]
    return output.splitlines()


def tcp_fabric(include: str) -> dict:
    return {"env": {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": include}}


@pytest.fixture(scope="module")
def tcp_runs(netns, bench_python):
    """One real run per interface, as the brief's command line: --mca pml ob1 --mca btl self,tcp ..."""
    return {name: run_netbench(netns, bench_python,
                               {"pml": "ob1", "btl": "self,tcp", "btl_tcp_if_include": name}, tcp_fabric(name)["env"])
            for name in SUBNETS}


@pytest.mark.parametrize("asked,other", [("fabA", "fabB"), ("fabB", "fabA")])
def test_openmpi_tcp_interface_is_the_one_asked_for(tcp_runs, asked, other):
    lines = tcp_runs[asked]
    mpi = one(observe_transport(lines), "mpi")
    assert (mpi.transport, mpi.interfaces, mpi.count) == ("tcp", (asked,), 2)
    assert any(line.endswith(f"btl: tcp: Using interface: {asked} ") for line in mpi.evidence)
    check = verify(lines, tcp_fabric(asked))
    assert check.ok, check.reason
    assert check.reason == f"as asked: mpi: tcp over {asked}"
    # The same run judged against a fabric that wants the other interface: a mismatch, with the line.
    wrong = verify(lines, tcp_fabric(other))
    assert wrong.status == "mismatch"
    assert wrong.reason == (f"mpi: the fabric asks for interface {other} (OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp "
                            f"OMPI_MCA_btl_tcp_if_include={other}), the log shows tcp over {asked}")
    assert any("mca: bml: Using tcp btl for send to" in line for line in wrong.evidence)
    assert any(line.endswith(f"btl: tcp: Using interface: {asked} ") for line in wrong.evidence)
    assert verify(lines, {"env": {}, "expect": {"transport": "tcp", "interface": other}}).status == "mismatch"


def test_openmpi_subnet_include_is_checked_by_address(netns, bench_python):
    fabric = tcp_fabric(SUBNETS["fabB"] + ".0/24")
    lines = run_netbench(netns, bench_python, {}, fabric["env"])  # this time from the environment alone
    mpi = one(observe_transport(lines), "mpi")
    assert (mpi.interfaces, mpi.addresses) == (("fabB",), (SUBNETS["fabB"] + ".1",))
    assert verify(lines, fabric).ok
    assert verify(lines, tcp_fabric(SUBNETS["fabA"] + ".0/24")).status == "mismatch"
    assert verify(lines, {"env": {}, "expect": {"transport": "tcp", "interface": "fabB"}}).ok


def test_openmpi_named_exclude_list_is_not_taken_for_the_interface(netns, bench_python):
    # Open MPI 4.1 prints "btl: tcp: Using interface: X" for the names of an exclude list too;
    # only rank 0's list of settings (mpi_show_mca_params) tells which list it was.
    env = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_exclude": "lo,fabA"}
    lines = run_netbench(netns, bench_python, {}, env)
    assert any(line.endswith("btl: tcp: Using interface: fabA ") for line in lines)
    assert any(line.endswith("btl_tcp_if_exclude=lo,fabA (environment)") for line in lines)
    mpi = one(observe_transport(lines), "mpi")
    assert (mpi.transport, mpi.interfaces) == ("tcp", ())
    check = verify(lines, {"env": env, "expect": {"transport": "tcp", "interface": "fabA"}})
    assert check.status == "unverified" and "does not name the interface" in check.reason


def test_ucx_pml_over_tcp_is_read_from_ucx(netns, bench_python):
    fabric = {"env": {"OMPI_MCA_pml": "ucx", "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "fabB"}}
    # Open MPI's pml ucx refuses TCP-only UCX unless told; the fabric's own env stays as it is.
    lines = run_netbench(netns, bench_python, {"pml_ucx_tls": "any", "pml_ucx_devices": "any"}, fabric["env"])
    ucx = one(observe_transport(lines), "ucx")
    assert (ucx.transport, ucx.interfaces) == ("tcp", ("fabB",))
    assert "UCX  INFO" in ucx.evidence[0] and "tcp/fabB" in ucx.evidence[0]
    assert verify(lines, fabric).ok
    assert verify(lines, {"env": {**fabric["env"], "UCX_NET_DEVICES": "fabA"}}).status == "mismatch"


def test_openmpi_silent_fallback_from_ucx_to_tcp(netns, bench_python):
    # Asked for UCX over InfiniBand without forcing the PML: with no IB device here Open MPI
    # quietly takes ob1 and the TCP BTL, and the benchmark succeeds.
    fabric = {"env": {"UCX_TLS": "rc,sm,self", "UCX_NET_DEVICES": "mlx5_0:1"}, "expect": {"transport": "ib"}}
    lines = run_netbench(netns, bench_python, {"btl": "self,tcp", "btl_tcp_if_include": "fabA"}, fabric["env"])
    check = verify(lines, fabric)
    assert check.status == "mismatch" and "mpi: the fabric asks for ib" in check.reason
    assert any("mca: bml: Using tcp btl for send to" in line for line in check.evidence)


def test_shared_memory_only_is_unverified(netns, bench_python):
    lines = run_netbench(netns, bench_python, {"btl": "self,vader"}, {})
    assert one(observe_transport(lines), "mpi").transport == "shm"
    check = verify(lines, tcp_fabric("fabA"))
    assert check.status == "unverified" and "shared memory" in check.reason


def test_grpc_traffic_of_tensorflow_modes_is_checked_against_the_fabric():
    """TF's own modes bind gRPC on the interface the fabric names; another one is a mismatch."""
    from containerbench.fabrics import check_grpc

    base = {"status": "ok", "reason": "as asked: mpi: tcp over fast0", "evidence": ["btl line"],
            "expected": {"interface": ["fast0"]}}
    assert (check_grpc(base, "fast0", "10.0.0.1")["reason"]
            == "as asked: mpi: tcp over fast0; grpc: tcp over fast0 (10.0.0.1)")
    wrong = check_grpc(base, "slow0", "10.1.0.1", "result line 9")
    assert wrong["status"] == "mismatch" and wrong["evidence"][0] == "result line 9"
    assert wrong["reason"] == "grpc: the fabric asks for interface fast0, the benchmark bound slow0 (10.1.0.1)"
    unknown = check_grpc(base, None, "node1")
    assert unknown["status"] == "unverified"
    assert "grpc: tcp over the hostname (node1): not an interface" in unknown["reason"]
    assert check_grpc({**base, "expected": {"interface": []}}, None, "node1")["status"] == "ok"


@pytest.mark.parametrize("env, keeps", [
    (INFINIBAND["env"], True),   # UCX_TLS rc,sm,self: UCX's shared memory inside a node
    (ETHERNET["env"], True),     # OMPI_MCA_btl self,vader,tcp: vader, Open MPI 4's shared-memory BTL
    (LOCAL["tcp-loopback"]["env"], False),  # btl self,tcp and UCX_TLS tcp: every byte through TCP, on one node too
    ({"UCX_TLS": "^sm"}, False), ({"UCX_TLS": "^ib"}, True), ({"OMPI_MCA_btl": "^vader"}, False),
    # NCCL's "Environment Variables": NCCL_SHM_DISABLE and NCCL_P2P_DISABLE, both, leave it the network.
    ({"NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}, False), ({"NCCL_SHM_DISABLE": "1"}, True), ({}, True),
])
def test_a_fabric_that_shuts_shared_memory_out_crosses_its_network_on_one_node_too(env, keeps):
    # UCX's FAQ, "which transports": sm/shm name every shared-memory transport (posix, sysv, cma, ...).
    assert keeps_shared_memory(env) is keeps
