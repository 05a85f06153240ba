"""``format("chasqui")``: a Spark Python Data Source for queues (PySpark 4 ``pyspark.sql.datasource``).

    from airflow_provider_chasqui.spark.datasource import register
    register(spark)                       # once per session (classic or Spark Connect)
    df.write.format("chasqui").option("queue", "emails").option("name", "send").mode("append").save()

Works the same over Spark Connect: the class is pickled by reference, so the server's Python
workers need this package installed.  See docs/spark.md for every option.  Importing this
package imports pyspark (``airflow_provider_chasqui.spark`` itself does not).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from ...errors import ConfigError
from .options import ENV_URL, write_plan
from .reader import SCHEMAS, ChasquiReader, ChasquiStreamReader, read_plan
from .writer import ChasquiArrowWriter, ChasquiStreamWriter, load_report

__all__ = ["ENV_URL", "ChasquiDataSource", "load_report", "register"]

_SPARK_KEYS = ("checkpointlocation", "path")


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
        return ChasquiReader(read_plan(self._options()))

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
        return ChasquiArrowWriter(write_plan(options, schema))

    def streamWriter(self, schema: Any, overwrite: bool) -> ChasquiStreamWriter:
        options = self._options()
        if not options.get("load_id"):
            raise ConfigError(
                'chasqui: a streaming write needs .option("load_id", "<a name stable across '
                'restarts>"): ids are derived from it and the micro-batch id, which makes the sink '
                "exactly-once"
            )
        return ChasquiStreamWriter(write_plan(options, schema))


def register(spark: Any) -> None:
    """Make ``format("chasqui")`` known to this SparkSession (classic or Connect)."""
    spark.dataSource.register(ChasquiDataSource)
