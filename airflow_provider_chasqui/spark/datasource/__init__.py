"""``format("chasqui")``: a Spark Python Data Source for queues (PySpark 4 ``pyspark.sql.datasource``).

    from airflow_provider_chasqui.spark.datasource import register
    register(spark)                       # once per session (classic or Spark Connect)
    df.write.format("chasqui").option("queue", "emails").option("name", "send").mode("append").save()

Works the same over Spark Connect: the class is pickled by reference, so the server's Python
workers need this package installed.  See docs/spark.md for every option.  Importing this
package imports pyspark (``airflow_provider_chasqui.spark`` itself does not).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from types import FrameType
from typing import Any

from pyspark.sql.datasource import DataSource

from ...errors import ConfigError
from .options import ENV_URL, WritePlan, write_plan
from .reader import (
    SCHEMAS,
    ChasquiFilteringReader,
    ChasquiReader,
    read_plan,
)
from .stream import ChasquiStreamReader
from .writer import ChasquiArrowWriter, ChasquiStreamWriter, load_report

__all__ = ["ENV_URL", "PUSHDOWN_CONF", "ChasquiDataSource", "load_report", "register"]

_SPARK_KEYS = ("checkpointlocation", "path")
#: Spark's switch for ``pushFilters``; off by default in Spark 4.1-4.3, turned on by ``register()``.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_PLAN_WITHOUT_PUSHDOWN = "pyspark.sql.worker.plan_data_source_read"


def _planned_without_pushdown() -> bool:
    """Whether Spark's Python planner called ``reader()`` on the path without filter pushdown:
    it refuses a reader that implements ``pushFilters`` there (DATA_SOURCE_PUSHDOWN_DISABLED)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == _PLAN_WITHOUT_PUSHDOWN:
            return True
        frame = frame.f_back
    return False


class ChasquiDataSource(DataSource):
    """The ``chasqui`` format: writes jobs (batch and streaming), reads a queue's events, dead
    letters, results and repeatable specs (batch; events also as a stream)."""

    @classmethod
    def name(cls) -> str:
        return "chasqui"

    def _options(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.options.items() if k.lower() not in _SPARK_KEYS or k.lower() == "path"}

    def schema(self) -> str:
        return SCHEMAS[read_plan(self._options()).what]

    def reader(self, schema: Any) -> ChasquiReader:
        plan = read_plan(self._options())
        # With pushdown off in the session, hand Spark the reader without pushFilters (it filters itself).
        return ChasquiReader(plan, schema) if _planned_without_pushdown() else ChasquiFilteringReader(plan, schema)

    def streamReader(self, schema: Any) -> ChasquiStreamReader:
        return ChasquiStreamReader(read_plan(self._options()))

    def writer(self, schema: Any, overwrite: bool) -> ChasquiArrowWriter:
        if overwrite:
            raise ConfigError('chasqui: a queue is append-only: use .mode("append")')
        options = self._options()
        kind = options.get("kind", "jobs")
        if kind == "repeatable":
            from .specs import ChasquiSpecWriter, spec_plan

            return ChasquiSpecWriter(spec_plan(options, schema))  # type: ignore[return-value]
        if kind != "jobs":
            raise ConfigError(f"chasqui: option kind must be jobs or repeatable, got {kind!r}")
        return ChasquiArrowWriter(_marked(write_plan(options, schema)))

    def streamWriter(self, schema: Any, overwrite: bool) -> ChasquiStreamWriter:
        options = self._options()
        if not options.get("load_id"):
            raise ConfigError(
                'chasqui: a streaming write needs .option("load_id", "<a name stable across '
                'restarts>"): ids are derived from it and the micro-batch id, which makes the sink '
                "exactly-once"
            )
        return ChasquiStreamWriter(_marked(write_plan(options, schema)))


def _marked(plan: WritePlan) -> WritePlan:
    """With ``timeout_ms``, on the driver before any task writes: mark the queue as one whose
    jobs carry timeouts (the first time, this waits until every worker must know it)."""
    if plan.timeout_ms:
        from ...core.running import mark_timeouts
        from ...sync.queue import SyncQueue

        with SyncQueue(plan.queue, redis_url=plan.url) as queue:
            queue.driver.run(mark_timeouts(queue.keys))
    return plan


def register(spark: Any, *, pushdown: bool = True) -> None:
    """Make ``format("chasqui")`` known to this SparkSession (classic or Connect) and, unless
    ``pushdown=False``, turn on Spark's filter pushdown into Python data sources
    (``spark.sql.python.filterPushdown.enabled``) so time and name filters narrow batch reads.

    On a local classic session whose Python workers run another interpreter that cannot import
    this package (``python job.py`` from a venv without ``PYSPARK_PYTHON``), a ``ConfigError``
    says so now, instead of a ``ModuleNotFoundError`` deep in the first job's Spark traceback."""
    _check_workers_python(spark)
    spark.dataSource.register(ChasquiDataSource)
    if pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")


def _check_workers_python(spark: Any) -> None:
    """See :func:`register`: only where the workers' interpreter is on this machine."""
    try:
        sc = spark.sparkContext  # Spark Connect has none: its server's workers (docs/spark.md)
        master, python = str(sc.master), str(sc.pythonExec or "")
    except Exception:  # noqa: BLE001 - not a classic session: nothing to check here
        return
    if not master.startswith("local") or not python:
        return
    found = shutil.which(python) or python
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    probe = subprocess.run(  # from a neutral directory: Spark's workers do not run in the driver's
        [found, "-c", "import airflow_provider_chasqui"], capture_output=True, timeout=120, cwd=tempfile.gettempdir()
    )
    if probe.returncode != 0:
        raise ConfigError(
            f"Spark runs its Python workers with {python!r}, which cannot import airflow_provider_chasqui "
            f"(this driver runs {sys.executable!r}): set PYSPARK_PYTHON={sys.executable} (or the config "
            "spark.pyspark.python) before the session starts, or install the package there (docs/spark.md)"
        )
