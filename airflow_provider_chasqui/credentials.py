"""``credential_provider=`` (chasquimq's): credentials fetched for each new connection, as
token-based AUTH needs (ElastiCache or MemoryDB IAM tokens, Azure Entra tokens, a vault).

The provider is ``async def provider(endpoint) -> (username, password)`` (a plain function
returning the pair works too): ``endpoint`` is ``"host:port"`` of the URL, ``username`` may
be None (AUTH with the password alone), ``(None, None)`` sends no AUTH.  A redis-py
``CredentialProvider`` is taken as it is.  Each new connection asks again, so a rotated token
reaches the connections opened after the rotation; open ones stay authenticated.

Every client of this package is made through ``core.urls.connection_options``, which adds the
provider registered for the client's URL (:func:`register`): a ``Queue``'s event waits, a
``Worker``'s reader and lease-guard thread and its promoter and scheduler all authenticate
with it, without each being handed it.  One provider per URL per process (the latest given).
A failing or malformed provider is a ``ChasquiConnectionError`` naming it at the first call
(the worker backs off and tries again, as with any outage).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from redis.credentials import CredentialProvider
from redis.exceptions import AuthenticationError

from .core.urls import CREDENTIAL_PROVIDERS, split_cluster_flag
from .errors import ConfigError, ConfigTypeError

__all__ = ["carries_credentials", "load_provider", "register", "ProviderCredentials"]

Credentials = tuple[str | None, str | None]
PROVIDER_TIMEOUT_SECS = 30.0  # a provider that does not answer fails the connection after this


class ProviderCredentials(CredentialProvider):
    """A chasquimq-style provider behind redis-py's ``CredentialProvider`` (sync and asyncio
    clients: redis-py 5.0 asks asyncio connections through the sync method too)."""

    def __init__(
        self, provider: Callable[[str | None], Credentials | Awaitable[Credentials]], endpoint: str | None
    ) -> None:
        self.provider, self.endpoint = provider, endpoint

    async def get_credentials_async(self) -> Any:  # redis-py types it without the empty tuple (no AUTH)
        try:
            got = self.provider(self.endpoint)
            if inspect.isawaitable(got):
                got = await asyncio.wait_for(got, PROVIDER_TIMEOUT_SECS)
        except Exception as exc:
            raise AuthenticationError(f"credential_provider failed: {exc!r}"[:2000]) from exc
        return _auth_args(got)

    def get_credentials(self) -> Any:
        """The sync path (``SyncQueue``, the lease guard; asyncio clients on redis-py < 5.1): an
        ``async def`` provider runs on a loop of its own, in a helper thread when this thread
        already runs one."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.get_credentials_async())
        out: list[Any] = []

        def run() -> None:
            try:
                out.append(asyncio.run(self.get_credentials_async()))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                out.append(exc)

        helper = threading.Thread(target=run, name="chasqui-credentials", daemon=True)
        helper.start()
        helper.join(PROVIDER_TIMEOUT_SECS + 1)
        if not out:
            raise AuthenticationError(f"credential_provider gave no answer within {PROVIDER_TIMEOUT_SECS:.0f} s")
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


def _auth_args(got: object) -> tuple[str, ...]:
    """``(username, password)`` as AUTH's arguments: ``(password,)`` without a username, none
    for ``(None, None)``."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(v is None or isinstance(v, str) for v in got)):
        raise AuthenticationError(
            f"credential_provider must return (username, password), each a str or None; got {type(got).__name__}"
        )
    user, password = got
    if password is None:
        if user is not None:
            raise AuthenticationError("credential_provider returned a username without a password")
        return ()
    return (password,) if user is None else (user, password)


def carries_credentials(url: str) -> bool:
    """Whether ``url`` names a user or a password of its own."""
    parts = urlsplit(split_cluster_flag(url, None)[0])
    return bool(parts.password or parts.username)


def load_provider(spec: str, what: str) -> Any:
    """The provider ``pkg.module:attr`` names (``chasqui worker --credential-provider``, Airflow's
    ``[chasqui] credential_provider``: ``what``, named in every error).  Only settings of whoever
    deploys the process name one: never connection data (SECURITY.md, "Token credentials")."""
    module, sep, attr = str(spec).strip().partition(":")
    names = [*module.split("."), *attr.split(".")]
    if not sep or not all(n.isidentifier() for n in names):
        raise ConfigError(f"{what} {spec!r} must name an object: pkg.module:attr")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as exc:  # any failure of the named module is its setting's error
        raise ConfigError(f"{what} {spec!r}: importing {module} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: {module} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, CredentialProvider) or callable(obj)):
        raise ConfigTypeError(f"{what} {spec!r} is a {type(obj).__name__}, not a credential provider")
    return obj


def register(url: str, provider: object) -> None:
    """Make ``provider`` the credentials of every client this process opens to ``url`` (None:
    nothing registered); a URL that carries a user or password already is a ConfigError
    (redis-py refuses both at once, and only at the first connection)."""
    if provider is None:
        return
    plain = split_cluster_flag(url, None)[0]  # the URL the cluster client is made from
    parts = urlsplit(plain)
    if parts.password or parts.username:  # carries_credentials(url), split once here
        raise ConfigError("credential_provider and a user or password in the Redis URL: give one of them")
    try:  # a Sentinel URL lists several hosts: the master is found later, the endpoint is None
        endpoint = f"{parts.hostname}:{parts.port or 6379}" if parts.hostname and "," not in parts.netloc else None
    except ValueError:
        endpoint = None
    if isinstance(provider, CredentialProvider):
        wrapped: CredentialProvider = provider
    elif callable(provider):
        wrapped = ProviderCredentials(provider, endpoint)
    else:
        raise ConfigTypeError(
            f"credential_provider must be an async function (endpoint) -> (username, password) or a redis-py "
            f"CredentialProvider, got {type(provider).__name__}"
        )
    for key in {url, plain}:
        CREDENTIAL_PROVIDERS[key] = wrapped
