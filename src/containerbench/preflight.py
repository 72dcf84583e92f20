"""The pre-flight check: what a compute node must see before any benchmark job runs there.

The workflow plans on one machine (a login node) and measures on others. Before it
submits any job (Snakemake's onstart, not in a dry run), it runs this check where
the measurements run (`srun`, one task on each of as many compute nodes as the
sweep's largest run takes; here, this machine) and stops with one line per problem
and node:

- the clone is at the same path with the same package sources (every job runs
  `python -m containerbench` from it, and containers bind the working directory);
- the bare-metal interpreter exists there and imports the benchmark's packages;
- the runtimes installed only there (`available: compute-nodes`) answer their
  probe there (they are not probed when planning);
- what each runtime needs on a node beyond its probe (Runtime.node_requirements:
  Sarus's and podman's versions, a CDI spec for GPUs, ch-run's features, enroot's
  PMI hook, a Pyxis with --container-env, the host MPI of a native runtime with every library
  it loads: hostmpi.py), asked there, not where the workflow plans;
- the image files the site supplies (a SIF, a squashfs) are there;
- every device the fabrics name (an HCA port, a network interface) is there and up;
- a node holds the ranks the sweep puts on it: a GPU each, and the CPUs each asks for.

It is not a rule: a job that every measurement depended on would, whenever it ran
again (after a code or config change), make every finished measurement run again.

    python -m containerbench preflight --repo R --sources-digest D --bench-python P [--torch-python T] \
        --probes '{"apptainer": ["apptainer", "--version"]}' [--devices JSON] [--ranks-per-node N \\
        --cpus-per-rank C --gpus-per-node G] [--out preflight.json]

(each framework's interpreter under its own option, Framework.preflight_option).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from containerbench.fabrics import DeviceRequest, fabric_settings, named_devices
from containerbench.frameworks import FRAMEWORKS, framework
from containerbench.launchers import Srun, uses_slurm
from containerbench.runtimes import NodeRequirement, run_probe

PACKAGE = Path("src") / "containerbench"
# The srun allocation's time limit: the check takes seconds, the queue may take longer.
SRUN_MINUTES = 10
# How long the workflow waits for it, queue included.
TIMEOUT_S = 3600


def sources_digest(repo: Path) -> str:
    """A digest of the package's sources in `repo`: the same clone, at the same commit and edits."""
    digest = hashlib.sha256()
    for path in sorted((Path(repo) / PACKAGE).rglob("*.py")):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def check_clone(repo: Path, expected_digest: str) -> str | None:
    if not (repo / PACKAGE).is_dir():
        return (f"the clone is not at {repo} on this node; allowed: a clone on a filesystem the compute "
                "nodes mount at the same path as the login node")
    found = sources_digest(repo)
    if found != expected_digest:
        return (f"the clone at {repo} differs from the one the workflow planned with (package sources "
                f"{found} here, {expected_digest} there); allowed: one shared clone")
    return None


def check_bench_python(python: str, timeout: float = 300, framework_name: str | None = None) -> str | None:
    """Does `python` import what a rank of the framework (default: the default one) imports first
    (Framework.import_check: fails fast, without the framework's seconds-long import of itself)?"""
    checked = framework(framework_name)
    key, side = f"bare_metal.{checked.bare_metal_key}", checked.venv_side
    try:
        done = subprocess.run([python, "-c", checked.import_check], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return (f"'{key}' = {python!r} does not exist on this node; allowed: a venv on a shared "
                f"filesystem (scripts/setup-venv.sh {side}) or an interpreter every node has")
    except subprocess.TimeoutExpired:
        return f"'{key}' = {python!r} did not import the benchmark's packages within {timeout:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"'{key}' = {python!r} cannot import the benchmark's packages on this node: {last[:200]}"
    return None


# An InfiniBand port carries traffic when it is ACTIVE, which drivers/infiniband/core/sysfs.c
# (state_show) writes as "4: ACTIVE" in /sys/class/infiniband/DEVICE/ports/N/state.
ACTIVE_PORT = "ACTIVE"
# SIOCGIFFLAGS (netdevice(7)): IFF_UP, administratively up; IFF_RUNNING, operationally up (carrier).
SIOCGIFFLAGS, IFF_UP, IFF_RUNNING = 0x8913, 0x1, 0x40


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as error:
        return f"unreadable ({error.strerror})"


def interface_states() -> dict[str, str]:
    """This node's network interfaces, "up", "down" or "no carrier", as the kernel gives them to this
    process's network namespace (if_nameindex(3) and SIOCGIFFLAGS, netdevice(7)). Not /sys/class/net:
    sysfs shows the namespace of whoever mounted it, which a container or a test node may not share."""
    states = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("16sh22x", name.encode()[:15], 0)
            try:
                flags = struct.unpack("16sh22x", fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
            except OSError:  # gone since it was listed (a container's veth): not an interface of this node
                continue
            states[name] = ("up" if flags & IFF_UP and flags & IFF_RUNNING else
                            "no carrier" if flags & IFF_UP else "down")
    return states


def _has(names, what: str) -> str:
    return f"{what} here: {', '.join(sorted(names))}" if names else f"no {what} here"


def check_devices(requests: list[DeviceRequest], sys_root: Path = Path("/sys"),
                  interfaces: dict[str, str] | None = None) -> list[str]:
    """Each device a fabric names, present and up on this node; one line per one that is not.
    `interfaces`: name -> state (default: this node's, interface_states)."""
    ib_dir = sys_root / "class" / "infiniband"
    if interfaces is None:
        interfaces = interface_states() if any(each.kind != "hca" for each in requests) else {}
    hcas = {path.name: {port.name: _read(port / "state") for port in sorted((path / "ports").glob("*"))}
            for path in sorted(ib_dir.glob("*"))}
    problems = []
    for request in requests:
        def named(devices, request=request):
            return [d for d in devices if d == request.name or (not request.exact and d.startswith(request.name))]

        kind = request.kind if request.kind != "any" else "hca" if named(hcas) else "netdev"
        said = f"'{request.key}' = {request.value!r}"
        if kind == "hca":
            found = named(hcas)
            if not found:
                problems.append(f"{said} names the InfiniBand device {request.name}, which this node does not "
                                f"have ({_has(hcas, 'InfiniBand devices')}); allowed: a device `ibv_devinfo -l` "
                                "lists on the nodes")
                continue
            ports = {f"{hca} port {port}": state for hca in found for port, state in hcas[hca].items()
                     if not request.port or port == request.port}
            if not ports:
                ports_here = sorted({port for hca in found for port in hcas[hca]})
                problems.append(f"{said}: {', '.join(found)} has no port {request.port} on this node; allowed: "
                                f"{_has(ports_here, 'ports')}")
            elif not any(state.partition(": ")[2] == ACTIVE_PORT for state in ports.values()):
                problems.append(f"{said}: no port is ACTIVE on this node ("
                                + ", ".join(f"{port}: {state}" for port, state in ports.items())
                                + "); allowed: a port the subnet manager made ACTIVE (`ibstat`)")
        else:
            found = named(interfaces)
            if not found and request.kind == "any":
                port = f":{request.port}" if request.port else ""
                problems.append(f"{said} names {request.name}{port}, which this node has neither as an InfiniBand "
                                f"device nor as an interface ({_has(hcas, 'InfiniBand devices')}; "
                                f"{_has(interfaces, 'interfaces')}); allowed: `ibv_devinfo -l` or `ip -br link` "
                                "on the nodes")
            elif not found:
                problems.append(f"{said} names the interface {request.name}, which this node does not have "
                                f"({_has(interfaces, 'interfaces')}); allowed: an interface "
                                "`ip -br link` lists on the nodes")
            elif not any(interfaces[name] == "up" for name in found):
                problems.append(f"{said}: the interface is not up on this node ("
                                + ", ".join(f"{name} {interfaces[name]}" for name in found)
                                + "); allowed: an interface that is up with a carrier (`ip -br link`)")
    return problems


def count_gpus(proc_root: Path = Path("/proc")) -> int | None:
    """The NVIDIA GPUs the driver knows on this node: one directory each under /proc/driver/nvidia/gpus
    (the driver's README, "Using the /proc File System Interface"), whatever the job's cgroup lets it
    open. None: no NVIDIA driver."""
    gpus = proc_root / "driver" / "nvidia" / "gpus"
    return len([path for path in gpus.iterdir() if path.is_dir()]) if gpus.is_dir() else None


def check_layout(ranks_per_node: int, cpus_per_rank: int, gpus_per_node: int, cpus: int | None = None,
                 gpus: int | None = None) -> list[str]:
    """Does this node hold the ranks the sweep puts on one node: the CPUs they ask for, and the GPUs each job
    asks for? (More ranks than GPUs asked for is the config's mistake, refused by config.check_runs.)"""
    problems = []
    cpus = cpus if cpus is not None else os.cpu_count()
    if ranks_per_node * cpus_per_rank > cpus:
        problems.append(f"'scaling.ranks_per_node' = {ranks_per_node} ranks x 'slurm.cpus_per_rank' = "
                        f"{cpus_per_rank} CPUs is {ranks_per_node * cpus_per_rank} CPUs, and this node has "
                        f"{cpus}; allowed: at most {cpus} CPUs per node")
    if gpus_per_node:
        if gpus is None:
            problems.append(f"'slurm.gpus_per_node' = {gpus_per_node}, but this node has no NVIDIA driver "
                            "(no /proc/driver/nvidia/gpus); allowed: GPU nodes, or slurm.gpus_per_node: 0")
        elif gpus_per_node > gpus:
            problems.append(f"'slurm.gpus_per_node' = {gpus_per_node}, and this node has {gpus} GPUs "
                            f"(/proc/driver/nvidia/gpus); allowed: at most {gpus}")
    return problems


def _version(text: str) -> tuple[int, ...] | None:
    found = re.search(r"\d+(?:\.\d+)+", text)
    return tuple(int(part) for part in found[0].split(".")) if found else None


def check_requirements(requirements: list[NodeRequirement], timeout: float = 60) -> list[str]:
    """Each runtime's node requirements (Runtime.node_requirements), asked on this node; a line per one
    it lacks, naming the runtime, what it needs, what this node has and where the need is written."""
    problems = []
    for need in requirements:
        where = f" ({need.source})" if need.source else ""
        if need.paths and not any(glob.glob(path) for path in need.paths):
            problems.append(f"runtime {need.runtime!r} needs {need.what}: none of {', '.join(need.paths)} is on "
                            f"this node{where}")
        if not need.argv:
            continue
        # The whole output: a version or an option may be on any line.
        ok, output = run_probe(need.argv, timeout=timeout, whole=True)
        if not ok:
            problems.append(f"runtime {need.runtime!r} needs {need.what}: {output}{where}")
            continue
        if need.holds and need.holds not in output:
            problems.append(f"runtime {need.runtime!r} needs {need.what}: `{shlex.join(need.argv)}` does not "
                            f"list {need.holds} on this node{where}")
        if need.at_least:
            found = _version(output)
            if found is None or found < _version(need.at_least):
                shown = ".".join(map(str, found)) if found else f"no version in {output.strip()[:80]!r}"
                problems.append(f"runtime {need.runtime!r} needs {need.what}: this node has {shown} "
                                f"(`{shlex.join(need.argv)}`){where}")
    return problems


def run_checks(repo: Path, expected_digest: str, pythons: dict[str, str | None],
               probes: dict[str, list[str]], image_files=(), devices=(), layout: dict | None = None,
               requirements=()) -> dict:
    """Every check, run here; the result names each problem in one line. `pythons`: framework -> its
    bare-metal interpreter, where the sweep runs it; `layout`: ranks_per_node, cpus_per_rank and
    gpus_per_node, as check_layout takes them."""
    started = time.time()
    problems = []
    if problem := check_clone(repo, expected_digest):
        problems.append(problem)
    for name, python in pythons.items():
        if python and (problem := check_bench_python(python, framework_name=name)):
            problems.append(problem)
    for image in image_files:
        if not Path(image).exists():
            problems.append(f"the image {image} does not exist on this node; allowed: an image on a filesystem "
                            "the compute nodes mount")
    problems += check_devices(list(devices))
    if layout:
        problems += check_layout(**layout, gpus=count_gpus() if layout["gpus_per_node"] else None)
    problems += check_requirements(list(requirements))
    probed = {}
    for runtime, argv in sorted(probes.items()):
        ok, detail = run_probe(argv, timeout=60)
        probed[runtime] = {"argv": argv, "ok": ok, "detail": detail}
        if not ok:
            problems.append(f"runtime {runtime!r} cannot run on this node: {detail}")
    return {"host": socket.gethostname(), "repo": str(repo), "sources_digest": expected_digest,
            **{each.python_key: pythons.get(each.name) for each in FRAMEWORKS.values()},
            "image_files": list(image_files), "devices": [asdict(each) for each in devices], "layout": layout,
            "probes": probed, "requirements": [asdict(each) for each in requirements], "problems": problems,
            "seconds": round(time.time() - started, 3)}


def check_argv(config: dict, repo: Path, python: str, pythons: dict[str, str | None], probes: dict[str, list[str]],
               image_files=(), runs=(), requirements=()) -> list[str]:
    """The check's command line: on as many compute nodes as the sweep's largest run takes, one task each,
    through srun when the runs use srun, else here. `pythons`: framework -> its bare-metal interpreter
    (None, or left out: not checked); `runs`: the sweep's, whose fabrics' devices and busiest node are
    checked (none: neither); `requirements`: the runtimes' NodeRequirements."""
    interpreters = [word for each in FRAMEWORKS.values() if pythons.get(each.name)
                    for word in (each.preflight_option, str(pythons[each.name]))]
    argv = [python, "-m", "containerbench", "preflight", "--repo", str(repo), "--sources-digest", sources_digest(repo),
            *interpreters, "--probes", json.dumps(probes), *(f"--image-file={path}" for path in image_files)]
    if requirements:
        argv += ["--requirements", json.dumps([asdict(each) for each in requirements])]
    if runs:
        fabrics = {run.fabric: fabric_settings(config, run.fabric) for run in runs}
        argv += ["--devices", json.dumps([asdict(each) for each in named_devices(fabrics)]),
                 f"--ranks-per-node={max(run.ranks_per_node for run in runs)}",
                 f"--cpus-per-rank={config['slurm']['cpus_per_rank']}",
                 f"--gpus-per-node={config['slurm']['gpus_per_node']}"]
    if not uses_slurm(config):
        return argv
    slurm = config["slurm"]
    placement = [f"--{key}={slurm[key]}" for key in ("partition", "account", "qos", "constraint") if slurm[key]]
    nodes = max((run.nodes for run in runs), default=1)
    return [Srun.program, f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", f"--time={SRUN_MINUTES}",
            "--job-name=containerbench-preflight", *placement, *argv]


def run_before_jobs(argv: list[str], timeout: float = TIMEOUT_S) -> None:
    """Run the check before any job is submitted; its problems, one line each, stop the workflow."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        sys.exit(f"containerbench: preflight: {argv[0]} is not installed here")
    except subprocess.TimeoutExpired:
        sys.exit(f"containerbench: preflight: no answer within {timeout:g} s from {shlex.join(argv[:6])} ...")
    if done.returncode != 0:
        problems = [line for line in done.stderr.splitlines() if line.startswith("containerbench: ")]
        sys.exit("\n".join(problems) or f"containerbench: preflight failed (exit {done.returncode}): "
                 f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    print(done.stdout.strip(), file=sys.stderr)
