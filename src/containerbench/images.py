"""Container images: which artifact each runtime runs, so the rules and the plans agree.

One image, containers/Dockerfile, is built offline (no registry is reachable)
from a local Debian base and a wheelhouse, so it holds the same pinned packages
and package code as the bare-metal venv and reports the same provenance hash;
`containerbench image <step>` builds it (baseimage, wheelhouse, imagebuild) and
hands it to every runtime:

  containerbench image base             debootstrap -> localhost/containerbench-base:bookworm
  containerbench image wheelhouse       pip download the lock, build the Horovod wheel once
  containerbench image build            <engine> build --network none -> stamp JSON
  containerbench image export           <engine> save -> build/images/containerbench.tar
  containerbench image charliecloud     export, ch-convert -> build/images/containerbench.ch
  containerbench image charliecloud-nvidia   ch-fromhost --nvidia, on a GPU node
  containerbench image load             <other engine> load the archive -> its stamp JSON
  containerbench image prepare --runtime R   apptainer, singularity, enroot, sarus, podman-hpc:
                                        the commands of R's class (containerbench.runtimes)
  containerbench image print-commands   every runtime's image commands, printed
  containerbench image remove           the tag from each engine, and every file made from it

Every step has a time limit (--step-timeout), so a wedged engine fails its step
with a message instead of holding the workflow. The Singularity definition is
made by containerbench.singularity (`containerbench singularity-definition`).
Here: which file each runtime runs (image_files, resolve_images), what a
runtime's image carries (image_lock), and the converting runtimes' prepare step.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
from pathlib import Path

from containerbench.config import (
    BENCH_ENVS,
    MODEL_FLAVOUR,
    MPI_FLAVOURS,
    BenchEnv,
    ConfigError,
    ImageUse,
    MpiFlavour,
    bench_env,
    image_key,
    mpi_models,
    runtime_label,
)
from containerbench.frameworks import framework as framework_named
from containerbench.imagestep import (
    DEFAULT_STEP_TIMEOUT_S,
    IMAGES,
    QUERY_TIMEOUT_S,
    ImageStepError,
    run_step,
    write_file,
)
from containerbench.runtimes import (
    CONTAINER_RUNTIMES,
    Apptainer,
    BareMetal,
    BuiltImage,
    Charliecloud,
    Podman,
    RunRequest,
    host_environment,
    run_probe,
)

_write = write_file  # prepare_runtime's name for it

# -- what each runtime runs, and the commands that make it (owned by its class) ---------------

def build_outputs(tag: str, build_dir: Path | str = IMAGES, engine: str = Podman.name,
                  gpus: bool = False) -> BuiltImage:
    """What the image build makes of `tag`: the image, and where the files made from it go."""
    return BuiltImage(tag, engine, str(build_dir), gpus)


def image_files(tag: str, build_dir: Path | str = IMAGES, gpus: bool = False) -> dict[str, str]:
    """Every file the workflow can make from the image `tag`: each runtime's artifact, the archive
    they are converted from, the Singularity definition and Charliecloud's directory."""
    image = build_outputs(tag, build_dir, gpus=gpus)
    files = {name: cls.artifact(image) for name, cls in CONTAINER_RUNTIMES.items() if cls.artifact(image)}
    return {**files, "archive": image.archive, "definition": image.definition,
            "charliecloud-dir": Charliecloud.reference(image)}


def built_image(runtime: str, tag: str, build_dir: Path | str = IMAGES, gpus: bool = False) -> tuple[str, str] | None:
    """(the image reference `runtime` runs, the file its runs depend on), or None if not buildable here."""
    cls, image = CONTAINER_RUNTIMES.get(runtime), build_outputs(tag, build_dir, gpus=gpus)
    if cls is None or cls.artifact(image) is None:
        return None  # bare metal, and Shifter (its gateway serves images; it cannot take a local build)
    return cls.reference(image), cls.artifact(image)


def runtime_commands(engine: str, tag: str, registry: str = "REGISTRY", build_dir: Path | str = IMAGES,
                     gpus: bool = False) -> dict[str, list[list[str]]]:
    """Every runtime's prepare commands for the built image (what `images print-commands` shows)."""
    image = build_outputs(tag, build_dir, engine, gpus)
    commands = {name: [*cls.prepare_commands(image, registry), *cls.after_prepared_commands(image)]
                for name, cls in CONTAINER_RUNTIMES.items()}
    return {**commands, "apptainer-def": [Apptainer.build_argv(image.file(".sif"), image.definition)]}


def flavour_tag(tag: str, env: BenchEnv, flavour: MpiFlavour) -> str:
    """The tag of one flavour of the built image: the framework's suffix, then the MPI flavour's
    (localhost/containerbench:latest, ...:latest-mpich, ...:latest-torch, ...:latest-torch-mpich)."""
    return flavour.tag(env.tag(tag))


def resolve_images(config: dict, build_dir: Path | str = IMAGES) -> dict[ImageUse, str]:
    """Fill in the image each runtime runs for each MPI model and framework of the sweep
    (images.<runtime>.image, native_image: the MPICH flavour, torch_image, torch_native_image:
    the PyTorch flavours) where the workflow builds it; return who runs a built image -> the file
    their runs depend on. An image the config names is run as it is and depends on nothing built."""
    images = config["images"]
    tag, gpus = images["build"]["tag"], config["slurm"]["gpus_per_node"] > 0
    artifacts = {}
    for runtime in config["runtimes"]:
        if runtime == BareMetal.name:
            continue
        settings = images.setdefault(runtime, {})
        models = mpi_models(config, runtime)
        for framework, model in itertools.product(config["benchmark"]["frameworks"], models):
            key, hybrid_key = image_key(model, framework), image_key("hybrid", framework)
            if settings.get(key) or (models == ("native",) and settings.get(hybrid_key)):
                continue  # a native-only runtime's `image` is its MPICH-ABI image
            env, flavour = bench_env(config, framework), MPI_FLAVOURS[MODEL_FLAVOUR[model]]
            made = built_image(runtime, flavour_tag(tag, env, flavour), build_dir, gpus=gpus)
            if made is None:
                raise ConfigError(f"config: 'images.{runtime}.{key}' is missing; allowed: the image reference "
                                  f"{runtime} runs (the workflow cannot build a {runtime} image locally)")
            settings[key], artifacts[ImageUse(runtime, model, framework)] = made
    return artifacts


# What an image carries, as pip sees it: the lock of a bare-metal venv to compare it with.
FREEZE_ARGS = ("list", "--format=freeze", "--disable-pip-version-check")
NOT_LOCKED = ("containerbench", "horovod")  # the package comes from the clone; Horovod is compiled


def image_lock(runtime, timeout: float = QUERY_TIMEOUT_S) -> str:
    """The distributions installed in `runtime`'s image, as a lock for scripts/setup-venv.sh
    (BENCH_LOCK=...): a bare-metal venv with the versions a vendor's image carries. Horovod's version
    is a comment: setup-venv.sh compiles it against the TensorFlow of the lock."""
    if runtime.requires_launcher:
        raise ImageStepError(f"freeze: runtime {runtime.name!r} starts only under {runtime.requires_launcher}; "
                             f"run this command inside an allocation's step there")
    request = RunRequest(module="pip", args=FREEZE_ARGS, workdir=os.getcwd())
    done = run_step(f"freeze ({runtime.name})", runtime.rank_argv(request), capture=True, timeout=timeout,
                    env={**host_environment(), **runtime.environment(request)})
    pins = sorted((line.strip() for line in done.stdout.splitlines() if "==" in line), key=str.lower)
    locked = [pin for pin in pins if pin.split("==")[0].lower() not in NOT_LOCKED]
    horovod = [f"# {pin.split('+')[0]}" for pin in pins if pin.lower().startswith("horovod==")]
    image = getattr(runtime, "image", "")
    return "\n".join([f"# What {image} carries ({runtime.name}: pip list --format=freeze), for a bare-metal venv:",
                      "#   BENCH_LOCK=<this file> scripts/setup-venv.sh bench VENV", *horovod, *locked]) + "\n"


def check_bench_env(config: dict, repo: Path | str, artifacts: dict[ImageUse, str] | None = None) -> None:
    """The GPU environment's image installs a Horovod wheel that only `make gpu-env` can build
    (it needs nvcc): say so before any job, instead of failing the build an hour in. Its MPICH
    flavour would need a second such wheel, compiled against MPICH: without NCCL operations the
    native runs would average GPU gradients through the host, so they are refused. A framework with an
    environment of its own (Framework.env: PyTorch's envs/bench-torch.lock.txt) has the CPU build of
    itself there: a GPU sweep names its own image."""
    env = BENCH_ENVS[config["benchmark_env"]]
    uses = sorted(artifacts or {})
    on_benchmark_env = [use for use in uses if not framework_named(use.framework).env]  # TensorFlow's, with Horovod
    native = [use for use in on_benchmark_env if use.mpi_model == "native"]
    if env.horovod_gpu_operations and native:
        label = runtime_label(native[0].runtime, "native")
        raise ConfigError(f"config: {label} would run the MPICH flavour of the '{env.name}' image, whose "
                          f"Horovod the workflow can only build without {env.horovod_gpu_operations} operations; "
                          f"allowed: images.{native[0].runtime}.native_image naming a site's MPICH-based "
                          "GPU image, or mpi_model hybrid")
    on_own_env = [use for use in uses if framework_named(use.framework).env]
    if config["slurm"]["gpus_per_node"] > 0 and on_own_env:
        use, own = on_own_env[0], framework_named(on_own_env[0].framework)
        raise ConfigError(f"config: 'images.{use.runtime}.{own.image_key(use.mpi_model)}' is missing: a GPU sweep's "
                          f"{own.label} ranks need CUDA's {own.provenance_roots[0]}, and the image the workflow builds "
                          f"has the CPU one of {BENCH_ENVS[own.env].lock}; allowed: a site's CUDA {own.label} image "
                          f"there (e.g. NGC's), or runtimes [bare-metal] for {own.name}")
    wheels = Path(repo) / env.wheelhouse
    if env.horovod_gpu_operations and on_benchmark_env and not any(wheels.glob("horovod-*-linux_x86_64.whl")):
        raise ConfigError(f"config: 'benchmark_env' = '{env.name}' builds its image with the Horovod wheel that "
                          f"`make gpu-env` puts in {env.wheelhouse} ({env.horovod_gpu_operations} operations, "
                          f"compiled by CUDA 11.8's nvcc), and there is none; allowed: run `make gpu-env` "
                          "first, or benchmark_env: cpu")


# Runtimes whose artifact `images prepare` makes from the archive or the engine's store, with
# nothing of their own to check (their class's prepare_from; docker/podman load and Charliecloud
# have their own steps).
CONVERTED = tuple(name for name, cls in CONTAINER_RUNTIMES.items() if cls.prepare_from)


def stamped_id(name: str, built_stamp: Path) -> str:
    """The id of the image the engine built, from the build's stamp (imagebuild.build_stamp)."""
    try:
        return json.loads(Path(built_stamp).read_text())["image_id"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ImageStepError(f"{name}: the build's stamp {built_stamp} names no image id ({error!r}); "
                             "build the image again") from None


def check_prepared_id(name: str, reference: str, prepared_id: str, built_stamp: Path) -> None:
    """The prepared copy is the image the engine built, by its id (the build's stamp: imagebuild.build_stamp)."""
    built_id = stamped_id(name, built_stamp)
    if prepared_id != built_id:
        raise ImageStepError(f"{name}: prepared {reference} as {prepared_id}, not the built {built_id} "
                             f"({built_stamp}); prepare it again")


def read_prepared(name: str, image: BuiltImage, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> dict[str, str]:
    """What `name`'s prepare commands made of `image`, read back (Runtime.read_prepared); ValueError if none."""
    return CONTAINER_RUNTIMES[name].read_prepared(
        image, lambda argv: run_step(f"{name} ({argv[0]} {argv[1]})", argv, timeout=timeout, capture=True).stdout)


def prepare_runtime(name: str, image: BuiltImage, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> str:
    """Run `name`'s prepare commands; a runtime whose artifact is not the file the commands make
    (sarus, podman-hpc: the image lives in their own store) gets a stamp naming what it runs."""
    cls = CONTAINER_RUNTIMES[name]
    artifact = Path(cls.artifact(image))
    artifact.parent.mkdir(parents=True, exist_ok=True)
    for argv in cls.prepare_commands(image):
        with cls.store_lock(argv):
            run_step(f"{name} ({argv[0]} {argv[1]})", argv, timeout=timeout)
    with cls.store_lock():
        try:
            found = read_prepared(name, image, timeout)
        except ValueError as error:
            raise ImageStepError(f"{name}: {error}") from None
    if found.get("image_id"):
        check_prepared_id(name, cls.reference(image), found["image_id"],
                          Path(image_files(image.tag, image.build_dir)[image.engine]))
    for argv in cls.after_prepared_commands(image):
        with cls.store_lock(argv):
            run_step(f"{name} ({argv[0]} {argv[1]})", argv, timeout=timeout)
    if cls.artifact_is_stamp:
        _write(artifact, json.dumps({"image": cls.reference(image), **found}) + "\n")
    return cls.reference(image)


class StoreNotAnswering(ImageStepError):
    """A runtime or engine whose stamp says its store holds a copy does not answer here: the copy may stay."""

    def __init__(self, name: str, why: str):
        last = why.strip().splitlines()[-1] if why.strip() else "no output"
        super().__init__(f"{name} does not answer here ({last})")
        self.name = name


def remove_prepared(name: str, image: BuiltImage, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> list[str]:
    """Remove the copy `name`'s prepare put in its own store, where one is there (read back first, and again
    after: podman-hpc's rmsqi exits 0 when it removed nothing). Returns what was removed."""
    cls = CONTAINER_RUNTIMES[name]
    if not cls.remove_prepared_commands(image):
        return []
    answers, why = run_probe(cls.probe)
    if not answers:
        if Path(cls.artifact(image)).exists():  # its stamp: the copy was made in the store
            raise StoreNotAnswering(name, why)
        return []
    with cls.store_lock():
        try:
            read_prepared(name, image, timeout)
        except ValueError:
            return []  # nothing prepared in this store
        try:
            cls.release_prepared(image)
        except ValueError as error:
            raise ImageStepError(f"remove ({name}): {error}") from None
        commands = cls.remove_prepared_commands(image)
        for argv in commands:
            run_step(f"remove ({argv[0]} {argv[1]})", argv, timeout=timeout)
        try:
            left = read_prepared(name, image, timeout)
        except ValueError:
            return [f"{name} {image.tag}"]
    raise ImageStepError(f"remove ({name}): `{shlex.join(commands[-1])}` left {image.tag} ({left}) in place")
