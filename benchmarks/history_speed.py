"""How fast the results store compares two sessions: N synthetic run records (one performance
variable each, over a few hundred variables) stored in two sessions, then `compare`, timed.

    .venv/bin/python benchmarks/history_speed.py [--records 100000] [--tries 3]

The records go in through history.write_session, the insert path store() itself takes; only
the record bodies are small synthetic JSON instead of real records, whose parsing
(validate.record_variables) is not what is timed here. Prints the time of the best try;
asserts nothing (speed targets are read, not tested).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from containerbench import history

TARGET_S = 2.0
RUNTIMES = ("bare-metal", "podman", "apptainer", "charliecloud", "enroot")
NODES = (1, 2, 4, 8, 16, 32, 64, 128)
BATCHES = (32, 64, 128, 256, 512)


def variables() -> list[str]:
    """200 training points, named as validate.record_variables names them."""
    return [f"train/resnet50-224px-mixed_float16/{runtime}/infiniband/{nodes}x{4 * nodes}/b{batch}/images_per_sec"
            for runtime in RUNTIMES for nodes in NODES for batch in BATCHES]


def synthetic_session(label: str, count: int, speedup: np.ndarray, rng: np.random.Generator):
    """`count` records spread over the variables, 2% noise, each variable's mean scaled by `speedup`."""
    names = variables()
    which = np.arange(count) % len(names)
    values = 1000.0 * (1 + which / len(names)) * speedup[which] * rng.normal(1, 0.02, count)
    run_ids = [f"{label}-{index}" for index in range(count)]
    rows = [(run_id, f"{label}-digest-{index}", "ok", zlib.compress(json.dumps({"run_id": run_id}).encode()))
            for index, run_id in enumerate(run_ids)]
    measurements = pd.DataFrame({"run_id": run_ids, "variable": np.array(names)[which], "value": values,
                                 "unit": "img/s"})
    return rows, measurements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="stored records in all, half in each session")
    parser.add_argument("--tries", type=int, default=3, help="compare is timed this many times; the best counts")
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    # Every fourth variable 5% faster in the second session: compare should find those.
    speedup = np.where(np.arange(len(variables())) % 4 == 0, 1.05, 1.0)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "history.sqlite"
        started = time.perf_counter()
        for label, factor in (("before", np.ones_like(speedup)), ("after", speedup)):
            rows, measurements = synthetic_session(label, args.records // 2, factor, rng)
            history.write_session(path, {"kind": "sweep", "tag": label, "created": "2026-11-25T00:00:00+00:00"}, rows,
                                  measurements)
        stored_s = time.perf_counter() - started
        history.compare(path, "before", "after")  # imports (scipy.stats) out of the timing
        times = []
        for _ in range(args.tries):
            started = time.perf_counter()
            frame = history.compare(path, "before", "after")
            times.append(time.perf_counter() - started)
        size_mb = path.stat().st_size / 1e6
    best = min(times)
    significant = frame.set_index("variable")["significant"].reindex(variables()) == "significant"
    made = speedup > 1
    print(f"stored {args.records} records in two sessions: {stored_s:.2f} s, {size_mb:.1f} MB")
    # At 95%, about 1 in 20 of the unchanged variables comes out significant by chance.
    print(f"variables: {len(frame)}; significant: {int(significant[made].sum())} of the {int(made.sum())} made 5% "
          f"faster, {int(significant[~made].sum())} of the {int((~made).sum())} unchanged")
    print(f"compare over {args.records} stored records: {best:.2f} s "
          f"(target {TARGET_S:g} s, time/target = {best / TARGET_S:.2f})")


if __name__ == "__main__":
    main()
