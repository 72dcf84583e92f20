"""The Snakemake workflow: its DAG, its refusal of bad configs, and a real end-to-end run."""

from __future__ import annotations

import json
import os
import re
import shlex

import pandas as pd
import pytest
import yaml
from helpers import ROOT, SMOKE_MODEL, TINY, recorded_records, snakemake

from containerbench import cli, history, images
from containerbench import config as cb_config
from containerbench import fleetplan as fleetplan_module
from containerbench.rank import datasets
from containerbench.runtimes import select_runtimes


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def test_dry_run_of_the_default_config(tmp_path):
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), "--dry-run")
    assert done.returncode == 0, done.stderr
    # Bare metal and every container runtime usable on this machine, each: 2 rank counts x 3
    # repetitions + 1 netbench, interleaved by repetition; the others are skipped. And bare metal's 2-rank point
    # with parameter servers, joined rounds and asynchronous, 3 repetitions each (benchmark.modes_at).
    config = cb_config.load([str(ROOT / "config" / "config.yaml")])
    skipped = select_runtimes(config, images.resolve_images(config))
    runtimes = config["runtimes"]
    assert "bare-metal" in runtimes
    assert set(runtimes) | set(skipped) == {"bare-metal", "podman", "charliecloud", "docker"}
    counts = job_counts(done.stdout)
    n = len(runtimes)
    assert {k: v for k, v in counts.items() if not k.startswith("image")} == {
        "measure_rep1": 3 * n + 2, "measure_rep2": 2 * n + 2, "measure_rep3": 2 * n + 2, "parse_run": 7 * n + 6,
        "tables": 1, "store_history": 1, "report": 1, "export": 1, "all": 1}
    for runtime in runtimes:
        for ranks in (1, 2):
            for rep in (1, 2, 3):
                assert f"results/runs/train_{runtime}_tcp-loopback_1x{ranks}_b8_rep{rep}.log" in done.stdout
        assert f"results/runs/netbench_{runtime}_tcp-loopback_1x2_rep1.log" in done.stdout
    for mode in ("parameter_server", "parameter_server_async"):
        for rep in (1, 2, 3):
            assert f"results/runs/train_bare-metal_tcp-loopback_1x2_b8_{mode}_rep{rep}.log" in done.stdout


def test_dry_run_of_the_example_site_config(tmp_path):
    # Apptainer and Enroot are declared to be on the compute nodes only, so neither is probed here.
    # Apptainer's image is converted by a job on a node; Enroot's is made here without Enroot, as its import
    # makes it (issue 32, finding 7: a node with Enroot may lack the engine that built the image).
    # The example's GPU environment needs the Horovod wheel of `make gpu-env` (opt-in, test_gpu_env.py);
    # the environment changes what is installed, not what is planned.
    relaxed = tmp_path / "relaxed.yaml"
    relaxed.write_text("runtime_policy: skip-unusable\nbenchmark_env: cpu\n")
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "site.example.yaml"), str(relaxed), "--dry-run",
                     "--printshellcmds")
    assert done.returncode == 0, done.stderr
    assert " prepare --runtime enroot --without-runtime --build-dir " in done.stdout
    assert re.search(r" prepare --runtime apptainer +--build-dir ", done.stdout)
    # Bare metal, Apptainer and Enroot, each: 2 fabrics x 4 node counts x 2 batch sizes = 16 runs per
    # repetition (5), plus netbench at each of the 4 node counts over 2 fabrics in repetitions 1-3.
    counts = job_counts(done.stdout)
    for made_once in ("image_wheelhouse", "image_base"):  # made once per clone: by an earlier test or not yet
        counts.pop(made_once, None)
    assert counts == {"measure_rep1": 72, "measure_rep2": 72, "measure_rep3": 72,
                      "measure_rep4": 48, "measure_rep5": 48, "parse_run": 312, "image_build": 1,
                      "image_archive": 1, "singularity_definition": 1, "image_apptainer": 1, "image_enroot": 1,
                      "tables": 1, "store_history": 1, "report": 1, "export": 1, "all": 1}
    assert "results/runs/train_apptainer_infiniband_8x4_b128_rep5.log" in done.stdout
    assert "results/runs/train_enroot_ethernet_1x4_b64_rep1.log" in done.stdout
    assert "results/runs/netbench_bare-metal_ethernet_2x1_rep3.log" in done.stdout
    # What the sweep costs, said once before anything is submitted, for the runs this dry run lists.
    measured = sum(count for rule, count in job_counts(done.stdout).items() if rule.startswith("measure_"))
    assert done.stderr.count("What this sweep costs:") == 1
    assert f"  jobs         {measured} measurement jobs, one per run (" in done.stderr
    assert "node-hours: every job to its time limit, slurm.runtime_minutes = 90" in done.stderr


def test_a_site_config_is_the_whole_config_as_containerbench_plan_reads_it(tmp_path):
    # Run where config/config.yaml exists, as from the clone: the profile's replace-workflow-config
    # keeps the default's loopback fabric out of the site's sweep.
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    here = tmp_path / "bare-metal-only.yaml"  # Apptainer and Enroot cannot run here
    here.write_text("runtimes: [bare-metal]\n")
    site = [str(ROOT / "config" / "site.example.yaml"), str(here)]
    planned = snakemake(tmp_path, "--configfile", *site, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    measured = set(re.findall(r"^\s+output: results/runs/(\S+)\.log\b", planned.stdout, re.M))
    config = cb_config.load(site)
    assert measured == {run.run_id for run in cb_config.plan_runs(config)}
    assert len(measured) == 104 and not any("tcp-loopback" in run_id for run_id in measured)


def test_a_site_runtime_missing_here_stops_the_workflow(tmp_path):
    here = tmp_path / "enroot-here.yaml"  # as a site whose login node is meant to have Enroot declares it
    here.write_text("images: {enroot: {available: everywhere}}\n")
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "site.example.yaml"), str(here), "--dry-run")
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("containerbench:")]
    # Issue 32, finding 7: every way out, and with compute-nodes the image is made here (test_containers).
    assert errors == ["containerbench: config: runtime 'enroot' cannot run here: enroot is not installed "
                      "(not on PATH); allowed: install it, set images.enroot.available: compute-nodes where only "
                      "the compute nodes have it (the pre-flight job probes it there, its image made here without "
                      "it as its own import makes it, with mksquashfs), give images.enroot.image "
                      "(and torch_image), or set runtime_policy: skip-unusable"]


# What each rule's shell command runs, and the parser that must accept its arguments.
COMMAND_PARSERS = {"containerbench": cli.build_parser, "containerbench.rank.datasets": datasets.parser}


def test_every_shell_command_of_the_workflow_parses(tmp_path):
    """The whole DAG, image steps and the data sample included, printed by a forced dry run; each
    command's words go through the argument parser of the module it runs, as they would for real."""
    real_data = tmp_path / "real.yaml"
    real_data.write_text(yaml.safe_dump({"benchmark": {"data": ["synthetic", "real"]}}))
    targets = sorted(set(images.image_files("localhost/containerbench:latest", ROOT / "build" / "images").values()))
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), str(real_data),
                     "--dry-run", "--printshellcmds", "--forceall", "all", *targets)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = [c for c in re.findall(r"^Shell command: (.+)$", done.stdout, re.M) if c != "None"]  # None: rule all
    steps = set()
    for command in commands:
        words = shlex.split(command)
        words = words[:next((i for i, word in enumerate(words) if word in (">", "2>", "2>&1")), len(words))]
        module, arguments = words[words.index("-m") + 1], words[words.index("-m") + 2:]
        try:
            parsed = COMMAND_PARSERS[module]().parse_args(arguments)
        except SystemExit:
            pytest.fail(f"the command of a rule does not parse: {command}")
        steps.add((module, getattr(parsed, "step", None) or getattr(parsed, "command", None)))
    assert steps == {("containerbench", step) for step in ("launch", "parse", "tables", "store", "report")} | {
        ("containerbench", step) for step in ("base", "wheelhouse", "build", "export", "load", "charliecloud",
                                              "prepare", "singularity-definition")} | {
        ("containerbench.rank.datasets", "generate")}


@pytest.mark.parametrize("fleet", [False, True], ids=["sweep", "validate_nodes"])
def test_lint_finds_only_the_explained_warning(tmp_path, fleet):
    # The Snakefile explains why no rule has a conda: or container: directive; nothing else is left. With a
    # batch to validate (a saved plan: no Slurm needed), the fleet's rules are linted too.
    site = []
    if fleet:
        plan = fleetplan_module.plan_batch({f"n{i}": fleetplan_module.NodeState(f"n{i}", "idle") for i in range(1, 5)})
        (tmp_path / "plan.json").write_text(json.dumps(plan.as_dict()))
        (tmp_path / "site.yaml").write_text(yaml.safe_dump({"launcher": {"kind": "srun"},
                                                            "validation": {"plan": str(tmp_path / "plan.json")}}))
        site = [str(tmp_path / "site.yaml")]
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), *site, "--lint")
    lints = re.findall(r"^    \* (.+?):?$", done.stderr, re.M)
    assert lints and set(lints) == {"Specify a conda environment or container for each rule."}
    assert ("Lints for rule fleet_verdict" in done.stderr) is fleet
    if fleet:  # the batch's cost is said before anything is submitted, beside the sweep's
        dry = snakemake(tmp_path, "validate_nodes", "--configfile", str(ROOT / "config" / "config.yaml"), *site,
                        "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert dry.stderr.count("What validating the batch costs:") == 1
        assert "  jobs         4 node jobs and 6 link jobs, each holding its nodes exclusively" in dry.stderr
        # A rule an allocation (fleetrounds), linted above: the node jobs, then three rounds of links.
        assert "  allocations  4 in 4 rounds " in dry.stderr
        assert {"fleet_nodes_1", "fleet_links1_1", "fleet_links2_1", "fleet_links3_1"} <= set(
            re.findall(r"^(fleet_\w+)\s+1$", dry.stdout, re.M)), dry.stdout


@pytest.mark.parametrize("override,expected", [
    ({"runtimes": ["dockr"]},
     "containerbench: config: 'runtimes[0]' = 'dockr' is not allowed; allowed: one of bare-metal"),
    ({"benchmark": {"stepz": 3}},
     "containerbench: config: unknown key 'stepz' in 'benchmark'; known keys: batch_sizes,"),
    ({"images": {"podman": {"write_fake": True}}},
     "containerbench: config: runtime 'podman': unknown option 'write_fake' in images.podman; allowed: image, "),
    ({"benchmark": {"repetitions": "auto"}},
     "containerbench: config: 'benchmark.target_ci_percent' is required with benchmark.repetitions auto; allowed: "),
    ({"history": {"tag": "latest"}},
     "containerbench: config: 'history': tag 'latest' reads as another selector; allowed: a name that is not a "),
    ({"launcher": {"kind": "srun"}, "validation": {"plan": "/nonexistent/plan.json"}},
     "containerbench: config: 'validation.plan' = '/nonexistent/plan.json' is not a readable plan ([Errno 2] No "),
])
def test_bad_config_stops_before_any_job_with_one_line(tmp_path, override, expected):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(override))
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), str(bad))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and 'File "' not in done.stderr
    # A note (no Slurm answers here, so its checks are not made) is not an error.
    errors = [line for line in done.stderr.splitlines()
              if line.startswith("containerbench:") and not line.startswith("containerbench: note:")]
    assert len(errors) == 1 and errors[0].startswith(expected)
    assert not (tmp_path / "results").exists()  # nothing ran


@pytest.mark.parametrize("validation, expected", [
    ({}, "containerbench: config: 'validation.nodes' and 'validation.partition' are not set; allowed: a Slurm "
         "hostlist (n[001-064]) or a partition, in the site config"),
    ({"nodes": "n[1-4]"}, "containerbench: config: 'validation.nodes' needs launcher.kind srun (it is 'mpirun'); "
                          "allowed: a Slurm site's config"),
])
def test_validate_nodes_without_a_batch_on_slurm_says_what_to_set_in_one_line(tmp_path, validation, expected):
    (tmp_path / "batch.yaml").write_text(yaml.safe_dump({"validation": validation}))
    done = snakemake(tmp_path, "validate_nodes", "--configfile", str(ROOT / "config" / "config.yaml"),
                     str(tmp_path / "batch.yaml"), "--dry-run")
    assert done.returncode == 1
    assert [line for line in done.stderr.splitlines() if line.startswith("containerbench:")] == [expected]


def test_a_results_store_that_is_not_ours_stops_the_workflow_and_is_left_as_it_is(tmp_path):
    store = tmp_path / "history.sqlite"
    store.write_bytes(b"site accounting export, not ours\n")
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), "--dry-run")
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("containerbench:")]
    assert errors == [f"containerbench: config: 'history': {store.name}: not a containerbench results store "
                      "(not an SQLite file); left as it is"]
    assert store.read_bytes() == b"site accounting export, not ours\n"


@pytest.mark.slow
def test_the_workflow_runs_end_to_end_and_then_has_nothing_to_do(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    # Without the local compute probe, as the embedded default runs (test_bench runs it): it would trace
    # ResNet-50 a second time in every rank of every run.
    tiny.write_text(yaml.safe_dump({**TINY, "benchmark": {**TINY["benchmark"], "node_probe_steps": 0}}))
    configs = ["--configfile", str(ROOT / "config" / "config.yaml"), str(tiny)]
    # Last time: the recorded runs of the same tiny sweep, stored as an earlier session of system ci.
    store = tmp_path / "history.sqlite"
    assert history.store(store, list(recorded_records().values()), tag="recorded").session_id == 1
    done = snakemake(tmp_path, *configs)
    assert done.returncode == 0, done.stderr[-4000:]
    # The pre-flight check ran before any job (here: this machine is the compute node).
    assert (f"containerbench: preflight on {os.uname().nodename}: clone, bare-metal Python, 0 runtime probe(s), "
            "4 fabric device(s) and the ranks' CPUs and GPUs ok") in done.stderr

    results = tmp_path / "results"
    logs, records = sorted((results / "runs").glob("*.log")), sorted((results / "runs").glob("*.json"))
    assert len(logs) == len(records) == 5  # 2 rank counts x 2 repetitions + netbench
    for path in records:
        record = json.loads(path.read_text())
        assert record["status"] == "ok", record["reasons"]
        assert record["log"]["path"] == f"results/runs/{path.stem}.log"

    summary = pd.read_csv(results / "summary.csv")
    assert list(summary["ranks"]) == [1, 2] and list(summary["repetitions"]) == [2, 2]
    # The runs took turns at going first (plans.run_order): 1 rank then 2 in the first repetition, 2 then 1 in the
    # second; the order they really started in, from their records.
    runs = pd.read_csv(results / "runs.csv")
    assert {(run.ranks, run.repetition): run.order_in_repetition for run in runs.itertuples()} == {
        (1, 1): 1, (2, 1): 2, (2, 2): 1, (1, 2): 2}
    assert (summary["images_per_sec_median"] > 0).all()
    assert summary.loc[0, "scaling_efficiency_percent"] == 100.0

    report = (results / "report.html").read_text()
    # Throughput/scaling, the runs in the order they ran, loss curves, network curves, CPU and traffic.
    assert report.count('src="data:image/png;base64,') == 5
    assert "img/s median" in report and "scaling eff. %" in report and "Ping-pong" in report
    assert "0 failed" in report

    # Every record went into the results store (beside results/, which it outlives) as one session, and the
    # report says what changed since the recorded session.
    session = json.loads((results / "history" / "session.json").read_text())
    assert (session["stored"], session["skipped"], session["session"]["id"], session["previous"]["id"]) == (5, 0, 2, 1)
    assert session["session"]["config_digest"] and session["session"]["system"] == "ci"
    since = pd.read_csv(results / "history" / "since_last.csv").set_index("variable")
    one_rank = "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x1/b2/images_per_sec"
    assert (since.loc[one_rank, "n_a"], since.loc[one_rank, "n_b"]) == (1, 2)
    assert since.loc[one_rank, "significant"] == "n/a: needs 2+ repetitions each"
    # The CSV keeps 6 digits.
    assert since.loc[one_rank, "mean_b"] == pytest.approx(summary.loc[0, "images_per_sec_mean"], rel=1e-4)
    assert "<h2>Since last time</h2>" in report and "against the previous session of system ci" in report
    assert "containerbench compare --store history.sqlite 1 2" in report

    again = snakemake(tmp_path, *configs, "--dry-run")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # Every file the workflow wrote is one a rule declares, as an output or as its log.
    summary = snakemake(tmp_path, *configs, "--summary")
    assert summary.returncode == 0, summary.stderr[-2000:]
    declared = set()
    for row in summary.stdout.splitlines()[1:]:
        output, _, _, logs, *_ = row.split("\t")
        declared |= {output, *filter(None, logs.split(","))}
    written = {str(path.relative_to(tmp_path)) for path in results.rglob("*") if path.is_file()}
    # A directory output (the runs' TensorBoard files) declares what it holds.
    undeclared = {path for path in written - declared
                  if not any(path.startswith(directory.rstrip("/") + "/") for directory in declared)}
    assert not undeclared, sorted(undeclared)
    assert any(path.startswith("results/tensorboard/train_") for path in written)
    assert {f"results/{name}" for name in ("summary.md", "table1.md", "modes.csv", "memory.csv")} <= written
    # What a site's ReFrame log pipeline, CI and Prometheus read (test_export.py checks each format).
    assert {"results/export/junit.xml", "results/export/metrics.prom"} <= written
    assert any(path.startswith("results/export/perflogs/ci/default/train_") for path in written)

    # The README's way to measure one run again: that run, its record, the tables and the report (the
    # network benchmark's run: seconds, where a ResNet-50 run traces its graph for half a minute).
    run_log = results / "runs" / "netbench_bare-metal_tcp-loopback_1x2_rep1.log"
    before = json.loads(run_log.read_text().splitlines()[0].split(" ", 1)[1])["started_unix"]
    redo = snakemake(tmp_path, *configs, "--forcerun", "results/runs/netbench_bare-metal_tcp-loopback_1x2_rep1.log")
    assert redo.returncode == 0, redo.stderr[-3000:]
    assert job_counts(redo.stdout + redo.stderr) == {"measure_rep1": 1, "parse_run": 1, "tables": 1,
                                                     "store_history": 1, "report": 1, "export": 1, "all": 1}
    # The run measured again is stored as a session of its own, and the comparison is still with the session
    # before this run's first, not with this run itself.
    session = json.loads((results / "history" / "session.json").read_text())
    assert (session["stored"], session["skipped"], session["session"]["id"], session["previous"]["id"]) == (1, 4, 3, 1)
    assert json.loads(run_log.read_text().splitlines()[0].split(" ", 1)[1])["started_unix"] > before

    # A site baselines its healthy nodes, then validates against that baseline.
    assert snakemake(tmp_path, "baseline", *configs).returncode == 0
    assert "systems:\n  ci:\n" in (results / "references.yaml").read_text()
    overlay = tmp_path / "validate.yaml"
    overlay.write_text(yaml.safe_dump({"validation": {"references": "results/references.yaml"}}))
    judged = snakemake(tmp_path, "validate", *configs, str(overlay))
    assert judged.returncode == 0, judged.stderr[-3000:]
    assert (results / "validation.txt").read_text().splitlines()[-1] == "VERDICT: PASS"
    # A FAIL fails the workflow, and the verdict stays where the admin reads it.
    references = yaml.safe_load((results / "references.yaml").read_text())
    for entry in references["systems"]["ci"].values():
        entry["reference"] *= 10 if entry["lower"] is not None else 0.1
    (tmp_path / "unreachable.yaml").write_text(yaml.safe_dump(references))
    overlay.write_text(yaml.safe_dump({"validation": {"references": "unreachable.yaml"}}))
    judged = snakemake(tmp_path, "validate", *configs, str(overlay))
    assert judged.returncode == 1
    assert (results / "validation.txt").read_text().splitlines()[-1].startswith("VERDICT: FAIL")


def round_files(results) -> list[dict]:
    return sorted((json.loads(path.read_text()) for path in (results / "rounds").glob("round-*.json")),
                  key=lambda decision: decision["round"])


def measured(results) -> dict[str, list[int]]:
    """point id -> the repetitions whose raw log is there."""
    found = {}
    for log in sorted((results / "runs").glob("*.log")):
        point, repetition = log.stem.rsplit("_rep", 1)
        found.setdefault(point, []).append(int(repetition))
    return {point: sorted(reps) for point, reps in found.items()}


@pytest.mark.slow
def test_auto_repetitions_add_rounds_until_the_target_or_the_most_without_measuring_a_run_twice(tmp_path):
    # Two cheap points (1 rank, two batch sizes, the smoke network), so that the rounds have runs to interleave.
    auto = {**TINY, "scaling": {"nodes": [1], "ranks_per_node": [1]}, "netbench": {"enabled": False},
            "benchmark": {**TINY["benchmark"], "model": SMOKE_MODEL, "batch_sizes": [2, 4], "repetitions": "auto",
                          "target_ci_percent": 50,
                          "min_repetitions": 2, "max_repetitions": 3}}
    (tmp_path / "auto.yaml").write_text(yaml.safe_dump(auto))
    configs = ["--configfile", str(ROOT / "config" / "config.yaml"), str(tmp_path / "auto.yaml")]
    planned = snakemake(tmp_path, *configs, "--dry-run")
    assert planned.returncode == 0, planned.stderr[-3000:]
    # Only the minimum is planned up front, and the cost estimate says the most.
    assert job_counts(planned.stdout)["measure_rep1"] == 2 and job_counts(planned.stdout)["measure_rep2"] == 2
    assert "measure_rep3" not in job_counts(planned.stdout)
    assert "  repetitions  auto: 2 per train point counted above, more until the 95% interval of the mean is " \
           "within +-50%; at most 3 each: 6 measurement jobs" in planned.stderr

    done = snakemake(tmp_path, *configs)
    assert done.returncode == 0, done.stderr[-4000:]
    results = tmp_path / "results"
    rounds, runs = round_files(results), measured(results)
    assert len(runs) == 2 and [decision["round"] for decision in rounds] == list(range(2, len(rounds) + 2))
    # Each round sent on exactly the points whose interval was wider than the target, while they could go on.
    for decision in rounds:
        for point, entry in decision["points"].items():
            if entry["repetitions"] != decision["round"]:
                continue  # stopped in an earlier round, carried over
            if entry["stop"] is None:
                assert entry["ci95_percent"] is None or entry["ci95_percent"] > 50
                assert f"{point}_rep{decision['round'] + 1}" in decision["next"]
            elif entry["stop"].startswith("target reached: "):
                assert entry["ci95_percent"] <= 50
                assert entry["stop"] == f"target reached: ci95 +-{entry['ci95_percent']:.3g}%"
            else:
                assert decision["round"] == 3 and entry["stop"].startswith("max_repetitions (3) reached: ci95 ")
    stops = rounds[-1]["points"]
    assert rounds[-1]["next"] == []
    assert runs == {point: list(range(1, stops[point]["repetitions"] + 1)) for point in stops}
    # Every point's next repetition ran before any point's following one.
    records = [json.loads(path.read_text()) for path in (results / "runs").glob("*.json")]
    order = [r["spec"]["repetition"] for r in sorted(records, key=lambda record: record["started_unix"])]
    assert order == sorted(order)
    summary = pd.read_csv(results / "summary.csv")
    assert sorted(summary["repetitions_stop"]) == sorted(entry["stop"] for entry in stops.values())
    assert sorted(summary["repetitions"]) == sorted(entry["repetitions"] for entry in stops.values())

    # An impossible target and one more repetition allowed: the rounds are decided again, no finished run
    # is measured again, and the first round asks every point for all it may still make at once (its
    # repetitions doubled, up to max_repetitions 4), which the summary says.
    before = {log.name: log.stat().st_mtime_ns for log in (results / "runs").glob("*.log")}
    (tmp_path / "strict.yaml").write_text(yaml.safe_dump({"benchmark": {"target_ci_percent": 0.01,
                                                                        "max_repetitions": 4}}))
    strict = [*configs, str(tmp_path / "strict.yaml")]
    again = snakemake(tmp_path, *strict)
    assert again.returncode == 0, again.stderr[-4000:]
    assert {name: (results / "runs" / name).stat().st_mtime_ns for name in before} == before
    assert measured(results) == {point: [1, 2, 3, 4] for point in runs}
    first = json.loads((results / "rounds" / "round-2.json").read_text())
    assert sorted(first["next"]) == sorted(f"{point}_rep{n}" for point in runs for n in (3, 4))
    assert all(entry["asked"] == 4 for entry in first["points"].values())
    assert json.loads((results / "rounds" / "round-3.json").read_text())["next"] == []
    summary = pd.read_csv(results / "summary.csv")
    assert list(summary["repetitions"]) == [4, 4]
    assert all(stop.startswith("max_repetitions (4) reached: ci95 +-") for stop in summary["repetitions_stop"])

    # Nothing left to do: a dry run says so.
    idle = snakemake(tmp_path, *strict, "--dry-run")
    assert idle.returncode == 0 and "Nothing to be done" in idle.stdout + idle.stderr


@pytest.mark.containers
def test_a_gpu_sweep_injects_the_nvidia_libraries_into_charliecloud_on_a_node(tmp_path):
    # The directory is converted where the image was built (the engine's store is there); only
    # ch-fromhost --nvidia runs as a job on a node, whose libraries it copies (ch-fromhost(1)).
    # The plan has Charliecloud only where the build engine answers (runtimes.select_runtimes): this
    # needs podman as `make setup` configures it (build/engines/containers.conf), not only the venv.
    relaxed = tmp_path / "relaxed.yaml"
    relaxed.write_text("runtime_policy: skip-unusable\nbenchmark_env: cpu\nruntimes: [bare-metal, charliecloud]\n")
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "site.example.yaml"), str(relaxed), "--dry-run",
                     "--printshellcmds")
    assert done.returncode == 0, done.stderr
    counts = job_counts(done.stdout)
    assert counts["image_charliecloud"] == 1 and counts["image_charliecloud_nvidia"] == 1
    [command] = [c for c in re.findall(r"^Shell command: (.+)$", done.stdout, re.M) if "charliecloud-nvidia" in c]
    words = shlex.split(command)
    parsed = cli.build_parser().parse_args(words[words.index("-m") + 2:words.index(">")])
    assert parsed.step == "charliecloud-nvidia" and str(parsed.marker).endswith(".ch.nvidia")
