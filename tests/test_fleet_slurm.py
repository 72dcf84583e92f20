"""`snakemake validate_nodes` on a real four-node Slurm cluster (tests/slurm/cluster.sh, CB_NODES=4)
with one node made slow for real (a CPU quota on its slurmd's cgroup), one link made slow for real
(a 100 Mbit/s cap on the pair's fast network) and one link job cancelled from outside while it runs: the verdict
must name exactly that node, that link and that job, with Slurm's own word for the cancellation. Then, on the
same four nodes, a sweep through chaos (benchmarks/chaos_sweep.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import BENCH_PYTHON, ROOT, SLURM_CLUSTER, cancel_when_running, clone_copy, on_controller, running_cluster

from containerbench import config as cb_config
from containerbench import fleet, fleetjobs, fleetplan, fleetrounds
from containerbench.fleetstats import NOT_REPEATED
from containerbench.rank import markers
from containerbench.slurm import NodeState

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.slurm, pytest.mark.netns, pytest.mark.timeout(1500)]
CLUSTER = SLURM_CLUSTER
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SLOW_NODE, SLOW_LINK, CANCELLED_LINK = "n3", ("n1", "n2"), "n2+n4"
# 40% of a CPU for everything the slow node runs: its training 82% below the healthy nodes' (2026-11-29).
# Not less slowed, though its job takes 130 s where the others take 33: these four slurmd share two vCPUs, so a
# figure's repetitions on one node differ by more than the 10% shortfall that fails, the variable is unjudged,
# and then only a node whose best repetition is under half the others' worst fails (fleet.py). At one CPU its
# training came out 43 to 48% below: once failed, once only unjudged (a fresh clone's CI, 2026-11-29).
SLOW_NODE_PERCENT = "40"
# The seed make test runs, at one repetition of each training point where the benchmark's five seeds take two, and
# that sweep's length without chaos on this machine: 216 s at one repetition on 2026-12-01, as the value set when
# the sweep ran two was (benchmarks/chaos_sweep.py, not given it, measures it with an undisturbed sweep first).
# The same four events land among fewer runs: seed 2 took 257 s where two repetitions took 398, side by side on
# 2026-12-01, and seeds 1 and 3 broke no promise at one repetition either (321 and 234 s).
CHAOS_SEED, CHAOS_REPETITIONS, CHAOS_UNDISTURBED_S = 2, 1, 216


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("slurm-four"), nodes=4) as state:
        yield state


def test_the_example_site_walks_from_clone_to_dry_runs_by_the_readmes_commands(four_nodes, tmp_path):
    """As a site admin on this cluster (four nodes, GPUs declared with socket affinity in gres.conf): copy the
    example, run the README's commands as written, mend what each refuses, until the sweep's, the
    calibration's and the batch's dry runs list their jobs. Each mistake is one line, before any job."""
    clone = clone_copy(tmp_path / "containerbench", ".venv-bench", "build")
    readme = (ROOT / "README.md").read_text()
    site_file = clone / "config" / "site.yaml"

    def run(command: str):
        # The README's own line; with --dry-run where it would submit, and cat for less (no terminal here).
        assert command.replace(" | cat", " | less").removesuffix(" --dry-run") in readme, command
        return on_controller(four_nodes, "bash", "-c", command, cwd=clone, timeout=600)

    def refused(command: str) -> str:
        done = run(command)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
        return lines[-1]

    def edit(change: dict) -> None:  # the lines marked EDIT, and what this cluster asks besides
        site_file.write_text(yaml.safe_dump(cb_config.merge(yaml.safe_load(site_file.read_text()), change)))

    estimate = ".venv/bin/containerbench plan --estimate --config config/site.yaml"
    sweep = ".venv/bin/snakemake --profile profiles/slurm --configfile config/site.yaml --dry-run"
    batch = ".venv/bin/snakemake validate_nodes --profile profiles/slurm --configfile config/site.yaml --dry-run"
    assert run("cp config/site.example.yaml config/site.yaml").returncode == 0
    assert refused(estimate) == ("config: 'slurm.partition' = 'gpu' is not a partition of this cluster; "
                                 "allowed: cpu")
    edit({"slurm": {"partition": "cpu", "account": "cbtest-account"}})
    assert refused(estimate) == "config: 'scaling.nodes' asks for 8 nodes, partition 'cpu' has 4; allowed: at most 4"
    # The example's 4 GPUs a node pass against gres.conf's gpu:h100:4(S:0-1), as sinfo's %G writes it with
    # socket affinity. No CUDA here: the CPU benchmark venv `make setup` built (a GPU site: `make gpu-env`).
    edit({"system": "cbtest-h100", "scaling": {"nodes": [1, 2, 4]}, "benchmark_env": "cpu",
          "bare_metal": {"python": ".venv-bench/bin/python"}, "validation": {"nodes": "n[1-4]"}})
    listed = run(".venv/bin/containerbench plan --config config/site.yaml | cat")
    assert listed.returncode == 0 and "train_bare-metal_infiniband_4x4_b128_rep5" in listed.stdout, listed.stderr
    cost = run(estimate)
    assert cost.returncode == 0 and cost.stdout.startswith("What this sweep costs:"), cost.stderr[-3000:]
    runs = cb_config.plan_runs(cb_config.load([site_file]))
    assert f"  jobs         {len(runs)} measurement jobs" in cost.stdout
    # The batch's jobs, each held to its runs' timeouts (no record tells how long they take), pass the
    # partition's MaxTime (120 minutes): validate_nodes stops there, in one line; the sweep is told, and runs.
    planned = run(sweep)
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", planned.stdout, re.M))
    assert sum(int(count) for rule, count in jobs.items() if rule.startswith("measure_rep")) == len(runs), jobs
    # Apptainer's image is converted on a compute node, where only it is installed; Enroot's is made here.
    assert {"image_apptainer", "image_enroot"} <= set(jobs), jobs
    assert "What this sweep costs:" in planned.stderr and "What validating the batch costs:" in planned.stderr
    too_long = re.compile(r"containerbench: (note: validate_nodes would stop here|config): the job of \S+ may take "
                          r"\d+ minutes \(its runs' timeouts, .+\), beyond partition 'cpu''s time limit of 120; "
                          r"allowed: shorter timeouts, or `snakemake calibrate` first, so that each job asks for its "
                          r"runs' expected time, or fewer repetitions")
    assert any(too_long.fullmatch(line) and "note:" in line for line in planned.stderr.splitlines()), planned.stderr
    assert too_long.fullmatch(refused(batch))
    calibrate = run(".venv/bin/snakemake calibrate --profile profiles/slurm --configfile config/site.yaml --dry-run")
    assert calibrate.returncode == 0, calibrate.stderr[-3000:]
    assert re.search(r"^measure_calibration\s+10$", calibrate.stdout, re.M), calibrate.stdout[-3000:]
    edit({"validation": {"nodes": "n[1-4]", "repetitions": 1}, "benchmark": {"timeout_s": 1200},
          "netbench": {"timeout_s": 600}})
    fleet = run(batch)
    assert fleet.returncode == 0, fleet.stderr[-3000:]
    # Four nodes: 4 node jobs, and a ring of 4 links with 2 chords in 3 rounds (docs/validation.md), each round in
    # one allocation of the four nodes (validation.nodes_per_allocation): 4 Slurm submissions.
    rules = dict(re.findall(r"^(fleet_\w+)\s+(\d+)$", fleet.stdout, re.M))
    assert {rule: count for rule, count in rules.items() if re.fullmatch(r"fleet_(nodes|links\d)_\d", rule)} == {
        "fleet_nodes_1": "1", "fleet_links1_1": "1", "fleet_links2_1": "1", "fleet_links3_1": "1"}, fleet.stdout
    assert "  jobs         4 node jobs and 6 link jobs" in fleet.stderr
    assert "  allocations  4 in 4 rounds " in fleet.stderr


# Two repetitions of each node's and link's runs, where a site runs three (tests/slurm/fleet.yaml): the verdict's
# rules are the same at two, and its validation took 1,385 s at three on 2026-12-01 (the nodes' round 4.5 minutes,
# the links' 11, the second pass 7), a third of `make test`'s slow half. One job at a time, as the four nodes share
# two cores; the slowed node's CPU quota slows its three links' runs too (17 s where a healthy one takes 9).
REPETITIONS = 2
# netbench's messages up to 1 MiB, where a site's run goes to 16 MiB (config.yaml), as
# benchmarks/fleet_error_rates.py measures them: a healthy link's run takes 4 s, where it took 8 (2026-12-01), and
# the slowed link, at 1 Gbit/s, is as far below the others at 1 MiB. A result is still several srun messages long.
NETBENCH_MAX_BYTES = 1048576
SECOND_PASS = range(REPETITIONS + 1, 2 * REPETITIONS + 1)  # a suspect's repetitions measured again


@pytest.mark.timeout(2400)
def test_validate_nodes_names_the_slowed_node_the_slowed_link_and_the_cancelled_job(four_nodes, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)},
                                    "validation": {"repetitions": REPETITIONS},
                                    "netbench": {"max_bytes": NETBENCH_MAX_BYTES}}))
    subprocess.run([str(CLUSTER), "slow-node", str(four_nodes), SLOW_NODE, SLOW_NODE_PERCENT], check=True, timeout=60)
    # 1 Gbit/s against the healthy links' 0.5 to 2.2 GB/s over fast0: far below the shortfall that fails, and
    # its netbench runs up to 16 MiB (three, at three repetitions) took half a minute, where 100 Mbit/s took
    # four and a half; up to 1 MiB it is 87% below the others (2026-12-01).
    subprocess.run([str(CLUSTER), "slow-link", str(four_nodes), *SLOW_LINK, "1gbit"], check=True, timeout=60)
    cancelled, stop = [], threading.Event()
    watcher = threading.Thread(target=cancel_when_running,
                               args=(four_nodes, f"containerbench-fleet-{CANCELLED_LINK}", cancelled, stop))
    watcher.start()
    try:
        done = on_controller(
            four_nodes, "timeout", "-s", "INT", "2100", SNAKEMAKE, "validate_nodes", "--snakefile",
            str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--profile", str(ROOT / "profiles" / "slurm"),
            "--configfile", str(ROOT / "tests" / "slurm" / "fleet.yaml"), str(site),
            "--slurm-init-seconds-before-status-checks", "2", timeout=2200)
    finally:
        stop.set()
        watcher.join()
        subprocess.run([str(CLUSTER), "heal", str(four_nodes)], timeout=60)
    output = done.stdout + done.stderr
    # A FAIL fails the workflow, after the verdict is written.
    assert done.returncode == 1, output[-5000:]
    fleet_dir = tmp_path / "results" / "fleet"
    assert (fleet_dir / "fleet_summary.csv").exists(), output[-5000:]  # a workflow that failed before the verdict
    summary = pd.read_csv(fleet_dir / "fleet_summary.csv", keep_default_na=False).set_index("member")
    print(summary.to_string())  # the verdict, for the note (pytest -s)
    nodes = pd.read_csv(fleet_dir / "fleet_nodes.csv")
    print(nodes[["node", "variable", "value", "fleet_median", "robust_z", "deviation_percent", "spread_percent",
                 "repeatability_percent", "result"]].to_string())
    assert "fleet: 1 of 4 node(s) failed, 2 of 6 link(s) bad" in output
    # Four slurmd on one VM's two vCPUs, whose host moves them: a figure whose repetitions on one node
    # differ by more than the 10% that fails is reported unjudged, in a row of its own, never passed in
    # silence; the faults injected are far beyond that noise, and fail all the same.
    unjudged = summary[summary["kind"] == "variable"]
    assert set(unjudged["result"]) <= {"unjudged"}
    assert all(reason.startswith("repetitions of one member differ by ") for reason in unjudged["reason"])
    # A healthy node that met the slow phase in a judged figure is measured again, and passes (not repeated);
    # the slowed node, measured again still slowed, fails, its figure confirmed.
    healthy = nodes[nodes["node"] != SLOW_NODE]
    assert set(healthy["result"]) <= {"pass", "unjudged", NOT_REPEATED}
    assert set(healthy.loc[healthy["result"] == "unjudged", "variable"]) <= set(unjudged.index)
    failed = summary[summary["result"] == "fail"]
    assert sorted(failed.index) == sorted([SLOW_NODE, "+".join(SLOW_LINK), CANCELLED_LINK]), summary
    assert summary.loc[SLOW_NODE, "reason"].startswith("images_per_sec ")
    assert "the first pass's median: confirmed" in summary.loc[SLOW_NODE, "reason"]
    suspects = json.loads((fleet_dir / "recheck" / "suspects.json").read_text())
    assert SLOW_NODE in suspects and set(suspects) - {SLOW_NODE} <= set(healthy.loc[healthy["result"] ==
                                                                                  NOT_REPEATED, "node"])
    # After the suspects' second measurements, the slowed link, whose ends are fine elsewhere, is measured again,
    # and each end re-paired with n4, the one node that passed (n3 is the slowed node, confirmed: it explains its
    # slow links) and is the end of no link left unexplained (fleet.relinks): slow again, with both ends within
    # the fleet re-paired, it is the link itself.
    assert json.loads((fleet_dir / "recheck" / "relinks.json").read_text()) == ["n1+n2", "n1+n4", "n2+n4"]
    assert summary.loc["n1+n2", "reason"].endswith(
        ": confirmed; re-paired, n1 with n4 and n2 with n4 within the fleet: the link itself (a cable, a switch port)")
    assert sorted(p.name for p in (fleet_dir / "recheck").glob(f"*_on_{SLOW_NODE}_rep*.json")) == [
        f"netbench_bare-metal_fast_1x2_on_{SLOW_NODE}_rep{r}.json" for r in SECOND_PASS] + [
        f"train_bare-metal_fast_1x1_b32_on_{SLOW_NODE}_rep{r}.json" for r in SECOND_PASS]
    # Each node's job ran its hardware tier first, on its node (a step: Slurm names the node to it): the tools
    # the test cluster lacks are skipped with their reasons, the kernel log is read there, and none failed.
    for node in ("n1", "n2", "n3", "n4"):
        checks = {check["name"]: check for check in
                  json.loads((fleet_dir / "hardware" / f"{node}.json").read_text())["checks"]}
        assert (checks["nvidia-smi -q"]["status"], checks["nvidia-smi -q"]["reason"]) == (
            "skipped", f"nvidia-smi not found on {node}")
        assert checks["dmesg"]["status"] in ("pass", "skipped") and "hardware" not in summary.loc[node, "reason"]
    # The cancelled job is a failed record with Slurm's state from sacct, not a job submitted again.
    assert cancelled, "the link job never ran"
    assert f"failed: Slurm job {cancelled[0]} CANCELLED by 0 (sacct)" in summary.loc[CANCELLED_LINK, "reason"]
    # Each job ran once, in an allocation of its own (tests/slurm/fleet.yaml): the cancelled one is not submitted
    # again.
    assert len(re.findall(r"localrule fleet_nodes_\d+:", output)) == 4
    assert len(re.findall(r"localrule fleet_links\d+_\d+:", output)) == 6
    assert output.count("localrule fleet_recheck:") == len(suspects)  # only the suspects, never the batch
    assert output.count("localrule fleet_recheck_link:") == 3
    # Links through the slow node are explained by it, or not slow at all: never a bad link of their own.
    assert set(summary.loc[["n1+n3", "n2+n3", "n3+n4"], "result"]) <= {"explained", "pass"}
    # The pair is slowed on rail fast0 only (cluster.sh slow-link): the link fails by that rail's name, and its
    # other rail, measured alone, passes.
    assert "pingpong_bandwidth_MBps over rail fast.fast0 " in summary.loc["n1+n2", "reason"]
    links = pd.read_csv(fleet_dir / "fleet_links.csv")
    print(links.loc[links["link"] == "n1+n2", ["variable", "value", "fleet_median", "deviation_percent",
                                               "slow"]].to_string())
    other_rail = links[(links["link"] == "n1+n2") & links["variable"].str.contains("/fast.fast1/")]
    assert len(other_rail) >= 3 and not other_rail["slow"].any()  # its three figures, none slow
    # Issue 34: at sizes up to 1 MiB, each result longer than one srun message and the fabric check's verbose
    # Open MPI output from every task on, every result reached its record whole (none of the healthy links
    # failed above; unreadable would not have been a link fault but is not here either).
    assert "unreadable" not in set(summary["result"])
    link_log = (fleet_dir / "runs" / "netbench_bare-metal_fast_2x1_on_n1+n4_rep1.log").read_text()
    assert link_log.count(f"{markers.PART}result ") > 5 and "btl: tcp: " in link_log
    drain = (fleet_dir / "drain.txt").read_text().splitlines()
    assert drain[0].startswith(f"scontrol update NodeName={SLOW_NODE} State=DRAIN 'Reason=containerbench: ")
    # The nodes' chart, and the links' matrices: the fabric whole, then each rail alone.
    page = (fleet_dir / "fleet.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4 and "link matrix (Rail fast.fast0 alone)" in page
    # The batch's records are a session of the results store too.
    session = json.loads((fleet_dir / "history" / "session.json").read_text())["session"]
    assert session["records"] == len((fleet_dir / "records.txt").read_text().split()) and session["system"] == "cbtest"
    states = on_controller(four_nodes, "sinfo", "--noheader", "--Node", "--format", "%N %T").stdout
    assert "drain" not in states  # printed, never run unless validation.drain asks


def test_a_rounds_allocation_runs_its_jobs_at_once_each_on_its_own_nodes(four_nodes, tmp_path):
    """Issue 33 item 1 on real Slurm: one allocation of the four nodes (one salloc, --no-kill) runs their four node
    jobs at once, each job's steps pinned to its own node, its hardware tier first; a job with a node drained since
    is left out of its round's allocation, and an allocation Slurm refuses leaves every run of every job a failed
    record with salloc's error."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)},
                                    "validation": {"nodes_per_allocation": 4, "repetitions": 1}}))
    config = cb_config.load([ROOT / "tests" / "slurm" / "fleet.yaml", site])
    plan = fleetplan.plan_batch({f"n{i}": NodeState(f"n{i}", "idle") for i in range(1, 5)})
    jobs = fleetjobs.FleetJobs(config, plan, str(tmp_path / "fleet"))
    rounds = fleetrounds.FleetRounds(jobs, plan)
    jobs.write(plan, tmp_path / "plan.json")
    rounds.write()
    nodes = rounds.held[0]
    done = on_controller(four_nodes, sys.executable, "-m", "containerbench", "fleet", "run", rounds.file(nodes),
                         timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(Path(path).read_text()) for path in rounds.outputs(nodes)["records"]]
    assert len(records) == 4 * 2 and all(record["status"] == "ok" for record in records), [
        (record["run_id"], record["reasons"]) for record in records]
    assert all(set(record["result"]["hostnames"]) == set(record["spec"]["nodelist"]) for record in records)
    # At once: every job had started its first run before any job ended its last (each job's runs run in turn).
    runs = {node: [record for record in records if record["spec"]["nodelist"] == [node]] for node in plan.nodes}
    started = max(min(record["started_unix"] for record in mine) for mine in runs.values())
    ended = min(max(record["started_unix"] + record["wall_s"] for record in mine) for mine in runs.values())
    assert started < ended, (started, ended)
    for node in plan.nodes:  # each job's hardware tier ran first, on its own node
        report = json.loads(Path(jobs.hardware_report(node)).read_text())
        assert report["node"] == node and {"nvidia-smi -q", "dmesg"} <= {check["name"] for check in report["checks"]}
    # One Slurm job for the four: sacct(1) --name, --format JobName,NNodes (its steps apart from it: -X).
    accounted = on_controller(four_nodes, "sacct", "-X", "--noheader", "--parsable2", "--name",
                              "containerbench-fleet-nodes-1", "--format", "JobID,NNodes", timeout=60).stdout.split()
    assert len(accounted) == 1 and accounted[0].endswith("|4"), accounted
    # A node Slurm drained since the plan: its link's job is left out of the next round's allocation (salloc would
    # wait for the node), its runs failed records with Slurm's state and reason; the other link runs.
    links = rounds.held[1]
    assert links.jobs == (("link", "n1+n2"), ("link", "n3+n4"))
    on_controller(four_nodes, "scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=cbtest_drained", timeout=60)
    # And a job with an allocation of its own (a second pass's) is not submitted for it: salloc would wait.
    own = fleetjobs.FleetJobs(config, plan, str(tmp_path / "second"))
    own.write(plan, tmp_path / "second-plan.json")
    try:
        done = on_controller(four_nodes, sys.executable, "-m", "containerbench", "fleet", "run", rounds.file(links),
                             timeout=900)
        alone = on_controller(four_nodes, sys.executable, "-m", "containerbench", "fleet", "run",
                              own.job_file(("link", "n3+n4")), timeout=300)
    finally:
        on_controller(four_nodes, "scontrol", "update", "NodeName=n4", "State=RESUME", timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for path in rounds.outputs(links)["records"]:
        record = json.loads(Path(path).read_text())
        if record["spec"]["nodelist"] == ["n1", "n2"]:
            assert record["status"] == "ok", record["reasons"]
        else:
            assert record["status"] == "failed" and len(record["reasons"]) == 1, record["reasons"]
            assert re.fullmatch(r"not run: node n4 drain\w* \(cbtest_drained\) \(sinfo\) when its allocation was "
                                r"asked for", record["reasons"][0]), record["reasons"]
    assert alone.returncode == 0 and "salloc" not in alone.stdout + alone.stderr, alone.stdout + alone.stderr
    for log in own.logs(("link", "n3+n4")):
        record = json.loads(Path(fleetjobs.record_path(log)).read_text())
        assert record["taken_out"] == {"n4": {"state": record["taken_out"]["n4"]["state"], "reason": "cbtest_drained"}}
        assert record["taken_out"]["n4"]["state"].startswith("drain"), record["taken_out"]
    # The verdict fails the node Slurm took out, with Slurm's word first, and explains its link by it. (Whether
    # the others pass is not asked: one repetition of four jobs at once on two cores.)
    measured = [json.loads(Path(path).read_text())
                for held in rounds.held[:2] for path in rounds.outputs(held)["records"]]
    summary = fleet.judge(measured, plan).summary.set_index("member")
    assert summary.loc["n4", "result"] == "fail" and re.match(
        r"not run: Slurm state drain\w* \(cbtest_drained\) \(sinfo\), taken out since the plan: seen when the "
        r"allocation of n3\+n4 was asked for(;|$)", summary.loc["n4", "reason"]), summary.loc["n4"]
    assert summary.loc["n3+n4", "result"] == "explained" and summary.loc["n3+n4", "reason"] in (
        "node n4 failed", "node n3 and n4 failed"), summary.loc["n3+n4"]
    # Slurm gives no allocation (a partition it does not know): every run of every job says why; nothing already
    # measured is touched.
    refused = json.loads(Path(rounds.file(rounds.held[2])).read_text())
    refused["allocation"] = [word if not word.startswith("--partition=") else "--partition=nosuch"
                             for word in refused["allocation"]]
    Path(rounds.file(rounds.held[2])).write_text(json.dumps(refused))
    done = on_controller(four_nodes, sys.executable, "-m", "containerbench", "fleet", "run",
                         rounds.file(rounds.held[2]), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in rounds.outputs(rounds.held[2])["records"]:
        record = json.loads(Path(path).read_text())
        assert record["reasons"] == ["not run: no allocation: error: Job submit/allocate failed: Invalid partition "
                                     "name specified"], record["reasons"]
    assert json.loads(Path(rounds.outputs(nodes)["records"][0]).read_text()) == records[0]


def test_a_sweep_through_chaos_keeps_every_promise(four_nodes):
    """Issue 34, item 5: one seed of benchmarks/chaos_sweep.py (five there), at one repetition, on this cluster: a
    running job scancel'ed, a node set DOWN, slurmctld restarted and the workflow's controller SIGKILLed and started
    again, at seeded moments; then every planned run has a record (measured, or failed with Slurm's word),
    none twice, the store is whole and holds each run once, and nothing is left running."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos_sweep.py"), "--state", str(four_nodes),
                           "--seeds", str(CHAOS_SEED), "--repetitions", str(CHAOS_REPETITIONS),
                           "--undisturbed-s", str(CHAOS_UNDISTURBED_S)],
                          capture_output=True, text=True, timeout=1400)
    print(done.stdout)  # the events injected and when, for the note (pytest -s)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    for event in ("scancel: job ", "node-down: n", "restart-slurmctld: exit 0", "kill-controller: snakemake "):
        assert event in done.stdout, done.stdout
    assert f"seed {CHAOS_SEED}: " in done.stdout and " 0 promise(s) broken" in done.stdout
