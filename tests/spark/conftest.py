"""Fixtures of the Spark suite: one in-process SparkSession (``local[2]``) for the whole session.

PySpark is imported only here and in these tests, so the rest of the suite never pays for it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, as scripts/test.sh sets it


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    with warnings.catch_warnings():
        # pyspark 4.3 warns that it does not yet fully support pandas 3 (installed by the Spark provider).
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
        from pyspark.sql import SparkSession

        session = (SparkSession.builder.master("local[2]").appName("chasqui-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "4")
                   .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
