"""The reference every container is compared with: the venv's Python on the host."""

from __future__ import annotations

from containerbench.runtimes.base import RunRequest, Runtime


class BareMetal(Runtime):
    """The reference every container is compared with: the venv's Python on the host."""

    name = "bare-metal"
    default_mpi_model = "host"  # the venv's mpi4py and Horovod with the host's MPI: no container to swap it into

    def __init__(self, python: str, **settings):
        super().__init__(**settings)
        self.python = python

    def rank_argv(self, request: RunRequest) -> list[str]:
        return [self.python, "-m", request.module, *request.args]

