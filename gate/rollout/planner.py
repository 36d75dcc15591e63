"""The planner: one pure step of a gate's rollout, from a snapshot to what to start now.

See the package docstring (`gate.rollout`) for the rules; this module applies them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Literal

from gate.api.keys import NodeStatus
from gate.api.nodegate import CompartmentRollback, CompartmentStatus, NodeGate
from gate.api.policy import DeploymentPolicy
from gate.rollout.compartment import CompartmentSpec, assign_compartment, compartments_of
from gate.rollout.order import order_key
from gate.rollout.priority import blockers, selects
from gate.rollout.snapshot import GateProgress, NodeSnapshot
from gate.rollout.strategy import close_batch
from gate.rollout.window import require_aware, windows_open

WaitReason = Literal["stopped", "paused", "priority", "protected-pods", "outside-window", "batch-running",
                     "batch-soaking", "budget-full", "queued"]
"""Why a node that has not started does not start now, most fundamental first:

* stopped        — its compartment hit failureThreshold; a person must resume it
* paused         — the gate is paused
* priority       — a higher-priority gate is not complete yet (`Wait.gates` names them)
* protected-pods — pods matching the gate's podNonInterruptLabels still run on it (`Wait.pods` names
                   them): it is not picked while they run, so a long job holds back only its own node
* outside-window — no maintenance window is open
* batch-running  — the compartment's current batch has not finished (batches are sticky)
* batch-soaking  — the current batch's nodes finished their rounds but not yet their soak
* budget-full    — disrupted nodes already fill the ceiling (e.g. failed nodes still cordoned)
* queued         — a batch started now without it; it goes in a later batch
"""

_BLOCKING: frozenset[WaitReason] = frozenset({"stopped", "priority", "protected-pods"})


@dataclass(frozen=True)
class Wait:
    """Why one node does not start now, for its status label, `kubectl describe` and the CLI."""

    compartment: str
    reason: WaitReason
    message: str
    gates: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()  # protected-pods: the pods ("namespace/name") it waits for

    @property
    def status(self) -> NodeStatus:
        """The node's status label: `blocked` needs something outside the rollout's own pace
        (a person, another gate, a workload's job to end); `waiting` clears by itself as the rollout
        proceeds."""
        return "blocked" if self.reason in _BLOCKING else "waiting"


@dataclass(frozen=True)
class Start:
    """Start `node` now, recording `batch` on it (in its state annotation) in the same write."""

    node: str
    compartment: str
    batch: int


@dataclass(frozen=True)
class ClosedBatch:
    """A batch this plan judged because all its nodes finished: for Events and metrics."""

    number: int
    size: int
    successes: int
    good: bool


@dataclass(frozen=True)
class CompartmentPlan:
    """One compartment's outcome.

    `status` is the new durable state plus counts, counted as if `start` had been performed: write
    it into `NodeGate.status.compartments`. Its `batch` is the batch running, or between batches the
    number the next batch will get; `batchSize` is that batch's size (planned, until it is picked).
    """

    status: CompartmentStatus
    start: tuple[str, ...]
    running: tuple[str, ...]
    closed: tuple[ClosedBatch, ...]
    stopped_now: bool
    hold: tuple[str, ...] = ()  # cordon now, unpicked, while their protected pods finish
    release: tuple[str, ...] = ()  # held nodes to uncordon: the gate no longer cordons while protected
    soaking: tuple[str, ...] = ()  # nodes of the open batch proving healthy after their round

    @property
    def name(self) -> str:
        return self.status.name


@dataclass(frozen=True)
class Plan:
    """What one reconcile of a gate should do. Nodes not mentioned keep what they have."""

    gate: str
    compartments: tuple[CompartmentPlan, ...]
    assignment: Mapping[str, str]
    waits: Mapping[str, Wait]
    window_open: bool

    @property
    def starts(self) -> tuple[Start, ...]:
        return tuple(
            Start(node, c.name, c.status.batch) for c in self.compartments for node in c.start
        )

    @property
    def holds(self) -> tuple[str, ...]:
        return tuple(node for c in self.compartments for node in c.hold)

    @property
    def releases(self) -> tuple[str, ...]:
        return tuple(node for c in self.compartments for node in c.release)

    def statuses(self) -> list[CompartmentStatus]:
        return [c.status for c in self.compartments]

    def compartment(self, name: str) -> CompartmentPlan:
        for c in self.compartments:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True)
class Member:
    """A node of a compartment, with the higher-priority gates it waits for."""

    name: str
    progress: GateProgress
    blockers: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()  # its protected pods still running ("namespace/name")


@dataclass(frozen=True)
class Gating:
    """Gate-wide conditions a compartment obeys."""

    gate: str
    paused: bool
    window_open: bool
    windows_configured: bool
    sequencing: str
    cordon_protected: bool = False


def plan(
    gate: NodeGate,
    policy: DeploymentPolicy | None,
    nodes: Iterable[NodeSnapshot],
    *,
    now: datetime,
    gates: Iterable[NodeGate] = (),
    protected: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
    """Decide which nodes of `gate` start now.

    `policy` is the DeploymentPolicy the gate names (None when it names none); `nodes` is every node
    of the cluster with each gate's progress on it; `gates` is every NodeGate (for priorities; the
    planned gate may be among them); the previous durable state is `gate.status.compartments`;
    `now` must be timezone-aware; `protected` names, per node, the pods matching the gate's
    podNonInterruptLabels that still run there (nodes without any may be left out). Raises
    PolicyMismatch when `policy` is not the one the gate names.
    """
    require_aware(now)
    specs = compartments_of(gate, policy)
    windows = policy.spec.windows if policy is not None else []
    gating = Gating(
        gate=gate.name,
        paused=gate.spec.paused,
        window_open=windows_open(windows, now),
        windows_configured=bool(windows),
        sequencing=gate.spec.sequencing,
        cordon_protected=gate.spec.cordon_while_protected,
    )
    members = members_by_compartment(gate, specs, list(nodes), gates, protected or {})
    previous = previous_state(gate)
    planned: list[CompartmentPlan] = []
    waits: dict[str, Wait] = {}
    assignment: dict[str, str] = {}
    for spec in specs:
        compartment, compartment_waits = plan_compartment(spec, members[spec.name], previous.get(spec.name), gating)
        planned.append(compartment)
        waits.update(compartment_waits)
        assignment.update((m.name, spec.name) for m in members[spec.name])
    return Plan(gate.name, tuple(planned), assignment, waits, gating.window_open)


def resume(
    compartments: Sequence[CompartmentStatus], names: Collection[str] | None = None
) -> list[CompartmentStatus]:
    """Clear the stop of the named compartments (all when `names` is None).

    The operator calls it on `nodegate resume` and on a spec change, then writes the result to
    `status.compartments`. The run of failures restarts at 0, so the next failed batch does not stop
    the compartment again at once; the next batch keeps the (shrunk) size planned before the stop.
    """
    resumed = []
    for c in compartments:
        if c.state == "stopped" and (names is None or c.name in names):
            c = c.model_copy(update={"state": "waiting", "consecutive_failures": 0, "rollback": None})
        resumed.append(c)
    return resumed


def previous_state(gate: NodeGate) -> dict[str, CompartmentStatus]:
    return {c.name: c for c in gate.status.compartments} if gate.status is not None else {}


def members_by_compartment(
    gate: NodeGate, specs: Sequence[CompartmentSpec], nodes: Sequence[NodeSnapshot], gates: Iterable[NodeGate],
    protected: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, list[Member]]:
    """Each compartment's nodes in pick order.

    A node belongs to the gate while the gate selects it, and also while the gate still holds it
    (in flight or disrupted) after its labels changed: otherwise relabelling a node mid-batch would
    free budget that is still in use.
    """
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise ValueError(f"node {node.name} appears twice in the snapshot")
        seen.add(node.name)
    held = blockers(gate, gates, nodes)
    running = protected or {}
    members: dict[str, list[Member]] = {spec.name: [] for spec in specs}
    for node in sorted(nodes, key=lambda n: order_key(n.name)):
        progress = node.progress(gate.name)
        if selects(gate, node) or progress.occupies_budget:
            compartment = assign_compartment(specs, node.labels, matches=node.matches)
            pods = tuple(running.get(node.name, ())) if not progress.finished and not progress.in_flight else ()
            members[compartment].append(Member(node.name, progress, held.get(node.name, ()), pods))
    return members


@dataclass(frozen=True)
class BatchTally:
    """How far one batch got: it closes when every node in it finished."""

    size: int
    finished: int
    successes: int


@dataclass(frozen=True)
class CompartmentView:
    """What the decision needs to know about a compartment's nodes, counted once.

    `waiting` (not picked, not finished) and `eligible` (waiting, not held by a higher-priority
    gate, no protected pod running) are in pick order; `decide` only iterates them from the front, so
    a simulation can hand in queues it consumes as it goes. `protected` are the waiting nodes that
    only their protected pods keep from being eligible; `held` names the waiting nodes the gate has
    cordoned while their protected pods finish (they are counted in `occupied` already).
    """

    matched: int
    complete: int
    failed: int
    occupied: int
    running: tuple[str, ...]
    waiting: Collection[Member]
    eligible: Collection[str]
    batches: Mapping[int, BatchTally]
    protected: Sequence[Member] = ()
    held: frozenset[str] = frozenset()
    soaking: tuple[str, ...] = ()


def tally(members: Sequence[Member]) -> CompartmentView:
    """Count a compartment's nodes; `members` must be in pick order (see gate.rollout.order)."""
    batches: dict[int, BatchTally] = {}
    for m in members:
        if m.progress.batch > 0:
            b = batches.get(m.progress.batch, BatchTally(0, 0, 0))
            batches[m.progress.batch] = BatchTally(
                b.size + 1,
                b.finished + m.progress.finished,
                b.successes + (m.progress.status == "complete"),
            )
    waiting = [m for m in members if m.progress.waiting]
    return CompartmentView(
        matched=len(members),
        complete=sum(1 for m in members if m.progress.status == "complete"),
        failed=sum(1 for m in members if m.progress.status == "failed"),
        occupied=sum(1 for m in members if m.progress.occupies_budget),
        running=tuple(m.name for m in members if m.progress.in_flight),
        waiting=waiting,
        eligible=[m.name for m in waiting if not m.blockers and not m.protected],
        batches=batches,
        protected=[m for m in waiting if not m.blockers and m.protected],
        held=frozenset(m.name for m in waiting if m.progress.held),
        soaking=tuple(m.name for m in members if m.progress.soaking),
    )


def plan_compartment(
    spec: CompartmentSpec, members: Sequence[Member], previous: CompartmentStatus | None, gating: Gating
) -> tuple[CompartmentPlan, dict[str, Wait]]:
    """One compartment's step: close finished batches, then maybe pick the next batch."""
    return decide(spec, tally(members), previous, gating)


def decide(
    spec: CompartmentSpec,
    view: CompartmentView,
    previous: CompartmentStatus | None,
    gating: Gating,
    *,
    explain: bool = True,
) -> tuple[CompartmentPlan, dict[str, Wait]]:
    """The decision proper, on counts: costs O(batch size), plus O(waiting nodes) when `explain`
    asks for every waiting node's reason, so a simulation of thousands of batches stays linear."""
    matched = view.matched
    ceiling = spec.budget.ceiling(matched)
    strategy = spec.strategy_for(ceiling)
    prev = previous if previous is not None else CompartmentStatus(name=spec.name)
    was_stopped = prev.state == "stopped"
    failures = prev.consecutive_failures
    if prev.batch <= 0:
        batch, size = 1, strategy.params.initial_batch
    else:
        # batchSize 0 means "start this rollout afresh" (the operator writes it after a spec change):
        # the next batch is the strategy's initial one, whatever the last rollout grew to.
        batch, size = prev.batch, prev.batch_size if prev.batch_size > 0 else strategy.params.initial_batch

    # `batch` is closed exactly when the stored number moves past it, so judging a batch twice is
    # impossible. Normally at most one batch closes per call; more close only when the status was
    # lost and the history is replayed from the batch numbers on the nodes.
    # With `health`, a node leaves the budget when its round ends and soaks while serving, so a batch
    # is no longer bounded by the ceiling: it fills in pick order as slots free, up to its planned
    # size, and is judged once it is full (or nothing is left to put in it) and every node of it
    # finished, its soak included. Without `health` a batch is picked whole, within the room.
    filling = spec.health is not None
    closed: list[ClosedBatch] = []
    stop = False
    rollback: CompartmentRollback | None = None
    while ((current := view.batches.get(batch)) is not None and current.finished == current.size
           and (not filling or current.size >= size or not view.eligible or (batch + 1) in view.batches)):
        result = close_batch(
            strategy,
            size=current.size,
            successes=current.successes,
            complete=view.complete,
            matched=matched,
            consecutive_failures=failures,
        )
        closed.append(ClosedBatch(batch, current.size, current.successes, result.good))
        failures = result.consecutive_failures
        # Only the newest closure decides: in a replay, later batches ran, so a person had resumed.
        stop = result.stop
        # Under `rollback`, a failed batch stops the compartment at once: its nodes go back first.
        rollback = CompartmentRollback(batch=batch) if spec.rollback and not result.good else None
        stop = stop or rollback is not None
        batch += 1
        size = result.next_size
    stopped = was_stopped or stop

    running = view.running
    room = ceiling - view.occupied
    start: tuple[str, ...] = ()
    spent = 0  # budget the picks take: a held node is counted in `occupied` already
    may_start = not stopped and not gating.paused and gating.window_open
    have = 0
    if filling and (open_batch := view.batches.get(batch)) is not None:
        have = open_batch.size
    if may_start and (filling or not running):
        picked: list[str] = []
        for name in islice(view.eligible, max(0, size - have)):
            cost = 0 if name in view.held else 1
            if spent + cost > room:
                break
            picked.append(name)
            spent += cost
        if picked:
            start = tuple(picked)
            if not filling:
                size = len(picked)
    if filling and have + len(view.eligible) > 0:
        size = min(size, have + len(view.eligible))  # a batch never waits for nodes that are not there
    hold, release = _holds(view, start, room - spent, may_start, gating)

    waits: dict[str, Wait] = {}
    if explain:
        started = set(start)
        waits = {
            m.name: _wait(m, spec.name, batch, stopped, failures, view.occupied + len(hold) - len(release),
                          ceiling, running, gating, held=m.name in view.held or m.name in hold,
                          soaking=view.soaking, filling=filling and have + len(start) < size)
            for m in view.waiting
            if m.name not in started
        }

    state: Literal["waiting", "rolling", "complete", "stopped", "outside-window"]
    if stopped:
        state = "stopped"
    elif not view.waiting and not running:
        state = "complete"  # every node finished; failures show in `failed`
    elif running or start or view.soaking:
        state = "rolling"
    elif gating.windows_configured and not gating.window_open:
        state = "outside-window"
    else:
        state = "waiting"

    status = CompartmentStatus(
        name=spec.name,
        matched=matched,
        ceiling=ceiling,
        in_progress=view.occupied + spent + len(hold) - len(release),
        complete=view.complete,
        failed=view.failed,
        soaking=len(view.soaking),
        batch=batch,
        batch_size=size,
        consecutive_failures=failures,
        state=state,
        # The roll-back stays recorded while the compartment stays stopped; a resume or a new spec ends it.
        rollback=rollback if stop else (prev.rollback if stopped else None),
    )
    return (CompartmentPlan(status, start, running, tuple(closed), stopped and not was_stopped, hold, release,
                            view.soaking), waits)


def _holds(view: CompartmentView, start: tuple[str, ...], room: int, may_start: bool,
           gating: Gating) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Which nodes to cordon now while their protected pods finish, and which held ones to let go.

    Only with `cordonWhileProtected`, only where nodes may start (not stopped, paused or outside a
    window), and only once every node free of protected pods has started (none is left in
    `eligible` beyond `start`): holding a node takes budget, and a free node must never wait for a
    held one. Holds take what budget is left, in pick order, so the ceiling still bounds every
    node the gate has cordoned. Without the setting (it was turned off, or a failed round left
    the node cordoned and protected pods run there now), held nodes with protected pods running are
    let go; one whose pods ended keeps its cordon and starts in its turn, at no cost to the budget."""
    if not gating.cordon_protected:
        return (), tuple(m.name for m in view.waiting if m.protected and m.name in view.held)
    if not may_start or room <= 0 or len(start) < len(view.eligible):
        return (), ()
    fresh = (m.name for m in view.protected if m.name not in view.held)
    return tuple(islice(fresh, room)), ()


def _wait(
    member: Member,
    compartment: str,
    batch: int,
    stopped: bool,
    failures: int,
    occupied: int,
    ceiling: int,
    running: tuple[str, ...],
    gating: Gating,
    *,
    held: bool = False,
    soaking: tuple[str, ...] = (),
    filling: bool = False,
) -> Wait:
    if stopped:
        return Wait(
            compartment,
            "stopped",
            f"compartment {compartment} stopped after {failures} failed batches in a row; "
            f"run `nodegate resume {gating.gate}` to continue",
        )
    if gating.paused:
        return Wait(compartment, "paused", f"gate {gating.gate} is paused")
    if member.blockers:
        where = "on this node" if gating.sequencing == "node" else "on all their nodes"
        names = ", ".join(member.blockers)
        return Wait(
            compartment,
            "priority",
            f"waits for higher-priority gate {names} to complete {where}",
            member.blockers,
        )
    if member.protected:
        names = ", ".join(member.protected[:5]) + (f" and {len(member.protected) - 5} more"
                                                    if len(member.protected) > 5 else "")
        how = "cordoned by the gate, it waits" if held else "not picked while they run; it waits"
        return Wait(compartment, "protected-pods", f"{how} for its protected pods to finish: {names}",
                    pods=member.protected)
    if not gating.window_open:
        return Wait(compartment, "outside-window", "no maintenance window is open")
    if filling and occupied >= ceiling:
        return Wait(
            compartment,
            "budget-full",
            f"budget of {compartment} is full: {occupied} of at most {ceiling} nodes disrupted",
        )
    if running:
        return Wait(compartment, "batch-running", f"waits for batch {batch} of {compartment} to finish")
    if soaking:
        return Wait(compartment, "batch-soaking", f"waits for batch {batch} of {compartment} to pass its soak "
                    f"({len(soaking)} node(s) soaking)")
    if occupied >= ceiling:
        return Wait(
            compartment,
            "budget-full",
            f"budget of {compartment} is full: {occupied} of at most {ceiling} nodes disrupted",
        )
    return Wait(compartment, "queued", f"queued for a later batch of {compartment}")
