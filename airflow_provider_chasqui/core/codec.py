"""Byte-exact ChasquiMQ 1.x codecs: envelopes, delayed members, retry overrides, ids.

The envelope is the msgpack array ``[id, bin(inner), created_at_ms, attempt(, retry)]``
(wire spec section 4); ``inner`` is the msgpack of the user's data.  A delayed member is
``u32le(len(name)) + name + envelope`` (section 6.1).  Never add elements: a ChasquiMQ
worker rejects extra trailing fields.  Imports only the standard library and msgpack.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import CodecError, ConfigError

__all__ = [
    "Envelope",
    "RetryOverride",
    "BackoffWire",
    "encode_data",
    "decode_data",
    "encode_envelope",
    "decode_envelope",
    "encode_member",
    "split_member",
    "new_job_id",
    "now_ms",
    "MAX_JOB_NAME_BYTES",
    "validate_job_name",
]

MAX_JOB_NAME_BYTES = 256
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_U32 = struct.Struct("<I")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_job_id(ms: int | None = None) -> str:
    """A canonical 26-character ULID: 48-bit ms timestamp + 80 random bits."""
    value = ((now_ms() if ms is None else ms) << 80) | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


def validate_job_name(name: object) -> bytes:
    if not isinstance(name, str):
        raise ConfigError(f"job name must be a str, got {type(name).__name__}")
    raw = name.encode("utf-8")
    if len(raw) > MAX_JOB_NAME_BYTES:
        raise ConfigError(f"job name is {len(raw)} bytes; the limit is {MAX_JOB_NAME_BYTES}")
    return raw


def encode_data(data: Any) -> bytes:
    """msgpack of user data; a value msgpack cannot encode is a ConfigError at the call."""
    try:
        return _packb(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"job data cannot be encoded as msgpack: {exc}") from exc


def decode_data(inner: bytes) -> Any:
    try:
        return msgpack.unpackb(inner, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"job data is not valid msgpack: {exc}") from exc


@dataclass(frozen=True, slots=True)
class BackoffWire:
    """``BackoffSpec`` as the wire stores it: ``[kind, delay_ms, max|nil, mult|nil, jitter|nil]``."""

    kind: str
    delay_ms: int
    max_delay_ms: int | None = None
    multiplier: float | None = None
    jitter_ms: int | None = None

    def to_wire(self) -> list[Any]:
        mult = None if self.multiplier is None else float(self.multiplier)
        return [self.kind, self.delay_ms, self.max_delay_ms, mult, self.jitter_ms]


@dataclass(frozen=True, slots=True)
class RetryOverride:
    """Per-job ``[max_attempts|nil, backoff|nil]`` (both slots always present)."""

    max_attempts: int | None = None
    backoff: BackoffWire | None = None

    def to_wire(self) -> list[Any]:
        return [self.max_attempts, None if self.backoff is None else self.backoff.to_wire()]


@dataclass(frozen=True, slots=True)
class Envelope:
    id: str
    inner: bytes
    created_at_ms: int
    attempt: int = 0
    retry: RetryOverride | None = None

    def with_attempt(self, attempt: int) -> "Envelope":
        return Envelope(self.id, self.inner, self.created_at_ms, attempt, self.retry)


def encode_envelope(env: Envelope) -> bytes:
    if env.retry is None:
        return _packb([env.id, env.inner, env.created_at_ms, env.attempt])
    return _packb([env.id, env.inner, env.created_at_ms, env.attempt, env.retry.to_wire()])


def _uint(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CodecError(f"{what} must be an unsigned integer, got {value!r}")
    return value


def _opt_uint(value: Any, what: str) -> int | None:
    return None if value is None else _uint(value, what)


def _decode_backoff(raw: Any) -> BackoffWire | None:
    if raw is None:
        return None
    if isinstance(raw, dict):  # serde also accepts the named-map form
        raw = [raw.get(k) for k in ("kind", "delay_ms", "max_delay_ms", "multiplier", "jitter_ms")]
    if not isinstance(raw, list) or not 2 <= len(raw) <= 5:
        raise CodecError("backoff must be an array of 2 to 5 elements")
    raw = raw + [None] * (5 - len(raw))
    kind, delay, cap, mult, jitter = raw
    if not isinstance(kind, str):
        raise CodecError("backoff kind must be a string")
    if mult is not None and (isinstance(mult, bool) or not isinstance(mult, (int, float))):
        raise CodecError("backoff multiplier must be a float")
    return BackoffWire(
        kind,
        _uint(delay, "backoff delay_ms"),
        _opt_uint(cap, "backoff max_delay_ms"),
        None if mult is None else float(mult),
        _opt_uint(jitter, "backoff jitter_ms"),
    )


def _decode_retry(raw: Any) -> RetryOverride | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise CodecError("retry override must be an array of exactly 2 elements")
    return RetryOverride(_opt_uint(raw[0], "retry max_attempts"), _decode_backoff(raw[1]))


def decode_envelope(raw: bytes) -> Envelope:
    """Decode ``d`` the way ChasquiMQ's shims do; any deviation is a CodecError."""
    try:
        arr = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise CodecError(f"envelope is not valid msgpack: {exc}") from exc
    if not isinstance(arr, list) or not 3 <= len(arr) <= 5:
        raise CodecError("envelope must be an array of 3 to 5 elements")
    job_id, inner = arr[0], arr[1]
    if not isinstance(job_id, str):
        raise CodecError("envelope id must be a string")
    if isinstance(inner, list) and all(isinstance(b, int) and 0 <= b < 256 for b in inner):
        inner = bytes(inner)
    if not isinstance(inner, bytes):
        raise CodecError("envelope payload must be msgpack bin")
    created = _uint(arr[2], "created_at_ms")
    attempt = _uint(arr[3], "attempt") if len(arr) > 3 else 0
    retry = _decode_retry(arr[4]) if len(arr) > 4 else None
    return Envelope(job_id, inner, created, attempt, retry)


def encode_member(name_bytes: bytes, envelope_bytes: bytes) -> bytes:
    """Delayed ZSET member: ``u32le(len(name)) + name + envelope``."""
    return _U32.pack(len(name_bytes)) + name_bytes + envelope_bytes


def split_member(member: bytes) -> tuple[str, bytes]:
    """Inverse of :func:`encode_member`: ``(name, envelope bytes)``."""
    if len(member) < 4:
        raise CodecError("delayed member shorter than its 4-byte name prefix")
    (n,) = _U32.unpack_from(member)
    if 4 + n > len(member):
        raise CodecError("delayed member name length runs past the member")
    try:
        name = member[4 : 4 + n].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError("delayed member name is not UTF-8") from exc
    return name, member[4 + n :]
