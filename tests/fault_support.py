"""Helpers of the fault and security suites: a TCP fault proxy, worker subprocesses that
record what they ran, a Sentinel launcher and a throw-away TLS certificate authority.

Everything binds to 127.0.0.1, every process started here is stopped by its pid, and no
helper sleeps to synchronise: callers wait for conditions (``engine_support.wait_until``).

Run as a script it is a worker process (``python fault_support.py worker --url ...``) whose
handler appends ``<i> <job id> <consumer>`` to a file with one ``write(2)`` per job, so the
record of a job survives a SIGKILL of the process the moment the handler returned.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import free_port

HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent


# ---- records of processed jobs --------------------------------------------------------------
@dataclass
class Records:
    """What the recording handlers wrote: per data index, how often and by whom."""

    counts: collections.Counter[int] = field(default_factory=collections.Counter)
    by_consumer: dict[str, set[int]] = field(default_factory=lambda: collections.defaultdict(set))

    @property
    def distinct(self) -> int:
        return len(self.counts)

    @property
    def duplicates(self) -> dict[int, int]:
        """index -> extra runs (count - 1) for every index run more than once."""
        return {i: c - 1 for i, c in self.counts.items() if c > 1}

    @property
    def extra_runs(self) -> int:
        return sum(self.duplicates.values())

    def add(self, i: int, consumer: str = "") -> None:
        self.counts[i] += 1
        self.by_consumer[consumer].add(i)


def read_records(paths: Iterable[Path]) -> Records:
    rec = Records()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            parts = line.split()
            if len(parts) >= 3:  # a torn last line cannot happen (one write per line), but be strict
                rec.add(int(parts[0]), parts[2].decode())
    return rec


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


# ---- worker subprocesses ----------------------------------------------------------------------
@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    out: Path
    consumer: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by pid: no shutdown, no final ack flush."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM by pid (the worker drains and acks), SIGKILL after ``timeout``."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def log_tail(self, n: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def spawn_worker(url: str, queue: str, out: Path, consumer: str, **options: Any) -> WorkerProcess:
    """Start ``python fault_support.py worker`` recording into ``out``; options become flags."""
    args = [
        sys.executable,
        str(HERE / "fault_support.py"),
        "worker",
        "--url",
        url,
        "--queue",
        queue,
        "--out",
        str(out),
        "--consumer",
        consumer,
    ]
    for key, value in options.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    log = out.with_suffix(".log")
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
    return WorkerProcess(proc, out, consumer, log)


@dataclass
class WorkerGroup:
    """``n`` recording worker processes on one queue, each with its ``.rec`` (ends: index,
    id, consumer, wall time) and ``.starts`` (starts: index, id, consumer, wall time, attempt)
    file in ``tmp``."""

    workers: list[WorkerProcess]
    records: list[Path]
    starts: list[Path]

    @classmethod
    def spawn(cls, url: str, queue: str, tmp: Path, prefix: str, n: int = 3, **options: Any) -> WorkerGroup:
        records = [tmp / f"{prefix}{k}.rec" for k in range(n)]
        starts = [tmp / f"{prefix}{k}.starts" for k in range(n)]
        workers = [spawn_worker(url, queue, records[k], f"{prefix}-{k}", starts=starts[k], **options) for k in range(n)]
        return cls(workers, records, starts)

    def ended(self) -> int:
        return sum(count_lines(p) for p in self.records)

    def started(self) -> int:
        return sum(count_lines(p) for p in self.starts)

    def start_rows(self) -> list[list[str]]:
        return [line.split() for p in self.starts if p.exists() for line in p.read_text().splitlines()]

    def grants(self) -> list[tuple[int, int]]:
        """``(granted, server ms)`` of every flow-limit grant the workers logged (``grant_log=1``)."""
        from airflow_provider_chasqui.engine.flow_gate import GRANT_LOGGED

        return [
            (int(m.group(1)), int(m.group(2)))
            for w in self.workers
            if w.log.exists()
            for m in GRANT_LOGGED.finditer(w.log.read_text(errors="replace"))
        ]

    def end_rows(self) -> list[list[str]]:
        return [line.split() for p in self.records if p.exists() for line in p.read_text().splitlines()]

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


async def _worker_main(ns: argparse.Namespace) -> None:
    import logging

    from airflow_provider_chasqui import Worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if ns.grant_log:  # each flow-limit grant with the server time it was made at (FlowGate.grant)
        logging.getLogger("airflow_provider_chasqui.engine.flow_gate").setLevel(logging.DEBUG)
    fd = os.open(ns.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    tag = ns.consumer.encode()
    pause = ns.handler_sleep_ms / 1000

    starts = os.open(ns.starts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if ns.starts else None

    def started(job: Any) -> None:
        if starts is not None:
            os.write(
                starts, b"%d %s %s %.6f %d\n" % (int(job.data["i"]), job.id.encode(), tag, time.time(), job.attempt)
            )

    def rate_limited_once(job: Any) -> None:
        """A job whose data asks for it raises RateLimited, the first time any worker runs it
        (a marker file, created exclusively, holds when it was raised)."""
        ms = job.data.get("rate_limited_ms") if isinstance(job.data, dict) else None
        if ms is None or not ns.marker:
            return
        try:
            mark = os.open(ns.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        os.write(mark, b"%.6f" % time.time())
        os.close(mark)
        from airflow_provider_chasqui import RateLimited

        raise RateLimited(ms)

    slow = ns.slow_ms / 1000

    async def record(job: Any) -> None:
        started(job)
        rate_limited_once(job)
        if ns.blocking_sleep_ms:  # an async handler calling blocking code: the event loop stalls
            time.sleep(ns.blocking_sleep_ms / 1000)
        wait = slow if slow and isinstance(job.data, dict) and job.data.get("slow") else pause
        if wait:
            await asyncio.sleep(wait)
        os.write(fd, b"%d %s %s %.6f\n" % (int(job.data["i"]), job.id.encode(), tag, time.time()))

    def record_in_thread(job: Any) -> None:
        started(job)
        if pause:
            time.sleep(pause)
        os.write(fd, b"%d %s %s %.6f\n" % (int(job.data["i"]), job.id.encode(), tag, time.time()))

    worker = Worker(
        ns.queue,
        record_in_thread if ns.thread_handler else record,
        redis_url=ns.url,
        consumer_id=ns.consumer,
        concurrency=ns.concurrency,
        claim_min_idle_ms=ns.claim_min_idle_ms,
        run_scheduler=False,
        read_block_ms=ns.read_block_ms,
        install_signal_handlers=True,
        job_timeout_ms=ns.job_timeout_ms or None,
        read_count=ns.read_count,
        store_results=bool(ns.store_results),
    )
    await worker.run()
    os.close(fd)


# ---- a fault-injecting TCP proxy --------------------------------------------------------------
class _Pipe:
    """One proxied connection: two directions, each pausable, both abortable."""

    def __init__(
        self,
        proxy: FaultProxy,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.writers = (client_w, up_w)
        self.stalled = False  # a stalled pipe stays stalled forever (a black-holed flow)
        self.tasks = [
            asyncio.ensure_future(self._pump(client_r, up_w)),
            asyncio.ensure_future(self._pump(up_r, client_w, replies=True)),
        ]

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, replies: bool = False) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                if replies and self.proxy.drop_replies > 0:  # the request ran; its reply is lost with the connection
                    self.proxy.drop_replies -= 1
                    break
                while self.proxy.paused or self.stalled:  # hold the bytes: the peer sees silence
                    await self.proxy._resumed.wait()
                    if self.stalled:
                        await asyncio.Event().wait()  # never: a black hole keeps the socket open
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            self.abort()

    def abort(self) -> None:
        """RST both sides (no FIN): what a dropped NAT entry or a killed middlebox looks like."""
        for w in self.writers:
            with contextlib.suppress(Exception):
                w.transport.abort()
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()
        self.proxy._pipes.discard(self)


class FaultProxy:
    """``127.0.0.1:<port>`` -> ``target``; faults: :meth:`pause`, :meth:`cut`, :meth:`refuse`,
    :meth:`blackhole`, ``drop_replies = n`` (the next n replies are lost, each with its
    connection: the request ran).  Runs on the caller's event loop; ``async with`` starts and stops it."""

    def __init__(self, target_port: int, target_host: str = HOST) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.paused = False
        self.refusing = False
        self.accepted = 0
        self.cuts = 0
        self.drop_replies = 0  # this many replies are dropped, each cutting its connection (RST)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._pipes: set[_Pipe] = set()
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.resume()
        self.refusing = False
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_w.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self.accepted += 1
        self._pipes.add(_Pipe(self, client_r, client_w, up_r, up_w))

    @property
    def open_connections(self) -> int:
        return len(self._pipes)

    def pause(self) -> None:
        """Hold every byte in both directions (connections stay open): a stall."""
        self.paused = True
        self._resumed.clear()

    def resume(self) -> None:
        self.paused = False
        self._resumed.set()

    def cut(self) -> int:
        """Abort every open connection with an RST; returns how many were cut."""
        pipes = list(self._pipes)
        for p in pipes:
            p.abort()
        self.cuts += len(pipes)
        return len(pipes)

    def refuse(self, on: bool = True) -> None:
        """While on, new connections are accepted and reset at once."""
        self.refusing = on

    def blackhole(self) -> int:
        """Every connection open now goes silent forever (no RST, no FIN); new ones work."""
        pipes = list(self._pipes)
        for p in pipes:
            p.stalled = True
        return len(pipes)


# ---- Sentinel ----------------------------------------------------------------------------------
@dataclass
class SentinelProcess:
    proc: subprocess.Popen[bytes]
    port: int
    config: Path
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_sentinel(
    binary: Path,
    tmpdir: Path,
    service: str,
    master_port: int,
    *,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    timeout: float = 20.0,
) -> SentinelProcess:
    """``redis-server <conf> --sentinel`` monitoring ``127.0.0.1:master_port`` (quorum 1)."""
    import redis

    port = free_port()
    conf = tmpdir / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind {HOST}\ndir {tmpdir}\nprotected-mode no\n"
        f"sentinel monitor {service} {HOST} {master_port} 1\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
        f"sentinel parallel-syncs {service} 1\n"
    )
    log = tmpdir / f"sentinel-{port}.log"
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            [str(binary), str(conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=tmpdir,
            start_new_session=True,
        )
    sp = SentinelProcess(proc, port, conf, log)
    deadline = time.monotonic() + timeout
    with redis.Redis(host=HOST, port=port, socket_connect_timeout=1, socket_timeout=2) as r:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sentinel exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
            try:
                if r.info("server").get("process_id") == proc.pid:
                    return sp
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            if time.monotonic() > deadline:
                sp.stop()
                raise RuntimeError(f"sentinel on {port} did not answer:\n{log.read_text(errors='replace')}")
            time.sleep(0.02)


# ---- TLS ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path  # a CA that did not sign the server certificate
    client_cert: Path  # signed by ``ca``, for mutual TLS
    client_key: Path


def make_tls_files(tmpdir: Path) -> TlsFiles:
    """A throw-away CA and a server certificate for IP 127.0.0.1 (the openssl CLI)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, cwd=tmpdir, capture_output=True, timeout=60)

    for name in ("ca", "other-ca"):
        run(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN=chasqui-test-{name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
        )
    run(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    (tmpdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    )
    run(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=chasqui-worker",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
    )
    (tmpdir / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    run(
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "client.ext",
        "-out",
        "client.pem",
    )
    return TlsFiles(
        tmpdir / "ca.pem",
        tmpdir / "server.pem",
        tmpdir / "server.key",
        tmpdir / "other-ca.pem",
        tmpdir / "client.pem",
        tmpdir / "client.key",
    )


# ---- stream inspection ------------------------------------------------------------------------------
def pending_ids(
    client: Any, stream: str, group: str, consumer: str | None = None, count: int = 1_000_000
) -> list[bytes]:
    args: list[Any] = ["XPENDING", stream, group, "-", "+", count]
    if consumer is not None:
        args.append(consumer)
    return [row[0] for row in client.execute_command(*args) or []]


def indexes_of_entries(client: Any, stream: str, entry_ids: list[bytes]) -> dict[bytes, int]:
    """entry id -> the job's ``data["i"]`` (entries that still exist)."""
    import msgpack

    from airflow_provider_chasqui.core.codec import decode_envelope

    out: dict[bytes, int] = {}
    pipe = client.pipeline(transaction=False)
    for eid in entry_ids:
        pipe.execute_command("XRANGE", stream, eid, eid)
    for eid, rows in zip(entry_ids, pipe.execute()):
        for _id, fields in rows or []:
            flat = fields if isinstance(fields, list) else [x for kv in fields.items() for x in kv]
            d = dict(zip(flat[::2], flat[1::2]))[b"d"]
            out[eid] = int(msgpack.unpackb(decode_envelope(d).inner)["i"])
    return out


def chunks(seq: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="fault_support.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--queue", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--consumer", required=True)
    w.add_argument("--concurrency", type=int, default=100)
    w.add_argument("--claim-min-idle-ms", type=int, default=1000)
    w.add_argument("--read-block-ms", type=int, default=1000)
    w.add_argument("--handler-sleep-ms", type=float, default=0.0)
    w.add_argument("--starts", default="", help="also record each handler start in this file")
    w.add_argument("--thread-handler", type=int, default=0, help="1: a plain function (run in a thread)")
    w.add_argument("--slow-ms", type=float, default=0.0, help="jobs with data slow=True sleep this long here")
    w.add_argument("--blocking-sleep-ms", type=float, default=0.0, help="the async handler time.sleep()s this long")
    w.add_argument("--read-count", type=int, default=256, help="entries read per XREADGROUP beyond the running ones")
    w.add_argument("--store-results", type=int, default=0, help="1: keep results and failure records")
    w.add_argument("--job-timeout-ms", type=int, default=0, help="the worker's job_timeout_ms (0: none)")
    w.add_argument("--grant-log", type=int, default=0, help="1: log every flow-limit grant (its server time)")
    w.add_argument("--marker", default="", help="a job with data rate_limited_ms raises RateLimited once (this file)")
    ns = p.parse_args(argv)
    asyncio.run(_worker_main(ns))


if __name__ == "__main__":
    main()
