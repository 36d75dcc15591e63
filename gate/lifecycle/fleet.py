"""One gate across the fleet: which nodes start, which go back in line, labels, taints and status.

Pure, like the per-node machine: the operator passes every node with every gate's parsed state, and
performs the updates returned. The rollout planner (`gate.rollout`) decides *which* nodes start;
this module turns that into node updates and the gate's status (which `gate.lifecycle.status` words).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gate.api import keys
from gate.api.common import parse_duration, parse_time
from gate.api.nodegate import CompartmentStatus, NodeCounts, NodeGate, NodeGateStatus
from gate.api.policy import DeploymentPolicy
from gate.api.records import Refusal
from gate.api.state import Failure, NodeGateState, StateParseError, rollout_hash
from gate.lifecycle.condition import NodeCondition, blocked_condition
from gate.lifecycle.handoff import held
from gate.lifecycle.node import EventRequest, NodeChange, NodeView
from gate.lifecycle.rollback import plan_rollbacks
from gate.lifecycle.round import pending_work, rerun, start_round
from gate.lifecycle.status import fresh_rollout, gate_status, resumed_gate, rollout_events
from gate.lifecycle.taint import passed, taint_reason
from gate.rollout import GateProgress, NodeSnapshot, Plan, plan
from gate.rollout.history import Revision
from gate.rollout.snapshot import memo_match


@dataclass(frozen=True)
class FleetNode:
    view: NodeView
    created: datetime | None
    states: Mapping[str, NodeGateState | StateParseError]  # by gate name: what each gate recorded
    # By gate name: records that parse but that the operator did not write (`gate.api.records`). They are
    # not in `states`: for every decision the node has no record for that gate; they are only reported.
    refused: Mapping[str, Refusal] = field(default_factory=dict)

    @functools.cached_property
    def progresses(self) -> Mapping[str, GateProgress]:
        """Where each gate's rollout stands on the node. The operator keeps one FleetNode per node
        version, so a plan of a thousand nodes reads this rather than working it out each time."""
        handed_off = held(self.view.annotations, self.view.unschedulable) is not None
        return {g: progress_of(s, handed_off=handed_off) for g, s in self.states.items()}

    @property
    def handed_off(self) -> bool:
        """Held for hand-off (spec.leaveCordoned): cordoned for the validator that comes next."""
        return held(self.view.annotations, self.view.unschedulable) is not None

    @functools.cached_property
    def matched(self) -> dict[Hashable, bool]:
        """Which selectors match the node's labels, filled in as plans ask (`NodeSnapshot.matches`):
        one memo per node version, like `progresses`."""
        return {}

    def selected_by(self, gate: NodeGate) -> bool:
        """`selects`, from the memo."""
        return not self.ignored and self.matches(gate)

    def matches(self, gate: NodeGate) -> bool:
        """The gate's selector matches the node's labels, ignored or not."""
        return memo_match(self.matched, gate.spec.node_selector, self.view.labels)

    @property
    def ignored(self) -> bool:
        """A holder of `bypass` opted the node out of every gate (nodegate.io/ignore=true)."""
        return self.view.labels.get(keys.IGNORE_LABEL) == "true"


@dataclass
class NodeUpdate:
    state: NodeGateState | None = None
    change: NodeChange = field(default_factory=NodeChange)
    remove_state: bool = False  # drop this gate's annotation and label (the node left the gate)
    remove_annotations: list[str] = field(default_factory=list)  # requests acted on
    events: list[EventRequest] = field(default_factory=list)


@dataclass
class GatePlan:
    updates: dict[str, NodeUpdate]
    status: NodeGateStatus
    active: list[str]  # nodes in progress: the node-level reconcile drives them
    events: list[EventRequest]
    rollout: Plan | None
    conditions: dict[str, NodeCondition | None] = field(default_factory=dict)  # blocked conditions to write
    recheck_after: float | None = None  # seconds until a node waiting for protected pods reaches waitTimeout
    resumed: bool = False  # a resume request was acted on: the operator removes the annotation
    restarted: bool = False  # likewise a restart request (`nodegate reset GATE`)

    @property
    def requests_done(self) -> list[str]:
        """The gate's request annotations acted on in this plan, for the operator to remove."""
        return [key for key, done in ((keys.RESUME_ANNOTATION, self.resumed),
                                      (keys.RESTART_ANNOTATION, self.restarted)) if done]


def progress_of(state: NodeGateState | StateParseError | None, *, handed_off: bool = False) -> GateProgress:
    if state is None:
        return GateProgress(handed_off=handed_off)
    if isinstance(state, StateParseError):
        return GateProgress(status="failed")
    # A waiting node the gate cordoned (while its protected pods finish, or left so by a failed round)
    # is out of service as much as one in a round: it counts against the ceiling until it finishes.
    # A soaking node serves again: it holds no disruption slot, yet its batch waits for it (`gate.rollout`).
    soaking = state.status == "in-progress" and state.phase == "soak"
    disrupted = (state.status == "in-progress" and not soaking) or (state.status in ("failed", "waiting")
                                                                    and state.cordoned)
    return GateProgress(status=state.status, batch=state.batch, disrupted=disrupted, soaking=soaking,
                        handed_off=handed_off)


def disabled(gate: NodeGate) -> bool:
    """The gate stays but does nothing (`nodegate disable`, annotation nodegate.io/disabled=true)."""
    return gate.metadata.annotations.get(keys.DISABLED_ANNOTATION) == "true"


def selects(gate: NodeGate, node: NodeView) -> bool:
    return node.labels.get(keys.IGNORE_LABEL) != "true" and gate.spec.node_selector.matches(node.labels)


def hold_asked_by(gate: NodeGate, node: FleetNode, gates: Iterable[NodeGate]) -> str | None:
    """The readinessTaint gate selecting the node that asks for a hand-off hold (spec.leaveCordoned):
    `gate` itself if it asks, else the first other by name; None when none asks."""
    if gate.spec.readiness_taint and gate.spec.leave_cordoned:
        return gate.name
    askers = sorted(g.name for g in gates if g.name != gate.name and g.spec.readiness_taint
                    and g.spec.leave_cordoned and node.selected_by(g))
    return askers[0] if askers else None


# Seconds after writing a roll-back record before the plan that lets its nodes go back (`gate.lifecycle.rollback`).
ROLLBACK_RECHECK = 1.0

Replan = Literal["now", "soon"] | None


def replan(before: FleetNode | None, after: FleetNode | None) -> Replan:
    """Whether a node's change calls for a plan of the fleet (`plan_gate`, `plan_removal`, the failure
    conditions): "now" when it may let a node start (a round ended, the node joined, left, was
    relabelled, rebooted, or a person asked for something), "soon" when it only moves the rollout's
    figures (a pick, a cordon or uncordon within a round: the plan's and the node reconcile's own
    writes), None when no plan reads what changed.

    Of a round in progress the plans read only where it stands in the rollout (status, batch,
    compartment, cordon, boot, and for the conditions a blocked drain or a failing pull), never its
    phase or step: the node's own reconcile drives those, and their writes, one per phase, are most
    of a rollout's node events. Of any other state, everything. Of the node: labels, annotations,
    taints, cordon, boot ID, creation and NodeGate's own conditions, not the kubelet's heartbeat or its
    other conditions."""
    if before is None or after is None:
        return "now"
    if _inputs(before, detail=False) != _inputs(after, detail=False):
        return "now"
    if _inputs(before, detail=True) != _inputs(after, detail=True):
        return "soon"
    return None


_STATUS_LABELS = f"{keys.GROUP}/status."


def _inputs(node: FleetNode, *, detail: bool) -> tuple[object, ...]:
    """What the plans read of a node. Without `detail`, the states of gates waiting or in a round on
    it, its status labels and its cordon are left out: what remains changes only when a round ends or
    something outside the operator changed the node, which is when a node may start."""
    view = node.view
    states: list[tuple[str, object]] = []
    for gate, state in sorted(node.states.items()):
        if isinstance(state, NodeGateState) and state.status in ("waiting", "in-progress") and not detail:
            if state.removing:
                states.append((gate, "removing"))  # an uninstall ends with the state gone: that may start one
            elif state.phase == "soak":
                states.append((gate, "soak"))  # a node entering its soak frees its slot: that may start one
            continue  # waiting, picked, in a round: the plan's and the node reconcile's own writes
        if isinstance(state, NodeGateState) and state.status == "in-progress":
            states.append((gate, (state.status, state.removing, state.generation, state.rollout_hash, state.batch,
                                  state.compartment, state.cordoned, state.passed, state.boot_id,
                                  state.phase == "drain" and bool(state.drain_blocked_by), state.pull_failing,
                                  state.health_unreadable)))
        else:
            states.append((gate, state.dump() if isinstance(state, NodeGateState) else str(state)))
    annotations = tuple(sorted((k, v) for k, v in view.annotations.items()
                               if keys.gate_of_state_annotation(k) is None and (detail or k != keys.CORDONED_BY)))
    labels = tuple(sorted((k, v) for k, v in view.labels.items() if detail or not k.startswith(_STATUS_LABELS)))
    refused = tuple(sorted((gate, r.record) for gate, r in node.refused.items()))  # a forged record is reported
    return (view.name, labels, annotations, view.taints, view.unschedulable if detail else None, view.boot_id,
            node.created, tuple(sorted(view.conditions.items())), tuple(states), refused)


def _update(updates: dict[str, NodeUpdate], name: str) -> NodeUpdate:
    return updates.setdefault(name, NodeUpdate())


def plan_gate(gate: NodeGate, policy: DeploymentPolicy | None, fleet: Sequence[FleetNode], *,
              gates: Sequence[NodeGate], now: datetime, gate_created: datetime | None = None,
              busy: Collection[str] = (), protected: Mapping[str, Sequence[str]] | None = None,
              revisions: Sequence[Revision] | None = None) -> GatePlan:
    """`revisions`: the gate's history as the operator read it (None: not read yet), for roll-backs
    (`gate.lifecycle.rollback`). `busy`: nodes where a stage pod of this gate has not ended;
    a person's reset or rerun waits for them, so it never uncordons a node under a running stage.
    `protected`: per node, the pods matching the gate's podNonInterruptLabels that still run there
    ("namespace/name"; the operator looks only at nodes that have not started)."""
    name = gate.name
    generation = gate.metadata.generation or 0
    spec_hash = rollout_hash(gate)
    updates: dict[str, NodeUpdate] = {}
    events: list[EventRequest] = []
    snapshots: list[NodeSnapshot] = []
    selected: list[FleetNode] = []
    ignored = 0
    for node in fleet:
        raw = node.states.get(name)
        in_scope = node.selected_by(gate)
        ignored += node.ignored and node.matches(gate)
        if isinstance(raw, StateParseError) and keys.reset_annotation(name) in node.view.annotations:
            raw = None  # a reset replaces the unreadable state; `_requests` below writes the new one
        if isinstance(raw, StateParseError):
            if in_scope and node.view.labels.get(keys.status_label(name)) != "failed":
                up = _update(updates, node.view.name)
                up.change.status = "failed"
                up.events.append(EventRequest("node", "Warning", "StateCorrupt",
                                              f"NodeGate {name}: {raw}; reset the node with `nodegate node reset`"))
        state = raw if isinstance(raw, NodeGateState) else None
        if not in_scope and state is not None and (state.status != "in-progress" or node.view.name not in busy):
            # The node left the gate (labels changed, or ignore=true): forget it, undo our cordon. A round
            # in progress there stops at once (the node reconcile acts only where the gate selects the
            # node); a stage pod still running is let finish first.
            up = _update(updates, node.view.name)
            up.remove_state = True
            if state.status == "in-progress":
                up.events.append(EventRequest(
                    "node", "Warning", "RoundStopped", f"NodeGate {name} does not select the node (any longer): the "
                    "round recorded there was not carried on, and the gate's keys were removed"))
            if state.cordoned and node.view.cordoned_by == name:
                up.change.unschedulable = False
                up.change.clear_cordoned_by = True
            continue
        if not in_scope and raw is None and keys.status_label(name) in node.view.labels:
            _update(updates, node.view.name).remove_state = True  # left while waiting in line: drop the label
            continue
        if in_scope:
            selected.append(node)
        if in_scope and not isinstance(raw, StateParseError):
            requested = None if node.view.name in busy else _requests(gate, node, state, updates)
            if requested is not None:
                state = requested
        effective = state
        if state is not None and in_scope:
            effective = _requeue(gate, state, generation, spec_hash)
            if effective is not state:
                up = _update(updates, node.view.name)
                up.state = effective
                up.change.status = "waiting"
        why = taint_reason(gate, node, state, effective, gate_created) if in_scope else None
        if why is not None:
            up = _update(updates, node.view.name)
            up.change.add_readiness_taint = True
            up.events.append(EventRequest("node", "Normal", "ReadinessTaintAdded",
                                          f"NodeGate {name} tainted the node: it {why}"))
        progresses = node.progresses
        if effective is not None and effective is not node.states.get(name):
            progresses = {**progresses, name: progress_of(effective, handed_off=node.handed_off)}
        snapshots.append(NodeSnapshot(node.view.name, node.view.labels, progresses, node.matched))

    resumed = keys.RESUME_ANNOTATION in gate.metadata.annotations
    restarted = keys.RESTART_ANNOTATION in gate.metadata.annotations
    fresh = (_spec_changed(gate, spec_hash) or restarted) and gate.status is not None
    gate_for_plan = fresh_rollout(gate) if fresh else gate
    if restarted:
        events.append(EventRequest("gate", "Normal", "Restarted", "A person reset the gate: its rollout starts "
                                   "afresh (stopped compartments resume, batches start small again)"))
    if resumed:
        gate_for_plan = resumed_gate(gate_for_plan, gate.metadata.annotations[keys.RESUME_ANNOTATION])
        events.append(EventRequest("gate", "Normal", "Resumed", "A person resumed the rollout"))
    rollout = plan(gate_for_plan, policy, snapshots, now=now, gates=gates, protected=protected)
    states = {n.view.name: n for n in fleet}
    for start in rollout.starts:
        node = states[start.node]
        current = updates.get(start.node)
        base = (current.state if current and current.state else None) or _state(node.states.get(name))
        up = _update(updates, start.node)
        up.state = start_round(base, gate=gate, batch=start.batch, compartment=start.compartment,
                               boot_id=node.view.boot_id, now=now)
        up.change.status = "in-progress"
    _holds(gate, rollout, states, updates)
    compartments, again = _rollbacks(gate, rollout, states, updates, events, revisions, now)
    timed_out, recheck_after = _wait_timeouts(gate, rollout, states, updates, now, spec_hash)
    if again:
        recheck_after = ROLLBACK_RECHECK if recheck_after is None else min(recheck_after, ROLLBACK_RECHECK)
    for node_name, wait in rollout.waits.items():
        if node_name in timed_out or (node_name in updates and updates[node_name].change.status == "in-progress"):
            continue
        if states[node_name].view.labels.get(keys.status_label(name)) != wait.status:
            _update(updates, node_name).change.status = wait.status
    events += rollout_events(rollout)
    conditions, waiting_since = _blocked_conditions(gate, fleet, rollout, updates, timed_out, now)

    active = []
    by_status = dict.fromkeys(("in-progress", "complete", "failed", "blocked", "waiting"), 0)
    for_pods = 0
    for node in selected:
        queued = updates.get(node.view.name)
        recorded = node.states.get(name)
        node_state = queued.state if queued is not None and queued.state is not None else recorded
        node_status = "failed" if isinstance(recorded, StateParseError) else _status_of(node_state)
        if node_status == "in-progress":
            active.append(node.view.name)
        elif node_status not in ("complete", "failed"):
            node_wait = rollout.waits.get(node.view.name)
            node_status = "blocked" if node_wait is not None and node_wait.status == "blocked" else "waiting"
            for_pods += node_wait is not None and node_wait.reason == "protected-pods"
        by_status[node_status] += 1
    counts = NodeCounts(matched=len(selected), in_progress=by_status["in-progress"], complete=by_status["complete"],
                        failed=by_status["failed"], blocked=by_status["blocked"], waiting=by_status["waiting"],
                        waiting_for_pods=for_pods, ignored=ignored)
    status = gate_status(gate, counts, compartments, now, spec_hash, drains=_blocked_drains(gate.name, fleet),
                         pulls=_failing_pulls(gate.name, fleet), unreadable=_unreadable_signals(gate.name, fleet))
    status.waiting_for_pods_since = waiting_since
    return GatePlan(updates, status, active, events, rollout, conditions, recheck_after, resumed=resumed,
                    restarted=restarted)


def _holds(gate: NodeGate, rollout: Plan, states: Mapping[str, FleetNode], updates: dict[str, NodeUpdate]) -> None:
    """Cordon the nodes the plan holds while their protected pods finish, and uncordon those it lets go:
    the cordon, `cordoned-by` and the state's `cordoned` in one write. A node someone else cordoned is
    left as it is (it takes no new job already, and NodeGate never takes over another's cordon)."""
    name = gate.name
    for node_name in rollout.holds:
        node = states[node_name]
        if node.view.unschedulable:
            continue
        current = updates.get(node_name)
        base = (current.state if current and current.state else None) or _state(node.states.get(name))
        up = _update(updates, node_name)
        up.state = base.model_copy(update={"status": "waiting", "batch": 0, "cordoned": True})
        up.change.unschedulable = True
        up.change.cordoned_by = name
        up.events.append(EventRequest("node", "Normal", "Cordoned", f"NodeGate {name} cordoned the node while its "
                                      "protected pods finish (spec.cordonWhileProtected), so that no new job lands"))
    for node_name in rollout.releases:
        node = states[node_name]
        current = updates.get(node_name)
        base = (current.state if current and current.state else None) or _state(node.states.get(name))
        up = _update(updates, node_name)
        up.state = base.model_copy(update={"cordoned": False})
        if node.view.cordoned_by == name:
            up.change.unschedulable = False
            up.change.clear_cordoned_by = True
            up.events.append(EventRequest("node", "Normal", "Uncordoned", f"NodeGate {name} uncordoned the node: it "
                                          "does not hold nodes while protected pods run (spec.cordonWhileProtected)"))


def _rollbacks(gate: NodeGate, rollout: Plan, states: Mapping[str, FleetNode], updates: dict[str, NodeUpdate],
               events: list[EventRequest], revisions: Sequence[Revision] | None,
               now: datetime) -> tuple[list[CompartmentStatus], bool]:
    """The roll-backs of failed batches (`gate.lifecycle.rollback`): the nodes picked to go back are put
    in progress like any pick; returns the compartment statuses with the roll-back records, and whether
    to plan again soon (a record written now lets its nodes go back in the next plan)."""
    name = gate.name
    current: dict[str, NodeGateState | None] = {}
    for node_name, node in states.items():
        queued = updates.get(node_name)
        if queued is not None and queued.remove_state:
            continue
        raw = queued.state if queued is not None and queued.state is not None else node.states.get(name)
        current[node_name] = raw if isinstance(raw, NodeGateState) else None
    previous = gate.status.compartments if gate.status is not None else []
    planned = plan_rollbacks(gate, rollout, current, revisions=revisions, previous=previous,
                             boot_ids={n: f.view.boot_id for n, f in states.items()}, now=now)
    for node_name, state in planned.states.items():
        up = _update(updates, node_name)
        up.state = state
        up.change.status = "in-progress"
        up.events += planned.node_events.get(node_name, [])
    events += planned.events
    return planned.statuses, planned.recheck


def _blocked_since(gate: str, node: FleetNode, now: datetime) -> datetime:
    """Since when the node waits for its protected pods: the ProtectedPods condition's transition, now
    when it has none yet (it is written after this plan)."""
    current = node.view.conditions.get(keys.blocked_condition(gate))
    since = parse_time(current.since) if current is not None and current.reason == "ProtectedPods" else None
    return since or now


def _wait_timeouts(gate: NodeGate, rollout: Plan, states: Mapping[str, FleetNode], updates: dict[str, NodeUpdate],
                   now: datetime, spec_hash: str) -> tuple[set[str], float | None]:
    """Fail the nodes that waited for their protected pods longer than `waitTimeout` (WaitTimeout,
    naming the pods), as a round does that waits for pods picked up after its node was picked. Such a
    node was never picked: it is in no batch, and its failure counts in no batch's judgement. Returns
    them, and the seconds until the next waiting node reaches the timeout (for the operator to plan
    again then: nothing else may happen meanwhile)."""
    limit = gate.spec.wait_timeout
    if not limit:
        return set(), None
    seconds = parse_duration(limit).total_seconds()
    failed: set[str] = set()
    recheck: float | None = None
    for node_name, wait in rollout.waits.items():
        if wait.reason != "protected-pods":
            continue
        node = states[node_name]
        left = seconds - (now - _blocked_since(gate.name, node, now)).total_seconds()
        if left > 0:
            recheck = left if recheck is None else min(recheck, left)
            continue
        current = updates.get(node_name)
        base = (current.state if current and current.state else None) or _state(node.states.get(gate.name))
        names = ", ".join(wait.pods[:5])
        message = f"protected pods still running after {limit}: {names}"
        up = _update(updates, node_name)
        up.state = base.model_copy(update={"status": "failed", "batch": 0, "failure": Failure(
            stage="wait-pods", reason="WaitTimeout", message=message, generation=gate.metadata.generation or 0,
            rollout_hash=spec_hash)})
        up.change.status = "failed"
        text = f"Node {node_name} failed in step wait-pods: WaitTimeout: {message}"
        up.events.append(EventRequest("node", "Warning", "WaitTimeout", text))
        up.events.append(EventRequest("gate", "Warning", "WaitTimeout", text))
        failed.add(node_name)
    return failed, recheck


def _blocked_conditions(gate: NodeGate, fleet: Sequence[FleetNode], rollout: Plan,
                        updates: Mapping[str, NodeUpdate], timed_out: Collection[str],
                        now: datetime) -> tuple[dict[str, NodeCondition | None], str | None]:
    """The blocked conditions to write (node -> wanted, None: remove), and since when the node that has
    waited longest for its protected pods waits (None: none waits)."""
    name, kind = gate.name, keys.blocked_condition(gate.name)
    out: dict[str, NodeCondition | None] = {}
    oldest: datetime | None = None
    for node in fleet:
        node_name = node.view.name
        wait = rollout.waits.get(node_name)
        pods = wait.pods if wait is not None and wait.reason == "protected-pods" and node_name not in timed_out else ()
        queued = updates.get(node_name)
        state = queued.state if queued is not None and queued.state is not None else node.states.get(name)
        wanted = blocked_condition(name, node_name, state, pods) if node.selected_by(gate) else None
        if pods:
            since = _blocked_since(name, node, now)
            oldest = since if oldest is None else min(oldest, since)
        if node.view.conditions.get(kind) != wanted:
            out[node_name] = wanted
    stamp = oldest.isoformat(timespec="seconds").replace("+00:00", "Z") if oldest is not None else None
    return out, stamp


def _failing_pulls(gate: str, fleet: Sequence[FleetNode]) -> list[tuple[str, str]]:
    """(node, the kubelet's reason and message) for every node whose stage pod cannot pull its image."""
    return [(node.view.name, state.pull_failing) for node in fleet
            if isinstance(state := node.states.get(gate), NodeGateState) and state.status == "in-progress"
            and state.pull_failing]


def _unreadable_signals(gate: str, fleet: Sequence[FleetNode]) -> list[tuple[str, str]]:
    """(node, which signal and why) for every soaking node whose health signal cannot be read."""
    return [(node.view.name, state.health_unreadable) for node in fleet
            if isinstance(state := node.states.get(gate), NodeGateState) and state.status == "in-progress"
            and state.phase == "soak" and state.health_unreadable]


def _blocked_drains(gate: str, fleet: Sequence[FleetNode]) -> list[tuple[str, str]]:
    """(node, what holds its drain) for every node whose drain a PodDisruptionBudget holds."""
    out = []
    for node in fleet:
        state = node.states.get(gate)
        if (isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "drain"
                and state.drain_blocked_by):
            out.append((node.view.name, state.drain_blocked_by))
    return out


def _requests(gate: NodeGate, node: FleetNode, state: NodeGateState | None,
              updates: dict[str, NodeUpdate]) -> NodeGateState | None:
    """Act on a person's reset or rerun request on the node; the new state, or None for no change.

    A request for a node in the middle of a round waits until the round ends (the annotation stays):
    the stages running there are never cut off."""
    annotations = node.view.annotations
    reset_key, rerun_key = keys.reset_annotation(gate.name), keys.rerun_annotation(gate.name)
    if reset_key not in annotations and rerun_key not in annotations:
        return None
    if state is not None and state.status == "in-progress":
        return None
    if state is not None and state.status == "failed" and not _batch_closed(gate, state):
        # Its batch is not judged yet: retrying now would erase the failure the judgement counts.
        return None
    up = _update(updates, node.view.name)
    base = state or NodeGateState()
    if reset_key in annotations:
        # The next pick starts a new round; a node that passed once keeps serving (no readiness taint).
        # The pods it created stay its own: the last attempt's pod, kept for its logs, is swept by the next round.
        fresh = NodeGateState(round=base.round, boot_id=base.boot_id, passed=passed(base), pods=base.pods)
        up.remove_annotations.append(reset_key)
        if node.view.cordoned_by == gate.name:
            up.change.unschedulable = False
            up.change.clear_cordoned_by = True
        message = f"NodeGate {gate.name} will run on the node again from scratch (reset requested)"
    else:
        package, _, stage = annotations[rerun_key].partition("/")
        fresh = rerun(base, package, stage or "apply")
        up.remove_annotations.append(rerun_key)
        message = f"NodeGate {gate.name} will rerun {package} {stage or 'apply'} on the node (rerun requested)"
    fresh = fresh.model_copy(update={"status": "waiting", "batch": 0, "failure": None})
    up.state = fresh
    up.change.status = "waiting"
    up.events.append(EventRequest("node", "Normal", "RerunRequested", message))
    return fresh


def _batch_closed(gate: NodeGate, state: NodeGateState) -> bool:
    if state.batch <= 0 or gate.status is None:
        return True
    for comp in gate.status.compartments:
        if comp.name == state.compartment:
            return comp.batch > state.batch  # the stored batch number moves past a batch once judged
    return True


def _state(raw: NodeGateState | StateParseError | None) -> NodeGateState:
    return raw if isinstance(raw, NodeGateState) else NodeGateState()


def _status_of(state: NodeGateState | StateParseError | None) -> str:
    if isinstance(state, NodeGateState):
        return state.status
    if isinstance(state, StateParseError):
        return "failed"
    return "waiting"


def _requeue(gate: NodeGate, state: NodeGateState, generation: int, spec_hash: str) -> NodeGateState:
    """A finished node goes back in line when the spec asks for more (a new version, config, ...),
    and a failed node gets another round once the rollout spec changed after its failure. A pause or
    a resume is no such change: it bumps the generation, never the rollout hash."""
    # A node finished under the gate's current rollout hash has nothing pending: the hash covers
    # everything but `paused`. Only other ones need the (per-package) comparison, the expensive part.
    changed = state.rollout_hash != spec_hash if state.rollout_hash else state.generation < generation
    if state.status == "complete" and changed and pending_work(gate, state):
        return state.model_copy(update={"status": "waiting", "batch": 0, "passed": True})
    if state.status == "failed" and state.failure is not None and _failed_before(state.failure, spec_hash,
                                                                                   generation):
        return state.model_copy(update={"status": "waiting", "batch": 0, "failure": None})
    return state


def _failed_before(failure: Failure, spec_hash: str, generation: int) -> bool:
    """The rollout spec changed since the failure."""
    if failure.rollout_hash:
        return failure.rollout_hash != spec_hash
    return failure.generation < generation  # recorded before failures carried the hash


def _spec_changed(gate: NodeGate, spec_hash: str) -> bool:
    """The rollout spec changed since the last plan (not merely the generation: a pause is no change)."""
    status = gate.status
    if status is None:
        return False
    if status.rollout_hash:
        return status.rollout_hash != spec_hash
    # A status written before it carried the hash: the generation is all there is to go by.
    return status.observed_generation is not None and status.observed_generation < (gate.metadata.generation or 0)
