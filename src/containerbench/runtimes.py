"""Container runtimes: each turns a rank's run request into an argv and environment.

One small class per runtime (the shape of ReFrame's containers.py). A runtime
only knows how to start ONE rank; the launcher (launch.py) puts mpirun or srun
in front, so `srun --mpi=pmix <runtime argv> python -m containerbench.bench`
composes for every runtime the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunRequest:
    """What one rank must run, independent of where it runs."""

    module: str  # e.g. "containerbench.bench"
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # fabric and benchmark variables for the rank
    workdir: str = "."
    gpus: bool = False


class Runtime:
    """Base class: the argv that starts one rank, and the variables it needs."""

    name = ""

    def rank_argv(self, request: RunRequest) -> list[str]:
        raise NotImplementedError

    def environment(self, request: RunRequest) -> dict[str, str]:
        return {"CONTAINERBENCH_RUNTIME": self.name, **request.env}


class BareMetal(Runtime):
    """The reference every container is compared with: the venv's Python on the host."""

    name = "bare-metal"

    def __init__(self, python: str):
        self.python = python

    def rank_argv(self, request: RunRequest) -> list[str]:
        return [self.python, "-m", request.module, *request.args]


def runtime_for(name: str, config: dict) -> Runtime:
    if name == "bare-metal":
        return BareMetal(config["bare_metal"]["python"])
    raise ValueError(f"runtime {name!r} is not supported; allowed: bare-metal")
