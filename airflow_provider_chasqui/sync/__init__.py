"""Blocking twins of the producer side, for Airflow hooks and operators (no event loop).

The names other parts use come from here, not from the private modules."""

from ._driver import SyncDriver, raw_client, translate_errors
from ._sentinel import make_client

__all__ = ["SyncDriver", "raw_client", "translate_errors", "make_client"]
