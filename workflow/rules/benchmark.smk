# One job per benchmark process. The raw log is the source of every figure; a
# run that crashes still leaves its log and becomes a record marked failed.
#
# One rule per repetition, earlier repetitions first (priority): every runtime's
# first repetition runs before any second one, so container and bare-metal runs
# interleave and a drift of the machine does not land on one runtime only.

REPETITIONS = sorted({run.repetition for run in RUNS})


def _run_inputs(spec: dict) -> dict:
    inputs = {}
    if spec["runtime"] in IMAGE_ARTIFACTS:
        inputs["image"] = IMAGE_ARTIFACTS[spec["runtime"]]
    if DATASET_SAMPLE and spec.get("data") == "real":
        inputs["data"] = rules.dataset_sample.output[0]
    return inputs


RUN_INPUTS = {run_id: _run_inputs(run_plan["spec"]) for run_id, run_plan in PLANS.items()}
JOB_SHAPE = {
    "nodes": lambda wildcards: PLANS[wildcards.run_id]["spec"]["nodes"],
    "tasks": lambda wildcards: PLANS[wildcards.run_id]["spec"]["ranks"],
    "mpi": lambda wildcards: "srun" if PLANS[wildcards.run_id]["spec"]["ranks"] > 1 else None,
} if config["launcher"]["kind"] == "srun" else {}

for repetition in REPETITIONS:

    rule:
        name:
            f"measure_rep{repetition}"
        input:
            # The image a container run needs (images.smk), and the generated sample for a
            # real-data run (data.smk); one function, as each costs Snakemake time per job.
            unpack(lambda wildcards: RUN_INPUTS[wildcards.run_id]),
        output:
            log=f"{RESULTS}/runs/{{run_id}}.log",
        wildcard_constraints:
            # The id's shape, not an alternation of every id: planning a large sweep stays fast.
            run_id=rf"(train|netbench)_[^/]+_rep{repetition}",
        params:
            plan=lambda wildcards: json.dumps(PLANS[wildcards.run_id], sort_keys=True),
        priority: max(REPETITIONS) - repetition
        resources:
            # Two benchmarks sharing a machine measure each other: one at a time (local profile).
            exclusive_machine=1,
            # On Slurm (launcher srun): the run's nodes and ranks. A multi-rank job is an MPI job
            # for the executor plugin (`mpi` set, tasks > 1): it runs our command, which calls srun.
            **JOB_SHAPE,
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
