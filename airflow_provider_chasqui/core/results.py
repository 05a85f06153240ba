"""What became of jobs, as flows: a result, a failure record, a state, and the wait on the
events stream until jobs end (``Queue.get_result``, ``get_job_state``, ``wait_for_results``
and their twins).  Results and failure records are this project's keys (ChasquiMQ keeps
neither); the wait pins the events stream before it reads the stored outcomes, so a job that
ends in between is found by one or the other (``core/event_hub.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from ..errors import ConfigError, ConfigTypeError, JobFailed, JobNotFound
from .calls import Flow, command, int_reply, reply_pairs, str_reply
from .codec import decode_data
from .event_follow import EventCursor
from .event_hub import (
    Failed,
    JobOutcome,
    Outcome,
    backfill_call,
    backfill_hits,
    completed,
    failed,
    outcome_calls,
    parse_outcomes,
)
from .failure import JobFailure, failure_record
from .job_details import job_details
from .key_types import read_types
from .keys import DEFAULT_GROUP, QueueKeys
from .running import check_job_id, check_job_ids
from .settings import MAX_MS
from .urls import WAIT_BLOCK_MS

__all__ = ["ResultFlows", "check_wait", "single_outcome"]

FAILED_EVENTS_WINDOW = 1000  # events a failure's handler error is looked for in (newest first)


class ResultFlows:
    """``ProducerCore``'s result and state methods (a mixin: it needs the queue's ``keys``)."""

    keys: QueueKeys

    def get_result(self, job_id: str) -> Flow[Any]:
        raw = yield command("GET", self.keys.result(check_job_id(job_id)))
        return None if raw is None else decode_data(raw)

    def get_results(self, job_ids: Iterable[str]) -> Flow[list[Any]]:
        job_ids = check_job_ids(job_ids)
        if not job_ids:
            return []
        raws = yield [command("GET", self.keys.result(j)) for j in job_ids]
        return [None if r is None else decode_data(r) for r in raws]

    def get_failure(self, job_id: str) -> Flow[JobFailure | None]:
        """The job's failure record as a :class:`JobFailure`, or None (no record: the job did
        not end in the DLQ, the record expired, or the worker did not store results)."""
        raw = yield command("GET", self.keys.failure(check_job_id(job_id)))
        return failure_record(job_id, raw)

    def get_job_state(self, job_id: str, *, group: str = DEFAULT_GROUP) -> Flow[str]:
        check_job_id(job_id)
        k = self.keys
        done, failed, cancelled, delayed = yield [
            command("EXISTS", k.result(job_id)),
            command("EXISTS", k.failure(job_id)),
            command("EXISTS", k.cancelled(job_id)),
            command("EXISTS", k.didx(job_id)),
        ]
        if int_reply(done):
            return "completed"
        if int_reply(failed):
            return "failed"
        if int_reply(cancelled):
            return "cancelled"
        if int_reply(delayed):
            return "delayed"
        # not ended, nor delayed under a caller's id: where it is now, as get_job_details finds it
        # (waiting, active, delayed; or ended with no record kept: its events say how)
        try:
            details = yield from job_details(k.queue, job_id, group=group)
        except JobNotFound:
            return "unknown"
        return details.state

    def wait_for_jobs(
        self, job_ids: Iterable[str], timeout_ms: int, clock: Any, *, stop_on_failure: bool = False
    ) -> Flow[dict[str, Outcome]]:
        """Block on the events stream until every id completed or failed.

        Returns ``{id: ("completed", result) | ("failed", reason, detail, traceback)}``; ids still
        running at the deadline are absent.  ``clock()`` gives monotonic ms.  With
        ``stop_on_failure`` it returns as soon as one job is known to have failed.
        """
        pending = set(job_ids)
        k = self.keys
        deadline = clock() + timeout_ms
        failed_ids: list[str] = []
        cursor = EventCursor(k, count=1000)  # the event hub's position, reads and decisions
        cursor.pin((yield cursor.pin_call()))
        outcomes = yield from self._stored_outcomes(sorted(pending))
        pending -= set(outcomes)
        by_job = {j.encode(): j for j in pending}

        def settle(jid: str, outcome: Outcome) -> None:
            pending.discard(jid)
            del by_job[jid.encode()]
            outcomes[jid] = outcome

        def ended(hits: dict[str, tuple[str, str]]) -> None:
            for jid, (kind, reason) in hits.items():
                if jid not in pending:
                    continue
                if kind != "completed":  # dead-lettered, or cancelled
                    failed_ids.append(jid)
                    settle(jid, failed(reason))
                else:
                    settle(jid, completed())

        back = backfill_call(k, sorted(pending)) if pending else None
        if back is not None:  # ended before the pin, with no stored outcome: only the event tells
            ended(backfill_hits((yield back), sorted(pending)))
        while pending and not (stop_on_failure and any(o[0] == "failed" for o in outcomes.values())):
            remaining = deadline - clock()
            if remaining <= 0:
                break
            block = max(1, int(min(remaining, WAIT_BLOCK_MS)))  # within the client's socket timeout
            reply = yield cursor.read_call(block_ms=block)
            ended(cursor.hits(reply, by_job))
            if not reply and cursor.stuck:  # a full events stream: no event comes, the records may
                for jid, outcome in (yield from self._stored_outcomes(sorted(pending))).items():
                    settle(jid, outcome)
                cursor.unstick((yield cursor.end_call()))
        if failed_ids:  # the failure records carry the handler's error as detail
            outcomes.update((yield from self._stored_outcomes(failed_ids)))
        done = [j for j, o in outcomes.items() if o[0] == "completed" and o[1] is None]
        if done:
            values = yield from self.get_results(done)
            for jid, value in zip(done, values):
                outcomes[jid] = completed(value)
        return (yield from self.with_handler_errors(outcomes))

    def with_handler_errors(self, outcomes: Mapping[str, Outcome]) -> Flow[dict[str, Outcome]]:
        """Failures known only from their ``dlq`` event (a worker that keeps no failure records:
        ``store_results`` off) get the handler's error as their detail: the reason of the job's
        newest ``failed`` event among the newest ``FAILED_EVENTS_WINDOW``.  One read, made only
        when such a failure is there; an events key of another type adds nothing."""
        out = dict(outcomes)
        bare = {j for j, o in out.items() if isinstance(o, Failed) and not o.detail and o.value != "cancelled"}
        if not bare or (yield from read_types([self.keys.events]))[self.keys.events] != "stream":
            return out
        rows = yield command("XREVRANGE", self.keys.events, "+", "-", "COUNT", FAILED_EVENTS_WINDOW)
        for _eid, flat in rows or []:
            f = reply_pairs(flat or [])
            jid = str_reply(f.get("id", b""))
            if jid in bare and f.get("e") == b"failed":
                bare.discard(jid)
                o = cast(Failed, out[jid])
                out[jid] = failed(o.value, str_reply(f.get("reason", b"")), o.traceback)
        return out

    def _stored_outcomes(self, job_ids: list[str]) -> Flow[dict[str, Outcome]]:
        if not job_ids:
            return {}
        return parse_outcomes(job_ids, (yield outcome_calls(self.keys, job_ids)))


_MAX_WAIT_S = MAX_MS // 1000


def check_wait(job_ids: object, timeout: object, stop_on_failure: object = False) -> tuple[list[str], int]:
    """A wait's job ids (``running.check_job_ids``) and its timeout in ms: ``ConfigError``
    unless the timeout is a non-negative number of seconds up to ten years (NaN waited forever;
    1e308 s overflowed the conversion to ms) and ``stop_on_failure`` a bool."""
    ids = check_job_ids(job_ids)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= _MAX_WAIT_S:
        raise ConfigError(f"timeout must be a number of seconds from 0 to {_MAX_WAIT_S:,} (ten years), got {timeout!r}")
    if not isinstance(stop_on_failure, bool):
        raise ConfigTypeError(f"stop_on_failure must be True or False, got {stop_on_failure!r}")
    return ids, int(timeout * 1000)


def single_outcome(job_id: str, outcomes: Mapping[str, JobOutcome], timeout: float) -> Any:
    """Turn a ``wait_for_jobs`` answer for one id into a value or an exception."""
    if job_id not in outcomes:
        raise TimeoutError(f"job {job_id} did not finish within {timeout} s")
    outcome = outcomes[job_id]
    if isinstance(outcome, Failed):
        raise JobFailed(job_id, outcome.value, outcome.detail, traceback=outcome.traceback)
    return outcome.value
