"""The benchmark image: built from containers/Dockerfile with the network off, refused unless the
provenance measured inside equals the bench venv's, then exported as a docker archive, loaded into
the other engine, converted for Charliecloud, and removed with every file made from it (the
`containerbench image` steps build, export, load, charliecloud, remove)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from containerbench import buildinputs
from containerbench.buildinputs import INPUTS_LABEL
from containerbench.config import BenchEnv, MpiFlavour
from containerbench.images import (
    BuiltImage,
    StoreNotAnswering,
    build_outputs,
    image_files,
    remove_prepared,
    stamped_id,
)
from containerbench.imagestep import (
    ARCHIVE,
    BASE_IMAGE,
    BENCH_PYTHON,
    CHARLIECLOUD_DIR,
    DEFAULT_STEP_TIMEOUT_S,
    IMAGE_REPO,
    IMAGES,
    QUERY_TIMEOUT_S,
    ImageStepError,
    run_step,
)
from containerbench.processes import run_group
from containerbench.rank import provenance
from containerbench.runtimes import (
    CONTAINER_RUNTIMES,
    ENGINES,
    Charliecloud,
    Enroot,
    Podman,
    engine_env,
    engine_usable,
)

DOCKERFILE = Path("containers/Dockerfile")
PROVENANCE_LABEL = "org.containerbench.provenance"
STAGE_LABEL_KEY = "org.containerbench.stage"
STAGE_LABEL = f"{STAGE_LABEL_KEY}=venv"  # on the Dockerfile's venv stage only: what the build gives back


@dataclass(frozen=True)
class ImageSpec:
    engine: str = Podman.name
    tag: str = f"{IMAGE_REPO}:latest"
    base_image: str = BASE_IMAGE
    build_args: dict[str, str] = field(default_factory=dict)
    dockerfile: Path = DOCKERFILE
    context: Path = Path(".")
    network: str = "none"  # the default base needs nothing from outside: prove it
    inputs: str | None = None  # buildinputs.inputs_digest, labelled on the image

    def all_build_args(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image, **self.build_args}


# -- build, inspect, stamp -------------------------------------------------------------------

def host_provenance(bench_python: Path = BENCH_PYTHON) -> dict:
    out = run_step("provenance (host)", [str(bench_python), "-m", "containerbench.rank.provenance"], capture=True,
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


def build_context_files(repo: Path, env: BenchEnv, flavour: MpiFlavour) -> list[str]:
    """The image_build rule's inputs: what the flavour's build takes from the repository (buildinputs.files_taken),
    but the wheelhouse (its own rule's) and README.md, the package's long description only: a new stamp has every
    container run measured again, hours of a site's sweep for a docs edit. For a Dockerfile whose sources cannot be
    read so, the Python sources and the env's lock."""
    args = image_build_args(env, flavour)
    try:
        return buildinputs.files_taken(repo / DOCKERFILE, repo, args, [args["WHEELHOUSE"], "README.md"])
    except buildinputs.Unresolved:
        return [str(repo / env.lock), *sorted(str(path) for path in (repo / "src" / "containerbench").rglob("*.py"))]


def build_argv(spec: ImageSpec) -> list[str]:
    argv = [spec.engine, "build", "--network", spec.network, "-f", str(spec.dockerfile), "-t", spec.tag]
    if spec.engine == Podman.name:
        # podman-build(1), --layers: "Cache intermediate images during the build process (Default is true)". The
        # Dockerfile's venv stage (its wheelhouse and the venv, 1.6 GB) would stay in the store as that cache,
        # beside the image that holds the venv again: the store keeps the image only (a rebuild takes 2 minutes).
        argv.append("--layers=false")
    for name, value in spec.all_build_args().items():
        argv += ["--build-arg", f"{name}={value}"]
    if "PROVENANCE" in spec.build_args:  # podman 4.3 reuses a cached LABEL step when only the ARG changed
        argv += ["--label", f"{PROVENANCE_LABEL}={spec.build_args['PROVENANCE']}"]
    if spec.inputs:
        argv += ["--label", f"{INPUTS_LABEL}={spec.inputs}"]
    return argv + [str(spec.context)]


def same_inputs_argv(engine: str, inputs: str) -> list[str]:
    """The images labelled with these inputs (docker-images(1) and podman-images(1), --filter label=KEY=VALUE)."""
    return [engine, "images", "--quiet", "--no-trunc", "--filter", f"label={INPUTS_LABEL}={inputs}"]


def built_from_same_inputs(spec: ImageSpec) -> str | None:
    """An image in the store built from exactly these inputs, the final stage's (not a stage docker kept); none
    where the store cannot say (the build then builds)."""
    try:
        found = run_group(same_inputs_argv(spec.engine, spec.inputs), timeout=QUERY_TIMEOUT_S,
                          env=engine_env(spec.engine), capture=True, stdin=subprocess.DEVNULL)
        for image_id in dict.fromkeys(found.stdout.split() if found.returncode == 0 else []):
            labels = (inspect_image(spec.engine, image_id).get("Config") or {}).get("Labels") or {}
            if labels.get(INPUTS_LABEL) == spec.inputs and STAGE_LABEL_KEY not in labels:
                return image_id
    except (ImageStepError, subprocess.TimeoutExpired, json.JSONDecodeError):
        pass
    return None


def build_or_reuse(spec: ImageSpec, timeout: float) -> bool:
    """Tag the image built from the same inputs (buildinputs), the same bytes minutes sooner, else build;
    True when it was reused."""
    if spec.inputs and (same := built_from_same_inputs(spec)):
        tagged = run_group([spec.engine, "tag", same, spec.tag], timeout=QUERY_TIMEOUT_S, env=engine_env(spec.engine),
                           capture=True, stdin=subprocess.DEVNULL)
        if tagged.returncode == 0:
            print(f"build: {spec.tag} is {same}, built before from the same inputs ({INPUTS_LABEL}={spec.inputs})")
            return True
        print(f"build: tagging {same} failed ({tagged.stderr.strip()[-200:]}); building")
    run_step(f"build ({spec.engine})", build_argv(spec), env=engine_env(spec.engine), timeout=timeout)
    return False


def digest_of_inputs(spec: ImageSpec) -> str | None:
    """buildinputs' digest of this build, with the ids of the images its FROMs name; none (no label, no reuse)
    where the digest cannot see an input or such an image is not in the store yet (the build says so)."""
    args = spec.all_build_args()
    try:
        if spec.network != "none":
            raise buildinputs.Unresolved(f"--network {spec.network}: the build may take what it fetches")
        images = buildinputs.from_images(spec.dockerfile, args)
        if not all(image_exists(spec.engine, image) for image in images):
            return None
        ids = {image: image_digest(spec.engine, image) for image in images}
        return buildinputs.inputs_digest(spec.dockerfile, spec.context, args, ids)
    except (buildinputs.Unresolved, OSError, ValueError, re.error) as why:  # OSError: a file gone while read
        print(f"build: not reusable: {why}")
        return None


def image_exists(engine: str, tag: str) -> bool:
    argv = [engine, "image", "inspect", tag]
    try:
        return run_group(argv, timeout=QUERY_TIMEOUT_S, env=engine_env(engine)).returncode == 0
    except FileNotFoundError:
        raise ImageStepError(f"base: {engine} is not installed (scripts/container-engines.sh install)") from None
    except subprocess.TimeoutExpired:
        raise ImageStepError(f"base: `{shlex.join(argv)}` did not answer within {QUERY_TIMEOUT_S} s") from None


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
    argv = image_run_argv(engine, tag, ["python3", "-m", "containerbench.rank.provenance"])
    done = run_step("provenance (image)", argv, capture=True, env=engine_env(engine), timeout=timeout)
    return json.loads(done.stdout)


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
    spec = replace(spec, inputs=digest_of_inputs(spec))
    previous = image_digest(spec.engine, spec.tag) if image_exists(spec.engine, spec.tag) else None
    reused = build_or_reuse(spec, timeout)
    if spec.engine != Podman.name:  # docker's classic builder keeps the stages; podman keeps none (--layers=false)
        forget(spec.engine, prune_stage_argv(spec.engine), "the venv stage's images")
    measured = image_provenance(spec.engine, spec.tag, timeout)
    record = build_stamp(spec.engine, spec.tag, host_hash, timeout, measured)
    stamp = stamp or stamp_path(spec.engine)
    if spec.inputs and not reused and digest_of_inputs(spec) != spec.inputs:
        # Its label would name inputs other than those it holds, and a later build of them would reuse it.
        refusal = "its build context changed while it was built (buildinputs); build it again"
    elif record["measured_provenance"] != host_hash:  # another lock or wheel, or the sources changed during the build
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
    forget_previous(spec.engine, spec.tag, previous, record["image_id"])
    return record


def forget_previous(engine: str, tag: str, previous: str | None, built: str) -> None:
    """A build moves the tag: the image it named before is left untagged, a whole copy (1.3 GB; no layer cache
    shares it). Removed by its id, never forced, unless another tag names it (rmi by id would untag that one
    too) or a container uses it (rmi refuses)."""
    if not previous or previous == built:
        return
    what = f"the image {tag} named before ({previous})"
    found = run_group([engine, "image", "inspect", previous], timeout=QUERY_TIMEOUT_S, env=engine_env(engine),
                      capture=True, stdin=subprocess.DEVNULL)
    if found.returncode != 0:
        return  # gone already
    if tags := json.loads(found.stdout)[0].get("RepoTags") or []:
        print(f"build: kept {what}: {', '.join(tags)} names it")
        return
    forget(engine, [engine, "rmi", previous], what)


def prune_stage_argv(engine: str) -> list[str]:
    """The build stages' images the classic builder keeps, by the label only they carry (containers/Dockerfile):
    docker-image-prune(1) removes dangling images only, and --filter label= only those with the label."""
    return [engine, "image", "prune", "--force", "--filter", f"label={STAGE_LABEL}"]


def forget(engine: str, argv: list[str], what: str) -> None:
    """Give back disk the build left behind; a refusal leaves it, and says so in the step's log."""
    done = run_group(argv, timeout=QUERY_TIMEOUT_S, env=engine_env(engine), capture=True, stdin=subprocess.DEVNULL)
    print(f"build: removed {what}" if done.returncode == 0 else
          f"build: kept {what}: {(done.stderr or done.stdout).strip()[-200:]}")


# -- export, load, charliecloud --------------------------------------------------------------

def save_argv(engine: str, tag: str, archive: Path = ARCHIVE) -> list[str]:
    return [engine, "save", *CONTAINER_RUNTIMES[engine].save_options, "-o", str(archive), tag]


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
    marker, image_id = Path(Charliecloud.image_id_file(str(out))), image_digest(engine, tag, info)
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
                 env=engine_env(Charliecloud.name), timeout=timeout)
    finally:
        subprocess.run(forget, capture_output=True, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, check=False)
        Path(flat_tar).unlink(missing_ok=True)
    environment = Path(Charliecloud.environment_file(str(out)))
    environment.parent.mkdir(parents=True, exist_ok=True)
    environment.write_text("".join(f"{pair}\n" for pair in info["Config"].get("Env") or []))
    clear_dev(out)
    marker.write_text(image_id + "\n")
    return out


def open_permissions(rootfs: Path) -> None:
    """enroot's common::fixperms on an unpacked image: `chmod -R u+rX`, and u+w on every directory."""
    for root, directories, files in os.walk(rootfs):
        for name, more in [*((d, stat.S_IRWXU) for d in directories), *((f, stat.S_IRUSR) for f in files)]:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode):
                executable = stat.S_IXUSR if mode & 0o111 else 0
                os.chmod(path, stat.S_IMODE(mode) | more | executable)


def directory_in_image(rootfs: Path, path: str, what: str) -> Path:
    """ROOTFS/PATH, each part of it a directory of the image where it exists: written as root, a link or a `..`
    there could reach out of the image (ImageStepError, one line, where one is)."""
    here = rootfs
    for part in Path(path.lstrip("/")).parts:
        here = here / part
        if part == ".." or here.is_symlink() or (here.exists() and not here.is_dir()):
            raise ImageStepError(f"enroot: {what} {path!r}: {here.relative_to(rootfs)} in the image is a link, a file "
                                 "or '..'; allowed: a path of directories")
    return here


def enroot_squashfs(built: BuiltImage, out: Path, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> Path:
    """Enroot's image, made here without Enroot (Enroot.converts_without_itself): what `enroot import podman://`
    or `dockerd://` does (NVIDIA/enroot src/docker.sh, docker::daemon::import), for a site whose compute nodes
    have Enroot and not the engine that built the image. Of the image the build stamped, by its id: a tag that
    names another image now (built again elsewhere, or pulled over) is refused, and the export is of that id."""
    engine, tag = built.engine, built.tag
    info = inspect_image(engine, tag)
    stamp = Path(image_files(tag, built.build_dir)[engine])
    found, expected = image_digest(engine, tag, info), stamped_id(Enroot.name, stamp)
    if found != expected:
        raise ImageStepError(f"enroot: {tag} in {engine} is {found}, not the built {expected} ({stamp}); allowed: "
                             "the image the workflow built: build it again")
    # Unpacked where enroot unpacks (ENROOT_TEMP_PATH, else TMPDIR: node-local), not beside the image on the
    # filesystem every node mounts: the export and its tree are twice the image, in many small files.
    scratch = Path(tempfile.mkdtemp(prefix="containerbench-enroot-", dir=os.environ.get("ENROOT_TEMP_PATH") or None))
    rootfs, flat_tar, container = scratch / "rootfs", str(scratch / "image.tar"), Charliecloud.export_paths(str(out))[0]
    # The same flat export that enroot's import pipes through tar (`create`, `export`, `rm`).
    create, export, remove = Charliecloud.export_argvs(engine, found, container, flat_tar)
    forget = [*remove[:-1], "--force", remove[-1]]
    rootfs.mkdir()
    subprocess.run(forget, capture_output=True, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, check=False)
    try:
        run_step("enroot (create)", create, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, capture=True)
        run_step("enroot (export)", export, env=engine_env(engine), timeout=timeout)
        run_step("enroot (rm)", remove, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, capture=True)
        run_step("enroot (tar)", Enroot.unpack_argv(flat_tar, str(rootfs)), timeout=timeout)
        Path(flat_tar).unlink()
        open_permissions(rootfs)
        for name, text in Enroot.configured_files(info["Config"], Enroot.import_uri(engine, tag)).items():
            directory, file = name.rsplit("/", 1)
            path = directory_in_image(rootfs, directory, f"{tag}'s /{directory} for /{name}") / file
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir() and not path.is_symlink():
                raise ImageStepError(f"enroot: {tag}'s /{name} is a directory; allowed: a file, which this replaces")
            path.unlink(missing_ok=True)  # a link is replaced, never followed
            path.write_text(text)
        workdir = info["Config"].get("WorkingDir") or "/"
        directory_in_image(rootfs, workdir, f"{tag}'s WorkingDir").mkdir(parents=True, exist_ok=True)
        run_step("enroot (mksquashfs)", Enroot.squash_argv(str(rootfs), str(out)), timeout=timeout)
    finally:
        subprocess.run(forget, capture_output=True, env=engine_env(engine), timeout=QUERY_TIMEOUT_S, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    return out


# Runtimes whose image containerbench makes itself where they are not installed (converts_without_itself).
WITHOUT_THE_RUNTIME = {Enroot.name: enroot_squashfs}


@dataclass
class Removal:
    """What remove_image gave back, and the stamps it kept, each with why: a store that does not answer here
    may still hold the copy its stamp names, which nothing would then record."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # stamp -> why


def remove_from_engine(engine: str, tag: str, stamp: str, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> list[str]:
    """Remove `tag` from `engine` where it is there (remove_prepared's counterpart for the engines); an engine
    that does not answer while its `stamp` says it holds the image: StoreNotAnswering."""
    answers, why = engine_usable(engine)
    if not answers:
        if Path(stamp).exists():
            raise StoreNotAnswering(engine, why)
        return []
    if not image_exists(engine, tag):
        return []
    run_step(f"remove ({engine} rmi)", rmi_argv(engine, tag), env=engine_env(engine), timeout=timeout)
    return [f"{engine} {tag}"]


def remove_image(tag: str, build_dir: Path | str = IMAGES, only=None,
                 timeout: float = DEFAULT_STEP_TIMEOUT_S) -> Removal:
    """Give back the disk one built flavour holds: its tag in each engine that answers, and every file
    the workflow made from it (stamps, archive, Charliecloud directory, .sif, ...); `only` keeps it to
    some of image_files' names (an engine's name: its tag and its stamp). Removing a stamp with its
    image makes the next workflow run build it again instead of trusting an image that is gone; the
    stamp of a store that does not answer is kept, with why."""
    files = image_files(tag, build_dir)
    if unknown := sorted(set(only or ()) - set(files)):
        raise ImageStepError(f"remove: no such part of an image: {', '.join(unknown)} (one of {', '.join(files)})")
    wanted = set(only or files)
    done = Removal()
    # Each engine's tag, then a copy in a runtime's own store (podman-hpc's); a store that does not answer keeps
    # its stamp, which records the copy that may still be there.
    # (docker and podman are runtimes too: their copy is the engine's own, removed once.)
    stores = dict.fromkeys([*sorted(wanted & set(ENGINES)), *sorted(wanted & set(CONTAINER_RUNTIMES))])
    for name in stores:
        try:
            done.removed += (remove_from_engine(name, tag, files[name], timeout) if name in ENGINES
                             else remove_prepared(name, build_outputs(tag, build_dir), timeout))
        except StoreNotAnswering as silent:
            done.kept[files[name]] = str(silent)
    paths = {Path(path) for name, path in files.items() if name in wanted and path not in done.kept}
    paths |= {Path(Charliecloud.image_id_file(str(path))) for path in paths if path.suffix == ".ch"}
    for path in sorted(paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        done.removed.append(str(path))
    return done
