"""One trace from a DAG run: ``dag.test()`` in a subprocess and a real worker process, both with
``CHASQUI_OTEL=1`` and the OpenTelemetry SDK exporting spans to files (``otel_export.py``).

The spans' parent ids must chain DAG task -> enqueue (PRODUCER) -> handler (CONSUMER, in the
worker process) and DAG task -> trigger wait -> resumed task; the deferred sensor continues the
trace of the task that enqueued its job.  The trace is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from airflow_support import delete_queue_keys

HERE = Path(__file__).resolve().parent


def _spans(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _start_worker(redis_url: str, queue: str, spans: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "otel_export.py"), str(spans), str(HERE / "worker_main.py"), redis_url, queue],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while "READY" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"worker did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc


def _one(spans: list[dict], pred, what: str) -> dict:
    found = [s for s in spans if pred(s)]
    assert len(found) == 1, f"{what}: {len(found)} spans\n" + "\n".join(s["name"] for s in spans)
    return found[0]


def _print_trace(spans: list[dict], trace_id: str) -> None:
    mine = {s["span_id"]: s for s in spans if s["trace_id"] == trace_id}

    def depth(s: dict) -> int:
        return 0 if s["parent_id"] not in mine else 1 + depth(mine[s["parent_id"]])

    print(f"\ntrace {trace_id}:")
    for s in sorted(mine.values(), key=depth):
        print(
            f"  {'  ' * depth(s)}{s['name']}  span={s['span_id']} parent={s['parent_id']}  "
            f"{s['attributes'].get('chasqui.job.outcome', '')}"
        )


@pytest.mark.timeout(400)
def test_one_trace_from_dag_task_to_handler_to_resume(
    airflow_home: dict[str, str], redis_url: str, tmp_path: Path
) -> None:
    queue = f"t-traced-{uuid.uuid4().hex[:6]}"
    env = {
        **airflow_home,
        "CHASQUI_OTEL": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")) if p),
    }
    worker_spans, dag_spans = tmp_path / "worker-spans.jsonl", tmp_path / "dag-spans.jsonl"
    worker = _start_worker(redis_url, queue, worker_spans, tmp_path / "worker.log", env)
    try:
        # run_dag.py under the exporter: otel_export.py runs it as __main__
        runner = [sys.executable, str(HERE / "otel_export.py"), str(dag_spans), str(HERE / "run_dag.py")]
        proc = subprocess.run(
            [*runner, json.dumps([["chasqui_traced", {"queue": queue}]])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-6000:]
        (summary,) = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert summary["state"] == "success", summary["tis"]
        assert summary["xcom"]["square.return_value"] == {"x": 5, "square": 25}
        assert summary["xcom"]["sense.return_value"] == {"x": 6, "square": 36}
        job_id = summary["xcom"]["square.job_id"]
        deadline = time.monotonic() + 30  # the worker exports each span as it ends; wait for the handler's
        while {s["attributes"].get("chasqui.job.id") for s in _spans(worker_spans)} < {
            job_id,
            summary["xcom"]["enqueue.job_id"],
        }:
            assert time.monotonic() < deadline, _spans(worker_spans)
            time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait(30)
        delete_queue_keys(redis_url, queue)
    spans = _spans(dag_spans) + _spans(worker_spans)
    by_id = {s["span_id"]: s for s in spans}

    # the operator that waits for its result: DAG task -> enqueue -> handler; task -> wait -> resume
    enqueue = _one(
        spans,
        lambda s: s["kind"] == "PRODUCER" and s["attributes"].get("messaging.message.id") == job_id,
        "the enqueue span",
    )
    task = by_id[enqueue["parent_id"]]
    assert task["name"] in ("worker.square", "airflow task chasqui_traced.square"), task["name"]
    handler = _one(
        spans, lambda s: s["kind"] == "CONSUMER" and s["attributes"].get("chasqui.job.id") == job_id, "the handler span"
    )
    assert handler["parent_id"] == enqueue["span_id"] and handler["trace_id"] == task["trace_id"]
    assert handler["attributes"]["chasqui.job.outcome"] == "completed"
    assert handler["attributes"]["messaging.destination.name"] == queue
    wait = _one(
        spans,
        lambda s: s["name"] == f"chasqui wait {queue}" and s["parent_id"] == task["span_id"],
        "the square task's trigger wait",
    )
    resume = _one(spans, lambda s: s["name"] == "chasqui resume square", "the square task's resumption")
    assert resume["parent_id"] == wait["span_id"] and resume["trace_id"] == task["trace_id"]
    _print_trace(spans, task["trace_id"])

    # the deferred sensor continues the trace of the task that enqueued its job (the XCom it left):
    # enqueue task -> enqueue span, and enqueue task -> sensor task -> trigger wait -> resumption
    sense_resume = _one(spans, lambda s: s["name"] == "chasqui resume sense", "the sensor's resumption")
    sense_wait = by_id[sense_resume["parent_id"]]
    assert sense_wait["name"] == f"chasqui wait {queue}"
    sense_task = by_id[sense_wait["parent_id"]]
    assert sense_task["name"] in ("worker.sense", "airflow task chasqui_traced.sense"), sense_task["name"]
    enqueue_task = by_id[sense_task["parent_id"]]
    assert enqueue_task["name"] in ("worker.enqueue", "airflow task chasqui_traced.enqueue"), enqueue_task["name"]
    delayed_job = summary["xcom"]["enqueue.job_id"]
    _one(
        spans,
        lambda s: (
            s["kind"] == "PRODUCER"
            and s["attributes"].get("messaging.message.id") == delayed_job
            and s["parent_id"] == enqueue_task["span_id"]
        ),
        "the enqueue task's enqueue span",
    )
    # a delayed job carries no context: its handler span starts a trace of its own
    delayed = _one(
        spans,
        lambda s: s["kind"] == "CONSUMER" and s["attributes"].get("chasqui.job.id") == delayed_job,
        "the delayed job's handler span",
    )
    assert delayed["parent_id"] is None
    _print_trace(spans, sense_task["trace_id"])
