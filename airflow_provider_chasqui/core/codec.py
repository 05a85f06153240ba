"""Byte-exact ChasquiMQ 1.x codecs: envelopes, delayed members, retry overrides, ids.

The envelope is the msgpack array ``[id, bin(inner), created_at_ms, attempt(, retry)]``
(wire spec section 4); ``inner`` is the msgpack of the user's data.  A delayed member is
``u32le(len(name)) + name + envelope`` (section 6.1).  Never add elements: a ChasquiMQ
worker rejects extra trailing fields.  Imports only the standard library and msgpack.
"""

from __future__ import annotations

import collections
import json
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import CodecError, ConfigError, ConfigTypeError, LimitError
from .fast import fast_constructor

__all__ = [
    "packb",
    "Envelope",
    "RetryOverride",
    "BackoffWire",
    "encode_data",
    "decode_data",
    "data_json",
    "encode_envelope",
    "decode_envelope",
    "decode_retry",
    "encode_member",
    "split_member",
    "new_job_id",
    "now_ms",
    "MAX_JOB_NAME_BYTES",
    "MAX_JOB_ID_CHARS",
    "validate_job_name",
    "U32_MAX",
    "U64_MAX",
]

MAX_JOB_NAME_BYTES = 256
MAX_JOB_ID_CHARS = 1024  # producers refuse longer ids; a foreign envelope with one is decode_failed
_MAX_FLOAT = sys.float_info.max
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack
packb = _packb  # public: the same packer for callers outside the core (the Spark encoder)
_U32 = struct.Struct("<I")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
# byte -> Crockford digit of its low 5 bits: 256 is a multiple of 32, so a random byte gives a
# uniformly random digit, and 16 random bytes give the ULID's 80 random bits.
_RANDOM_DIGITS = bytes.maketrans(bytes(range(256)), bytes(ord(_CROCKFORD[b & 31]) for b in range(256)))
_id_prefix: tuple[int | None, str] = (None, "")  # (ms, its 10 time digits), swapped whole: thread-safe


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_RANDOM_BATCH = 256
_random_parts: collections.deque[str] = collections.deque()  # popleft is atomic: thread-safe
os.register_at_fork(after_in_child=_random_parts.clear)  # a child must not reuse the parent's


def _random_part() -> str:
    """16 random Crockford digits (80 bits).  Read from the system's randomness 256 ids at a
    time: one ``os.urandom`` per id cost about half a ``Queue.add``'s encoding."""
    try:
        return _random_parts.popleft()
    except IndexError:
        digits = os.urandom(16 * _RANDOM_BATCH).translate(_RANDOM_DIGITS).decode("ascii")
        _random_parts.extend([digits[i : i + 16] for i in range(16, len(digits), 16)])
        return digits[:16]


def _time_digits(ms: int) -> str:
    global _id_prefix
    cached = _id_prefix
    if cached[0] != ms:  # the time digits: the low 50 bits of ms, two digits (10 bits) at a time
        pairs = _CROCKFORD_PAIRS
        cached = _id_prefix = (ms, "".join([pairs[(ms >> shift) & 1023] for shift in (40, 30, 20, 10, 0)]))
    return cached[1]


def ulid_ms(job_id: str) -> int | None:
    """The creation time (ms) a ULID job id carries (every id this package makes); None otherwise."""
    if len(job_id) != 26 or not all(c in _CROCKFORD for c in job_id):
        return None
    ms = 0
    for c in job_id[:10]:
        ms = ms * 32 + _CROCKFORD.index(c)
    return ms


def new_job_id(ms: int | None = None) -> str:
    """A canonical 26-character ULID: 48-bit ms timestamp + 80 random bits."""
    cached = _id_prefix
    if ms is None:
        ms = time.time_ns() // 1_000_000
    if cached[0] == ms:
        return cached[1] + _random_part()
    return _time_digits(ms) + _random_part()


def new_job_ids(n: int, ms: int | None = None) -> list[str]:
    """``n`` ids as :func:`new_job_id` makes them for one millisecond, with one read of the
    system's randomness for all of them (``add_bulk``'s hot path)."""
    if n <= 0:
        return []
    prefix = _time_digits(time.time_ns() // 1_000_000 if ms is None else ms)
    size = 16 * n
    digits = os.urandom(size).translate(_RANDOM_DIGITS).decode("ascii")
    return [prefix + digits[i : i + 16] for i in range(0, size, 16)]


def utf8_text(value: str, what: str) -> bytes:
    """``value`` as UTF-8, or a ``ConfigError`` naming ``what``: a str may hold a lone
    surrogate (what Python makes of undecodable bytes in argv, the environment or file names),
    which has no UTF-8 and so can name no key, field or argument."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"{what} must be text that encodes as UTF-8 (it holds a lone surrogate, as undecodable bytes give),"
            f" got {value!r}"
        ) from None


def items_list(value: object, what: str) -> list[Any]:
    """A bulk call's items as a list: any iterable but a str, bytes or a mapping (one item
    given alone, or a typo), which is a ``ConfigTypeError`` naming ``what``."""
    if isinstance(value, list):
        return value
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigTypeError(f"{what} must be a list (or another iterable) of items, got {type(value).__name__}")
    return list(value)


def validate_job_name(name: object) -> bytes:
    if not isinstance(name, str):
        raise ConfigError(f"job name must be a str, got {type(name).__name__}")
    raw = utf8_text(name, "job name")
    if len(raw) > MAX_JOB_NAME_BYTES:
        raise LimitError(f"job name is {len(raw)} bytes; the limit is {MAX_JOB_NAME_BYTES}")
    return raw


def encode_data(data: Any) -> bytes:
    """msgpack of user data; a value msgpack cannot encode is a ConfigError at the call."""
    try:
        return _packb(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"job data cannot be encoded as msgpack: {exc}") from exc


# Decoding is bounded by the input.  Each msgpack object takes at least one byte, but a
# one-byte empty map becomes a 64-byte dict (plus its 8-byte slot): ``[{}] * 1_000_000`` is
# 1 MB on the wire and 73 MB decoded.  Data up to SMALL_DATA_BYTES decodes directly (at most
# ~72 x 64 KiB = 4.6 MB); larger data may hold at most one list or map per BYTES_PER_CONTAINER
# encoded bytes, counted while it decodes and refused (CodecError, so ``decode_failed``) the
# moment it has more: what is left then costs about 20 x its size at most (short strings).
SMALL_DATA_BYTES = 64 * 1024
BYTES_PER_CONTAINER = 8


class _ContainerBudget:
    """The ``list_hook``/``object_hook`` of a bounded decode: counts containers, stops at the cap."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self, value: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise _Overgrown
        return value


class _Overgrown(Exception):
    pass


class _TupleKeyedMaps:
    """The ``object_pairs_hook`` of the second decode pass: each map as a dict whose array keys
    are tuples (what a tuple key packs to; Python cannot hash the list msgpack decodes it as),
    counted in the pass's budget.  It builds nothing but dicts and tuples of decoded values."""

    __slots__ = ("budget",)

    def __init__(self, budget: _ContainerBudget) -> None:
        self.budget = budget

    def take(self, pairs: list[tuple[Any, Any]]) -> Any:
        return self.budget.take({_as_tuple(key): value for key, value in pairs})


def _as_tuple(key: Any) -> Any:
    return tuple(_as_tuple(k) for k in key) if isinstance(key, list) else key


def decode_data(inner: bytes) -> Any:
    """Job data (or a result, a failure record) from msgpack, bounded: see SMALL_DATA_BYTES.
    A map with array keys (a tuple-keyed dict packs to one) decodes with tuple keys, on a second
    pass only: the first pass's ``unhashable type: 'list'`` dead-lettered such jobs."""
    try:
        try:
            if len(inner) <= SMALL_DATA_BYTES:
                return msgpack.unpackb(inner, raw=False, strict_map_key=False)
            budget = _ContainerBudget(len(inner) // BYTES_PER_CONTAINER)
            return msgpack.unpackb(
                inner, raw=False, strict_map_key=False, list_hook=budget.take, object_hook=budget.take
            )
        except TypeError:  # unhashable key
            budget = _ContainerBudget(len(inner) // BYTES_PER_CONTAINER + SMALL_DATA_BYTES)
            maps = _TupleKeyedMaps(budget)
            return msgpack.unpackb(
                inner, raw=False, strict_map_key=False, list_hook=budget.take, object_pairs_hook=maps.take
            )
    except _Overgrown:
        raise CodecError(
            f"job data of {len(inner)} bytes holds more than one list or map per {BYTES_PER_CONTAINER} bytes "
            f"({len(inner) // BYTES_PER_CONTAINER} allowed): it would take far more memory than its size"
        ) from None
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"job data is not valid msgpack: {exc}") from exc


def data_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` for decoded user data: a map key JSON has no form for
    (a tuple, which an array key decodes to) is written as its ``repr`` rather than ending the
    output in json's ``TypeError``."""
    try:
        return json.dumps(value, **options)
    except TypeError:
        return json.dumps(_json_keys(value), **options)


def _json_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            (k if k is None or isinstance(k, (str, int, float, bool)) else repr(k)): _json_keys(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_json_keys(v) for v in value]
    return value


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

    def with_attempt(self, attempt: int) -> Envelope:
        return Envelope(self.id, self.inner, self.created_at_ms, attempt, self.retry)


# ``Envelope(id, inner, created_at_ms, attempt, retry)`` for the worker's hot path (``core.fast``)
_new_envelope = fast_constructor(Envelope)


def encode_envelope(env: Envelope) -> bytes:
    if env.retry is None:
        return _packb([env.id, env.inner, env.created_at_ms, env.attempt])
    return _packb([env.id, env.inner, env.created_at_ms, env.attempt, env.retry.to_wire()])


def encode_new_envelope(job_id: str, inner: bytes, created_at_ms: int, retry: RetryOverride | None = None) -> bytes:
    """``encode_envelope(Envelope(job_id, inner, created_at_ms, 0, retry))``, the same bytes,
    without building the object (the producers' hot path)."""
    if retry is None:
        return _packb([job_id, inner, created_at_ms, 0])
    return _packb([job_id, inner, created_at_ms, 0, retry.to_wire()])


U32_MAX = 2**32 - 1  # msgpack u32: attempts, retry counts
U64_MAX = 2**64 - 1  # msgpack u64: instants, deadlines, intervals


def _uint(value: Any, what: str, top: int = U64_MAX) -> int:
    """An unsigned integer that fits the Rust field (``u64`` unless ``top`` says ``u32``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise CodecError(f"{what} must be an unsigned integer up to {top}, got {value!r}")
    return value


def _opt_uint(value: Any, what: str, top: int = U64_MAX) -> int | None:
    return None if value is None else _uint(value, what, top)


def _fields(raw: dict[Any, Any], names: tuple[str, ...], what: str) -> list[Any]:
    """A serde struct in map form, as its positional array (missing fields = nil)."""
    if not all(isinstance(k, str) for k in raw):
        raise CodecError(f"{what} map keys must be strings")
    return [raw.get(name) for name in names]


def _decode_backoff(raw: Any) -> BackoffWire | None:
    if raw is None:
        return None
    if isinstance(raw, dict):  # serde also accepts the named-map form
        raw = _fields(raw, ("kind", "delay_ms", "max_delay_ms", "multiplier", "jitter_ms"), "backoff")
    if not isinstance(raw, list) or len(raw) != 5:
        raise CodecError("backoff must be an array of exactly 5 elements")
    kind, delay, cap, mult, jitter = raw
    if not isinstance(kind, str):
        raise CodecError("backoff kind must be a string")
    # NaN fails both comparisons; inf and ints beyond a float fail the upper one.
    if mult is not None and (
        isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 <= mult <= _MAX_FLOAT
    ):
        raise CodecError(f"backoff multiplier must be a finite non-negative number, got {mult!r}")
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
    if isinstance(raw, dict):
        raw = _fields(raw, ("max_attempts", "backoff"), "retry override")
    if not isinstance(raw, list) or len(raw) != 2:
        raise CodecError("retry override must be an array of exactly 2 elements")
    return RetryOverride(_opt_uint(raw[0], "retry max_attempts", U32_MAX), _decode_backoff(raw[1]))


_RETRY_MEMO: dict[tuple[Any, ...], RetryOverride] = {}
_RETRY_MEMO_MAX = 1024


def decode_retry(raw: Any) -> RetryOverride | None:
    """``_decode_retry`` remembered for the array form: a queue's jobs carry a handful of
    distinct overrides (``attempts=``, ``backoff=``), and building and checking the two objects
    cost four times the envelope's own decoding on the worker's hot path.  The memo key holds
    each value *and its type* (``True`` is not ``1``, ``1.0`` is not ``1``), only overrides that
    decoded are stored, and the memo is emptied when full, so a hostile producer sending
    distinct overrides costs only misses."""
    if type(raw) is list and len(raw) == 2:
        top, b = raw
        if b is None:
            key: tuple[Any, ...] = (top, type(top))
        elif type(b) is list and len(b) == 5:
            key = (top, type(top), *b, *map(type, b))
        else:
            return _decode_retry(raw)
        try:
            hit = _RETRY_MEMO.get(key)
        except TypeError:  # an unhashable element (a list, a map): the exact verdict below
            return _decode_retry(raw)
        if hit is None:
            hit = _decode_retry(raw)  # raises CodecError: nothing stored
            if hit is not None:
                if len(_RETRY_MEMO) >= _RETRY_MEMO_MAX:
                    _RETRY_MEMO.clear()
                _RETRY_MEMO[key] = hit
        return hit
    return _decode_retry(raw)


def decode_envelope(raw: bytes) -> Envelope:
    """Decode ``d`` the way ChasquiMQ's shims do; any deviation is a CodecError."""
    try:
        arr = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise CodecError(f"envelope is not valid msgpack: {exc}") from exc
    if type(arr) is list and 4 <= len(arr) <= 5:  # fast path: the shape every producer writes
        job_id, inner, created, attempt = arr[0], arr[1], arr[2], arr[3]
        if (
            type(job_id) is str
            and type(inner) is bytes
            and type(created) is int
            and type(attempt) is int
            and 0 <= created <= U64_MAX
            and 0 <= attempt <= U32_MAX
            and len(job_id) <= MAX_JOB_ID_CHARS
        ):  # a 5th element: the job's retry override (``attempts=``, ``backoff=``), remembered
            return _new_envelope(job_id, inner, created, attempt, decode_retry(arr[4]) if len(arr) == 5 else None)
    if isinstance(arr, dict):  # serde's map form: fields by name, defaults may be missing
        fields = _fields(arr, ("id", "payload", "created_at_ms", "attempt", "retry"), "envelope")
        fields[3] = fields[3] if "attempt" in arr else 0
        arr = fields
    if not isinstance(arr, list) or not 3 <= len(arr) <= 5:
        raise CodecError("envelope must be an array of 3 to 5 elements")
    job_id, inner = arr[0], arr[1]
    if not isinstance(job_id, str):
        raise CodecError("envelope id must be a string")
    if len(job_id) > MAX_JOB_ID_CHARS:
        raise CodecError(f"envelope id is {len(job_id)} characters; the limit is {MAX_JOB_ID_CHARS}")
    if isinstance(inner, list) and all(type(b) is int and 0 <= b < 256 for b in inner):
        inner = bytes(inner)
    if not isinstance(inner, bytes):
        raise CodecError("envelope payload must be msgpack bin")
    created = _uint(arr[2], "created_at_ms")
    attempt = _uint(arr[3], "attempt", U32_MAX) if len(arr) > 3 else 0
    retry = decode_retry(arr[4]) if len(arr) > 4 else None
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
