"""The Lua scripts' per-row layouts (``core/rows.py``) against the scripts' header comments:
every ``N per job: a, b, ...`` list in a ``lua/*.lua`` header names the fields of a Python row
type, in the same order, and the Python builders put each value where its name says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import pytest
from engine_support import consumer_core
from wire_vectors import NAME, V2

from airflow_provider_chasqui.core.consumer import ConsumerCore, Delivery, Rejected
from airflow_provider_chasqui.core.enqueue import QueueFlows
from airflow_provider_chasqui.core.features import Features
from airflow_provider_chasqui.core.rows import (
    COMPLETE_ROW,
    DELAY_ROW,
    ENQUEUE_ROW,
    FAIL_DEAD_ROW,
    FAIL_RETRY_ROW,
    LUA_ROWS,
)

pytestmark = pytest.mark.timeout(30)

LUA_DIR = Path(__file__).resolve().parents[2] / "lua"
# "6 per job: entry_id, job_id, ..." or, for a script with several layouts, "12 per entry 'r': ..."
ROW_LIST = re.compile(r"(\d+) per (?:job|entry|spec)(?: '(\w+)')?: ([a-z_]+(?:, [a-z_]+)*)")


def header(path: Path) -> str:
    """The leading comment block of a script."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def lua_rows() -> dict[tuple[str, str], tuple[str, ...]]:
    rows: dict[tuple[str, str], tuple[str, ...]] = {}
    for path in sorted(LUA_DIR.glob("*.lua")):
        for count, label, names in ROW_LIST.findall(header(path)):
            fields = tuple(names.split(", "))
            assert len(fields) == int(count), f"{path.name}: '{count} per' lists {len(fields)} names"
            assert (path.stem, label) not in rows, f"{path.name}: two row lists labelled {label!r}"
            rows[(path.stem, label)] = fields
    return rows


def test_every_lua_row_list_is_a_python_row_type_and_back() -> None:
    found = lua_rows()
    assert set(found) == set(LUA_ROWS)
    for key, (_row_type, names) in LUA_ROWS.items():
        assert found[key] == names, key


@pytest.mark.parametrize("key", sorted(LUA_ROWS), ids=lambda k: ":".join(filter(None, k)))
def test_row_types_are_as_long_as_their_names(key: tuple[str, str]) -> None:
    row_type, names = LUA_ROWS[key]
    assert len(get_args(row_type)) == len(names)
    assert len(set(names)) == len(names)


def test_the_header_parser_sees_a_changed_list() -> None:
    """The check can fail: a header whose list differs from the type is reported."""
    text = "-- ARGV = [group, then 6 per job: entry_id, job_id, name, attempt, result, duration_us]"
    ((count, label, names),) = ROW_LIST.findall(text)
    assert (count, label) == ("6", "")
    assert tuple(names.split(", ")) != COMPLETE_ROW


def _consumer(max_attempts: int = 3) -> ConsumerCore:
    return consumer_core("rows-test", max_attempts=max_attempts)


def named(names: tuple[str, ...], row: Any) -> dict[str, Any]:
    assert len(row) == len(names)
    return dict(zip(names, row))


def test_fail_rows_put_each_value_under_its_name() -> None:
    core = _consumer()
    dl = core.gate(b"1700000000000-0", [b"d", V2, b"n", NAME.encode()], 1)
    assert isinstance(dl, Delivery)
    row, outcome, delay = core.failure_row(dl, ValueError("boom"), False, 1234, now=1_000)
    assert outcome == "retry"
    r = named(FAIL_RETRY_ROW, row)
    assert r["kind"] == "r" and r["entry_id"] == b"1700000000000-0" and r["job_id"] == dl.envelope.id
    assert r["name"] == NAME and r["attempt"] == dl.envelope.attempt + 1 and r["duration_us"] == 1234
    assert r["run_at_ms"] == 1_000 + delay and r["backoff_ms"] == delay
    assert r["next_attempt"] == dl.envelope.attempt + 2 and r["traceback"] == ""
    try:
        raise ValueError("boom")
    except ValueError as exc:
        raised = exc
    dead, outcome, _ = core.failure_row(dl, raised, True, 5, now=1_000)
    d = named(FAIL_DEAD_ROW, dead)
    assert d["kind"] == "d" and d["dlq_reason"] == outcome == "unrecoverable" and d["payload"] == dl.raw
    assert "ValueError" in d["failed_reason"] and "boom" in d["traceback"]
    rej = Rejected(b"1-0", "malformed", b"xx", "n", detail="bad", job_id="j", attempt=2, dlq_name=b"\xff")
    d = named(FAIL_DEAD_ROW, core.reject_row(rej))
    assert (d["entry_id"], d["payload"], d["dlq_reason"], d["detail"], d["dlq_name"]) == (
        b"1-0",
        b"xx",
        "malformed",
        "bad",
        b"\xff",
    )


def test_complete_argv_is_head_then_complete_rows() -> None:
    core = _consumer()
    rows = [(b"1-0", "j1", "n", 1, 10, b""), (b"2-0", "j2", "m", 2, 20, b"r")]
    argv = core.complete(rows, Features(), now=5).argv
    tail = argv[len(argv) - 2 * len(COMPLETE_ROW) :]
    assert [named(COMPLETE_ROW, tail[i : i + 6])["job_id"] for i in (0, 6)] == ["j1", "j2"]


def test_bulk_adds_send_enqueue_and_delay_rows() -> None:
    flows = QueueFlows("rows-test")
    now = 1_700_000_000_000
    jobs = [flows.prepare("a", 1, now=now), flows.prepare("b", 2, now=now, delay_ms=500)]
    calls = next(flows.add_bulk(jobs))
    enqueue, delay = calls
    assert enqueue.script is not None and enqueue.script.name == "enqueue_batch"
    assert named(ENQUEUE_ROW, enqueue.argv[1:]) == {"envelope": jobs[0].envelope, "name": b"a"}
    assert delay.script is not None and delay.script.name == "delay_batch"
    row = named(DELAY_ROW, delay.argv)
    assert row["run_at_ms"] == now + 500 and row["member"].endswith(jobs[1].envelope)
