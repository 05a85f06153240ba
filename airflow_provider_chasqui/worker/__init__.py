"""The worker process: ``chasqui worker`` (:mod:`.cli`), the Spark entry (:mod:`.spark`), the handler
registry (:mod:`.registry`) and Prometheus metrics (:mod:`.metrics`).

Importing this package imports none of its submodules' optional dependencies (airflow,
pyspark, prometheus_client); the registry helpers are re-exported because handler modules use them.
"""

from __future__ import annotations

from .registry import HandlerLoadError, HandlerRegistry, handler, load_handlers

__all__ = ["HandlerLoadError", "HandlerRegistry", "handler", "load_handlers"]
