"""Running commands that start process trees (container engines, snakemake, mpirun)."""

from __future__ import annotations

import os
import signal
import subprocess


def run_group(argv: list[str], *, timeout: float, capture: bool = True, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own: on a timeout or an interruption the whole
    group is killed, so no helper outlives the command. Raises subprocess.TimeoutExpired as
    subprocess.run does."""
    pipe = subprocess.PIPE if capture else None
    process = subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, Ctrl-C, a signal from snakemake or pytest-timeout
        kill_group(process.pid)
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`, if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
