# One job per benchmark process. The raw log is the source of every figure; a
# run that crashes still leaves its log and becomes a record marked failed.


rule measure:
    output:
        log=f"{RESULTS}/runs/{{run_id}}.log",
    params:
        plan=lambda wildcards: json.dumps(PLANS[wildcards.run_id], sort_keys=True),
    resources:
        # Two benchmarks sharing a machine measure each other: one at a time.
        exclusive_machine=1,
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
