"""Plans (exact argv and environment per launcher) and the executor's raw log."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import BENCH_PYTHON, ROOT, tiny_config

from containerbench import config as cb_config
from containerbench import launchers
from containerbench.execution import execute, node_answers
from containerbench.plans import RunPlan, plan_run, plan_sweep
from containerbench.rank import markers
from containerbench.records import parse_log
from containerbench.runtimes import BareMetal, Podman

BENCH_ARGS = ["--model", "resnet50", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "1",
              "--steps", "2", "--precision", "fp32", "--data-format", "channels_last", "--threads", "0",
              "--probe-steps", "1", "--mode", "horovod", "--runtime", "bare-metal"]
FABRIC_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
              "HOROVOD_GLOO_IFACE": "lo", "NCCL_SOCKET_IFNAME": "lo", "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
# Added to every run so each layer logs the network it chose (fabrics.debug_environment).
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV", "UCX_LOG_LEVEL": "info",
             "HOROVOD_LOG_LEVEL": "debug", "OMPI_MCA_btl_base_verbose": "20",
             "OMPI_MCA_mpi_show_mca_params": "enviro,file"}


def telemetry_args(config, run_id, runtime=BareMetal, launcher=launchers.Mpirun):
    """What every plan appends: where the run's node samplers write (plans.telemetry_settings), and the
    runtime's and launcher's processes they count apart."""
    return ["--telemetry-dir", str(Path(config["results_dir"]).absolute() / "telemetry" / run_id),
            "--telemetry-interval", "0.5", "--telemetry-services",
            ",".join(sorted({*runtime.service_processes, *launcher.service_processes}))]


def spec_for(config, kind="train", ranks_per_node=2):
    return next(r for r in cb_config.plan_runs(config) if r.kind == kind and r.ranks_per_node == ranks_per_node)


def test_mpirun_plan_binds_one_core_per_rank_and_forwards_every_variable(tmp_path):
    config = tiny_config(tmp_path)
    run_plan = plan_run(spec_for(config), config)
    env = {"CONTAINERBENCH_RUNTIME": "bare-metal", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1",
           **DEBUG_ENV, **FABRIC_ENV}
    assert run_plan.env == env
    forwarded = [arg for name in sorted(env) for arg in ("-x", name)]
    assert run_plan.argv == [
        "mpirun", "-np", "2", "--map-by", "ppr:2:node", "--bind-to", "core", "--report-bindings", *forwarded,
        str(BENCH_PYTHON), "-m", "containerbench.rank.bench", *BENCH_ARGS,
        *telemetry_args(config, "train_bare-metal_tcp-loopback_1x2_b2_rep1"),
    ]
    assert run_plan.spec == {"kind": "train", "runtime": "bare-metal", "fabric": "tcp-loopback", "nodes": 1,
                                "ranks_per_node": 2, "ranks": 2, "repetition": 1, "batch_size": 2,
                                "run_id": "train_bare-metal_tcp-loopback_1x2_b2_rep1", "system": "ci",
                                "launcher": "mpirun", "mpi_model": "host", "model": "resnet50", "image_size": 32,
                                "precision": "fp32",
                                "xla": False, "data_format": "channels_last", "warmup_steps": 1, "steps": 2,
                                "mode": "horovod", "data": "synthetic"}


def test_srun_plan_uses_the_configured_mpi_plugin(tmp_path):
    config = tiny_config(tmp_path, launcher={"kind": "srun", "srun_mpi": "pmi2", "bind": "socket",
                                             "extra_args": ["--gpus-per-task=1"]},
                         scaling={"nodes": [2], "ranks_per_node": [4]})
    run_plan = plan_run(spec_for(config, ranks_per_node=4), config)
    assert run_plan.argv[:10] == ["srun", "--mpi=pmi2", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4",
                                     "--cpus-per-task=1", "--cpu-bind=sockets", "--export=ALL", "--gpus-per-task=1",
                                     str(BENCH_PYTHON)]


def test_netbench_plan_runs_the_netbench_module_on_two_ranks(tmp_path):
    config = tiny_config(tmp_path)
    run_plan = plan_run(spec_for(config, kind="netbench"), config)
    assert run_plan.argv[-11:-6] == [str(BENCH_PYTHON), "-m", "containerbench.rank.netbench", "--max-bytes", "65536"]
    assert run_plan.argv[-6:] == telemetry_args(config, run_plan.run_id)
    assert run_plan.argv[:3] == ["mpirun", "-np", "2"]


def test_netbench_runs_at_every_node_count_with_ping_pong_on_the_first_pair_only(tmp_path):
    config = cb_config.merge(tiny_config(tmp_path), {"scaling": {"nodes": [1, 2, 4]},
                                                     "launcher": {"kind": "srun", "srun_mpi": "pmix"}})
    net = {r.nodes: plan_run(r, config).argv for r in cb_config.plan_runs(config) if r.kind == "netbench"}
    assert sorted(net) == [1, 2, 4]
    assert net[1][:4] == ["srun", "--mpi=pmix", "--nodes=1", "--ntasks=2"] and net[1][-8:-6] == ["--max-bytes", "65536"]
    assert net[2][:4] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2"] and net[2][-8:-6] == ["--max-bytes", "65536"]
    assert net[4][:4] == ["srun", "--mpi=pmix", "--nodes=4", "--ntasks=4"] and net[4][-7] == "--no-pingpong"


def test_each_runtime_can_name_the_srun_mpi_plugin_its_image_needs(tmp_path):
    # Slurm's MPI guide (mpi_guide.shtml, "srun --mpi"): Open MPI is started through PMIx, MPICH
    # through PMI2; an MPICH-based image under srun needs --mpi=pmi2 while the host's Open MPI keeps pmix.
    config = tiny_config(tmp_path, runtimes=["bare-metal", "apptainer"],
                         launcher={"kind": "srun", "srun_mpi": "pmix"},
                         images={"apptainer": {"image": "/images/mpich.sif", "srun_mpi": "pmi2"}})
    plugins = {r.runtime: plan_run(r, config).argv[1] for r in cb_config.plan_runs(config)}
    assert plugins == {"bare-metal": "--mpi=pmix", "apptainer": "--mpi=pmi2"}


def run_python(tmp_path, code: str, timeout_s=60):
    run_plan = {"run_id": "probe", "spec": {"kind": "train", "ranks": 1}, "argv": [sys.executable, "-c", code],
                "env": {"PROBE": "yes"}, "timeout_s": timeout_s}
    log = tmp_path / "probe.log"
    returncode = execute(RunPlan.from_json(run_plan), log, echo=None)
    return returncode, log.read_text().splitlines()


def test_log_holds_the_launch_line_the_output_and_the_exit_line(tmp_path):
    returncode, lines = run_python(tmp_path, "import os; print('hello', os.environ['PROBE'])")
    assert returncode == 0
    header = json.loads(lines[0][len(markers.LAUNCH):])
    assert header["argv"][1:] == ["-c", "import os; print('hello', os.environ['PROBE'])"]
    assert header["env"] == {"PROBE": "yes"} and header["started_unix"] > 0
    assert lines[1] == "hello yes"
    footer = json.loads(lines[-1][len(markers.EXIT):])
    assert footer["returncode"] == 0 and footer["timed_out"] is False


def test_a_run_past_its_timeout_is_killed_and_recorded_failed(tmp_path):
    returncode, lines = run_python(tmp_path, "import time; print('started', flush=True); time.sleep(60)", timeout_s=1)
    assert returncode != 0
    record = parse_log(tmp_path / "probe.log")
    assert record["status"] == "failed"
    assert record["reasons"][0] == "timed out after 1 s"


def test_a_missing_launcher_is_a_failed_run_not_a_crash(tmp_path):
    run_plan = {"run_id": "nompi", "spec": {"kind": "train", "ranks": 2}, "argv": ["no-such-mpirun", "-np", "2"],
                "env": {}, "timeout_s": 10}
    assert execute(RunPlan.from_json(run_plan), tmp_path / "nompi.log", echo=None) == 127
    record = parse_log(tmp_path / "nompi.log")
    assert record["status"] == "failed" and "exit code 127" in record["reasons"]
    assert "cannot start 'no-such-mpirun'" in record["evidence"]


def test_a_run_whose_image_is_not_on_every_node_never_starts_its_ranks_and_says_why(tmp_path):
    """Issue 32, finding 1: the node-image step (nodeimages) runs before the ranks; where it fails (here: the
    image stamp it checks the node's image against is not where the node looks) the ranks are not started,
    and the record is failed with the node's own line as evidence."""
    stamp = tmp_path / "build" / "images" / "podman-containerbench-latest.json"  # never made
    step = [sys.executable, "-m", "containerbench", "node-image", "--engine", "podman", "--image",
            "localhost/containerbench:latest", "--stamp", str(stamp)]
    run_plan = {"run_id": "noimage", "spec": {"kind": "netbench", "ranks": 1, "nodes": 1},
                "argv": [sys.executable, "-c", f"open({str(tmp_path / 'started')!r}, 'w')"], "env": {}, "timeout_s": 60,
                "node_prepare": step}
    assert execute(RunPlan.from_json(run_plan), tmp_path / "noimage.log", echo=None) == 1
    assert not (tmp_path / "started").exists()
    header = json.loads((tmp_path / "noimage.log").read_text().splitlines()[0][len(markers.LAUNCH):])
    assert header["node_prepare"] == step and header["node_images"] == [] and header["node_prepare_s"] > 0
    record = parse_log(tmp_path / "noimage.log")
    assert record["status"] == "failed" and record["node_images"] == []
    host = os.uname().nodename
    assert record["evidence"] == (f"containerbench: the image is not on every node of the run ({shlex.join(step[:3])} "
                                  f"...): {host}: the image stamp {stamp} is unreadable here ([Errno 2] No such file "
                                  f"or directory: '{stamp}'); allowed: a clone on a filesystem every node mounts at "
                                  "the same path")


def test_each_node_answers_for_the_charliecloud_directory_it_sees_and_a_node_without_it_says_so(tmp_path):
    """Issue 32: every record names the image each of its nodes ran. Charliecloud's nodes read one image directory
    on the shared filesystem (ch-run(1): IMAGE is a directory or SquashFS); its node step loads nothing, but reads
    the id of the image the directory was converted from, kept beside it (imagebuild.charliecloud_image), as the
    node sees it, with the node's own mount namespace."""
    from containerbench import nodeimages

    image = tmp_path / "containerbench-latest.ch"
    step = [sys.executable, "-m", "containerbench", "node-image", "--engine", "charliecloud", "--image", str(image)]
    missing = subprocess.run(step, capture_output=True, text=True, timeout=120)
    host = os.uname().nodename
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == (f"containerbench: node-image: {host}: the image directory {image} (with "
                              "containerbench-latest.ch.image-id beside it) is not here; allowed: a clone on a "
                              "filesystem every node mounts at the same path\n")
    (image / "ch").mkdir(parents=True)
    Path(f"{image}.image-id").write_text("sha256:" + "c" * 64 + "\n")
    found = subprocess.run(step, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    (answer,) = node_answers(found.stdout, nodeimages.LINE)
    assert {key: answer[key] for key in ("host", "engine", "image", "image_id", "loaded", "mnt_ns")} == {
        "host": host, "engine": "charliecloud", "image": str(image), "image_id": "sha256:" + "c" * 64,
        "loaded": False, "mnt_ns": os.readlink("/proc/self/ns/mnt")}
    # Only docker's, podman's and podman-hpc's containers of ours are told apart once their starter has ended (their
    # runtimes' orphans): the epilog line is theirs alone.
    orphans = subprocess.run([*step[:5], "charliecloud", "--orphans-only"], capture_output=True, text=True, timeout=120)
    assert (orphans.returncode, orphans.stderr) == (2, "containerbench: node-image: --orphans-only is for docker, "
                                                       "podman, podman-hpc, whose containers of ours are found once "
                                                       "their starter has ended; not charliecloud\n")


def test_a_rank_on_a_node_whose_image_was_not_checked_invalidates_the_run():
    """The record's proof that the step ran where the ranks ran: every rank's host answered, with one image."""
    from containerbench.records import Verdict, judge_node_images

    answers = [{"host": "n1", "engine": "podman", "image": "i", "image_id": "sha256:a", "loaded": False,
                "seconds": 0.03}]
    ranks = {"processes": [{"rank": 0, "hostname": "n1"}, {"rank": 1, "hostname": "n2"}]}
    verdict = Verdict()
    judge_node_images({"node_images": answers}, ranks, verdict)
    assert verdict.reasons == ["rank 1 ran on n2, where the image was not checked (node-image answered from n1)"]
    verdict = Verdict()
    judge_node_images({"node_images": [*answers, {**answers[0], "host": "n2", "image_id": "sha256:b"}]}, ranks, verdict)
    assert verdict.reasons == ["the nodes held different images under the tag: n1 sha256:a, n2 sha256:b"]
    verdict = Verdict()
    judge_node_images({}, ranks, verdict)  # a bare-metal run, or one planned before the step
    assert verdict.reasons == []


def test_the_ranks_step_is_pinned_to_the_nodes_the_image_step_ran_on():
    """In an allocation of more nodes than the run's, srun's two steps of N nodes need not land on the same N."""
    from containerbench.execution import pinned_to

    answers = [{"host": "n7.cluster", "slurm_node": "n7"}, {"host": "n9.cluster", "slurm_node": "n9"}]
    assert pinned_to(["srun", "--mpi=pmix", "cmd"], answers) == ["srun", "--nodelist=n7,n9", "--mpi=pmix", "cmd"]
    assert pinned_to(["mpirun", "cmd"], answers) == ["mpirun", "cmd"]
    assert pinned_to(["srun", "cmd"], [{"host": "vm"}]) == ["srun", "cmd"]  # not a Slurm step: nothing to pin


def test_a_run_that_needs_its_own_allocation_is_not_run_inside_another(tmp_path, monkeypatch):
    """Shifter's image goes on the run's own salloc (Runtime.allocation_options); launched by hand inside
    another allocation, made without it, the run is not started, and its record says why."""
    from containerbench.execution import run_plans
    from containerbench.launchers import Allocation

    monkeypatch.setenv("SLURM_JOB_ID", "41")
    run_plan = RunPlan.from_json({"run_id": "shifted", "spec": {"kind": "netbench", "ranks": 2, "nodes": 2},
                                  "argv": ["srun", "true"], "env": {}, "timeout_s": 60,
                                  "allocation": ["salloc", "--nodes=2", "--image=id:0123abcd", "--module=none"],
                                  "allocation_options": ["--image=id:0123abcd", "--module=none"]})
    log = tmp_path / "shifted.log"
    assert run_plans([run_plan], [log], Allocation.PER_RUN, ["launch"], salloc=run_plan.allocation, echo=None) == 0
    record = parse_log(log)
    assert record["status"] == "failed" and record["reasons"] == [
        "not run: its runtime needs --image=id:0123abcd --module=none on its own allocation (salloc), and it was "
        "launched inside Slurm job 41, made without them; allowed: launching it from outside any allocation"]


def test_mpirun_as_root_gets_allow_run_as_root(tmp_path):
    run_plan = {"run_id": "root", "spec": {}, "argv": ["mpirun", "-np", "1", "true"], "env": {}, "timeout_s": 60}
    execute(RunPlan.from_json(run_plan), tmp_path / "root.log", echo=None)
    argv = json.loads((tmp_path / "root.log").read_text().splitlines()[0][len(markers.LAUNCH):])["argv"]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_a_benchmark_that_crashes_leaves_its_log_and_a_failed_record(tmp_path, bench_python):
    # Real benchmark, bad argument: it exits non-zero before training.
    run_plan = {"run_id": "crash", "spec": {"kind": "train", "ranks": 1},
                "argv": [str(bench_python), "-m", "containerbench.rank.bench", "--model", "resnet51"],
                "env": {}, "timeout_s": 120}
    assert execute(RunPlan.from_json(run_plan), tmp_path / "crash.log", echo=None) == 2
    record = parse_log(tmp_path / "crash.log")
    assert record["status"] == "failed"
    assert record["reasons"] == ["exit code 2", "no result line"]
    assert "invalid choice: 'resnet51'" in record["evidence"]


def test_plan_command_prints_every_run_with_its_argv(root, capsys, monkeypatch):
    from containerbench.cli import main

    monkeypatch.chdir(root)
    assert main(["plan", "--config", "config/site.example.yaml",
                 "--run-id", "train_bare-metal_infiniband_2x4_b64_rep1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "train_bare-metal_infiniband_2x4_b64_rep1"
    assert "NCCL_NET=IB" in out[1] and "NCCL_IB_HCA==mlx5_0,mlx5_1" in out[1]
    assert out[2].startswith("  argv: srun --mpi=pmix --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 "
                             "--gres=gpu:4 --cpu-bind=sockets --export=ALL")
    assert out[2].endswith("--precision mixed_float16 --data-format channels_last --threads 0 --probe-steps 5 "
                           "--mode horovod --runtime bare-metal --telemetry-dir "
                           f"{Path('results').absolute()}/telemetry/train_bare-metal_infiniband_2x4_b64_rep1 "
                           "--telemetry-interval 0.5 --telemetry-services slurmstepd,srun")


def test_plan_command_rejects_a_bad_config_in_one_line(tmp_path, capsys):
    from containerbench.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("system: x\nscaling: {nodes: [1], ranks_per_node: [1]}\nruntimes: [bare-metal]\n"
                   "fabrics: {tcp: {env: {}}}\nlauncher: {kind: mpirun, bind: hwthread}\n")
    assert main(["plan", "--config", str(bad)]) == 2
    assert capsys.readouterr().err == ("config: 'launcher.bind' = 'hwthread' is not allowed; "
                                       "allowed: one of core, socket, none\n")


def test_real_data_and_mode_settings_reach_the_benchmark_and_the_container(tmp_path):
    dataset = tmp_path / "imagenet"
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"],
                         benchmark={"modes": ["collective", "parameter_server"], "data": ["real"],
                                    "collective_implementation": "nccl", "parameter_servers": 2},
                         dataset={"path": str(dataset)}, images={"podman": {"image": "localhost/cb:test"}})
    runs = {(r.runtime, r.mode): r for r in cb_config.plan_runs(config) if r.kind == "train" and r.ranks == 2}
    collective = plan_run(runs[("bare-metal", "collective")], config).argv[:-6]  # the telemetry's last
    assert collective[-8:] == ["--mode", "collective", "--runtime", "bare-metal", "--collective", "nccl",
                               "--data-dir", str(dataset)]
    servers = plan_run(runs[("podman", "parameter_server")], config).argv
    assert servers[-6:] == telemetry_args(config, runs[("podman", "parameter_server")].run_id, Podman)
    assert servers[-12:-6] == ["--runtime", "podman", "--parameter-servers", "2", "--data-dir", str(dataset)]
    # The dataset is bound into the container at the path the benchmark is given.
    assert f"{dataset}:{dataset}" in servers


def test_prepare_plans_every_run_with_the_files_it_needs_and_probes_nothing_unasked(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # a probe would find no runtime and no sinfo
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman", "charliecloud"], benchmark={"data": ["real"]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    assert sweep.skipped == {} and config["runtimes"] == ["bare-metal", "podman", "charliecloud"]
    assert set(sweep.plans) == {run.run_id for run in sweep.runs} == {run.run_id for run in cb_config.plan_runs(config)}
    sample = str(tmp_path / "build" / "data" / "imagenet-sample")
    assert sweep.dataset_sample == sample == sweep.config["dataset"]["path"]
    images_dir = tmp_path / "build" / "images"
    assert sweep.inputs["train_podman_tcp-loopback_1x2_b2_real_rep1"] == {
        "image": f"{images_dir}/podman-containerbench-latest.json", "data": sample}
    assert sweep.inputs["train_charliecloud_tcp-loopback_1x1_b2_real_rep2"]["image"] == \
        f"{images_dir}/containerbench-latest.ch"
    assert sweep.inputs["train_bare-metal_tcp-loopback_1x1_b2_real_rep1"] == {"data": sample}
    assert sweep.inputs["netbench_podman_tcp-loopback_1x2_rep1"] == {
        "image": f"{images_dir}/podman-containerbench-latest.json"}


def test_prepare_with_probes_skips_what_cannot_run_here_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="skip-unusable")
    sweep = plan_sweep(config, tmp_path)
    assert sweep.skipped == {"podman": "podman is not installed (not on PATH)"}
    assert {run.runtime for run in sweep.runs} == {"bare-metal"} and sweep.artifacts == {}
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="require")
    with pytest.raises(cb_config.ConfigError,
                       match="^config: runtime 'podman' cannot run here: podman is not installed"):
        plan_sweep(config, tmp_path)


def test_a_runtime_that_cannot_do_what_the_config_asks_is_refused_in_one_line(tmp_path):
    # Charliecloud without --write-fake binds datasets to the image's empty directories: three at most.
    binds = [str(tmp_path / name) for name in ("a", "b", "c", "d")]
    config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud"],
                         images={"binds": binds, "charliecloud": {"write_fake": False}}, benchmark={"data": ["real"]},
                         dataset={"path": str(tmp_path)})
    (tmp_path / "train-00000-of-00001").write_bytes(b"")
    refused = r"^config: runtime 'charliecloud': \d binds need images.charliecloud.write_fake: true"
    with pytest.raises(cb_config.ConfigError, match=refused):
        plan_sweep(config, tmp_path, probe=False)



# What a sweep costs (cost.estimate, `containerbench plan --estimate`).

def recorded_records_in(directory, copies=()):
    """The recorded real runs' records, written into `directory` as the workflow's parse step writes
    them, plus those of changed copies: (name, recorded log, {marker: change of that line's JSON})."""
    from helpers import RECORDED_RUNS

    from containerbench.records import write_record

    directory.mkdir(parents=True, exist_ok=True)
    for log in sorted(RECORDED_RUNS.glob("*.log")):
        write_record(log, directory / f"{log.stem}.json")
    for name, source, changes in copies:
        lines = []
        for line in (RECORDED_RUNS / f"{source}.log").read_text().splitlines(keepends=True):
            marker = next((m for m in changes if line.startswith(m)), None)
            if marker:
                payload = markers.payload(line, marker)
                changes[marker](payload)
                line = markers.line(marker, payload)
            lines.append(line)
        (directory / f"{name}.log").write_text("".join(lines))
        write_record(directory / f"{name}.log", directory / f"{name}.json")
    return directory


def loaded(directory):
    from containerbench.records import load_records

    records, problems = load_records(sorted(directory.glob("*.json")))
    assert problems == []
    return records


def test_the_example_site_costs_a_slurm_job_per_run_each_to_its_time_limit(root):
    from containerbench.cost import estimate, format_estimate, one_node_jobs

    config = cb_config.load([root / "config" / "site.example.yaml"])
    sweep = plan_sweep(config, root, probe=False)
    # Besides the runs: the pre-flight check, and the conversions of Apptainer's and Enroot's images
    # (the example has both on the compute nodes only).
    assert one_node_jobs(sweep) == 3
    cost = estimate(sweep.plans.values(), config, [], node_jobs=3)
    runs = cb_config.plan_runs(cb_config.load([root / "config" / "site.example.yaml"]))
    assert cost.jobs == {kind: sum(r.kind == kind for r in runs) for kind in ("train", "netbench")}
    assert cost.runs == len(runs) and cost.local_jobs == len(runs) + 2  # a parse per run, tables, report
    assert cost.allocations == {n: sum(r.nodes == n for r in runs) for n in config["scaling"]["nodes"]}
    assert cost.nodes == sum(r.nodes for r in runs) and cost.slurm
    assert cost.worst_node_hours == pytest.approx((sum(r.nodes for r in runs) + 3)
                                                  * config["slurm"]["runtime_minutes"] / 60)
    timeouts = {"train": config["benchmark"]["timeout_s"], "netbench": config["netbench"]["timeout_s"]}
    assert cost.timeout_node_hours == pytest.approx(sum(r.nodes * timeouts[r.kind] for r in runs) / 3600)
    assert cost.expected_node_hours is None and cost.expected_runs == 0 and cost.unmeasured_runs == len(runs)
    # At one node the ethernet runs measure what the infiniband runs do (issue 36): said before submitting.
    assert cost.one_node_repeats == sum(r.nodes == 1 and r.fabric == "ethernet" for r in runs) > 0
    assert cost.one_node_fabrics == ("infiniband", "ethernet")
    assert (f"  one node     {cost.one_node_repeats} runs at one node over a second fabric (infiniband, ethernet): "
            "their ranks talk through shared memory, not a network, so they compare no fabric; the report marks "
            "these rows") in format_estimate(cost, "nowhere").splitlines()
    # A fabric that shuts shared memory out crosses its network stack on one node too: not counted.
    tcp_only = cb_config.merge(config, {"fabrics": {"ethernet": {"env": {"OMPI_MCA_btl": "self,tcp",
                                                                          "UCX_TLS": "tcp,self"}}}})
    assert estimate(plan_sweep(tcp_only, root, probe=False).plans.values(), tcp_only, []).one_node_repeats == 0


def test_without_slurm_the_worst_case_is_every_run_to_its_own_timeout(tmp_path):
    from containerbench.cost import estimate

    config = tiny_config(tmp_path, netbench={"timeout_s": 300})
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, [])
    runs = cb_config.plan_runs(config)
    assert not cost.slurm and cost.timeout_node_hours is None
    timeouts = {"train": 600, "netbench": 300}  # TINY's benchmark.timeout_s, and the override above
    assert cost.worst_node_hours == pytest.approx(sum(r.nodes * timeouts[r.kind] for r in runs) / 3600)
    assert cost.worst_basis == "every run to its own timeout, benchmark.timeout_s = 600 s, netbench.timeout_s = 300 s"


def test_the_expected_cost_is_the_wall_time_of_the_last_ok_run_at_each_point(tmp_path):
    from containerbench.cost import estimate

    config = tiny_config(tmp_path)  # the sweep the recorded runs are the first repetition of
    records = loaded(recorded_records_in(tmp_path / "runs"))
    wall = {(r["kind"], r["spec"]["ranks"]): r["wall_s"] for r in records}
    runs = cb_config.plan_runs(config)
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, records)
    assert cost.expected_node_hours == pytest.approx(sum(r.nodes * wall[(r.kind, r.ranks)] for r in runs) / 3600)
    assert (cost.expected_runs, cost.unmeasured_runs, cost.records_used, cost.records_read) == (len(runs), 0, 3, 3)
    assert cost.measured_unix == (min(r["started_unix"] for r in records), max(r["started_unix"] for r in records))


def test_a_later_ok_run_replaces_an_earlier_one_and_a_failed_run_is_no_measurement(tmp_path):
    from containerbench.cost import estimate

    day_later = {markers.LAUNCH: lambda launch: launch.update(started_unix=launch["started_unix"] + 86400),
                 markers.EXIT: lambda exit_: exit_.update(wall_s=40.0)}
    failed = {markers.LAUNCH: lambda launch: launch.update(started_unix=launch["started_unix"] + 2 * 86400),
              markers.EXIT: lambda exit_: exit_.update(returncode=1, wall_s=99.0)}
    records = loaded(recorded_records_in(tmp_path / "runs", [
        ("later", "train_bare-metal_tcp-loopback_1x1_b2_rep1", day_later),
        ("failed", "train_bare-metal_tcp-loopback_1x2_b2_rep1", failed)]))
    status = {r["log"]["path"].rsplit("/", 1)[1]: r["status"] for r in records}
    assert status["later.log"] == "ok" and status["failed.log"] == "failed"
    first_2_ranks = next(r["wall_s"] for r in records if r["run_id"] == "train_bare-metal_tcp-loopback_1x2_b2_rep1"
                         and r["status"] == "ok")
    config = tiny_config(tmp_path, netbench={"enabled": False})
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, records)
    per_point = config["benchmark"]["repetitions"]
    assert cost.expected_node_hours == pytest.approx(per_point * (40.0 + first_2_ranks) / 3600)
    assert cost.records_used == 2 and cost.records_ok == 4 and cost.records_read == 5


def test_more_steps_than_measured_add_the_measured_step_time(tmp_path):
    import statistics

    from containerbench.cost import estimate

    config = tiny_config(tmp_path, benchmark={"steps": 12, "warmup_steps": 2})  # recorded: 1 + 2 (+ 1 probe)
    records = loaded(recorded_records_in(tmp_path / "runs"))
    expected = {}
    for record in records:
        more = 0 if record["kind"] == "netbench" else (12 - 2) + (2 - 1)
        steps = [s for rank in (record["result"].get("per_rank") or []) for s in rank["step_s"]]
        expected[(record["kind"], record["spec"]["ranks"])] = record["wall_s"] + (
            more * statistics.median(steps) if more else 0)
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, records)
    runs = cb_config.plan_runs(config)
    assert cost.expected_node_hours == pytest.approx(sum(r.nodes * expected[(r.kind, r.ranks)] for r in runs) / 3600)
    assert cost.unmeasured_runs == 0


def test_points_never_measured_are_counted_not_guessed(tmp_path):
    from containerbench.cost import estimate

    config = tiny_config(tmp_path, benchmark={"batch_sizes": [4]})  # recorded: batch 2 only
    records = loaded(recorded_records_in(tmp_path / "runs"))
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, records)
    trains = sum(r.kind == "train" for r in cb_config.plan_runs(config))
    netbench = next(r["wall_s"] for r in records if r["kind"] == "netbench")
    assert (cost.expected_runs, cost.unmeasured_runs) == (1, trains)
    assert cost.expected_node_hours == pytest.approx(netbench / 3600)
    other_site = tiny_config(tmp_path, system="elsewhere")  # the same shapes measured on another system
    cost = estimate(plan_sweep(other_site, tmp_path, probe=False).plans.values(), other_site, records)
    assert cost.expected_node_hours is None and cost.records_used == 0


def test_a_point_never_measured_is_expected_from_the_nearest_run_of_its_benchmark(tmp_path):
    import statistics

    from containerbench.cost import estimate, format_estimate

    # Measured: 1 node, 1 warmup + 2 steps + 1 probe step. Asked: 1 and 2 nodes, 2 warmup + 12 steps + 1 probe.
    config = tiny_config(tmp_path, scaling={"nodes": [1, 2]}, benchmark={"steps": 12, "warmup_steps": 2})
    records = loaded(recorded_records_in(tmp_path / "runs"))
    by_benchmark = {(r["kind"], r["spec"]["ranks_per_node"]): r for r in records}
    runs = cb_config.plan_runs(config)
    hours, like = 0.0, 0
    for run in runs:
        record = by_benchmark.get((run.kind, run.ranks_per_node))
        if record is None:  # the network benchmark at one rank a node: never measured, no figure
            continue
        seconds = record["wall_s"]
        if run.kind == "train":  # its start-up and exit, and its median step time for each step asked
            step = statistics.median(s for rank in record["result"]["per_rank"] for s in rank["step_s"])
            seconds = record["wall_s"] - (1 + 2 + 1) * step + (2 + 12 + 1) * step
        hours += run.nodes * seconds / 3600
        like += run.nodes == 2
    cost = estimate(plan_sweep(config, tmp_path, probe=False).plans.values(), config, records)
    unmeasured = sum(r.kind == "netbench" and r.nodes == 2 for r in runs)
    assert (cost.expected_runs, cost.nearest_runs, cost.unmeasured_runs) == (len(runs) - unmeasured, like, unmeasured)
    assert like == sum(r.kind == "train" and r.nodes == 2 for r in runs) > 0 and unmeasured > 0
    assert cost.expected_node_hours == pytest.approx(hours)
    line = next(line for line in format_estimate(cost, "here").splitlines() if line.startswith("  expected"))
    assert line.endswith(f"of {len(runs)} runs, from the last ok run at each point, or for {like} the nearest ok run "
                         "of the same benchmark at another point (its start-up and step time, not the traffic of more "
                         f"nodes); {unmeasured} run{'s' * (unmeasured > 1)} without an earlier ok run of its "
                         "benchmark, no figure for those")


def test_the_nearest_run_of_a_benchmark_crossed_nodes_over_the_same_fabric_then_is_the_same_runtime():
    from containerbench.cost import _nearest_of_benchmark
    from containerbench.plans import RunPlan

    def measured(runtime, nodes, fabric="ib", started=0.0):
        return ({"spec": {"runtime": runtime, "mpi_model": "hybrid", "nodes": nodes, "fabric": fabric},
                 "started_unix": started}, 4)

    def plan(nodes, fabric="ib"):
        return RunPlan(f"train_podman_{fabric}_{nodes}x4_b32_rep1", {"runtime": "podman", "mpi_model": "hybrid",
                                                                    "nodes": nodes, "fabric": fabric}, [], {}, 60.0)

    one_node, other_fabric = measured("podman", 1), measured("podman", 8, "eth")
    bare_metal, two_nodes, sixteen = measured("bare-metal", 8), measured("podman", 2), measured("podman", 16, started=5)
    # Across nodes: a run that crossed nodes over the same fabric first (its step holds the traffic), then the
    # nearest node count (by ratio: 16 is nearer 8 than 2 is), then the same runtime.
    assert _nearest_of_benchmark(plan(8), [one_node, other_fabric, bare_metal, two_nodes, sixteen]) == bare_metal
    assert _nearest_of_benchmark(plan(8), [one_node, other_fabric, two_nodes, sixteen]) == sixteen
    assert _nearest_of_benchmark(plan(8), [one_node, other_fabric]) == other_fabric
    assert _nearest_of_benchmark(plan(8), [one_node]) == one_node and _nearest_of_benchmark(plan(8), []) is None
    # On one node: a one-node run of any fabric before any that crossed nodes.
    assert _nearest_of_benchmark(plan(1, "eth"), [two_nodes, bare_metal, one_node]) == one_node
    # The same shape only (the fleet's deadlines): as many nodes, over the same fabric where they cross.
    assert _nearest_of_benchmark(plan(8), [one_node, other_fabric, sixteen], same_shape=True) is None
    assert _nearest_of_benchmark(plan(8), [other_fabric, bare_metal], same_shape=True) == bare_metal


def test_calibration_runs_each_benchmark_bare_metal_on_the_fewest_nodes_and_across_nodes_over_each_fabric(root):
    from containerbench.cost import CALIBRATION_STEPS, calibration_plans, calibration_runs

    config = cb_config.load([root / "config" / "site.example.yaml"])
    sweep = plan_sweep(config, root, probe=False)
    chosen = calibration_runs(sweep)
    assert [run.run_id for run in chosen] == [
        "netbench_bare-metal_ethernet_1x2_rep0", "netbench_bare-metal_ethernet_2x1_rep0",
        "netbench_bare-metal_infiniband_1x2_rep0", "netbench_bare-metal_infiniband_2x1_rep0",
        "train_bare-metal_ethernet_2x4_b128_rep0", "train_bare-metal_ethernet_2x4_b64_rep0",
        "train_bare-metal_infiniband_1x4_b128_rep0", "train_bare-metal_infiniband_1x4_b64_rep0",
        "train_bare-metal_infiniband_2x4_b128_rep0", "train_bare-metal_infiniband_2x4_b64_rep0"]
    # Every benchmark of the sweep (as the estimate groups runs) has one; 10 runs of the sweep's 312.
    assert len(sweep.runs) == 312 and all(run.repetition == 0 for run in chosen)
    plans = calibration_plans(sweep, chosen)
    assert sorted(plans) == [run.run_id for run in chosen]
    for run_plan in plans.values():
        assert run_plan.telemetry is None and "--telemetry-dir" not in run_plan.benchmark_args
        if run_plan.spec["kind"] == "train":
            steps = run_plan.benchmark_args[run_plan.benchmark_args.index("--steps") + 1]
            assert int(steps) == min(config["benchmark"]["steps"], CALIBRATION_STEPS) == run_plan.spec["steps"]
    # The sweep's own plans are untouched: its runs take the config's steps, with telemetry.
    assert all(p.telemetry for p in sweep.plans.values())


def plan_estimate(argv, capsys):
    from containerbench.cli import main

    returncode = main(["plan", "--estimate", *argv])
    out, err = capsys.readouterr()
    return returncode, out, err


def test_plan_estimate_prints_jobs_allocations_and_the_expected_cost_from_the_records(tmp_path, capsys):
    config = tiny_config(tmp_path)
    records = loaded(recorded_records_in(tmp_path / "measured"))
    runs = cb_config.plan_runs(config)
    wall = {(r["kind"], r["spec"]["ranks"]): r["wall_s"] for r in records}
    expected_hours = sum(r.nodes * wall[(r.kind, r.ranks)] for r in runs) / 3600
    returncode, out, err = plan_estimate(["--config", str(ROOT / "config" / "config.yaml"),
                                          "--config", str(tmp_path / "tiny.yaml"),
                                          "--records", str(tmp_path / "measured")], capsys)
    assert returncode == 0 and err == ""
    trains = sum(r.kind == "train" for r in runs)
    worst_hours = (trains * 600 + (len(runs) - trains) * 900) / 3600
    measured = sorted({time.strftime("%Y-%m-%d", time.gmtime(r["started_unix"])) for r in records})
    assert len(measured) == 1  # the recorded runs ran on one day
    assert out.splitlines() == [
        "What this sweep costs:",
        f"  jobs         {len(runs)} measurement jobs, one per run ({trains} train, {len(runs) - trains} netbench), "
        "run here by mpirun, no Slurm job",
        "               1 one-node job besides: the pre-flight check",
        f"               {len(runs) + 2} more: a parse per run, tables, report",
        f"  allocations  {len(runs)} nodes in {len(runs)} runs: {len(runs)} of 1 node",
        f"  worst case   {worst_hours:.2g} node-hours: every run to its own timeout, benchmark.timeout_s = 600 s, "
        "netbench.timeout_s = 900 s",
        f"  expected     {expected_hours:.2g} node-hours for {len(runs)} of {len(runs)} runs, "
        "from the last ok run at each point",
        f"  rates from   3 of 3 records in {tmp_path / 'measured'} (3 ok), measured {measured[0]} (UTC)",
    ]


def test_plan_estimate_of_one_run_as_json(tmp_path, capsys):
    tiny_config(tmp_path)
    recorded_records_in(tmp_path / "measured")
    configs = ["--config", str(ROOT / "config" / "config.yaml"), "--config", str(tmp_path / "tiny.yaml")]
    returncode, out, _ = plan_estimate([*configs, "--records", str(tmp_path / "measured" / "*.json"), "--json",
                                        "--run-id", "train_bare-metal_tcp-loopback_1x2_b2_rep2"], capsys)
    cost = json.loads(out)
    assert returncode == 0 and cost["jobs"] == {"train": 1} and cost["allocations"] == {"1": 1}
    wall = parse_log(ROOT / "tests" / "data" / "runs" / "train_bare-metal_tcp-loopback_1x2_b2_rep1.log")["wall_s"]
    assert cost["expected_node_hours"] == pytest.approx(wall / 3600) and cost["records_used"] == 1
    returncode, out, err = plan_estimate([*configs, "--run-id", "train_nothing_rep1"], capsys)
    assert returncode == 2 and err == "plan: --run-id 'train_nothing_rep1' is not a run of this sweep\n"


def test_plan_reads_records_only_for_an_estimate(tmp_path, capsys):
    from containerbench.cli import main

    assert main(["plan", "--records", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "plan: --records is read only with --estimate\n"


def test_plan_estimate_reads_the_configs_results_by_default_and_says_when_there_are_none(tmp_path, capsys):
    results = tmp_path / "results"
    runs = cb_config.plan_runs(tiny_config(tmp_path, results_dir=str(results), scaling={"nodes": [1, 2]}))
    on = {n: sum(r.nodes == n for r in runs) for n in (1, 2)}  # the recorded runs ran on 1 node
    configs = ["--config", str(ROOT / "config" / "config.yaml"), "--config", str(tmp_path / "tiny.yaml")]
    returncode, out, _ = plan_estimate(configs, capsys)
    assert returncode == 0
    assert (f"  expected     none: no earlier ok run of the benchmark of any of the {len(runs)} runs (the workflow's "
            "calibrate target makes one of each)") in out.splitlines()
    assert out.splitlines()[-1] == f"  rates from   no run records in {results}/runs/*.json"
    assert (f"  allocations  {on[1] + 2 * on[2]} nodes in {len(runs)} runs: {on[1]} of 1 node, {on[2]} of 2 nodes"
            in out.splitlines())
    recorded_records_in(results / "runs")
    returncode, out, _ = plan_estimate(configs, capsys)
    # At 2 nodes: training from the 1-node runs of its benchmark; the network benchmark (one rank a node) none.
    like, none = (sum(r.nodes == 2 and r.kind == kind for r in runs) for kind in ("train", "netbench"))
    assert returncode == 0 and f"node-hours for {on[1] + like} of {len(runs)} runs, from the last ok run at each " \
        f"point, or for {like} the nearest ok run of the same benchmark" in out
    assert f"; {none} run without an earlier ok run of its benchmark, no figure for those" in out
    assert f"  rates from   3 of 3 records in {results}/runs/*.json (3 ok)" in out
    # The calibration runs' records (the workflow's calibrate target) are read beside the sweep's.
    (results / "calibration").mkdir()
    netbench = results / "runs" / "netbench_bare-metal_tcp-loopback_1x2_rep1.json"
    record = json.loads(netbench.read_text())
    record["run_id"] = "netbench_bare-metal_tcp-loopback_1x2_rep0"
    (results / "calibration" / f"{record['run_id']}.json").write_text(json.dumps(record))
    netbench.unlink()
    (results / "calibration" / "notes.json").write_text("{}")  # not a run's record: not read
    returncode, out, _ = plan_estimate(configs, capsys)
    assert returncode == 0 and f"node-hours for {on[1] + like} of {len(runs)} runs" in out
    assert (f"  rates from   3 of 3 records in {results}/runs/*.json and {results}/calibration/*_rep0.json (3 ok)"
            in out)


@pytest.mark.parametrize("given,what", [("no-such-dir", "does not exist"), ("no-such-dir/*.json", "matches no file")])
def test_plan_estimate_names_records_it_cannot_read_in_one_line(tmp_path, capsys, given, what):
    tiny_config(tmp_path)
    path = str(tmp_path / given)
    returncode, out, err = plan_estimate(["--config", str(ROOT / "config" / "config.yaml"),
                                          "--config", str(tmp_path / "tiny.yaml"), "--records", path], capsys)
    assert returncode == 2 and out == ""
    assert err == (f"records: {path!r} {what}; allowed: a directory of run records, a record file, "
                   "or a glob that matches some\n")


def test_plan_piped_into_head_stops_quietly(tmp_path):
    # Enroot where the workflow plans, as a site without Pyxis on the compute nodes would declare it.
    here = tmp_path / "enroot-here.yaml"
    here.write_text("images: {enroot: {available: everywhere}}\n")
    done = subprocess.run(f"{shlex.quote(sys.executable)} -m containerbench plan --config config/site.example.yaml "
                          f"--config {here} | head -1", shell=True, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, executable="/bin/bash")
    assert done.stdout == "train_bare-metal_infiniband_1x4_b64_rep1\n"
    # Quietly: no second error at exit. The one line is what the workflow would do with Enroot here
    # (not installable on this machine), said before the runs it lists (issue 36: the plan listed runs
    # the workflow then did not run, in silence).
    assert done.stderr.splitlines() == ["containerbench: note: enroot cannot run here: enroot is not installed (not "
                                        "on PATH); the workflow stops before any job (runtime_policy: require)"]
    # The example as written has Enroot on the compute nodes only: nothing to say where it plans.
    done = subprocess.run(f"{shlex.quote(sys.executable)} -m containerbench plan --config config/site.example.yaml "
                          "| head -1", shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          executable="/bin/bash")
    assert (done.stdout, done.stderr) == ("train_bare-metal_infiniband_1x4_b64_rep1\n", "")


@pytest.mark.parametrize("kind", ["mpirun", "srun"])
@pytest.mark.parametrize("bind", ["core", "socket", "none"])
def test_the_record_reads_from_the_launch_line_whether_a_core_per_rank_was_asked(tmp_path, kind, bind):
    """records.judge_binding holds the ranks to a core each only where the run's own argv asked for it:
    mpirun --bind-to core, MPICH's Hydra -bind-to core (native runs), srun --cpu-bind=cores."""
    from containerbench.records import asks_a_core_per_rank

    config = tiny_config(tmp_path, launcher={"kind": kind, "bind": bind}, runtimes=["bare-metal", "podman"],
                         images={"podman": {"image": "localhost/cb:test", "mpi_model": ["hybrid", "native"]}})
    plans = [plan_run(spec, config) for spec in cb_config.plan_runs(config) if spec.ranks == 2]
    assert {plan.argv[0] for plan in plans} == ({"mpirun", "mpiexec.mpich"} if kind == "mpirun" else {"srun"})
    assert {asks_a_core_per_rank(plan.argv) for plan in plans} == {bind == "core"}


def test_a_site_names_a_newer_nccl_and_every_runtime_of_the_example_loads_it(tmp_path):
    # docs/slurm.md, "The GPU environment": the site's libnccl.so.2 preloaded by the fabrics' env and its
    # directory bound. How each runtime passes a variable and a bind in is held against its own docs in
    # test_runtime_docs.py; here, that the two keys the docs give reach every runtime of the example.
    site = tmp_path / "site.yaml"
    config = yaml.safe_load((ROOT / "config" / "site.example.yaml").read_text())
    config["images"]["binds"] = ["/sw/nccl/2.21.5"]
    for fabric in config["fabrics"].values():
        fabric["env"]["LD_PRELOAD"] = "/sw/nccl/2.21.5/lib/libnccl.so.2"
    site.write_text(yaml.safe_dump(config))
    sweep = plan_sweep(cb_config.load([site]), ROOT, probe=False)
    for runtime, loaded, bound in (
            ("bare-metal", "LD_PRELOAD", None),
            ("apptainer", "APPTAINERENV_LD_PRELOAD", ["--bind", "/sw/nccl/2.21.5"]),
            ("enroot", "LD_PRELOAD", None)):
        for fabric in ("infiniband", "ethernet"):
            plan = sweep.plans[f"train_{runtime}_{fabric}_2x4_b64_rep1"]
            assert plan.env[loaded] == "/sw/nccl/2.21.5/lib/libnccl.so.2", (runtime, fabric)
            words = " ".join(plan.argv)
            assert (" ".join(bound) in words if bound else
                    runtime == "bare-metal" or "/sw/nccl/2.21.5:/sw/nccl/2.21.5" in words), (runtime, words)


def test_plan_estimate_reads_the_systems_last_sweeps_in_the_results_store_too(tmp_path, capsys):
    # Issue 36: the expected cost from the history when it has the points, though results/ is new.
    from containerbench import history

    store = tmp_path / "store.sqlite"
    config = tiny_config(tmp_path, results_dir=str(tmp_path / "fresh-results"), history={"store": str(store)})
    records = loaded(recorded_records_in(tmp_path / "measured"))
    history.store(store, records)  # an earlier sweep of system ci
    runs = cb_config.plan_runs(config)
    configs = ["--config", str(ROOT / "config" / "config.yaml"), "--config", str(tmp_path / "tiny.yaml")]
    returncode, out, _ = plan_estimate(configs, capsys)
    assert returncode == 0
    assert (f"  rates from   3 of 3 records in {tmp_path}/fresh-results/runs/*.json and {store} (1 session of "
            "system ci) (3 ok), measured ") in out
    assert f"node-hours for {len(runs)} of {len(runs)} runs, from the last ok run at each point" in out
    # A run that is both in results/ and stored counts once.
    recorded_records_in(tmp_path / "fresh-results" / "runs")
    returncode, out, _ = plan_estimate(configs, capsys)
    assert "  rates from   3 of 3 records in" in out
    # Another system's sweeps, and fleet batches, are not this sweep's history.
    (tmp_path / "other").mkdir()
    other = tiny_config(tmp_path / "other", system="elsewhere", history={"store": str(store)})
    assert cost_records_of(other) == []
    history.store(store, [{**record, "run_id": f"{record['run_id']}-node", "log": {**record["log"], "sha256": "f" * 64},
                           "spec": {**record["spec"], "nodelist": ["n1"]}} for record in records[:1]])
    assert history.sessions(store)["kind"].tolist() == ["sweep", "fleet"]
    assert len(cost_records_of(config)) == 3  # the fleet batch's record is not read


def cost_records_of(config):
    from containerbench.cli.sweep import stored_sweeps

    return stored_sweeps(config)[0]
