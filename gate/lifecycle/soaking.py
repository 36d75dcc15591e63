"""The soak phase of a round: a node whose round went through under a policy with `health` serves
again, and counts as complete only once it stayed healthy through the soak.

Entering it (`enter_soak`) ends the round's work as completing it would (uncordoned, the interrupt
bookkeeping cleared) but in phase `soak`, until `soakUntil`. Each look at a soaking node
(`decide_soak`) asks `gate.lifecycle.soak.judge`, which says what counts as healthy, and fails the
node (Unhealthy, HealthUnreadable), keeps it soaking (looking again at the soak's end, sooner while a
Prometheus query is to be asked again) or completes it.
"""

from __future__ import annotations

from gate.api.common import parse_time
from gate.api.policy import Health
from gate.lifecycle.node import Decision, NodeContext
from gate.lifecycle.round import Round, complete_round, end_round, iso_time
from gate.lifecycle.soak import judge, soak_end


def enter_soak(r: Round, health: Health) -> None:
    """The round's work is done: the node serves again (uncordoned, its taint lifted by the round's
    finish in `gate.lifecycle.machine`), but it is complete only once it stayed healthy through the
    soak (`gate.lifecycle.soak`)."""
    ctx = r.ctx
    until = soak_end(health, ctx.now)
    end_round(r, "soak", soak_until=iso_time(until))
    r.event("node", "Normal", "Soaking", f"NodeGate {ctx.gate.name} finished its round on the node; it serves again "
            f"and must stay Ready and healthy for {health.soak} (until {until.isoformat(timespec='seconds')}) "
            "before it counts as complete")
    r.decision.requeue_after = _soak_look(ctx, health.soak_seconds)


def _soak_look(ctx: NodeContext, left: float | None) -> float:
    """When to look at a soaking node again: at the soak's end, sooner while a query is to be asked."""
    wait = ctx.timing.poll if left is None else max(0.5, left)
    health = ctx.health
    if health is not None and health.prometheus is not None:
        wait = min(wait, ctx.timing.health_poll)
    return wait


def decide_soak(r: Round) -> Decision:
    """One look at a soaking node: fail it (Unhealthy, HealthUnreadable), keep it soaking, or complete it."""
    ctx, s = r.ctx, r.state
    health = ctx.health
    if health is None:
        # The policy no longer asks for health (or the gate left it): nothing is left to prove.
        complete_round(r)
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node (its policy no "
                "longer asks for a soak)")
        return r.finish_decision()
    verdict = judge(health, ready=ctx.node.ready, conditions=ctx.node.health_conditions, reading=ctx.reading,
                    soak_since=parse_time(s.phase_since) or ctx.now, soak_until=parse_time(s.soak_until) or ctx.now,
                    now=ctx.now)
    if verdict.outcome in ("unhealthy", "unreadable-failed"):
        s.health_unreadable = None
        return r.fail(verdict.reason, verdict.message, stage="soak")
    if verdict.outcome == "passed":
        complete_round(r)
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node: it stayed Ready "
                f"and healthy through its soak of {health.soak}")
        return r.finish_decision()
    unreadable = verdict.message if verdict.outcome == "unreadable" else None
    if s.health_unreadable != unreadable:
        s.health_unreadable = unreadable
        r.changed = True
        if unreadable is not None:
            r.event("node", "Warning", "HealthUnreadable", f"NodeGate {ctx.gate.name}: {unreadable}; the node stays "
                    "in its soak (a signal that cannot be read never counts as healthy)")
    r.decision.requeue_after = _soak_look(ctx, verdict.recheck_after)
    return r.finish_decision()
