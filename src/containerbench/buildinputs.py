"""What an image is built from, as one digest: the Dockerfile, its build arguments, the base image's id
and every file its COPY and ADD instructions take from the build context (less what .dockerignore leaves
out). podman builds without a layer cache (imagebuild.build_argv), so a second build of the same inputs
(another tag, a rule run again after a checkout touched its inputs) would be a whole new 1.6 GB image
and three minutes: the build labels its image with this digest, and a build whose inputs an image in the
store already carries tags that image instead.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
from pathlib import Path

from containerbench.singularity import dockerfile_args, expand_args, instructions

INPUTS_LABEL = "org.containerbench.inputs"


def copied_sources(dockerfile: Path, build_args: dict[str, str]) -> list[str]:
    """The build-context paths the Dockerfile's COPY and ADD take, with its ARGs expanded (Dockerfile
    reference, "COPY": `COPY [--flags] <src>... <dest>` or the JSON form); a COPY --from takes from a stage."""
    values = {**dockerfile_args(dockerfile), **build_args}
    sources = []
    for line in instructions(dockerfile):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() not in ("COPY", "ADD"):
            continue
        rest = expand_args(rest.strip(), values)
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        flags = [word for word in words if word.startswith("--")]
        if any(flag.startswith("--from=") for flag in flags):
            continue
        sources += [word for word in words if not word.startswith("--")][:-1]
    return sources


def ignore_patterns(context: Path) -> list[str]:
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path, or one of the directories above it, decides;
    `!` takes a path back in. `**` matches any number of directories, none included."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.lstrip("!").strip("/")
        forms = {bare, bare[3:]} if bare.startswith("**/") else {bare}
        if any(fnmatch.fnmatchcase(prefix, form) for prefix in prefixes for form in forms):
            verdict = not negated
    return verdict


def context_files(context: Path, sources: list[str]) -> list[Path]:
    """Every file under the sources that reaches the build, in a stable order."""
    patterns, found = ignore_patterns(context), set()
    for source in sources:
        top = context / source
        candidates = [top] if top.is_file() else [Path(root) / name for root, _, names in os.walk(top)
                                                  for name in names]
        for path in candidates:
            relative = path.relative_to(context).as_posix()
            if not ignored(relative, patterns):
                found.add(relative)
    return [context / relative for relative in sorted(found)]


def inputs_digest(dockerfile: Path, context: Path, build_args: dict[str, str], base_id: str) -> str:
    """The arguments as the build sees them: the Dockerfile's defaults, overridden by those given (one it does
    not declare changes nothing), so that naming a default changes no digest."""
    declared = dockerfile_args(dockerfile)
    values = {**declared, **{name: value for name, value in build_args.items() if name in declared}}
    digest = hashlib.sha256()
    digest.update(dockerfile.read_bytes())
    digest.update(json.dumps({"build_args": values, "base_id": base_id}, sort_keys=True).encode())
    for path in context_files(context, copied_sources(dockerfile, build_args)):
        digest.update(f"\0{path.relative_to(context).as_posix()}\0{os.access(path, os.X_OK)}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:32]
