"""The frameworks a sweep trains with: one frozen record each, in one registry (FRAMEWORKS).

Everything the workflow side knows of a framework is here: the harness module its ranks run, its
modes, the benchmark settings a plan copies, its environment (lock, venv, wheelhouse), the bare-metal
interpreter's config key, the prefix of its image keys, the benchmark's arguments that only it takes,
the import check a node runs before any job, and the distributions its provenance hash starts from.
Code that would spell a framework's name iterates over FRAMEWORKS or asks `framework(name)` instead.

Adding a framework: a harness module the ranks run (like torchbench.py), one entry here, its name in
the config schema's benchmark.frameworks enum, and a flavour of containers/Dockerfile (its lock).
This module imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def _no_extra_args(spec, bench: dict) -> list[str]:
    return []


@dataclass(frozen=True)
class Framework:
    name: str  # as the config, the run ids and the records spell it
    label: str  # as tables and the report print it
    harness: str  # the module a training rank runs (python -m ...)
    modes: tuple[str, ...]  # every mode it can train in; default_mode first
    select_modes: Callable  # benchmark.modes -> the modes it trains in (the schema's modes are TensorFlow's)
    default_mode: str  # what run ids and performance variables leave out
    planned_settings: tuple[str, ...]  # benchmark settings copied into a train plan's spec
    bare_metal_key: str  # bare_metal.<key>: the interpreter its bare-metal ranks run
    env: str | None  # its BENCH_ENVS entry; None: the config's benchmark_env (cpu or gpu)
    image_key_prefix: str  # images.<runtime>.<prefix>image / <prefix>native_image
    venv_side: str  # scripts/setup-venv.sh's name for its venv
    import_check: str  # what a node's interpreter must import before any job is submitted
    provenance_roots: tuple[str, ...]  # installed distributions its provenance hash walks from
    version_distributions: tuple[tuple[str, str], ...]  # (label, distribution) the report shows
    # The benchmark's arguments only this framework's harness takes: (RunSpec, config["benchmark"]) -> argv tail.
    extra_args: Callable = field(default=_no_extra_args, compare=False, repr=False)

    def image_key(self, mpi_model: str) -> str:
        """The key of images.<runtime> naming the image a run of this framework and MPI model runs."""
        return self.image_key_prefix + ("native_image" if mpi_model == "native" else "image")


def _every_mode_asked(asked) -> list[str]:
    return list(asked)


def _ddp_and_local_if_asked(asked) -> list[str]:
    # DistributedDataParallel is PyTorch's counterpart of every distributed mode asked; alone (local) when asked.
    return ["ddp", *(["local"] if "local" in asked else [])]


def _tensorflow_args(spec, bench: dict) -> list[str]:
    if spec.mode == "collective":
        return ["--collective", bench["collective_implementation"]]
    if spec.mode == "parameter_server":
        return ["--parameter-servers", str(bench["parameter_servers"])]
    return []


def _pytorch_args(spec, bench: dict) -> list[str]:
    return ["--backend", bench["torch_backend"], *(["--compile"] if bench["torch_compile"] else [])]


TENSORFLOW = Framework(
    name="tensorflow", label="TensorFlow", harness="containerbench.bench",
    modes=("horovod", "collective", "parameter_server", "local"), select_modes=_every_mode_asked,
    default_mode="horovod",
    planned_settings=("model", "image_size", "precision", "xla", "data_format", "warmup_steps", "steps"),
    bare_metal_key="python", env=None, image_key_prefix="", venv_side="bench",
    import_check="import containerbench.provenance, mpi4py, horovod, tensorflow",
    provenance_roots=("tensorflow", "tensorflow-cpu", "horovod"),
    version_distributions=(("TensorFlow", "tensorflow"), ("Horovod", "horovod")),
    extra_args=_tensorflow_args,
)
PYTORCH = Framework(
    name="pytorch", label="PyTorch", harness="containerbench.torchbench",
    modes=("ddp", "local"), select_modes=_ddp_and_local_if_asked, default_mode="ddp",
    planned_settings=("model", "image_size", "precision", "data_format", "warmup_steps", "steps", "torch_compile"),
    bare_metal_key="torch_python", env="torch", image_key_prefix="torch_", venv_side="bench-torch",
    import_check="import containerbench.provenance, mpi4py, torch",
    provenance_roots=("torch", "torchvision", "tfrecord", "pillow"),
    version_distributions=(("PyTorch", "torch"), ("torchvision", "torchvision")),
    extra_args=_pytorch_args,
)

FRAMEWORKS: dict[str, Framework] = {each.name: each for each in (TENSORFLOW, PYTORCH)}
# Run ids, plans and records leave the default framework's name out (they had no framework before PyTorch).
DEFAULT_FRAMEWORK = TENSORFLOW.name


def framework(name: str | None) -> Framework:
    """The framework called `name`; None (an older record, a netbench run) is the default one."""
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]
