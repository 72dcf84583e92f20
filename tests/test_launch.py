"""Plans (exact argv and environment per launcher) and the executor's raw log."""

from __future__ import annotations

import json
import os
import sys

import pytest
from helpers import BENCH_PYTHON, tiny_config

from containerbench import config as cb_config
from containerbench import markers
from containerbench.launch import execute, plan, prepare
from containerbench.records import parse_log

BENCH_ARGS = ["--model", "resnet50", "--batch-size", "2", "--image-size", "32", "--warmup-steps", "1",
              "--steps", "2", "--precision", "fp32", "--data-format", "channels_last", "--threads", "0",
              "--probe-steps", "1", "--mode", "horovod", "--runtime", "bare-metal"]
FABRIC_ENV = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
              "HOROVOD_GLOO_IFACE": "lo", "NCCL_SOCKET_IFNAME": "lo"}
# Added to every run so each layer logs the network it chose (fabrics.debug_environment).
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV", "UCX_LOG_LEVEL": "info",
             "HOROVOD_LOG_LEVEL": "debug", "OMPI_MCA_btl_base_verbose": "20",
             "OMPI_MCA_mpi_show_mca_params": "enviro,file"}


def spec_for(config, kind="train", ranks_per_node=2):
    return next(r for r in cb_config.plan_runs(config) if r.kind == kind and r.ranks_per_node == ranks_per_node)


def test_mpirun_plan_binds_one_core_per_rank_and_forwards_every_variable(tmp_path):
    config = tiny_config(tmp_path)
    run_plan = plan(spec_for(config), config)
    env = {"CONTAINERBENCH_RUNTIME": "bare-metal", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "1",
           **DEBUG_ENV, **FABRIC_ENV}
    assert run_plan["env"] == env
    forwarded = [arg for name in sorted(env) for arg in ("-x", name)]
    assert run_plan["argv"] == [
        "mpirun", "-np", "2", "--map-by", "ppr:2:node", "--bind-to", "core", "--report-bindings", *forwarded,
        str(BENCH_PYTHON), "-m", "containerbench.bench", *BENCH_ARGS,
    ]
    assert run_plan["spec"] == {"kind": "train", "runtime": "bare-metal", "fabric": "tcp-loopback", "nodes": 1,
                                "ranks_per_node": 2, "ranks": 2, "repetition": 1, "batch_size": 2,
                                "run_id": "train_bare-metal_tcp-loopback_1x2_b2_rep1", "system": "ci",
                                "launcher": "mpirun", "model": "resnet50", "image_size": 32, "precision": "fp32",
                                "xla": False, "data_format": "channels_last", "warmup_steps": 1, "steps": 2,
                                "mode": "horovod", "data": "synthetic"}


def test_srun_plan_uses_the_configured_mpi_plugin(tmp_path):
    config = tiny_config(tmp_path, launcher={"kind": "srun", "srun_mpi": "pmi2", "bind": "socket",
                                             "extra_args": ["--gpus-per-task=1"]},
                         scaling={"nodes": [2], "ranks_per_node": [4]})
    run_plan = plan(spec_for(config, ranks_per_node=4), config)
    assert run_plan["argv"][:10] == ["srun", "--mpi=pmi2", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4",
                                     "--cpus-per-task=1", "--cpu-bind=sockets", "--export=ALL", "--gpus-per-task=1",
                                     str(BENCH_PYTHON)]


def test_netbench_plan_runs_the_netbench_module_on_two_ranks(tmp_path):
    config = tiny_config(tmp_path)
    run_plan = plan(spec_for(config, kind="netbench"), config)
    assert run_plan["argv"][-5:] == [str(BENCH_PYTHON), "-m", "containerbench.netbench", "--max-bytes", "65536"]
    assert run_plan["argv"][:3] == ["mpirun", "-np", "2"]


def test_netbench_runs_at_every_node_count_with_ping_pong_on_the_first_pair_only(tmp_path):
    config = cb_config.merge(tiny_config(tmp_path), {"scaling": {"nodes": [1, 2, 4]},
                                                     "launcher": {"kind": "srun", "srun_mpi": "pmix"}})
    net = {r.nodes: plan(r, config)["argv"] for r in cb_config.plan_runs(config) if r.kind == "netbench"}
    assert sorted(net) == [1, 2, 4]
    assert net[1][:4] == ["srun", "--mpi=pmix", "--nodes=1", "--ntasks=2"] and net[1][-2:] == ["--max-bytes", "65536"]
    assert net[2][:4] == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=2"] and net[2][-2:] == ["--max-bytes", "65536"]
    assert net[4][:4] == ["srun", "--mpi=pmix", "--nodes=4", "--ntasks=4"] and net[4][-1] == "--no-pingpong"


def test_each_runtime_can_name_the_srun_mpi_plugin_its_image_needs(tmp_path):
    # Slurm's MPI guide (mpi_guide.shtml, "srun --mpi"): Open MPI is started through PMIx, MPICH
    # through PMI2; an MPICH-based image under srun needs --mpi=pmi2 while the host's Open MPI keeps pmix.
    config = tiny_config(tmp_path, runtimes=["bare-metal", "apptainer"],
                         launcher={"kind": "srun", "srun_mpi": "pmix"},
                         images={"apptainer": {"image": "/images/mpich.sif", "srun_mpi": "pmi2"}})
    plugins = {r.runtime: plan(r, config)["argv"][1] for r in cb_config.plan_runs(config)}
    assert plugins == {"bare-metal": "--mpi=pmix", "apptainer": "--mpi=pmi2"}


def run_python(tmp_path, code: str, timeout_s=60):
    run_plan = {"run_id": "probe", "spec": {"kind": "train", "ranks": 1}, "argv": [sys.executable, "-c", code],
                "env": {"PROBE": "yes"}, "timeout_s": timeout_s}
    log = tmp_path / "probe.log"
    returncode = execute(run_plan, log, echo=None)
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
    assert execute(run_plan, tmp_path / "nompi.log", echo=None) == 127
    record = parse_log(tmp_path / "nompi.log")
    assert record["status"] == "failed" and "exit code 127" in record["reasons"]
    assert "cannot start 'no-such-mpirun'" in record["evidence"]


def test_mpirun_as_root_gets_allow_run_as_root(tmp_path):
    run_plan = {"run_id": "root", "spec": {}, "argv": ["mpirun", "-np", "1", "true"], "env": {}, "timeout_s": 60}
    execute(run_plan, tmp_path / "root.log", echo=None)
    argv = json.loads((tmp_path / "root.log").read_text().splitlines()[0][len(markers.LAUNCH):])["argv"]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_a_benchmark_that_crashes_leaves_its_log_and_a_failed_record(tmp_path, bench_python):
    # Real benchmark, bad argument: it exits non-zero before training.
    run_plan = {"run_id": "crash", "spec": {"kind": "train", "ranks": 1},
                "argv": [str(bench_python), "-m", "containerbench.bench", "--model", "resnet51"],
                "env": {}, "timeout_s": 120}
    assert execute(run_plan, tmp_path / "crash.log", echo=None) == 2
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
                           "--mode horovod --runtime bare-metal")


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
    collective = plan(runs[("bare-metal", "collective")], config)["argv"]
    assert collective[-8:] == ["--mode", "collective", "--runtime", "bare-metal", "--collective", "nccl",
                               "--data-dir", str(dataset)]
    servers = plan(runs[("podman", "parameter_server")], config)["argv"]
    assert servers[-6:] == ["--runtime", "podman", "--parameter-servers", "2", "--data-dir", str(dataset)]
    # The dataset is bound into the container at the path the benchmark is given.
    assert f"{dataset}:{dataset}" in servers


def test_prepare_plans_every_run_with_the_files_it_needs_and_probes_nothing_unasked(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # a probe would find no runtime and no sinfo
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman", "charliecloud"], benchmark={"data": ["real"]})
    sweep = prepare(config, tmp_path, probe=False)
    assert sweep.skipped == {} and config["runtimes"] == ["bare-metal", "podman", "charliecloud"]
    assert set(sweep.plans) == {run.run_id for run in sweep.runs} == {run.run_id for run in cb_config.plan_runs(config)}
    sample = str(tmp_path / "build" / "data" / "imagenet-sample")
    assert sweep.dataset_sample == sample == config["dataset"]["path"]
    images_dir = tmp_path / "build" / "images"
    assert sweep.inputs["train_podman_tcp-loopback_1x2_b2_real_rep1"] == {
        "image": f"{images_dir}/podman-containerbench-latest.json", "data": sample}
    assert sweep.inputs["train_charliecloud_tcp-loopback_1x1_b2_real_rep2"]["image"] == \
        f"{images_dir}/containerbench-latest.ch"
    assert sweep.inputs["train_bare-metal_tcp-loopback_1x1_b2_real_rep1"] == {"data": sample}
    assert sweep.inputs["netbench_podman_tcp-loopback_1x2_rep1"] == {"image": f"{images_dir}/podman-containerbench-latest.json"}


def test_prepare_with_probes_skips_what_cannot_run_here_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="skip-unusable")
    sweep = prepare(config, tmp_path)
    assert sweep.skipped == {"podman": "podman is not installed (not on PATH)"}
    assert {run.runtime for run in sweep.runs} == {"bare-metal"} and sweep.image_files == {}
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="require")
    with pytest.raises(cb_config.ConfigError, match="^config: runtime 'podman' cannot run here: podman is not installed"):
        prepare(config, tmp_path)


def test_a_runtime_that_cannot_do_what_the_config_asks_is_refused_in_one_line(tmp_path):
    # Charliecloud without --write-fake binds datasets to the image's empty directories: three at most.
    binds = [str(tmp_path / name) for name in ("a", "b", "c", "d")]
    config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud"],
                         images={"binds": binds, "charliecloud": {"write_fake": False}}, benchmark={"data": ["real"]},
                         dataset={"path": str(tmp_path)})
    (tmp_path / "train-00000-of-00001").write_bytes(b"")
    with pytest.raises(cb_config.ConfigError, match=r"^config: runtime 'charliecloud': \d binds need --write-fake"):
        prepare(config, tmp_path, probe=False)
