# One job per benchmark process. The raw log is the source of every figure; a
# run that crashes still leaves its log and becomes a record marked failed.
#
# One rule per repetition, earlier repetitions first (priority): every runtime's
# first repetition runs before any second one, so container and bare-metal runs
# interleave and a drift of the machine does not land on one runtime only.

REPETITIONS = sorted({run.repetition for run in RUNS})

for repetition in REPETITIONS:

    rule:
        name:
            f"measure_rep{repetition}"
        input:
            # The image a container run needs, built by the rules in images.smk.
            image=lambda wildcards: IMAGE_ARTIFACTS.get(PLANS[wildcards.run_id]["spec"]["runtime"], []),
        output:
            log=f"{RESULTS}/runs/{{run_id}}.log",
        wildcard_constraints:
            run_id="|".join(re.escape(run.run_id) for run in RUNS if run.repetition == repetition),
        params:
            plan=lambda wildcards: json.dumps(PLANS[wildcards.run_id], sort_keys=True),
        priority: max(REPETITIONS) - repetition
        resources:
            # Two benchmarks sharing a machine measure each other: one at a time (local profile).
            exclusive_machine=1,
            # On Slurm: the run's nodes and ranks. A multi-rank job is an MPI job for the
            # executor plugin (`mpi` set, tasks > 1): it runs our command, which calls srun.
            nodes=lambda wildcards: PLANS[wildcards.run_id]["spec"]["nodes"],
            tasks=lambda wildcards: PLANS[wildcards.run_id]["spec"]["ranks"],
            mpi=lambda wildcards: "srun" if PLANS[wildcards.run_id]["spec"]["ranks"] > 1 else None,
            **SLURM_RESOURCES,
        shell:
            "{CB} launch --log {output.log} --plan {params.plan:q}"


rule parse_run:
    input:
        f"{RESULTS}/runs/{{run_id}}.log",
    output:
        f"{RESULTS}/runs/{{run_id}}.json",
    localrule: True
    shell:
        "{CB} parse {input} --out {output}"
