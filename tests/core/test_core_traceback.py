"""Handler tracebacks (sans-I/O): bounded, innermost frames kept, never raising, and only in
the rows of dead-lettered jobs."""

from __future__ import annotations

import sys

import pytest
from wire_vectors import NAME, V2

from airflow_provider_chasqui.core.consumer import ConsumerCore, Delivery
from airflow_provider_chasqui.core.failure import MAX_TRACEBACK_BYTES, TRACEBACK_FRAMES, clip_head, handler_traceback
from airflow_provider_chasqui.core.retry import RetryPolicy
from airflow_provider_chasqui.core.settings import QueueSettings


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def innermost_failure() -> None:
    raise ValueError("the innermost frame")


def recurse(n: int) -> None:
    if n == 0:
        innermost_failure()
    recurse(n - 1)


def ping(n: int, message: str = "the innermost frame") -> None:
    if n == 0:
        raise ValueError(message)
    pong(n - 1, message)


def pong(n: int, message: str) -> None:
    ping(n - 1, message)


def chained_deep() -> None:
    try:
        ping(200)
    except ValueError:
        ping(200, "while handling it")


def test_a_never_raised_exception_has_no_traceback() -> None:
    assert handler_traceback(ValueError("boom")) == ""


def test_the_traceback_names_the_raising_frame_and_its_cause() -> None:
    def outer() -> None:
        try:
            innermost_failure()
        except ValueError as exc:
            raise RuntimeError("wrapped") from exc

    tb = handler_traceback(_raised(outer))
    assert tb.startswith("Traceback (most recent call last):") and tb.endswith("RuntimeError: wrapped\n")
    assert "in innermost_failure" in tb and 'raise ValueError("the innermost frame")' in tb
    assert "The above exception was the direct cause" in tb


def test_a_deep_traceback_keeps_its_innermost_frames_within_the_bound() -> None:
    tb = handler_traceback(_raised(chained_deep))
    assert len(tb.encode()) <= MAX_TRACEBACK_BYTES
    assert tb.startswith("[traceback truncated: ") and "the innermost frames follow]\n" in tb
    assert tb.endswith("ValueError: while handling it\n") and "raise ValueError(message)" in tb
    # the outer (first) exception went first: its header is cut, whatever the length of the
    # paths in its frames (a checkout with short paths keeps more of its tail)
    assert "Traceback (most recent call last):" not in tb.split("During handling of the above exception")[0]
    # the cut lands on a line start: the first kept line is a whole line of the traceback
    first = tb.splitlines()[1]
    assert first == "" or first.startswith(
        ("  File ", "    ", "  [Previous line repeated", "Traceback", "During", "ValueError: ")
    )
    # at most TRACEBACK_FRAMES frames are formatted per exception, however deep the stack
    assert handler_traceback(_raised(lambda: ping(2000))).count("  File ") <= TRACEBACK_FRAMES


def test_a_huge_message_does_not_push_out_the_frames() -> None:
    tb = handler_traceback(_raised(lambda: ping(6, "x" * 100_000)))
    assert len(tb.encode()) <= MAX_TRACEBACK_BYTES and "[truncated: " in tb
    assert tb.startswith("Traceback (most recent call last):") and tb.count("in pong") == 3
    assert tb.endswith(" bytes]\n") and tb.splitlines()[-1].startswith("ValueError: xxx")


def test_a_recursion_error_is_formatted_cheaply() -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        exc = _raised(lambda: recurse(10_000))
    finally:
        sys.setrecursionlimit(limit)
    tb = handler_traceback(exc)
    assert isinstance(exc, RecursionError) and "RecursionError" in tb and len(tb.encode()) <= MAX_TRACEBACK_BYTES


def test_hostile_exceptions_never_break_the_failure_path() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    class Surrogates(Exception):
        pass

    tb = handler_traceback(_raised(lambda: (_ for _ in ()).throw(Hostile())))
    assert "Hostile" in tb
    tb = handler_traceback(_raised(lambda: (_ for _ in ()).throw(Surrogates("\udcff" + "é" * 5000))))
    assert len(tb.encode("utf-8")) <= MAX_TRACEBACK_BYTES  # lone surrogates became U+FFFD: it encodes


@pytest.mark.parametrize("text", ["", "short\n", "a\n" * 10, "é" * 3000])
def test_clip_head_is_the_identity_within_the_bound_and_keeps_the_end(text: str) -> None:
    clipped = clip_head(text, 64)
    if len(text.encode()) <= 64:
        assert clipped == text
    else:
        assert len(clipped.encode()) <= 64 and clipped.startswith("[traceback truncated")
        assert text.endswith(clipped.split("\n", 1)[1])


def test_only_dead_lettered_rows_carry_the_traceback() -> None:
    core = ConsumerCore(
        "emails",
        group="default",
        consumer_id="c",
        max_attempts=2,
        settings=QueueSettings(),
        retry=RetryPolicy(),
        events=True,
        result_ttl_ms=0,
        failure_ttl_ms=60_000,
    )
    dl = core.gate(b"1-0", [b"d", V2, b"n", NAME.encode()], 1)
    assert isinstance(dl, Delivery)
    exc = _raised(innermost_failure)
    row, outcome, _ = core.failure_row(dl, exc, False, 5, 1_700_000_000_000)
    assert outcome == "retry" and len(row) == 12 and row[11] == ""  # nothing stores a retried attempt's
    row, outcome, _ = core.failure_row(dl, exc, True, 5, 1_700_000_000_000)
    assert outcome == "unrecoverable" and len(row) == 12 and row[11] == handler_traceback(exc)
    assert row[9] == ""  # the DLQ detail argument stays empty: the script fills it from the traceback
    row, _, _ = core.failure_row(dl, exc, True, 5, 1_700_000_000_000, tb="given")
    assert row[11] == "given"  # the worker formats once, for its log and the row
