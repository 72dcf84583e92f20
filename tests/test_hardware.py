"""The hardware tier (issue 33): each parser on real outputs of its tool, recorded by others
(tests/data/hardware/SOURCES.md says where each comes from), and the check run here, where none of the
tools is installed: each check skipped with its reason, never a pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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
    [finding] = hardware.parse_nvlink_status(read("nvlink-status-a100-all-links-inactive.txt"))
    assert finding.what == "GPU 6: NVLink inactive"
    assert hardware.parse_dcgmi_diag(read("dcgmi-diag-r1-a10g-pass.txt")) == []
    [finding] = hardware.parse_dcgmi_diag(read("dcgmi-diag-r3-a10g-targeted-power-fail.txt"))
    assert finding.what == "Targeted Power: Fail - GPU: 1" and finding.line_number == 27


def test_hwcheck_here_skips_each_absent_tool_with_its_reason_and_never_passes_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "hwcheck", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [report] = tmp_path.glob("*.json")
    checks = {check["name"]: check for check in json.loads(report.read_text())["checks"]}
    assert set(checks) == set(hardware.TOOLS)
    node = report.stem
    for name in ("nvidia-smi -q", "nvidia-smi nvlink --status", "ibstat", "perfquery -x", "dcgmi diag -r 1"):
        tool = hardware.TOOLS[name][0][0]
        assert checks[name]["status"] == "skipped" and checks[name]["reason"] == f"{tool} not found on {node}"
        assert f"skipped {name}: {tool} not found on {node}" in done.stdout
    # dmesg is here: read (pass: no Xid on this machine), or not readable to this user (skipped, and why).
    assert checks["dmesg"]["status"] in ("pass", "skipped") and Path(checks["dmesg"]["output"]).is_file()
    assert hardware.failures([report]) == {}


def test_a_node_whose_hardware_failed_fails_first_with_the_line(recorded_runs, tmp_path):
    nodes = [f"n{i:02d}" for i in range(1, 7)]
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in nodes})
    report = tmp_path / "n03.json"
    found = hardware.parse_kernel_log(read("xid-48-63-94-dbe-rowremap.txt"))
    report.write_text(json.dumps({"node": "n03", "checks": [
        {"name": "dmesg", "status": "fail", "reason": "", "output": "n03/dmesg.txt",
         "findings": [vars(finding) for finding in found]}]}))
    why = hardware.failures([report])["n03"]
    assert why.startswith("hardware: dmesg: Xid 48 on PCI:0000:19:00 (line 11: ") and why.endswith(
        f" and {len(found) - 3} more")
    verdict = fleet.judge(fleet_records(recorded_runs, plan.nodes, plan.links), plan, hardware={"n03": why})
    assert verdict.failed_nodes == ["n03"]
    assert verdict.summary.set_index("member").loc["n03", "reason"] == why
    assert "NodeName=n03 State=DRAIN" in fleetexport.format_drain_list(verdict)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.txt")))
def test_every_recorded_output_is_read_by_a_check_and_named_in_its_sources(name):
    tool = {"ibstat": "ibstat", "perfquery": "perfquery -x", "nvidia-smi-q": "nvidia-smi -q", "xid": "dmesg",
            "nvlink": "nvidia-smi nvlink --status", "dcgmi": "dcgmi diag -r 1"}
    check = next(check for prefix, check in tool.items() if name.startswith(prefix))
    hardware.judge_output(check, read(name))  # parses whole
    assert f"| {name} |" in read("SOURCES.md")
