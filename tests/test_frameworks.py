"""A third framework is a harness module, one registry entry, a schema enum and a Dockerfile flavour
(docs/developing.md, "Adding a framework"): a toy one, registered here and nowhere else, is planned
through the whole planning path (config -> plan_runs -> plans.plan_run) with its harness, its modes, its
bare-metal interpreter, its image and its arguments, and the pre-flight check asks for its interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, tiny_config

from containerbench import config as cb_config
from containerbench import preflight
from containerbench.config import BenchEnv, ImageUse
from containerbench.frameworks import FRAMEWORKS, Framework
from containerbench.plans import plan_sweep
from containerbench.point import Point

# A harness prints the result line (bench.run_and_report); the toy one only says what it was given.
TOY_HARNESS = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"

TOY = Framework(
    name="toy", label="Toy", short_label="Toy", harness="toybench", modes=("allreduce", "local"),
    default_mode="allreduce", planned_settings=("model", "image_size", "steps"), bare_metal_key="toy_python",
    env="toy", image_key_prefix="toy_", venv_side="bench-toy", import_check="import toybench",
    preflight_option="--toy-python", provenance_roots=("toy",), reported_versions=(("Toy", "toy"),),
    select_modes=lambda asked: ["allreduce", *(["local"] if "local" in asked else [])],
    setting_args=lambda bench: ["--toy-steps", str(bench["steps"])],
)
# Its Dockerfile flavour: the lock its venv and its image install, its tag and files ending in -toy.
TOY_ENV = BenchEnv("toy", "envs/bench-toy.txt", "envs/bench-toy.lock.txt", "build/wheelhouse-toy", "",
                   ".venv-bench-toy", framework=TOY.name, suffix="-toy", horovod=False)


def with_the_toy(schema: dict) -> dict:
    """The config schema as a third framework's entry extends it: its name in benchmark.frameworks, its
    bare-metal interpreter, its image keys under each runtime's images."""
    schema["properties"]["benchmark"]["properties"]["frameworks"]["items"]["enum"].append(TOY.name)
    schema["properties"]["bare_metal"]["properties"][TOY.bare_metal_key] = {"type": "string", "minLength": 1}
    schema["$defs"]["runtime_image"]["properties"] |= {TOY.image_key(model): {"type": "string", "minLength": 1}
                                                       for model in ("hybrid", "native")}
    return schema


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy framework registered, its harness module in tmp_path (importable from there), its image
    flavour, the schema extended."""
    (tmp_path / "toybench.py").write_text(TOY_HARNESS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setitem(FRAMEWORKS, TOY.name, TOY)
    monkeypatch.setitem(cb_config.BENCH_ENVS, TOY_ENV.name, TOY_ENV)
    load_schema = cb_config.load_schema
    monkeypatch.setattr(cb_config, "load_schema", lambda name="config": with_the_toy(load_schema(name))
                        if name == "config" else load_schema(name))
    return TOY


def test_a_framework_registered_in_one_place_is_planned_through_the_whole_path(toy, tmp_path):
    config = tiny_config(tmp_path, runtimes=["bare-metal", "podman"],
                         benchmark={"frameworks": ["tensorflow", "toy"], "modes": ["horovod", "local"]},
                         bare_metal={"toy_python": sys.executable})
    sweep = plan_sweep(config, ROOT, probe=False)
    mine = [run for run in sweep.runs if run.framework == "toy"]
    assert {(run.kind, run.mode) for run in mine} == {("train", "allreduce"), ("train", "local"),
                                                      ("netbench", "allreduce")}
    train = next(run for run in mine if run.kind == "train" and run.runtime == "bare-metal" and run.mode == "allreduce")
    # Its name in the run id, its default mode left out, and the id parses back to its point.
    assert train.run_id == "train_bare-metal_tcp-loopback_1x1_b2_toy_rep1"
    assert Point.parse_run_id(train.run_id) == (train.point, 1)
    bare = sweep.plans[train.run_id]
    assert bare.argv[bare.argv.index(sys.executable):][:3] == [sys.executable, "-m", "toybench"]
    toy_args = bare.benchmark_args[:bare.benchmark_args.index("--telemetry-dir")]  # telemetry's come last
    assert toy_args[-2:] == ("--toy-steps", "2") and toy_args[toy_args.index("--mode") + 1] == "allreduce"
    assert {key: bare.spec[key] for key in ("framework", "mode", "model", "image_size", "steps")} == {
        "framework": "toy", "mode": "allreduce", "model": "resnet50", "image_size": 32, "steps": 2}
    assert "xla" not in bare.spec and "torch_compile" not in bare.spec  # only its planned settings
    # In a container: its own image key, filled in with its flavour of the image the workflow builds.
    podman = sweep.plans[train.run_id.replace("bare-metal", "podman")]
    assert podman.image == sweep.config["images"]["podman"]["toy_image"] and podman.image.endswith("-toy")
    assert sweep.artifacts[ImageUse("podman", "hybrid", "toy")].endswith("-toy.json")
    # The harness module the plan names runs, and is given the plan's arguments.
    ran = subprocess.run([sys.executable, "-m", toy.harness, *bare.benchmark_args], capture_output=True, text=True,
                         check=True, timeout=60)
    assert json.loads(ran.stdout) == list(bare.benchmark_args)


def test_the_preflight_check_asks_for_its_interpreter_and_imports_its_harness(toy, tmp_path):
    config = tiny_config(tmp_path, benchmark={"frameworks": ["toy"]})
    argv = preflight.check_argv(config, ROOT, sys.executable, {"toy": sys.executable}, {})
    assert argv[argv.index("--toy-python") + 1] == sys.executable and "--bench-python" not in argv
    assert preflight.check_bench_python(sys.executable, framework_name="toy") is None  # toybench imports
    missing = str(tmp_path / "no-venv" / "bin" / "python")
    assert preflight.check_bench_python(missing, framework_name="toy") == (
        f"'bare_metal.toy_python' = {missing!r} does not exist on this node; allowed: a venv on a shared "
        "filesystem (scripts/setup-venv.sh bench-toy) or an interpreter every node has")
