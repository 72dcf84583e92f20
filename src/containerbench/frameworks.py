"""The frameworks a sweep trains with: one frozen record each, in one registry (FRAMEWORKS).

Everything the workflow side knows of a framework is here: the harness module its ranks run, its
modes, the benchmark settings a plan copies and the arguments only its harness takes, its environment
(BENCH_ENVS entry, setup-venv.sh side), the bare-metal interpreter's config key, the prefix of its
image keys, the import check a node runs before any job, what the report shows of it, and the
distributions its provenance hash starts from. Code that would spell a framework's name iterates over
FRAMEWORKS or asks `framework(name)` instead (tests/test_concepts.py checks it).

Adding a framework (docs/developing.md): a harness module the ranks run (like torchbench.py), one
entry here, its name in the config schema's benchmark.frameworks enum, and a flavour of
containers/Dockerfile (its lock and config.BENCH_ENVS entry). This module imports nothing of the
package: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

LOCAL = "local"  # the mode with no gradient exchange (distribution.LOCAL), which every framework may have
# TensorFlow's ParameterServerStrategy in synchronous rounds, and with every worker at its own pace
# (rank/parameterservers.py): the first is the second's baseline in the modes table.
PARAMETER_SERVER_MODES = ("parameter_server", "parameter_server_async")
SYNCHRONOUS_OF = {"parameter_server_async": "parameter_server"}  # a mode without waits -> the same in rounds


def _nothing(*_) -> list[str]:
    return []


def _no_problem(config: dict) -> str | None:
    return None


@dataclass(frozen=True)
class Framework:
    name: str  # as the config, the run ids and the records spell it
    label: str  # as the report and messages print it
    short_label: str  # in the report's narrow column headings
    harness: str  # the module a training rank runs (python -m ...)
    modes: tuple[str, ...]  # every mode it can train in
    default_mode: str  # its data-parallel baseline: what run ids and performance variables leave out
    planned_settings: tuple[str, ...]  # benchmark settings copied into a train plan's spec
    bare_metal_key: str  # bare_metal.<key>: the interpreter its bare-metal ranks run
    env: str | None  # its config.BENCH_ENVS entry; None: the config's benchmark_env (cpu or gpu)
    image_key_prefix: str  # images.<runtime>.<prefix>image / <prefix>native_image
    venv_side: str  # scripts/setup-venv.sh's name for its venv
    import_check: str  # what a node's interpreter must import before any job is submitted
    preflight_option: str  # how `containerbench preflight` is given its bare-metal interpreter
    provenance_roots: tuple[str, ...]  # installed distributions its provenance hash walks from, its own first
    reported_versions: tuple[tuple[str, str], ...]  # (label, key of the result's versions) the report shows
    # The module whose MODELS it can train; None: every model the schema allows.
    models_module: str | None = None
    # benchmark.modes -> the modes it trains in (the schema's modes are the default framework's).
    select_modes: Callable[[list[str]], list[str]] = field(default=list, compare=False, repr=False)
    # What it cannot run under a valid config: config -> one line (ConfigError's), or None.
    check: Callable[[dict], str | None] = field(default=_no_problem, compare=False, repr=False)
    # Its harness's own arguments: (RunSpec, config["benchmark"]) -> those of the mode, before the data's,
    # and config["benchmark"] -> those of its settings, after them.
    mode_args: Callable = field(default=_nothing, compare=False, repr=False)
    setting_args: Callable = field(default=_nothing, compare=False, repr=False)
    # netbench's own arguments for its sweeps: config -> argv words (its collectives beside MPI's).
    netbench_args: Callable[[dict], list[str]] = field(default=_nothing, compare=False, repr=False)

    def image_key(self, mpi_model: str) -> str:
        """The key of images.<runtime> naming the image a run of this framework and MPI model runs."""
        return self.image_key_prefix + ("native_image" if mpi_model == "native" else "image")

    @property
    def python_key(self) -> str:
        """Where `containerbench preflight` keeps its interpreter (argparse's dest of preflight_option)."""
        return self.preflight_option.removeprefix("--").replace("-", "_")


def _tensorflow_mode_args(spec, bench: dict) -> list[str]:
    if spec.mode == "collective":
        return ["--collective", bench["collective_implementation"]]
    if spec.mode in PARAMETER_SERVER_MODES:
        return ["--parameter-servers", str(bench["parameter_servers"])]
    return []


def _ddp_and_local_if_asked(asked) -> list[str]:
    # DistributedDataParallel is PyTorch's counterpart of every distributed mode asked; alone (local) when asked.
    return ["ddp", *([LOCAL] if LOCAL in asked else [])]


def _torch_backend_check(config: dict) -> str | None:
    if config["benchmark"]["torch_backend"] == "nccl" and config["slurm"]["gpus_per_node"] == 0:
        return ("config: 'benchmark.torch_backend' = nccl needs GPUs, but slurm.gpus_per_node is 0; "
                "allowed: auto or gloo, or slurm.gpus_per_node > 0")
    return None


def _pytorch_setting_args(bench: dict) -> list[str]:
    return ["--backend", bench["torch_backend"], *(["--compile"] if bench["torch_compile"] else [])]


def _pytorch_netbench_args(config: dict) -> list[str]:
    return ["--backend", "torch-" + config["benchmark"]["torch_backend"],
            *(["--nccl-ring"] if config["netbench"]["nccl_ring"] else [])]


TENSORFLOW = Framework(
    name="tensorflow", label="TensorFlow", short_label="TF", harness="containerbench.rank.bench",
    modes=("horovod", "collective", *PARAMETER_SERVER_MODES, LOCAL), default_mode="horovod",
    planned_settings=("model", "image_size", "precision", "xla", "data_format", "warmup_steps", "steps"),
    bare_metal_key="python", env=None, image_key_prefix="", venv_side="bench",
    import_check="import containerbench.rank.provenance, mpi4py, horovod, tensorflow",
    preflight_option="--bench-python",
    provenance_roots=("tensorflow", "tensorflow-cpu", "horovod"),
    reported_versions=(("TensorFlow", "tensorflow"), ("Horovod", "horovod")),
    mode_args=_tensorflow_mode_args, setting_args=lambda bench: ["--xla"] if bench["xla"] else [],
)
PYTORCH = Framework(
    name="pytorch", label="PyTorch", short_label="PyTorch", harness="containerbench.rank.torchbench",
    modes=("ddp", LOCAL), default_mode="ddp",
    planned_settings=("model", "image_size", "precision", "data_format", "warmup_steps", "steps", "torch_compile"),
    bare_metal_key="torch_python", env="torch", image_key_prefix="torch_", venv_side="bench-torch",
    import_check="import containerbench.rank.provenance, mpi4py, torch", preflight_option="--torch-python",
    provenance_roots=("torch", "torchvision", "tfrecord", "pillow"),
    reported_versions=(("PyTorch", "torch"), ("torchvision", "torchvision")),
    models_module="containerbench.rank.torchmodels", select_modes=_ddp_and_local_if_asked, check=_torch_backend_check,
    setting_args=_pytorch_setting_args, netbench_args=_pytorch_netbench_args,
)

FRAMEWORKS: dict[str, Framework] = {each.name: each for each in (TENSORFLOW, PYTORCH)}
# Run ids, plans and records leave the default framework's name out (they had no framework before PyTorch),
# and the frameworks table sets each other framework beside it.
DEFAULT_FRAMEWORK = TENSORFLOW.name


def framework(name: str | None) -> Framework:
    """The framework called `name`; None (an older record, a netbench run) is the default one."""
    return FRAMEWORKS[name or DEFAULT_FRAMEWORK]
