"""What `nodegate status` says about a gate, computed from a snapshot of the cluster. Pure: no I/O.

The CLI reads NodeGates, DeploymentPolicies, Nodes and the stage pods once (or keeps them current with
watches), and this module turns them into a `GateReport`: per compartment the counts behind a progress
bar, the nodes in progress with their phase and the step their stage pod runs now, the failed nodes with the reason, and
what the rest wait for. The wait reasons come from running the operator's own pure planning step
(`gate.lifecycle.fleet.plan_gate`, which calls the rollout planner) on the snapshot: the status says
what the operator would decide, not a second opinion that could drift from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import ValidationError

from gate.api.common import Obj
from gate.api.nodegate import CompartmentStatus, ImageRecord, NodeGate
from gate.api.policy import DEFAULT_COMPARTMENT, DeploymentPolicy
from gate.api.state import Failure, NodeGateState, StateParseError, failure_message
from gate.cli.stagepods import running as running_steps
from gate.controller.views import fleet_node
from gate.controller.workloads import WorkloadIndex
from gate.kube.objects import parse_time
from gate.lifecycle.fleet import FleetNode, plan_gate
from gate.lifecycle.handoff import held
from gate.lifecycle.soak import soak_left
from gate.rollout import PolicyMismatch, Wait

NodeState = Literal["complete", "in-progress", "failed", "waiting", "blocked", "starting"]

# How a phase of a round reads in one line.
PHASE_TEXT = {
    "idle": "starting",
    "cordon": "cordoning",
    "wait-pods": "waiting for protected pods",
    "drain": "draining",
    "stages": "running stages",
    "interrupt": "interrupting",
    "post-interrupt": "post-interrupt checks",
    "finish": "finishing",
    "soak": "soaking (serving, must stay healthy)",
}
WAIT_ORDER = ("starting", "stopped", "paused", "priority", "protected-pods", "outside-window", "batch-running",
              "batch-soaking", "budget-full", "queued")


@dataclass(frozen=True)
class Snapshot:
    """Everything the status is computed from: raw API objects as the API server returned them."""

    gates: Sequence[Obj]
    policies: Mapping[str, Obj]
    nodes: Sequence[Obj]
    pods: Sequence[Obj] = ()  # the operator's stage pods
    pods_visible: bool = True  # False when the reader may not list pods there: no stage names then
    workloads: Sequence[Obj] = ()  # pods of any namespace matching some gate's podNonInterruptLabels
    namespace: str = "nodegate-system"  # the operator's: its stage pods protect no node


@dataclass(frozen=True)
class CompartmentReport:
    name: str
    matched: int
    complete: int
    in_progress: int
    failed: int
    waiting: int
    ceiling: int
    batch: int
    batch_size: int
    consecutive_failures: int
    state: str


@dataclass(frozen=True)
class ActiveNode:
    """A node in the middle of a round."""

    name: str
    compartment: str
    batch: int
    phase: str
    seconds: float | None  # in the current phase
    running: tuple[str, ...]  # "package stage" of the step its stage pods run now, or the interrupt, "reboot"
    detail: str = ""  # e.g. what blocks the drain
    soak_left: float | None = None  # in phase soak: seconds until the soak ends (0: over, waiting for a signal)

    @property
    def doing(self) -> str:
        text = PHASE_TEXT.get(self.phase, self.phase)
        if self.running:
            text += ": " + ", ".join(self.running)
        if self.detail:
            text += f" ({self.detail})"
        return text


@dataclass(frozen=True)
class FailedNode:
    name: str
    compartment: str
    package: str | None
    stage: str
    reason: str
    message: str
    cordoned: bool

    @property
    def where(self) -> str:
        return f"{self.package} {self.stage}" if self.package else self.stage


@dataclass(frozen=True)
class WaitGroup:
    """Nodes of one compartment waiting for the same thing."""

    compartment: str
    reason: str
    message: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class GateReport:
    name: str
    summary: str  # Ready | Progressing | Degraded | Paused | Unknown
    matched: int
    complete: int
    generation: int
    observed_generation: int | None
    policy: str | None
    paused: bool
    compartments: tuple[CompartmentReport, ...]
    active: tuple[ActiveNode, ...]
    failed: tuple[FailedNode, ...]
    waits: tuple[WaitGroup, ...]
    notes: tuple[str, ...] = ()  # gate-wide: policy missing, operator behind, Degraded message
    node_states: Mapping[str, NodeState] = field(default_factory=dict)
    images: tuple[ImageRecord, ...] = ()  # each package's tag as the operator resolved it for this rollout
    held: tuple[str, ...] = ()  # nodes this gate left cordoned for hand-off (spec.leaveCordoned)

    @property
    def done(self) -> bool:
        return self.matched > 0 and self.complete == self.matched


def build_reports(snapshot: Snapshot, now: datetime, names: Sequence[str] | None = None) -> list[GateReport]:
    """A report per gate (every gate, or those named, in that order); `now` must be timezone-aware."""
    gates: dict[str, NodeGate] = {}
    broken: dict[str, str] = {}
    for raw in snapshot.gates:
        name = raw.get("metadata", {}).get("name", "")
        try:
            gates[name] = NodeGate.model_validate(raw)
        except ValidationError as exc:
            broken[name] = str(exc).splitlines()[0]
    fleet = [fleet_node(n) for n in snapshot.nodes]
    running = running_steps(snapshot.pods)
    workloads = WorkloadIndex(snapshot.namespace)
    for pod in snapshot.workloads:
        workloads.pod_event("ADDED", pod)
    node_names = [n.view.name for n in fleet]
    live = [g for g in gates.values() if not g.metadata.deletion_timestamp]
    wanted = list(names) if names is not None else sorted({*gates, *broken})
    reports = []
    for name in wanted:
        if name in broken:
            reports.append(_unreadable(name, broken[name]))
        elif name in gates:
            selector = gates[name].spec.pod_non_interrupt_labels
            protected = workloads.matching(selector, node_names) if selector is not None else {}
            reports.append(gate_report(gates[name], snapshot.policies, fleet, live, running, now,
                                       pods_visible=snapshot.pods_visible, protected=protected))
    return reports


def gate_report(gate: NodeGate, policies: Mapping[str, Obj], fleet: Sequence[FleetNode], gates: Sequence[NodeGate],
                running: Mapping[tuple[str, str], tuple[str, ...]], now: datetime, *,
                pods_visible: bool = True, protected: Mapping[str, Sequence[str]] | None = None) -> GateReport:
    notes: list[str] = []
    policy: DeploymentPolicy | None = None
    wanted = gate.spec.deployment_policy
    if wanted and wanted in policies:
        policy = DeploymentPolicy.model_validate(policies[wanted])
    recorded = {c.name: c for c in gate.status.compartments} if gate.status is not None else {}
    generation = gate.metadata.generation or 0
    observed = gate.status.observed_generation if gate.status is not None else None
    if gate.metadata.deletion_timestamp:
        notes.append("being deleted: the operator uninstalls what it can and removes its keys from the nodes")
    if gate.status is None or not observed:  # 0: the CRD's default, before the operator's first status
        notes.append("the operator has not reported on this gate yet (is it running?)")
    elif observed < generation:
        notes.append(f"the operator has not acted on generation {generation} yet (last seen: {observed})")
    if not pods_visible:
        notes.append("stage names unknown: no permission to list pods in the operator's namespace")

    try:
        gplan = plan_gate(gate, policy, fleet, gates=gates, now=now,
                          gate_created=parse_time(gate.metadata.creation_timestamp), protected=protected)
    except PolicyMismatch:
        notes.insert(0, f"DeploymentPolicy {wanted} does not exist: the operator starts nothing until it does")
        return _without_plan(gate, fleet, running, now, notes)
    rollout = gplan.rollout
    assert rollout is not None  # plan_gate always plans
    if gate.status is not None:
        for cond in gate.status.conditions:
            if cond.type == "Degraded" and cond.status == "True" and cond.message:
                notes.append(f"degraded: {cond.message}")
            if cond.type == "ImagesVerified" and cond.status == "True" and cond.reason != "Verified":
                notes.append(f"image signatures ({cond.reason}): {cond.message}")  # warn mode: runs anyway
    if not rollout.window_open and policy is not None and policy.spec.windows:
        notes.append("outside every maintenance window: new nodes start only inside one")

    by_name = {n.view.name: n for n in fleet}
    starting = {s.node: s for s in rollout.starts}
    node_states: dict[str, NodeState] = {}
    per_compartment: dict[str, dict[str, int]] = {c.name: _zero() for c in rollout.compartments}
    active: list[ActiveNode] = []
    failed: list[FailedNode] = []
    groups: dict[tuple[str, str, str], list[str]] = {}
    in_batch: dict[tuple[str, int], int] = {}  # nodes recorded in each batch: its real size
    for node_name, compartment in rollout.assignment.items():
        raw = by_name[node_name].states.get(gate.name)
        state = _node_state(raw, rollout.waits.get(node_name), node_name in starting)
        number = starting[node_name].batch if node_name in starting else (
            raw.batch if isinstance(raw, NodeGateState) else 0)
        if number:
            in_batch[(compartment, number)] = in_batch.get((compartment, number), 0) + 1
        node_states[node_name] = state
        per_compartment[compartment][_bucket(state)] += 1
        if state == "in-progress" and isinstance(raw, NodeGateState):
            active.append(_active(node_name, compartment, raw, running.get((gate.name, node_name), ()), now))
        elif state == "failed":
            failed.append(_failed(node_name, compartment, raw))
        elif state == "starting":
            start = starting[node_name]
            key = (compartment, "starting",
                   f"picked for batch {start.batch} of {compartment}; the operator starts them now")
            groups.setdefault(key, []).append(node_name)
        elif state in ("waiting", "blocked"):
            wait = rollout.waits.get(node_name)
            if wait is not None:
                groups.setdefault((compartment, wait.reason, wait.message), []).append(node_name)

    compartments = []
    for plan_c in rollout.compartments:
        counts = per_compartment[plan_c.name]
        # What the operator recorded is the truth a person acts on (a stop is only real once it is
        # written); the plan's status stands in until the operator has written one.
        c = recorded.get(plan_c.name) or plan_c.status
        if plan_c.name == DEFAULT_COMPARTMENT and policy is not None and sum(counts.values()) == 0:
            continue  # a policy's catch-all with no nodes is noise
        if counts["in_progress"] and in_batch.get((c.name, c.batch)):
            # While a batch runs its size is the nodes in it (the planned size of a rollout restarted
            # by a spec change can differ from the batch still finishing).
            c = c.model_copy(update={"batch_size": in_batch[(c.name, c.batch)]})
        compartments.append(_compartment(c, counts))
    order = {c.name: i for i, c in enumerate(rollout.compartments)}
    waits = sorted(
        (WaitGroup(c, reason, message, tuple(sorted(nodes))) for (c, reason, message), nodes in groups.items()),
        key=lambda w: (order.get(w.compartment, 0), WAIT_ORDER.index(w.reason) if w.reason in WAIT_ORDER else 99,
                       w.message),
    )
    matched = len(node_states)
    complete = sum(1 for s in node_states.values() if s == "complete")
    handed = tuple(sorted(n.view.name for n in fleet if held(n.view.annotations, n.view.unschedulable) == gate.name))
    if handed:
        shown = ", ".join(handed[:5]) + (f" and {len(handed) - 5} more" if len(handed) > 5 else "")
        notes.append(f"held for hand-off: {len(handed)} node(s) left cordoned for the validator that comes next "
                     f"({shown}); `kubectl uncordon NODE` or `nodegate node release NODE` releases one for good")
    return GateReport(
        name=gate.name, summary=_summary(gate), matched=matched, complete=complete, generation=generation,
        observed_generation=observed, policy=wanted, paused=gate.spec.paused, compartments=tuple(compartments),
        active=tuple(sorted(active, key=lambda a: (order.get(a.compartment, 0), a.name))),
        failed=tuple(sorted(failed, key=lambda f: (order.get(f.compartment, 0), f.name))),
        waits=tuple(waits), notes=tuple(notes), node_states=node_states, images=_images(gate), held=handed,
    )


def _zero() -> dict[str, int]:
    return {"complete": 0, "in_progress": 0, "failed": 0, "waiting": 0}


def _bucket(state: NodeState) -> str:
    # A node picked for a batch counts as in progress from the pick on, as it does against the budget.
    return {"complete": "complete", "in-progress": "in_progress", "starting": "in_progress",
            "failed": "failed"}.get(state, "waiting")


def _compartment(c: CompartmentStatus, counts: Mapping[str, int]) -> CompartmentReport:
    return CompartmentReport(
        name=c.name, matched=sum(counts.values()), complete=counts["complete"], in_progress=counts["in_progress"],
        failed=counts["failed"], waiting=counts["waiting"], ceiling=c.ceiling, batch=c.batch,
        batch_size=c.batch_size, consecutive_failures=c.consecutive_failures, state=c.state,
    )


def _node_state(raw: NodeGateState | StateParseError | None, wait: Wait | None, starting: bool) -> NodeState:
    if isinstance(raw, StateParseError):
        return "failed"
    status = raw.status if raw is not None else "waiting"
    if status in ("complete", "in-progress", "failed"):
        return status
    if starting:
        return "starting"
    if wait is not None:
        return wait.status
    return "waiting"


def _active(name: str, compartment: str, state: NodeGateState, running: tuple[str, ...], now: datetime
            ) -> ActiveNode:
    since = parse_time(state.phase_since)
    seconds = max(0.0, (now - since).total_seconds()) if since is not None else None
    detail = ""
    left = soak_left(state.soak_until, now) if state.phase == "soak" else None
    if left is not None:
        detail = state.health_unreadable or ("" if left > 0 else "soak over, waiting for a health reading")
    elif state.pull_failing:
        detail = f"cannot pull: {state.pull_failing}"
    elif state.phase == "drain" and state.drain_blocked_by:
        detail = f"blocked by {state.drain_blocked_by}"
    elif state.phase == "interrupt" and state.interrupt is not None and not running:
        detail = state.interrupt.type
        if state.interrupt.services:
            detail += " " + ", ".join(state.interrupt.services)
    return ActiveNode(name, compartment, state.batch, state.phase, seconds, running, detail, left)


def _failed(name: str, compartment: str, raw: NodeGateState | StateParseError | None) -> FailedNode:
    if isinstance(raw, StateParseError):
        return FailedNode(name, compartment, None, "state", "StateCorrupt",
                          f"{raw}; `nodegate node reset {name}` starts the node afresh", False)
    failure = (raw.failure if raw is not None else None) or Failure(stage="unknown", reason="Failed")
    cordoned = raw.cordoned if raw is not None else False
    return FailedNode(name, compartment, failure.package, failure.stage, failure.reason,
                      failure_message(failure.message), cordoned)


def _summary(gate: NodeGate) -> str:
    if gate.status is not None and gate.status.status:
        return gate.status.status
    return "Paused" if gate.spec.paused else "Unknown"


def _unreadable(name: str, error: str) -> GateReport:
    return GateReport(name=name, summary="Unknown", matched=0, complete=0, generation=0, observed_generation=None,
                      policy=None, paused=False, compartments=(), active=(), failed=(), waits=(),
                      notes=(f"the object does not parse: {error}",))


def _without_plan(gate: NodeGate, fleet: Sequence[FleetNode], running: Mapping[tuple[str, str], tuple[str, ...]],
                  now: datetime, notes: list[str]) -> GateReport:
    """No policy, so no compartments: still show the nodes the gate already holds."""
    active, failed = [], []
    node_states: dict[str, NodeState] = {}
    for node in fleet:
        raw = node.states.get(gate.name)
        if raw is None:
            continue
        state = _node_state(raw, None, False)
        node_states[node.view.name] = state
        compartment = (raw.compartment or "") if isinstance(raw, NodeGateState) else ""
        if state == "in-progress" and isinstance(raw, NodeGateState):
            active.append(_active(node.view.name, compartment, raw, running.get((gate.name, node.view.name), ()), now))
        elif state == "failed":
            failed.append(_failed(node.view.name, compartment, raw))
    return GateReport(
        name=gate.name, summary=_summary(gate), matched=len(node_states),
        complete=sum(1 for s in node_states.values() if s == "complete"), generation=gate.metadata.generation or 0,
        observed_generation=gate.status.observed_generation if gate.status else None,
        policy=gate.spec.deployment_policy, paused=gate.spec.paused, compartments=(), active=tuple(active),
        failed=tuple(failed), waits=(), notes=tuple(notes), node_states=node_states, images=_images(gate),
    )


def _images(gate: NodeGate) -> tuple[ImageRecord, ...]:
    return tuple(gate.status.images) if gate.status is not None else ()


def progress_counts(report: GateReport) -> dict[str, int]:
    """Gate-wide counts by what the progress bar shows."""
    totals = _zero()
    for c in report.compartments:
        totals["complete"] += c.complete
        totals["in_progress"] += c.in_progress
        totals["failed"] += c.failed
        totals["waiting"] += c.waiting
    return totals
