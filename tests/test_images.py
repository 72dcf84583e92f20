"""The container-image pipeline without building anything: the exact command of every step,
the Apptainer definition made from the Dockerfile, step time limits, engine probes.
The real builds are in test_image_builds.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from containerbench import baseimage, cli, imagebuild, images, imagestep, singularity, wheelhouse
from containerbench.config import BENCH_ENVS, MPI_FLAVOURS
from containerbench.imagebuild import ImageSpec
from containerbench.runtimes import DEFAULT_PATH, engine_env, engine_usable

ENGINES_SCRIPT = ROOT / "scripts" / "container-engines.sh"
TAG = "localhost/containerbench:0123456789abcdef"
HOROVOD_STEP = "env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \\"
CUDA = "nvcr.io/nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04"


def definition(**kwargs) -> str:
    return singularity.singularity_definition(ROOT / "containers" / "Dockerfile", **kwargs)


def section(text: str, name: str) -> list[str]:
    body = text.split(f"\n{name}\n", 1)[1]
    return body.split("\n%", 1)[0].strip().splitlines()


def stage(text: str, name: str) -> str:
    """One stage of a multi-stage definition, from its Bootstrap line to the next stage's."""
    stages = re.split(r"\n(?=Bootstrap: )", "\n" + text)
    return next(part for part in stages if f"\nStage: {name}\n" in part + "\n")


# -- Apptainer definition ----------------------------------------------------------------------

def test_definition_from_local_daemon_base():
    text = definition(build_args={"PROVENANCE": "0123456789abcdef"})
    assert text.splitlines()[:2] == ["Bootstrap: docker-daemon", "From: localhost/containerbench-base:bookworm"]
    assert "${" not in text and "$PROVENANCE" not in text
    assert not re.search(r"^su - ", text, re.M)
    # Apptainer user guide, "Definition Files", "Multi-Stage Builds": each stage names itself (Stage:) after its own
    # Bootstrap and From, and a later stage copies from an earlier one with `%files from STAGE`. The venv is made in
    # the first from the wheelhouse; the image has the venv and not the wheelhouse's 300 MB.
    assert re.findall(r"^(?:Bootstrap|From|Stage): .*", text, re.M) == [
        "Bootstrap: docker-daemon", "From: localhost/containerbench-base:bookworm", "Stage: venv",
        "Bootstrap: docker-daemon", "From: localhost/containerbench-base:bookworm", "Stage: image"]
    venv, image = stage(text, "venv"), stage(text, "image")
    assert "build/wheelhouse /opt/containerbench/wheelhouse" in section(venv, "%files")
    assert "wheelhouse" not in "".join(section(image, "%files"))
    assert section(image, "%files from venv") == ["/opt/containerbench/venv /opt/containerbench/venv"]
    # The venv stage's own label (what the docker build prunes it by) stays in that stage; the image's is the hash.
    assert section(venv, "%labels") == ["org.containerbench.stage venv"] and "%environment" not in venv
    assert section(text, "%environment") == ["export VIRTUAL_ENV=/opt/containerbench/venv",
                                             "export PATH=/opt/containerbench/venv/bin:$PATH",
                                             "export PYTHONUNBUFFERED=1"]
    assert "export PATH=/opt/containerbench/venv/bin:$PATH" in section(image, "%post")  # ENV holds for later steps
    post = section(venv, "%post")
    assert "HOROVOD_GPU_OPERATIONS=''" in post and "--no-binary" not in text
    assert any(line.strip() == "--no-build-isolation horovod==0.28.1; fi" for line in post)
    horovod = [line.strip() for line in post].index(HOROVOD_STEP)
    assert post[horovod - 1].strip() == '&& if [ -n "0.28.1" ]; then \\'  # ARGs expanded as Docker would
    assert section(image, "%labels") == ["org.containerbench.provenance 0123456789abcdef"]
    assert "envs/bench.lock.txt /opt/containerbench/bench.lock.txt" in section(text, "%files")


def test_the_pytorch_flavour_is_the_same_definition_from_its_own_lock_without_horovod():
    flavour_args = imagebuild.image_build_args(BENCH_ENVS["torch"], MPI_FLAVOURS["openmpi"])
    assert flavour_args == {"LOCK": "envs/bench-torch.lock.txt", "WHEELHOUSE": "build/wheelhouse-torch",
                            "HOROVOD_VERSION": ""}
    text = definition(build_args=flavour_args)
    post = section(text, "%post")
    assert "HOROVOD_VERSION=''" in post  # the step's shell test skips Horovod
    horovod = [line.strip() for line in post].index(HOROVOD_STEP)
    assert post[horovod - 1].strip() == '&& if [ -n "" ]; then \\'
    files = section(text, "%files")
    assert "envs/bench-torch.lock.txt /opt/containerbench/bench.lock.txt" in files
    assert "build/wheelhouse-torch /opt/containerbench/wheelhouse" in files
    mpich = imagebuild.image_build_args(BENCH_ENVS["torch"], MPI_FLAVOURS["mpich"])
    assert mpich == {"LOCK": "envs/bench-torch.lock.txt", "WHEELHOUSE": "build/wheelhouse-torch-mpich",
                     "MPI_WHEELS": "mpich==5.0.2", "HOROVOD_VERSION": ""}
    assert imagebuild.image_build_args(BENCH_ENVS["cpu"], MPI_FLAVOURS["openmpi"]) == {
        "LOCK": "envs/bench.lock.txt", "WHEELHOUSE": "build/wheelhouse"}  # TensorFlow's as it was
    assert images.flavour_tag(TAG, BENCH_ENVS["torch"], MPI_FLAVOURS["mpich"]) == f"{TAG}-torch-mpich"
    assert images.flavour_tag(TAG, BENCH_ENVS["cpu"], MPI_FLAVOURS["openmpi"]) == TAG


def test_definition_from_archive():
    # Apptainer user guide, "Support for Docker and OCI Containers": a definition that starts from a
    # Docker archive uses `Bootstrap: docker-archive` with the file in `From:`.
    text = definition(build_args={"BASE_IMAGE": "/scratch/base.tar"})
    assert text.splitlines()[:2] == ["Bootstrap: docker-archive", "From: /scratch/base.tar"]
    text = definition(bootstrap="docker-archive", source="/scratch/base.tar")
    assert text.splitlines()[:2] == ["Bootstrap: docker-archive", "From: /scratch/base.tar"]
    # An image reference has no archive until someone saves one: it must be named.
    with pytest.raises(ValueError, match="^bootstrap docker-archive needs the archive of the base "
                                         "localhost/containerbench-base:bookworm"):
        definition(bootstrap="docker-archive")


def test_definition_command_labels_the_image_with_the_bench_venvs_hash(tmp_path, bench_python):
    out = tmp_path / "containerbench.def"
    assert cli.main(["singularity-definition", "--dockerfile", str(ROOT / "containers" / "Dockerfile"),
                     "--context", str(ROOT), "--bench-python", str(bench_python), "--out", str(out)]) == 0
    assert section(stage(out.read_text(), "image"), "%labels") == [
        f"org.containerbench.provenance {singularity.host_provenance_hash(bench_python)}"]


def test_definition_from_registry_with_site_arguments():
    text = definition(build_args={"BASE_IMAGE": CUDA, "APT_PACKAGES": "python3 python3-venv openmpi-bin",
                                  "HOROVOD_GPU_OPERATIONS": "NCCL", "LOCK": "envs/gpu.lock.txt"})
    assert text.splitlines()[:2] == ["Bootstrap: docker", f"From: {CUDA}"]
    post = section(text, "%post")
    assert "APT_PACKAGES='python3 python3-venv openmpi-bin'" in post
    assert "HOROVOD_GPU_OPERATIONS=NCCL \\" in post
    assert "--no-binary=horovod --no-build-isolation horovod==0.28.1; fi" in post  # GPU: compile the sdist
    assert "envs/gpu.lock.txt /opt/containerbench/bench.lock.txt" in section(text, "%files")
    assert "${" not in text


def test_definition_fixes_user_args_and_context(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text('ARG BASE=debian:12\nFROM ${BASE}\nARG WHO=1000\nARG DIR="/opt/x"\n'
                          'ENV APP=$DIR/bin\nCOPY data ${DIR}/data\nUSER ${WHO}\nRUN echo "$APP" > $DIR/app\n'
                          'LABEL a.b=$WHO\n')
    text = singularity.singularity_definition(dockerfile, {"WHO": "1001"}, context="ctx")
    assert text.splitlines()[:2] == ["Bootstrap: docker", "From: debian:12"]
    assert "${" not in text and "$WHO" not in text and "$DIR" not in text
    assert not re.search(r"^su - ", text, re.M)
    assert "ctx/data /opt/x/data" in section(text, "%files")
    assert section(text, "%labels") == ["a.b 1001"]
    post = section(text, "%post")
    assert "WHO=1001" in post and "export APP=/opt/x/bin" in post and 'echo "$APP" > /opt/x/app' in post
    assert section(text, "%environment") == ["export APP=/opt/x/bin"]


def test_a_multi_stage_definition_bootstraps_each_stage_from_its_own_image(tmp_path):
    # Apptainer user guide, "Multi-Stage Builds": a stage bootstraps from an image (its example's devel stage from
    # golang, its final one from alpine) and copies from an earlier one with `%files from devel`; a docker-archive
    # source given for the image's base applies only to the stages that start from that base.
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE=debian:12\nFROM golang:1.22 AS devel\nRUN go build -o /hello hello.go\n"
                          "FROM ${BASE} AS final\nCOPY --from=devel /hello /bin/hello\nCOPY data /data\n")
    text = singularity.singularity_definition(dockerfile, bootstrap="docker-archive", source="/s/base.tar",
                                              context="ctx")
    assert re.findall(r"^(?:Bootstrap|From|Stage): .*", text, re.M) == [
        "Bootstrap: docker", "From: golang:1.22", "Stage: devel",
        "Bootstrap: docker-archive", "From: /s/base.tar", "Stage: final"]
    final = stage(text, "final")
    assert section(final, "%files from devel") == ["/hello /bin/hello"]  # in the stage, not the build context
    assert section(final, "%files") == ["ctx/data /data"]


def test_a_line_of_a_run_step_that_starts_with_from_is_no_stage(tmp_path):
    # Dockerfile reference, "Format": a backslash continues the instruction on the next line, and comment lines
    # within it are removed first. So `from os import path` in a RUN step's script is part of that RUN.
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian:12\nRUN python3 -c 'import os' \\\n  # a comment\n"
                          "  from os import path \\\n  && true\nARG X=1\n")
    assert singularity.dockerfile_stages(dockerfile, {}) == [("debian:12", None)]
    assert singularity.instructions(dockerfile)[1] == "RUN python3 -c 'import os'    from os import path    && true"
    text = singularity.singularity_definition(dockerfile)
    assert "Stage:" not in text and "X=1" in section(text, "%post")


@pytest.mark.parametrize(("dockerfile", "error"), [
    ("FROM debian:12 AS venv\nRUN true\nFROM debian:12\nCOPY --from=venv /v /v\n",
     "every stage of a multi-stage build must be named (FROM IMAGE AS NAME)"),
    ("FROM debian:12 AS venv\nRUN true\nFROM venv AS image\nRUN true\n",
     "stage image starts from stage venv; an Apptainer stage bootstraps from an image"),
])
def test_a_dockerfile_whose_stages_apptainer_cannot_build_is_refused_in_one_line(tmp_path, dockerfile, error):
    # spython starts a stage only at FROM ... AS NAME (it would merge an unnamed stage into the one before), and an
    # Apptainer stage's From: is an image, never another stage.
    (tmp_path / "Dockerfile").write_text(dockerfile)
    with pytest.raises(ValueError, match=re.escape(error)):
        singularity.singularity_definition(tmp_path / "Dockerfile")


def test_expand_args_forms():
    values = {"A": "x", "E": ""}
    assert (singularity.expand_args("$A ${A} ${A:-d} ${E:-d} ${A:+w$A} ${E:+w} $AB $PATH", values)
            == "x x x d wx  $AB $PATH")
    assert singularity.dockerfile_args(ROOT / "containers" / "Dockerfile")["APT_PACKAGES"] == ""
    assert singularity.bootstrap_for("localhost/x:1") == "docker-daemon"
    assert singularity.bootstrap_for("build/images/base.tar") == "docker-archive"
    assert singularity.bootstrap_for(CUDA) == "docker"


# -- exact commands ----------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_build_argv(engine):
    spec = ImageSpec(engine, TAG, build_args={"PROVENANCE": "0123456789abcdef"})
    # podman-build(1), --layers: "Cache intermediate images during the build process (Default is true)"; docker's
    # classic builder has no such option (docker-build(1): --rm removes the intermediate containers, as by default).
    assert imagebuild.build_argv(spec) == [
        engine, "build", "--network", "none", "-f", "containers/Dockerfile", "-t", TAG,
        *(["--layers=false"] if engine == "podman" else []),
        "--build-arg", "BASE_IMAGE=localhost/containerbench-base:bookworm",
        "--build-arg", "PROVENANCE=0123456789abcdef",
        "--label", "org.containerbench.provenance=0123456789abcdef", "."]
    assert engine_env(engine).get("DOCKER_BUILDKIT") == ("0" if engine == "docker"
                                                         else os.environ.get("DOCKER_BUILDKIT"))


def test_a_docker_build_prunes_only_the_dangling_images_of_the_venv_stage():
    # docker-image-prune(1): "Remove all dangling images"; --filter "label=<key>=<value>" keeps to those with the
    # label, which only the Dockerfile's venv stage sets (a LABEL holds for the images after it in its stage).
    assert imagebuild.prune_stage_argv("docker") == [
        "docker", "image", "prune", "--force", "--filter", "label=org.containerbench.stage=venv"]
    assert "LABEL org.containerbench.stage=venv" in (ROOT / "containers" / "Dockerfile").read_text()


def test_a_prepared_copy_must_be_the_built_image_by_its_id(tmp_path):
    """podman-hpc's squashed copy, read back after migrate, against the build's stamp (imagebuild.build_stamp)."""
    stamp = tmp_path / "podman-containerbench.json"
    stamp.write_text('{"image_id": "sha256:aaa"}')
    images.check_prepared_id("podman-hpc", TAG, "sha256:aaa", stamp)
    with pytest.raises(imagestep.ImageStepError) as other:
        images.check_prepared_id("podman-hpc", TAG, "sha256:bbb", stamp)
    assert str(other.value) == (f"podman-hpc: prepared {TAG} as sha256:bbb, not the built sha256:aaa ({stamp}); "
                                "prepare it again")
    stamp.write_text("{}")
    with pytest.raises(imagestep.ImageStepError) as unnamed:
        images.check_prepared_id("podman-hpc", TAG, "sha256:aaa", stamp)
    assert str(unnamed.value) == (f"podman-hpc: the build's stamp {stamp} names no image id (KeyError('image_id')); "
                                  "build the image again")


def test_export_and_every_runtimes_prepare_commands():
    archive = Path("build/images/containerbench.tar")
    assert imagebuild.save_argv("docker", TAG, archive) == ["docker", "save", "-o", str(archive), TAG]
    assert imagebuild.save_argv("podman", TAG, archive) == ["podman", "save", "--format", "docker-archive",
                                                        "-o", str(archive), TAG]
    assert imagebuild.load_argv("podman", archive) == ["podman", "load", "-i", str(archive)]
    # Every file is named after the tag (containerbench-<hash>); the classes own the commands.
    out, remote = "build/images/containerbench-0123456789abcdef", "registry.example.org/containerbench:0123456789abcdef"
    assert images.runtime_commands("podman", TAG, "registry.example.org", gpus=True) == {
        "docker": [["docker", "load", "-i", f"{out}.tar"]],
        "podman": [],  # the build engine holds the image already
        "podman-hpc": [["podman-hpc", "load", "-i", f"{out}.tar"], ["podman-hpc", "migrate", TAG],
                       ["podman-hpc", "rmi", TAG]],  # once the squashed copy is read back (read_prepared)
        "apptainer": [["apptainer", "build", f"{out}.sif", f"docker-archive:{out}.tar"]],
        "singularity": [["singularity", "build", f"{out}.sif", f"docker-archive:{out}.tar"]],
        "apptainer-def": [["apptainer", "build", f"{out}.sif", f"{out}.def"]],
        "charliecloud": [["podman", "create", "--read-only", "--name", f"{Path(out).name}.ch-export", TAG, "/bin/true"],
                         ["podman", "export", "--output", f"{out}.ch.tar", f"{Path(out).name}.ch-export"],
                         ["podman", "rm", f"{Path(out).name}.ch-export"],
                         ["ch-convert", "-i", "tar", "-o", "dir", f"{out}.ch.tar", f"{out}.ch"],
                         ["ch-fromhost", "--nvidia", f"{out}.ch"]],
        "enroot": [["enroot", "import", "-o", f"{out}.sqsh", f"podman://{TAG}"]],
        "sarus": [["sarus", "load", f"{out}.tar", "containerbench:0123456789abcdef"]],
        "shifter": [["podman", "push", TAG, remote], ["shifterimg", "pull", f"docker:{remote}"],
                    ["shifterimg", "lookup", f"docker:{remote}"]],
    }
    from_docker = images.runtime_commands("docker", TAG, "registry.example.org")
    assert from_docker["podman"] == [["podman", "load", "-i", f"{out}.tar"]] and from_docker["docker"] == []
    assert from_docker["enroot"][0][-1] == f"dockerd://{TAG}"
    assert from_docker["shifter"][:2] == [["docker", "tag", TAG, remote], ["docker", "push", remote]]
    assert from_docker["charliecloud"][0][0] == "docker" and from_docker["charliecloud"][-1][0] == "ch-convert"


def test_each_runtime_runs_what_its_prepare_commands_made():
    build_dir = "/clone/build/images"
    files = images.image_files(TAG, build_dir)
    assert images.built_image("sarus", TAG, build_dir) == ("load/library/containerbench:0123456789abcdef",
                                                          files["sarus"])
    assert images.built_image("enroot", TAG, "build/images")[0] == os.path.abspath(
        "build/images/containerbench-0123456789abcdef.sqsh")  # Pyxis: a file only with a leading / or .
    assert images.built_image("podman-hpc", TAG, build_dir) == (TAG, files["podman-hpc"])
    assert images.built_image("apptainer", TAG, build_dir) == (files["apptainer"],) * 2
    assert images.built_image("shifter", TAG, build_dir) is None  # the gateway pulls from a registry
    # GPU runs wait for ch-fromhost --nvidia's marker (made on a GPU node), and run the directory.
    directory = f"{build_dir}/containerbench-0123456789abcdef.ch"
    assert images.built_image("charliecloud", TAG, build_dir) == (directory, directory)
    assert images.built_image("charliecloud", TAG, build_dir, gpus=True) == (directory, f"{directory}.nvidia")


def test_base_and_wheelhouse_argvs(tmp_path):
    assert baseimage.debootstrap_argv(Path("root"), "http://deb.debian.org/debian") == [
        "debootstrap", "--variant=minbase", "--include=python3,python3-venv,openmpi-bin,libopenmpi3,ca-certificates",
        "bookworm", "root", "http://deb.debian.org/debian"]
    assert baseimage.rootfs_tar_argv(Path("root")) == ["tar", "-C", "root", "--exclude=./dev/*", "-c", "."]
    assert baseimage.import_argv("podman") == [
        "podman", "import", "--change", f"ENV PATH={DEFAULT_PATH}",
        "--change", f"LABEL org.containerbench.base-recipe={baseimage.recipe()}", "-", imagestep.BASE_IMAGE]
    assert re.fullmatch("[0-9a-f]{16}", baseimage.recipe()) and baseimage.recipe() == baseimage.recipe("bookworm")
    assert baseimage.recipe("trixie") != baseimage.recipe() != baseimage.recipe(packages=("python3",))
    args = wheelhouse.platform_args("3.11")
    assert args[:10] == ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                         "--abi", "cp311", "--abi", "abi3", "--abi"]
    assert "manylinux_2_36_x86_64" in args and "manylinux_2_5_x86_64" in args and "manylinux_2_37_x86_64" not in args
    assert wheelhouse.horovod_wheel_argv(Path("py"), Path("w/horovod-0.28.1.tar.gz"), Path("w")) == [
        "py", "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", "--no-build-isolation",
        "--wheel-dir", "w", "w/horovod-0.28.1.tar.gz"]
    assert wheelhouse.horovod_version(ROOT) == "0.28.1"
    (tmp_path / "debian.sources").write_text("Types: deb\nURIs: http://mirror.example/debian\n"
                                             "Suites: bookworm bookworm-updates\nComponents: main\n")
    assert baseimage.apt_mirror("bookworm", [tmp_path]) == "http://mirror.example/debian"
    (tmp_path / "debian.sources").write_text("deb [arch=amd64] http://one.example/debian bookworm main\n")
    assert baseimage.apt_mirror("bookworm", [tmp_path / "debian.sources"]) == "http://one.example/debian"


# Horovod 0.28.1's sdist: setup.py configures CMake with -DCMAKE_BUILD_TYPE=RelWithDebInfo (custom_build_ext,
# unless HOROVOD_DEBUG), and CMakeLists.txt then replaces -O2 by -O3 in CMAKE_CXX_FLAGS_RELWITHDEBINFO
# ("RelWithDebInfo uses -O2, prefer performance over debug info"). The project below does the same two things.
HOROVOD_LIKE_PROJECT = """cmake_minimum_required(VERSION 3.13)
project(horovod_like CXX)
string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")
message(STATUS "compile flags: ${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")
"""


def test_horovods_compile_keeps_its_optimisation_without_debug_information(tmp_path, bench_python):
    (tmp_path / "CMakeLists.txt").write_text(HOROVOD_LIKE_PROJECT)
    configured = {}
    for name, env in (("cmake's own", {k: v for k, v in wheelhouse.horovod_build_env(ROOT).items()
                                       if k != "CMAKE_TOOLCHAIN_FILE"}),
                      ("ours", wheelhouse.horovod_build_env(ROOT))):
        done = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / name.replace(" ", "-")),
                               "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        configured[name] = re.search(r"^-- compile flags: (.*)$", done.stdout, re.M)[1]
    assert configured == {"cmake's own": "-O3 -g -DNDEBUG", "ours": "-O3 -DNDEBUG"}
    assert wheelhouse.horovod_build_env(ROOT)["CMAKE_TOOLCHAIN_FILE"] == str(ROOT / wheelhouse.HOROVOD_TOOLCHAIN)
    assert wheelhouse.horovod_build_env(ROOT, PATH="/x")["PATH"] == "/x"


def test_engine_usable_reports_missing_binary(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert engine_usable("docker") == (False, "docker is not installed (not on PATH)")
    assert engine_usable("charliecloud") == (False, "ch-run is not installed (not on PATH)")


@pytest.mark.containers
def test_engine_usable_names_the_daemon_that_did_not_answer(monkeypatch):
    # make setup installs docker.io; no daemon listens on this socket
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    ok, why = engine_usable("docker")
    assert not ok
    assert why.startswith("`docker info --format '{{.ServerVersion}}'` failed: ")
    assert why.endswith("(DOCKER_HOST=unix:///nonexistent/docker.sock)")


def test_failing_step_names_itself():
    with pytest.raises(imagestep.ImageStepError, match=r"^export \(podman save\) failed \(exit 1\): false x$"):
        imagestep.run_step("export (podman save)", ["false", "x"], timeout=60)
    with pytest.raises(imagestep.ImageStepError, match="not installed"):
        imagestep.run_step("charliecloud", ["/nonexistent/ch-convert"], timeout=60)


def test_step_past_its_time_limit_fails_and_leaves_nothing_running(tmp_path):
    # the step's own child (as podman's and ch-convert's helpers do) must go with it
    pid_file = tmp_path / "helper.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    with pytest.raises(imagestep.ImageStepError, match=r"^build \(podman\) timed out after 1 s: bash -c "):
        imagestep.run_step("build (podman)", ["bash", "-c", script], timeout=1)
    helper = int(pid_file.read_text())
    assert not Path(f"/proc/{helper}").exists() or "Z" in Path(f"/proc/{helper}/stat").read_text().split()[2]


def test_dockerfile_and_context_rules():
    dockerfile = (ROOT / "containers" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=localhost/containerbench-base:bookworm" in dockerfile
    assert "LABEL org.containerbench.provenance=$PROVENANCE" in dockerfile
    assert not re.search(r"^\s*(ENTRYPOINT|CMD)\b", dockerfile, re.M)
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv*", "results", ".snakemake", "build/*", "!build/wheelhouse"} <= set(ignore)
    # every flavour's wheelhouse is in the context (a missing one fails the build's COPY)
    assert {f"!{flavour.wheelhouse(env)}"
            for env in BENCH_ENVS.values() for flavour in MPI_FLAVOURS.values()} <= set(ignore)


def test_podman_conf_script(tmp_path):
    out = subprocess.run(["bash", str(ENGINES_SCRIPT), "podman-conf", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == f"CONTAINERS_CONF={tmp_path}/containers.conf"
    conf = (tmp_path / "containers.conf").read_text()
    assert 'runtime = "runc"' in conf and 'cgroup_manager = "cgroupfs"' in conf


def test_remove_names_an_unknown_part_in_one_line_before_touching_anything(tmp_path, capsys):
    stamp = tmp_path / "podman-containerbench-x.json"
    stamp.write_text("{}")
    assert cli.main(["image", "--tag", "localhost/containerbench:x", "remove", "--build-dir", str(tmp_path),
                     "--only", "podman", "--only", "charliclod"]) == 1
    assert capsys.readouterr().err == (
        "containerbench image: remove: no such part of an image: charliclod (one of docker, podman, apptainer, "
        "singularity, charliecloud, enroot, sarus, podman-hpc, archive, definition, charliecloud-dir)\n")
    assert stamp.exists()


def test_remove_keeps_the_stamp_of_a_store_that_does_not_answer_and_says_so(tmp_path, capsys, monkeypatch):
    """A stamp says the engine's store holds the image; where that engine does not answer here (a dockerd not
    running, a podman-hpc broken), its removal was skipped in silence and the stamp removed, leaving a copy no
    file records (a finding of stop 53). Now the stamp is kept, the rest goes, and the command fails in one line
    naming the stamp and why. dockerd really does not answer at this socket (docker(1), DOCKER_HOST)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-dockerd.sock")
    tag = "localhost/containerbench-kept-test:x"
    files = images.image_files(tag, tmp_path)
    Path(files["docker"]).write_text("{}")
    Path(files["archive"]).write_text("not an archive: only its name is removed")
    assert not engine_usable("docker")[0]
    assert cli.main(["image", "--tag", tag, "remove", "--build-dir", str(tmp_path), "--only", "docker",
                     "--only", "archive"]) == 1
    said = capsys.readouterr()
    assert said.out == f"removed {files['archive']}\n"
    assert re.fullmatch(rf"containerbench image: remove: kept {re.escape(files['docker'])}: docker does not answer "
                        r"here \(.+\), and may still hold what it names; allowed: run it again where each answers, "
                        r"or delete the stamp once its copy is gone\n", said.err), said.err
    assert Path(files["docker"]).exists() and not Path(files["archive"]).exists()


def test_remove_takes_sarus_loaded_copy_by_the_reference_it_lists_and_reads_it_back(tmp_path, capsys, monkeypatch):
    """Issue 32: `make clean-images` left the image `sarus load` put in Sarus's store. Sarus cannot be installed
    here, so a program of its name answers as the user guide's own examples do (eth-cscs/sarus@4a8fdc43,
    doc/user/user_guide.rst, "Loading images from tar archives" for the listing, "Removing images" for `sarus rmi
    load/library/my_debian` and its "removed load/library/my_debian/latest"); what is held here is our side:
    the stamp's copy read back, removed by the listed reference, read back again, and the stamp gone."""
    listing, calls = tmp_path / "listing.txt", tmp_path / "calls.txt"
    listing.write_text(
        "REPOSITORY               TAG          IMAGE ID       CREATED               SIZE         SERVER\n"
        "load/library/my_debian   latest       2fe79f06fa6d   2018-01-31T15:08:56   47.04MB      load\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sarus").write_text(f"""#!{sys.executable}
import sys, pathlib
listing, argv = pathlib.Path({str(listing)!r}), sys.argv[1:]
pathlib.Path({str(calls)!r}).open("a").write(" ".join(argv) + "\\n")
if argv == ["--version"]:
    print("1.7.0")
elif argv == ["images"]:
    print(listing.read_text(), end="")
elif argv[0] == "rmi":
    repository, tag = argv[1].rsplit(":", 1)
    rows = listing.read_text().splitlines()
    listing.write_text("".join(row + "\\n" for row in rows if row.split()[:2] != [repository, tag]))
    print(f"removed {{repository}}/{{tag}}")
""")
    (bin_dir / "sarus").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    tag = "localhost/my_debian:latest"
    stamp = Path(images.image_files(tag, tmp_path)["sarus"])
    stamp.write_text('{"image": "load/library/my_debian:latest", "sarus_image_id": "2fe79f06fa6d"}\n')
    assert cli.main(["image", "--tag", tag, "remove", "--build-dir", str(tmp_path), "--only", "sarus"]) == 0
    assert calls.read_text().splitlines() == ["--version", "images", "rmi load/library/my_debian:latest", "images"]
    assert listing.read_text().splitlines()[1:] == [] and not stamp.exists()
    assert capsys.readouterr().out.splitlines() == ["removed sarus localhost/my_debian:latest", f"removed {stamp}"]
