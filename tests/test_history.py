"""The results store (containerbench.history): sessions of real recorded runs, compared with
Fieller's interval; selectors; idempotent re-storing; stores it must refuse and leave alone."""

from __future__ import annotations

import copy
import hashlib
import json
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from containerbench import history
from containerbench.history import HistoryError
from containerbench.intervals import ratio_interval, ratio_intervals
from containerbench.records import ADDED_KEYS
from containerbench.status import Status

TRAIN_ONE = "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x1/b2/images_per_sec"
TRAIN_TWO = "train/resnet50-32px-fp32/bare-metal/tcp-loopback/1x2/b2/images_per_sec"
LATENCY = "netbench/bare-metal/tcp-loopback/1x2/pingpong_latency_us@1"
# Four repetitions a side, within 1% of each other; "after" is 20% faster in training.
JITTER = [1.0, 1.01, 0.99, 1.005]


def repetitions(recorded_runs, label: str, speedup: float = 1.0, kinds=None) -> list[dict]:
    """Copies of the recorded runs as repetitions of another session: new run ids and log digests
    (a digest is a record's identity in the store), training rates scaled by speedup and jitter."""
    copies = []
    for index, jitter in enumerate(JITTER):
        for (kind, ranks), record in sorted(recorded_runs.items()):
            if kinds and (kind, ranks) not in kinds:
                continue
            copied = copy.deepcopy(record)
            copied["run_id"] = f"{record['run_id']}-{label}{index}"
            copied["log"]["sha256"] = hashlib.sha256(copied["run_id"].encode()).hexdigest()
            if kind == "train":
                copied["result"]["images_per_sec"] = record["result"]["images_per_sec"] * speedup * jitter
            copies.append(copied)
    return copies


@pytest.fixture
def two_sessions(recorded_runs, tmp_path):
    path = tmp_path / "deep" / "dir" / "history.sqlite"  # parents are made
    before = repetitions(recorded_runs, "before")
    after = repetitions(recorded_runs, "after", speedup=1.2)
    assert history.store(path, before, tag="before", config_digest="abc") == history.StoreResult(1, 12, 0)
    assert history.store(path, after, tag="after") == history.StoreResult(2, 12, 0)
    return path, before, after


def rates(records, ranks):
    return [r["result"]["images_per_sec"] for r in records if r["kind"] == "train" and r["spec"]["ranks"] == ranks]


def test_compare_finds_a_20_percent_speedup_with_fieller_interval(two_sessions, recorded_runs):
    path, before, after = two_sessions
    frame = history.compare(path, "before", "after").set_index("variable")
    assert list(frame.columns) == history.COMPARISON_COLUMNS[1:]
    for variable, ranks in ((TRAIN_ONE, 1), (TRAIN_TWO, 2)):
        row = frame.loc[variable]
        expected = ratio_interval(rates(after, ranks), rates(before, ranks))
        assert (row["n_a"], row["n_b"], row["unit"]) == (4, 4, "img/s")
        assert row["mean_a"] == pytest.approx(np.mean(rates(before, ranks)))
        assert row["change_percent"] == pytest.approx(20.0)  # the jitter is the same on both sides
        assert row["ci_low_percent"] == pytest.approx(100 * (expected.low - 1))
        assert row["ci_high_percent"] == pytest.approx(100 * (expected.high - 1))
        assert 15 < row["ci_low_percent"] < 20 < row["ci_high_percent"] < 25
        assert row["significant"] == "significant"
    # Netbench copies carry identical figures: no spread, so no interval and no verdict.
    latency = frame.loc[LATENCY]
    assert latency["change_percent"] == 0 and latency["unit"] == "us"
    assert latency["significant"] == "n/a: no spread in either side's repetitions"
    assert np.isnan(latency["ci_low_percent"])
    text = history.format_comparison(history.compare(path, 1, 2))
    assert text.splitlines()[0].split()[:4] == ["variable", "unit", "n_a", "n_b"]
    assert any(line.startswith(TRAIN_ONE) and "+20.00" in line and line.endswith("  significant")
               for line in text.splitlines())


def test_a_small_change_within_the_noise_is_not_significant(recorded_runs, tmp_path):
    path = tmp_path / "history.sqlite"
    history.store(path, repetitions(recorded_runs, "a"))
    history.store(path, repetitions(recorded_runs, "b", speedup=1.002))
    row = history.compare(path, "previous", "latest").set_index("variable").loc[TRAIN_ONE]
    assert row["change_percent"] == pytest.approx(0.2)
    assert row["ci_low_percent"] < 0 < row["ci_high_percent"] and row["significant"] == "not significant"


def test_a_variable_on_one_side_only_is_listed_with_why(recorded_runs, tmp_path):
    path = tmp_path / "history.sqlite"
    history.store(path, repetitions(recorded_runs, "a", kinds={("train", 1)}), tag="one-rank")
    history.store(path, repetitions(recorded_runs, "b", kinds={("train", 1), ("train", 2)}), tag="both")
    frame = history.compare(path, "one-rank", "both").set_index("variable")
    assert frame.loc[TRAIN_TWO, "significant"] == "n/a: not measured in A (one-rank)"
    assert (frame.loc[TRAIN_TWO, "n_a"], frame.loc[TRAIN_TWO, "n_b"]) == (0, 4)
    assert np.isnan(frame.loc[TRAIN_TWO, "change_percent"])
    assert frame.loc[TRAIN_ONE, "significant"] == "not significant"
    reverse = history.compare(path, "both", "one-rank").set_index("variable")
    assert reverse.loc[TRAIN_TWO, "significant"] == "n/a: not measured in B (one-rank)"


def test_sessions_record_what_ran_and_restoring_is_idempotent(two_sessions, recorded_runs):
    path, before, after = two_sessions
    table = history.sessions(path)
    assert list(table["id"]) == [1, 2] and list(table["tag"]) == ["before", "after"]
    first = table.iloc[0]
    assert (first["system"], first["nodes"], first["records"], first["config_digest"]) == ("ci", "vm", 12, "abc")
    assert first["provenance_hashes"] == recorded_runs[("train", 1)]["result"]["provenance"]["hash"]
    assert first["git_commit"] == history.clone_commit()
    assert datetime.fromisoformat(first["created"]).tzinfo == timezone.utc
    # The same records again: nothing stored, no new session; half new: only those.
    assert history.store(path, before, tag="again") == history.StoreResult(None, 0, 12)
    extra = repetitions(recorded_runs, "extra")[:3]
    assert history.store(path, before[:5] + extra, tag="third") == history.StoreResult(3, 3, 5)
    assert list(history.sessions(path)["records"]) == [12, 12, 3]
    # Kept whole, as JSON (a parsed record's tuples come back as lists, as from its .json file).
    assert history.stored_records(path, 3) == json.loads(json.dumps(extra))
    assert history.stored_records(path, [1]) == json.loads(json.dumps(before))


def test_stored_records_come_back_in_the_current_shape(recorded_runs, tmp_path):
    """A store kept from before a key was added holds records without it: they are migrated when read back."""
    older = repetitions(recorded_runs, "older")[:1]
    for key in ADDED_KEYS:
        del older[0][key]
    path = tmp_path / "history.sqlite"
    history.store(path, older)
    (back,) = history.stored_records(path, 1)
    assert type(back["status"]) is Status and all(back[key] is None for key in ADDED_KEYS)


def test_selectors_name_sessions_by_id_tag_date_latest_and_previous(two_sessions):
    path, _, _ = two_sessions
    today = history.sessions(path)["created"].iloc[0][:10]
    assert history.resolve(path, 1) == 1 and history.resolve(path, "2") == 2
    assert history.resolve(path, "before") == 1 and history.resolve(path, "after") == 2
    assert history.resolve(path, "latest") == 2 and history.resolve(path, "previous") == 1
    assert history.resolve(path, today) == [1, 2]  # a day's sessions, merged
    with pytest.raises(HistoryError) as refused:
        history.resolve(path, "nonesuch")
    message = str(refused.value)
    assert message == (f"{path}: no session matches 'nonesuch'; allowed: a session id 1..2, a tag (after, before), "
                       f"a date YYYY-MM-DD ({today}..{today}), latest, previous")
    for unknown in ("7", "1999-01-01"):
        with pytest.raises(HistoryError, match=f"no session matches '{unknown}'"):
            history.resolve(path, unknown)
    with pytest.raises(HistoryError, match="reads as another selector"):
        history.store(path, [], tag="latest")


def test_a_date_compares_all_of_its_sessions_merged(two_sessions):
    path, _, _ = two_sessions
    today = history.sessions(path)["created"].iloc[0][:10]
    row = history.compare(path, 1, today).set_index("variable").loc[TRAIN_ONE]
    assert (row["n_a"], row["n_b"]) == (4, 8)
    assert row["change_percent"] == pytest.approx(10.0)


def test_an_empty_or_missing_store_has_no_sessions(tmp_path):
    missing = tmp_path / "none.sqlite"
    assert history.sessions(missing).empty
    assert history.format_sessions(history.sessions(missing)) == "no sessions stored"
    with pytest.raises(HistoryError, match="allowed: nothing yet, the store holds no sessions"):
        history.resolve(missing, "latest")
    assert not missing.exists()  # reading never makes a store


@pytest.mark.parametrize("content, why", [
    (b"\x00\xffgarbage, not a database" * 40, "not an SQLite file"),
    (b"", "an empty file"),
    (b"SQLite format 3\x00" + b"\x13" * 2000, "SQLite: file is not a database"),
])
def test_a_corrupt_store_is_refused_in_one_line_and_left_as_it_is(tmp_path, recorded_runs, content, why):
    path = tmp_path / "results.sqlite"
    path.write_bytes(content)
    expected = f"{path}: not a containerbench results store ({why}); left as it is"
    for attempt in (lambda: history.store(path, list(recorded_runs.values())), lambda: history.sessions(path),
                    lambda: history.compare(path, 1, 2)):
        with pytest.raises(HistoryError) as refused:
            attempt()
        assert str(refused.value) == expected
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]  # no journal, no temporary left


def test_an_sqlite_file_of_someone_else_is_refused_and_untouched(tmp_path, recorded_runs):
    path = tmp_path / "theirs.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE meta (key TEXT, value TEXT)")  # even a table named meta
        connection.execute("INSERT INTO meta VALUES ('format', 'theirs')")
    connection.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError) as refused:
        history.store(path, list(recorded_runs.values()))
    assert str(refused.value) == (f"{path}: not a containerbench results store (its meta table names no "
                                  "containerbench format and version); left as it is")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE results (x)")
    connection.close()
    with pytest.raises(HistoryError, match=r"\(no meta table\); left as it is$"):
        history.sessions(other)
    assert path.read_bytes() == before


def test_a_failed_write_leaves_the_store_as_it_was(two_sessions):
    """One transaction per session: a failure after the session row and records went in (here a
    measurement without a value) takes all of it back, as a kill mid-write would."""
    path, _, _ = two_sessions
    bad = pd.DataFrame({"run_id": ["r1"], "variable": ["x"], "value": [None], "unit": ["s"]})
    with pytest.raises(sqlite3.IntegrityError):
        history.write_session(path, {"created": "2026-01-01T00:00:00+00:00"}, [("r1", "d1", "ok", b"{}")], bad)
    assert list(history.sessions(path)["id"]) == [1, 2]
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM records").fetchone() == (24,)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    connection.close()


def test_the_vectorised_interval_is_the_scalar_one_element_by_element():
    rng = np.random.default_rng(5)
    samples = [(rng.normal(95, 5, n), rng.normal(100, s, m)) for n, m, s in
               [(3, 3, 3), (2, 5, 1), (1, 3, 2), (4, 4, 0.0), (3, 3, 80)]]
    samples.append((np.array([5.0, 5.0]), np.array([5.0, 5.0])))  # no spread on either side
    vector = ratio_intervals([x.mean() for x, _ in samples], [y.mean() for _, y in samples],
                             [x.var(ddof=1) if len(x) > 1 else np.nan for x, _ in samples],
                             [y.var(ddof=1) for _, y in samples], [len(x) for x, _ in samples],
                             [len(y) for _, y in samples])
    for index, (x, y) in enumerate(samples):
        scalar = ratio_interval(x, y)
        assert vector.no_interval[index] == scalar.no_interval
        for field in ("ratio", "low", "high", "dof"):
            assert getattr(vector, field)[index] == pytest.approx(getattr(scalar, field), nan_ok=True)
    assert list(vector.no_interval[2:]) == ["n/a: needs 2+ repetitions each", None,
                                            "n/a: denominator mean not distinguishable from 0",
                                            "n/a: no spread in either side's repetitions"]


def containerbench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "containerbench", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_store_history_and_compare_from_the_command_line(recorded_runs, tmp_path):
    store = tmp_path / "history.sqlite"
    for label, speedup in (("before", 1.0), ("after", 1.2)):
        directory = tmp_path / label
        directory.mkdir()
        for record in repetitions(recorded_runs, label, speedup):
            (directory / f"{record['run_id']}.json").write_text(json.dumps(record))
    config = ROOT / "config" / "config.yaml"
    done = containerbench("store", "--store", store, "--tag", "before", "--config", config,
                          *sorted((tmp_path / "before").glob("*.json")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"containerbench: session 1 in {store}: 12 record(s) stored, 0 already stored"
    assert history.sessions(store)["config_digest"][0] == hashlib.sha256(config.read_bytes()).hexdigest()
    done = containerbench("store", "--store", store, "--tag", "after", *sorted((tmp_path / "after").glob("*.json")))
    assert done.returncode == 0 and "session 2" in done.stdout
    again = containerbench("store", "--store", store, *sorted((tmp_path / "after").glob("*.json")))
    assert again.stdout.strip() == f"containerbench: no new session in {store}: 0 record(s) stored, 12 already stored"

    listed = containerbench("history", "--store", store)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "kind", "created", "(UTC)"] and len(lines) == 3
    assert lines[1].split()[:2] == ["1", "sweep"] and " before " in lines[1] and " after " in lines[2]

    csv = tmp_path / "compare.csv"
    compared = containerbench("compare", "--store", store, "previous", "latest", "--csv", csv)
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.splitlines()[:2] == ["A = previous: session(s) 1", "B = latest: session(s) 2"]
    table = pd.read_csv(csv).set_index("variable")
    assert table.loc[TRAIN_TWO, "change_percent"] == pytest.approx(20.0)
    assert table.loc[TRAIN_TWO, "significant"] == "significant"

    unknown = containerbench("compare", "--store", store, "before", "nonesuch")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr.splitlines() == [f"containerbench: {store}: no session matches 'nonesuch'; allowed: a "
                                           "session id 1..2, a tag (after, before), a date YYYY-MM-DD "
                                           f"({lines[1].split()[2][:10]}..{lines[1].split()[2][:10]}), latest, "
                                           "previous"]

    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all\n" * 10)
    for argv in (("history", "--store", corrupt), ("compare", "--store", corrupt, "1", "2"),
                 ("store", "--store", corrupt, *sorted((tmp_path / "after").glob("*.json")))):
        refused = containerbench(*argv)
        assert refused.returncode == 2
        assert refused.stderr.splitlines() == [f"containerbench: {corrupt}: not a containerbench results store "
                                               "(not an SQLite file); left as it is"]
    assert corrupt.read_bytes() == b"not a database at all\n" * 10


def test_since_last_compares_this_runs_records_with_the_systems_session_before_them(two_sessions, recorded_runs):
    path, before, after = two_sessions
    summary, changes = history.since_last(path, after)
    assert (summary["session"]["id"], summary["previous"]["id"], summary["previous"]["tag"]) == (2, 1, "before")
    row = changes.set_index("variable").loc[TRAIN_ONE]
    assert row["change_percent"] == pytest.approx(20.0) and row["significant"] == "significant"
    # A run measured again in part: one new repetition beside three stored ones is still compared with
    # the session before this run's first, not with the part of itself stored earlier.
    again = repetitions(recorded_runs, "again", speedup=1.2, kinds={("train", 1)})[:1]
    assert history.store(path, again).session_id == 3
    summary, changes = history.since_last(path, after[3:] + again)
    assert (summary["session"]["id"], summary["previous"]["id"]) == (3, 1)
    assert changes.set_index("variable").loc[TRAIN_ONE, "n_b"] == 1 + sum(
        r["kind"] == "train" and r["spec"]["ranks"] == 1 for r in after[3:])
    # Another system's sessions are not its "last time"; records never stored have none.
    other = repetitions(recorded_runs, "other")
    for record in other:
        record["spec"]["system"] = "other-cluster"
    history.store(path, other)
    assert history.since_last(path, other)[0]["previous"] is None
    summary, changes = history.since_last(path, repetitions(recorded_runs, "never"))
    assert summary == {"session": None, "previous": None} and changes.empty


def test_store_writes_the_session_and_since_last_for_the_report(two_sessions, tmp_path):
    path, _, after = two_sessions
    records = []
    for record in after:
        records.append(tmp_path / f"{record['run_id']}.json")
        records[-1].write_text(json.dumps(record))
    done = containerbench("store", *records, "--store", path, "--config-digest", "d1", "--summary",
                          tmp_path / "session.json", "--since-last", tmp_path / "since.csv")
    assert done.returncode == 0 and "no new session" in done.stdout, done.stderr
    session = json.loads((tmp_path / "session.json").read_text())
    assert (session["stored"], session["skipped"], session["session"]["id"], session["previous"]["id"]) == (0, 12, 2, 1)
    since = pd.read_csv(tmp_path / "since.csv").set_index("variable")
    assert since.loc[TRAIN_ONE, "change_percent"] == pytest.approx(20.0)


CONCURRENT_STORE = """
import json, sys
from containerbench import history
records = json.load(open(sys.argv[2]))
print(history.store(sys.argv[1], records, tag=sys.argv[3]).session_id)
"""


def test_two_workflows_storing_the_same_records_at_once_make_one_session_and_no_error(recorded_runs, tmp_path):
    """The duplicate check is inside the write transaction (BEGIN IMMEDIATE): the second writer waits, then
    finds every record stored; without it both would find them new and the second fail on the digest."""
    path = tmp_path / "history.sqlite"
    history.store(path, repetitions(recorded_runs, "first"))  # the store exists: both writers open it
    records = tmp_path / "records.json"
    records.write_text(json.dumps(repetitions(recorded_runs, "same") * 20))  # a long write, the same records
    (tmp_path / "store.py").write_text(CONCURRENT_STORE)
    writers = [subprocess.Popen([sys.executable, str(tmp_path / "store.py"), str(path), str(records), tag],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    results = [writer.communicate(timeout=120) for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], [err[-2000:] for _, err in results]
    assert sorted(out.strip() for out, _ in results) == ["2", "None"]  # one session, the other had nothing new
    assert list(history.sessions(path)["id"]) == [1, 2]


def test_two_different_records_of_one_run_in_one_session_are_refused_in_one_line(recorded_runs, tmp_path):
    first = repetitions(recorded_runs, "x")[:1]
    second = copy.deepcopy(first[0])
    second["log"]["sha256"] = "0" * 64  # another log of the same run id (a second results directory)
    with pytest.raises(HistoryError) as caught:
        history.store(tmp_path / "history.sqlite", [first[0], second])
    assert str(caught.value) == (f"{tmp_path / 'history.sqlite'}: two different records of run {first[0]['run_id']!r} "
                                 "in one session; allowed: one record a run (store the results of two directories "
                                 "as two sessions)")
    assert history.sessions(tmp_path / "history.sqlite").empty


def fleet_batch(recorded_runs, label: str) -> list[dict]:
    """Copies of the recorded runs as a fleet batch's jobs: each pinned to its node (RunSpec.nodelist)."""
    batch = repetitions(recorded_runs, label)
    for record in batch:
        record["spec"]["nodelist"] = ["n1"] if record["spec"]["nodes"] == 1 else ["n1", "n2"]
    return batch


def test_a_fleet_batch_is_compared_with_fleet_batches_and_a_sweep_with_sweeps(recorded_runs, tmp_path):
    # Issue 36: sweeps and validate_nodes batches share one store and one tag, so "previous latest" could
    # set a sweep against a batch of new nodes.
    path = tmp_path / "history.sqlite"
    history.store(path, repetitions(recorded_runs, "sweep1"), tag="site")
    history.store(path, fleet_batch(recorded_runs, "batch1"), tag="site")  # a fleet's, by its pinned runs
    sweep2 = repetitions(recorded_runs, "sweep2", speedup=1.2)
    history.store(path, sweep2, tag="site", kind="sweep")
    history.store(path, fleet_batch(recorded_runs, "batch2"), tag="site", kind="fleet")
    assert list(history.sessions(path)["kind"]) == ["sweep", "fleet", "sweep", "fleet"]
    # The report's "since last time": the sweep before, not the batch stored between them.
    assert history.since_last(path, sweep2)[0]["previous"]["id"] == 1
    assert (history.resolve(path, "previous"), history.resolve(path, "latest")) == (3, 4)
    assert (history.resolve(path, "previous", "fleet"), history.resolve(path, "latest", "fleet")) == (2, 4)
    assert (history.resolve(path, "previous", "sweep"), history.resolve(path, "latest", "sweep")) == (1, 3)
    assert history.resolve(path, "site", "fleet") == [2, 4]
    # docs/history.md's command for this batch against the one before it.
    compared = containerbench("compare", "--store", path, "--kind", "fleet", "previous", "latest")
    assert compared.returncode == 0 and compared.stdout.splitlines()[:2] == [
        "A = previous: session(s) 2", "B = latest: session(s) 4"]
    with pytest.raises(HistoryError, match=r"no session matches '5' among the fleet sessions; allowed: a session "
                                           r"id 2, 4, a tag \(site\)"):
        history.resolve(path, "5", "fleet")
    with pytest.raises(HistoryError, match=r"^kind 'batch' is not a kind of session; allowed: sweep, fleet$"):
        history.store(path, repetitions(recorded_runs, "x"), kind="batch")


def test_the_command_line_offers_the_stores_kinds():
    from containerbench.cli import history as history_cli

    assert history_cli.KINDS == history.KINDS


def test_a_store_of_schema_1_gains_each_sessions_kind_once(recorded_runs, tmp_path):
    path = tmp_path / "history.sqlite"
    history.store(path, repetitions(recorded_runs, "sweep1"))
    history.store(path, fleet_batch(recorded_runs, "batch1"))
    with sqlite3.connect(path) as connection:  # the store as schema 1 left it: no kind column
        connection.execute("ALTER TABLE sessions DROP COLUMN kind")
        connection.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    assert list(history.sessions(path)["kind"]) == ["sweep", "fleet"]  # read from each session's records
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
    assert history.store(path, repetitions(recorded_runs, "sweep2")).session_id == 3
    assert list(history.sessions(path)["kind"]) == ["sweep", "fleet", "sweep"]
    empty = tmp_path / "sweeps-only.sqlite"
    history.store(empty, repetitions(recorded_runs, "only"))
    with pytest.raises(HistoryError, match=r"allowed: nothing yet, the store holds no fleet session \(1 of other "
                                           r"kinds\)$"):
        history.resolve(empty, "latest", "fleet")
