"""How batches grow, shrink and stop: the arithmetic of a compartment's strategy.

A batch is *good* when `successes * 100 >= batchThreshold * size`; otherwise it failed.
The next batch's size is computed from the size the finished batch actually had (its members), not
from a planned size that the budget may have clipped: the API promises "each good batch is delta
larger than / growthFactor times the one before", and a shrink after a failure must shrink what
really ran, not an overshooting number the ceiling hides.

| strategy    | after a good batch | after a failed batch, progress below safetyLimit | at or above safetyLimit |
|-------------|--------------------|--------------------------------------------------|-------------------------|
| fixed       | initialBatch       | max(1, size // 2)                                | size (no shrink)        |
| linear      | size + delta       | max(1, size - delta)                             | size (no shrink)        |
| exponential | size * growthFactor| max(1, size // growthFactor)                     | size (no shrink)        |

Progress is `complete * 100 / matched` for the compartment, measured when the batch closes. Late in a
rollout most nodes already proved the change, so one bad batch says more about those nodes than about
the change: the size is kept, not shrunk (and never grown after a failure). A good batch resets the
run of failures; `failureThreshold` failed batches in a row stop the compartment (None: never).
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.api.policy import Strategy


def is_good(successes: int, size: int, batch_threshold: int) -> bool:
    """successes/size >= batch_threshold%, in integers so 2/3 against 67% is exact."""
    return successes * 100 >= batch_threshold * size


def below_safety_limit(complete: int, matched: int, safety_limit: int) -> bool:
    return complete * 100 < safety_limit * matched


def next_batch_size(strategy: Strategy, size: int, *, good: bool, below_safety: bool) -> int:
    """Planned size of the batch after one of `size` nodes (see the table in the module docstring)."""
    if good:
        if strategy.linear is not None:
            return size + strategy.linear.delta
        if strategy.exponential is not None:
            return size * strategy.exponential.growth_factor
        return strategy.params.initial_batch
    if not below_safety:
        return max(1, size)
    if strategy.linear is not None:
        return max(1, size - strategy.linear.delta)
    if strategy.exponential is not None:
        return max(1, size // strategy.exponential.growth_factor)
    return max(1, size // 2)


@dataclass(frozen=True)
class BatchResult:
    """What closing a finished batch decides."""

    good: bool
    next_size: int
    consecutive_failures: int
    stop: bool


def close_batch(
    strategy: Strategy, *, size: int, successes: int, complete: int, matched: int, consecutive_failures: int
) -> BatchResult:
    """Judge a finished batch of `size` nodes (`successes` complete) and plan the next one.

    `complete` and `matched` describe the whole compartment when the batch closes.
    """
    params = strategy.params
    good = is_good(successes, size, params.batch_threshold)
    failures = 0 if good else consecutive_failures + 1
    below = below_safety_limit(complete, matched, params.safety_limit)
    stop = params.failure_threshold is not None and failures >= params.failure_threshold
    return BatchResult(
        good=good,
        next_size=next_batch_size(strategy, size, good=good, below_safety=below),
        consecutive_failures=failures,
        stop=stop,
    )
