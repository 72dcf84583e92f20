"""How often fleet validation drains a healthy node, or misses a fault, at its default settings (issue 33,
item 6): the test cluster's nodes validated again and again with the same faults injected.

    .venv/bin/python benchmarks/fleet_error_rates.py [--runs 10] [--nodes 8] [--state DIR]

Each run is `snakemake validate_nodes` on tests/slurm/fleet.yaml (bare metal, the fast network whole and
its two rails, validation at its defaults: three repetitions, min_shortfall 10%, the second pass, the
hardware tier) over nodes n1..nN of tests/slurm/cluster.sh, with these faults:

- two slowed nodes: every process of their slurmd capped at 40% of a CPU (cluster.sh slow-node);
- one slowed link: a pair capped at 1 Gbit/s on both rails (cluster.sh slow-link, fast0 and fast1);
- one degraded rail: another pair capped on fast1 only;
- one node whose hardware check fails: `nvidia-smi -q` on that node prints a recorded real output with a row
  remap pending (tests/data/hardware; nvidia-smi cannot be installed here, so a program of that name on the
  jobs' PATH prints recorded outputs: the healthy TITAN V's on every other node).

The faulty pairs are links of the plan between healthy nodes (fleetplan's ring and chords). Per run it
prints the failed nodes and links against those injected: a false drain is a healthy node failed, a missed
fault an injected one that passed; a false link a healthy link failed. netbench runs up to 1 MiB (not the
default 16 MiB) so that a run takes minutes: the verdict's settings are the defaults. Without --state it
starts an N-node cluster (as root) and stops it after. Exit 1 when any run drained a healthy node or missed
a fault.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

from containerbench import fleetplan

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
HARDWARE_DATA = ROOT / "tests" / "data" / "hardware"
SLOW_NODE_PERCENT, SLOW_RATE = "40", "1gbit"


def cluster(*argv: str, timeout: float = 120) -> None:
    subprocess.run([str(CLUSTER), *argv], check=True, timeout=timeout)


def faults(nodes: list[str]) -> dict:
    """Which nodes and links to break: three neighbours on the ring (which leaves the most links of the plan
    between healthy nodes: 5 of 12 at 8 nodes, 7 of 14 at 9), and two disjoint links among those, so that the
    healthy links outnumber the broken ones and no healthy node is slow in all of its links."""
    hardware, slowed = nodes[0], nodes[1:3]
    links = [pair for pair in map(fleetplan.in_order, fleetplan.link_pairings(nodes)) if not set(pair) & set(nodes[:3])]
    link = links[0]
    rail = next(pair for pair in links[1:] if not set(pair) & set(link))
    return {"slowed": slowed, "hardware": hardware, "link": link, "rail": rail}


def nvidia_smi(bin_dir: Path, bad_node: str) -> None:
    """`nvidia-smi -q` and `nvidia-smi nvlink --status` as a node with one GPU prints them: the recorded row
    remap pending on `bad_node`, a healthy recorded output elsewhere; any other call as if it were absent."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -q ]; then\n'
        f'  [ "$SLURMD_NODENAME" = {bad_node} ] && \\\n'
        f"    exec cat {HARDWARE_DATA}/nvidia-smi-q-a10-remapped-rows-pending.txt\n"
        f"  exec cat {HARDWARE_DATA}/nvidia-smi-q-titanv-ecc-na.txt\n"
        "fi\n"
        f'[ "$1 $2" = "nvlink --status" ] && exec cat {HARDWARE_DATA}/nvlink-status-a100-1gpu-healthy.txt\n'
        'echo "nvidia-smi: not available here" >&2; exit 127\n')
    script.chmod(0o755)


def validate(state: Path, workdir: Path, nodes: list[str], env: dict) -> tuple[pd.DataFrame, float]:
    site = workdir / "site.yaml"
    site.write_text(yaml.safe_dump({
        "bare_metal": {"python": str(BENCH_PYTHON)},
        "validation": {"nodes": f"n[1-{len(nodes)}]"},
        "netbench": {"max_bytes": 1048576},
        "history": {"store": str(workdir / "history.sqlite")},
    }))
    started = time.monotonic()
    done = subprocess.run(
        [str(CLUSTER), "exec", str(state), "timeout", "-s", "INT", "7200", SNAKEMAKE, "validate_nodes",
         "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
         "--profile", str(ROOT / "profiles" / "slurm"),
         "--configfile", str(ROOT / "tests" / "slurm" / "fleet.yaml"), str(site),
         "--slurm-init-seconds-before-status-checks", "2"],
        capture_output=True, text=True, env=env, timeout=7500)
    summary = workdir / "results" / "fleet" / "fleet_summary.csv"
    if not summary.exists():
        sys.exit(f"the validation wrote no verdict (exit {done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    return pd.read_csv(summary, keep_default_na=False), time.monotonic() - started


def tally(summary: pd.DataFrame, injected: dict) -> dict:
    failed = summary[summary["result"] == "fail"]
    nodes = set(failed.loc[failed["kind"] == "node", "member"])
    links = set(failed.loc[failed["kind"] == "link", "member"])
    bad_nodes = {*injected["slowed"], injected["hardware"]}
    bad_links = {fleetplan.link_name(injected["link"]), fleetplan.link_name(injected["rail"])}
    reasons = failed.set_index("member")["reason"]
    rail = fleetplan.link_name(injected["rail"])
    return {
        "false_drains": sorted(nodes - bad_nodes), "missed_nodes": sorted(bad_nodes - nodes),
        "false_links": sorted(links - bad_links), "missed_links": sorted(bad_links - links),
        "hardware_named": str(reasons.get(injected["hardware"], "")).startswith("hardware: nvidia-smi -q: "),
        "rail_named": "over rail fast.fast1 " in str(reasons.get(rail, "")),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=8, choices=[8, 9])
    parser.add_argument("--state", type=Path, help="a running test cluster's state directory (CB_NODES=N)")
    args = parser.parse_args(argv)
    nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
    injected = faults(nodes)
    print(f"faults: slowed nodes {', '.join(injected['slowed'])} ({SLOW_NODE_PERCENT}% of a CPU); hardware "
          f"{injected['hardware']} (a row remap pending); slowed link {fleetplan.link_name(injected['link'])} "
          f"(both rails, {SLOW_RATE}); degraded rail fast1 of {fleetplan.link_name(injected['rail'])}", flush=True)
    state, own_cluster = args.state, args.state is None
    if own_cluster:
        state = Path(tempfile.mkdtemp(prefix="fleet-errors-"))
        subprocess.run([str(CLUSTER), "start", str(state)], check=True, timeout=900,
                       env={**os.environ, "CB_NODES": str(args.nodes)})
    totals = {"false_drains": 0, "missed": 0, "false_links": 0}
    try:
        for run in range(1, args.runs + 1):
            workdir = Path(tempfile.mkdtemp(prefix=f"fleet-errors-run{run}-"))
            nvidia_smi(workdir / "bin", injected["hardware"])
            env = {**os.environ, "PATH": f"{workdir / 'bin'}:{os.environ['PATH']}"}
            cluster("heal", str(state))
            for node in injected["slowed"]:
                cluster("slow-node", str(state), node, SLOW_NODE_PERCENT)
            for iface in ("fast0", "fast1"):
                cluster("slow-link", str(state), *injected["link"], SLOW_RATE, iface)
            cluster("slow-link", str(state), *injected["rail"], SLOW_RATE, "fast1")
            try:
                summary, seconds = validate(state, workdir, nodes, env)
            finally:
                cluster("heal", str(state))
            found = tally(summary, injected)
            missed = found["missed_nodes"] + found["missed_links"]
            totals["false_drains"] += len(found["false_drains"])
            totals["missed"] += len(missed)
            totals["false_links"] += len(found["false_links"])
            print(f"run {run}: {seconds:.0f} s; false drains {found['false_drains'] or 'none'}; missed "
                  f"{missed or 'none'}; healthy links failed {found['false_links'] or 'none'}; the hardware "
                  f"fault named by its tool: {found['hardware_named']}; the degraded rail named: "
                  f"{found['rail_named']} ({workdir})", flush=True)
    finally:
        if own_cluster:
            subprocess.run([str(CLUSTER), "stop", str(state)], timeout=300)
    print(f"{args.runs} run(s): {totals['false_drains']} false drain(s), {totals['missed']} missed fault(s), "
          f"{totals['false_links']} healthy link(s) failed (target: none of each)")
    return 1 if totals["false_drains"] or totals["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
