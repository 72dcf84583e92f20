"""Container runtimes: each turns a rank's run request into an argv and environment.

One small class per runtime (the shape of ReFrame's containers.py), in a module
of its family; base.py holds what they share, this module the registry and the
choice of runtimes for a config. A runtime only knows how to start ONE rank; the
launcher (launchers.py) puts mpirun or srun in front, so
`srun --mpi=pmix <runtime argv> python3 -m containerbench.rank.bench`
composes for every runtime the same way. The MPI model is the hybrid one: the
MPI library lives in the image and is wired up by the host's srun (PMIx/PMI2)
or mpirun, so every runtime shares the host's network, PIDs and shared memory.

Hooks a launcher uses:
  rank_argv(request)        the words that start one rank
  environment(request)      variables the launcher sets on the host and forwards (mpirun -x)
  launcher_options(request) options the launcher inserts before rank_argv (Enroot: srun's Pyxis options)
  requires_launcher         "srun" for Enroot (Pyxis is a Slurm plugin); check_launcher(kind) raises
  probe / usable()          a quick command that succeeds only where the runtime can run here

Each container runtime passes into the image only what the run needs: the
variables the launcher sets for the rank (RANK_PREFIXES), the benchmark's own
(request.env), PYTHONNOUSERSITE (a ~/.local site-packages on a bound home must
not shadow the image's) and PMIX_MCA_gds=hash (the PMIx server's shared-memory
datastore lives in a host directory the container does not see; hash needs only
the server's socket: apptainer/singularity#5195; Enroot's 50-slurm-pmi.sh hook
binds that directory instead). Rank variable names are only known when the rank
starts; where a runtime cannot pass them by prefix, rankexec.py does it on the node.
"""


from __future__ import annotations

import inspect
import os
import shutil

from containerbench import hostmpi
from containerbench.config import ConfigError, ImageUse, image_keys, mpi_models
from containerbench.frameworks import framework as framework_named
from containerbench.launchers import NoLauncher
from containerbench.runtimes.bare_metal import BareMetal
from containerbench.runtimes.base import (
    CONTAINER_RUNTIMES,
    DEFAULT_PATH,
    IMAGE_FILE_SUFFIXES,
    LAUNCH_OPTIONS,
    MPI_MODELS,
    PINNED,
    RANK_PREFIXES,
    RANKEXEC,
    SLURM_GPU_VARS,
    BuiltImage,
    ContainerRuntime,
    RunRequest,
    Runtime,
    engine_env,
    host_environment,
    is_image_path,
    move_binds,
    register,
    run_probe,
)
from containerbench.runtimes.node import NativeMpi, NodeRequirement

# Each module registers its runtimes as it is imported, and the registry keeps that order (plans and
# `images print-commands` show them in it): a new runtime's module goes last.
# isort: off
from containerbench.runtimes.oci import ENGINES, Docker, OciEngine, Podman
from containerbench.runtimes.apptainer import Apptainer, Singularity
from containerbench.runtimes.shifter import Shifter
from containerbench.runtimes.charliecloud import WRITE_FAKE_SINCE, Charliecloud
from containerbench.runtimes.enroot import Enroot
from containerbench.runtimes.sarus import Sarus
from containerbench.runtimes.podman_hpc import PodmanHPC
# isort: on

__all__ = [
    "CONTAINER_RUNTIMES", "DEFAULT_PATH", "ENGINES", "IMAGE_FILE_SUFFIXES", "LAUNCH_OPTIONS", "MPI_MODELS", "PINNED",
    "RANKEXEC", "RANK_PREFIXES", "RUNTIME_NAMES", "SLURM_GPU_VARS", "WRITE_FAKE_SINCE", "Apptainer", "BareMetal",
    "BuiltImage", "Charliecloud", "ContainerRuntime", "Docker", "Enroot", "NativeMpi", "NodeRequirement", "OciEngine",
    "Podman",
    "PodmanHPC", "RunRequest", "Runtime", "Sarus", "Shifter", "Singularity", "check_launchers",
    "engine_env", "engine_usable", "host_environment", "is_image_path", "move_binds", "node_requirements", "register",
    "run_probe",
    "runtime_for", "select_runtimes",
]

RUNTIME_NAMES = (BareMetal.name, *CONTAINER_RUNTIMES)


def own_options(cls: type[ContainerRuntime]) -> list[str]:
    """What images.<name> may set for the class besides its image: its constructor's own parameters
    (the launch settings, LAUNCH_OPTIONS, go to Runtime's)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return sorted(p.name for p in parameters if p.kind is not p.VAR_KEYWORD and p.name not in ("self", "image"))


def native_mpi(settings: dict) -> NativeMpi:
    """The config's native_mpi as the ranks bind it: host paths made absolute (a clone-relative one names the
    same file on every node that sees the clone at the same path)."""
    found = {key: settings[key] for key in ("library", "image_library") if key in settings}
    if "library" in found:
        found["library"] = os.path.abspath(found["library"])
    return NativeMpi(**found, library_dirs=tuple(os.path.abspath(path) for path in settings.get("library_dirs", ())))


def runtime_for(name: str, config: dict, mpi_model: str | None = None, framework: str | None = None) -> Runtime:
    """The runtime called `name`, in `mpi_model` (default: its first); container runtimes read
    config["images"][name] = {image: ..., native_image: ..., options}. Bare metal runs the
    framework's own venv (bare_metal.<Framework.bare_metal_key>: python, torch_python), a container
    runtime the framework's image (images.<name>.torch_image and torch_native_image for PyTorch). Without
    a framework: the sweep's first (what probes and launcher checks need is the same in each)."""
    chosen = framework_named(framework or ((config.get("benchmark") or {}).get("frameworks") or [None])[0])
    if name == BareMetal.name:
        return BareMetal(config["bare_metal"][chosen.bare_metal_key])
    if name not in CONTAINER_RUNTIMES:
        raise ValueError(f"runtime {name!r} is not supported; allowed: {', '.join(RUNTIME_NAMES)}")
    options = dict((config.get("images") or {}).get(name) or {})
    settings = {key: options.pop(key) for key in LAUNCH_OPTIONS if key in options}
    models = settings.get("mpi_model", "hybrid")
    settings["mpi_model"] = model = mpi_model or (models[0] if isinstance(models, list) else models)
    images = {key: options.pop(key) for key in image_keys() if key in options}
    key, native_key = chosen.image_key("hybrid"), chosen.image_key("native")
    if model == "native" and (images.get(native_key) or not images.get(key)):
        key = native_key  # a native-only runtime's `image` is its MPICH-ABI image
    image = images.get(key)
    if not isinstance(image, str) or not image:
        raise ValueError(f"runtime {name!r} needs an image reference: set images.{name}.{key} in the config")
    cls = CONTAINER_RUNTIMES[name]
    allowed = own_options(cls)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"runtime {name!r}: unknown option {', '.join(map(repr, unknown))} in images.{name}; "
                         f"allowed: image, {', '.join(allowed)}")
    native = config.get("native_mpi") or {}
    if model == "native" and "srun_mpi" not in settings:
        settings["srun_mpi"] = native.get("srun_mpi", "pmi2")  # an MPICH libmpi speaks PMI2 to srun (mpi_guide)
    runtime = cls(image, **options, **settings, launcher=config.get("launcher", {}).get("kind", NoLauncher.kind),
                  native_mpi=native_mpi(native))
    runtime.check_mpi_model()
    return runtime


def node_requirements(config: dict) -> list[NodeRequirement]:
    """What the sweep's runtimes need on each node it runs on (Runtime.node_requirements), in each MPI model
    they run, once each: the pre-flight check asks the nodes."""
    gpus = config["slurm"]["gpus_per_node"] > 0
    found = []
    for name in config["runtimes"]:
        for model in mpi_models(config, name):
            runtime = runtime_for(name, config, model)
            found += runtime.node_requirements(gpus)
            if runtime.native:  # the host MPI as the ranks will load it, read as each run's own step reads it
                native, what = runtime.native_mpi, "the host MPI with every library it loads in native_mpi.library_dirs"
                found.append(NodeRequirement(name, what, tuple(hostmpi.node_argv(native.library, native.library_dirs)),
                                             source="hostmpi.py"))
    return list(dict.fromkeys(found))


def engine_usable(engine: str) -> tuple[bool, str]:
    """Can `engine` build or convert images here? Its runtime class's own probe (for docker:
    the daemon answers), run in the environment the image steps use."""
    cls = CONTAINER_RUNTIMES[engine]
    ok, detail = run_probe(cls.probe, env=engine_env(engine), timeout=30)
    return ok, detail if ok else detail + cls.probe_failure_hint()


def check_launchers(config: dict) -> None:
    """Every runtime of the sweep takes its options and runs under the configured launcher (Enroot
    needs srun); ValueError names the one that does not."""
    for name in config["runtimes"]:
        for model in mpi_models(config, name):
            runtime_for(name, config, model).check_launcher(config["launcher"]["kind"])


def unusable_here(config: dict, artifacts: dict[ImageUse, str]) -> dict[str, str]:
    """The container runtimes of the config that cannot run from this host, each with why (its probe,
    or the build engine's for one that runs the built image); those declared on the compute nodes only
    are probed there (containerbench.preflight), not here."""
    build_ok, build_reason = engine_usable(config["images"]["build"]["engine"]) if artifacts else (True, "")
    unusable = {}
    for name in config["runtimes"]:
        if name == BareMetal.name:
            continue
        runtime = runtime_for(name, config)
        runs_built = any(use.runtime == name for use in artifacts)
        if runtime.available == "compute-nodes":
            # Its image made here without it: what that needs is asked here (Enroot's tar and mksquashfs).
            if missing := [tool for tool in runtime.conversion_tools if runs_built and not shutil.which(tool)]:
                unusable[name] = (f"its image is made here without it (available: compute-nodes), with "
                                  f"{' and '.join(runtime.conversion_tools)}, and {', '.join(missing)} is not "
                                  "installed here")
            continue
        ok, reason = runtime.usable()
        if ok and runs_built and not build_ok:
            ok, reason = False, f"the image cannot be built here: {build_reason}"
        if not ok:
            unusable[name] = reason
    return unusable


def select_runtimes(config: dict, artifacts: dict[ImageUse, str]) -> dict[str, str]:
    """Probe each container runtime (and, for those that run the built image, the build engine);
    apply runtime_policy. Return {skipped runtime: reason}.

    Under `require` an unusable runtime is a ConfigError; under `skip-unusable` it
    is removed from config["runtimes"] and its reason returned for the report.
    """
    unusable = unusable_here(config, artifacts)
    if unusable and config["runtime_policy"] == "require":
        name, reason = next(iter(unusable.items()))
        made_here = (", its image made here without it as its own import makes it, with mksquashfs"
                     if CONTAINER_RUNTIMES[name].converts_without_itself else "")
        raise ConfigError(f"config: runtime {name!r} cannot run here: {reason}; allowed: install it, set "
                          f"images.{name}.available: compute-nodes where only the compute nodes have it (the "
                          f"pre-flight job probes it there{made_here}), give images.{name}.image (and torch_image), "
                          "or set runtime_policy: skip-unusable")
    config["runtimes"] = [name for name in config["runtimes"] if name not in unusable]
    return unusable
