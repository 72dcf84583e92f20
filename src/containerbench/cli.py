"""`containerbench` command line: what the workflow's rules call, and what a
person runs to inspect a plan or re-parse a log by hand.

Each command imports what it needs when it runs: `plan` and `launch` start
without loading pandas or matplotlib."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench.status import Status


def cmd_plan(args) -> int:
    from containerbench.launch import (
        estimate,
        first_plans,
        format_estimate,
        format_most,
        most_estimate,
        one_node_jobs,
        prepare,
        sweep_records,
    )

    if args.records and not args.estimate:
        raise cb_config.ConfigError("plan: --records is read only with --estimate")
    config = cb_config.load(args.config)
    if args.every_runtime:
        print(every_runtime(config, Path.cwd()))
        return 0
    # What each runtime would run, from this clone; nothing is probed here.
    sweep = prepare(config, Path.cwd(), probe=False)
    if args.estimate:
        if args.run_id and args.run_id not in sweep.plans:
            raise cb_config.ConfigError(f"plan: --run-id {args.run_id!r} is not a run of this sweep")
        records, source = sweep_records(config, args.records)
        # With repetitions auto: the minimum counted, and what the most would cost beside it.
        plans = [sweep.plans[args.run_id]] if args.run_id else first_plans(sweep, config)
        cost = estimate(plans, config, records, one_node_jobs(sweep, config))
        most = None if args.run_id else most_estimate(sweep, config, records)
        if args.json:
            print(json.dumps({**cost.as_dict(), **({"at_most": most.as_dict()} if most else {})}, sort_keys=True))
        else:
            print(format_estimate(cost, source) + (f"\n{format_most(most, config)}" if most else ""))
        return 0
    for spec in sweep.runs:
        if args.run_id and spec.run_id != args.run_id:
            continue
        run_plan = sweep.plans[spec.run_id]
        if args.json:
            print(json.dumps(run_plan, sort_keys=True))
        else:
            env = " ".join(f"{k}={v}" for k, v in sorted(run_plan["env"].items()))
            print(f"{spec.run_id}\n  env:  {env}\n  argv: {shlex.join(run_plan['argv'])}")
    return 0


def cmd_launch(args) -> int:
    from containerbench.launch import measure, run_allocated_plans, run_in_allocation
    from containerbench.slurm import in_allocation

    run_plan = json.loads(Path(args.plan[1:]).read_text()) if args.plan.startswith("@") else json.loads(args.plan)
    if args.in_allocation or (run_plan.get("allocation") and in_allocation()):
        # In an allocation already (salloc's, or a site's own session): the run is a step of it.
        return run_in_allocation([run_plan], [args.log])
    if run_plan.get("allocation"):  # its own allocation, with this process outside it
        return run_allocated_plans([run_plan], [args.log], run_plan["allocation"],
                                   ["launch", "--plan", args.plan, "--log", args.log])
    returncode = measure(run_plan, Path(args.log))
    if returncode != 0:
        print(f"containerbench: {run_plan['run_id']} exited with {returncode}; kept as a failed run, "
              f"see {args.log}", file=sys.stderr)
    return 0  # a failed benchmark is a measured outcome, not a workflow error


def cmd_parse(args) -> int:
    from containerbench.records import write_record

    record = write_record(args.log, args.out, args.telemetry)
    if record["status"] != Status.OK:
        print(f"containerbench: {record['run_id']} {record['status']}: {'; '.join(record['reasons'])}", file=sys.stderr)
    return 0


def cmd_tables(args) -> int:
    from containerbench.results import write_tables

    if args.repetition_stops:
        from containerbench.repetitions import stops

        write_tables(args.records, args.out_dir, stops(args.repetition_stops))
    else:
        write_tables(args.records, args.out_dir)
    return 0


def cmd_round(args) -> int:
    from containerbench.repetitions import write_round

    try:
        decision = write_round(args.records, args.round, args.target_ci_percent, args.max_repetitions, args.out,
                               args.previous)
    except ValueError as error:
        print(f"containerbench: round {args.round}: {error}", file=sys.stderr)
        return 1
    stopped = sum(entry["stop"] is not None for entry in decision["points"].values())
    print(f"containerbench: round {args.round}: {len(decision['next'])} point(s) go on to repetition "
          f"{args.round + 1}, {stopped} stopped")
    return 0


def cmd_report(args) -> int:
    from containerbench.report import render

    render(args.tables, args.records, args.out, skipped=json.loads(args.skipped), history=args.history)
    return 0


def _system_of(record_paths, given: str | None) -> str:
    """The system named on the command line, else the one every record names."""
    from containerbench.records import load_records

    if given:
        return given
    systems = {r["spec"].get("system") for r in load_records(record_paths)[0]} - {None}
    if len(systems) != 1:
        raise cb_config.ConfigError(f"--system is needed: the records name {sorted(systems) or 'no system'}")
    return systems.pop()


def cmd_validate(args) -> int:
    from containerbench.validate import ReferencesError, format_outcome, validate

    try:
        outcome = validate(args.records, args.references, _system_of(args.records, args.system),
                           strict=args.strict, slow_fraction=args.slow_node_fraction)
    except ReferencesError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    text = format_outcome(outcome)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if outcome.passed else 1


def cmd_baseline(args) -> int:
    from containerbench.records import load_records
    from containerbench.validate import performance_variables, write_baseline

    records, _ = load_records(args.records)
    source = f"{len(records)} run records"
    if args.good_nodes:  # the nodes a site trusts: the reference for their node type
        from containerbench.fleet import in_order, on_nodes
        from containerbench.slurm import QueryError, expand_hostlist

        try:
            good = expand_hostlist(args.good_nodes) if "[" in args.good_nodes else args.good_nodes.split(",")
        except QueryError as error:
            raise cb_config.ConfigError(f"baseline: --good-nodes: {error}") from None
        records = on_nodes(records, good)
        source = f"{len(records)} run records on {','.join(in_order(good))}"
    measured = performance_variables(records)
    if measured.empty:
        print("containerbench: no successful runs to take a baseline from", file=sys.stderr)
        return 1
    write_baseline(measured, _system_of(args.records, args.system), args.out, lower=args.lower, upper=args.upper,
                   source=source)
    print(f"containerbench: wrote {len(measured)} references to {args.out}")
    return 0


def cmd_store(args) -> int:
    import hashlib

    from containerbench.history import HistoryError, since_last, store
    from containerbench.records import load_records

    records, problems = load_records(args.records)  # a corrupt record is named and left out
    config_digest = args.config_digest
    if args.config_file:
        try:
            config_digest = hashlib.sha256(Path(args.config_file).read_bytes()).hexdigest()
        except OSError as error:
            raise cb_config.ConfigError(f"store: --config {args.config_file}: {error.strerror}") from None
    if not records:
        print(f"containerbench: no run records to store ({len(problems)} unreadable)", file=sys.stderr)
        return 1
    try:
        result = store(args.store, records, tag=args.tag, system=args.system, config_digest=config_digest)
        sessions, changes = since_last(args.store, records) if args.since_last or args.summary else ({}, None)
    except HistoryError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    where = f"session {result.session_id}" if result.session_id else "no new session"
    print(f"containerbench: {where} in {args.store}: {result.stored} record(s) stored, "
          f"{result.skipped} already stored")
    if args.summary:
        Path(args.summary).write_text(json.dumps({"store": str(args.store), "stored": result.stored,
                                                  "skipped": result.skipped, **sessions}, indent=1) + "\n")
    if args.since_last:
        changes.to_csv(args.since_last, index=False)
    return 0


def cmd_history(args) -> int:
    from containerbench.history import HistoryError, format_sessions, sessions

    try:
        print(format_sessions(sessions(args.store)))
    except HistoryError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    return 0


def cmd_compare(args) -> int:
    from containerbench.history import HistoryError, compare, format_comparison, resolve

    try:
        sides = {name: resolve(args.store, selector) for name, selector in (("A", args.a), ("B", args.b))}
        frame = compare(args.store, args.a, args.b)
    except HistoryError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    for (name, ids), selector in zip(sides.items(), (args.a, args.b)):
        print(f"{name} = {selector}: session(s) {', '.join(map(str, ids if isinstance(ids, list) else [ids]))}")
    print(format_comparison(frame))
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return 0


def cmd_fleet_plan(args) -> int:
    from containerbench import fleet, slurm

    try:
        planned = fleet.plan(fleet.select(args.nodes, args.partition))
    except slurm.QueryError as error:
        print(f"containerbench: fleet: {error}", file=sys.stderr)
        return 2
    if args.write:
        Path(args.write).write_text(json.dumps(planned.as_dict(), indent=1) + "\n")
    print(fleet.format_plan(planned))
    return 0


def cmd_fleet_run(args) -> int:
    from containerbench import fleet

    return fleet.run_job(args.job, args.in_allocation)


def cmd_fleet_summary(args) -> int:
    from containerbench import fleet

    text, failed = fleet.format_summary(args.summary)
    print(text, end="")
    return 1 if failed else 0


def cmd_fleet_judge(args) -> int:
    import subprocess

    from containerbench import fleet
    from containerbench.records import load_records

    try:
        planned = fleet.FleetPlan.load(args.plan, "--plan")
    except fleet.FleetError as error:
        print(f"containerbench: fleet: {error}", file=sys.stderr)
        return 2
    records, _ = load_records(args.records)
    references = {}
    if args.references:
        from containerbench.validate import ReferencesError, load_references

        try:
            references = load_references(args.references, args.system or _system_of(args.records, None))
        except ReferencesError as error:
            print(f"containerbench: {error}", file=sys.stderr)
            return 2
    verdict = fleet.judge(records, planned, references, min_shortfall=args.min_shortfall)
    paths = fleet.write_verdict(verdict, args.out_dir)
    from containerbench.report import render_fleet

    page = Path(args.out_dir) / "fleet.html"
    render_fleet(args.out_dir, page, args.min_shortfall, fleet.ROBUST_Z_LIMIT)
    print(fleet.format_verdict(verdict))
    print(f"tables and page: {page.parent}/fleet_*.csv, {page}")
    drain = paths["drain"].read_text()
    if drain:
        print(f"drain list ({paths['drain']}){'' if args.drain else ', not run: --drain runs it'}:\n{drain}", end="")
    for argv in fleet.drain_commands(verdict) if args.drain else []:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        node = argv[2].removeprefix("NodeName=")
        print(f"  {node}: {'drained' if done.returncode == 0 else 'NOT drained: ' + done.stderr.strip()}")
    return 1 if (verdict.failed_nodes or verdict.bad_links) and not args.exit_zero else 0


def cmd_freeze_image(args) -> int:
    from containerbench.images import ImageStepError, image_lock
    from containerbench.runtimes import runtime_for

    config = cb_config.load(args.config)
    try:
        runtime = runtime_for(args.runtime, config)
        if runtime.name == "bare-metal":
            raise ValueError("runtime 'bare-metal' has no image; allowed: a container runtime of the config")
        lock = image_lock(runtime)
    except (ValueError, ImageStepError) as error:
        raise cb_config.ConfigError(f"freeze-image: {error}") from None
    Path(args.out).write_text(lock)
    print(f"containerbench: {lock.count(chr(10)) - 2} pins of {runtime.image} written to {args.out}")
    return 0


# What the site names in images.<runtime>.image where the workflow cannot build the image (Shifter's gateway).
SITE_IMAGE = {"shifter": "id:SHIFTERIMG_LOOKUP_ID"}


def every_runtime(config: dict, repo: Path) -> str:
    """Every runtime in each MPI model it supports, for the config's first run: its prepare commands
    and the run's argv and environment, whether or not the config's sweep names it."""
    import copy

    from containerbench import images
    from containerbench.launch import prepare
    from containerbench.runtimes import CONTAINER_RUNTIMES, MPI_MODELS

    blocks = []
    for name in ["bare-metal", *CONTAINER_RUNTIMES]:
        for model in ("host",) if name == "bare-metal" else MPI_MODELS:
            one = copy.deepcopy(config)
            one["runtimes"] = [name]
            if name != "bare-metal":
                settings = {key: value for key, value in (one["images"].get(name) or {}).items()
                            if key not in cb_config.IMAGE_KEYS}
                settings["mpi_model"] = model
                if name == "shifter":  # its gateway serves images: a site's (MPICH-based for native)
                    settings["image"] = settings["torch_image"] = SITE_IMAGE[name]
                one["images"][name] = settings
            title = f"{name} ({model})"
            try:
                sweep = prepare(one, repo, probe=False)
            except cb_config.ConfigError as refused:
                blocks.append(f"{title}\n  not supported: {str(refused).removeprefix('config: ')}")
                continue
            run_plan = sweep.plans[sweep.runs[0].run_id]
            build = one["images"]["build"]
            flavour = cb_config.MPI_FLAVOURS[cb_config.MODEL_FLAVOUR[model if model != "host" else "hybrid"]]
            env = cb_config.bench_env(one, sweep.runs[0].framework)
            prepared = images.runtime_commands(build["engine"], images.flavour_tag(build["tag"], env, flavour), "REGISTRY",
                                               repo / images.IMAGES, one["slurm"]["gpus_per_node"] > 0).get(name, [])
            uses_built = any((use.runtime, use.mpi_model) == (name, model) for use in sweep.image_files)
            lines = [title, *(f"  prepare: {shlex.join(argv)}" for argv in (prepared if uses_built or name == "shifter" else []))]
            env = " ".join(f"{k}={v}" for k, v in sorted(run_plan["env"].items()))
            lines += [f"  env:  {env}", f"  argv: {shlex.join(run_plan['argv'])}"]
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="containerbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="print every run of the sweep with its exact argv and environment")
    p.add_argument("--config", action="append", default=None, help="YAML file(s), later ones override (default config/config.yaml)")
    p.add_argument("--run-id", help="only this run")
    p.add_argument("--json", action="store_true", help="one JSON plan per line (with --estimate: the estimate)")
    p.add_argument("--estimate", action="store_true",
                   help="print what the sweep costs instead: jobs, allocations, worst-case and expected node-hours")
    p.add_argument("--every-runtime", action="store_true",
                   help="instead: every runtime in each MPI model it supports, for the first run of the sweep")
    p.add_argument("--records", action="append", metavar="DIR_OR_GLOB",
                   help="run records of earlier runs the expected figure comes from "
                        "(default: <results_dir>/runs/*.json of the config)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("fleet", help="validate a batch of nodes: plan its node and link jobs, or judge its records")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("plan", help="the batch's nodes from Slurm with their states, its links and job rounds")
    a.add_argument("--nodes", help="a Slurm hostlist, e.g. n[001-064]")
    a.add_argument("--partition", help="every node of this partition")
    a.add_argument("--write", metavar="PLAN_JSON", help="also write the plan, for `fleet judge`")
    a.set_defaults(func=cmd_fleet_plan)
    a = actions.add_parser("run", help="a node's or link's runs one after another, in the allocation salloc made")
    a.add_argument("job", help="the job's file (its allocation, its runs' plans and logs), as validate_nodes writes it")
    a.add_argument("--in-allocation", action="store_true", help="run the plans in the allocation salloc made")
    a.set_defaults(func=cmd_fleet_run)
    a = actions.add_parser("summary", help="print a verdict's summary and drain list; exit 1 if a node or link failed")
    a.add_argument("summary", help="fleet_summary.csv")
    a.set_defaults(func=cmd_fleet_summary)
    a = actions.add_parser("judge", help="the verdict on every node and link; exit 1 if any failed")
    a.add_argument("records", nargs="*", help="the batch's run records, or @FILE listing them")
    a.add_argument("--plan", required=True, help="the file `fleet plan --write` wrote")
    a.add_argument("--out-dir", default="results/fleet", help="where the tables and the drain list go")
    a.add_argument("--min-shortfall", type=float, default=0.10,
                   help="a figure fails only this far (a fraction) worse than the fleet median")
    a.add_argument("--drain", action="store_true", help="run the drain list's scontrol lines")
    a.add_argument("--exit-zero", action="store_true",
                   help="exit 0 when a node or link failed too (the workflow's judge; else 1, and 2 on bad input)")
    a.add_argument("--references", help="a references file: its system's figures bound every node and link too")
    a.add_argument("--system", help="the node type's system in the references file (default: the records' system)")
    a.set_defaults(func=cmd_fleet_judge)

    p = sub.add_parser("freeze-image", help="write what a runtime's image carries as a lock for a bare-metal venv")
    p.add_argument("--config", action="append", default=None, help="YAML file(s) (default config/config.yaml)")
    p.add_argument("--runtime", required=True, help="the container runtime whose image (images.<runtime>.image)")
    p.add_argument("--out", required=True, help="the lock file to write")
    p.set_defaults(func=cmd_freeze_image)

    p = sub.add_parser("launch", help="run one plan, writing its raw log")
    p.add_argument("--plan", required=True, help="the plan as JSON, or @FILE")
    p.add_argument("--log", required=True)
    p.add_argument("--in-allocation", action="store_true",
                   help="run in the allocation salloc made (SLURM_JOB_ID), asking sacct why when it ends under the run")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("parse", help="turn a raw log into a run record")
    p.add_argument("log")
    p.add_argument("--out", required=True)
    p.add_argument("--telemetry", metavar="CSV", help="the run's merged samples (default: the path its launch line names)")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("tables", help="aggregate run records into CSV tables")
    p.add_argument("records", nargs="*")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--repetition-stops", metavar="ROUND_JSON",
                   help="repetitions auto: the last round's file, for the summary's repetitions_stop column")
    p.set_defaults(func=cmd_tables)

    p = sub.add_parser("round", help="repetitions auto: which points need another repetition after this round")
    p.add_argument("records", nargs="*", help="the records of repetitions 1..ROUND of the points still going")
    p.add_argument("--round", type=int, required=True, help="the repetitions every point going has made")
    p.add_argument("--previous", help="the previous round's file (none in the first round)")
    p.add_argument("--target-ci-percent", type=float, required=True)
    p.add_argument("--max-repetitions", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_round)

    p = sub.add_parser("report", help="render the HTML report from the tables")
    p.add_argument("records", nargs="*")
    p.add_argument("--tables", nargs="+", required=True, help="the CSV tables `containerbench tables` wrote")
    p.add_argument("--out", required=True)
    p.add_argument("--skipped", default="{}", help="JSON {runtime: why it was not run here}")
    p.add_argument("--history", nargs=2, metavar=("SUMMARY_JSON", "SINCE_LAST_CSV"),
                   help="what `containerbench store --summary --since-last` wrote: the report's 'Since last time'")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("validate", help="judge a run against reference values: exit 0 only if all pass")
    p.add_argument("records", nargs="+")
    p.add_argument("--references", required=True, help="YAML references file (containerbench baseline writes one)")
    p.add_argument("--system", help="which system's references (default: the system the records name)")
    p.add_argument("--strict", action="store_true", help="a measured figure with no reference fails")
    p.add_argument("--slow-node-fraction", type=float, default=0.10,
                   help="a node this fraction below the median of its peers is named slow (default 0.10)")
    p.add_argument("--out", help="also write the verdict to this file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("baseline", help="write a references file from a good run")
    p.add_argument("records", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--system")
    p.add_argument("--lower", type=float, default=-0.10, help="tolerance below the reference (default -0.10)")
    p.add_argument("--upper", type=float, default=None, help="tolerance above the reference (default: none)")
    p.add_argument("--good-nodes", metavar="NODES",
                   help="only runs on these nodes (n1,n2 or a Slurm hostlist): the nodes of a type declared good")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("store", help="add run records to the results store as one session")
    p.add_argument("records", nargs="+", metavar="RECORD.json", help="run records, or @FILE listing them")
    p.add_argument("--store", required=True, help="the SQLite results store (made when missing)")
    p.add_argument("--tag", help="a name to select this session by")
    p.add_argument("--system", help="the system measured (default: the one the records name)")
    p.add_argument("--config", dest="config_file", metavar="CONFIG",
                   help="the config file of the run: its sha256 is stored with the session")
    p.add_argument("--config-digest", help="instead of --config: the digest of the run's whole config")
    p.add_argument("--summary", metavar="JSON", help="also write this session and the system's previous one")
    p.add_argument("--since-last", metavar="CSV",
                   help="also write each variable's change from the system's previous session (compare)")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser("history", help="list the sessions of the results store")
    p.add_argument("--store", required=True)
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("compare", help="each performance variable's change from session A to B, with a 95%% interval")
    p.add_argument("a", metavar="A", help="a session id, tag, date YYYY-MM-DD (all that day's), latest or previous")
    p.add_argument("b", metavar="B", help="the same, for the side compared against A")
    p.add_argument("--store", required=True)
    p.add_argument("--csv", metavar="FILE", help="also write the comparison as CSV")
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", "unset") is None:
        args.config = ["config/config.yaml"]
    try:
        return args.func(args)
    except cb_config.ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `containerbench plan | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
