"""Next-fire maths (spec §15.3) and the walk helper (§15.4): expectations computed by hand."""

from __future__ import annotations

import calendar
import datetime as dt
import re
from types import SimpleNamespace

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui.core.cron import (
    check_cron,
    compile_cron,
    first_fire_after_now,
    next_fire_after,
    resolve_timezone,
)
from airflow_provider_chasqui.core.repeat import RepeatPattern
from airflow_provider_chasqui.errors import ConfigError


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    """UTC wall time -> epoch ms (stdlib only)."""
    return calendar.timegm((y, mo, d, h, mi, s)) * 1000


def cron(expr: str, tz: str | None = None) -> RepeatPattern:
    return RepeatPattern.cron(expr, tz=tz)


def fires(pattern: RepeatPattern, start: int, n: int) -> list[int | None]:
    out: list[int | None] = []
    t: int | None = start
    for _ in range(n):
        t = next_fire_after(pattern, t)  # type: ignore[arg-type]
        out.append(t)
        if t is None:
            break
    return out


# --------------------------------------------------------------------------- every


def test_every_is_from_plus_interval():
    p = RepeatPattern.every(60_000)
    assert next_fire_after(p, 1_000) == 61_000
    assert next_fire_after(p, 1_000, 5_000) == 65_000  # start_after in the future wins
    assert next_fire_after(p, 9_000, 5_000) == 69_000  # past start_after is ignored


def test_every_is_anchored_to_the_previous_fire_not_to_now():
    p = RepeatPattern.every(60_000)
    t0 = ms(2024, 5, 1, 12)
    assert fires(p, t0, 4) == [t0 + 60_000, t0 + 120_000, t0 + 180_000, t0 + 240_000]


def test_every_zero_interval_has_no_next_fire():
    raw = SimpleNamespace(kind="every", interval_ms=0, expression=None, tz=None)
    assert next_fire_after(raw, 1_000) is None
    assert first_fire_after_now(raw, 1_000, 5_000) == 0


def test_negative_time_is_clamped_to_zero_like_the_engine():
    assert next_fire_after(RepeatPattern.every(10), -500) == 10


# --------------------------------------------------------------------------- UTC cron


def test_five_field_is_strictly_after():
    p = cron("*/5 * * * *")
    assert next_fire_after(p, ms(2024, 1, 1, 0, 0)) == ms(2024, 1, 1, 0, 5)
    assert next_fire_after(p, ms(2024, 1, 1, 0, 4, 59) + 999) == ms(2024, 1, 1, 0, 5)
    assert next_fire_after(p, ms(2024, 1, 1, 0, 5) + 1) == ms(2024, 1, 1, 0, 10)


def test_start_after_moves_the_origin():
    p = cron("0 * * * *")
    assert next_fire_after(p, ms(2024, 1, 1, 0, 30), ms(2024, 1, 1, 5, 0)) == ms(2024, 1, 1, 6)


def test_six_fields_have_leading_seconds():
    assert fires(cron("5 * * * * *"), ms(2024, 1, 1), 2) == [ms(2024, 1, 1, 0, 0, 5), ms(2024, 1, 1, 0, 1, 5)]
    assert next_fire_after(cron("30 0 12 * * *"), ms(2024, 1, 1)) == ms(2024, 1, 1, 12, 0, 30)
    assert fires(cron("*/20 * * * * *"), ms(2024, 1, 1) + 500, 3) == [
        ms(2024, 1, 1, 0, 0, 20),
        ms(2024, 1, 1, 0, 0, 40),
        ms(2024, 1, 1, 0, 1, 0),
    ]
    assert next_fire_after(cron("0 0 0 1 1 *"), ms(2024, 6, 1)) == ms(2025, 1, 1)


def test_day_of_month_or_day_of_week():
    # 2024-09-01 is a Sunday: "13th OR Friday" -> Fri 6, Fri 13, Fri 20
    assert fires(cron("0 0 13 * 5"), ms(2024, 9, 1), 3) == [ms(2024, 9, 6), ms(2024, 9, 13), ms(2024, 9, 20)]
    assert next_fire_after(cron("0 0 * * 1"), ms(2024, 9, 1)) == ms(2024, 9, 2)  # dom '*': Mondays only
    assert next_fire_after(cron("0 0 * * 7"), ms(2024, 9, 2)) == ms(2024, 9, 8)  # 7 is Sunday


def test_names_and_aliases():
    assert next_fire_after(cron("0 9 * JAN MON"), ms(2024, 12, 31)) == ms(2025, 1, 6, 9)
    assert next_fire_after(cron("@daily"), ms(2024, 3, 3, 15)) == ms(2024, 3, 4)
    assert next_fire_after(cron("@hourly"), ms(2024, 3, 3, 15, 1)) == ms(2024, 3, 3, 16)


@pytest.mark.parametrize(
    ("expr", "start", "expected"),
    [
        ("0 0 L * *", ms(2024, 2, 1), [ms(2024, 2, 29), ms(2024, 3, 31), ms(2024, 4, 30)]),
        ("0 0 * * 5#2", ms(2024, 3, 1), [ms(2024, 3, 8), ms(2024, 4, 12)]),  # second Friday
        ("0 0 * * FRI#2", ms(2024, 3, 1), [ms(2024, 3, 8), ms(2024, 4, 12)]),
        ("0 0 * * 1#5", ms(2024, 1, 1), [ms(2024, 1, 29), ms(2024, 4, 29)]),  # months with 5 Mondays
        ("0 0 * * 5#L", ms(2024, 1, 1), [ms(2024, 1, 26), ms(2024, 2, 23), ms(2024, 3, 29)]),
        ("0 0 * * L5", ms(2024, 1, 1), [ms(2024, 1, 26), ms(2024, 2, 23)]),
        ("0 0 * * FRIL", ms(2024, 1, 1), [ms(2024, 1, 26), ms(2024, 2, 23)]),
        ("0 0 15W * *", ms(2024, 6, 1), [ms(2024, 6, 14), ms(2024, 7, 15), ms(2024, 8, 15)]),  # 15 Jun = Sat
        ("0 0 1W * *", ms(2024, 5, 31), [ms(2024, 6, 3)]),  # 1 Jun 2024 = Sat -> Mon 3rd
        ("0 0 ? * ?", ms(2024, 6, 1), [ms(2024, 6, 2)]),
    ],
)
def test_croner_extensions(expr, start, expected):
    assert fires(cron(expr), start, len(expected)) == expected


def test_impossible_and_rare_dates():
    assert next_fire_after(cron("0 0 30 2 *"), ms(2024, 1, 1)) is None
    assert next_fire_after(cron("0 0 31 4,6 *"), ms(2024, 1, 1)) is None
    assert next_fire_after(cron("0 0 29 2 *"), ms(2097, 1, 1)) == ms(2104, 2, 29)  # 2100 is no leap year


# --------------------------------------------------------------------------- zones


@pytest.mark.parametrize("tz", [None, "", "UTC", "utc", "Utc", "Z"])
def test_utc_aliases(tz):
    assert resolve_timezone(tz) is dt.UTC
    assert next_fire_after(cron("30 2 * * *", tz), ms(2024, 1, 1)) == ms(2024, 1, 1, 2, 30)


@pytest.mark.parametrize(
    ("tz", "expected"),
    [
        ("+05:30", ms(2024, 1, 1, 21, 0)),  # 02:30 at +05:30 on Jan 2 = 21:00Z Jan 1
        ("+0530", ms(2024, 1, 1, 21, 0)),
        ("-03:00", ms(2024, 1, 1, 5, 30)),
        ("-0300", ms(2024, 1, 1, 5, 30)),
        ("+00:00", ms(2024, 1, 1, 2, 30)),
    ],
)
def test_fixed_offsets(tz, expected):
    assert next_fire_after(cron("30 2 * * *", tz), ms(2024, 1, 1)) == expected


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "+25:00", "+5:30", "+05:60", "-", "+05", "America/New York"])
def test_unknown_zone_is_a_config_error_naming_it(tz):
    with pytest.raises(ConfigError, match="timezone") as info:
        cron("0 0 * * *", tz)
    assert tz in str(info.value)


@pytest.mark.parametrize("tz", ["localtime", "LocalTime", "posixrules", "posix/Europe/Paris", "right/UTC"])
def test_zones_that_depend_on_the_host_are_refused(tz):
    """Issue 26: ``localtime`` and ``posixrules`` loaded (on Debian both exist as files) and meant
    whatever each scheduler host was set to; ``posix/`` and ``right/`` exist only in some hosts'
    databases (``right/`` counts leap seconds).  Refused before any file is opened."""
    with pytest.raises(ConfigError, match="host") as info:
        cron("0 0 * * *", tz)
    assert repr(tz) in str(info.value) and "IANA" in str(info.value)
    assert cron("0 0 * * *", "Europe/Paris").tz == "Europe/Paris"  # the zone itself is fine


# (zone, expression, start UTC, expected UTC fires), all worked out by hand.
DST_CASES = [
    # New York 2024-03-10: 02:00 EST -> 03:00 EDT (07:00Z). 02:30 does not exist -> 03:00 EDT once.
    ("America/New_York", "30 2 * * *", ms(2024, 3, 9, 8), [ms(2024, 3, 10, 7), ms(2024, 3, 11, 6, 30)]),
    # New York 2024-11-03: 02:00 EDT -> 01:00 EST (06:00Z). 01:30 twice -> the EDT one (05:30Z) only.
    ("America/New_York", "30 1 * * *", ms(2024, 11, 2, 12), [ms(2024, 11, 3, 5, 30), ms(2024, 11, 4, 6, 30)]),
    # Gap: 02:00, 02:30 and 03:00 collapse into one fire at 03:00 EDT.
    (
        "America/New_York",
        "*/30 * * * *",
        ms(2024, 3, 10, 6, 15),
        [ms(2024, 3, 10, 6, 30), ms(2024, 3, 10, 7), ms(2024, 3, 10, 7, 30)],
    ),
    # Overlap: 01:00 and 01:30 EST (06:00Z, 06:30Z) do not fire again.
    (
        "America/New_York",
        "*/30 * * * *",
        ms(2024, 11, 3, 4, 45),
        [ms(2024, 11, 3, 5), ms(2024, 11, 3, 5, 30), ms(2024, 11, 3, 7), ms(2024, 11, 3, 7, 30)],
    ),
    # Starting inside the second pass (01:10 EST) goes straight to 02:00 EST.
    ("America/New_York", "*/30 * * * *", ms(2024, 11, 3, 6, 10), [ms(2024, 11, 3, 7)]),
    (
        "America/New_York",
        "0 * * * *",
        ms(2024, 3, 10, 5, 30),
        [ms(2024, 3, 10, 6), ms(2024, 3, 10, 7), ms(2024, 3, 10, 8)],
    ),
    # Madrid 2024-03-31: 02:00 CET -> 03:00 CEST (01:00Z).
    (
        "Europe/Madrid",
        "30 2 * * *",
        ms(2024, 3, 30),
        [ms(2024, 3, 30, 1, 30), ms(2024, 3, 31, 1), ms(2024, 4, 1, 0, 30)],
    ),
    # Madrid 2024-10-27: 03:00 CEST -> 02:00 CET (01:00Z). 02:30 -> CEST instant 00:30Z.
    ("Europe/Madrid", "30 2 * * *", ms(2024, 10, 26, 12), [ms(2024, 10, 27, 0, 30), ms(2024, 10, 28, 1, 30)]),
    (
        "Europe/Madrid",
        "*/30 * * * *",
        ms(2024, 10, 27, 0, 15),
        [ms(2024, 10, 27, 0, 30), ms(2024, 10, 27, 2), ms(2024, 10, 27, 2, 30)],
    ),
    # Lord Howe 2024-10-06: 02:00 +10:30 -> 02:30 +11:00 (15:30Z on the 5th); a 30-minute gap.
    (
        "Australia/Lord_Howe",
        "15 2 * * *",
        ms(2024, 10, 4),
        [ms(2024, 10, 4, 15, 45), ms(2024, 10, 5, 15, 30), ms(2024, 10, 6, 15, 15)],
    ),
    (
        "Australia/Lord_Howe",
        "*/30 * * * *",
        ms(2024, 10, 5, 14, 45),
        [ms(2024, 10, 5, 15), ms(2024, 10, 5, 15, 30), ms(2024, 10, 5, 16)],
    ),
    # Lord Howe 2024-04-07: 02:00 +11:00 -> 01:30 +10:30 (15:00Z on the 6th); 01:30-02:00 twice.
    ("Australia/Lord_Howe", "45 1 * * *", ms(2024, 4, 6), [ms(2024, 4, 6, 14, 45), ms(2024, 4, 7, 15, 15)]),
    (
        "Australia/Lord_Howe",
        "*/15 * * * *",
        ms(2024, 4, 6, 14, 20),
        [ms(2024, 4, 6, 14, 30), ms(2024, 4, 6, 14, 45), ms(2024, 4, 6, 15, 30), ms(2024, 4, 6, 15, 45)],
    ),
    # Fixed offsets and UTC have no DST: the same wall time every day.
    ("+05:30", "30 2 * * *", ms(2024, 3, 9), [ms(2024, 3, 9, 21), ms(2024, 3, 10, 21), ms(2024, 3, 11, 21)]),
    ("UTC", "30 2 * * *", ms(2024, 3, 9), [ms(2024, 3, 9, 2, 30), ms(2024, 3, 10, 2, 30), ms(2024, 3, 11, 2, 30)]),
    # Six-field expression inside the New York gap: 02:30:15 -> 03:00:00 EDT.
    ("America/New_York", "15 30 2 * * *", ms(2024, 3, 10, 5), [ms(2024, 3, 10, 7), ms(2024, 3, 11, 6, 30, 15)]),
]


@pytest.mark.parametrize(("tz", "expr", "start", "expected"), DST_CASES)
def test_dst_matrix(tz, expr, start, expected):
    assert fires(cron(expr, tz), start, len(expected)) == expected


@pytest.mark.parametrize(
    ("tz", "day", "expr"),
    [
        ("America/New_York", (2024, 3, 10), "30 2 * * *"),
        ("America/New_York", (2024, 11, 3), "30 1 * * *"),
        ("Europe/Madrid", (2024, 3, 31), "30 2 * * *"),
        ("Europe/Madrid", (2024, 10, 27), "30 2 * * *"),
        ("Australia/Lord_Howe", (2024, 10, 6), "15 2 * * *"),
        ("Australia/Lord_Howe", (2024, 4, 7), "45 1 * * *"),
    ],
)
def test_daily_job_fires_exactly_once_on_a_transition_day(tz, day, expr):
    zone = resolve_timezone(tz)
    y, m, d = day
    start = ms(y, m, d) - 2 * 86_400_000
    got = [f for f in fires(cron(expr, tz), start, 5) if f is not None]
    local_days = [dt.datetime.fromtimestamp(f / 1000, zone).date() for f in got]
    assert local_days.count(dt.date(y, m, d)) == 1
    assert len(set(local_days)) == len(local_days)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "expr",
    [
        "61 * * * *",
        "* * *",
        "1 2 3 4 5 6 7",
        "H * * * *",
        "R * * * *",
        "*/0 * * * *",
        "0 0 32 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "a b c d e",
        "0 0 * * 5#6",
        "   ",
    ],
)
def test_invalid_cron_is_a_config_error(expr):
    with pytest.raises(ConfigError, match="invalid cron expression"):
        RepeatPattern.cron(expr)
    with pytest.raises(ConfigError, match="invalid cron expression"):
        compile_cron(expr)


@pytest.mark.parametrize(
    ("expr", "reversed_range"),
    [("1-0 * * * *", "1-0"), ("0 22-2 * * *", "22-2"), ("0 0 * * FRI-MON", "fri-mon"), ("0 0 * DEC-JAN *", "dec-jan"),
     ("50-10/5 * * * *", "50-10"), ("0 0 * * 5-0", "5-0"), ("0 0 20-3 * *", "20-3")],
)  # fmt: skip
def test_a_range_that_runs_backwards_is_refused_as_croner_refuses_it(expr: str, reversed_range: str) -> None:
    """croniter wrapped ``22-2`` round (22, 23, 0, 1, 2) where croner, which ChasquiMQ's
    scheduler runs, refuses the pattern (and drops such a spec at its tick): a shared queue
    would have fired on one scheduler only. A stored spec still reads (``compile_cron``)."""
    with pytest.raises(ConfigError, match=f"the range '{reversed_range}' runs backwards"):
        RepeatPattern.cron(expr)
    with pytest.raises(ConfigError, match="runs backwards"):
        check_cron(expr)
    assert compile_cron(expr).next_after(0) > 0  # what a scheduler does with one stored before
    for fine in ("0 0 * * 1-5", "0 0 * * MON-FRI", "0 0 1-31 JAN-DEC *", "*/5 10-20/2 * * *", "30 1-1 * * *", "@daily"):
        assert RepeatPattern.cron(fine).expression == fine


@pytest.mark.parametrize(
    ("expr", "token", "why"),
    [
        ("*/256 * * * *", "*/256", "is over 255"),
        ("0 */1000 * * *", "*/1000", "is over 255"),
        ("* * * * * */300", "*/300", "is over 255"),  # six fields: seconds first
        ("40/230 * * * *", "40/230", "carries past 255"),
        ("0 0 * * FRI-SAT/251", "fri-sat/251", "carries past 255"),
    ],
)
def test_a_step_croner_cannot_count_is_refused(expr: str, token: str, why: str) -> None:
    """croner, which ChasquiMQ's scheduler runs, reads a step as a byte and counts in bytes, so
    these fail there while croniter fires at the start value alone: one scheduler would fire,
    the other drop the spec.  A stored spec still reads (``compile_cron``)."""
    with pytest.raises(ConfigError, match=f"the step in '{re.escape(token)}' {why}"):
        RepeatPattern.cron(expr)
    assert compile_cron(expr).next_after(0) > 0
    for fine in ("*/255 * * * *", "30-59/220 * * * *", "*/200 * * * *", "0 0 */32 * *", "0 0 * * */250"):
        assert check_cron(fine).next_after(0) > 0


def test_invalid_cron_message_quotes_the_expression():
    with pytest.raises(ConfigError) as info:
        compile_cron("61 * * * *")
    assert str(info.value).startswith("invalid cron expression '61 * * * *': ")


def test_non_string_expression_and_zone():
    with pytest.raises(ConfigError):
        compile_cron(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        compile_cron("* * * * *", tz=3)  # type: ignore[arg-type]


def test_compiled_expressions_are_cached():
    assert compile_cron("7 7 * * *", "Europe/Madrid") is compile_cron("7 7 * * *", "Europe/Madrid")
    assert compile_cron("7 7 * * *", "Europe/Madrid") is not compile_cron("7 7 * * *", None)


# --------------------------------------------------------------------------- walk to now


def test_first_fire_after_now_every():
    p = RepeatPattern.every(60_000)
    assert first_fire_after_now(p, 1_000, 1_000 + 5 * 60_000 + 1) == 1_000 + 6 * 60_000
    assert first_fire_after_now(p, 1_000, 1_000 + 5 * 60_000) == 1_000 + 6 * 60_000  # strictly after now
    assert first_fire_after_now(p, 1_000, 30_000) == 61_000


def test_first_fire_after_now_cron():
    p = cron("0 * * * *")
    assert first_fire_after_now(p, ms(2024, 1, 1, 10), ms(2024, 1, 1, 12, 30)) == ms(2024, 1, 1, 13)
    assert first_fire_after_now(p, ms(2024, 1, 1, 10), ms(2024, 1, 1, 12)) == ms(2024, 1, 1, 13)
    assert first_fire_after_now(cron("0 0 30 2 *"), ms(2024, 1, 1), ms(2024, 2, 1)) == 0


def test_a_stale_timeline_jumps_to_now_on_its_own_boundaries():
    """No walk cap, no re-arm off the timeline (ChasquiMQ re-arms at now + 60 s after 100,000
    steps): an interval keeps its phase, a cron lands on its next instant, however stale."""
    p = RepeatPattern.every(1)
    assert first_fire_after_now(p, 0, 99_999) == 100_000
    assert first_fire_after_now(p, 0, 100_000) == 100_001
    assert first_fire_after_now(RepeatPattern.every(7), 3, 5_000_000_000) == 5_000_000_001  # 3 + 7k
    t0 = ms(2024, 1, 1)
    for gap in (99_999_000, 100_000_000, 10 * 365 * 86_400_000):
        assert first_fire_after_now(cron("* * * * * *"), t0, t0 + gap + 1) == t0 + gap + 1000
        assert first_fire_after_now(RepeatPattern.every(1_000), t0, t0 + gap + 1) == t0 + gap + 1000
    assert first_fire_after_now(cron("*/5 * * * *"), t0, t0 + 40 * 86_400_000 + 7) == t0 + 40 * 86_400_000 + 300_000


def test_long_walk_below_cap_for_sparse_cron():
    # A daily job missed for ~3 years walks ~1100 steps and lands on the next midnight.
    p = cron("0 0 * * *")
    assert first_fire_after_now(p, ms(2020, 1, 1), ms(2023, 1, 10, 12)) == ms(2023, 1, 11)


# --------------------------------------------------------------------------- cross-check


def _field(draw, low: int, high: int) -> str:
    kind = draw(st.sampled_from(["star", "value", "range", "step", "list"]))
    if kind == "star":
        return "*"
    if kind == "value":
        return str(draw(st.integers(low, high)))
    if kind == "list":
        return ",".join(str(v) for v in sorted(draw(st.sets(st.integers(low, high), min_size=1, max_size=4))))
    a = draw(st.integers(low, high))
    b = draw(st.integers(a, high))
    return f"{a}-{b}" if kind == "range" else f"{a}-{b}/{draw(st.integers(1, 5))}"


@st.composite
def plain_cron(draw) -> str:
    fields = [_field(draw, 0, 59), _field(draw, 0, 23), _field(draw, 1, 28), _field(draw, 1, 12), _field(draw, 0, 6)]
    if draw(st.booleans()):
        fields.insert(0, _field(draw, 0, 59))
    return " ".join(fields)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=plain_cron(), start=st.integers(ms(2000, 1, 1), ms(2040, 1, 1)))
def test_utc_agrees_with_croniter_on_plain_fields(expr, start):
    base = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=start // 1000)
    try:
        want = croniter(expr, base, second_at_beginning=True).get_next(dt.datetime)
    except CroniterBadDateError:
        assume(False)
    expected = calendar.timegm(want.timetuple()) * 1000
    assert next_fire_after(cron(expr), start) == expected
