# `benchmark.repetitions: auto`: every train point's min_repetitions, then rounds. Round r is a
# checkpoint: it reads the records of the points still going and writes which of them need more
# repetitions, and how many (containerbench.repetitions decides). What reads the records (RECORDS,
# report.smk) walks the rounds with checkpoints.repetition_round.get(round=r): Snakemake re-evaluates
# the DAG after each round and adds only the runs it asked for (Snakemake's documentation, "Data-dependent
# conditional execution": https://snakemake.readthedocs.io/en/stable/snakefiles/rules.html#data-dependent-conditional-execution).
# Every run a point may need is planned and has its measure_rep rule (benchmark.smk), so a round's
# repetitions still interleave the runtimes; a finished run is never made again, and a round is decided
# again only when its records or its settings (target_ci_percent, max_repetitions) change.
# Functions only here: `snakemake --lint` wants rules and functions in separate files.
AUTO_REPETITIONS = config["benchmark"]["repetitions"] == cb_config.AUTO
FEWEST_REPETITIONS, MOST_REPETITIONS = cb_config.repetition_bounds(config["benchmark"])
FIRST_RUNS = [run.run_id for run in cb_config.first_runs(config, SWEEP.runs)]
POINT_RUNS = {}  # point id -> its run ids, repetition 1 first (SWEEP.runs is repetition-major)
for spec in SWEEP.runs:
    POINT_RUNS.setdefault(spec.point_id, []).append(spec.run_id)


def record_path(run_id):
    return f"{RESULTS}/runs/{run_id}.json"


def round_path(round_number):
    return f"{RESULTS}/rounds/round-{round_number}.json"


def decided_round(round_number):
    """Round r's decision; until it has run, Snakemake takes the exception this raises as a dependency on it."""
    with checkpoints.repetition_round.get(round=round_number).output[0].open() as decision:
        return json.load(decision)


def repetition_rounds():
    """The runs the rounds asked for beyond FIRST_RUNS, and the last round's file (why each point stopped)."""
    asked, round_number = [], FEWEST_REPETITIONS
    while going := decided_round(round_number)["next"]:
        asked += going
        round_number += 1
    return asked, round_path(round_number)


def round_inputs(wildcards):
    """Round r reads repetitions 1..r of the points the previous round sent on (the first round: every point)."""
    round_number = int(wildcards.round)
    if round_number == FEWEST_REPETITIONS:
        return {
            "records": [
                record_path(spec.run_id)
                for spec in SWEEP.runs
                if spec.kind == "train" and spec.repetition <= round_number
            ]
        }
    previous = decided_round(round_number - 1)
    going = {Point.id_of(run_id) for run_id in previous["next"]}
    return {
        "records": [
            record_path(run_id)
            for point in sorted(going)
            for run_id in POINT_RUNS[point][: previous["points"][point]["asked"]]
        ],
        "previous": round_path(round_number - 1),
    }


def auto_records(wildcards):
    """The records of the first runs and of the repetitions the rounds asked for (RECORDS, report.smk)."""
    return [record_path(run_id) for run_id in FIRST_RUNS + repetition_rounds()[0]]
