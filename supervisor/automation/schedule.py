"""When a job is due: the arithmetic of `at`, `every` and cron schedules, pure (no clock,
no I/O, no event loop). The CLI and the cron tool build a `Schedule` with `make_schedule`,
whose `ScheduleError` names the field a user got wrong; the job store keeps it as JSON
(`to_json`, `from_json`); the scheduler asks `next_after(t)` to arm its one timer.

Cron times are wall-clock times in the schedule's IANA zone, and daylight saving is
handled as vixie cron (cronie, the BSDs) handles it, because that is what operators of
cron expect:
- A fixed-time job (neither the minute nor the hour field starts with `*`, e.g.
  `30 2 * * *`) runs once for each of its local times. A time inside a spring-forward gap
  runs at the first instant after the gap (03:00 local), once even if several of its
  times fall in that gap; a time that happens twice on fall-back day runs at its first
  occurrence only.
- A wildcard-time job (`*/15 * * * *`, `0 * * * *`, `@hourly`) follows the clock: no run
  at a time that does not exist, and a run at both occurrences of a time that repeats.
Matching every instant whose wall time fits (croniter's way) would run a daily 01:30 job
twice on fall-back day and a daily 02:30 job not at all on spring-forward day.
"""

from __future__ import annotations

import calendar
import dataclasses
import functools
import math
import re
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class ScheduleError(ValueError):
    """A schedule that cannot be: the message starts with the field it is about,
    e.g. "cron: field 2 (hour): 25 is out of range 0-23", "tz: unknown time zone 'Mars/Base'",
    "at: 2020-01-01T00:00:00+00:00 is in the past", "every: '5x' is not a duration (examples: 90s, 30m, 1h, 1h30m, 2d)"."""


# ---------------------------------------------------------------------------- durations

_UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?\s*[wdhms]\s*)+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhms])")
MIN_PERIOD_S = 1.0
MAX_PERIOD_S = 10 * 365.25 * 86_400  # ten years
_LATEST_AT = 253_402_300_799.0
"""9999-12-31T23:59:59Z, the last time `datetime` can print."""
_DURATION_EXAMPLES = "(examples: 90s, 30m, 1h, 1h30m, 2d)"


def parse_duration(text: str, field: str = "every") -> float:
    """Seconds in `90s`, `30m`, `1h30m`, `2d`, `1w` (or a bare number of seconds), from
    1 s to 10 years. The error names `field`."""
    spoken = text.strip().lower()
    if _NUMBER.fullmatch(spoken):
        seconds = float(spoken)
    elif _DURATION.fullmatch(spoken):
        parts = _DURATION_PART.findall(spoken)
        ranks = ["wdhms".index(unit) for _, unit in parts]
        if ranks != sorted(set(ranks)):
            raise ScheduleError(f"{field}: {text!r} repeats or reorders its units; write the largest first, e.g. 1h30m")
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    else:
        raise ScheduleError(f"{field}: {text!r} is not a duration {_DURATION_EXAMPLES}")
    if seconds < MIN_PERIOD_S:
        raise ScheduleError(f"{field}: {text!r} is shorter than the minimum of 1 second")
    if seconds > MAX_PERIOD_S:
        raise ScheduleError(f"{field}: {text!r} is longer than the maximum of 10 years")
    return seconds


def format_duration(seconds: float) -> str:
    """The short spelling `parse_duration` reads back: 5400 -> `1h30m`, 90 -> `1m30s`."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    rest = int(seconds)
    parts: list[str] = []
    for unit, size in _UNIT_SECONDS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


# ---------------------------------------------------------------------------- zones


def zone(name: str | None, field: str = "tz") -> ZoneInfo:
    """The IANA zone called `name`; UTC when none is given."""
    if not name:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: a key that is no relative path ('../x', '/etc/passwd') or no TZif file.
        raise ScheduleError(
            f"{field}: unknown time zone {name!r} (give an IANA name such as 'Europe/Berlin', 'America/New_York' or 'UTC')"
        ) from None


# ---------------------------------------------------------------------------- cron


@dataclass(frozen=True)
class _CronField:
    number: int
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] stands for name_base + i
    name_base: int = 0


_FIELDS = (
    _CronField(1, "minute", 0, 59),
    _CronField(2, "hour", 0, 23),
    _CronField(3, "day of month", 1, 31),
    _CronField(4, "month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1),
    _CronField(5, "day of week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat"), 0),
)
_FIELDS_HINT = "minute hour day-of-month month day-of-week, e.g. '0 9 * * 1-5'"
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MAX_CRON_CHARS = 1000
_QUARTZ = re.compile(r"[0-9]*[lw]|lw|.*#.*")  # L, 5L, 15W, LW, mon#2: Quartz's last, weekday, nth

# How far from an instant a clock change is looked for, to learn whether wall-clock order
# and time order agree around it: larger than any clock change in the tz database except
# the date-line moves of Pacific islands (2 h is "double summer time").
_SLACK_S = 3 * 3600
_HORIZON_YEARS = 10
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _cron_value(spec: _CronField, token: str, where: str) -> int:
    spoken = token.lower()
    if _is_digits(spoken):
        value = int(spoken)
    elif spoken in spec.names:
        value = spec.names.index(spoken) + spec.name_base
    elif spec.number in (3, 5) and _QUARTZ.fullmatch(spoken):
        raise ScheduleError(
            f"{where}: {token!r} is not supported: L, W and # are Quartz extensions, not cron; list the days instead"
        )
    else:
        named = f" or a name ({spec.names[0]}-{spec.names[-1]})" if spec.names else ""
        raise ScheduleError(f"{where}: {token!r} is not a number{named}")
    if not spec.low <= value <= spec.high:
        raise ScheduleError(f"{where}: {value} is out of range {spec.low}-{spec.high}")
    return value


def _cron_item(spec: _CronField, item: str, where: str) -> range:
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _is_digits(step_text):
            raise ScheduleError(f"{where}: step {step_text!r} in {item!r} is not a whole number")
        step = int(step_text)
        if step == 0:
            raise ScheduleError(f"{where}: step 0 in {item!r} never moves; a step is at least 1")
    if base in ("*", "?"):
        if base == "?" and spec.number not in (3, 5):
            raise ScheduleError(f"{where}: '?' is only for the day-of-month and day-of-week fields; use '*'")
        return range(spec.low, spec.high + 1, step)
    if "-" in base:
        first_text, _, last_text = base.partition("-")
        first, last = _cron_value(spec, first_text, where), _cron_value(spec, last_text, where)
        if first > last:
            raise ScheduleError(f"{where}: range {base} is reversed; write the smaller value first ({last_text}-{first_text})")
        return range(first, last + 1, step)
    first = _cron_value(spec, base, where)
    # `5/15` is `5-59/15`, as in vixie cron.
    return range(first, (spec.high if slash else first) + 1, step)


def _cron_field(spec: _CronField, text: str) -> frozenset[int]:
    where = f"cron: field {spec.number} ({spec.name})"
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ScheduleError(f"{where}: {text!r} has an empty list item")
        values.update(_cron_item(spec, item, where))
    if spec.number == 5 and 7 in values:
        values = (values - {7}) | {0}  # 7 is Sunday too
    return frozenset(values)


@dataclass(frozen=True)
class CronExpr:
    """A parsed five-field cron expression. Made by `CronExpr.parse` (and by `Schedule`,
    which keeps one); immutable and shareable."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday .. 6 = Saturday."""
    dom_any: bool
    """The day-of-month field starts with `*` or `?` (vixie cron reads the first character,
    so `*/2` counts): then day of month and day of week must both match; otherwise either."""
    dow_any: bool
    wildcard_time: bool
    """The minute or the hour field starts with `*`: the job follows the clock through
    daylight-saving changes instead of running once per local time (module docstring)."""
    _minute_list: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _hour_list: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _day_list: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_minute_list", tuple(sorted(self.minutes)))
        object.__setattr__(self, "_hour_list", tuple(sorted(self.hours)))
        object.__setattr__(self, "_day_list", tuple(sorted(self.days)))

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        stripped = text.strip()
        if not stripped:
            raise ScheduleError(f"cron: the expression is empty; give five fields: {_FIELDS_HINT}")
        if len(stripped) > _MAX_CRON_CHARS:
            raise ScheduleError(f"cron: the expression is longer than {_MAX_CRON_CHARS} characters")
        fields_text = stripped
        if stripped.startswith("@"):
            macro = _MACROS.get(stripped.lower())
            if macro is None:
                raise ScheduleError(f"cron: {stripped!r} is not supported; the macros are {', '.join(_MACROS)}")
            fields_text = macro
        parts = fields_text.split()
        if len(parts) > 5:
            raise ScheduleError(
                f"cron: {stripped!r} has {len(parts)} fields, expected 5 ({_FIELDS_HINT}); seconds and years are not supported"
            )
        # Fields present are checked before the count, so `0 0 L` is told about its `L`.
        sets = [_cron_field(spec, part) for spec, part in zip(_FIELDS, parts)]
        if len(parts) < 5:
            raise ScheduleError(f"cron: {stripped!r} has {len(parts)} fields, expected 5 ({_FIELDS_HINT})")
        minute, hour, dom, _, dow = parts
        return cls(
            text=stripped,
            minutes=sets[0],
            hours=sets[1],
            days=sets[2],
            months=sets[3],
            weekdays=sets[4],
            dom_any=dom[0] in "*?",
            dow_any=dow[0] in "*?",
            wildcard_time=minute.startswith("*") or hour.startswith("*"),
        )

    def next_after(self, after: float, tz: ZoneInfo) -> float | None:
        """The first run strictly after `after` (epoch seconds), with the daylight-saving
        rules of the module docstring; None when nothing matches within ten years.

        Walks matching days, and in them matching hours and minutes, in wall-clock order
        from `after`'s wall time; each wall time gives its instants (none, one, or two).
        Away from a clock change the first instant found is the answer. Near one, wall
        order and time order can differ by the size of the change, so the walk starts that
        much earlier and goes on that much past the first find, keeping the least."""
        start_wall = datetime.fromtimestamp(after, tz).replace(tzinfo=None)
        shift = _shift_near(tz, after)
        if shift:
            first = (start_wall - timedelta(seconds=shift)).replace(second=0, microsecond=0)
        else:
            first = start_wall.replace(second=0, microsecond=0) + timedelta(minutes=1)
        first_day = first.date()
        best: float | None = None
        stop_wall: int | None = None  # wall seconds past which nothing can beat `best`
        for year, month, day, epoch_day in self._days(first_day, first_day.year + _HORIZON_YEARS):
            day_wall = epoch_day * 86_400
            if stop_wall is not None and day_wall > stop_wall:
                break
            on_first_day = (year, month, day) == (first_day.year, first_day.month, first_day.day)
            hours = self._hour_list[bisect_left(self._hour_list, first.hour) :] if on_first_day else self._hour_list
            for hour in hours:
                minutes = self._minute_list
                if on_first_day and hour == first.hour:
                    minutes = minutes[bisect_left(minutes, first.minute) :]
                for minute in minutes:
                    wall = day_wall + hour * 3600 + minute * 60
                    if stop_wall is not None and wall > stop_wall:
                        return best
                    for instant in self._instants(datetime(year, month, day, hour, minute), wall, tz):
                        if instant > after and (best is None or instant < best):
                            best = instant
                    if best is not None and stop_wall is None:
                        shift = _shift_near(tz, best)
                        if not shift:
                            return best
                        stop_wall = wall + shift
        return best

    def _days(self, first: date, last_year: int) -> Iterator[tuple[int, int, int, int]]:
        """(year, month, day, days since 1970-01-01) of each matching day from `first` on."""
        year, month, from_day = first.year, first.month, first.day
        last_year = min(last_year, 9998)
        while year <= last_year:
            if month in self.months:
                first_ordinal = date(year, month, 1).toordinal()
                length = calendar.monthrange(year, month)[1]
                # With any day of week allowed, only the listed days of the month can match.
                candidates: Iterator[int] | range = (
                    (d for d in self._day_list[bisect_left(self._day_list, from_day) :] if d <= length)
                    if self.dow_any
                    else range(from_day, length + 1)
                )
                for day in candidates:
                    ordinal = first_ordinal + day - 1
                    in_dom = day in self.days
                    in_dow = ordinal % 7 in self.weekdays  # ordinal 1 (0001-01-01) was a Monday
                    if (in_dom and in_dow) if (self.dom_any or self.dow_any) else (in_dom or in_dow):
                        yield year, month, day, ordinal - _EPOCH_ORDINAL
            from_day = 1
            month += 1
            if month == 13:
                year, month = year + 1, 1

    def _instants(self, local: datetime, wall: int, tz: ZoneInfo) -> tuple[float, ...]:
        """The instants at which this job runs for the local time `local` (`wall` is the
        same time in seconds, read as if it were UTC)."""
        # PEP 495: fold=0 reads a time with the offset from before a change, fold=1 after.
        early = _offset(tz, local)
        late = _offset(tz, local.replace(fold=1))
        if early == late:
            return (float(wall - early),)
        if early > late:  # the time happens twice (fall back)
            if self.wildcard_time:
                return (float(wall - early), float(wall - late))
            return (float(wall - early),)
        # the time does not exist (spring forward)
        if self.wildcard_time:
            return ()
        return (_gap_end(tz, wall, early, late),)


def _offset(tz: ZoneInfo, local: datetime) -> int:
    offset = tz.utcoffset(local)
    return int(offset.total_seconds()) if offset is not None else 0


def _offset_at(tz: ZoneInfo, instant: float) -> int:
    offset = datetime.fromtimestamp(instant, tz).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def _shift_near(tz: ZoneInfo, instant: float) -> int:
    """The size in seconds of a clock change within _SLACK_S of `instant`, 0 when there is
    none (no zone changes its clock twice within 6 h)."""
    return abs(_offset_at(tz, instant + _SLACK_S) - _offset_at(tz, instant - _SLACK_S))


def _gap_end(tz: ZoneInfo, wall: int, before: int, after: int) -> float:
    """The instant the clock jumped over the nonexistent local time `wall`. It lies in
    (wall - after, wall - before]: the offset is `before` until then."""
    low, high = wall - after, wall - before
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(tz, middle) == before:
            low = middle
        else:
            high = middle
    return float(high)


# ---------------------------------------------------------------------------- schedules

ScheduleKind = Literal["at", "every", "cron"]
_KINDS: tuple[ScheduleKind, ...] = ("at", "every", "cron")
_JSON_KEYS = frozenset({"kind", "at", "every_s", "anchor", "cron", "tz"})


# A CronExpr is immutable, so the jobs that share an expression (a store loading
# thousands at start) share one parse.
_parse_cron = functools.lru_cache(maxsize=4096)(CronExpr.parse)


def _iso_utc(instant: float) -> str:
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Schedule:
    """When one job is due. Made by `make_schedule` (checked input) or `from_json` (the
    job store); a Schedule that exists is valid, because construction checks it and
    parses its cron expression once."""

    kind: ScheduleKind
    at: float | None = None
    """Epoch seconds (`at`)."""
    every_s: float | None = None
    anchor: float | None = None
    """Epoch seconds: an `every` schedule is due at anchor + k*every_s, k >= 1, so its
    times survive a restart. Without one, the period counts from whenever it is asked."""
    cron: str | None = None
    tz: str = "UTC"
    """The IANA zone a cron expression is read in (for `at`, the zone a time without an
    offset was read in; kept for the record)."""
    _cron_expr: CronExpr | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _zone: ZoneInfo | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ScheduleError(_bad_kind(self.kind))
        if self.kind == "at":
            if self.at is None or not math.isfinite(self.at):
                raise ScheduleError("at: an at schedule needs its time (epoch seconds)")
            if not 0 <= self.at <= _LATEST_AT:
                # Past year 9999 a time cannot even be printed (describe() would fail
                # for every `cron list`, after any restart too).
                raise ScheduleError(f"at: {self.at!r} is not a time this gateway can keep (1970 to 9999)")
        elif self.kind == "every":
            if self.every_s is None or not MIN_PERIOD_S <= self.every_s <= MAX_PERIOD_S:
                raise ScheduleError(f"every: the period must be 1 s to 10 years, not {self.every_s!r}")
            if self.anchor is not None and not math.isfinite(self.anchor):
                raise ScheduleError(f"every: the anchor must be epoch seconds, not {self.anchor!r}")
        elif self.cron is None:
            raise ScheduleError(f"cron: a cron schedule needs an expression ({_FIELDS_HINT})")
        else:
            object.__setattr__(self, "_cron_expr", _parse_cron(self.cron))
        if not self.tz:
            object.__setattr__(self, "tz", "UTC")
        object.__setattr__(self, "_zone", zone(self.tz))

    def next_after(self, t: float) -> float | None:
        """When it is next due, strictly after `t`; None when never again."""
        if self.at is not None and self.kind == "at":
            return self.at if self.at > t else None
        if self.every_s is not None and self.kind == "every":
            return _next_period(self.every_s, t if self.anchor is None else self.anchor, t)
        if self._cron_expr is not None and self._zone is not None:
            return self._cron_expr.next_after(t, self._zone)
        return None

    def describe(self) -> str:
        """One line for `cron list`: `at 2026-12-01T10:00:00Z`, `every 30m`,
        `cron '0 9 * * 1-5' (Europe/Berlin)`."""
        if self.at is not None and self.kind == "at":
            return f"at {_iso_utc(self.at)}"
        if self.every_s is not None and self.kind == "every":
            return f"every {format_duration(self.every_s)}"
        return f"cron '{self.cron}' ({self.tz})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("at", "every_s", "anchor", "cron"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["tz"] = self.tz
        return out

    @classmethod
    def from_json(cls, d: Any) -> Schedule:
        """The inverse of `to_json`; ScheduleError, naming the field, on bad data."""
        if not isinstance(d, Mapping):
            raise ScheduleError(f"schedule: expected an object with a kind, not {type(d).__name__}")
        unknown = sorted(str(key) for key in d if key not in _JSON_KEYS)
        if unknown:
            raise ScheduleError(f"schedule: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_JSON_KEYS))})")
        cron, tz = d.get("cron"), d.get("tz", "UTC")
        if cron is not None and not isinstance(cron, str):
            raise ScheduleError(f"cron: the expression must be text, not {type(cron).__name__}")
        if not isinstance(tz, str):
            raise ScheduleError(f"tz: the time zone must be text, not {type(tz).__name__}")
        return cls(
            kind=_json_kind(d.get("kind")),
            at=_json_number(d, "at", "at"),
            every_s=_json_number(d, "every_s", "every"),
            anchor=_json_number(d, "anchor", "every"),
            cron=cron,
            tz=tz,
        )


def _bad_kind(kind: object) -> str:
    return f"schedule: kind {kind!r} is not one of {', '.join(_KINDS)}"


def _json_kind(value: object) -> ScheduleKind:
    for kind in _KINDS:
        if value == kind:
            return kind
    raise ScheduleError(_bad_kind(value))


def _json_number(d: Mapping[str, Any], key: str, field: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"{field}: {key} must be a number of seconds, not {value!r}")
    return float(value)


def _next_period(period: float, anchor: float, t: float) -> float:
    """The least anchor + k*period (k >= 1) strictly after t."""
    k = max(1, math.floor((t - anchor) / period) + 1)
    # The division can round either way; settle k exactly.
    while anchor + k * period <= t:
        k += 1
    while k > 1 and anchor + (k - 1) * period > t:
        k -= 1
    return anchor + k * period


def _parse_at(text: str, place: ZoneInfo, now: float) -> float:
    spoken = text.strip()
    try:
        moment = datetime.fromisoformat(spoken)
    except ValueError:
        raise ScheduleError(
            f"at: {text!r} is not an ISO 8601 time (examples: 2026-12-01T10:00, 2026-12-01T10:00:00Z, 2026-12-01 10:00+01:00)"
        ) from None
    if moment.tzinfo is None:
        # A local time that happens twice is its first occurrence (fold=0).
        moment = moment.replace(tzinfo=place)
        if moment.astimezone(UTC).astimezone(place).replace(tzinfo=None) != moment.replace(tzinfo=None):
            raise ScheduleError(
                f"at: {spoken} does not exist in {place.key} (a daylight-saving gap: the clocks skip it); "
                "give a time outside the gap, or one with an offset"
            )
    instant = moment.timestamp()
    if instant <= now:
        raise ScheduleError(f"at: {moment.isoformat()} is in the past (now is {_iso_utc(now)}); give a future time")
    if instant > now + MAX_PERIOD_S:
        raise ScheduleError(f"at: {moment.isoformat()} is more than 10 years ahead; give a nearer time")
    return instant


def make_schedule(
    *, at: str | None = None, every: str | None = None, cron: str | None = None, tz: str | None = None, now: float
) -> Schedule:
    """A schedule from what a user typed (the CLI, the cron tool, the heartbeat's config).
    `tz` reads an `at` time without an offset and a cron expression; `every` ignores it
    (it is still checked: a misspelt zone is a mistake either way)."""
    given = [name for name, value in (("at", at), ("every", every), ("cron", cron)) if value is not None]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        raise ScheduleError(f"schedule: give exactly one of at, every or cron{got}")
    place = zone(tz)
    if at is not None:
        return Schedule(kind="at", at=_parse_at(at, place, now), tz=place.key)
    if every is not None:
        return Schedule(kind="every", every_s=parse_duration(every, "every"), anchor=now)
    assert cron is not None
    expr = CronExpr.parse(cron)
    if expr.next_after(now, place) is None:
        raise ScheduleError(
            f"cron: {expr.text!r} never runs in the next {_HORIZON_YEARS} years; check its day of month against its month"
        )
    return Schedule(kind="cron", cron=expr.text, tz=place.key)
