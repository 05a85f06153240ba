"""Control characters from producers and handlers never reach a terminal or a human log raw
(issue 26): job names and handler errors forged lines in the human log, and ``chasqui events``
and ``chasqui dlq peek`` printed ANSI escapes as they were.  Real worker, real Redis, the real
CLI in a subprocess.
"""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import msgpack
import pytest
import redis
from engine_support import running, wait_until
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_chasqui import Queue, UnrecoverableError, Worker
from airflow_provider_chasqui.cli_common.logs import formatter_spec
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.text import printable

pytestmark = pytest.mark.timeout(120)

HOSTILE = "x\n2026-01-01 00:00:00,000 INFO    forged [1]: all good\x1b[2J\x1b]0;owned\x07\r\u202eevil\x00\x9b"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _chasqui(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@given(st.text())
def test_printable_leaves_no_control_character_and_keeps_the_rest(text: str) -> None:
    out = printable(text)
    assert RAW.search(out) is None and "\n" not in out
    assert printable(out) == out  # nothing left to escape
    if not RAW.search(text) and "\n" not in text:
        assert out is text  # safe text is returned as it is, not copied
    kept = printable(text, keep_newlines=True)
    assert kept.count("\n") == text.count("\n") and RAW.search(kept) is None


def test_escapes_read_as_what_they_were() -> None:
    assert printable("a\nb\x1b[31mc\td\u202e") == "a\\nb\\x1b[31mc\\td\\u202e"


async def test_the_human_log_shows_one_line_per_record(redis_url: str, queue_name: str) -> None:
    def refuse(job) -> None:
        raise UnrecoverableError(HOSTILE)

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    spec = formatter_spec("human")
    handler.setFormatter(spec.pop("()")(**spec))
    logger = logging.getLogger("airflow_provider_chasqui")
    logger.addHandler(handler)
    try:
        async with Queue(queue_name, redis_url=redis_url) as q:
            await q.add(HOSTILE, {"n": 1})
            async with running(Worker(queue_name, refuse, redis_url=redis_url, run_scheduler=False, read_block_ms=200)):
                await wait_until(lambda: _dlq_len(q), 60, what="the job in the DLQ")
    finally:
        logger.removeHandler(handler)
    text = buf.getvalue()
    assert "forged" in text  # the hostile text was logged...
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text and "\x00" not in text
    record_start = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ +airflow_provider_chasqui")
    starts = [line for line in text.splitlines() if record_start.match(line)]
    assert not [s for s in starts if "forged [1]" in s.split(":", 3)[-1][:40]]  # ...inside a line, never as one
    assert all(
        line.startswith(("  ", "Traceback", "airflow_provider_chasqui.")) or record_start.match(line)
        for line in text.splitlines()
    ), text


async def _dlq_len(q: Queue) -> bool:
    return len(await q.peek_dlq(10)) >= 1


def test_cli_tables_and_events_escape_control_characters(redis_url: str, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        env = msgpack.packb(["J\x1b[2J", msgpack.packb({"a": 1}), 1700000000000, 2])
        r.xadd(k.dlq, {"d": env, "n": HOSTILE, "source_id": "1-0", "reason": "retries_exhausted", "detail": HOSTILE})
        r.xadd(k.events, {"e": "failed", "id": "J1", "ts": "1700000000106", "n": HOSTILE, "error": HOSTILE})
    for out in (
        _chasqui("dlq", "peek", queue_name, "--redis-url", redis_url),
        _chasqui("events", queue_name, "--redis-url", redis_url),
    ):
        assert RAW.search(out) is None, repr(out)
        assert "forged" in out and "\\x1b[2J" in out
    events = _chasqui("events", queue_name, "--redis-url", redis_url).splitlines()
    assert len(events) == 1  # one event, one line
