"""Telemetry samples -> what a run used while it measured, and whether anything else ran.

Reads the CSV the nodes' samplers wrote (telemetry.py; merged by execution.collect_telemetry)
together with each rank's measured window (wall clock, its own CPU seconds, its CPU
affinity) from the run's result, and answers, per node:

- how busy the run's CPUs were, and how much of them processes outside the run took
  (node CPU time on the run's cores - the ranks' own CPU time - the sampler's - the runtime's and
  launcher's processes'), and steal;
- the bytes and packets per measured step on each interface and InfiniBand port;
- GPU utilisation, memory of the ranks and of the node.

`disturbance` turns that into the disturbed verdict, `traffic_check` compares the bytes on
the fabric's interface with what the gradient all-reduce must move. Counters are cumulative,
interpolated linearly at the window's ends, so a window is integrated exactly.
"""

from __future__ import annotations

import csv
import hashlib
from bisect import bisect_left
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

from containerbench.fabrics import expected_transport, interface_ok
from containerbench.status import Check

# CPU shares are judged only where samples inside the measured window span this share of it, and
# at least this many: a window of a few sampling intervals says nothing about who used the CPUs.
MIN_COVERAGE = 0.5
MIN_SAMPLES_INSIDE = 3
# Traffic on the fabric below this share of what the all-reduce must move: it went elsewhere.
MIN_TRAFFIC_SHARE = 0.5
# Modes whose gradients travel as a ring all-reduce (parameter servers move other volumes).
ALLREDUCE_MODES = ("horovod", "collective")
NET_METRICS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")


def load_samples(path: str | Path) -> dict[str, dict[tuple[str, str], list[tuple[float, float]]]]:
    """host -> (metric, device) -> [(time, cumulative value)], in time order."""
    series: dict = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            series[row["host"]][(row["metric"], row["device"])].append((float(row["time_unix"]), float(row["value"])))
    for per_host in series.values():
        for points in per_host.values():
            points.sort()
    return series


def value_at(points: list[tuple[float, float]], when: float) -> float:
    """A cumulative counter at `when`, linear between samples, clamped to the sampled range."""
    times = [t for t, _ in points]
    i = bisect_left(times, when)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 + (v1 - v0) * (when - t0) / (t1 - t0) if t1 > t0 else v1


def _delta(points, start: float, end: float) -> float:
    return value_at(points, end) - value_at(points, start)


def _rate_in_window(points, start: float, end: float) -> float:
    """Counter increase over the window, from the samples inside it where they span most of it (no
    warmup traffic smeared in by interpolating across the window's edges), else interpolated."""
    inside = [(t, v) for t, v in points if start <= t <= end]
    if len(inside) >= 2 and inside[-1][0] - inside[0][0] >= 0.5 * (end - start):
        return (inside[-1][1] - inside[0][1]) * (end - start) / (inside[-1][0] - inside[0][0])
    return _delta(points, start, end)


def _device_name(metric: str, device: str) -> str:
    # InfiniBand ports as NCCL and UCX name them (mlx5_0:1); interfaces as they are.
    return device.replace("/", ":") if metric.startswith("ib_") else device


def node_windows(result: dict) -> dict[str, dict]:
    """host -> the run's measured window (earliest start, latest end over every rank that times steps),
    the CPU seconds its ranks there reported for it, and the cores they were bound to. A rank that times
    nothing (a parameter-server worker) still counts for its node's cores and, via the sampler, its CPU."""
    per_rank = {r["rank"]: r for r in result.get("per_rank") or []}
    processes = [{**p, "window": p.get("window") or per_rank.get(p["rank"], {}).get("window")}
                 for p in result.get("processes") or []]
    timed = [p["window"] for p in processes if p["window"]]
    if not timed:
        return {}
    start, end = min(w["start_unix"] for w in timed), max(w["end_unix"] for w in timed)
    windows: dict[str, dict] = {}
    for process in processes:
        node = windows.setdefault(process["hostname"], {"start_unix": start, "end_unix": end, "cpu_s": 0.0,
                                                        "cores": set(), "ranks": 0})
        node["cpu_s"] += (process["window"] or {}).get("cpu_s", 0.0)
        node["cores"] |= set((process.get("context") or {}).get("affinity") or [])
        node["ranks"] += 1
    return windows


def summarise_node(samples: dict, window: dict, steps: int | None) -> dict:
    start, end = window["start_unix"], window["end_unix"]
    seconds = max(end - start, 1e-9)
    # CPU shares come from the samples inside the window, where /proc/stat and the ranks' counters
    # were read at the same instants: interpolating across the window's edges would mix in start-up
    # and warmup, which the ranks' own window figures leave out. Too few samples inside: not judged.
    inside = sorted({t for points in samples.values() for t, _ in points if start <= t <= end})
    first, last = (inside[0], inside[-1]) if len(inside) >= 2 else (start, end)
    span = max(last - first, 1e-9)
    coverage = span / seconds if len(inside) >= MIN_SAMPLES_INSIDE else 0.0
    cores = sorted(window["cores"]) or sorted(int(d[3:]) for m, d in samples if m == "cpu_busy_s")
    capacity = span * len(cores)
    siblings = smt_siblings(samples, cores)

    def between(metric, device="node"):
        return _delta(samples[(metric, device)], first, last) if (metric, device) in samples else 0.0

    busy = sum(between("cpu_busy_s", f"cpu{c}") for c in cores)
    steal = sum(between("cpu_steal_s", f"cpu{c}") for c in cores)
    sampler = between("sampler_cpu_s")
    # The run's own CPU: what the sampler saw of the ranks' processes, or what the ranks reported for
    # the window where that is more (a rank the sampler cannot see, in another PID namespace).
    own = max(between("run_cpu_s"), window["cpu_s"] * span / seconds)
    # The runtime's and launcher's processes (dockerd, conmon, orted) on the run's cores: the cost of
    # running this way, not a disturbance.
    service = max(0.0, sum(between("service_cpu_s", f"cpu{c}") for c in cores))  # not -1e-14 from rounding
    services = {device: between(metric, device) for metric, device in samples if metric == "service_cpu_by_name_s"}
    foreign = max(0.0, busy - own - sampler - service)
    # On the SMT siblings of the run's cores nothing of the run is bound: all but the runtime's processes and
    # the sampler (wherever it ran) is a stranger sharing the cores' execution units.
    sibling_foreign = max(0.0, sum(between("cpu_busy_s", f"cpu{c}") - between("service_cpu_s", f"cpu{c}")
                                   for c in siblings or []) - sampler)
    per_step = max(steps or 1, 1)
    traffic = {}
    for (metric, device), points in samples.items():
        kind, _, counter = metric.partition("_")
        if kind in ("net", "ib") and counter in NET_METRICS:
            traffic.setdefault(_device_name(metric, device), {})[f"{counter}_per_step"] = (
                _rate_in_window(points, start, end) / per_step)
    gpus = {device: [v for t, v in points if start <= t <= end] for (metric, device), points in samples.items()
            if metric == "gpu_util_percent"}
    in_window = [v for t, v in samples.get(("run_rss_bytes", "node"), []) if start <= t <= end]
    return {
        "window_s": round(seconds, 3), "coverage": round(min(coverage, 1.0), 3), "samples_inside": len(inside),
        "cores": cores, "ranks": window["ranks"], "cpu_utilisation_percent": 100 * busy / capacity,
        "run_cpu_percent": 100 * own / capacity, "foreign_cpu_share": foreign / capacity,
        "smt_siblings": siblings,  # null: the sampler did not know the topology
        "sibling_foreign_cpu_share": sibling_foreign / (span * len(siblings)) if siblings else None,
        "service_cpu_percent": 100 * service / capacity,
        "service_cpu_s": {name: round(value, 3) for name, value in sorted(services.items())},
        "steal_share": steal / capacity, "sampler_cpu_percent_of_a_core": 100 * sampler / span,
        "traffic": traffic,
        "gpu_util_percent": {d: sum(v) / len(v) for d, v in gpus.items() if v},
        "run_rss_bytes_max": max(in_window, default=None),
    }


def smt_siblings(samples: dict, cores: list[int]) -> list[int] | None:
    """The CPUs that share a hardware core with one of `cores` and are not among them, from the sampler's
    topology rows (smt_core); None where it wrote none (a record sampled before them, a sysfs that is silent)."""
    core_of = {int(device[3:]): points[0][1] for (metric, device), points in samples.items() if metric == "smt_core"}
    if not core_of:
        return None
    shared = {core_of[c] for c in cores if c in core_of}
    return sorted(c for c, core in core_of.items() if core in shared and c not in cores)


def disturbance(nodes: dict[str, dict], settings: dict) -> str | None:
    """Why the run is disturbed (the figures), or None: judged only where the sampler covered the window."""
    found = []
    limit = f"limit {100 * settings['disturbed_cpu_share']:.0f}%"
    for host, node in sorted(nodes.items()):
        if node["coverage"] < MIN_COVERAGE:
            continue
        cores = ",".join(map(str, node["cores"]))
        if node["foreign_cpu_share"] > settings["disturbed_cpu_share"]:
            found.append(f"on {host} processes outside the run took {100 * node['foreign_cpu_share']:.0f}% of its "
                         f"CPUs (cores {cores}) in the measured window, {limit}")
        if (node.get("sibling_foreign_cpu_share") or 0.0) > settings["disturbed_cpu_share"]:
            siblings = ",".join(map(str, node["smt_siblings"]))
            found.append(f"on {host} processes outside the run took {100 * node['sibling_foreign_cpu_share']:.0f}% "
                         f"of the SMT siblings of its CPUs (cores {siblings}, which share their execution units) in "
                         f"the measured window, {limit}")
        if node["steal_share"] > settings["max_steal_share"]:
            found.append(f"on {host} the hypervisor stole {100 * node['steal_share']:.0f}% of the run's CPUs, limit "
                         f"{100 * settings['max_steal_share']:.0f}%")
    return "; ".join(found) or None


def disturbance_check(disturbed: str | None, nodes: dict[str, dict], missing: list[str], settings: dict) -> dict:
    """The disturbed rule's outcome, from its finding (`disturbed`, disturbance's): "disturbed" with its
    figures, "unjudged" where a node's samples cannot tell (too few inside the measured window, or none), else
    "ok". An unjudged run is kept and compared; the tables count it, so a quiet machine is never claimed where
    it was not seen."""
    interval = settings.get("interval_s")
    unseen = []
    for host, node in sorted(nodes.items()):
        if node["coverage"] < MIN_COVERAGE:
            inside = node.get("samples_inside", 0)
            spanning = f" spanning {100 * node['coverage']:.0f}% of it" if inside >= MIN_SAMPLES_INSIDE else ""
            unseen.append(f"on {host} the measured window of {node['window_s']:.2f} s held {inside} telemetry "
                          f"sample(s){spanning} (needed: {MIN_SAMPLES_INSIDE} spanning {100 * MIN_COVERAGE:.0f}%; "
                          f"sampled every {interval} s)")
    unseen += [f"on {host} no telemetry sample" for host in missing]
    reason = "; ".join(filter(None, [disturbed, *unseen])) or None
    status = Check.DISTURBED if disturbed else Check.UNJUDGED if unseen else Check.OK
    return {"status": status, "reason": reason}


def _bytes(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def traffic_check(nodes: dict[str, dict], result: dict, spec: dict, fabric: dict) -> dict:
    """Did the gradients cross the fabric's interface? Bytes sent per step on it, per node, against
    what a ring all-reduce must send: parameters x 4 B x 2(n-1)/n for n ranks (each node sends one
    ring link's share, however many ranks it holds)."""
    def verdict(status, reason, **extra):
        return {"status": status, "reason": reason, **extra}

    if spec.get("kind") != "train" or (spec.get("nodes") or 1) < 2:
        return verdict(Check.NOT_APPLICABLE, "one node: no traffic between nodes")
    if result.get("mode") not in ALLREDUCE_MODES or not result.get("parameters"):
        return verdict(Check.NOT_APPLICABLE, f"mode {result.get('mode')}: not a ring all-reduce")
    patterns = [p for p in expected_transport(fabric).interface if not p.startswith("^")]
    if not patterns:
        return verdict(Check.NOT_CHECKED, "the fabric names no interface")
    ranks = result["ranks"]
    expected = result["parameters"] * 4 * 2 * (ranks - 1) / ranks
    names = ",".join(dict.fromkeys(p.lstrip("=") for p in patterns))
    observed, short = {}, []
    for host, node in sorted(nodes.items()):
        sent = {device: c.get("tx_bytes_per_step", 0.0) for device, c in node["traffic"].items() if device != "lo"}
        on_fabric = sum(v for device, v in sent.items() if interface_ok(device, None, tuple(patterns)))
        observed[host] = {"on_fabric": on_fabric, "by_interface": sent}
        if on_fabric < MIN_TRAFFIC_SHARE * expected:
            busiest = max(sent, key=sent.get, default=None)
            elsewhere = f"; {busiest} carried {_bytes(sent[busiest])}" if busiest and sent[busiest] > on_fabric else ""
            short.append(f"{host} sent {_bytes(on_fabric)} per step on {names}{elsewhere}")
    basis = (f"the all-reduce must send {_bytes(expected)} per step per node ({result['parameters']:,} parameters "
             f"x 4 B x 2({ranks}-1)/{ranks})")
    if short:
        return verdict(Check.MISMATCH, "; ".join(short) + f": {basis}",
                       expected_bytes_per_step=expected, observed=observed)
    return verdict(Check.OK, f"every node sent >= {100 * MIN_TRAFFIC_SHARE:.0f}% of it on {names}: {basis}",
                   expected_bytes_per_step=expected, observed=observed)


def series(samples: dict, origin: float, fabric: dict) -> list[dict]:
    """Rates between consecutive samples, for the plots: CPU (the run's and everything else's, as %
    of the node), packets and MB/s on the fabric's interfaces (else every interface but lo), GPU use."""
    patterns = tuple(p for p in expected_transport(fabric).interface if not p.startswith("^"))
    cpus = [key for key in samples if key[0] == "cpu_busy_s"]
    nets = [(m, d) for m, d in samples if m.startswith(("net_", "ib_"))]
    chosen = ([key for key in nets if patterns and interface_ok(_device_name(*key), None, patterns)]
              or [(m, d) for m, d in nets if d != "lo"])
    times = sorted({t for points in samples.values() for t, _ in points})
    rows = []
    for before, after in pairwise(times):
        def rate(keys, before=before, after=after):
            return sum(_delta(samples[k], before, after) for k in keys) / (after - before)

        total = rate(cpus) + rate([("cpu_idle_s", d) for _, d in cpus]) + rate([("cpu_steal_s", d) for _, d in cpus])
        busy, own = rate(cpus), rate([("run_cpu_s", "node")]) if ("run_cpu_s", "node") in samples else 0.0
        row = {"t_s": round((before + after) / 2 - origin, 2), "cpu_percent": 100 * busy / total if total else 0.0,
               "run_cpu_percent": 100 * own / total if total else 0.0}
        row["other_cpu_percent"] = max(0.0, row["cpu_percent"] - row["run_cpu_percent"])
        for counter in NET_METRICS:
            value = rate([k for k in chosen if k[0].endswith(counter)])
            row[counter.replace("bytes", "MBps").replace("packets", "packets_per_s")] = (
                value / 1e6 if "bytes" in counter else value)
        gpu = [v for (m, d), points in samples.items() if m == "gpu_util_percent" for t, v in points if t == after]
        if gpu:
            row["gpu_util_percent"] = sum(gpu) / len(gpu)
        rows.append(row)
    return rows


def read_telemetry(path: str | Path, result: dict | None, spec: dict, fabric: dict, settings: dict) -> dict:
    """The record's telemetry block: per-node summaries, the disturbed verdict, the traffic check and
    the series for the plots."""
    path = Path(path)
    block = {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    samples = load_samples(path)
    windows = node_windows(result or {})
    steps = (result or {}).get("steps")
    nodes = {host: summarise_node(samples[host], window, steps) for host, window in windows.items() if host in samples}
    origin = min((w["start_unix"] for w in windows.values()), default=min(
        (t for per_host in samples.values() for points in per_host.values() for t, _ in points[:1]), default=0.0))
    block["nodes"] = nodes
    block["missing_nodes"] = sorted(set(windows) - set(samples))
    block["disturbed"] = disturbance(nodes, settings)
    block["disturbance_check"] = disturbance_check(block["disturbed"], nodes, block["missing_nodes"], settings)
    block["traffic_check"] = traffic_check(nodes, result or {}, spec, fabric)
    block["series"] = {host: series(per_host, origin, fabric) for host, per_host in sorted(samples.items())}
    return block
