"""The digest of what an image is built from (buildinputs): it moves with every input that reaches the build,
and only with those. The real reuse in an engine's store: test_image_builds.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ROOT

from containerbench import buildinputs
from containerbench.config import BENCH_ENVS, MPI_FLAVOURS
from containerbench.imagebuild import DOCKERFILE, ImageSpec, build_argv, build_context_files, same_inputs_argv

IDS = {"localhost/base:1": "sha256:" + "1" * 64}
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
    return buildinputs.inputs_digest(context / "Dockerfile", context, {**ARGS, **args}, IDS)


def test_the_sources_are_what_copy_and_add_take_from_the_context_with_the_args_expanded(context):
    # Dockerfile reference, "COPY": `COPY [--chown=...] <src>... <dest>`, the JSON form, and `--from=<stage>`
    # copies from a stage, not the context; continuation lines are one instruction ("Format").
    assert buildinputs.copied_sources(context / "Dockerfile", ARGS) == [
        "envs/bench.lock.txt", "build/wheelhouse", "README.md", "src"]
    assert buildinputs.copied_sources(DOCKERFILE if DOCKERFILE.is_absolute() else ROOT / DOCKERFILE, ARGS) == [
        "envs/bench.lock.txt", "build/wheelhouse", "envs/bench.lock.txt", "pyproject.toml", "README.md", "src"]


def test_the_files_are_those_the_dockerignore_lets_through(context):
    entries = buildinputs.context_entries(context, ["src", "build/wheelhouse", "/README.md"])
    assert entries == ["README.md", "build/wheelhouse", "build/wheelhouse/numpy.whl", "src", "src/pkg",
                       "src/pkg/code.py"]
    patterns = buildinputs.ignore_patterns(context)
    assert buildinputs.ignored("build/notes.txt", patterns) and not buildinputs.ignored("build/wheelhouse/a", patterns)
    assert buildinputs.ignored("__pycache__/a.pyc", patterns)  # `**/` matches no directory too


@pytest.mark.parametrize("pattern, path, ignored", [
    # Docker's builder reference, ".dockerignore file", and podman's .containerignore(5) (containers-common), whose
    # examples these are: Go's filepath.Match rules, each line cleaned with filepath.Clean, a leading / the
    # context's root, `**` any number of directories (zero included); `*` and `?` stay within one directory, and
    # a pattern that matches a directory leaves out what is under it.
    ("src/*.py", "src/a.py", True), ("src/*.py", "src/pkg/a.py", False), ("*/temp*", "somedir/temporary.txt", True),
    ("*/*/temp*", "somedir/subdir/temporary.txt", True), ("temp?", "tempa/x", True), ("temp?", "temp/x", False),
    ("**/*.go", "a/b/c.go", True), ("**/*.go", "c.go", True), ("./build/", "build/x", True),
    ("/README.md", "README.md", True), ("[a-c]x", "bx", True), ("[^a-c]x", "bx", False),
    ("[!a-c]x", "bx", True),  # filepath.Match: "'[' [ '^' ] { character-range } ']'", so `!` is a member
])
def test_a_pattern_leaves_out_what_docker_leaves_out(tmp_path, pattern, path, ignored):
    (tmp_path / ".dockerignore").write_text(pattern + "\n")
    assert buildinputs.ignored(path, buildinputs.ignore_patterns(tmp_path)) is ignored


def test_the_last_matching_pattern_decides_and_an_exception_takes_back_in(tmp_path):
    # The same references: "the last line that matches a particular file determines whether it is included".
    (tmp_path / ".dockerignore").write_text("*.md\n! README.md\n!./docs/keep.md\n")
    patterns = buildinputs.ignore_patterns(tmp_path)
    assert [buildinputs.ignored(path, patterns) for path in ("CHANGES.md", "README.md", "docs/keep.md")] == [
        True, False, False]  # `*.md` is at the top only: docs/keep.md was never left out, nor taken back


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
    assert buildinputs.inputs_digest(context / "Dockerfile", context, ARGS, {"localhost/base:1": "sha256:2"}) != now
    shutil.rmtree(context / "src" / "pkg" / "__pycache__")
    assert digest(context) == now


def test_links_modes_and_empty_directories_are_inputs_and_a_dangling_link_is_no_error(context):
    seen = {digest(context)}
    changes = {
        "a dangling link": lambda: (context / "src" / "pkg" / ".#code.py").symlink_to("root@host.1234"),
        "its target": lambda: ((context / "src" / "pkg" / ".#code.py").unlink(),
                               (context / "src" / "pkg" / ".#code.py").symlink_to("root@host.5678")),
        "a mode": lambda: (context / "src" / "pkg" / "code.py").chmod(
            (context / "src" / "pkg" / "code.py").stat().st_mode ^ 0o100),
        "an empty directory": lambda: (context / "src" / "empty").mkdir(),
        "a link to a directory": lambda: (context / "src" / "linked").symlink_to("pkg"),
    }
    for what, change in changes.items():
        change()
        assert (now := digest(context)) not in seen, what
        seen.add(now)


def test_the_images_a_build_starts_from_are_its_froms_less_its_own_stages(context):
    assert buildinputs.from_images(context / "Dockerfile", ARGS) == ["localhost/base:1"]
    assert buildinputs.from_images(context / "Dockerfile", {"BASE_IMAGE": "other:2"}) == ["other:2"]


def test_an_argument_whose_stages_declare_other_defaults_has_none_in_common(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM a AS one\nARG X=1\nARG Y=3\nFROM b\nARG X=2\nARG Y=3\n")
    assert buildinputs.effective_args(tmp_path / "Dockerfile", {}) == {"X": None, "Y": "3"}
    assert buildinputs.effective_args(tmp_path / "Dockerfile", {"X": "2", "Z": "0"}) == {"X": "2", "Y": "3"}


@pytest.mark.parametrize("instruction, why", [
    ("RUN --mount=type=bind,source=src,target=/s true", "RUN --mount"),
    ("COPY <<EOF /f\nEOF", "a heredoc"),
    ("ADD https://example.org/a.tar /a", "not from the context"),
    ("COPY *.nothing /t/", "no file of the build context matches it"),
    ("COPY $FROM_ENV /d", "a variable the build arguments do not set"),
    ("COPY --from=localhost/other:1 /x /x", "an image, not a stage"),
    ("COPY ../outside /o", "outside the build context"),
    ("COPY linked-wheels /w", "a COPY source that is a link"),
])
def test_an_input_the_digest_cannot_see_is_said_and_nothing_is_reused(context, instruction, why):
    (context / "linked-wheels").symlink_to("build/wheelhouse")  # the builders follow it
    (context / "Dockerfile").write_text((context / "Dockerfile").read_text() + instruction + "\n")
    with pytest.raises(buildinputs.Unresolved, match=why):
        digest(context)


@pytest.mark.parametrize("ignore_file", [".containerignore", "Dockerfile.dockerignore", "Dockerfile.containerignore"])
def test_an_ignore_file_the_builders_would_read_instead_is_said(context, ignore_file):
    # containers-common's .containerignore(5): engines read ".containerignore or .dockerignore in the root context
    # directory"; Docker's build-context reference: a Dockerfile's own <name>.dockerignore beside it wins over the
    # context's (the .containerignore form beside it refused the same way, in case a builder reads it).
    (context / ignore_file).write_text("src\n")
    with pytest.raises(buildinputs.Unresolved, match="an ignore file the digest does not read"):
        digest(context)


def test_the_json_form_after_flags_and_wildcards_are_sources(context):
    (context / "Dockerfile").write_text((context / "Dockerfile").read_text()
                                        + 'COPY --chown=0:0 ["README.md", "/r"]\nCOPY\tsrc/pkg/*.py /p/\n')
    assert buildinputs.copied_sources(context / "Dockerfile", ARGS)[-2:] == ["README.md", "src/pkg/*.py"]
    first = digest(context)
    (context / "src" / "pkg" / ".hidden.py").write_text("")  # filepath.Match's `*` matches a leading dot
    assert digest(context) != first


def test_the_build_labels_its_image_with_its_inputs_and_asks_the_store_by_that_label():
    # docker-build(1) and podman-build(1): --label KEY=VALUE; docker-images(1) and podman-images(1):
    # --filter label=KEY=VALUE, --quiet (ids only), --no-trunc (whole ids).
    argv = build_argv(ImageSpec("podman", "localhost/x:1", inputs="abc"))
    assert argv[-3:] == ["--label", f"{buildinputs.INPUTS_LABEL}=abc", "."]
    assert "--label" not in build_argv(ImageSpec("docker", "localhost/x:1"))
    assert same_inputs_argv("docker", "abc") == [
        "docker", "images", "--quiet", "--no-trunc", "--filter", "label=org.containerbench.inputs=abc"]


def test_a_rules_inputs_are_the_files_the_build_takes_less_what_another_rule_makes(context):
    """What the build takes, less the sources named: a schema or a template too, not only the Python sources
    (the workflow's rule names the wheelhouse, its own rule's, and README.md: below)."""
    taken = buildinputs.files_taken(context / "Dockerfile", context, ARGS, ["build/wheelhouse"])
    assert taken == [str(context / name) for name in ("README.md", "envs/bench.lock.txt", "src/pkg/code.py")]
    everything = buildinputs.files_taken(context / "Dockerfile", context, ARGS, [])
    assert str(context / "build" / "wheelhouse" / "numpy.whl") in everything


@pytest.mark.parametrize("flavour", sorted(MPI_FLAVOURS))
def test_the_workflows_image_build_takes_the_package_data_and_pyproject_and_not_the_readme(flavour):
    taken = {Path(path).relative_to(ROOT).as_posix()
             for path in build_context_files(ROOT, BENCH_ENVS["cpu"], MPI_FLAVOURS[flavour])}
    assert "README.md" not in taken  # what a docs edit would cost: every container run measured again
    assert {"pyproject.toml", "envs/bench.lock.txt", "src/containerbench/schemas/config.schema.yaml",
            "src/containerbench/templates/report.html.j2", "src/containerbench/rank/bench.py"} <= taken
    assert not [path for path in taken if "__pycache__" in path or path.startswith("build/")]


def test_a_dockerfile_whose_sources_cannot_be_read_makes_the_rule_take_the_sources_and_the_lock(tmp_path):
    """The image_build rule's inputs where files_taken cannot tell them (buildinputs.Unresolved): the package's
    Python and the env's lock, which the rule no longer names apart (it was there for this case only)."""
    env, flavour = BENCH_ENVS["cpu"], MPI_FLAVOURS["openmpi"]
    (tmp_path / DOCKERFILE).parent.mkdir(parents=True)
    (tmp_path / DOCKERFILE).write_text("FROM base\nCOPY linked /w\n")
    (tmp_path / "linked").symlink_to("src")  # a COPY source that is a link: Unresolved
    (tmp_path / "src" / "containerbench").mkdir(parents=True)
    (tmp_path / "src" / "containerbench" / "bench.py").write_text("x = 1\n")
    with pytest.raises(buildinputs.Unresolved):
        buildinputs.files_taken(tmp_path / DOCKERFILE, tmp_path, {}, [])
    assert build_context_files(tmp_path, env, flavour) == [str(tmp_path / env.lock),
                                                           str(tmp_path / "src" / "containerbench" / "bench.py")]
