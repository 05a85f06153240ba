"""Provider metadata for Airflow's ``apache_airflow_provider`` entry point.

Airflow calls :func:`get_provider_info` from every process that initialises its providers
manager (CLI, scheduler, triggerer, workers), so this module stays a plain dict: it imports
neither Airflow nor Redis, and ``package-name`` must equal the distribution name, or
Airflow's discovery raises and takes every ``airflow`` command down with it.

The ``chasqui`` connection type declares its form declaratively (``conn-fields`` and
``ui-field-behaviour``, the Airflow 3.2+ way); the extras land in ``Connection.extra``
under the plain field names that :mod:`.hooks._connection` reads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["get_provider_info"]

_INTEGRATION = "Chasqui"
#: Where the README is published: it is the distribution's description, which the package index's
#: project page renders.  Equals pyproject's ``Documentation`` URL (``documentation-url`` to Airflow).
_DOCS = "https://pypi.org/project/airflow-provider-chasqui/"


def _field(label: str, kind: Any, description: str, **schema: Any) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": kind, **schema}}


_CONN_FIELDS: dict[str, Any] = {
    "db": _field(
        "Database", ["integer", "null"], "Redis logical database (standalone and Sentinel only).", default=0, minimum=0
    ),
    "default_queue": _field(
        "Default queue", ["string", "null"], "Queue used when an operator, sensor or hook call names none."
    ),
    "tls": _field("TLS", ["boolean", "null"], "Connect with TLS (rediss://).", default=False),
    "tls_verify": _field(
        "Verify TLS certificate",
        ["boolean", "null"],
        "Check the server certificate (turn off only for tests).",
        default=True,
    ),
    "tls_ca_certs": _field("TLS CA bundle", ["string", "null"], "Path of a PEM CA bundle on the workers."),
    "mode": _field(
        "Mode",
        "string",
        "standalone: one server; sentinel: Host/Port (or Sentinels) are Sentinels "
        "asked for the master; cluster: Host/Port is one node of a Redis Cluster.",
        enum=["standalone", "sentinel", "cluster"],
        default="standalone",
    ),
    "sentinel_service": _field(
        "Sentinel service", ["string", "null"], "Master name monitored by the Sentinels (sentinel mode)."
    ),
    "sentinels": _field(
        "Sentinels", ["string", "null"], "host:port,host:port of the Sentinels; default: Host and Port (sentinel mode)."
    ),
    "sentinel_password": _field(
        "Sentinel password",
        ["string", "null"],
        "Password of the Sentinels themselves, if they require one.",
        format="password",
    ),
}


_CONFIG: dict[str, Any] = {
    "chasqui": {
        "description": "Defaults of the Chasqui provider's operators and sensors.",
        "options": {
            "default_deferrable": {
                "description": "Whether ChasquiJobSensor and ChasquiEnqueueOperator(wait_for_result=True) "
                "wait in the triggerer when their deferrable argument is not given.  Unset "
                "(the default), they follow [operators] default_deferrable, as the official "
                "providers' operators do; set, it overrides that for Chasqui only.",
                "version_added": "0.1.0",
                "type": "boolean",
                "example": "True",
                "default": None,
            },
            "credential_provider": {
                "description": "pkg.module:attr of an async function (endpoint) -> (username, password) "
                "(or a redis-py CredentialProvider) that the hook's queues, the triggers, the "
                "dashboard and `chasqui` commands given --conn-id authenticate with, asked for each new "
                "connection: short-lived tokens (ElastiCache or MemoryDB IAM, Azure Entra).  The "
                "connection then carries no password.  Configuration only, never a connection "
                "field: whoever edits connections must not choose code that Airflow runs.",
                "version_added": "0.1.0",
                "type": "string",
                "example": "my_company.redis_auth:iam_token",
                "default": None,
            },
        },
    },
}


def get_provider_info() -> dict[str, Any]:
    """The provider description Airflow validates against ``provider_info.schema.json``."""
    return {
        "package-name": "airflow-provider-chasqui",
        "name": "Chasqui",
        "description": "Redis Streams job queue and cron scheduler (ChasquiMQ-compatible) for Airflow.",
        "integrations": [{"integration-name": _INTEGRATION, "external-doc-url": _DOCS, "tags": ["software"]}],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_chasqui.hooks.chasqui"]}],
        "operators": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "airflow_provider_chasqui.operators.enqueue",
                    "airflow_provider_chasqui.operators.repeatable",
                    "airflow_provider_chasqui.operators.dlq",
                ],
            }
        ],
        "sensors": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_chasqui.sensors.job"]}],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "airflow_provider_chasqui.triggers.job",
                    "airflow_provider_chasqui.triggers.queue_events",
                ],
            }
        ],
        "queues": ["airflow_provider_chasqui.queues.chasqui.ChasquiMessageQueueProvider"],
        "config": _CONFIG,
        # task buttons in the UI that open the job's / spec's page of the dashboard plugin
        "extra-links": [
            "airflow_provider_chasqui.operators.links.ChasquiJobLink",
            "airflow_provider_chasqui.operators.links.ChasquiScheduleLink",
        ],
        "connection-types": [
            {
                "connection-type": "chasqui",
                "hook-class-name": "airflow_provider_chasqui.hooks.chasqui.ChasquiHook",
                "hook-name": "Chasqui (Redis Streams)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema"],
                    "relabeling": {"login": "ACL user (optional)"},
                    "placeholders": {"host": "localhost", "port": "6379", "login": "default"},
                },
                "conn-fields": _CONN_FIELDS,
            }
        ],
    }
