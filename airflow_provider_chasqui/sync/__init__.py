"""Blocking twins of the producer side, for Airflow hooks and operators (no event loop)."""
