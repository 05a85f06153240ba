"""Golden byte vectors of the ChasquiMQ wire spec (section 23), copied verbatim from its hex.

Fixed inputs of the spec: queue ``emails``, job id ``01J9Z8X7W6V5T4S3R2Q1P0N9M8``,
``created_at_ms = 1700000000000``, user data ``{"to": "ada@example.com"}``.  Shared by the
core, Lua and engine suites; never computed with the code under test.
"""

from __future__ import annotations

JOB_ID = "01J9Z8X7W6V5T4S3R2Q1P0N9M8"
CREATED_AT_MS = 1_700_000_000_000
DATA = {"to": "ada@example.com"}
NAME = "send-email"


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


# V1 — inner user-data msgpack (what the shims pass to the engine)
V1 = _hex("""
    81 a2 74 6f af 61 64 61 40 65 78 61 6d 70 6c 65
    2e 63 6f 6d
""")

# V2 — Job envelope, shim payload, attempt 0, no retry (stream field `d`)
V2 = _hex("""
    94 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2
    74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63
    6f 6d cf 00 00 01 8b cf e5 68 00 00
""")

# V3 — same job after two failed runs (attempt = 2)
V3 = _hex("""
    94 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2
    74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63
    6f 6d cf 00 00 01 8b cf e5 68 00 02
""")

# V4 — with retry override (max_attempts 5; exponential 250 ms, cap 10 000, ×3.0, jitter 50)
V4 = _hex("""
    95 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2
    74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63
    6f 6d cf 00 00 01 8b cf e5 68 00 00 92 05 95 ab
    65 78 70 6f 6e 65 6e 74 69 61 6c cc fa cd 27 10
    cb 40 08 00 00 00 00 00 00 32
""")

# V5 — Python shim `backoff=500` (int), attempts unset
V5 = _hex("""
    95 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2
    74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63
    6f 6d cf 00 00 01 8b cf e5 68 00 00 92 c0 95 a5
    66 69 78 65 64 cd 01 f4 c0 c0 c0
""")

# V6 — `attempts=3` only
V6 = _hex("""
    95 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2
    74 6f af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63
    6f 6d cf 00 00 01 8b cf e5 68 00 00 92 03 c0
""")

# V7 — delayed ZSET member, name `send-email`, envelope V2
V7 = _hex("""
    0a 00 00 00 73 65 6e 64 2d 65 6d 61 69 6c 94 ba
    30 31 4a 39 5a 38 58 37 57 36 56 35 54 34 53 33
    52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2 74 6f
    af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d
    cf 00 00 01 8b cf e5 68 00 00
""")

# V8 — retry-reschedule member for the same job after its first failure (attempt 1, name kept)
V8 = _hex("""
    0a 00 00 00 73 65 6e 64 2d 65 6d 61 69 6c 94 ba
    30 31 4a 39 5a 38 58 37 57 36 56 35 54 34 53 33
    52 32 51 31 50 30 4e 39 4d 38 c4 14 81 a2 74 6f
    af 61 64 61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d
    cf 00 00 01 8b cf e5 68 00 01
""")

# V13 — counter-example: native Rust `Producer<EmailJob{to, subject}>` (typed T inline)
V13 = _hex("""
    94 ba 30 31 4a 39 5a 38 58 37 57 36 56 35 54 34
    53 33 52 32 51 31 50 30 4e 39 4d 38 92 af 61 64
    61 40 65 78 61 6d 70 6c 65 2e 63 6f 6d a2 68 69
    cf 00 00 01 8b cf e5 68 00 00
""")

# Lengths the spec states next to each vector.
LENGTHS = {"V1": 20, "V2": 60, "V3": 60, "V4": 90, "V5": 75, "V6": 63, "V7": 74, "V8": 74, "V13": 58}
