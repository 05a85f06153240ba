"""Private Redis deployments for the hook tests: ACL users, TLS, Sentinel, Cluster.

Built on ``tests/servers.py`` (real redis-server 7 binaries on free loopback ports); every
process started here is stopped by the context manager that started it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from servers import RunningServer, free_port, start_server

__all__ = ["acl_server", "tls_server", "sentinel", "cluster", "TlsServer"]

ALICE = ("alice", "p@ss:w/rd?x%")  # a password that needs URL quoting


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def acl_server(tmpdir: Path) -> Iterator[RunningServer]:
    """A server with the ACL user ``alice`` (all commands and keys) besides ``default``."""
    user, password = ALICE
    rules = ("on", f">{password}", "~*", "&*", "+@all")
    server = start_server("redis7", tmpdir=tmpdir, extra_args=("--user", user, *rules))
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class TlsServer:
    server: RunningServer
    tls_port: int
    ca: Path


def _certificates(tmpdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (``cryptography``,
    which Airflow already depends on; no openssl binary needed).  Returns (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, issuer: x509.Name | None, issuer_key: object, key: object, ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())  # type: ignore[attr-defined]
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = build("chasqui-test-ca", None, ca_key, ca_key, True)
    cert = build("127.0.0.1", ca_cert.subject, ca_key, key, False)
    paths = tmpdir / "ca.pem", tmpdir / "server.pem", tmpdir / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@contextlib.contextmanager
def tls_server(tmpdir: Path) -> Iterator[TlsServer]:
    """A server with a TLS port (clients need no certificate) beside its plain one."""
    ca, cert, key = _certificates(tmpdir)
    tls_port = free_port()
    server = start_server(
        "redis7",
        tmpdir=tmpdir,
        extra_args=(
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
        ),
    )
    try:
        yield TlsServer(server, tls_port, ca)
    finally:
        server.stop()


@contextlib.contextmanager
def sentinel(tmpdir: Path, service: str = "chasqui-master") -> Iterator[tuple[RunningServer, int]]:
    """A master and one Sentinel monitoring it as ``service``; yields (master, sentinel port)."""
    master = start_server("redis7", tmpdir=tmpdir)
    port = free_port()
    conf = tmpdir / f"sentinel-{port}.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\nsentinel monitor {service} 127.0.0.1 {master.port} 1\n")
    with open(tmpdir / f"sentinel-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            ["/usr/bin/redis-server", str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT, cwd=tmpdir
        )
    try:
        with redis.Redis(port=port, socket_timeout=2) as s:
            _wait(lambda: s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service), 20, "the Sentinel")
        yield master, port
    finally:
        proc.terminate()
        proc.wait(10)
        master.stop()


@contextlib.contextmanager
def cluster(tmpdir: Path, nodes: int = 3) -> Iterator[list[RunningServer]]:
    """A Redis Cluster of ``nodes`` masters (no replicas) covering all 16384 slots."""
    servers: list[RunningServer] = []
    try:
        for _ in range(nodes):
            servers.append(
                start_server(
                    "redis7",
                    tmpdir=tmpdir,
                    extra_args=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-port",
                        str(free_port()),
                    ),
                )
            )
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{s.port}" for s in servers],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for s in servers:
            with s.client() as c:
                _wait(lambda c=c: c.cluster("info")["cluster_state"] == "ok", 30, f"cluster state ok on {s.port}")
        yield servers
    finally:
        for s in servers:
            s.stop()
