"""Running commands that start process trees (container engines, snakemake, mpirun), and making
sure none outlives what it belongs to: its session stopped whole, a launched run tied to its
launcher's life (die_with_parent) and to the workflow controller's (watch_controller)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Set by the workflow's controller (workflow/rules/common.smk) for its jobs: which process they
# belong to, as identity() writes it.
CONTROLLER_VARIABLE = "CONTAINERBENCH_CONTROLLER"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_group(argv: list[str], *, timeout: float, capture: bool = True, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout or an interruption the whole session
    is killed, so no helper outlives the command. Raises subprocess.TimeoutExpired as
    subprocess.run does."""
    pipe = subprocess.PIPE if capture else None
    process = subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, start_new_session=True, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, Ctrl-C, a signal from snakemake or pytest-timeout
        kill_session(process.pid)
        process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (the state) on; None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks after boot): with the pid, its identity, as a pid is reused."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def ended(pid: int) -> bool:
    """Is there no process `pid` on this host? One this user may not signal or see (another user's, under a /proc
    mounted hidepid) is there."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def running(pid: int, ticks: int) -> bool:
    """Is the process that started at `ticks` still there (and not a zombie waiting for its parent)?"""
    fields = _stat(pid)
    return bool(fields) and int(fields[19]) == ticks and fields[0] not in "ZX"


def _live_processes():
    """(pid, stat fields from the state on) of every process on this host that has not exited."""
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields and fields[0] not in "ZX":
            yield int(entry.name), fields


def session_members(session: int) -> list[int]:
    """Every live process of a session; its leader's id stays the session's after the leader exits."""
    return [pid for pid, fields in _live_processes() if int(fields[3]) == session]


def _signal_all(pids, signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_session(leader: int) -> None:
    """SIGKILL every process of the session `leader` started (start_new_session=True). Its group is
    not enough: Open MPI puts each rank in a process group of its own, in mpirun's session. Only
    processes still in the session are signalled, never an id that may have been reused."""
    for _ in range(3):  # a process forked while the previous pass signalled
        members = session_members(leader)
        if not members:
            return
        _signal_all(members, signal.SIGKILL)
        time.sleep(0.05)


def stop_session(leader: int, grace_s: float = 5.0) -> None:
    """SIGTERM the session, so that mpirun, srun and the engines take their ranks and containers
    down themselves; SIGKILL whatever is left after `grace_s`."""
    _signal_all(session_members(leader), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_members(leader) and time.monotonic() < deadline:
        time.sleep(0.1)
    kill_session(leader)


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A Popen preexec_fn: the child gets `signum` when the process that started it dies, even by
    SIGKILL, which leaves that process no chance to stop anything itself. SIGTERM, not SIGKILL, so
    that mpirun stops its ranks (a SIGKILLed mpirun leaves them running). The kernel sends it when
    the parent *thread* ends: call Popen from the thread that waits for the child."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing but the call after fork
    parent = os.getpid()

    def arm() -> None:
        if prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm


def _pid_namespace() -> str:
    return str(os.stat("/proc/self/ns/pid").st_ino)


def identity(pid: int) -> str:
    """host:pid-namespace:pid:start-ticks, a process named so that no other can be taken for it."""
    return f"{socket.gethostname()}:{_pid_namespace()}:{pid}:{start_ticks(pid)}"


def checkable(named: str) -> tuple[int, int] | None:
    """(pid, start ticks) of the process identity() named, when it can be checked from here; None
    when it runs on another host (a Slurm job's node) or in another pid namespace."""
    host, namespace, pid, ticks = (named.rsplit(":", 3) + ["", "", "", ""])[:4]
    if host != socket.gethostname() or namespace != _pid_namespace() or not (pid.isdigit() and ticks.isdigit()):
        return None
    return int(pid), int(ticks)


def watch_controller(on_gone: Callable[[str], None], interval_s: float = 1.0) -> threading.Event | None:
    """From a daemon thread, call on_gone(what) once the workflow controller named in the environment
    has gone; return the Event that ends the watch, or None when there is nothing to watch here."""
    named = os.environ.get(CONTROLLER_VARIABLE, "")
    controller = checkable(named)
    if controller is None:
        return None
    done = threading.Event()

    def watch() -> None:
        while not done.wait(interval_s):
            if not running(*controller):
                on_gone(f"workflow controller {controller[0]} on {socket.gethostname()} gone")
                return

    threading.Thread(target=watch, name="controller-watch", daemon=True).start()
    return done


# Snakemake's lock files (.snakemake/locks/<n>.input.lock, <n>.output.lock) name files, not the
# process that holds them: this record beside them does, so that a lock left by a killed controller
# can be told from a live one. One controller per directory, as Snakemake's own unlock assumes (a
# controller that ends removes the whole lock directory, other controllers' locks included).
LOCK_OWNER = "containerbench-controller"


def record_lock_owner(lock_dir: Path) -> None:
    """Write the identity of this controller (CONTROLLER_VARIABLE) beside the locks it holds;
    Snakemake removes the directory, this record with it, when the controller ends normally."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    (lock_dir / LOCK_OWNER).write_text(os.environ[CONTROLLER_VARIABLE] + "\n")


def held_by_another(lock_dir: Path) -> str | None:
    """The one line that refuses a second controller in this directory while the first runs here (its
    identity recorded beside the locks, record_lock_owner); None when there is none, or it is elsewhere."""
    try:
        named = (lock_dir / LOCK_OWNER).read_text().strip()
    except OSError:
        return None
    owner = checkable(named)
    if owner is None or not running(*owner) or owner[0] == os.getpid():
        return None
    return (f"containerbench: workflow controller {owner[0]} is running in this directory; allowed: one at a time "
            f"(wait for it to end, or stop it: kill {owner[0]})")


def processes_of(named: str) -> list[int]:
    """Live processes on this host that carry controller identity `named` in their environment: the
    jobs of that controller, which stop themselves within seconds once it is gone (execution.execute)."""
    wanted = f"{CONTROLLER_VARIABLE}={named}".encode()

    def carries_it(pid: int) -> bool:
        try:
            return wanted in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or another user's
            return False

    return [pid for pid, _ in _live_processes() if carries_it(pid)]


def slurm_jobs_from(directory: Path, timeout: float = 30.0) -> list[str] | None:
    """Ids of this user's Slurm jobs pending or running with `directory` as their working directory
    (Snakemake's Slurm executor submits from there), but the allocation this runs in; None when
    squeue cannot say."""
    try:
        listed = run_group(["squeue", "--me", "--noheader", "--format=%i|%Z"], timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    here = directory.resolve()
    inside = os.environ.get("SLURM_JOB_ID")
    return [job for job, _, workdir in (line.strip().partition("|") for line in listed.stdout.splitlines())
            if workdir and Path(workdir).resolve() == here and job != inside]


def remove_stale_lock(lock_dir: Path, slurm: bool = False, wait_s: float = 30.0) -> str | None:
    """Remove the locks of a controller that is gone (on this host: one elsewhere cannot be checked),
    as `snakemake --unlock` would; say so in one line, or return None when there is none. Lock files
    newer than the owner's record belong to a controller that started since, and stay.

    The lock stays, and the line says why, while the dead controller's runs still go: its local jobs
    (waited for up to `wait_s`: they stop within seconds) or, with `slurm`, its Slurm jobs, which run
    on their nodes whatever happens here and would measure beside a rerun of the same run ids."""
    record = lock_dir / LOCK_OWNER
    try:
        named, recorded = record.read_text().strip(), record.stat().st_mtime
    except OSError:
        return None
    owner = checkable(named)
    if owner is None or running(*owner):
        return None
    deadline = time.monotonic() + wait_s
    while (left := processes_of(named)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        return (f"containerbench: the lock of workflow controller {owner[0]} (gone) stays: its runs "
                f"(pids {' '.join(map(str, left))}) are still stopping; run again when they have")
    if slurm:
        jobs = slurm_jobs_from(Path.cwd())
        if jobs is None:
            return (f"containerbench: the lock of workflow controller {owner[0]} (gone) stays: squeue cannot "
                    f"say whether its Slurm jobs still run; check, then `snakemake --unlock`")
        if jobs:
            return (f"containerbench: the lock of workflow controller {owner[0]} (gone) stays: its Slurm jobs "
                    f"{' '.join(jobs)} still run from this directory; `scancel {' '.join(jobs)}`, then run again")
    for lock in lock_dir.glob("*.lock"):
        if lock.stat().st_mtime <= recorded:
            lock.unlink()
    record.unlink()
    return (f"containerbench: removed the lock of workflow controller {owner[0]}, which is gone "
            f"(killed?); finished runs are kept, unfinished ones run again")
