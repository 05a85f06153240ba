"""The Spark worker's SparkSession: built once per process, classic or Spark Connect.

spark-submit's ``--master`` and ``--conf`` win over the worker's defaults (FAIR scheduling
with the shipped ``fairscheduler.xml`` pools, Spark's log level at WARN), ``--spark-conf``
wins over both; ``--remote`` (or ``$SPARK_REMOTE``) makes it a Spark Connect client.  PySpark
is imported only when a session is built.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_provider_chasqui.errors import ConfigError

__all__ = [
    "DEFAULT_SPARK_LOG_LEVEL",
    "ENV_REMOTE",
    "POOLS",
    "POOL_FILE",
    "build_session",
    "describe_remote",
    "is_connect",
    "parse_conf",
    "remote_url",
    "session_defaults",
]

log = logging.getLogger("airflow_provider_chasqui.worker.spark")

#: Spark's log level unless ``spark.log.level`` is set (spark-submit ``--conf`` or ``--spark-conf``):
#: Spark's warnings and errors stay, its per-stage and per-task INFO lines go.
DEFAULT_SPARK_LOG_LEVEL = "WARN"
#: The FAIR pools ``fairscheduler.xml`` declares (``chasqui-0`` to ``chasqui-15``).
POOLS = 16
#: The scheduler allocation file the worker uses unless ``spark.scheduler.allocation.file`` is set.
POOL_FILE = str(Path(__file__).resolve().with_name("fairscheduler.xml"))


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--spark-conf takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


#: Where the Spark Connect URL comes from when ``--remote`` is not given (pyspark's own variable).
ENV_REMOTE = "SPARK_REMOTE"


def remote_url(args: argparse.Namespace) -> str | None:
    """``--remote``, else ``$SPARK_REMOTE``, else None (a classic session)."""
    url = getattr(args, "remote", None) or os.environ.get(ENV_REMOTE) or None
    if url is not None and not (url.startswith(("sc://", "local[")) or url == "local"):
        raise ConfigError(
            f"--remote / ${ENV_REMOTE} must be a Spark Connect URL (sc://host:port), got {describe_remote(url)!r}"
        )
    return url


def describe_remote(url: str) -> str:
    """The URL for logs: scheme, host and port only (a ``;token=...`` parameter never shows)."""
    head = url.split(";", 1)[0]
    scheme, sep, rest = head.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]  # never user:password@
    return f"{scheme}{sep}{host}" if sep else head.rsplit("@", 1)[-1]


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no SparkContext, no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def build_session(
    app_name: str | None, conf: dict[str, str], *, default_name: str = "chasqui-worker", remote: str | None = None
) -> Any:
    """The process's SparkSession; spark-submit's ``--master``/``--conf`` win over our defaults.
    With ``remote`` (a ``sc://`` URL): a Spark Connect session, with ``conf`` as its session
    settings (static ones are ignored by the server)."""
    from pyspark.sql import SparkSession

    if remote is not None:
        builder = SparkSession.builder.remote(remote)
        for key, value in conf.items():
            builder = builder.config(key, value)
        if app_name:
            log.info("--app-name does not apply to a Spark Connect session (the server names the application)")
        return builder.getOrCreate()
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # joins spark-submit's JVM (or starts one) so its settings are visible
    existing = SparkConf()  # spark-submit's --master/--conf, as JVM system properties
    builder = SparkSession.builder
    given = existing.get("spark.app.name", None)  # spark-submit --name; its default is the file's name
    if app_name or not given or given == os.path.basename(sys.argv[0] or ""):
        builder = builder.appName(app_name or default_name)
    for key, value in session_defaults(existing, conf).items():
        builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def session_defaults(existing: Any, conf: dict[str, str]) -> dict[str, str]:
    """What the worker sets when neither spark-submit nor ``--spark-conf`` did: FAIR scheduling
    with the shipped pools (no "pool ... has not been configured" warning per handler thread),
    and Spark's log level (WARN: a batch's output is the worker's lines and Spark's warnings)."""

    def given(key: str) -> bool:
        return key in conf or existing.contains(key)

    out: dict[str, str] = {}
    if not given("spark.scheduler.mode"):
        out["spark.scheduler.mode"] = "FAIR"
    mode = conf.get("spark.scheduler.mode") or existing.get("spark.scheduler.mode", None) or "FAIR"
    if mode.upper() == "FAIR" and not given("spark.scheduler.allocation.file"):
        out["spark.scheduler.allocation.file"] = Path(POOL_FILE).as_uri()  # file:, not the cluster's default FS
    if not given("spark.log.level"):
        out["spark.log.level"] = DEFAULT_SPARK_LOG_LEVEL
    return out
