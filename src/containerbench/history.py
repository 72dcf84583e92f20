"""The results store: every run record, from every workflow run, kept in one SQLite file, and
what changed between two stored sessions, with a 95% interval.

A session is the records one `store` call added: its kind (a sweep, or a fleet batch of
`validate_nodes`), tag, system, UTC date, the git commit of
this clone, the provenance hashes and nodes the records name, and the digest of the config.
Each record is kept whole (zlib-compressed JSON) beside its performance variables
(validate.record_variables: one row per run and variable, not aggregated), which `compare`
reads. A record is identified by the digest of its raw log: storing it again is skipped.

Durability: WAL mode, and each `store` is one transaction, so a kill mid-write leaves the
store as it was before that call. A file that is not a store of ours is refused in one line
and never written to. docs/history.md says more.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import tempfile
import zlib
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from containerbench.records import migrate

STORE_FORMAT = "containerbench-results"
SCHEMA_VERSION = 2  # 2: sessions.kind
# What a session holds: a sweep's runs, or a fleet batch's node and link jobs (validate_nodes). Compared
# only with their own kind: a batch of new nodes is not the sweep before it.
KINDS = ("sweep", "fleet")
SQLITE_HEADER = b"SQLite format 3\x00"
# Where the workflow keeps the store when history.store is null: the working directory, beside results_dir
# rather than in it, so a fresh results_dir or `make clean-results` keeps it.
DEFAULT_STORE = "history.sqlite"
# Seconds a writer waits for another writer's transaction (two workflows storing at once).
BUSY_TIMEOUT_S = 30

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY, tag TEXT, system TEXT, created TEXT NOT NULL, git_commit TEXT,
    config_digest TEXT, provenance_hashes TEXT, nodes TEXT, records INTEGER NOT NULL, kind TEXT);
CREATE TABLE records (
    session INTEGER NOT NULL REFERENCES sessions(id), run_id TEXT NOT NULL,
    log_sha256 TEXT NOT NULL UNIQUE, status TEXT, body BLOB NOT NULL);
CREATE TABLE measurements (
    session INTEGER NOT NULL REFERENCES sessions(id), run_id TEXT NOT NULL, variable TEXT NOT NULL,
    value REAL NOT NULL, unit TEXT);
CREATE INDEX measurements_by_variable ON measurements (session, variable);
"""

SESSION_COLUMNS = ["id", "kind", "tag", "system", "created", "git_commit", "config_digest", "provenance_hashes",
                   "nodes", "records"]
COMPARISON_COLUMNS = ["variable", "unit", "n_a", "n_b", "mean_a", "mean_b", "change_percent", "ci_low_percent",
                      "ci_high_percent", "significant"]
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
NAMED_SELECTORS = ("latest", "previous")
# SQLite's limit on bound parameters is 32766 in recent builds, 999 in old ones.
PARAMETER_CHUNK = 900


class HistoryError(ValueError):
    """A store that cannot be used, or a selector that names no session; the message is one line."""


@dataclass(frozen=True)
class StoreResult:
    session_id: int | None  # None when every record was stored already (no session is made)
    stored: int
    skipped: int  # already in the store


def store_path(config: dict) -> str:
    """The results store a config names (history.store), or DEFAULT_STORE."""
    return config["history"]["store"] or DEFAULT_STORE


def _refuse(path: Path, why: str) -> HistoryError:
    return HistoryError(f"{path}: not a containerbench results store ({why}); left as it is")


def _create(path: Path) -> None:
    """A new empty store, built beside `path` and linked into place when complete: a kill while
    creating leaves no half-made file that a later open would have to refuse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, building = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".creating", dir=path.parent)
    os.close(descriptor)
    try:
        with closing(sqlite3.connect(building)) as connection:
            connection.execute("PRAGMA journal_mode=WAL")  # kept in the file: every later open is WAL
            with connection:
                connection.executescript(SCHEMA)
                connection.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                       [("format", STORE_FORMAT), ("schema_version", str(SCHEMA_VERSION))])
        try:
            os.link(building, path)  # unlike a rename, never replaces a store another process just made
        except FileExistsError:
            pass
    finally:
        Path(building).unlink(missing_ok=True)


def _open(path: str | Path, create: bool) -> sqlite3.Connection | None:
    """A connection to the store at `path`, checked before anything is written; None when there is
    no store and `create` is false (nothing stored yet)."""
    path = Path(path)
    if not path.exists():
        if not create:
            return None
        _create(path)
    if not path.is_file():
        raise _refuse(path, "not a regular file")
    # SQLite itself would take an empty file for an empty database and write to it.
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise _refuse(path, "an empty file" if not header else "not an SQLite file")
    connection = sqlite3.connect(path.resolve().as_uri() + "?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        meta = dict(connection.execute("SELECT key, value FROM meta"))
    except sqlite3.DatabaseError as error:
        connection.close()
        why = "no meta table" if "no such table" in str(error) else f"SQLite: {error}"
        raise _refuse(path, why) from None
    if meta.get("format") != STORE_FORMAT or "schema_version" not in meta:
        connection.close()
        raise _refuse(path, "its meta table names no containerbench format and version")
    if not meta["schema_version"].isdigit() or int(meta["schema_version"]) > SCHEMA_VERSION:
        connection.close()
        raise _refuse(path, f"schema version {meta['schema_version']}, this containerbench reads up to "
                            f"{SCHEMA_VERSION}")
    if int(meta["schema_version"]) < 2:
        try:
            _add_kinds(connection)
        except sqlite3.DatabaseError as error:  # a read-only file, a lock held past the busy timeout
            connection.close()
            raise HistoryError(f"{path}: schema 1, and its sessions' kinds could not be added (SQLite: {error}); "
                               "allowed: a store this user may write, not in use") from None
    return connection


def kind_of(records: list[dict]) -> str:
    """A fleet batch's runs are pinned to their nodes (RunSpec.nodelist); a sweep's are not."""
    return "fleet" if any((record.get("spec") or {}).get("nodelist") for record in records) else "sweep"


def _add_kinds(connection: sqlite3.Connection) -> None:
    """Schema 1 to 2, once, in one transaction: each session's kind, from its first record."""
    with connection:
        connection.execute("BEGIN IMMEDIATE")
        if connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] != "1":
            return  # another process did it while this one waited for the lock
        connection.execute("ALTER TABLE sessions ADD COLUMN kind TEXT")
        firsts = connection.execute("SELECT session, body FROM records WHERE rowid IN "
                                    "(SELECT MIN(rowid) FROM records GROUP BY session)").fetchall()
        connection.executemany("UPDATE sessions SET kind = ? WHERE id = ?",
                               [(kind_of([json.loads(zlib.decompress(body))]), session) for session, body in firsts])
        connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def check_store(path: str | Path) -> None:
    """Refuse, before anything runs, a file at `path` that is not a store of ours (none there is fine)."""
    connection = _open(path, create=False)
    if connection is not None:
        connection.close()


def record_digest(record: dict) -> str:
    """The sha256 of the record's raw log: its identity."""
    return record["log"]["sha256"]


def clone_commit() -> str | None:
    """The git commit of the containerbench clone this code runs from (-dirty with local changes);
    None outside a git clone. Records do not carry it, so the session takes it from here."""
    try:
        described = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always",
                                    "--dirty", "--abbrev=40"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if described.returncode != 0:
        return None
    return described.stdout.strip() or None


def _joined(values) -> str | None:
    unique = sorted({str(value) for value in values if value})
    return ",".join(unique) or None


def check_tag(tag: str | None) -> None:
    """A tag must not read as another kind of selector, or it could never be selected."""
    if tag is None:
        return
    if not tag.strip() or tag.isdigit() or tag in NAMED_SELECTORS or DATE.fullmatch(tag):
        raise HistoryError(f"tag {tag!r} reads as another selector; allowed: a name that is not a number, "
                           f"a date YYYY-MM-DD, {' or '.join(NAMED_SELECTORS)}")


def check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise HistoryError(f"kind {kind!r} is not a kind of session; allowed: {', '.join(KINDS)}")


def write_session(path: str | Path, session: dict, records: list[tuple[str, str, str, bytes]],
                  measurements: pd.DataFrame) -> StoreResult:
    """Add one session in one transaction: `records` are (run_id, log_sha256, status, body) rows,
    `measurements` has run_id, variable, value, unit. Records whose digest is stored already are
    skipped with their measurements; with none new, no session is made. store() comes here, and
    benchmarks/history_speed.py does too, with synthetic rows."""
    with closing(_open(path, create=True)) as connection, connection:
        # The write lock first: two workflows storing at once would otherwise both find a record new and
        # the second would fail on the unique digest, its whole session lost.
        connection.execute("BEGIN IMMEDIATE")
        stored_digests = set()
        digests = [row[1] for row in records]
        for start in range(0, len(digests), PARAMETER_CHUNK):
            chunk = digests[start:start + PARAMETER_CHUNK]
            stored_digests.update(digest for (digest,) in connection.execute(
                f"SELECT log_sha256 FROM records WHERE log_sha256 IN ({','.join('?' * len(chunk))})", chunk))
        new, seen = [], set(stored_digests)
        for row in records:
            if row[1] not in seen:  # a digest twice in one call is one record
                seen.add(row[1])
                new.append(row)
        if not new:
            return StoreResult(None, 0, len(records))
        # A session's measurements belong to its records by run id (records and measurements tables).
        runs = [row[0] for row in new]
        if len(set(runs)) != len(runs):
            twice = next(run for run in runs if runs.count(run) > 1)
            raise HistoryError(f"{path}: two different records of run {twice!r} in one session; allowed: one "
                               "record a run (store the results of two directories as two sessions)")
        cursor = connection.execute(
            "INSERT INTO sessions (kind, tag, system, created, git_commit, config_digest, provenance_hashes, nodes, "
            "records) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [session.get(key) for key in ("kind", "tag", "system", "created", "git_commit", "config_digest",
                                          "provenance_hashes", "nodes")] + [len(new)])
        session_id = cursor.lastrowid
        connection.executemany("INSERT INTO records (session, run_id, log_sha256, status, body) VALUES (?, ?, ?, ?, ?)",
                               [(session_id, *row) for row in new])
        new_runs = {row[0] for row in new}
        kept = measurements[measurements["run_id"].isin(new_runs)]
        connection.executemany(
            "INSERT INTO measurements (session, run_id, variable, value, unit) VALUES (?, ?, ?, ?, ?)",
            zip([session_id] * len(kept), kept["run_id"], kept["variable"], kept["value"].astype(float),
                kept["unit"]))
    return StoreResult(session_id, len(new), len(records) - len(new))


def store(path: str | Path, records: list[dict], tag: str | None = None, system: str | None = None,
          config_digest: str | None = None, git_commit: str | None = None, kind: str | None = None) -> StoreResult:
    """Store run records as one new session (records already stored are skipped, and counted); its
    kind, unless given, is what the records are (kind_of)."""
    from containerbench.validate import record_variables

    check_tag(tag)
    check_kind(kind)
    results = [record["result"] or {} for record in records]  # null: the run left no result line
    session = {
        "kind": kind or kind_of(records),
        "tag": tag,
        "system": system or _joined(record["spec"].get("system") for record in records),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit or clone_commit(),
        "config_digest": config_digest,
        "provenance_hashes": _joined((result.get("provenance") or {}).get("hash") for result in results),
        "nodes": _joined(host for result in results for host in result.get("hostnames") or []),
    }
    rows = [(record["run_id"], record_digest(record), record["status"],
             zlib.compress(json.dumps(record, sort_keys=True).encode())) for record in records]
    return write_session(path, session, rows, record_variables(records))


def sessions(path: str | Path) -> pd.DataFrame:
    """Every stored session, oldest first (empty when there is no store yet)."""
    connection = _open(path, create=False)
    if connection is None:
        return pd.DataFrame(columns=SESSION_COLUMNS)
    with closing(connection):
        return pd.read_sql_query(f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions ORDER BY id", connection)


def newest_sweep_records(path: str | Path, system: str, sessions_read: int = 5) -> tuple[list[dict], str]:
    """The records of `system`'s newest sweep sessions (not fleet batches), for an estimate's expected
    cost (cost.sweep_records), and what they are; none where there is no store yet. A store may hold
    years of sessions: the freshest measurement of each point is what an estimate wants."""
    return newest_records(path, system, {"sweep": sessions_read})


def newest_records(path: str | Path, system: str, kinds: dict[str, int]) -> tuple[list[dict], str]:
    """The records of `system`'s newest sessions of each kind, as many as `kinds` says ({"sweep": 5,
    "fleet": 1}), and what they are; none where there is no store yet."""
    table = sessions(path)
    mine = table[table["system"] == system]
    chosen = pd.concat([mine[mine["kind"] == kind].tail(count) for kind, count in kinds.items()]).sort_values("id")
    if chosen.empty:
        return [], ""
    what = f"{path} ({len(chosen)} session{'' if len(chosen) == 1 else 's'} of system {system})"
    return stored_records(path, [int(i) for i in chosen["id"]]), what


def stored_records(path: str | Path, session_ids) -> list[dict]:
    """The records of the given sessions, as they were stored, migrated to the current shape (records.migrate)."""
    ids = _as_list(session_ids)
    connection = _open(path, create=False)
    if connection is None:
        return []
    with closing(connection):
        rows = connection.execute(f"SELECT body FROM records WHERE session IN ({','.join('?' * len(ids))}) "
                                  "ORDER BY rowid", ids)
        return [migrate(json.loads(zlib.decompress(body))) for (body,) in rows]


def _as_list(ids) -> list[int]:
    return [ids] if isinstance(ids, (int, np.integer)) else list(ids)


def resolve(path: str | Path, selector: str | int, kind: str | None = None) -> int | list[int]:
    """The session(s) a selector names: an id, a tag (several sessions with one tag: all of them),
    a UTC date YYYY-MM-DD (every session of that day, as a list), `latest`, or `previous`
    (the one before the latest); among the sessions of `kind` only, when given."""
    check_kind(kind)
    every = sessions(path)
    table = every[every["kind"] == kind] if kind is not None else every
    text = str(selector).strip()
    ids = list(table["id"].astype(int))
    found: int | list[int] | None = None
    if text.isdigit():
        found = int(text) if int(text) in ids else None
    elif text == "latest":
        found = ids[-1] if ids else None
    elif text == "previous":
        found = ids[-2] if len(ids) >= 2 else None
    elif DATE.fullmatch(text):
        found = [int(i) for i in table.loc[table["created"].str.startswith(text), "id"]] or None
    else:
        tagged = [int(i) for i in table.loc[table["tag"] == text, "id"]]
        found = (tagged[0] if len(tagged) == 1 else tagged) or None
    if found is None:
        among = f" among the {kind} sessions" if kind else ""
        raise HistoryError(f"{path}: no session matches {text!r}{among}; allowed: "
                           f"{_allowed(table, kind, len(every) - len(table))}")
    return found


def _allowed(table: pd.DataFrame, kind: str | None = None, others: int = 0) -> str:
    if table.empty:
        return (f"nothing yet, the store holds no {kind} session ({others} of other kinds)" if kind else
                "nothing yet, the store holds no sessions (containerbench store adds one)")
    tags = sorted(set(table["tag"].dropna()))
    dates = sorted(set(table["created"].str[:10]))
    shown_tags = ", ".join(tags[:5]) + (", ..." if len(tags) > 5 else "")
    ids = [int(i) for i in table["id"]]
    shown_ids = (", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "") if kind
                 else f"{ids[0]}..{ids[-1]}")  # a kind's ids need not run on
    return (f"a session id {shown_ids}, "
            + (f"a tag ({shown_tags}), " if tags else "")
            + f"a date YYYY-MM-DD ({dates[0]}..{dates[-1]}), latest, previous")


def _session_values(connection: sqlite3.Connection, ids: list[int]) -> pd.DataFrame:
    return pd.read_sql_query(
        f"SELECT variable, unit, value FROM measurements WHERE session IN ({','.join('?' * len(ids))})",
        connection, params=ids)


def _record_values(connection: sqlite3.Connection, digests: list[str]) -> pd.DataFrame:
    """The measurements of the records with these raw-log digests, whichever sessions hold them."""
    frames = [pd.read_sql_query(
        "SELECT m.variable, m.unit, m.value FROM measurements m JOIN records r "
        f"ON m.session = r.session AND m.run_id = r.run_id WHERE r.log_sha256 IN ({','.join('?' * len(chunk))})",
        connection, params=chunk) for chunk in (digests[i:i + PARAMETER_CHUNK]
                                                for i in range(0, len(digests), PARAMETER_CHUNK))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["variable", "unit", "value"])


def _variable_summary(values: pd.DataFrame) -> pd.DataFrame:
    """Count, mean and sample variance of each variable: grouped in pandas, read with one query a
    side (what keeps compare fast over 100,000 stored rows)."""
    values = values.assign(unit=values["unit"].fillna(""))
    return values.groupby(["variable", "unit"], sort=False)["value"].agg(["count", "mean", "var"])


def compare(path: str | Path, a: str | int, b: str | int, kind: str | None = None) -> pd.DataFrame:
    """Each performance variable of sessions A and B (selected among `kind`'s, when given): the runs
    and mean on each side, the change of B's mean from A's in percent, Fieller's 95% interval for it,
    and whether it is significant. A variable measured on one side only is listed with the reason
    there is no change."""
    ids_a, ids_b = _as_list(resolve(path, a, kind)), _as_list(resolve(path, b, kind))
    with closing(_open(path, create=False)) as connection:
        return _compared(_session_values(connection, ids_a), _session_values(connection, ids_b), a, b)


def _compared(values_a: pd.DataFrame, values_b: pd.DataFrame, a, b) -> pd.DataFrame:
    from containerbench.intervals import ratio_intervals

    both = (_variable_summary(values_a).join(_variable_summary(values_b), how="outer", lsuffix="_a", rsuffix="_b")
            .sort_index().reset_index())
    n_a, n_b = both["count_a"].fillna(0).astype(int), both["count_b"].fillna(0).astype(int)
    # B's mean over A's: the change relative to A, A's own uncertainty counted.
    intervals = ratio_intervals(both["mean_b"], both["mean_a"], both["var_b"], both["var_a"], n_b, n_a, f"A ({a})")
    significance = intervals.significance()
    significance = np.where(n_a == 0, f"n/a: not measured in A ({a})", significance)
    significance = np.where(n_b == 0, f"n/a: not measured in B ({b})", significance)
    return pd.DataFrame({
        "variable": both["variable"], "unit": both["unit"].where(both["unit"] != "", None), "n_a": n_a, "n_b": n_b,
        "mean_a": both["mean_a"], "mean_b": both["mean_b"], "change_percent": 100 * (intervals.ratio - 1),
        "ci_low_percent": 100 * (intervals.low - 1), "ci_high_percent": 100 * (intervals.high - 1),
        "significant": significance,
    })[COMPARISON_COLUMNS]


def _number(value, signed: bool = False) -> str:
    if pd.isna(value):
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.4g}"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) if i in right else cell.ljust(width)
                       for i, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def format_comparison(frame: pd.DataFrame) -> str:
    """The comparison as an aligned text table, one variable a line."""
    if frame.empty:
        return "no performance variables in either side"
    header = ["variable", "unit", "n_a", "n_b", "mean_a", "mean_b", "change %", "95% CI %", "significance"]
    rows = [[row.variable, row.unit or "", str(row.n_a), str(row.n_b), _number(row.mean_a), _number(row.mean_b),
             _number(row.change_percent, signed=True),
             "-" if pd.isna(row.ci_low_percent) else
             f"{_number(row.ci_low_percent, True)}..{_number(row.ci_high_percent, True)}",
             row.significant] for row in frame.itertuples()]
    return _table(header, rows, right={2, 3, 4, 5, 6, 7})


def format_sessions(frame: pd.DataFrame) -> str:
    """The stored sessions as an aligned text table (commits and digests shortened)."""
    if frame.empty:
        return "no sessions stored"
    header = ["id", "kind", "created (UTC)", "tag", "system", "records", "nodes", "git commit", "config", "provenance"]

    def short(value, width=12):
        return "-" if value is None or pd.isna(value) else str(value)[:width]

    def commit(value):
        return short(value) + ("-dirty" if str(value).endswith("-dirty") else "")

    rows = [[str(row.id), short(row.kind), row.created, short(row.tag, 40), short(row.system, 40), str(row.records),
             short(row.nodes, 40), commit(row.git_commit), short(row.config_digest), short(row.provenance_hashes, 40)]
            for row in frame.itertuples()]
    return _table(header, rows, right={0, 5})


def since_last(path: str | Path, records: list[dict]) -> tuple[dict, pd.DataFrame]:
    """This run's records against last time: the system's newest session of the same kind from before
    any of them was stored (a run measured again in part is still compared with the run before it, not with
    itself). Returns both sessions' descriptions (`session`: the newest holding these records) and
    compare()'s table for the variables these records measured, empty with nothing before."""
    digests = list(dict.fromkeys(record_digest(record) for record in records))
    table = sessions(path)
    connection = _open(path, create=False)
    if connection is None or not digests:
        return {"session": None, "previous": None}, pd.DataFrame(columns=COMPARISON_COLUMNS)
    with closing(connection):
        holding = sorted({session for chunk in (digests[i:i + PARAMETER_CHUNK]
                                                for i in range(0, len(digests), PARAMETER_CHUNK))
                          for (session,) in connection.execute(
                              f"SELECT DISTINCT session FROM records WHERE log_sha256 IN "
                              f"({','.join('?' * len(chunk))})", chunk)})
        if not holding:
            return {"session": None, "previous": None}, pd.DataFrame(columns=COMPARISON_COLUMNS)
        newest = table.loc[table["id"] == holding[-1]].iloc[0]
        earlier = table.loc[(table["id"] < holding[0]) & (table["system"] == newest["system"])
                            & (table["kind"] == newest["kind"]), "id"]
        previous = int(earlier.max()) if not earlier.empty else None

        def described(session_id):  # plain JSON types, NaN as None
            rows = table[table["id"] == session_id]
            return json.loads(rows.to_json(orient="records"))[0] if session_id is not None else None

        summary = {"session": described(holding[-1]), "previous": described(previous)}
        if previous is None:
            return summary, pd.DataFrame(columns=COMPARISON_COLUMNS)
        changes = _compared(_session_values(connection, [previous]), _record_values(connection, digests),
                            previous, "this run")
    return summary, changes[changes["n_b"] > 0].reset_index(drop=True)
