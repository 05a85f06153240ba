"""``benchmarks/bench_spark_datasource.py`` (write and read sides) at a tiny size, so it cannot rot.
Shape only: never a timed assertion.  It runs as a subprocess (its own local[2] Spark, as the
benchmark does) on a queue of its own on the shared Redis, which it deletes at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


def test_bench_spark_datasource_smoke(redis_url: str) -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_spark_datasource.py"),
            "--rows",
            "3000",
            "--raw-rows",
            "1000",
            "--runs",
            "1",
            "--redis-url",
            redis_url,
            "--json",
        ],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 3000 and summary["median"] > 0 and summary["raw_median"] > 0 and summary["ratio"] > 0
    read = summary["read"]
    assert read["rows"] == 3000 and read["partitions"] >= 1
    for key in (
        "plain_median",
        "count_median",
        "noop_median",
        "count_ratio",
        "noop_ratio",
    ):
        assert read[key] > 0, (key, read)
    assert "plain XRANGE loop" in proc.stdout and "every column" in proc.stdout
    with redis.Redis.from_url(redis_url) as r:  # the benchmark's queue is gone
        assert not list(r.scan_iter(match="{chasqui:bench-sparkds-*", count=10_000))
