"""A stored spec decoded for the scheduler's hot loop (sans-I/O).

``SpecDecoder.decode`` is ``StoredSpec.decode`` with caches: the shape upserts write by
default is unpacked once per spec and checked with exact types, its pattern and missed-fires
policy come from caches keyed by their exact wire values (``True`` or ``1.0`` never hit the
entry of ``1``); anything unusual takes ``StoredSpec.decode`` itself, so the answer, or the
``CodecError`` that quarantines the spec, is always the general decoder's
(``tests/scheduler/test_sched_core.py::test_fast_decode_equals_the_reference_decoder`` and the
tests after it hold the two to that).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from .codec import U64_MAX
from .fast import fast_constructor
from .repeat import MissedFiresPolicy, RepeatPattern, StoredSpec

__all__ = ["DueSpec", "SpecDecoder"]

_unpackb = msgpack.unpackb
_PLAIN = (int, str, type(None))
_SKIP_POLICY = MissedFiresPolicy.skip()


class DueSpec(NamedTuple):
    """The fields of a ``StoredSpec`` the scheduler uses (a light tuple for the hot loop)."""

    key: str
    job_name: str
    pattern: RepeatPattern
    payload_inner: bytes
    limit: int | None
    start_after_ms: int | None
    end_before_ms: int | None
    missed_fires: MissedFiresPolicy
    ident: Any  # hashable stand-in for (pattern, start_after_ms, missed_fires): the plan cache's key


# ``DueSpec`` from one tuple of its values, for the hot loop (see ``core.fast``)
_new_due_spec = fast_constructor(DueSpec)


def _slow(raw: bytes) -> DueSpec:
    s = StoredSpec.decode(raw)
    return DueSpec(
        s.key,
        s.job_name,
        s.pattern,
        s.payload_inner,
        s.limit,
        s.start_after_ms,
        s.end_before_ms,
        s.missed_fires,
        (s.pattern, s.start_after_ms, s.missed_fires),
    )


class SpecDecoder:
    """``StoredSpec.decode`` for the hot loop, with its caches: the common shape is unpacked
    once and its pattern and policy come from caches keyed by their exact wire values; anything
    unusual takes ``StoredSpec.decode`` itself (same fields, or its CodecError).  Each
    ``SchedulerCore`` owns one, so schedulers (and tests) share no cached state."""

    __slots__ = ("patterns", "policies")

    def __init__(self) -> None:
        # wire value -> decoded object, at most ~4096 entries each (cleared when full)
        self.patterns: dict[Any, RepeatPattern] = {}
        self.policies: dict[Any, MissedFiresPolicy] = {"": _SKIP_POLICY}

    def decode(self, raw: bytes) -> DueSpec:  # noqa: C901 - the spec wire format's checks in one pass, on the scheduler's per-spec hot path
        pkey: tuple[Any, ...] | None  # (a bare annotation: no runtime work)
        try:
            arr = _unpackb(raw)
        except Exception:  # noqa: BLE001 - the slow path names the problem
            return _slow(raw)
        # the shape upserts write by default (8 elements, no limit, no window, skip policy, a
        # bin8 payload), checked with exact types and no loops; the rest takes the general path
        if type(arr) is list and len(arr) == 8:
            key, name, pat, payload, limit, start, end, fired = arr
            if (
                limit is None
                and start is None
                and end is None
                and type(fired) is int
                and fired >= 0
                and type(key) is str
                and type(name) is str
                and type(pat) is dict
                and len(pat) == 1
                and type(payload) is bytes
                and len(payload) >= 2
                and payload[0] == 0xC4
                and len(payload) == payload[1] + 2
            ):
                body = pat.get("Every")
                if body is not None:
                    pkey = (
                        ("Every", body[0]) if type(body) is list and len(body) == 1 and type(body[0]) is int else None
                    )
                else:
                    body = pat.get("Cron")
                    pkey = (
                        ("Cron", body[0], body[1])
                        if type(body) is list
                        and len(body) == 2
                        and type(body[0]) is str
                        and (body[1] is None or type(body[1]) is str)
                        else None
                    )
                pattern = self.patterns.get(pkey) if pkey is not None else None
                if pattern is not None:
                    ident = (pkey, None, "")
                    return _new_due_spec((key, name, pattern, payload[2:], None, None, None, _SKIP_POLICY, ident))
        if type(arr) is not list or not 8 <= len(arr) <= 9:
            return _slow(raw)
        key, name, pat, payload, limit, start, end, fired = arr[:8]
        if (
            type(key) is not str
            or type(name) is not str
            or type(pat) is not dict
            or len(pat) != 1
            or type(payload) is not bytes
            or len(payload) < 2
        ):
            return _slow(raw)
        for v in (limit, start, end):
            if v is not None and (type(v) is not int or not 0 <= v <= U64_MAX):
                return _slow(raw)
        if type(fired) is not int or fired < 0:
            return _slow(raw)
        ((variant, body),) = pat.items()
        if type(body) is not list or not all(type(x) in _PLAIN for x in body):
            return _slow(raw)  # exact types only: True or 1.0 must not hit the cache entry of 1
        pkey = (variant, *body)
        pattern = self.patterns.get(pkey)
        policy_wire = arr[8] if len(arr) == 9 else ""
        if type(policy_wire) is str:
            qkey: Any = policy_wire
        elif (
            type(policy_wire) is dict
            and len(policy_wire) == 1
            and all(type(v) is list and all(type(x) in _PLAIN for x in v) for v in policy_wire.values())
        ):
            qkey = tuple((k, *v) for k, v in policy_wire.items())
        else:
            return _slow(raw)
        policy = self.policies.get(qkey)
        if pattern is None or policy is None:
            spec = _slow(raw)  # validates; then remember the pieces
            if len(self.patterns) > 4096 or len(self.policies) > 4096:
                self.patterns.clear()
                self.policies = {"": _SKIP_POLICY}
            self.patterns[pkey] = spec.pattern
            self.policies[qkey] = spec.missed_fires
            return spec
        inner = _bin_body(payload)
        if inner is None:
            return _slow(raw)
        return DueSpec(key, name, pattern, inner, limit, start, end, policy, (pkey, start, qkey))


def _bin_body(payload: bytes) -> bytes | None:
    """The bytes of a msgpack bin (the RawBytes layer of the stored payload), else None."""
    tag = payload[0]
    if tag == 0xC4:
        n, head = payload[1], 2
    elif tag == 0xC5 and len(payload) >= 3:
        n, head = int.from_bytes(payload[1:3], "big"), 3
    elif tag == 0xC6 and len(payload) >= 5:
        n, head = int.from_bytes(payload[1:5], "big"), 5
    else:
        return None
    return payload[head:] if len(payload) == head + n else None
