"""The whole rollout, simulated from a snapshot: what `nodegate plan` prints.

The simulation runs the real planner step by step (`plan_compartment`), assuming every node it
starts, and every node already running, succeeds. It looks past what only time or people change:
windows are treated as open, a pause or a stop as lifted (a stopped compartment is shown as it will
run after `nodegate resume`), and higher-priority gates as complete. Failed nodes stay failed, and
disrupted ones keep their share of the budget, as they would until someone fixes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.rollout.compartment import compartments_of
from gate.rollout.planner import Gating, Member, members_by_compartment, plan_compartment, previous_state, resume
from gate.rollout.snapshot import GateProgress, NodeSnapshot

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
    # Higher-priority gates are assumed complete, so none are passed in.
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
        # Each pass either starts at least one node or finishes the ones already running, so the
        # rollout ends within one pass per node plus one.
        for _ in range(len(current) + 1):
            step, _waits = plan_compartment(spec, current, state, gating)
            if not step.start and not step.running:
                break
            batch = step.status.batch
            started = set(step.start)
            current = [
                Member(m.name, GateProgress("complete", batch))
                if m.name in started
                else Member(m.name, GateProgress("complete", m.progress.batch))
                if m.progress.in_flight
                else m
                for m in current
            ]
            if step.start:
                batches.append(SimulatedBatch(batch, step.start, "planned"))
            state = step.status
        unplanned = tuple(
            m.name for m in current if not m.progress.finished and not m.progress.in_flight
        )
        simulated.append(
            SimulatedCompartment(
                spec.name,
                len(current),
                spec.budget.ceiling(len(current)),
                stopped,
                tuple(batches),
                unplanned,
            )
        )
    return Simulation(gate.name, tuple(simulated))


def _history(members: list[Member]) -> list[SimulatedBatch]:
    """Batches already picked, from the batch numbers recorded on the nodes (pick order within)."""
    by_number: dict[int, list[Member]] = {}
    for m in members:
        if m.progress.batch > 0 or m.progress.in_flight:
            by_number.setdefault(m.progress.batch, []).append(m)
    return [
        SimulatedBatch(
            number,
            tuple(m.name for m in group),
            "running" if any(m.progress.in_flight for m in group) else "done",
        )
        for number, group in sorted(by_number.items())
    ]
