"""`containerbench parse`, `tables`, `round`, `report`, `remeasure`, `validate` and `baseline`: a run's
raw log made a record, records made tables and a report, runs set aside to be measured again, and
records judged against references."""

from __future__ import annotations

import json
import sys

from containerbench import config as cb_config
from containerbench import outputs


def cmd_parse(args) -> int:
    from containerbench.records import write_record
    from containerbench.status import Status

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
    going = sum(entry["stop"] is None for entry in decision["points"].values())
    print(f"containerbench: round {args.round}: {going} point(s) go on, {len(decision['next'])} more run(s), "
          f"{stopped} stopped")
    return 0


def cmd_report(args) -> int:
    from containerbench.report import render

    render(args.tables, args.records, args.out, skipped=json.loads(args.skipped), history=args.history)
    return 0


def system_of(record_paths, given: str | None) -> str:
    """The system named on the command line, else the one every record names."""
    from containerbench.records import load_records

    return given or system_named(load_records(record_paths)[0], None)


def system_named(records: list[dict], given: str | None) -> str:
    """system_of for records already read."""
    if given:
        return given
    systems = {r["spec"].get("system") for r in records} - {None}
    if len(systems) != 1:
        raise cb_config.ConfigError(f"--system is needed: the records name {sorted(systems) or 'no system'}")
    return systems.pop()


def cmd_validate(args) -> int:
    from containerbench.validate import ReferencesError, format_outcome, validate

    try:
        outcome = validate(args.records, args.references, system_of(args.records, args.system),
                           strict=args.strict, slow_fraction=args.slow_node_fraction)
    except ReferencesError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    text = format_outcome(outcome)
    print(text)
    if args.out:
        outputs.write_text(args.out, text + "\n")
    return 0 if outcome.passed else 1


def cmd_baseline(args) -> int:
    from containerbench.records import load_records
    from containerbench.validate import performance_variables, write_baseline

    records, _ = load_records(args.records)
    source = f"{len(records)} run records"
    if args.good_nodes:  # the nodes a site trusts: the reference for their node type
        from containerbench.fleetplan import in_order
        from containerbench.fleetstats import on_nodes
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
    write_baseline(measured, system_of(args.records, args.system), args.out, lower=args.lower, upper=args.upper,
                   source=source)
    print(f"containerbench: wrote {len(measured)} references to {args.out}")
    return 0


def cmd_export(args) -> int:
    from containerbench.export import export
    from containerbench.records import load_records
    from containerbench.validate import ReferencesError

    records, problems = load_records(args.records)
    for path, why in problems:
        print(f"containerbench: export: unreadable record {path}: {why}", file=sys.stderr)
    try:
        written = export(records, args.out_dir, system_named(records, args.system), args.references,
                         strict=args.strict, slow_fraction=args.slow_node_fraction)
    except ReferencesError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    print(f"containerbench: exported {len(records)} run records to {len(written)} files in {args.out_dir}: "
          "ReFrame perflogs, JUnit XML, OpenMetrics")
    return 0


def cmd_remeasure(args) -> int:
    from containerbench.attempts import RemeasureError, set_aside

    try:
        moved = set_aside(args.results, args.status, args.runs)
    except RemeasureError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    for run_id, status, attempt in moved:
        print(f"containerbench: {run_id} ({status}) set aside in {attempt}: the next snakemake measures it again "
              "(where its sweep still plans it)")
    if not moved:
        print(f"containerbench: no run in {args.results} is {' or '.join(args.status)}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("parse", help="turn a raw log into a run record")
    p.add_argument("log")
    p.add_argument("--out", required=True)
    p.add_argument("--telemetry", metavar="CSV",
                   help="the run's merged samples (default: the path its launch line names)")
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

    p = sub.add_parser("remeasure", help="set the runs of these statuses aside, so the next snakemake measures them "
                                         "again (nothing is deleted)")
    p.add_argument("--results", default="results", help="the workflow's results directory (default: results)")
    p.add_argument("--status", nargs="+", default=["disturbed"], metavar="STATUS",
                   help="the records' statuses to measure again (default: disturbed)")
    p.add_argument("--run", action="append", dest="runs", metavar="RUN_ID",
                   help="only this run (again for more); each must have a record of such a status")
    p.set_defaults(func=cmd_remeasure)

    p = sub.add_parser("validate", help="judge a run against reference values: exit 0 only if all pass")
    p.add_argument("records", nargs="+")
    p.add_argument("--references", required=True, help="YAML references file (containerbench baseline writes one)")
    p.add_argument("--system", help="which system's references (default: the system the records name)")
    p.add_argument("--strict", action="store_true", help="a measured figure with no reference fails")
    p.add_argument("--slow-node-fraction", type=float, default=0.10,
                   help="a node this fraction below the median of its peers is named slow (default 0.10)")
    p.add_argument("--out", help="also write the verdict to this file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("export", help="write the records as ReFrame perflogs, JUnit XML and OpenMetrics text, for the "
                                      "tools a site already runs")
    p.add_argument("records", nargs="+")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--references", help="judge the runs against this references file: reference and bounds in the "
                                        "perflogs, the verdict in the JUnit XML and the metrics")
    p.add_argument("--system", help="which system (default: the system the records name)")
    p.add_argument("--strict", action="store_true", help="a measured figure with no reference fails")
    p.add_argument("--slow-node-fraction", type=float, default=0.10,
                   help="a node this fraction below the median of its peers is named slow (default 0.10)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("baseline", help="write a references file from a good run")
    p.add_argument("records", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--system")
    p.add_argument("--lower", type=float, default=-0.10, help="tolerance below the reference (default -0.10)")
    p.add_argument("--upper", type=float, default=None, help="tolerance above the reference (default: none)")
    p.add_argument("--good-nodes", metavar="NODES",
                   help="only runs on these nodes (n1,n2 or a Slurm hostlist): the nodes of a type declared good")
    p.set_defaults(func=cmd_baseline)
