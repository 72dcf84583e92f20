"""The commands README.md and docs/ give, read by the programs that will read them.

A step of the docs that a program reads otherwise than the reader does is a defect found only by a
site admin: `snakemake --configfile a.yaml validate_nodes` takes the target for a second config file
(--configfile takes several), and stops in a traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

import pytest
from helpers import ROOT, clone_copy
from snakemake.cli import get_argument_parser

from containerbench import cli

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


# --- every command of the docs, run as written ------------------------------------------------------

# A command is a line of a fenced block whose program (after VAR=value words) is make, cp, or a program of
# the clone (.venv/bin/..., scripts/...); a layout listing ("Snakefile  entry point") names no program.
ASSIGNMENT = re.compile(r"[A-Z][A-Z0-9_]*=\S+")


def doc_commands() -> list[tuple[str, str]]:
    """(file, command) for every command of README.md and docs/*.md, its comment cut, spaces collapsed."""
    found = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+", " ", re.split(r"\s#\s", line)[0]).strip()
                words = [word for word in command.split() if not ASSIGNMENT.fullmatch(word)]
                program = ROOT / words[0] if words else None
                if words and (words[0] in ("make", "cp") or (program.is_file() and os.access(program, os.X_OK))):
                    found.append((doc.name, command))
    return found


GPU_ENV_FIRST = ("containerbench: config: 'benchmark_env' = 'gpu' builds its image with the Horovod wheel that "
                 "`make gpu-env` puts in build/wheelhouse-gpu (NCCL operations, compiled by CUDA 11.8's nvcc), and "
                 "there is none; allowed: run `make gpu-env` first, or benchmark_env: cpu")
SITE_SWEEP = ".venv/bin/snakemake --profile profiles/slurm --configfile config/site.yaml"
RUN_ID = "train_bare-metal_tcp-loopback_1x1_b8_rep1"  # the embedded default's first run

# How the test runs each command, in a copy of the clone whose state is the docs' steps before it (a
# site.yaml copied from the example, the recorded runs' records in results/runs, references made from
# them, a results store with two sweeps and two fleet batches):
#   real     as written (a pipe into less included: less copies a pipe through);
#   dry      as written plus --dry-run (snakemake: nothing is submitted or measured);
#   make -n  as written with -n: make prints the recipes (test_make_n_test_prints_the_suite_and_runs_nothing);
#   refused  as written (a snakemake one with --dry-run: nothing is submitted whatever the state); the state
#            of this machine makes it stop in the one line given (no GPU wheel, no Apptainer image, no Slurm
#            controller), which is what a site sees at that step;
#   parse    the words through containerbench's own parser (placeholders filled): the command needs a
#            batch's records or a site's nodes, and the test named in the reason runs it for real.
HOW = {
    "make run": ("make -n", "snakemake --profile profiles/local"),
    "make test": ("make -n", "scripts/test-suite.sh"),
    "make setup": ("make -n", None),
    "make gpu-env": ("make -n", None),
    "make test-fast": ("make -n", "pytest -m"),
    "make lint": ("make -n", "ruff check"),
    ".venv/bin/snakemake --profile profiles/local --forcerun results/runs/<run_id>.log": ("dry", None),
    "cp config/site.example.yaml config/site.yaml": ("real", None),
    ".venv/bin/containerbench plan --config config/site.yaml | less":
        ("real", "train_bare-metal_infiniband_1x4_b64_rep1"),
    ".venv/bin/containerbench plan --estimate --config config/site.yaml": ("real", "What this sweep costs:"),
    ".venv/bin/containerbench plan --config config/site.yaml --estimate": ("real", "What this sweep costs:"),
    ".venv/bin/containerbench plan --every-runtime --config config/site.yaml": ("real", "sarus"),
    f"{SITE_SWEEP} --dry-run": ("refused", GPU_ENV_FIRST),
    SITE_SWEEP: ("refused", GPU_ENV_FIRST),
    ".venv/bin/snakemake validate --profile profiles/slurm --configfile config/site.yaml": ("refused", GPU_ENV_FIRST),
    ".venv/bin/snakemake calibrate --profile profiles/slurm --configfile config/site.yaml": ("refused", GPU_ENV_FIRST),
    ".venv/bin/snakemake validate_nodes --profile profiles/slurm --configfile config/site.yaml":
        ("refused", GPU_ENV_FIRST),
    ".venv/bin/snakemake --profile profiles/local baseline": ("dry", None),
    "cp results/references.yaml config/references.yaml": ("real", None),
    ".venv/bin/containerbench validate results/runs/*.json --references config/references.yaml":
        ("real", "VERDICT: PASS"),
    ".venv/bin/containerbench export results/runs/*.json --out-dir results/export --references "
    "config/references.yaml": ("real", "exported 3 run records"),
    ".venv/bin/containerbench plan --config config/config.yaml": ("real", RUN_ID),
    ".venv/bin/containerbench plan --config config/site.example.yaml --run-id "
    "train_bare-metal_infiniband_2x4_b64_rep1": ("real", "argv: srun --mpi=pmix --nodes=2"),
    ".venv/bin/containerbench plan --config config/site.example.yaml | less": ("real", "train_enroot_"),
    # The example names no Apptainer image of the site's own, which is what freeze-image reads.
    ".venv/bin/containerbench freeze-image --config config/site.yaml --runtime apptainer --out envs/vendor.lock.txt":
        ("refused", "freeze-image: runtime 'apptainer' needs an image reference: set images.apptainer.image in the "
                    "config"),
    "BENCH_LOCK=envs/vendor.lock.txt scripts/setup-venv.sh bench /sw/containerbench/venv-vendor":
        ("refused", "setup-venv: BENCH_LOCK=envs/vendor.lock.txt is not a file; allowed: a lock that containerbench "
                    "freeze-image wrote"),
    ".venv/bin/python -m pytest tests/test_config.py -q": ("real", " passed"),
    # The recorded runs are one repetition each: the script says so (test_benchmarks runs it on two).
    ".venv/bin/python benchmarks/precision_per_minute.py results/runs/*.json --target 5":
        ("real", "records: 3; training points with 2+ ok runs: 0; target +-5%"),
    ".venv/bin/containerbench store --store history.sqlite --tag acceptance-1 --config config/site.yaml "
    "results/runs/*.json": ("real", "3 record(s) stored"),
    ".venv/bin/containerbench history --store history.sqlite": ("real", "acceptance-0"),
    ".venv/bin/containerbench compare --store history.sqlite previous latest --csv results/compare.csv":
        ("real", "A = previous"),
    ".venv/bin/containerbench compare --store history.sqlite --kind sweep previous latest": ("real", "A = previous"),
    ".venv/bin/containerbench compare --store history.sqlite --kind fleet previous latest":
        ("real", "A = previous: session(s) 3"),
    # No Slurm answers here (no scontrol, no slurm.conf, or no controller): it gets as far as asking Slurm.
    ".venv/bin/containerbench fleet plan --nodes 'n[001-064]' --write results/fleet/plan.json":
        ("refused", re.compile(r"containerbench: fleet: 'validation.nodes' = 'n\[001-064\]'(: (scontrol|sinfo) "
                               r"\S+ \S+ failed: .+| needs Slurm's scontrol, which is not installed here)")),
    # A batch's records and plan: test_fleet.py's command-line test judges real ones this way
    # (test_the_command_line_judges_the_records_writes_the_tables_and_only_prints_the_drain_list).
    ".venv/bin/containerbench fleet judge --plan results/fleet/plan.json --out-dir results/fleet [--references "
    "config/references.yaml --system gpu-a100] results/fleet/runs/*.json "
    "[--recheck results/fleet/recheck/*_rep*.json] [--hardware results/fleet/hardware/*.json]": ("parse", None),
    # This machine's hardware tier: no GPU or HCA here, each such check skipped with its reason.
    ".venv/bin/containerbench fleet hwcheck --out results/fleet/hardware": ("real", "report: results/fleet/hardware/"),
    # RECORDS: a batch's records from known-good nodes; test_fleet.py makes references this way
    # (test_a_batch_slower_as_a_whole_passes_the_fleet_test_and_fails_the_reference_from_good_nodes).
    ".venv/bin/containerbench baseline --good-nodes 'n[001-008]' --system gpu-a100 --out config/references.yaml "
    "RECORDS": ("parse", None),
}
PLACEHOLDERS = {"<run_id>": RUN_ID, "RECORDS": "results/runs/*.json", "[": "", "]": ""}
DOC_COMMANDS = doc_commands()


def test_every_command_of_the_docs_is_run_by_this_test():
    assert {command for _, command in DOC_COMMANDS} == set(HOW)


@pytest.fixture(scope="module")
def docs_clone(tmp_path_factory, recorded_runs):
    """A copy of this clone's files (committed or not, ignored ones left out) with the workflow venv, in the
    state the docs' earlier steps leave it."""
    import json

    from containerbench import history

    clone = clone_copy(tmp_path_factory.mktemp("docs") / "containerbench")
    (clone / "envs" / "vendor.lock.txt").unlink(missing_ok=True)  # containers.md's freeze-image output: not yet
    shutil.copy(clone / "config" / "site.example.yaml", clone / "config" / "site.yaml")
    runs = clone / "results" / "runs"
    runs.mkdir(parents=True)
    for record in recorded_runs.values():
        (runs / f"{record['run_id']}.json").write_text(json.dumps(record))
    assert cli.main(["baseline", *map(str, sorted(runs.glob("*.json"))), "--out",
                     str(clone / "results" / "references.yaml")]) == 0  # what `snakemake baseline` writes
    shutil.copy(clone / "results" / "references.yaml", clone / "config" / "references.yaml")
    store = clone / "history.sqlite"
    for index, kind in enumerate(("sweep", "sweep", "fleet", "fleet")):
        earlier = []
        for record in recorded_runs.values():
            copied = json.loads(json.dumps(record))
            copied["run_id"] = f"{record['run_id']}-earlier{index}"
            copied["log"]["sha256"] = f"{index:02d}{record['log']['sha256'][2:]}"
            if kind == "fleet":
                copied["spec"]["nodelist"] = ["n001"]
            earlier.append(copied)
        history.store(store, earlier, tag=f"acceptance-{index}" if index == 0 else None, kind=kind)
    return clone


@pytest.mark.parametrize("doc, command", DOC_COMMANDS, ids=[f"{doc}:{command[:60]}" for doc, command in DOC_COMMANDS])
def test_every_command_of_the_docs_runs_as_written(docs_clone, doc, command):
    import subprocess

    mode, expected = HOW[command]
    if mode == "parse":
        for placeholder, value in PLACEHOLDERS.items():
            command = command.replace(placeholder, value)
        words = shlex.split(command)
        assert cli.build_parser().parse_args(words[1:]).func  # .venv/bin/containerbench WORDS
        return
    written = command.replace("<run_id>", RUN_ID)
    if mode == "refused" and "/snakemake " in written and "--dry-run" not in written:
        written += " --dry-run"  # whatever the state, nothing is submitted
    if not shutil.which("less"):
        written = written.replace("| less", "| cat")  # less copies a pipe through, as cat does
    line = {"dry": f"{written} --dry-run", "make -n": written.replace("make ", "make -n --no-print-directory ", 1),
            "real": written, "refused": written}[mode]
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["bash", "-c", line], cwd=docs_clone, capture_output=True, text=True, timeout=600, env=env)
    said = done.stdout + done.stderr
    if mode == "refused":
        last = [text for text in done.stderr.splitlines() if text.strip()][-1]
        assert done.returncode != 0 and (expected.fullmatch(last) if isinstance(expected, re.Pattern)
                                         else last == expected), said[-3000:]
    else:
        assert done.returncode == 0, said[-3000:]
        assert expected is None or expected in said, said[-3000:]
