"""What an image is built from, as one digest: the Dockerfile, its build arguments, the ids of the images its
FROMs name and every file its COPY and ADD instructions take from the build context (less what .dockerignore
leaves out: names, modes, contents, links). podman builds without a layer cache (imagebuild.build_argv), so a
second build of the same inputs (another tag, a rule run again after a checkout touched its inputs) would be a
whole new 1.6 GB image and three minutes: the build labels its image with this digest, and a build whose
inputs an image in the store already carries tags that image instead.

Where the digest cannot see an input (a RUN --mount, a heredoc, a URL, a source no file matches, a variable
set by ENV) it refuses (Unresolved): the image is built, and never reused.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import posixpath
import re
import shlex
import stat
from pathlib import Path

from containerbench.singularity import arg_declarations, dockerfile_stages, expand_args, instructions

INPUTS_LABEL = "org.containerbench.inputs"


class Unresolved(Exception):
    """An input of the build the digest cannot see: no label, no reuse."""


def effective_args(dockerfile: Path, build_args: dict[str, str]) -> dict[str, str | None]:
    """Each declared ARG's value as the build sees it: the one given, else its default. Naming a default changes
    nothing, and an argument the Dockerfile does not declare is unused; an ARG whose stages declare different
    defaults has none in common (None), so that naming one of them is another build."""
    return {name: build_args.get(name, defaults[0] if len(set(defaults)) == 1 else None)
            for name, defaults in arg_declarations(dockerfile).items()}


def _values(dockerfile: Path, build_args: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in effective_args(dockerfile, build_args).items() if value is not None}


def from_images(dockerfile: Path, build_args: dict[str, str]) -> list[str]:
    """The images the FROMs name that are no earlier stage (each an input, by its id)."""
    stages, images = set(), []
    for image, name in dockerfile_stages(dockerfile, _values(dockerfile, build_args)):
        if "$" in image:
            raise Unresolved(f"FROM {image}: a variable the build arguments do not set")
        if image not in stages and image not in images:
            images.append(image)
        stages.add(name or "")
    return images


def copied_sources(dockerfile: Path, build_args: dict[str, str]) -> list[str]:
    """The build-context paths the Dockerfile's COPY and ADD take, ARGs expanded (Dockerfile reference, "COPY":
    `COPY [--flags] <src>... <dest>`, or its JSON form after the flags); a COPY --from takes from a stage."""
    values = _values(dockerfile, build_args)
    stages = {name for _, name in dockerfile_stages(dockerfile, values) if name}
    sources = []
    for line in instructions(dockerfile):
        keyword, rest = (line.split(None, 1) + [""])[:2]
        keyword = keyword.upper()
        if keyword == "RUN" and re.match(r"(--\S+\s+)*--mount", rest):
            raise Unresolved(f"RUN --mount: {line[:80]}")
        if keyword not in ("COPY", "ADD"):
            continue
        if "<<" in rest:
            raise Unresolved(f"a heredoc: {line[:80]}")
        flags = []
        while rest.startswith("--"):
            flag, rest = (rest.split(None, 1) + [""])[:2]
            flags.append(flag)
        if stage := next((flag.split("=", 1)[1] for flag in flags if flag.startswith("--from=")), None):
            if stage not in stages and not stage.isdigit():
                raise Unresolved(f"COPY --from={stage}: an image, not a stage of this Dockerfile")
            continue
        rest = expand_args(rest.strip(), values)
        if "$" in rest:
            raise Unresolved(f"{keyword} {rest[:80]}: a variable the build arguments do not set")
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        for source in words[:-1]:
            if keyword == "ADD" and re.match(r"[a-z+]+://|git@", source):
                raise Unresolved(f"ADD {source}: not from the context")
            sources.append(source)
    return sources


def _clean(pattern: str) -> tuple[bool, str]:
    """A .dockerignore line as Docker reads it: `!` takes back in, the path cleaned (filepath.Clean), no leading /."""
    negated = pattern.startswith("!")
    path = posixpath.normpath(pattern[1:].strip() if negated else pattern).lstrip("/")
    return negated, path


def _regex(pattern: str) -> re.Pattern:
    """Docker's pattern syntax (moby patternmatcher): `*` and `?` stay within one directory, `**` crosses any
    number of them, none included."""
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[" and (end := pattern.find("]", i + 1)) > i:  # filepath.Match: only `^` negates a class
            out, i = out + "[" + pattern[i + 1:end] + "]", end
        elif char == "\\" and i + 1 < len(pattern):
            out, i = out + re.escape(pattern[i + 1]), i + 1
        else:
            out += re.escape(char)
        i += 1
    return re.compile(out)


def ignore_patterns(context: Path, dockerfile: Path | None = None) -> list[tuple[bool, re.Pattern]]:
    """The context's .dockerignore; another ignore file the builders would read instead is not this one's to
    guess (podman's .containerignore, a Dockerfile's own NAME.dockerignore)."""
    own = [dockerfile.with_name(dockerfile.name + suffix) for suffix in (".dockerignore", ".containerignore")
           ] if dockerfile else []
    others = [context / ".containerignore", *own]
    if other := next((path for path in others if path.exists()), None):
        raise Unresolved(f"{other}: an ignore file the digest does not read")
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    cleaned = [_clean(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [(negated, _regex(body)) for negated, body in cleaned if body != "."]


def ignored(relative: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """The last pattern that matches the path, or a directory above it, decides (Docker's rule)."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negated, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = not negated
    return verdict


def _glob(context: Path, relative: str) -> list[Path]:
    """The context's paths a COPY source with wildcards names, component by component with Go's filepath.Match
    rules as fnmatch has them within one name (a `*` matches a leading dot too, unlike Python's glob)."""
    found = [context]
    for part in relative.split("/"):
        if not glob.has_magic(part):
            found = [path / part for path in found if os.path.lexists(path / part)]
            continue
        found = [path / name for path in found if path.is_dir() and not path.is_symlink()
                 for name in sorted(os.listdir(path)) if fnmatch.fnmatchcase(name, part)]
    return found


def _matches(context: Path, source: str) -> list[Path]:
    relative = posixpath.normpath(source.lstrip("/"))
    if relative == ".." or relative.startswith("../"):
        raise Unresolved(f"{source}: outside the build context")
    found = _glob(context, relative) if glob.has_magic(relative) else (
        [context / relative] if os.path.lexists(context / relative) else [])
    if not found:
        raise Unresolved(f"{source}: no file of the build context matches it")
    if links := [path for path in found if path.is_symlink()]:
        # The builders follow a source that is a link (to where the digest would have to follow it too).
        raise Unresolved(f"{links[0].relative_to(context)}: a COPY source that is a link")
    return found


def context_entries(context: Path, sources: list[str], dockerfile: Path | None = None) -> list[str]:
    """Every path under the sources that reaches the build (files, directories, links, not followed), relative to
    the context, in a stable order."""
    patterns, found = ignore_patterns(context, dockerfile), set()
    for source in sources:
        for top in _matches(context, source):
            paths = [top]
            if top.is_dir() and not top.is_symlink():
                for root, dirs, files in os.walk(top):  # links to directories are listed in dirs, not walked
                    paths += [Path(root) / name for name in dirs + files]
            found |= {path.relative_to(context).as_posix() for path in paths}
    return sorted(relative for relative in found if not ignored(relative, patterns))


def inputs_digest(dockerfile: Path, context: Path, build_args: dict[str, str], image_ids: dict[str, str]) -> str:
    """The digest of the build's inputs; `image_ids`: the id of each image from_images names."""
    digest = hashlib.sha256()
    digest.update(dockerfile.read_bytes())
    digest.update(json.dumps({"build_args": effective_args(dockerfile, build_args), "images": image_ids},
                             sort_keys=True).encode())
    for relative in context_entries(context, copied_sources(dockerfile, build_args), dockerfile):
        path = context / relative
        info = path.lstat()
        digest.update(f"\0{relative}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode):o}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            digest.update(os.readlink(path).encode())
        elif stat.S_ISREG(info.st_mode):
            digest.update(f"{info.st_size}\0".encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:32]


def files_taken(dockerfile: Path, context: Path, build_args: dict[str, str], left_out: list[str]) -> list[str]:
    """The files of the context the build takes, as a workflow rule's inputs (a change to any of them builds the
    image again): the package's sources, schemas and templates, pyproject.toml, the lock. Less the sources
    `left_out` names (the wheelhouse, another rule's, declared by its marker). Unresolved where the Dockerfile's
    sources cannot be read as the digest reads them."""
    leave = {posixpath.normpath(source.lstrip("/")) for source in left_out}
    sources = [source for source in copied_sources(dockerfile, build_args)
               if posixpath.normpath(source.lstrip("/")) not in leave]
    return [str(context / relative) for relative in context_entries(context, sources, dockerfile)
            if (context / relative).is_file()]
