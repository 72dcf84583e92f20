"""The files the workflow writes for people and later steps to read: each appears whole or not at all.

A controller killed at any moment (SIGKILL: nothing of it runs after) must never leave a truncated
record, table, verdict or report where a reader finds it. So each is written under a hidden name
beside its final one and renamed over it: rename(2) replaces a name in one step within a file
system, and what a kill leaves half written is a `.NAME.PID.partial` no reader looks for. The
results store is SQLite, whose transactions do the same for it (history.py).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARTIAL = ".partial"


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A path to write `path`'s new content to; on leaving the block it takes `path`'s name, whole.
    On an error the old file stays as it was and the partial one is removed."""
    final = Path(path)
    partial = final.with_name(f".{final.name}.{os.getpid()}{PARTIAL}")
    _remove_left_behind(final)
    try:
        yield partial
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)


def _remove_left_behind(final: Path) -> None:
    """The partial files of `final` that killed writers left (their process is gone)."""
    for left in final.parent.glob(f".{glob.escape(final.name)}.*{PARTIAL}"):
        pid = left.name.removeprefix(f".{final.name}.").removesuffix(PARTIAL)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            left.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with replacing(path) as partial:
        partial.write_text(text)
