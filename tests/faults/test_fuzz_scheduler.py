"""Fuzzing a live scheduler with hostile stored specs, spec extensions and scores.

A real :class:`Scheduler` runs in a background thread on the shared Redis with one good
spec firing every 50 ms.  Hypothesis writes, next to it, repeat entries whose stored spec is
random bytes, msgpack of the wrong shape, a mutated valid spec or missing, whose ``ext``
field is junk, and whose score is due, ``-inf`` or far in the past.

Proven for every example: the scheduler never stops ticking, the good spec keeps firing,
every hostile entry is processed within seconds (fired and rescheduled, dropped, or moved
aside; none is left at the score it was written with), and
every spec that does not decode is moved to ``:repeat:quarantine`` with its exact bytes.
"""

from __future__ import annotations

import asyncio
import threading
import time

import msgpack
import pytest
import redis
from engine_support import wait_until_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui import RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.repeat import StoredSpec
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.engine.scheduler import Scheduler

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_counter = iter(range(10**9))


class SchedulerThread:
    def __init__(self, url: str, queue: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.driver: AsyncDriver | None = None
        self.scheduler: Scheduler | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(url, queue), name="fuzz-scheduler", daemon=True)

    def _main(self, url: str, queue: str) -> None:
        async def run() -> None:
            self.driver = AsyncDriver(url)
            self.scheduler = Scheduler(self.driver, queue, tick_ms=20)
            self.ready.set()
            try:
                await self.scheduler.run()
            finally:
                await self.driver.close()

        try:
            self.loop.run_until_complete(run())
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
        finally:
            self.loop.close()

    def __enter__(self) -> SchedulerThread:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.scheduler is not None
        self.loop.call_soon_threadsafe(self.scheduler.stop)
        self.thread.join(30)
        assert not self.thread.is_alive() and self.error is None, self.error

    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None


def _mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.integers(1, len(valid) - 1).map(lambda n: valid[:n]),  # truncated
        st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
            lambda t: valid[: t[0]] + bytes([t[1]]) + valid[t[0] + 1 :]
        ),  # one byte changed
        st.binary(min_size=1, max_size=8).map(lambda b: valid + b),  # trailing bytes
    )


_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
_junk = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=9) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=14,
).map(_packb)
_shaped = st.tuples(  # the StoredSpec array shape with arbitrary field values
    st.text(max_size=8),
    st.text(max_size=8),
    st.dictionaries(
        st.sampled_from(["Every", "Cron", "every", "cron", "x"]), st.lists(_scalar, max_size=3), min_size=1, max_size=2
    ),
    st.binary(max_size=6),
    _scalar,
    _scalar,
    _scalar,
    _scalar,
).map(lambda t: _packb(list(t)))


def _decodes(raw: bytes | None) -> bool:
    try:
        StoredSpec.decode(raw)  # type: ignore[arg-type]
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.timeout(300)
def test_hostile_stored_specs_never_stall_the_scheduler(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.upsert_repeatable_job("ok", {}, repeat=RepeatPattern.every(50), key="good")
    r = redis.Redis.from_url(redis_url, protocol=2)
    r.response_callbacks.clear()
    valid = r.execute_command("HGET", keys.repeat_spec("good"), "spec")
    tally = {"quarantined": 0, "handled": 0}
    try:
        with SchedulerThread(redis_url, queue_name) as st_:
            spec_bytes = st.one_of(st.binary(max_size=40), _junk, _shaped, _mutations(valid), st.just(valid), st.none())
            entry = st.tuples(
                spec_bytes,
                st.none() | st.binary(max_size=12) | _junk,
                st.sampled_from(["due", "due", "due", "-inf", "ancient", "zero"]),
            )

            @settings(
                max_examples=120,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(st.lists(entry, min_size=1, max_size=8))
            def example(entries: list[tuple[bytes | None, bytes | None, str]]) -> None:
                now = int(time.time() * 1000)
                written: dict[str, bytes | None] = {}
                scores: dict[str, float] = {}
                pipe = r.pipeline(transaction=True)
                for spec, ext, when in entries:
                    key = f"bad-{next(_counter)}"
                    fields = ([b"spec", spec] if spec is not None else []) + ([b"ext", ext] if ext is not None else [])
                    if fields:
                        pipe.execute_command("HSET", keys.repeat_spec(key), *fields)
                    score = {"due": now - 1, "-inf": "-inf", "ancient": -(10**15), "zero": 0}[when]
                    pipe.execute_command("ZADD", keys.repeat, score, key)
                    written[key] = spec
                    scores[key] = float(score)
                fires_before = int(r.execute_command("XLEN", keys.stream))
                pipe.execute()

                def settled() -> bool:
                    """Every entry was processed: gone, or rescored away from the score written (a
                    decodable spec is a real schedule and is due again one interval later)."""
                    for key, score in scores.items():
                        now_score = r.execute_command("ZSCORE", keys.repeat, key)
                        if now_score is not None and float(now_score) == score:
                            return not st_.alive()
                    return True

                wait_until_sync(settled, 10, what="every hostile entry to be processed")
                assert st_.alive(), st_.error
                quarantine = {
                    k.decode(): v for k, v in zip(*[iter(r.execute_command("HGETALL", keys.repeat_quarantine))] * 2)
                }
                for key, spec in written.items():
                    if key in quarantine:
                        assert quarantine[key] == spec, "quarantine must keep the exact bytes"
                        tally["quarantined"] += 1
                    else:
                        assert spec is None or _decodes(spec), f"{key}: undecodable spec not quarantined: {spec!r}"
                        tally["handled"] += 1
                    assert (
                        not r.execute_command("EXISTS", keys.repeat_spec(key))
                        or spec is not None
                        and r.execute_command("ZSCORE", keys.repeat, key) is not None
                    ), f"{key} left a spec hash behind"
                    # valid copies are real schedules: remove them so examples do not pile up
                    r.execute_command("ZREM", keys.repeat, key)
                    r.execute_command("DEL", keys.repeat_spec(key))
                wait_until_sync(
                    lambda: int(r.execute_command("XLEN", keys.stream)) > fires_before,
                    10,
                    what="the good spec to keep firing",
                )

            example()
            assert st_.scheduler is not None and st_.scheduler.ticks > 0
    finally:
        r.close()
    assert tally["quarantined"] > 0 and tally["handled"] > 0, tally
    print(f"\n[fuzz stored specs] {tally}")
