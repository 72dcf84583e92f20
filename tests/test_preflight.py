"""The pre-flight job, run for real: what a compute node must see before any benchmark job.

A site's runtime that exists only on the compute nodes (Apptainer, say) is stood in for by
a stub on PATH (Apptainer cannot be installed here); its probe is Apptainer's documented
`apptainer --version` (apptainer.org/docs/user/main/cli/apptainer.html, "Options: --version")."""

import json
import os
import subprocess
import sys

import pytest
from helpers import BENCH_PYTHON, ROOT, snakemake, tiny_config

from containerbench import cli, images, preflight, runtimes
from containerbench import config as cb_config
from containerbench.plans import plan_sweep, site_image_files


def run_preflight(tmp_path, *args, path=None):
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run([sys.executable, "-m", "containerbench", "preflight", "--out", str(tmp_path / "pre.json"),
                           *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def apptainer_on_path(tmp_path):
    """A compute node's PATH with an `apptainer` that answers its version, as the real one does."""
    bin_dir = tmp_path / "node-bin"
    bin_dir.mkdir()
    stub = bin_dir / "apptainer"
    stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "apptainer version 1.4.5" && exit 0\nexit 64\n')
    stub.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_node_that_sees_the_clone_and_has_the_runtime_passes(tmp_path, apptainer_on_path):
    probes = json.dumps({"apptainer": ["apptainer", "--version"]})
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--probes", probes, path=apptainer_on_path)
    assert done.returncode == 0, done.stderr
    stamp = json.loads((tmp_path / "pre.json").read_text())
    assert stamp["problems"] == [] and stamp["probes"]["apptainer"]["detail"] == "apptainer version 1.4.5"


def test_each_problem_is_one_line_and_nothing_is_stamped(tmp_path):
    elsewhere = tmp_path / "not-shared"
    done = run_preflight(tmp_path, "--repo", str(elsewhere), "--sources-digest", "0" * 16,
                         "--bench-python", str(tmp_path / "no-venv" / "bin" / "python"),
                         "--probes", json.dumps({"apptainer": ["apptainer", "--version"]}),
                         path="/usr/bin:/bin")
    assert done.returncode == 1 and not (tmp_path / "pre.json").exists()
    host = os.uname().nodename
    assert done.stderr.splitlines() == [
        f"containerbench: preflight on {host}: the clone is not at {elsewhere} on this node; allowed: a clone on "
        "a filesystem the compute nodes mount at the same path as the login node",
        f"containerbench: preflight on {host}: 'bare_metal.python' = '{tmp_path}/no-venv/bin/python' does not "
        "exist on this node; allowed: a venv on a shared filesystem (scripts/setup-venv.sh bench) or an "
        "interpreter every node has",
        f"containerbench: preflight on {host}: runtime 'apptainer' cannot run on this node: apptainer is not "
        "installed (not on PATH)",
    ]


def test_a_stale_copy_of_the_clone_is_not_the_clone(tmp_path):
    copy = tmp_path / "copy"
    (copy / "src" / "containerbench" / "rank").mkdir(parents=True)
    (copy / "src" / "containerbench" / "rank" / "bench.py").write_text("# an older checkout\n")
    done = run_preflight(tmp_path, "--repo", str(copy), "--sources-digest", preflight.sources_digest(ROOT))
    assert done.returncode == 1
    assert f"the clone at {copy} differs from the one the workflow planned with" in done.stderr


@pytest.mark.bench
def test_the_bare_metal_python_must_import_the_benchmark(tmp_path):
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--bench-python", str(BENCH_PYTHON))
    assert done.returncode == 0, done.stderr
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--bench-python", sys.executable)  # the workflow venv: no TensorFlow
    assert done.returncode == 1 and "cannot import the benchmark's packages on this node" in done.stderr


def test_a_pytorch_sweep_refuses_a_torch_python_without_torch_before_any_run(tmp_path, torch_python):
    digest = preflight.sources_digest(ROOT)
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", digest, "--torch-python", str(torch_python))
    assert done.returncode == 0, done.stderr
    # The TensorFlow venv given for PyTorch's: it has mpi4py and no torch.
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", digest, "--torch-python", str(BENCH_PYTHON))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"containerbench: preflight on {os.uname().nodename}: 'bare_metal.torch_python' = '{BENCH_PYTHON}' cannot "
        "import the benchmark's packages on this node: ModuleNotFoundError: No module named 'torch'"]


def test_the_workflow_checks_each_frameworks_bare_metal_python(tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["pytorch"]})
    argv = preflight.check_argv(config, ROOT, sys.executable, {"pytorch": config["bare_metal"]["torch_python"]}, {})
    assert argv[argv.index("--torch-python") + 1] == config["bare_metal"]["torch_python"]
    assert "--bench-python" not in argv


COMPUTE_ONLY = {"runtimes": ["bare-metal", "apptainer"], "runtime_policy": "require",
                "images": {"apptainer": {"image": "/sw/images/containerbench.sif", "available": "compute-nodes"}}}


def test_a_runtime_only_on_compute_nodes_is_not_probed_where_the_workflow_plans(tmp_path):
    assert subprocess.run(["sh", "-c", "command -v apptainer"]).returncode != 0  # as on a login node
    config = tiny_config(tmp_path, **COMPUTE_ONLY)
    sweep = plan_sweep(config, ROOT, probe=True)  # require: a runtime that cannot run here would be refused
    assert {run.runtime for run in sweep.runs} == {"bare-metal", "apptainer"} and sweep.skipped == {}
    everywhere = cb_config.merge(tiny_config(tmp_path, **COMPUTE_ONLY),
                                 {"images": {"apptainer": {"available": "everywhere"}}})
    with pytest.raises(cb_config.ConfigError, match="runtime 'apptainer' cannot run here: apptainer is not installed"):
        plan_sweep(everywhere, ROOT, probe=True)


def test_under_slurm_the_check_runs_on_one_compute_node_through_srun(tmp_path):
    config = tiny_config(tmp_path, **COMPUTE_ONLY, launcher={"kind": "srun"},
                         slurm={"partition": "gpu", "account": "proj", "qos": None, "constraint": "a100"})
    pythons = {"tensorflow": "/sw/cb/.venv-bench/bin/python"}
    argv = preflight.check_argv(config, ROOT, "/sw/cb/.venv/bin/python", pythons,
                                {"apptainer": ["apptainer", "--version"]}, ["/sw/images/tf.sif"])
    assert argv == ["srun", "--nodes=1", "--ntasks=1", "--time=10", "--job-name=containerbench-preflight",
                    "--partition=gpu", "--account=proj", "--constraint=a100",
                    "/sw/cb/.venv/bin/python", "-m", "containerbench", "preflight", "--repo", str(ROOT),
                    "--sources-digest", preflight.sources_digest(ROOT),
                    "--bench-python", "/sw/cb/.venv-bench/bin/python",
                    "--probes", '{"apptainer": ["apptainer", "--version"]}', "--image-file=/sw/images/tf.sif"]
    assert cli.build_parser().parse_args(argv[8 + 3:]).command == "preflight"  # what follows `python -m containerbench`
    local = preflight.check_argv(tiny_config(tmp_path), ROOT, sys.executable, {}, {})
    assert local[:4] == [sys.executable, "-m", "containerbench", "preflight"]  # mpirun or none: here


def test_the_workflow_stops_before_any_job_when_a_node_cannot_run_it(tmp_path):
    # A real run, not a dry run (the check is Snakemake's onstart hook): nothing is started.
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"runtimes": ["bare-metal"], "bare_metal": {"python": str(tmp_path / "no-venv")}}))
    done = snakemake(tmp_path, "--configfile", str(ROOT / "config" / "config.yaml"), str(bad))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("containerbench:")] == [
        f"containerbench: preflight on {os.uname().nodename}: 'bare_metal.python' = '{tmp_path}/no-venv' does not "
        "exist on this node; allowed: a venv on a shared filesystem (scripts/setup-venv.sh bench) or an "
        "interpreter every node has"]
    assert not (tmp_path / "results").exists()


DIGEST = "@sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("runtime,image,available,problem", [
    # A SIF (Apptainer: "apptainer exec image.sif") or squashfs (Pyxis: a path starts with / or .) must exist.
    ("apptainer", "/sw/images/missing.sif", "everywhere",
     "'images.apptainer.image' = '/sw/images/missing.sif' does not exist; allowed: an existing file or directory"),
    ("apptainer", "/sw/images/missing.sif", "compute-nodes", None),  # the pre-flight job looks on the node
    ("enroot", "./images/missing.sqsh", "everywhere", "does not exist"),
    # A registry reference is pinned by digest (OCI image spec, "Digests"), else two runs may measure two images.
    ("enroot", "docker://nvcr.io#nvidia/tensorflow:24.01-tf2-py3", "everywhere",
     "'images.enroot.image' = 'docker://nvcr.io#nvidia/tensorflow:24.01-tf2-py3' is neither a file nor pinned"),
    ("enroot", f"docker://nvcr.io#nvidia/tensorflow{DIGEST}", "everywhere", None),
    ("apptainer", f"docker://nvcr.io/nvidia/tensorflow{DIGEST}", "everywhere", None),
    ("sarus", "nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere", "is neither a file nor pinned by digest"),
    ("podman-hpc", "nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere", "is neither a file nor pinned"),
    # Shifter names an image by the id `shifterimg lookup` prints (shifter(1): --image=id:<id>).
    ("shifter", "id:" + "ab" * 32, "everywhere", None),
    ("shifter", "docker:nvcr.io/nvidia/tensorflow:24.01-tf2-py3", "everywhere",
     "'images.shifter.image' = 'docker:nvcr.io/nvidia/tensorflow:24.01-tf2-py3' is not pinned; allowed: id:<id>"),
])
def test_an_image_the_site_supplies_exists_or_is_pinned(tmp_path, runtime, image, available, problem):
    config = tiny_config(tmp_path, runtimes=["bare-metal", runtime],
                         images={runtime: {"image": image, "available": available}})
    found = runtimes.runtime_for(runtime, config).site_image_problem()
    assert found == problem if problem is None else problem in found


@pytest.mark.containers
def test_a_local_engine_accepts_an_image_of_its_own_store(tmp_path, container_engines):
    built = images.built_image("podman", "localhost/containerbench:latest", ROOT / "build" / "images")
    assert built is not None
    for image, problem in (("localhost/containerbench:latest", None),
                           ("localhost/containerbench:never-built", "is neither a file nor pinned by digest")):
        config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], images={"podman": {"image": image}})
        found = runtimes.runtime_for("podman", config).site_image_problem()
        assert found == problem if problem is None else problem in found
    # Before any job, in one line.
    with pytest.raises(cb_config.ConfigError, match=r"^config: 'images.podman.image' = "
                                                    r"'localhost/containerbench:never-built' is neither"):
        plan_sweep(config, ROOT, probe=True)


def test_a_site_image_only_the_nodes_see_is_looked_for_there(tmp_path):
    config = tiny_config(tmp_path, runtimes=["bare-metal", "apptainer"], runtime_policy="require",
                         images={"apptainer": {"image": str(tmp_path / "gone.sif"), "available": "compute-nodes"}})
    sweep = plan_sweep(config, ROOT, probe=True)  # not refused here: only the nodes see it
    assert site_image_files(config, sweep.artifacts) == [f"{tmp_path}/gone.sif"]
    done = run_preflight(tmp_path, "--repo", str(ROOT), "--sources-digest", preflight.sources_digest(ROOT),
                         "--image-file", str(tmp_path / "gone.sif"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"containerbench: preflight on {os.uname().nodename}: the image "
                                        f"{tmp_path}/gone.sif does not exist on this node; allowed: an image on a "
                                        "filesystem the compute nodes mount"]
