"""An image the site supplies instead of the built one, e.g. a vendor's TensorFlow container,
run for real with podman.

The vendor's image here is made from ours the way a vendor's differs from it: without the
containerbench package (a vendor does not ship it) and without one distribution
(google-pasta, which TensorFlow does not import). `package: clone` runs the clone's benchmark
code in it; `containerbench freeze-image` writes the lock a bare-metal venv with its versions is
built from; and the overhead table still shows its throughput and names the package that differs.
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
from helpers import BENCH_PYTHON, ROOT, SMOKE_MODEL, run_and_parse, snakemake, tiny_config

from containerbench import config as cb_config
from containerbench import images
from containerbench.cli import main
from containerbench.processes import run_group
from containerbench.results import write_tables

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
BUILT = "localhost/containerbench:latest"
VENDOR = "localhost/containerbench-vendor-test:latest"


@pytest.fixture(scope="module")
def vendor_image(container_engines, tmp_path_factory):
    if run_group(["podman", "image", "exists", BUILT], timeout=60, env=container_engines).returncode != 0:
        stamp = images.image_files(BUILT, ROOT / "build" / "images")["podman"]
        workdir = tmp_path_factory.mktemp("build")
        built = snakemake(workdir, "--configfile", str(ROOT / "config" / "config.yaml"), stamp, env=container_engines)
        assert built.returncode == 0, built.stderr[-3000:]
    context = tmp_path_factory.mktemp("vendor")
    (context / "Containerfile").write_text(
        f"FROM {BUILT}\nRUN python3 -m pip uninstall --yes containerbench google-pasta\n")
    done = run_group(["podman", "build", "--network", "none", "-t", VENDOR, str(context)], timeout=900,
                     env=container_engines)
    assert done.returncode == 0, done.stderr[-3000:]
    yield VENDOR
    run_group(["podman", "rmi", "--force", VENDOR], timeout=300, env=container_engines)


def vendor_config(tmp_path, package: str) -> dict:
    return tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="require",
                       images={"podman": {"image": VENDOR, "package": package}},
                       scaling={"nodes": [1], "ranks_per_node": [1]}, netbench={"enabled": False},
                       benchmark={"repetitions": 1, "model": SMOKE_MODEL})


def test_freeze_image_writes_the_lock_of_what_the_image_carries(vendor_image, container_engines, tmp_path,
                                                                 monkeypatch):
    for name, value in container_engines.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "vendor.yaml"
    config.write_text(json.dumps({"runtimes": ["bare-metal", "podman"], "images": {"podman": {"image": VENDOR}}}))
    lock = tmp_path / "vendor.lock.txt"
    assert main(["freeze-image", "--config", str(ROOT / "config" / "config.yaml"), "--config", str(config),
                 "--runtime", "podman", "--out", str(lock)]) == 0
    ours = {line for line in (ROOT / "envs" / "bench.lock.txt").read_text().splitlines() if "==" in line
            and not line.startswith("#")}
    frozen = lock.read_text().splitlines()
    assert "# horovod==0.28.1" in frozen  # compiled by setup-venv.sh against the lock's TensorFlow
    pins = {line for line in frozen if not line.startswith("#")}
    # What the vendor's image lacks, and the build tools the image's venv holds, and nothing else.
    assert ours - pins == {"google-pasta==0.2.0"}
    assert {pin.split("==")[0] for pin in pins - ours} == {"pip", "setuptools", "wheel"}
    assert not any(line.lower().startswith("containerbench") for line in frozen)


def test_a_vendor_image_runs_the_clones_benchmark_and_its_difference_is_named(vendor_image, container_engines,
                                                                              tmp_path, monkeypatch):
    for name, value in container_engines.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)

    # Without the package, the image cannot run the benchmark: a failed record, with the evidence.
    image_only = vendor_config(tmp_path, "image")
    [(_, failed)] = list(run_and_parse([r for r in cb_config.plan_runs(image_only) if r.runtime == "podman"],
                                       image_only, tmp_path / "image"))
    assert failed["status"] == "failed"
    assert "No module named 'containerbench'" in failed["evidence"]

    clone = vendor_config(tmp_path, "clone")
    records = {spec.runtime: record for spec, record in run_and_parse(cb_config.plan_runs(clone), clone,
                                                                      tmp_path / "clone")}
    assert {r["status"] for r in records.values()} == {"ok"}, [r["reasons"] for r in records.values()]
    bare, vendor = (records[name]["result"]["provenance"] for name in ("bare-metal", "podman"))
    assert vendor["code_sha256"] == bare["code_sha256"]  # the clone's benchmark ran in the vendor's image
    assert set(bare["packages"]) - set(vendor["packages"]) == {"google-pasta"}
    host = subprocess.run([str(BENCH_PYTHON), "-m", "containerbench.rank.provenance"], capture_output=True, text=True,
                          check=True, timeout=300)
    assert json.loads(host.stdout)["hash"] == bare["hash"] != vendor["hash"]

    for record in records.values():
        (tmp_path / f"{record['run_id']}.json").write_text(json.dumps(record))
    write_tables(sorted(str(p) for p in tmp_path.glob("*.json")), tmp_path / "tables")
    [row] = pd.read_csv(tmp_path / "tables" / "overhead.csv").to_dict("records")
    assert row["runtime"] == "podman" and row["runtime_median"] > 0 and row["bare_metal_median"] > 0
    assert row["note"] == "not comparable: packages differ: google-pasta 0.2.0 vs absent"
