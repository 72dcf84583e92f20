# Validating a batch of new nodes: `snakemake validate_nodes` with validation.nodes (a Slurm hostlist)
# or validation.partition. docs/validation.md says how nodes are paired and judged.
#
# Each node's job and each link's job holds exactly its nodes, exclusively, and runs its runs one after
# another there, from outside (containerbench fleet run): when Slurm ends the allocation (scancel, time
# limit), the runs get Slurm's state and reason from sacct in their logs and become failed records, so the
# verdict names the node instead of the workflow submitting it again. The jobs run in rounds
# (fleetrounds): every node's job, then the links round by round (fleetplan.job_rounds), no node in two jobs
# at a time; a round's jobs share allocations of validation.nodes_per_allocation nodes, a local rule each, every
# job of one at once on its own nodes, and at most validation.max_jobs allocations run at once.

FLEET_SELECTION = {
    key: config["validation"][key] for key in ("nodes", "partition", "plan") if config["validation"][key]
}
FLEET = None


if FLEET_SELECTION and workflow.is_main_process:  # every fleet rule is local: the planning process runs them
    try:
        if not launchers.uses_slurm(config):
            raise fleetplan.FleetError(
                f"'validation.{next(iter(FLEET_SELECTION))}' needs launcher.kind srun "
                f"(it is {config['launcher']['kind']!r}); allowed: a Slurm site's config"
            )
        FLEET = fleetplan.planned(config["validation"])
        # The jobs' time limits come from earlier records of their runs' benchmarks: the results and
        # calibration directories, the system's newest sweeps and its last batch in the results store.
        EARLIER = history.newest_records(HISTORY_STORE, config["system"], kinds={"sweep": 5, "fleet": 1})
        EARLIER_RECORDS, EARLIER_SOURCE = cost.sweep_records(PLANNED, stored=EARLIER)
        FLEET_JOBS = fleetjobs.FleetJobs(
            PLANNED, FLEET, f"{RESULTS}/fleet", EARLIER_RECORDS, EARLIER_SOURCE, SWEEP.artifacts
        )
        FLEET_ROUNDS = fleetrounds.FleetRounds(FLEET_JOBS, FLEET)
        try:
            PARTITIONS = slurm.partitions()
            fleetjobs.check_time_limit(FLEET_JOBS, config["slurm"], PARTITIONS)
            fleetrounds.check_allocation_size(FLEET_ROUNDS, config["slurm"], PARTITIONS)
        except fleetplan.FleetError as error:
            # Only the batch is refused: a sweep, or the calibration that gives the jobs their expected
            # times (the refusal's own remedy), still runs, and is told what validate_nodes would say.
            if fleet_asked():
                raise
            print(f"containerbench: note: validate_nodes would stop here: {error}", file=sys.stderr)
    except slurm.QueryError as error:
        sys.exit(f"containerbench: config: {error}")  # one line, before anything is submitted
    if PLANS_A_RUN:  # beside the sweep's (common.smk): what `validate_nodes` would hold
        print(FLEET_ROUNDS.cost_summary(), file=sys.stderr)
    if "fleet_jobs" not in workflow.global_resources:  # a --resources fleet_jobs=N of the admin wins
        workflow.register_resource("fleet_jobs", config["validation"]["max_jobs"])

if FLEET is not None:
    FLEET_DIR = f"{RESULTS}/fleet"
    FLEET_IMAGES = FLEET_JOBS.images()
    # Each node's hardware report (validation.hardware): its job runs `fleet hwcheck` there before its runs.
    FLEET_HARDWARE = (
        {"hardware": FLEET_JOBS.hardware_report("{node}")} if config["validation"]["hardware"]["enabled"] else {}
    )

    rule fleet_plan:
        """What was planned, for the verdict (the nodes measured, those Slurm could not run on, the links),
        and each node's and link's job: its allocation, its runs' plans and logs."""
        output:
            plan=f"{FLEET_DIR}/plan.json",
            records=FLEET_JOBS.records_list,
            hardware=FLEET_JOBS.hardware_list,
            # One directory, not a file per job: each node's and link's job depends on it, and Snakemake
            # walks every output of a job's dependencies when the job ends (quadratic in the jobs).
            jobs=directory(FLEET_JOBS.jobs_dir),
        log:
            f"{RESULTS}/logs/fleet/plan.txt",
        params:
            # The allocations' files change with it: planned again when it does.
            nodes_per_allocation=config["validation"]["nodes_per_allocation"],
        localrule: True
        run:
            FLEET_JOBS.write(FLEET, output.plan)
            FLEET_ROUNDS.write()

    for held in FLEET_ROUNDS.held:  # one rule an allocation: its outputs are all of its jobs' files

        rule:
            name:
                held.rule
            input:
                FLEET_IMAGES,
                jobs=FLEET_JOBS.jobs_dir,
                # The round before, finished: its logs' times are not this round's business (a rerun of one is
                # not a reason to measure these again).
                after=[ancient(log) for log in FLEET_ROUNDS.waits_for(held)],
            output:
                # The jobs parse their raw logs into records themselves (a parse job per run would be most of
                # a large batch's DAG).
                **FLEET_ROUNDS.outputs(held),
            log:
                f"{RESULTS}/logs/fleet/allocation-{held.name}.txt",
            params:
                cb=CB,
                allocation=FLEET_ROUNDS.file(held),
            resources:
                fleet_jobs=1,
            localrule: True
            shell:
                "{params.cb} fleet run {params.allocation:q} > {log:q} 2>&1"

    FLEET_VERDICT = {key: f"{FLEET_DIR}/{name}" for key, name in fleetexport.VERDICT_FILES.items()}
    FLEET_JUDGED = dict(
        references=(
            ["--references", config["validation"]["references"], "--system", config["system"]]
            if config["validation"]["references"]
            else []
        ),
        shortfall=config["validation"]["min_shortfall"],
        # A node whose hardware failed fails first, with the tool's line; it is not measured again.
        hardware=["--hardware", f"@{FLEET_JOBS.hardware_list}"] if FLEET_HARDWARE else [],
    )

    checkpoint fleet_suspects:
        """The nodes whose own figures fail the first pass: each is measured again (fleet_recheck) before
        the verdict fails it, at another time, so that a moment's noise on a healthy node drains nothing."""
        input:
            plan=f"{FLEET_DIR}/plan.json",
            listed=FLEET_JOBS.records_list,
            # The node jobs that write the records write the hardware reports too (FLEET_HARDWARE), listed in
            # FLEET_JOBS.hardware_list beside plan.json: the reports again would add a thousand files to the DAG.
            records=FLEET_JOBS.records(),
        output:
            suspects=f"{FLEET_DIR}/recheck/suspects.json",
        log:
            f"{RESULTS}/logs/fleet/suspects.txt",
        params:
            **FLEET_JUDGED,
            cb=CB,
        localrule: True
        shell:
            "{params.cb} fleet suspects @{input.listed:q} --plan {input.plan:q} {params.references:q} "
            "{params.hardware:q} --min-shortfall {params.shortfall} --out {output.suspects:q} > {log:q} 2>&1"

    rule fleet_recheck:
        """A suspect node's job again, its runs the repetitions after the first pass's."""
        input:
            FLEET_IMAGES,
            jobs=FLEET_JOBS.jobs_dir,
            suspects=f"{FLEET_DIR}/recheck/suspects.json",
        output:
            job=f"{FLEET_DIR}/recheck/node-{{node}}.json",
            logs=[f"{FLEET_DIR}/recheck/{spec.run_id}.log" for spec in fleetjobs.recheck_runs(PLANNED, "{node}")],
            records=[f"{FLEET_DIR}/recheck/{spec.run_id}.json" for spec in fleetjobs.recheck_runs(PLANNED, "{node}")],
        log:
            f"{RESULTS}/logs/fleet/recheck-{{node}}.txt",
        wildcard_constraints:
            node=r"[^+/]+",
        params:
            cb=CB,
        resources:
            fleet_jobs=1,
        localrule: True
        run:
            FLEET_JOBS.write_job(("recheck", wildcards.node), output.job)
            shell("{params.cb} fleet run {output.job:q} > {log:q} 2>&1")

    checkpoint fleet_relinks:
        """After the suspects' second measurements: the slow links no end explains (fleetsecond.links_to_settle),
        each measured again with its ends re-paired with nodes that passed (fleet_recheck_link)."""
        input:
            plan=f"{FLEET_DIR}/plan.json",
            listed=FLEET_JOBS.records_list,
            records=FLEET_JOBS.records(),
            rechecked=lambda wildcards: FLEET_JOBS.recheck_records(
                json.loads(Path(checkpoints.fleet_suspects.get().output.suspects).read_text())
            ),
        output:
            relinks=f"{FLEET_DIR}/recheck/relinks.json",
        log:
            f"{RESULTS}/logs/fleet/relinks.txt",
        params:
            **FLEET_JUDGED,
            cb=CB,
        localrule: True
        shell:
            "{params.cb} fleet relinks @{input.listed:q} --recheck {input.rechecked:q} --plan {input.plan:q} "
            "{params.references:q} {params.hardware:q} --min-shortfall {params.shortfall} --out {output.relinks:q} "
            "> {log:q} 2>&1"

    rule fleet_recheck_link:
        """A slow link no end explains, measured again, or one of its ends re-paired with a node that passed
        (fleet_relinks): a link's job, its runs the repetitions after the first pass's."""
        input:
            FLEET_IMAGES,
            jobs=FLEET_JOBS.jobs_dir,
            relinks=f"{FLEET_DIR}/recheck/relinks.json",
        output:
            job=f"{FLEET_DIR}/recheck/link-{{link}}.json",
            logs=[f"{FLEET_DIR}/recheck/{spec.run_id}.log" for spec in fleetjobs.relink_runs(PLANNED, ("{link}",))],
            records=[f"{FLEET_DIR}/recheck/{spec.run_id}.json" for spec in fleetjobs.relink_runs(PLANNED, ("{link}",))],
        log:
            f"{RESULTS}/logs/fleet/recheck-{{link}}.txt",
        wildcard_constraints:
            link=r"[^+/]+\+[^+/]+",
        params:
            cb=CB,
        resources:
            fleet_jobs=1,
        localrule: True
        run:
            FLEET_JOBS.write_job(("recheck", wildcards.link), output.job)
            shell("{params.cb} fleet run {output.job:q} > {log:q} 2>&1")

    rule fleet_verdict:
        """The tables, the page and the drain list; it always succeeds, so they are kept on FAIL."""
        input:
            # Paths, not rules.fleet_plan.output: with a rule reference among its inputs, Snakemake hashes a
            # named list input once for each of its files (quadratic: 70 s for a thousand nodes' records).
            plan=f"{FLEET_DIR}/plan.json",
            listed=FLEET_JOBS.records_list,
            # The node jobs that write the records write the hardware reports too (FLEET_HARDWARE), listed in
            # FLEET_JOBS.hardware_list beside plan.json: the reports again would add a thousand files to the DAG.
            records=FLEET_JOBS.records(),
            # The second measurements, once fleet_suspects and then fleet_relinks have named them: the suspect
            # nodes', then the ambiguous links' and their ends' pairings (none without recheck).
            rechecked=lambda wildcards: (
                FLEET_JOBS.recheck_records(
                    json.loads(Path(checkpoints.fleet_suspects.get().output.suspects).read_text())
                    + json.loads(Path(checkpoints.fleet_relinks.get().output.relinks).read_text())
                )
                if config["validation"]["recheck"]
                else []
            ),
        output:
            **FLEET_VERDICT,
            page=f"{FLEET_DIR}/fleet.html",
            junit=f"{FLEET_DIR}/{fleetexport.FLEET_JUNIT}",
            metrics=directory(f"{FLEET_DIR}/{fleetexport.FLEET_METRICS_DIR}"),
        log:
            f"{RESULTS}/logs/fleet/verdict.txt",
        params:
            **FLEET_JUDGED,
            cb=CB,
            out_dir=lambda wildcards, output: os.path.dirname(output.summary),
            drain=["--drain"] if config["validation"]["drain"] else [],
        localrule: True
        shell:
            "{params.cb} fleet judge @{input.listed:q} --recheck {input.rechecked:q} --plan {input.plan:q} "
            "--out-dir {params.out_dir:q} {params.references:q} {params.hardware:q} "
            "--min-shortfall {params.shortfall} {params.drain:q} --exit-zero > {log:q} 2>&1"

    rule fleet_store_history:
        """The batch's records go into the results store too, as a session of their own (history,
        compare), with what changed since the system's previous session."""
        input:
            listed=FLEET_JOBS.records_list,  # a path, not a rule reference (fleet_verdict says why)
            # After the verdict, which waits for every record: the records themselves again would double
            # the files the DAG resolves.
            judged=FLEET_VERDICT["summary"],
        output:
            summary=f"{FLEET_DIR}/history/session.json",
            since_last=f"{FLEET_DIR}/history/since_last.csv",
        log:
            f"{RESULTS}/logs/fleet/store_history.txt",
        params:
            cb=CB,
            store=HISTORY_STORE,
            tag=["--tag", config["history"]["tag"]] if config["history"]["tag"] else [],
            digest=CONFIG_DIGEST,
        localrule: True
        shell:
            "{params.cb} store @{input.listed:q} --store {params.store:q} --kind fleet {params.tag:q} --config-digest "
            "{params.digest} --summary {output.summary:q} --since-last {output.since_last:q} > {log:q} 2>&1"

    rule validate_nodes:
        """`snakemake validate_nodes`: the workflow exits non-zero when a node, a link or a container path failed."""
        input:
            verdict=rules.fleet_verdict.output.summary,
            stored=rules.fleet_store_history.output.summary,
        log:
            f"{RESULTS}/logs/fleet/validate_nodes.txt",
        params:
            cb=CB,
        localrule: True
        shell:
            "{params.cb} fleet summary {input.verdict:q} 2>&1 | tee {log:q}"

else:

    rule validate_nodes:
        """Without a batch to validate: one line saying what to set."""
        input:
            lambda wildcards: sys.exit(
                "containerbench: config: 'validation.nodes' and 'validation.partition' are "
                "not set; allowed: a Slurm hostlist (n[001-064]) or a partition, in the "
                "site config"
            ),
        log:
            f"{RESULTS}/logs/fleet/validate_nodes.txt",
        localrule: True
        shell:
            "true > {log:q}"
