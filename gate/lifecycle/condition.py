"""NodeGate's condition on a failed node, next to the status label: decided here, written by the operator.

A node that failed for a gate carries the Node condition `nodegate.io/failed.<gate>` (status True,
reason the failure's reason, a message naming the package, the stage and what went wrong), so that
`kubectl describe node` shows why and tools that watch node conditions see it. The condition is
derived from the gate's state on the node alone, level-triggered: it is there exactly while the state
says failed, and goes when the node gets another round (a rerun, a reset, a spec change), leaves the
gate, or the gate is deleted.

A node the gate cannot go on with for something outside it carries `nodegate.io/blocked.<gate>`
(`blocked_condition`): reason ProtectedPods while it is not picked because its protected pods run,
DrainBlocked while a PodDisruptionBudget holds its drain, ImagePullFailing while the kubelet cannot
pull a stage pod's image (before the pull grace fails the node); the gate's plan decides it and it
goes when the wait ends. Its lastTransitionTime is the start of the wait (the oldest wait of the gate's
status is read from it).

Conditions live in the Node's status, which kubelets write too: the operator sends a strategic merge
patch of the status subresource that touches only its own entry (the list is merged by `type`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gate.api import keys
from gate.api.state import NodeGateState, StateParseError, failure_message


@dataclass(frozen=True)
class NodeCondition:
    """One entry of a Node's status.conditions, as far as NodeGate decides it."""

    type: str
    status: str
    reason: str
    message: str
    since: str | None = field(default=None, compare=False)  # lastTransitionTime, as read from the Node


def failure_condition(gate: str, state: NodeGateState | StateParseError | None) -> NodeCondition | None:
    """The condition the node must carry for `gate`, or None when it must carry none."""
    if isinstance(state, StateParseError):
        return NodeCondition(keys.failed_condition(gate), "True", "StateCorrupt",
                             f"NodeGate {gate}: {state}; reset the node with `nodegate node reset`")
    if state is None or state.status != "failed" or state.failure is None:
        return None  # most nodes of a fleet, at every plan: decided before anything is worked out
    kind = keys.failed_condition(gate)
    f = state.failure
    where = f"package {f.package} failed in stage {f.stage}" if f.package else f"failed in step {f.stage}"
    detail = failure_message(f.message)
    return NodeCondition(kind, "True", f.reason, f"NodeGate {gate}: {where}" + (f": {detail}" if detail else ""))


def blocked_condition(gate: str, node: str, state: NodeGateState | StateParseError | None,
                      protected: Sequence[str] = ()) -> NodeCondition | None:
    """The condition saying why the gate cannot go on at the node for something outside it, or None.

    DrainBlocked: the round is draining and a PodDisruptionBudget refused an eviction (the state's
    `drainBlockedBy` names the pod and the budget); it goes once the drain goes on. ProtectedPods:
    the node is not picked while `protected` (pods matching podNonInterruptLabels) run; it goes once
    they ended and the node is picked. Both name the node, for an alert that quotes the message."""
    kind = keys.blocked_condition(gate)
    if (isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "drain"
            and state.drain_blocked_by):
        return NodeCondition(kind, "True", "DrainBlocked", f"NodeGate {gate}: the drain of node {node} is held by a "
                             f"PodDisruptionBudget: {state.drain_blocked_by}")
    if isinstance(state, NodeGateState) and state.status == "in-progress" and state.pull_failing:
        return NodeCondition(kind, "True", "ImagePullFailing", f"NodeGate {gate}: a stage pod on node {node} cannot "
                             f"pull its image: {state.pull_failing}")
    if protected:
        names = ", ".join(protected[:10]) + (f" and {len(protected) - 10} more" if len(protected) > 10 else "")
        return NodeCondition(kind, "True", "ProtectedPods", f"NodeGate {gate} waits to interrupt node {node} until "
                             f"its protected pods finish: {names}")
    return None


def timestamp(now: datetime) -> str:
    """A time as conditions and NodeGate's records write it (RFC 3339, seconds, `Z`)."""
    return now.isoformat(timespec="seconds").replace("+00:00", "Z")


def transition_time(before: tuple[str, str | None] | None, status: str, now: datetime) -> str:
    """The lastTransitionTime of a condition whose status is `status` now, for every condition NodeGate
    writes (a gate's, a policy's, a node's): the time it has while its status holds, else now.
    `before`: the condition as read, (status, lastTransitionTime); None: it was not there."""
    if before is not None and before[0] == status and before[1]:
        return before[1]
    return timestamp(now)


def condition_patch(current: NodeCondition | None, wanted: NodeCondition | None, kind: str,
                    now: datetime) -> dict[str, Any] | None:
    """The strategic merge patch of the Node's status that turns `current` into `wanted` (None: no
    entry of type `kind`); None when nothing needs to change."""
    if current == wanted:
        return None
    if wanted is None:
        return {"status": {"conditions": [{"type": kind, "$patch": "delete"}]}}
    entry: dict[str, Any] = {"type": wanted.type, "status": wanted.status, "reason": wanted.reason,
                             "message": wanted.message, "lastHeartbeatTime": timestamp(now)}
    if current is None or current.status != wanted.status:  # else the merge keeps the one the node has
        entry["lastTransitionTime"] = transition_time(None, wanted.status, now)
    return {"status": {"conditions": [entry]}}
