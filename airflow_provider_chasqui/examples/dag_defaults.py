"""What the example DAGs share: their queues and data directory, each defined once here.

Each default can be changed per deployment by an environment variable, read when a DAG file
is parsed, and every run can still pick another queue through the DAG's ``queue`` Param:

* ``CHASQUI_EXAMPLES_QUEUE`` (``chasqui-examples``): the queue of the plain examples, served
  by ``chasqui worker --handlers airflow_provider_chasqui.examples.handlers``;
* ``CHASQUI_EVENTS_QUEUE`` (``chasqui-events``): the event-driven example's queue mode;
* ``CHASQUI_SPARK_QUEUE`` (``spark``): the Spark pipeline's queue, served by a long-running
  Spark worker;
* ``CHASQUI_SPARK_BATCH_QUEUE`` (``spark-batch``): the queue the batch Spark worker of
  ``spark_batch_worker.py`` drains and exits (kept apart from ``spark`` so a long-running
  worker does not take its jobs);
* ``CHASQUI_DATA_DIR`` (``/tmp/chasqui-data``): where the Spark examples read and write.

Imports neither Airflow nor pyspark at module level (workers import this package too).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["EXAMPLES_QUEUE", "EVENTS_QUEUE", "SPARK_QUEUE", "SPARK_BATCH_QUEUE", "DATA_DIR", "queue_param"]

EXAMPLES_QUEUE = os.environ.get("CHASQUI_EXAMPLES_QUEUE") or "chasqui-examples"
EVENTS_QUEUE = os.environ.get("CHASQUI_EVENTS_QUEUE") or "chasqui-events"
SPARK_QUEUE = os.environ.get("CHASQUI_SPARK_QUEUE") or "spark"
SPARK_BATCH_QUEUE = os.environ.get("CHASQUI_SPARK_BATCH_QUEUE") or "spark-batch"
DATA_DIR = os.environ.get("CHASQUI_DATA_DIR") or "/tmp/chasqui-data"


def queue_param(default: str = EXAMPLES_QUEUE, what: str = "a worker of the example handlers") -> Any:
    """The ``queue`` Param of an example DAG: the shared default, overridable per run."""
    from airflow.sdk import Param

    return Param(
        default,
        type="string",
        minLength=1,
        description=f"the Chasqui queue {what} consumes (default from the environment, see "
        "airflow_provider_chasqui.examples.dag_defaults)",
    )
