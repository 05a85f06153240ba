"""Who may look and who may change: the standalone server's token / basic-auth check.

An ``Access`` callable takes the request and whether it changes anything, and returns the
user's name for the audit line or raises ``HTTPException`` (401/403).  Inside Airflow the
plugin passes one that asks Airflow's auth manager (``plugin.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Protocol

from fastapi import HTTPException, Request

__all__ = ["Access", "open_access", "standalone_access", "TOKEN_COOKIE", "CsrfKey"]

TOKEN_COOKIE = "chasqui_dashboard_token"


class Access(Protocol):
    def __call__(self, request: Request, write: bool) -> str: ...


def open_access(request: Request, write: bool) -> str:
    """Loopback without credentials: whoever reaches the port (the default bind is 127.0.0.1)."""
    return "local"


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def standalone_access(token: str | None, basic_auth: str | None) -> Callable[[Request, bool], str]:
    """A bearer token (header, cookie set by ``/login``, or ``?token=`` once) and/or
    ``user:password`` basic auth; any of the configured ones lets a request in."""
    if token is None and basic_auth is None:
        return open_access
    user_pw = basic_auth.split(":", 1) if basic_auth else None

    def check(request: Request, write: bool) -> str:
        header = request.headers.get("authorization", "")
        if token is not None:
            given = None
            if header.lower().startswith("bearer "):
                given = header[7:].strip()
            given = given or request.cookies.get(TOKEN_COOKIE) or request.query_params.get("token")
            if given and _same(given, token):
                return "token"
        if user_pw is not None and header.lower().startswith("basic "):
            try:
                user, _, pw = base64.b64decode(header[6:].strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, pw = "", ""
            if _same(user, user_pw[0]) and _same(pw, user_pw[1]):
                return user
        if user_pw is not None and token is None:
            raise HTTPException(401, "log in", headers={"WWW-Authenticate": 'Basic realm="chasqui"'})
        raise HTTPException(401, "a token is required: open /login")

    return check


class CsrfKey:
    """The key of the check value every form carries back (a cross-site post lacks it).

    It must be the same in every process that serves the dashboard: Airflow's API server runs
    several workers (``--workers 2``) and replicas, and a form rendered by one is posted to
    another.  The plugin derives it from Airflow's ``[api] secret_key`` (which Airflow requires
    to be shared for the same reason); the standalone server is one process, a random key does."""

    def __init__(self, secret: bytes | str | None = None) -> None:
        if secret is None:
            self._key = secrets.token_bytes(32)
        else:
            raw = secret.encode() if isinstance(secret, str) else secret
            if not raw:
                raise ValueError("the dashboard's CSRF secret is empty")
            self._key = hashlib.sha256(b"chasqui-dashboard-csrf\0" + raw).digest()

    def token(self, user: str) -> str:
        """A per-user value, the same in every process that shares the secret."""
        return hmac.new(self._key, user.encode(), hashlib.sha256).hexdigest()[:32]

    def check(self, user: str, given: str | None) -> None:
        if not given or not _same(given, self.token(user)):
            raise HTTPException(403, "the form's check value is missing or stale: reload the page and try again")
