"""Batch handlers in the Spark worker: a batch as one DataFrame (issue 25).

A batch handler (``@handler(name, batch=N)``, docs/running-jobs.md) normally takes a list of
jobs.  In the Spark worker, one whose job parameter is named ``jobs_df`` takes the batch as
one DataFrame instead, built on the worker's SparkSession with the columns of
:data:`JOBS_SCHEMA`: ``id``, ``name``, ``attempt``, ``created_at_ms`` and ``data``, the payload
as a JSON string (``F.from_json`` reads it; bytes become base64 text, other values JSON cannot
hold become their ``str``).  It returns one result per job as the list form does, or a
DataFrame with an ``id`` column and ``result`` and/or ``error`` columns: each job takes the first
row of its id; a non-null ``error`` fails that job (its text is the reason), a job with no row
fails with a reason saying so, and ``result`` (a struct becomes a dict) is the job's result.
Such a DataFrame is collected on the driver, at most ``2 x`` the batch's rows, so a handler
cannot pull a huge one by mistake.

Imports pyspark only inside the functions.
"""

from __future__ import annotations

import base64
from typing import Any

from ..core.codec import data_json
from ..core.plain import to_plain
from ..errors import ChasquiError

__all__ = ["DATAFRAME_PARAM", "JOBS_SCHEMA", "batch_outcomes", "jobs_frame", "takes_dataframe"]

#: The name of a batch handler's job parameter that asks for the batch as one DataFrame.
DATAFRAME_PARAM = "jobs_df"
#: The columns of the DataFrame a ``jobs_df`` handler receives.
JOBS_SCHEMA = "id STRING, name STRING, attempt INT, created_at_ms LONG, data STRING"


def takes_dataframe(params: list[str]) -> bool:
    """Whether a handler's first parameter (its job) is :data:`DATAFRAME_PARAM`."""
    return bool(params) and params[0] == DATAFRAME_PARAM


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def jobs_frame(spark: Any, jobs: list[Any]) -> Any:
    """The batch as a DataFrame of :data:`JOBS_SCHEMA`, one row per job, in the batch's order."""
    rows = [(j.id, j.name, j.attempt, j.created_at_ms, _json(j.data)) for j in jobs]
    return spark.createDataFrame(rows, JOBS_SCHEMA)


def _json(data: Any) -> str:
    """A payload as JSON text (NaN and the infinities as ``NaN`` / ``Infinity``, which Spark's
    JSON reader takes by default)."""
    return data_json(data, default=_json_default)


def batch_outcomes(jobs: list[Any], out: Any) -> Any:
    """The handler's reply as the worker's batch contract wants it: a list as it is; a DataFrame
    (``id`` plus ``result`` and/or ``error``) as one result or exception per job, in order."""
    if not (hasattr(out, "columns") and hasattr(out, "limit") and hasattr(out, "collect")):
        return out  # a list (or something else the worker then refuses, naming it)
    columns = set(out.columns)
    if "id" not in columns or not columns & {"result", "error"}:
        raise ChasquiError(
            f"a jobs_df handler's DataFrame needs an id column and a result or error column, got {sorted(columns)}"
        )
    wanted = [c for c in ("id", "result", "error") if c in columns]
    rows = out.select(*wanted).limit(2 * len(jobs)).collect()
    first: dict[str, Any] = {}
    for row in rows:
        first.setdefault(str(row["id"]), row)
    outcomes: list[Any] = []
    for job in jobs:
        row = first.get(job.id)
        if row is None:
            outcomes.append(ChasquiError(f"the handler's DataFrame has no row for job {job.id}"))
        elif "error" in columns and row["error"] is not None:
            outcomes.append(ChasquiError(str(row["error"])))
        else:
            outcomes.append(_plain(row["result"]) if "result" in columns else None)
    return outcomes


def _plain(value: Any) -> Any:
    """A collected Spark value as a job result (a Row becomes a dict, recursively)."""
    return to_plain(value)
