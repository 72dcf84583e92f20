"""A small sweep on the 4-node test cluster while things go wrong at random, seeded moments; then every
promise checked (issue 34, item 5).

    .venv/bin/python benchmarks/chaos_sweep.py [--seeds 1 2 3 4 5] [--state DIR] [--repetitions 2]

For each seed, `snakemake --profile profiles/slurm` runs tests/slurm/config.yaml's sweep (bare metal,
ResNet-50 at 32 px, two fabrics, one and two nodes, two repetitions unless --repetitions says) and, at moments
drawn from the seed (a share of the sweep's runs done, between a tenth and seven tenths: counted in runs, not
seconds, so that a fast hour moves no event past the sweep's end), each of these once, in an order drawn too:

- scancel: a running job of the sweep is cancelled;
- node-down: a node running a job is set DOWN (then RESUMEd 20 s later);
- restart-slurmctld: slurmctld is stopped and started again on its saved state;
- kill-controller: the workflow's controller is SIGKILLed, and started again as a site admin would
  (again every 15 s while it refuses for the dead one's jobs still in Slurm).

At the end:

- every planned run has a record: measured (ok, or disturbed on these shared cores), or failed with
  Slurm's word (its state, from sacct) when Slurm ended it;
- no record is lost or duplicated (one record and one launch line per run);
- the results store passes `PRAGMA integrity_check` and holds each run once;
- nothing is left running: no mpirun, srun, salloc, rank, sampler or snakemake of the sweep.

Without --state it starts a 4-node cluster (tests/slurm/cluster.sh, as root) and stops it after. Prints a
line per injected event and per check; exit 1 when a promise is broken.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from containerbench import config as cb_config
from containerbench.processes import kill_session

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
EVENTS = ("scancel", "node-down", "restart-slurmctld", "kill-controller")
# What must not outlive the sweep (matched in command lines that name its directory, or in any).
LEFT_BEHIND = ("containerbench.rank", "mpirun", "salloc", "srun ", "snakemake", "containerbench launch")


def on_controller(state: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLUSTER), "exec", str(state), *argv], capture_output=True, text=True, timeout=timeout)


def sweep_config(workdir: Path, repetitions: int) -> list[Path]:
    overlay = workdir / "chaos.yaml"
    overlay.write_text(yaml.safe_dump({
        "runtimes": ["bare-metal"],
        "bare_metal": {"python": str(BENCH_PYTHON)},
        # ResNet-50 as tests/slurm/config.yaml has it: the smoke network's all-reduce is too small for the
        # traffic check to see in a window of a few steps (measured: under half of it, judged invalid).
        "benchmark": {"repetitions": repetitions, "timeout_s": 300},
        "netbench": {"max_bytes": 1048576, "timeout_s": 300},
        "history": {"store": str(workdir / "history.sqlite")},
    }))
    return [ROOT / "tests" / "slurm" / "config.yaml", overlay]


class Controller:
    """The workflow's controller on the cluster's login host, started (again) as an admin would."""

    def __init__(self, state: Path, workdir: Path, configs: list[Path]):
        self.state, self.workdir, self.configs = state, workdir, configs
        self.process: subprocess.Popen | None = None
        self.starts, self.outputs = 0, []

    def start(self) -> None:
        log = open(self.workdir / f"controller-{self.starts + 1}.log", "w")
        self.process = subprocess.Popen(
            [str(CLUSTER), "exec", str(self.state), SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"),
             "--directory", str(self.workdir), "--profile", str(ROOT / "profiles" / "slurm"),
             "--configfile", *map(str, self.configs), "--slurm-init-seconds-before-status-checks", "2"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL the controller alone (nsenter execs it: the process started is snakemake itself)."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def run_to_the_end(self, deadline: float) -> int:
        """Wait for the controller; while it refuses to start for the dead one's jobs, start it again."""
        while True:
            returncode = self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
            text = (self.workdir / f"controller-{self.starts}.log").read_text(errors="replace")
            if "(gone) stays" in text and time.monotonic() < deadline:  # processes.remove_stale_lock's refusal
                time.sleep(15)
                self.start()
                continue
            return returncode


def inject(event: str, state: Path, controller: Controller, rng: random.Random, say) -> None:
    def running_jobs() -> list[tuple[str, str]]:
        out = on_controller(state, "squeue", "--noheader", "--states", "RUNNING", "--format", "%i %N").stdout
        return [tuple(line.split()) for line in out.splitlines() if len(line.split()) == 2]

    if event in ("scancel", "node-down"):
        for _ in range(240):  # a moment with a job running (a restarted controller may wait for its lock)
            if jobs := running_jobs():
                break
            time.sleep(0.5)
        else:
            say(f"{event}: no job ran within 120 s; nothing injected")
            return
        job, nodes = rng.choice(sorted(jobs))
        if event == "scancel":
            on_controller(state, "scancel", job)
            say(f"scancel: job {job} on {nodes}")
        else:
            node = on_controller(state, "scontrol", "show", "hostnames", nodes).stdout.split()[0]
            on_controller(state, "scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=chaos")
            say(f"node-down: {node} (running job {job}), resumed in 20 s")
            threading.Timer(20, on_controller, (state, "scontrol", "update", f"NodeName={node}",
                                                "State=RESUME")).start()
    elif event == "restart-slurmctld":
        done = subprocess.run([str(CLUSTER), "restart-controller", str(state)], capture_output=True, text=True,
                              timeout=120)
        say(f"restart-slurmctld: exit {done.returncode}")
    else:
        controller.kill()
        say(f"kill-controller: snakemake {controller.process.pid} SIGKILLed, started again")
        controller.start()


def planned_runs(configs: list[Path]) -> list[str]:
    config = cb_config.load(configs)
    return [spec.run_id for spec in cb_config.plan_runs(config)]


def left_behind(workdir: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(word in line for word in LEFT_BEHIND) and (str(workdir) in line or "containerbench.rank" in line):
            found.append(f"{entry.name}: {line[:160]}")
    return found


def check(workdir: Path, configs: list[Path]) -> list[str]:
    broken = []
    runs_dir = workdir / "results" / "runs"
    planned = planned_runs(configs)
    records = {path.stem: json.loads(path.read_text()) for path in runs_dir.glob("*.json")}
    for run_id in planned:
        record = records.get(run_id)
        if record is None:
            broken.append(f"{run_id}: no record")
            continue
        launches = (runs_dir / f"{run_id}.log").read_text(errors="replace").count("containerbench-launch ")
        if launches != 1:
            broken.append(f"{run_id}: {launches} launch lines in its log")
        if record["status"] == "failed" and not any("Slurm" in reason or "sacct" in reason
                                                    for reason in record["reasons"]):
            broken.append(f"{run_id}: failed without Slurm's word: {record['reasons']}")
        if record["status"] not in ("ok", "disturbed", "failed"):
            broken.append(f"{run_id}: {record['status']}: {record['reasons']}")
    extra = set(records) - set(planned)
    if extra:
        broken.append(f"records no plan made: {sorted(extra)}")
    store = workdir / "history.sqlite"
    if not store.exists():
        broken.append("no results store")
    else:
        with sqlite3.connect(store.resolve().as_uri() + "?mode=ro", uri=True) as connection:
            checked = connection.execute("PRAGMA integrity_check").fetchone()[0]
            if checked != "ok":
                broken.append(f"history.sqlite: integrity_check {checked}")
            twice = connection.execute("SELECT run_id, count(*) FROM records GROUP BY run_id HAVING count(*) > 1")
            broken += [f"history.sqlite holds {run} {count} times" for run, count in twice]
            stored = {run for (run,) in connection.execute("SELECT run_id FROM records")}
            broken += [f"history.sqlite lacks {run}" for run in sorted(set(planned) - stored)]
    broken += [f"left running: {line}" for line in left_behind(workdir)]
    return broken


def chaos(seed: int, state: Path, undisturbed_s: float | None, repetitions: int) -> tuple[list[str], float]:
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-", dir=os.environ.get("CHAOS_DIR")))
    configs = sweep_config(workdir, repetitions)
    controller = Controller(state, workdir, configs)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"  seed {seed} t={time.monotonic() - started:6.1f} s: {text}", flush=True)

    controller.start()
    injector = None
    if undisturbed_s:
        # Moments in runs done: at moments in seconds (the undisturbed length's shares), a sweep that ran faster
        # than the length given had ended before its last event, a scancel that found no job (seen in CI).
        shares = sorted(rng.uniform(0.1, 0.7) for _ in EVENTS)
        order = rng.sample(EVENTS, len(EVENTS))
        planned, runs_dir = len(planned_runs(configs)), workdir / "results" / "runs"

        def inject_all() -> None:
            for share, event in zip(shares, order):
                while (len(list(runs_dir.glob("*.json"))) < share * planned and controller.process.poll() is None
                       and time.monotonic() < started + 1800):
                    time.sleep(0.5)
                inject(event, state, controller, rng, say)

        injector = threading.Thread(target=inject_all)
        injector.start()
    try:
        if injector:
            injector.join()
        returncode = controller.run_to_the_end(started + 1800)
        say(f"controller exited {returncode} after {controller.starts} start(s)")
        if undisturbed_s:  # what a site admin does after a rough night: run the workflow once more
            controller.start()
            returncode = controller.run_to_the_end(time.monotonic() + 900)
            say(f"the morning's rerun exited {returncode}")
    finally:
        if controller.process and controller.process.poll() is None:
            kill_session(controller.process.pid)
    elapsed = time.monotonic() - started
    time.sleep(5)  # the jobs' launchers stop their runs within seconds of a controller's end
    return check(workdir, configs), elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--state", type=Path, help="a running 4-node test cluster's state directory")
    parser.add_argument("--undisturbed-s", type=float,
                        help="the sweep's length without chaos, to compare each seed's with (else measured)")
    # make test runs one seed at one repetition (tests/test_fleet_slurm.py): the same four events among fewer runs.
    parser.add_argument("--repetitions", type=int, default=2, help="of each training point (default 2)")
    args = parser.parse_args(argv)
    state, own_cluster = args.state, args.state is None
    if own_cluster:
        state = Path(tempfile.mkdtemp(prefix="chaos-cluster-"))
        subprocess.run([str(CLUSTER), "start", str(state)], check=True, timeout=600,
                       env={**os.environ, "CB_NODES": "4"})
    failures = 0
    try:
        undisturbed = args.undisturbed_s
        if undisturbed is None:
            broken, undisturbed = chaos(0, state, None, args.repetitions)
            print(f"undisturbed sweep: {undisturbed:.0f} s, {len(broken)} promise(s) broken", flush=True)
            failures += bool(broken)
            for line in broken:
                print(f"    {line}")
        for seed in args.seeds:
            broken, elapsed = chaos(seed, state, undisturbed, args.repetitions)
            print(f"seed {seed}: {elapsed:.0f} s, {len(broken)} promise(s) broken", flush=True)
            failures += bool(broken)
            for line in broken:
                print(f"    {line}")
    finally:
        if own_cluster:
            subprocess.run([str(CLUSTER), "stop", str(state)], timeout=300)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
