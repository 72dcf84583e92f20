# Configuration checked before any job starts, and the sweep expanded into plans.
import json
import shlex
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import launch, results, slurm

REPO = Path(workflow.basedir)  # the image, the wheelhouse and the data sample belong to the clone
try:
    cb_config.validated(config)  # one line naming the key, the value and what is allowed; defaults filled in
    # Probing runtimes and sinfo is for the process that plans; a job re-reads this file on its node.
    SWEEP = launch.prepare(config, REPO, probe=workflow.is_main_process)
except cb_config.ConfigError as error:
    # Stop before any job starts, with the one line and no traceback.
    sys.exit(f"containerbench: {error}")

if workflow.is_main_process:
    # What the sweep costs, once, before anything is submitted; on stderr, so a dry run shows it too.
    print(launch.cost_summary(SWEEP, config), file=sys.stderr)

PLANS = SWEEP.plans
RESULTS = config["results_dir"]
PYTHON = sys.executable  # the workflow's interpreter, with this package installed
CB = shlex.join([PYTHON, "-m", "containerbench"])
BENCH_PYTHON = Path(config["bare_metal"]["python"])
if not BENCH_PYTHON.is_absolute() and (REPO / BENCH_PYTHON).exists():
    BENCH_PYTHON = REPO / BENCH_PYTHON
SLURM_RESOURCES = slurm.job_resources(config["slurm"])
# What the runs need (images, the data sample) is made before the first measurement: otherwise the
# bare-metal runs, ready first, would all run before any container run, and the runtimes would be
# measured at different times instead of interleaved by repetition (benchmark.smk).
BEFORE_ANY_MEASUREMENT = 1_000_000


wildcard_constraints:
    run_id=r"(train|netbench)_[^/]+_rep\d+",  # ids are made by config.RunSpec.run_id
