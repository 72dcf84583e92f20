"""The digest of what an image is built from (buildinputs): it moves with every input that reaches the build,
and only with those. The real reuse in an engine's store: test_image_builds.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ROOT

from containerbench import buildinputs
from containerbench.imagebuild import DOCKERFILE, ImageSpec, build_argv, same_inputs_argv

BASE_ID = "sha256:" + "1" * 64
ARGS = {"BASE_IMAGE": "localhost/base:1", "LOCK": "envs/bench.lock.txt", "WHEELHOUSE": "build/wheelhouse"}


@pytest.fixture
def context(tmp_path):
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "src" / "pkg" / "__pycache__" / "code.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "bench.lock.txt").write_text("numpy==1.26.4\n")
    (tmp_path / "envs" / "other.lock.txt").write_text("numpy==2.0.0\n")
    (tmp_path / "build" / "wheelhouse").mkdir(parents=True)
    (tmp_path / "build" / "wheelhouse" / "numpy.whl").write_bytes(b"wheel")
    (tmp_path / "build" / "notes.txt").write_text("not in the context\n")
    (tmp_path / "README.md").write_text("readme\n")
    (tmp_path / ".dockerignore").write_text("# comment\nbuild/*\n!build/wheelhouse\n**/__pycache__\n")
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE_IMAGE=base\nFROM ${BASE_IMAGE} AS venv\nARG LOCK=envs/bench.lock.txt\nARG WHEELHOUSE\n"
        "COPY ${LOCK} /lock.txt\nCOPY --chown=0:0 $WHEELHOUSE \\\n  /wheels\n"
        "FROM ${BASE_IMAGE} AS image\nCOPY --from=venv /wheels /wheels\nCOPY [\"README.md\", \"/readme\"]\n"
        "ADD src /src\n")
    return tmp_path


def digest(context: Path, **args) -> str:
    return buildinputs.inputs_digest(context / "Dockerfile", context, {**ARGS, **args}, BASE_ID)


def test_the_sources_are_what_copy_and_add_take_from_the_context_with_the_args_expanded(context):
    # Dockerfile reference, "COPY": `COPY [--chown=...] <src>... <dest>`, the JSON form, and `--from=<stage>`
    # copies from a stage, not the context; continuation lines are one instruction ("Format").
    assert buildinputs.copied_sources(context / "Dockerfile", ARGS) == [
        "envs/bench.lock.txt", "build/wheelhouse", "README.md", "src"]
    assert buildinputs.copied_sources(DOCKERFILE if DOCKERFILE.is_absolute() else ROOT / DOCKERFILE, ARGS) == [
        "envs/bench.lock.txt", "build/wheelhouse", "envs/bench.lock.txt", "pyproject.toml", "README.md", "src"]


def test_the_files_are_those_the_dockerignore_lets_through(context):
    files = [path.relative_to(context).as_posix() for path in
             buildinputs.context_files(context, ["src", "build/wheelhouse", "README.md"])]
    assert files == ["README.md", "build/wheelhouse/numpy.whl", "src/pkg/code.py"]
    patterns = buildinputs.ignore_patterns(context)
    assert buildinputs.ignored("build/notes.txt", patterns) and not buildinputs.ignored("build/wheelhouse/a", patterns)
    assert buildinputs.ignored("__pycache__/a.pyc", patterns)  # `**/` matches no directory too


def test_the_digest_moves_with_each_input_and_only_with_them(context):
    first = digest(context)
    assert digest(context) == first
    (context / "src" / "pkg" / "__pycache__" / "code.cpython-311.pyc").write_bytes(b"\1")  # left out
    (context / "build" / "notes.txt").write_text("changed\n")  # left out
    (context / "envs" / "other.lock.txt").write_text("numpy==2.1.0\n")  # not copied
    assert digest(context) == first
    changes = {
        "a source file": lambda: (context / "src" / "pkg" / "code.py").write_text("x = 2\n"),
        "a new file": lambda: (context / "src" / "pkg" / "more.py").write_text(""),
        "a wheel": lambda: (context / "build" / "wheelhouse" / "numpy.whl").write_bytes(b"other"),
        "its mode": lambda: (context / "README.md").chmod(0o755),
        "the Dockerfile": lambda: (context / "Dockerfile").write_text(
            (context / "Dockerfile").read_text() + "RUN true\n"),
    }
    seen = {first}
    for what, change in changes.items():
        change()
        assert (now := digest(context)) not in seen, what
        seen.add(now)
    assert digest(context, LOCK="envs/other.lock.txt") not in seen  # another build argument, another file
    assert digest(context, LOCK="envs/bench.lock.txt", UNDECLARED="x") == now  # its default named; one unused
    assert buildinputs.inputs_digest(context / "Dockerfile", context, ARGS, "sha256:" + "2" * 64) not in seen
    shutil.rmtree(context / "src" / "pkg" / "__pycache__")
    assert digest(context) in seen


def test_the_build_labels_its_image_with_its_inputs_and_asks_the_store_by_that_label():
    # docker-build(1) and podman-build(1): --label KEY=VALUE; docker-images(1) and podman-images(1):
    # --filter label=KEY=VALUE, --quiet (ids only), --no-trunc (whole ids).
    argv = build_argv(ImageSpec("podman", "localhost/x:1", inputs="abc"))
    assert argv[-3:] == ["--label", f"{buildinputs.INPUTS_LABEL}=abc", "."]
    assert "--label" not in build_argv(ImageSpec("docker", "localhost/x:1"))
    assert same_inputs_argv("docker", "abc") == [
        "docker", "images", "--quiet", "--no-trunc", "--filter", "label=org.containerbench.inputs=abc"]
