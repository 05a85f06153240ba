"""The promoter: moves due delayed jobs into the stream, leader-locked (wire spec 15.1).

Runs embedded in every ``Worker`` and standalone (``Promoter(...).run()``) for producer-only
deployments.  Promotion is one Lua call that uses Redis' clock, so two leaders at once still
cannot promote a member twice.
"""

from __future__ import annotations

from typing import Any

from ..core.calls import int_reply, script_call
from ..core.keys import QueueKeys
from ..core.settings import MAX_COUNT, QueueSettings, check_flags, check_int
from ._driver import AsyncDriver
from .leader import LeaderLoop
from .metrics import metrics_sink

__all__ = ["Promoter"]


class Promoter(LeaderLoop):
    role = "promoter"
    interval_arg = "poll_interval_ms"

    def __init__(
        self,
        driver: AsyncDriver,
        queue: str,
        *,
        holder: str | None = None,
        poll_interval_ms: int = 100,
        batch: int = 256,
        lock_ttl_secs: int = 5,
        settings: QueueSettings | None = None,
        events: bool = True,
        metrics: Any = None,
    ) -> None:
        check_flags(events=events)
        self.keys = QueueKeys.for_queue(queue)
        super().__init__(
            driver, self.keys.promoter_lock, holder=holder, interval_ms=poll_interval_ms, lock_ttl_secs=lock_ttl_secs
        )
        self.settings = QueueSettings.given(settings)
        self.batch = check_int("batch", batch, 1, MAX_COUNT)
        self.events_max = self.settings.events_max_len if events else 0
        self.metrics = metrics_sink(metrics)
        self.promoted_total = 0

    async def tick(self) -> bool:
        k = self.keys
        reply = await self.driver.call(
            script_call(
                "promote",
                (k.delayed, k.stream, k.events, k.dlq),
                (self.batch, self.settings.max_stream_len, self.events_max, k.prefix, self.settings.dlq_max_len),
            )
        )
        promoted, depth, lag = (int_reply(x) for x in reply[:3])
        self.promoted_total += promoted
        self.metrics.promoter_tick(self.keys.queue, promoted, depth, lag)
        return promoted >= self.batch
