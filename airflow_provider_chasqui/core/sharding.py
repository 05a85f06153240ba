"""One logical schedule set spread over N queues ``<name>.<i>`` (sans-I/O routing rules).

Each shard is a queue of its own, so its keys carry their own hash tag ``{chasqui:<name>.<i>}``
and Redis Cluster places each shard on whatever node owns that slot.  A spec lives on shard
``crc32(spec key) % N`` (stable across processes, Python versions and restarts; changing N
moves specs, so N is fixed for the life of a schedule set).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError, ConfigTypeError
from .codec import utf8_text
from .keys import validate_queue_name

__all__ = [
    "shard_of",
    "shard_queue_names",
    "split_by_shard",
    "split_limit",
    "encode_cursor",
    "decode_cursor",
    "MAX_SHARDS",
]

MAX_SHARDS = 16384


def _check_shards(shards: Any) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int) or not 0 < shards <= MAX_SHARDS:
        raise ConfigError(f"shards must be an int in 1..{MAX_SHARDS}, got {shards!r}")
    return shards


def shard_queue_names(name: str, shards: int) -> list[str]:
    _check_shards(shards)
    validate_queue_name(name)
    return [validate_queue_name(f"{name}.{i}") for i in range(shards)]


def shard_of(key: str, shards: int) -> int:
    """The shard index of a spec key (or of any routing key, e.g. a caller's job id)."""
    if not isinstance(key, str):
        raise ConfigTypeError(f"a routing key (job id, group or spec key) must be a str, got {type(key).__name__}")
    return zlib.crc32(utf8_text(key, "a routing key (job id, group or spec key)")) % shards


def split_by_shard(items: Iterable[Mapping[str, Any]], keys: Iterable[str], shards: int) -> dict[int, list[Any]]:
    """Group items by the shard of their resolved key, keeping their order within a shard."""
    out: dict[int, list[Any]] = {}
    for item, key in zip(items, keys):
        out.setdefault(shard_of(key, shards), []).append(item)
    return out


def split_limit(what: str, total: object, shards: int, maximum: int) -> list[int]:
    """A limit of the whole sharded queue as one limit per shard, summing to ``total``: every
    shard's workers obey their own share (a Lua script cannot count across hash slots), so
    the shards together never exceed ``total``.  Each shard needs a share of at least 1 and at
    most ``maximum`` (a shard's own bound, so the error names the whole queue's)."""
    if isinstance(total, bool) or not isinstance(total, int):
        raise ConfigTypeError(f"{what} must be an int, got {type(total).__name__} {total!r}")
    if not shards <= total <= maximum * shards:
        raise ConfigError(
            f"{what} of a queue with {shards} shards must be from {shards} to {maximum * shards:,}, got {total!r}"
        )
    base, extra = divmod(total, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def encode_cursor(shard: int, inner: str | None) -> str | None:
    return None if inner is None else f"{shard}/{inner}"


def decode_cursor(cursor: str | None, shards: int) -> tuple[int, str | None]:
    """``(shard, that shard's cursor)``; None starts at shard 0."""
    if cursor is None or cursor == "":
        return 0, None
    head, sep, inner = cursor.partition("/") if isinstance(cursor, str) else ("", "", "")
    if not sep or not head.isdigit() or int(head) >= shards:
        raise ConfigError(f"invalid cursor {cursor!r} for {shards} shards")
    return int(head), inner
