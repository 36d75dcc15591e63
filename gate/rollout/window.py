"""Maintenance windows: when new nodes may start.

A window opens at `start` (wall-clock time in `timeZone`) on each of its `days` and closes at `end`.
When `end` is earlier than `start` the window runs past midnight and belongs to the day it opens on:
`{days: [Fri], start: "22:00", end: "02:00"}` is Friday 22:00 to Saturday 02:00, and not Saturday
22:00. When `end` equals `start` the window lasts a full 24 hours. The window includes its opening
minute and excludes its closing minute. Times are wall-clock times, so across a daylight-saving change
a window keeps its local hours (and a window inside the skipped hour is shorter that night).

A window whose time zone is unknown never opens: failing closed keeps a typo from starting work at
an hour nobody chose (admission rejects such zones; this guards objects written before that check).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gate.api.policy import WEEKDAYS, Window


def _minute_of_day(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def require_aware(now: datetime) -> None:
    """A naive datetime has no place in time zone arithmetic: refuse it rather than guess UTC."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware, e.g. datetime.now(timezone.utc)")


def window_contains(window: Window, now: datetime) -> bool:
    """Whether `now` (timezone-aware) falls inside `window`."""
    require_aware(now)
    try:
        zone = ZoneInfo(window.time_zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    local = now.astimezone(zone)
    minute = local.hour * 60 + local.minute
    start, end = _minute_of_day(window.start), _minute_of_day(window.end)
    today = WEEKDAYS[local.weekday()]
    if start < end:
        return today in window.days and start <= minute < end
    # Runs past midnight (or a full day when end == start): the part after midnight belongs to the
    # previous day's window.
    yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
    return (today in window.days and minute >= start) or (yesterday in window.days and minute < end)


def windows_open(windows: Sequence[Window], now: datetime) -> bool:
    """No windows: always open. Otherwise open while `now` is inside at least one of them."""
    require_aware(now)
    return not windows or any(window_contains(w, now) for w in windows)
