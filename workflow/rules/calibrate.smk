# `snakemake ... calibrate`: before a sweep is submitted, a short run of each of its benchmarks at its
# cheapest point (cost.calibration_runs: bare metal, the fewest nodes, a few steps), so that the
# estimate has an expected figure for points never measured here. The records stay apart from the
# sweep's (results/calibration/): no table reads them, and the sweep's own runs keep their
# counterbalanced order. Later estimates read them while results/ is kept (cost.sweep_records).

CALIBRATION_RUNS = {run.run_id: run for run in cost.calibration_runs(SWEEP)}
CALIBRATION = cost.calibration_plans(SWEEP, list(CALIBRATION_RUNS.values()))
CALIBRATION_DIR = f"{RESULTS}/{cost.CALIBRATION_DIR}"


rule calibrate:
    """The sweep's estimate, its expected figure from the calibration runs and every earlier record."""
    input:
        expand(f"{CALIBRATION_DIR}/{{run_id}}.json", run_id=sorted(CALIBRATION)),
    output:
        text=f"{RESULTS}/estimate.txt",
        json=f"{RESULTS}/estimate.json",
    log:
        f"{RESULTS}/logs/calibration/estimate.txt",
    localrule: True
    run:
        cost.write_summary(
            SWEEP, history.newest_sweep_records(HISTORY_STORE, config["system"]), output.text, output.json, log[0]
        )


# A measurement (its name says so): the pre-flight check runs before it (common.smk's onstart).
rule measure_calibration:
    input:
        unpack(lambda wildcards: SWEEP.inputs_of(CALIBRATION_RUNS[wildcards.run_id])),
    output:
        log=f"{CALIBRATION_DIR}/{{run_id}}.log",
    log:
        f"{RESULTS}/logs/calibration/{{run_id}}.txt",
    wildcard_constraints:
        run_id=Point.run_id_pattern(cost.CALIBRATION_REPETITION),
    params:
        cb=CB,
        plan=lambda wildcards: CALIBRATION[wildcards.run_id].to_json(),
    resources:
        **job_shape(CALIBRATION),
    localrule: ALLOCATES
    shell:
        "{params.cb} launch --log {output.log:q} --plan {params.plan:q} 2> {log:q}"


rule parse_calibration:
    input:
        f"{CALIBRATION_DIR}/{{run_id}}.log",
    output:
        f"{CALIBRATION_DIR}/{{run_id}}.json",
    log:
        f"{RESULTS}/logs/calibration/parse-{{run_id}}.txt",
    wildcard_constraints:
        run_id=Point.run_id_pattern(cost.CALIBRATION_REPETITION),
    params:
        cb=CB,
    localrule: True
    shell:
        "{params.cb} parse {input:q} --out {output:q} 2> {log:q}"
