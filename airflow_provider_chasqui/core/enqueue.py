"""The public ``Queue``/``SyncQueue`` arguments mapped to flows (:class:`QueueFlows`): which
options a job may combine, ``add_bulk``'s items, unique and deduplicated adds, and which of the
producer core's paths (``core/producer.py``) each add takes.  Shared by both twins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from ..errors import ConfigError
from .backoff import build_retry_override
from .calls import Call, Flow, Pause, Stream, script_call, str_reply
from .codec import encode_data, encode_member, encode_new_envelope, items_list, new_job_ids, now_ms
from .dedup import check_dedup, dedup_call
from .dlq import positive
from .groups import add_grouped_call, check_group
from .priorities import add_prioritized_call, check_priority
from .producer import BULK_CHUNK, PreparedJob, ProducerCore
from .running import FIRST_MARK_WAIT_SECS, check_timeout_ms, timeout_calls

__all__ = ["AddRoute", "QueueFlows", "bulk_item", "unique_key_for"]

STREAM_CHUNK = 250  # add_bulk's plain path: jobs per streamed script call (measured: 1.25x over 1,000)
# an envelope's bytes besides the job's data: array, 26-char id, bin header, created_at, attempt
_ENVELOPE_OVERHEAD = 64
_BULK_KEYS = {
    "name",
    "data",
    "delay",
    "delay_ms",
    "attempts",
    "backoff",
    "job_id",
    "repeat",
    "priority",
    "group",
    "timeout_ms",
}


def bulk_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one ``add_bulk`` dict (chasquimq's keys)."""
    if type(item) is not dict and not isinstance(item, Mapping):  # the ABC check is slow: dicts skip it
        raise ConfigError(f"add_bulk items must be dicts, got {type(item).__name__}")
    if not item.keys() <= _BULK_KEYS:
        unknown = set(item) - _BULK_KEYS
        raise ConfigError(f"unknown add_bulk keys {sorted(unknown)}; allowed: {sorted(_BULK_KEYS)}")
    if "name" not in item or "data" not in item:
        raise ConfigError("every add_bulk item needs 'name' and 'data'")
    return dict(item)


def _side_lane(what: str, value: Any, options: Mapping[str, Any]) -> None:
    """A valid ``priority`` or ``group``, on a job that can have one: an immediate job without a
    caller id (a delayed one, or one whose id must be deduplicated, enters the stream by another
    path), and not both."""
    if what == "priority":
        check_priority(value)
    else:
        check_group(value)
    for option in ("delay", "delay_ms", "job_id", "group"):
        if option != what and options.get(option) is not None:
            raise ConfigError(
                f"{what} cannot be combined with {option} (such a job waits beside the stream, added now)"
            )


def _row(job_id: str, created_at_ms: int, name: str, data: Any) -> tuple[str, int, str, Any]:
    return job_id, created_at_ms, name, data


def unique_key_for(name: str, inner: bytes) -> str:
    """Default ``add_unique`` key when the caller gives neither key nor job id."""
    return hashlib.sha1(name.encode() + b"\0" + inner).hexdigest()


@dataclass(frozen=True, slots=True)
class AddRoute:
    """Where one ``add`` that is not the plain quick add goes; the twins act on it with their own
    I/O: run ``flow`` (returns ``(job_id, created_at_ms)``), or add inside a PRODUCER span with
    the ``traced`` options, or upsert a repeatable spec with the ``upsert`` options."""

    flow: Flow[tuple[str, int]] | None = None
    traced: dict[str, Any] | None = None
    upsert: dict[str, Any] | None = None


class QueueFlows(ProducerCore):
    """The public ``Queue``/``SyncQueue`` arguments mapped to flows, shared by both twins."""

    def add_route(
        self,
        name: str,
        data: Any,
        *,
        traced: bool,
        delay: Any,
        delay_ms: Any,
        attempts: Any,
        backoff: Any,
        job_id: str | None,
        repeat: Any,
        missed_fires: Any,
        priority: int | None,
        group: str | None,
        timeout_ms: Any,
        dedup_id: str | None,
        dedup_mode: str,
        dedup_ttl_ms: Any,
    ) -> AddRoute:
        """``Queue.add``'s choice of path (``traced``: the queue traces its adds): a
        deduplicated add (with ``repeat`` every fire is deduplicated instead), a traced add (not
        beside the stream, no spec), a spec upsert, or an add by :meth:`enqueue`."""
        if dedup_id is not None and repeat is None:
            others = {"delay": delay, "delay_ms": delay_ms, "job_id": job_id, "repeat": repeat}
            others.update(priority=priority, group=group, missed_fires=missed_fires)
            flow = self.enqueue_dedup(
                name,
                data,
                dedup_id=dedup_id,
                dedup_mode=dedup_mode,
                dedup_ttl_ms=dedup_ttl_ms,
                attempts=attempts,
                backoff=backoff,
                timeout_ms=timeout_ms,
                others=others,
            )
            return AddRoute(flow=flow)
        side = priority is not None or group is not None  # waits beside the stream: no trace
        common = {"attempts": attempts, "backoff": backoff, "job_id": job_id, "timeout_ms": timeout_ms}
        if traced and repeat is None and missed_fires is None and not side:
            return AddRoute(traced={"delay": delay, "delay_ms": delay_ms, **common})
        if repeat is not None:
            if delay is not None or delay_ms is not None:
                raise ConfigError(
                    "delay/delay_ms do not apply to a repeatable spec (repeat=): it fires on its pattern; "
                    "use upsert_repeatable_job(..., start_after=...) to hold its first fire back"
                )
            upsert = {"repeat": repeat, "missed_fires": missed_fires, "priority": priority, "group": group}
            upsert.update(dedup_id=dedup_id, dedup_mode=dedup_mode, dedup_ttl_ms=dedup_ttl_ms)
            return AddRoute(upsert={**common, **upsert})
        if missed_fires is not None:
            raise ConfigError("missed_fires is only meaningful together with repeat=")
        flow = self.enqueue(name, data, delay=delay, delay_ms=delay_ms, priority=priority, group=group, **common)
        return AddRoute(flow=flow)

    def enqueue(
        self,
        name: str,
        data: Any,
        *,
        delay: Any = None,
        delay_ms: Any = None,
        attempts: Any = None,
        backoff: Any = None,
        job_id: str | None = None,
        trace: str | None = None,
        priority: int | None = None,
        group: str | None = None,
        timeout_ms: Any = None,
    ) -> Flow[tuple[str, int]]:
        """Returns ``(job_id, created_at_ms)``.  ``trace``: see :meth:`add` (a prioritized or
        grouped job carries none).  ``priority``: ``core/priorities.py``; ``group``:
        ``core/groups.py``; ``timeout_ms``: ``core/running.py`` (kept just before the add)."""
        options = {"delay": delay, "delay_ms": delay_ms, "job_id": job_id}
        if priority is not None:
            _side_lane("priority", priority, {**options, "group": group})
        if group is not None:
            _side_lane("group", group, options)
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(
            name, data, delay=delay, delay_ms=delay_ms, retry=build_retry_override(attempts, backoff), job_id=job_id
        )
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        side = None  # beside the stream (checked above: not both)
        if priority is not None:
            side = add_prioritized_call(self.keys, [(priority, encode_member(job.name_bytes, job.envelope))])
        elif group is not None:
            side = add_grouped_call(self.keys, [(group, encode_member(job.name_bytes, job.envelope))])
        if side is not None:
            yield side
            return job.id, job.created_at_ms
        jid = yield from (self.add_with_id(job, trace) if job_id is not None else self.add(job, trace))
        return jid, job.created_at_ms

    def enqueue_dedup(
        self,
        name: str,
        data: Any,
        *,
        dedup_id: Any,
        dedup_mode: Any,
        dedup_ttl_ms: Any,
        attempts: Any = None,
        backoff: Any = None,
        timeout_ms: Any = None,
        others: Mapping[str, Any] | None = None,
    ) -> Flow[tuple[str, int]]:
        """``add(..., dedup_id=)`` (``core/dedup.py``): returns ``(job_id, created_at_ms)``, the
        first job's id when a throttled repeat added nothing.  ``others``: the ``add`` options
        a deduplicated job cannot take, each of which must be None."""
        clash = sorted(k for k, v in (others or {}).items() if v is not None)
        if clash:
            raise ConfigError(f"dedup_id cannot be combined with {', '.join(clash)}")
        did, mode, ttl = check_dedup(dedup_id, dedup_mode, dedup_ttl_ms)
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(name, data, retry=build_retry_override(attempts, backoff))
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        reply = yield dedup_call(
            self.keys,
            did,
            mode,
            ttl,
            job_id=job.id,
            envelope=job.envelope,
            name=job.name_bytes,
            member=encode_member(job.name_bytes, job.envelope) if mode == "debounce" else b"",
            max_stream_len=self.settings.max_stream_len,
            events_max=self.settings.events_max_len,
        )
        return str_reply(reply[1]), job.created_at_ms

    def enqueue_unique(
        self,
        name: str,
        data: Any,
        *,
        job_id: str | None,
        key: str | None,
        window_ms: int,
        delay: Any = None,
        delay_ms: Any = None,
        attempts: Any = None,
        backoff: Any = None,
        trace: str | None = None,
        timeout_ms: Any = None,
    ) -> Flow[tuple[str, int]]:
        positive(window_ms, "window")
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(
            name, data, delay=delay, delay_ms=delay_ms, retry=build_retry_override(attempts, backoff), job_id=job_id
        )
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        inner = encode_data(data)
        jid = yield from self.add_unique(job, key or job_id or unique_key_for(name, inner), window_ms, trace)
        return jid, job.created_at_ms

    def enqueue_bulk(self, items: Iterable[Mapping[str, Any]], make: Any = None) -> Flow[list[Any]]:
        """Returns ``make(job_id, created_at_ms, name, data)`` of each item, in order (by default
        that tuple); caller ids go in one pipeline."""
        items = items_list(items, "jobs")
        make = make or _row
        if not items:
            return []
        plain = self._plain_bulk(items)
        if plain is not None:  # every item just name and data: the common case, streamed
            return (yield from self._plain_bulk_flow(items, *plain, make))
        checked = [bulk_item(i) for i in items]
        if any(i.get("repeat") is not None for i in checked):
            raise ConfigError("add_bulk does not take 'repeat'; use upsert_repeatable_job")
        for i in checked:
            if i.get("priority") is not None:
                _side_lane("priority", i["priority"], i)
            if i.get("group") is not None:
                _side_lane("group", i["group"], i)
        limits = [None if i.get("timeout_ms") is None else check_timeout_ms(i["timeout_ms"]) for i in checked]
        now = now_ms()
        prepared = []
        for i in checked:
            prepared.append(
                self.prepare(
                    i["name"],
                    i["data"],
                    delay=i.get("delay"),
                    delay_ms=i.get("delay_ms"),
                    retry=build_retry_override(i.get("attempts"), i.get("backoff")),
                    job_id=i.get("job_id"),
                    now=now,
                )
            )
        timed = [(p, ms) for p, ms in zip(prepared, limits) if ms is not None]
        if timed:
            yield from self._keep_timeouts(timed)
        urgent = [(i["priority"], p) for i, p in zip(checked, prepared) if i.get("priority") is not None]
        grouped = [(i["group"], p) for i, p in zip(checked, prepared) if i.get("group") is not None]
        side: list[Call] = []  # one script call per BULK_CHUNK, FIFO in the items' order
        for lane, make_call in ((urgent, add_prioritized_call), (grouped, add_grouped_call)):
            members = [(key, encode_member(p.name_bytes, p.envelope)) for key, p in lane]
            side += [make_call(self.keys, members[c : c + BULK_CHUNK]) for c in range(0, len(members), BULK_CHUNK)]
        if side:
            yield side
            aside = {id(p) for _key, p in urgent + grouped}
            prepared_rest = [(i, p) for i, p in zip(checked, prepared) if id(p) not in aside]
        else:
            prepared_rest = list(zip(checked, prepared))
        if not any(i.get("job_id") is not None for i, _p in prepared_rest):
            yield from self.add_bulk([p for _i, p in prepared_rest])
            return [make(p.id, p.created_at_ms, i["name"], i["data"]) for i, p in zip(checked, prepared)]
        plain_jobs = [p for i, p in prepared_rest if i.get("job_id") is None]
        yield from self.add_bulk(plain_jobs)
        with_id = [p for i, p in prepared_rest if i.get("job_id") is not None]
        replies = iter((yield [self._with_id_call(p) for p in with_id]))  # one pipeline for all of them
        jobs = []
        for i, p in zip(checked, prepared):
            jid = self._with_id_reply(p, next(replies)) if i.get("job_id") is not None else p.id
            jobs.append(make(jid, p.created_at_ms, i["name"], i["data"]))
        return jobs

    def _keep_timeouts(self, jobs: list[tuple[PreparedJob, int]]) -> Flow[None]:
        """Keep each job's own timeout (``core/running.py``), in one pipeline before the add.
        The first time a queue gets one, wait until every worker's cached controls must show
        the ``timeouts`` field, so no worker can take this job without reading its timeout."""
        due = [(j.id, ms, 0 if j.run_at_ms is None else j.run_at_ms - j.created_at_ms) for j, ms in jobs]
        replies = yield timeout_calls(self.keys, due)
        if replies and replies[-1] == 1:  # HSET made the field: the queue's first job with a timeout
            yield Pause(FIRST_MARK_WAIT_SECS)

    def _plain_bulk(self, items: list[Mapping[str, Any]]) -> tuple[list[bytes], list[bytes], int] | None:
        """``(name bytes, encoded data, now)`` when every item is a dict of exactly ``name`` and
        ``data``, validated as ``prepare`` validates them (every error is raised here, before
        anything is sent), else None."""
        now = now_ms()
        near_limit = self.settings.max_payload_bytes - _ENVELOPE_OVERHEAD
        names = self._names
        name_list: list[bytes] = []
        inners: list[bytes] = []
        for item in items:
            if type(item) is not dict or len(item) != 2 or "name" not in item or "data" not in item:
                return None
            name, data = item["name"], item["data"]
            hit = names.get(name) if type(name) is str else None
            name_list.append((hit or self._name(name))[0])
            inner = encode_data(data)
            if len(inner) > near_limit:
                self.prepare(name, data, now=now)  # the exact check: raises prepare()'s own error
            inners.append(inner)
        return name_list, inners, now

    def _plain_bulk_flow(
        self, items: list[Mapping[str, Any]], name_list: list[bytes], inners: list[bytes], now: int, make: Any
    ) -> Flow[list[Any]]:
        """Ids and envelopes are made chunk by chunk as the driver sends them, so Redis writes
        one chunk while the next is encoded, and the results are built while it writes the last."""
        jobs: list[Any] = []
        head = (self.settings.max_stream_len,)
        key = (self.keys.stream,)

        def calls() -> Iterator[Call]:
            ids: list[str] = []
            for i in range(0, len(inners), STREAM_CHUNK):
                chunk_ids = new_job_ids(min(STREAM_CHUNK, len(inners) - i), now)
                ids += chunk_ids
                argv: list[Any] = []
                add = argv.extend
                for jid, inner, name_bytes in zip(
                    chunk_ids, inners[i : i + STREAM_CHUNK], name_list[i : i + STREAM_CHUNK]
                ):
                    add((encode_new_envelope(jid, inner, now), name_bytes))  # a rows.EnqueueRow
                yield script_call("enqueue_batch", key, head + tuple(argv))
            jobs.extend(map(make, ids, repeat(now), [i["name"] for i in items], [i["data"] for i in items]))

        yield Stream(calls())
        return jobs
