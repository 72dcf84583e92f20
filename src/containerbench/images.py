"""Container images: build the one benchmark image and hand it to every runtime.

One definition, containers/Dockerfile, built offline (no registry is reachable)
from a local Debian base and a wheelhouse, so the image holds the same pinned
packages and package code as the bare-metal venv and reports the same
provenance hash. Every step is an argv builder plus a small runner:

  python -m containerbench.images base             debootstrap -> localhost/containerbench-base:bookworm
  python -m containerbench.images wheelhouse       pip download the lock, build the Horovod wheel once
  python -m containerbench.images build            <engine> build --network none -> stamp JSON
  python -m containerbench.images export           <engine> save -> build/images/containerbench.tar
  python -m containerbench.images charliecloud     export, ch-convert -> build/images/containerbench.ch
  python -m containerbench.images charliecloud-nvidia   ch-fromhost --nvidia, on a GPU node
  python -m containerbench.images load             <other engine> load the archive -> its stamp JSON
  python -m containerbench.images prepare --runtime R   apptainer, singularity, enroot, sarus, podman-hpc:
                                                   the commands of R's class (containerbench.runtimes)
  python -m containerbench.images print-commands   every runtime's image commands, printed
  python -m containerbench.images remove           the tag from each engine, and every file made from it

Every step has a time limit (--step-timeout), so a wedged engine fails its step
with a message instead of holding the workflow. The Singularity definition is
made by containerbench.singularity. Which file each runtime runs is decided
here too (image_files, resolve_images), so the rules and the plans agree.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from containerbench import provenance
from containerbench.config import (
    BENCH_ENVS,
    MODEL_FLAVOUR,
    MPI_FLAVOURS,
    BenchEnv,
    ConfigError,
    ImageUse,
    MpiFlavour,
    bench_env,
    image_key,
    mpi_models,
    runtime_label,
)
from containerbench.processes import run_group
from containerbench.runtimes import (
    CONTAINER_RUNTIMES,
    DEFAULT_PATH,
    Apptainer,
    BuiltImage,
    Charliecloud,
    RunRequest,
    engine_env,
    engine_usable,
    host_environment,
)

BUILD = Path("build")
IMAGES = BUILD / "images"
WHEELHOUSE = BUILD / "wheelhouse"
DOCKERFILE = Path("containers/Dockerfile")
BENCH_PYTHON = Path(".venv-bench/bin/python")
BASE_IMAGE = "localhost/containerbench-base:bookworm"
IMAGE_REPO = "localhost/containerbench"
ARCHIVE = IMAGES / "containerbench.tar"
CHARLIECLOUD_DIR = IMAGES / "containerbench.ch"
PROVENANCE_LABEL = "org.containerbench.provenance"
ENGINES = ("docker", "podman")
# What every rank needs at run time besides the venv: Python and Open MPI (mpi4py and
# Horovod's mpi_lib link libmpi.so.40 / libmpi_cxx.so.40 from libopenmpi3).
BASE_PACKAGES = ("python3", "python3-venv", "openmpi-bin", "libopenmpi3", "ca-certificates")
SUITE, GLIBC = "bookworm", (2, 36)
# A base with apt steps or a slow mirror may need more (images.step_timeout_s in the config).
DEFAULT_STEP_TIMEOUT_S = 3600
# Questions that take seconds (does the image exist, its id, the venv's versions and hash): a wedged
# engine fails them long before a step's limit.
QUERY_TIMEOUT_S = 300
HOROVOD_FLAGS = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1",
                 "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
# Horovod's compile, on every core; not the caller's MAKEFLAGS: under `make VAR=value` it carries
# the variables too (" -- VAR=value"), which the inner build must not see.
HOROVOD_MAKEFLAGS = f"-j{os.cpu_count()}"
COMPILER_CACHE = BUILD / "ccache"
# RelWithDebInfo without -g: the same machine code, a fifth less compile time (the file says more).
HOROVOD_TOOLCHAIN = Path("scripts") / "horovod-without-debug-info.cmake"
BUILD_TOOLS = ("pip", "setuptools", "wheel")  # tensorflow and astunparse depend on them: they enter the hash


class ImageStepError(RuntimeError):
    """A step failed; the message is one line naming the step and the command."""


@dataclass(frozen=True)
class ImageSpec:
    engine: str = "podman"
    tag: str = f"{IMAGE_REPO}:latest"
    base_image: str = BASE_IMAGE
    build_args: dict[str, str] = field(default_factory=dict)
    dockerfile: Path = DOCKERFILE
    context: Path = Path(".")
    network: str = "none"  # the default base needs nothing from outside: prove it

    def all_build_args(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image, **self.build_args}


# -- running ---------------------------------------------------------------------------------

def run_step(step: str, argv: list[str], *, timeout: float, env=None, capture=False,
             stdin=None) -> subprocess.CompletedProcess:
    """Run one image step in its own process group (podman and ch-convert start helpers that
    would outlive a killed parent); it never reads a terminal or a CI pipe."""
    try:
        done = run_group(argv, timeout=timeout, capture=capture, env=env,
                         stdin=subprocess.DEVNULL if stdin is None else stdin)
    except FileNotFoundError:
        raise ImageStepError(f"{step}: {argv[0]} is not installed (scripts/container-engines.sh install)") from None
    except subprocess.TimeoutExpired:
        raise ImageStepError(f"{step} timed out after {timeout:g} s: {shlex.join(argv)}") from None
    if done.returncode != 0:
        last = (done.stderr or "").strip().splitlines()[-1:]
        raise ImageStepError(f"{step} failed (exit {done.returncode}): {shlex.join(argv)}"
                             + (f" -- {last[0]}" if last else ""))
    return done


# -- base ------------------------------------------------------------------------------------

def apt_mirror(suite: str = SUITE, roots=(Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))) -> str:
    """The host's Debian mirror for `suite`, from one-line or deb822 sources."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.glob("*")) if r.is_dir() else [])]
    for path in files:
        text = path.read_text(errors="replace")
        for block in re.split(r"\n\s*\n", text):  # deb822 stanzas
            fields = dict(re.findall(r"^(URIs|Suites):\s*(.+)$", block, re.M))
            if suite in fields.get("Suites", "").split() and "URIs" in fields:
                return fields["URIs"].split()[0]
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    return "http://deb.debian.org/debian"


def debootstrap_argv(rootfs: Path, mirror: str, suite: str = SUITE, packages=BASE_PACKAGES) -> list[str]:
    return ["debootstrap", "--variant=minbase", "--include=" + ",".join(packages), suite, str(rootfs), mirror]


def rootfs_tar_argv(rootfs: Path) -> list[str]:
    # /dev nodes stay out: copied as files, /dev/full fills the disk (ch-image import).
    return ["tar", "-C", str(rootfs), "--exclude=./dev/*", "-c", "."]


def import_argv(engine: str, tag: str = BASE_IMAGE) -> list[str]:
    return [engine, "import", "--change", f"ENV PATH={DEFAULT_PATH}", "-", tag]


def image_exists(engine: str, tag: str) -> bool:
    argv = [engine, "image", "inspect", tag]
    try:
        return run_group(argv, timeout=QUERY_TIMEOUT_S, env=engine_env(engine)).returncode == 0
    except FileNotFoundError:
        raise ImageStepError(f"base: {engine} is not installed (scripts/container-engines.sh install)") from None
    except subprocess.TimeoutExpired:
        raise ImageStepError(f"base: `{shlex.join(argv)}` did not answer within {QUERY_TIMEOUT_S} s") from None


def make_base(engine: str, tag: str = BASE_IMAGE, rootfs: Path = BUILD / "base" / "rootfs",
              mirror: str | None = None, force: bool = False, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> str:
    """Debootstrap a root file system into `rootfs`, import it into the engine as `tag`, and remove
    it: the engine keeps the base, the workflow keeps only its marker. A base another engine here
    already holds is copied from it instead (save, load): one debootstrap serves both engines."""
    if image_exists(engine, tag) and not force:
        return f"{tag} already in {engine}"
    holder = None if force else next((other for other in ENGINES if other != engine and engine_usable(other)[0]
                                      and image_exists(other, tag)), None)
    if holder:
        archive = rootfs.parent / "base.tar"
        try:
            export_image(holder, tag, archive, timeout)
            run_step(f"base (load into {engine})", load_argv(engine, archive), env=engine_env(engine), timeout=timeout)
            return f"{tag} copied from {holder} into {engine}"
        except ImageStepError as error:  # made here instead, as if no engine held it
            print(f"containerbench.images: base: not copied from {holder} ({error}); debootstrap instead",
                  file=sys.stderr)
        finally:
            archive.unlink(missing_ok=True)
    shutil.rmtree(rootfs, ignore_errors=True)  # a half-made rootfs from an interrupted run
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_step("base (debootstrap)", debootstrap_argv(rootfs, mirror or apt_mirror()), timeout=timeout)
        tar = subprocess.Popen(rootfs_tar_argv(rootfs), stdout=subprocess.PIPE)
        try:
            run_step("base (import)", import_argv(engine, tag), stdin=tar.stdout, env=engine_env(engine),
                     timeout=timeout)
        finally:
            tar.stdout.close()
            if tar.wait() != 0:
                raise ImageStepError(f"base (tar) failed (exit {tar.returncode}): "
                                     f"{shlex.join(rootfs_tar_argv(rootfs))}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return f"{tag} imported into {engine}"


# -- wheelhouse ------------------------------------------------------------------------------

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


# -- build, inspect, stamp -------------------------------------------------------------------

def host_provenance(bench_python: Path = BENCH_PYTHON) -> dict:
    out = run_step("provenance (host)", [str(bench_python), "-m", "containerbench.provenance"], capture=True,
                   timeout=QUERY_TIMEOUT_S)
    return json.loads(out.stdout)


def default_tag(bench_python: Path = BENCH_PYTHON) -> str:
    """Images are tagged with the benchmark's provenance hash: a stale image has another tag."""
    return f"{IMAGE_REPO}:{host_provenance(bench_python)['hash']}"


def image_build_args(env: BenchEnv, flavour: MpiFlavour) -> dict[str, str]:
    """containers/Dockerfile's build arguments for one flavour: the env's lock and wheelhouse, the MPI
    wheels, and for an env without Horovod (PyTorch) an empty HOROVOD_VERSION, which skips it."""
    return {"LOCK": env.lock, "WHEELHOUSE": flavour.wheelhouse(env),
            **({"MPI_WHEELS": " ".join(flavour.wheels)} if flavour.wheels else {}),
            **({} if env.horovod else {"HOROVOD_VERSION": ""})}


def build_argv(spec: ImageSpec) -> list[str]:
    argv = [spec.engine, "build", "--network", spec.network, "-f", str(spec.dockerfile), "-t", spec.tag]
    for name, value in spec.all_build_args().items():
        argv += ["--build-arg", f"{name}={value}"]
    if "PROVENANCE" in spec.build_args:  # podman 4.3 reuses a cached LABEL step when only the ARG changed
        argv += ["--label", f"{PROVENANCE_LABEL}={spec.build_args['PROVENANCE']}"]
    return argv + [str(spec.context)]


def inspect_image(engine: str, tag: str) -> dict:
    out = run_step("inspect", [engine, "image", "inspect", tag], capture=True, env=engine_env(engine),
                   timeout=QUERY_TIMEOUT_S)
    return json.loads(out.stdout)[0]


def image_digest(engine: str, tag: str, info: dict | None = None) -> str:
    """The image id (config digest), 'sha256:...' from docker and podman alike."""
    image_id = (info or inspect_image(engine, tag))["Id"]
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def rmi_argv(engine: str, tag: str) -> list[str]:
    """Remove the tag (and the image, when no other tag names it)."""
    return [engine, "rmi", tag]


def image_run_argv(engine: str, tag: str, command: list[str]) -> list[str]:
    return [engine, "run", "--rm", "--network", "none", tag, *command]


def image_provenance(engine: str, tag: str, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> dict:
    argv = image_run_argv(engine, tag, ["python3", "-m", "containerbench.provenance"])
    return json.loads(run_step("provenance (image)", argv, capture=True, env=engine_env(engine), timeout=timeout).stdout)


def build_stamp(engine: str, tag: str, host_hash: str | None = None, timeout: float = DEFAULT_STEP_TIMEOUT_S,
                measured: dict | None = None) -> dict:
    info = inspect_image(engine, tag)
    measured = measured or image_provenance(engine, tag, timeout)
    return {"engine": engine, "image": tag, "image_id": image_digest(engine, tag, info),
            "label_provenance": ((info.get("Config") or {}).get("Labels") or {}).get(PROVENANCE_LABEL),
            "measured_provenance": measured["hash"], "host_provenance": host_hash,
            "mpi_wheels": measured.get("mpi", {}),  # the flavour: {} on Open MPI, {"mpich": ...} on the MPICH one
            "python": measured["python"], "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def stamp_path(engine: str) -> Path:
    return IMAGES / f"containerbench.{engine}.json"


def build_image(spec: ImageSpec, bench_python: Path = BENCH_PYTHON, stamp: Path | None = None,
                timeout: float = DEFAULT_STEP_TIMEOUT_S) -> dict:
    """Build, then measure the provenance inside the image; refuse an image that differs from bare metal:
    name what differs, and leave neither the tag nor a stamp that would claim it is good."""
    host = host_provenance(bench_python)
    host_hash = host["hash"]
    spec = replace(spec, build_args={"PROVENANCE": host_hash, **spec.build_args})
    run_step(f"build ({spec.engine})", build_argv(spec), env=engine_env(spec.engine), timeout=timeout)
    measured = image_provenance(spec.engine, spec.tag, timeout)
    record = build_stamp(spec.engine, spec.tag, host_hash, timeout, measured)
    stamp = stamp or stamp_path(spec.engine)
    if record["measured_provenance"] != host_hash:  # another lock or wheel, or the sources changed during the build
        differs = provenance.difference(host, measured)
        refusal = f"the provenance measured in it differs: {differs} (bench venv vs image)"
    elif record["label_provenance"] != host_hash:
        refusal = f"its label {PROVENANCE_LABEL} is {record['label_provenance']}, not the bench venv's {host_hash}"
    else:
        refusal = None
    if refusal:
        stamp.unlink(missing_ok=True)  # an older build's stamp would name this tag, which no longer holds it
        untagged = run_group(rmi_argv(spec.engine, spec.tag), timeout=QUERY_TIMEOUT_S, env=engine_env(spec.engine),
                             capture=True, stdin=subprocess.DEVNULL)
        left = "" if untagged.returncode == 0 else f"; removing the tag failed too: {untagged.stderr.strip()[-200:]}"
        raise ImageStepError(f"build: refused {spec.tag}: {refusal}{left}")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(record, indent=2) + "\n")
    return record


# -- export, load, charliecloud --------------------------------------------------------------

def save_argv(engine: str, tag: str, archive: Path = ARCHIVE) -> list[str]:
    fmt = ["--format", "docker-archive"] if engine == "podman" else []  # readable by docker, sarus, apptainer
    return [engine, "save", *fmt, "-o", str(archive), tag]


def load_argv(engine: str, archive: Path = ARCHIVE) -> list[str]:
    return [engine, "load", "-i", str(archive)]


def export_image(engine: str, tag: str, archive: Path = ARCHIVE, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)  # podman refuses to overwrite
    run_step(f"export ({engine} save)", save_argv(engine, tag, archive), env=engine_env(engine), timeout=timeout)
    return archive


def load_image(engine: str, tag: str, archive: Path = ARCHIVE, stamp: Path | None = None,
               timeout: float = DEFAULT_STEP_TIMEOUT_S) -> dict:
    """Load the archive into another engine (podman as a runtime after a docker build, or the
    reverse), then stamp it there as build_image does: the id and the provenance measured inside."""
    run_step(f"load into {engine}", load_argv(engine, archive), env=engine_env(engine), timeout=timeout)
    record = build_stamp(engine, tag, timeout=timeout)
    if stamp:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(record, indent=2) + "\n")
    return record


def clear_dev(image_dir: Path) -> list[str]:
    """Remove device nodes and files under IMAGE/dev: ch-run mounts the host's /dev there anyway."""
    removed = []
    for entry in sorted((image_dir / "dev").glob("*")):
        mode = entry.lstat().st_mode
        if not stat.S_ISDIR(mode):
            entry.unlink()
            removed.append(entry.name)
    return removed


def charliecloud_image(engine: str, tag: str, out: Path = CHARLIECLOUD_DIR, force: bool = False,
                       timeout: float = DEFAULT_STEP_TIMEOUT_S) -> Path:
    """Convert unless OUT was already made from this very image (its id is kept in OUT.image-id):
    the engine exports the image flat, ch-convert unpacks that tarball (Charliecloud.export_argvs says
    why not `ch-convert -i ENGINE` itself), and the image's ENV goes where ch-run --set-env reads it."""
    info = inspect_image(engine, tag)
    marker, image_id = Path(f"{out}.image-id"), image_digest(engine, tag, info)
    if not force and marker.exists() and marker.read_text().strip() == image_id and (out / "ch").is_dir():
        return out
    marker.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    container, flat_tar = Charliecloud.export_paths(str(out))
    create, export, remove = Charliecloud.export_argvs(engine, tag, container, flat_tar)
    # A conversion killed between create and rm leaves its container, whose name create would refuse:
    # forgotten first. And whatever fails here, the container and the 2 GB tarball go.
    forget = [*remove[:-1], "--force", remove[-1]]
    subprocess.run(forget, capture_output=True, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, check=False)
    try:
        run_step("charliecloud (create)", create, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, capture=True)
        run_step("charliecloud (export)", export, env=engine_env(engine), timeout=timeout)
        run_step("charliecloud (rm)", remove, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, capture=True)
        run_step("charliecloud (ch-convert)", Charliecloud.convert_argv(flat_tar, str(out)),
                 env=engine_env("charliecloud"), timeout=timeout)
    finally:
        subprocess.run(forget, capture_output=True, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, check=False)
        Path(flat_tar).unlink(missing_ok=True)
    environment = Path(Charliecloud.environment_file(str(out)))
    environment.parent.mkdir(parents=True, exist_ok=True)
    environment.write_text("".join(f"{pair}\n" for pair in info["Config"].get("Env") or []))
    clear_dev(out)
    marker.write_text(image_id + "\n")
    return out


def remove_image(tag: str, build_dir: Path | str = IMAGES, only=None,
                 timeout: float = DEFAULT_STEP_TIMEOUT_S) -> list[str]:
    """Give back the disk one built flavour holds: its tag in each engine that answers, and every file
    the workflow made from it (stamps, archive, Charliecloud directory, .sif, ...); `only` keeps it to
    some of image_files' names (an engine's name: its tag and its stamp). Removing a stamp with its
    image makes the next workflow run build it again instead of trusting an image that is gone."""
    files = image_files(tag, build_dir)
    if unknown := sorted(set(only or ()) - set(files)):
        raise ImageStepError(f"remove: no such part of an image: {', '.join(unknown)} (one of {', '.join(files)})")
    wanted = set(only or files)
    removed = []
    for engine in sorted(wanted & set(ENGINES)):
        if not engine_usable(engine)[0] or not image_exists(engine, tag):
            continue
        run_step(f"remove ({engine} rmi)", rmi_argv(engine, tag), env=engine_env(engine), timeout=timeout)
        removed.append(f"{engine} {tag}")
    paths = {Path(path) for name, path in files.items() if name in wanted}
    paths |= {Path(f"{path}.image-id") for path in paths if path.suffix == ".ch"}
    for path in sorted(paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(str(path))
    return removed


# -- what each runtime runs, and the commands that make it (owned by its class) ---------------

def built(tag: str, build_dir: Path | str = IMAGES, engine: str = "podman", gpus: bool = False) -> BuiltImage:
    return BuiltImage(tag, engine, str(build_dir), gpus)


def image_files(tag: str, build_dir: Path | str = IMAGES, gpus: bool = False) -> dict[str, str]:
    """Every file the workflow can make from the image `tag`: each runtime's artifact, the archive
    they are converted from, the Singularity definition and Charliecloud's directory."""
    image = built(tag, build_dir, gpus=gpus)
    files = {name: cls.artifact(image) for name, cls in CONTAINER_RUNTIMES.items() if cls.artifact(image)}
    return {**files, "archive": image.archive, "definition": image.definition,
            "charliecloud-dir": Charliecloud.reference(image)}


def built_image(runtime: str, tag: str, build_dir: Path | str = IMAGES, gpus: bool = False) -> tuple[str, str] | None:
    """(the image reference `runtime` runs, the file its runs depend on), or None if not buildable here."""
    cls, image = CONTAINER_RUNTIMES.get(runtime), built(tag, build_dir, gpus=gpus)
    if cls is None or cls.artifact(image) is None:
        return None  # bare metal, and Shifter (its gateway serves images; it cannot take a local build)
    return cls.reference(image), cls.artifact(image)


def runtime_commands(engine: str, tag: str, registry: str = "REGISTRY", build_dir: Path | str = IMAGES,
                     gpus: bool = False) -> dict[str, list[list[str]]]:
    """Every runtime's prepare commands for the built image (what `images print-commands` shows)."""
    image = built(tag, build_dir, engine, gpus)
    commands = {name: cls.prepare_commands(image, registry) for name, cls in CONTAINER_RUNTIMES.items()}
    return {**commands, "apptainer-def": [Apptainer.build_argv(image.file(".sif"), image.definition)]}


def flavour_tag(tag: str, env: BenchEnv, flavour: MpiFlavour) -> str:
    """The tag of one flavour of the built image: the framework's suffix, then the MPI flavour's
    (localhost/containerbench:latest, ...:latest-mpich, ...:latest-torch, ...:latest-torch-mpich)."""
    return flavour.tag(env.tag(tag))


def resolve_images(config: dict, build_dir: Path | str = IMAGES) -> dict[ImageUse, str]:
    """Fill in the image each runtime runs for each MPI model and framework of the sweep
    (images.<runtime>.image, native_image: the MPICH flavour, torch_image, torch_native_image:
    the PyTorch flavours) where the workflow builds it; return who runs a built image -> the file
    their runs depend on. An image the config names is run as it is and depends on nothing built."""
    images = config["images"]
    tag, gpus = images["build"]["tag"], config["slurm"]["gpus_per_node"] > 0
    artifacts = {}
    for runtime in config["runtimes"]:
        if runtime == "bare-metal":
            continue
        settings = images.setdefault(runtime, {})
        models = mpi_models(config, runtime)
        for framework, model in itertools.product(config["benchmark"]["frameworks"], models):
            key, hybrid_key = image_key(model, framework), image_key("hybrid", framework)
            if settings.get(key) or (models == ("native",) and settings.get(hybrid_key)):
                continue  # a native-only runtime's `image` is its MPICH-ABI image
            env, flavour = bench_env(config, framework), MPI_FLAVOURS[MODEL_FLAVOUR[model]]
            built = built_image(runtime, flavour_tag(tag, env, flavour), build_dir, gpus=gpus)
            if built is None:
                raise ConfigError(f"config: 'images.{runtime}.{key}' is missing; allowed: the image reference "
                                  f"{runtime} runs (the workflow cannot build a {runtime} image locally)")
            settings[key], artifacts[ImageUse(runtime, model, framework)] = built
    return artifacts


# What an image carries, as pip sees it: the lock of a bare-metal venv to compare it with.
FREEZE_ARGS = ("list", "--format=freeze", "--disable-pip-version-check")
NOT_LOCKED = ("containerbench", "horovod")  # the package comes from the clone; Horovod is compiled


def image_lock(runtime, timeout: float = QUERY_TIMEOUT_S) -> str:
    """The distributions installed in `runtime`'s image, as a lock for scripts/setup-venv.sh
    (BENCH_LOCK=...): a bare-metal venv with the versions a vendor's image carries. Horovod's version
    is a comment: setup-venv.sh compiles it against the TensorFlow of the lock."""
    if runtime.requires_launcher:
        raise ImageStepError(f"freeze: runtime {runtime.name!r} starts only under {runtime.requires_launcher}; "
                             f"run this command inside an allocation's step there")
    request = RunRequest(module="pip", args=FREEZE_ARGS, workdir=os.getcwd())
    done = run_step(f"freeze ({runtime.name})", runtime.rank_argv(request), capture=True, timeout=timeout,
                    env={**host_environment(), **runtime.environment(request)})
    pins = sorted((line.strip() for line in done.stdout.splitlines() if "==" in line), key=str.lower)
    locked = [pin for pin in pins if pin.split("==")[0].lower() not in NOT_LOCKED]
    horovod = [f"# {pin.split('+')[0]}" for pin in pins if pin.lower().startswith("horovod==")]
    image = getattr(runtime, "image", "")
    return "\n".join([f"# What {image} carries ({runtime.name}: pip list --format=freeze), for a bare-metal venv:",
                      "#   BENCH_LOCK=<this file> scripts/setup-venv.sh bench VENV", *horovod, *locked]) + "\n"


def check_bench_env(config: dict, repo: Path | str, artifacts: dict[ImageUse, str] | None = None) -> None:
    """The GPU environment's image installs a Horovod wheel that only `make gpu-env` can build
    (it needs nvcc): say so before any job, instead of failing the build an hour in. Its MPICH
    flavour would need a second such wheel, compiled against MPICH: without NCCL operations the
    native runs would average GPU gradients through the host, so they are refused. The PyTorch
    image is built from envs/bench-torch.lock.txt, whose torch is the CPU one: a GPU sweep names
    its own."""
    env = BENCH_ENVS[config["benchmark_env"]]
    uses = sorted(artifacts or {})
    native = [use for use in uses if use.mpi_model == "native" and use.framework == "tensorflow"]
    if env.horovod_gpu_operations and native:
        label = runtime_label(native[0].runtime, "native")
        raise ConfigError(f"config: {label} would run the MPICH flavour of the '{env.name}' image, whose "
                          f"Horovod the workflow can only build without {env.horovod_gpu_operations} operations; "
                          f"allowed: images.{native[0].runtime}.native_image naming a site's MPICH-based "
                          "GPU image, or mpi_model hybrid")
    torch = [use for use in uses if use.framework == "pytorch"]
    if config["slurm"]["gpus_per_node"] > 0 and torch:
        key = image_key(torch[0].mpi_model, "pytorch")
        raise ConfigError(f"config: 'images.{torch[0].runtime}.{key}' is missing: a GPU sweep's PyTorch ranks need "
                          f"CUDA's torch, and the image the workflow builds has the CPU one of "
                          f"{BENCH_ENVS['torch'].lock}; allowed: a site's CUDA PyTorch image there (e.g. NGC's), "
                          "or runtimes [bare-metal] for pytorch")
    wheels = Path(repo) / env.wheelhouse
    builds_tensorflow = any(use.framework == "tensorflow" for use in uses)
    if env.horovod_gpu_operations and builds_tensorflow and not any(wheels.glob("horovod-*-linux_x86_64.whl")):
        raise ConfigError(f"config: 'benchmark_env' = '{env.name}' builds its image with the Horovod wheel that "
                          f"`make gpu-env` puts in {env.wheelhouse} ({env.horovod_gpu_operations} operations, "
                          f"compiled by CUDA 11.8's nvcc), and there is none; allowed: run `make gpu-env` "
                          "first, or benchmark_env: cpu")


# Runtimes whose artifact `images prepare` makes from the archive or the engine's store, with
# nothing of their own to check (their class's prepare_from; docker/podman load and Charliecloud
# have their own steps).
CONVERTED = tuple(name for name, cls in CONTAINER_RUNTIMES.items() if cls.prepare_from)


def prepare_runtime(name: str, image: BuiltImage, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> str:
    """Run `name`'s prepare commands; a runtime whose artifact is not the file the commands make
    (sarus, podman-hpc: the image lives in their own store) gets a stamp naming what it runs."""
    cls = CONTAINER_RUNTIMES[name]
    artifact = Path(cls.artifact(image))
    artifact.parent.mkdir(parents=True, exist_ok=True)
    for argv in cls.prepare_commands(image):
        run_step(f"{name} ({argv[0]} {argv[1]})", argv, timeout=timeout)
    if cls.artifact_is_stamp:
        _write(artifact, json.dumps({"image": cls.reference(image)}) + "\n")
    return cls.reference(image)


# -- command line ----------------------------------------------------------------------------

def step_argv(python, engine: str, tag: str, bench_python, repo, env: BenchEnv,
              flavour: MpiFlavour = MPI_FLAVOURS["openmpi"]) -> list[str]:
    """The command line of this module for one flavour of the image, less the step (the workflow's rules)."""
    argv = [str(python), "-m", "containerbench.images", "--engine", engine, "--tag", tag,
            "--bench-python", str(bench_python), "--repo", str(repo), "--env", env.name]
    return argv + (["--mpi", flavour.name] if flavour.wheels else [])



def _build_args(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def _write(path: Path | None, text: str) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m containerbench.images", description=__doc__.splitlines()[0])
    cli.add_argument("--engine", default=os.environ.get("CONTAINERBENCH_ENGINE", "podman"), choices=ENGINES,
                     help="the engine that builds (and holds) the image")
    cli.add_argument("--tag", help=f"default {IMAGE_REPO}:<provenance hash of the bench venv>")
    cli.add_argument("--bench-python", type=Path, default=BENCH_PYTHON)
    cli.add_argument("--env", choices=sorted(BENCH_ENVS), default="cpu",
                     help="the benchmark environment: its lock and wheelhouse (config key benchmark_env)")
    cli.add_argument("--mpi", choices=sorted(MPI_FLAVOURS), default="openmpi",
                     help="the image's MPI flavour: openmpi (hybrid model) or mpich (native model); "
                          "the mpich image's tag and wheelhouse end in -mpich")
    cli.add_argument("--repo", type=Path, default=Path("."),
                     help="the repository: build context, containers/Dockerfile, envs/, build/ (default: .)")
    cli.add_argument("--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S, metavar="SECONDS",
                     help=f"each step fails after this long (default {DEFAULT_STEP_TIMEOUT_S})")
    steps = cli.add_subparsers(dest="step", required=True)
    step = steps.add_parser("base", help="debootstrap a Debian base and import it into the engine")
    step.add_argument("--base-image", default=BASE_IMAGE)
    step.add_argument("--mirror")
    step.add_argument("--force", action="store_true")
    step.add_argument("--marker", type=Path, help="write the base's name here when done")
    step = steps.add_parser("wheelhouse", help="the lock as wheels, and the Horovod wheel, for an offline build")
    step.add_argument("--dest", type=Path, help="default: the environment's, e.g. REPO/build/wheelhouse")
    step.add_argument("--python-version", help="the image's Python, e.g. 3.10 for another base")
    step.add_argument("--marker", type=Path, help="write the wheelhouse's file names here when done")
    step = steps.add_parser("build", help="build containers/Dockerfile; refuse an image whose provenance differs")
    step.add_argument("--base-image", default=BASE_IMAGE)
    step.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    step.add_argument("--apt-packages", default="", help="installed at build time (then the build has network)")
    step.add_argument("--network", help="default: none, or host with --apt-packages")
    step.add_argument("--stamp", type=Path)
    step = steps.add_parser("export", help="save the image as a docker archive")
    step.add_argument("--archive", type=Path, default=ARCHIVE)
    step = steps.add_parser("load", help="load the archive into the other engine and stamp it there")
    step.add_argument("--into", choices=ENGINES, required=True)
    step.add_argument("--archive", type=Path, default=ARCHIVE)
    step.add_argument("--stamp", type=Path)
    step = steps.add_parser("charliecloud", help="ch-convert the image into a Charliecloud directory")
    step.add_argument("--out", type=Path, default=CHARLIECLOUD_DIR)
    step.add_argument("--force", action="store_true")
    step = steps.add_parser("charliecloud-nvidia", help="inject this node's NVIDIA libraries (ch-fromhost --nvidia)")
    step.add_argument("--out", type=Path, default=CHARLIECLOUD_DIR)
    step.add_argument("--marker", type=Path, required=True, help="written when done")
    step = steps.add_parser("prepare", help="run a converting runtime's prepare commands (its class's)")
    step.add_argument("--runtime", required=True, choices=sorted(set(CONVERTED)))
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step = steps.add_parser("remove", help="remove the image's tag from each engine and every file made from it")
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step.add_argument("--every-flavour", action="store_true",
                      help="every environment's and MPI flavour's image of the tag, not only --env's and --mpi's")
    step.add_argument("--only", action="append", metavar="PART",
                      help="only this part (an engine, a runtime's artifact, archive, definition); repeatable")
    step = steps.add_parser("print-commands", help="print every runtime's image commands")
    step.add_argument("--registry", default="REGISTRY")
    step.add_argument("--build-dir", type=Path, default=IMAGES)
    step.add_argument("--gpus", action="store_true")
    step.add_argument("--json", action="store_true")
    return cli


def run(args: argparse.Namespace) -> str:
    """Do one step; return what it made, for the log."""
    timeout, repo, env, flavour = args.step_timeout, args.repo, BENCH_ENVS[args.env], MPI_FLAVOURS[args.mpi]
    needs_tag = args.step not in ("base", "wheelhouse", "charliecloud-nvidia")
    tag = flavour_tag(args.tag or default_tag(args.bench_python), env, flavour) if needs_tag else None
    if args.step == "base":
        done = make_base(args.engine, args.base_image, repo / "build" / "base" / "rootfs", args.mirror, args.force,
                         timeout)
        _write(args.marker, args.base_image + "\n")
        return done
    if args.step == "wheelhouse" and flavour.wheels:
        names = make_flavour_wheelhouse(flavour, args.bench_python, repo, timeout, env)
        _write(args.marker, "\n".join(names) + "\n")
        return "\n".join(names)
    if args.step == "wheelhouse":
        names = make_wheelhouse(args.bench_python, args.dest or repo / env.wheelhouse, repo, args.python_version,
                                timeout, env)
        _write(args.marker, "\n".join(names) + "\n")
        return "\n".join(names)
    if args.step == "build":
        build_args = {**image_build_args(env, flavour),
                      **({"APT_PACKAGES": args.apt_packages} if args.apt_packages else {}), **_build_args(args.build_arg)}
        # apt packages at build time need the network; the default base needs nothing from outside.
        network = args.network or ("host" if args.apt_packages else "none")
        spec = ImageSpec(args.engine, tag, args.base_image, build_args, repo / DOCKERFILE, repo, network)
        return json.dumps(build_image(spec, args.bench_python, args.stamp, timeout), indent=2)
    if args.step == "export":
        return str(export_image(args.engine, tag, args.archive, timeout))
    if args.step == "load":
        return json.dumps(load_image(args.into, tag, args.archive, args.stamp, timeout), indent=2)
    if args.step == "charliecloud":
        return str(charliecloud_image(args.engine, tag, args.out, args.force, timeout))
    if args.step == "charliecloud-nvidia":
        run_step("charliecloud (ch-fromhost --nvidia)", Charliecloud.nvidia_argv(str(args.out)),
                 env=engine_env("charliecloud"), timeout=timeout)
        _write(args.marker, f"{args.out}: ch-fromhost --nvidia done\n")
        return str(args.out)
    if args.step == "prepare":
        return prepare_runtime(args.runtime, built(tag, args.build_dir, args.engine), timeout)
    if args.step == "remove":
        base = args.tag or default_tag(args.bench_python)
        tags = sorted({flavour_tag(base, each_env, each_flavour) for each_env in BENCH_ENVS.values()
                       for each_flavour in MPI_FLAVOURS.values()}) if args.every_flavour else [tag]
        removed = [what for each in tags for what in remove_image(each, args.build_dir, args.only, timeout)]
        return "\n".join(f"removed {what}" for what in removed) or f"nothing of {', '.join(tags)} to remove"
    commands = runtime_commands(args.engine, tag, args.registry, args.build_dir, args.gpus)
    return json.dumps(commands, indent=2) if args.json else \
        "\n".join(f"{name}: {shlex.join(argv)}" for name, argvs in commands.items() for argv in argvs)


def main(argv: list[str] | None = None) -> int:
    try:
        print(run(parser().parse_args(argv)))
    except ImageStepError as error:
        print(f"containerbench.images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
