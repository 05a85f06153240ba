"""The README's main job really runs: worker + promoter + scheduler on a demo queue."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_demo(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.demo", *args], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def check(out: str) -> None:
    assert "result of the delayed job: {'sent_to': 'later@example.com'}" in out
    assert "DLQ: [('poison', 'unrecoverable'), ('flaky', 'retries_exhausted')]" in out
    assert out.count(" completed        tick ") == 3  # the every-1s spec with limit 3 fired exactly 3 times


@pytest.mark.timeout(120)
def test_demo_on_the_local_redis(redis_url: str, queue_name: str) -> None:
    check(run_demo("--queue", queue_name, "--redis-url", redis_url))


@pytest.mark.timeout(120)
def test_demo_starts_an_embedded_valkey_when_nothing_answers() -> None:
    out = run_demo("--redis-url", "redis://127.0.0.1:1")
    assert "started embedded valkey-server" in out
    check(out)
