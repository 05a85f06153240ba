"""Next-fire maths for repeatable specs (spec §15.3-15.4): cron in any zone, fixed intervals.

Pure functions only; imports the standard library and ``croniter`` (no msgpack, no redis).
``croniter`` parses and validates the expression; the search itself runs here, over local
wall-clock time, because croniter's own zone handling fires a fall-back-overlap time twice.

Semantics (croner-compatible where croniter allows):

* 5 fields ``m h dom mon dow`` or 6 fields with **leading** seconds; ``@hourly``-style aliases,
  names (``MON``, ``JAN``), ``?``, ``L`` (last day of month), ``W`` (nearest weekday),
  ``N#k`` (k-th weekday), ``LN`` / ``N#L`` / ``NL`` (last weekday N of the month).
  ``H``/``R`` (hash/random) fields and a year field are rejected.
* Day-of-month and day-of-week combine with OR when both are restricted, otherwise the
  restricted one applies (Vixie cron / croner default).
* DST: a wall time inside a spring-forward gap fires once, at the first valid instant after
  the gap (gap slots collapse into that single fire); a wall time inside a fall-back overlap
  fires once, at the earlier instant.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from ..errors import ConfigError

__all__ = [
    "PatternLike",
    "CompiledCron",
    "check_cron",
    "compile_cron",
    "resolve_timezone",
    "next_fire_after",
    "first_fire_after_now",
]

_ONE_SEC = timedelta(seconds=1)
_EPOCH = datetime(1970, 1, 1)
_HORIZON_YEARS = 400  # the Gregorian calendar repeats every 400 years
_MAX_CANDIDATES = 100_000  # local candidates skipped inside one fall-back overlap, at most
_FIXED_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})", re.ASCII)
_HASH_FIELD = re.compile(r"[hr](\(\d+-\d+\))?(/\d+)?", re.ASCII)
_LAST_DOW = re.compile(r"([0-7]|sun|mon|tue|wed|thu|fri|sat)(#l|l)", re.ASCII)
_DOW_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MONTH_NAMES = {
    m: i for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)
}
_RANGE = re.compile(r"([0-9a-z]+)-([0-9a-z]+)", re.ASCII)
_PARSE_START = datetime(2000, 1, 1)


class PatternLike(Protocol):
    """What :func:`next_fire_after` reads from a ``RepeatPattern``."""

    @property
    def kind(self) -> str: ...
    @property
    def expression(self) -> str | None: ...
    @property
    def tz(self) -> str | None: ...
    @property
    def interval_ms(self) -> int | None: ...


# --------------------------------------------------------------------------- time zones


# Names a zone file may have on one host and not another, or with another meaning: the host's
# own zone (localtime, posixrules: a copy of some default zone) and the system database's
# posix/ and right/ (leap-second) copies.  Schedules fire on any scheduler host, so refused.
_HOST_ZONES = frozenset({"localtime", "posixrules"})
_HOST_ZONE_DIRS = ("posix/", "right/")


# Module-level memo, kept deliberately: a pure function of one string, bounded, and ZoneInfo
# keeps a process-wide cache of its own anyway; no object owns "the time zones".
@lru_cache(maxsize=1024)
def _resolve_timezone(tz: str | None) -> tzinfo:
    if tz is None or tz == "" or tz == "Z" or tz.upper() == "UTC":
        return UTC
    if tz[0] in "+-":
        return _fixed_offset(tz)
    low = tz.lower()
    if low in _HOST_ZONES or low.startswith(_HOST_ZONE_DIRS):
        raise ConfigError(
            f"timezone {tz!r} means whatever the scheduler's host is set to (or a host-only copy of "
            "the database): name the IANA zone itself, e.g. 'Europe/Paris'"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigError(f"unknown timezone {tz!r}: not an IANA zone name") from exc


def _fixed_offset(tz: str) -> tzinfo:
    m = _FIXED_OFFSET.fullmatch(tz)
    if m is None or int(m.group(2)) > 23 or int(m.group(3)) > 59:
        raise ConfigError(f"unknown timezone {tz!r}: fixed offsets are ±HH:MM or ±HHMM")
    minutes = int(m.group(2)) * 60 + int(m.group(3))
    return timezone(timedelta(minutes=-minutes if m.group(1) == "-" else minutes))


def resolve_timezone(tz: str | None) -> tzinfo:
    """None/""/"UTC"/"Z" -> UTC; "±HH:MM"/"±HHMM" -> fixed offset; else an IANA zone."""
    if tz is not None and not isinstance(tz, str):
        raise ConfigError(f"timezone must be a str or None, got {type(tz).__name__}")
    return _resolve_timezone(tz)


# --------------------------------------------------------------------------- parsing


def _bad(expression: str, why: str) -> ConfigError:
    return ConfigError(f"invalid cron expression '{expression}': {why}")


def _normalise_fields(expression: str) -> str:
    """Check the field count, reject H/R, and rewrite croner's last-weekday forms for croniter."""
    fields = expression.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        return fields[0]
    if len(fields) not in (5, 6):
        raise _bad(expression, f"expected 5 fields (m h dom mon dow) or 6 (leading seconds), got {len(fields)}")
    for token in ",".join(fields).lower().split(","):
        if _HASH_FIELD.fullmatch(token):
            raise _bad(expression, "hash/random fields (H, R) are not supported")
    dow = len(fields) - 1
    fields[dow] = ",".join(_last_dow(t) for t in fields[dow].lower().split(","))
    return " ".join(fields)


def _last_dow(token: str) -> str:
    m = _LAST_DOW.fullmatch(token)
    if m is None:
        return token
    day = m.group(1)
    return f"l{_DOW_NAMES.get(day, day)}"


def _expand(expression: str) -> tuple[list[list[Any]], dict[Any, set[Any]], set[int]]:
    text = _normalise_fields(expression)
    try:
        it = croniter(text, _PARSE_START, second_at_beginning=True)
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise _bad(expression, str(exc) or type(exc).__name__) from exc
    if len(it.expanded) not in (5, 6):
        raise _bad(expression, "a year field is not supported")
    return it.expanded, dict(it.nth_weekday_of_month), set(getattr(it, "nearest_weekday", ()) or ())


def _values(field: list[Any], low: int, high: int, expression: str) -> tuple[int, ...]:
    if field == ["*"]:
        return tuple(range(low, high + 1))
    if not all(type(v) is int and low <= v <= high for v in field):
        raise _bad(expression, f"unsupported field values {field!r}")
    return tuple(sorted(set(field)))


class _Days:
    """Which days of a given month match the dom/dow fields (cached per month)."""

    __slots__ = ("dom", "dom_last", "dom_w", "dow", "nth", "dom_star", "dow_star", "_cache")

    def __init__(self, dom: list[Any], dow: list[Any], nth: dict[Any, set[Any]], w: set[int], expression: str):
        self.dom_star = dom == ["*"] and not w
        self.dow_star = dow == ["*"] and not nth
        self.dom_last = "l" in dom
        self.dom_w = tuple(sorted(w))
        self.dom = frozenset(v for v in dom if type(v) is int and not w)
        self.nth = _nth_pairs(nth, expression)
        self.dow = frozenset() if nth else frozenset(_values(dow, 0, 6, expression) if not self.dow_star else ())
        if not self.dom_star and not all(v == "l" or (type(v) is int and 1 <= v <= 31) for v in dom):
            raise _bad(expression, f"unsupported day-of-month values {dom!r}")
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def impossible(self, months: tuple[int, ...]) -> bool:
        """True when only plain day numbers restrict the day and none fits any allowed month."""
        if not self.dow_star or self.dom_star or self.dom_last or self.dom_w:
            return False
        longest = max(29 if m == 2 else calendar.monthrange(2001, m)[1] for m in months)
        return min(self.dom) > longest

    def of(self, year: int, month: int) -> tuple[int, ...]:
        key = (year, month)
        days = self._cache.get(key)
        if days is None:
            if len(self._cache) > 512:
                self._cache.clear()
            days = self._cache[key] = self._compute(year, month)
        return days

    def _compute(self, year: int, month: int) -> tuple[int, ...]:
        first_wd, ndays = calendar.monthrange(year, month)  # Monday = 0
        if self.dom_star and self.dow_star:
            return tuple(range(1, ndays + 1))
        by_dom = set() if self.dom_star else self._dom_days(year, month, ndays)
        by_dow = set() if self.dow_star else self._dow_days((first_wd + 1) % 7, ndays)
        return tuple(sorted(by_dom | by_dow))

    def _dom_days(self, year: int, month: int, ndays: int) -> set[int]:
        days = {d for d in self.dom if d <= ndays}
        if self.dom_last:
            days.add(ndays)
        days.update(_nearest_weekday(year, month, d, ndays) for d in self.dom_w)
        return days

    def _dow_days(self, first_dow: int, ndays: int) -> set[int]:
        def first(dow: int) -> int:
            return 1 + (dow - first_dow) % 7

        days = {d for dow in self.dow for d in range(first(dow), ndays + 1, 7)}
        for dow, n in self.nth:
            last = first(dow) + 7 * ((ndays - first(dow)) // 7)
            day = last if n == "l" else first(dow) + 7 * (n - 1)
            if day <= ndays:
                days.add(day)
        return days


def _nth_pairs(nth: dict[Any, set[Any]], expression: str) -> tuple[tuple[int, Any], ...]:
    pairs: list[tuple[int, Any]] = []
    for dow, ns in nth.items():
        for d in range(7) if dow == "*" else (dow,):
            if type(d) is not int or not 0 <= d <= 6:
                raise _bad(expression, f"unsupported day-of-week value {dow!r}")
            pairs.extend((d, n) for n in ns)
    return tuple(sorted(pairs, key=repr))


def _nearest_weekday(year: int, month: int, day: int, ndays: int) -> int:
    """Quartz/croniter ``W``: nearest Mon-Fri to ``day`` without leaving the month."""
    day = min(day, ndays)
    wd = calendar.weekday(year, month, day)
    if wd == 5:
        return day - 1 if day > 1 else day + 2
    if wd == 6:
        return day + 1 if day < ndays else day - 2
    return day


class _CronFields:
    """A parsed expression: sorted allowed values per field plus the day matcher."""

    __slots__ = ("seconds", "minutes", "hours", "months", "days", "never")

    def __init__(self, expression: str) -> None:
        exp, nth, w = _expand(expression)
        self.minutes = _values(exp[0], 0, 59, expression)
        self.hours = _values(exp[1], 0, 23, expression)
        self.months = _values(exp[3], 1, 12, expression)
        self.seconds = _values(exp[5], 0, 59, expression) if len(exp) == 6 else (0,)
        self.days = _Days(exp[2], exp[4], nth, w, expression)
        self.never = self.days.impossible(self.months)

    def first_at_or_after(self, wall: datetime) -> datetime | None:
        """First matching naive wall time >= ``wall`` within the search horizon."""
        y, mo, d = wall.year, wall.month, wall.day
        hms: tuple[int, int, int] = (wall.hour, wall.minute, wall.second)
        stop = min(9999, y + _HORIZON_YEARS)
        while y <= stop:
            if mo in self.months:
                hit = self._in_month(y, mo, d, hms)
                if hit is not None:
                    return datetime(y, mo, hit[0], *hit[1])
            y, mo = (y + 1, 1) if mo == 12 else (y, mo + 1)
            d, hms = 1, (0, 0, 0)
        return None

    def _in_month(self, y: int, mo: int, d: int, hms: tuple[int, int, int]) -> tuple[int, tuple[int, int, int]] | None:
        days = self.days.of(y, mo)
        for day in days[bisect_left(days, d) :]:
            t = self._time_at_or_after(*(hms if day == d else (0, 0, 0)))
            if t is not None:
                return day, t
        return None

    def _time_at_or_after(self, h: int, mi: int, s: int) -> tuple[int, int, int] | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, mi)
            if j < len(minutes) and minutes[j] == mi:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h, mi, seconds[k]
                j += 1
            if j < len(minutes):
                return h, minutes[j], seconds[0]
            i += 1
        return (hours[i], minutes[0], seconds[0]) if i < len(hours) else None


# Module-level memo, kept deliberately: a pure function of the expression (an expression used in
# several zones is parsed once), bounded; the parsed fields are immutable apart from their own
# derived per-month day cache, so sharing them can change no result.
@lru_cache(maxsize=16384)
def _parse(expression: str) -> _CronFields:
    return _CronFields(expression)


# --------------------------------------------------------------------------- compiled


class CompiledCron:
    """An expression bound to a zone; :meth:`next_after` gives the next fire in UTC ms."""

    __slots__ = ("expression", "tz", "zone", "_fields", "_fixed")

    def __init__(self, expression: str, tz: str | None) -> None:
        self.expression = expression
        self.tz = tz
        self.zone = resolve_timezone(tz)
        self._fields = _parse(expression)
        off = self.zone.utcoffset(None) if isinstance(self.zone, timezone) else None
        self._fixed = None if off is None else int(off.total_seconds())

    def __repr__(self) -> str:
        return f"CompiledCron({self.expression!r}, tz={self.tz!r})"

    def next_after(self, t_ms: int) -> int | None:
        """First fire instant strictly after ``t_ms`` (UTC ms), or None if there is none."""
        if self._fields.never:
            return None
        try:
            wall = datetime.fromtimestamp(t_ms // 1000, self.zone).replace(tzinfo=None) + _ONE_SEC
        except (OverflowError, ValueError, OSError):
            return None
        for _ in range(_MAX_CANDIDATES):
            cand = self._fields.first_at_or_after(wall)
            if cand is None:
                return None
            fire = self._instant_ms(cand)
            if fire > t_ms:
                return fire
            if cand.year == 9999 and cand.month == 12 and cand.day == 31:
                return None
            wall = cand + _ONE_SEC  # an overlap time already passed on its earlier instant
        return None

    def _instant_ms(self, wall: datetime) -> int:
        """Wall time -> UTC ms: overlap picks the earlier instant, a gap the end of the gap."""
        base = (wall - _EPOCH) // _ONE_SEC
        if self._fixed is not None:
            return (base - self._fixed) * 1000
        u0 = base - int(self.zone.utcoffset(wall).total_seconds())  # type: ignore[union-attr]  # fold=0 reading
        u1 = base - int(self.zone.utcoffset(wall.replace(fold=1)).total_seconds())  # type: ignore[union-attr]
        if u0 <= u1:  # unambiguous, or an overlap where fold=0 is the earlier instant
            return u0 * 1000
        return self._transition(u1, u0) * 1000  # gap: fold=1 reads before it, fold=0 after

    def _transition(self, before: int, after: int) -> int:
        """First second in (before, after] whose UTC offset differs from the one at ``before``."""
        zone = self.zone
        old = datetime.fromtimestamp(before, zone).utcoffset()
        lo, hi = before, after
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, zone).utcoffset() == old:
                lo = mid
            else:
                hi = mid
        return hi


# Module-level memo, kept deliberately: a pure function of (expression, zone), bounded.  Its
# natural owner would be the ``RepeatPattern``, but patterns are value objects made afresh per
# item (a bulk upsert of a million specs may use a handful of expressions, each in a new
# object), so owning it there would compile each again; results are immutable (see ``_parse``).
@lru_cache(maxsize=16384)
def _compile(expression: str, tz: str | None) -> CompiledCron:
    return CompiledCron(expression, tz)


def check_cron(expression: str, tz: str | None = None) -> CompiledCron:
    """:func:`compile_cron` for a pattern a user gives, which must also mean the same to croner
    (what ChasquiMQ schedulers run): a range that runs backwards (``22-2``, ``FRI-MON``) is
    refused, as croner refuses it, where croniter would wrap it around, and so is a step croner
    cannot count (:func:`_check_step`).  Stored specs are read
    with :func:`compile_cron` alone, so one written before this check keeps its schedule."""
    compiled = compile_cron(expression, tz)
    fields = expression.split()
    dow = len(fields) - 1
    for at, field in enumerate(fields if len(fields) > 1 else ()):
        names = _DOW_NAMES if at == dow else _MONTH_NAMES if at == dow - 1 else {}
        least, most = _FIELD_BOUNDS[min(dow - at, len(_FIELD_BOUNDS) - 1)]
        for token in field.lower().split(","):
            part, _, step = token.split("#")[0].partition("/")
            m = _RANGE.fullmatch(part)
            if m is not None:
                low, high = (names.get(v, int(v) if v.isdigit() else -1) for v in m.groups())
                if low > high:
                    raise _bad(expression, f"the range {m.group()!r} runs backwards (write it as two ranges)")
            if step.isdigit():
                _check_step(expression, token, part, int(step), names, least, most)
    return compiled


# (least, most) of each field counted from the last: day of week, month, day of month, hour,
# minute, second (croner's bounds)
_FIELD_BOUNDS = ((0, 7), (1, 12), (1, 31), (0, 23), (0, 59), (0, 59))


def _check_step(
    expression: str, token: str, part: str, step: int, names: dict[str, int], least: int, most: int
) -> None:
    """croner reads a step as a byte and steps in bytes: a step over 255, or one that carries
    the last value it reaches past 255, fails there (``*/256``, ``40/230``) where croniter
    fires at the start value alone."""
    if step > 255:
        raise _bad(expression, f"the step in {token!r} is over 255, which croner cannot read")
    m = _RANGE.fullmatch(part)
    if part == "*":
        start, end = least, most
    elif m is not None:
        start, end = (names.get(v, int(v) if v.isdigit() else -1) for v in m.groups())
    else:
        start, end = names.get(part, int(part) if part.isdigit() else -1), most
    if 0 <= start <= end and start + (end - start) // step * step + step > 255:
        raise _bad(expression, f"the step in {token!r} carries past 255, which croner cannot count to")


def compile_cron(expression: str, tz: str | None = None) -> CompiledCron:
    """Parse and validate ``expression`` in zone ``tz`` (cached); ConfigError when invalid."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigError(f"invalid cron expression {expression!r}: must be a non-empty str")
    if tz is not None and not isinstance(tz, str):
        raise ConfigError(f"timezone must be a str or None, got {type(tz).__name__}")
    return _compile(expression, tz)


# --------------------------------------------------------------------------- patterns


def next_fire_after(pattern: PatternLike, t_ms: int, start_after_ms: int | None = None) -> int | None:
    """Spec §15.3: next fire strictly after ``max(t_ms, start_after_ms or 0)``; None if none."""
    frm = max(t_ms, start_after_ms or 0)
    if pattern.kind == "every":
        interval = pattern.interval_ms
        return frm + interval if interval else None
    if pattern.kind == "cron":
        return compile_cron(pattern.expression, pattern.tz).next_after(frm)  # type: ignore[arg-type]
    raise ConfigError(f"unknown repeat pattern kind {pattern.kind!r}")


def first_fire_after_now(pattern: PatternLike, fire_at_ms: int, now_ms: int, start_after_ms: int | None = None) -> int:
    """First instant of the spec's timeline strictly after ``now_ms`` (spec §15.4), in O(1)
    pattern evaluations however stale ``fire_at_ms`` is: cron instants do not depend on
    where a walk starts, so it is the next instant after now; an interval keeps its phase
    (closed form).  Returns 0 when the pattern has no further fire (the spec is removed).

    Deliberate difference from ChasquiMQ, which walks from ``fire_at_ms`` at most 100,000
    steps and re-arms at now + 60 s when that cap is hit: after a long outage that walk cost
    a second of CPU per spec and moved the spec off its boundary.
    """
    if pattern.kind == "every" and pattern.interval_ms:
        return _every_after_now(pattern.interval_ms, fire_at_ms, now_ms, start_after_ms)
    nxt = next_fire_after(pattern, now_ms, start_after_ms)
    return 0 if nxt is None else nxt


def _every_after_now(interval: int, cursor: int, now_ms: int, start_after_ms: int | None) -> int:
    first = max(cursor, start_after_ms or 0) + interval
    if first > now_ms:
        return first
    return first + ((now_ms - first) // interval + 1) * interval
