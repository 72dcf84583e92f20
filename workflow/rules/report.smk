# Records -> tables -> report. Nothing here reads a raw log.


rule tables:
    input:
        expand(f"{RESULTS}/runs/{{run_id}}.json", run_id=PLANS),
    output:
        summary=f"{RESULTS}/summary.csv",
        runs=f"{RESULTS}/runs.csv",
        netbench=f"{RESULTS}/netbench.csv",
        failures=f"{RESULTS}/failures.csv",
    localrule: True
    shell:
        "{CB} tables {input} --out-dir {RESULTS}"


rule report:
    input:
        tables=rules.tables.output,
        records=rules.tables.input,
    output:
        f"{RESULTS}/report.html",
    params:
        skipped=lambda wildcards: json.dumps(SKIPPED_RUNTIMES, sort_keys=True),
    localrule: True
    shell:
        "{CB} report {input.records} --tables-dir {RESULTS} --out {output} --skipped {params.skipped:q}"


rule baseline:
    """Write a references file from this run: `snakemake baseline` on healthy nodes."""
    input:
        rules.tables.input,
    output:
        f"{RESULTS}/references.yaml",
    localrule: True
    shell:
        "{CB} baseline {input} --out {output}"


rule validate:
    """The node-validation verdict: `snakemake validate` (set validation.references)."""
    input:
        records=rules.tables.input,
        references=lambda wildcards: config["validation"]["references"]
        or sys.exit("containerbench: config: 'validation.references' is not set; "
                    "allowed: the path of a references file (snakemake baseline writes one)"),
    output:
        f"{RESULTS}/validation.txt",
    params:
        strict="--strict" if config["validation"]["strict"] else "",
        fraction=config["validation"]["slow_node_fraction"],
    localrule: True
    shell:
        "{CB} validate {input.records} --references {input.references} {params.strict} "
        "--slow-node-fraction {params.fraction} --out {output} --report-only"
