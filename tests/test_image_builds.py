"""The real offline build of containers/Dockerfile with podman and docker, run under mpirun
and as a Charliecloud directory, each reporting the bare-metal venv's provenance hash; and
the two refusals of an environment one package apart, triggered for real: the overhead
comparison of a real run, and the build step of a real image."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from helpers import (
    BENCH_PYTHON,
    ROOT,
    SMOKE_MODEL,
    WORKFLOW_IMAGE,
    ch_run_argv,
    exported,
    give_back,
    measured,
    run_and_parse,
    tiny_config,
)

from containerbench import baseimage, buildinputs, cli, imagebuild, images, imagestep, wheelhouse
from containerbench import config as cb_config
from containerbench.imagebuild import ImageSpec
from containerbench.processes import run_group
from containerbench.rank import markers
from containerbench.results import write_tables
from containerbench.runtimes import engine_env, engine_usable

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.containers]
ENGINES_SCRIPT = ROOT / "scripts" / "container-engines.sh"
COLLECTED_AT = time.time()  # before any test of this session ran
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "--mca", "btl", "self,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "pml", "ob1"]


def _engines_script(*args) -> dict[str, str]:
    """Run scripts/container-engines.sh; return the variables it prints for its caller to export."""
    done = subprocess.run(["bash", str(ENGINES_SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return exported(done.stdout)


def _built_image(engine: str, bench_python: Path) -> dict:
    """Base and wheelhouse (reused from build/ when there), then the image and its stamp."""
    base = baseimage.make_base(engine)
    wheelhouse.make_wheelhouse(bench_python)
    tag = imagebuild.default_tag(bench_python)
    stamp = imagebuild.build_image(ImageSpec(engine, tag), bench_python)
    return {"tag": tag, "stamp": stamp, "host": imagebuild.host_provenance(bench_python), "base": base}


@pytest.fixture(scope="session")
def containers_root():
    _engines_script("install")
    previous = os.getcwd()
    os.chdir(ROOT)  # images.py paths (build/, containers/Dockerfile) are relative to the project
    yield ROOT
    os.chdir(previous)


# Both tags are this module's (the provenance hash, not the workflow's tag), and go when it ends. Where
# test_containers built the workflow's image in this session, podman's build is that image tagged again: the same
# inputs (buildinputs); docker's copy went back when test_containers ended, and is built again here.
@pytest.fixture(scope="module")
def podman_image(containers_root, bench_python):
    conf = _engines_script("podman-conf", str(ROOT / "build" / "engines" / "podman"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in conf.items():
            patch.setenv(name, value)
        ok, why = engine_usable("podman")
        assert ok, why
        built = _built_image("podman", bench_python)
        yield built
        give_back(built["tag"], "podman")
        imagebuild.stamp_path("podman").unlink(missing_ok=True)  # build_image's own stamp, beside the workflow's


@pytest.fixture(scope="module")
def docker_image(containers_root, container_engines, bench_python):
    # The session's dockerd (conftest.container_engines): one daemon and one store for the suite.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("DOCKER_HOST", "PATH"):  # the daemon's socket, and its own client first on PATH
            patch.setenv(name, container_engines[name])
        ok, why = engine_usable("docker")
        assert ok, why
        built = _built_image("docker", bench_python)
        yield built
        # 2 GB in the daemon's store that no later test runs
        run_group(imagebuild.rmi_argv("docker", built["tag"]), timeout=300, capture=True)
        imagebuild.stamp_path("docker").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def charliecloud_dir(podman_image, tmp_path_factory):
    """The image as a Charliecloud directory: the workflow's, where test_containers converted this very image (the
    same id: the build reused it by its inputs), else converted here and removed afterwards."""
    workflows = Path(images.image_files(WORKFLOW_IMAGE, ROOT / imagestep.IMAGES)["charliecloud-dir"])
    marker = Path(f"{workflows}.image-id")
    if workflows.is_dir() and marker.exists() and marker.read_text().strip() == podman_image["stamp"]["image_id"]:
        yield workflows
        return
    image_dir = imagebuild.charliecloud_image("podman", podman_image["tag"], tmp_path_factory.mktemp("ch") / "image")
    yield image_dir
    shutil.rmtree(image_dir)  # 2 GB that no later test runs


def _result(stdout: str) -> dict:
    results = markers.payloads_of(stdout.splitlines(), markers.RESULT)
    assert len(results) == 1 and results[0], stdout
    return results[0]


@pytest.mark.parametrize("image", ["podman_image", "docker_image"])
def test_image_reports_host_provenance(image, request):
    built = request.getfixturevalue(image)
    stamp = built["stamp"]
    assert built["tag"] == f"{imagestep.IMAGE_REPO}:{built['host']['hash']}"
    assert stamp["measured_provenance"] == stamp["label_provenance"] == built["host"]["hash"]
    assert stamp["mpi_wheels"] == {}  # the Open MPI flavour: no MPI wheel (the MPICH one: test_containers.py)
    assert stamp["image_id"].startswith("sha256:") and stamp["python"] == built["host"]["python"]
    assert json.loads(imagebuild.stamp_path(stamp["engine"]).read_text()) == stamp


def test_docker_builds_on_the_very_base_podman_made(podman_image, docker_image):
    # One debootstrap for both engines (baseimage.make_base): the session's dockerd starts with an empty
    # store (conftest.container_engines), so its base is podman's, saved and loaded, with podman's image
    # id (the config digest).
    assert docker_image["base"] == f"{imagestep.BASE_IMAGE} copied from podman into docker"
    assert (imagebuild.image_digest("docker", imagestep.BASE_IMAGE)
            == imagebuild.image_digest("podman", imagestep.BASE_IMAGE))



def test_a_base_made_from_another_recipe_is_made_again_not_taken_for_current(podman_image, docker_image, tmp_path,
                                                                            capsys):
    """The base's tag alone used to say it was current: a base made before BASE_PACKAGES changed would have been
    built on for ever. It is labelled with its recipe (docker-import(1), podman-import(1): --change takes LABEL)
    and one of another recipe, or of none (made before the label), is made again; docker's copy is podman's,
    label and all (test above). docker-import's reference does not list LABEL among --change's instructions:
    dockerd is given the same argv here, and applies it."""
    assert baseimage.made_from("podman", imagestep.BASE_IMAGE) == baseimage.recipe()
    assert baseimage.made_from("docker", imagestep.BASE_IMAGE) == baseimage.recipe()
    assert baseimage.recipe(packages=(*baseimage.BASE_PACKAGES, "libfabric1")) != baseimage.recipe()
    assert baseimage.made_from("podman", "localhost/containerbench-base-test:none") is None
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "debian_version").write_text("12.0\n")
    tag = "localhost/containerbench-base-test:unlabelled"
    tar = subprocess.Popen(["tar", "-C", str(tmp_path / "root"), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(["podman", "import", "-", tag], stdin=tar.stdout, capture_output=True, text=True,
                              timeout=300, env=engine_env("podman"))
    tar.stdout.close()
    assert tar.wait() == 0 and imported.returncode == 0, imported.stderr
    labelled = "localhost/containerbench-base-test:labelled"
    tar = subprocess.Popen(["tar", "-C", str(tmp_path / "root"), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(baseimage.import_argv("docker", labelled), stdin=tar.stdout, capture_output=True,
                              text=True, timeout=300, env=engine_env("docker"))
    tar.stdout.close()
    assert tar.wait() == 0 and imported.returncode == 0, imported.stderr
    try:
        assert baseimage.made_from("docker", labelled) == baseimage.recipe()
        assert baseimage.made_from("podman", tag) == ""
        # Made again, not reused: the debootstrap it starts is pointed at a mirror that answers nothing here, so
        # it fails at once, and the unlabelled image is left as it was.
        with pytest.raises(imagestep.ImageStepError, match=r"base \(debootstrap\)"):
            baseimage.make_base("podman", tag, tmp_path / "rootfs", mirror="http://127.0.0.1:9/debian", timeout=120)
        assert capsys.readouterr().err.startswith(
            f"containerbench image: base: {tag} in podman was made from recipe unlabelled, this one is "
            f"{baseimage.recipe()} (baseimage.BASE_PACKAGES, SUITE): made again\n")
        assert baseimage.made_from("podman", tag) == ""
    finally:
        subprocess.run(["podman", "rmi", tag], capture_output=True, timeout=300, env=engine_env("podman"))
        subprocess.run(["docker", "rmi", labelled], capture_output=True, timeout=300, env=engine_env("docker"))

def test_podman_ranks_under_mpirun(podman_image):
    command = [*MPIRUN, "podman", "run", "--rm", "--network", "host", "--pid", "host", "--ipc", "host",
               "-v", "/tmp:/tmp", "--env", "OMPI_*", "--env", "PMIX_*", podman_image["tag"],
               "python3", "-m", "containerbench.rank.netbench", "--max-bytes", "4096"]
    done = run_group(command, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _result(done.stdout)["ranks"] == 2


def test_docker_ranks_under_mpirun(docker_image):
    # docker has no --env 'OMPI_*': the rank shim names each variable mpirun set
    command = [*MPIRUN, sys.executable, "-m", "containerbench.rank.rankexec", "--pass-prefix", "OMPI_",
               "--pass-prefix", "PMIX_", "--", "docker", "run", "--rm", "--network", "host", "--pid", "host",
               "--ipc", "host", "-v", "/tmp:/tmp", docker_image["tag"],
               "python3", "-m", "containerbench.rank.netbench", "--max-bytes", "4096"]
    done = run_group(command, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _result(done.stdout)["ranks"] == 2


def test_charliecloud_ranks_report_host_provenance(podman_image, charliecloud_dir):
    env = engine_env("charliecloud")
    ok, why = engine_usable("charliecloud")
    assert ok, why
    image_dir = charliecloud_dir
    assert not [p for p in (image_dir / "dev").iterdir() if not p.is_dir()]  # no device nodes kept
    command = [*MPIRUN, "--tag-output", *ch_run_argv(image_dir, ["python3", "-m", "containerbench.rank.provenance"])]
    done = run_group(command, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # --tag-output prefixes each rank's lines with [job,rank]; the two JSON documents interleave
    hashes = dict(re.findall(r'\[\d+,(\d+)\]<stdout>:\s*"hash": "(\w+)"', done.stdout))
    assert hashes == {"0": podman_image["host"]["hash"], "1": podman_image["host"]["hash"]}


def test_a_container_run_that_ran_on_the_host_is_invalid(charliecloud_dir, tmp_path, monkeypatch):
    """Each rank proves from inside where it ran (telemetry.rank_context): triggered for real by a
    broken `ch-run` first on PATH, which drops the image and runs the command on the host, as a
    misconfigured site wrapper would. The genuine ch-run beside it passes."""
    image_dir = charliecloud_dir
    config = tiny_config(tmp_path, runtimes=["charliecloud"], images={"charliecloud": {"image": str(image_dir)}},
                         scaling={"nodes": [1], "ranks_per_node": [1]}, netbench={"enabled": False},
                         benchmark={"repetitions": 1, "model": SMOKE_MODEL})  # where it ran, not what it trained
    [run] = cb_config.plan_runs(config)
    genuine_dir, broken_dir, shim_dir = tmp_path / "genuine", tmp_path / "broken", tmp_path / "shim"
    for directory in (genuine_dir, broken_dir, shim_dir):
        directory.mkdir()
    [(_, genuine)] = run_and_parse([run], config, genuine_dir, stolen_kept=True)
    assert measured(genuine), (genuine["reasons"], genuine["evidence"])
    [process] = genuine["result"]["processes"]
    assert process["context"]["mnt_ns"] != genuine["launch_context"]["mnt_ns"]
    assert {"charliecloud", "$CH_RUNNING"} <= set(process["context"]["markers"])  # ch-run(1): CH_RUNNING

    shim = shim_dir / "ch-run"
    shim.write_text(f"#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done; shift; shift\nexec {BENCH_PYTHON} \"$@\"\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim_dir}:{os.environ['PATH']}")
    [(_, on_host)] = run_and_parse([run], config, broken_dir)
    [process] = on_host["result"]["processes"]
    assert process["context"]["mnt_ns"] == on_host["launch_context"]["mnt_ns"]
    assert process["context"]["markers"] == on_host["launch_context"]["markers"]
    assert on_host["status"] == "invalid"
    assert on_host["reasons"] == [
        f"ran on the host, not in charliecloud: rank 0 on {process['hostname']} has the host's mount namespace "
        f"({process['context']['mnt_ns']}) and no container marker the host lacks"]


# One distribution of TensorFlow's dependency closure at another version than the lock's:
# termcolor is pure Python, has no dependencies and the same API in both, so the benchmark
# runs unchanged and only the provenance tells the two environments apart.
OTHER_TERMCOLOR = "3.2.0"
REFUSED_TAG = "localhost/containerbench-refused-test:latest"


@pytest.fixture(scope="module")
def other_termcolor(tmp_path_factory, bench_python) -> dict:
    """The locked termcolor version, and a wheel of another one downloaded from the index."""
    locked = re.search(r"^termcolor==(\S+)$", (ROOT / "envs" / "bench.lock.txt").read_text(), re.MULTILINE)[1]
    assert locked != OTHER_TERMCOLOR
    dest = tmp_path_factory.mktemp("wheels")
    subprocess.run([str(bench_python), "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest",
                    str(dest), f"termcolor=={OTHER_TERMCOLOR}"], check=True, capture_output=True, timeout=300)
    [wheel] = dest.glob("termcolor-*.whl")
    return {"locked": locked, "wheel": wheel}


def site_venv(path: Path, bench_python: Path, wheel: Path) -> Path:
    """A site's venv that differs from the bench venv by one distribution: the wheel installed in
    its own site-packages, which come first, and the bench venv's (with their .pth files) after
    them. Seconds and a few kB, where a copy of the 1.3 GB bench venv would take minutes."""
    subprocess.run([str(bench_python), "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    [site_packages] = path.glob("lib/python3*/site-packages")
    subprocess.run([str(bench_python), "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                    str(site_packages), str(wheel)], check=True, capture_output=True, timeout=300)
    bench_site = subprocess.run([str(bench_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (site_packages / "zz-bench-venv.pth").write_text(f"import site; site.addsitedir({bench_site!r})\n")
    return path / "bin" / "python"


def test_a_bare_metal_venv_one_package_apart_is_not_compared(podman_image, other_termcolor, bench_python, tmp_path):
    """bare_metal.python is a venv with another termcolor than the image's: both runs are real and
    ok, and the overhead table shows their throughput but refuses the comparison, naming it."""
    python = site_venv(tmp_path / "site-venv", bench_python, other_termcolor["wheel"])
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"], runtime_policy="require",
                         bare_metal={"python": str(python)}, images={"podman": {"image": podman_image["tag"]}},
                         scaling={"nodes": [1], "ranks_per_node": [1]}, netbench={"enabled": False},
                         benchmark={"repetitions": 1, "model": SMOKE_MODEL})
    runs = tmp_path / "runs"
    runs.mkdir()
    records = {spec.runtime: record for spec, record in run_and_parse(cb_config.plan_runs(config), config, runs)}
    assert {name: r["status"] for name, r in records.items()} == {"bare-metal": "ok", "podman": "ok"}, \
        [r["reasons"] for r in records.values()]
    bare, image = (records[name]["result"]["provenance"] for name in ("bare-metal", "podman"))
    assert image["hash"] == podman_image["host"]["hash"] != bare["hash"]
    assert set(bare["packages"].items()) ^ set(image["packages"].items()) == {
        ("termcolor", OTHER_TERMCOLOR), ("termcolor", other_termcolor["locked"])}

    for record in records.values():
        (runs / f"{record['run_id']}.json").write_text(json.dumps(record))
    write_tables(sorted(str(p) for p in runs.glob("*.json")), tmp_path / "tables")
    [row] = pd.read_csv(tmp_path / "tables" / "overhead.csv").to_dict("records")
    assert row["runtime"] == "podman" and row["runtime_median"] > 0 and row["bare_metal_median"] > 0
    assert pd.isna(row["overhead_percent_of_means"])
    assert row["note"] == f"not comparable: packages differ: termcolor {OTHER_TERMCOLOR} vs {other_termcolor['locked']}"


def test_the_build_refuses_an_image_one_package_apart(podman_image, other_termcolor, tmp_path, capsys):
    """The images command's real build step, given a Dockerfile that installs another termcolor over
    the built image (offline, from the wheel in its context): refused, naming the package; neither
    the tag nor the stamp of an earlier good build is left to claim the image is good."""
    repo, wheel = tmp_path / "repo", other_termcolor["wheel"]
    (repo / "containers").mkdir(parents=True)
    shutil.copy(wheel, repo)
    (repo / "containers" / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
        f"COPY {wheel.name} /tmp/\n"
        f"RUN python3 -m pip install --no-cache-dir --no-index --no-deps /tmp/{wheel.name} && rm /tmp/{wheel.name}\n")
    stamp = tmp_path / "containerbench.podman.json"
    stamp.write_text(json.dumps(podman_image["stamp"]))
    try:
        assert cli.main(["image", "--engine", "podman", "--tag", REFUSED_TAG, "--repo", str(repo), "build",
                         "--base-image", podman_image["tag"], "--stamp", str(stamp)]) == 1
        assert capsys.readouterr().err.splitlines() == [(
            f"containerbench image: build: refused {REFUSED_TAG}: the provenance measured in it differs: packages "
            f"differ: termcolor {other_termcolor['locked']} vs {OTHER_TERMCOLOR} (bench venv vs image)")]
        assert not stamp.exists()
        assert run_group(["podman", "image", "exists", REFUSED_TAG], timeout=120).returncode == 1
        assert run_group(["podman", "image", "exists", podman_image["tag"]], timeout=120).returncode == 0
    finally:
        run_group(["podman", "rmi", "--force", REFUSED_TAG], timeout=300, capture=True)


def test_a_docker_build_leaves_no_image_of_its_venv_stage(docker_image):
    # The classic builder keeps each step's image, the venv stage's (1.6 GB: wheels and venv) dangling beside the
    # image; the build prunes those by the label only that stage sets (imagebuild.prune_stage_argv).
    argv = ["docker", "images", "--quiet", "--filter", "dangling=true", "--filter", f"label={imagebuild.STAGE_LABEL}"]
    left = run_group(argv, timeout=60, capture=True)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr
    labels = imagebuild.inspect_image("docker", docker_image["tag"])["Config"]["Labels"]
    assert "org.containerbench.stage" not in labels
    assert labels[imagebuild.PROVENANCE_LABEL] == docker_image["host"]["hash"]


def test_a_rebuild_removes_the_image_its_tag_named_before_unless_another_tag_names_it(podman_image, tmp_path,
                                                                                      capsys):
    """Without a layer cache, the image a tag named before a build shares only the base with the new one: the
    build removes it by its id, unless another tag names it: podman-rmi(1) by id would remove that tag too."""
    tag, other = "localhost/containerbench-rebuild-test:latest", "localhost/containerbench-rebuild-test:kept"

    def build(n: int) -> str:
        (tmp_path / "Dockerfile").write_text(f"FROM {imagestep.BASE_IMAGE}\nRUN echo {n} > /n\n")
        done = run_group(["podman", "build", "--layers=false", "-t", tag, str(tmp_path)], timeout=300, capture=True)
        assert done.returncode == 0, done.stderr
        return imagebuild.image_digest("podman", tag)

    try:
        first, second = build(1), build(2)
        imagebuild.forget_previous("podman", tag, first, second)
        assert capsys.readouterr().out == f"build: removed the image {tag} named before ({first})\n"
        assert not imagebuild.image_exists("podman", first) and imagebuild.image_exists("podman", second)
        assert run_group(["podman", "tag", tag, other], timeout=60, capture=True).returncode == 0
        third = build(3)
        imagebuild.forget_previous("podman", tag, second, third)
        assert capsys.readouterr().out == f"build: kept the image {tag} named before ({second}): {other} names it\n"
        assert imagebuild.image_exists("podman", other) and imagebuild.image_digest("podman", other) == second
        imagebuild.forget_previous("podman", tag, third, third)  # built the same image: nothing to remove
        assert capsys.readouterr().out == "" and imagebuild.image_exists("podman", third)
    finally:
        run_group(["podman", "rmi", "--force", tag, other], timeout=300, capture=True)


def test_a_build_of_the_same_inputs_tags_the_image_built_before(podman_image, tmp_path, capsys):
    """podman builds without a layer cache: a second build of identical inputs (another tag) is the image already
    built, found by the inputs label the build put on it; another input is another build."""
    tags = [f"localhost/containerbench-inputs-test:{n}" for n in (1, 2, 3)]
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY a /a\n")
    (tmp_path / "a").write_text("1\n")

    def build(tag: str) -> tuple[str, bool]:
        spec = ImageSpec("podman", tag, dockerfile=tmp_path / "Dockerfile", context=tmp_path)
        spec = replace(spec, inputs=imagebuild.digest_of_inputs(spec))  # as build_image asks it: the base's id too
        assert spec.inputs
        reused = imagebuild.build_or_reuse(spec, timeout=300)
        return imagebuild.image_digest("podman", tag), reused

    try:
        first, reused = build(tags[0])
        assert not reused
        capsys.readouterr()
        assert build(tags[1]) == (first, True)
        inputs = imagebuild.inspect_image("podman", first)["Config"]["Labels"][buildinputs.INPUTS_LABEL]
        assert capsys.readouterr().out.endswith(
            f"build: {tags[1]} is {first}, built before from the same inputs ({buildinputs.INPUTS_LABEL}={inputs})\n")
        (tmp_path / "a").write_text("2\n")
        assert build(tags[2])[0] != first
        assert "built before" not in capsys.readouterr().out
    finally:
        run_group(["podman", "rmi", "--force", *tags], timeout=300, capture=True)


def test_the_modules_podman_image_is_the_workflows_when_built_from_the_same_inputs(podman_image):
    """In `make test`, test_containers built the workflow's image first: this module's build of the same inputs
    (another tag) is that image, not another three minutes and 1.6 GB."""
    workflows = Path(images.image_files(WORKFLOW_IMAGE, ROOT / imagestep.IMAGES)["podman"])
    # One left from an earlier session may be of other inputs (its rule does not list README.md): not asked.
    if not workflows.exists() or workflows.stat().st_mtime < COLLECTED_AT:
        pytest.skip("the workflow's image was not built in this session (test_containers did not run first)")
    labels = imagebuild.inspect_image("podman", podman_image["tag"])["Config"]["Labels"]
    assert labels[buildinputs.INPUTS_LABEL] == imagebuild.inspect_image("podman", WORKFLOW_IMAGE)["Config"]["Labels"][
        buildinputs.INPUTS_LABEL]
    assert podman_image["stamp"]["image_id"] == json.loads(workflows.read_text())["image_id"] == (
        imagebuild.image_digest("podman", WORKFLOW_IMAGE))


def test_remove_gives_back_what_was_built_of_a_tag_and_only_the_parts_asked(podman_image, tmp_path, capsys):
    """`images remove` (make clean-images, and each container module's teardown): the engine's tag
    and the files made from it go; another tag of the same image stays."""
    tag = "localhost/containerbench-remove-test:latest"
    assert run_group(["podman", "tag", imagestep.BASE_IMAGE, tag], timeout=120).returncode == 0
    build_dir = tmp_path / "images"
    files = images.image_files(tag, build_dir)
    imagebuild.export_image("podman", tag, Path(files["archive"]))  # a real docker archive of the tag
    Path(files["podman"]).write_text(json.dumps({"tag": tag}))  # the stamps and the converted directory
    (Path(files["charliecloud-dir"]) / "bin").mkdir(parents=True)  # are the workflow's files: their
    Path(f"{files['charliecloud-dir']}.image-id").write_text("sha256:0\n")  # names are what is removed
    try:
        assert cli.main(["image", "--tag", tag, "remove", "--build-dir", str(build_dir), "--only", "archive"]) == 0
        assert capsys.readouterr().out == f"removed {files['archive']}\n"
        assert run_group(["podman", "image", "exists", tag], timeout=120).returncode == 0
        assert cli.main(["image", "--tag", tag, "remove", "--build-dir", str(build_dir)]) == 0
        assert sorted(capsys.readouterr().out.splitlines()) == sorted([
            f"removed podman {tag}", f"removed {files['podman']}", f"removed {files['charliecloud-dir']}",
            f"removed {files['charliecloud-dir']}.image-id"])
        assert run_group(["podman", "image", "exists", tag], timeout=120).returncode == 1
        assert run_group(["podman", "image", "exists", imagestep.BASE_IMAGE], timeout=120).returncode == 0
        assert list(build_dir.iterdir()) == []
        assert cli.main(["image", "--tag", tag, "remove", "--build-dir", str(build_dir)]) == 0
        assert capsys.readouterr().out == f"nothing of {tag} to remove\n"
    finally:
        run_group(["podman", "rmi", "--force", tag], timeout=300, capture=True)
