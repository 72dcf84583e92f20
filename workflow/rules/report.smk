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
    localrule: True
    shell:
        "{CB} report {input.records} --tables-dir {RESULTS} --out {output}"
