"""Everything one gate reconcile writes, decided at once: `ReconcilePlan` (pure: no I/O).

The gate reconcile reads the caches, resolves the packages' images (I/O, in the controller; what that
writes is planned by `gate.lifecycle.images.plan_images`), and then asks one function here what to
write; `gate.controller.gate_applier.GateApplier` writes it (the rule: `gate.controller.executor`).
One plan per path:

* `plan_finalizer`: a gate without the operator's finalizer gets it, and nothing else yet.
* `plan_reconcile`: an enabled gate with a usable policy. The rollout (`gate.lifecycle.fleet.plan_gate`)
  decides the node updates, blocked conditions, status and Events; this adds what follows from them.
* `plan_removal_reconcile`: a deleted gate whose nodes still hold its record (`gate.lifecycle.removal`).
* `plan_release`: a deleted gate no node holds a record of any more: what it left on nodes, then its
  finalizer.
* `plan_disabled`: a disabled gate (only readiness taints let go, and its status says Disabled).
* `plan_problem`: a gate whose DeploymentPolicy is missing or cannot be used (Degraded and Stalled).

Decisions made here, rather than in the controller or the applier:

* **Failure conditions follow the state the plan leaves on each node** (`failure_conditions`): the state
  of the node's update when the plan writes one, none when it removes the record, else the node's. So a
  node the plan fails (a wait timeout) gets its condition, and one it gives a new round loses it, in
  the same reconcile. Only nodes whose condition differs are listed: most of a fleet needs nothing.
* **The status carries the image records and ImagesResolved** (`with_images`): the rollout planner does
  not know the records; they are kept as the gate's status has them (the controller resolved them just
  before), or emptied when the operator does not resolve digests (pods pull tags then, and a record
  would claim what they do not do). A field the new status lacks but the old one has
  (`waitingForPodsSince`) is set to null, as a merge patch removes a field only when told so. A status
  that differs from the current one only in lastTransitionTimes is not written (`status_patch`).
* **Metric values are data** (`GateMetrics`): gauges per state and compartment, waiting-for-pods,
  drains blocked, records refused, and which series the gate no longer has.
* **A record not written by the operator is reported once** per (gate, node, record) (`refused_reports`):
  `reported` is what was reported before.

The order the applier writes in is what makes a crash between two writes harmless: node writes
first (the status never counts progress ahead of the nodes it counts), then the node conditions, the
status, the removal of the requests acted on (only once the status says what they did), Events,
metrics. When to look again (`recheck_after`, `node_keys`) the reconcile returns.

To add a decision: give `ReconcilePlan` a field with a harmless default (an empty list, None), fill
it in the plan function that decides it (with a unit test on that function), and write it in
`GateApplier.apply_gate_plan`, at the place in the order where a crash right after it is harmless.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gate.api import keys
from gate.api.common import Obj, parse_time
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, StateParseError
from gate.lifecycle.condition import NodeCondition, failure_condition
from gate.lifecycle.fleet import FleetNode, NodeUpdate, plan_gate, selects
from gate.lifecycle.health import KSTATUS_TYPES, STALLED, condition, previous_conditions
from gate.lifecycle.health import same_status as same_status
from gate.lifecycle.images import records_wire
from gate.lifecycle.machine import cordon_at_pick
from gate.lifecycle.node import EventRequest
from gate.lifecycle.prepull import Candidate, Lookahead, candidates, waits_for_images
from gate.lifecycle.removal import plan_removal
from gate.lifecycle.signatures import verified_condition
from gate.lifecycle.staging import GateStaging, StagingAhead, gate_staging
from gate.lifecycle.taint import lifts, readiness_clear
from gate.rollout.history import Revision

# The `state` label of nodegate_nodes, and the field of status.nodes it counts.
NODE_STATES = (("complete", "complete"), ("in-progress", "inProgress"), ("failed", "failed"),
               ("waiting", "waiting"), ("blocked", "blocked"))


@dataclass(frozen=True)
class CompartmentGauges:
    """The gauges of one compartment, as its status says them."""

    matched: int = 0
    ceiling: int = 0
    in_progress: int = 0
    complete: int = 0
    failed: int = 0
    batch: int = 0
    consecutive_failures: int = 0
    stopped: int = 0  # 1 while the compartment is stopped
    rolled_back: int = 0  # 1 while it is stopped by a failed batch under `rollback: true`


@dataclass(frozen=True)
class WaitGauges:
    """Nodes waiting for protected pods, and since when (a Unix time; None: the series goes)."""

    nodes: int
    since: float | None


@dataclass(frozen=True)
class ForgetSeries:
    """Series of the gate to remove: compartments not in `compartments`, packages not in `packages`, and
    stage series of packages no gate has (`all_packages`)."""

    compartments: frozenset[str]
    packages: frozenset[str]
    all_packages: frozenset[str]


@dataclass
class GateMetrics:
    """The metric values one gate reconcile sets. A field left None is not touched."""

    nodes: dict[str, int]  # by the `state` label
    compartments: dict[str, CompartmentGauges]
    wait: WaitGauges | None = None
    drains_blocked: int | None = None
    forget: ForgetSeries | None = None


@dataclass(frozen=True)
class RefusedReport:
    """A record of the gate on a node that the operator did not write, reported now (once)."""

    node: str
    record: str  # the record's digest: a new one is reported again
    why: str


@dataclass
class ReconcilePlan:
    """What one gate reconcile writes, in the order the applier writes it."""

    gate: str
    updates: dict[str, NodeUpdate] = field(default_factory=dict)  # node writes (record, label, cordon, taint)
    releasable: frozenset[str] | None = None  # removal: nodes done whose batch was judged (None: not a removal)
    failure_conditions: dict[str, NodeCondition | None] = field(default_factory=dict)  # node -> wanted (None: go)
    blocked_conditions: dict[str, NodeCondition | None] = field(default_factory=dict)  # likewise
    status: Obj | None = None  # the status merge patch; None: the status stays as it is
    drop_annotations: list[str] = field(default_factory=list)  # the gate's requests acted on
    events: list[EventRequest] = field(default_factory=list)  # on the gate
    refused: list[RefusedReport] = field(default_factory=list)  # each also has its Event in `events`
    metrics: GateMetrics | None = None
    recheck_after: float | None = None  # seconds: look at the gate again then, with no event to say so
    node_keys: list[str] = field(default_factory=list)  # nodes whose own reconcile runs now
    # The gate's prepull candidates (`gate.lifecycle.prepull`), for the prepuller once the picks are
    # written; None: prepull is off, or this plan starts no round.
    prepull: list[Candidate] | None = None
    # The gate's part of the fleet-wide staging plan (`gate.lifecycle.staging`), for the stager once the
    # picks are written; None: staging is off.
    staging: GateStaging | None = None
    # A deleted gate that is done with every node: remove its finalizer, last of the writes (so a write
    # that fails above it keeps the gate, retried, until every node is clean).
    release: bool = False
    # A gate first seen: add the finalizer, alone (guarded by its resourceVersion); the watch brings the
    # new version back, and that one is planned.
    add_finalizer: bool = False


def plan_finalizer(gate: NodeGate) -> ReconcilePlan | None:
    """The finalizer, added to a gate that lacks it before anything else is planned (its deletion then
    waits for its nodes to be clean); None: it has it."""
    if keys.FINALIZER in gate.metadata.finalizers:
        return None
    return ReconcilePlan(gate=gate.name, add_finalizer=True)


def plan_reconcile(gate: NodeGate, policy: DeploymentPolicy | None, fleet: Sequence[FleetNode], *, status: Obj,
                   gates: Sequence[NodeGate], now: datetime, gate_created: datetime | None = None,
                   busy: Collection[str] = frozenset(), protected: Mapping[str, Sequence[str]] | None = None,
                   resolve_digests: bool, packages_in_use: Collection[str],
                   reported: Collection[tuple[str, str, str]] = frozenset(),
                   prepull: Lookahead | None = None,
                   revisions: Sequence[Revision] | None = None,
                   staging: StagingAhead | None = None) -> ReconcilePlan:
    """The whole reconcile of an enabled gate: its rollout (`plan_gate`), with the gate's current
    `status` (wire), and everything that follows from it; with `prepull`, the nodes whose round's
    images are pulled ahead; with `staging`, the gate's staging candidates (`gate.lifecycle.staging`)."""
    gplan = plan_gate(gate, policy, fleet, gates=gates, now=now, gate_created=gate_created, busy=busy,
                      protected=protected or {}, revisions=revisions)
    cordon_picks(gate, gplan.updates, fleet, now, prepull=prepull, staging=staging, resolve=resolve_digests)
    planned = gplan.status.to_wire()
    wanted = with_images(gate, gplan.status.to_wire(), resolve_digests=resolve_digests, now=now)
    if "waitingForPodsSince" in status and "waitingForPodsSince" not in wanted:
        wanted["waitingForPodsSince"] = None  # a merge patch removes a field only when told so
    refused = refused_reports(gate.name, fleet, reported)
    since = gplan.status.waiting_for_pods_since
    since_at = parse_time(since)
    metrics = gate_metrics(planned)
    metrics.wait = WaitGauges(gplan.status.nodes.waiting_for_pods,
                              since_at.timestamp() if since_at is not None else None)
    metrics.drains_blocked = sum(1 for n in fleet if _drain_blocked(n.states.get(gate.name)))
    metrics.forget = ForgetSeries(frozenset(c.name for c in gplan.status.compartments),
                                  frozenset(gate.spec.packages), frozenset(packages_in_use))
    states = {n.view.name: s if isinstance(s := n.states.get(gate.name), NodeGateState) else None for n in fleet}
    return ReconcilePlan(
        gate=gate.name, updates=gplan.updates,
        failure_conditions=failure_conditions(gate.name, fleet, gplan.updates),
        blocked_conditions=gplan.conditions, status=status_patch(status, wanted),
        drop_annotations=gplan.requests_done,
        events=[*gplan.events, *(refused_event(gate.name, r) for r in refused)], refused=refused,
        metrics=metrics, recheck_after=gplan.recheck_after,
        prepull=None if prepull is None else candidates(
            gate, gplan, states, ahead=prepull.ahead, agent_image=prepull.agent_image, resolve=resolve_digests),
        staging=None if staging is None else gate_staging(gate, gplan, states, catalog=staging.catalog,
                                                          ahead=staging.ahead))


def cordon_picks(gate: NodeGate, updates: Mapping[str, NodeUpdate], fleet: Sequence[FleetNode], now: datetime, *,
                 prepull: Lookahead | None, staging: StagingAhead | None, resolve: bool) -> None:
    """The nodes picked in this plan whose round would only cordon at its first look carry that cordon
    in the pick's write (`gate.lifecycle.machine.cordon_at_pick`): one node write and one reconcile
    less per node. The state goes in progress at wait-pods, `unschedulable` and `cordoned-by` with it,
    so the budget counts the cordoned node from that very write, and a restart after it resumes at
    wait-pods; the Cordoned Event follows the write, as every Event of the gate applier's path."""
    picks = [n for n, u in updates.items() if u.change.status == "in-progress" and u.state is not None]
    if not picks:
        return
    views = {f.view.name: f.view for f in fleet}
    for name in picks:
        update, view = updates[name], views.get(name)
        if view is None or update.state is None or update.change.unschedulable is not None \
                or update.change.clear_cordoned_by:
            continue  # the plan moves the cordon itself (a reset uncordons): the node reconcile cordons after it
        decision = cordon_at_pick(gate, view, update.state, now, serving=staging.catalog if staging else None,
                                  images_wait=waits_for_images(gate, update.state, name, prepull, resolve=resolve))
        if decision is None or decision.state is None:
            continue
        update.state = decision.state
        update.change.unschedulable = decision.node.unschedulable
        update.change.cordoned_by = decision.node.cordoned_by
        update.events += decision.events


def plan_removal_reconcile(gate: NodeGate, policy: DeploymentPolicy | None, fleet: Sequence[FleetNode], *,
                           status: Obj, holders: Sequence[str], now: datetime,
                           resolve_digests: bool) -> ReconcilePlan:
    """A deleted gate whose records `holders` still carry: its removal (`plan_removal`) and what follows.
    The node reconciles uninstall and remove the keys; their events bring the gate back."""
    rplan = plan_removal(gate, policy, fleet, now=now)
    planned = rplan.status.to_wire()
    wanted = with_images(gate, rplan.status.to_wire(), resolve_digests=resolve_digests, now=now)
    return ReconcilePlan(
        gate=gate.name, updates=rplan.updates, releasable=rplan.releasable,
        # A failed uninstall shows on its node too.
        failure_conditions=failure_conditions(gate.name, fleet, rplan.updates),
        status=status_patch(status, wanted),
        drop_annotations=[keys.RESUME_ANNOTATION] if rplan.resumed else [],
        events=rplan.events, metrics=gate_metrics(planned), node_keys=list(holders))


def holders(gate: NodeGate, fleet: Iterable[FleetNode]) -> list[str]:
    """The nodes carrying a record of the gate (the operator's or not): a deleted gate uninstalls from
    them (`plan_removal_reconcile`) before it may go."""
    annotation = keys.state_annotation(gate.name)
    return [n.view.name for n in fleet if annotation in n.view.annotations]


def plan_release(gate: NodeGate, fleet: Iterable[FleetNode], gates: Collection[NodeGate]) -> ReconcilePlan:
    """A deleted gate no node holds a record of: remove what it left on nodes it never started on (its
    status label on a node waiting in line, a person's reset or rerun request, and the readiness taint
    of a node that waited for this gate alone) and its node conditions, then let the gate go."""
    plan = ReconcilePlan(gate=gate.name, release=True)
    requests = (keys.reset_annotation(gate.name), keys.rerun_annotation(gate.name))
    for node in fleet:
        view = node.view
        taint = selects(gate, view) and lifts(gate, view.taints, readiness_clear(gate.name, node, gates))
        if keys.status_label(gate.name) in view.labels or any(r in view.annotations for r in requests) or taint:
            update = NodeUpdate(remove_state=True)
            if taint:
                update.change.remove_readiness_taint = True
                update.events.append(EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                  f"NodeGate {gate.name} was deleted; no other gate holds the node "
                                                  "back"))
            plan.updates[view.name] = update
        for kind, wanted in ((keys.failed_condition(gate.name), plan.failure_conditions),
                             (keys.blocked_condition(gate.name), plan.blocked_conditions)):
            if kind in view.conditions:
                wanted[view.name] = None
    return plan


def plan_disabled(gate: NodeGate, fleet: Sequence[FleetNode], *, status: Obj, gates: Sequence[NodeGate],
                  now: datetime) -> ReconcilePlan:
    """A disabled gate plans nothing: no round starts (one running finishes, as the node reconcile
    drives it), and it lets go of the readiness taint on every node that no enabled gate holds back.
    Its status says Disabled, and Progressing False; neither Reconciling nor Stalled: the gate does
    nothing, and Ready decides (gate.lifecycle.health)."""
    updates: dict[str, NodeUpdate] = {}
    if gate.spec.readiness_taint:
        for node in fleet:
            if selects(gate, node.view) and lifts(gate, node.view.taints, readiness_clear(gate.name, node, gates)):
                update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                         f"NodeGate {gate.name} is disabled; no other gate holds "
                                                         "the node back")])
                update.change.remove_readiness_taint = True
                updates[node.view.name] = update
    generation = gate.metadata.generation or 0
    wanted = dict(status)
    previous = previous_conditions(status)
    conditions = [c for c in status.get("conditions") or []
                  if c.get("type") not in ("Disabled", "Progressing", *KSTATUS_TYPES)]
    disabled: tuple[tuple[str, Literal["True", "False"], str, str], ...] = (
            ("Disabled", "True", "Disabled", f"annotation {keys.DISABLED_ANNOTATION}=true: the gate does nothing"),
            ("Progressing", "False", "Disabled", "The gate is disabled: no new work starts"))
    for type_, value, reason, message in disabled:
        conditions.append(condition(type_, value, reason, message, previous, now, generation).to_wire())
    wanted.update({"conditions": conditions, "status": "Disabled", "observedGeneration": generation})
    return ReconcilePlan(gate=gate.name, updates=updates, status=status_patch(status, wanted))


def plan_problem(gate: NodeGate, *, status: Obj, reason: str, message: str, now: datetime) -> ReconcilePlan:
    """A gate that cannot go on until a person fixes what `message` names (its DeploymentPolicy is
    missing or invalid): Degraded, and Stalled for kstatus, with a Warning Event saying why."""
    generation = gate.metadata.generation or 0
    wanted = dict(status)
    previous = previous_conditions(status)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in ("Degraded", *KSTATUS_TYPES)]
    for type_ in ("Degraded", STALLED):  # since the problem began: the time holds while the status does
        conditions.append(condition(type_, "True", reason, message, previous, now, generation).to_wire())
    wanted.update({"conditions": conditions, "status": "Degraded", "observedGeneration": generation})
    return ReconcilePlan(gate=gate.name, status=status_patch(status, wanted),
                         events=[EventRequest("gate", "Warning", reason, message)])


def with_images(gate: NodeGate, status: Obj, *, resolve_digests: bool, now: datetime) -> Obj:
    """A planned status (wire) with the gate's image records kept and the ImagesResolved condition,
    while the operator resolves images (`resolve_digests`); with no records when it does not."""
    if not resolve_digests:
        status["images"] = []  # pods pull tags then; a record would claim what they do not do
        return status
    records = gate.status.images if gate.status is not None else []
    status["images"] = records_wire(records)
    previous = gate.status.conditions if gate.status is not None else []
    pinned = sum(1 for p in gate.spec.packages.values() if "@" in p.image)
    message = f"{len(records)} package image(s) resolved to a digest for this rollout"
    if pinned:
        message += f", {pinned} pinned by digest in the spec"
    resolved = condition("ImagesResolved", "True", "Resolved", message, previous, now, gate.metadata.generation or 0)
    verified = verified_condition(records, previous, now, gate.metadata.generation or 0)
    status["conditions"] = [*status.get("conditions", []), resolved.to_wire(),
                            *([verified.to_wire()] if verified is not None else [])]
    return status


def failure_conditions(gate: str, fleet: Iterable[FleetNode],
                       updates: Mapping[str, NodeUpdate]) -> dict[str, NodeCondition | None]:
    """The failure condition (gate.lifecycle.condition) of every node whose condition must change, once
    the plan's `updates` are written: node -> the condition it must carry, None: it must carry none."""
    kind = keys.failed_condition(gate)
    out: dict[str, NodeCondition | None] = {}
    for node in fleet:
        state = node.states.get(gate)
        update = updates.get(node.view.name)
        if update is not None and update.remove_state:
            state = None
        elif update is not None and update.state is not None:
            state = update.state
        wanted = failure_condition(gate, state)
        if node.view.conditions.get(kind) != wanted:
            out[node.view.name] = wanted
    return out


def status_patch(current: Obj, wanted: Obj) -> Obj | None:
    """`wanted`, unless it says what `current` says (lastTransitionTimes aside): None, nothing to write."""
    return None if same_status(current, wanted) else wanted


def gate_metrics(status: Obj) -> GateMetrics:
    """The gauges of the gate's nodes by state and of each compartment, from its status (wire)."""
    nodes = status.get("nodes", {})
    compartments = {
        c["name"]: CompartmentGauges(
            matched=c.get("matched", 0), ceiling=c.get("ceiling", 0), in_progress=c.get("inProgress", 0),
            complete=c.get("complete", 0), failed=c.get("failed", 0), batch=c.get("batch", 0),
            consecutive_failures=c.get("consecutiveFailures", 0), stopped=1 if c.get("state") == "stopped" else 0,
            rolled_back=1 if c.get("state") == "stopped" and c.get("rollback") else 0)
        for c in status.get("compartments", [])}
    return GateMetrics(nodes={state: nodes.get(field_, 0) for state, field_ in NODE_STATES},
                       compartments=compartments)


def refused_reports(gate: str, fleet: Iterable[FleetNode],
                    reported: Collection[tuple[str, str, str]]) -> list[RefusedReport]:
    """Records of this gate that the operator did not write (`FleetNode.refused`) and that were not
    reported yet. The plan took each node as having no record; the annotation stays until the operator
    writes its own record there (when it picks the node) or removes the gate's keys."""
    out: list[RefusedReport] = []
    for node in fleet:
        refused = node.refused.get(gate)
        if refused is not None and (gate, node.view.name, refused.record) not in reported:
            out.append(RefusedReport(node.view.name, refused.record, refused.why))
    return out


def refused_event(gate: str, report: RefusedReport) -> EventRequest:
    """The Warning Event on the gate that names the node whose record is not the operator's."""
    return EventRequest("gate", "Warning", "RecordNotOurs",
                        f"NodeGate {gate}: the record {keys.state_annotation(gate)} on node {report.node} was not "
                        f"written by the operator ({report.why}). It is ignored: the node counts as having no "
                        "record for this gate. Find out who wrote it (the API server's audit log); docs/security.md")


def _drain_blocked(state: NodeGateState | StateParseError | None) -> bool:
    return (isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "drain"
            and bool(state.drain_blocked_by))


