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
        pattern = re.compile(r"""(["'])(%s)\1""" % "|".join(map(re.escape, sorted(names, key=len, reverse=True))))
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


# (file relative to the clone, name): why it is spelled there.
FRAMEWORK_SPELLINGS_ALLOWED: dict[tuple[str, str], str] = {}


def test_a_framework_is_spelled_only_in_frameworks_py():
    check("a framework name", {"frameworks.py"}, FRAMEWORKS, FRAMEWORK_SPELLINGS_ALLOWED)


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_each_framework_is_in_the_config_schemas_enum(name):
    import yaml

    schema = yaml.safe_load((PACKAGE / "schemas" / "config.schema.yaml").read_text())
    assert name in schema["properties"]["benchmark"]["properties"]["frameworks"]["items"]["enum"]
