"""The plan as a typed object (its JSON round trip), planning that leaves the config as it was, and the
one Slurm allocation strategy chosen when planning."""

from __future__ import annotations

import copy
import json

import pytest
from helpers import tiny_config

from containerbench import config as cb_config
from containerbench.launchers import LAUNCHERS, Allocation, allocation_for
from containerbench.plans import RunPlan, measurement_priorities, plan_run, plan_sweep, run_order


def test_a_plan_round_trips_through_its_json_and_keeps_the_form_the_workflow_passes(tmp_path):
    config = tiny_config(tmp_path)
    for spec in cb_config.plan_runs(config):
        run_plan = plan_run(spec, config)
        assert RunPlan.from_json(run_plan.to_json()) == run_plan
        assert RunPlan.from_json(json.loads(run_plan.to_json())) == run_plan
        # What the benchmark module is given is carried, not found again in argv.
        assert run_plan.argv[-len(run_plan.benchmark_args):] == list(run_plan.benchmark_args)
        assert set(run_plan.as_dict()) == {"run_id", "spec", "argv", "env", "timeout_s", "exit_grace_s", "image",
                                           "fabric", "telemetry"}


def test_planning_leaves_the_config_as_the_user_wrote_it(tmp_path):
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman", "charliecloud"], benchmark={"data": ["real"]})
    before = copy.deepcopy(config)
    sweep = plan_sweep(config, tmp_path, probe=False)
    assert config == before
    # What planning resolved is in the sweep's config: the built images, the data sample.
    assert sweep.config["dataset"]["path"] == sweep.dataset_sample and not config["dataset"]["path"]
    assert sweep.config["images"]["podman"]["image"] and "image" not in (config["images"].get("podman") or {})


def test_each_launcher_kind_of_the_config_has_its_launcher():
    assert set(LAUNCHERS) == {"none", "mpirun", "srun"}


def test_no_slurm_launcher_allocates_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    config = tiny_config(tmp_path)
    assert allocation_for(config) is Allocation.NONE
    assert plan_run(cb_config.plan_runs(config)[0], config).strategy is Allocation.NONE


def srun_config(tmp_path):
    return tiny_config(tmp_path, launcher={"kind": "srun"}, scaling={"nodes": [1], "ranks_per_node": [1]})


def test_srun_from_outside_any_allocation_asks_salloc_for_each_run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = srun_config(tmp_path)
    assert allocation_for(config) is Allocation.PER_RUN
    run_plan = plan_run(cb_config.plan_runs(config)[0], config)
    assert run_plan.allocation[0] == "salloc" and run_plan.strategy is Allocation.PER_RUN
    assert RunPlan.from_json(run_plan.to_json()).allocation == run_plan.allocation


def test_srun_inside_an_allocation_makes_each_run_a_job_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    config = srun_config(tmp_path)
    assert allocation_for(config) is Allocation.STEP
    run_plan = plan_run(cb_config.plan_runs(config)[0], config)
    assert run_plan.allocation is None and run_plan.strategy is Allocation.STEP


def test_a_fleet_jobs_runs_share_their_jobs_allocation(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = srun_config(tmp_path)
    assert allocation_for(config, job_of_runs=True) is Allocation.PER_JOB and Allocation.PER_JOB.asks_salloc
    assert plan_run(cb_config.plan_runs(config)[0], config, Allocation.PER_JOB).allocation is None


def test_the_runs_of_a_repetition_take_turns_at_going_first(tmp_path):
    """The default sweep's shape (3 runtimes, 1 and 2 ranks, netbench in the first repetition), 3 repetitions:
    each runtime runs first at each rank count once, and the comparisons' arms are not always in one order."""
    config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud", "podman"],
                         benchmark={"repetitions": 3})
    runs = cb_config.plan_runs(config)
    order = run_order(runs)
    assert sorted(order) == sorted(run.run_id for run in runs)
    by_repetition: dict[int, list] = {}
    for run in sorted(runs, key=lambda run: (run.repetition, order[run.run_id])):
        by_repetition.setdefault(run.repetition, []).append(run)
    assert sorted(by_repetition) == [1, 2, 3]
    for members in by_repetition.values():
        assert [order[run.run_id] for run in members] == list(range(len(members)))  # places 0, 1, ... within each
    first = {}  # (kind, ranks) -> the runtime that ran first at that rank count, per repetition
    for repetition, members in by_repetition.items():
        for run in members:
            first.setdefault((run.kind, run.ranks), {}).setdefault(repetition, run.runtime)
    for (kind, ranks), runtimes in first.items():
        if kind == "train":
            assert sorted(runtimes.values()) == ["bare-metal", "charliecloud", "podman"], (ranks, runtimes)
    blocks = [[run.ranks for run in members if run.kind == "train"] for members in by_repetition.values()]
    assert [block[0] for block in blocks] == [1, 2, 1]  # the rank counts' blocks take turns too

    priorities = measurement_priorities(runs, below=1_000_000)
    ranked = sorted(runs, key=lambda run: -priorities[run.run_id])  # Snakemake starts the highest first
    assert [run.run_id for run in ranked] == [run.run_id for members in by_repetition.values() for run in members]
    with pytest.raises(cb_config.ConfigError) as refused:
        measurement_priorities(runs, below=10)
    assert str(refused.value) == (f"config: {len(runs)} runs in 3 repetitions are too many to order by priority "
                                  "below 10; allowed: fewer runs or repetitions per sweep")



def node_image_step(run_plan: RunPlan) -> list[str]:
    """The node-image command of a plan's node_prepare, less what starts it on each node."""
    return run_plan.node_prepare[run_plan.node_prepare.index("-m") - 1:]


def test_a_docker_or_podman_run_under_slurm_loads_the_image_on_each_of_its_nodes_first(tmp_path, monkeypatch):
    """Issue 32, finding 1: each node has its own dockerd, and podman a store per user per node
    (containers-storage.conf(5): graphroot, runroot), so the image loaded where the workflow plans is not
    on the other nodes. A run under Slurm first runs `containerbench node-image` once on each of its nodes
    (srun, one task a node, before the ranks' step), with the shared archive to load from; the workflow
    gives the run that archive as an input (kept, not temp: made again, it would outdate every run)."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman", "docker", "charliecloud", "podman-hpc"],
                         launcher={"kind": "srun"}, scaling={"nodes": [2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    for spec in sweep.runs:
        run_plan, needs = sweep.plans[spec.run_id], sweep.inputs[spec.run_id]
        if spec.runtime == "bare-metal":
            assert run_plan.node_prepare is None and "archive" not in needs, spec.run_id
            continue
        if spec.runtime in ("charliecloud", "podman-hpc"):  # every node reads one shared copy: asked, not loaded
            assert "archive" not in needs, spec.run_id
            continue
        stamp = sweep.artifacts[cb_config.ImageUse.of(spec)]
        assert needs["archive"] == f"{tmp_path}/build/images/containerbench-latest.tar" and needs["image"] == stamp
        assert run_plan.node_prepare[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--export=ALL"]
        assert node_image_step(run_plan)[1:] == [
            "-m", "containerbench", "node-image", "--engine", spec.runtime, "--image",
            "localhost/containerbench:latest", "--stamp", stamp, "--archive", needs["archive"]]
        assert RunPlan.from_json(run_plan.to_json()).node_prepare == run_plan.node_prepare


def test_each_node_is_asked_for_the_shared_copy_podman_hpc_and_charliecloud_run(tmp_path, monkeypatch):
    """Issue 32: every record names the image each of its nodes ran. podman-hpc's nodes run the squashed copy in
    SQUASH_DIR, a shared directory (podman-hpc 1.2.2 README, "migrate"; siteconfig.py adds it as an
    additionalimagestore), and Charliecloud's the image directory on the shared filesystem: nothing is loaded, but
    each node is asked which image it sees there (one task a node, as node-image does for docker and podman). Under
    mpirun on several nodes no step reaches each node, and the run goes without (as before), not refused."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = tiny_config(tmp_path, runtimes=["charliecloud", "podman-hpc"], launcher={"kind": "srun"},
                         scaling={"nodes": [2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    for spec in sweep.runs:
        run_plan = sweep.plans[spec.run_id]
        assert run_plan.node_prepare[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--export=ALL"]
        step = node_image_step(run_plan)[1:]
        if spec.runtime == "charliecloud":
            assert step == ["-m", "containerbench", "node-image", "--engine", "charliecloud", "--image",
                            f"{tmp_path}/build/images/containerbench-latest.ch"]
        else:
            assert step == ["-m", "containerbench", "node-image", "--engine", "podman-hpc", "--image",
                            "localhost/containerbench:latest", "--stamp",
                            f"{tmp_path}/build/images/podman-hpc-containerbench-latest.json"]
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # mpirun inside an allocation places ranks on its nodes, even on one
    config = tiny_config(tmp_path, runtimes=["charliecloud", "podman-hpc"],
                         scaling={"nodes": [1, 2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    assert {spec.nodes for spec in sweep.runs} == {1, 2}
    assert all(plan.node_prepare is None for plan in sweep.plans.values())


def test_a_site_image_podman_hpc_pulls_itself_gets_no_node_step(tmp_path, monkeypatch):
    """A podman-hpc image the site supplies is pinned by digest, and `podman-hpc shared-run` runs podman, which pulls
    an image a node lacks (podman-run(1), --pull: "missing" by default): nothing the workflow migrated to ask the
    nodes for, so no step stands between the run and that pull, as before."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    pinned = "registry.example.org/containerbench@sha256:" + "1" * 64
    config = tiny_config(tmp_path, runtimes=["podman-hpc"], launcher={"kind": "srun"},
                         images={"podman-hpc": {"image": pinned}}, scaling={"nodes": [2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    assert sweep.runs and all(plan.node_prepare is None for plan in sweep.plans.values())


def test_a_local_podman_run_checks_the_image_here_without_loading_an_archive(tmp_path):
    """Without Slurm the ranks start where the workflow loaded the image: the step only asks this store
    for the id (which the record keeps), and nothing waits for an archive."""
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"])
    sweep = plan_sweep(config, tmp_path, probe=False)
    spec = next(spec for spec in sweep.runs if spec.runtime == "podman")
    run_plan = sweep.plans[spec.run_id]
    assert run_plan.node_prepare[1:] == ["-m", "containerbench", "node-image", "--engine", "podman", "--image",
                                         "localhost/containerbench:latest", "--stamp",
                                         sweep.artifacts[cb_config.ImageUse.of(spec)]]
    assert "archive" not in sweep.inputs[spec.run_id]


def test_calibration_and_fleet_runs_put_the_built_image_on_their_nodes_as_the_sweeps_do(tmp_path, monkeypatch):
    """A calibration run (cost.calibration_plans) and a fleet job's run (fleetjobs.FleetJobs) are planned from
    the same built images as the sweep's: their node-image step checks the stamp and loads the archive,
    and a fleet job waits for both files (FleetJobs.images)."""
    from containerbench import cost, fleet, fleetjobs, fleetplan

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = tiny_config(tmp_path, runtimes=["podman"], launcher={"kind": "srun"},
                         scaling={"nodes": [1, 2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    stamp = f"{tmp_path}/build/images/podman-containerbench-latest.json"
    archive = f"{tmp_path}/build/images/containerbench-latest.tar"
    calibrations = cost.calibration_plans(sweep, cost.calibration_runs(sweep))
    assert calibrations
    for run_plan in calibrations.values():
        assert node_image_step(run_plan)[-4:] == ["--stamp", stamp, "--archive", archive]
    batch = fleetplan.plan_batch({name: fleet.NodeState(name, "idle") for name in ("n1", "n2")})
    jobs = fleetjobs.FleetJobs(sweep.config, batch, str(tmp_path / "fleet"), artifacts=sweep.artifacts)
    assert jobs.images() == [archive, stamp]
    for spec in jobs.runs[("link", "n1+n2")]:
        assert node_image_step(jobs.plan(spec))[-4:] == ["--stamp", stamp, "--archive", archive]


def test_a_docker_or_podman_run_on_nodes_no_srun_reaches_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # mpirun inside an allocation may span its nodes
    config = tiny_config(tmp_path, runtimes=["podman"], scaling={"nodes": [2], "ranks_per_node": [1]})
    with pytest.raises(cb_config.ConfigError) as refused:
        plan_sweep(config, tmp_path, probe=False)
    assert str(refused.value) == ("config: runtime 'podman' on 2 nodes under launcher 'mpirun': its image must "
                                  "first be put in each node's own store, which only srun reaches; allowed: "
                                  "launcher srun, or one node")


def test_a_native_run_reads_the_host_mpi_on_each_of_its_nodes_before_its_ranks(tmp_path, monkeypatch):
    """Issue 32, finding 3: the host MPI's closure is read where the ranks run, on every node of the run (srun, one
    task a node, as node-image), not where the workflow plans; and a launch no srun reaches is refused."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    tree = str(tmp_path / "mpich" / "lib")
    native_mpi = {"library": f"{tree}/libmpi.so.12", "library_dirs": [tree]}
    config = tiny_config(tmp_path, runtimes=["bare-metal", "charliecloud"], launcher={"kind": "srun"},
                         images={"charliecloud": {"mpi_model": "native"}}, native_mpi=native_mpi,
                         scaling={"nodes": [2], "ranks_per_node": [1]})
    sweep = plan_sweep(config, tmp_path, probe=False)
    for spec in sweep.runs:
        run_plan = sweep.plans[spec.run_id]
        if spec.runtime == "bare-metal":
            assert run_plan.node_mpi is None and run_plan.native_mpi is None
            continue
        assert run_plan.native_mpi == native_mpi
        assert run_plan.node_mpi[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--export=ALL"]
        assert run_plan.node_mpi[6:] == ["-m", "containerbench", "node-mpi", "--library", f"{tree}/libmpi.so.12",
                                         "--library-dir", tree]
        assert RunPlan.from_json(run_plan.to_json()).node_mpi == run_plan.node_mpi
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # mpirun inside an allocation may span its nodes
    config = tiny_config(tmp_path, runtimes=["charliecloud"], images={"charliecloud": {"mpi_model": "native"}},
                         native_mpi=native_mpi, scaling={"nodes": [2], "ranks_per_node": [1]})
    with pytest.raises(cb_config.ConfigError) as refused:
        plan_sweep(config, tmp_path, probe=False)
    assert str(refused.value) == ("config: runtime 'charliecloud' native on 2 nodes under launcher 'mpirun': the host "
                                  "MPI must first be read on each node, which only srun reaches; allowed: launcher "
                                  "srun, or one node")
