"""Host-side shim that finishes a container command when the rank starts, then execs it.

Some arguments of a rank's container command are only known on the node, when
the rank starts: the names of the variables mpirun/srun set for it (OMPI_*,
PMIX_*, SLURM_*...) and the node's device files. The plan (containerbench.runtimes) puts

    <host python> -m containerbench.rank.rankexec [--pass-prefix P]... [--pass-name N]...
        [--env-prefix X] [--env-form name|value] [--insert-after WORD]
        [--device-glob G]... -- <command>

in front of the command. At rank start the shim inserts, right after the first
`run` word of the command (docker/podman/sarus run; --insert-after names
another, e.g. `shifter`), `--env NAME` for every variable whose name starts
with a --pass-prefix or is a --pass-name (the engine copies the value from this
environment; with --env-form value it is `--env=NAME=VALUE`, for Shifter, which
has no name-only form) and `--device=PATH` for every path matching a
--device-glob. With --env-prefix X it instead exports X+NAME=value for those
variables and leaves the command alone (Apptainer's APPTAINERENV_ mechanism,
which also works under --cleanenv). With --cpuset-from-affinity it inserts
`--cpuset-cpus=LIST`, the CPUs mpirun/srun bound this rank to: dockerd creates
the container outside the rank's process tree, so the binding would not reach it
(docker run reference, "--cpuset-cpus"). Then it replaces itself with the command
(os.execvp): no process is left behind and the exit status is the command's.
With --memory-from-cgroup it inserts `--memory=BYTES`, the memory.max of the
rank's cgroup (Slurm's step limit), for the same reason ("--memory"), divided by
--memory-share N, the ranks of the node under that one limit: bare-metal ranks
share it, and each container would otherwise get all of it.
With --pmi-fd, where srun's pmi2 plugin gave the rank its socket as PMI_FD, it
moves that socket to fd 3, sets PMI_FD=3 and inserts `--preserve-fds=1`: podman
passes fds 3 to 3+N-1 into the container and closes the rest (podman-run(1),
"--preserve-fds"), as podman-hpc does for the same socket (podman_hpc.py, pmi_fd).
With --label-client it labels the container with this process, which the exec makes
the engine's client (`org.containerbench.client=HOST:NS:PID:START`, processes.identity),
and its uid. dockerd keeps a container running when its client is SIGKILLed (by Slurm
at a job's end, or an out-of-memory kill), outside the step's cgroup, holding its GPUs;
the node's next docker run (containerbench node-image) removes those whose client has
ended.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
from pathlib import Path

from containerbench.rank.telemetry import cgroup_limits

# docker-run(1) --label; listed back by `docker ps --filter label=KEY` and {{.Label "KEY"}} (docker ps reference,
# "Filtering" and "Formatting"). The client: host, pid namespace, process id and start time
# (processes.identity); its owner's uid, as a node's /proc may hide other users' processes (hidepid).
CLIENT_LABEL = "org.containerbench.client"
CLIENT_UID_LABEL = "org.containerbench.client-uid"


def own_identity() -> str:
    """This process as processes.identity names one, host:pid-namespace:pid:start-ticks (proc(5): /proc/PID/stat
    field 22), written here because the shim is of the rank side, which imports nothing of the workflow's."""
    ticks = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    return f"{socket.gethostname()}:{os.stat('/proc/self/ns/pid').st_ino}:{os.getpid()}:{ticks}"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m containerbench.rank.rankexec", description=__doc__.splitlines()[0])
    parser.add_argument("--pass-prefix", action="append", default=[], metavar="PREFIX")
    parser.add_argument("--pass-name", action="append", default=[], metavar="NAME")
    parser.add_argument("--env-form", choices=("name", "value"), default="name")
    parser.add_argument("--insert-after", default="run", metavar="WORD")
    parser.add_argument("--env-prefix", metavar="PREFIX", help="export PREFIX+NAME instead of inserting --env NAME")
    parser.add_argument("--device-glob", action="append", default=[], metavar="PATTERN")
    parser.add_argument("--cpuset-from-affinity", action="store_true")
    parser.add_argument("--memory-from-cgroup", action="store_true")
    parser.add_argument("--memory-share", type=int, default=1, metavar="RANKS")
    parser.add_argument("--pmi-fd", action="store_true")
    parser.add_argument("--label-client", action="store_true")
    at = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:at]), argv[at + 1:]
    if not command:
        parser.error("give the command after --")
    names = sorted(name for name in os.environ
                   if name in args.pass_name or args.pass_prefix and name.startswith(tuple(args.pass_prefix)))
    if args.env_prefix:
        os.environ.update({args.env_prefix + name: os.environ[name] for name in names})
        inserted = []
    elif args.env_form == "value":
        # shifter exits on --env=NAME= ("Improperly formatted environment variable"): an empty one stays unset.
        inserted = [f"--env={name}={os.environ[name]}" for name in names if os.environ[name]]
    else:
        inserted = [word for name in names for word in ("--env", name)]
    inserted += [f"--device={path}" for pattern in args.device_glob for path in sorted(glob.glob(pattern))]
    bound = sorted(os.sched_getaffinity(0))
    if args.cpuset_from_affinity and len(bound) < os.cpu_count():  # unbound: nothing to pass on
        inserted.append("--cpuset-cpus=" + ",".join(map(str, bound)))
    memory = cgroup_limits()["memory_max"] if args.memory_from_cgroup else None
    if memory:  # the step's memory limit (Slurm's task/cgroup), which the container would escape
        inserted.append(f"--memory={int(memory) // max(args.memory_share, 1)}")
    if args.pmi_fd and os.environ.get("PMI_FD"):
        os.dup2(int(os.environ["PMI_FD"]), 3)  # the copy is inheritable: exec keeps it
        os.environ["PMI_FD"] = "3"
        inserted.append("--preserve-fds=1")
    if args.label_client:  # the exec keeps this process's id and start time: they become the client's
        inserted += [f"--label={CLIENT_LABEL}={own_identity()}", f"--label={CLIENT_UID_LABEL}={os.getuid()}"]
    if inserted:
        word = args.insert_after
        if word not in command:
            parser.error(f"no {word!r} word in the command to insert {inserted[0]!r} after")
        at = command.index(word) + 1
        command = command[:at] + inserted + command[at:]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
