"""Spark integration: bulk loads from DataFrames (:mod:`.bulk`).  The Spark *worker* is
:mod:`airflow_provider_chasqui.worker.spark`.

Importing this package does not import pyspark (the functions take a DataFrame and use it).
"""

from __future__ import annotations

from .bulk import DEFAULT_BATCH, enqueue_dataframe, to_plain, upsert_specs_dataframe

__all__ = ["DEFAULT_BATCH", "enqueue_dataframe", "to_plain", "upsert_specs_dataframe"]
