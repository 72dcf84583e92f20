"""How fast records become tables: N run records (copies of a real one, with
varied points and rates) through runs_table + summary_table, timed.

    .venv/bin/python benchmarks/aggregate.py [--records 100000] [--from results/runs/X.json]

Prints the time and rows/s; asserts nothing (speed targets are read, not tested).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import random
import time

from containerbench.records import migrate
from containerbench.results import runs_table, summary_table


def synthetic_records(template: dict, count: int) -> list[dict]:
    rng = random.Random(42)
    records = []
    for i in range(count):
        record = copy.copy(template)
        record["run_id"] = f"synthetic-{i}"
        record["spec"] = dict(template["spec"], ranks=2 ** (i % 6), nodes=max(1, 2 ** (i % 6) // 4),
                              batch_size=(32, 64)[i % 2], fabric=("infiniband", "ethernet")[(i // 2) % 2],
                              repetition=i // 24)
        record["result"] = dict(template["result"], images_per_sec=rng.uniform(100, 200) * record["spec"]["ranks"])
        records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--from", dest="template", help="a real train record (default: the first in results/runs)")
    args = parser.parse_args()
    path = args.template or next(p for p in sorted(glob.glob("results/runs/train_*.json")))
    template = migrate(json.load(open(path)))  # in the current shape, as every reader gets a record
    records = synthetic_records(template, args.records)

    started = time.perf_counter()
    runs = runs_table(records)
    tabled = time.perf_counter()
    summary = summary_table(runs)
    done = time.perf_counter()
    print(f"records: {len(records)}  summary rows: {len(summary)}  (template {path})")
    print(f"runs_table:    {tabled - started:7.3f} s  {len(records) / (tabled - started):12,.0f} records/s")
    print(f"summary_table: {done - tabled:7.3f} s  {len(records) / (done - tabled):12,.0f} records/s")
    print(f"total:         {done - started:7.3f} s  {len(records) / (done - started):12,.0f} records/s")


if __name__ == "__main__":
    main()
