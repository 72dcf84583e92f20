"""The fleet verdict: which nodes of a batch, and which links between them, are bad.

The fleet is made of real records (tests/data/runs) put on other nodes: each node's
single-node training and netbench, each link's two-node netbench, three repetitions
with a little noise. One node computes slowly, one node's network is slow in every
link it is in, and one link is slow between two nodes that are fine elsewhere; the
verdict must name exactly those and pass the others.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import ROOT, assert_junit_as_pytest_writes, fleet_records, on_nodes, tiny_config
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from containerbench import config as cb_config
from containerbench import (
    execution,
    fabrics,
    fleet,
    fleetexport,
    fleetjobs,
    fleetplan,
    fleetreport,
    fleetrounds,
    fleetstats,
    hardware,
    slurm,
)
from containerbench.fleetstats import members_of
from containerbench.plans import RunPlan
from containerbench.rank import markers
from containerbench.records import parse_log
from containerbench.validate import Reference, rail_of

NODES = [f"n{i:02d}" for i in range(1, 7)]
# The fleet with three faults: large enough that the links between healthy nodes outnumber the slow ones.
BATCH, DRAINED = [f"n{i:02d}" for i in range(1, 11)], "n11"
NIC_LINKS = ["n04+n05", "n05+n06", "n05+n10"]
SLOW_NODE, BAD_NIC, BAD_LINK = "n04", "n05", ("n02", "n03")


@pytest.mark.parametrize("count", [4, 5, 6, 7, 16, 63, 64, 1024])
def test_every_node_is_in_three_links_and_n_nodes_cost_n_plus_half_n_link_jobs(count):
    nodes = [f"n{i}" for i in range(count)]
    pairs = fleetplan.link_pairings(nodes)
    assert len(pairs) == count + math.ceil(count / 2)
    assert len({frozenset(pair) for pair in pairs}) == len(pairs) and all(a != b for a, b in pairs)
    degree = {node: sum(node in pair for pair in pairs) for node in nodes}
    assert min(degree.values()) >= 3
    rounds = fleetplan.job_rounds(pairs)
    assert sorted(itertools.chain(*rounds)) == sorted(pairs)
    for taken in rounds:  # never two jobs on one node at a time
        members = [node for pair in taken for node in pair]
        assert len(members) == len(set(members))
    assert len(rounds) <= max(degree.values()) + 1  # Vizing: a colouring this short exists


def test_two_and_three_nodes_have_their_ring_only():
    assert fleetplan.link_pairings(["a", "b"]) == [("a", "b")]
    assert fleetplan.link_pairings(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("a", "c")]
    assert fleetplan.link_pairings(["n9", "n10"]) == [("n9", "n10")]  # natural order: one spelling per link
    assert fleetplan.link_pairings(["a"]) == []


def test_nodes_slurm_cannot_run_on_are_reported_not_planned():
    states = {name: fleet.NodeState(name, "idle") for name in NODES}
    states["n07"] = fleet.NodeState("n07", "drained", "bad DIMM")
    states["n08"] = fleet.NodeState("n08", "idle*")  # not responding
    states["n09"] = fleet.NodeState("n09", "mixed")
    plan = fleetplan.plan_batch(states)
    assert plan.nodes == [*NODES, "n09"] and sorted(plan.unavailable) == ["n07", "n08"]
    assert plan.jobs == 7 + 7 + 4


@pytest.fixture(scope="module")
def verdict(recorded_runs):
    states = {name: fleet.NodeState(name, "idle") for name in BATCH}
    states[DRAINED] = fleet.NodeState(DRAINED, "drained", "bad DIMM")
    plan = fleetplan.plan_batch(states)
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={SLOW_NODE: 0.7}, network={BAD_NIC: 0.5},
                            slow_links={BAD_LINK: 0.4})
    return fleet.judge(records, plan)


def test_the_verdict_names_exactly_the_slow_node_the_bad_nic_and_the_bad_link(verdict):
    assert verdict.failed_nodes == [SLOW_NODE, BAD_NIC, DRAINED]
    assert verdict.bad_links == ["+".join(BAD_LINK)]
    summary = verdict.summary.set_index("member")
    assert summary.loc[DRAINED, "reason"] == "not run: Slurm state drained (bad DIMM)"
    # Its link to the slow node (n04) is not counted: n04 failed on its own, so that link says nothing of n05.
    assert (summary.loc[BAD_NIC, "reason"]
            == f"slow in all 2 of its links to nodes that passed ({', '.join(NIC_LINKS[1:])})")
    assert summary.loc[SLOW_NODE, "reason"].startswith("images_per_sec ")
    assert "30% below the fleet median" in summary.loc[SLOW_NODE, "reason"]
    # The slow NIC's links are explained by it, not called bad links themselves.
    assert (summary.loc[NIC_LINKS, "result"] == "explained").all()
    # Everything else passes, the slow node's links included: its CPU is slow, its network is not.
    assert set(summary.loc[summary["result"] == "pass"].index) == set(summary.index) - {
        SLOW_NODE, BAD_NIC, DRAINED, "n02+n03", *NIC_LINKS}
    assert len(summary) == 11 + 15


def test_the_node_table_holds_each_metric_against_the_fleet(verdict):
    table = verdict.nodes
    assert list(table.columns) == fleet.NODE_COLUMNS
    rate = table[table["variable"].str.endswith("/images_per_sec")].set_index("node")
    assert sorted(rate.index) == BATCH  # the drained node has no figures, only its summary row
    assert rate.loc[SLOW_NODE, "result"] == "fail" and (rate.drop(SLOW_NODE)["result"] == "pass").all()
    assert rate.loc[SLOW_NODE, "deviation_percent"] == pytest.approx(-30, abs=3)
    assert rate.loc[SLOW_NODE, "robust_z"] < -fleetstats.ROBUST_Z_LIMIT
    # Intra-node netbench: every node is fine inside itself, the bad NIC included.
    intra = table[table["variable"].str.contains("/1x2/")]
    assert set(intra["result"]) == {"pass"} and set(intra["node"]) == set(BATCH)


def test_the_link_table_blames_each_slow_link_on_its_cause(verdict):
    table = verdict.links
    busbw = table[table["variable"].str.contains("allreduce_busbw")].set_index("link")
    assert len(busbw) == 15
    assert busbw.loc["n02+n03", "blamed_on"] == "link" and busbw.loc["n02+n03", "slow"]
    assert busbw.loc["n02+n03", "deviation_percent"] == pytest.approx(-60, abs=3)
    assert (busbw.loc[NIC_LINKS, "blamed_on"] == BAD_NIC).all()
    assert not busbw.drop(["n02+n03", *NIC_LINKS])["slow"].any()


def test_the_drain_list_drains_failed_nodes_only_and_names_the_bad_link(verdict):
    commands = fleetexport.drain_commands(verdict)
    assert [argv[:4] for argv in commands] == [["scontrol", "update", f"NodeName={node}", "State=DRAIN"]
                                              for node in (SLOW_NODE, BAD_NIC)]  # n11 is drained already
    assert commands[1][4] == ("Reason=containerbench: slow in all 2 of its links to nodes that passed "
                              f"({', '.join(NIC_LINKS[1:])})")
    assert all(len(argv[4]) <= len("Reason=containerbench: ") + fleetexport.REASON_CHARS for argv in commands)
    text = fleetexport.format_drain_list(verdict).splitlines()
    assert text[0].startswith(f"scontrol update NodeName={SLOW_NODE} State=DRAIN 'Reason=containerbench: ")
    assert text[2].startswith("# link n02+n03: ") and text[2].endswith("(a cable or switch port: not drained)")


def test_a_node_whose_runs_failed_or_left_no_record_fails_with_the_reason(recorded_runs):
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links)
    cancelled = [r for r in records if r["result"]["hostnames"] == ["n01"] and r["kind"] == "train"]
    for record in cancelled:
        record.update(status="failed", reasons=["Slurm: CANCELLED by 0 (sacct)"])
    records = [r for r in records if set(r["result"]["hostnames"]) != {"n06"}]  # its links ran, it did not
    summary = fleet.judge(records, plan).summary.set_index("member")
    assert summary.loc["n01", "result"] == "fail"
    assert summary.loc["n01", "reason"] == f"{cancelled[0]['run_id']} and 2 more failed: Slurm: CANCELLED by 0 (sacct)"
    assert summary.loc["n06", "reason"] == "not measured: no record of this node"
    assert summary.loc["n02", "result"] == "pass"


def test_a_homogeneous_fleet_passes_whole(recorded_runs):
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    summary = fleet.judge(fleet_records(recorded_runs, plan.nodes, plan.links), plan).summary
    assert len(summary) == 6 + 9 and set(summary["result"]) == {"pass"}
    assert fleetexport.format_drain_list(fleet.judge(fleet_records(recorded_runs, plan.nodes, plan.links), plan)) == ""


def test_a_small_shortfall_in_a_tight_fleet_is_not_a_fault(recorded_runs):
    # 5% down with 1% noise is far out by the MAD, but under the 10% a site cares about.
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    verdict = fleet.judge(fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n03": 0.95}), plan)
    row = verdict.nodes[(verdict.nodes["node"] == "n03") & verdict.nodes["variable"].str.endswith("images_per_sec")]
    assert row["robust_z"].iloc[0] < -fleetstats.ROBUST_Z_LIMIT and row["result"].iloc[0] == "pass"
    assert verdict.failed_nodes == []


@pytest.mark.parametrize("state, available", [
    ("idle", True), ("mixed", True), ("allocated", True), ("completing", True), ("planned", True),
    ("drained", False), ("draining", False), ("down", False), ("down*", False), ("idle*", False),
    ("fail", False), ("maint", False), ("reserved", True), ("future", False), ("unknown", False),
    ("inval", False), ("powered_down", False), ("reboot_issued", False)])
def test_which_sinfo_states_take_a_job(state, available):
    # The states of sinfo(1), "NODE STATE CODES"; "*" marks a node not responding.
    assert fleet.NodeState("n1", state).available is available


def test_hyphenated_hostnames_keep_their_links_apart(recorded_runs):
    names = [f"rack-1-n{i}" for i in range(1, 6)]
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in names})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("rack-1-n2", "rack-1-n3"): 0.4})
    verdict = fleet.judge(records, plan)
    assert verdict.failed_nodes == [] and verdict.bad_links == ["rack-1-n2+rack-1-n3"]


def test_the_command_line_judges_the_records_writes_the_tables_and_only_prints_the_drain_list(recorded_runs, tmp_path):
    states = {name: fleet.NodeState(name, "idle") for name in NODES}
    plan = fleetplan.plan_batch(states)
    (tmp_path / "plan.json").write_text(json.dumps(plan.as_dict()))
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={SLOW_NODE: 0.7})
    for record in records:
        (tmp_path / f"{record['run_id']}.json").write_text(json.dumps(record))
    judged = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "judge", "--plan",
                             str(tmp_path / "plan.json"), "--out-dir", str(tmp_path / "fleet"),
                             *map(str, sorted(tmp_path.glob("*_rep*.json")))], capture_output=True, text=True)
    assert judged.returncode == 1, judged.stderr
    lines = judged.stdout.splitlines()
    assert lines[0] == "fleet: 1 of 6 node(s) failed, 0 of 9 link(s) bad"
    assert lines[1].startswith(f"  node {SLOW_NODE}  fail      images_per_sec ")
    assert lines[3] == f"drain list ({tmp_path / 'fleet' / 'drain.txt'}), not run: --drain runs it:"
    assert lines[4].startswith(f"scontrol update NodeName={SLOW_NODE} State=DRAIN 'Reason=containerbench: ")
    written = pd.read_csv(tmp_path / "fleet" / "fleet_summary.csv")
    assert len(written) == 15 and written.loc[written["result"] == "fail", "member"].tolist() == [SLOW_NODE]
    assert (tmp_path / "fleet" / "drain.txt").read_text() == lines[4] + "\n"
    assert fleetplan.FleetPlan.from_dict(json.loads((tmp_path / "plan.json").read_text())) == plan
    # The page: what failed, the per-node chart, the link matrix, the drain list; read from the tables.
    page = (tmp_path / "fleet" / "fleet.html").read_text()
    assert lines[2] == f"tables and page: {tmp_path / 'fleet'}/fleet_*.csv, {tmp_path / 'fleet' / 'fleet.html'}"
    assert page.count('src="data:image/png;base64,') == 2
    assert 'alt="per-node deviation from the fleet median"' in page and 'alt="link matrix (Links): ' in page
    assert "1 of 6 node(s) failed" in page and "0 of 9 link(s) bad" in page
    assert f"<td>{SLOW_NODE}</td>" in page and f"scontrol update NodeName={SLOW_NODE} State=DRAIN" in page
    # What `snakemake validate_nodes` prints and exits with, from the summary alone.
    summary = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "summary",
                              str(tmp_path / "fleet" / "fleet_summary.csv")], capture_output=True, text=True)
    assert summary.returncode == 1 and summary.stdout.splitlines() == [lines[0], lines[1], lines[4]]
    # For CI and Prometheus (fleetexport): a case per node and link, a metrics file per node.
    out = tmp_path / "fleet"
    assert lines[5] == f"for CI and Prometheus: {out / 'fleet_junit.xml'}, {out / 'fleet_metrics'}/<node>.prom"
    junit = ET.parse(out / "fleet_junit.xml").getroot()
    (tmp_path / "pytest-reference").mkdir()
    assert_junit_as_pytest_writes(junit, tmp_path / "pytest-reference")
    cases = {suite.get("name"): {case.get("name"): [child.tag for child in case if child.tag != "system-out"]
                                 for case in suite} for suite in junit}
    assert {name: outcome for name, outcome in cases["nodes"].items() if outcome} == {SLOW_NODE: ["failure"]}
    assert sorted(cases["nodes"]) == sorted(plan.nodes) and len(cases["links"]) == 9
    assert not any(cases["links"].values())
    node_rows = pd.read_csv(out / "fleet_nodes.csv")
    for node in plan.nodes:
        families = {family.name: family.samples for family in
                    openmetrics_families((out / "fleet_metrics" / f"{node}.prom").read_text())}
        checks = {(sample.labels["kind"], sample.labels["member"]): sample.value
                  for sample in families["containerbench_fleet_check_passed"]}
        assert checks[("node", node)] == (0 if node == SLOW_NODE else 1)
        assert sum(kind == "link" for kind, _ in checks) == 3  # each node is in three links
        mine = node_rows[(node_rows["node"] == node) & node_rows["variable"].str.endswith("/images_per_sec")]
        (rate,) = families["containerbench_training_images_per_second"]
        assert rate.value == pytest.approx(mine["value"].iloc[0]) and rate.labels["node"] == node
    # The second pass as the workflow runs it: the suspects named, then judged with their second measurement.
    named = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "suspects", "--plan",
                            str(tmp_path / "plan.json"), "--out", str(tmp_path / "suspects.json"),
                            *map(str, sorted(tmp_path.glob("*_rep*.json")))], capture_output=True, text=True)
    assert named.returncode == 0 and named.stdout == f"1 node(s) to measure again before they fail: {SLOW_NODE}\n"
    assert json.loads((tmp_path / "suspects.json").read_text()) == [SLOW_NODE]
    (tmp_path / "recheck").mkdir()
    for repetition in (4, 5, 6):
        again = on_nodes(recorded_runs[("train", 1)], [SLOW_NODE], repetition, 1.0)
        (tmp_path / "recheck" / f"{again['run_id']}.json").write_text(json.dumps(again))
    rejudged = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "judge", "--plan",
                               str(tmp_path / "plan.json"), "--out-dir", str(tmp_path / "fleet2"),
                               *map(str, sorted(tmp_path.glob("*_rep*.json"))), "--recheck",
                               *map(str, sorted((tmp_path / "recheck").glob("*_rep*.json")))],
                              capture_output=True, text=True)
    assert rejudged.returncode == 0, rejudged.stderr
    head = rejudged.stdout.splitlines()[:2]
    assert head[0] == "fleet: 0 of 6 node(s) failed, 0 of 9 link(s) bad"
    assert head[1].startswith(f"  node {SLOW_NODE}  pass      not repeated: images_per_sec ")
    assert head[1].endswith("the first pass's median: within the fleet")


def test_a_batch_is_a_hostlist_or_a_partition_and_judge_needs_its_plan():
    for argv, message in ((["plan"], "containerbench: fleet: give one of 'validation.nodes' (a Slurm hostlist) and "
                                     "'validation.partition'; got neither"),
                          (["plan", "--nodes", "n1", "--partition", "new"], "containerbench: fleet: give one of "
                           "'validation.nodes' (a Slurm hostlist) and 'validation.partition'; got both"),
                          ):
        done = subprocess.run([sys.executable, "-m", "containerbench", "fleet", *argv], capture_output=True, text=True)
        assert (done.returncode, done.stderr) == (2, message + "\n")
    done = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "judge"], capture_output=True, text=True)
    assert done.returncode == 2 and "error: the following arguments are required: --plan" in done.stderr


def test_the_charts_sign_every_metric_so_that_below_zero_is_worse(verdict):
    nodes, links = verdict.nodes, verdict.links
    assert (nodes["better_percent"] == nodes["deviation_percent"].where(
        ~nodes["variable"].str.contains("latency"), -nodes["deviation_percent"])).all()
    latency = links[(links["link"] == "n02+n03") & links["variable"].str.contains("latency")].iloc[0]
    assert latency["deviation_percent"] > 100 and latency["better_percent"] == -latency["deviation_percent"]
    assert fleetreport.node_chart(nodes.iloc[0:0]) is None and fleetreport.link_matrix(links.iloc[0:0], BATCH) is None


def judge_cli(tmp_path, plan, records, *options):
    folder = tmp_path / f"fleet-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps(plan.as_dict()))
    for record in records:
        (folder / f"{record['run_id']}.json").write_text(json.dumps(record))
    return subprocess.run([sys.executable, "-m", "containerbench", "fleet", "judge",
                           "--plan", str(folder / "plan.json"), "--out-dir", str(folder / "out"),
                           *options, *map(str, folder.glob("*_rep*.json"))],
                          capture_output=True, text=True), folder / "out"


def test_a_batch_slower_as_a_whole_passes_the_fleet_test_and_fails_the_reference_from_good_nodes(
        recorded_runs, tmp_path):
    # The site's good nodes of this type (n01-n06) give the references; one of them was bad that day.
    good = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    good_records = fleet_records(recorded_runs, good.nodes, good.links, compute={"n03": 0.5})
    for record in good_records:
        (tmp_path / f"{record['run_id']}.json").write_text(json.dumps(record))
    references = tmp_path / "references.yaml"
    baseline = subprocess.run([sys.executable, "-m", "containerbench", "baseline", "--good-nodes", "n01,n02,n04,n05",
                               "--out", str(references), *map(str, tmp_path.glob("*_rep*.json"))],
                              capture_output=True, text=True)
    assert baseline.returncode == 0, baseline.stderr
    written = references.read_text()
    assert "run records on n01,n02,n04,n05" in written.splitlines()[0]
    one_node = "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x1/b2/images_per_sec"
    rate = recorded_runs[("train", 1)]["result"]["images_per_sec"]
    assert yaml.safe_load(written)["systems"]["ci"][one_node]["reference"] == pytest.approx(rate, rel=0.02)
    # A new batch, every node 20% slower: the same as each other, so only the references catch it.
    new = fleetplan.plan_batch({f"m{i}": fleet.NodeState(f"m{i}", "idle") for i in range(1, 5)})
    slow = fleet_records(recorded_runs, new.nodes, new.links, compute={node: 0.8 for node in new.nodes})
    without, _ = judge_cli(tmp_path, new, slow)
    assert without.returncode == 0 and without.stdout.startswith("fleet: 0 of 4 node(s) failed"), without.stdout
    judged, out = judge_cli(tmp_path, new, slow, "--references", str(references))
    assert judged.returncode == 1 and judged.stdout.startswith("fleet: 4 of 4 node(s) failed, 0 of 6 link(s) bad")
    nodes = pd.read_csv(out / "fleet_nodes.csv")
    row = nodes[(nodes["node"] == "m1") & (nodes["variable"] == one_node)].iloc[0]
    assert row["result"] == "fail" and row["reference"] == pytest.approx(rate, rel=0.02)
    assert row["reason"].startswith(f"images_per_sec {row['value']:.4g} img/s outside the reference ")
    assert row["reason"].endswith(f"(at least {row['reference'] * 0.9:.4g})")
    missing, _ = judge_cli(tmp_path, new, slow, "--references", str(references), "--system", "other")
    assert (missing.returncode, missing.stderr) == (
        2, f"containerbench: no references for system 'other' in {references}; systems there: ci\n")


def test_in_four_nodes_a_slow_nodes_links_do_not_hide_a_bad_link(recorded_runs):
    # A node slow in everything (a CPU cap) slows its three links too: half of four nodes' six. The links
    # are set against those between nodes that passed, so the one bad link still stands out.
    nodes = ["n1", "n2", "n3", "n4"]
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in nodes})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n3": 0.4}, network={"n3": 0.6},
                            slow_links={("n1", "n2"): 0.4})
    verdict = fleet.judge(records, plan)
    assert verdict.failed_nodes == ["n3"] and verdict.bad_links == ["n1+n2"]
    summary = verdict.summary.set_index("member")
    assert set(summary.index[summary["result"] == "explained"]) == {"n2+n3", "n3+n4", "n1+n3"}


def test_each_node_and_link_job_runs_its_runs_pinned_in_one_exclusive_allocation():
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["fabrics"]["fast"].pop("rails")  # a link's rails: test_a_links_job_measures_its_fabric_whole_...
    config["validation"]["hardware"]["enabled"] = False  # its step's bound: test_a_nodes_job_checks_its_hardware_...
    config["validation"].update(repetitions=2, link_training=True)
    node = fleetjobs.node_runs(config, "n3")
    assert [run.run_id for run in node] == [
        "train_bare-metal_fast_1x1_b32_on_n3_rep1", "netbench_bare-metal_fast_1x2_on_n3_rep1",
        "train_bare-metal_fast_1x1_b32_on_n3_rep2", "netbench_bare-metal_fast_1x2_on_n3_rep2"]
    link = fleetjobs.link_runs(config, ("n1", "n2"))
    assert [run.run_id for run in link] == [
        "netbench_bare-metal_fast_2x1_on_n1+n2_rep1", "train_bare-metal_fast_2x1_b32_on_n1+n2_rep1",
        "netbench_bare-metal_fast_2x1_on_n1+n2_rep2", "train_bare-metal_fast_2x1_b32_on_n1+n2_rep2"]
    assert link[0].as_dict()["nodelist"] == ["n1", "n2"] and "nodelist" not in cb_config.plan_runs(config)[0].as_dict()
    # salloc(1) OPTIONS: --nodelist, --exclusive, --time in minutes (a bare number is minutes), --partition,
    # --account; the time is the runs' timeouts rounded up, with 2 minutes a run for sacct after a failure.
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2")})
    jobs = fleetjobs.FleetJobs(config, plan, "results/fleet")
    minutes = -(-(2 * 600 + 2 * config["netbench"]["timeout_s"]) // 60) + 2 * 4
    assert jobs.allocation(("link", "n1+n2")) == [
        "salloc", "--nodes=2", "--nodelist=n1,n2", "--exclusive", "--ntasks-per-node=1", "--cpus-per-task=1",
        f"--time={minutes}", "--job-name=containerbench-fleet-n1+n2", "--partition=cpu", "--account=cbtest-account"]
    assert jobs.longest()[1] == minutes  # the node jobs run as many runs as long
    limit = {"cpu": slurm.Partition(nodes=2, gpus=0, max_minutes=minutes - 1)}
    with pytest.raises(fleetplan.FleetError) as caught:
        fleetjobs.check_time_limit(jobs, config["slurm"], limit)
    assert str(caught.value) == (
        f"the job of n1 may take {minutes} minutes (its runs' timeouts, 'benchmark.timeout_s' and "
        "'netbench.timeout_s', and 'validation.repetitions'), beyond partition 'cpu''s time limit of "
        f"{minutes - 1}; allowed: shorter timeouts, or `snakemake calibrate` first, so that each job asks for its "
        "runs' expected time, or fewer repetitions")
    fleetjobs.check_time_limit(jobs, config["slurm"], {"cpu": slurm.Partition(2, 0, minutes)})
    fleetjobs.check_time_limit(jobs, config["slurm"], None)  # where sinfo cannot answer: not checked


@pytest.mark.parametrize("text, minutes", [("infinite", None), ("UNLIMITED", None), ("30:00", 30), ("2:00:00", 120),
                                           ("1-00:00:00", 1440), ("1-12:30:00", 2190), ("45", 45), ("5:30", 6)])
def test_sinfos_time_limits_are_read_in_whole_minutes(text, minutes):
    # sinfo(1) %l: "Maximum time for any job in the format "days-hours:minutes:seconds"", or "infinite".
    assert slurm.time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text, nodes", [("1-infinite", None), ("1-64", 64), ("2-UNLIMITED", None), ("16", 16)])
def test_sinfos_job_sizes_are_read_as_the_most_nodes_a_job_may_have(text, nodes):
    # sinfo(1) %s: "Maximum job size in nodes", printed as the partition's MinNodes-MaxNodes ("1-infinite").
    assert slurm.job_size_limit(text) == nodes


def test_an_allocation_larger_than_the_partitions_largest_job_is_refused_before_anything_is_submitted():
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["validation"]["nodes_per_allocation"] = 8
    plan = fleetplan.plan_batch({f"n{i}": fleet.NodeState(f"n{i}", "idle") for i in range(1, 11)})
    rounds = fleetrounds.FleetRounds(fleetjobs.FleetJobs(config, plan, "results/fleet"), plan)
    with pytest.raises(fleetplan.FleetError) as caught:
        fleetrounds.check_allocation_size(rounds, config["slurm"], {"cpu": slurm.Partition(10, 0, 120, 4)})
    assert str(caught.value) == ("'validation.nodes_per_allocation' = 8 makes allocations of 8 nodes, beyond "
                                 "partition 'cpu''s largest job of 4; allowed: at most 4")
    fleetrounds.check_allocation_size(rounds, config["slurm"], {"cpu": slurm.Partition(10, 0, 120, 8)})
    fleetrounds.check_allocation_size(rounds, config["slurm"], {"cpu": slurm.Partition(10, 0, 120)})  # no MaxNodes
    fleetrounds.check_allocation_size(rounds, config["slurm"], None)  # where sinfo cannot answer: not checked


def test_a_jobs_file_holds_its_allocation_plans_and_logs_and_a_run_never_started_is_a_failed_record(tmp_path):
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    plan = fleetplan.plan_batch({"n1": fleet.NodeState("n1", "idle")})
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"))
    jobs.write(plan, tmp_path / "plan.json")
    job = json.loads(Path(jobs.job_file(("node", "n1"))).read_text())
    assert fleetplan.FleetPlan.from_dict(json.loads((tmp_path / "plan.json").read_text())) == plan
    assert job["logs"] == jobs.logs(("node", "n1")) and job["allocation"] == jobs.allocation(("node", "n1"))
    # Fleet runs are in their job's allocation, not one each; their telemetry is not collected.
    assert all("allocation" not in run_plan and run_plan["telemetry"] is None for run_plan in job["plans"])
    execution.write_not_run(RunPlan.from_json(job["plans"][1]), job["logs"][1],
                            {"not_run": "no allocation: Job allocation 7 has been revoked"})
    record = parse_log(job["logs"][1])
    assert (record["status"], record["reasons"]) == ("failed",
                                                     ["not run: no allocation: Job allocation 7 has been revoked"])
    assert record["spec"]["nodelist"] == ["n1"] and record["run_id"] == jobs.runs[("node", "n1")][1].run_id


def test_a_run_whose_allocation_slurm_ended_carries_slurms_state_and_reason(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(markers.line(markers.LAUNCH, {"run_id": "netbench_x_on_n1+n2_rep1", "spec": {"kind": "netbench"}})
                   + "srun: error: n2: task 1: Killed\n"
                   + markers.line(markers.EXIT, {"returncode": 137, "wall_s": 3.2, "timed_out": False, "slurm": {
                       "job": "41", "state": "CANCELLED by 0", "reason": "None", "exit_code": "0:15"}}))
    record = parse_log(log)
    assert (record["status"], record["reasons"]) == ("failed", ["Slurm job 41 CANCELLED by 0 (sacct)"])
    assert record["evidence"] == "srun: error: n2: task 1: Killed"


def test_a_links_job_runs_in_a_round_after_the_jobs_before_it_on_both_of_its_nodes():
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    plan = fleetplan.plan_batch({f"n{i}": fleet.NodeState(f"n{i}", "idle") for i in range(1, 8)})
    jobs = fleetjobs.FleetJobs(config, plan, "results/fleet")
    assert len(jobs.runs) == plan.jobs == 7 + 7 + 4
    rounds = fleetrounds.FleetRounds(jobs, plan)
    round_of = {job: held.round for held in rounds.held for job in held.jobs}
    for node in plan.nodes:
        # This node's jobs in the order they may run: its own, then its links round by round, each in a later
        # round, and a round waits for every allocation of the one before (fleetrounds: a barrier).
        chain = [("node", node)] + [("link", fleetplan.link_name(fleetplan.in_order(pair)))
                                    for taken in plan.rounds for pair in taken if node in pair]
        assert [round_of[job] for job in chain] == sorted({round_of[job] for job in chain}), (node, chain)
    for held in rounds.held[1:]:
        before = [other for other in rounds.held if other.round == held.round - 1]
        assert rounds.waits_for(held) == [rounds.outputs(other)["logs"][0] for other in before]
    repetitions = config["validation"]["repetitions"]
    # Each link over the fabric whole, then over each of its two rails alone.
    assert jobs.logs(("link", "n1+n2")) == [f"results/fleet/runs/netbench_bare-metal_{fabric}_2x1_on_n1+n2_rep{rep}.log"
                                            for rep in range(1, repetitions + 1)
                                            for fabric in ("fast", "fast.fast0", "fast.fast1")]
    assert len(jobs.records()) == (7 * 2 + 11 * 3) * repetitions and jobs.records()[0].endswith("_on_n1_rep1.json")


def test_half_the_fleets_figure_fails_however_wide_a_small_fleets_spread():
    # Three links between good nodes, one of them crippled: it widens the MAD it is measured against
    # (figures the test cluster measured with a 20 Mbit/s cap on n1+n2), and its z stays small.
    variable = "netbench/bare-metal/fast/2x1/allreduce_busbw_GBps@1048576"
    latency = "netbench/bare-metal/fast/2x1/pingpong_latency_us@1"
    values = pd.DataFrame({"variable": [variable] * 3 + [latency] * 3, "value": [0.001, 3.125, 2.382, 5.5, 5.2, 5.4]})
    judged = fleetstats.robust_deviation(values, 0.10)
    assert judged["robust_z"].iloc[0] > -fleetstats.ROBUST_Z_LIMIT and judged["worse"].tolist() == [
        True, False, False, False, False, False]
    judged = fleetstats.robust_deviation(values.assign(value=[0.001, 3.125, 2.382, 11.0, 5.2, 5.4]), 0.10)
    assert judged["worse"].tolist() == [True, False, False, True, False, False]  # latency over twice the median


# Intra-node ping-pong at 1 MiB (here: the largest size recorded) between two ranks of one 2-vCPU
# Firecracker VM (AMD EPYC), idle, bound or not, TCP or shared memory, measured back to back on
# 2026-11-27: the host moves the vCPUs, and the figure sits near 8,600, 3,500 or 1,650 MB/s for 10 to
# 60 s at a time. Four "nodes" on that one machine.
VM_PHASES = {"n1": (8600, 1650, 3500), "n2": (1650, 1690, 1700), "n3": (8500, 8650, 1650), "n4": (3500, 8600, 8700)}


def vm_fleet(recorded_runs, phases, compute=None):
    """A fleet whose intra-node ping-pong bandwidth at each repetition is `phases[node][repetition - 1]`."""
    plan = fleetplan.plan_batch({node: fleet.NodeState(node, "idle") for node in phases})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute=compute)
    for record in records:
        hosts = record["result"]["hostnames"]
        if record["kind"] == "netbench" and len(set(hosts)) == 1:
            largest = record["result"]["pingpong"][-1]
            largest["bandwidth_MBps"] = phases[hosts[0]][record["spec"]["repetition"] - 1]
    return plan, records


def test_a_figure_that_does_not_repeat_on_one_node_is_not_judged_against_the_fleet(recorded_runs):
    plan, records = vm_fleet(recorded_runs, VM_PHASES)
    verdict = fleet.judge(records, plan, min_shortfall=0.10)
    # n2's three repetitions fell in the low phase: 65% under the fleet median, which alone would fail it.
    assert verdict.failed_nodes == [] and verdict.bad_links == []
    nodes = verdict.nodes.set_index("node")
    bandwidth = nodes[nodes["variable"].str.contains("/1x2/pingpong_bandwidth_MBps@")]
    assert bandwidth.loc["n2", "deviation_percent"] < -50 and set(bandwidth["result"]) == {fleetstats.UNJUDGED}
    # Each node's spread is its range in % of its median; the repeatability, their median over the batch.
    assert bandwidth.loc["n2", "spread_percent"] == pytest.approx(100 * 50 / 1690)
    assert bandwidth["repeatability_percent"].iloc[0] == pytest.approx(
        pd.Series([100 * 6950 / 3500, 100 * 50 / 1690, 100 * 7000 / 8500, 100 * 5200 / 8600]).median())
    assert "not judged against the fleet" in bandwidth.loc["n2", "reason"]
    # The verdict says which figure it did not compare, and why; the ones that repeat are judged as ever.
    unjudged = verdict.summary[verdict.summary["kind"] == "variable"]
    assert unjudged["member"].tolist() == [bandwidth["variable"].iloc[0]]
    assert unjudged["reason"].iloc[0].startswith("repetitions of one member differ by ")
    assert "too coarse to resolve the 10% shortfall" in fleetexport.format_verdict(verdict)
    rate = nodes[nodes["variable"].str.endswith("/images_per_sec")]
    assert set(rate["result"]) == {"pass"} and rate["repeatability_percent"].max() < 10


def test_a_node_under_half_the_others_worst_fails_however_noisy_the_figure(recorded_runs):
    # A node whose best repetition is a tenth of what the others reach at their worst: noise cannot explain it.
    phases = {**VM_PHASES, "n2": (165, 170, 160)}
    plan, records = vm_fleet(recorded_runs, phases, compute={"n3": 0.7})
    verdict = fleet.judge(records, plan, min_shortfall=0.10)
    assert verdict.failed_nodes == ["n2", "n3"]
    summary = verdict.summary.set_index("member")
    assert "even its best repetition under half the others' worst" in summary.loc["n2", "reason"]
    assert summary.loc["n3", "reason"].startswith("images_per_sec ")  # a figure that repeats: judged as ever


def test_a_batch_runs_in_rounds_each_in_a_few_allocations_that_hold_many_nodes(tmp_path):
    """Issue 33 item 1: the node jobs all at once, then the links in rounds of disjoint pairs, each round's jobs
    sharing allocations of validation.nodes_per_allocation nodes, every job on its own nodes: a thousand nodes cost
    16 Slurm submissions in 4 rounds rather than 2,560, and about 4 jobs' time."""
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["validation"].update(nodes_per_allocation=256, max_jobs=4)
    thousand = fleetplan.plan_batch({f"n{i:04d}": fleet.NodeState(f"n{i:04d}", "idle") for i in range(1, 1025)})
    held = fleetrounds.round_allocations(thousand, 256)
    assert len(held) == 16 and len(thousand.rounds) == 3
    assert [each.name for each in held[:5]] == ["nodes-1", "nodes-2", "nodes-3", "nodes-4", "links1-1"]
    jobs = [job for each in held for job in each.jobs]
    assert sorted(jobs) == sorted([("node", name) for name in thousand.nodes]
                                  + [("link", fleetplan.link_name(pair)) for pair in thousand.links])
    for each in held:  # no node twice in an allocation, nor in a round: one job a node at a time
        assert len(each.nodes) == len(set(each.nodes)) <= 256
        same_round = [node for other in held if other.round == each.round for node in other.nodes]
        assert len(same_round) == len(set(same_round))
    assert {each.round for each in held if each.jobs[0][0] == "link"} == {1, 2, 3}
    # A link is never split, and an allocation holds one job at least, however few nodes it may hold.
    four = fleetplan.plan_batch({f"n{i}": fleet.NodeState(f"n{i}", "idle") for i in range(1, 5)})
    assert [len(each.jobs) for each in fleetrounds.round_allocations(four, 3)] == [3, 1, 1, 1, 1, 1, 1, 1]
    assert len(fleetrounds.round_allocations(four, 1)) == 4 + 6  # the test cluster's: one job an allocation

    config["validation"]["nodes_per_allocation"] = 4
    rounds = fleetrounds.FleetRounds(fleetjobs.FleetJobs(config, four, str(tmp_path / "fleet")), four)
    first, links = rounds.held[0], rounds.held[1]
    assert (first.name, first.rule, first.nodes) == ("nodes-1", "fleet_nodes_1", ("n1", "n2", "n3", "n4"))
    assert (links.name, links.rule, links.jobs) == ("links1-1", "fleet_links1_1",
                                                    (("link", "n1+n2"), ("link", "n3+n4")))
    # salloc(1) OPTIONS: --nodelist, --exclusive, --time in minutes; -k, --no-kill: "Do not automatically terminate a
    # job if one of the nodes it has been allocated fails" (the other jobs of the allocation run on). The time is the
    # longest of its jobs', which run at once.
    minutes = rounds.jobs.time_limit(("node", "n1"))
    assert rounds.salloc(first) == [
        "salloc", "--nodes=4", "--nodelist=n1,n2,n3,n4", "--exclusive", "--ntasks-per-node=2", "--cpus-per-task=1",
        f"--time={minutes}", "--job-name=containerbench-fleet-nodes-1", "--partition=cpu",
        "--account=cbtest-account", "--no-kill"]
    # Its outputs are every file of its jobs; a round waits for every allocation of the one before.
    assert rounds.outputs(first)["logs"] == [log for node in four.nodes for log in rounds.jobs.logs(("node", node))]
    assert rounds.outputs(first)["hardware"] == [rounds.jobs.hardware_report(node) for node in four.nodes]
    assert "hardware" not in rounds.outputs(links)
    assert rounds.waits_for(first) == [] and rounds.waits_for(links) == [rounds.jobs.logs(("node", "n1"))[0]]
    rounds.jobs.write(four, tmp_path / "plan.json")
    rounds.write()
    written = json.loads(Path(rounds.file(links)).read_text())
    assert written == {"name": "links1-1", "allocation": rounds.salloc(links),
                       "jobs": [rounds.jobs.job_file(("link", "n1+n2")), rounds.jobs.job_file(("link", "n3+n4"))]}
    # Each run's steps pinned to its job's own nodes (srun(1) -w, --nodelist), the ranks' and the steps before
    # them on each node: the allocation holds the round's other jobs too.
    job = json.loads(Path(rounds.jobs.job_file(("link", "n1+n2"))).read_text())
    argv = job["plans"][0]["argv"]
    assert argv[:4] == ["srun", "--mpi=pmix", "--nodes=2", "--nodelist=n1,n2"], argv
    node_job = json.loads(Path(rounds.jobs.job_file(("node", "n3"))).read_text())
    assert "--nodelist=n3" in node_job["hardware"]["argv"]
    assert all("--nodelist=n3" in run_plan["argv"] for run_plan in node_job["plans"])


def test_what_validating_a_batch_costs_is_its_jobs_held_to_their_time_limits():
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    plan = fleetplan.plan_batch({f"n{i}": fleet.NodeState(f"n{i}", "idle") for i in range(1, 8)})
    jobs = fleetjobs.FleetJobs(config, plan, "results/fleet")
    node_minutes = fleetjobs.allocation_minutes(config, jobs.runs[("node", "n1")]) + fleetjobs.hardware_minutes(config)
    link_minutes = fleetjobs.allocation_minutes(config, jobs.runs[("link", "n1+n2")])
    lines = fleetrounds.FleetRounds(jobs, plan).cost_summary().splitlines()
    # The test cluster's: one job an allocation, one allocation at a time (its nodes share this machine's cores).
    assert lines[:4] == [
        "What validating the batch costs:", "  jobs         7 node jobs and 11 link jobs, each holding its nodes "
        "exclusively",
        f"  allocations  18 in {1 + len(plan.rounds)} rounds (the node jobs, then the links round by round), each of "
        "at most 1 node (validation.nodes_per_allocation) with every job on its own nodes at once, at most 1 at a "
        "time (validation.max_jobs)",
        f"  wall time    at most {7 * node_minutes + 11 * link_minutes:,} minutes: each round after the one before, "
        "every job to its time limit"]
    lines = lines[:2] + lines[4:]
    assert lines[2] == f"  runs         {7 * 6 + 11 * 3 * 3}: each job's runs, validation.repetitions = 3"  # 2 rails
    timeouts = f"benchmark.timeout_s = 600 s, netbench.timeout_s = {config['netbench']['timeout_s']} s"
    worst = (7 * node_minutes + 11 * 2 * link_minutes) / 60
    assert lines[3:] == [
        f"  worst case   {worst:,.0f} node-hours: every job to its time limit",
        f"  time limit   node jobs {node_minutes} minutes: the runs' timeouts, {timeouts}, as no earlier ok run of "
        "their benchmarks on as many nodes tells how long they take (the calibrate target makes them); and the "
        f"hardware step's {fleetjobs.hardware_minutes(config)} (validation.hardware.timeout_s a tool)",
        f"  time limit   link jobs {link_minutes} minutes: the runs' timeouts, {timeouts}, as no earlier ok run of "
        "their benchmarks on as many nodes tells how long they take (the calibrate target makes them)"]


def test_a_jobs_time_limit_is_its_runs_deadlines_from_their_expected_times_where_records_tell(tmp_path,
                                                                                               recorded_runs):
    import math

    from containerbench.slurm import ALLOCATION_SLACK_MINUTES

    # The recorded runs' own config (one node, 1 and 2 ranks) validating two nodes: each node's job trains on
    # 2 ranks and runs the 2-rank netbench, both recorded on one node; a link's job runs the netbench on two
    # nodes, never recorded on two: its traffic is not known, so it keeps its timeouts.
    config = tiny_config(tmp_path, validation={"nodes": "n[1-2]", "repetitions": 2, "link_training": False})
    plan = fleetplan.plan_batch({node: fleet.NodeState(node, "idle") for node in ("n1", "n2")})
    records = list(recorded_runs.values())
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"), records, "the recorded runs")
    walls = [recorded_runs[("train", 2)]["wall_s"], recorded_runs[("netbench", 2)]["wall_s"]] * 2
    assert jobs.expected_s == {"node": pytest.approx(walls)}
    # Each run: 3 times its expected time (the default factor), at least 5 minutes more, at most its timeout.
    timeouts = [config["benchmark"]["timeout_s"], config["netbench"]["timeout_s"]] * 2
    deadlines = [min(timeout, max(3 * wall, wall + 300)) for timeout, wall in zip(timeouts, walls)]
    assert jobs.deadlines(("node", "n2")) == pytest.approx(deadlines)
    # And a node's job holds its node for its hardware step too, at most each tool's timeout, as srun's --time.
    step = fleetjobs.hardware_minutes(config)
    minutes = math.ceil(math.ceil(sum(deadlines)) / 60) + ALLOCATION_SLACK_MINUTES * 4 + step
    assert minutes < fleetjobs.allocation_minutes(config, jobs.runs[("node", "n1")]) + step
    assert f"--time={minutes}" in jobs.allocation(("node", "n2")) and jobs.time_limit(("node", "n1")) == minutes
    worst_link = fleetjobs.allocation_minutes(config, jobs.runs[("link", "n1+n2")])
    assert f"--time={worst_link}" in jobs.allocation(("link", "n1+n2"))
    # The deadlines are the runs' own timeouts in the job's file: a run over it ends alone, the next still run.
    jobs.write(plan, tmp_path / "plan.json")
    written = json.loads(Path(jobs.job_file(("node", "n1"))).read_text())
    assert [run_plan["timeout_s"] for run_plan in written["plans"]] == pytest.approx(deadlines)
    lines = jobs.cost_summary().splitlines()
    assert (f"  time limit   node jobs {minutes} minutes: each run 3 x its expected time "
            f"(validation.time_limit_factor), at least 5 minutes more; the runs' expected {sum(walls) / 60:.1f} in "
            f"all, + {ALLOCATION_SLACK_MINUTES} a run; and the hardware step's {step} (validation.hardware.timeout_s "
            "a tool)") in lines
    assert not any(line.startswith("  expected") for line in lines)  # the link jobs' runs have no figure
    # A factor that makes the deadlines longer than the runs' timeouts gives the timeouts.
    config["validation"]["time_limit_factor"] = 1000
    jobs = fleetjobs.FleetJobs(config, plan, "results/fleet", records, "the recorded runs")
    assert jobs.time_limit(("node", "n1")) == fleetjobs.allocation_minutes(config, jobs.runs[("node", "n1")]) + step


@pytest.mark.parametrize("name", ["n1;rm -rf /", "n1 n2", "../n1", "n1+n2", "-n1", "$(reboot)", ""])
def test_a_node_name_that_is_not_a_hostname_is_refused_in_one_line(name):
    # Names go into file names, Snakemake wildcards, '+'-joined link names and scontrol drain lines.
    with pytest.raises(fleetplan.FleetError) as refused:
        fleetplan.plan_batch({"n0": fleet.NodeState("n0", "idle"), name: fleet.NodeState(name, "idle")})
    assert str(refused.value) == f"Slurm names node {name!r}; allowed: {fleetplan.NODE_NAME_ALLOWED}"


def edited(plan: dict, change) -> dict:
    change(plan)
    return plan


@pytest.mark.parametrize("change, why", [
    (lambda plan: plan["nodes"].append("n1"), "node 'n1' is in nodes twice"),
    (lambda plan: plan["unavailable"].update({"n2": {"state": "down", "reason": ""}}),
     "node 'n2' is in nodes and unavailable twice"),
    (lambda plan: plan["nodes"].append("n5;reboot"), "the plan names node 'n5;reboot'; allowed: "),
    (lambda plan: plan["links"].append(["n1", "n9"]), "link ['n1', 'n9'] is not two different nodes of its 'nodes'"),
    (lambda plan: plan["links"].append(["n3", "n3"]), "link ['n3', 'n3'] is not two different nodes"),
    (lambda plan: plan["links"].append(list(reversed(plan["links"][0]))), "a link is in 'links' twice"),
    (lambda plan: plan["rounds"].pop(), "its 'rounds' do not hold each of its 'links' once"),
    (lambda plan: plan.update(rounds=[[pair for taken in plan["rounds"] for pair in taken]]),
     "a round gives a node two jobs at once: "),
    (lambda plan: plan["rounds"].insert(1, []), "its 'rounds' hold an empty round"),
    (lambda plan: plan.pop("links"), "'links'"),
])
def test_a_plan_edited_into_one_no_planning_makes_is_refused_in_one_line_and_nothing_is_written(tmp_path, change,
                                                                                               why):
    plan = fleetplan.plan_batch({f"n{i}": fleet.NodeState(f"n{i}", "idle") for i in range(1, 5)})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edited(plan.as_dict(), change)))
    done = subprocess.run([sys.executable, "-m", "containerbench", "fleet", "judge", "--plan", str(path),
                           "--out-dir", str(tmp_path / "verdict"), str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"containerbench: fleet: --plan = {str(path)!r} is not a readable plan (")
    assert why in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "verdict").exists()


def test_a_suspect_is_measured_again_and_fails_only_if_the_second_measurement_fails_it_too(recorded_runs):
    """The second pass (issue 33): a healthy node that met a moment's noise in the first pass (here 40%
    slower in all three repetitions, as a neighbour or a hypervisor's vCPU move can make it) and is within
    the fleet when measured again is not failed or drained; a slow node slow again is, the figure confirmed."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n02": 0.6, "n04": 0.6})
    assert fleet.suspects(records, plan) == ["n02", "n04"]
    # Their jobs again, as the repetitions after the first pass's (fleetjobs.recheck_runs): n04 still slow.
    again = [on_nodes(recorded_runs[("train", 1)], [node], repetition, factor)
             for node, factor in (("n02", 1.0), ("n04", 0.6)) for repetition in (4, 5, 6)]
    verdict = fleet.judge(records, plan, rechecked=again)
    assert verdict.failed_nodes == ["n04"]
    summary = verdict.summary.set_index("member")
    assert summary.loc["n02", "result"] == "pass"
    assert re.fullmatch(r"not repeated: images_per_sec [\d.]+ \S+, 40% below the fleet median .+; measured "
                        r"again later: [\d.]+ \S+, [01]% (above|below) the first pass's median: within the fleet",
                        summary.loc["n02", "reason"]), summary.loc["n02", "reason"]
    assert summary.loc["n04", "reason"].endswith("40% below the first pass's median: confirmed")
    rows = verdict.nodes.set_index("node")
    train = rows["variable"].str.startswith("train/")
    assert rows[train].loc["n02", "result"] == fleetstats.NOT_REPEATED and rows[train].loc["n04", "result"] == "fail"
    assert rows[train].loc["n02", "recheck_value"] > rows[train].loc["n04", "recheck_value"]
    assert rows[train].drop(["n02", "n04"])["recheck_value"].isna().all()
    drain = fleetexport.format_drain_list(verdict)
    assert "n02" not in drain and "NodeName=n04" in drain
    # Its links were judged with n02 among the healthy: none is blamed on it.
    assert not summary.loc[[m for m in summary.index if "n02" in m and "+" in m], "reason"].str.contains("n02").any()
    # Without a second measurement the first pass decides, as before.
    assert fleet.judge(records, plan).failed_nodes == ["n02", "n04"]
    # A second measurement that did not run whole is no evidence of health: the first pass's verdict stands.
    crashed = [dict(record, status="failed", reasons=["Slurm: NODE_FAIL (sacct)"]) if record["result"]["hostnames"]
               == ["n02"] and record["spec"]["repetition"] == 6 else record for record in again]
    summary = fleet.judge(records, plan, rechecked=crashed).summary.set_index("member")
    assert summary.loc["n02", "result"] == "fail"
    assert summary.loc["n02", "reason"].endswith(
        "; measured again: train_bare-metal_tcp-loopback_1x1_b2_n02_rep6 failed: Slurm: NODE_FAIL (sacct)"), summary
    # One whose results could not be read back says nothing of the node's health, as in the first pass: where
    # some could, they decide; where none could, the first pass's verdict stands, and says why.
    def unreadable(repetitions):
        return [dict(record, status="failed", reasons=["result unreadable: a part missing"])
                if record["result"]["hostnames"] == ["n02"] and record["spec"]["repetition"] in repetitions
                else record for record in again]
    assert fleet.judge(records, plan, rechecked=unreadable({6})).failed_nodes == ["n04"]
    summary = fleet.judge(records, plan, rechecked=unreadable({4, 5, 6})).summary.set_index("member")
    assert summary.loc["n02", "result"] == "fail" and "; measured again: " in summary.loc["n02", "reason"]
    assert summary.loc["n02", "reason"].endswith("_rep6 unreadable (the launcher's output cut it): not judged, "
                                                 "run it again")
    # And one that left no record at all: no figure of it.
    summary = fleet.judge(records, plan, rechecked=[r for r in again if r["result"]["hostnames"] != ["n02"]]
                          ).summary.set_index("member")
    assert summary.loc["n02", "result"] == "fail"
    # A node whose runs failed is its own evidence: not a suspect to measure again.
    for record in records:
        if record["result"]["hostnames"] == ["n04"]:
            record.update(status="failed", reasons=["Slurm: NODE_FAIL (sacct)"])
    assert fleet.suspects(records, plan) == ["n02"]


def test_a_slow_link_of_a_node_whose_slowness_was_not_repeated_is_not_blamed_on_the_link(recorded_runs):
    """n02 was slow, in its node's job and in one link, during the first pass, and is within the fleet when
    measured again: the link was measured in that pass too, so it is not called a bad cable; unjudged."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    link = next(pair for pair in plan.links if "n02" in pair)
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n02": 0.6}, slow_links={link: 0.4})
    again = [on_nodes(recorded_runs[("train", 1)], ["n02"], repetition, 1.0) for repetition in (4, 5, 6)]
    assert fleet.judge(records, plan).summary.set_index("member").loc["+".join(link), "result"] == "explained"
    verdict = fleet.judge(records, plan, rechecked=again)
    summary = verdict.summary.set_index("member")
    assert verdict.failed_nodes == [] and verdict.bad_links == [] and not verdict.failed
    assert summary.loc["+".join(link), "result"] == fleetstats.UNJUDGED
    assert summary.loc["+".join(link), "reason"].endswith(
        "; not judged: its end n02 was slow in the first pass and not when measured again, and the link was "
        "measured in that pass")
    # The second pass settles it (fleet.relinks, after n02's second measurement): the link measured again, slow
    # again, with both of its ends within the fleet with new partners is the link itself, n02 a moment's noise.
    assert fleet.suspects(records, plan) == ["n02"]
    members = fleet.relinks(records, plan, rechecked=again)
    assert members[0] == "+".join(link) and len(members) == 3
    verdict = fleet.judge(records, plan, rechecked=again + links_again(
        recorded_runs, {member: 0.4 if member == "+".join(link) else 1.0 for member in members}))
    assert verdict.failed_nodes == [] and verdict.bad_links == ["+".join(link)]


def links_again(recorded_runs, factors: dict[str, float], repetitions=(4, 5, 6)) -> list[dict]:
    """Second measurements of links (fleetjobs.relink_runs: the repetitions after the first pass's), each
    link's netbench scaled by its factor."""
    return [on_nodes(recorded_runs[("netbench", 2)], link.split("+"), repetition, factor)
            for link, factor in factors.items() for repetition in repetitions]


def test_a_slow_link_no_end_explains_is_measured_again_with_its_ends_re_paired(recorded_runs):
    """Item 4 of issue 33 for links, as Google's Cluster Health Scanner does it: a slow link whose ends are fine
    elsewhere is measured again, and each end is paired with a node that passed and is the end of no such link (one
    not linked to it in the plan first). Slow again with both re-pairings fine: the link itself; fine when
    measured again: a moment's noise, passed; slow again and one end slow with its new partner too: that end."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("n02", "n03"): 0.4})
    # No node is a suspect; after their second measurements (none), n02 (linked to n01, n03 and n05 in the plan)
    # meets n04, and n03 (n02, n04, n06) meets n01.
    assert fleet.suspects(records, plan) == []
    assert fleet.relinks(records, plan) == ["n02+n03", "n02+n04", "n01+n03"]
    cable = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {"n02+n03": 0.4, "n02+n04": 1.0,
                                                                              "n01+n03": 1.0}))
    assert cable.bad_links == ["n02+n03"] and cable.failed_nodes == []
    reason = cable.summary.set_index("member").loc["n02+n03", "reason"]
    assert re.search(r"; measured again later: .*pingpong_bandwidth_MBps [\d.]+ MB/s \(6\d% below the first pass's "
                     r"median\)", reason), reason
    assert reason.endswith("): confirmed; re-paired, n02 with n04 and n03 with n01 within the fleet: the link itself "
                           "(a cable, a switch port)")
    # A pairing whose runs failed tells nothing of its end: the link fails, confirmed, without being called the
    # link itself, and says why.
    failed_pairing = [dict(record, status="failed", reasons=["exit 1"])
                      if record["spec"]["nodelist"] == ["n02", "n04"] else record
                      for record in links_again(recorded_runs, {"n02+n03": 0.4, "n02+n04": 1.0, "n01+n03": 1.0})]
    row = fleet.judge(records, plan, rechecked=failed_pairing).summary.set_index("member").loc["n02+n03"]
    assert row["result"] == "fail" and row["reason"].endswith(
        ": confirmed; re-paired, n03 with n01 within the fleet; n02 re-paired with n04: "
        "netbench_bare-metal_tcp-loopback_1x2_n02-n04_rep4 and 2 more failed: exit 1"), row["reason"]
    noise = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {"n02+n03": 1.0, "n02+n04": 1.0,
                                                                             "n01+n03": 1.0}))
    assert not noise.failed
    row = noise.summary.set_index("member").loc["n02+n03"]
    assert row["result"] == "pass" and row["reason"].startswith("not repeated: ")
    assert row["reason"].endswith("the first pass's median): within the fleet; re-paired, n02 with n04 and n03 with "
                                  "n01 within the fleet")
    assert not noise.links.loc[noise.links["link"] == "n02+n03", "slow"].any()  # not crossed on the page
    nic = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {"n02+n03": 0.4, "n02+n04": 0.4,
                                                                           "n01+n03": 1.0}))
    assert nic.failed_nodes == ["n02"] and nic.bad_links == []
    summary = nic.summary.set_index("member")
    assert summary.loc["n02+n03", "result"] == "explained" and summary.loc["n02+n03", "reason"] == "node n02 failed"
    assert summary.loc["n02", "reason"] == ("slow again in link n02+n03 and re-paired with n04, which passed: its own "
                                            "network (its HCA, port or cable)")
    # A slow link's end that failed on its own evidence explains it: nothing to settle, nothing measured again.
    failed_end = [dict(record, status="failed", reasons=["exit 1"]) if record["result"]["hostnames"] == ["n02"]
                  else record for record in records]
    assert fleet.relinks(failed_end, plan) == []


def test_a_link_measured_again_is_judged_only_on_what_came_back(recorded_runs):
    """The second pass's edge cases (a review of it): another slow link sharing an end is no pairing of that
    end; a second measurement that failed, or lacks a slow figure, settles nothing and says so; a failed
    pairing leaves its end untold; one partner slow with both ends blames neither."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    # n02 slow in two of its three links: no culprit, both links ambiguous; n01, n04 and n06 passed and are the
    # end of neither: n02 meets n04 and then n06 (not linked to it in the plan), n03 and n05 meet n01.
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("n02", "n03"): 0.4,
                                                                               ("n02", "n05"): 0.4})
    members = fleet.relinks(records, plan)
    assert members == ["n02+n03", "n02+n04", "n01+n03", "n02+n05", "n02+n06", "n01+n05"]
    again = links_again(recorded_runs, {member: 0.4 if member in ("n02+n03", "n02+n05") else 1.0
                                        for member in members})
    verdict = fleet.judge(records, plan, rechecked=again)
    assert verdict.failed_nodes == [] and verdict.bad_links == ["n02+n03", "n02+n05"]
    assert all(reason.endswith("within the fleet: the link itself (a cable, a switch port)")
               for reason in verdict.summary.set_index("member").loc[["n02+n03", "n02+n05"], "reason"])
    # The link's second runs failed: the first pass's verdict stands (the link itself), and says why.
    crashed = [dict(record, status="failed", reasons=["Slurm: NODE_FAIL (sacct)"])
               if record["spec"]["nodelist"] == ["n02", "n03"] else record for record in again]
    summary = fleet.judge(records, plan, rechecked=crashed).summary.set_index("member")
    assert summary.loc["n02+n03", "result"] == "fail" and "; measured again: " in summary.loc["n02+n03", "reason"]
    assert summary.loc["n02+n03", "reason"].endswith("failed: Slurm: NODE_FAIL (sacct); re-paired, n02 with n04 and "
                                                     "n06 and n03 with n01 within the fleet")
    # A slow figure not measured again settles nothing either: not passed on the others' word.
    partial = [record for record in again if not (record["spec"]["nodelist"] == ["n02", "n03"]
                                                  and record["spec"]["repetition"] > 4)]
    for record in partial:
        if record["spec"]["nodelist"] == ["n02", "n03"]:
            record["result"]["pingpong"] = []
    summary = fleet.judge(records, plan, rechecked=partial).summary.set_index("member")
    assert summary.loc["n02+n03", "result"] == "fail"
    assert "; measured again: no figure of " in summary.loc["n02+n03", "reason"]
    # Both ends slow with the one partner they share: that partner is the common factor, neither end is blamed.
    small = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES[:3]})  # a ring of three
    records = fleet_records(recorded_runs, small.nodes, small.links, slow_links={("n01", "n02"): 0.4})
    members = fleet.relinks(records, small)
    assert members == ["n01+n02", "n01+n03", "n02+n03"]  # n03, the one node that passed, meets both ends
    partner = {"n03"}
    verdict = fleet.judge(records, small, rechecked=links_again(recorded_runs, dict.fromkeys(members, 0.4)))
    assert verdict.failed_nodes == [] and verdict.bad_links == ["n01+n02"]
    assert verdict.summary.set_index("member").loc["n01+n02", "reason"].endswith(
        f"{partner.pop()}, re-paired with n01 and n02, slow with each: the partner they share is the common factor, "
        "which end is not told")


def test_an_end_is_blamed_only_when_slow_with_every_node_that_passed_it_was_re_paired_with(recorded_runs):
    """The second pass's pairings, read whatever the link did when measured again (a review of it): an end slow
    with its new partner is to blame even where the link came back within the fleet, or failed; an end slow with
    one partner and within the fleet with another is not told, nor is one slow with a partner that was slow with
    another link's end too; a pairing with records and no figure is untold, as is a link's."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("n02", "n03"): 0.4})
    assert fleet.relinks(records, plan) == ["n02+n03", "n02+n04", "n01+n03"]
    # Within the fleet again, and n02 slow with n04: n02's network, now and then; the link is explained by it.
    verdict = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {"n02+n03": 1.0, "n02+n04": 0.4,
                                                                                "n01+n03": 1.0}))
    summary = verdict.summary.set_index("member")
    assert verdict.failed_nodes == ["n02"] and verdict.bad_links == []
    assert summary.loc["n02", "reason"] == ("slow in link n02+n03 (not when it was measured again) and re-paired with "
                                            "n04, which passed: its own network (its HCA, port or cable)")
    assert summary.loc["n02+n03", "result"] == "explained"
    assert verdict.links.loc[verdict.links["link"] == "n02+n03", "blamed_on"].eq("n02").all()
    # The link's second runs failed: its ends' pairings still tell.
    crashed = [dict(record, status="failed", reasons=["exit 1"]) if record["spec"]["nodelist"] == ["n02", "n03"]
               else record for record in links_again(recorded_runs, {"n02+n03": 0.4, "n02+n04": 0.4, "n01+n03": 1.0})]
    verdict = fleet.judge(records, plan, rechecked=crashed)
    assert verdict.failed_nodes == ["n02"] and verdict.summary.set_index("member").loc["n02", "reason"].startswith(
        "slow in link n02+n03 and re-paired with n04, which passed")
    # Records without a figure, of the link and of a pairing: nothing settled, the first pass's verdict stands
    # (the link itself, not re-paired fine at both ends), and the reason says which figures are missing.
    blank = links_again(recorded_runs, {"n02+n03": 0.4, "n02+n04": 1.0, "n01+n03": 1.0})
    for record in blank:
        if record["spec"]["nodelist"] in (["n02", "n03"], ["n01", "n03"]):
            record["result"].update(pingpong=[], allreduce=[])
    row = fleet.judge(records, plan, rechecked=blank).summary.set_index("member").loc["n02+n03"]
    assert row["result"] == "fail" and "; measured again: no figure of " in row["reason"]
    assert "; re-paired, n02 with n04 within the fleet; n03 re-paired with n01: no figure of " in row["reason"], row
    # n02 slow in two links, each measured again slow: re-paired slow with n04 and within the fleet with n06, it is
    # not told; the links fail, blamed on no one (not the link itself either).
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("n02", "n03"): 0.4,
                                                                               ("n02", "n05"): 0.4})
    members = fleet.relinks(records, plan)
    assert members == ["n02+n03", "n02+n04", "n01+n03", "n02+n05", "n02+n06", "n01+n05"]
    verdict = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {
        member: 0.4 if member in ("n02+n03", "n02+n05", "n02+n04") else 1.0 for member in members}))
    assert verdict.failed_nodes == [] and verdict.bad_links == ["n02+n03", "n02+n05"]
    assert "; n02 slow re-paired with n04, within the fleet with n06: n02 not told" in (
        verdict.summary.set_index("member").loc["n02+n03", "reason"])
    assert verdict.links.loc[verdict.links["link"].isin(["n02+n03", "n02+n05"]), "blamed_on"].eq("").all()
    # Slow with n04, and its pairing with n06 told nothing (its runs failed): not told either.
    failed_pairing = [dict(record, status="failed", reasons=["exit 1"]) if record["spec"]["nodelist"] == ["n02", "n06"]
                      else record for record in links_again(recorded_runs, {
                          member: 0.4 if member in ("n02+n03", "n02+n05", "n02+n04") else 1.0 for member in members})]
    verdict = fleet.judge(records, plan, rechecked=failed_pairing)
    assert verdict.failed_nodes == [] and "; n02 slow re-paired with n04: n02 not told" in (
        verdict.summary.set_index("member").loc["n02+n03", "reason"])
    # Two links whose ends share no node, and the partner n04 slow with an end of each: n04 is the common
    # factor, and neither end is blamed. The ends of one link meet different partners where there are two.
    records = fleet_records(recorded_runs, plan.nodes, plan.links, slow_links={("n02", "n03"): 0.4,
                                                                               ("n05", "n06"): 0.4})
    members = fleet.relinks(records, plan)
    assert members == ["n02+n03", "n02+n04", "n01+n03", "n05+n06", "n01+n05", "n04+n06"]
    verdict = fleet.judge(records, plan, rechecked=links_again(recorded_runs, {
        member: 0.4 if member in ("n02+n03", "n05+n06", "n02+n04", "n04+n06") else 1.0 for member in members}))
    assert verdict.failed_nodes == [] and verdict.bad_links == ["n02+n03", "n05+n06"]
    assert verdict.summary.set_index("member").loc["n05+n06", "reason"].endswith(
        "; re-paired, n05 with n01 within the fleet; n04, re-paired with n02 and n06, slow with each: the partner "
        "they share is the common factor, which end is not told")


def test_a_node_slow_in_everything_in_the_first_pass_only_is_not_drained_through_its_links(recorded_runs):
    """n02 was slow in its node's job and in all three of its links during the first pass (an episode that
    lasted), and is within the fleet when measured again: its links, measured in that pass, are unjudged,
    and it is not made the culprit of them."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n02": 0.6}, network={"n02": 0.6})
    assert fleet.judge(records, plan).failed_nodes == ["n02"]
    again = [on_nodes(recorded_runs[("train", 1)], ["n02"], repetition, 1.0) for repetition in (4, 5, 6)]
    verdict = fleet.judge(records, plan, rechecked=again)
    assert not verdict.failed
    summary = verdict.summary.set_index("member")
    links = [member for member in summary.index if "+" in member and "n02" in member.split("+")]
    assert len(links) == 3 and set(summary.loc[links, "result"]) == {fleetstats.UNJUDGED}
    assert not verdict.links.loc[verdict.links["link"].isin(links), "slow"].any()  # not crossed on the page


def test_a_batch_below_its_reference_as_a_whole_is_not_measured_twice(recorded_runs):
    """Only a node failing against the fleet is a suspect: a batch all below the site's reference fails
    on the first pass, as it would again, and is not run a second time whole."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n03": 0.6})
    train = fleet.judge(records, plan).nodes
    variable = train.loc[train["variable"].str.startswith("train/"), "variable"].iloc[0]
    median = train.loc[train["variable"] == variable, "fleet_median"].iloc[0]
    references = {variable: Reference(2 * median, -0.1, None, "img/s")}
    assert set(fleet.judge(records, plan, references).failed_nodes) == set(NODES)
    assert fleet.suspects(records, plan, references) == ["n03"]


def test_a_recheck_is_its_nodes_job_again_as_the_repetitions_after_the_first_pass(tmp_path):
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["validation"].update(repetitions=2)
    assert [run.run_id for run in fleetjobs.recheck_runs(config, "n3")] == [
        "train_bare-metal_fast_1x1_b32_on_n3_rep3", "netbench_bare-metal_fast_1x2_on_n3_rep3",
        "train_bare-metal_fast_1x1_b32_on_n3_rep4", "netbench_bare-metal_fast_1x2_on_n3_rep4"]
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2", "n3")})
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"))
    jobs.write_job(("recheck", "n3"), tmp_path / "recheck" / "node-n3.json")
    written = json.loads((tmp_path / "recheck" / "node-n3.json").read_text())
    # The node's own allocation: its node alone, exclusively, for as long as its runs (the same runs); its
    # hardware was checked in the first pass, and is not again.
    untimed = [word for word in jobs.allocation(("node", "n3")) if not word.startswith("--time=")]
    assert [word for word in written["allocation"] if not word.startswith("--time=")] == untimed
    assert jobs.time_limit(("recheck", "n3")) == jobs.time_limit(("node", "n3")) - fleetjobs.hardware_minutes(config)
    assert f"--time={jobs.time_limit(('recheck', 'n3'))}" in written["allocation"] and "hardware" not in written
    again = fleetjobs.recheck_runs(config, "n3")
    assert written["logs"] == [f"{tmp_path}/fleet/recheck/{run.run_id}.log" for run in again]
    assert [plan["spec"]["repetition"] for plan in written["plans"]] == [3, 3, 4, 4]
    assert jobs.recheck_records(["n3"]) == [log.removesuffix(".log") + ".json" for log in written["logs"]]
    # A slow link's second measurement, or a re-pairing (fleet.links_to_settle, NODE+NODE, planned or not): a
    # link's job again, the repetitions after the first pass's, holding both its nodes, timed as a link's.
    relinked = fleetjobs.relink_runs(config, ("n1", "n3"))
    assert [run.run_id for run in relinked[:3]] == [
        f"netbench_bare-metal_{fabric}_2x1_on_n1+n3_rep3" for fabric in ("fast", "fast.fast0", "fast.fast1")]
    assert [run.repetition for run in relinked] == [3] * 3 + [4] * 3
    assert jobs.job_runs(("recheck", "n1+n3")) == relinked
    jobs.write_job(("recheck", "n1+n3"), tmp_path / "recheck" / "link-n1+n3.json")
    written = json.loads((tmp_path / "recheck" / "link-n1+n3.json").read_text())
    assert "--nodes=2" in written["allocation"] and "--nodelist=n1,n3" in written["allocation"]
    assert jobs.time_limit(("recheck", "n1+n3")) == fleetjobs.allocation_minutes(config, relinked)
    assert written["logs"] == [f"{tmp_path}/fleet/recheck/{run.run_id}.log" for run in relinked]
    assert jobs.recheck_records(["n3", "n1+n3"])[-1] == written["logs"][-1].removesuffix(".log") + ".json"


def in_runtime(record: dict, runtime: str, factor: float) -> dict:
    """A node's training record as if run in `runtime`, its rate scaled by `factor`."""
    moved = copy.deepcopy(record)
    moved["spec"]["runtime"] = runtime
    moved["run_id"] = moved["spec"]["run_id"] = record["run_id"].replace("bare-metal", runtime, 1)
    moved["result"]["images_per_sec"] *= factor
    return moved


def test_a_shortfall_only_in_a_container_is_the_container_path_and_is_not_drained(recorded_runs, tmp_path):
    """Host or image (issue 33): each node's job trains bare metal and in each runtime of the config. n03 is
    40% slow in podman only (as a missing GPUDirect, NCCL plugin or topology file in the image makes it):
    its hardware passed, and the verdict says the container's path failed there, without draining it. n04 is
    as slow bare metal: its hardware, drained."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    records = fleet_records(recorded_runs, plan.nodes, plan.links, compute={"n04": 0.6})
    records += [in_runtime(record, "podman", 0.6 if record["result"]["hostnames"] == ["n03"] else 1.0)
                for record in list(records) if record["kind"] == "train"]
    verdict = fleet.judge(records, plan)
    assert verdict.failed_nodes == ["n04"] and verdict.container_path_nodes == ["n03"] and verdict.failed
    summary = verdict.summary.set_index("member")
    assert summary.loc["n03", "result"] == fleet.CONTAINER_PATH
    assert re.fullmatch(r"images_per_sec [\d.]+ \S+, 40% below the fleet median .+; bare metal on this node "
                        r"[\d.]+ \S+, within the fleet: the container's path, not the node's hardware",
                        summary.loc["n03", "reason"]), summary.loc["n03", "reason"]
    # n04 fails in both, its hardware: a container adds nothing to explain it.
    rows = verdict.nodes[verdict.nodes["node"] == "n04"].set_index("variable")
    assert set(rows.loc[rows.index.str.startswith("train/"), "result"]) == {"fail"}
    drain = fleetexport.format_drain_list(verdict).splitlines()
    assert drain[0].startswith("scontrol update NodeName=n04 State=DRAIN")
    assert drain[1].startswith("# node n03: images_per_sec ") and drain[1].endswith(
        "(the image or the runtime's set-up there: not drained)") and len(drain) == 2
    assert fleetexport.format_verdict(verdict).startswith(
        "fleet: 1 of 6 node(s) failed, 0 of 9 link(s) bad, 1 node(s) failed in a container only (not drained)")
    # The page says so beside the failed nodes' count, as the command line's exit status does.
    fleetexport.write_verdict(verdict, tmp_path)
    fleetreport.render_fleet(tmp_path, tmp_path / "fleet.html", 0.10)
    page = (tmp_path / "fleet.html").read_text()
    assert "1 of 6 node(s) failed" in page and "1 node(s) failed in a container only (not drained)" in page
    # A second measurement is asked for it too: noise in its container runs would look the same.
    assert fleet.suspects(records, plan) == ["n03", "n04"]
    # Measured again, n03 slow in podman still, but its bare-metal run failed: no longer the container's alone.
    again = [in_runtime(on_nodes(recorded_runs[("train", 1)], ["n03"], repetition, 1.0), "podman", 0.6)
             for repetition in (4, 5, 6)]
    again += [dict(on_nodes(recorded_runs[("train", 1)], ["n03"], 4, 1.0), status="failed",
                   reasons=["Slurm: NODE_FAIL (sacct)"])]
    summary = fleet.judge(records, plan, rechecked=again).summary.set_index("member")
    assert summary.loc["n03", "result"] == "fail" and "measured again: " in summary.loc["n03", "reason"]
    # Or its bare-metal figure slow the second time: its hardware after all.
    again = again[:3] + [on_nodes(recorded_runs[("train", 1)], ["n03"], r, 0.6) for r in (4, 5, 6)]
    summary = fleet.judge(records, plan, rechecked=again).summary.set_index("member")
    assert summary.loc["n03", "result"] == "fail"


@pytest.mark.parametrize("variable, bare", [
    ("train/cnn_smoke-128px-fp32/podman/fast/1x1/b32/images_per_sec",
     "train/cnn_smoke-128px-fp32/bare-metal/fast/1x1/b32/images_per_sec"),
    ("train/resnet50-224px-fp32/apptainer (native)/ib/1x4/b64/images_per_sec",
     "train/resnet50-224px-fp32/bare-metal/ib/1x4/b64/images_per_sec"),
    ("netbench/docker/fast/1x2/pingpong_latency_us@1", "netbench/bare-metal/fast/1x2/pingpong_latency_us@1"),
    ("train/cnn_smoke-128px-fp32/bare-metal/fast/1x1/b32/images_per_sec", None),
    ("netbench/bare-metal/fast/1x2/pingpong_latency_us@1", None),
    ("train/resnet50-224px-fp32/bare-metal (native)/ib/1x4/b64/images_per_sec", None)])
def test_a_figures_bare_metal_counterpart_is_its_variable_with_the_runtime_made_bare_metals(variable, bare):
    assert fleet.bare_metal_counterpart(variable) == bare


RAILS = {"rail0": {"env": {"OMPI_MCA_btl_tcp_if_include": "fast0", "NCCL_IB_HCA": "=mlx5_0:1"}},
         "rail1": {"env": {"OMPI_MCA_btl_tcp_if_include": "fast1", "NCCL_IB_HCA": "=mlx5_1:1"}}}


def railed_config() -> dict:
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["fabrics"]["fast"]["rails"] = copy.deepcopy(RAILS)
    return config


def test_a_links_job_measures_its_fabric_whole_then_each_rail_alone_each_run_set_and_checked_as_its_rail():
    config = railed_config()
    assert [run.run_id for run in fleetjobs.link_runs(config, ("n1", "n2"))][:3] == [
        "netbench_bare-metal_fast_2x1_on_n1+n2_rep1", "netbench_bare-metal_fast.rail0_2x1_on_n1+n2_rep1",
        "netbench_bare-metal_fast.rail1_2x1_on_n1+n2_rep1"]
    # A node's job and the sweep measure the fabric: rails are the links' business.
    assert {run.fabric for run in fleetjobs.node_runs(config, "n1")} == {"fast"}
    assert {run.fabric for run in cb_config.plan_runs(config)} == {"fast"}
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2")})
    jobs = fleetjobs.FleetJobs(config, plan, "results/fleet")
    rail = next(jobs.plan(spec) for spec in jobs.job_runs(("link", "n1+n2")) if spec.fabric == "fast.rail1")
    # The rail's variables over the fabric's; what the parser checks in its log comes from those (the interface
    # Open MPI's TCP BTL must name is fast1), not from the fabric's, which names the rails together.
    assert rail.env["OMPI_MCA_btl_tcp_if_include"] == "fast1" and rail.env["HOROVOD_GLOO_IFACE"] == "fast0"
    assert rail.fabric == {"name": "fast.rail1", "env": {**config["fabrics"]["fast"]["env"], **RAILS["rail1"]["env"]},
                           "expect": None}
    assert fabrics.expected_transport(rail.fabric).layers["mpi"].interfaces == {"tcp": ("=fast1",)}
    assert fabrics.expected_transport(rail.fabric).layers["nccl"].interfaces["ib"] == ("=mlx5_1:1",)
    # The rail's devices as the fabrics name them, by their place in the config; those named exactly are the
    # rails the node jobs' hardware step reads (ibstat, perfquery) where validation.hardware names none.
    requests = fabrics.named_devices({"fast.rail1": fabrics.fabric_settings(config, "fast.rail1")})
    assert {(each.key, each.name) for each in requests} >= {("fabrics.fast.rails.rail1.env.NCCL_IB_HCA", "mlx5_1")}
    assert fabrics.named_hcas(config) == ["mlx5_0:1", "mlx5_1:1"]
    assert fleetjobs.hardware_step(config, "hw", "n1")["argv"][-4:] == [
        "--ib-devices", "mlx5_0:1,mlx5_1:1", "--timeout-s", "120"]


@pytest.mark.parametrize("rails, message", [
    ({"mlx5_0": {"env": {}}}, "config: 'fabrics.fast.rails' = 'mlx5_0' is not allowed; allowed: pattern "
                              "^[a-z0-9][a-z0-9-]*$"),
    ({"rail0": {"expect": {"transport": "ib"}}}, "config: 'fabrics.fast.rails.rail0': 'env' is a required property; "
                                                 "required keys: env"),
    ({"rail0": {"env": {}, "description": "x"}}, "config: unknown key 'description' in 'fabrics.fast.rails.rail0'; "
                                                 "known keys: env, expect"),
])
def test_a_rail_that_cannot_be_named_or_set_is_refused_in_one_line(tmp_path, rails, message):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"fabrics": {"fast": {"env": {"OMPI_MCA_btl": "self,tcp"}, "rails": rails}}}))
    with pytest.raises(cb_config.ConfigError) as caught:
        cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml", site])
    assert str(caught.value) == message


def railed_records(recorded_runs, plan, rail_factor) -> list[dict]:
    """The fleet's records, with each link's netbench again per rail; `rail_factor(pair, rail)` slows one."""
    records = fleet_records(recorded_runs, plan.nodes, plan.links)
    for record in [each for each in records if len(each["spec"]["nodelist"]) == 2]:
        for rail in RAILS:
            copied = on_nodes(record, record["result"]["hostnames"], record["spec"]["repetition"],
                              rail_factor(tuple(record["spec"]["nodelist"]), rail) / 2)
            copied["spec"]["fabric"] = f"{record['spec']['fabric']}.{rail}"
            copied["run_id"] = copied["spec"]["run_id"] = copied["run_id"].replace("_rep", f"_{rail}_rep")
            records.append(copied)
    return records


def test_one_degraded_rail_of_a_link_fails_it_by_name_where_the_fabric_whole_passes(recorded_runs, tmp_path):
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in BATCH})
    records = railed_records(recorded_runs, plan, lambda pair, rail: 0.3 if (pair, rail) == (BAD_LINK, "rail1")
                             else 1)
    verdict = fleet.judge(records, plan)
    assert verdict.failed_nodes == [] and verdict.bad_links == ["+".join(BAD_LINK)]
    reason = verdict.summary.set_index("member").loc["+".join(BAD_LINK), "reason"]
    assert "pingpong_bandwidth_MBps over rail tcp-loopback.rail1 157.2 MB/s, 70% below" in reason, reason
    assert ".rail0" not in reason and not re.search(r"MBps \d", reason)  # the fabric whole and rail0 passed
    slow = verdict.links[verdict.links["slow"]]
    assert set(slow["variable"].map(rail_of)) == {f"{records[0]['spec']['fabric']}.rail1"}
    # A rail slow in every link of one node is that node's HCA or port: the node fails, its links are explained.
    records = railed_records(recorded_runs, plan, lambda pair, rail: 0.3 if SLOW_NODE in pair and rail == "rail0"
                             else 1)
    verdict = fleet.judge(records, plan)
    assert verdict.failed_nodes == [SLOW_NODE] and verdict.bad_links == []
    reason = verdict.summary.set_index("member").loc[SLOW_NODE, "reason"]
    fabric = records[0]["spec"]["fabric"]
    assert reason.startswith(f"slow over rail {fabric}.rail0 in all ") and ".rail1" not in reason, reason
    # The page draws the links over the fabric whole, then each rail alone.
    fleetexport.write_verdict(verdict, tmp_path)
    fleetreport.render_fleet(tmp_path, tmp_path / "fleet.html")
    page = (tmp_path / "fleet.html").read_text()
    assert re.findall(r'alt="link matrix \(([^)]*)\)', page) == [
        "Every fabric, its rails together", f"Rail {fabric}.rail0 alone", f"Rail {fabric}.rail1 alone"]


def test_a_nodes_job_checks_its_hardware_first_and_a_hwcheck_that_cannot_answer_fails_the_node(tmp_path,
                                                                                                 monkeypatch):
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    config["slurm"]["gpus_per_node"] = 4
    config["validation"]["hardware"].update(nvlink=True, ib_devices=["mlx5_0", "mlx5_1"])
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2")})
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"))
    jobs.write(plan, tmp_path / "plan.json")
    step = json.loads(Path(jobs.job_file(("node", "n1"))).read_text())["hardware"]
    # srun(1): one task on one node, the job's own (--nodelist: its allocation may hold its round's other jobs),
    # a step of the node job's allocation with its GPUs (--gres: a step sees only what it asks for), ended by Slurm
    # at --time, in the job's environment (--export=ALL); what the site expects of the node from
    # validation.hardware, the GPUs from its GRES.
    # Bounded by Slurm (--time, minutes): each of 6 tools' 120 s, perfquery's once a port of the rails (two HCAs
    # named without a port: each port of a dual-port card), a minute to start.
    assert fleetjobs.hardware_minutes(config) == math.ceil((120 * (5 + 2 * 2) + 60) / 60) == 19
    assert step == {"argv": ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=n1", "--gres=gpu:4",
                             "--time=19",
                             "--export=ALL",
                             sys.executable, "-m", "containerbench", "fleet", "hwcheck", "--out",
                             f"{tmp_path}/fleet/hardware", "--gpus", "4", "--nvlink", "--ib-devices", "mlx5_0,mlx5_1",
                             "--timeout-s", "120"],
                    "node": "n1", "report": f"{tmp_path}/fleet/hardware/n1.json", "minutes": 19}
    # The node's job holds its node for the step too; a link's job runs none.
    assert jobs.time_limit(("node", "n1")) == fleetjobs.allocation_minutes(config, jobs.runs[("node", "n1")]) + 19
    assert "hardware" not in json.loads(Path(jobs.job_file(("link", "n1+n2"))).read_text())  # links: no tier
    assert jobs.hardware_reports() == [f"{tmp_path}/fleet/hardware/{node}.json" for node in ("n1", "n2")]
    # The step's own command, here rather than under srun, as Slurm names the node to it: the tools this
    # machine lacks are skipped with their reasons, and the report is the one the verdict reads.
    # Its PATH holds none of the tools, whatever this machine has: each is skipped, named by its node.
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    fleetjobs.check_hardware({**step, "argv": step["argv"][step["argv"].index(sys.executable):]})
    checks = json.loads(Path(step["report"]).read_text())["checks"]
    assert {check["name"]: (check["status"], check["reason"]) for check in checks} == {
        name: ("skipped", f"{argv[0]} not found on n1") for name, argv in hardware.TOOLS.items()}
    assert hardware.failures([step["report"]], ["n1"]) == ({}, [])
    # A step Slurm would not start (or a hwcheck that died) leaves no report of its own: one says why, and
    # the node fails on it rather than passing with no hardware checked.
    Path(step["report"]).unlink()
    fleetjobs.check_hardware({**step, "argv": ["/bin/sh", "-c", "echo 'srun: error: Unable to create step'; exit 1"]})
    assert hardware.failures([step["report"]], ["n1"])[0] == {"n1": (
        "hardware: hardware step: exited with 1 and wrote no report: srun: error: Unable to create step")}
    # Where no rail is named, perfquery may read up to eight ports (ibstat lists them all).
    config["validation"]["hardware"]["ib_devices"] = None
    assert fabrics.named_hcas(config) is None  # tests/slurm/fleet.yaml's rails are interfaces, no HCA
    assert fleetjobs.hardware_minutes(config) == math.ceil((120 * (5 + fleetjobs.UNNAMED_PORTS) + 60) / 60)
    config["validation"]["hardware"]["enabled"] = False
    assert fleetjobs.hardware_step(config, "x", "n1") is None
    assert fleetjobs.FleetJobs(config, plan, "x").hardware_reports() == []


def test_a_node_slurm_took_out_after_its_own_job_fails_and_its_left_out_links_are_explained_by_it(
        recorded_runs, tmp_path, monkeypatch):
    """Issue 33: a node that passed its own job and was drained before its links' rounds. Each of its link jobs
    is left out of its round's allocation (salloc would wait for the node); their runs' records name the node
    Slurm took out, and the verdict fails that node (Slurm's state and reason), not its links."""
    plan = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in NODES})
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml"])
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"))
    jobs.write(plan, tmp_path / "plan.json")
    # As fleetrounds leaves them out when sinfo says n03 is drained (on real Slurm: test_fleet_slurm's rounds test).
    nodes_out = {"n03": fleet.NodeState("n03", "drained", "bad DIMM")}
    taken = [job for job in jobs.runs if job[0] == "link" and "n03" in job[1].split("+")]
    for job in taken:
        fleetjobs.not_run(json.loads(Path(jobs.job_file(job)).read_text()), fleetjobs.why_taken_out(nodes_out),
                          nodes_out)
    left_out = [parse_log(log) for job in taken for log in jobs.logs(job)]
    assert {record["status"] for record in left_out} == {"failed"}
    assert {tuple(record["reasons"]) for record in left_out} == {
        ("not run: node n03 drained (bad DIMM) (sinfo) when its allocation was asked for",)}
    assert all(record["taken_out"] == {"n03": {"state": "drained", "reason": "bad DIMM"}} for record in left_out)
    # And n05 did not answer slurmctld's ping for the minute its own job waited (idle*): that job was left out.
    silent = {"n05": fleet.NodeState("n05", "idle*")}
    fleetjobs.not_run(json.loads(Path(jobs.job_file(("node", "n05"))).read_text()), fleetjobs.why_taken_out(silent),
                      silent)
    left_out += [parse_log(log) for log in jobs.logs(("node", "n05"))]
    measured = [record for record in fleet_records(recorded_runs, plan.nodes, plan.links)
                if not ("n03" in members_of(record) and len(members_of(record)) == 2)
                and members_of(record) != ("n05",)]
    assert fleet.suspects([*measured, *left_out], plan) == []
    summary = fleet.judge([*measured, *left_out], plan).summary.set_index("member")
    assert summary.loc["n05", "reason"] == ("not run: Slurm state idle* (sinfo), not answering slurmctld since the "
                                            "plan: seen when the allocation of n05 was asked for")  # said once
    links = [job[1] for job in taken]
    assert summary.loc["n03", "result"] == "fail"
    assert summary.loc["n03", "reason"] == (
        f"not run: Slurm state drained (bad DIMM) (sinfo), taken out since the plan: seen when the allocation of "
        f"{links[0]} was asked for")
    assert (summary.loc[links, "result"] == "explained").all()
    assert (summary.loc[links, "reason"] == "node n03 failed").all()
    assert set(summary.loc[summary["result"] == "pass"].index) == set(summary.index) - {"n03", "n05", *links}
    # Drained already: no drain line for it (fleetexport drains what Slurm has not); the silent node is drained.
    assert [argv[2] for argv in fleetexport.drain_commands(fleet.judge([*measured, *left_out], plan))] == [
        "NodeName=n05"]
