"""The dashboard inside Airflow 3: a plugin that mounts the app in the API server at
``/chasqui`` and adds a "Chasqui" entry to the UI's navigation.

One dashboard for every ``chasqui`` connection of the metadata database (a picker switches
between them).  Airflow's own login and auth manager decide who sees what:

* **viewing** needs the custom-view permission ``GET`` on ``Chasqui``
  (``is_authorized_custom_view``; the simple auth manager gives it to viewers and up);
* **changing** (replay, remove, purge, pause, resume, trigger, remove a spec) needs the right
  to edit that connection (``is_authorized_connection(method="PUT")``; ops and admins in the
  simple auth manager).  Anyone else gets 403.

The package registers it with the ``airflow.plugins`` entry point (pyproject.toml), which
Airflow loads whatever ``[core] lazy_load_providers`` says (a provider-info ``plugins`` entry
is only read when that is off); this module is only imported by Airflow's plugin manager.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import HTTPException, Request

from ..errors import ChasquiError, ConfigError
from .data import Source, SourceSet

log = logging.getLogger(__name__)

__all__ = ["ChasquiDashboardPlugin", "AirflowSources", "airflow_access", "URL_PREFIX", "RESOURCE"]

URL_PREFIX = "/chasqui"
RESOURCE = "Chasqui"
_LIST_TTL_S = 30.0


class AirflowSources(SourceSet):
    """The ``chasqui`` connections of the metadata database, listed every 30 s; a source is
    rebuilt when its connection's URL changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._labels: list[str] = []
        self._listed_at = 0.0
        self._sources: dict[str, Source] = {}

    def labels(self) -> list[str]:
        with self._lock:
            if time.monotonic() - self._listed_at < _LIST_TTL_S:
                return list(self._labels)
        from airflow.models.connection import Connection
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            ids = sorted(session.scalars(select(Connection.conn_id).where(Connection.conn_type == "chasqui")))
        with self._lock:
            self._labels, self._listed_at = ids, time.monotonic()
        return list(ids)

    def get(self, label: str | None) -> Source:
        labels = self.labels()
        if not label:
            if not labels:
                raise ConfigError("no 'chasqui' connection yet: add one (Admin > Connections, type Chasqui)")
            label = labels[0]
        elif label not in labels:
            raise ConfigError(f"no 'chasqui' connection named {label!r}")
        from ..hooks.chasqui import register_configured_provider, settings_outside_task

        url = settings_outside_task(label).redis_url()
        register_configured_provider(url)  # [chasqui] credential_provider, as the tasks' and the triggerer's
        with self._lock:
            src = self._sources.get(label)
            if src is not None and src.url == url:
                return src
            old, src = src, Source(label, url)
            self._sources[label] = src
        if old is not None:
            old.close()
        return src

    def close(self) -> None:
        with self._lock:
            for s in self._sources.values():
                s.close()
            self._sources.clear()


def _token(request: Request) -> str | None:
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN)


async def airflow_access(request: Request, write: bool) -> str:
    """The Airflow user behind the request (the UI's ``_token`` cookie or a bearer JWT), checked
    against the auth manager: view = custom view ``Chasqui``, change = edit the connection."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    token = _token(request)
    if not token:
        raise HTTPException(401, "log in to Airflow first")
    manager = get_auth_manager()
    try:
        user = await manager.get_user_from_token(token)
    except Exception as exc:  # expired or forged: Airflow's own answer is 401/403
        raise HTTPException(401, f"Airflow did not accept the session ({type(exc).__name__}): log in again") from exc
    name = user.get_name()
    if not manager.is_authorized_custom_view(method="GET", resource_name=RESOURCE, user=user):
        raise HTTPException(403, f"{name} may not view the Chasqui dashboard")
    if write:
        label = request.query_params.get("src") or None
        if label is None:
            try:
                labels = request.app.state.sources.labels()
            except ChasquiError:
                labels = []
            label = labels[0] if labels else None
        if not manager.is_authorized_connection(method="PUT", user=user, details=ConnectionDetails(conn_id=label)):
            raise HTTPException(
                403,
                f"{name} may not change queues of connection {label!r}: that needs the right to edit the connection",
            )
    return name


def _app() -> Any:
    from .app import create_app

    return create_app(
        AirflowSources(),
        access=airflow_access,
        title="Chasqui",
        csrf_secret=shared_secret(),
        frame_ancestors="self",
        airflow_ui="",
    )


class LazyApp:
    """The dashboard's ASGI app, built on its first request.  Loading plugins happens in every
    Airflow process (and, on executors that start a process per task, in every task); building
    the app there cost 0.26 s each time.  Airflow mounts this object like any ASGI app."""

    def __init__(self, build: Any) -> None:
        self._build, self._lock = build, threading.Lock()
        self._app: Any = None

    @property
    def built(self) -> bool:
        return self._app is not None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self._app
        if app is None:
            with self._lock:  # several API server threads may ask at once: one build
                if self._app is None:
                    self._app = self._build()
                app = self._app
        await app(scope, receive, send)


def shared_secret() -> str | None:
    """What every API server process and replica shares: Airflow's ``[api] secret_key`` (Airflow
    requires it to be the same for its own CSRF check), else ``[api_auth] jwt_secret``; None (a
    per-process key: forms then work only with one API server worker) when neither is set."""
    from airflow.configuration import conf

    for section, key in (("api", "secret_key"), ("api_auth", "jwt_secret")):
        value = conf.get(section, key, fallback=None)
        if value:
            return str(value)
    log.warning(
        "neither [api] secret_key nor [api_auth] jwt_secret is set: the Chasqui dashboard's forms "
        "work only with a single API server worker"
    )
    return None


class ChasquiDashboardPlugin(AirflowPlugin):
    """Mounts the dashboard at ``/chasqui`` and links it from the navigation ("Browse")."""

    name = "chasqui_dashboard"
    fastapi_apps = [{"app": LazyApp(_app), "url_prefix": URL_PREFIX, "name": "Chasqui dashboard"}]
    external_views = [
        {
            "name": "Chasqui",
            "href": URL_PREFIX + "/",
            "destination": "nav",
            "category": "browse",
            "url_route": "chasqui",
        }
    ]
