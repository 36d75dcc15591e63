"""The whole rollout, simulated from a snapshot: what `nodegate plan` prints.

The simulation runs the planner's own decision (`decide`) step by step, assuming every node it
starts, and every node already running, succeeds. It looks past what only time or people change:
windows are treated as open, a pause or a stop as lifted (a stopped compartment is shown as it will
run after `nodegate resume`), and higher-priority gates as complete. Failed nodes stay failed, and
disrupted ones keep their share of the budget, as they would until someone fixes them.

Nodes are counted once; each step then only updates the counts, so simulating thousands of batches
of one node costs about as much as planning once per batch would cost for a single node.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.rollout.compartment import compartments_of
from gate.rollout.planner import (
    BatchTally,
    CompartmentPlan,
    CompartmentView,
    Gating,
    Member,
    decide,
    members_by_compartment,
    previous_state,
    resume,
    tally,
)
from gate.rollout.snapshot import NodeSnapshot

BatchPhase = Literal["done", "running", "planned"]


@dataclass(frozen=True)
class SimulatedBatch:
    number: int
    nodes: tuple[str, ...]
    phase: BatchPhase


@dataclass(frozen=True)
class SimulatedCompartment:
    """`batches` in order: those already done or running (from the nodes' batch numbers), then the
    planned ones. `unplanned` nodes are never reached, e.g. because failed nodes that stay cordoned
    fill the budget."""

    name: str
    matched: int
    ceiling: int
    stopped: bool
    batches: tuple[SimulatedBatch, ...]
    unplanned: tuple[str, ...]


@dataclass(frozen=True)
class Simulation:
    gate: str
    compartments: tuple[SimulatedCompartment, ...]


def simulate(
    gate: NodeGate, policy: DeploymentPolicy | None, nodes: Iterable[NodeSnapshot]
) -> Simulation:
    """Every batch of every compartment of `gate`, past and future, assuming all nodes succeed."""
    specs = compartments_of(gate, policy)
    # Higher-priority gates are assumed complete, so none are passed in: every waiting node is
    # eligible, and `waiting` and `eligible` hold the same nodes in the same order.
    members = members_by_compartment(gate, specs, list(nodes), ())
    previous = previous_state(gate)
    gating = Gating(gate.name, paused=False, window_open=True, windows_configured=False, sequencing="node")
    simulated = []
    for spec in specs:
        current = members[spec.name]
        state = previous.get(spec.name)
        stopped = state is not None and state.state == "stopped"
        if state is not None:
            state = resume([state])[0]
        batches = _history(current)
        counted = tally(current)
        view = CompartmentView(
            counted.matched, counted.complete, counted.failed, counted.occupied, counted.running,
            deque(counted.waiting), deque(counted.eligible), counted.batches, soaking=counted.soaking,
        )
        batch_of = {m.name: m.progress.batch for m in current}
        # Each pass either starts at least one node or finishes the ones already running or soaking
        # (a pass that starts none follows one that did), so the rollout ends within two passes per
        # node plus two.
        for _ in range(2 * len(current) + 2):
            step, _waits = decide(spec, view, state, gating, explain=False)
            if not step.start and not step.running and not step.soaking:
                break
            if step.start and batches and batches[-1].number == step.status.batch:
                # Under `health` a batch fills over several passes as the budget frees.
                last = batches.pop()
                batches.append(SimulatedBatch(last.number, last.nodes + step.start, last.phase))
            elif step.start:
                batches.append(SimulatedBatch(step.status.batch, step.start, "planned"))
            view = _all_succeed(view, step, batch_of)
            state = step.status
        simulated.append(
            SimulatedCompartment(
                spec.name,
                len(current),
                spec.budget.ceiling(len(current)),
                stopped,
                tuple(batches),
                tuple(m.name for m in view.waiting),
            )
        )
    return Simulation(gate.name, tuple(simulated))


def _all_succeed(view: CompartmentView, step: CompartmentPlan, batch_of: Mapping[str, int]) -> CompartmentView:
    """The counts after the running nodes and the ones `step` started all completed."""
    batches = dict(view.batches)
    for name in (*step.running, *step.soaking):
        if (number := batch_of[name]) > 0:
            b = batches[number]
            batches[number] = BatchTally(b.size, b.finished + 1, b.successes + 1)
    take = len(step.start)
    if take:
        b = batches.get(step.status.batch, BatchTally(0, 0, 0))
        batches[step.status.batch] = BatchTally(b.size + take, b.finished + take, b.successes + take)
    # The started nodes are the front of both queues (see `simulate`); the previous view is
    # dropped, so consuming its queues in place is safe and keeps each step O(batch).
    assert isinstance(view.waiting, deque) and isinstance(view.eligible, deque)
    for _ in range(take):
        view.waiting.popleft()
        view.eligible.popleft()
    return CompartmentView(
        matched=view.matched,
        complete=view.complete + len(step.running) + len(step.soaking) + take,
        failed=view.failed,
        occupied=view.occupied - len(step.running),
        running=(),
        waiting=view.waiting,
        eligible=view.eligible,
        batches=batches,
    )


def _history(members: list[Member]) -> list[SimulatedBatch]:
    """Batches already picked, from the batch numbers recorded on the nodes (pick order within)."""
    by_number: dict[int, list[Member]] = {}
    for m in members:
        if m.progress.batch > 0 or m.progress.in_flight or m.progress.soaking:
            by_number.setdefault(m.progress.batch, []).append(m)
    return [
        SimulatedBatch(
            number,
            tuple(m.name for m in group),
            "running" if any(m.progress.in_flight or m.progress.soaking for m in group) else "done",
        )
        for number, group in sorted(by_number.items())
    ]
