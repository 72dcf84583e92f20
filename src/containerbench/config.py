"""The workflow configuration: validation with one-line errors, and the sweep.

`check` turns the first schema violation into a sentence naming the key, the
bad value and what is allowed. `plan_runs` expands the sweep (runtimes x fabrics
x nodes x ranks per node x batch sizes x repetitions) into RunSpecs, one per
benchmark process, each with a stable, readable run id.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration that cannot be run; the message is one line for the user."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    with open(path) as handle:
        return yaml.safe_load(handle)


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
    schema = schema or load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        raise ConfigError(f"config: {describe(error)}")


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

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def run_id(self) -> str:
        shape = f"{self.nodes}x{self.ranks_per_node}"
        batch = f"_b{self.batch_size}" if self.batch_size else ""
        # The defaults leave the id as it was: old results stay where a resumed sweep finds them.
        variant = "".join(f"_{value}" for value, default in ((self.mode, "horovod"), (self.data, "synthetic"))
                          if value != default)
        return f"{self.kind}_{self.runtime}_{self.fabric}_{shape}{batch}{variant}_rep{self.repetition}"

    def as_dict(self) -> dict:
        return {**asdict(self), "ranks": self.ranks, "run_id": self.run_id}


def plan_runs(config: dict) -> list[RunSpec]:
    """Every run of the sweep, repetition-major, so repetitions interleave the points."""
    bench, scaling = config["benchmark"], config["scaling"]
    runs: list[RunSpec] = []
    for repetition in range(1, bench["repetitions"] + 1):
        for runtime, fabric, nodes, per_node, batch, mode, data in itertools.product(
            config["runtimes"], config["fabrics"], scaling["nodes"], scaling["ranks_per_node"], bench["batch_sizes"],
            bench.get("modes", ["horovod"]), bench.get("data", ["synthetic"]),
        ):
            runs.append(RunSpec("train", runtime, fabric, nodes, per_node, repetition, batch, mode, data))
    net = config.get("netbench", {})
    if net.get("enabled", True):
        # Point to point needs two ranks; across nodes when the sweep has them.
        nodes = 2 if max(scaling["nodes"]) >= 2 else 1
        for repetition in range(1, net.get("repetitions", 1) + 1):
            for runtime, fabric in itertools.product(config["runtimes"], config["fabrics"]):
                runs.append(RunSpec("netbench", runtime, fabric, nodes, 2 // nodes, repetition))
    return runs


def check_runs(config: dict, runs: list[RunSpec]) -> None:
    """Constraints across keys that a schema cannot say."""
    if config["launcher"]["kind"] == "none":
        too_big = sorted({r.ranks for r in runs if r.ranks > 1})
        if too_big:
            raise ConfigError(
                f"config: 'launcher.kind' = 'none' runs one rank, but the sweep asks for {too_big} ranks; "
                "allowed: launcher.kind mpirun or srun, or scaling with one rank and netbench.enabled false"
            )
    servers = config["benchmark"].get("parameter_servers", 1)
    short = sorted({r.ranks for r in runs if r.mode == "parameter_server" and r.ranks < servers})
    if short:
        raise ConfigError(f"config: 'benchmark.parameter_servers' = {servers} needs that many ranks (they live in "
                          f"worker processes), but the sweep has parameter_server runs on {short} rank(s); "
                          f"allowed: at most {min(short)}")
    if config["benchmark"].get("xla") and any(r.mode == "parameter_server" for r in runs):
        raise ConfigError("config: 'benchmark.xla' = true cannot run mode parameter_server (XLA cannot read "
                          "variables held on parameter servers); allowed: xla false, or modes without parameter_server")
    from containerbench.runtimes import runtime_for

    for name in config["runtimes"]:
        try:
            runtime_for(name, config).check_launcher(config["launcher"]["kind"])
        except ValueError as error:
            raise ConfigError(f"config: {error}") from None
    ids = [r.run_id for r in runs]
    if len(ids) != len(set(ids)):
        raise ConfigError("config: two sweep points give the same run id; make fabric and runtime names distinct")


# The ImageNet-shaped sample the workflow writes when benchmark.data has `real`
# and no dataset.path is given; manifest.json is written last, when it is whole.
SAMPLE_DIR = "build/data/imagenet-sample"


def dataset_dir(config: dict, sample_dir: str = SAMPLE_DIR) -> str:
    return config.get("dataset", {}).get("path") or sample_dir


def check_dataset(config: dict) -> None:
    """A site's dataset.path must hold ImageNet TFRecords before any real-data run is planned on it."""
    path = config.get("dataset", {}).get("path")
    if path and "real" in config["benchmark"].get("data", []) and not any(Path(path).glob("train-*-of-*")):
        raise ConfigError(f"config: 'dataset.path' = {path!r} holds no ImageNet TFRecords; allowed: a directory "
                          "with train-*-of-* files, or null for a sample generated here")


# Where the workflow puts the images it builds, and what each runtime runs from
# them: runtime -> (image reference, the file the run depends on). A runtime
# given an explicit images.<name>.image runs that and depends on nothing built.
BUILD_DIR = "build/images"


def image_files(tag: str, build_dir: str = BUILD_DIR) -> dict[str, str]:
    """What the workflow makes from the image `tag`, named after it: a stale file made
    from another image (or by hand) is never taken for this one."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", tag.rsplit("/", 1)[-1])
    return {"docker": f"{build_dir}/docker-{slug}.json", "podman": f"{build_dir}/podman-{slug}.json",
            "podman-hpc": f"{build_dir}/podman-hpc-{slug}.json", "sarus": f"{build_dir}/sarus-{slug}.json",
            "archive": f"{build_dir}/{slug}.tar", "charliecloud": f"{build_dir}/{slug}.ch",
            "definition": f"{build_dir}/{slug}.def", "apptainer": f"{build_dir}/{slug}.sif",
            "singularity": f"{build_dir}/{slug}.sif", "enroot": f"{build_dir}/{slug}.sqsh"}


def built_image(runtime: str, tag: str, build_dir: str = BUILD_DIR) -> tuple[str, str] | None:
    """(the image reference `runtime` runs, the file its runs depend on), or None if not buildable here."""
    files = image_files(tag, build_dir)
    if runtime in ("docker", "podman", "podman-hpc", "sarus"):
        return tag, files[runtime]
    if runtime in ("charliecloud", "apptainer", "singularity", "enroot"):
        return files[runtime], files[runtime]
    return None  # bare metal, and Shifter (its gateway serves images; it cannot take a local build)


def resolve_images(config: dict, build_dir: str = BUILD_DIR) -> dict[str, str]:
    """Fill in images.<runtime>.image for runtimes that run the built image; return runtime -> artifact."""
    images = config.setdefault("images", {})
    artifacts = {}
    for runtime in config["runtimes"]:
        if runtime == "bare-metal":
            continue
        settings = images.setdefault(runtime, {})
        if settings.get("image"):
            continue
        built = built_image(runtime, images["build"]["tag"], build_dir)
        if built is None:
            raise ConfigError(f"config: 'images.{runtime}.image' is missing; allowed: the image reference "
                              f"{runtime} runs (the workflow cannot build a {runtime} image locally)")
        settings["image"], artifacts[runtime] = built
    return artifacts


def select_runtimes(config: dict, artifacts: dict[str, str]) -> dict[str, str]:
    """Probe each container runtime; apply runtime_policy. Return {skipped runtime: reason}.

    Under `require` an unusable runtime is a ConfigError; under `skip-unusable` it
    is removed from config["runtimes"] and its reason returned for the report.
    """
    from containerbench.images import engine_usable
    from containerbench.runtimes import runtime_for

    # Building is the images module's business: it says whether its engine answers here.
    build_ok, build_reason = engine_usable(config["images"]["build"]["engine"]) if artifacts else (True, "")
    unusable = {}
    for name in config["runtimes"]:
        if name == "bare-metal":
            continue
        ok, reason = runtime_for(name, config).usable()
        if ok and name in artifacts and not build_ok:
            ok, reason = False, f"the image cannot be built here: {build_reason}"
        if not ok:
            unusable[name] = reason
    if unusable and config.get("runtime_policy", "require") == "require":
        name, reason = next(iter(unusable.items()))
        raise ConfigError(f"config: runtime {name!r} cannot run here: {reason}; allowed: install it, give "
                          "images.<runtime>.image, or set runtime_policy: skip-unusable")
    config["runtimes"] = [name for name in config["runtimes"] if name not in unusable]
    return unusable
