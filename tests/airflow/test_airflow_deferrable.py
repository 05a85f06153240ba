"""Deferral follows Airflow's convention: with no ``deferrable`` argument, the operators and the
sensor take ``[operators] default_deferrable`` (False unless configured), as the official
providers do; ``[chasqui] default_deferrable``, when set, overrides it for Chasqui only; an
explicit argument wins over both.

Proven under real Airflow configuration (``AIRFLOW__...`` environment variables read by
``airflow.sdk.conf``): at construction for every combination, and with ``dag.test()`` runs
whose task logs show whether the trigger ran.
"""

from __future__ import annotations

import re
import uuid

import pytest
from airflow_support import WorkerProcess, delete_queue_keys, run_dags

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

UNSET = None
CASES = [  # ([operators], [chasqui]) -> the default
    ((UNSET, UNSET), False),
    (("true", UNSET), True),
    (("false", UNSET), False),
    ((UNSET, "true"), True),
    (("false", "true"), True),
    (("true", "false"), False),
    (("True", "0"), False),
    (("1", ""), True),  # an empty provider option is unset
]


def _configure(monkeypatch: pytest.MonkeyPatch, operators: str | None, chasqui: str | None) -> None:
    for section, value in (("OPERATORS", operators), ("CHASQUI", chasqui)):
        name = f"AIRFLOW__{section}__DEFAULT_DEFERRABLE"
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("config", "expected"), CASES)
def test_default_follows_operators_default_deferrable(monkeypatch: pytest.MonkeyPatch, config, expected) -> None:
    _configure(monkeypatch, *config)
    assert ChasquiJobSensor(task_id="s", job_id="x").deferrable is expected
    assert ChasquiEnqueueOperator(task_id="e", job_name="n", wait_for_result=True).deferrable is expected
    for explicit in (True, False):  # the argument wins over any configuration
        assert ChasquiJobSensor(task_id="s", job_id="x", deferrable=explicit).deferrable is explicit
        assert ChasquiEnqueueOperator(task_id="e", job_name="n", deferrable=explicit).deferrable is explicit


def test_a_bad_value_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _configure(monkeypatch, "maybe", None)
    with pytest.raises(Exception, match="maybe"):
        ChasquiJobSensor(task_id="s", job_id="x")


def _task_log(log: str, task_id: str) -> str:
    match = re.search(
        rf"\[DAG TEST\] starting task_id={task_id} .*?\[DAG TEST\] end task task_id={task_id} ", log, re.S
    )
    assert match, f"no log for {task_id}:\n{log[-3000:]}"
    return match.group(0)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("config", "deferred"), [((UNSET, UNSET), False), (("true", UNSET), True), (("false", "true"), True)]
)
def test_dag_test_defers_as_configured(
    airflow_home: dict[str, str], redis_url: str, tmp_path, config, deferred: bool
) -> None:
    queue = f"t-deferrable-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in airflow_home.items() if not k.endswith("__DEFAULT_DEFERRABLE")}
    for section, value in zip(("OPERATORS", "CHASQUI"), config):
        if value is not None:
            env[f"AIRFLOW__{section}__DEFAULT_DEFERRABLE"] = value
    worker = WorkerProcess(redis_url, queue, tmp_path / "worker.log")
    try:
        [run] = run_dags(env, [["chasqui_deferrable_default", {"queue": queue}]])
    finally:
        worker.stop()
        delete_queue_keys(redis_url, queue)
    assert run["state"] == "success", run["tis"]
    assert run["xcom"]["wait_here.return_value"] == {"x": 3, "square": 9}
    assert run["xcom"]["sense.return_value"] == {"x": 4, "square": 16}
    for task_id in ("wait_here", "sense"):
        log = _task_log(run["log"], task_id)
        assert ("[DAG TEST] Trigger completed" in log) is deferred, task_id
        # blocking, poking or resumed: the task log says what the wait found
        assert re.search(rf"queue {queue}: job \S+ completed; attempts: 1; waited \d+\.\d\d s; result: ", log), log
