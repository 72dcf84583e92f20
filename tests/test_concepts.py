"""Each concept is spelled in its home only: a runtime's name in its runtime class, a framework's in
frameworks.py, a run status in the Status enum, a launcher kind in its launcher class. Code elsewhere asks
the registry, so adding a runtime, a framework, a status or a launcher is one module plus its tests, and a
name spelled anywhere else fails here with the file and line.

What counts: a string literal that IS the name (`"docker"`, not a message that mentions it) in the package's
Python, and a quoted name in the workflow's rule files. The allowed exceptions are listed below, each with
its reason; an exception that no longer occurs fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import ROOT

from containerbench.config import load_schema
from containerbench.frameworks import FRAMEWORKS

PACKAGE = ROOT / "src" / "containerbench"
RULES = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]


def literal_spellings(path: Path, names) -> list[tuple[str, int, str]]:
    """(file, line, name) for every string literal in `path` that is exactly one of `names`."""
    found = []
    relative = str(path.relative_to(ROOT))
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append((relative, node.lineno, node.value))
    else:
        alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
        pattern = re.compile(rf"""(["'])({alternatives})\1""")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [(relative, number, match.group(2)) for match in pattern.finditer(line)]
    return found


def spellings_outside(homes: set[str], names, finder=literal_spellings) -> list[tuple[str, int, str]]:
    files = [path for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE)) not in homes]
    return [hit for path in [*files, *RULES] for hit in finder(path, set(names))]


def check(concept: str, homes: set[str], names, allowed: dict[tuple[str, str], str], finder=literal_spellings) -> None:
    """`finder`: what counts as a spelling in one file (literal_spellings: every literal that is a name)."""
    hits = spellings_outside(homes, names, finder)
    unexplained = [f"{file}:{line}: {name!r}" for file, line, name in hits if (file, name) not in allowed]
    assert not unexplained, f"{concept} spelled outside {sorted(homes)}: " + "; ".join(unexplained)
    stale = sorted(set(allowed) - {(file, name) for file, _, name in hits})
    assert not stale, f"allowed {concept} spellings that no longer occur: {stale}"


def test_the_checker_finds_a_spelling_in_python_and_in_a_rule(tmp_path):
    module = ROOT / "tests" / "data" / "concept-probe.py"
    rule = ROOT / "tests" / "data" / "concept-probe.smk"
    try:
        module.write_text('x = "pytorch"\ny = "a pytorch message"\n')
        rule.write_text('if framework == "pytorch":\n    pass\n')
        assert literal_spellings(module, {"pytorch"}) == [("tests/data/concept-probe.py", 1, "pytorch")]
        assert literal_spellings(rule, {"pytorch"}) == [("tests/data/concept-probe.smk", 1, "pytorch")]
    finally:
        module.unlink(missing_ok=True)
        rule.unlink(missing_ok=True)


# (file relative to the clone, name): why it is spelled there. The rank side (bench.py, torchbench.py,
# provenance.py and what they import) is hashed for provenance and imports nothing but the framework it
# runs, so it cannot ask the registry; the tests below keep it and the registry from drifting apart.
RANK_SIDE = "the rank side is hashed for provenance and imports nothing of the workflow's side"
FRAMEWORK_SPELLINGS_ALLOWED: dict[tuple[str, str], str] = {
    ("src/containerbench/rank/bench.py", "tensorflow"): f"TensorFlow's harness names itself in its result: {RANK_SIDE}",
    ("src/containerbench/rank/torchbench.py", "pytorch"): f"PyTorch's harness names itself in its result: {RANK_SIDE}",
    ("src/containerbench/rank/provenance.py", "tensorflow"): "a distribution's name in ROOT_DISTRIBUTIONS, the "
    f"walk's roots (test_provenance_roots_cover_every_frameworks): {RANK_SIDE}",
}


def test_a_framework_is_spelled_only_in_frameworks_py():
    check("a framework name", {"frameworks.py"}, FRAMEWORKS, FRAMEWORK_SPELLINGS_ALLOWED)


def test_the_config_schemas_enum_is_the_registrys_names():
    # The schema is a home too: the names a config may give, in the registry's order.
    schema = load_schema()
    assert schema["properties"]["benchmark"]["properties"]["frameworks"]["items"]["enum"] == list(FRAMEWORKS)


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_the_config_schema_has_each_frameworks_keys(name):
    # Its bare-metal interpreter, and its image in each MPI model under every runtime's images.<runtime>.
    schema, registered = load_schema(), FRAMEWORKS[name]
    assert registered.bare_metal_key in schema["properties"]["bare_metal"]["properties"]
    image_settings = schema["$defs"]["runtime_image"]["properties"]
    assert {registered.image_key(model) for model in ("hybrid", "native")} <= set(image_settings)


def test_provenance_roots_cover_every_frameworks():
    from containerbench.rank.provenance import ROOT_DISTRIBUTIONS

    for registered in FRAMEWORKS.values():
        assert set(registered.provenance_roots) <= set(ROOT_DISTRIBUTIONS), registered.name


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_harness_names_its_framework_in_its_result(name):
    # The name the rank side spells (FRAMEWORK_SPELLINGS_ALLOWED) is the registry's, in the registry's harness.
    harness = PACKAGE.joinpath(*FRAMEWORKS[name].harness.removeprefix("containerbench.").split(".")).with_suffix(".py")
    assert literal_spellings(harness, {name}), f"{harness.name} does not name {name!r} in its result"


# -- runtimes, run statuses, launcher kinds ------------------------------------------------------------

RUNTIME_HOMES = {str(path.relative_to(PACKAGE)) for path in (PACKAGE / "runtimes").glob("*.py")}

# (file relative to the clone, name): why it is spelled there.
MARKER_FILE = "the container a rank finds itself in, by its marker file"
RUNTIME_SPELLINGS_ALLOWED: dict[tuple[str, str], str] = {
    # The ranks' side (tests/test_layers.py's BENCHMARK_SIDE) runs in the benchmark venv and cannot import the
    # runtimes: each names the runtime it assumes when CONTAINERBENCH_RUNTIME (Runtime.environment's) is unset.
    ("src/containerbench/rank/bench.py", "bare-metal"): "the rank's --runtime default, on the ranks' side",
    ("src/containerbench/rank/torchbench.py", "bare-metal"): "the rank's --runtime default, on the ranks' side",
    ("src/containerbench/rank/netbench.py", "bare-metal"): "the result line's runtime default, on the ranks' side",
    ("src/containerbench/rank/telemetry.py", "docker"): MARKER_FILE,
    ("src/containerbench/rank/telemetry.py", "podman"): MARKER_FILE,
    ("src/containerbench/rank/telemetry.py", "apptainer"): MARKER_FILE,
    ("src/containerbench/rank/telemetry.py", "charliecloud"): MARKER_FILE,
    # Singularity's bootstrap agents (Bootstrap: docker, docker-daemon), not the runtime.
    ("src/containerbench/singularity.py", "docker"): "a Singularity definition's bootstrap agent",
    ("src/containerbench/cli/image.py", "docker"): "singularity-definition --bootstrap's choices, Singularity's agents",
}


def test_a_runtime_is_spelled_only_in_its_runtime_module():
    """A runtime's name (bare metal's and every registered one's) is its class's `name`: elsewhere code asks
    the registry or the class (CONTAINER_RUNTIMES[name].placeholder_image, BareMetal.name). The engines that
    build the image are the Docker and Podman runtimes (runtimes.ENGINES), so their names count too."""
    from containerbench.runtimes import RUNTIME_NAMES

    check("a runtime name", RUNTIME_HOMES, RUNTIME_NAMES, RUNTIME_SPELLINGS_ALLOWED)


def compared_spellings(path: Path, names) -> list[tuple[str, int, str]]:
    """literal_spellings narrowed, in Python, to where a literal is used as a verdict: an operand of a
    comparison (`record["status"] != "ok"`, `status in ("failed", "invalid")`), the value of a "status" key
    in a dict display, or a `status=` argument. Elsewhere the same words are other things: keys and columns
    ("disturbed", "failed", "ok"), a probe's ok, a test's outcome. A rule file counts every quoted name."""
    if path.suffix != ".py":
        return literal_spellings(path, names)
    candidates = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                candidates += operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        elif isinstance(node, ast.Dict):
            candidates += [value for key, value in zip(node.keys, node.values)
                           if isinstance(key, ast.Constant) and key.value == "status"]
        elif isinstance(node, ast.keyword) and node.arg == "status":
            candidates.append(node.value)
    relative = str(path.relative_to(ROOT))
    return [(relative, node.lineno, node.value) for node in candidates
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_the_verdict_finder_counts_comparisons_not_keys(tmp_path):
    module = ROOT / "tests" / "data" / "concept-probe.py"
    try:
        module.write_text('a = r["status"] == "ok"\nb = {"ok": 1, "status": "failed"}\nc = s in ("invalid",)\n'
                          'd = x["disturbed"]\n')
        found = compared_spellings(module, {"ok", "failed", "invalid", "disturbed"})
        assert [line for _, line, _ in found] == [1, 2, 3]
    finally:
        module.unlink(missing_ok=True)


# (file relative to the clone, name): why it is spelled there.
STATUS_SPELLINGS_ALLOWED: dict[tuple[str, str], str] = {}


def test_a_run_status_is_spelled_only_in_status_py():
    """A run's verdict (Status) and a check's outcome (Check) share words ("ok" is both), so both enums'
    values are checked, where code judges with them (compared_spellings): a reader compares with Status.OK,
    never "ok", so a status renamed or added is one line of status.py."""
    from containerbench.status import Check, Status

    check("a run status or check outcome", {"status.py"}, {*Status, *Check}, STATUS_SPELLINGS_ALLOWED,
          finder=compared_spellings)


# (file relative to the clone, name): why it is spelled there. "none" is a common word: each file below
# uses it as something else, and none of them names the launcher with it.
LAUNCHER_SPELLINGS_ALLOWED: dict[tuple[str, str], str] = {
    ("src/containerbench/rank/bench.py", "srun"): "detect_launcher: the program that started the rank, ranks' side",
    ("src/containerbench/rank/bench.py", "mpirun"): "detect_launcher: the program that started the rank, ranks' side",
    ("src/containerbench/rank/bench.py", "none"): "detect_launcher: no launcher's variables, ranks' side",
    ("src/containerbench/config.py", "none"): "check_runs refuses ranks > 1 under launcher none when the config "
                                              "loads; config sits below launchers (tests/test_layers.py)",
    ("src/containerbench/cli/image.py", "none"): "a build's --network none",
    ("src/containerbench/imagebuild.py", "none"): "a build's and a run's --network none",
    ("src/containerbench/fleetreport.py", "none"): "matplotlib's facecolors none",
    ("src/containerbench/runtimes/oci.py", "none"): "docker/podman run --log-driver none",
    ("src/containerbench/runtimes/shifter.py", "none"): "shifter --module none (no modules)",
    ("src/containerbench/slurm.py", "none"): "sinfo's reason none, and a message's empty list",
    ("src/containerbench/rank/torchbench.py", "none"): "the record's backend none (local mode), ranks' side",
    ("src/containerbench/validate.py", "none"): "a message's empty list",
    ("src/containerbench/wheelhouse.py", "none"): "pip download --abi none",
}


def test_a_launcher_kind_is_spelled_only_in_launchers_py():
    """launcher.kind's values are the launcher classes' `kind`; code elsewhere asks the class (Srun.kind,
    launchers.uses_slurm, Launcher.slurm_step). The program a run's argv starts with is the class's `program`
    (Srun.program), its own constant though it is the same word: a kind is what the config says, a program
    what execution finds in argv[0]."""
    from containerbench.launchers import LAUNCHERS

    check("a launcher kind", {"launchers.py"}, LAUNCHERS, LAUNCHER_SPELLINGS_ALLOWED)


def test_adding_a_runtime_is_one_module_plus_its_tests(tmp_path, monkeypatch):
    """A runtime defined here, in no module of the package, is planned like any other: its class registered
    with @register (and taken out again after the test), and the two schema lines docs/developing.md's
    "Adding a runtime" asks for (its name in the `runtimes` enum, an `images.<name>` entry), made here on a
    copy of the schema that config.load_schema returns instead of the package's file. runtime_for builds
    it from images.toy, and plans.plan_run puts its rank argv behind the configured launcher."""
    import copy

    from containerbench import config as cb_config
    from containerbench import plans
    from containerbench.runtimes import CONTAINER_RUNTIMES, ContainerRuntime, register, runtime_for

    schema = cb_config.load_schema("config")
    schema["properties"]["runtimes"]["items"]["enum"].append("toy")
    schema["properties"]["images"]["properties"]["toy"] = {"$ref": "#/$defs/runtime_image"}
    package_schema = cb_config.load_schema
    monkeypatch.setattr(cb_config, "load_schema",
                        lambda name="config": copy.deepcopy(schema) if name == "config" else package_schema(name))
    try:
        @register
        class Toy(ContainerRuntime):
            """A runtime that runs the image with `toy run`, the work directory bound."""

            name = "toy"

            def rank_argv(self, request):
                return ["toy", "run", "--bind", self.workdir(request), self.image, *self.command(request)]

        site = tmp_path / "toy.yaml"
        site.write_text("runtimes: [toy]\nimages: {toy: {image: /srv/images/toy.img}}\n")
        config = cb_config.load([ROOT / "config" / "config.yaml", site])
        runtime = runtime_for("toy", config)
        assert isinstance(runtime, Toy) and runtime.image == "/srv/images/toy.img"
        run = cb_config.plan_runs(config)[0]
        planned = plans.plan_run(run, config)
        start = planned.argv.index("toy")
        assert planned.argv[start:start + 8] == ["toy", "run", "--bind", str(Path.cwd()), "/srv/images/toy.img",
                                                 "python3", "-m", "containerbench.rank.bench"]
        assert planned.env["CONTAINERBENCH_RUNTIME"] == "toy"
    finally:
        CONTAINER_RUNTIMES.pop("toy", None)
    assert "toy" not in CONTAINER_RUNTIMES
