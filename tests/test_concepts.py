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


def spellings_outside(homes: set[str], names) -> list[tuple[str, int, str]]:
    files = [path for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE)) not in homes]
    return [hit for path in [*files, *RULES] for hit in literal_spellings(path, set(names))]


def check(concept: str, homes: set[str], names, allowed: dict[tuple[str, str], str]) -> None:
    hits = spellings_outside(homes, names)
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
    ("src/containerbench/bench.py", "tensorflow"): f"TensorFlow's harness names itself in its result: {RANK_SIDE}",
    ("src/containerbench/torchbench.py", "pytorch"): f"PyTorch's harness names itself in its result: {RANK_SIDE}",
    ("src/containerbench/provenance.py", "tensorflow"): "a distribution's name in ROOT_DISTRIBUTIONS, the "
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
    from containerbench.provenance import ROOT_DISTRIBUTIONS

    for registered in FRAMEWORKS.values():
        assert set(registered.provenance_roots) <= set(ROOT_DISTRIBUTIONS), registered.name


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_harness_names_its_framework_in_its_result(name):
    # The name the rank side spells (FRAMEWORK_SPELLINGS_ALLOWED) is the registry's, in the registry's harness.
    harness = PACKAGE / (FRAMEWORKS[name].harness.removeprefix("containerbench.") + ".py")
    assert literal_spellings(harness, {name}), f"{harness.name} does not name {name!r} in its result"
