"""A Spark handler the pipeline test controls: it runs a Spark job only once released, so a
SIGTERM can arrive while it is in flight (loaded by the Spark worker by dotted path)."""

from __future__ import annotations

import os
import time

from airflow_provider_chasqui.worker import handler


@handler("spark_hold")
def spark_hold(job, spark):
    folder = job.data["dir"]
    with open(os.path.join(folder, f"started-{job.id}"), "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(folder, "release")):
        if time.monotonic() > deadline:
            raise TimeoutError("spark_hold was never released")
        time.sleep(0.01)
    # A Spark job after the SIGTERM: proves the session is still up while the worker drains.
    return {
        "count": spark.range(int(job.data.get("n", 1000))).count(),
        "job_group": spark.sparkContext.getLocalProperty("spark.jobGroup.id"),
    }


@handler("spark_count")
def spark_count(job, spark):
    return {"count": spark.range(int(job.data["n"])).count(), "master": spark.sparkContext.master}


@handler("spark_connect_count")
def spark_connect_count(job, spark):
    """Works on any session (no SparkContext): what a handler run over Spark Connect sees."""
    return {
        "count": spark.range(int(job.data["n"])).count(),
        "session": type(spark).__module__,
        "tags": sorted(spark.getTags()) if hasattr(spark, "getTags") else None,
    }


@handler("spark_stop_session")
def spark_stop_session(job, spark):
    """A handler written as a script would be: it stops the session when done."""
    n = spark.range(5).count()
    spark.stop()
    return n


@handler("spark_connect_stop_session")
def spark_connect_stop_session(job, spark):
    """As ``spark_stop_session``, for any session (no SparkContext): over Spark Connect too."""
    n = spark.range(5).count()
    spark.stop()
    return n
