"""Every Redis key name the project uses, built in one place.

All keys of a queue share the Cluster hash tag ``{chasqui:<queue>}`` so every Lua script
touches a single slot.  The ChasquiMQ 1.x keys come first; the keys this project adds
(results, unique markers, cursors) live under the same tag and never inside an envelope.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .codec import utf8_text

__all__ = ["QueueKeys", "validate_queue_name", "check_consumer_name", "MAX_QUEUE_NAME_BYTES", "DEFAULT_GROUP"]

MAX_QUEUE_NAME_BYTES = 256
MAX_CONSUMER_NAME_BYTES = 256  # a consumer group's or a consumer's name
DEFAULT_GROUP = "default"
_FORBIDDEN = set("{}\r\n\0")


def validate_queue_name(name: object) -> str:
    """Reject queue names that would break the hash tag or inject into other keys."""
    if not isinstance(name, str):
        raise ConfigError(f"queue name must be a str, got {type(name).__name__}")
    if not name:
        raise ConfigError("queue name must not be empty")
    bad = _FORBIDDEN.intersection(name)
    if bad:
        raise ConfigError(
            f"queue name {name!r} contains {''.join(sorted(bad))!r}: braces and control "
            "characters would break the {chasqui:<queue>} hash tag"
        )
    if len(utf8_text(name, "queue name")) > MAX_QUEUE_NAME_BYTES:
        raise ConfigError(f"queue name is longer than {MAX_QUEUE_NAME_BYTES} bytes")
    return name


def check_consumer_name(value: object, what: str = "group") -> str:
    """A consumer group's (or consumer's) name: a non-empty str of at most
    ``MAX_CONSUMER_NAME_BYTES`` UTF-8 bytes.  Checked where a user gives one, so a bad name is
    a ``ConfigError`` at the call, not a worker failing every read."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty str, got {value!r}")
    if len(utf8_text(value, what)) > MAX_CONSUMER_NAME_BYTES:
        raise ConfigError(f"{what} is longer than {MAX_CONSUMER_NAME_BYTES} bytes")
    return value


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key set of one queue.  Construct through :meth:`for_queue` to validate the name."""

    queue: str
    prefix: str

    @classmethod
    def for_queue(cls, queue: str) -> QueueKeys:
        validate_queue_name(queue)
        return cls(queue=queue, prefix="{chasqui:" + queue + "}")

    # --- ChasquiMQ 1.x layout -------------------------------------------------------
    @property
    def stream(self) -> str:
        return self.prefix + ":stream"

    @property
    def delayed(self) -> str:
        return self.prefix + ":delayed"

    @property
    def dlq(self) -> str:
        return self.prefix + ":dlq"

    @property
    def events(self) -> str:
        return self.prefix + ":events"

    @property
    def promoter_lock(self) -> str:
        return self.prefix + ":promoter:lock"

    @property
    def scheduler_lock(self) -> str:
        return self.prefix + ":scheduler:lock"

    @property
    def repeat(self) -> str:
        return self.prefix + ":repeat"

    def repeat_spec(self, spec_key: str) -> str:
        return self.prefix + ":repeat:spec:" + spec_key

    def dlid(self, job_id: str) -> str:
        return self.prefix + ":dlid:" + job_id

    def didx(self, job_id: str) -> str:
        return self.prefix + ":didx:" + job_id

    # --- extensions of this project (same hash tag, extra keys only) ----------------
    def result(self, job_id: str) -> str:
        """msgpack of the handler's return value (opt-in, with a TTL, the newest
        ``results_max_len`` kept)."""
        return self.prefix + ":result:" + job_id

    @property
    def results(self) -> str:
        """ZSET of the stored result ids (score = time stored): the count cap's index."""
        return self.prefix + ":results"

    def failure(self, job_id: str) -> str:
        """msgpack ``[reason, detail, finished_ms]`` of a job that ended in the DLQ (opt-in,
        with a TTL, the newest ``failures_max_len`` kept)."""
        return self.prefix + ":failure:" + job_id

    @property
    def failures(self) -> str:
        """ZSET of the failure record ids (score = time written): the count cap's index."""
        return self.prefix + ":failures"

    def unique(self, unique_key: str) -> str:
        """Marker of ``add_unique``: holds the first job id for the window."""
        return self.prefix + ":unique:" + unique_key

    def cursor(self, name: str) -> str:
        """A consumer cursor kept in Redis (event-driven DAG triggers)."""
        return self.prefix + ":cursor:" + name

    @property
    def beats(self) -> str:
        """ZSET consumer name -> until when its worker counts as alive (ms): heartbeats (``core/liveness.py``)."""
        return self.prefix + ":beats"

    def worker(self, consumer: str) -> str:
        """A worker's identity (JSON: host, pid, version, handlers...), renewed with its heartbeat."""
        return self.prefix + ":worker:" + consumer

    @property
    def cancel_requests(self) -> str:
        """HASH job id -> when the request lapses (ms): jobs to cancel when a worker meets them."""
        return self.prefix + ":cancel"

    def cancelled(self, job_id: str) -> str:
        """A job that ended cancelled (the time, ms), kept like a failure record."""
        return self.prefix + ":cancelled:" + job_id

    def dedup(self, dedup_id: str) -> str:
        """A deduplication id's marker (``core/dedup.py``): its job and, debounced, its delayed member."""
        return self.prefix + ":dedup:" + dedup_id

    def progress(self, job_id: str) -> str:
        """A job's latest progress (msgpack), reported by its handler; TTL a day."""
        return self.prefix + ":progress:" + job_id

    def logs(self, job_id: str) -> str:
        """LIST of a job's log lines (``core/job_logs.py``), the newest 1000; TTL a day."""
        return self.prefix + ":logs:" + job_id

    def history(self, hour: int) -> str:
        """HASH of the jobs settled per minute in one UTC hour (``core/history.py``); 8 days."""
        return self.prefix + ":history:" + str(hour)

    def origin(self, job_id: str) -> str:
        """Which Airflow DAG run and task enqueued the job (``core/origin.py``); TTL a week."""
        return self.prefix + ":origin:" + job_id

    def spec_origin(self, spec_key: str) -> str:
        """Which Airflow DAG run and task last upserted the spec (``core/origin.py``); TTL 30 days."""
        return self.prefix + ":spec-origin:" + spec_key

    def job_timeout(self, job_id: str) -> str:
        """A job's own ``timeout_ms`` (``core/running.py``), while the job waits, runs or retries."""
        return self.prefix + ":to:" + job_id

    def trace(self, job_id: str) -> str:
        """A retried job's trace context, from its failed attempt to the next (``tracing``)."""
        return self.prefix + ":trace:" + job_id

    def spark_load(self, load_id: str) -> str:
        """The summary of one Spark load (``format("chasqui")`` writes with a ``loadId``)."""
        return self.prefix + ":spark:load:" + load_id

    def aside(self, what: str, token: str) -> str:
        """Where a drain (``draining``) or an obliterate (``obliterating:<index>``) moves a key
        before it empties it in chunks; gone when the operation ends."""
        return self.prefix + ":" + what + ":" + token

    @property
    def controls(self) -> str:
        """HASH of the queue's flow controls (``paused``, ``rate_max``, ``rate_per_ms``,
        ``concurrency``), obeyed by
        every worker (``controls.py``)."""
        return self.prefix + ":controls"

    @property
    def blocked(self) -> str:
        """A marker whose TTL is how long no worker starts a job of the queue (a handler raised
        ``RateLimited``); the longest block wins (``PEXPIRE ... GT``)."""
        return self.prefix + ":blocked"

    @property
    def rate(self) -> str:
        """HASH of the rate limit's current window (``w``) and what it granted (``n``): ``take_starts.lua``."""
        return self.prefix + ":rate"

    @property
    def prioritized(self) -> str:
        """ZSET of the jobs added with a priority, waiting to enter the stream (member as in
        ``delayed``; score = priority * 2**37 + sequence): ``core/priorities.py``."""
        return self.prefix + ":prioritized"

    @property
    def groups(self) -> str:
        """ZSET of the job groups with waiting jobs, in turn order (score = turn): the round
        robin of ``lua/take_grouped.lua`` (``core/groups.py``)."""
        return self.prefix + ":groups"

    @property
    def group_limits(self) -> str:
        """HASH of the per-group limits (``Queue.set_group_limits``): ``c:<group>`` and ``dc``
        (concurrency of one group / of every group), ``r:<group>`` and ``dr`` (``max:per_ms``)."""
        return self.prefix + ":group_limits"

    def group_jobs(self, group: str) -> str:
        """LIST of one group's waiting jobs (members as in ``delayed``), oldest first."""
        return self.prefix + ":group:" + group

    def group_running(self, group: str) -> str:
        """ZSET of one group's concurrency slots (entry id -> end of lease), as ``running``."""
        return self.prefix + ":grun:" + group

    def group_rate(self, group: str) -> str:
        """HASH of one group's rate window (``w``, ``n``), as ``rate``."""
        return self.prefix + ":grate:" + group

    def group_blocked(self, group: str) -> str:
        """A marker whose TTL is how long one group starts nothing (``RateLimited`` in that group)."""
        return self.prefix + ":gblocked:" + group

    @property
    def running(self) -> str:
        """ZSET of the concurrency slots: one member per running entry (its entry id), scored
        with the end of its lease in server ms (``take_starts.lua``, ``renew_slots.lua``)."""
        return self.prefix + ":running"

    # Repeatable specs add no per-spec key: their overrides and deadline live in the spec
    # hash's ``ext`` field, and a fire's identity (spec key + scheduled time) is claimed by a
    # compare-and-set on the spec's score in ``repeat`` (see lua/schedule_batch.lua).
    @property
    def repeat_paused(self) -> str:
        """ZSET of paused spec keys (score = the next fire they had when paused)."""
        return self.prefix + ":repeat:paused"

    @property
    def repeat_quarantine(self) -> str:
        """HASH spec_key -> raw bytes of stored specs that could not be decoded."""
        return self.prefix + ":repeat:quarantine"
