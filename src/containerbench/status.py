"""The words a run record judges with: a run's verdict (`Status`) and a check's outcome (`Check`).

Both are str enums, so a member is its string wherever one is compared, counted, written to JSON
or formatted: records keep the same strings they always had. They sit below every other module
(tests/test_layers.py), so the checks (fabrics, usage), the parser (records) and every reader can
share them.
"""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """A member is its value when formatted too (enum.StrEnum's behaviour, which needs Python 3.11)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)


class Status(_Word):
    """A run's verdict (records.Verdict): only an ok run is compared."""

    OK = "ok"
    FAILED = "failed"  # it did not run, did not end, or left no result (a run that never started included)
    INVALID = "invalid"  # it measured something other than what was planned, or on the wrong network
    DISTURBED = "disturbed"  # a valid measurement of a machine busy with something else: kept, not compared


class Check(_Word):
    """The outcome of one check in a record: the transport (fabric_check), the traffic and the disturbance
    (telemetry)."""

    OK = "ok"
    MISMATCH = "mismatch"  # the run used another network than its fabric asks for: the run is invalid
    UNVERIFIED = "unverified"  # no log line decided (fabrics.verify)
    NOT_APPLICABLE = "not applicable"  # nothing to check: one rank, one node, no ring all-reduce
    NOT_CHECKED = "not checked"  # the fabric names no interface to count traffic on (usage.traffic_check)
    DISTURBED = "disturbed"  # processes outside the run took its CPUs (usage.disturbance_check)
    UNJUDGED = "unjudged"  # too few telemetry samples in the measured window to tell whether anything else ran
