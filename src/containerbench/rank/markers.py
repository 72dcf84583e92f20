"""The marker lines that tie a raw log together, defined once.

The launcher writes the first and last line of every raw log; the benchmark
ranks print the others. The parser (records.py) reads a log through these
markers and nothing else, so the writer and the reader cannot drift apart. The
benchmark side imports this module too, so it is part of the provenance hash.

A rank's marker line reaches the log through the launcher's output forwarding,
which passes output on in pieces, not lines: srun in messages of at most 1024
bytes (SLURM_IO_MAX_MSG_LEN, src/common/io_hdr.h; slurmstepd's io.c packs whole
lines into them, so a longer line is cut), mpirun in reads of up to 4096. Another
task's output can land between two pieces. So `emit` writes a payload longer than
one short line as framed parts (PART), each under those limits and written with
one write(), with its length and CRC-32; `read_payloads` puts them back together,
taking out what was spliced into a part, and checks the whole against its SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zlib
from dataclasses import dataclass

LAUNCH = "containerbench-launch "  # first line: the spec, the exact argv and the variables given
EXIT = "containerbench-exit "  # last line: return code, wall time, timeout
RESULT = "containerbench-result "  # rank 0: the run's result, one JSON object
FAILURE = "containerbench-failure "  # rank 0: why the benchmark could not run this mode (plain text)
NETBENCH = "containerbench-netbench "  # rank 0 of netbench: one measurement
PART = "containerbench-part "  # one piece of a long marker line: PART <marker> <sha12> <i>/<n> <length> <crc32> <text>

PART_TEXT = 768  # JSON characters per part: a part line stays under 900 bytes
PART_HEADER = re.compile(r"containerbench-part ([\w-]+) ([0-9a-f]{12}) (\d+)/(\d+) (\d+) ([0-9a-f]{8}) ")
SPLICE_LINES = 8  # how many lines after a cut part its rest is looked for in


def line(marker: str, payload: dict) -> str:
    """One marker line, newline included."""
    return marker + json.dumps(payload, sort_keys=True) + "\n"


def payload(text: str, marker: str) -> dict | None:
    """The JSON after `marker` on a line that starts with it; None where it is not valid JSON."""
    try:
        return json.loads(text[len(marker):])
    except json.JSONDecodeError:
        return None


def _name(marker: str) -> str:
    return marker.strip().removeprefix("containerbench-")


def framed(marker: str, payload: dict) -> list[str]:
    """The lines that carry `payload`: one marker line when it is short, else its parts."""
    text = json.dumps(payload, sort_keys=True)  # ASCII: json escapes the rest, so characters are bytes
    if len(marker) + len(text) < PART_TEXT:
        return [marker + text + "\n"]
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    pieces = [text[at:at + PART_TEXT] for at in range(0, len(text), PART_TEXT)]
    return [f"{PART}{_name(marker)} {digest} {number}/{len(pieces)} {len(piece)} "
            f"{zlib.crc32(piece.encode()):08x} {piece}\n" for number, piece in enumerate(pieces, start=1)]


def carries(text: str, marker: str) -> bool:
    """Does the line hold a `marker` line, or one of the parts of one?"""
    return marker in text or f"{PART}{_name(marker)} " in text


def emit(marker: str, payload: dict, stream=None) -> None:
    """Print `payload` as `framed` lines, each in a write() of its own, flushed."""
    stream = stream or sys.stdout
    for text in framed(marker, payload):
        stream.write(text)
        stream.flush()


def _checks(piece: str, length: int, crc: str) -> bool:
    return len(piece) == length and f"{zlib.crc32(piece.encode()):08x}" == crc


def _piece(lines: list[str], at: int, text: str, length: int, crc: str) -> str | None:
    """A part's text from its line `text` (at index `at`), where something may have been spliced into it:
    a run of foreign characters inside the line, or foreign lines between its start and its rest."""
    if _checks(text, length, crc):
        return text
    extra = len(text) - length
    for cut in range(len(text) - extra + 1 if extra > 0 else 0):  # the foreign run inside this line
        if _checks(text[:cut] + text[cut + extra:], length, crc):
            return text[:cut] + text[cut + extra:]
    for later in lines[at + 1:at + 1 + SPLICE_LINES]:  # the part's rest ends a later line
        for cut in range(min(len(text), length) + 1):
            rest = length - cut
            if rest <= len(later) and _checks(text[:cut] + later[len(later) - rest:], length, crc):
                return text[:cut] + later[len(later) - rest:]
    return None


@dataclass
class Found:
    """A marker line of a log, or a payload put back together from its parts."""

    line: int  # 1-based: where it starts
    marker: str
    payload: dict | None  # None: unreadable
    problem: str | None = None  # why it is unreadable


def read_payloads(lines: list[str], also: tuple[str, ...] = ()) -> list[Found]:
    """The RESULT and NETBENCH payloads of a log (and those of the markers in `also`), single lines or in parts,
    in the order they start. A marker is read where it starts on its line: output forwarding can put another
    task's text first."""
    groups: dict[tuple[str, str], dict] = {}
    order: list[tuple[int, str, tuple[str, str] | str]] = []
    for index, text in enumerate(lines):
        if PART in text:
            found = PART_HEADER.search(text)
            if not found:
                continue
            name, digest, number, count, length, crc = found.groups()
            if (name, digest) not in groups:
                groups[(name, digest)] = {"count": int(count), "pieces": {}}
                order.append((index + 1, f"containerbench-{name} ", (name, digest)))
            piece = _piece(lines, index, text[found.end():], int(length), crc)
            if piece is not None:
                groups[(name, digest)]["pieces"][int(number)] = piece
            continue
        for marker in (RESULT, NETBENCH, *also):
            if marker in text:
                order.append((index + 1, marker, text[text.index(marker):]))
                break
    return [_found(number, marker, what, groups) for number, marker, what in order]


def payloads_of(lines: list[str], marker: str) -> list[dict | None]:
    """The `marker` payloads of some output, in order (None for one that cannot be read)."""
    also = () if marker in (RESULT, NETBENCH) else (marker,)
    return [found.payload for found in read_payloads(lines, also) if found.marker == marker]


def _found(number: int, marker: str, what: tuple[str, str] | str, groups: dict) -> Found:
    if isinstance(what, str):
        read = payload(what, marker)
        return Found(number, marker, read, None if read is not None else "its JSON is not valid")
    count, pieces = groups[what]["count"], groups[what]["pieces"]
    missing = [index for index in range(1, count + 1) if index not in pieces]
    if missing:
        return Found(number, marker, None, f"part {', '.join(map(str, missing))} of {count} not found whole")
    text = "".join(pieces[index] for index in range(1, count + 1))
    if hashlib.sha256(text.encode()).hexdigest()[:12] != what[1]:
        return Found(number, marker, None, f"its {count} parts do not make the whole they were cut from")
    read = payload(marker + text, marker)
    return Found(number, marker, read, None if read is not None else "its JSON is not valid")
