"""Both frameworks in the container runtimes: `benchmark.frameworks: [tensorflow, pytorch]` runs
TensorFlow + Horovod and PyTorch DDP bare metal, in podman and in Charliecloud, each framework from
its own flavour of containers/Dockerfile (PyTorch's: the lock of .venv-bench-torch, no Horovod, tag
ending in -torch). The records prove one benchmark per framework across runtimes (one provenance
hash each), and the loss trajectories of every container run follow bare metal's."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from helpers import ROOT, SMOKE_MODEL, TINY, WORKFLOW_IMAGE, give_back, measured, remeasure_disturbed, snakemake

# From scratch the fixture builds the PyTorch flavour (wheelhouse, podman build, ch-convert); TensorFlow's
# image is the one test_containers built in the same session (the same tag and files).
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.containers, pytest.mark.timeout(2400)]
RUNTIMES = ["bare-metal", "podman", "charliecloud"]
FRAMEWORKS = ["tensorflow", "pytorch"]


def framework(record: dict) -> str:
    return record["spec"].get("framework", "tensorflow")  # a TensorFlow record keeps the shape it had


@pytest.fixture(scope="module")
def framework_run(container_engines, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("frameworks")
    # One repetition of 2 ranks per point, the smoke network: what is proven is the identity of each
    # framework's benchmark across runtimes, at the default disturbance limits (test_containers says how).
    config = {**TINY, "runtimes": RUNTIMES, "runtime_policy": "require", "results_dir": str(workdir / "results"),
              "benchmark": {**TINY["benchmark"], "model": SMOKE_MODEL, "repetitions": 1, "frameworks": FRAMEWORKS},
              "scaling": {"nodes": [1], "ranks_per_node": [2]},
              # Messages up to 4 KiB: Gloo's round trips on two single-core ranks take 0.2-1.5 ms here, and
              # torch.distributed's netbench spent half a minute a runtime on sizes up to 64 KiB.
              "netbench": {"max_bytes": 4096},
              "history": {"store": str(workdir / "history.sqlite")}}
    (workdir / "frameworks.yaml").write_text(yaml.safe_dump(config))
    configs = ["--configfile", str(ROOT / "config" / "config.yaml"), str(workdir / "frameworks.yaml")]
    done = snakemake(ROOT, *configs, timeout=2100, env=container_engines)  # in the clone: its image and build cache
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        # The tables judged here are the training runs'; netbench records are read for what ran (test_containers).
        remeasure_disturbed(ROOT, workdir / "results", *configs, timeout=1200, stolen_kept=("netbench",),
                            env=container_engines)
        yield workdir / "results"
    finally:
        give_back(f"{WORKFLOW_IMAGE}-torch", env=container_engines)  # no later module runs it


def test_each_framework_ran_one_benchmark_in_every_runtime(framework_run):
    records = [json.loads(p.read_text()) for p in (framework_run / "runs").glob("*.json")]
    ran = sorted((r["kind"], framework(r), r["spec"]["runtime"]) for r in records)
    assert ran == sorted((kind, name, runtime) for kind in ("train", "netbench") for name in FRAMEWORKS
                         for runtime in RUNTIMES)
    for record in records:
        assert measured(record), (record["run_id"], record["reasons"], record.get("evidence"))
        if record["kind"] == "train":
            assert record["result"]["weights_identical"] is True
    hashes = {name: {r["result"]["provenance"]["hash"] for r in records if framework(r) == name} for name in FRAMEWORKS}
    assert all(len(found) == 1 for found in hashes.values()), hashes  # bare metal, podman, Charliecloud: one each
    assert hashes["tensorflow"] != hashes["pytorch"]
    for record in records:
        packages = record["result"]["provenance"]["packages"]
        if framework(record) == "pytorch":
            assert "torch" in packages and "tensorflow-cpu" not in packages and "horovod" not in packages
            if record["spec"]["runtime"] != "bare-metal":  # the PyTorch flavour of the built image
                assert record["image"].endswith(("containerbench:latest-torch", "containerbench-latest-torch.ch"))
        else:
            assert "horovod" in packages and "torch" not in packages
            if record["spec"]["runtime"] != "bare-metal":
                assert record["image"].endswith(("containerbench:latest", "containerbench-latest.ch"))


def test_every_container_run_follows_bare_metals_loss_trajectory(framework_run):
    trajectories = pd.read_csv(framework_run / "trajectories.csv")
    checked = {(row["framework"], row["runtime"]): row["loss_trajectory"] for row in trajectories.to_dict("records")}
    assert sorted(checked) == sorted((name, runtime) for name in FRAMEWORKS for runtime in RUNTIMES[1:])
    for point, verdict in checked.items():
        assert verdict.startswith("same as bare metal ("), (point, verdict)
    overhead = pd.read_csv(framework_run / "overhead.csv")
    assert sorted(zip(overhead["framework"], overhead["runtime"])) == sorted(checked)
    assert overhead["loss_trajectory"].str.startswith("same as bare metal").all()


def test_the_report_compares_the_frameworks_and_plots_their_loss(framework_run):
    frameworks = pd.read_csv(framework_run / "frameworks.csv")
    assert set(frameworks["runtime"]) == set(RUNTIMES)  # PyTorch against TensorFlow at each runtime's point
    assert frameworks["ratio_to_tensorflow_of_means"].notna().all()
    losses = pd.read_csv(framework_run / "losses.csv")
    assert {(name, runtime) for name, runtime in zip(losses["framework"], losses["runtime"])} == {
        (name, runtime) for name in FRAMEWORKS for runtime in RUNTIMES}
    report = (framework_run / "report.html").read_text()
    assert 'alt="training loss against step per runtime"' in report
