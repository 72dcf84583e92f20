# One job per benchmark process. The raw log is the source of every figure; a
# run that crashes still leaves its log and becomes a record marked failed.
#
# One rule per repetition, earlier repetitions first (priority): every runtime's
# first repetition runs before any second one, so container and bare-metal runs
# interleave; within a repetition the order rotates (plans.run_order), so that
# no runtime always runs first and a drift of the machine lands on each alike.

REPETITIONS = sorted({run.repetition for run in SWEEP.runs})
try:
    MEASUREMENT_PRIORITY = plans.measurement_priorities(SWEEP.runs, below=BEFORE_ANY_MEASUREMENT)
except cb_config.ConfigError as error:
    sys.exit(f"containerbench: {error}")
TELEMETRY_OUTPUT = {"telemetry": f"{RESULTS}/telemetry/{{run_id}}.csv"} if config["telemetry"]["enabled"] else {}
# Launcher srun from the workflow's node (launchers.Allocation.PER_RUN): each run is a local job that asks Slurm for its
# own allocation (salloc, with the slurm section's resources: in its plan) and launches from outside it, so
# that a run Slurm ends (scancel, time limit, node failure, preemption) is recorded with sacct's state and
# reason, as a failed record, instead of vanishing with its job and being submitted again next time.
ALLOCATES = SWEEP.allocation is launchers.Allocation.PER_RUN
# Inside a site's allocation instead, runs are its job steps: through the executor plugin (common.smk).
JOB_SHAPE = job_shape(PLANS)

for repetition in REPETITIONS:

    rule:
        name:
            f"measure_rep{repetition}"
        input:
            # The image a container run needs (images.smk), and the generated sample for a
            # real-data run (data.smk); one function, as each costs Snakemake time per job.
            unpack(lambda wildcards: SWEEP.inputs[wildcards.run_id]),
        # fmt: off
        # The log first, as a dry run lists it (snakefmt would move the ** before it).
        output:
            # The raw log: the launch line, everything the ranks print, the exit line.
            log=f"{RESULTS}/runs/{{run_id}}.log",
            # What each node's sampler saw while the run measured (execution.collect_telemetry).
            **TELEMETRY_OUTPUT,
        # fmt: on
        log:
            # The launcher's own complaints (a launcher that cannot start, the exit status).
            f"{RESULTS}/logs/launch/{{run_id}}.txt",
        wildcard_constraints:
            # The id's shape, not an alternation of every id: planning a large sweep stays fast.
            run_id=Point.run_id_pattern(repetition),
        params:
            cb=CB,
            plan=lambda wildcards: PLANS[wildcards.run_id].to_json(),
        priority: lambda wildcards: MEASUREMENT_PRIORITY[wildcards.run_id]
        resources:
            # A job step's nodes and ranks, for the executor plugin. A multi-rank job is an MPI job
            # for it (`mpi` set, tasks > 1): it runs our command, which calls srun.
            **JOB_SHAPE,
        localrule: ALLOCATES
        shell:
            "{params.cb} launch --log {output.log:q} --plan {params.plan:q} 2> {log:q}"


# `benchmark.repetitions: auto`: the rounds (rounds.smk says how), each a checkpoint.
include: "rounds.smk"


if AUTO_REPETITIONS:

    checkpoint repetition_round:
        input:
            unpack(round_inputs),
        output:
            f"{RESULTS}/rounds/round-{{round}}.json",
        log:
            f"{RESULTS}/logs/rounds/round-{{round}}.txt",
        wildcard_constraints:
            round=r"\d+",
        params:
            cb=CB,
            previous=lambda wildcards, input: ["--previous", input.previous] if "previous" in input.keys() else [],
            target=config["benchmark"].get("target_ci_percent"),
            most=MOST_REPETITIONS,
        localrule: True
        shell:
            "{params.cb} round {input.records:q} --round {wildcards.round} {params.previous:q} "
            "--target-ci-percent {params.target} --max-repetitions {params.most} --out {output:q} > {log:q} 2>&1"


rule parse_run:
    # fmt: off
    # The log first, as a dry run lists it (snakefmt would move the ** before it).
    input:
        log=f"{RESULTS}/runs/{{run_id}}.log",
        # Read by the parser through the path the log's launch line names.
        **TELEMETRY_OUTPUT,
    # fmt: on
    output:
        f"{RESULTS}/runs/{{run_id}}.json",
    log:
        f"{RESULTS}/logs/parse/{{run_id}}.txt",
    params:
        cb=CB,
    localrule: True
    shell:
        "{params.cb} parse {input.log:q} --out {output:q} 2> {log:q}"
