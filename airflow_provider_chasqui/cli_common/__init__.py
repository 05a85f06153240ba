"""What every ``chasqui`` command line shares (the worker's, the operator commands', the
dashboard's): the default Redis URL, where a command finds its Redis (``--redis-url``, an Airflow
connection, ``$CHASQUI_REDIS_URL``), argument types and the process's logging setup.  Log formats:
:mod:`.logs`."""

from __future__ import annotations

import argparse
import logging
import logging.config
import os

from ..core.urls import DEFAULT_URL, check_url, redact_text
from ..errors import ConfigError
from .logs import formatter_spec

__all__ = [
    "DEFAULT_URL",
    "LOG_LEVELS",
    "non_negative_int",
    "positive_int",
    "tcp_port",
    "resolve_url",
    "configure_logging",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _int_arg(text: str, low: int, high: int | None, expected: str) -> int:
    """``text`` as an int from ``low`` to ``high``, or argparse's usage error naming it."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A strictly positive integer."""
    return _int_arg(text, 1, None, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer from 0 (for options where 0 means "no limit")."""
    return _int_arg(text, 0, None, "a non-negative integer")


def tcp_port(text: str) -> int:
    """A TCP port (0: any free one)."""
    return _int_arg(text, 0, 65535, "a TCP port in 0..65535")


def resolve_url(redis_url: str | None, conn_id: str | None, default: str = DEFAULT_URL) -> tuple[str, str | None]:
    """``(url, the connection's default queue)``: ``redis_url``, else the Airflow connection
    ``conn_id``, else ``$CHASQUI_REDIS_URL``, else ``default``."""
    if redis_url:
        return check_url(redis_url), None
    if conn_id:
        return _from_airflow_connection(conn_id)
    return check_url(os.environ.get("CHASQUI_REDIS_URL") or default), None


# the metadata database URL an Airflow 3 task's supervisor gives the task's processes
_TASK_BLOCKED_DB = "airflow-db-not-allowed:"


def _from_airflow_connection(conn_id: str) -> tuple[str, str | None]:
    """The only place this command touches Airflow (imported here, on demand)."""
    in_task = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").startswith(_TASK_BLOCKED_DB)
    if in_task:
        # Started by an Airflow 3 task (SparkSubmitOperator, BashOperator...): its supervisor blocks
        # the metadata database for the task's processes with a URL that makes importing Airflow
        # fail; import it as Airflow's virtualenv operators do, without an ORM.
        os.environ.setdefault("PYTHON_OPERATORS_VIRTUAL_ENV_MODE", "1")
    try:
        from ..hooks.chasqui import register_configured_provider, settings_outside_task
    except ImportError as exc:
        raise ConfigError(
            f"--conn-id needs Airflow ({exc}); install 'airflow-provider-chasqui[airflow]' or pass --redis-url"
        ) from exc
    try:
        settings = settings_outside_task(conn_id)
    except Exception as exc:
        if in_task:  # "not found", though the UI may well have it: say why it cannot be read here
            raise ConfigError(_in_task_message(conn_id, exc)) from exc
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"Airflow connection {conn_id!r} could not be read: {type(exc).__name__}: {redact_text(exc)}"
        ) from exc
    url = settings.redis_url()
    register_configured_provider(url)  # [chasqui] credential_provider, as the tasks' and the triggerer's
    return url, settings.default_queue


def _in_task_message(conn_id: str, exc: BaseException) -> str:
    """Why ``--conn-id`` fails in a child of an Airflow 3 task, and the two ways out."""
    return (
        f"Airflow connection {conn_id!r} cannot be read here: this process was started by an Airflow "
        "task, and Airflow 3 blocks the metadata database for a task's child processes "
        "(AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=airflow-db-not-allowed:///), so a connection made in "
        "the UI or with `airflow connections add` is out of reach.  Resolve it in the task "
        f"(ChasquiHook({conn_id!r}).get_settings().redis_url()) and pass it to this process as "
        "CHASQUI_REDIS_URL in its environment (example_dags/spark_batch_worker.py does), or give the "
        f"connection as AIRFLOW_CONN_{conn_id.upper()} or through a secrets backend "
        f"(lookup said: {type(exc).__name__}: {redact_text(exc)})"
    )


def configure_logging(level: str, fmt: str = "human") -> None:
    """The worker process's logging: one line per record on stderr (``fmt``: ``human`` text or
    ``json``, see :mod:`.logs`; Python warnings are logged too).  Only CLIs call this."""
    logging.captureWarnings(True)
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"line": formatter_spec(fmt)},
            "handlers": {
                "stderr": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}
            },
            "loggers": {
                "airflow_provider_chasqui": {"level": level},
                "py4j": {"level": "WARNING"},
                "asyncio": {"level": "WARNING"},
            },
            "root": {"level": level, "handlers": ["stderr"]},
        }
    )
