"""Independent restatements of the documented rules, for property tests to compare the planner with.

Written from the package docstring, not from the planner: different shapes (a minute-of-week circle
for windows, a lookup table for strategies) so a shared mistake is unlikely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

WEEK = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _minutes(hhmm: str) -> int:
    return int(hhmm[:2]) * 60 + int(hhmm[3:])


def window_open(window: Mapping[str, Any], now: datetime) -> bool:
    """Each listed day opens an interval on a 7-day circle of minutes, as long as the window lasts
    (24 hours when start == end); `now` is inside when it falls in one of those intervals."""
    local = now.astimezone(ZoneInfo(window.get("timeZone", "UTC")))
    minute = local.weekday() * 1440 + local.hour * 60 + local.minute
    start, end = _minutes(window["start"]), _minutes(window["end"])
    length = (end - start) % 1440 or 1440
    return any((minute - (WEEK.index(day) * 1440 + start)) % (7 * 1440) < length for day in window["days"])


def any_window_open(windows: Sequence[Mapping[str, Any]], now: datetime) -> bool:
    return not windows or any(window_open(w, now) for w in windows)


def ceiling(budget: Mapping[str, int], matched: int) -> int:
    if matched == 0:
        return 0
    if "count" in budget:
        return min(budget["count"], matched)
    return max(1, (budget["percent"] * matched) // 100)


def params(strategy: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    ((kind, values),) = strategy.items()
    defaults = {"initialBatch": 1, "batchThreshold": 100, "failureThreshold": 3, "safetyLimit": 50,
                "delta": 1, "growthFactor": 2}
    return kind, {**defaults, **values}


_GROW = {
    "fixed": lambda size, p: p["initialBatch"],
    "linear": lambda size, p: size + p["delta"],
    "exponential": lambda size, p: size * p["growthFactor"],
}
_SHRINK = {
    "fixed": lambda size, p: size // 2,
    "linear": lambda size, p: size - p["delta"],
    "exponential": lambda size, p: size // p["growthFactor"],
}


class Compartment:
    """The strategy state machine of one compartment, restated."""

    def __init__(self, strategy: Mapping[str, Any]) -> None:
        self.kind, self.p = params(strategy)
        self.batch = 1
        self.planned = self.p["initialBatch"]
        self.failures = 0
        self.stopped = False

    def close(self, size: int, successes: int, complete: int, matched: int) -> None:
        good = successes / size >= self.p["batchThreshold"] / 100 - 1e-12
        if good:
            self.failures = 0
            self.planned = _GROW[self.kind](size, self.p)
        else:
            self.failures += 1
            below = complete / matched < self.p["safetyLimit"] / 100 - 1e-12
            self.planned = max(1, _SHRINK[self.kind](size, self.p)) if below else size
        threshold = self.p["failureThreshold"]
        if threshold is not None and self.failures >= threshold:
            self.stopped = True
        self.batch += 1

    def resume(self) -> None:
        if self.stopped:
            self.stopped = False
            self.failures = 0
