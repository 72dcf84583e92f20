"""How fast a batch of nodes is planned and judged: the link pairings and job rounds of
N nodes, the workflow's DAG of their jobs (`snakemake -n validate_nodes`, from the
command line, as an admin waits for it), and the verdict over their records (N nodes x
R repetitions of single-node training and netbench, and of two-node netbench over
every link), timed.

    .venv/bin/python benchmarks/fleet_speed.py [--nodes 1024] [--repetitions 3] [--tries 3]
    .venv/bin/python benchmarks/fleet_speed.py --nodes 10000 --tries 1    # planning's target there: 60 s

The DAG is planned from the pairings saved as a plan (validation.plan), so no Slurm of
N nodes is needed; with launcher srun, as on a site. The records are the recorded real runs of
tests/data/runs moved onto N node names (tests/helpers.py: fleet_records), one node and one link
slowed. Prints the best of --tries for each step and its ratio to the target; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import fleet_records, recorded_records  # noqa: E402

from containerbench import fleet, fleetplan  # noqa: E402

# Issue 33: planning 1,024 nodes under 10 s, 10,000 under 60 s.
PLAN_TARGETS_S, VERDICT_TARGET_S = {1024: 10.0, 10000: 60.0}, 2.0
ROOT = Path(__file__).resolve().parents[1]


def dag_seconds(plan: fleetplan.FleetPlan, tries: int) -> tuple[float, dict[str, int]]:
    """`snakemake -n validate_nodes` on the saved plan: the best time, and the jobs of each rule."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "plan.json").write_text(json.dumps(plan.as_dict()))
        config = Path(tmp) / "site.yaml"
        config.write_text(yaml.safe_dump({
            "results_dir": f"{tmp}/results", "runtimes": ["bare-metal"], "launcher": {"kind": "srun"},
            "history": {"store": f"{tmp}/history.sqlite"},
            "validation": {"plan": f"{tmp}/plan.json", "repetitions": 3}}))
        argv = [str(Path(sys.executable).parent / "snakemake"), "validate_nodes", "-n", "--cores", "2",
                "--configfile", str(ROOT / "config" / "config.yaml"), str(config)]
        best, jobs = float("inf"), {}
        for _ in range(tries):
            started = time.perf_counter()
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            best = min(best, time.perf_counter() - started)
            if done.returncode != 0:
                sys.exit(done.stderr[-3000:])
            jobs = {rule: int(count) for rule, count in re.findall(r"^(fleet_\w+)\s+(\d+)$", done.stdout, flags=re.M)}
    return best, jobs


def best_of(tries: int, step):
    times, value = [], None
    for _ in range(tries):
        started = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - started)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    plan_target_s = next((target for nodes, target in sorted(PLAN_TARGETS_S.items()) if args.nodes <= nodes), 60.0)
    states = {f"n{i:04d}": fleet.NodeState(f"n{i:04d}", "idle") for i in range(1, args.nodes + 1)}

    plan_s, plan = best_of(args.tries, lambda: fleetplan.plan_batch(states))
    print(f"plan, {args.nodes} nodes: {len(plan.links)} links in {len(plan.rounds)} rounds, {plan.jobs} jobs: "
          f"{plan_s:.3f} s (target {plan_target_s:g} s, time/target = {plan_s / plan_target_s:.3f})")

    dag_s, jobs = dag_seconds(plan, args.tries)
    allocations = {rule: count for rule, count in jobs.items() if re.fullmatch(r"fleet_(nodes|links\d+)_\d+", rule)}
    print(f"snakemake -n validate_nodes, {args.nodes} nodes: {len(plan.nodes)} node and {len(plan.links)} link "
          f"jobs in {sum(allocations.values())} allocations (Slurm submissions), {sum(jobs.values())} workflow jobs "
          f"in all: {dag_s:.2f} s (target {plan_target_s:g} s for pairings and DAG together, time/target = "
          f"{(plan_s + dag_s) / plan_target_s:.3f})")

    slow_node, slow_link = plan.nodes[len(plan.nodes) // 3], tuple(sorted(plan.links[len(plan.links) // 2]))
    records = fleet_records(recorded_records(), plan.nodes, plan.links, compute={slow_node: 0.7},
                            slow_links={slow_link: 0.4}, repetitions=args.repetitions)
    verdict_s, verdict = best_of(args.tries, lambda: fleet.judge(records, plan))
    print(f"verdict, {args.nodes} nodes x {args.repetitions} repetitions ({len(records)} records): "
          f"{verdict_s:.3f} s (target {VERDICT_TARGET_S:g} s, time/target = {verdict_s / VERDICT_TARGET_S:.3f})")
    print(f"  failed nodes: {', '.join(verdict.failed_nodes) or 'none'} (slowed: {slow_node}); "
          f"bad links: {', '.join(verdict.bad_links) or 'none'} (slowed: {fleetplan.link_name(slow_link)})")


if __name__ == "__main__":
    main()
