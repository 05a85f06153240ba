"""Spark integration: the ``format("chasqui")`` data source (:mod:`.datasource`, imported on
demand: it imports pyspark) and the bulk loaders over it (:mod:`.bulk`).  The Spark *worker* is
:mod:`airflow_provider_chasqui.worker.spark`.

Importing this package does not import pyspark (the functions take a DataFrame and use it).
"""

from __future__ import annotations

from .bulk import DEFAULT_BATCH, enqueue_dataframe, to_plain, upsert_specs_dataframe

__all__ = ["DEFAULT_BATCH", "enqueue_dataframe", "to_plain", "upsert_specs_dataframe"]
