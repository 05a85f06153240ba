"""Where a job or a spec came from in Airflow: the DAG run and task that enqueued or upserted it
(sans-I/O; issue 28).  The operators write it beside the job (the wire format has no room for
it), the dashboard reads it to link a job or spec back to its task instance.

One small JSON string per job (``{q}:origin:<id>``, a week) and per spec
(``{q}:spec-origin:<key>``, 30 days, renewed by every upsert); written in the same pipeline
as nothing else, so a failed write costs only the link, never the job.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote

from .calls import Call, command
from .keys import QueueKeys

__all__ = [
    "Origin",
    "JOB_ORIGIN_TTL_MS",
    "SPEC_ORIGIN_TTL_MS",
    "from_context",
    "origin_calls",
    "spec_origin_call",
    "parse_origin",
]

JOB_ORIGIN_TTL_MS = 7 * 24 * 3_600_000
SPEC_ORIGIN_TTL_MS = 30 * 24 * 3_600_000
_MAX_TEXT = 250  # Airflow's own limit on dag, run and task ids


@dataclass(frozen=True, slots=True)
class Origin:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    def ui_path(self) -> str:
        """The task instance's page in Airflow 3's UI (its own route, from the UI root)."""
        dag, run, task = (quote(x, safe="") for x in (self.dag_id, self.run_id, self.task_id))
        path = f"/dags/{dag}/runs/{run}/tasks/{task}"
        return path + (f"/mapped/{self.map_index}" if self.map_index >= 0 else "")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def from_context(context: Any) -> Origin | None:
    """The origin of a running task from its Airflow context (None when it has no task instance)."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return None
    try:
        map_index = getattr(ti, "map_index", None)
        return Origin(str(ti.dag_id), str(ti.run_id), str(ti.task_id), -1 if map_index is None else int(map_index))
    except (AttributeError, TypeError, ValueError):
        return None


def origin_calls(keys: QueueKeys, job_ids: list[str], origin: Origin) -> list[Call]:
    body = origin.to_json()
    return [command("SET", keys.origin(job_id), body, "PX", JOB_ORIGIN_TTL_MS) for job_id in job_ids]


def spec_origin_call(keys: QueueKeys, spec_key: str, origin: Origin) -> Call:
    return command("SET", keys.spec_origin(spec_key), origin.to_json(), "PX", SPEC_ORIGIN_TTL_MS)


def parse_origin(raw: object) -> Origin | None:
    """An origin record, or None when absent or damaged (a record is a convenience, never trusted
    beyond its four fields, each checked)."""
    if raw is None:
        return None
    try:
        data = json.loads(bytes(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else str(raw))
        fields = [data["dag_id"], data["run_id"], data["task_id"]]
        map_index = data.get("map_index", -1)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(isinstance(f, str) and 0 < len(f) <= _MAX_TEXT for f in fields):
        return None
    if isinstance(map_index, bool) or not isinstance(map_index, int) or not -1 <= map_index < 2**31:
        return None
    return Origin(fields[0], fields[1], fields[2], map_index)
