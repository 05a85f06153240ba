"""OpenTelemetry tracing against real Redis, spans caught by the SDK's in-memory exporter.

A traced producer's span is the parent of the worker's CONSUMER span (through the ``tp`` stream
field); each attempt of a retried job is its own span, in the producer's trace and linked to
the failed attempt before it (through the side key); a failure is recorded on the span.
Without tracing nothing of OpenTelemetry is imported (checked in a fresh interpreter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from engine_support import running, stream_entries, wait_until
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from airflow_provider_chasqui import UnrecoverableError
from airflow_provider_chasqui.sync.queue import SyncQueue
from airflow_provider_chasqui.tracing import TRACE_KEY_TTL_MS

pytestmark = pytest.mark.single_node("tracing is per entry: the cluster adds nothing but minutes")

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="session", autouse=True)
def _provider() -> None:
    """The SDK as the process' global provider (settable once per process: kept if present).
    Once per session, not per module: in a shuffled run the module's tests are spread out, a
    module fixture is set up again each time, and every setup added one more span processor,
    so each span was exported twice, three times... (issue 29, seed 197530602)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture(autouse=True)
def _clear() -> None:
    EXPORTER.clear()


def _spans(queue: str, prefix: str) -> list:
    return [
        s
        for s in EXPORTER.get_finished_spans()
        if s.name.startswith(prefix) and s.attributes.get("messaging.destination.name") == queue
    ]


@pytest.mark.timeout(60)
async def test_consumer_span_is_a_child_of_the_producer_span(redis_url, queue_name, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url, tracing=True)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("dag task") as task:
        job = await q.add("greet", {"who": "ada"})
        with_opts = await q.add("greet", {"who": "bob"}, attempts=2)  # the flow path (not quick_add)
    (_, fields), (_, fields2) = stream_entries(redis_url, queue_name)
    assert set(fields) == {"d", "n", "tp"} and set(fields2) == {"d", "n", "tp"}
    assert fields["tp"].decode().startswith(f"00-{task.get_span_context().trace_id:032x}-")
    seen = []

    async def handler(j):
        seen.append((j.id, trace.get_current_span().get_span_context().span_id))
        return j.data["who"]

    async with running(worker_factory(queue_name, handler, redis_url, tracing=True)):
        await wait_until(lambda: len(_spans(queue_name, "chasqui process")) == 2, what="two consumer spans")
    producers = {s.attributes["messaging.message.id"]: s for s in _spans(queue_name, "chasqui enqueue")}
    consumers = {s.attributes["chasqui.job.id"]: s for s in _spans(queue_name, "chasqui process")}
    for jid in (job.id, with_opts.id):
        p, c = producers[jid], consumers[jid]
        assert p.kind is SpanKind.PRODUCER and p.parent.span_id == task.get_span_context().span_id
        assert c.kind is SpanKind.CONSUMER
        assert c.context.trace_id == p.context.trace_id and c.parent.span_id == p.context.span_id
        assert c.attributes["chasqui.job.name"] == "greet" and c.attributes["chasqui.job.attempt"] == 1
        assert c.attributes["chasqui.job.outcome"] == "completed"
        assert c.attributes["messaging.destination.name"] == queue_name
    # the handler ran inside its consumer span (the current span is the job's)
    assert dict(seen) == {jid: consumers[jid].context.span_id for jid in consumers}


@pytest.mark.timeout(60)
async def test_retries_are_linked_spans_and_failures_are_recorded(
    redis_url, queue_name, queues, worker_factory, clients
) -> None:
    q = queues(queue_name, redis_url, tracing=True)
    job = await q.add("flaky", 1, attempts=3, backoff=0)
    boom = await q.add("boom", 2)

    def handler(j):  # a sync handler: runs in a thread, its span still current there
        assert trace.get_current_span().get_span_context().is_valid
        if j.name == "boom":
            raise UnrecoverableError("no way")
        if j.attempt < 2:
            raise ValueError(f"attempt {j.attempt + 1} fails")
        return "ok"

    async with running(worker_factory(queue_name, handler, redis_url, tracing=True, promoter_poll_ms=20)):
        await wait_until(lambda: len(_spans(queue_name, "chasqui process")) == 4, what="four consumer spans")
    # the side key that carried the trace across retries is bounded by its TTL (SECURITY.md's key table)
    ttl = await clients(redis_url).pttl(q.keys.trace(job.id))
    assert 0 < ttl <= TRACE_KEY_TTL_MS
    (producer,) = [s for s in _spans(queue_name, "chasqui enqueue") if s.attributes["messaging.message.id"] == job.id]
    attempts = sorted(
        (s for s in _spans(queue_name, "chasqui process") if s.attributes["chasqui.job.id"] == job.id),
        key=lambda s: s.attributes["chasqui.job.attempt"],
    )
    assert [s.attributes["chasqui.job.attempt"] for s in attempts] == [1, 2, 3]
    assert [s.attributes["chasqui.job.outcome"] for s in attempts] == ["retry", "retry", "completed"]
    for s in attempts:  # every attempt is a child of the producer's span, in its trace
        assert s.context.trace_id == producer.context.trace_id and s.parent.span_id == producer.context.span_id
    assert not attempts[0].links
    for before, after in zip(attempts, attempts[1:]):  # and linked to the attempt it retries
        assert [link.context.span_id for link in after.links] == [before.context.span_id]
    for s in attempts[:2]:
        assert s.status.status_code is StatusCode.ERROR
        (event,) = [e for e in s.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "ValueError"
        assert "fails" in event.attributes["exception.message"]
    (dead,) = [s for s in _spans(queue_name, "chasqui process") if s.attributes["chasqui.job.id"] == boom.id]
    assert dead.attributes["chasqui.job.outcome"] == "dlq"
    assert dead.attributes["chasqui.dlq.reason"] == "unrecoverable"
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.events[0].attributes["exception.type"].endswith("UnrecoverableError")


@pytest.mark.timeout(60)
async def test_untraced_and_delayed_jobs_start_their_own_trace(redis_url, queue_name, queues, worker_factory) -> None:
    plain = queues(queue_name, redis_url, tracing=False)
    traced = queues(queue_name, redis_url, tracing=True)
    untraced = await plain.add("a", 1)
    delayed = await traced.add("b", 2, delay=1)  # 1 ms: through the delayed set, which carries no context
    assert [set(f) for _, f in stream_entries(redis_url, queue_name)] == [{"d", "n"}]
    async with running(worker_factory(queue_name, lambda j: None, redis_url, tracing=True, promoter_poll_ms=20)):
        await wait_until(lambda: len(_spans(queue_name, "chasqui process")) == 2, what="two consumer spans")
    spans = {s.attributes["chasqui.job.id"]: s for s in _spans(queue_name, "chasqui process")}
    assert spans[untraced.id].parent is None and spans[delayed.id].parent is None
    (producer,) = _spans(queue_name, "chasqui enqueue")
    assert producer.attributes["chasqui.trace_carried"] is False
    assert spans[delayed.id].context.trace_id != producer.context.trace_id


@pytest.mark.timeout(60)
async def test_caller_ids_and_unique_adds_carry_the_trace(redis_url, queue_name, queues) -> None:
    """Immediate adds through the ``add_unique`` script (``job_id=``, ``add_unique``) write ``tp`` too."""
    q = queues(queue_name, redis_url, tracing=True)
    await q.add("x", 1, job_id="my-id")
    await q.add_unique("x", 2, key="k1")
    assert (await q.add_unique("x", 3, key="k1")).data == 3  # suppressed: nothing written
    producers = _spans(queue_name, "chasqui enqueue")
    entries = stream_entries(redis_url, queue_name)
    assert len(entries) == 2 and len(producers) == 3
    ids = {f"{s.context.trace_id:032x}-{s.context.span_id:016x}" for s in producers}
    for _, fields in entries:
        assert set(fields) == {"d", "n", "tp"}
        assert fields["tp"].decode()[3:52] in ids


@pytest.mark.timeout(60)
def test_sync_queue_injects_the_trace_too(redis_url, queue_name) -> None:
    tracer = trace.get_tracer("test")
    with SyncQueue(queue_name, redis_url=redis_url, tracing=True) as q, tracer.start_as_current_span("outer"):
        q.add("x", 1)
    ((_, fields),) = stream_entries(redis_url, queue_name)
    (producer,) = _spans(queue_name, "chasqui enqueue")
    assert fields["tp"].decode().startswith(f"00-{producer.context.trace_id:032x}-{producer.context.span_id:016x}-")


@pytest.mark.timeout(120)
def test_nothing_of_opentelemetry_is_imported_when_tracing_is_off(redis_url, queue_name) -> None:
    """A fresh interpreter: the package, a queue (with an add) and a worker, tracing off; then
    the environment variable with OpenTelemetry blocked from importing: still off, no error.
    redis-py 8 imports ``opentelemetry.sdk`` itself when it is installed (its observability
    module), so what counts is what this package adds to what ``import redis`` loaded."""
    code = textwrap.dedent(f"""
        import sys
        if sys.argv[1] == "blocked":
            sys.modules["opentelemetry"] = None  # import opentelemetry -> ImportError
        import redis, redis.asyncio
        baseline = {{m for m in sys.modules if m.startswith("opentelemetry")}}
        import airflow_provider_chasqui
        from airflow_provider_chasqui import Queue, Worker
        from airflow_provider_chasqui.sync.queue import SyncQueue
        with SyncQueue({queue_name!r}, redis_url={redis_url!r}) as q:
            q.add("n", 1)
        Queue({queue_name!r}, redis_url={redis_url!r})
        w = Worker({queue_name!r}, lambda j: None, redis_url={redis_url!r})
        assert w._tracer is None
        from airflow_provider_chasqui import tracing
        assert tracing._api is (False if sys.argv[1] == "blocked" else None), tracing._api
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") and m not in baseline)
        print("LOADED", loaded)
        assert not loaded, loaded
    """)
    env = {k: v for k, v in os.environ.items() if k != "CHASQUI_OTEL"}
    for mode, extra in (("off", {}), ("blocked", {"CHASQUI_OTEL": "1"})):
        proc = subprocess.run(
            [sys.executable, "-c", code, mode], env={**env, **extra}, capture_output=True, text=True, timeout=90
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "LOADED []" in proc.stdout


@pytest.mark.timeout(60)
async def test_a_left_behind_attempt_s_span_ends_with_its_job_s_outcome(
    redis_url, queue_name, queues, worker_factory
) -> None:
    """A traced handler swallowing its timeout's cancellation is left behind
    (``engine/running_control.py``): its span ends, with the outcome its job was settled with,
    once the handler ends at last; the job behind it gets its own completed span meanwhile."""
    import asyncio

    q = queues(queue_name, redis_url, tracing=True)
    release = asyncio.Event()

    async def handler(j):
        while j.name == "stuck" and not release.is_set():
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                pass
        return "ok"

    async with running(worker_factory(queue_name, handler, redis_url, tracing=True, concurrency=1)):
        stuck = await q.add("stuck", 1, timeout_ms=300, attempts=1)
        quick = await q.add("quick", 2)
        await wait_until(lambda: len(_spans(queue_name, "chasqui process")) == 1, 30, what="the quick job's span")
        assert _spans(queue_name, "chasqui process")[0].attributes["chasqui.job.id"] == quick.id
        release.set()
        await wait_until(lambda: len(_spans(queue_name, "chasqui process")) == 2, 30, what="the stuck job's span")
    span = {s.attributes["chasqui.job.id"]: s for s in _spans(queue_name, "chasqui process")}[stuck.id]
    assert span.attributes["chasqui.job.outcome"] == "dlq"
    assert span.attributes["chasqui.dlq.reason"] == "retries_exhausted"
