"""The soak: a node that completed its round under a policy with `health` proves it stays healthy.

Pure: the operator hands in what it read (the Node, the last Prometheus reading) and performs the
verdict. The decisions:

* **Entering.** Under a DeploymentPolicy whose compartment (or `default`) carries `health`, a round
  that went through does not make the node complete: it enters phase `soak` with `soakUntil` = now +
  `soak`, uncordoned and serving (the readiness taint goes too). Its status label stays
  `in-progress`, but it holds no disruption slot: the planner counts it neither against the ceiling
  nor as finished, so its batch is judged only once every node of it left the soak.
  `soakUntil` is fixed on entry: a later change of `soak` applies to the nodes entering afterwards.
* **Unhealthy, at any moment of the soak:** the node is not Ready, or carries a condition that
  `nodeConditions` lists with the status given, or the Prometheus query returned samples. The node
  fails with reason `Unhealthy`, naming the signal (the condition with its reason and message, or
  the query, its endpoint and a summary of what it returned: the count, the greatest value and the
  node's own series, never another series). A failed node is a failed node of its batch: `batchThreshold`
  and `failureThreshold` apply as to any other failure.
* **Passed:** `soakUntil` is reached, the node is Ready and free of the listed conditions, and, with
  `prometheus`, the last reading was taken during the soak, succeeded and returned nothing.
* **Unreadable:** a query that fails never counts as healthy. The node stays in soak past
  `soakUntil` (still holding no slot, its batch still not judged) and its state says which signal
  cannot be read and why (the gate shows it as `HealthUnreadable`). Once the signal has failed
  without a break for `unreadable_limit` (the soak's length, at least five minutes) and the soak
  is over, the node fails with reason `HealthUnreadable`: a rollout whose health cannot be proven
  must stop at its thresholds rather than go on blind or hang without a word. The operator keeps
  when the failures began in memory only, so a restart delays that verdict, never hastens it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from gate.api.common import parse_time
from gate.api.policy import DeploymentPolicy, Health
from gate.lifecycle.condition import NodeCondition

MIN_UNREADABLE_LIMIT = 300.0  # seconds: a Prometheus restart must not fail a fleet's soaking nodes


@dataclass(frozen=True)
class Reading:
    """The last Prometheus answer for one node, summarized (`gate.controller.promql.summarize`): when the
    query succeeded, `count` samples, their greatest value `max_value` and the node's own series `own`
    (each rendered `metric{labels} => value`; no other series is ever kept); else `error`. `at`: when
    it was taken; `failing_since`: the first failure of the unbroken run of failures `error` belongs to."""

    at: datetime
    count: int = 0
    max_value: str = ""
    own: tuple[str, ...] = ()
    error: str | None = None
    failing_since: datetime | None = None


SoakOutcome = Literal["soaking", "passed", "unhealthy", "unreadable", "unreadable-failed"]


@dataclass(frozen=True)
class SoakVerdict:
    """`reason`/`message` name the signal for `unhealthy`, `unreadable` and `unreadable-failed`;
    `recheck_after`: seconds until the verdict may change by the clock alone (None: only an event)."""

    outcome: SoakOutcome
    reason: str = ""
    message: str = ""
    recheck_after: float | None = None


def health_of(policy: DeploymentPolicy | None, compartment: str | None) -> Health | None:
    """The `health` that governs a node of `compartment` (the policy's `default` for `__default__`,
    or for a compartment the policy no longer lists)."""
    if policy is None:
        return None
    for c in policy.spec.compartments:
        if c.name == compartment:
            return c.health
    return policy.spec.default.health


def soak_end(health: Health, now: datetime) -> datetime:
    return now + timedelta(seconds=health.soak_seconds)


def unreadable_limit(health: Health) -> float:
    return max(health.soak_seconds, MIN_UNREADABLE_LIMIT)


def _matching(health: Health, conditions: Mapping[str, NodeCondition]) -> NodeCondition | None:
    for wanted in health.node_conditions:
        found = conditions.get(wanted.type)
        if found is not None and found.status == wanted.status:
            return found
    return None


def describe_condition(c: NodeCondition) -> str:
    text = f"node condition {c.type}={c.status}"
    if c.reason:
        text += f" ({c.reason})"
    return text + (f": {c.message}" if c.message else "")


def judge(health: Health, *, ready: bool, conditions: Mapping[str, NodeCondition], reading: Reading | None,
          soak_since: datetime, soak_until: datetime, now: datetime) -> SoakVerdict:
    """The verdict on one soaking node now (see the module docstring). `conditions`: the Node's
    conditions by type; `reading`: the last Prometheus reading for it (None: none yet)."""
    if not ready:
        return SoakVerdict("unhealthy", "Unhealthy", "the node is not Ready during its soak")
    bad = _matching(health, conditions)
    if bad is not None:
        return SoakVerdict("unhealthy", "Unhealthy", describe_condition(bad))
    left = (soak_until - now).total_seconds()
    prom = health.prometheus
    if prom is not None and reading is not None and reading.at >= soak_since:
        if reading.error is None and reading.count:
            own = (f"; the node's series: {'; '.join(reading.own)}" if reading.own
                   else "; none of them is labelled with the node")
            return SoakVerdict("unhealthy", "Unhealthy", f"Prometheus query {prom.query!r} (endpoint {prom.endpoint}) "
                               f"returned {reading.count} sample(s), the greatest {reading.max_value}{own}")
        if reading.error is not None:
            message = (f"Prometheus query {prom.query!r} (endpoint {prom.endpoint}) cannot be read: "
                       f"{reading.error}")
            since = reading.failing_since or reading.at
            failing = (now - since).total_seconds()
            limit = unreadable_limit(health)
            if left <= 0 and failing >= limit:
                return SoakVerdict("unreadable-failed", "HealthUnreadable",
                                   f"{message} (failing for {int(failing)}s, the limit is {int(limit)}s)")
            return SoakVerdict("unreadable", "HealthUnreadable", message,
                               recheck_after=max(1.0, max(left, limit - failing)))
    if left > 0:
        return SoakVerdict("soaking", recheck_after=left)
    if prom is not None and (reading is None or reading.at < soak_since):
        return SoakVerdict("soaking", recheck_after=None)  # no reading of this soak yet: wait for one
    return SoakVerdict("passed")


def soak_left(soak_until: str | None, now: datetime) -> float | None:
    """Seconds of soak left (0 once over) from a state's `soakUntil`; None without one."""
    end = parse_time(soak_until)
    return None if end is None else max(0.0, (end - now).total_seconds())


__all__ = ["MIN_UNREADABLE_LIMIT", "Reading", "SoakOutcome", "SoakVerdict", "describe_condition", "health_of",
           "judge", "soak_end", "soak_left", "unreadable_limit"]
