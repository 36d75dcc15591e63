"""One gate's status and Events, from what its plan found: conditions, counts and compartments.

The fleet planner (`gate.lifecycle.fleet.plan_gate`) and the removal's (`gate.lifecycle.removal`)
count the gate's nodes and run the rollout planner; this module turns what they found into the
gate's status (`gate_status`: Ready, Progressing, Degraded and Paused, the abnormal-true
DrainBlocked, ImagePullFailing and HealthUnreadable, and kstatus' verdict from
`gate.lifecycle.health`) and the gate's Events of a plan (`rollout_events`: batches judged,
compartments stopped). It also holds the two changes of a gate's compartments that come from outside
a plan: a resume request (`resumed_gate`) and a spec change (`fresh_rollout`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from gate.api import keys
from gate.api.nodegate import CompartmentStatus, NodeCounts, NodeGate, NodeGateStatus
from gate.lifecycle.health import condition, rollout_verdict, with_verdict
from gate.lifecycle.node import EventRequest
from gate.lifecycle.rollback import rollback_message
from gate.rollout import Plan, resume


def rollout_events(rollout: Plan) -> list[EventRequest]:
    """Events of one plan: batches judged, compartments stopped."""
    events = []
    for comp in rollout.compartments:
        for closed in comp.closed:
            verdict = "succeeded" if closed.good else "failed"
            events.append(EventRequest("gate", "Normal" if closed.good else "Warning",
                                       "BatchSucceeded" if closed.good else "BatchFailed",
                                       f"Compartment {comp.name}: batch {closed.number} {verdict} "
                                       f"({closed.successes}/{closed.size} nodes)"))
        if comp.stopped_now:
            events.append(EventRequest("gate", "Warning", "CompartmentStopped",
                                       f"Compartment {comp.name} stopped after {comp.status.consecutive_failures} "
                                       "failed batches in a row; `nodegate resume` continues it"))
    return events


def resumed_gate(gate: NodeGate, value: str) -> NodeGate:
    """The gate with the stop of the compartments a resume request names cleared."""
    names = None if value.strip() in ("", "*") else {n.strip() for n in value.split(",") if n.strip()}
    status = gate.status or NodeGateStatus()
    return gate.model_copy(update={"status": status.model_copy(
        update={"compartments": resume(status.compartments, names)})})


def fresh_rollout(gate: NodeGate) -> NodeGate:
    """After a spec change a stopped compartment resumes, and batches start small again: a new
    version deserves the same care as the first. Batch numbers keep counting up, so nodes picked
    in earlier rollouts never look like members of the next batch."""
    assert gate.status is not None
    restarted = [c.model_copy(update={"batch_size": 0, "consecutive_failures": 0})
                 for c in resume(gate.status.compartments)]
    return gate.model_copy(update={"status": gate.status.model_copy(update={"compartments": restarted})})


def _per_node(items: Sequence[tuple[str, str]], shown: int = 5) -> str:
    """`node N: what; ...` for the first `shown` nodes, and how many more."""
    text = "; ".join(f"node {node}: {what}" for node, what in items[:shown])
    return text + (f"; and {len(items) - shown} more nodes" if len(items) > shown else "")


def _word(value: bool) -> Literal["True", "False"]:
    return "True" if value else "False"


def gate_status(gate: NodeGate, counts: NodeCounts, compartments: list[CompartmentStatus],
                now: datetime, spec_hash: str, drains: Sequence[tuple[str, str]] = (),
                pulls: Sequence[tuple[str, str]] = (),
                unreadable: Sequence[tuple[str, str]] = ()) -> NodeGateStatus:
    """`drains`: (node, what holds it) for each drain a PodDisruptionBudget holds: the DrainBlocked
    condition, present only while one is (abnormal-true, like kstatus' Stalled). `pulls`: (node, the
    kubelet's reason and message) for each stage pod whose image cannot be pulled: ImagePullFailing,
    the same way. `unreadable`: (node, which signal and why) for each soaking node whose health signal
    cannot be read: HealthUnreadable, the same way (such a node stays in its soak, `gate.lifecycle.soak`)."""
    generation = gate.metadata.generation or 0
    previous = gate.status.conditions if gate.status is not None else []
    stopped = [c.name for c in compartments if c.state == "stopped"]
    done = counts.complete == counts.matched
    progressing = counts.in_progress > 0 or counts.waiting > 0
    degraded = counts.failed > 0 or bool(stopped)
    paused = gate.spec.paused
    if done:
        ready_reason, ready_msg = "Complete", f"All {counts.matched} matched nodes are complete"
    else:
        ready_reason, ready_msg = "Incomplete", f"{counts.complete} of {counts.matched} nodes are complete"
    if counts.ignored:
        # Ready is never claimed over nodes the gate skipped without saying so.
        ready_msg += (f"; {counts.ignored} more that the selector matches are ignored ({keys.IGNORE_LABEL}=true) "
                      "and were not touched")
    if degraded:
        parts = []
        if counts.failed:
            parts.append(f"{counts.failed} nodes failed")
        if stopped:
            parts.append(f"compartments stopped: {', '.join(stopped)}")
        deg_reason = "CompartmentStopped" if stopped else "NodesFailed"
        rolled = [(c.name, c.rollback) for c in compartments if c.state == "stopped" and c.rollback is not None]
        if rolled:
            # Under `rollback: true` a failed batch stopped the compartment: the reason says it went back
            # (RolledBack), or could not (NoRevision), and the message names the batch, nodes and revision.
            reasons = {r.reason for _, r in rolled}
            deg_reason = "NoRevision" if "NoRevision" in reasons else "RolledBack"
            parts += [rollback_message(comp, record) for comp, record in rolled]
        deg_msg = "; ".join(parts)
    else:
        deg_reason, deg_msg = "AsExpected", "No failures"
    if paused:
        prog_reason, prog_msg = "Paused", "The gate is paused: no new work starts"
    elif progressing:
        prog_reason = "RollingOut"
        prog_msg = f"{counts.in_progress} nodes in progress, {counts.waiting} waiting"
    else:
        prog_reason, prog_msg = "Idle", "Nothing to do"
    conditions = [
        condition("Ready", _word(done), ready_reason, ready_msg, previous, now, generation),
        condition("Progressing", _word(progressing and not paused), prog_reason, prog_msg, previous, now, generation),
        condition("Degraded", _word(degraded), deg_reason, deg_msg, previous, now, generation),
        condition("Paused", _word(paused), "Paused" if paused else "NotPaused",
                  "spec.paused is true" if paused else "spec.paused is false", previous, now, generation),
    ]
    if drains:
        conditions.append(condition("DrainBlocked", "True", "PodDisruptionBudget",
                                    f"A PodDisruptionBudget holds the drain of {len(drains)} node(s): "
                                    f"{_per_node(drains)}", previous, now, generation))
    if pulls:
        conditions.append(condition("ImagePullFailing", "True", "KubeletPullError",
                                    f"Stage pods on {len(pulls)} node(s) cannot pull their image: "
                                    f"{_per_node(pulls)}", previous, now, generation))
    if unreadable:
        conditions.append(condition("HealthUnreadable", "True", "SignalUnreadable",
                                    f"The health signal of {len(unreadable)} soaking node(s) cannot be read, so they "
                                    f"stay in their soak: {_per_node(unreadable)}", previous, now, generation))
    verdict = rollout_verdict(gate.name, counts, compartments, paused)
    conditions = with_verdict(conditions, verdict, previous, now, generation)
    summary = "Paused" if paused else "Degraded" if degraded else "Ready" if done else "Progressing"
    return NodeGateStatus(
        observed_generation=generation, rollout_hash=spec_hash, conditions=conditions, status=summary,
        progress=f"{counts.complete}/{counts.matched}", nodes=counts, compartments=compartments,
    )
