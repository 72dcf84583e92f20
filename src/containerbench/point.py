"""A sweep point: what every repetition of a run has in common, and each name the package gives it.

One value, one spelling of each name: the point id and a repetition's run id (file names, Snakemake
wildcards, the rounds of `repetitions: auto`), and back from them; the columns the tables group a
point's runs by; validate's performance variable. Names leave out what is the default (TensorFlow in
its default mode, synthetic data, the hybrid MPI model, no pinned nodes): each part came into the
names after the runs recorded before it, so their names stay as they were, and parsing a name fills
the defaults back in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from containerbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, framework

DATA = ("synthetic", "real")
MPI_MODELS = ("hybrid", "native")
KINDS = ("train", "netbench")
NATIVE_LABEL = " (native)"  # after a runtime's name in the tables, for its native-model runs

_REPETITION = "_rep"
_PINNED = "_on_"
# kind_runtime_fabric_NxM: runtimes and fabric names have no underscore (the config schema).
_HEAD = re.compile(r"(?P<kind>[a-z]+)_(?P<runtime>[^_]+)_(?P<fabric>[^_]+)_(?P<nodes>\d+)x(?P<per_node>\d+)"
                   r"(?:_b(?P<batch_size>\d+))?")


def variant_parts(framework_name: str, mode: str, data: str) -> list[str]:
    """What sets a training point apart from the default benchmark (TensorFlow in its default mode,
    synthetic data), in the order run ids and performance variables name it."""
    return [value for value, default in ((framework_name, DEFAULT_FRAMEWORK), (mode, default_mode(framework_name)),
                                         (data, DATA[0])) if value != default]


def default_mode(framework_name: str) -> str:
    """The framework's data-parallel baseline: the mode a point of it runs when nothing else is asked."""
    return framework(framework_name).default_mode


def runtime_label(runtime: str, mpi_model: str | None) -> str:
    """How tables name a runtime: a native-model run beside the same runtime's hybrid one."""
    return f"{runtime}{NATIVE_LABEL}" if mpi_model == "native" else runtime


def _given(value, default):
    """A table's value, or the default where the record predates its column (None, or NaN in a table)."""
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


@dataclass(frozen=True)
class Point:
    """A sweep point: the runs that differ only in their repetition."""

    kind: str  # "train" or "netbench"
    runtime: str
    fabric: str
    nodes: int
    ranks_per_node: int
    batch_size: int | None = None  # of a train point
    framework: str = DEFAULT_FRAMEWORK
    mode: str = ""  # "": the framework's default (default_mode)
    data: str = DATA[0]
    mpi_model: str = MPI_MODELS[0]  # of a container runtime: its image's MPI, or the host's swapped in
    nodelist: tuple[str, ...] = ()  # pinned to these nodes (fleet validation)

    # The tables' columns of a point, in their order: a table's point also names the benchmark trained
    # (model, image size, precision), its runtime with its MPI model (runtime_label) and its ranks.
    COLUMNS: ClassVar[tuple[str, ...]] = ("framework", "model", "image_size", "precision", "mode", "data", "runtime",
                                          "fabric", "nodes", "ranks", "batch_size")
    # The telemetry table's, for a run of either kind: the spec's own fields (the runtime without its model).
    TELEMETRY_COLUMNS: ClassVar[tuple[str, ...]] = ("run_id", "kind", "runtime", "mode", "fabric", "nodes", "ranks",
                                                    "repetition")

    def __post_init__(self):
        object.__setattr__(self, "mode", self.mode or default_mode(self.framework))

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def id(self) -> str:
        """The point id, e.g. train_podman_ib_2x4_b32_pytorch_real_native_on_n1+n2."""
        batch = f"_b{self.batch_size}" if self.batch_size else ""
        model = [self.mpi_model] if self.mpi_model != MPI_MODELS[0] else []
        variant = "".join(f"_{value}" for value in (*variant_parts(self.framework, self.mode, self.data), *model))
        pinned = f"{_PINNED}{'+'.join(self.nodelist)}" if self.nodelist else ""  # a fleet's node or link
        return f"{self.kind}_{self.runtime}_{self.fabric}_{self.nodes}x{self.ranks_per_node}{batch}{variant}{pinned}"

    def run_id(self, repetition: int) -> str:
        return self.run_id_of(self.id, repetition)

    def variable(self, model: str, image_size: int, precision: str) -> str:
        """A training point's performance variable (validate), without its metric: a framework, mode or data
        other than the default is named after the precision, as in the run ids, and the MPI model in the
        runtime's label (as the tables name it); the default's names are as they always were, so that a
        site's references keep matching."""
        variant = "".join(f"-{value}" for value in variant_parts(self.framework, self.mode, self.data))
        return (f"train/{model}-{int(image_size)}px-{precision}{variant}/{runtime_label(self.runtime, self.mpi_model)}/"
                f"{self.fabric}/{self.nodes}x{self.ranks_per_node}/b{int(self.batch_size)}")

    @classmethod
    def columns(cls, *without: str) -> list[str]:
        """The tables' columns of a point, in order, less `without` (what a comparison sets side by side)."""
        return [column for column in cls.COLUMNS if column not in without]

    @classmethod
    def run_columns(cls) -> list[str]:
        """A run's columns in a long table (the losses): its id, its point's, its repetition."""
        return ["run_id", *cls.COLUMNS, "repetition"]

    @staticmethod
    def run_id_of(point_id: str, repetition: int) -> str:
        return f"{point_id}{_REPETITION}{repetition}"

    @staticmethod
    def id_of(run_id: str) -> str:
        """A run's point id: its id without the repetition (any name, not only one that parses)."""
        return run_id.rsplit(_REPETITION, 1)[0]

    @staticmethod
    def run_id_pattern(repetition: int | str = r"\d+") -> str:
        """The run ids' shape as a regular expression (Snakemake's wildcard constraints), of one repetition or any."""
        return rf"({'|'.join(KINDS)})_[^/]+{_REPETITION}{repetition}"

    @classmethod
    def parse_run_id(cls, run_id: str) -> tuple[Point, int]:
        """The point and the repetition a run id names; ValueError for a name no RunSpec gives."""
        point_id, _, repetition = run_id.rpartition(_REPETITION)
        if not point_id or not repetition.isdigit():
            raise ValueError(f"{run_id!r} is not a run id: it does not end in {_REPETITION}<repetition>")
        return cls.parse(point_id), int(repetition)

    @classmethod
    def parse(cls, point_id: str) -> Point:
        """The point a point id names, the defaults its name leaves out filled in; ValueError if none does."""
        name, _, pinned = point_id.partition(_PINNED)
        head = _HEAD.match(name)
        if not head or head["kind"] not in KINDS:
            raise ValueError(f"{point_id!r} is not a point id: expected kind_runtime_fabric_NxM[_b<batch>]...")
        fields = {"nodelist": tuple(pinned.split("+")) if pinned else (), **cls._variant(name[head.end():], point_id)}
        point = cls(head["kind"], head["runtime"], head["fabric"], int(head["nodes"]), int(head["per_node"]),
                    int(head["batch_size"]) if head["batch_size"] else None, **fields)
        if point.id != point_id:  # a default spelled out, or the parts out of order: no RunSpec names it so
            raise ValueError(f"{point_id!r} is not a point id as runs are named: that point is {point.id!r}")
        return point

    @staticmethod
    def _variant(tail: str, point_id: str) -> dict:
        """framework, mode, data and MPI model from what follows the shape and batch, e.g. _pytorch_local_real:
        the mode is what the known framework, data and MPI model names leave (parameter_server has an underscore)."""
        words = tail.split("_")[1:] if tail.startswith("_") else ([] if not tail else None)
        if words is None:
            raise ValueError(f"{point_id!r} is not a point id: {tail!r} after its shape")
        framework_name = words.pop(0) if words and words[0] in FRAMEWORKS else DEFAULT_FRAMEWORK
        mpi_model = words.pop() if words and words[-1] in MPI_MODELS else MPI_MODELS[0]
        data = words.pop() if words and words[-1] in DATA else DATA[0]
        if set(words) & {*FRAMEWORKS, *DATA, *MPI_MODELS}:
            raise ValueError(f"{point_id!r} is not a point id: framework, mode, data and MPI model out of order")
        return {"framework": framework_name, "mode": "_".join(words), "data": data, "mpi_model": mpi_model}

    @classmethod
    def from_row(cls, row) -> Point:
        """The training point of a table's row (the runs or the summary table: an itertuples row); a column
        a record predates (None, or NaN) is its default. The runtime column is runtime_label's."""
        framework_name = _given(getattr(row, "framework", None), DEFAULT_FRAMEWORK)
        nodes = int(row.nodes)  # columns turn float when a failed run has gaps
        return cls("train", str(row.runtime).removesuffix(NATIVE_LABEL), row.fabric, nodes, int(row.ranks) // nodes,
                   int(row.batch_size), framework_name,
                   _given(getattr(row, "mode", None), default_mode(framework_name)),
                   _given(getattr(row, "data", None), DATA[0]),
                   "native" if str(row.runtime).endswith(NATIVE_LABEL) else MPI_MODELS[0])
