"""The hardware tier (issue 33): each parser on real outputs of its tool, recorded by others
(tests/data/hardware/SOURCES.md says where each comes from), and the check run here, where none of the
tools is installed: each check skipped with its reason, never a pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, fleet_records

from containerbench import fleet, fleetexport, fleetplan, hardware

DATA = ROOT / "tests" / "data" / "hardware"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_nvidia_smi_q_names_each_gpus_fault_by_its_line():
    # nvidia-smi(1), "Clocks Event Reasons": HW Slowdown is the hardware's own (power brake, thermal); SW
    # Power Cap is a policy, which is why the healthy GPUs' "SW Power Cap : Active" lines are not findings.
    gpus, findings = hardware.parse_nvidia_smi_q(read("nvidia-smi-q-h100-8gpu.txt"), expected_gpus=8)
    assert len(gpus) == 8 and gpus[0] == "00000000:53:00.0"
    assert [(f.what, f.line_number) for f in findings] == [
        ("GPU 00000000:75:00.0: HW Power Brake Slowdown active", 498),
        ("GPU 00000000:75:00.0: SW Thermal Slowdown active", 500)]
    assert findings[0].line.strip() == "HW Power Brake Slowdown       : Active"
    _, findings = hardware.parse_nvidia_smi_q(read("nvidia-smi-q-h100-8gpu-hw-slowdown.txt"))
    assert len(findings) == 16 and {f.what.split(": ")[1] for f in findings} == {
        "HW Slowdown active", "HW Power Brake Slowdown active"}
    # "Remapped Rows": a pending remap needs a GPU reset.
    gpus, findings = hardware.parse_nvidia_smi_q(read("nvidia-smi-q-a10-remapped-rows-pending.txt"))
    [finding] = findings
    assert str(finding) == ("GPU 00000000:07:00.0: a row remap pending (reset the GPU) "
                            "(line 142: 'Pending                           : Yes')")
    # The older ECC layout, every counter N/A: nothing to find; one GPU where two are expected is a finding.
    gpus, findings = hardware.parse_nvidia_smi_q(read("nvidia-smi-q-titanv-ecc-na.txt"), expected_gpus=2)
    assert len(gpus) == 1 and [f.what for f in findings] == ["1 GPU(s) listed, 2 expected"]


def test_an_uncorrectable_ecc_error_and_a_narrowed_pcie_link_are_found():
    # The recorded H100 log with two of its values as a failing GPU shows them: the layout is the tool's.
    text = read("nvidia-smi-q-h100-8gpu.txt").splitlines()
    assert text[130].strip() == "DRAM Uncorrectable            : 0"
    assert text[69].strip() == "Current                   : 16x"
    text[130] = text[130].replace(": 0", ": 2")
    text[69] = text[69].replace("16x", "8x")
    _, findings = hardware.parse_nvidia_smi_q("\n".join(text))
    assert {(f.what, f.line_number) for f in findings} == {
        ("GPU 00000000:53:00.0: 2 uncorrectable ECC error(s) (DRAM Uncorrectable)", 131),
        ("GPU 00000000:53:00.0: PCIe link width 8x of 16x", 70),
        ("GPU 00000000:75:00.0: HW Power Brake Slowdown active", 498),
        ("GPU 00000000:75:00.0: SW Thermal Slowdown active", 500)}


def test_older_drivers_layouts_and_what_is_not_a_fault():
    # Older drivers: "Clocks Throttle Reasons"; the older ECC layout counts a Double Bit error under its memory
    # and again under "Total", once a fault. A width N/A (a GPU in a low-power state) is not one.
    text = read("nvidia-smi-q-h100-8gpu-hw-slowdown.txt")
    text = text.replace("Clocks Event Reasons", "Clocks Throttle Reasons")
    assert len(hardware.parse_nvidia_smi_q(text)[1]) == 16
    titan = read("nvidia-smi-q-titanv-ecc-na.txt").splitlines()
    double = [i for i, line in enumerate(titan) if line.strip() == "Double Bit"][0]  # the volatile one
    total = next(i for i in range(double, len(titan)) if titan[i].strip().startswith("Total"))
    assert titan[double + 1].strip().startswith("Device Memory") and total == double + 8
    for i in (double + 1, total):
        titan[i] = titan[i].replace("N/A", "1")
    assert [f.what for f in hardware.parse_nvidia_smi_q("\n".join(titan))[1]] == [
        "GPU 00000000:01:00.0: 1 uncorrectable ECC error(s) (Device Memory)"]
    width = "Current                   : "
    text = read("nvidia-smi-q-h100-8gpu.txt").replace(f"{width}16x", f"{width}N/A")
    assert not any("PCIe" in f.what for f in hardware.parse_nvidia_smi_q(text)[1])


def test_an_xid_an_application_causes_is_not_the_nodes():
    text = read("xid-48-63-94-dbe-rowremap.txt").replace("Xid (PCI:0000:19:00): 48,", "Xid (PCI:0000:19:00): 13,")
    assert "Xid 13" not in {f.what.split(" on ")[0] for f in hardware.parse_kernel_log(text)}
    assert hardware.parse_kernel_log(text)[0].what == "Xid 63 on PCI:0000:19:00"


def test_ibstat_finds_an_infiniband_port_down_and_leaves_ethernet_ports_alone():
    ports = hardware.parse_ibstat(read("ibstat-healthy.txt"))
    assert len(ports) == 9 and sum(p.link_layer == "InfiniBand" for p in ports) == 8
    assert hardware.ibstat_findings(ports) == []
    # One rail slower than the site says its ports run: found.
    assert [f.what for f in hardware.ibstat_findings(ports, expected_rate=400)][0] == (
        "mlx5_1 port 1: rate 200 Gb/s, 400 expected")
    [finding] = hardware.ibstat_findings(hardware.parse_ibstat(read("ibstat-down-polling-ib-rate10.txt")))
    assert str(finding) == "mlx5_10 port 1: Down, Polling (line 9: 'State: Down')"
    # Three Ethernet ports down (a host's unused NICs): not the fabric's, not a finding.
    ports = hardware.parse_ibstat(read("ibstat-down.txt"))
    assert sum(p.state == "Down" for p in ports) == 3 and hardware.ibstat_findings(ports) == []
    # The rails the site names: a dual-port card's unused port is not read, a rail missing is a finding.
    ports = hardware.parse_ibstat(read("ibstat-down-polling-ib-rate10.txt"))
    assert [f.what for f in hardware.ibstat_findings(ports, devices=["mlx5_0"])] == ["mlx5_0 not listed"]


def test_perfquery_counts_link_errors_only():
    [finding] = hardware.parse_perfquery(read("perfquery-x-linkdowned-xmitdiscards.txt"))
    assert str(finding) == "LinkDownedCounter 1 (line 15: 'LinkDownedCounter:...............1')"
    assert hardware.parse_perfquery(read("perfquery-x-clean-2ports.txt")) == []


def test_the_kernel_log_names_each_xid_and_a_gpu_fallen_off_the_bus():
    findings = hardware.parse_kernel_log(read("xid-48-63-94-dbe-rowremap.txt"))
    assert [f.what for f in findings[:3]] == ["Xid 48 on PCI:0000:19:00", "Xid 63 on PCI:0000:19:00",
                                              "Xid 94 on PCI:0000:19:00"]
    assert findings[0].line_number == 11
    [finding] = hardware.parse_kernel_log(read("xid-fallen-off-bus-no-xid-dmesg.txt"))
    assert finding.what == "a GPU has fallen off the bus" and finding.line_number == 3


def test_nvlink_and_dcgm_diagnostics():
    assert hardware.parse_nvlink_status(read("nvlink-status-a100-1gpu-healthy.txt")) == []
    # NVML's "all links are inactive" is what a PCIe GPU without a bridge says too: a fault where NVLink is expected.
    assert hardware.parse_nvlink_status(read("nvlink-status-a100-all-links-inactive.txt")) == []
    [finding] = hardware.parse_nvlink_status(read("nvlink-status-a100-all-links-inactive.txt"), expect_nvlink=True)
    assert finding.what == "GPU 6: NVLink inactive"
    # A link listed inactive among active ones, in the recorded layout, is one whatever is expected.
    text = read("nvlink-status-a100-1gpu-healthy.txt").replace("Link 3: 25 GB/s", "Link 3: <inactive>")
    assert [(f.what, f.line_number) for f in hardware.parse_nvlink_status(text)] == [("GPU 7: NVLink inactive", 5)]
    assert hardware.parse_dcgmi_diag(read("dcgmi-diag-r1-a10g-pass.txt")) == []
    [finding] = hardware.parse_dcgmi_diag(read("dcgmi-diag-r3-a10g-targeted-power-fail.txt"))
    assert finding.what == "Targeted Power: Fail - GPU: 1" and finding.line_number == 27


def hwcheck(out, path: str, *options: str) -> subprocess.CompletedProcess:
    """`containerbench fleet hwcheck` with PATH as given (the tools it finds there), as node n7 of Slurm."""
    env = {**os.environ, "PATH": path, "SLURMD_NODENAME": "n7"}
    return subprocess.run([sys.executable, "-m", "containerbench", "fleet", "hwcheck", "--out", str(out), *options],
                          capture_output=True, text=True, timeout=120, env=env)


def test_hwcheck_skips_each_absent_tool_with_its_reason_and_never_passes_it(tmp_path):
    done = hwcheck(tmp_path, str(tmp_path / "no-tools-here"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "n7.json").read_text())  # named as Slurm names the node, as the plan does
    assert report["node"] == "n7" and [check["name"] for check in report["checks"]] == list(hardware.TOOLS)
    for check in report["checks"]:
        tool = hardware.TOOLS[check["name"]][0]
        assert (check["status"], check["reason"]) == ("skipped", f"{tool} not found on n7")
        assert f"skipped {check['name']}: {tool} not found on n7" in done.stdout
    assert hardware.failures([tmp_path / "n7.json"], ["n7"]) == ({}, [])
    # A report of a node the plan does not name (an FQDN where Slurm's name was meant) is said, not judged.
    assert hardware.failures([tmp_path / "n7.json"], ["n7.cluster"]) == (
        {"n7.cluster": "hardware: no report from this node (`fleet hwcheck` did not run there)"}, ["n7"])


def tool(directory: Path, name: str, script: str) -> None:
    """A program of that name on the PATH given to hwcheck: the tools are not installable here, so each
    prints a recorded real output of its own (tests/data/hardware), as the node would."""
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_hwcheck_runs_each_tool_keeps_its_output_and_reads_each_ib_port_apart(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "nvidia-smi", f'[ "$1" = -q ] && exec /bin/cat {DATA}/nvidia-smi-q-a10-remapped-rows-pending.txt\n'
                                f'exec /bin/cat {DATA}/nvlink-status-a100-all-links-inactive.txt')
    tool(bin_dir, "ibstat", f"exec /bin/cat {DATA}/ibstat-healthy.txt")
    # perfquery(8): -C the CA, -P the port; the one with a downed link is mlx5_3's.
    tool(bin_dir, "perfquery", f'echo "$@" >> {tmp_path}/perfquery-args\n[ "$3" = mlx5_3 ] && '
                               f"exec /bin/cat {DATA}/perfquery-x-linkdowned-xmitdiscards.txt\n"
                               f"exec /bin/cat {DATA}/perfquery-x-clean-2ports.txt")
    tool(bin_dir, "dcgmi", 'echo "Error: unable to establish a connection to the specified host: localhost"; exit 1')
    tool(bin_dir, "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    done = hwcheck(tmp_path / "hw", str(bin_dir), "--gpus", "1")
    assert done.returncode == 1, done.stderr
    checks = {check["name"]: check for check in json.loads((tmp_path / "hw" / "n7.json").read_text())["checks"]}
    assert {name: check["status"] for name, check in checks.items()} == {
        "nvidia-smi -q": "fail", "nvidia-smi nvlink --status": "pass", "dmesg": "skipped", "ibstat": "pass",
        "perfquery -x": "fail", "dcgmi diag -r 1": "skipped"}
    # An A10 (PCIe) says all its links are inactive: a fault only where the node's GPUs have NVLink.
    assert hardware.judge_output("nvidia-smi nvlink --status", read("nvlink-status-a100-all-links-inactive.txt"),
                                 hardware.Expected(nvlink=True))
    # Each InfiniBand port ibstat lists Active, apart; the Ethernet CA (mlx5_0) not.
    asked = (tmp_path / "perfquery-args").read_text().splitlines()
    assert asked == [f"-x -C mlx5_{i} -P 1" for i in range(1, 9)]
    [finding] = checks["perfquery -x"]["findings"]
    assert finding["what"] == "mlx5_3 port 1: LinkDownedCounter 1" and finding["line_number"] == 15
    assert checks["dmesg"]["reason"] == ("dmesg: exit status 1: dmesg: read kernel buffer failed: Operation not "
                                         "permitted")
    # The raw outputs, line for line as the tools printed them: each finding's line is the file's.
    raw = Path(checks["nvidia-smi -q"]["output"])
    [remap] = checks["nvidia-smi -q"]["findings"]
    assert raw.read_text().splitlines()[remap["line_number"] - 1] == remap["line"]
    assert len(checks["perfquery -x"]["output"].split(", ")) == 8
    why, unknown = hardware.failures([tmp_path / "hw" / "n7.json"], planned=["n7", "n8"])
    assert unknown == []
    assert why["n7"].startswith("hardware: nvidia-smi -q: GPU 00000000:07:00.0: a row remap pending (reset the GPU)")
    assert "; perfquery -x: mlx5_3 port 1: LinkDownedCounter 1 (line 15: " in why["n7"]
    assert why["n8"] == "hardware: no report from this node (`fleet hwcheck` did not run there)"
    # The rails the site names: only their ports are read by perfquery too (a storage HCA is not a rail).
    (tmp_path / "perfquery-args").unlink()
    hwcheck(tmp_path / "hw2", str(bin_dir), "--ib-devices", "mlx5_3,mlx5_4")
    assert (tmp_path / "perfquery-args").read_text().splitlines() == ["-x -C mlx5_3 -P 1", "-x -C mlx5_4 -P 1"]
    # No Active InfiniBand port of the named rails: perfquery is skipped, not run without -C and -P, where
    # libibumad picks "the first port that is ACTIVE", else the first UP, of any CA: some other port's counters
    # (infiniband-diags(8), "Local port Selection").
    (tmp_path / "perfquery-args").unlink()
    hwcheck(tmp_path / "hw3", str(bin_dir), "--ib-devices", "mlx5_0")
    checks = {check["name"]: check for check in json.loads((tmp_path / "hw3" / "n7.json").read_text())["checks"]}
    assert (checks["perfquery -x"]["status"], checks["perfquery -x"]["reason"]) == (
        "skipped", "no Active InfiniBand port of mlx5_0 in ibstat's list on n7")
    assert not (tmp_path / "perfquery-args").exists()


def test_a_node_whose_hardware_failed_fails_first_with_the_line(recorded_runs, tmp_path):
    nodes = [f"n{i:02d}" for i in range(1, 7)]
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in nodes})
    report = tmp_path / "n03.json"
    found = hardware.parse_kernel_log(read("xid-48-63-94-dbe-rowremap.txt"))
    report.write_text(json.dumps({"node": "n03", "checks": [
        {"name": "dmesg", "status": "fail", "reason": "", "output": "n03/dmesg.txt",
         "findings": [vars(finding) for finding in found]}]}))
    why = hardware.failures([report], nodes)[0]["n03"]
    assert why.startswith("hardware: dmesg: Xid 48 on PCI:0000:19:00 (line 11: ") and why.endswith(
        f" and {len(found) - 3} more")
    verdict = fleet.judge(fleet_records(recorded_runs, plan.nodes, plan.links), plan, hardware={"n03": why})
    assert verdict.failed_nodes == ["n03"]
    assert verdict.summary.set_index("member").loc["n03", "reason"] == why
    assert "NodeName=n03 State=DRAIN" in fleetexport.format_drain_list(verdict)


def test_every_recorded_output_is_read_by_a_test_and_named_in_its_sources():
    files = sorted(path.name for path in DATA.glob("*.txt"))
    this = Path(__file__).read_text()
    assert files and all(f"| {name} |" in read("SOURCES.md") and f'"{name}"' in this for name in files)
