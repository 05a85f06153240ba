"""Optional OpenTelemetry tracing (the ``otel`` extra): W3C trace context from producer to worker.

Off unless asked for (``tracing=True`` on ``Queue``/``SyncQueue``/``Worker``, or the
``CHASQUI_OTEL=1`` environment variable) *and* ``opentelemetry-api`` imports.  Nothing here
imports OpenTelemetry until then, and callers keep a single boolean (or None) per object, so
tracing costs nothing when off.  The tracer comes from the global provider: configure the
SDK (exporter, sampler) as for any instrumented library.

On the wire the producer's span context rides as an extra stream field ``tp`` (the W3C
``traceparent`` string) next to ``d`` and ``n``; ChasquiMQ readers locate fields by name and
ignore unknown ones (wire spec 3.1).  Delayed members and DLQ entries have a fixed layout, so
they carry no context: a delayed add starts a new trace in the worker.  A retry keeps its
trace through a side key ``{chasqui:<queue>}:trace:<job_id>`` (the producer's context and the
failed attempt's span), written by the worker when it schedules the retry, read once by the
attempt that follows, and expiring with the backoff plus an hour.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ENV", "wanted", "available", "Tracer", "tracer", "TRACE_KEY_TTL_MS"]

ENV = "CHASQUI_OTEL"
_TRUE = {"1", "true", "yes", "on"}
TRACE_KEY_TTL_MS = 3600 * 1000  # beyond the retry's backoff: how long a retry waits for its context
_NAME = "airflow_provider_chasqui"
_OUTCOMES = ("completed", "retry", "cancelled", "rate_limited")
_api: Any = None  # the resolved module namespace, False when OpenTelemetry is missing


def wanted(flag: bool | None) -> bool:
    """The explicit ``tracing=`` argument, else ``CHASQUI_OTEL``."""
    if flag is not None:  # checked by the constructors (core.settings.check_flags): this module imports none
        return bool(flag)
    return os.environ.get(ENV, "").strip().lower() in _TRUE


def available() -> bool:
    """Whether ``opentelemetry-api`` imports (resolved once per process)."""
    global _api
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        except ImportError:
            _api = False
        else:
            _api = _Api(context, propagate, trace, Link, SpanKind, Status, StatusCode)
    return _api is not False


class _Api:
    __slots__ = ("context", "propagate", "trace", "Link", "SpanKind", "Status", "StatusCode")

    def __init__(self, *mods: Any) -> None:
        for slot, mod in zip(self.__slots__, mods):
            setattr(self, slot, mod)


def tracer(flag: bool | None = None) -> Tracer | None:
    """A :class:`Tracer` when tracing is wanted and OpenTelemetry imports, else None."""
    return Tracer() if wanted(flag) and available() else None


class Tracer:
    """The few span operations the queue, the worker and the Airflow operators need."""

    def __init__(self) -> None:
        self.api = _api
        self._tracer = _api.trace.get_tracer(_NAME)

    # ---- context <-> traceparent --------------------------------------------------------
    def carrier(self, ctx: Any = None) -> dict[str, str]:
        """The W3C headers (``traceparent``, maybe ``tracestate``) of ``ctx`` (default: current)."""
        out: dict[str, str] = {}
        self.api.propagate.inject(out, context=ctx)
        return out

    def traceparent(self, ctx: Any = None) -> str | None:
        return self.carrier(ctx).get("traceparent")

    def extract(self, traceparent: str | bytes | None) -> Any:
        """The context a ``traceparent`` names (an invalid or empty one gives an empty context)."""
        if isinstance(traceparent, (bytes, bytearray)):
            traceparent = bytes(traceparent).decode("ascii", "replace")
        if not traceparent:
            return self.api.context.Context()
        return self.api.propagate.extract({"traceparent": traceparent})

    def has_current_span(self) -> bool:
        valid: bool = self.api.trace.get_current_span().get_span_context().is_valid
        return valid

    # ---- spans --------------------------------------------------------------------------
    @contextmanager
    def span(
        self,
        name: str,
        *,
        kind: str = "INTERNAL",
        parent: str | bytes | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        """A current span (child of ``parent`` when given, else of the current span)."""
        ctx = self.extract(parent) if parent else None
        with self._tracer.start_as_current_span(
            name, context=ctx, kind=getattr(self.api.SpanKind, kind), attributes=attributes
        ) as span:
            yield span

    def produce(self, queue: str, name: str) -> Any:
        """The PRODUCER span of one add; its traceparent goes into the job."""
        return self.span(
            f"chasqui enqueue {name}",
            kind="PRODUCER",
            attributes={
                "messaging.system": "chasqui",
                "messaging.operation.type": "send",
                "messaging.destination.name": queue,
                "chasqui.job.name": name,
            },
        )

    def start_consume(
        self,
        queue: str,
        job_id: str,
        name: str,
        attempt: int,
        parent: bytes | str | None,
        previous: bytes | str | None = None,
    ) -> tuple[Any, Any]:
        """Start and make current the CONSUMER span of one attempt: a child of the producer's
        span (``parent``), linked to the previous attempt's span (``previous``) on a retry.
        Returns ``(span, token)`` for :meth:`end_consume` (same task or thread)."""
        api = self.api
        links = []
        if previous:
            prev = api.trace.get_current_span(self.extract(previous)).get_span_context()
            if prev.is_valid:
                links.append(api.Link(prev, {"chasqui.link": "previous_attempt"}))
        span = self._tracer.start_span(
            f"chasqui process {name}",
            context=self.extract(parent),
            kind=api.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "chasqui",
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": job_id,
                "chasqui.job.id": job_id,
                "chasqui.job.name": name,
                "chasqui.job.attempt": attempt,
            },
        )
        token = api.context.attach(api.trace.set_span_in_context(span))
        return span, token

    def end_consume(self, span: Any, token: Any, outcome: str, exc: BaseException | None = None) -> None:
        api = self.api
        try:
            if outcome not in _OUTCOMES:  # a DLQ reason: retries_exhausted, unrecoverable, routing_failed
                span.set_attribute("chasqui.dlq.reason", outcome)
                outcome = "dlq"
            span.set_attribute("chasqui.job.outcome", outcome)
            if exc is not None:
                span.record_exception(exc)
                span.set_status(api.Status(api.StatusCode.ERROR, f"{type(exc).__name__}: {outcome}"))
            span.end()
        finally:
            try:
                api.context.detach(token)
            except Exception:  # noqa: BLE001 - a detach from another context only logs in the API
                pass


# ---- Airflow: the operators, the sensor and the trigger ------------------------------------
#: The XCom key under which the enqueue operator leaves its task's traceparent (tracing on only):
#: a ``ChasquiJobSensor`` reading the ids from that task continues the same trace.
TRACE_XCOM_KEY = "chasqui_traceparent"


@contextmanager
def airflow_task_span(context: Any, parent: Any = None) -> Iterator[str | None]:
    """Within an Airflow task's ``execute``: Airflow's own task span when Airflow tracing made one
    current, else a span of ours for the task (a child of ``parent``, a callable giving a
    traceparent, when it gives one); yields that span's traceparent (None when tracing is off),
    which a deferral hands to the trigger.  Deferring (an exception) is not an error."""
    t = tracer()
    if t is None:
        yield None
        return
    if t.has_current_span():
        yield t.traceparent()
        return
    ti = context.get("ti") if hasattr(context, "get") else None
    name = f"airflow task {getattr(ti, 'dag_id', '?')}.{getattr(ti, 'task_id', '?')}"
    upstream = parent() if parent is not None else None
    ctx = t.extract(upstream) if isinstance(upstream, str) and upstream else None
    with t._tracer.start_as_current_span(
        name,
        context=ctx,
        record_exception=False,
        set_status_on_exception=False,
        attributes={
            "airflow.dag_id": str(getattr(ti, "dag_id", "")),
            "airflow.task_id": str(getattr(ti, "task_id", "")),
            "airflow.dag_run.run_id": str(getattr(ti, "run_id", "")),
        },
    ):
        yield t.traceparent()


@contextmanager
def trigger_span(traceparent: str | None, queue: str, job_ids: list[str]) -> Iterator[str | None]:
    """The trigger's wait, a child of the deferring task's span; yields its traceparent for the event."""
    t = tracer() if traceparent else None
    if t is None:
        yield None
        return
    with t.span(
        f"chasqui wait {queue}",
        parent=traceparent,
        attributes={
            "messaging.system": "chasqui",
            "messaging.destination.name": queue,
            "chasqui.job.ids": list(job_ids)[:100],
        },
    ):
        yield t.traceparent()


@contextmanager
def resume_span(event: Any, task_id: str) -> Iterator[None]:
    """The task's resumption after its trigger fired, a child of the trigger's wait span."""
    parent = event.get("traceparent") if isinstance(event, dict) else None
    t = tracer() if parent else None
    if t is None:
        yield
        return
    with t.span(
        f"chasqui resume {task_id}", parent=parent, attributes={"chasqui.status": str(event.get("status", ""))}
    ):
        yield
