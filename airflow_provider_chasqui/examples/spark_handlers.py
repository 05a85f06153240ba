"""Spark handlers for the example sales pipeline (``example_dags/spark_sales_pipeline.py``).

Run them with the Spark worker::

    CHASQUI_REDIS_URL=redis://... SPARK_LOCAL_IP=127.0.0.1 spark-submit --master local[2] \\
        "$(python -c 'import airflow_provider_chasqui.worker.spark as m; print(m.__file__)')" \\
        --queue spark --handlers airflow_provider_chasqui.examples.spark_handlers

(the URL from the environment or ``--conn-id``, never a spark-submit argument: argv is public;
``SPARK_LOCAL_IP=127.0.0.1`` keeps a local try's driver on loopback, leave it out on a cluster).
The worker runs each handler thread's Spark jobs in its own FAIR pool (declared in the shipped
``worker/fairscheduler.xml``) and logs Spark at WARN unless ``spark.log.level`` is set.

``sales_rollup`` reads a sales CSV (as written by :func:`generate_sales_csv`), aggregates it
per day and region into a Parquet rollup and returns ``{"rows", "input_rows", "revenue",
"output"}``: JSON-compatible, so Airflow's sensor can hand it to a downstream task through
XCom.  A missing input or a bad payload dead-letters the job at once (``UnrecoverableError``):
retrying cannot fix it.

Must never import airflow; pyspark is only used through the ``spark`` argument.
"""

from __future__ import annotations

import csv
import os
import random
from datetime import date, timedelta
from typing import Any

from ..errors import UnrecoverableError
from ..types import Job
from ..worker.registry import handler

__all__ = ["SALES_COLUMNS", "generate_sales_csv", "sales_rollup", "expected_rollup"]

SALES_COLUMNS = ("order_id", "day", "region", "product", "quantity", "unit_price")
_REGIONS = ("north", "south", "east", "west")
_PRODUCTS = {"widget": 2.50, "gadget": 12.00, "gizmo": 7.25, "doohickey": 0.99}
_SCHEMA_DDL = "order_id BIGINT, day DATE, region STRING, product STRING, quantity INT, unit_price DOUBLE"


def generate_sales_csv(
    path: str, rows: int = 10_000, *, seed: int = 7, days: int = 28, start: date = date(2026, 1, 1)
) -> dict[str, Any]:
    """Write a deterministic sales CSV with a header; returns ``{"path", "rows"}``."""
    if rows <= 0:
        raise ValueError("rows must be positive")
    rng = random.Random(seed)
    products = sorted(_PRODUCTS)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(SALES_COLUMNS)
        for i in range(rows):
            product = products[rng.randrange(len(products))]
            out.writerow(
                (
                    i,
                    (start + timedelta(days=rng.randrange(days))).isoformat(),
                    _REGIONS[rng.randrange(len(_REGIONS))],
                    product,
                    rng.randint(1, 20),
                    _PRODUCTS[product],
                )
            )
    os.replace(tmp, path)  # readers never see half a file
    return {"path": path, "rows": rows}


def expected_rollup(path: str) -> dict[tuple[str, str], tuple[int, int, float]]:
    """The rollup computed in plain Python (for tests): (day, region) -> (orders, units, revenue)."""
    out: dict[tuple[str, str], list[Any]] = {}
    with open(path, newline="") as fh:
        for rec in csv.DictReader(fh):
            acc = out.setdefault((rec["day"], rec["region"]), [0, 0, 0.0])
            acc[0] += 1
            acc[1] += int(rec["quantity"])
            acc[2] += int(rec["quantity"]) * float(rec["unit_price"])
    return {k: (v[0], v[1], round(v[2], 2)) for k, v in out.items()}


def _paths(job: Job) -> tuple[str, str]:
    data = job.data
    if not isinstance(data, dict) or not isinstance(data.get("input"), str) or not isinstance(data.get("output"), str):
        raise UnrecoverableError(f"sales_rollup needs {{'input': csv path, 'output': parquet dir}}, got {data!r}")
    if not os.path.exists(data["input"]):
        raise UnrecoverableError(f"sales_rollup: input dataset {data['input']!r} does not exist")
    return data["input"], data["output"]


@handler("sales_rollup")
def sales_rollup(job: Job, spark: Any) -> dict[str, Any]:
    """CSV of orders -> Parquet of (day, region, orders, units, revenue), one file set per output dir."""
    from pyspark.sql import functions as F

    source, output = _paths(job)
    sales = spark.read.csv(source, header=True, schema=_SCHEMA_DDL, mode="FAILFAST")
    rollup = (
        sales.groupBy("day", "region")
        .agg(
            F.count(F.lit(1)).alias("orders"),
            F.sum("quantity").alias("units"),
            F.round(F.sum(F.col("quantity") * F.col("unit_price")), 2).alias("revenue"),
        )
        .orderBy("day", "region")
    )
    rollup.coalesce(1).write.mode("overwrite").parquet(output)
    written = spark.read.parquet(output)
    totals = written.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum("orders").alias("input_rows"),
        F.round(F.sum("revenue"), 2).alias("revenue"),
    ).first()
    return {
        "rows": int(totals["rows"]),
        "input_rows": int(totals["input_rows"] or 0),
        "revenue": float(totals["revenue"] or 0.0),
        "output": output,
        "job_id": job.id,
    }
