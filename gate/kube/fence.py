"""How long a leader may act, and the fence its writes pass: the arithmetic of leader election.

A standby takes the lease over once the lease's record has not changed for `lease_seconds` by *its
own* clock, counted from the moment it first saw that record (`gate.kube.lease`). It cannot have seen
a renewal before the renewal reached the API server, and the renewal cannot reach the API server
before the leader sent it. So, with S the moment (on the leader's monotonic clock) at which the
leader *sent* its last successful renewal,

    no standby takes over before  S + lease_seconds,

whatever the network did to the answer. The clocks never need to agree on the time, only to tick at
the same rate (a drift of a few parts per million costs microseconds here). Judging from the moment
the answer was *received* instead would be wrong by the round trip: a renewal answered after 9 s
would count from 9 s too late.

The leader acts only while

    now < S + renew_deadline   (renew_deadline < lease_seconds),

and the difference, `margin = lease_seconds - renew_deadline`, is what a write let through just
before the deadline has to reach the API server before anyone else may be leading. The `Fence` is
that inequality, checked by the work's client at the moment a write would go out (once it has a
connection, not when it was queued for one), so a write queued before the deadline does not leave
after it, even when the event loop was stalled (a frozen process, a starved CPU) and the renewal
loop has not yet noticed. The leader also cancels its work at the deadline; the fence is what makes
the deadline hold for the writes already on their way.

**Unversioned writes** (a condition patch, a delete, an eviction, a merge patch without a
resourceVersion) get a tighter rule. A write that carries a resourceVersion cannot land over a
standby's newer write of that object (the API server refuses it, 409); one without can. So such a write
goes out only with a deadline of its own that ends no later than the fence (`budget`): the client gives
up on it (and closes its connection, which cancels the request in the API server) before the renew
deadline, and the margin is what the API server has left to finish one already being applied.

Pure: the clock is a parameter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gate.kube.errors import LeadershipLost

Clock = Callable[[], float]


@dataclass(frozen=True)
class LeaseTiming:
    """The three durations of leader election, checked together (seconds)."""

    lease_seconds: float  # a standby takes over after the record did not change for this long
    renew_seconds: float  # the leader renews this long after its last renewal was sent
    renew_deadline: float  # the leader stops acting this long after its last renewal was sent

    def __post_init__(self) -> None:
        if not 0 < self.renew_seconds < self.renew_deadline < self.lease_seconds:
            raise ValueError(
                f"leader election needs 0 < renew_seconds ({self.renew_seconds:g}) < renew_deadline "
                f"({self.renew_deadline:g}) < lease_seconds ({self.lease_seconds:g}): the leader must stop "
                "acting before a standby may take over")

    @property
    def margin(self) -> float:
        """Seconds between the leader's last moment to act and a standby's first moment to lead."""
        return self.lease_seconds - self.renew_deadline


class Fence:
    """Whether this replica may still act as the leader, on its monotonic clock.

    `begin(sent)` opens a term with the renewal (the lease's creation or takeover) that was sent at
    `sent`; `extend(sent)` moves the deadline on with each later successful renewal; `revoke()` ends
    the term at once. Until a term begins, and after it ends, nothing may be written.
    """

    def __init__(self, renew_deadline: float, clock: Clock = time.monotonic) -> None:
        self.renew_deadline = renew_deadline
        self._clock = clock
        self._until = -math.inf
        self._open = False
        self.refused = 0  # writes refused so far (the operator's metric and logs)

    def begin(self, sent: float) -> None:
        self._open = True
        self._until = sent + self.renew_deadline

    def extend(self, sent: float) -> None:
        """A renewal sent at `sent` succeeded. Ignored once the term ended: a renewal that comes back
        after the leader gave up must not bring it back to life unnoticed."""
        if self._open:
            self._until = max(self._until, sent + self.renew_deadline)

    def revoke(self) -> None:
        self._open = False
        self._until = -math.inf

    def remaining(self) -> float:
        """Seconds left to act (<= 0: none)."""
        return self._until - self._clock()

    def holds(self) -> bool:
        return self._open and self.remaining() > 0

    def budget(self, what: str, wanted: float) -> float:
        """The time an unversioned write may take: `wanted`, cut to what is left before the renew deadline,
        so that it cannot be answered (or retried by the client) after it. Raises `LeadershipLost` as
        `check` does when no time is left."""
        self.check(what)
        return min(wanted, self.remaining())

    def check(self, what: str) -> None:
        """Raise `LeadershipLost` unless a write may go out now; `what` names it in the error."""
        if not self.holds():
            self.refused += 1
            raise LeadershipLost(f"{what}: not sent, this replica is not the leader (its renew deadline passed "
                                 "or it never led)")


__all__ = ["Clock", "Fence", "LeaseTiming"]
