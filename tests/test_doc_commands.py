"""The commands README.md and docs/ give, read by the programs that will read them.

A step of the docs that a program reads otherwise than the reader does is a defect found only by a
site admin: `snakemake --configfile a.yaml validate_nodes` takes the target for a second config file
(--configfile takes several), and stops in a traceback.
"""

from __future__ import annotations

import re
import shlex

import pytest
from helpers import ROOT
from snakemake.cli import get_argument_parser

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def fenced_commands(program: str) -> list[tuple[str, str]]:
    """(file, line) for every line of a fenced block that runs `program` (.venv/bin/ or not), comments cut."""
    found = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():  # continued lines joined
                if re.match(rf"\s*(\S*/)?{re.escape(program)}(\s|$)", line):
                    found.append((doc.name, re.sub(r"\s+", " ", line.strip())))
    return found


SNAKEMAKE_COMMANDS = fenced_commands("snakemake")


def test_the_docs_give_snakemake_commands():
    assert len(SNAKEMAKE_COMMANDS) >= 10


@pytest.mark.parametrize("doc, line", SNAKEMAKE_COMMANDS, ids=[f"{doc}:{line}" for doc, line in SNAKEMAKE_COMMANDS])
def test_every_snakemake_command_of_the_docs_reads_its_targets_as_targets(doc, line):
    # Snakemake's own parser: every --configfile value a config file, every target a rule of the workflow.
    args = get_argument_parser().parse_args(shlex.split(line, comments=True)[1:])
    assert all(str(path).endswith((".yaml", ".yml", ".json")) for path in args.configfile or []), (doc, line)
    rules = set(re.findall(r"^\s*rule (\w+):", "\n".join(
        path.read_text() for path in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]),
        re.MULTILINE))
    assert set(args.targets) <= rules, (doc, line)


def test_make_n_test_prints_the_suite_and_runs_nothing(tmp_path):
    # GNU make runs a recipe line that spells $(MAKE) even under -n ("How the MAKE Variable Works",
    # the GNU make manual): `make -n test` ran the fast tests for real. It must only print.
    import os
    import subprocess

    alone = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "--no-print-directory", "-n", "test", f"VENV={tmp_path / 'no-venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=alone)  # as typed, not under `make test`
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [line for line in done.stdout.splitlines() if "scripts/test-suite.sh" in line]
    assert not (tmp_path / "no-venv").exists() and "passed" not in done.stdout
