"""ChasquiHook and the ``chasqui`` connection: parsing (JSON and URI forms through Airflow's
own ``Connection``), then real deployments: ACL user, TLS, Sentinel and Cluster.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from pathlib import Path

import pytest
from airflow.sdk import Connection
from airflow_support import WorkerProcess
from redis_topologies import ALICE, acl_server, cluster, sentinel, tls_server

from airflow_provider_chasqui import ChasquiConnectionError, ConfigError
from airflow_provider_chasqui.hooks._connection import ChasquiConnectionSettings
from airflow_provider_chasqui.hooks.chasqui import ChasquiHook
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor
from airflow_provider_chasqui.triggers.job import ChasquiJobTrigger

pytestmark = pytest.mark.timeout(180)


def settings_of(conn: Connection) -> ChasquiConnectionSettings:
    return ChasquiConnectionSettings.from_fields(
        host=conn.host,
        port=conn.port,
        login=conn.login,
        password=conn.password,
        schema=conn.schema,
        extra=conn.extra_dejson,
    )


def use(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: dict | str) -> ChasquiHook:
    """Register ``conn_id`` as an ``AIRFLOW_CONN_*`` variable (JSON or URI) and hook it."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value if isinstance(value, str) else json.dumps(value))
    return ChasquiHook(conn_id)


# ---- parsing ------------------------------------------------------------------------------
def test_json_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = use(
        monkeypatch,
        "j",
        {
            "conn_type": "chasqui",
            "host": "redis.internal",
            "port": 6380,
            "login": "alice",
            "password": "s3cr:t@/",
            "extra": {"db": 2, "tls": True, "tls_ca_certs": "/etc/ca.pem", "default_queue": "jobs"},
        },
    )
    s = hook.get_settings()
    assert (s.host, s.port, s.db, s.username, s.password, s.tls, s.default_queue) == (
        "redis.internal",
        6380,
        2,
        "alice",
        "s3cr:t@/",
        True,
        "jobs",
    )
    assert s.redis_url() == "rediss://alice:s3cr%3At%40%2F@redis.internal:6380/2?ssl_ca_certs=%2Fetc%2Fca.pem"
    assert "s3cr" not in repr(s)
    with hook.get_queue() as queue:
        assert queue.name == "jobs"
    with hook.get_queue("other") as queue:
        assert queue.name == "other"


def test_uri_connection_with_string_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = use(monkeypatch, "u", "chasqui://:pw%40x@10.0.0.5:6379/3?tls=true&tls_verify=false&default_queue=q1")
    s = hook.get_settings()
    assert (s.host, s.db, s.username, s.password, s.tls, s.tls_verify) == ("10.0.0.5", 3, None, "pw@x", True, False)
    assert s.redis_url() == "rediss://:pw%40x@10.0.0.5:6379/3?ssl_cert_reqs=none"


def test_defaults_and_ipv6() -> None:
    s = settings_of(Connection(conn_id="d", conn_type="chasqui"))
    assert s.redis_url() == "redis://127.0.0.1:6379/0"
    assert settings_of(Connection(conn_id="v6", conn_type="chasqui", host="::1")).redis_url() == "redis://[::1]:6379/0"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"extra": {"colour": "blue"}}, "unknown chasqui connection extras"),
        ({"extra": {"db": "two"}}, "db must be a non-negative integer"),
        ({"schema": "1", "extra": {"db": 2}}, "db given twice"),
        ({"extra": {"tls": "maybe"}}, "'tls' must be a boolean"),
        ({"extra": {"mode": "ring"}}, "mode must be one of"),
        ({"extra": {"mode": "sentinel"}}, "sentinel_service"),
        ({"extra": {"mode": "cluster", "db": 1}}, "only database 0"),
        ({"extra": {"sentinel_service": "m"}}, "only apply in sentinel mode"),
        ({"extra": {"tls_verify": False}}, "need tls=true"),
        ({"extra": {"mode": "sentinel", "sentinel_service": "m", "sentinels": "h:x"}}, "not host:port"),
        # an extra is any JSON: these were quote()'s TypeError, an encode error, int()'s ValueError
        ({"extra": {"mode": "sentinel", "sentinel_service": 5}}, "connection sentinel_service must be a str, got int"),
        ({"extra": {"mode": "sentinel", "sentinel_service": "\udcff"}}, "sentinel_service must be text that encodes"),
        ({"extra": {"tls": True, "tls_ca_certs": ["/ca.pem"]}}, "connection tls_ca_certs must be a str, got list"),
        ({"extra": {"default_queue": 7}}, "connection default_queue must be a str, got int"),
        ({"extra": {"db": "\u00b2"}}, "db must be a non-negative integer"),
        ({"schema": "\u00b2", "extra": {}}, "schema \\(db\\) must be a non-negative integer"),
        ({"extra": {"mode": "sentinel", "sentinel_service": "m", "sentinels": "h:\u00b2"}}, "not host:port"),
    ],
)
def test_bad_connections_are_config_errors(fields: dict, message: str) -> None:
    conn = Connection(
        conn_id="bad", conn_type="chasqui", host="h", schema=fields.get("schema"), extra=json.dumps(fields["extra"])
    )
    with pytest.raises(ConfigError, match=message):
        settings_of(conn)


def test_blank_extras_from_the_ui_are_ignored() -> None:
    conn = Connection(
        conn_id="ui",
        conn_type="chasqui",
        host="h",
        extra=json.dumps({"db": None, "default_queue": "", "tls": None, "sentinels": ""}),
    )
    assert settings_of(conn).redis_url() == "redis://h:6379/0"


def test_no_queue_name_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = use(monkeypatch, "nq", {"conn_type": "chasqui", "host": "127.0.0.1"})
    with pytest.raises(ConfigError, match="no queue name"):
        hook.get_queue()


def test_sentinel_and_cluster_settings() -> None:
    sentinel_conn = Connection(
        conn_id="s",
        conn_type="chasqui",
        host="s1",
        extra=json.dumps({"mode": "sentinel", "sentinel_service": "m", "sentinels": "s1:26379, s2:26380,s3"}),
    )
    s = settings_of(sentinel_conn)
    assert s.sentinels == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert s.redis_url() == "redis+sentinel://s1:26379,s2:26380,s3:26379/m/0"
    secured = Connection(
        conn_id="s2",
        conn_type="chasqui",
        host="s1",
        port=5000,
        login="u",
        password="p w",
        extra=json.dumps(
            {"mode": "sentinel", "sentinel_service": "my master", "db": 3, "tls": True, "sentinel_password": "sp@"}
        ),
    )
    assert settings_of(secured).redis_url() == (
        "rediss+sentinel://u:p%20w@s1:5000/my%20master/3?sentinel_password=sp%40"
    )
    c = settings_of(Connection(conn_id="c", conn_type="chasqui", host="n1", port=7000, extra='{"mode": "cluster"}'))
    assert c.redis_url() == "redis://n1:7000/0?cluster=true"


# ---- real servers -------------------------------------------------------------------------
def test_test_connection_reports_success_and_failure(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    assert ChasquiHook().test_connection() == (True, "Redis answered PING")
    ok, message = use(monkeypatch, "dead", {"conn_type": "chasqui", "host": "127.0.0.1", "port": 1}).test_connection()
    assert not ok and "ChasquiConnectionError" in message


def test_the_hook_pauses_and_resumes_a_queue(monkeypatch: pytest.MonkeyPatch, redis_url: str, queue_name: str) -> None:
    """An incident's stop from a DAG task: pause the connection's default queue, then resume it."""
    parts = urllib.parse.urlsplit(redis_url)
    hook = use(
        monkeypatch,
        "pausing",
        {"conn_type": "chasqui", "host": parts.hostname, "port": parts.port, "extra": {"default_queue": queue_name}},
    )
    assert hook.is_queue_paused() is False
    hook.pause_queue()
    assert hook.is_queue_paused() is True
    with hook.get_queue() as q:
        assert q.is_paused()
    hook.resume_queue(queue_name)
    assert hook.is_queue_paused(queue_name) is False


def test_acl_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user, password = ALICE
    with acl_server(tmp_path) as server:
        uri = f"chasqui://{user}:{urllib.parse.quote(password, safe='')}@127.0.0.1:{server.port}/0"
        with use(monkeypatch, "acl", uri).get_queue("acl-q") as queue:
            job = queue.add("square", {"x": 1})
            assert queue.get_job_state(job.id) == "waiting"  # added, not read yet
        with server.client() as admin:
            assert admin.xlen("{chasqui:acl-q}:stream") == 1
        wrong = use(
            monkeypatch,
            "acl_wrong",
            {"conn_type": "chasqui", "host": "127.0.0.1", "port": server.port, "login": user, "password": "nope"},
        )
        with wrong.get_queue("acl-q") as queue, pytest.raises(ChasquiConnectionError):
            queue.add("square", {"x": 1})


def test_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tls_server(tmp_path) as tls:
        base = {"conn_type": "chasqui", "host": "127.0.0.1", "port": tls.tls_port}
        verified = use(monkeypatch, "tls_ca", {**base, "extra": {"tls": True, "tls_ca_certs": str(tls.ca)}})
        with verified.get_queue("tls-q") as queue:
            queue.add("square", {"x": 1})
        unverified = use(monkeypatch, "tls_any", {**base, "extra": {"tls": True, "tls_verify": False}})
        with unverified.get_queue("tls-q") as queue:
            queue.add("square", {"x": 2})
        untrusted = use(monkeypatch, "tls_system_ca", {**base, "extra": {"tls": True}})
        with untrusted.get_queue("tls-q") as queue, pytest.raises(ChasquiConnectionError, match="certificate"):
            queue.add("square", {"x": 3})
        with tls.server.client() as plain:
            assert plain.xlen("{chasqui:tls-q}:stream") == 2


def test_sentinel_mode_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer, sensor, trigger and the worker all reach the master through the Sentinel
    (one ``redis+sentinel://`` URL from the hook)."""
    with sentinel(tmp_path, service="chasqui-master") as (master, sentinel_port):
        hook = use(
            monkeypatch,
            "via_sentinel",
            {
                "conn_type": "chasqui",
                "host": "127.0.0.1",
                "port": sentinel_port,
                "extra": {"mode": "sentinel", "sentinel_service": "chasqui-master", "default_queue": "sq"},
            },
        )
        with hook.get_queue() as queue:
            jobs = [queue.add("square", {"x": x}) for x in (2, 3)]
        url = hook.get_settings().redis_url()
        assert url == f"redis+sentinel://127.0.0.1:{sentinel_port}/chasqui-master/0"
        worker = WorkerProcess(url, "sq", tmp_path / "worker.log")
        try:
            sensor = ChasquiJobSensor(
                task_id="w",
                job_id=[j.id for j in jobs],
                chasqui_conn_id="via_sentinel",
                deferrable=False,
                poke_interval=0.1,
                timeout=30,
            )
            assert sensor.execute({}) == {jobs[0].id: {"x": 2, "square": 4}, jobs[1].id: {"x": 3, "square": 9}}
            trigger = ChasquiJobTrigger(job_ids=[jobs[0].id], queue_name="sq", chasqui_conn_id="via_sentinel")
            event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 30))
            assert event.payload["results"] == {jobs[0].id: {"x": 2, "square": 4}}
        finally:
            assert "STOPPED" in worker.stop()
        with master.client() as direct:
            assert direct.exists("{chasqui:sq}:result:" + jobs[1].id)  # it all happened on the master


def test_cluster_mode_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-node Redis Cluster reached through one seed node: enqueue, a real worker on the
    hook's ``?cluster=true`` URL, then the sensor and the trigger read the results."""
    with cluster(tmp_path) as nodes:
        hook = use(
            monkeypatch,
            "cl",
            {
                "conn_type": "chasqui",
                "host": "127.0.0.1",
                "port": nodes[-1].port,
                "extra": {"mode": "cluster", "default_queue": "cq"},
            },
        )
        url = hook.get_settings().redis_url()
        assert url == f"redis://127.0.0.1:{nodes[-1].port}/0?cluster=true"
        with hook.get_queue() as queue:
            later = queue.add("square", {"x": 2}, delay=60.0, job_id="later")
            jobs = queue.add_bulk([{"name": "square", "data": {"x": i}} for i in range(10)])
            assert queue.get_job_state(later.id) == "delayed"
        ids = [j.id for j in jobs]
        worker = WorkerProcess(url, "cq", tmp_path / "worker.log")
        try:
            sensor = ChasquiJobSensor(
                task_id="w", job_id=ids, chasqui_conn_id="cl", deferrable=False, poke_interval=0.1, timeout=30
            )
            assert sensor.execute({}) == {j.id: {"x": i, "square": i * i} for i, j in enumerate(jobs)}
            trigger = ChasquiJobTrigger(
                job_ids=[ids[3], later.id], queue_name="cq", chasqui_conn_id="cl", deadline=time.time() + 1
            )
            event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 30))
            assert event.payload == {"status": "timeout", "pending": [later.id], "queue": "cq"}
        finally:
            assert "STOPPED" in worker.stop()
        holding = []
        for node in nodes:  # one hash tag, so one slot on one node holds the whole queue
            with node.client() as c:
                if c.cluster("countkeysinslot", c.cluster("keyslot", "{chasqui:cq}:stream")):
                    holding.append((c.zcard("{chasqui:cq}:delayed"), c.exists("{chasqui:cq}:result:" + ids[0])))
        assert holding == [(1, 1)]
