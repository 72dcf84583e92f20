"""What every image step shares: the paths under build/, the image names, the engines, the time
limits, and the runner that turns a failed or wedged command into one line naming the step.

The steps themselves are in baseimage (the Debian base), wheelhouse (the wheels of an offline
build), imagebuild (build, export, load, convert, remove) and images (what each runtime runs);
`containerbench image <step>` runs them (cli/image.py).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from containerbench.processes import run_group

BUILD = Path("build")
IMAGES = BUILD / "images"
BENCH_PYTHON = Path(".venv-bench/bin/python")
BASE_IMAGE = "localhost/containerbench-base:bookworm"
IMAGE_REPO = "localhost/containerbench"
ARCHIVE = IMAGES / "containerbench.tar"
CHARLIECLOUD_DIR = IMAGES / "containerbench.ch"
SUITE, GLIBC = "bookworm", (2, 36)
# A base with apt steps or a slow mirror may need more (images.step_timeout_s in the config).
DEFAULT_STEP_TIMEOUT_S = 3600
# Questions that take seconds (does the image exist, its id, the venv's versions and hash): a wedged
# engine fails them long before a step's limit.
QUERY_TIMEOUT_S = 300


class ImageStepError(RuntimeError):
    """A step failed; the message is one line naming the step and the command."""


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



def write_file(path: Path | None, text: str) -> None:
    """Write `text` to `path` (its directory made), or nothing when no path is given (an optional marker)."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
