"""The workflow configuration: the schema with one-line errors, and the sweep.

`load` merges YAML files, `validated` checks a config against the schema
(package data, schemas/config.schema.yaml) and fills in its defaults; the first
violation becomes one sentence naming the key, the bad value and what is
allowed. `plan_runs` expands the sweep (runtimes x fabrics x nodes x ranks per
node x batch sizes x modes x data, repeated) into RunSpecs, one per benchmark
process, each with a stable, readable run id. Nothing here probes the machine.
"""

from __future__ import annotations

import copy
import importlib
import itertools
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import yaml

from containerbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, PARAMETER_SERVER_MODES, PYTORCH
from containerbench.frameworks import framework as framework_named

# runtime_label is the point's; named here too for the modules that import it from here (images).
from containerbench.point import Point, default_mode, runtime_label  # noqa: F401

if TYPE_CHECKING:
    import jsonschema

# Imported by the functions that validate, not at the top of config, records and validate: a fleet job's driver
# (`fleet run JOB --in-allocation`, one process a job on the login node while its runs last) validates nothing,
# and its imports' peak RSS is 26.5 MB without jsonschema, 33.0 with it: 6.6 GB at once for a 1,024-node round.
LAZY_IMPORTS = ("jsonschema",)


class ConfigError(ValueError):
    """A configuration that cannot be run; the message is one line for the user."""


def load_schema(name: str = "config") -> dict:
    """A schema shipped with the package: `config`, `references` or `record`."""
    text = resources.files("containerbench").joinpath("schemas", f"{name}.schema.yaml").read_text()
    return yaml.safe_load(text)


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def _allowed(error: jsonschema.ValidationError) -> str:
    schema, validator = error.schema, error.validator
    if validator == "enum":
        return "one of " + ", ".join(map(str, schema["enum"]))
    if validator == "additionalProperties":
        known = sorted(schema.get("properties", {}))
        return "known keys: " + ", ".join(known) if known else "no other keys"
    if validator == "required":
        return "required keys: " + ", ".join(schema["required"])
    if validator in ("minimum", "maximum", "minItems", "minProperties", "type", "pattern", "uniqueItems"):
        return f"{validator} {error.validator_value}"
    if validator == "anyOf":  # e.g. benchmark.repetitions: "type integer minimum 1, or 'auto'"
        return ", or ".join(" ".join(repr(v) if k == "const" else f"{k} {v}" for k, v in alternative.items())
                            for alternative in error.validator_value)
    return f"{validator}: {error.validator_value}"


def describe(error: jsonschema.ValidationError) -> str:
    """One line: where, what was found, what is allowed."""
    where = _key_path(error)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        place = f"'{where}'" if error.absolute_path else "the top level"
        return f"unknown key {', '.join(repr(k) for k in extra)} in {place}; {_allowed(error)}"
    if error.validator == "required":
        return f"'{where}': {error.message}; {_allowed(error)}"
    if error.validator == "propertyNames":
        return f"'{where}': name {error.instance!r} is not allowed; names must match {error.validator_value}"
    return f"'{where}' = {error.instance!r} is not allowed; allowed: {_allowed(error)}"


def check(config: dict, schema: dict | None = None) -> None:
    """Raise ConfigError naming the first violation (the most specific one)."""
    import jsonschema  # here, not at the top: see LAZY_IMPORTS

    validator = jsonschema.Draft202012Validator(schema or load_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        raise ConfigError(f"config: {describe(error)}")


def _filling_defaults():
    """A validator (Draft 2020-12) that sets each absent property to its schema default before descending into it
    (the jsonschema FAQ's recipe, which Snakemake's validate uses too), so nested defaults fill in."""
    import jsonschema

    check_properties = jsonschema.Draft202012Validator.VALIDATORS["properties"]

    def properties(validator, schema_properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in schema_properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from check_properties(validator, schema_properties, instance, schema)

    return jsonschema.validators.extend(jsonschema.Draft202012Validator, {"properties": properties})


def validated(config: dict) -> dict:
    """Check `config` (ConfigError on the first violation), then fill in the schema's defaults in place."""
    schema = load_schema()
    if isinstance(config.get("telemetry"), bool):  # `telemetry: false` is short for enabled: false
        config["telemetry"] = {"enabled": config["telemetry"]}
    check(config, schema)
    for error in _filling_defaults()(schema).iter_errors(config):
        raise ConfigError(f"config: {describe(error)}")  # a default the schema itself got wrong
    check_repetitions(config["benchmark"])
    check_hardware_settings(config)
    return config


def check_hardware_settings(config: dict) -> None:
    """What the schema cannot say about `validation.hardware.gpus`: a node job's hardware step sees the GPUs
    its job asked for (srun --gres=gpu:slurm.gpus_per_node, Slurm's device cgroup), so it cannot count more."""
    settings, asked = config["validation"]["hardware"], config["slurm"]["gpus_per_node"]
    if settings["enabled"] and settings["gpus"] and settings["gpus"] > asked:
        raise ConfigError(f"config: 'validation.hardware.gpus' = {settings['gpus']} is more than "
                          f"'slurm.gpus_per_node' ({asked}), the GPUs the node jobs ask for and their hardware step "
                          "sees; allowed: at most slurm.gpus_per_node, or null (slurm.gpus_per_node)")


# `benchmark.repetitions: auto`: each train point runs min_repetitions, then one more repetition per
# round until the 95% interval of its mean is within target_ci_percent of it, or max_repetitions ran
# (containerbench.repetitions decides, workflow/rules/rounds.smk and benchmark.smk schedule the rounds).
AUTO = "auto"


def check_repetitions(bench: dict) -> None:
    """What the schema cannot say about `repetitions: auto`: it needs a target, and a maximum not below the minimum."""
    if bench["repetitions"] != AUTO:
        return
    if bench.get("target_ci_percent") is None:
        raise ConfigError("config: 'benchmark.target_ci_percent' is required with benchmark.repetitions auto; "
                          "allowed: a number above 0, the 95% interval's half-width in percent of the mean (e.g. 2)")
    if bench["max_repetitions"] < bench["min_repetitions"]:
        raise ConfigError(f"config: 'benchmark.max_repetitions' = {bench['max_repetitions']} is below "
                          f"'benchmark.min_repetitions' = {bench['min_repetitions']}; "
                          f"allowed: at least {bench['min_repetitions']}")


def repetition_bounds(bench: dict) -> tuple[int, int]:
    """The fewest and the most repetitions of a train point: N and N for `repetitions: N`."""
    if bench["repetitions"] == AUTO:
        return bench["min_repetitions"], bench["max_repetitions"]
    return bench["repetitions"], bench["repetitions"]


def merge(base: dict, overlay: dict) -> dict:
    """Nested dictionaries merged key by key, the overlay winning (as Snakemake merges --configfile)."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load(paths) -> dict:
    """YAML files merged in order, checked, with the schema's defaults filled in."""
    config: dict = {}
    for path in paths:
        try:
            config = merge(config, yaml.safe_load(Path(path).read_text()) or {})
        except OSError as error:
            raise ConfigError(f"config: cannot read {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config: {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    return validated(config)


@dataclass(frozen=True)
class RunSpec:
    """One benchmark process: what to run, where, and which repetition."""

    kind: str  # "train" or "netbench"
    runtime: str
    fabric: str
    nodes: int
    ranks_per_node: int
    repetition: int
    batch_size: int | None = None
    mode: str = "horovod"
    data: str = "synthetic"
    mpi_model: str = "hybrid"  # of a container runtime: its image's MPI, or the host's swapped in (native)
    nodelist: tuple[str, ...] = ()  # pinned to these nodes (fleet validation); empty: wherever Slurm places it
    framework: str = DEFAULT_FRAMEWORK  # of a train run: whose harness trains (frameworks.Framework.harness)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def point(self) -> Point:
        """The sweep point: what every repetition of this run has in common."""
        return Point(self.kind, self.runtime, self.fabric, self.nodes, self.ranks_per_node, self.batch_size,
                     self.framework, self.mode, self.data, self.mpi_model, self.nodelist)

    @property
    def point_id(self) -> str:
        return self.point.id

    @property
    def run_id(self) -> str:
        return self.point.run_id(self.repetition)

    def as_dict(self) -> dict:
        fields = asdict(self)
        # Only a pinned run names its nodes, only a run of another than the default framework its framework:
        # every other record and plan keeps the shape it had (earlier records stay at the same sweep point).
        nodelist = fields.pop("nodelist")
        if fields["framework"] == DEFAULT_FRAMEWORK:
            del fields["framework"]
        return {**fields, **({"nodelist": list(nodelist)} if nodelist else {}), "ranks": self.ranks,
                "run_id": self.run_id}


def framework_modes(framework_name: str, modes: list[str]) -> list[str]:
    """The modes `framework_name` trains in when benchmark.modes asks for `modes` (Framework.select_modes)."""
    return framework_named(framework_name).select_modes(modes)


def mpi_models(config: dict, runtime: str) -> tuple[str, ...]:
    """The MPI models `runtime` runs in (images.<runtime>.mpi_model: one, or a list for both side by side)."""
    model = ((config.get("images") or {}).get(runtime) or {}).get("mpi_model", "hybrid")
    return tuple(model) if isinstance(model, list) else (model,)


class ImageUse(NamedTuple):
    """Who runs a built image: a container runtime, in an MPI model, for a framework's ranks (each
    pair of MPI flavour and framework is an image of its own)."""

    runtime: str
    mpi_model: str = "hybrid"
    framework: str = DEFAULT_FRAMEWORK

    @classmethod
    def of(cls, run: RunSpec) -> ImageUse:
        return cls(run.runtime, run.mpi_model, run.framework)


def plan_runs(config: dict) -> list[RunSpec]:
    """Every run of the sweep, repetition-major, so repetitions interleave the points. With
    `repetitions: auto`, every run a point may need (up to max_repetitions): the workflow asks for
    the minimum and then what the rounds decide (first_runs)."""
    bench, scaling = config["benchmark"], config["scaling"]
    runs: list[RunSpec] = []
    runtime_models = [(runtime, model) for runtime in config["runtimes"] for model in mpi_models(config, runtime)]
    for repetition in range(1, repetition_bounds(bench)[1] + 1):
        for framework, (runtime, model), fabric, nodes, per_node, batch in itertools.product(
            bench["frameworks"], runtime_models, config["fabrics"], scaling["nodes"], scaling["ranks_per_node"],
            bench["batch_sizes"],
        ):
            for mode, data in itertools.product(framework_modes(framework, bench["modes"]), bench["data"]):
                if not mode_runs_at(bench, framework, mode, runtime, nodes * per_node):
                    continue
                runs.append(RunSpec("train", runtime, fabric, nodes, per_node, repetition, batch, mode, data, model,
                                    framework=framework))
    net = config["netbench"]
    if net["enabled"]:
        # At every node count of the sweep: two ranks on one node (the intra-node path),
        # else one rank per node, so that the network, not the node, is measured.
        # MPI's own, and with pytorch torch.distributed's collectives (Gloo, or NCCL on GPUs) beside it.
        for repetition in range(1, net["repetitions"] + 1):
            for framework, (runtime, model), fabric, nodes in itertools.product(
                    bench["frameworks"], runtime_models, config["fabrics"], scaling["nodes"]):
                runs.append(RunSpec("netbench", runtime, fabric, nodes, 2 if nodes == 1 else 1, repetition,
                                    mode=default_mode(framework), mpi_model=model, framework=framework))
    return runs


def mode_runs_at(bench: dict, framework: str, mode: str, runtime: str, ranks: int) -> bool:
    """Each framework's baseline mode runs at every point; the others where benchmark.modes_at puts them."""
    where = bench.get("modes_at") or {}
    return mode == default_mode(framework) or (runtime in where.get("runtimes", [runtime])
                                                and ranks in where.get("ranks", [ranks]))


def check_modes_at(config: dict) -> None:
    """benchmark.modes_at names runtimes and rank counts of the sweep: checked against the config's runtimes before
    the unusable ones are skipped, so that a runtime missing on this host skips its runs rather than failing here."""
    scaling = config["scaling"]
    sweep = {"runtimes": config["runtimes"],
             "ranks": sorted({n * p for n in scaling["nodes"] for p in scaling["ranks_per_node"]})}
    modes_at = config["benchmark"].get("modes_at") or {}
    for key, allowed in sweep.items():
        if stray := [value for value in modes_at.get(key, []) if value not in allowed]:
            raise ConfigError(f"config: 'benchmark.modes_at.{key}' = {stray} names what the sweep does not run; "
                              f"allowed: {allowed}")


def check_frameworks(config: dict, runs: list[RunSpec]) -> None:
    """What each framework of the sweep cannot run (a model it lacks, its own checks), refused before any run."""
    bench = config["benchmark"]
    for each in map(framework_named, bench["frameworks"]):
        models = importlib.import_module(each.models_module).MODELS if each.models_module else None
        if models is not None and bench["model"] not in models:
            raise ConfigError(f"config: 'benchmark.model' = {bench['model']!r} has no {each.label} version here; "
                              f"allowed with frameworks {each.name}: {', '.join(models)}, or benchmark.frameworks "
                              f"[{DEFAULT_FRAMEWORK}]")
        if problem := each.check(config):
            raise ConfigError(problem)


def first_runs(config: dict, runs: list[RunSpec]) -> list[RunSpec]:
    """The runs made whatever the results: all of them, except with `repetitions: auto` the train
    repetitions after min_repetitions (netbench keeps its own fixed netbench.repetitions)."""
    fewest = repetition_bounds(config["benchmark"])[0]
    return [run for run in runs if run.kind != "train" or run.repetition <= fewest]


def check_runs(config: dict, runs: list[RunSpec]) -> None:
    """Constraints across keys that a schema cannot say."""
    if config["launcher"]["kind"] == "none":
        too_big = sorted({r.ranks for r in runs if r.ranks > 1})
        if too_big:
            raise ConfigError(
                f"config: 'launcher.kind' = 'none' runs one rank, but the sweep asks for {too_big} ranks; "
                "allowed: launcher.kind mpirun or srun, or scaling with one rank and netbench.enabled false"
            )
    gpus_per_node = config["slurm"]["gpus_per_node"]
    sharing = sorted({r.ranks_per_node for r in runs if gpus_per_node and r.ranks_per_node > gpus_per_node})
    if sharing:  # each job asks for --gres=gpu:gpus_per_node: more ranks than that on a node share a GPU
        raise ConfigError(f"config: 'scaling.ranks_per_node' has {sharing} ranks per node, and each job asks for "
                          f"'slurm.gpus_per_node' = {gpus_per_node} GPUs: ranks would share a GPU; allowed: at most "
                          f"{gpus_per_node} ranks per node, one per GPU")
    servers = config["benchmark"]["parameter_servers"]
    short = sorted({r.ranks for r in runs if r.mode in PARAMETER_SERVER_MODES and r.ranks < servers})
    if short:
        raise ConfigError(f"config: 'benchmark.parameter_servers' = {servers} needs that many ranks (they live in "
                          f"worker processes), but the sweep has parameter-server runs on {short} rank(s); "
                          f"allowed: at most {min(short)}")
    if config["benchmark"]["xla"] and (modes := sorted({r.mode for r in runs} & set(PARAMETER_SERVER_MODES))):
        raise ConfigError(f"config: 'benchmark.xla' = true cannot run mode {', '.join(modes)} (XLA cannot read "
                          "variables held on parameter servers); allowed: xla false, or other modes")
    check_frameworks(config, runs)
    ids = [r.run_id for r in runs]
    if len(ids) != len(set(ids)):
        raise ConfigError("config: two sweep points give the same run id; make fabric and runtime names distinct")


# The ImageNet-shaped sample the workflow writes when benchmark.data has `real`
# and no dataset.path is given; manifest.json is written last, when it is whole.
SAMPLE_DIR = "build/data/imagenet-sample"


@dataclass(frozen=True)
class BenchEnv:
    """A benchmark environment: the one lock that the bare-metal venv (scripts/setup-venv.sh) and
    the image (containers/Dockerfile) both install, so that their provenance hashes can match.
    Each framework's image is a flavour of its own (tag and wheelhouse suffix): a PyTorch rank
    needs neither TensorFlow nor Horovod, nor a TensorFlow rank torch's 750 MB."""

    name: str
    pins: str  # the top-level pins, Horovod's version among them (TensorFlow)
    lock: str  # the full closure
    wheelhouse: str  # the image's offline wheels, with the Horovod wheel setup-venv.sh built
    horovod_gpu_operations: str  # "" = Horovod's CPU collectives (Gloo, MPI)
    venv: str  # where `make setup` / `make gpu-env` puts the bare-metal venv
    framework: str = DEFAULT_FRAMEWORK
    suffix: str = ""  # of the image's tag and files: the TensorFlow image keeps the names it had
    horovod: bool = True  # the image compiles or installs Horovod (containers/Dockerfile HOROVOD_VERSION)
    # Pins that PyPI serves only as a source distribution: built into wheels for the offline image.
    sdist_only: tuple[str, ...] = ()

    def tag(self, tag: str) -> str:
        return tag + self.suffix


BENCH_ENVS = {
    "cpu": BenchEnv("cpu", "envs/bench.txt", "envs/bench.lock.txt", "build/wheelhouse", "", ".venv-bench"),
    "gpu": BenchEnv("gpu", "envs/bench-gpu.txt", "envs/bench-gpu.lock.txt", "build/wheelhouse-gpu", "NCCL",
                    ".venv-bench-gpu"),
    "torch": BenchEnv("torch", "envs/bench-torch.txt", "envs/bench-torch.lock.txt", "build/wheelhouse-torch", "",
                      ".venv-bench-torch", framework=PYTORCH.name, suffix="-torch", horovod=False,
                      sdist_only=("tfrecord",)),
}


def bench_env(config: dict, framework_name: str) -> BenchEnv:
    """The environment `framework_name`'s ranks run, bare metal and in the image the workflow builds: its own
    (Framework.env: PyTorch's envs/bench-torch.lock.txt; a GPU site gives its own image), or benchmark_env's
    (cpu or gpu: TensorFlow's)."""
    return BENCH_ENVS[framework_named(framework_name).env or config["benchmark_env"]]


def image_key(mpi_model: str, framework_name: str = DEFAULT_FRAMEWORK) -> str:
    """The key of images.<runtime> naming the image a run of this MPI model and framework runs:
    image, native_image, torch_image, torch_native_image."""
    return framework_named(framework_name).image_key(mpi_model)


def image_keys() -> tuple[str, ...]:
    """Every image key of images.<runtime>: each framework's, in each MPI model."""
    return tuple(each.image_key(model) for each in FRAMEWORKS.values() for model in ("hybrid", "native"))


@dataclass(frozen=True)
class MpiFlavour:
    """The MPI an image is built with, one build argument of containers/Dockerfile apart. openmpi: the
    base's Debian Open MPI, for the hybrid model. mpich: the MPICH-ABI flavour for the native model,
    whose libmpi.so.12 (the `mpich` wheel's, in the venv's lib/) the host's MPICH replaces at run
    time; its Horovod is compiled against that wheel. The benchmark's packages are the lock's in
    both, so the provenance hash is the same; the MPI wheels are recorded beside it (provenance.mpi)."""

    name: str
    wheels: tuple[str, ...] = ()  # installed from the flavour's wheelhouse before the lock

    @property
    def suffix(self) -> str:
        return f"-{self.name}" if self.wheels else ""

    def wheelhouse(self, env: BenchEnv) -> str:
        """The env's wheels, hard-linked, with the MPI wheels and the Horovod wheel built against them."""
        return env.wheelhouse + self.suffix

    def tag(self, tag: str) -> str:
        return tag + self.suffix


MPI_FLAVOURS = {"openmpi": MpiFlavour("openmpi"), "mpich": MpiFlavour("mpich", ("mpich==5.0.2",))}
MODEL_FLAVOUR = {"hybrid": "openmpi", "native": "mpich"}  # the flavour of the built image each MPI model runs


def dataset_dir(config: dict, sample_dir: str = SAMPLE_DIR) -> str:
    return config["dataset"]["path"] or sample_dir


def check_dataset(config: dict) -> None:
    """A site's dataset.path must hold ImageNet TFRecords before any real-data run is planned on it."""
    path = config["dataset"]["path"]
    if path and "real" in config["benchmark"]["data"] and not any(Path(path).glob("train-*-of-*")):
        raise ConfigError(f"config: 'dataset.path' = {path!r} holds no ImageNet TFRecords; allowed: a directory "
                          "with train-*-of-* files, or null for a sample generated here")
