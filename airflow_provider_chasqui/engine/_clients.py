"""How the asyncio side's Redis clients are built: raw replies (redis-py's reshaping off),
commands packed by hiredis' C packer, and a cluster client that routes what redis-py would ask a
node about (two-word commands, stream reads, FCALL keys) and lets ``CLIENT UNBLOCK`` reach a
blocking reader on whichever node it waits.  ``engine/_driver.py`` runs calls on them.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis._parsers.helpers import parse_command as _parse_command
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException

from ..core.urls import connection_options, split_cluster_flag
from ..drivers_common import FCALLS, stream_read_slot
from ._sentinel import make_client

__all__ = ["raw_client", "route_fcall", "CLUSTER"]

try:  # a dependency (redis[hiredis]); without it redis-py's own packer is used
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None  # type: ignore[assignment]

# connection class -> its hiredis-packing subclass: one per class for the process (a memo of
# class creation, as many entries as connection classes), so clients share the same subclass
_HIREDIS_CLASSES: dict[type, type] = {}


def _hiredis_connection_class(cls: type) -> type:
    """``cls`` packing commands with hiredis' C packer.

    redis.asyncio packs every argument in Python (several microseconds each), which dominated
    the worker's per-batch script calls; the sync client already uses hiredis.  Same bytes on
    the wire; a command hiredis refuses (or whose name holds a space) takes the original path,
    so its errors are unchanged.
    """
    fast = _HIREDIS_CLASSES.get(cls)
    if fast is None:
        original: Callable[..., list[bytes]] = cls.pack_command  # type: ignore[attr-defined]

        def pack_command(self: Any, *args: Any) -> list[bytes]:
            first = args[0] if args else None
            if isinstance(first, (str, bytes)) and (" " if isinstance(first, str) else b" ") not in first:  # type: ignore[operator]
                try:
                    return [_hiredis_pack(args)]
                except (TypeError, UnicodeError):
                    pass
            return original(self, *args)

        fast = type(f"Hiredis{cls.__name__}", (cls,), {"pack_command": pack_command})
        _HIREDIS_CLASSES[cls] = fast
    return fast


def raw_client(url: str, *, cluster: bool | None = None, **kwargs: Any) -> aioredis.Redis:
    """A client with redis-py's reply reshaping switched off.

    ``?cluster=true`` in the URL (or ``cluster=True``) gives a ``RedisCluster``: every script
    of this project touches one queue's hash tag, so each runs on a single slot.
    """
    url, use_cluster = split_cluster_flag(url, cluster)
    if use_cluster:
        # the cluster client pools per node; a "single connection" client is a blocking reader
        reader = bool(kwargs.pop("single_connection_client", False))
        url, kwargs = connection_options(url, kwargs)  # RESP2, TLS checks, timeouts (make_client does it too)
        cclient = _RawCluster.from_url(url, decode_responses=False, **kwargs)
        cclient.response_callbacks.clear()  # the nodes share this dict
        cclient.response_callbacks["COMMAND"] = _command_listing_only
        if reader:
            cclient._make_reader()  # type: ignore[attr-defined]
        return cclient  # type: ignore[return-value]
    client = make_client(url, decode_responses=False, **kwargs)  # redis+sentinel:// too
    client.response_callbacks.clear()
    pool = client.connection_pool
    if (
        _hiredis_pack is not None
        and str(pool.connection_kwargs.get("encoding", "utf-8")).lower() in ("utf-8", "utf8")
        and pool.connection_kwargs.get("encoding_errors", "strict") == "strict"
    ):
        pool.connection_class = _hiredis_connection_class(pool.connection_class)
    return client


# Blocking readers of this process by the handle their ``CLIENT ID`` returned (see _RawCluster).
_READERS: weakref.WeakValueDictionary[int, _RawCluster] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1 << 62)
_STREAM_READS = frozenset({"XREAD", "XREADGROUP"})


class _RawCluster(AsyncRedisCluster):
    """Routes two-word commands sent as separate arguments (``"CLIENT", "ID"``) the way the
    sync cluster client does: by their joined name's node flag, not by key lookup.

    A blocking reader (``single_connection_client=True``) has no one connection: its
    ``CLIENT ID`` returns a process-local handle, and each keyed command first learns the real
    client id of the connection it runs on, so ``CLIENT UNBLOCK <handle>`` from any cluster
    client of this process reaches the node and connection that is blocked.
    """

    _reader = False

    def _make_reader(self) -> None:
        self._reader = True
        self._handle = next(_HANDLES)
        self._node_ids: dict[str, int] = {}  # node name -> id of our connection there
        self._blocked_on: tuple[str, int] | None = None
        self._resolving = False  # awaiting the id of the connection the next read goes to
        self._skip_read = False  # an unblock arrived meanwhile: that read returns nil at once
        _READERS[self._handle] = self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 and isinstance(args[0], str) and isinstance(args[1], str):
            joined = f"{args[0]} {args[1]}".upper()
            if joined in self.command_flags:
                args = (joined, *args[2:])
        name = args[0].upper() if args and isinstance(args[0], str) else None
        if name == "CLIENT UNBLOCK" and len(args) > 1 and not kwargs.get("target_nodes"):
            reader = _READERS.get(int(args[1])) if str(args[1]).lstrip("-").isdigit() else None
            if reader is not None:
                return await self._unblock(reader, *args[2:])
        if self._reader and not kwargs.get("target_nodes"):
            if name == "CLIENT ID":  # (re)connecting: forget the ids of the old connections
                self._node_ids.clear()
                self._blocked_on = None
                return self._handle
            if name is not None and name not in self.command_flags:
                await self._note_connection(args)
                if self._skip_read:  # as if CLIENT UNBLOCK had ended it, as on one server
                    self._skip_read = False
                    return None
        return await super().execute_command(*args, **kwargs)

    async def _note_connection(self, args: tuple[Any, ...]) -> None:
        """Learn the client id of the connection the keyed command ``args`` will run on."""
        self._blocked_on = None
        self._resolving = True
        try:
            if self._initialize:
                await self.initialize()
            node = self.nodes_manager.get_node_from_slot(await self._determine_slot(*args))
            cid = self._node_ids.get(node.name)
            if cid is None:  # one command at a time: the node's only connection runs both
                cid = int(await super().execute_command("CLIENT ID", target_nodes=node))
                self._node_ids[node.name] = cid
        finally:
            self._resolving = False
        self._blocked_on = (node.name, cid)

    async def _unblock(self, reader: _RawCluster, *mode: Any) -> Any:
        if reader._resolving:
            reader._skip_read = True
            return 1
        if reader._blocked_on is None:
            return 0
        node_name, cid = reader._blocked_on
        if self._initialize:
            await self.initialize()
        node = self.get_node(node_name=node_name)
        if node is None:  # the node left the cluster: its read ended with it
            return 0
        return await super().execute_command("CLIENT UNBLOCK", cid, *mode, target_nodes=node)

    async def initialize(self, *args: Any, **kwargs: Any) -> _RawCluster:
        """No reachable seed node is a connection error (retried like one), not a config error.
        (redis-py 8 passes ``last_failed_node_name``.)"""
        try:
            return await super().initialize(*args, **kwargs)  # type: ignore[return-value]
        except RedisClusterException as exc:
            if isinstance(exc.__cause__, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
                raise rexc.ConnectionError(str(exc)) from exc
            raise

    async def _determine_slot(self, command: str, *args: Any) -> int:
        """XREAD/XREADGROUP keys are parsed here: redis-py asks a node (COMMAND GETKEYS) per call."""
        if isinstance(command, str) and command.upper() in _STREAM_READS:
            slot = stream_read_slot(self.encoder, args)
            if slot is not None:
                return slot
        return await super()._determine_slot(command, *args)


def _command_listing_only(response: Any, **options: Any) -> Any:
    """The async cluster client parses the full ``COMMAND`` listing (hundreds of entries) at
    start-up to route commands; ``COMMAND INFO <name>`` (one entry) stays raw for the core."""
    if isinstance(response, list) and len(response) > 1:
        return _parse_command(response, **options)
    return response


def route_fcall(client: AsyncRedisCluster) -> None:
    """FCALL's keys are read from the call, as redis-py reads EVALSHA's: it would ask a node
    (COMMAND GETKEYS, one more round trip and ACL grant) on every FCALL."""
    parser = client.commands_parser
    get_keys = parser.get_keys

    async def keys(*args: Any) -> Any:
        if args and args[0] in FCALLS and len(args) > 2:
            return list(args[3 : 3 + int(args[2])])
        return await get_keys(*args)

    parser.get_keys = keys  # type: ignore[method-assign]


CLUSTER = AsyncRedisCluster
