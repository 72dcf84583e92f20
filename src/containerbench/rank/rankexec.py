"""Host-side shim that finishes a container command when the rank starts, then execs it.

Some arguments of a rank's container command are only known on the node, when
the rank starts: the names of the variables mpirun/srun set for it (OMPI_*,
PMIX_*, SLURM_*...) and the node's device files. The plan (containerbench.runtimes) puts

    <host python> -m containerbench.rank.rankexec [--pass-prefix P]... [--pass-name N]...
        [--env-prefix X] [--env-form name|value] [--insert-after WORD]
        [--device-glob G]... [--bind-pmix=FORM | --bind-pmix-variable=NAME [--pmix-base B]
        [--shared-path P]...] -- <command>

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
at a job's end, or an out-of-memory kill), outside the step's cgroup, holding its GPUs,
and podman's conmon, outside the client's process tree, does too; the node's next docker
or podman run (containerbench node-image) removes those whose client has ended.
With --bind-pmix=FORM, under srun's pmix plugin, it inserts FORM's words, {path} filled in, for
each directory of the step's PMIx server the rank's client may need at the same path,
as Enroot's hook does for Pyxis (NVIDIA/enroot conf/hooks/extra/50-slurm-pmi.sh):
Slurm's spmix_appdir, the namespace's directory (PMIX_NSDIR), in which Open MPI makes its
session directory (MPI_Init fails where it is missing and the root is read-only: seen on
the test cluster), and PMIX_SERVER_TMPDIR (in SlurmdSpoolDir). The appdir lies under the job's
SLURM_PMIX_TMPDIR, else mpi.conf's PMIxCliTmpDirBase, else TmpFS with %n and %h expanded on
the node (Slurm's mpi/pmix pmixp_info.c): --pmix-base gives the last two as the plan read
them from `scontrol show config`, as no variable of the rank names them (PMIX_SYSTEM_TMPDIR,
where Enroot looks, is /tmp there); Enroot's place is looked in too. One under a
--shared-path (bound already) is left out. --bind-pmix-variable NAME appends them to NAME
instead (comma-separated: Apptainer's APPTAINER_BIND).
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
from pathlib import Path

from containerbench.rank.telemetry import cgroup_limits

# docker-run(1), podman-run(1) --label; listed back by `ps --filter label=KEY` and each engine's template
# (OciEngine.label_template; docker ps reference, "Filtering" and "Formatting"). The client: host, pid namespace,
# process id and start time
# (processes.identity); its owner's uid, as a node's /proc may hide other users' processes (hidepid).
CLIENT_LABEL = "org.containerbench.client"
CLIENT_UID_LABEL = "org.containerbench.client-uid"


def own_identity() -> str:
    """This process as processes.identity names one, host:pid-namespace:pid:start-ticks (proc(5): /proc/PID/stat
    field 22), written here because the shim is of the rank side, which imports nothing of the workflow's."""
    ticks = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    return f"{socket.gethostname()}:{os.stat('/proc/self/ns/pid').st_ino}:{os.getpid()}:{ticks}"


def pmix_directories(environ=os.environ, base: str = "") -> list[str]:
    """The existing directories of srun's PMIx server for this step (the module's text), when Enroot's
    50-slurm-pmi.sh would look: in a Slurm step whose MPI type is PMIx (or unset) with PMIX_* variables set;
    the defaults are TMPDIR, TEMP, TMP, /tmp, in that order (docs.openpmix.org, "Session directories")."""
    if not (environ.get("SLURM_JOB_ID") and environ.get("SLURM_STEP_ID")):
        return []
    if not environ.get("SLURM_MPI_TYPE", "pmix").startswith("pmix") or not any(n.startswith("PMIX_") for n in environ):
        return []
    default = environ.get("TMPDIR") or environ.get("TEMP") or environ.get("TMP") or "/tmp"
    system = environ.get("PMIX_SYSTEM_TMPDIR") or default
    step = f"{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}"
    # Named with the job's uid, or without (older Slurm); %n is the node's name, %h its NodeHostname, which is the
    # NodeName unless set, "typically" what `hostname -s` returns (slurm.conf(5), NodeHostname): both are looked in.
    short = socket.gethostname().split(".")[0]
    node = environ.get("SLURMD_NODENAME") or short
    expanded = [base.replace("%n", node).replace("%h", host) for host in dict.fromkeys([node, short])]
    bases = dict.fromkeys(filter(None, [environ.get("SLURM_PMIX_TMPDIR"), *expanded, system]))
    appdirs = [f"{base}/spmix_appdir{uid}_{step}" for base in bases
               for uid in (f"_{environ.get('SLURM_JOB_UID', '')}", "")]
    # PMIX_SERVER_TMPDIR only where set (Slurm always sets it): Enroot's fallback to TMPDIR would bind all of /tmp.
    found = [next((d for d in appdirs if os.path.isdir(d)), ""), environ.get("PMIX_SERVER_TMPDIR", "")]
    return list(dict.fromkeys(os.path.normpath(d) for d in found if d and os.path.isdir(d)))


def outside(paths: list[str], shared: list[str]) -> list[str]:
    """The paths of `paths` that lie under none of `shared` (bound already, at the same path)."""
    roots = [os.path.normpath(p) for p in shared]
    return [p for p in paths if not any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)]


def bind_pmix_options(base: str, shared, form: str | None = None, variable: str | None = None) -> list[str]:
    """This shim's options that bind the PMIx directories, in the words `form` ({path}) or as the variable
    `variable`, where none of `shared` (the paths the runtime binds already) holds them; `base`: Slurm's
    client directory base as configured, %n and %h unexpanded ("" where the plan could not read it)."""
    if not (form or variable):
        raise ValueError("bind_pmix_options: give form or variable")
    # One word each: a form is itself an option (--mount=..., --bind=...), which argparse would take for one.
    chosen = [f"--bind-pmix={form}"] if form else [f"--bind-pmix-variable={variable}"]
    return [*chosen, *(["--pmix-base", base] if base else []),
            *(word for path in shared for word in ("--shared-path", path))]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m containerbench.rank.rankexec", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)  # a command's --bind=... is no abbreviation of --bind-pmix
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
    parser.add_argument("--bind-pmix", metavar="FORM", help="e.g. '--volume {path}:{path}'")
    parser.add_argument("--bind-pmix-variable", metavar="NAME", help="e.g. APPTAINER_BIND")
    parser.add_argument("--shared-path", action="append", default=[], metavar="PATH")
    parser.add_argument("--pmix-base", default="", metavar="TEMPLATE", help="PMIxCliTmpDirBase or TmpFS (%%n, %%h)")
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
    wanted = args.bind_pmix or args.bind_pmix_variable
    pmix = outside(pmix_directories(base=args.pmix_base), args.shared_path) if wanted else []
    if args.bind_pmix_variable and pmix:
        os.environ[args.bind_pmix_variable] = ",".join(filter(None, [os.environ.get(args.bind_pmix_variable), *pmix]))
    elif args.bind_pmix:
        inserted += [word.format(path=path) for path in pmix for word in args.bind_pmix.split(" ")]
    if inserted:
        word = args.insert_after
        if word not in command:
            parser.error(f"no {word!r} word in the command to insert {inserted[0]!r} after")
        at = command.index(word) + 1
        command = command[:at] + inserted + command[at:]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
