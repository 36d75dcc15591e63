"""Removing a gate is a rollout too: which nodes uninstall now, under the gate's budgets.

Deleting a gate uninstalls every package with `uninstall.enabled` from every node that has it. That
is a host change like any other, so the nodes that need it go through the rollout planner
(`gate.rollout.plan`) with the gate's own compartments, budgets, strategies, thresholds and windows:
a node uninstalls only once the planner picked it into a batch, a failed uninstall counts against
its batch (and may stop its compartment, until `nodegate resume`), and a paused gate picks nothing.

The nodes of the removal are those holding the gate's state with something to uninstall; whether
the gate's selector still matches them does not matter (what is installed must go). A node is
marked `removing` with its batch number when picked. A node the gate still holds cordoned (a failed
node, say) is disrupted already: it starts at once, outside any batch (it occupies the budget as it
did before), so that it never waits for budget it holds itself. A node that uninstalled is released
(keys removed, cordon undone) once its batch was judged, so that every batch is judged on all its
nodes; nodes with nothing to uninstall are released at once. Pure: the operator performs the updates
returned.

On the node the removal is a round of its own (`gate.lifecycle.uninstall.decide_removal`, with new stage pod
names): cordon, wait for protected pods and drain when an uninstall needs an interrupt, the uninstalls,
the interrupt, the checks after it, the uncordon; the node then stops counting against the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gate.api import keys
from gate.api.nodegate import CompartmentStatus, NodeCounts, NodeGate, NodeGateStatus
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, rollout_hash
from gate.lifecycle.fleet import FleetNode, NodeUpdate
from gate.lifecycle.health import RECONCILING, STALLED, Verdict, condition, with_verdict
from gate.lifecycle.node import EventRequest
from gate.lifecycle.status import fresh_rollout, gate_status, resumed_gate, rollout_events
from gate.rollout import GateProgress, NodeSnapshot, Start, plan


@dataclass
class RemovalPlan:
    updates: dict[str, NodeUpdate]
    status: NodeGateStatus
    events: list[EventRequest] = field(default_factory=list)
    releasable: frozenset[str] = frozenset()  # nodes done with the removal whose batch was judged
    resumed: bool = False  # a resume request was acted on: the operator removes the annotation


def uninstallable(gate: NodeGate, state: NodeGateState) -> list[str]:
    """Packages of the gate with uninstall enabled that are still installed on the node."""
    return sorted(n for n, p in gate.spec.packages.items() if p.uninstall.enabled and n in state.installed)


def removal_hash(gate: NodeGate) -> str:
    """The removal is a rollout of its own: its hash differs from the gate's install rollout, so the
    first plan of the removal starts it afresh (stopped compartments resume, batches start small)."""
    return f"removal-{rollout_hash(gate)}"


def _progress(gate: NodeGate, state: NodeGateState) -> GateProgress | None:
    """The node's progress in the removal, or None when it takes no part (nothing to uninstall)."""
    if state.removing:
        disrupted = state.status == "in-progress" or state.cordoned
        return GateProgress(status=state.status, batch=state.batch, disrupted=disrupted)
    if uninstallable(gate, state):
        if state.cordoned:  # started at once, outside any batch (see the module docstring)
            return GateProgress(status="in-progress", disrupted=True)
        return GateProgress(status="waiting")
    return None


def _planned_gate(gate: NodeGate) -> NodeGate:
    """The gate as the planner must see it for the removal: every node it holds (the snapshot holds
    only those), no priorities, and its durable rollout state started afresh on the first plan."""
    raw = gate.to_wire()
    raw["spec"]["nodeSelector"] = {}
    planned = NodeGate.model_validate(raw)
    if planned.status is not None and planned.status.rollout_hash != removal_hash(gate):
        planned = fresh_rollout(planned)
    if keys.RESUME_ANNOTATION in gate.metadata.annotations:
        planned = resumed_gate(planned, gate.metadata.annotations[keys.RESUME_ANNOTATION])
    return planned


def _without_rollback(policy: DeploymentPolicy | None) -> DeploymentPolicy | None:
    """The policy as a removal reads it: a removal has no revision to go back to, so `rollback` is off and
    its failed batches count towards `failureThreshold` as they always did."""
    if policy is None or not (policy.spec.default.rollback or any(c.rollback for c in policy.spec.compartments)):
        return policy
    wire = policy.model_dump(by_alias=True, mode="json")
    wire["spec"]["default"]["rollback"] = False
    for compartment in wire["spec"]["compartments"]:
        compartment["rollback"] = False
    return DeploymentPolicy.model_validate(wire)


def plan_removal(gate: NodeGate, policy: DeploymentPolicy | None, fleet: Sequence[FleetNode], *,
                 now: datetime) -> RemovalPlan:
    """One step of a deleted gate's removal: the nodes to start uninstalling now, the status."""
    name = gate.name
    snapshots: list[NodeSnapshot] = []
    members: dict[str, NodeGateState] = {}
    for node in fleet:
        state = node.states.get(name)
        if not isinstance(state, NodeGateState):
            continue
        progress = _progress(gate, state)
        if progress is None:
            continue
        members[node.view.name] = state
        # Opted out or not, a node holding the gate's packages is in the removal: they must go.
        labels = {k: v for k, v in node.view.labels.items() if k != keys.IGNORE_LABEL}
        snapshots.append(NodeSnapshot(node.view.name, labels, {name: progress}))
    rollout = plan(_planned_gate(gate), _without_rollback(policy), snapshots, now=now, gates=())
    updates: dict[str, NodeUpdate] = {}
    cordoned = [] if gate.spec.paused or not rollout.window_open else sorted(
        n for n, st in members.items() if not st.removing and st.cordoned)
    starts = [*rollout.starts, *(Start(n, members[n].compartment or "", 0) for n in cordoned)]
    for start in starts:
        previous = members[start.node]
        # A round of its own: new stage pod names, and nothing carried over from an install round's interrupt.
        state = previous.model_copy(update={
            "status": "in-progress", "removing": True, "batch": start.batch, "compartment": start.compartment,
            "round": previous.round + 1, "failure": None, "phase": "idle", "phase_since": now.isoformat(),
            "interrupt": None, "interrupted": [], "post_checked": [], "payload_placed": [],
            "drain_blocked_by": None})
        update = NodeUpdate(state=state)
        update.change.status = "in-progress"
        batch = f"batch {start.batch}" if start.batch else "cordoned already, outside the batches"
        update.events.append(EventRequest("node", "Normal", "Uninstalling",
                                          f"NodeGate {name} was deleted: uninstalling "
                                          f"{', '.join(uninstallable(gate, state))} ({batch})"))
        updates[start.node] = update
    for node_name, wait in rollout.waits.items():
        updates.setdefault(node_name, NodeUpdate()).change.status = wait.status

    started = {s.node for s in starts}
    counts = NodeCounts(matched=len(members))
    for node_name, state in members.items():
        now_status = "in-progress" if node_name in started else (state.status if state.removing else "waiting")
        if now_status == "in-progress":
            counts.in_progress += 1
        elif now_status == "complete":
            counts.complete += 1
        elif now_status == "failed":
            counts.failed += 1
        elif rollout.waits.get(node_name) is not None and rollout.waits[node_name].status == "blocked":
            counts.blocked += 1
        else:
            counts.waiting += 1
    judged = {c.name: c.status.batch for c in rollout.compartments}
    releasable = frozenset(
        n for n, st in members.items() if st.removing and not uninstallable(gate, st) and n not in started
        and (st.batch == 0 or judged.get(st.compartment or "", 0) > st.batch))
    events = rollout_events(rollout)
    status, announce = _status(gate, counts, rollout.statuses(), now)
    events += announce
    if keys.RESUME_ANNOTATION in gate.metadata.annotations:
        events.append(EventRequest("gate", "Normal", "Resumed", "A person resumed the removal"))
    return RemovalPlan(updates, status, events, releasable=releasable,
                       resumed=keys.RESUME_ANNOTATION in gate.metadata.annotations)


def _status(gate: NodeGate, counts: NodeCounts, compartments: list[CompartmentStatus],
            now: datetime) -> tuple[NodeGateStatus, list[EventRequest]]:
    """The gate's status during its removal, with a `Deleting` condition saying what it waits for,
    and a Warning Event when it starts waiting for a person (a paused gate uninstalls nothing)."""
    base = gate_status(gate, counts, compartments, now, removal_hash(gate))
    previous = gate.status.conditions if gate.status is not None else []
    events: list[EventRequest] = []
    waiting = counts.waiting + counts.blocked
    stopped = [c.name for c in compartments if c.state == "stopped"]
    if gate.spec.paused and waiting:
        reason = "Paused"
        message = (f"The gate is being deleted but is paused: no uninstall starts while it stays paused, and "
                   f"{waiting} nodes wait to uninstall its packages; `nodegate resume {gate.name}` or "
                   f"`nodegate delete {gate.name} --force` lets the removal go on")
        if not any(c.type == "Deleting" and c.reason == "Paused" for c in previous):
            events.append(EventRequest("gate", "Warning", "DeletionPaused", message))
    elif stopped and waiting:
        reason = "CompartmentStopped"
        message = (f"Uninstalls failed: compartments stopped: {', '.join(stopped)}; {waiting} nodes wait to "
                   f"uninstall; `nodegate resume {gate.name}` continues")
    elif counts.failed:
        reason = "UninstallFailed"
        message = (f"{counts.failed} nodes failed to uninstall and hold the gate back: fix them, then "
                   f"`nodegate node reset NODE --gate {gate.name}`")
    else:
        reason = "Removing"
        message = (f"{counts.complete} of {counts.matched} nodes uninstalled, {counts.in_progress} in progress, "
                   f"{waiting} waiting; then every node is released and the gate goes")
    deleting = condition("Deleting", "True", reason, message, previous, now, gate.metadata.generation or 0)
    conditions = [c for c in base.conditions if c.type != "Deleting"] + [deleting]
    # The removal's own kstatus verdict: what blocks it for good needs a person (Stalled); the rest
    # is uninstalls running or waiting, a pause included (Reconciling). Nothing left: neither.
    left = counts.in_progress + waiting + counts.failed
    verdict = (Verdict(STALLED, reason, message) if reason in ("CompartmentStopped", "UninstallFailed")
               else Verdict(RECONCILING, reason, message) if left else None)
    conditions = with_verdict(conditions, verdict, previous, now, gate.metadata.generation or 0)
    return base.model_copy(update={"conditions": conditions, "status": "Deleting"}), events


