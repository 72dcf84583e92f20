"""containers/Dockerfile as a Singularity/Apptainer definition file.

spython converts the Dockerfile; what it gets wrong for this one is put right
here: ${ARG} references are expanded with the build's values, `USER` is not
turned into `su -`, the bootstrap agent follows the base image (a local daemon,
an archive or a registry), COPY sources are anchored at the build context,
labels take Apptainer's "KEY VALUE" form, ENV values hold for later %post
steps as they do for later RUN steps, and each stage of a multi-stage build is a stage
of the definition.

    containerbench singularity-definition --dockerfile containers/Dockerfile --out DEF [--build-arg NAME=VALUE]
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path


def instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, one line each: a line ending in a backslash continues on the next, and
    comment lines, even within an instruction, are no part of it (Dockerfile reference, "Format")."""
    out, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if re.match(r"\s*#", line):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        if (current := current + line).strip():
            out.append(current.strip())
        current = ""
    return out + ([current.strip()] if current.strip() else [])


def arg_declarations(dockerfile: Path) -> dict[str, list[str]]:
    """Each ARG name's defaults, one per declaration in order, unquoted as Docker does (ARG X="" is empty)."""
    declared: dict[str, list[str]] = {}
    for line in instructions(dockerfile):
        if re.match(r"\s*ARG\s", line, re.I):
            for word in shlex.split(line.split(None, 1)[1], comments=True):
                name, _, value = word.partition("=")
                declared.setdefault(name, []).append(value)
    return declared


def dockerfile_args(dockerfile: Path) -> dict[str, str]:
    """ARG names and defaults (a name declared again: its last default)."""
    return {name: defaults[-1] for name, defaults in arg_declarations(dockerfile).items()}


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


def dockerfile_stages(dockerfile: Path, values: dict[str, str]) -> list[tuple[str, str | None]]:
    """Each FROM's image (ARGs expanded with the build's values) and stage name, in order."""
    froms = (re.match(r"FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.I) for line in instructions(dockerfile))
    return [(expand_args(match.group(1), values), match.group(2)) for match in froms if match]


def singularity_definition(dockerfile: Path, build_args: dict | None = None, bootstrap: str | None = None,
                           source: str | None = None, context: str = ".") -> str:
    """spython's conversion of the Dockerfile, with what it gets wrong put right. The bootstrap
    agent follows the base (a local daemon, an archive, a registry) unless given; `source` is
    what it bootstraps from, the base by default, and must be given to bootstrap an image
    reference from an archive. A multi-stage Dockerfile becomes a multi-stage definition (Apptainer
    user guide, "Multi-Stage Builds": each stage bootstraps from an image of its own, and a later one
    copies files from it, `%files from STAGE`); bootstrap and source apply to the stages that start
    from the image's own base."""
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
    stages = dockerfile_stages(dockerfile, values)
    names = [name for _, name in stages]
    if len(stages) != len(recipe):  # spython starts a stage only at a FROM ... AS NAME, and merges the rest
        raise ValueError(f"{dockerfile}: every stage of a multi-stage build must be named (FROM IMAGE AS NAME)")
    for image, name in stages:
        if image in names:
            raise ValueError(f"{dockerfile}: stage {name} starts from stage {image}; an Apptainer stage "
                             "bootstraps from an image, so each stage must start FROM an image")
    environ = {line for layer in recipe.values() for line in layer.environ}
    base = stages[-1][0]  # the stage that makes the image
    bootstrap = bootstrap or bootstrap_for(base)
    if bootstrap == "docker-archive" and not source and bootstrap_for(base) != "docker-archive":
        raise ValueError(f"bootstrap docker-archive needs the archive of the base {base} (--from ARCHIVE)")
    source = source or base
    out, section, stage = [""], "", -1
    for line in converted.splitlines():
        if line.startswith("Bootstrap:"):  # a stage begins: its header, with its own image
            stage += 1
            image, name = stages[stage]
            header = [f"Bootstrap: {bootstrap}", f"From: {source}"] if image == base else [
                f"Bootstrap: {bootstrap_for(image)}", f"From: {image}"]
            out += ([""] if out[-1] else []) + header + ([f"Stage: {name}"] if len(stages) > 1 else [])
            section = ""
            continue
        if re.match(r"(From|Stage):", line) or (not out[-1] and not line):
            continue
        if line.startswith("%"):
            section = line.strip()
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


def write_singularity_definition(out: Path, **kwargs) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(singularity_definition(**kwargs))
    return out


def host_provenance_hash(bench_python: Path) -> str:
    """The benchmark venv's provenance hash, for the image's label (as the image build sets it)."""
    done = subprocess.run([str(bench_python), "-m", "containerbench.rank.provenance"], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout)["hash"]
