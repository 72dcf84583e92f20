"""The disk the suite leaves free, sampled while it runs: a CI machine has the disk it has, and a
suite that runs out of it fails everywhere at once (tmp_path itself cannot be made), so the summary
says how low free space went and during which test, and the container tests refuse to start, in one
line, where there is clearly not enough."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9


@dataclass
class Filesystem:
    path: str
    start_free: float
    lowest_free: float
    lowest_during: str = "the start"


@dataclass
class DiskWatch:
    """Free space of each file system the suite writes to (the clone, the temporary directory,
    podman's store), sampled every `interval_s` seconds in a daemon thread."""
    paths: list[str]
    interval_s: float = 5.0
    current: str = "the start"
    filesystems: dict[int, Filesystem] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def for_suite(cls, root: Path) -> DiskWatch:
        return cls([str(root), tempfile.gettempdir(), "/var/lib/containers"])

    def start(self) -> None:
        self.sample()
        threading.Thread(target=self._run, name="diskwatch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        for path in self.paths:
            if not os.path.exists(path):
                continue
            device, free = os.stat(path).st_dev, shutil.disk_usage(path).free
            seen = self.filesystems.setdefault(device, Filesystem(path, free, free))
            if free < seen.lowest_free:
                seen.lowest_free, seen.lowest_during = free, self.current

    def free(self, path: str) -> float:
        return shutil.disk_usage(path).free

    def summary(self) -> list[str]:
        return [f"disk: {fs.path}: {fs.start_free / GB:.1f} GB free at the start, lowest "
                f"{fs.lowest_free / GB:.1f} GB (the suite used up to {(fs.start_free - fs.lowest_free) / GB:.1f} GB), "
                f"during {fs.lowest_during}" for fs in self.filesystems.values()]
