"""Maintenance windows: days, wall-clock hours in an IANA zone, spans past midnight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.api.policy import WEEKDAYS, Window
from gate.rollout import window_contains, windows_open

FRI_NIGHT_BERLIN = Window(days=["Fri"], start="22:00", end="02:00", time_zone="Europe/Berlin")


@pytest.mark.parametrize(
    ("utc", "inside"),
    [
        (datetime(2025, 1, 10, 20, 59, tzinfo=UTC), False),  # Fri 21:59 CET: not yet
        (datetime(2025, 1, 10, 21, 0, tzinfo=UTC), True),  # Fri 22:00 CET: opens
        (datetime(2025, 1, 10, 23, 30, tzinfo=UTC), True),  # Sat 00:30 CET: past midnight, Friday's window
        (datetime(2025, 1, 11, 0, 59, tzinfo=UTC), True),  # Sat 01:59 CET
        (datetime(2025, 1, 11, 1, 0, tzinfo=UTC), False),  # Sat 02:00 CET: closed (end excluded)
        (datetime(2025, 1, 11, 21, 30, tzinfo=UTC), False),  # Sat 22:30 CET: Saturday is not listed
        (datetime(2025, 1, 9, 23, 30, tzinfo=UTC), False),  # Fri 00:30 CET belongs to Thursday's window
        (datetime(2025, 7, 11, 20, 30, tzinfo=UTC), True),  # Fri 22:30 CEST: summer time moves it in UTC
        (datetime(2025, 7, 11, 23, 59, tzinfo=UTC), True),  # Sat 01:59 CEST
        (datetime(2025, 7, 12, 0, 0, tzinfo=UTC), False),  # Sat 02:00 CEST
    ],
)
def test_window_spanning_midnight_in_berlin_belongs_to_the_day_it_opens(utc: datetime, inside: bool) -> None:
    assert window_contains(FRI_NIGHT_BERLIN, utc) is inside


@pytest.mark.parametrize(
    ("local", "inside"),
    [("08:59", False), ("09:00", True), ("16:59", True), ("17:00", False)],
)
def test_same_day_window_includes_its_opening_minute_and_excludes_its_closing_minute(
    local: str, inside: bool
) -> None:
    window = Window(days=["Mon"], start="09:00", end="17:00", time_zone="America/New_York")
    hour, minute = map(int, local.split(":"))
    now = datetime(2025, 1, 6, hour, minute, 30, tzinfo=ZoneInfo("America/New_York"))

    assert window_contains(window, now) is inside


def test_window_with_equal_start_and_end_lasts_a_full_day() -> None:
    window = Window(days=["Sat"], start="06:00", end="06:00", time_zone="UTC")

    assert window_contains(window, datetime(2025, 1, 11, 6, 0, tzinfo=UTC))
    assert window_contains(window, datetime(2025, 1, 12, 5, 59, tzinfo=UTC))
    assert not window_contains(window, datetime(2025, 1, 12, 6, 0, tzinfo=UTC))
    assert not window_contains(window, datetime(2025, 1, 11, 5, 59, tzinfo=UTC))


def test_window_with_unknown_time_zone_never_opens() -> None:
    window = Window(days=list(WEEKDAYS), start="00:00", end="00:00", time_zone="Mars/Olympus")

    assert not window_contains(window, datetime(2025, 1, 11, 12, 0, tzinfo=UTC))


def test_no_windows_means_always_open_and_naive_times_are_refused() -> None:
    assert windows_open([], datetime(2025, 1, 11, 12, 0, tzinfo=UTC))
    with pytest.raises(ValueError, match="timezone-aware"):
        windows_open([], datetime(2025, 1, 11, 12, 0))


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Chatham"]
hhmm = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.sampled_from([0, 1, 15, 30, 45, 59]))
windows = st.builds(
    Window,
    days=st.lists(st.sampled_from(WEEKDAYS), min_size=1, max_size=7, unique=True),
    start=hhmm,
    end=hhmm,
    time_zone=st.sampled_from(ZONES),
)
instants = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2027, 1, 1)).map(
    lambda d: d.replace(tzinfo=UTC)
)


def _inside_by_minute_of_week(window: Window, now: datetime) -> bool:
    """Oracle: each listed day opens an interval on a 7-day circle of minutes, as long as the window
    lasts (24 hours when start == end); `now` is inside when it falls in one of those intervals."""
    local = now.astimezone(ZoneInfo(window.time_zone))
    minute = local.weekday() * 1440 + local.hour * 60 + local.minute
    start = int(window.start[:2]) * 60 + int(window.start[3:])
    end = int(window.end[:2]) * 60 + int(window.end[3:])
    length = (end - start) % 1440 or 1440
    return any((minute - (WEEKDAYS.index(day) * 1440 + start)) % (7 * 1440) < length for day in window.days)


@settings(max_examples=400, deadline=None)
@given(window=windows, now=instants)
def test_window_membership_matches_a_minute_of_week_oracle(window: Window, now: datetime) -> None:
    assert window_contains(window, now) == _inside_by_minute_of_week(window, now)


@settings(max_examples=100, deadline=None)
@given(window=windows, now=instants)
def test_window_membership_does_not_depend_on_the_zone_now_is_given_in(window: Window, now: datetime) -> None:
    elsewhere = now.astimezone(timezone(timedelta(hours=-7, minutes=-30)))
    assert window_contains(window, now) == window_contains(window, elsewhere)


@settings(max_examples=300, deadline=None)
@given(
    window=windows,
    day=st.integers(0, 365 * 2),
    edge=st.sampled_from(["start", "end"]),
    shift=st.integers(-1, 1),
    second=st.sampled_from([0, 59]),
)
def test_window_membership_matches_the_oracle_at_its_opening_and_closing_minutes(
    window: Window, day: int, edge: str, shift: int, second: int
) -> None:
    zone = ZoneInfo(window.time_zone)
    hhmm = window.start if edge == "start" else window.end
    local = datetime(2025, 1, 1, int(hhmm[:2]), int(hhmm[3:]), second, tzinfo=zone) + timedelta(days=day)
    now = (local + timedelta(minutes=shift)).astimezone(UTC)

    assert window_contains(window, now) == _inside_by_minute_of_week(window, now)
