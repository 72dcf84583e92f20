"""The Debian base every image starts from, made here without a registry: debootstrap a root
file system and import it into the engine (`containerbench image base`), or copy it from the
other engine when that one already holds it."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from containerbench.imagebuild import export_image, image_exists, load_argv
from containerbench.imagestep import (
    BASE_IMAGE,
    BUILD,
    DEFAULT_STEP_TIMEOUT_S,
    QUERY_TIMEOUT_S,
    SUITE,
    ImageStepError,
    run_step,
)
from containerbench.runtimes import DEFAULT_PATH, ENGINES, engine_env, engine_usable

# What every rank needs at run time besides the venv: Python and Open MPI (mpi4py and
# Horovod's mpi_lib link libmpi.so.40 / libmpi_cxx.so.40 from libopenmpi3).
BASE_PACKAGES = ("python3", "python3-venv", "openmpi-bin", "libopenmpi3", "ca-certificates")


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


# What the base is made of, as a label on it: a base made from another recipe (an older BASE_PACKAGES) is
# made again, not reused because its tag exists; the image_base rule's params carry it, so Snakemake runs the
# rule again when it changes, and the images built on the base follow (their inputs digest has its id).
RECIPE_LABEL = "org.containerbench.base-recipe"


def recipe(suite: str = SUITE, packages=BASE_PACKAGES) -> str:
    """The base's recipe, digested: the suite, the packages, the debootstrap variant and the PATH it gets."""
    made_of = {"suite": suite, "packages": list(packages), "variant": "minbase", "path": DEFAULT_PATH}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]


def import_argv(engine: str, tag: str = BASE_IMAGE) -> list[str]:
    # podman-import(1), --change: LABEL is among the instructions it applies. docker-import's reference lists
    # fewer, but dockerd applies LABEL too (test_image_builds imports with this argv into docker 28.2 here).
    return [engine, "import", "--change", f"ENV PATH={DEFAULT_PATH}", "--change", f"LABEL {RECIPE_LABEL}={recipe()}",
            "-", tag]


def made_from(engine: str, tag: str) -> str | None:
    """The recipe label of the engine's `tag` ("" where it has none: made before the label), None where the
    engine has no such image."""
    if not image_exists(engine, tag):
        return None
    done = run_step("base (inspect)", [engine, "image", "inspect", tag], capture=True, env=engine_env(engine),
                    timeout=QUERY_TIMEOUT_S)
    config = json.loads(done.stdout)[0]
    return ((config.get("Config") or {}).get("Labels") or config.get("Labels") or {}).get(RECIPE_LABEL, "")


def make_base(engine: str, tag: str = BASE_IMAGE, rootfs: Path = BUILD / "base" / "rootfs",
              mirror: str | None = None, force: bool = False, timeout: float = DEFAULT_STEP_TIMEOUT_S) -> str:
    """Debootstrap a root file system into `rootfs`, import it into the engine as `tag`, and remove
    it: the engine keeps the base, the workflow keeps only its marker. A base another engine here
    already holds is copied from it instead (save, load): one debootstrap serves both engines."""
    wanted = recipe()
    if (found := made_from(engine, tag)) == wanted and not force:
        return f"{tag} already in {engine}"
    if found is not None and not force:
        print(f"containerbench image: base: {tag} in {engine} was made from recipe {found or 'unlabelled'}, this "
              f"one is {wanted} (baseimage.BASE_PACKAGES, SUITE): made again", file=sys.stderr)
    holder = None if force else next((other for other in ENGINES if other != engine and engine_usable(other)[0]
                                      and made_from(other, tag) == wanted), None)
    if holder:
        archive = rootfs.parent / "base.tar"
        try:
            export_image(holder, tag, archive, timeout)
            run_step(f"base (load into {engine})", load_argv(engine, archive), env=engine_env(engine), timeout=timeout)
            return f"{tag} copied from {holder} into {engine}"
        except ImageStepError as error:  # made here instead, as if no engine held it
            print(f"containerbench image: base: not copied from {holder} ({error}); debootstrap instead",
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
