"""The main sweep of every runtime that runs here, on the test cluster whose nodes are as separate as a site's
(issue 32): each slurmd in its own network and mount namespace, with its own podman store and its own dockerd,
the clone's filesystem shared as /home is. Then every record checked, and the sweep's wall time printed.

    .venv/bin/python benchmarks/cluster_sweep.py [--keep DIR]
    .venv/bin/python benchmarks/cluster_sweep.py --recheck DIR     # only the checks, on a sweep kept in DIR

As root, after `make setup`. It starts what it needs and stops it by PID afterwards: the login node's dockerd
(scripts/container-engines.sh start-dockerd), NERSC's podman-hpc with its mpich module binding build/host-mpi/lib,
and the two-node cluster with a dockerd and a /sys of its own on each node (tests/slurm/cluster.sh, CB_NODE_DOCKERD,
CB_NODE_SYSFS). On the login node (this host's network, where the image build reaches its package mirror)
`snakemake --profile profiles/local` builds and prepares every image the sweep runs; then `snakemake --profile
profiles/slurm` on the cluster's controller runs tests/slurm/config.yaml's sweep on the fast network (with UCX on
it, for MPICH): bare metal, docker, podman, podman-hpc and Charliecloud, hybrid and native (config/native.yaml's
host MPI; docker hybrid only, as srun's pmi2 socket cannot reach its containers), on 1 and 2 nodes. The images reach
the nodes as a site's do: docker's and podman's through each run's node-image step (loaded from the shared archive
where a node lacks the image), podman-hpc's squashed copy and Charliecloud's directory from the shared filesystem.

Checks, a line each, exit 1 when one fails: every planned run has a record and every record is ok; each node of a
container run answered with the build's image id (docker's and podman's store, podman-hpc's squashed copy, the id
kept beside Charliecloud's directory, held to podman's build); every record of one framework has one provenance hash.
Prints the wall time of the image steps and of the sweep, and each node-image step's seconds, first load and later.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from containerbench import config as cb_config
from containerbench.images import built_image, image_files

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
ENGINES = ROOT / "scripts" / "container-engines.sh"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
RUNTIMES = ["bare-metal", "docker", "podman", "podman-hpc", "charliecloud"]
CONTAINERS = RUNTIMES[1:]
HOST_MPI = ROOT / "build" / "host-mpi" / "lib"
TAGS = ("localhost/containerbench:latest", "localhost/containerbench:latest-mpich")


def exported(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and " " not in line.split("=")[0])


def sweep_config(workdir: Path) -> list[Path]:
    native = yaml.safe_load((ROOT / "config" / "native.yaml").read_text())["native_mpi"]
    overlay = workdir / "sweep.yaml"
    overlay.write_text(yaml.safe_dump({
        "runtimes": RUNTIMES,
        "bare_metal": {"python": str(BENCH_PYTHON)},
        # docker only hybrid: under srun a native rank takes pmi2's inherited socket, which dockerd's containers
        # cannot (config.py refuses it in one line; issue 32, finding 2).
        "images": {**{name: {"mpi_model": ["hybrid"] if name == "docker" else ["hybrid", "native"]}
                      for name in CONTAINERS},
                   # The cluster's TmpFS is its state directory's tmp/%n, where srun's pmix plugin makes each step's
                   # client directory; Debian's ch-run 0.31 has no --write-fake to bind it, so a hybrid rank runs only
                   # where it lies under the /tmp ch-run shares (runtimes/charliecloud.py refuses it elsewhere).
                   "charliecloud": {"mpi_model": ["hybrid", "native"] if str(workdir).startswith("/tmp/")
                                    else ["native"]},
                   # The cluster's SlurmdSpoolDir (cluster.sh SPOOL), bound as podman-hpc's openmpi-pmix module binds
                   # /var/spool/slurmd, where a site's is ("Error: statfs /var/spool/slurmd" without it).
                   "podman-hpc": {"mpi_model": ["hybrid", "native"],
                                  "slurm_paths": ["/var/spool/containerbench-slurmd", "/run/munge"]}},
        "native_mpi": {**native, "library": str(ROOT / native["library"]),
                       "library_dirs": [str(ROOT / d) for d in native["library_dirs"]]},
        "scaling": {"nodes": [1, 2], "ranks_per_node": [1]},
        "results_dir": str(workdir / "results"),
        "history": {"store": str(workdir / "history.sqlite")},
    }))
    # The fast network only: the slow one doubles the sweep and says nothing more about where images are.
    base = yaml.safe_load((ROOT / "tests" / "slurm" / "config.yaml").read_text())
    # And MPICH's (native runs) transport on it: UCX's, whose shared memory would join the nodes' one kernel.
    fast = base["fabrics"]["fast"]
    base["fabrics"] = {"fast": {**fast, "env": {**fast["env"], "UCX_TLS": "tcp", "UCX_NET_DEVICES": "fast0"}}}
    whole = workdir / "cluster.yaml"
    whole.write_text(yaml.safe_dump(base))
    return [whole, overlay]


def image_targets() -> list[str]:
    """What each container runtime runs, of both flavours: the image (hybrid) and its MPICH one (native)."""
    return sorted(built_image(runtime, tag, ROOT / "build" / "images")[1] for runtime in CONTAINERS for tag in TAGS)


def forget_copies_in_gone_stores() -> None:
    """podman-hpc's stamps name squashed copies in a SQUASH_DIR of an earlier session (this one's is new and empty),
    and docker's images in a dockerd store removed at the end: without them the image steps migrate or load the
    image again, and `make clean-images` keeps no stamp of a store that will never answer again."""
    for tag in TAGS:
        for runtime in ("podman-hpc", "docker"):
            Path(built_image(runtime, tag, ROOT / "build" / "images")[1]).unlink(missing_ok=True)


def check(records: list[dict], planned: int, stamps: dict[str, str]) -> list[str]:
    broken = []
    if len(records) != planned:
        broken.append(f"{len(records)} records of {planned} planned runs")
    for record in records:
        spec, where = record["spec"], record["run_id"]
        if record["status"] != "ok":
            broken.append(f"{where}: {record['status']}: {record['reasons']}")
        if spec["runtime"] != "bare-metal":
            held = {node["host"]: node["image_id"] for node in record["node_images"] or []}
            hosts = {p["hostname"] for p in record["result"]["processes"]} if record.get("result") else set()
            if set(held) != hosts or len(hosts) != spec["nodes"]:
                broken.append(f"{where}: node images from {sorted(held)}, ranks on {sorted(hosts)}")
            want = stamps.get((spec["runtime"], record["image"]))
            if any(image_id != want for image_id in held.values()):
                broken.append(f"{where}: nodes held {held}, the build {want}")
    framework = {r["run_id"]: r["spec"].get("framework", "tensorflow") for r in records}  # named where not the default
    for name in set(framework.values()):
        hashes = {r["result"]["provenance"]["hash"] for r in records
                  if framework[r["run_id"]] == name and r.get("result")}
        if len(hashes) != 1:
            broken.append(f"{name}: {len(hashes)} provenance hashes: {sorted(hashes)}")
    return broken


def report(workdir: Path, configs: list[Path]) -> int:
    """Each node-image step's seconds, then the checks, a line each; the number broken."""
    planned = len(cb_config.plan_runs(cb_config.load([str(p) for p in configs])))
    records = [json.loads(p.read_text()) for p in sorted((workdir / "results" / "runs").glob("*.json"))]
    stamps = {}  # (runtime, image) -> the id the workflow built, loaded or migrated
    for runtime in ("docker", "podman", "podman-hpc"):
        for path in (ROOT / "build" / "images").glob(f"{runtime}-containerbench-*.json"):
            stamp = json.loads(path.read_text())
            stamps[(runtime, stamp["image"])] = stamp["image_id"]
            if runtime == "podman":  # the build engine: Charliecloud's directory is converted from its image
                directory = image_files(stamp["image"], ROOT / "build" / "images")["charliecloud-dir"]
                stamps[("charliecloud", directory)] = stamp["image_id"]
    for record in records:
        for node in record.get("node_images") or []:
            print(f"    node-image {record['spec']['runtime']} {record['run_id']} {node['host']}: "
                  f"{'loaded, ' if node['loaded'] else ''}{node['seconds']:.2f} s")
    broken = check(records, planned, stamps)
    for line in broken:
        print(f"BROKEN {line}")
    print(f"{len(records)} records of {planned} planned runs, {len(broken)} check(s) broken")
    return len(broken)


def another_cluster() -> bool:
    """Is a test cluster running already (cluster.sh's controller namespace), a suite's say? Its stop would be ours."""
    if Path("/run/netns/cbctl").exists():
        print("cluster_sweep: a test cluster is already running (/run/netns/cbctl); allowed: run this once it is "
              "stopped", file=sys.stderr)
        return True
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary directory, removed)")
    parser.add_argument("--recheck", type=Path, metavar="DIR",
                        help="only check again the records of a sweep kept in DIR (--keep DIR)")
    args = parser.parse_args(argv)
    if args.recheck:
        return int(report(args.recheck, [args.recheck / "cluster.yaml", args.recheck / "sweep.yaml"]) > 0)
    if another_cluster():
        return 2
    # Absolute: cluster.sh writes the state directory's paths into slurm.conf and the nodes' mounts.
    workdir = (args.keep or Path(tempfile.mkdtemp(prefix="cluster-sweep-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    state, engines = workdir / "cluster", workdir / "engines"
    subprocess.run([str(ENGINES), "install"], check=True, timeout=900)
    subprocess.run([str(CLUSTER), "install"], check=True, timeout=900)
    env = dict(os.environ)
    env |= exported(subprocess.run([str(ENGINES), "podman-conf", str(engines)], check=True, capture_output=True,
                                   text=True).stdout)
    # podman takes a run root of 50 characters at most: a short directory of its own.
    phpc, cluster_started = Path(tempfile.mkdtemp(prefix="cs-phpc-")), False
    try:
        env |= exported(subprocess.run([str(ENGINES), "start-dockerd", str(engines / "docker")], check=True,
                                       capture_output=True, text=True, timeout=300).stdout)
        env |= exported(subprocess.run([str(ENGINES), "podman-hpc", str(phpc), str(HOST_MPI)], check=True,
                                       capture_output=True, text=True, timeout=1800, env=env).stdout)
        configs = sweep_config(workdir)
        forget_copies_in_gone_stores()
        started = time.monotonic()
        targets = image_targets()
        built = subprocess.run([SNAKEMAKE, *targets, "--snakefile", str(ROOT / "Snakefile"), "--directory",
                                str(workdir), "--profile", str(ROOT / "profiles" / "local"), "--configfile",
                                *map(str, configs)], env=env, timeout=5400)
        images_s = time.monotonic() - started
        print(f"images: {len(targets)} prepared on the login node in {images_s:.0f} s (rc {built.returncode})",
              flush=True)
        if built.returncode:
            return 1
        if another_cluster():  # started while the images were made
            return 2
        cluster_started = True  # from here stop is ours to run, even after a start that failed half-way
        subprocess.run([str(CLUSTER), "start", str(state)], check=True, timeout=600,
                       env={**env, "CB_NODE_DOCKERD": str(engines / "docker"), "CB_NODE_SYSFS": "1"})
        started = time.monotonic()
        with open(workdir / "sweep.log", "w") as log:
            swept = subprocess.run(
                [str(CLUSTER), "exec", str(state), SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"),
                 "--directory", str(workdir), "--profile", str(ROOT / "profiles" / "slurm"),
                 "--configfile", *map(str, configs), "--slurm-init-seconds-before-status-checks", "2"],
                stdout=log, stderr=subprocess.STDOUT, env=env, timeout=7200)
        print(f"sweep: {time.monotonic() - started:.0f} s (snakemake rc {swept.returncode}; {workdir / 'sweep.log'})",
              flush=True)
        return int(report(workdir, configs) > 0 or swept.returncode != 0)
    finally:
        if cluster_started:  # never another's: stop kills what runs in the cluster's namespaces
            subprocess.run([str(CLUSTER), "stop", str(state)], timeout=600)
        subprocess.run([str(ENGINES), "stop-dockerd", str(engines / "docker")], timeout=300)
        subprocess.run([str(ENGINES), "clean-podman-hpc", str(phpc)], timeout=300)
        shutil.rmtree(phpc, ignore_errors=True)
        forget_copies_in_gone_stores()
        shutil.rmtree(engines / "docker", ignore_errors=True)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
