"""What a reconcile returns: when to look again (controller-runtime's `reconcile.Result`).

A reconciler never touches the work queue: it returns a `Result`, and the worker
(`gate.controller.operator.Operator._worker`) is the one place that turns it into the queue's
`add_after` (or, for a gate, the debounced `World.gate_later`). An error raised instead goes back
with backoff, as before. `looks` may name keys other than the one reconciled (a gate plan asks for
its picked nodes' own reconciles), as a controller-runtime handler would enqueue them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gate.controller.triggers import WorkKey


@dataclass(frozen=True)
class Result:
    looks: Mapping[WorkKey, float] = field(default_factory=dict)  # key -> seconds until it is looked at (0: now)
    replan: frozenset[str] = frozenset()  # gates planned again, debounced (`World.gate_later`)

    def __or__(self, other: Result) -> Result:
        looks = dict(self.looks)
        for key, after in other.looks.items():
            looks[key] = min(after, looks.get(key, after))  # the earlier look wins, as in the queue
        return Result(looks, self.replan | other.replan)


def look(key: WorkKey, after: float = 0.0) -> Result:
    return Result({key: after})


def replan(gates: Iterable[str]) -> Result:
    return Result(replan=frozenset(gates))


DONE = Result()


def merged(results: Iterable[Result]) -> Result:
    out = DONE
    for result in results:
        out |= result
    return out

