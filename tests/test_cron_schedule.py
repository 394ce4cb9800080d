"""When a job is due (supervisor/automation/schedule.py), checked against instants written
out by hand in this file, with their UTC offsets: the daylight-saving changes of 2026 in
New York (spring forward 2026-03-08 02:00 EST -> 03:00 EDT, fall back 2026-11-01
02:00 EDT -> 01:00 EST) and Berlin (2026-03-29 02:00 CET -> 03:00 CEST, 2026-10-25
03:00 CEST -> 02:00 CET), month ends, the day-of-month/day-of-week rule, names and
macros, `every` across a restart, `at`, and the errors a user sees.

The daylight-saving rule is vixie cron's: a job whose minute or hour field starts with
`*` follows the clock (no run at a time that does not exist, runs at both occurrences
of a repeated time); any other job runs once per local time (a time in a gap runs at the
first instant after it, a repeated time at its first occurrence). Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from zoneinfo import ZoneInfo

from clawsup.supervisor.automation.schedule import (
    CronExpr,
    Schedule,
    ScheduleError,
    format_duration,
    make_schedule,
    parse_duration,
    zone,
)

NY = "America/New_York"
BERLIN = "Europe/Berlin"
UTC = "UTC"


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def runs(expr: str, tz: str, start: str, count: int) -> list[str]:
    """The next `count` runs after `start`, each found from the one before (so each call
    is given a due instant and must return the following one), as local ISO times."""
    place, cron, t = ZoneInfo(tz), CronExpr.parse(expr), ts(start)
    out: list[str] = []
    for _ in range(count):
        due = cron.next_after(t, place)
        assert due is not None, f"{expr!r} stopped after {out}"
        assert due > t
        out.append(datetime.fromtimestamp(due, place).isoformat())
        t = due
    return out


def runs_until(expr: str, tz: str, start: str, end: str) -> list[str]:
    place, cron, t = ZoneInfo(tz), CronExpr.parse(expr), ts(start)
    out: list[str] = []
    while (due := cron.next_after(t, place)) is not None and due <= ts(end):
        assert due > t
        out.append(datetime.fromtimestamp(due, place).isoformat())
        t = due
    return out


# ------------------------------------------------------------------ daylight saving

DST_TABLE = [
    # New York, spring forward: local 02:00-02:59 on 2026-03-08 does not exist.
    pytest.param("30 2 * * *", NY, "2026-03-07T12:00:00-05:00",
                 ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"], id="ny-spring-fixed-in-gap"),
    pytest.param("0 2 * * *", NY, "2026-03-07T12:00:00-05:00",
                 ["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00"], id="ny-spring-fixed-gap-start"),
    pytest.param("0,30 2 * * *", NY, "2026-03-07T12:00:00-05:00",
                 ["2026-03-08T03:00:00-04:00", "2026-03-09T02:00:00-04:00", "2026-03-09T02:30:00-04:00"],
                 id="ny-spring-two-times-in-one-gap-run-once"),
    pytest.param("30 2 * * *", NY, "2026-03-08T03:00:00-04:00",
                 ["2026-03-09T02:30:00-04:00"], id="ny-spring-from-the-gap-run-itself"),
    pytest.param("30 1 * * *", NY, "2026-03-07T12:00:00-05:00",
                 ["2026-03-08T01:30:00-05:00", "2026-03-09T01:30:00-04:00"], id="ny-spring-before-gap"),
    pytest.param("*/30 * * * *", NY, "2026-03-08T01:00:00-05:00",
                 ["2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00"],
                 id="ny-spring-wildcard-skips-gap"),
    # The minute field starts with `*`, so by vixie's rule this is a wildcard-time job
    # (although its hour is fixed): it follows the clock.
    pytest.param("*/15 1 * * *", NY, "2026-03-08T00:50:00-05:00",
                 ["2026-03-08T01:00:00-05:00", "2026-03-08T01:15:00-05:00", "2026-03-08T01:30:00-05:00",
                  "2026-03-08T01:45:00-05:00", "2026-03-09T01:00:00-04:00"], id="ny-spring-every-15-in-hour-1"),
    # New York, fall back: local 01:00-01:59 on 2026-11-01 happens twice (EDT, then EST).
    pytest.param("30 1 * * *", NY, "2026-10-31T12:00:00-04:00",
                 ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"], id="ny-fall-fixed-runs-once"),
    pytest.param("30 1 * * *", NY, "2026-11-01T01:10:00-05:00",
                 ["2026-11-02T01:30:00-05:00"], id="ny-fall-fixed-from-second-pass-waits-a-day"),
    pytest.param("30 2 * * *", NY, "2026-10-31T12:00:00-04:00",
                 ["2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"], id="ny-fall-fixed-after-overlap"),
    pytest.param("0 2 * * *", NY, "2026-10-31T12:00:00-04:00",
                 ["2026-11-01T02:00:00-05:00", "2026-11-02T02:00:00-05:00"], id="ny-fall-fixed-at-overlap-end"),
    pytest.param("*/30 * * * *", NY, "2026-11-01T00:45:00-04:00",
                 ["2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T01:00:00-05:00",
                  "2026-11-01T01:30:00-05:00", "2026-11-01T02:00:00-05:00"], id="ny-fall-wildcard-runs-twice"),
    pytest.param("*/15 1 * * *", NY, "2026-11-01T00:00:00-04:00",
                 ["2026-11-01T01:00:00-04:00", "2026-11-01T01:15:00-04:00", "2026-11-01T01:30:00-04:00",
                  "2026-11-01T01:45:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00",
                  "2026-11-01T01:30:00-05:00", "2026-11-01T01:45:00-05:00", "2026-11-02T01:00:00-05:00"],
                 id="ny-fall-every-15-in-hour-1-is-wildcard"),
    pytest.param("*/15 * * * *", NY, "2026-11-01T01:40:00-04:00",
                 ["2026-11-01T01:45:00-04:00", "2026-11-01T01:00:00-05:00", "2026-11-01T01:15:00-05:00"],
                 id="ny-fall-wildcard-from-first-pass"),
    pytest.param("*/15 * * * *", NY, "2026-11-01T01:40:00-05:00",
                 ["2026-11-01T01:45:00-05:00", "2026-11-01T02:00:00-05:00"], id="ny-fall-wildcard-from-second-pass"),
    # Both fields fixed: once per local time, at the first pass.
    pytest.param("15,45 1 * * *", NY, "2026-11-01T00:00:00-04:00",
                 ["2026-11-01T01:15:00-04:00", "2026-11-01T01:45:00-04:00", "2026-11-02T01:15:00-05:00"],
                 id="ny-fall-fixed-list-in-hour-1"),
    # Berlin, spring forward: local 02:00-02:59 on 2026-03-29 does not exist.
    pytest.param("30 2 * * *", BERLIN, "2026-03-28T12:00:00+01:00",
                 ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"], id="berlin-spring-fixed-in-gap"),
    pytest.param("0 2 * * *", BERLIN, "2026-03-28T12:00:00+01:00",
                 ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"], id="berlin-spring-fixed-gap-start"),
    pytest.param("*/30 * * * *", BERLIN, "2026-03-29T01:00:00+01:00",
                 ["2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"],
                 id="berlin-spring-wildcard-skips-gap"),
    # Berlin, fall back: local 02:00-02:59 on 2026-10-25 happens twice (CEST, then CET).
    pytest.param("30 2 * * *", BERLIN, "2026-10-24T12:00:00+02:00",
                 ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"], id="berlin-fall-fixed-runs-once"),
    pytest.param("0 2 * * *", BERLIN, "2026-10-24T12:00:00+02:00",
                 ["2026-10-25T02:00:00+02:00", "2026-10-26T02:00:00+01:00"], id="berlin-fall-fixed-at-overlap-start"),
    pytest.param("30 1 * * *", BERLIN, "2026-10-24T12:00:00+02:00",
                 ["2026-10-25T01:30:00+02:00", "2026-10-26T01:30:00+01:00"], id="berlin-fall-before-overlap"),
    pytest.param("*/30 * * * *", BERLIN, "2026-10-25T01:30:00+02:00",
                 ["2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+01:00",
                  "2026-10-25T02:30:00+01:00", "2026-10-25T03:00:00+01:00"], id="berlin-fall-wildcard-runs-twice"),
    # A far run asked for from inside an overlap.
    pytest.param("0 0 1 1 *", NY, "2026-11-01T01:30:00-05:00",
                 ["2027-01-01T00:00:00-05:00"], id="ny-yearly-from-inside-overlap"),
]  # fmt: skip


@pytest.mark.parametrize(("expr", "tz", "start", "expected"), DST_TABLE)
def test_daylight_saving_table(expr: str, tz: str, start: str, expected: list[str]) -> None:
    assert runs(expr, tz, start, len(expected)) == expected


def test_hourly_job_has_23_runs_on_spring_day_and_25_on_fall_day() -> None:
    ny_spring = ["2026-03-08T00:00:00-05:00", "2026-03-08T01:00:00-05:00"] + [
        f"2026-03-08T{h:02d}:00:00-04:00" for h in range(3, 24)
    ]
    ny_fall = ["2026-11-01T00:00:00-04:00", "2026-11-01T01:00:00-04:00", "2026-11-01T01:00:00-05:00"] + [
        f"2026-11-01T{h:02d}:00:00-05:00" for h in range(2, 24)
    ]
    berlin_spring = ["2026-03-29T00:00:00+01:00", "2026-03-29T01:00:00+01:00"] + [
        f"2026-03-29T{h:02d}:00:00+02:00" for h in range(3, 24)
    ]
    berlin_fall = ["2026-10-25T00:00:00+02:00", "2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00"] + [
        f"2026-10-25T{h:02d}:00:00+01:00" for h in range(2, 24)
    ]
    assert runs_until("0 * * * *", NY, "2026-03-07T23:30:00-05:00", "2026-03-08T23:59:00-04:00") == ny_spring
    assert runs_until("0 * * * *", NY, "2026-10-31T23:30:00-04:00", "2026-11-01T23:59:00-05:00") == ny_fall
    assert runs_until("0 * * * *", BERLIN, "2026-03-28T23:30:00+01:00", "2026-03-29T23:59:00+02:00") == berlin_spring
    assert runs_until("0 * * * *", BERLIN, "2026-10-24T23:30:00+02:00", "2026-10-25T23:59:00+01:00") == berlin_fall
    assert (len(ny_spring), len(ny_fall), len(berlin_spring), len(berlin_fall)) == (23, 25, 23, 25)


def reference_runs(cron: CronExpr, tz: str, start: float, end: float) -> list[float]:
    """The same rule stated another way, as a slow walk through real time minute by minute
    (every zone here changes its clock on a whole minute): a wildcard-time job runs at
    each instant whose wall time matches; a fixed-time job runs at each first pass of a
    matching wall time, and at the instant after a jump if a wall time it skipped matches."""
    place = ZoneInfo(tz)

    def matches(wall: datetime) -> bool:
        in_dom, in_dow = wall.day in cron.days, wall.isoweekday() % 7 in cron.weekdays
        day = (in_dom and in_dow) if (cron.dom_any or cron.dow_any) else (in_dom or in_dow)
        return day and wall.minute in cron.minutes and wall.hour in cron.hours and wall.month in cron.months

    out: list[float] = []
    t = start - start % 60 + 60
    previous = datetime.fromtimestamp(t - 60, place).replace(tzinfo=None)
    while t <= end:
        now = datetime.fromtimestamp(t, place)
        wall = now.replace(tzinfo=None)
        if cron.wildcard_time:
            run = matches(wall)
        else:
            skipped = (previous + timedelta(minutes=k) for k in range(1, int((wall - previous).total_seconds()) // 60))
            run = (matches(wall) and now.fold == 0) or any(matches(w) for w in skipped)
        if run:
            out.append(t)
        previous, t = wall, t + 60
    return out


# Lord Howe Island moves its clock by 30 minutes: 2026-04-05 02:00 -> 01:30 and
# 2026-10-04 02:00 -> 02:30.
@pytest.mark.parametrize(
    ("tz", "start"),
    [
        (NY, "2026-03-07T22:00:00-05:00"),
        (NY, "2026-10-31T22:00:00-04:00"),
        (BERLIN, "2026-03-28T22:00:00+01:00"),
        (BERLIN, "2026-10-24T22:00:00+02:00"),
        ("Australia/Lord_Howe", "2026-04-04T22:00:00+11:00"),
        ("Australia/Lord_Howe", "2026-10-03T22:00:00+10:30"),
    ],
)
def test_agrees_with_a_minute_by_minute_walk_around_each_change(tz: str, start: str) -> None:
    exprs = ["*/15 * * * *", "0 * * * *", "30 2 * * *", "0,15 2 * * *", "15,45 1 * * *", "*/10 1-3 * * *", "5 1-3 * * *", "@daily"]
    begin = ts(start)
    end = begin + 10 * 3600
    for expr in exprs:
        cron, got, t = CronExpr.parse(expr), [], begin
        while (due := cron.next_after(t, ZoneInfo(tz))) is not None and due <= end:
            assert due > t
            got.append(due)
            t = due
        assert got == reference_runs(cron, tz, begin, end), expr


# ------------------------------------------------------------------ calendar


def test_month_ends() -> None:
    assert runs("0 9 31 * *", UTC, "2026-04-15T00:00:00+00:00", 2) == ["2026-05-31T09:00:00+00:00", "2026-07-31T09:00:00+00:00"]
    assert runs("0 0 29 2 *", UTC, "2026-03-01T00:00:00+00:00", 1) == ["2028-02-29T00:00:00+00:00"]
    # 2100 is no leap year: eight years to the next 29 February.
    assert runs("0 0 29 2 *", UTC, "2096-03-01T00:00:00+00:00", 1) == ["2104-02-29T00:00:00+00:00"]
    assert runs("0 12 1 * *", UTC, "2026-12-31T12:00:00+00:00", 1) == ["2027-01-01T12:00:00+00:00"]
    assert runs("59 23 31 12 *", UTC, "2026-12-31T23:59:00+00:00", 1) == ["2027-12-31T23:59:00+00:00"]
    assert CronExpr.parse("0 0 31 2 *").next_after(ts("2026-01-01T00:00:00+00:00"), ZoneInfo(UTC)) is None
    assert CronExpr.parse("0 0 30 2 *").next_after(ts("2026-01-01T00:00:00+00:00"), ZoneInfo(UTC)) is None


def test_day_of_month_or_day_of_week() -> None:
    # April 2026: the 1st is a Wednesday, the 13th a Monday; Fridays are 3, 10, 17, 24, and 1 May.
    start = "2026-04-01T00:00:00+00:00"
    assert runs("0 0 13 * 5", UTC, start, 6) == [
        "2026-04-03T00:00:00+00:00", "2026-04-10T00:00:00+00:00", "2026-04-13T00:00:00+00:00",
        "2026-04-17T00:00:00+00:00", "2026-04-24T00:00:00+00:00", "2026-05-01T00:00:00+00:00",
    ]  # fmt: skip
    assert runs("0 0 * * 5", UTC, start, 5) == [
        "2026-04-03T00:00:00+00:00", "2026-04-10T00:00:00+00:00", "2026-04-17T00:00:00+00:00",
        "2026-04-24T00:00:00+00:00", "2026-05-01T00:00:00+00:00",
    ]  # fmt: skip
    assert runs("0 0 13 * *", UTC, start, 3) == ["2026-04-13T00:00:00+00:00", "2026-05-13T00:00:00+00:00", "2026-06-13T00:00:00+00:00"]
    assert runs("0 0 13 * ?", UTC, start, 1) == ["2026-04-13T00:00:00+00:00"]


def test_day_field_starting_with_star_means_both_must_match_as_in_vixie_cron() -> None:
    # Vixie cron reads the first character: `*/10` counts as `*`, so days 1, 11, 21, 31
    # that are also Fridays (1 May, 31 July); spelt as a list, either one matches.
    start = "2026-04-01T00:00:00+00:00"
    assert runs("0 0 */10 * 5", UTC, start, 2) == ["2026-05-01T00:00:00+00:00", "2026-07-31T00:00:00+00:00"]
    assert runs("0 0 1,11,21,31 * 5", UTC, start, 4) == [
        "2026-04-03T00:00:00+00:00", "2026-04-10T00:00:00+00:00", "2026-04-11T00:00:00+00:00", "2026-04-17T00:00:00+00:00",
    ]  # fmt: skip


def test_names_macros_and_sunday_as_seven() -> None:
    assert runs("0 9 * * mon-fri", UTC, "2026-04-03T09:00:00+00:00", 2) == ["2026-04-06T09:00:00+00:00", "2026-04-07T09:00:00+00:00"]
    assert CronExpr.parse("0 9 * * MON-Fri").weekdays == frozenset({1, 2, 3, 4, 5})
    assert runs("@daily", UTC, "2026-04-03T12:00:00+00:00", 2) == ["2026-04-04T00:00:00+00:00", "2026-04-05T00:00:00+00:00"]
    assert runs("@midnight", UTC, "2026-04-03T12:00:00+00:00", 1) == ["2026-04-04T00:00:00+00:00"]
    assert runs("@hourly", UTC, "2026-04-03T12:00:00+00:00", 2) == ["2026-04-03T13:00:00+00:00", "2026-04-03T14:00:00+00:00"]
    assert runs("@weekly", UTC, "2026-04-03T12:00:00+00:00", 1) == ["2026-04-05T00:00:00+00:00"]
    assert runs("@monthly", UTC, "2026-04-03T12:00:00+00:00", 1) == ["2026-05-01T00:00:00+00:00"]
    assert runs("@yearly", UTC, "2026-04-03T12:00:00+00:00", 1) == ["2027-01-01T00:00:00+00:00"]
    assert runs("@ANNUALLY", UTC, "2026-04-03T12:00:00+00:00", 1) == ["2027-01-01T00:00:00+00:00"]
    # July 2026 starts on a Wednesday.
    assert runs("0 0 * jan,JUL Sun", UTC, "2026-04-01T00:00:00+00:00", 2) == ["2026-07-05T00:00:00+00:00", "2026-07-12T00:00:00+00:00"]
    assert CronExpr.parse("0 0 * * 7").weekdays == frozenset({0})
    assert CronExpr.parse("0 0 * * 5-7").weekdays == frozenset({5, 6, 0})
    assert runs("0 0 * * 7", UTC, "2026-04-01T00:00:00+00:00", 2) == runs("0 0 * * sun", UTC, "2026-04-01T00:00:00+00:00", 2)
    assert runs("0 0 * * 7", UTC, "2026-04-01T00:00:00+00:00", 1) == ["2026-04-05T00:00:00+00:00"]


def test_lists_ranges_steps_and_wildcard_time() -> None:
    assert CronExpr.parse("*/15 * * * *").minutes == frozenset({0, 15, 30, 45})
    assert CronExpr.parse("10-50/20 * * * *").minutes == frozenset({10, 30, 50})
    assert CronExpr.parse("5/15 * * * *").minutes == frozenset({5, 20, 35, 50})
    assert CronExpr.parse("0 1,5,9 * * *").hours == frozenset({1, 5, 9})
    assert CronExpr.parse("0 0 * * *").days == frozenset(range(1, 32))
    # vixie's rule: a minute or hour field starting with `*` follows the clock.
    assert [CronExpr.parse(e).wildcard_time for e in ("*/15 1 * * *", "0 */2 * * *", "@hourly", "* * * * *")] == [True] * 4
    assert [CronExpr.parse(e).wildcard_time for e in ("15,45 1 * * *", "30 2 * * *", "@daily", "0 0-23/2 * * *")] == [False] * 4


def test_next_after_is_strictly_after() -> None:
    place = ZoneInfo(UTC)
    cron = CronExpr.parse("*/15 * * * *")
    assert cron.next_after(ts("2026-04-03T12:15:00+00:00"), place) == ts("2026-04-03T12:30:00+00:00")
    assert cron.next_after(ts("2026-04-03T12:14:59.500000+00:00"), place) == ts("2026-04-03T12:15:00+00:00")
    assert cron.next_after(ts("2026-04-03T23:59:00+00:00"), place) == ts("2026-04-04T00:00:00+00:00")


# ------------------------------------------------------------------ schedules

T0 = ts("2026-06-01T12:00:00+00:00")


def test_every_keeps_its_times_across_a_restart() -> None:
    schedule = make_schedule(every="30m", now=T0)
    assert (schedule.every_s, schedule.anchor) == (1800.0, T0)
    restarted = Schedule.from_json(json.loads(json.dumps(schedule.to_json())))
    assert restarted == schedule
    # Down from T0 + 1 h 30 m to T0 + 1 h 45 m: next due at T0 + 2 h, not 30 m after the restart.
    assert restarted.next_after(T0 + 3.5 * 1800) == T0 + 4 * 1800
    assert restarted.next_after(T0) == T0 + 1800
    assert restarted.next_after(T0 + 1800) == T0 + 2 * 1800
    assert restarted.next_after(T0 - 500) == T0 + 1800
    assert restarted.describe() == "every 30m"


def test_at_reads_a_time_without_offset_in_tz() -> None:
    assert make_schedule(at="2026-12-01T10:00", now=T0).at == ts("2026-12-01T10:00:00+00:00")
    berlin = make_schedule(at="2026-12-01T10:00", tz=BERLIN, now=T0)
    assert berlin.at == ts("2026-12-01T10:00:00+01:00")
    assert berlin.describe() == "at 2026-12-01T09:00:00Z"
    assert make_schedule(at="2026-12-01T10:00:00Z", tz=BERLIN, now=T0).at == ts("2026-12-01T10:00:00+00:00")
    assert make_schedule(at="2026-12-01 10:00+01:00", tz=NY, now=T0).at == ts("2026-12-01T09:00:00+00:00")
    # A repeated local time is its first pass.
    assert make_schedule(at="2026-11-01T01:30", tz=NY, now=T0).at == ts("2026-11-01T01:30:00-04:00")


def test_at_is_due_once() -> None:
    schedule = make_schedule(at="2026-12-01T10:00:00Z", now=T0)
    due = ts("2026-12-01T10:00:00+00:00")
    assert schedule.next_after(T0) == due
    assert schedule.next_after(due - 0.001) == due
    assert schedule.next_after(due) is None
    assert schedule.next_after(due + 60) is None
    assert Schedule.from_json(schedule.to_json()) == schedule


def test_cron_schedule_reads_its_zone() -> None:
    schedule = make_schedule(cron="0 9 * * 1-5", tz=BERLIN, now=ts("2026-04-03T10:00:00+02:00"))
    assert schedule.describe() == "cron '0 9 * * 1-5' (Europe/Berlin)"
    assert schedule.next_after(ts("2026-04-03T10:00:00+02:00")) == ts("2026-04-06T09:00:00+02:00")
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert make_schedule(cron="@hourly", now=T0).describe() == "cron '@hourly' (UTC)"


def test_durations() -> None:
    table = {"90s": 90, "30m": 1800, "1h": 3600, "1h30m": 5400, "2d": 172_800, "1w": 604_800, "45": 45,
             "1.5h": 5400, " 1H 30M ": 5400, "1s": 1}  # fmt: skip
    assert {text: parse_duration(text) for text in table} == table
    assert [format_duration(s) for s in (90, 1800, 5400, 172_800, 604_800, 1.5)] == ["1m30s", "30m", "1h30m", "2d", "1w", "1.5s"]
    assert parse_duration(format_duration(93_784)) == 93_784


# ------------------------------------------------------------------ errors

ERRORS = [
    (lambda: CronExpr.parse("0 25 * * *"), "cron: field 2 (hour): 25 is out of range 0-23"),
    (lambda: CronExpr.parse("60 * * * *"), "cron: field 1 (minute): 60 is out of range 0-59"),
    (lambda: CronExpr.parse("0 0 32 * *"), "cron: field 3 (day of month): 32 is out of range 1-31"),
    (lambda: CronExpr.parse("0 0 * 13 *"), "cron: field 4 (month): 13 is out of range 1-12"),
    (lambda: CronExpr.parse("0 0 * * 8"), "cron: field 5 (day of week): 8 is out of range 0-7"),
    (lambda: CronExpr.parse("0 0 L * *"), "cron: field 3 (day of month): 'L' is not supported"),
    (lambda: CronExpr.parse("0 0 L"), "cron: field 3 (day of month): 'L' is not supported"),
    (lambda: CronExpr.parse("0 0 * * mon#2"), "cron: field 5 (day of week): 'mon#2' is not supported"),
    (lambda: CronExpr.parse("0 5-1 * * *"), "cron: field 2 (hour): range 5-1 is reversed; write the smaller value first (1-5)"),
    (lambda: CronExpr.parse("*/0 * * * *"), "cron: field 1 (minute): step 0"),
    (lambda: CronExpr.parse("*/x * * * *"), "cron: field 1 (minute): step 'x'"),
    (lambda: CronExpr.parse("0 0 * foo *"), "cron: field 4 (month): 'foo' is not a number or a name (jan-dec)"),
    (lambda: CronExpr.parse("0 jan * * *"), "cron: field 2 (hour): 'jan' is not a number"),
    (lambda: CronExpr.parse("? * * * *"), "cron: field 1 (minute): '?' is only for the day-of-month and day-of-week"),
    (lambda: CronExpr.parse("1,,2 * * * *"), "cron: field 1 (minute): '1,,2' has an empty list item"),
    (lambda: CronExpr.parse("0 0 * * * *"), "cron: '0 0 * * * *' has 6 fields, expected 5"),
    (lambda: CronExpr.parse("0 0 *"), "cron: '0 0 *' has 3 fields, expected 5"),
    (lambda: CronExpr.parse("@reboot"), "cron: '@reboot' is not supported; the macros are @yearly"),
    (lambda: CronExpr.parse("  "), "cron: the expression is empty"),
    (lambda: make_schedule(cron="0 0 31 2 *", now=T0), "cron: '0 0 31 2 *' never runs in the next 10 years"),
    (lambda: zone("Mars/Base"), "tz: unknown time zone 'Mars/Base' (give an IANA name"),
    (lambda: zone("../../etc/passwd"), "tz: unknown time zone '../../etc/passwd'"),
    (lambda: make_schedule(cron="0 9 * * *", tz="Mars/Base", now=T0), "tz: unknown time zone 'Mars/Base'"),
    (lambda: parse_duration("5x"), "every: '5x' is not a duration (examples: 90s, 30m, 1h, 1h30m, 2d)"),
    (lambda: parse_duration("500ms"), "every: '500ms' is not a duration"),
    (lambda: parse_duration("0.5"), "every: '0.5' is shorter than the minimum of 1 second"),
    (lambda: parse_duration("3653d"), "every: '3653d' is longer than the maximum of 10 years"),
    (lambda: parse_duration("30m1h"), "every: '30m1h' repeats or reorders its units; write the largest first"),
    (lambda: parse_duration("-5m"), "every: '-5m' is not a duration"),
    (lambda: parse_duration("0s", field="heartbeat.every"), "heartbeat.every: '0s' is shorter than the minimum"),
    (lambda: make_schedule(every="1y", now=T0), "every: '1y' is not a duration"),
    (lambda: make_schedule(now=T0), "schedule: give exactly one of at, every or cron"),
    (lambda: make_schedule(at="2026-12-01T10:00Z", every="1h", now=T0), "schedule: give exactly one of at, every or cron (got at and every)"),
    (lambda: make_schedule(at="tomorrow", now=T0), "at: 'tomorrow' is not an ISO 8601 time (examples: 2026-12-01T10:00"),
    (lambda: make_schedule(at="2020-01-01T00:00:00Z", now=T0), "at: 2020-01-01T00:00:00+00:00 is in the past (now is 2026-06-01T12:00:00Z)"),
    (lambda: make_schedule(at="2026-06-01T12:00:00Z", now=T0), "at: 2026-06-01T12:00:00+00:00 is in the past"),
    (lambda: make_schedule(at="2026-03-08T02:30", tz=NY, now=T0 - 365 * 86400),
     "at: 2026-03-08T02:30 does not exist in America/New_York (a daylight-saving gap"),
    (lambda: Schedule.from_json("cron"), "schedule: expected an object with a kind, not str"),
    (lambda: Schedule.from_json({"kind": "soon"}), "schedule: kind 'soon' is not one of at, every, cron"),
    (lambda: Schedule.from_json({"kind": "at", "at": 1e9, "extra": 1}), "schedule: unknown keys extra"),
    (lambda: Schedule.from_json({"kind": "at"}), "at: an at schedule needs its time"),
    (lambda: Schedule.from_json({"kind": "at", "at": "noon"}), "at: at must be a number of seconds, not 'noon'"),
    (lambda: Schedule.from_json({"kind": "at", "at": True}), "at: at must be a number of seconds, not True"),
    (lambda: Schedule.from_json({"kind": "every", "every_s": 0.5, "anchor": T0}), "every: the period must be 1 s to 10 years"),
    (lambda: Schedule.from_json({"kind": "every", "every_s": 60, "anchor": "x"}), "every: anchor must be a number"),
    (lambda: Schedule.from_json({"kind": "cron"}), "cron: a cron schedule needs an expression"),
    (lambda: Schedule.from_json({"kind": "cron", "cron": 5}), "cron: the expression must be text"),
    (lambda: Schedule.from_json({"kind": "cron", "cron": "61 * * * *"}), "cron: field 1 (minute): 61 is out of range"),
    (lambda: Schedule.from_json({"kind": "cron", "cron": "0 * * * *", "tz": "Mars/Base"}), "tz: unknown time zone 'Mars/Base'"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "message"), ERRORS, ids=[m.split(":")[0] + ":" + m.split(":", 1)[1][:40] for _, m in ERRORS])
def test_errors_name_their_field_and_say_what_to_do(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        call()
    assert str(caught.value).startswith(message)


def test_an_at_time_past_ten_years_or_past_year_9999_is_refused() -> None:
    """9999-12-31T23:59-14:00 is in year 10000 in UTC: once stored, `describe()` failed
    for every `cron list`, after any restart too (the attack pass)."""
    with pytest.raises(ScheduleError, match=r"^at: .* is more than 10 years ahead"):
        make_schedule(at="9999-12-31T23:59:00-14:00", now=T0)
    with pytest.raises(ScheduleError, match=r"^at: .* is not a time this gateway can keep"):
        Schedule.from_json({"kind": "at", "at": 253_402_300_800.0 + 86_400, "tz": "UTC"})
