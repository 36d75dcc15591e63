"""Batch sizes after good and failed batches, per strategy; stopping after failureThreshold."""

from __future__ import annotations

from typing import Any

import pytest

from gate.api.policy import Strategy
from gate.rollout import close_batch, next_batch_size
from tests.unit.rollout.builders import exponential, fixed, linear


def _strategy(spec: dict[str, Any]) -> Strategy:
    return Strategy.model_validate(spec)


@pytest.mark.parametrize(
    ("spec", "size", "good", "below", "expected"),
    [
        # good batches grow from the size the batch actually had
        (fixed(4), 2, True, True, 4),
        (linear(1, 3), 2, True, True, 5),
        (exponential(1, 3), 2, True, True, 6),
        # failed batches below safetyLimit shrink, never below 1
        (fixed(4), 4, False, True, 2),
        (fixed(4), 1, False, True, 1),
        (linear(5, 2), 5, False, True, 3),
        (linear(5, 2), 2, False, True, 1),
        (exponential(8, 2), 8, False, True, 4),
        (exponential(8, 3), 8, False, True, 2),
        (exponential(1, 2), 1, False, True, 1),
        # failed batches at or above safetyLimit keep their size: no shrink, no growth
        (fixed(4), 3, False, False, 3),
        (linear(1, 2), 5, False, False, 5),
        (exponential(1, 2), 8, False, False, 8),
    ],
)
def test_next_batch_size_follows_the_strategy_table(
    spec: dict[str, Any], size: int, good: bool, below: bool, expected: int
) -> None:
    assert next_batch_size(_strategy(spec), size, good=good, below_safety=below) == expected


def test_batch_threshold_compares_exactly_without_rounding() -> None:
    strategy = _strategy(fixed(3, batchThreshold=67))
    two_of_three = close_batch(strategy, size=3, successes=2, complete=2, matched=10, consecutive_failures=0)
    strategy = _strategy(fixed(3, batchThreshold=66))
    two_of_three_lenient = close_batch(strategy, size=3, successes=2, complete=2, matched=10, consecutive_failures=0)

    assert not two_of_three.good  # 66.67% < 67%
    assert two_of_three_lenient.good


def test_safety_limit_is_reached_at_exactly_the_percentage() -> None:
    strategy = _strategy(linear(4, 2, safetyLimit=50, failureThreshold=None))
    below = close_batch(strategy, size=4, successes=0, complete=4, matched=9, consecutive_failures=0)
    at = close_batch(strategy, size=4, successes=0, complete=5, matched=10, consecutive_failures=0)

    assert below.next_size == 2  # 44% complete: shrink
    assert at.next_size == 4  # 50% complete: keep


def test_failure_threshold_counts_consecutive_failed_batches_and_a_good_batch_resets_it() -> None:
    strategy = _strategy(fixed(1, failureThreshold=2))

    first = close_batch(strategy, size=1, successes=0, complete=0, matched=5, consecutive_failures=0)
    second = close_batch(strategy, size=1, successes=0, complete=0, matched=5, consecutive_failures=1)
    good = close_batch(strategy, size=1, successes=1, complete=1, matched=5, consecutive_failures=1)

    assert (first.consecutive_failures, first.stop) == (1, False)
    assert (second.consecutive_failures, second.stop) == (2, True)
    assert (good.consecutive_failures, good.stop) == (0, False)


def test_failure_threshold_none_never_stops() -> None:
    strategy = _strategy(fixed(1, failureThreshold=None))
    result = close_batch(strategy, size=1, successes=0, complete=0, matched=5, consecutive_failures=1000)

    assert (result.consecutive_failures, result.stop) == (1001, False)
