"""The wheelhouses of an offline image build: the lock's wheels for the image's interpreter, the
Horovod wheel compiled once (with ccache where installed), and each MPI flavour's wheelhouse with
its MPI wheel and a Horovod wheel compiled against it (`containerbench image wheelhouse`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from containerbench.config import BENCH_ENVS, BenchEnv, MpiFlavour
from containerbench.imagestep import (
    BENCH_PYTHON,
    BUILD,
    DEFAULT_STEP_TIMEOUT_S,
    GLIBC,
    QUERY_TIMEOUT_S,
    ImageStepError,
    run_step,
)

WHEELHOUSE = BUILD / "wheelhouse"
HOROVOD_FLAGS = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1",
                 "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
# Horovod's compile, on every core; not the caller's MAKEFLAGS: under `make VAR=value` it carries
# the variables too (" -- VAR=value"), which the inner build must not see.
HOROVOD_MAKEFLAGS = f"-j{os.cpu_count()}"
COMPILER_CACHE = BUILD / "ccache"
# RelWithDebInfo without -g: the same machine code, a fifth less compile time (the file says more).
HOROVOD_TOOLCHAIN = Path("scripts") / "horovod-without-debug-info.cmake"
BUILD_TOOLS = ("pip", "setuptools", "wheel")  # tensorflow and astunparse depend on them: they enter the hash


def horovod_version(root: Path = Path("."), env: BenchEnv = BENCH_ENVS["cpu"]) -> str | None:
    """The Horovod the env's image installs; None for an env without Horovod (PyTorch's)."""
    if not env.horovod:
        return None
    match = re.search(r"^horovod==(\S+)", (root / env.pins).read_text(), re.M)
    if not match:
        raise ImageStepError(f"wheelhouse: no horovod==VERSION pin in {env.pins}")
    return match.group(1)


def locked_pins(lock: Path, names) -> list[str]:
    """NAME==VERSION of each of `names` in the lock (a name the lock lacks is an error)."""
    def normal(name: str) -> str:  # PEP 503
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {normal(name): version for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock.read_text(), re.M)}
    missing = [name for name in names if normal(name) not in pins]
    if missing:
        raise ImageStepError(f"wheelhouse: {lock} pins no {', '.join(missing)}")
    return [f"{name}=={pins[normal(name)]}" for name in names]


def platform_args(python_version: str = "3.11", glibc=GLIBC) -> list[str]:
    """pip download for the image's interpreter (cp3XX, manylinux up to its glibc), not the host's."""
    abi = "cp" + python_version.replace(".", "")
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for minor in range(glibc[1], 4, -1):
        args += ["--platform", f"manylinux_{glibc[0]}_{minor}_x86_64"]
    return args + ["--platform", "manylinux2014_x86_64", "--platform", "manylinux2010_x86_64",
                   "--platform", "manylinux1_x86_64"]


def download_argv(python: Path, lock: Path, dest: Path, extra=(), python_version: str = "3.11") -> list[str]:
    # --find-links: the wheels built here from source distributions (sdist_wheel_argv) satisfy their pins.
    return [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--dest", str(dest),
            "--find-links", str(dest), *platform_args(python_version), "-r", str(lock), *extra]


def sdist_wheel_argv(python: Path, dest: Path, pins) -> list[str]:
    """Pure-Python pins that PyPI serves only as sources, made wheels once (the image installs only wheels)."""
    return [str(python), "-m", "pip", "wheel", "--disable-pip-version-check", "--quiet", "--no-deps",
            "--wheel-dir", str(dest), *pins]


def sdist_argv(python: Path, dest: Path, version: str) -> list[str]:
    return [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
            "--no-binary=:all:", "--no-build-isolation", "--dest", str(dest), f"horovod=={version}"]


def horovod_wheel_argv(python: Path, sdist: Path, dest: Path) -> list[str]:
    return [str(python), "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
            "--no-build-isolation", "--wheel-dir", str(dest), str(sdist)]


def _bench_query(python: Path, code: str) -> str:
    return run_step("bench venv", [str(python), "-c", code], capture=True, timeout=QUERY_TIMEOUT_S).stdout.strip()


def build_tool_pins(python: Path) -> list[str]:
    code = ("import importlib.metadata as m; "
            f"print(' '.join(n + '==' + m.version(n) for n in {list(BUILD_TOOLS)!r}))")
    return _bench_query(python, code).split()


def make_wheelhouse(bench_python: Path = BENCH_PYTHON, dest: Path = WHEELHOUSE, root: Path = Path("."),
                    python_version: str | None = None, timeout: float = DEFAULT_STEP_TIMEOUT_S,
                    env: BenchEnv = BENCH_ENVS["cpu"]) -> list[str]:
    """Fill `dest` for an offline image build; the Horovod wheel is built only when missing."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = build_tool_pins(bench_python)
    (dest / "build-tools.txt").write_text("\n".join(pins) + "\n")
    host_version = _bench_query(bench_python, "import sys; print('%d.%d' % sys.version_info[:2])")
    sources = [pin for pin in locked_pins(root / env.lock, env.sdist_only)
               if not any(dest.glob(f"{pin.replace('-', '_').replace('==', '-')}-*.whl"))]
    if sources:
        run_step("wheelhouse (wheels from sources)", sdist_wheel_argv(bench_python, dest, sources), timeout=timeout)
    run_step("wheelhouse (download)", download_argv(bench_python, root / env.lock, dest, pins,
                                                    python_version or host_version), timeout=timeout)
    version = horovod_version(root, env)
    if version is None:
        return sorted(p.name for p in dest.iterdir())
    abi = "cp" + host_version.replace(".", "")
    wheel = dest / f"horovod-{version}-{abi}-{abi}-linux_x86_64.whl"
    if env.horovod_gpu_operations and not wheel.exists():
        # Compiling NCCL operations needs nvcc and the venv's NCCL: scripts/setup-venv.sh does it, once.
        raise ImageStepError(f"wheelhouse: {wheel} is missing: benchmark_env '{env.name}' installs the Horovod "
                             f"wheel built with {env.horovod_gpu_operations} operations by `scripts/setup-venv.sh "
                             f"bench-{env.name} VENV` (make gpu-env), which needs CUDA 11.8's nvcc")
    sdist = dest / f"horovod-{version}.tar.gz"
    if not sdist.exists():
        run_step("wheelhouse (horovod sdist)", sdist_argv(bench_python, dest, version), timeout=timeout)
    if not wheel.exists():  # 3-5 minutes; links the host's Debian Open MPI, which the base also has
        run_step("wheelhouse (horovod wheel)", horovod_wheel_argv(bench_python, sdist, dest),
                 env=horovod_build_env(root), timeout=timeout)
    return sorted(p.name for p in dest.iterdir())


def horovod_build_env(root: Path = Path("."), **extra: str) -> dict[str, str]:
    """The environment of a Horovod wheel's compile (scripts/setup-venv.sh sets the same for the venv's):
    its framework and controller switches, every core, no debug information, ccache where installed."""
    return {**os.environ, **HOROVOD_FLAGS, "MAKEFLAGS": HOROVOD_MAKEFLAGS,
            "CMAKE_TOOLCHAIN_FILE": str((root / HOROVOD_TOOLCHAIN).absolute()), **compiler_cache_env(root), **extra}


def compiler_cache_env(root: Path = Path(".")) -> dict[str, str]:
    """ccache under a Horovod compile, when it is installed (scripts/setup-venv.sh sets the same for
    the venv's): the MPICH flavour's wheel then compiles again only what includes mpi.h, and finds the
    rest (most of Gloo) in the cache the Open MPI build filled. pip unpacks each build in a new
    directory under the temporary one: paths there are hashed relative to the compiler's working
    directory (CCACHE_BASEDIR), and that directory left out (CCACHE_NOHASHDIR)."""
    if shutil.which("ccache") is None:
        return {}
    return {"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
            "CCACHE_DIR": str((root / COMPILER_CACHE).absolute()), "CCACHE_BASEDIR": tempfile.gettempdir(),
            "CCACHE_NOHASHDIR": "1"}


def mpi_wheel_argv(python: Path, dest: Path, wheels, python_version: str) -> list[str]:
    return [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
            "--dest", str(dest), *platform_args(python_version), *wheels]


def make_flavour_wheelhouse(flavour: MpiFlavour, bench_python: Path = BENCH_PYTHON, root: Path = Path("."),
                            timeout: float = DEFAULT_STEP_TIMEOUT_S, env: BenchEnv = BENCH_ENVS["cpu"]) -> list[str]:
    """The flavour's wheelhouse: the env's wheels (hard links: a second copy would cost a GB), its MPI
    wheels, and a Horovod wheel compiled against them (the env's own is linked to Open MPI). The MPI
    wheel is installed into build/mpi/<flavour>/prefix for its compiler wrappers, which Horovod's
    build finds first on PATH. Built once, like the env's Horovod wheel (2-3 minutes)."""
    base, dest = root / env.wheelhouse, root / flavour.wheelhouse(env)
    dest.mkdir(parents=True, exist_ok=True)
    version = horovod_version(root, env)
    if version and not (base / f"horovod-{version}.tar.gz").exists():
        # Horovod's sources, as the env's wheelhouse step fetches them: this step needs nothing else from
        # it first (`make test` runs it beside setup's last steps, before any workflow; the workflow's run of
        # it links the rest).
        run_step("wheelhouse (horovod sdist)", sdist_argv(bench_python, base, version), timeout=timeout)
    for wheel in base.iterdir():
        target = dest / wheel.name
        if wheel.name.startswith("horovod-") and wheel.suffix == ".whl" or target.exists():
            continue
        os.link(wheel, target)
    host_version = _bench_query(bench_python, "import sys; print('%d.%d' % sys.version_info[:2])")
    run_step(f"wheelhouse ({flavour.name})", mpi_wheel_argv(bench_python, dest, flavour.wheels, host_version),
             timeout=timeout)
    abi = "cp" + host_version.replace(".", "")
    wheel = dest / f"horovod-{version}-{abi}-{abi}-linux_x86_64.whl"
    if version and not wheel.exists():  # PyTorch's image has no Horovod: the MPI wheel is all it adds
        prefix = root / BUILD / "mpi" / flavour.name / "prefix"
        run_step(f"wheelhouse ({flavour.name} prefix)",
                 [str(bench_python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps",
                  "--no-index", "--find-links", str(dest), "--prefix", str(prefix), *flavour.wheels], timeout=timeout)
        run_step(f"wheelhouse (horovod wheel, {flavour.name})",
                 horovod_wheel_argv(bench_python, dest / f"horovod-{version}.tar.gz", dest),
                 env=horovod_build_env(root, PATH=f"{prefix.absolute() / 'bin'}:{os.environ['PATH']}"),
                 timeout=timeout)
    return sorted(p.name for p in dest.iterdir())
