"""``ChasquiHook``: an Airflow ``chasqui`` connection turned into engine queues.

The hook is deliberately thin: it resolves the connection (sync ``get_connection`` for
operators, ``aget_connection`` for triggers, which must not block the triggerer's loop),
validates it into :class:`~._connection.ChasquiConnectionSettings`, and opens a blocking
:class:`~airflow_provider_chasqui.SyncQueue` or an asyncio
:class:`~airflow_provider_chasqui.Queue`.  Everything else is the engine's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from airflow.sdk import BaseHook, conf

from ..core.codec import utf8_text
from ..credentials import carries_credentials, load_provider, register
from ..engine.queue import Queue
from ..errors import ConfigError
from ..sync import translate_errors
from ..sync.queue import SyncQueue
from ._connection import ChasquiConnectionSettings

__all__ = [
    "ChasquiHook",
    "check_conn_id",
    "configured_credential_provider",
    "register_configured_provider",
    "settings_outside_task",
]

PROVIDER_OPTION = "[chasqui] credential_provider"


def configured_credential_provider(url: str) -> Any:
    """The deployment's ``[chasqui] credential_provider`` (``pkg.module:attr``: token AUTH,
    ``credentials.py``), loaded, for a connection whose ``url`` carries no user or password of
    its own (those win); None when unset.  It is read from Airflow's configuration
    (``airflow.cfg``, ``AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER``), which whoever deploys Airflow
    sets, and never from a connection: whoever edits connections must not choose the code that
    tasks, the triggerer and workers run (SECURITY.md, "Token credentials")."""
    spec = conf.get("chasqui", "credential_provider", fallback=None)
    if spec is None or not str(spec).strip():
        return None
    provider = load_provider(str(spec), PROVIDER_OPTION)  # a bad setting fails every connection alike
    return None if carries_credentials(url) else provider


def register_configured_provider(url: str) -> None:
    """Every client this process opens to ``url`` authenticates with the configured provider
    (``chasqui`` commands given ``--conn-id``, the dashboard plugin); nothing when none applies."""
    register(url, configured_credential_provider(url))


def _settings(conn: Any, extra: dict[str, Any]) -> ChasquiConnectionSettings:
    return ChasquiConnectionSettings.from_fields(
        host=conn.host, port=conn.port, login=conn.login, password=conn.password, schema=conn.schema, extra=extra
    )


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr meanwhile: Airflow's structlog holds the original
    ``sys.stdout`` object, so swapping ``sys.stdout`` alone would not catch its lines."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def settings_outside_task(conn_id: str) -> ChasquiConnectionSettings:
    """The settings of ``conn_id`` for a process that is not an Airflow task (``chasqui worker``).

    Outside a task the Task SDK's lookup sees only ``AIRFLOW_CONN_*`` variables, while the UI and
    ``airflow connections add`` write to the metadata database: look the connection up as
    Airflow's own components do (environment variables, the configured secrets backends, then
    the metadata database), and name every place tried when it is in none of them.
    """
    from airflow.exceptions import AirflowNotFoundException  # type: ignore[attr-defined]

    try:  # the Task SDK's own lookup first: AIRFLOW_CONN_* without touching airflow-core
        return ChasquiHook(conn_id).get_settings()
    except AirflowNotFoundException:
        pass
    try:
        from airflow.configuration import ensure_secrets_loaded
        from airflow.models.connection import Connection
    except ImportError:  # the Task SDK without airflow-core: nothing more to look in
        raise ConfigError(
            f"Airflow connection {conn_id!r} was not found in the environment variable "
            f"AIRFLOW_CONN_{conn_id.upper()} (airflow-core, for the metadata database, is not "
            "installed)"
        ) from None
    try:
        # airflow-core logs its warnings (e.g. "empty cryptography key") to stdout, which
        # belongs to the command's output (`chasqui dlq peek --json`): send them to stderr.
        with _stdout_to_stderr():
            conn = Connection.get_connection_from_secrets(conn_id)
            return _settings(conn, conn.extra_dejson)
    except AirflowNotFoundException:
        tried = ", ".join(type(backend).__name__ for backend in ensure_secrets_loaded())
        raise ConfigError(
            f"Airflow connection {conn_id!r} was not found; looked in the environment variable "
            f"AIRFLOW_CONN_{conn_id.upper()}, the secrets backends ({tried}) and the metadata database of "
            "this AIRFLOW_HOME: create it in the UI or with `airflow connections add`"
        ) from None


def check_conn_id(conn_id: object) -> str:
    """A connection id as Airflow stores one: a non-empty str that encodes as UTF-8; else a
    ``ConfigError`` (a ``ValueError``) naming it, where the task or trigger is made rather than
    as a lookup error (or an encoding crash in the triggerer) later."""
    if not isinstance(conn_id, str) or not conn_id:
        raise ConfigError(f"chasqui_conn_id must be a connection id (a non-empty str), got {conn_id!r}")
    utf8_text(conn_id, "chasqui_conn_id")
    return conn_id


class ChasquiHook(BaseHook):
    """Opens Chasqui queues on the Redis an Airflow connection describes.

    One hook per connection id; each ``get_queue``/``aget_queue`` call returns a new queue
    with its own connection pool, which the caller closes (both are context managers).
    The hook itself holds no client, so it is safe to share between threads.

    :param chasqui_conn_id: the ``chasqui`` connection (host, port, db, ACL user and password,
        TLS and mode in the extras; see the provider's ``conn-fields``).

    .. seealso:: ``airflow_provider_chasqui.hooks._connection`` for every connection field.
    """

    conn_name_attr = "chasqui_conn_id"
    default_conn_name = "chasqui_default"
    conn_type = "chasqui"
    hook_name = "Chasqui (Redis Streams)"

    def __init__(self, chasqui_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chasqui_conn_id = check_conn_id(chasqui_conn_id)

    # ---- settings ---------------------------------------------------------------------
    def get_settings(self) -> ChasquiConnectionSettings:
        conn = self.get_connection(self.chasqui_conn_id)
        return _settings(conn, conn.extra_dejson)

    async def aget_settings(self) -> ChasquiConnectionSettings:
        conn = await self.aget_connection(self.chasqui_conn_id)
        return _settings(conn, await conn.aextra_dejson())

    # ---- queues -----------------------------------------------------------------------
    def get_queue(self, queue_name: str | None = None) -> SyncQueue:
        """A blocking queue (``queue_name`` or the connection's ``default_queue``)."""
        settings = self.get_settings()
        url = settings.redis_url()
        return SyncQueue(
            settings.queue_name(queue_name), redis_url=url, credential_provider=configured_credential_provider(url)
        )

    async def aget_queue(self, queue_name: str | None = None) -> Queue:
        """The asyncio twin of :meth:`get_queue`, for triggers."""
        settings = await self.aget_settings()
        url = settings.redis_url()
        return Queue(
            settings.queue_name(queue_name), redis_url=url, credential_provider=configured_credential_provider(url)
        )

    def get_conn(self) -> SyncQueue:
        """``BaseHook`` protocol: the connection's default queue."""
        return self.get_queue()

    # ---- flow control (Queue.pause / resume) ---------------------------------------------
    def pause_queue(self, queue_name: str | None = None) -> None:
        """No worker starts a new job of the queue until :meth:`resume_queue` (an incident's stop)."""
        with self.get_queue(queue_name) as queue:
            queue.pause()

    def resume_queue(self, queue_name: str | None = None) -> None:
        with self.get_queue(queue_name) as queue:
            queue.resume()

    def is_queue_paused(self, queue_name: str | None = None) -> bool:
        with self.get_queue(queue_name) as queue:
            return queue.is_paused()

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's Test button: PING the server the connection points at."""
        try:
            with self.get_queue(self.get_settings().default_queue or "connection-test") as queue, translate_errors():
                queue.driver.client.execute_command("PING")
        except Exception as exc:  # noqa: BLE001 - the UI shows the reason instead of a traceback
            return False, f"{type(exc).__name__}: {exc}"
        return True, "Redis answered PING"
