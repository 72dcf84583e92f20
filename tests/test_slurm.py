"""The workflow on a real two-node Slurm cluster (tests/slurm/cluster.sh): profiles/slurm,
the executor plugin, srun with PMIx, two fabrics, and the transport check from the logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import (
    BENCH_PYTHON,
    ROOT,
    SLURM_CLUSTER,
    cancel_when_running,
    fleet_records,
    on_controller,
    running_cluster,
)

from containerbench import config as cb_config
from containerbench import fleetplan, slurm
from containerbench.images import built_image
from containerbench.plans import plan_run
from containerbench.processes import run_group
from containerbench.records import parse_log

# the first test waits for the cluster, the image check and an 8-run workflow
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.slurm, pytest.mark.netns, pytest.mark.containers,
              pytest.mark.timeout(2700)]
CLUSTER = SLURM_CLUSTER
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("slurm-state")) as state:
        yield state


def workflow(state: Path, workdir: Path, *args: str, overrides: dict | None = None) -> subprocess.CompletedProcess:
    extra = workdir / "extra.yaml"
    extra.write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)}, **(overrides or {})}))
    return on_controller(
        state, "timeout", "-s", "INT", "1500", SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"),
        "--directory", str(workdir), "--profile", str(ROOT / "profiles" / "slurm"),
        "--configfile", str(ROOT / "tests" / "slurm" / "config.yaml"), str(extra),
        "--slurm-init-seconds-before-status-checks", "2", *args)


# The sweep runs on two nodes only: one rank on one node talks to no one, so it says nothing about the
# fabric, and the one-node path under srun is run by the tests below (and scaling by test_workflow).
ACROSS_NODES = {"scaling": {"nodes": [2]}}


@pytest.fixture(scope="module")
def slurm_run(cluster, container_engines, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm-workflow")
    # The login node builds the image (the controller's namespace has no route to package
    # registries); the jobs on the nodes only run it.
    extra = workdir / "extra.yaml"
    extra.write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)}}))
    image = built_image("charliecloud", "localhost/containerbench:latest", ROOT / "build" / "images")[1]
    built = run_group([SNAKEMAKE, image, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
                      "--profile", str(ROOT / "profiles" / "local"), "--configfile",
                      str(ROOT / "tests" / "slurm" / "config.yaml"), str(extra)],
                     timeout=2400, env=container_engines)
    assert built.returncode == 0, built.stderr[-3000:]
    # Before the sweep is submitted: one short run of each of its benchmarks, and the estimate they give
    # (test_the_estimate_calibrated_before_the_sweep_is_within_twice_what_slurm_charged_for_it).
    (workdir / "calibrated-since").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    calibrated = workflow(cluster, workdir, "calibrate", overrides=ACROSS_NODES)
    assert calibrated.returncode == 0, calibrated.stdout[-3000:] + calibrated.stderr[-5000:]
    done = workflow(cluster, workdir, overrides=ACROSS_NODES)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    # Before any job: the pre-flight check, through srun on as many nodes as the largest run takes (2), each
    # asked for what Charliecloud needs there (extended globs). fast0 and slow0 are found in each node's own
    # network namespace, which /sys/class/net does not show.
    checked = re.findall(r"^containerbench: preflight on (n[12]): clone, bare-metal Python, 0 runtime probe\(s\), "
                         r"1 runtime requirement\(s\), 6 fabric device\(s\) and the ranks' CPUs and GPUs ok$",
                         done.stdout + done.stderr, re.M)
    assert sorted(checked) == ["n1", "n2"], done.stderr[-3000:]
    return workdir


def test_what_the_cluster_cannot_give_is_refused_in_one_line_before_any_job(cluster, tmp_path):
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)}}))
    config = cb_config.load([ROOT / "tests" / "slurm" / "config.yaml", tmp_path / "site.yaml"])
    via = (str(CLUSTER), "exec", str(cluster))  # the controller's own sinfo
    slurm.check_cluster(config, cb_config.plan_runs(config), via)  # what the test cluster has: fine
    # Its GPUs are declared with socket affinity (tests/slurm/cluster.sh), as sinfo shows them at a GPU site:
    # the form that crashed the check (issue 36), read here from Slurm's own sinfo.
    cpus = len(os.sched_getaffinity(0))
    assert on_controller(cluster, "sinfo", "-h", "-o", "%G").stdout.split() == [
        f"gpu:h100:{2 * cpus}(S:0-{cpus - 1})" if cpus > 1 else "gpu:h100:2(S:0)"]
    assert slurm.partitions(via)["cpu"].gpus == 2 * cpus
    assert slurm.partitions(via)["cpu"].max_job_nodes is None  # sinfo %s "1-infinite": no MaxNodes here
    for change, message in (
        ({"slurm": {"partition": "gpu"}}, "'slurm.partition' = 'gpu' is not a partition of this cluster; allowed: cpu"),
        ({"scaling": {"nodes": [4]}}, "'scaling.nodes' asks for 4 nodes, partition 'cpu' has 2; allowed: at most 2"),
        ({"slurm": {"gpus_per_node": 2 * cpus + 1}},
         f"'slurm.gpus_per_node' = {2 * cpus + 1}, nodes of partition 'cpu' have {2 * cpus} GPU(s)"),
    ):
        wanted = cb_config.merge(config, change)
        with pytest.raises(cb_config.ConfigError) as caught:
            slurm.check_cluster(wanted, cb_config.plan_runs(wanted), via)
        assert str(caught.value).startswith(f"config: {message}")
        # The estimate refuses what the sweep would (it accepted a partition the cluster lacks).
        (tmp_path / "change.yaml").write_text(yaml.safe_dump(change))
        configs = [ROOT / "tests" / "slurm" / "config.yaml", tmp_path / "site.yaml", tmp_path / "change.yaml"]
        estimated = on_controller(cluster, sys.executable, "-m", "containerbench", "plan", "--estimate",
                                  *(f"--config={path}" for path in configs), cwd=ROOT, timeout=120)
        assert estimated.returncode == 2 and estimated.stdout == ""
        assert estimated.stderr.startswith(f"config: {message}") and estimated.stderr.count("\n") == 1


def test_a_hostlist_of_more_nodes_than_slurm_can_have_is_refused_in_one_line(cluster):
    via = (str(CLUSTER), "exec", str(cluster))
    # Slurm's scontrol refuses one range of more than 64K hosts (src/common/hostlist.c) but expands any
    # number of ranges: 80,000 names here, more than a cluster can hold (MAX_SLURM_NODES).
    with pytest.raises(slurm.QueryError) as refused:
        slurm.expand_hostlist("a[1-40000],b[1-40000]", via)
    assert str(refused.value) == ("'validation.nodes' = 'a[1-40000],b[1-40000]' expands to 80,000 names, more nodes "
                                  "than a Slurm cluster can have (65,536); allowed: the hostlist of the new nodes")
    with pytest.raises(slurm.QueryError) as refused:
        slurm.expand_hostlist("n[1-3000000]", via)
    assert str(refused.value).startswith("'validation.nodes' = 'n[1-3000000]' expands to no node names")


def test_every_run_used_slurm_and_the_fabric_it_asked_for(slurm_run):
    records = [json.loads(p.read_text()) for p in sorted((slurm_run / "results" / "runs").glob("*.json"))]
    assert len(records) == 2 * 2 * 2  # runtimes x fabrics x (training, netbench), on 2 nodes
    assert {r["spec"]["runtime"] for r in records} == {"bare-metal", "charliecloud"}
    assert len({r["result"]["provenance"]["hash"] for r in records}) == 1  # the same benchmark in both
    for record in records:
        assert record["status"] == "ok", (record["run_id"], record["reasons"])
        # One sampler per node of the job, each covering the measured window (0.1 s samples: a
        # window shorter than a second may hold too few to judge, and then says so by coverage 0).
        nodes = record["telemetry"]["nodes"]
        assert set(nodes) == set(record["result"]["hostnames"]), record["run_id"]
        assert all(node["coverage"] > 0.5 for node in nodes.values() if node["window_s"] > 1), (record["run_id"], nodes)
        assert record["result"]["hostnames"] == ["n1", "n2"]
        if record["spec"]["ranks"] > 1:
            check = record["fabric_check"]
            interface = {"fast": "fast0", "slow": "slow0"}[record["spec"]["fabric"]]
            assert check["status"] == "ok", check["reason"]
            assert interface in check["reason"]
            assert any(interface in line for line in check["evidence"])
    assert {r["result"]["launcher"] for r in records if r["kind"] == "train"} == {"srun"}


def test_the_estimate_calibrated_before_the_sweep_is_within_twice_what_slurm_charged_for_it(cluster, slurm_run):
    results = slurm_run / "results"
    calibration = sorted(path.name for path in (results / "calibration").glob("*_rep0.json"))
    # Bare metal, each benchmark over each fabric: across nodes, the fabric's speed is in the step time.
    assert calibration == ["netbench_bare-metal_fast_2x1_rep0.json", "netbench_bare-metal_slow_2x1_rep0.json",
                           "train_bare-metal_fast_2x1_b2_rep0.json", "train_bare-metal_slow_2x1_b2_rep0.json"]
    expected = json.loads((results / "estimate.json").read_text())
    records = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*.json"))]
    assert expected["runs"] == expected["expected_runs"] == len(records) == 8 and expected["unmeasured_runs"] == 0
    # What Slurm charged for the sweep: each run's own allocation, its nodes x its elapsed time (sacct), the
    # first job of each run's name since the calibration began (a later test measures some runs again).
    since = (slurm_run / "calibrated-since").read_text()
    listed = on_controller(cluster, "sacct", "--allusers", "-X", "--noheader", "--parsable2", "--starttime", since,
                           "--format=JobIDRaw,JobName,NNodes,ElapsedRaw", timeout=60)
    assert listed.returncode == 0, listed.stderr
    names = {f"containerbench-{record['run_id']}" for record in records}
    charged: dict[str, float] = {}
    for line in sorted(listed.stdout.splitlines(), key=lambda line: int(line.split("|")[0])):
        _, name, nodes, elapsed = line.split("|")
        if name in names and name not in charged:
            charged[name] = int(nodes) * int(elapsed) / 3600
    assert set(charged) == names, listed.stdout
    actual = sum(charged.values())
    assert 0.5 <= expected["expected_node_hours"] / actual <= 2, (expected["expected_node_hours"], actual)


def test_the_gradients_crossed_the_fabric_asked_for_by_the_counters(slurm_run):
    """Not only the logs: each node's sampler counted the bytes on each interface while the
    ranks measured, and every node of a 2-node run sent what the all-reduce must move on the
    fabric's interface, next to nothing on the other network."""
    records = [json.loads(p.read_text()) for p in sorted((slurm_run / "results" / "runs").glob("train_*_2x1_*.json"))]
    assert len(records) == 2 * 2  # runtimes x fabrics
    for record in records:
        telemetry = record["telemetry"]
        assert set(telemetry["nodes"]) == {"n1", "n2"}  # one sampler per node, under srun
        check = telemetry["traffic_check"]
        mine, other = ("fast0", "slow0") if record["spec"]["fabric"] == "fast" else ("slow0", "fast0")
        assert check["status"] == "ok" and mine in check["reason"], check
        expected = check["expected_bytes_per_step"]  # parameters x 4 B x 2(n-1)/n, n = 2
        assert expected == record["result"]["parameters"] * 4
        for host in ("n1", "n2"):
            sent = check["observed"][host]["by_interface"]
            assert sent[mine] >= 0.6 * expected and sent[other] < 0.05 * expected, (host, sent)


def test_the_report_shows_the_fabric_difference_across_nodes(slurm_run):
    results = slurm_run / "results"
    summary = pd.read_csv(results / "summary.csv")
    fabrics = pd.read_csv(results / "fabrics.csv")
    for runtime in ("bare-metal", "charliecloud"):
        mine = summary[summary["runtime"] == runtime].set_index(["fabric", "nodes"])
        assert mine.loc[("fast", 2), "images_per_sec_median"] > mine.loc[("slow", 2), "images_per_sec_median"]
        two_nodes = fabrics[(fabrics["nodes"] == 2) & (fabrics["runtime"] == runtime)].iloc[0]
        assert (two_nodes["faster_fabric"], two_nodes["slower_fabric"]) == ("fast", "slow")
        assert two_nodes["ratio_of_means"] > 1.2
    assert fabrics["note"].isna().all()  # two nodes: every row compares the networks (issue 36's one-node note)
    net = pd.read_csv(results / "netbench.csv")
    # Two nodes only: one node's two ranks talk over loopback whichever interface is named,
    # so the shaped link is crossed only between n1 and n2.
    across = net[(net["test"] == "allreduce") & (net["nodes"] == 2)]
    busbw = across.groupby("fabric")["busbw_GBps"].max()
    assert busbw["fast"] > busbw["slow"]
    report = (results / "report.html").read_text()
    assert "<h2>Interconnects</h2>" in report and "fast" in report and "slow" in report


def test_what_slurm_cannot_give_is_refused_before_submission(cluster, tmp_path):
    done = workflow(cluster, tmp_path, "--dry-run", overrides={"slurm": {"partition": "gpu"}})
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("containerbench:")]
    assert errors == ["containerbench: config: 'slurm.partition' = 'gpu' is not a partition of this cluster; "
                      "allowed: cpu"]


def measured(output: str) -> list[tuple[str, str]]:
    """The measure jobs a workflow ran: (rule, run id), from Snakemake's lines for each local job."""
    return re.findall(r"^localrule (measure_rep\d+):\n(?:    .*\n)*?    wildcards: run_id=(\S+)", output, re.M)


def test_a_run_slurm_ended_is_a_failed_record_with_slurms_reason_and_is_not_submitted_again(cluster, tmp_path):
    with open(ROOT / "tests" / "slurm" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    del config["fabrics"]["slow"]
    config.update(runtimes=["bare-metal"], bare_metal={"python": str(BENCH_PYTHON)})
    config["scaling"]["nodes"] = [1]
    config["benchmark"]["steps"] = 2000  # minutes: it is cancelled long before
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(config))
    run_id = "train_bare-metal_fast_1x1_b2_rep1"
    cancelled, stop = [], threading.Event()
    watcher = threading.Thread(target=cancel_when_running, args=(cluster, f"containerbench-{run_id}", cancelled, stop),
                               kwargs={"settle_s": 5})
    watcher.start()
    try:
        done = on_controller(cluster, "timeout", "-s", "INT", "900", SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"),
                             "--directory", str(tmp_path), "--profile", str(ROOT / "profiles" / "slurm"),
                             "--configfile", str(site), "--slurm-init-seconds-before-status-checks", "2")
    finally:
        stop.set()
        watcher.join()
    output = done.stdout + done.stderr
    assert cancelled, output[-3000:]
    # The run Slurm ended is a measured outcome: a failed record with sacct's state, and the report is made.
    assert done.returncode == 0, output[-5000:]
    assert sorted(measured(output)) == [("measure_rep1", "netbench_bare-metal_fast_1x2_rep1"), ("measure_rep1", run_id)]
    record = json.loads((tmp_path / "results" / "runs" / f"{run_id}.json").read_text())
    assert (record["status"], record["reasons"]) == ("failed", [f"Slurm job {cancelled[0]} CANCELLED by 0 (sacct)"])
    assert (tmp_path / "results" / "report.html").exists()
    again = on_controller(cluster, SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
                          "--profile", str(ROOT / "profiles" / "slurm"), "--configfile", str(site), "--dry-run")
    assert again.returncode == 0 and measured(again.stdout + again.stderr) == [], again.stdout[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_run_slurm_gives_no_allocation_is_a_failed_record_with_sallocs_error(cluster, tmp_path):
    (tmp_path / "site.yaml").write_text(yaml.safe_dump({"bare_metal": {"python": str(BENCH_PYTHON)},
                                                        "slurm": {"partition": "nosuch"}}))
    config = cb_config.load([ROOT / "tests" / "slurm" / "config.yaml", tmp_path / "site.yaml"])
    spec = next(run for run in cb_config.plan_runs(config) if run.kind == "train" and run.nodes == 1)
    run_plan = plan_run(spec, config)
    # salloc(1): the job's shape, time limit and name; the slurm section's partition and account.
    assert run_plan.allocation == [
        "salloc", "--nodes=1", "--exclusive", "--ntasks-per-node=1", "--cpus-per-task=1",
        f"--time={config['slurm']['runtime_minutes']}", f"--job-name=containerbench-{spec.run_id}",
        "--partition=nosuch", "--account=cbtest-account"]
    (tmp_path / "plan.json").write_text(run_plan.to_json())
    log = tmp_path / "run.log"
    done = on_controller(cluster, sys.executable, "-m", "containerbench", "launch",
                         "--plan", f"@{tmp_path / 'plan.json'}", "--log", str(log), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    record = parse_log(log)
    assert record["status"] == "failed"
    assert record["reasons"] == ["not run: no allocation: error: Job submit/allocate failed: Invalid partition name "
                                 "specified"], record["reasons"]


def test_a_killed_workflow_resubmits_only_what_is_missing(cluster, slurm_run):
    # What a workflow killed mid-run leaves: one run never measured (no log, no record),
    # and no tables or report yet.
    results = slurm_run / "results"
    for path in [results / "runs" / f"netbench_bare-metal_slow_2x1_rep1{suffix}" for suffix in (".log", ".json")]:
        path.unlink()
    for path in results.glob("*.*"):
        path.unlink()
    done = workflow(cluster, slurm_run, overrides=ACROSS_NODES)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert measured(output) == [("measure_rep1", "netbench_bare-metal_slow_2x1_rep1")], output[-3000:]
    assert (results / "report.html").exists()


def test_a_run_on_the_wrong_interface_is_caught(cluster, slurm_run, tmp_path):
    """Netbench asked for the fast network, but its MPI was pointed at the slow one."""
    with open(ROOT / "tests" / "slurm" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    config["fabrics"]["fast"]["env"]["OMPI_MCA_btl_tcp_if_include"] = "slow0"  # the mistake
    config["fabrics"]["fast"]["expect"] = {"transport": "tcp", "interface": "fast0"}
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump({**config, "bare_metal": {"python": str(BENCH_PYTHON)}}))
    loaded = cb_config.load([str(path)])
    spec = next(r for r in cb_config.plan_runs(loaded) if r.kind == "netbench" and r.fabric == "fast" and r.nodes == 2)
    run_plan = plan_run(spec, loaded)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(run_plan.to_json())
    log = tmp_path / "wrong.log"
    done = on_controller(cluster, "salloc", "-N2", "--ntasks-per-node=1", "-p", "cpu", sys.executable, "-m",
                         "containerbench", "launch", "--plan", f"@{plan_file}", "--log", str(log), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = parse_log(log)
    assert record["status"] == "invalid"
    assert record["reasons"][0].startswith("fabric: ") and "slow0" in record["reasons"][0]
    assert any("slow0" in line for line in record["fabric_check"]["evidence"])
    assert record["evidence"] == record["fabric_check"]["evidence"][0]


def test_a_nodes_podman_store_lacks_the_image_until_the_run_puts_it_there(cluster, slurm_run, container_engines,
                                                                         tmp_path):
    """Issue 32, finding 1. Each node of the test cluster has its own podman store, as a site's nodes have
    (cluster.sh NODE_LOCAL: containers-storage.conf(5)'s graphroot and runroot, and podman's tmpdir, are
    the node's), so the image the workflow built where it plans is on no node: a 2-node podman run would
    not find it. The run's node-image step (nodeimages, run on each node with srun before the ranks) loads
    the shared archive there; the record names the id each node held, the build's; a second run loads
    nothing. Measured 2026-11-28: 20-38 s a node for the first load (both nodes at once, 1.9 GB), 0.03 s after."""
    tag = "localhost/containerbench:latest"
    built = ROOT / "build" / "images" / "podman-containerbench-latest.json"  # the build's stamp (slurm_run built it)
    stamp = tmp_path / built.name
    stamp.write_text(built.read_text())
    image_id = json.loads(built.read_text())["image_id"]
    exported = run_group([sys.executable, "-m", "containerbench", "image", "--engine", "podman", "--tag", tag, "export",
                          "--archive", str(tmp_path / "containerbench-latest.tar")], timeout=600, env=container_engines)
    assert exported.returncode == 0, exported.stderr[-2000:]
    conf = f"CONTAINERS_CONF={container_engines['CONTAINERS_CONF']}"
    held = on_controller(cluster, "env", conf, "srun", "-N2", "--ntasks-per-node=1", "-p", "cpu", "sh", "-c",
                         f"podman image exists {tag} && echo $(hostname) has it || echo $(hostname) lacks it",
                         timeout=300)
    assert sorted(held.stdout.split("\n")[:2]) == ["n1 lacks it", "n2 lacks it"], held.stdout + held.stderr
    assert run_group(["podman", "image", "exists", tag], timeout=60, env=container_engines).returncode == 0

    with open(ROOT / "tests" / "slurm" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    config |= {"runtimes": ["bare-metal", "podman"], "images": {"podman": {"image": tag}},
               "results_dir": str(tmp_path / "results"), "bare_metal": {"python": str(BENCH_PYTHON)}}
    path = tmp_path / "podman.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = cb_config.load([str(path)])
    spec = next(r for r in cb_config.plan_runs(loaded) if r.kind == "netbench" and r.fabric == "fast" and r.nodes == 2
                and r.runtime == "podman")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan_run(spec, loaded, artifact=str(stamp)).to_json())
    records = []
    for attempt in (1, 2):
        log = tmp_path / f"podman-{attempt}.log"
        done = on_controller(cluster, "env", conf, "salloc", "-N2", "--ntasks-per-node=1", "-p", "cpu",
                             sys.executable, "-m", "containerbench", "launch", "--plan", f"@{plan_file}", "--log",
                             str(log), timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        records.append(parse_log(log))
        assert records[-1]["status"] == "ok", (records[-1]["reasons"], log.read_text()[-3000:])
        assert [(n["host"], n["image_id"]) for n in records[-1]["node_images"]] == [("n1", image_id), ("n2", image_id)]
        assert {p["hostname"] for p in records[-1]["result"]["processes"]} == {"n1", "n2"}
    first, later = ({n["host"]: n for n in record["node_images"]} for record in records)
    assert all(first[host]["loaded"] and not later[host]["loaded"] for host in ("n1", "n2"))
    print("node-image step, first run:", {host: first[host]["seconds"] for host in first},
          "later:", {host: later[host]["seconds"] for host in later})


def test_a_read_only_container_under_sruns_pmix_needs_the_steps_client_directory_which_the_shim_binds(
        cluster, container_engines, tmp_path):
    """Issue 32: the PMIx client directory. Slurm 22.05's pmix plugin makes each step's spmix_appdir under
    SLURM_PMIX_TMPDIR, else mpi.conf's PMIxCliTmpDirBase, else TmpFS with %n expanded (SchedMD/slurm
    src/plugins/mpi/pmix/pmixp_info.c), and hands it to the ranks as PMIX_NSDIR, where Open MPI makes its session
    directory; no variable of the rank names its base (PMIX_SYSTEM_TMPDIR, where Enroot's 50-slurm-pmi.sh looks,
    is /tmp), so the plan reads it from `scontrol show config` and the shim finds the step's on the node. A
    container whose root is read-only (as an Apptainer SIF, or podman-run(1) --read-only) and that does not bind
    it fails in MPI_Init (ess_pmi_module.c); with the shim's --volume it runs. The container here is real podman
    with the host's root filesystem as its rootfs (podman-run(1) --rootfs), which holds Python and Open MPI."""
    read = "from containerbench import slurm; print(slurm.pmix_client_base())"
    base = on_controller(cluster, sys.executable, "-c", read, timeout=60).stdout.strip()
    assert base == f"{cluster}/tmp/%n"  # cluster.sh's TmpFS, as slurm.conf(5) writes it
    hello = tmp_path / "hello.py"
    hello.write_text("from mpi4py import MPI\nimport numpy as np\nc = MPI.COMM_WORLD\nx = np.ones(4)\n"
                     "c.Allreduce(MPI.IN_PLACE, x)\nprint('rank', c.rank, 'of', c.size, 'sum', int(x[0]))\n")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    # The step's spool (PMIX_SERVER_TMPDIR) is left out, as a shared path would be: with PMIX_MCA_gds=hash the
    # client needs none of it (seen here), and a mount point for it would be made in the host's root below.
    shim = [sys.executable, "-m", "containerbench.rank.rankexec", "--pass-prefix", "PMIX_", "--pass-prefix",
            "SLURM_", "--pass-prefix", "OMPI_", "--shared-path", "/var/spool/containerbench-slurmd"]
    podman = ["podman", "run", "--rm", "--read-only", "--read-only-tmpfs=false", "--network", "host", "--ipc",
              "host", "--pid", "host", "--log-driver", "none", "--volume", f"{ROOT}:{ROOT}", "--env",
              "PMIX_MCA_gds=hash", "--rootfs", str(rootfs), str(BENCH_PYTHON), str(hello)]
    conf = f"CONTAINERS_CONF={container_engines['CONTAINERS_CONF']}"

    def ranks(*bind: str) -> subprocess.CompletedProcess:
        # Each rank binds the host's root filesystem (no submounts) in a mount namespace of its own, then the shim.
        script = f'mount --bind / {rootfs} && exec "$@"'
        return on_controller(cluster, "env", conf, "srun", "-N2", "--ntasks-per-node=2", "-p", "cpu", "--mpi=pmix",
                             "unshare", "-m", "sh", "-c", script, "sh", *shim, *bind, "--", *podman, timeout=300)

    unbound = ranks()
    assert unbound.returncode != 0 and "ess_pmi_module.c" in unbound.stdout + unbound.stderr, unbound.stderr[-2000:]
    bound = ranks("--bind-pmix=--volume {path}:{path}", "--pmix-base", base)
    assert bound.returncode == 0, bound.stderr[-2000:]
    assert sorted(bound.stdout.split("\n")[:4]) == [f"rank {r} of 4 sum 4" for r in range(4)], bound.stdout


def test_a_native_runs_host_mpi_is_read_on_each_of_its_nodes_where_the_ranks_will_run(cluster, tmp_path):
    """Issue 32, finding 3, on the cluster whose nodes are separate (cluster.sh: each slurmd in its own mount
    namespace, the clone shared): a native run's launch reads the host MPI on every node of its allocation (the
    node-mpi step, srun one task a node, before the ranks; execution.prepare_nodes), and each node answers from
    its own view, under its own Slurm name, with the closure whose files its ranks must map."""
    tree = ROOT / "build" / "host-mpi" / "lib"  # `make setup` (scripts/host-mpi-tree.sh)
    assert (tree / "libmpich.so.12").exists()
    with open(ROOT / "tests" / "slurm" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    config |= {"runtimes": ["bare-metal", "charliecloud"], "results_dir": str(tmp_path / "results"),
               "images": {"charliecloud": {"image": str(tmp_path / "image.ch"), "mpi_model": "native"}},
               "native_mpi": {"library": str(tree / "libmpich.so.12"), "library_dirs": [str(tree)]}}
    path = tmp_path / "native.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = cb_config.load([str(path)])
    spec = next(r for r in cb_config.plan_runs(loaded) if r.runtime == "charliecloud" and r.nodes == 2)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan_run(spec, loaded).to_json())
    read = ("import json, sys; from containerbench.plans import RunPlan; from containerbench.execution import "
            "prepare_nodes; kept, said, why = prepare_nodes(RunPlan.from_json(open(sys.argv[1]).read())); "
            "print(json.dumps({'kept': kept, 'said': said, 'why': why}))")
    done = on_controller(cluster, "salloc", "-N2", "--ntasks-per-node=1", "-p", "cpu", sys.executable, "-c", read,
                         str(plan_file), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["why"] is None, answer
    nodes = answer["kept"]["node_mpi"]
    assert [(node["host"], node["slurm_node"]) for node in nodes] == [("n1", "n1"), ("n2", "n2")]
    for node in nodes:
        assert node["library"]["path"] == str(tree / "libmpich.so.12")
        assert node["library"]["version"].startswith("MPICH Version:")
        assert {"libucp.so.0", "libhwloc.so.15"} <= {each["name"] for each in node["closure"]}
        assert all(each["path"].startswith(f"{tree}/") for each in node["closure"])


def test_training_on_the_wrong_wire_is_caught_by_the_counters(cluster, tmp_path):
    """Training asked for the fast network, but its MPI was pointed at the slow one: the bytes
    counted on the interfaces say so, with the numbers."""
    with open(ROOT / "tests" / "slurm" / "config.yaml") as handle:
        config = yaml.safe_load(handle)
    config["fabrics"]["fast"]["env"]["OMPI_MCA_btl_tcp_if_include"] = "slow0"  # the mistake
    config["fabrics"]["fast"]["expect"] = {"transport": "tcp", "interface": "fast0"}
    config["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump({**config, "bare_metal": {"python": str(BENCH_PYTHON)}}))
    loaded = cb_config.load([str(path)])
    spec = next(r for r in cb_config.plan_runs(loaded) if r.kind == "train" and r.fabric == "fast" and r.nodes == 2
                and r.runtime == "bare-metal")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan_run(spec, loaded).to_json())
    log = tmp_path / "wrong.log"
    done = on_controller(cluster, "salloc", "-N2", "--ntasks-per-node=1", "-p", "cpu", sys.executable, "-m",
                         "containerbench", "launch", "--plan", f"@{plan_file}", "--log", str(log), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = parse_log(log)
    check = record["telemetry"]["traffic_check"]
    assert check["status"] == "mismatch"
    for host in ("n1", "n2"):
        sent = check["observed"][host]["by_interface"]
        assert sent["slow0"] >= 0.6 * check["expected_bytes_per_step"] and sent["fast0"] < 0.05 * sent["slow0"]
        assert f"{host} sent " in check["reason"] and "per step on fast0; slow0 carried" in check["reason"]
    assert record["status"] == "invalid"  # the logs' check names it first; the counters agree


# A controller killed on the login node leaves its Slurm jobs running on their nodes: a rerun that
# unlocked would submit the same run ids beside them. Played on the controller with a real sbatch job.
LOCK_SCRIPT = """
import json, os, subprocess, sys, time
from pathlib import Path
from containerbench import processes
os.chdir(sys.argv[1])
locks = Path(".snakemake", "locks")
controller = subprocess.Popen(["sleep", "600"])
os.environ[processes.CONTROLLER_VARIABLE] = processes.identity(controller.pid)
locks.mkdir(parents=True)
(locks / "0.input.lock").write_text("results/runs/a.log\\n")  # Snakemake's, then whose it is
processes.record_lock_owner(locks)
controller.kill()
controller.wait()
# Without the identity: on this test cluster the nodes share the login node's kernel, and the
# local check (its runs still stopping) would answer first; a real site's nodes are elsewhere.
clean = {k: v for k, v in os.environ.items() if k != processes.CONTROLLER_VARIABLE}
job = subprocess.run(["sbatch", "--parsable", "--partition=cpu", "--account=cbtest-account", "--wrap", "sleep 300"],
                     capture_output=True, text=True, check=True, env=clean).stdout.strip().split(";")[0]
kept = processes.remove_stale_lock(locks, slurm=True, wait_s=0)
subprocess.run(["scancel", job], check=True)
for _ in range(120):
    if not subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True, text=True).stdout.strip():
        break
    time.sleep(0.5)
removed = processes.remove_stale_lock(locks, slurm=True, wait_s=0)
print(json.dumps({"controller": controller.pid, "job": job, "kept": kept, "removed": removed,
                  "left": sorted(os.listdir(locks))}))
"""


def test_a_dead_controllers_lock_stays_while_its_slurm_jobs_run(cluster, tmp_path):
    script = tmp_path / "lock.py"
    script.write_text(LOCK_SCRIPT)
    done = on_controller(cluster, sys.executable, str(script), str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["kept"] == (f"containerbench: the lock of workflow controller {seen['controller']} (gone) stays: "
                            f"its Slurm jobs {seen['job']} still run from this directory; `scancel {seen['job']}`, "
                            "then run again")
    assert seen["removed"].startswith(f"containerbench: removed the lock of workflow controller {seen['controller']}")
    assert seen["left"] == []


def wait_for_state(cluster: Path, node: str, wanted: str, seconds: int = 60) -> str:
    state = ""
    for _ in range(seconds):
        state = on_controller(cluster, "sinfo", "--noheader", "--Node", "--nodes", node,
                              "--format", "%T").stdout.strip()
        if state == wanted:
            break
        time.sleep(1)
    return state


def test_the_nodes_to_validate_come_from_slurm_and_a_failed_one_is_drained_on_request(cluster, recorded_runs,
                                                                                       tmp_path):
    # Last in this module: it drains a node of the shared cluster for a moment.
    via = (str(CLUSTER), "exec", str(cluster))
    assert slurm.expand_hostlist("n[1-2]", via) == ["n1", "n2"]
    for query, message in (
        (lambda: slurm.expand_hostlist("n[3-", via),
         "'validation.nodes' = 'n[3-' expands to no node names; allowed: a Slurm hostlist such as n[001-064] or n1,n2"),
        (lambda: slurm.node_states(["n1", "n9"], via),
         "'validation.nodes' names 'n9', which Slurm does not know (sinfo); allowed: nodes of this cluster"),
        (lambda: slurm.partition_states("new", via),
         "'validation.partition' = 'new' is not a partition with nodes; allowed: cpu"),
    ):
        with pytest.raises(slurm.QueryError) as caught:
            query()
        assert str(caught.value) == message
    cli = (sys.executable, "-m", "containerbench", "fleet")
    planned = on_controller(cluster, *cli, "plan", "--partition", "cpu", "--write", str(tmp_path / "plan.json"))
    assert planned.stdout == "2 node(s) to measure, 1 link(s) in 1 round(s): 3 jobs\n  round 1: n1+n2\n", planned.stderr
    plan = fleetplan.FleetPlan.from_dict(json.loads((tmp_path / "plan.json").read_text()))
    records = fleet_records(recorded_runs, plan.nodes, plan.links)
    for record in records:
        if record["kind"] == "train" and record["result"]["hostnames"] == ["n2"]:
            record.update(status="failed", reasons=["Slurm NODE_FAIL (sacct)"])
        (tmp_path / f"{record['run_id']}.json").write_text(json.dumps(record))
    try:
        judged = on_controller(cluster, *cli, "judge", "--plan", str(tmp_path / "plan.json"), "--out-dir",
                               str(tmp_path / "fleet"), "--drain", *map(str, tmp_path.glob("*_rep*.json")))
        assert judged.returncode == 1 and judged.stdout.endswith("\n  n2: drained\n"), judged.stdout + judged.stderr
        states = slurm.node_states(["n1", "n2"], via)
        assert states["n2"].state == "drained" and states["n2"].reason.startswith(
            "containerbench: train_bare-metal_tcp-loopback_1x1_b2_n2_rep1 and 2 more failed: Slurm NODE_FAIL (sacct)")
        assert states["n1"].available
        replanned = fleetplan.plan_batch(states)  # reported as it is, not waited for
        assert replanned.nodes == ["n1"] and list(replanned.unavailable) == ["n2"] and replanned.links == []
    finally:
        on_controller(cluster, "scontrol", "update", "NodeName=n2", "State=RESUME")
        assert wait_for_state(cluster, "n2", "idle") == "idle"
