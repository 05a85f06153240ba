"""``ChasquiReplayDLQOperator``: move dead-lettered jobs back onto their queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from ..hooks.chasqui import ChasquiHook

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ChasquiReplayDLQOperator"]


class ChasquiReplayDLQOperator(BaseOperator):
    """Replays up to ``limit`` DLQ entries (oldest first, attempts reset) and returns the count.

    Entries that no longer decode stay in the DLQ, as in ChasquiMQ; the replay pages past them
    (they never hide the entries behind them) and logs how many it skipped.  Typical use: a manual or
    scheduled DAG run after the bug that dead-lettered the jobs is fixed.

    :param queue_name: the queue; default: the connection's ``default_queue``. (templated)
    :param chasqui_conn_id: the ``chasqui`` connection. (templated)
    :param limit: the most entries to move in this run.
    """

    template_fields: Sequence[str] = ("queue_name", "chasqui_conn_id")
    ui_color = "#f4d35e"

    def __init__(
        self,
        *,
        queue_name: str | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        limit: int = 100,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id
        self.limit = limit

    def execute(self, context: Context) -> int:
        with ChasquiHook(self.chasqui_conn_id).get_queue(self.queue_name) as queue:
            report = queue.replay_dlq_report(self.limit)
            self.log.info(
                "queue %s: replayed %d dead-lettered job(s); skipped %d undecodable entries (they stay in the DLQ)",
                queue.name,
                report["replayed"],
                report["skipped"],
            )
        return report["replayed"]
