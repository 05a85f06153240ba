"""Bounded looks through a stream for viewers (the dashboard's job search and DLQ pages).

An ``XRANGE ... COUNT 1000`` of a queue whose jobs are 1 MiB each moves a gigabyte into the
viewer (issue 26).  ``scan_entries.lua`` reads the stream inside Redis in small steps, keeps
only the entries whose payload holds a needle (a job id), cuts every field to a size, and stops
after a number of entries or of bytes read; what crosses the network is the matches, cut.  The
reply says where the look stopped and whether it reached the end of the range, so a page can
say what it did not search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from .calls import Call, int_reply, script_call, str_reply

__all__ = ["ScanReply", "scan_call", "parse_scan", "ends_call", "parse_ends", "envelope_id", "ENVELOPE_ID_PREFIX"]

# Bytes of an envelope that always hold its job id (array header, str header, <= 1024 chars of
# up to 4 UTF-8 bytes... in practice ids are ASCII ULIDs; a longer id is simply not shown).
ENVELOPE_ID_PREFIX = 1100


@dataclass(frozen=True, slots=True)
class ScanReply:
    last: str  # the last entry id read ('' when none): continue after it
    scanned: int  # entries read
    done: bool  # the range ended (else a bound stopped the look)
    matches: list[tuple[str, dict[str, bytes], int]]  # (entry id, fields as cut, full length of d or -1)


def scan_call(
    stream: str,
    start: str,
    end: str = "+",
    *,
    count: int,
    needle: bytes = b"",
    clip: int = 0,
    whole_d: bool = False,
    step: int = 16,
    max_bytes: int = 32 * 1024 * 1024,
    max_matches: int = 1,
    name: str = "",
) -> Call:
    """One ``scan_entries`` call: see the module docstring and the script's header."""
    return script_call(
        "scan_entries",
        (stream,),
        (start, end, count, needle, clip, "1" if whole_d else "0", step, max_bytes, max_matches, name),
    )


def parse_scan(reply: Any) -> ScanReply:
    if not isinstance(reply, list) or len(reply) < 3:
        return ScanReply("", 0, True, [])
    matches = []
    for m in reply[3:]:
        if isinstance(m, list) and len(m) == 3 and isinstance(m[1], list):
            flat = m[1]
            fields = {str_reply(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
            matches.append((str_reply(m[0]), fields, int_reply(m[2])))
    return ScanReply(str_reply(reply[0]), int_reply(reply[1]), int_reply(reply[2]) == 1, matches)


def ends_call(stream: str) -> Call:
    """The ids of a stream's first and last entries (``stream_ends.lua``), without their
    fields: ``XREVRANGE ... COUNT 1`` would bring the newest payload along, whatever its size."""
    return script_call("stream_ends", (stream,), ())


def parse_ends(reply: Any) -> tuple[str, str] | None:
    """``(first id, last id)`` from ``ends_call``'s reply; None for an empty stream."""
    if not isinstance(reply, list) or len(reply) != 2:
        return None
    return str_reply(reply[0]), str_reply(reply[1])


def envelope_id(prefix: bytes) -> str | None:
    """The job id of an envelope from its first bytes (``ENVELOPE_ID_PREFIX`` suffice), without
    decoding (or holding) the rest; None when they do not start a ChasquiMQ envelope."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(prefix) + 1)
    try:
        unpacker.feed(prefix)
        if unpacker.read_array_header() < 4:
            return None
        job_id = unpacker.unpack()
    except Exception:  # noqa: BLE001 - truncated, not msgpack, not an array: no id to show
        return None
    return job_id if isinstance(job_id, str) else None
