"""How long the workflow takes to plan a large sweep: `snakemake -n` on a config
with about 1,000 benchmark runs, timed from the command line, as a site admin
would wait for it. Target: under 5 s.

    .venv/bin/python benchmarks/dag_speed.py [--repetitions 9]

Prints the run count, the seconds and the ratio to the target; asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 5.0


def sweep_config(results_dir: str, repetitions: int) -> dict:
    """10 batch sizes x 2 rank counts x 3 modes x 2 data sources x repetitions, plus netbench."""
    return {
        "results_dir": results_dir,
        "runtimes": ["bare-metal"],
        "runtime_policy": "skip-unusable",
        "benchmark": {"batch_sizes": list(range(1, 11)), "repetitions": repetitions,
                      "modes": ["horovod", "collective", "parameter_server"], "modes_at": None,  # every point
                      "data": ["synthetic", "real"]},
        "scaling": {"nodes": [1], "ranks_per_node": [1, 2]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=9, help="9 gives 1,080 training runs")
    parser.add_argument("--tries", type=int, default=3, help="timed dry runs; the median is reported")
    args = parser.parse_args()
    snakemake = Path(sys.executable).parent / "snakemake"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "sweep.yaml"
        config.write_text(yaml.safe_dump(sweep_config(str(Path(tmp) / "results"), args.repetitions)))
        times, jobs = [], None
        for _ in range(args.tries):
            started = time.perf_counter()
            done = subprocess.run([str(snakemake), "-n", "--cores", "2", "--configfile",
                                   str(ROOT / "config" / "config.yaml"), str(config)],
                                  cwd=ROOT, capture_output=True, text=True)
            times.append(time.perf_counter() - started)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            counts = dict(re.findall(r"^(measure_rep\d+)\s+(\d+)$", done.stdout, flags=re.M))
            jobs = sum(map(int, counts.values()))
    median = sorted(times)[len(times) // 2]
    print(f"snakemake -n, {jobs} benchmark runs: {median:.2f} s (median of {args.tries}; "
          f"all: {', '.join(f'{t:.2f}' for t in times)}); target {TARGET_S:.0f} s -> "
          f"time/target = {median / TARGET_S:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
