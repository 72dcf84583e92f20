"""Wall time of a fleet validation against its node count, on a simulated Slurm cluster.

Starts tests/slurm/cluster.sh with as many slurmd "nodes" as the largest size asks (root, network
namespaces), and for each size validates that many nodes as validate_nodes runs them (fleetrounds): the
node jobs in one allocation, then each round of links in one, every job of an allocation at once on its own
nodes. A tiny check: one repetition, the fabric whole (no rails), no link training. Prints each size's wall
time, rounds and allocations (Slurm submissions), and its ratio to the smallest size's; issue 33 asks the
ratio within 1.5 from 8 to 32 nodes. Every "node" here shares this machine's cores, so uncapped a check
that keeps a core busy grows with the node count. So each node is capped (cluster.sh slow-node) at its share
of the cores at the largest size, the same cap at every size: a node of its own, small, as a site's nodes
have cores of their own, and what grows with the count is the orchestration on the "login node" (salloc, one
process a job, the srun clients, the records written). Printed beside: the runs' own seconds, and what each
round took beyond its longest job's runs. Asserts nothing.

    sudo .venv/bin/python benchmarks/fleet_wall.py [--sizes 8 16 32] [--node-cpu-percent P]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"

from containerbench import config as cb_config  # noqa: E402
from containerbench import fleetjobs, fleetplan, fleetrounds  # noqa: E402
from containerbench.slurm import NodeState  # noqa: E402


def validate(state: Path, size: int, work: Path) -> dict:
    """Every round of `size` nodes, one after another, each a `fleet run` of its allocation: wall times."""
    site = work / f"site-{size}.yaml"
    site.write_text(yaml.safe_dump({
        "bare_metal": {"python": str(BENCH_PYTHON)},
        "validation": {"nodes_per_allocation": size, "max_jobs": 1, "repetitions": 1, "link_training": False},
    }))
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml", site])
    config["fabrics"]["fast"].pop("rails", None)
    plan = fleetplan.plan_batch({f"n{i}": NodeState(f"n{i}", "idle") for i in range(1, size + 1)})
    jobs = fleetjobs.FleetJobs(config, plan, str(work / f"fleet-{size}"))
    rounds = fleetrounds.FleetRounds(jobs, plan)
    jobs.write(plan, work / f"plan-{size}.json")
    rounds.write()
    started, per_round, overhead = time.monotonic(), [], 0.0
    for held in rounds.held:
        begun = time.monotonic()
        done = subprocess.run([str(CLUSTER), "exec", str(state), sys.executable, "-m", "containerbench", "fleet",
                               "run", rounds.file(held)], capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            sys.exit(f"size {size}, {held.name}: exit {done.returncode}: {done.stderr[-2000:]}")
        per_round.append(time.monotonic() - begun)
        # What the round took beyond its longest job's runs: salloc, the jobs' start, the records written.
        mine = [json.loads(Path(path).read_text()) for path in rounds.outputs(held)["records"]]
        longest = max(sum(record["wall_s"] or 0 for record in mine if tuple(record["spec"]["nodelist"]) == tuple(
            job[1].split("+"))) for job in held.jobs)
        overhead += per_round[-1] - longest
    records = [json.loads(Path(path).read_text()) for held in rounds.held for path in rounds.outputs(held)["records"]]
    failed = [record["run_id"] for record in records if record["status"] != "ok"]
    return {"wall_s": time.monotonic() - started, "rounds": per_round, "allocations": len(rounds.held),
            "run_s": sum(record["wall_s"] or 0 for record in records), "overhead_s": overhead, "failed": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--node-cpu-percent", type=int, default=None,
                        help="each node's cap, percent of a CPU (default: this machine's cores shared by the largest "
                             "size's nodes; 0: uncapped)")
    args = parser.parse_args()
    cap = args.node_cpu_percent if args.node_cpu_percent is not None else os.cpu_count() * 100 // max(args.sizes)
    with tempfile.TemporaryDirectory(prefix="fleet-wall-") as tmp:
        work, state = Path(tmp), Path(tmp) / "cluster"
        subprocess.run([str(CLUSTER), "install"], check=True, timeout=600)
        env = {**os.environ, "CB_NODES": str(max(args.sizes))}
        subprocess.run([str(CLUSTER), "start", str(state)], check=True, timeout=600, env=env)
        try:
            for node in range(1, max(args.sizes) + 1) if cap else ():
                subprocess.run([str(CLUSTER), "slow-node", str(state), f"n{node}", str(cap)], check=True, timeout=60)
            results = {}
            for size in sorted(args.sizes):  # each line as its size ends: a later size may run past a limit
                results[size] = validate(state, size, work)
                print_size(size, results, cap)
        finally:
            subprocess.run([str(CLUSTER), "stop", str(state)], timeout=300)


def print_size(size: int, results: dict, cap: int) -> None:
    result, smallest = results[size], results[min(results)]
    rounds = ", ".join(f"{seconds:.0f}" for seconds in result["rounds"])
    print(f"{size:4d} nodes: {result['wall_s']:7.1f} s in {len(result['rounds'])} rounds ({rounds} s), "
          f"{result['allocations']} allocations; the runs' own time {result['run_s']:.0f} s on "
          f"{os.cpu_count()} cores, each node capped at {f'{cap}% of a CPU' if cap else 'none'}; "
          f"wall / {min(results)} nodes' = {result['wall_s'] / smallest['wall_s']:.2f}; "
          f"beyond each round's longest job {result['overhead_s']:.1f} s, / {min(results)} nodes' = "
          f"{result['overhead_s'] / smallest['overhead_s']:.2f}"
          + (f"; failed: {', '.join(result['failed'])}" if result["failed"] else ""), flush=True)

if __name__ == "__main__":
    main()
