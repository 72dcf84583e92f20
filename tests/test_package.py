"""The package works installed, not only from this checkout: a wheel carries its schemas and
templates, and a config is checked from them with the repository out of reach."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

from helpers import ROOT


def test_an_installed_wheel_carries_and_uses_its_package_data(tmp_path):
    source = tmp_path / "source"
    (source / "src").mkdir(parents=True)
    shutil.copytree(ROOT / "src" / "containerbench", source / "src" / "containerbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path / "wheels"), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "wheels").glob("containerbench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"containerbench/schemas/config.schema.yaml", "containerbench/schemas/references.schema.yaml",
            "containerbench/schemas/record.schema.yaml", "containerbench/templates/report.html.j2"} <= names

    target = tmp_path / "installed"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    check = ("import containerbench, containerbench.config as c, containerbench.validate as v; "
             "print(containerbench.__file__); "
             "config = c.load(['config.yaml']); print(config['benchmark']['threads_per_rank']); "
             "print(sorted(c.load_schema('references')['properties']))")
    (tmp_path / "run").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "run" / "config.yaml")
    # The installed copy comes first on the path, and the checkout is nowhere near the working directory.
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=tmp_path / "run",
                          env={**os.environ, "PYTHONPATH": str(target)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    location, threads, keys = done.stdout.splitlines()
    assert location.startswith(str(target)) and threads == "0" and keys == "['systems']"
