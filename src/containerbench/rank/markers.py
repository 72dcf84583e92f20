"""The marker lines that tie a raw log together, defined once.

The launcher writes the first and last line of every raw log; the benchmark
ranks print the others. The parser (records.py) reads a log through these
markers and nothing else, so the writer and the reader cannot drift apart. The
benchmark side imports this module too, so it is part of the provenance hash.
"""

from __future__ import annotations

import json

LAUNCH = "containerbench-launch "  # first line: the spec, the exact argv and the variables given
EXIT = "containerbench-exit "  # last line: return code, wall time, timeout
RESULT = "containerbench-result "  # rank 0: the run's result, one JSON object
FAILURE = "containerbench-failure "  # rank 0: why the benchmark could not run this mode (plain text)
NETBENCH = "containerbench-netbench "  # rank 0 of netbench: one measurement


def line(marker: str, payload: dict) -> str:
    """One marker line, newline included."""
    return marker + json.dumps(payload, sort_keys=True) + "\n"


def payload(text: str, marker: str) -> dict | None:
    """The JSON after `marker` on a line that starts with it; None where it is not valid JSON."""
    try:
        return json.loads(text[len(marker):])
    except json.JSONDecodeError:
        return None
