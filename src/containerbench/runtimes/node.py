"""What a runtime takes from the node its ranks run on, or asks of it: the host's MPI that the native model
swaps in, and the requirements the pre-flight check asks each node (preflight.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NativeMpi:
    """The native MPI model: the image's MPICH-ABI libmpi is replaced at run time by the host's.
    `library` is the host's (on every node, at this path), `image_library` the file in the image it
    replaces; the rank loads the host's under the image's file name, which LD_LIBRARY_PATH finds
    for every later library that links libmpi.so.12 (the host's file has its own soname, e.g.
    Debian's libmpich.so.12). `library_dirs`: the host's directories that hold what the library loads
    (its fabric library, UCX, hwloc, a vendor PMI), bound into the container and put on LD_LIBRARY_PATH,
    so every one of them is the host's (hostmpi.py checks it on each node)."""

    library: str = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"
    image_library: str = "/opt/containerbench/venv/lib/libmpi.so.12"
    library_dirs: tuple[str, ...] = ()

    @property
    def bind(self) -> tuple[str, str]:
        return self.library, self.image_library

    def library_path(self, targets: list[str] | tuple[str, ...] | None = None) -> str:
        """LD_LIBRARY_PATH in the container: the host's directories where they are bound (`targets`; default: at
        their own paths), first, so that none of the closure resolves to the image's venv; then the image library's
        directory, where the host's library is bound."""
        bound = self.library_dirs if targets is None else targets
        return os.pathsep.join([*bound, os.path.dirname(self.image_library)])

    @property
    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": self.library_path()}


@dataclass(frozen=True)
class NodeRequirement:
    """What a runtime needs on every node its ranks run on, asked there by the pre-flight check (preflight.py),
    not where the workflow plans: a command that must succeed, the lowest version its output may name, a word
    its output must hold, or files of which one must exist. `source`: the documentation that sets it."""

    runtime: str
    what: str  # e.g. "Sarus 1.4.0 or later"
    argv: tuple[str, ...] = ()
    at_least: str | None = None  # the first version number in the command's output must be this or later
    holds: str | None = None  # a word the command's output must hold (an option in its --help)
    paths: tuple[str, ...] = ()  # one of these must exist (glob patterns)
    source: str = ""

    @classmethod
    def from_json(cls, data: dict) -> NodeRequirement:
        """One from its JSON (dataclasses.asdict's, as the pre-flight command line carries it)."""
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in data.items()})
