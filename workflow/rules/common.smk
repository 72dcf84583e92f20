# Configuration checked before any job starts, and the sweep expanded into plans.
import json
import re
import sys

from snakemake.utils import validate

from containerbench import config as cb_config
from containerbench.launch import plan as make_plan

try:
    cb_config.check(config)  # one line naming the key, the value and what is allowed
    validate(config, "../schemas/config.schema.yaml")  # fills the schema's defaults
    RUNS = cb_config.plan_runs(config)
    cb_config.check_runs(config, RUNS)
except cb_config.ConfigError as error:
    # Stop before any job starts, with the one line and no traceback.
    sys.exit(f"containerbench: {error}")
PLANS = {run.run_id: make_plan(run, config) for run in RUNS}

RESULTS = "results"
CB = f"{sys.executable} -m containerbench"


wildcard_constraints:
    run_id="|".join(map(re.escape, PLANS)),
