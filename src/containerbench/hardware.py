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
import os
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from containerbench import outputs
from containerbench.processes import run_group


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
        # The older layout counts each Double Bit error under its memory and again under "Total".
        if (sections[:2] == ["ECC Errors", "Volatile"] and ("Uncorrectable" in key or "Double Bit" in sections)
                and key != "Total"):
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
        if {"Max", "Current"} <= set(width) and "N/A" not in (width["Current"][0], width["Max"][0]) \
                and width["Current"][0] != width["Max"][0]:
            value, number, line = width["Current"]
            findings.append(Finding(f"GPU {gpu}: PCIe link width {value} of {width['Max'][0]}", number, line))
    if expected_gpus is not None and len(gpus) < expected_gpus:
        findings.append(Finding(f"{len(gpus)} GPU(s) listed, {expected_gpus} expected", 1, text.splitlines()[0]
                                if text else ""))
    return gpus, findings


XID = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9A-Fa-f:.]+)\): (?P<xid>\d+),")
# Xids NVIDIA's Xid catalogue gives an application as a cause of (13 graphics engine exception, 31 GPU memory
# page fault, 43 GPU stopped processing, 45 preemptive cleanup): a user's job, not the node, most often.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})


def parse_kernel_log(text: str) -> list[Finding]:
    """NVIDIA's Xid events (docs.nvidia.com, "Xid Errors") and a GPU fallen off the bus, in `dmesg`."""
    findings = []
    for number, line in _numbered(text):
        if match := XID.search(line):
            if int(match["xid"]) not in APPLICATION_XIDS:
                findings.append(Finding(f"Xid {match['xid']} on {match['pci']}", number, line))
        elif "fallen off the bus" in line:
            findings.append(Finding("a GPU has fallen off the bus", number, line))
    return findings


def parse_nvlink_status(text: str, expect_nvlink: bool = False) -> list[Finding]:
    """`nvidia-smi nvlink --status`: a link listed inactive; and, where the node's GPUs have NVLink
    (`expect_nvlink`), NVML's "all links are inactive" (which a PCIe GPU without a bridge says too)."""
    findings, gpu = [], ""
    for number, line in _numbered(text):
        if line.startswith("GPU "):
            gpu = line.split(":", 1)[0]
        elif "inactive" in line.lower() and (re.match(r"\s*Link \d+:", line) or expect_nvlink):
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
                port.rate = float(value) if re.fullmatch(r"[\d.]+", value) else 0.0
            elif key == "Link layer":
                port.link_layer = value
    return ports


def ibstat_findings(ports: list[IbPort], expected_rate: float | None = None,
                    devices: list[str] | None = None) -> list[Finding]:
    """An InfiniBand port not Active and LinkUp, or slower than `expected_rate` (Gb/s; else than the
    node's fastest InfiniBand port: one rail of several at a lower rate). `devices`: the HCAs the node's
    rails are (a dual-port card's unused port is then not read), each of which must be listed."""
    infiniband = [port for port in ports if port.link_layer == "InfiniBand" and is_rail(port, devices)]
    rate = expected_rate or max((port.rate for port in infiniband if port.state == "Active"), default=0.0)
    findings = []
    for port in infiniband:
        name = f"{port.device} port {port.port}"
        if port.state != "Active" or port.physical_state != "LinkUp":
            findings.append(Finding(f"{name}: {port.state}, {port.physical_state}", port.line_number, port.line))
        elif port.rate < rate:
            findings.append(Finding(f"{name}: rate {port.rate:g} Gb/s, {rate:g} expected", port.line_number,
                                    port.line))
    listed = {port.device for port in ports} | {f"{port.device}:{port.port}" for port in ports}
    findings += [Finding(f"{device} not listed", 0, "") for device in devices or [] if device not in listed]
    return findings


def is_rail(port: IbPort, devices: list[str] | None) -> bool:
    """Is this port one of the rails `devices` names (HCA, every port of it, or HCA:PORT)? None: every port."""
    return devices is None or port.device in devices or f"{port.device}:{port.port}" in devices


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


@dataclass
class Expected:
    """What a node's hardware should be, where the site says: its GPUs (its GRES), whether they have NVLink,
    its InfiniBand rails' rate and HCAs."""

    gpus: int | None = None
    nvlink: bool = False
    ib_rate: float | None = None
    ib_devices: list[str] | None = None


# Each tool's bound where none is given (validation.hardware.timeout_s's default in the schema too).
TOOL_TIMEOUT_S = 120.0
# What a node's job names its hardware step in a report it writes itself (fleetjobs.check_hardware).
STEP_CHECK = "hardware step"

# What each check runs. Each is skipped where its program is absent; perfquery runs once a port of each
# InfiniBand port ibstat lists (without -C and -P it reads the first HCA's first port only).
TOOLS = {
    "nvidia-smi -q": ["nvidia-smi", "-q"],
    "nvidia-smi nvlink --status": ["nvidia-smi", "nvlink", "--status"],
    "dmesg": ["dmesg"],
    "ibstat": ["ibstat"],
    "perfquery -x": ["perfquery", "-x"],
    "dcgmi diag -r 1": ["dcgmi", "diag", "-r", "1"],
}
# A tool whose failure to run says nothing of the hardware: the kernel log unreadable to this user
# (kernel.dmesg_restrict), DCGM's host engine not running, perfquery's /dev/infiniband/umad* open to root
# only (the node jobs run as the admin's user). Skipped, with what it said.
SKIPPED_IF_IT_CANNOT_RUN = {"dmesg", "dcgmi diag -r 1", "perfquery -x"}


def judge_output(name: str, text: str, expected: Expected | None = None) -> list[Finding]:
    """The findings in one tool's output, as `run_checks` reads it."""
    expected = expected or Expected()
    if name == "nvidia-smi -q":
        return parse_nvidia_smi_q(text, expected.gpus)[1]
    if name == "nvidia-smi nvlink --status":
        return parse_nvlink_status(text, expected.nvlink)
    if name == "ibstat":
        return ibstat_findings(parse_ibstat(text), expected.ib_rate, expected.ib_devices)
    return {"dmesg": parse_kernel_log, "perfquery -x": parse_perfquery, "dcgmi diag -r 1": parse_dcgmi_diag}[name](text)


def node_name() -> str:
    """The node as Slurm names it (the fleet's plan and verdict do), where a step runs; else its short
    hostname, which a NodeHostname or an FQDN may make differ."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """A tool's exit status and output; its whole session killed past `timeout_s` (a hung nvidia-smi's helpers
    too), and no terminal input read under srun."""
    try:
        done = run_group(argv, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, f"{' '.join(argv)} did not end in {timeout_s:g} s"
    except OSError as error:
        return -1, f"{' '.join(argv)}: {error}"
    return done.returncode, done.stdout + done.stderr


def run_checks(out_dir, expected: Expected | None = None,
               timeout_s: float = TOOL_TIMEOUT_S) -> tuple[Path, list[Check]]:
    """Every check this node has the tool for, its raw output kept in out_dir/NODE/, and the node's
    report in out_dir/NODE.json, which `fleet judge --hardware` reads."""
    expected, node = expected or Expected(), node_name()
    raw_dir = Path(out_dir) / node
    raw_dir.mkdir(parents=True, exist_ok=True)
    checks, ports = [], []
    for name, argv in TOOLS.items():
        if shutil.which(argv[0]) is None:
            checks.append(Check(name, "skipped", f"{argv[0]} not found on {node}"))
            continue
        runs = [(argv, "")]
        if name == "perfquery -x":  # a port at a time, each named in its findings
            runs = [([*argv, "-C", port.device, "-P", port.port], f"{port.device} port {port.port}: ")
                    for port in ports if port.link_layer == "InfiniBand" and port.state == "Active"
                    and is_rail(port, expected.ib_devices)]
            if not runs:  # its default port would be some other port's counters, or none's
                rails = f" of {', '.join(expected.ib_devices)}" if expected.ib_devices is not None else ""
                checks.append(Check(name, "skipped", f"no Active InfiniBand port{rails} in ibstat's list on {node}"))
                continue
        raws, findings, failed = [], [], []
        for words, prefix in runs:
            returncode, text = _run(words, timeout_s)
            # Its output as the tool printed it, so that each finding's line number is the file's.
            raws.append(raw_dir / ("_".join(word.lstrip("-").replace("/", "_") for word in words) + ".txt"))
            outputs.write_text(raws[-1], text)
            found = judge_output(name, text, expected)
            findings += [Finding(prefix + finding.what, finding.line_number, finding.line) for finding in found]
            if returncode != 0:
                failed.append(f"{' '.join(words)}: exit status {returncode}: "
                              + (text.strip().splitlines() or [""])[-1])
            if name == "ibstat":
                ports = parse_ibstat(text)
        status = "fail" if findings or failed else "pass"
        if failed and not findings and name in SKIPPED_IF_IT_CANNOT_RUN:
            status = "skipped"
        checks.append(Check(name, status, "; ".join(failed), findings, ", ".join(map(str, raws))))
    return write_report(report_path(out_dir, node), node, checks), checks


def report_path(out_dir, node: str) -> str:
    """Where `fleet hwcheck --out OUT_DIR` writes a node's report (raw outputs in OUT_DIR/NODE/)."""
    return f"{out_dir}/{node}.json"


def report_line(path) -> str:
    """The last line `fleet hwcheck` prints, naming its report: a node's job trusts it over a stat of the
    file from the submit host, whose NFS client may have cached the report's absence."""
    return f"report: {path}"


def write_step_report(path, node: str, status: str, why: str) -> Path:
    """The report a node's job writes itself where its hardware step could not run or answer: one check."""
    return write_report(path, node, [Check(STEP_CHECK, status, why)])


def write_report(path, node: str, checks: list[Check]) -> Path:
    """A node's report, as `fleet judge --hardware` reads it: also the one a node job writes where hwcheck
    itself could not run or answer there (fleetjobs.check_hardware), a single check saying why."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # where no hwcheck ran before it (a round left out)
    outputs.write_text(path, json.dumps({"node": node, "checks": [asdict(check) for check in checks]}, indent=1) + "\n")
    return Path(path)


def failures(reports, planned) -> tuple[dict[str, str], list[str]]:
    """Node -> why its hardware failed, from the reports run_checks wrote: each failed check's findings;
    and each of the `planned` nodes with no report (a missing row is never a pass). Also the nodes reports
    name that the plan does not (an FQDN where Slurm's name was meant): not judged."""
    failed, reported = {}, set()
    for path in reports:
        report = json.loads(Path(path).read_text())
        reported.add(report["node"])
        reasons = []
        for check in report["checks"]:
            if check["status"] == "fail":
                found = "; ".join(str(Finding(**finding)) for finding in check["findings"][:3])
                more = len(check["findings"]) - 3
                reasons.append(f"{check['name']}: {found or check['reason']}" + (f" and {more} more" if more > 0
                                                                                   else ""))
        if reasons:
            failed[report["node"]] = "hardware: " + "; ".join(reasons)
    for node in planned:
        if node not in reported:
            failed[node] = "hardware: no report from this node (`fleet hwcheck` did not run there)"
    planned = set(planned)
    return {node: why for node, why in failed.items() if node in planned}, sorted(reported - planned)
