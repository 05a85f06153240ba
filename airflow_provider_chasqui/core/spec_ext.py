"""A repeatable spec's extensions (this project's, not ChasquiMQ's): the spec hash's optional
``ext`` field, msgpack ``[1, retry_override|nil, deadline_ms|nil, skip_while_paused,
timeout_ms, priority, group, [dedup_id, mode, ttl_ms]]``, trailing items left out when unset
(``core/schedules.py`` describes the storage).  ChasquiMQ ignores the field; a field that does
not decode is a ``CodecError`` naming the item, and the scheduler quarantines the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import CodecError, ConfigError
from .codec import U64_MAX, RetryOverride, decode_envelope
from .dedup import check_dedup
from .groups import check_group
from .priorities import check_priority
from .running import MAX_TIMEOUT_MS

__all__ = ["SpecExt", "NO_EXT", "EXT_VERSION", "side_options", "dedup_option"]

EXT_VERSION = 1
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack


@dataclass(frozen=True, slots=True)
class SpecExt:
    """This project's per-spec extensions, stored in the spec hash's ``ext`` field."""

    retry: RetryOverride | None = None
    deadline_ms: int | None = None
    skip_while_paused: bool = False  # while_paused="skip": fires due while the queue is paused are skipped
    timeout_ms: int | None = None  # every fire's own timeout (core/running.py)
    priority: int | None = None  # every fire's priority (core/priorities.py)
    group: str | None = None  # every fire's group (core/groups.py)
    dedup: tuple[str, str, int] | None = None  # (dedup_id, mode, ttl_ms) of every fire (core/dedup.py)

    @property
    def empty(self) -> bool:
        return (
            self.retry is None
            and self.deadline_ms is None
            and not self.skip_while_paused
            and not self.timeout_ms
            and self.side is None
            and self.dedup is None
        )

    @property
    def side(self) -> tuple[int, str] | None:
        """``(priority or 0, group or "")`` when the fires wait beside the stream, else None."""
        if self.priority is None and self.group is None:
            return None
        return self.priority or 0, self.group or ""

    def encode(self) -> bytes:
        arr: list[Any] = [EXT_VERSION, None if self.retry is None else self.retry.to_wire(), self.deadline_ms]
        side, dedup = self.side is not None, self.dedup is not None
        if self.skip_while_paused or self.timeout_ms or side or dedup:
            arr.append(1 if self.skip_while_paused else 0)
        if self.timeout_ms or side or dedup:
            arr.append(self.timeout_ms)
        if side or dedup:
            arr += (self.priority, self.group)
        if dedup:
            arr.append(list(self.dedup))  # type: ignore[arg-type]
        return _packb(arr)

    @classmethod
    def decode(cls, raw: bytes | None) -> SpecExt:
        if raw is None or raw == b"":
            return NO_EXT
        try:
            arr = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise CodecError(f"spec ext is not valid msgpack: {exc!r}") from exc
        if not isinstance(arr, list) or len(arr) < 3 or arr[0] != EXT_VERSION:
            raise CodecError(f"spec ext must be [{EXT_VERSION}, retry|nil, deadline_ms|nil], got {arr!r}")
        retry = None
        if arr[1] is not None:  # validated by the envelope codec, the field's real home
            retry = decode_envelope(_packb(["", b"", 0, 0, arr[1]])).retry
        deadline = arr[2]
        if deadline is not None and (type(deadline) is not int or not 0 < deadline <= U64_MAX):
            raise CodecError(f"spec ext deadline_ms must be a positive int or nil, got {deadline!r}")
        timeout = arr[4] if len(arr) > 4 else None
        if timeout is not None and (type(timeout) is not int or not 0 < timeout <= MAX_TIMEOUT_MS):
            raise CodecError(f"spec ext timeout_ms must be 1 .. {MAX_TIMEOUT_MS} or nil, got {timeout!r}")
        skip = len(arr) > 3 and type(arr[3]) is int and arr[3] == 1  # else: "queue"
        priority, group, dedup = _decode_lanes(arr)
        return cls(retry, deadline, skip, timeout, priority, group, dedup)


def _decode_lanes(arr: list[Any]) -> tuple[int | None, str | None, tuple[str, str, int] | None]:
    """Items 6-8 of an ext (priority, group, dedup), checked as the options are; a bad one is
    a ``CodecError`` (the scheduler quarantines the spec)."""
    priority = arr[5] if len(arr) > 5 else None
    group = arr[6] if len(arr) > 6 else None
    try:
        side_options(priority, group)
    except ConfigError as exc:
        raise CodecError(f"spec ext priority/group: {exc}") from exc
    raw = arr[7] if len(arr) > 7 else None
    if raw is None:
        return priority, group, None
    try:
        if not isinstance(raw, list) or len(raw) != 3:
            raise ConfigError(f"must be [dedup_id, mode, ttl_ms], got {raw!r}"[:200])
        if type(raw[2]) is not int:
            raise ConfigError(f"ttl_ms must be an int, got {raw[2]!r}")
        return priority, group, dedup_option(raw[0], raw[1], raw[2], priority is not None or group is not None)
    except ConfigError as exc:
        raise CodecError(f"spec ext dedup: {exc}") from exc


def side_options(priority: Any, group: Any) -> bool:
    """Whether a spec's fires wait beside the stream (``ConfigError`` for a bad pair)."""
    if priority is None and group is None:
        return False
    if priority is not None and group is not None:
        raise ConfigError("a spec's fires take a priority or a group, not both (they wait beside the stream)")
    if priority is not None:
        check_priority(priority)
    else:
        check_group(group)
    return True


def dedup_option(dedup_id: Any, mode: Any, ttl_ms: Any, side: bool) -> tuple[str, str, int] | None:
    if dedup_id is None:
        if ttl_ms is not None or mode != "throttle":
            raise ConfigError("dedup_mode and dedup_ttl_ms need dedup_id")
        return None
    if side:
        raise ConfigError("dedup_id cannot be combined with priority or group")
    return check_dedup(dedup_id, mode, ttl_ms)


NO_EXT = SpecExt()
