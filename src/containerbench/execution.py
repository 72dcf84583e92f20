"""Execution: each RunPlan run into its raw log, as its allocation strategy says, with its nodes'
telemetry collected around it.

The raw log is the single source of truth for a run. It starts with a launch marker line (the plan,
the exact argv and the variables given), holds everything the ranks printed, and ends with an exit
marker line (return code, wall time, timeout). Parsing (records.py) reads nothing else, so every
figure traces back to this file.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from containerbench import hostmpi, nodeimages, outputs, slurm
from containerbench.launchers import Allocation, Mpirun, Srun
from containerbench.plans import RunPlan
from containerbench.processes import die_with_parent, run_group, stop_session, watch_controller
from containerbench.rank import markers
from containerbench.rank.telemetry import library_mpi_version, rank_context
from containerbench.runtimes import host_environment


def run_plans(plans: list[RunPlan], logs: list, strategy: Allocation, command: list[str], *,
              salloc: list[str] | None = None, inside: bool = False, echo=sys.stdout, on_refused=None) -> int:
    """The runs `plans` into `logs`, one after another, as their allocation strategy says: the one
    place it is carried out. PER_RUN and PER_JOB ask salloc (`salloc`) for the allocation and run
    `containerbench COMMAND --in-allocation` in it, which comes back here with `inside`; NONE and STEP
    start the runs here. A failed run is a measured outcome, not an error of the workflow: 0 unless the
    command in the allocation failed. `refused(why)`: called where Slurm gave no allocation, or revoked it
    before the command ran."""
    if inside or (strategy is Allocation.PER_RUN and slurm.in_allocation()):
        # In an allocation already (salloc's, or a site's own session): the runs are steps of it. A run whose
        # runtime needs words on its own allocation (Shifter's image, read when the allocation is made) cannot
        # be a step of one made without them.
        kept_plans, kept_logs = [], []
        for run_plan, log in zip(plans, logs):
            if inside or not run_plan.allocation_options:
                kept_plans.append(run_plan), kept_logs.append(log)
                continue
            write_not_run(run_plan, log, {"not_run": (
                f"its runtime needs {shlex.join(run_plan.allocation_options)} on its own allocation (salloc), and it "
                f"was launched inside Slurm job {os.environ.get('SLURM_JOB_ID')}, made without them; allowed: "
                "launching it from outside any allocation")})
        return run_in_allocation(kept_plans, kept_logs, echo)
    if strategy.asks_salloc:  # an allocation of their own, with this process outside it
        return run_allocated_plans(plans, logs, salloc, command, on_refused)
    for run_plan, log in zip(plans, logs):
        returncode = measure(run_plan, Path(log), echo)
        if returncode != 0:
            print(f"containerbench: {run_plan.run_id} exited with {returncode}; kept as a failed run, "
                  f"see {log}", file=sys.stderr)
    return 0


def clear_telemetry(run_plan: RunPlan) -> None:
    """Before the run: an empty directory for the nodes' samplers (nothing left from a killed attempt)."""
    if run_plan.telemetry:
        directory = Path(run_plan.telemetry["dir"])
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)


def collect_telemetry(run_plan: RunPlan) -> Path | None:
    """After the run: the nodes' samples as one CSV (a host column added), the per-node files removed."""
    settings = run_plan.telemetry
    if not settings:
        return None
    directory, merged = Path(settings["dir"]), Path(settings["file"])
    with outputs.replacing(merged) as partial, open(partial, "w", newline="") as out:  # whole or not at all
        writer = csv.writer(out)
        writer.writerow(["time_unix", "host", "metric", "device", "value"])
        for node_file in sorted(directory.glob("*.csv")):
            with open(node_file, newline="") as samples:
                rows = csv.reader(samples)
                next(rows, None)  # the node file's header
                writer.writerows([row[0], node_file.stem, *row[1:]] for row in rows if len(row) == 4)
    shutil.rmtree(directory, ignore_errors=True)
    return merged


def measure(run_plan: RunPlan, log_path: Path, echo=sys.stdout, allocation: str | None = None) -> int:
    """One run as the workflow makes it: its raw log (execute) and its nodes' samples beside it.
    `allocation`: the Slurm job it runs in, from outside it (fleet jobs), asked after a failure."""
    clear_telemetry(run_plan)
    # Where the launch ran, for the ranks' own view to be compared with (records.judge_container).
    context = rank_context()
    if run_plan.native_mpi:  # what the ranks must report having loaded (records.judge_native_mpi)
        library = run_plan.native_mpi["library"]
        context["native_mpi"] = {"library": library, "version": library_mpi_version(library)}
    run_plan = dataclasses.replace(run_plan, launch_context=context)
    try:
        return execute(run_plan, log_path, echo, allocation)
    finally:
        collect_telemetry(run_plan)


def _final_argv(argv: list[str]) -> list[str]:
    """Adjustments that depend on where the plan runs, decided there (and logged)."""
    # Open MPI refuses root unless told; containers and CI commonly run as root.
    if argv and Path(argv[0]).name == Mpirun.program and os.geteuid() == 0 and "--allow-run-as-root" not in argv:
        return [argv[0], "--allow-run-as-root", *argv[1:]]
    # Inside a job step already (a one-rank Snakemake job runs in `srun -n1`), a
    # nested srun would wait forever for CPUs that step holds.
    if argv and Path(argv[0]).name == Srun.program and "SLURM_STEP_ID" in os.environ and "--overlap" not in argv:
        return [argv[0], "--overlap", *argv[1:]]
    return argv


# The node-image step's limit: the longest load (nodeimages.LOAD_TIMEOUT_S), and Slurm's time to start it.
PREPARE_TIMEOUT_S = nodeimages.LOAD_TIMEOUT_S + 300


def pinned_to(argv: list[str], answers: list[dict]) -> list[str]:
    """The ranks' srun pinned to the nodes the node-image step ran on (--nodelist): in an allocation of more
    nodes than the run's, two steps of N nodes each need not land on the same N."""
    nodes = [answer["slurm_node"] for answer in answers if answer.get("slurm_node")]
    if not nodes or not argv or Path(argv[0]).name != Srun.program or any(w.startswith("--nodelist") for w in argv):
        return argv
    return [argv[0], f"--nodelist={','.join(nodes)}", *argv[1:]]


class _NotStarted(Exception):
    """The run's ranks were not started: why, in one line."""


def node_answers(output: str, line: str) -> list[dict]:
    """Each node's answer in a per-node step's output (the lines starting with `line`, nodeimages.LINE or
    hostmpi.LINE), by host: whole, or put back together from its parts (emitted as rank/markers.py frames a long
    line: slurmstepd forwards a line over 1 kB in pieces, between other tasks' lines)."""
    return sorted((answer for answer in markers.payloads_of(output.splitlines(), line) if answer),
                  key=lambda answer: answer["host"])


def _each_node(argv: list[str], run_plan: RunPlan, line: str,
               command: str) -> tuple[list[dict], float, str, str | None]:
    """A per-node step of the plan (once on every node of the run): (each node's answer, its seconds, its output for
    the log, why it failed or None). Every node must answer: a node whose line is missing is as much a failure as
    one that said no."""
    argv, started = _final_argv(argv), time.monotonic()
    try:  # its own limit: a load is not part of the run, whose timeout_s may come from earlier runs' times
        done = run_group(argv, timeout=PREPARE_TIMEOUT_S, env={**host_environment(), **run_plan.env},
                         stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())  # noqa: PLW1509 (prctl only)
        output, returncode = (done.stdout or "") + (done.stderr or ""), done.returncode
    except FileNotFoundError:
        output, returncode = "", 127
    except subprocess.TimeoutExpired:
        output, returncode = "", None
    answers, seconds = node_answers(output, line), round(time.monotonic() - started, 3)
    nodes = run_plan.spec.get("nodes", 1)
    if returncode == 0 and len(answers) == nodes:
        return answers, seconds, output, None
    said = [line.removeprefix(f"containerbench: {command}: ") for line in output.splitlines()
            if line.startswith(f"containerbench: {command}: ")]
    return answers, seconds, output, ("; ".join(said) or (
        f"did not end within {PREPARE_TIMEOUT_S:g} s" if returncode is None else
        f"exit {returncode}, {len(answers)} of {nodes} node(s) answered"))


def prepare_nodes(run_plan: RunPlan) -> tuple[dict, str, str | None]:
    """Run the plan's per-node steps before its ranks: the image on every node (node_prepare; nodeimages), and for
    a native run the host MPI read on every node (node_mpi; hostmpi). (What the launch line keeps: each node's
    answers and the steps' seconds, the steps' output for the log, why one failed or None.)"""
    kept, output = {}, ""
    if run_plan.node_prepare:
        answers, seconds, said, failed = _each_node(run_plan.node_prepare, run_plan, nodeimages.LINE,
                                                    "node-image")
        kept, output = {"node_images": answers, "node_prepare_s": seconds}, said
        if failed:
            return kept, output, (f"the image is not on every node of the run "
                                  f"({shlex.join(_final_argv(run_plan.node_prepare)[:3])} ...): {failed}")
    if run_plan.node_mpi:
        answers, seconds, said, failed = _each_node(run_plan.node_mpi, run_plan, hostmpi.LINE, "node-mpi")
        kept, output = {**kept, "node_mpi": answers, "node_mpi_s": seconds}, output + said
        if failed:
            return kept, output, f"the host MPI cannot be what the ranks load on every node of the run: {failed}"
    return kept, output, None


def closure_names(prepared: dict) -> dict[str, str]:
    """The files of the nodes' host MPI closures, named to every rank, which reports where it mapped each from."""
    if "node_mpi" not in prepared:
        return {}
    return {hostmpi.NAMES_VARIABLE: ":".join(hostmpi.names(prepared["node_mpi"]))}


class RunAbandoned(SystemExit):
    """The workflow controller is gone, so no one will collect this run: `containerbench launch`
    ends with this line and a non-zero status (after measure's finally), and the run's output is
    left incomplete for the next invocation to run again (rerun-incomplete)."""


def execute(run_plan: RunPlan, log_path: Path, echo=sys.stdout, allocation: str | None = None) -> int:
    """Run the plan, copying its output to the log (and to `echo`); return its exit code.

    A failing benchmark is a result, not an error of the workflow: the log keeps
    the evidence and the parser marks the record failed. A run whose workflow
    controller is gone is stopped and raises RunAbandoned.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = _final_argv(run_plan.argv)
    # Before the run's clock starts: the image on every node (a load is not the runtime's start-up).
    prepared, prepare_output, prepare_failed = prepare_nodes(run_plan)
    argv = pinned_to(argv, prepared.get("node_images") or [])
    header = {**run_plan.as_dict(), "argv": argv, "host": socket.gethostname(), "started_unix": time.time(),
              **prepared}
    started = time.monotonic()
    timed_out, abandoned, guard, step_guard = threading.Event(), [], None, None
    with open(log_path, "w") as log:
        log.write(markers.line(markers.LAUNCH, header))
        log.write(prepare_output)
        log.flush()
        try:
            if prepare_failed:
                raise _NotStarted(prepare_failed)
            # Nothing of the run may outlive the workflow. Two guards, as each covers what the other
            # cannot: if this process is killed (SIGKILL: no finally runs), the kernel signals the run
            # (die_with_parent); if the controller is killed, this process lives on, orphaned with its
            # job's shell, and only the watch below notices. Popen from this thread, before any other
            # starts: the death signal follows the thread that forks, and preexec_fn is unsafe with threads.
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                env={**host_environment(), **run_plan.env, **closure_names(prepared)}, start_new_session=True,
                preexec_fn=die_with_parent(),  # noqa: PLW1509 (it only calls prctl, getppid, kill)
            )
        except _NotStarted as error:
            log.write(f"containerbench: {error}\n")
            returncode = 1
        except (OSError, subprocess.SubprocessError) as error:  # the latter: preexec_fn failed
            log.write(f"containerbench: cannot start {argv[0]!r}: {error}\n")
            returncode = 127
        else:
            guard, step_guard = ExitGuard(process, run_plan.exit_grace_s), StepGuard(process, run_plan.exit_grace_s)
            returncode = _follow(process, log, echo, run_plan.timeout_s, timed_out, abandoned, guard, step_guard)
            if guard.hung:
                log.write(f"containerbench: the run printed its result and had not exited "
                          f"{guard.hung['after_result_s']:.1f} s later: stopped (hung at exit)\n")
            if step_guard.stopped:
                log.write(f"containerbench: srun said a task had ended, and the step had not ended "
                          f"{step_guard.stopped['after_task_ended_s']:.1f} s later: stopped\n")
        if abandoned:
            log.write(f"containerbench: {abandoned[0]}: run abandoned\n")
        footer = {"returncode": returncode, "wall_s": round(time.monotonic() - started, 3),
                  "timed_out": timed_out.is_set(), "ended_unix": time.time()}
        if guard and guard.hung:
            footer["hung_at_exit"] = guard.hung
        if step_guard and step_guard.stopped:
            footer["step_stopped"] = step_guard.stopped
        # Ended from outside (scancel, time limit, node failure)? srun can exit 0 when the node under its
        # step failed ("srun: error: Node failure on n3", seen in the chaos sweep), so a run that left no
        # whole result asks Slurm too.
        if allocation and (returncode != 0 or guard is None or guard.result_at is None):
            ended = slurm.job_state(allocation)
            if ended:
                footer["slurm"] = ended
        log.write(markers.line(markers.EXIT, footer))
    if abandoned:
        raise RunAbandoned(f"containerbench: {run_plan.run_id}: {abandoned[0]}: run abandoned")
    return returncode


def write_not_run(run_plan: RunPlan, log_path: Path, why: dict) -> None:
    """The raw log of a run that never started: its launch line and an exit line saying why (`not_run`,
    and Slurm's word in `slurm` where there is one), so it becomes a failed record, not a missing one."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(log_path).write_text(
        markers.line(markers.LAUNCH, {**run_plan.as_dict(), "host": socket.gethostname(), "started_unix": time.time()})
        + markers.line(markers.EXIT, {"returncode": None, "wall_s": 0.0, "timed_out": False,
                                      "ended_unix": time.time(), **why}))


def run_in_allocation(plans: list[RunPlan], logs: list, echo=sys.stdout) -> int:
    """Runs one after another in the allocation salloc made (SLURM_JOB_ID), launched from outside it:
    when Slurm ends it (scancel, time limit, node failure, preemption), the run under way gets Slurm's
    state and reason in its log, and the runs after it a log saying they did not run, so each becomes a
    failed record instead of a job Snakemake would quietly submit again."""
    allocation = os.environ.get("SLURM_JOB_ID")
    why = None
    for run_plan, log in zip(plans, logs):
        if why:
            write_not_run(run_plan, log, why)
            continue
        measure(run_plan, Path(log), echo, allocation=allocation)
        if allocation:
            last = (Path(log).read_text(errors="replace").splitlines() or [""])[-1]
            ended = (markers.payload(last, markers.EXIT) or {}).get("slurm") if last.startswith(markers.EXIT) else None
            if ended:
                why = {"not_run": f"its allocation ended before it: Slurm job {ended['job']} {ended['state']}",
                       "slurm": ended}
    return 0


def run_allocated_plans(plans: list[RunPlan], logs: list, allocation: list[str], command: list[str],
                        on_refused=None) -> int:
    """A job of runs with an allocation of its own (`allocation`, salloc's argv), asked for from here, and
    `containerbench COMMAND --in-allocation` (which comes to run_in_allocation) run in it. Where Slurm gave
    none, or revoked it before the command ran, every log not yet written says why and those written stay;
    where the command itself failed, its status is returned for the workflow to show."""
    inner = [sys.executable, "-m", "containerbench", *command, "--in-allocation"]
    returncode, refused = slurm.run_allocated(allocation, inner)
    if refused is None:
        return returncode
    for run_plan, log in zip(plans, logs):
        if not Path(log).exists():
            write_not_run(run_plan, log, {"not_run": refused})
    if on_refused is not None:  # what else the job owes where its command never ran (a node's hardware report)
        on_refused(refused)
    return 0


class _Guard:
    """What the guards below share: a deadline, set again as the run's output says more, at which a run
    still going has its session stopped, after `_note` has recorded why."""

    def __init__(self, process, grace_s: float):
        self.process, self.grace_s = process, grace_s
        self._timer: threading.Timer | None = None

    def _arm(self, after_s: float) -> None:
        self.cancel()
        self._timer = threading.Timer(after_s, self._stop)
        self._timer.daemon = True
        self._timer.start()

    def _note(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        if self.process.poll() is None:
            self._note()
            stop_session(self.process.pid)

    def cancel(self) -> None:
        if self._timer:
            self._timer.cancel()


class ExitGuard(_Guard):
    """Ends a run that printed its whole result and then does not exit: its ranks have all finished
    (rank 0 gathers from every rank before it prints), so what is left is the launcher's and the MPI
    library's teardown, which can deadlock (MPICH over UCX's tcp transport, openucx/ucx#8738). The
    measurement is kept; the exit line says the run hung at exit and when it was stopped."""

    def __init__(self, process, grace_s: float):
        super().__init__(process, grace_s)
        self.lines: list[str] = []  # from the first line of the result on
        self.watching = 0  # lines still to read after a result line: the rest of a cut part may follow
        self.result_at: float | None = None
        self.hung: dict | None = None

    def see(self, line: str) -> None:
        if self.result_at is not None:
            return
        if markers.carries(line, markers.RESULT):
            self.watching = markers.SPLICE_LINES + 1
        if not self.lines and not self.watching:
            return
        self.lines.append(line.rstrip("\n"))
        if self.watching:
            self.watching -= 1
            if any(found.marker == markers.RESULT and found.payload is not None
                   for found in markers.read_payloads(self.lines)):
                self.result_at = time.monotonic()
                self._arm(self.grace_s)

    def _note(self) -> None:
        self.hung = {"after_result_s": round(time.monotonic() - self.result_at, 3), "grace_s": self.grace_s}


class StepGuard(_Guard):
    """Ends a step that srun said had lost a task ("srun: error: n1: task 0: Segmentation fault",
    slurm.SRUN_TASK_ENDED) and that is still going when srun's own wait for the rest of it is over
    ("Waiting up to 32 seconds", slurm.SRUN_STEP_WAIT) and the run's grace after that. In a chaos sweep a
    rank segfaulted, srun asked for the step's end, and the other node's task lived on until the run's
    300 s timeout, which then hid what had ended first. The exit line says when and why it was stopped."""

    def __init__(self, process, grace_s: float):
        super().__init__(process, grace_s)
        self.task_ended_at: float | None = None
        self.srun_wait_s = float(slurm.SRUN_DEFAULT_STEP_WAIT_S)
        self.stopped: dict | None = None

    def see(self, line: str) -> None:
        if self.task_ended_at is None and slurm.SRUN_TASK_ENDED.match(line):
            self.task_ended_at = time.monotonic()
            self._arm(self.srun_wait_s + self.grace_s)
        elif self.task_ended_at is not None and (wait := slurm.SRUN_STEP_WAIT.match(line)):
            self.srun_wait_s = float(wait["seconds"])  # srun's own figure, from now on
            self._arm(self.srun_wait_s + self.grace_s)

    def _note(self) -> None:
        self.stopped = {"after_task_ended_s": round(time.monotonic() - self.task_ended_at, 3),
                        "srun_wait_s": self.srun_wait_s, "grace_s": self.grace_s}


def _follow(process, log, echo, timeout_s: float, timed_out: threading.Event, abandoned: list,
            guard: ExitGuard, step_guard: StepGuard) -> int:
    """Copy the run's output until it ends; stop its whole session on a timeout, when the controller
    is gone (its description appended to `abandoned`), when it hangs after its result (`guard`) or after srun
    lost a task (`step_guard`), when this process is interrupted, and after."""
    def time_out():
        if process.poll() is None and guard.hung is None and step_guard.stopped is None:  # ended by a guard first
            timed_out.set()
            stop_session(process.pid)

    def controller_gone(what: str):
        if process.poll() is None:
            abandoned.append(what)
            stop_session(process.pid)

    watchdog = threading.Timer(timeout_s, time_out)
    watchdog.start()
    watch = watch_controller(controller_gone)
    try:
        for line in process.stdout:
            log.write(line)
            if echo:
                echo.write(line)
            guard.see(line)
            step_guard.see(line)
        return process.wait()
    finally:
        watchdog.cancel()
        guard.cancel()
        step_guard.cancel()
        if watch:
            watch.set()
        # Interrupted, or a process of the run still there after it ended: none outlives the run.
        stop_session(process.pid, grace_s=1.0)
