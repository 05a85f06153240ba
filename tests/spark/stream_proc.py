"""A streaming query (parquet files -> format("chasqui")) in its own Spark process, run until a
test kills it: ``python stream_proc.py <src> <checkpoint> <queue> <redis_url> <load_id>``."""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def main(src: str, checkpoint: str, queue: str, url: str, load_id: str) -> None:
    warnings.simplefilter("ignore", FutureWarning)
    from pyspark.sql import SparkSession

    from airflow_provider_chasqui.spark.datasource import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("chasqui-stream-proc")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.schema("id BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(src)
        .writeStream.format("chasqui")
        .option("queue", queue)
        .option("redis_url", url)
        .option("name", "row")
        .option("load_id", load_id)
        .option("chunk_size", 25)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:6])
