"""Container images: build the one benchmark image and hand it to every runtime.

One definition, containers/Dockerfile, built offline (no registry is reachable)
from a local Debian base and a wheelhouse, so the image holds the same pinned
packages and package code as the bare-metal venv and reports the same
provenance hash. Every step is an argv builder plus a small runner:

  python -m containerbench.images base             debootstrap -> localhost/containerbench-base:bookworm
  python -m containerbench.images wheelhouse       pip download the lock, build the Horovod wheel once
  python -m containerbench.images build            <engine> build --network none -> stamp JSON
  python -m containerbench.images export           <engine> save -> build/images/containerbench.tar
  python -m containerbench.images charliecloud     ch-convert -> build/images/containerbench.ch
  python -m containerbench.images singularity-def  spython, corrected -> build/images/containerbench.def
  python -m containerbench.images print-commands   apptainer, enroot, sarus, shifter, podman-hpc argv
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

BUILD = Path("build")
IMAGES = BUILD / "images"
WHEELHOUSE = BUILD / "wheelhouse"
DOCKERFILE = Path("containers/Dockerfile")
BENCH_PYTHON = Path(".venv-bench/bin/python")
BASE_IMAGE = "localhost/containerbench-base:bookworm"
IMAGE_REPO = "localhost/containerbench"
ARCHIVE = IMAGES / "containerbench.tar"
BASE_ARCHIVE = IMAGES / "containerbench-base.tar"
CHARLIECLOUD_DIR = IMAGES / "containerbench.ch"
DEFINITION = IMAGES / "containerbench.def"
SIF = IMAGES / "containerbench.sif"
SQUASHFS = IMAGES / "containerbench.sqsh"
PROVENANCE_LABEL = "org.containerbench.provenance"
ENGINES = ("docker", "podman")
# What every rank needs at run time besides the venv: Python and Open MPI (mpi4py and
# Horovod's mpi_lib link libmpi.so.40 / libmpi_cxx.so.40 from libopenmpi3).
BASE_PACKAGES = ("python3", "python3-venv", "openmpi-bin", "libopenmpi3", "ca-certificates")
SUITE, GLIBC = "bookworm", (2, 36)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOROVOD_FLAGS = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITH_MPI": "1",
                 "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
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

def engine_env(engine: str) -> dict[str, str]:
    env = dict(os.environ)
    if engine == "docker":
        env["DOCKER_BUILDKIT"] = "0"  # Debian's docker.io has no buildx
    if engine == "charliecloud":
        env.setdefault("USER", pwd.getpwuid(os.getuid()).pw_name)  # ch-run refuses an unset $USER
        env["PATH"] = "/usr/bin:" + env.get("PATH", DEFAULT_PATH)  # ch-image needs Debian's python3 (lark)
    return env


# Every image step is time-limited, so a wedged engine fails its rule with a message
# instead of holding the workflow (and a CI job) forever. The workflow sets this from
# images.step_timeout_s; a base with apt or a slow mirror may need more than the default.
STEP_TIMEOUT_S = 3600


def run_step(step: str, argv: list[str], *, env=None, capture=False, stdin=None,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run one image step in its own process group (podman and ch-convert start helpers that
    would outlive a killed parent); it never reads a terminal or a CI pipe."""
    from containerbench.launch import run_group

    timeout = STEP_TIMEOUT_S if timeout is None else timeout
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


def engine_usable(engine: str) -> tuple[bool, str]:
    """Can `engine` build or convert images here? Its runtime class's own check (for docker:
    the daemon answers), run in the environment the image steps use."""
    from containerbench.runtimes import CONTAINER_RUNTIMES, run_probe

    ok, detail = run_probe(CONTAINER_RUNTIMES[engine].probe, env=engine_env(engine), timeout=30)
    if not ok and engine == "docker" and shutil.which("docker"):  # installed, but which daemon was asked
        detail += f" (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'the default socket')})"
    return ok, detail


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
    return subprocess.run(argv, capture_output=True, env=engine_env(engine)).returncode == 0


def make_base(engine: str, tag: str = BASE_IMAGE, rootfs: Path = BUILD / "base" / "rootfs",
              mirror: str | None = None, force: bool = False) -> str:
    if image_exists(engine, tag) and not force:
        return f"{tag} already in {engine}"
    done_marker = rootfs.with_name(rootfs.name + ".complete")
    if force or not done_marker.exists():
        shutil.rmtree(rootfs, ignore_errors=True)  # a half-made rootfs from an interrupted run
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        run_step("base (debootstrap)", debootstrap_argv(rootfs, mirror or apt_mirror()))
        done_marker.touch()
    tar = subprocess.Popen(rootfs_tar_argv(rootfs), stdout=subprocess.PIPE)
    try:
        run_step("base (import)", import_argv(engine, tag), stdin=tar.stdout, env=engine_env(engine))
    finally:
        tar.stdout.close()
        if tar.wait() != 0:
            raise ImageStepError(f"base (tar) failed (exit {tar.returncode}): {shlex.join(rootfs_tar_argv(rootfs))}")
    return f"{tag} imported into {engine}"


# -- wheelhouse ------------------------------------------------------------------------------

def horovod_version(root: Path = Path(".")) -> str:
    match = re.search(r"^horovod==(\S+)", (root / "envs" / "bench.txt").read_text(), re.M)
    if not match:
        raise ImageStepError("wheelhouse: no horovod==VERSION pin in envs/bench.txt")
    return match.group(1)


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
    return [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--dest", str(dest),
            *platform_args(python_version), "-r", str(lock), *extra]


def sdist_argv(python: Path, dest: Path, version: str) -> list[str]:
    return [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
            "--no-binary=:all:", "--no-build-isolation", "--dest", str(dest), f"horovod=={version}"]


def horovod_wheel_argv(python: Path, sdist: Path, dest: Path) -> list[str]:
    return [str(python), "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps",
            "--no-build-isolation", "--wheel-dir", str(dest), str(sdist)]


def _bench_query(python: Path, code: str) -> str:
    return run_step("bench venv", [str(python), "-c", code], capture=True).stdout.strip()


def build_tool_pins(python: Path) -> list[str]:
    code = ("import importlib.metadata as m; "
            f"print(' '.join(n + '==' + m.version(n) for n in {list(BUILD_TOOLS)!r}))")
    return _bench_query(python, code).split()


def make_wheelhouse(bench_python: Path = BENCH_PYTHON, dest: Path = WHEELHOUSE, root: Path = Path("."),
                    python_version: str | None = None) -> list[str]:
    """Fill `dest` for an offline image build; the Horovod wheel is built only when missing."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = build_tool_pins(bench_python)
    (dest / "build-tools.txt").write_text("\n".join(pins) + "\n")
    host_version = _bench_query(bench_python, "import sys; print('%d.%d' % sys.version_info[:2])")
    run_step("wheelhouse (download)", download_argv(bench_python, root / "envs" / "bench.lock.txt", dest, pins,
                                                    python_version or host_version))
    version = horovod_version(root)
    sdist = dest / f"horovod-{version}.tar.gz"
    if not sdist.exists():
        run_step("wheelhouse (horovod sdist)", sdist_argv(bench_python, dest, version))
    abi = "cp" + host_version.replace(".", "")
    wheel = dest / f"horovod-{version}-{abi}-{abi}-linux_x86_64.whl"
    if not wheel.exists():  # 3-5 minutes; links the host's Debian Open MPI, which the base also has
        env = {**os.environ, **HOROVOD_FLAGS, "MAKEFLAGS": os.environ.get("MAKEFLAGS", f"-j{os.cpu_count()}")}
        run_step("wheelhouse (horovod wheel)", horovod_wheel_argv(bench_python, sdist, dest), env=env)
    return sorted(p.name for p in dest.iterdir())


# -- build, inspect, stamp -------------------------------------------------------------------

def host_provenance(bench_python: Path = BENCH_PYTHON) -> dict:
    out = run_step("provenance (host)", [str(bench_python), "-m", "containerbench.provenance"], capture=True)
    return json.loads(out.stdout)


def default_tag(bench_python: Path = BENCH_PYTHON) -> str:
    """Images are tagged with the benchmark's provenance hash: a stale image has another tag."""
    return f"{IMAGE_REPO}:{host_provenance(bench_python)['hash']}"


def build_argv(spec: ImageSpec) -> list[str]:
    argv = [spec.engine, "build", "--network", spec.network, "-f", str(spec.dockerfile), "-t", spec.tag]
    for name, value in spec.all_build_args().items():
        argv += ["--build-arg", f"{name}={value}"]
    if "PROVENANCE" in spec.build_args:  # podman 4.3 reuses a cached LABEL step when only the ARG changed
        argv += ["--label", f"{PROVENANCE_LABEL}={spec.build_args['PROVENANCE']}"]
    return argv + [str(spec.context)]


def inspect_image(engine: str, tag: str) -> dict:
    out = run_step("inspect", [engine, "image", "inspect", tag], capture=True, env=engine_env(engine))
    return json.loads(out.stdout)[0]


def image_digest(engine: str, tag: str, info: dict | None = None) -> str:
    """The image id (config digest), 'sha256:...' from docker and podman alike."""
    image_id = (info or inspect_image(engine, tag))["Id"]
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def image_run_argv(engine: str, tag: str, command: list[str]) -> list[str]:
    return [engine, "run", "--rm", "--network", "none", tag, *command]


def image_provenance(engine: str, tag: str) -> dict:
    argv = image_run_argv(engine, tag, ["python3", "-m", "containerbench.provenance"])
    return json.loads(run_step("provenance (image)", argv, capture=True, env=engine_env(engine)).stdout)


def build_stamp(engine: str, tag: str, host_hash: str | None = None) -> dict:
    info = inspect_image(engine, tag)
    measured = image_provenance(engine, tag)
    return {"engine": engine, "image": tag, "image_id": image_digest(engine, tag, info),
            "label_provenance": ((info.get("Config") or {}).get("Labels") or {}).get(PROVENANCE_LABEL),
            "measured_provenance": measured["hash"], "host_provenance": host_hash,
            "python": measured["python"], "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def stamp_path(engine: str) -> Path:
    return IMAGES / f"containerbench.{engine}.json"


def build_image(spec: ImageSpec, bench_python: Path = BENCH_PYTHON, stamp: Path | None = None) -> dict:
    """Build, then measure the provenance inside the image; refuse an image that differs from bare metal."""
    host_hash = host_provenance(bench_python)["hash"]
    spec = replace(spec, build_args={"PROVENANCE": host_hash, **spec.build_args})
    run_step(f"build ({spec.engine})", build_argv(spec), env=engine_env(spec.engine))
    record = build_stamp(spec.engine, spec.tag, host_hash)
    for what in ("measured_provenance", "label_provenance"):
        if record[what] != host_hash:  # e.g. the sources changed during the build
            raise ImageStepError(f"build: {spec.tag} has {what} {record[what]}, the bench venv {host_hash}: "
                                 "the image holds another benchmark")
    stamp = stamp or stamp_path(spec.engine)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(record, indent=2) + "\n")
    return record


# -- export, load, charliecloud --------------------------------------------------------------

def save_argv(engine: str, tag: str, archive: Path = ARCHIVE) -> list[str]:
    fmt = ["--format", "docker-archive"] if engine == "podman" else []  # readable by docker, sarus, apptainer
    return [engine, "save", *fmt, "-o", str(archive), tag]


def load_argv(engine: str, archive: Path = ARCHIVE) -> list[str]:
    return [engine, "load", "-i", str(archive)]


def export_image(engine: str, tag: str, archive: Path = ARCHIVE, load_into: str | None = None) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)  # podman refuses to overwrite
    run_step(f"export ({engine} save)", save_argv(engine, tag, archive), env=engine_env(engine))
    if load_into:  # e.g. podman as a runtime after a docker build
        run_step(f"export ({load_into} load)", load_argv(load_into, archive), env=engine_env(load_into))
    return archive


def ch_convert_argv(engine: str, tag: str, out: Path = CHARLIECLOUD_DIR) -> list[str]:
    return ["ch-convert", "-i", engine, "-o", "dir", tag, str(out)]


def ch_run_argv(image_dir: Path, command: list[str]) -> list[str]:
    return ["ch-run", "--set-env", str(image_dir), "--", *command]  # --set-env: the image's ENV (PATH to the venv)


def clear_dev(image_dir: Path) -> list[str]:
    """Remove device nodes and files under IMAGE/dev: ch-run mounts the host's /dev there anyway."""
    removed = []
    for entry in sorted((image_dir / "dev").glob("*")):
        mode = entry.lstat().st_mode
        if not stat.S_ISDIR(mode):
            entry.unlink()
            removed.append(entry.name)
    return removed


def charliecloud_image(engine: str, tag: str, out: Path = CHARLIECLOUD_DIR, force: bool = False) -> Path:
    """Convert unless OUT was already made from this very image (its id is kept in OUT.image-id)."""
    marker, image_id = Path(f"{out}.image-id"), image_digest(engine, tag)
    if not force and marker.exists() and marker.read_text().strip() == image_id and (out / "ch").is_dir():
        return out
    marker.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_step("charliecloud (ch-convert)", ch_convert_argv(engine, tag, out), env=engine_env("charliecloud"))
    clear_dev(out)
    marker.write_text(image_id + "\n")
    return out


# -- singularity / apptainer -----------------------------------------------------------------

def dockerfile_args(dockerfile: Path) -> dict[str, str]:
    """ARG names and defaults, unquoted as Docker does (ARG X="" is empty)."""
    args = {}
    for line in dockerfile.read_text().splitlines():
        if re.match(r"\s*ARG\s", line, re.I):
            for word in shlex.split(line.split(None, 1)[1], comments=True):
                name, _, value = word.partition("=")
                args[name] = value
    return args


def expand_args(text: str, values: dict[str, str]) -> str:
    """Expand $NAME, ${NAME}, ${NAME:-word}, ${NAME:+word} for the given ARG names only."""
    def braced(match):
        name, op, word = match.group(1), match.group(2), match.group(3) or ""
        value = values[name]
        if op == ":-":
            return value or expand_args(word, values)
        if op == ":+":
            return expand_args(word, values) if value else ""
        return value
    names = "|".join(sorted(map(re.escape, values), key=len, reverse=True)) or "(?!)"
    text = re.sub(r"\$\{(" + names + r")(?:(:[-+])([^}]*))?\}", braced, text)
    return re.sub(r"\$(" + names + r")(?![A-Za-z0-9_])", lambda m: values[m.group(1)], text)


def bootstrap_for(base: str) -> str:
    if base.endswith((".tar", ".tar.gz", ".tgz")):
        return "docker-archive"
    return "docker-daemon" if base.startswith("localhost/") else "docker"


def singularity_definition(dockerfile: Path = DOCKERFILE, build_args: dict | None = None,
                           bootstrap: str | None = None, source: str | None = None,
                           context: str = ".") -> str:
    """spython's conversion of the Dockerfile, with what it gets wrong put right."""
    from spython.logger import bot
    from spython.main.parse.parsers import DockerParser
    from spython.main.parse.writers import SingularityWriter

    values = {**dockerfile_args(dockerfile), **(build_args or {})}
    if any("\n" in v for v in values.values()):
        raise ValueError("build arguments must be single lines")
    level, bot.level = bot.level, 0  # quiet: it warns that COPY sources are not in the caller's cwd
    try:
        recipe = DockerParser(str(dockerfile)).recipe
        converted = SingularityWriter(recipe).convert()
    finally:
        bot.level = level
    environ = {line for layer in recipe.values() for line in layer.environ}
    froms = re.findall(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", dockerfile.read_text(), re.M | re.I)
    base = expand_args(froms[-1], values)  # the stage that makes the image
    bootstrap = bootstrap or bootstrap_for(base)
    source = source or (str(BASE_ARCHIVE) if bootstrap == "docker-archive" else base)
    out, section = [f"Bootstrap: {bootstrap}", f"From: {source}"], ""
    for line in converted.splitlines():
        if re.match(r"(Bootstrap|From|Stage):", line) or (not out[-1] and not line):
            continue
        if line.startswith("%"):
            section = line.split()[0]
            out += ["", line] if out[-1] else [line]
            continue
        raw, line = line, expand_args(line, values)
        if raw.strip() != "\\" and line.strip() == "\\":
            continue  # a continuation line whose ${ARG:+...} expanded to nothing
        if section == "%files" and line.strip():
            src, dest = line.split(None, 1)  # COPY sources are relative to the build context
            line = f"{os.path.normpath(os.path.join(context, src))} {dest}"
        elif section == "%labels" and "=" in line.split()[0]:
            line = line.replace("=", " ", 1)  # Apptainer labels are "KEY VALUE"
        elif section == "%post":
            name = raw.split("=", 1)[0]
            if re.match(r"su -\s+\S+", line):  # spython's USER; the container runs as its caller anyway
                line = f"# {line.split('#', 1)[-1].strip()}: Apptainer runs as the invoking user"
            elif name in values and "=" in raw and not raw.rstrip().endswith("\\"):
                line = f"{name}={shlex.quote(values[name])}"  # ARG, with the build's value
            elif expand_args(line, values) in {expand_args(e, values) for e in environ}:
                line = f"export {line}"  # ENV holds for the later RUN steps too
        out.append(line)
    return "\n".join(out).strip() + "\n"


def write_singularity_definition(out: Path = DEFINITION, **kwargs) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(singularity_definition(**kwargs))
    return out


def apptainer_build_argv(sif: Path = SIF, archive: Path = ARCHIVE, program: str = "apptainer") -> list[str]:
    return [program, "build", "--fakeroot", str(sif), f"docker-archive://{archive}"]


def apptainer_build_def_argv(sif: Path = SIF, definition: Path = DEFINITION, program: str = "apptainer") -> list[str]:
    return [program, "build", "--fakeroot", str(sif), str(definition)]


# -- other runtimes' image steps (not installable here: argv only) ---------------------------

def enroot_import_argv(engine: str, tag: str, out: Path = SQUASHFS) -> list[str]:
    scheme = {"docker": "dockerd", "podman": "podman"}[engine]
    return ["enroot", "import", "-o", str(out), f"{scheme}://{tag}"]


def sarus_name(tag: str) -> str:
    """Sarus names a loaded image load/library/NAME:TAG; give it NAME:TAG without a registry."""
    return tag.rsplit("/", 1)[-1]


def sarus_load_argv(tag: str, archive: Path = ARCHIVE) -> list[str]:
    return ["sarus", "load", str(archive), sarus_name(tag)]


def push_argvs(engine: str, tag: str, registry_image: str) -> list[list[str]]:
    if engine == "podman":
        return [["podman", "push", tag, registry_image]]
    return [["docker", "tag", tag, registry_image], ["docker", "push", registry_image]]


def shifter_pull_argv(registry_image: str) -> list[str]:
    # Shifter pulls from a registry only (its gateway's import of a squashfs is admin-enabled, no CLI).
    return ["shifterimg", "pull", f"docker:{registry_image}"]


def podman_hpc_argvs(tag: str, archive: Path = ARCHIVE) -> list[list[str]]:
    return [["podman-hpc", "load", "-i", str(archive)], ["podman-hpc", "migrate", tag]]


def runtime_commands(engine: str, tag: str, registry: str = "REGISTRY") -> dict[str, list[list[str]]]:
    registry_image = f"{registry}/{sarus_name(tag)}"
    return {"apptainer": [apptainer_build_argv()], "singularity": [apptainer_build_argv(program="singularity")],
            "apptainer-def": [apptainer_build_def_argv()], "enroot": [enroot_import_argv(engine, tag)],
            "sarus": [sarus_load_argv(tag)],
            "shifter": [*push_argvs(engine, tag, registry_image), shifter_pull_argv(registry_image)],
            "podman-hpc": podman_hpc_argvs(tag), "charliecloud": [ch_convert_argv(engine, tag)]}


# -- command line ----------------------------------------------------------------------------

def _build_args(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m containerbench.images", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default=os.environ.get("CONTAINERBENCH_ENGINE", "podman"), choices=ENGINES)
    parser.add_argument("--tag", help=f"default {IMAGE_REPO}:<provenance hash of the bench venv>")
    parser.add_argument("--bench-python", type=Path, default=BENCH_PYTHON)
    steps = parser.add_subparsers(dest="step", required=True)
    base = steps.add_parser("base")
    base.add_argument("--base-image", default=BASE_IMAGE)
    base.add_argument("--mirror")
    base.add_argument("--force", action="store_true")
    wheels = steps.add_parser("wheelhouse")
    wheels.add_argument("--dest", type=Path, default=WHEELHOUSE)
    wheels.add_argument("--python-version", help="the image's Python, e.g. 3.10 for another base")
    build = steps.add_parser("build")
    build.add_argument("--base-image", default=BASE_IMAGE)
    build.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    build.add_argument("--network", default="none")
    build.add_argument("--stamp", type=Path)
    export = steps.add_parser("export")
    export.add_argument("--archive", type=Path, default=ARCHIVE)
    export.add_argument("--load-into", choices=ENGINES)
    charlie = steps.add_parser("charliecloud")
    charlie.add_argument("--out", type=Path, default=CHARLIECLOUD_DIR)
    charlie.add_argument("--force", action="store_true")
    sdef = steps.add_parser("singularity-def")
    sdef.add_argument("--bootstrap", choices=("docker", "docker-daemon", "docker-archive"))
    sdef.add_argument("--from", dest="source", help="image or archive to bootstrap from")
    sdef.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    sdef.add_argument("--out", type=Path, default=DEFINITION)
    show = steps.add_parser("print-commands")
    show.add_argument("--registry", default="REGISTRY")
    show.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    try:
        needs_tag = args.step in ("build", "export", "charliecloud", "print-commands")
        tag = args.tag or (default_tag(args.bench_python) if needs_tag else None)
        if args.step == "base":
            print(make_base(args.engine, args.base_image, mirror=args.mirror, force=args.force))
        elif args.step == "wheelhouse":
            print("\n".join(make_wheelhouse(args.bench_python, args.dest, python_version=args.python_version)))
        elif args.step == "build":
            spec = ImageSpec(args.engine, tag, args.base_image, _build_args(args.build_arg), network=args.network)
            print(json.dumps(build_image(spec, args.bench_python, args.stamp), indent=2))
        elif args.step == "export":
            print(export_image(args.engine, tag, args.archive, args.load_into))
        elif args.step == "charliecloud":
            print(charliecloud_image(args.engine, tag, args.out, args.force))
        elif args.step == "singularity-def":
            known = {"PROVENANCE": host_provenance(args.bench_python)["hash"]} if args.bench_python.exists() else {}
            print(write_singularity_definition(args.out, build_args={**known, **_build_args(args.build_arg)},
                                               bootstrap=args.bootstrap, source=args.source))
        else:
            commands = runtime_commands(args.engine, tag, args.registry)
            print(json.dumps(commands, indent=2) if args.json else
                  "\n".join(f"{name}: {shlex.join(argv)}" for name, argvs in commands.items() for argv in argvs))
    except ImageStepError as error:
        print(f"containerbench.images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
