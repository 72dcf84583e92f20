"""The package's architecture, checked: no import cycle, each module above the ones it uses,
log markers defined once, no test-only helpers in src/."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from helpers import ROOT

PACKAGE = ROOT / "src" / "containerbench"
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")

# Each layer may use the layers before it, never one after it or its own (so no cycle can form).
# The benchmark side (bench, netbench and what they use) is what the provenance hash covers.
LAYERS = [
    ("model definitions", {"torchmodels"}),
    ("the sweep point", {"point"}),
    ("leaves", {"markers", "processes", "provenance", "datasets", "distribution", "fabrics", "config", "telemetry",
                "intervals"}),
    ("benchmark, runtimes, Slurm, recipes, telemetry read back, PyTorch's input",
     {"bench", "netbench", "rankexec", "runtimes", "slurm", "singularity", "usage", "torchdata"}),
    ("the PyTorch harness (bench's record), images, records, the pre-flight job",
     {"torchbench", "images", "records", "preflight"}),
    ("the runs table and its summary", {"runtables"}),
    ("tables that compare runs, loss trajectories", {"comparisons", "losses"}),
    ("plans and launches, tables", {"launch", "results"}),
    ("report, validation, repetition rounds", {"report", "validate", "repetitions"}),
    ("fleet verdicts, the results history", {"fleet", "history"}),
    ("command line", {"cli"}),
    ("python -m containerbench", {"__main__"}),
]
# Imported by the ranks, in the benchmark venv (TensorFlow, mpi4py); the rest runs in the workflow venv.
BENCHMARK_SIDE = {"bench", "netbench", "distribution", "datasets", "provenance", "markers", "telemetry", "torchbench",
                  "torchmodels", "torchdata"}


def package_imports(module: str) -> set[str]:
    """Every containerbench module `module` imports, at top level or inside a function."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("containerbench.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "containerbench":
            if node.module == "containerbench":  # from containerbench import config, launch
                found |= {alias.name for alias in node.names if alias.name in MODULES}
            else:
                found.add(node.module.split(".")[1])
    return found - {module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = "open", path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                return path[path.index(successor):] + [successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        state[node], _ = "done", path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"config": {"images"}, "images": {"launch"}, "launch": {"config"}}) == [
        "config", "images", "launch", "config"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = {module: package_imports(module) for module in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_every_module_sits_above_the_modules_it_imports():
    layer_of = {module: index for index, (_, modules) in enumerate(LAYERS) for module in modules}
    assert set(layer_of) == set(MODULES), "a new module needs a place in LAYERS"
    for module in MODULES:
        for used in package_imports(module):
            assert layer_of[used] < layer_of[module], (
                f"{module} ({LAYERS[layer_of[module]][0]}) imports {used} ({LAYERS[layer_of[used]][0]})")


def imports_alone(python, module: str) -> None:
    done = subprocess.run([str(python), "-c", f"import containerbench.{module}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("module", sorted(set(MODULES) - BENCHMARK_SIDE - {"__main__"}))
def test_each_workflow_module_imports_alone_in_a_fresh_interpreter(module):
    imports_alone(sys.executable, module)


@pytest.mark.parametrize("module", sorted(BENCHMARK_SIDE))
def test_each_benchmark_module_imports_alone_in_the_benchmark_venv(module, bench_python):
    imports_alone(bench_python, module)


# What a PyTorch rank imports: its harness and what they share with the TensorFlow side, never TensorFlow.
TORCH_SIDE = {"torchbench", "torchmodels", "torchdata", "datasets", "bench", "netbench", "distribution", "provenance",
              "markers", "telemetry"}


@pytest.mark.parametrize("module", sorted(TORCH_SIDE))
def test_each_pytorch_side_module_imports_alone_in_the_pytorch_venv(module, torch_python):
    imports_alone(torch_python, module)


def test_log_markers_are_spelled_only_in_markers_py():
    for path in PACKAGE.glob("*.py"):
        if path.name != "markers.py":
            text = path.read_text()
            for marker in ("containerbench-launch ", "containerbench-exit ", "containerbench-result ",
                           "containerbench-failure ", "containerbench-netbench "):
                assert f'"{marker}' not in text, f"{path.name} spells {marker!r}: use containerbench.markers"


def test_the_provenance_hash_covers_every_module_the_benchmark_runs():
    from containerbench.provenance import BENCH_SOURCES

    ran, pending = set(), ["bench", "torchbench", "netbench"]  # the modules ranks run (launch.BENCHMARKS)
    while pending:
        module = pending.pop()
        if module not in ran:
            ran.add(module)
            pending += package_imports(module)
    assert {f"{module}.py" for module in ran} == set(BENCH_SOURCES)
