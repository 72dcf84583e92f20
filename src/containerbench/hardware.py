"""A node's hardware tier, read before anything is timed: each check a parser over a tool's own output.

The fleet tools site admins run (Azure's HPC health checks, Google's Cluster Health Scanner, Meta's GCM,
NVIDIA's DCGM) check the parts before timing the whole: a GPU with a pending row remap or a port
polling at a tenth of its rate measures as "slow" but is named here by its line. Each parser reads the
text the tool prints (tests/data/hardware holds recorded real outputs, with their sources), and each
finding names the line it read. `run_checks` runs the tools a node has and keeps their raw outputs; a
tool that is absent is a check skipped with the reason, never a pass.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from containerbench import outputs


@dataclass
class Finding:
    """One fault, with the line of the tool's output that says so (1-based)."""

    what: str
    line_number: int
    line: str

    def __str__(self) -> str:
        return f"{self.what} (line {self.line_number}: {self.line.strip()!r})"


@dataclass
class Check:
    name: str  # the tool and what it checks: "nvidia-smi -q", "ibstat", ...
    status: str  # pass, fail, skipped
    reason: str = ""  # why skipped, or why it could not be read
    findings: list[Finding] = field(default_factory=list)
    output: str = ""  # the raw output's file, where it was run


def _numbered(text: str):
    return enumerate(text.splitlines(), start=1)


def _tree(text: str):
    """`nvidia-smi -q`'s indented "Key : value" tree: (path of keys, value, line number, line) per value
    line; a line with no colon opens a section, and "GPU 00000000:3B:00.0" at the margin opens a GPU's."""
    stack: list[tuple[int, str]] = []
    for number, line in _numbered(text):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stripped = line.strip()
        if indent == 0 and stripped.startswith("GPU ") or " : " not in stripped and ":" not in stripped[-1:]:
            stack.append((indent, stripped))
            continue
        key, _, value = stripped.partition(":")
        yield [name for _, name in stack] + [key.strip()], value.strip(), number, line


# nvidia-smi -q: what fails. The ECC and row-remapping fields are NVIDIA's (nvidia-smi(1), "ECC Errors",
# "Remapped Rows": a pending remap needs a GPU reset, a remapping failure an RMA); the clock reasons that
# are the hardware's own (HW Slowdown, HW Thermal Slowdown, HW Power Brake Slowdown, SW Thermal Slowdown:
# the GPU too hot) rather than a policy (SW Power Cap, Idle, Applications Clocks Setting).
SLOWDOWN_REASONS = {"HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown"}
CLOCK_REASON_SECTIONS = {"Clocks Event Reasons", "Clocks Throttle Reasons"}  # newer drivers, older drivers


def parse_nvidia_smi_q(text: str, expected_gpus: int | None = None) -> tuple[list[str], list[Finding]]:
    """The GPUs `nvidia-smi -q` lists (their PCI bus ids) and what is wrong with them."""
    gpus: list[str] = []
    findings: list[Finding] = []
    widths: dict[str, dict[str, tuple[str, int, str]]] = {}
    for path, value, number, line in _tree(text):
        if not path or not path[0].startswith("GPU "):
            continue
        gpu = path[0].removeprefix("GPU ")
        if gpu not in gpus:
            gpus.append(gpu)
        sections, key = path[1:-1], path[-1]
        if sections[:2] == ["ECC Errors", "Volatile"] and ("Uncorrectable" in key or "Double Bit" in sections):
            if value.isdigit() and int(value) > 0:
                findings.append(Finding(f"GPU {gpu}: {value} uncorrectable ECC error(s) ({key})", number, line))
        elif sections == ["Remapped Rows"] and key in ("Pending", "Remapping Failure Occurred") and value == "Yes":
            what = "a row remap pending (reset the GPU)" if key == "Pending" else "a row remapping failed"
            findings.append(Finding(f"GPU {gpu}: {what}", number, line))
        elif sections == ["Retired Pages"] and key.startswith("Pending") and value == "Yes":
            findings.append(Finding(f"GPU {gpu}: a page retirement pending (reset the GPU)", number, line))
        elif sections and sections[0] in CLOCK_REASON_SECTIONS and key in SLOWDOWN_REASONS and value == "Active":
            findings.append(Finding(f"GPU {gpu}: {key} active", number, line))
        elif sections[-1:] == ["Link Width"] and key in ("Max", "Current"):
            widths.setdefault(gpu, {})[key] = (value, number, line)
    for gpu, width in widths.items():
        if {"Max", "Current"} <= set(width) and width["Current"][0] != width["Max"][0]:
            value, number, line = width["Current"]
            findings.append(Finding(f"GPU {gpu}: PCIe link width {value} of {width['Max'][0]}", number, line))
    if expected_gpus is not None and len(gpus) < expected_gpus:
        findings.append(Finding(f"{len(gpus)} GPU(s) listed, {expected_gpus} expected", 1, text.splitlines()[0]
                                if text else ""))
    return gpus, findings


XID = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9A-Fa-f:.]+)\): (?P<xid>\d+),")


def parse_kernel_log(text: str) -> list[Finding]:
    """NVIDIA's Xid events (docs.nvidia.com, "Xid Errors") and a GPU fallen off the bus, in `dmesg`."""
    findings = []
    for number, line in _numbered(text):
        if match := XID.search(line):
            findings.append(Finding(f"Xid {match['xid']} on {match['pci']}", number, line))
        elif "fallen off the bus" in line:
            findings.append(Finding("a GPU has fallen off the bus", number, line))
    return findings


def parse_nvlink_status(text: str) -> list[Finding]:
    """`nvidia-smi nvlink --status`: a link reported inactive, or none at all."""
    findings, gpu = [], ""
    for number, line in _numbered(text):
        if line.startswith("GPU "):
            gpu = line.split(":", 1)[0]
        elif "inactive" in line:
            findings.append(Finding(f"{gpu}: NVLink inactive" if gpu else "NVLink inactive", number, line))
    return findings


def parse_dcgmi_diag(text: str) -> list[Finding]:
    """`dcgmi diag -r 1`'s table: each row whose result says Fail."""
    findings, test = [], ""
    for number, line in _numbered(text):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        test = cells[0] or test  # a test's further rows (one per GPU, a warning) leave its name blank
        if cells[1].startswith("Fail"):
            findings.append(Finding(f"{test}: {cells[1]}", number, line))
    return findings


@dataclass
class IbPort:
    device: str
    port: str
    state: str = ""
    physical_state: str = ""
    rate: float = 0.0
    link_layer: str = ""
    line_number: int = 0
    line: str = ""


def parse_ibstat(text: str) -> list[IbPort]:
    """`ibstat`'s ports: each CA's "Port N:" with its State, Physical state, Rate and Link layer."""
    ports: list[IbPort] = []
    device = ""
    for number, line in _numbered(text):
        stripped = line.strip()
        if match := re.match(r"CA '([^']+)'", stripped):
            device = match[1]
        elif match := re.match(r"Port (\d+):$", stripped):
            ports.append(IbPort(device, match[1], line_number=number, line=line))
        elif ports and ":" in stripped:
            key, _, value = (part.strip() for part in stripped.partition(":"))
            port = ports[-1]
            if key == "State":
                port.state, port.line_number, port.line = value, number, line
            elif key == "Physical state":
                port.physical_state = value
            elif key == "Rate":
                port.rate = float(value)
            elif key == "Link layer":
                port.link_layer = value
    return ports


def ibstat_findings(ports: list[IbPort], expected_rate: float | None = None) -> list[Finding]:
    """An InfiniBand port not Active and LinkUp, or slower than `expected_rate` (Gb/s; else than the
    node's fastest InfiniBand port: one rail of several at a lower rate)."""
    infiniband = [port for port in ports if port.link_layer == "InfiniBand"]
    rate = expected_rate or max((port.rate for port in infiniband if port.state == "Active"), default=0.0)
    findings = []
    for port in infiniband:
        name = f"{port.device} port {port.port}"
        if port.state != "Active" or port.physical_state != "LinkUp":
            findings.append(Finding(f"{name}: {port.state}, {port.physical_state}", port.line_number, port.line))
        elif port.rate < rate:
            findings.append(Finding(f"{name}: rate {port.rate:g} Gb/s, {rate:g} expected", port.line_number,
                                    port.line))
    return findings


# perfquery's error counters that mean a bad cable, port or transceiver (IBTA's PortCounters; NHC's and
# Azure's health checks read the same): any count since the counters were cleared fails.
PERFQUERY_ERRORS = ("SymbolErrorCounter", "LinkErrorRecoveryCounter", "LinkDownedCounter", "PortRcvErrors",
                    "PortRcvRemotePhysicalErrors", "LocalLinkIntegrityErrors", "ExcessiveBufferOverrunErrors")


def parse_perfquery(text: str) -> list[Finding]:
    findings = []
    for number, line in _numbered(text):
        key, dots, value = line.partition(":")
        if dots and key in PERFQUERY_ERRORS and value.strip(".").isdigit() and int(value.strip(".")) > 0:
            findings.append(Finding(f"{key} {int(value.strip('.'))}", number, line))
    return findings


# What each check runs, and how its output is read. Each is skipped where its program is absent.
TOOLS = {
    "nvidia-smi -q": (["nvidia-smi", "-q"], None),
    "nvidia-smi nvlink --status": (["nvidia-smi", "nvlink", "--status"], parse_nvlink_status),
    "dmesg": (["dmesg"], parse_kernel_log),
    "ibstat": (["ibstat"], None),
    "perfquery -x": (["perfquery", "-x"], parse_perfquery),
    "dcgmi diag -r 1": (["dcgmi", "diag", "-r", "1"], parse_dcgmi_diag),
}


def judge_output(name: str, text: str, expected_gpus: int | None = None, ib_rate: float | None = None) -> list[Finding]:
    """The findings in one tool's output, as `run_checks` reads it."""
    if name == "nvidia-smi -q":
        return parse_nvidia_smi_q(text, expected_gpus)[1]
    if name == "ibstat":
        return ibstat_findings(parse_ibstat(text), ib_rate)
    return TOOLS[name][1](text)


def run_checks(out_dir, expected_gpus: int | None = None, ib_rate: float | None = None,
               timeout_s: float = 300) -> Path:
    """Every check this node has the tool for, its raw output kept in out_dir/NODE/, and the node's
    report in out_dir/NODE.json, which `fleet judge --hardware` reads."""
    node = socket.gethostname().split(".")[0]
    raw_dir = Path(out_dir) / node
    raw_dir.mkdir(parents=True, exist_ok=True)
    checks = []
    for name, (argv, _) in TOOLS.items():
        if shutil.which(argv[0]) is None:
            checks.append(Check(name, "skipped", f"{argv[0]} not found on {node}"))
            continue
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            checks.append(Check(name, "fail", f"{' '.join(argv)} did not end in {timeout_s:g} s"))
            continue
        raw = raw_dir / f"{name.replace(' ', '_')}.txt"
        outputs.write_text(raw, done.stdout + done.stderr)
        findings = judge_output(name, done.stdout + done.stderr, expected_gpus, ib_rate)
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [""]
        reason = f"exit status {done.returncode}: {said[0]}" if done.returncode != 0 else ""
        if done.returncode != 0 and not findings and name == "dmesg":  # the kernel log not readable here
            checks.append(Check(name, "skipped", reason, [], str(raw)))
            continue
        checks.append(Check(name, "fail" if findings or done.returncode != 0 else "pass", reason, findings, str(raw)))
    report = Path(out_dir) / f"{node}.json"
    outputs.write_text(report, json.dumps({"node": node, "checks": [asdict(check) for check in checks]},
                                          indent=1) + "\n")
    return report


def failures(reports) -> dict[str, str]:
    """Node -> why its hardware failed, from the reports run_checks wrote: each failed check's findings."""
    failed = {}
    for path in reports:
        report = json.loads(Path(path).read_text())
        reasons = []
        for check in report["checks"]:
            if check["status"] == "fail":
                found = "; ".join(str(Finding(**finding)) for finding in check["findings"][:3])
                more = len(check["findings"]) - 3
                reasons.append(f"{check['name']}: {found or check['reason']}" + (f" and {more} more" if more > 0
                                                                                   else ""))
        if reasons:
            failed[report["node"]] = "hardware: " + "; ".join(reasons)
    return failed
