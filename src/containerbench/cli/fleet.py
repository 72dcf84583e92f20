"""`containerbench fleet plan|run|suspects|relinks|hwcheck|summary|judge`: a batch of nodes validated, from the plan of
its node and link jobs, through the suspects measured again, to the verdict on each node and link and its
drain list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import hardware, outputs
from containerbench.cli.results import system_named, system_of


def cmd_fleet_plan(args) -> int:
    from containerbench import fleetplan, slurm

    try:
        planned = fleetplan.plan_batch(fleetplan.select(args.nodes, args.partition))
    except slurm.QueryError as error:
        print(f"containerbench: fleet: {error}", file=sys.stderr)
        return 2
    if args.write:
        outputs.write_text(args.write, json.dumps(planned.as_dict(), indent=1) + "\n")
    print(fleetplan.format_plan(planned))
    return 0


def cmd_fleet_run(args) -> int:
    from containerbench import fleetjobs, fleetrounds

    if "jobs" in json.loads(Path(args.job).read_text()):  # a round's allocation (fleetrounds), its jobs at once
        return fleetrounds.run_allocation(args.job, args.in_allocation)
    return fleetjobs.run_job(args.job, args.in_allocation)


def cmd_fleet_hwcheck(args) -> int:
    expected = hardware.Expected(args.gpus, args.nvlink, args.ib_rate,
                                 args.ib_devices.split(",") if args.ib_devices else None)
    report, checks = hardware.run_checks(args.out, expected, args.timeout_s)
    for check in checks:
        found = "; ".join(map(str, check.findings))
        print(f"{check.status:7} {check.name}: {found or check.reason}".rstrip(": "))
    print(hardware.report_line(report))
    return 1 if any(check.status == "fail" for check in checks) else 0


def cmd_fleet_summary(args) -> int:
    from containerbench import fleetexport

    text, failed = fleetexport.format_summary(args.summary)
    print(text, end="")
    return 1 if failed else 0


def _system(records: list[dict], given: str | None) -> str:
    """The system for the exported files' labels: as the results commands name it, else "unknown"."""
    try:
        return system_named(records, given)
    except cb_config.ConfigError:
        return "unknown"


def _load_batch(args):
    """The plan, the records, the references, the hardware faults and the second measurements' records (those
    `--recheck` names, where the command takes it) `fleet judge`, `suspects` and `relinks` read; None: refused,
    in one line."""
    from containerbench import fleetplan
    from containerbench.records import load_records

    try:
        planned = fleetplan.FleetPlan.load(args.plan, "--plan")
    except fleetplan.FleetError as error:
        print(f"containerbench: fleet: {error}", file=sys.stderr)
        return None
    records, _ = load_records(args.records)
    references = {}
    if args.references:
        from containerbench.validate import ReferencesError, load_references

        try:
            references = load_references(args.references, args.system or system_of(args.records, None))
        except ReferencesError as error:
            print(f"containerbench: {error}", file=sys.stderr)
            return None
    from containerbench.records import record_paths

    reports = record_paths(args.hardware)  # @FILE too: a thousand nodes' reports overflow one argument
    hardware_faults, unknown = hardware.failures(reports, planned.nodes) if reports else ({}, [])
    for node in unknown:
        print(f"containerbench: note: a hardware report names {node!r}, not a node of the plan: not judged",
              file=sys.stderr)
    rechecked = load_records(args.recheck)[0] if getattr(args, "recheck", None) else []
    return planned, records, references, hardware_faults, rechecked


def cmd_fleet_suspects(args) -> int:
    from containerbench import fleet

    if (batch := _load_batch(args)) is None:
        return 2
    planned, records, references, hardware_faults, _ = batch
    # A node whose hardware failed fails whatever its figures: measuring it again would tell nothing more.
    named = fleet.suspects(records, planned, references, min_shortfall=args.min_shortfall, hardware=hardware_faults)
    outputs.write_text(args.out, json.dumps(named) + "\n")
    print(f"{len(named)} node(s) to measure again before they fail" + (f": {', '.join(named)}" if named else ""))
    return 0


def cmd_fleet_relinks(args) -> int:
    from containerbench import fleet

    if (batch := _load_batch(args)) is None:
        return 2
    planned, records, references, hardware_faults, rechecked = batch
    named = fleet.relinks(records, planned, references, min_shortfall=args.min_shortfall, rechecked=rechecked,
                          hardware=hardware_faults)
    outputs.write_text(args.out, json.dumps(named) + "\n")
    print(f"{len(named)} link job(s) to run again, each slow link no end explains and its ends re-paired"
          + (f": {', '.join(named)}" if named else ""))
    return 0


def cmd_fleet_judge(args) -> int:
    import subprocess

    from containerbench import fleet, fleetexport

    if (batch := _load_batch(args)) is None:
        return 2
    planned, records, references, hardware_faults, rechecked = batch
    verdict = fleet.judge(records, planned, references, min_shortfall=args.min_shortfall, rechecked=rechecked,
                          hardware=hardware_faults)
    paths = fleetexport.write_verdict(verdict, args.out_dir)
    from containerbench.fleetreport import render_fleet
    from containerbench.fleetstats import ROBUST_Z_LIMIT

    page = Path(args.out_dir) / "fleet.html"
    render_fleet(args.out_dir, page, args.min_shortfall, ROBUST_Z_LIMIT)
    print(fleetexport.format_verdict(verdict))
    print(f"tables and page: {page.parent}/fleet_*.csv, {page}")
    drain = paths["drain"].read_text()
    if drain:
        print(f"drain list ({paths['drain']}){'' if args.drain else ', not run: --drain runs it'}:\n{drain}", end="")
    exported = fleetexport.write(verdict, args.out_dir, _system(records, args.system))
    print(f"for CI and Prometheus: {exported[0]}, {exported[0].parent / fleetexport.FLEET_METRICS_DIR}/<node>.prom")
    for argv in fleetexport.drain_commands(verdict) if args.drain else []:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        node = argv[2].removeprefix("NodeName=")
        print(f"  {node}: {'drained' if done.returncode == 0 else 'NOT drained: ' + done.stderr.strip()}")
    return 1 if verdict.failed and not args.exit_zero else 0


def _batch_arguments(parser):
    """What `fleet judge` and `fleet suspects` both read: the records, the plan, the shortfall, references and
    the hardware reports."""
    parser.add_argument("records", nargs="*", help="the batch's run records, or @FILE listing them")
    parser.add_argument("--plan", required=True, help="the file `fleet plan --write` wrote")
    parser.add_argument("--min-shortfall", type=float, default=0.10,
                        help="a figure fails only this far (a fraction) worse than the fleet median")
    parser.add_argument("--references", help="a references file: its system's figures bound every node and link too")
    parser.add_argument("--system", help="the node type's system in the references file (default: the records' system)")
    parser.add_argument("--hardware", nargs="*", default=[],
                        help="the nodes' hardware reports (`fleet hwcheck`), or @FILE listing them: a failed check "
                             "fails its node, with its line, and it is not measured again")
    return parser


def add_commands(sub) -> None:
    p = sub.add_parser("fleet", help="validate a batch of nodes: plan its node and link jobs, or judge its records")
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("plan", help="the batch's nodes from Slurm with their states, its links and job rounds")
    a.add_argument("--nodes", help="a Slurm hostlist, e.g. n[001-064]")
    a.add_argument("--partition", help="every node of this partition")
    a.add_argument("--write", metavar="PLAN_JSON", help="also write the plan, for `fleet judge`")
    a.set_defaults(func=cmd_fleet_plan)
    a = actions.add_parser("run", help="a node's or link's runs one after another, in the allocation salloc made; "
                                       "or a round's allocation, each of its jobs at once on its own nodes")
    a.add_argument("job", help="the job's file (its allocation, its runs' plans and logs), or an allocation's (its "
                               "salloc and its jobs' files), as validate_nodes writes them")
    a.add_argument("--in-allocation", action="store_true", help="run the plans in the allocation salloc made")
    a.set_defaults(func=cmd_fleet_run)
    a = actions.add_parser("hwcheck", help="this node's hardware tier: GPUs, NVLink, Xid, InfiniBand ports and "
                                           "counters, DCGM; raw outputs and a report for `fleet judge --hardware`")
    a.add_argument("--out", required=True, help="the directory for NODE.json and the raw outputs in NODE/")
    a.add_argument("--gpus", type=int, help="the GPUs this node must list (its GRES)")
    a.add_argument("--ib-rate", type=float, help="each InfiniBand port's rate in Gb/s (default: the node's fastest)")
    a.add_argument("--ib-devices", help="the node's rails, comma-separated, each HCA (every port of it) or HCA:PORT "
                                        "(default: every InfiniBand port ibstat lists)")
    a.add_argument("--nvlink", action="store_true", help="the GPUs have NVLink: none active is a fault")
    a.add_argument("--timeout-s", type=float, default=hardware.TOOL_TIMEOUT_S,
                   help="each tool's; its whole session killed past it")
    a.set_defaults(func=cmd_fleet_hwcheck)
    a = actions.add_parser("summary", help="print a verdict's summary and drain list; exit 1 if a node, a link or "
                                           "a container path failed")
    a.add_argument("summary", help="fleet_summary.csv")
    a.set_defaults(func=cmd_fleet_summary)
    a = _batch_arguments(actions.add_parser("suspects", help="the nodes whose figures fail, to measure again "
                                                             "before the verdict"))
    a.add_argument("--out", required=True, help="the JSON list of suspect nodes written")
    a.set_defaults(func=cmd_fleet_suspects)
    a = _batch_arguments(actions.add_parser("relinks", help="after the suspects' second measurements: the slow "
                                                            "links no end explains, each with its ends re-paired "
                                                            "with nodes that passed, to measure before the verdict"))
    a.add_argument("--recheck", nargs="*", default=[], help="the records of the suspects' second measurements")
    a.add_argument("--out", required=True, help="the JSON list of the links (NODE+NODE) written")
    a.set_defaults(func=cmd_fleet_relinks)
    a = _batch_arguments(actions.add_parser("judge", help="the verdict on every node and link; exit 1 if any "
                                                          "failed, a container path too"))
    a.add_argument("--recheck", nargs="*", default=[],
                   help="the records of the suspects' second measurements: a figure fails only if it fails there too")
    a.add_argument("--out-dir", default="results/fleet", help="where the tables and the drain list go")
    a.add_argument("--drain", action="store_true", help="run the drain list's scontrol lines")
    a.add_argument("--exit-zero", action="store_true",
                   help="exit 0 when the batch failed too (the workflow's judge; else 1, and 2 on bad input)")
    a.set_defaults(func=cmd_fleet_judge)
