"""The ``chasqui`` scheme of common-messaging's ``MessageQueueTrigger``.

``MessageQueueTrigger(scheme="chasqui", queue_name=..., mode="queue" | "completion",
job_names=[...], chasqui_conn_id=..., cursor=..., max_batch=100, linger_ms=100,
event_gap_ms=0)`` inside an ``AssetWatcher`` resolves to
:class:`~airflow_provider_chasqui.triggers.queue_events.ChasquiQueueEventTrigger` with those
keyword arguments.  The deprecated URI form is understood too::

    MessageQueueTrigger(queue="chasqui://chasqui_default/files?job_names=file_arrived")
    MessageQueueTrigger(queue="chasqui:///reports?mode=completion&job_names=report,rollup&cursor=nightly")
    MessageQueueTrigger(queue="chasqui:///files?max_batch=500&linger_ms=250")

Each asset event carries one read batch: ``extra["payload"]["jobs"]``, oldest first, at most
``max_batch`` jobs (see the trigger module).

(host = connection id, empty for ``chasqui_default``; path = the queue name, percent-encoded).

Airflow imports this module whenever ``MessageQueueTrigger`` is imported (DAG parsing included),
so it stays light: the trigger module, which pulls in Redis and the engine, is imported only
when a trigger is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise AirflowOptionalProviderFeatureException(
        "The chasqui message-queue provider needs apache-airflow-providers-common-messaging "
        "(pip install 'airflow-provider-chasqui[airflow]')"
    ) from exc

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

__all__ = ["ChasquiMessageQueueProvider", "SCHEME"]

SCHEME = "chasqui"
_INT_KEYS = ("max_batch", "linger_ms", "event_gap_ms")
_URI_KEYS = {"mode", "job_names", "cursor", *_INT_KEYS}


class ChasquiMessageQueueProvider(BaseMessageQueueProvider):
    """Chasqui queues (jobs or completions) as asset-watcher triggers: scheme ``chasqui``."""

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        return urlsplit(queue).scheme == SCHEME

    def trigger_class(self) -> type[BaseEventTrigger]:
        from ..triggers.queue_events import ChasquiQueueEventTrigger

        return ChasquiQueueEventTrigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """``chasqui://[<conn id>]/<queue>[?mode=..&job_names=a,b&cursor=..&max_batch=..&linger_ms=..]``
        -> trigger kwargs.

        Keyword arguments given next to the URI are passed by common-messaging as well, so a
        setting may come from one place only.
        """
        parts = urlsplit(queue)
        if parts.scheme != SCHEME:
            raise ValueError(f"not a chasqui queue URI: {queue!r}")
        try:  # %ff was taken as U+FFFD (unquote replaces what does not decode): a queue never meant
            name = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path, errors="strict")
            query = parse_qs(parts.query, keep_blank_values=False, strict_parsing=False, errors="strict")
            host = unquote(parts.netloc, errors="strict")
        except UnicodeDecodeError:
            raise ValueError(f"{queue!r} holds percent-escapes that are not UTF-8") from None
        if not name:
            raise ValueError(f"{queue!r} names no queue: use chasqui://[<conn id>]/<queue name>")
        unknown = set(query) - _URI_KEYS
        if unknown:
            raise ValueError(f"unknown chasqui URI parameters {sorted(unknown)}; known: {sorted(_URI_KEYS)}")
        out: dict[str, Any] = {"queue_name": name}
        if host:
            out["chasqui_conn_id"] = host
        for key in ("mode", "cursor"):
            if key in query:
                if len(query[key]) != 1:
                    raise ValueError(f"{key} given {len(query[key])} times in {queue!r}")
                out[key] = query[key][0]
        for key in _INT_KEYS:
            if key in query:
                if len(query[key]) != 1 or not (query[key][0].isascii() and query[key][0].isdigit()):
                    raise ValueError(f"{key} must be given once, as a whole number, in {queue!r}")
                out[key] = int(query[key][0])
        if "job_names" in query:
            out["job_names"] = [n for value in query["job_names"] for n in value.split(",") if n]
        clash = set(out) & set(kwargs)
        if clash:
            raise ValueError(f"{sorted(clash)} given both in the URI and as keyword arguments")
        return out
