"""`containerbench store`, `history` and `compare`: run records kept in the results store as
sessions, the sessions listed, and two of them compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from containerbench import config as cb_config
from containerbench import outputs


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
        result = store(args.store, records, tag=args.tag, system=args.system, config_digest=config_digest,
                       kind=args.kind)
        sessions, changes = since_last(args.store, records) if args.since_last or args.summary else ({}, None)
    except HistoryError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    where = f"session {result.session_id}" if result.session_id else "no new session"
    print(f"containerbench: {where} in {args.store}: {result.stored} record(s) stored, "
          f"{result.skipped} already stored")
    if args.summary:
        outputs.write_text(args.summary, json.dumps({"store": str(args.store), "stored": result.stored,
                                                     "skipped": result.skipped, **sessions}, indent=1) + "\n")
    if args.since_last:
        with outputs.replacing(args.since_last) as partial:
            changes.to_csv(partial, index=False)
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
        sides = {name: resolve(args.store, selector, args.kind)
                 for name, selector in (("A", args.a), ("B", args.b))}
        frame = compare(args.store, args.a, args.b, args.kind)
    except HistoryError as error:
        print(f"containerbench: {error}", file=sys.stderr)
        return 2
    for (name, ids), selector in zip(sides.items(), (args.a, args.b)):
        print(f"{name} = {selector}: session(s) {', '.join(map(str, ids if isinstance(ids, list) else [ids]))}")
    print(format_comparison(frame))
    if args.csv:
        with outputs.replacing(args.csv) as partial:
            frame.to_csv(partial, index=False)
    return 0


# history.KINDS, spelled here so that building the parser imports no pandas (every job's command line
# builds it); tests/test_history.py holds the two equal.
KINDS = ("sweep", "fleet")


def add_commands(sub) -> None:
    p = sub.add_parser("store", help="add run records to the results store as one session")
    p.add_argument("records", nargs="+", metavar="RECORD.json", help="run records, or @FILE listing them")
    p.add_argument("--store", required=True, help="the SQLite results store (made when missing)")
    p.add_argument("--tag", help="a name to select this session by")
    p.add_argument("--kind", choices=KINDS, help="what the session holds: a sweep's runs, or a fleet batch's node "
                   "and link jobs (default: what the records are, a fleet's being pinned to their nodes)")
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
    p.add_argument("--kind", choices=KINDS, help="select A and B among the sessions of this kind only: "
                   "`--kind fleet previous latest` is this batch against the one before it")
    p.add_argument("--csv", metavar="FILE", help="also write the comparison as CSV")
    p.set_defaults(func=cmd_compare)
