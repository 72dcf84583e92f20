# Records -> tables -> report. Nothing here reads a raw log.

RECORDS = auto_records if AUTO_REPETITIONS else expand(f"{RESULTS}/runs/{{run_id}}.json", run_id=PLANS)
# With auto, the tables read why each point's repetitions stopped from the last round (rounds.smk).
REPETITION_STOPS = {"stops": lambda wildcards: repetition_rounds()[1]} if AUTO_REPETITIONS else {}
# Runs set aside to be measured again (`containerbench remeasure`, attempts.py): the index it rewrites is
# newer than the tables, so Snakemake remakes them, and with them the records that are missing.
SET_ASIDE = {"set_aside": f"{RESULTS}/{attempts.INDEX}"} if Path(RESULTS, attempts.INDEX).exists() else {}
# The references the export judges against, where the config names a file (validation.references).
REFERENCES = {"references": config["validation"]["references"]} if config["validation"]["references"] else {}


rule tables:
    # fmt: off
    # The records first, as a dry run lists them (snakefmt would move the ** before them).
    input:
        records=RECORDS,
        **REPETITION_STOPS,
        **SET_ASIDE,
    # fmt: on
    output:
        # Every file `containerbench tables` writes, by name (results.TABLE_FILES).
        **{name: f"{RESULTS}/{file}" for name, file in results.TABLE_FILES.items()},
        tensorboard=directory(f"{RESULTS}/{results.TENSORBOARD_DIR}"),
    log:
        f"{RESULTS}/logs/tables.txt",
    params:
        cb=CB,
        out_dir=lambda wildcards, output: Path(output.summary).parent,
        stops=lambda wildcards, input: ["--repetition-stops", input.stops] if "stops" in input.keys() else [],
    localrule: True
    shell:
        "{params.cb} tables {input.records:q} {params.stops:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule store_history:
    """Every record also goes into the results store, as this run's session, and what changed since
    the system's previous session goes to the report. The store itself is not an output: it holds
    every run's records, and Snakemake removes a job's outputs before it runs."""
    input:
        RECORDS,
    output:
        summary=f"{RESULTS}/history/session.json",
        since_last=f"{RESULTS}/history/since_last.csv",
    log:
        f"{RESULTS}/logs/store_history.txt",
    params:
        cb=CB,
        store=HISTORY_STORE,
        tag=["--tag", config["history"]["tag"]] if config["history"]["tag"] else [],
        digest=CONFIG_DIGEST,
    localrule: True
    shell:
        "{params.cb} store {input:q} --store {params.store:q} --kind sweep {params.tag:q} "
        "--config-digest {params.digest} --summary {output.summary:q} --since-last {output.since_last:q} "
        "> {log:q} 2>&1"


rule report:
    input:
        tables=[path for path in rules.tables.output if path.endswith(".csv")],
        records=RECORDS,
        # Paths: a rule reference among the inputs makes Snakemake hash the named list of records once
        # for each record (quadratic in the runs).
        history=[str(path) for path in rules.store_history.output],
    output:
        f"{RESULTS}/report.html",
    log:
        f"{RESULTS}/logs/report.txt",
    params:
        cb=CB,
        # A function: a reason may hold braces (docker's probe format), which Snakemake would expand.
        skipped=lambda wildcards: json.dumps(SWEEP.skipped, sort_keys=True),
    localrule: True
    shell:
        "{params.cb} report {input.records:q} --tables {input.tables:q} --out {output:q} "
        "--skipped {params.skipped:q} --history {input.history:q} > {log:q} 2>&1"


rule export:
    """The records in the formats a site's tools already read (export.py): ReFrame perflogs, a JUnit XML
    and OpenMetrics text, each node's apart for its textfile collector. With validation.references set,
    the perflogs carry each reference and the JUnit XML and metrics the verdict."""
    # fmt: off
    input:
        records=RECORDS,
        **REFERENCES,
    # fmt: on
    output:
        perflogs=directory(f"{RESULTS}/export/{export.PERFLOG_DIR}"),
        junit=f"{RESULTS}/export/{export.JUNIT_FILE}",
        metrics=f"{RESULTS}/export/{export.METRICS_FILE}",
        by_node=directory(f"{RESULTS}/export/{export.BY_NODE_DIR}"),
    log:
        f"{RESULTS}/logs/export.txt",
    params:
        cb=CB,
        out_dir=lambda wildcards, output: Path(output.junit).parent,
        references=lambda wildcards, input: ["--references", input.references] if REFERENCES else [],
        strict=["--strict"] if config["validation"]["strict"] else [],
        fraction=config["validation"]["slow_node_fraction"],
    localrule: True
    shell:
        "{params.cb} export {input.records:q} --out-dir {params.out_dir:q} {params.references:q} {params.strict:q} "
        "--slow-node-fraction {params.fraction} > {log:q} 2>&1"


rule baseline:
    """Write a references file from this run: `snakemake baseline` on healthy nodes."""
    input:
        RECORDS,
    output:
        f"{RESULTS}/references.yaml",
    log:
        f"{RESULTS}/logs/baseline.txt",
    params:
        cb=CB,
    localrule: True
    shell:
        "{params.cb} baseline {input:q} --out {output:q} > {log:q} 2>&1"


rule validate:
    """The node-validation verdict: `snakemake validate` (set validation.references).

    No output, only logs: the verdict is worked out afresh on every request (the
    references may have changed), the workflow exits non-zero on FAIL, and Snakemake
    keeps a failed job's logs, so the verdict file survives a FAIL."""
    input:
        records=RECORDS,
        references=lambda wildcards: config["validation"]["references"]
        or sys.exit(
            "containerbench: config: 'validation.references' is not set; "
            "allowed: the path of a references file (snakemake baseline writes one)"
        ),
    log:
        verdict=f"{RESULTS}/validation.txt",
        messages=f"{RESULTS}/logs/validate.txt",
    params:
        cb=CB,
        strict="--strict" if config["validation"]["strict"] else "",
        fraction=config["validation"]["slow_node_fraction"],
    localrule: True
    shell:
        "{params.cb} validate {input.records:q} --references {input.references:q} {params.strict} "
        "--slow-node-fraction {params.fraction} --out {log.verdict:q} > {log.messages:q} 2>&1"
