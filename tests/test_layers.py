"""The package's architecture, checked: no import cycle, each module above the ones it uses,
log markers defined once, no test-only helpers in src/."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from helpers import ROOT

PACKAGE = ROOT / "src" / "containerbench"


def module_name(path) -> str:
    """A source file's module, relative to the package: "config", "runtimes" (its __init__), "runtimes.oci"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(name for name in map(module_name, PACKAGE.rglob("*.py")) if name)

# Each layer may use the layers before it, never one after it or its own (so no cycle can form).
# The benchmark side (bench, netbench and what they use) is what the provenance hash covers.
LAYERS = [
    ("the words records judge with, the frameworks' registry, the rank side's package (a docstring), its test faults, "
     "its step clocks", {"status", "frameworks", "rank", "rank.faults", "rank.stepclocks"}),
    ("model definitions", {"rank.torchmodels"}),
    ("the sweep point", {"point"}),
    ("the layers that pick a network, one class each (fabrics' parts)", {"fabriclayers"}),
    ("leaves", {"rank.markers", "outputs", "processes", "rank.provenance", "rank.datasets",
                "rank.distribution", "fabrics", "config", "rank.telemetry", "intervals"}),
    ("Slurm, runs set aside to be measured again, the host MPI on a node, a node's hardware tier, TensorFlow's "
     "parameter servers (modes built on distribution's)",
     {"slurm", "attempts", "hostmpi", "hardware", "rank.parameterservers"}),
    ("launchers (a runtime asks them what its launcher does)", {"launchers"}),
    ("the shim a container's rank starts through (docker's runtime reads the labels it gives)", {"rank.rankexec"}),
    ("benchmark, runtimes, recipes, telemetry read back, PyTorch's input, an image step's runner",
     {"rank.bench", "rank.netbench", "runtimes", "singularity", "usage", "rank.torchdata", "imagestep"}),
    ("the PyTorch harness (bench's record), which image each runtime runs, wheelhouses, records, the pre-flight job, "
     "the image on each node, what an image is built from",
     {"rank.torchbench", "images", "wheelhouse", "records", "preflight", "nodeimages", "buildinputs"}),
    ("the runs table and its summary", {"runtables"}),
    ("tables that compare runs, loss trajectories, the two levels of a point's spread",
     {"comparisons", "losses", "precision"}),
    ("plans, tables, image builds", {"plans", "results", "imagebuild"}),
    ("runs executed, their cost, report, validation, repetition rounds, the base image",
     {"execution", "cost", "report", "validate", "repetitions", "baseimage"}),
    ("the plan of a batch of nodes to validate", {"fleetplan"}),
    ("a batch's figures against the fleet", {"fleetstats"}),
    ("the second pass for links", {"fleetsecond"}),
    ("fleet verdicts, the results history, the formats a site's tools read", {"fleet", "history", "export"}),
    ("the fleet's node and link jobs, its verdict in the formats a site's tools read and on its page",
     {"fleetjobs", "fleetexport", "fleetreport"}),
    ("the allocations a batch's jobs run in, round by round", {"fleetrounds"}),
    ("command groups", {"cli.sweep", "cli.results", "cli.history", "cli.image"}),
    ("the fleet's commands (they name the records' system as results' do)", {"cli.fleet"}),
    ("command line", {"cli"}),
    ("python -m containerbench", {"__main__"}),
]
# A subpackage sits in its package's layer; inside, its modules have layers of their own, in the same
# rule: what a runtime takes from the node, the base classes, the runtimes built on them, those built on a
# runtime, the registry.
SUBPACKAGE_LAYERS = {
    "runtimes": [{"runtimes.node"}, {"runtimes.base"},
                 {"runtimes.bare_metal", "runtimes.oci", "runtimes.apptainer", "runtimes.shifter",
                  "runtimes.charliecloud", "runtimes.enroot", "runtimes.sarus"},
                 {"runtimes.podman_hpc"},
                 {"runtimes"}],
}
# Imported by the ranks, in the benchmark venv (TensorFlow, mpi4py): the rank/ subpackage, whole. The rest runs
# in the workflow venv (rank/rankexec.py, the shim, under the host's interpreter too).
BENCHMARK_SIDE = {module for module in MODULES if module.split(".")[0] == "rank"}


def source(module: str):
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_module(dotted: str) -> str:
    """The module of the package that `import containerbench.<dotted>` loads, less the prefix."""
    name = dotted.removeprefix("containerbench.")
    assert name in MODULES, f"containerbench.{name} is not a module of the package"
    return name


def package_imports(module: str) -> set[str]:
    """Every containerbench module `module` imports, at top level or inside a function."""
    tree = ast.parse(source(module).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {imported_module(alias.name) for alias in node.names if alias.name.startswith("containerbench.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "containerbench":
            package = node.module.removeprefix("containerbench").removeprefix(".")
            # from containerbench import config, launch; from containerbench.runtimes import oci
            submodules = {".".join(filter(None, (package, alias.name))) for alias in node.names}
            found |= submodules & set(MODULES)
            if package:
                found.add(imported_module(node.module))
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


def layers() -> dict[str, tuple[int, int]]:
    """module -> (its layer, its layer inside its subpackage: 0 outside one)."""
    layer_of = {module: (index, 0) for index, (_, modules) in enumerate(LAYERS) for module in modules}
    for package, inner in SUBPACKAGE_LAYERS.items():
        outer = layer_of.pop(package)[0]
        layer_of |= {module: (outer, index) for index, modules in enumerate(inner) for module in modules}
    return layer_of


def test_every_module_sits_above_the_modules_it_imports():
    layer_of = layers()
    assert set(layer_of) == set(MODULES), "a new module needs a place in LAYERS (or SUBPACKAGE_LAYERS)"
    for module in MODULES:
        for used in package_imports(module):
            (outer, inner), (used_outer, used_inner) = layer_of[module], layer_of[used]
            # Inside one layer only a subpackage's modules use each other, each only the ones below it.
            package = module.split(".")[0]
            same_package = package in SUBPACKAGE_LAYERS and used.split(".")[0] == package
            below = used_outer < outer or (used_outer == outer and same_package and used_inner < inner)
            assert below, f"{module} ({LAYERS[outer][0]}) imports {used} ({LAYERS[used_outer][0]})"


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
TORCH_SIDE = BENCHMARK_SIDE  # bench.py imports TensorFlow only when it trains


@pytest.mark.parametrize("module", sorted(TORCH_SIDE))
def test_each_pytorch_side_module_imports_alone_in_the_pytorch_venv(module, torch_python):
    imports_alone(torch_python, module)


def test_log_markers_are_spelled_only_in_markers_py():
    for path in PACKAGE.rglob("*.py"):
        if path.name != "markers.py":
            text = path.read_text()
            for marker in ("containerbench-launch ", "containerbench-exit ", "containerbench-result ",
                           "containerbench-failure ", "containerbench-netbench "):
                assert f'"{marker}' not in text, f"{path.name} spells {marker!r}: use containerbench.rank.markers"


def test_the_provenance_hash_covers_every_module_the_benchmark_runs():
    from containerbench.plans import benchmark_modules
    from containerbench.rank.provenance import BENCH_SOURCES

    ran, pending = set(), [module.removeprefix("containerbench.") for module in benchmark_modules()]
    while pending:
        module = pending.pop()
        if module not in ran:
            ran.add(module)
            pending += package_imports(module)
    # rank/__init__.py is a docstring; every other module a rank runs is a source the hash covers.
    assert {f"{module.removeprefix('rank.')}.py" for module in ran - {"rank"}} == set(BENCH_SOURCES)


def test_the_rank_side_imports_nothing_of_the_workflows_side():
    """rank/ runs under the benchmark's interpreter, which holds the framework and not the workflow's
    dependencies: a rank-side module that imported config, runtimes or pandas would fail on the node."""
    for module in sorted(BENCHMARK_SIDE):
        outside = sorted(used for used in package_imports(module) if used not in BENCHMARK_SIDE)
        assert not outside, f"{module} (rank side) imports {outside}"


def test_a_fleet_jobs_driver_imports_no_validator(tmp_path):
    """config.LAZY_IMPORTS: jsonschema is imported by the functions that validate; the driver validates
    nothing, and would carry it, 6.5 MB more RSS, in each of a round's thousand processes (one a job, on the
    login node, while the job's runs last). The driver itself is run, as fleetrounds._run_at_once starts it, on
    a job of no runs, and Python's -X importtime names every module it imported, those run_job imports in its
    body included: no list kept by hand to fall behind the code. What only a run's own path would import
    (execution.measure's body) is not reached here; none of it imports a validator today."""
    from containerbench.config import LAZY_IMPORTS

    job = tmp_path / "job.json"
    job.write_text('{"allocation": [], "plans": [], "logs": []}\n')
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "containerbench", "fleet", "run", str(job),
                           "--in-allocation"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"containerbench.fleetjobs", "containerbench.execution", "containerbench.records"} <= imported
    assert sorted(module for module in imported if module.split(".")[0] in LAZY_IMPORTS) == []
