"""Small builders for rollout tests, and a fake operator that performs plans on an in-memory fleet.

The fake operator persists only what the real one would (the compartment statuses through their wire
form, the batch number on each node), so every plan it asks for is a plan "after a restart".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gate.api.nodegate import CompartmentStatus, NodeGate
from gate.api.policy import DeploymentPolicy
from gate.rollout import GateProgress, NodeSnapshot, Plan, plan

# Monday 2025-01-06 12:00 UTC: inside any window that is not configured at all.
NOW = datetime(2025, 1, 6, 12, 0, tzinfo=UTC)


def make_gate(
    name: str = "g",
    *,
    selector: Mapping[str, str] | None = None,
    policy: str | None = None,
    budget: Mapping[str, int] | None = None,
    priority: int = 200,
    sequencing: str = "node",
    paused: bool = False,
    compartments: Iterable[CompartmentStatus] = (),
) -> NodeGate:
    spec: dict[str, Any] = {"priority": priority, "sequencing": sequencing, "paused": paused}
    if selector is not None:
        spec["nodeSelector"] = {"matchLabels": dict(selector)}
    if policy is not None:
        spec["deploymentPolicy"] = policy
    if budget is not None:
        spec["interruptionBudget"] = dict(budget)
    status = {"compartments": [c.to_wire() for c in compartments]}
    return NodeGate.model_validate({"metadata": {"name": name}, "spec": spec, "status": status})


def compartment(name: str, selector: Mapping[str, Any], budget: Mapping[str, int], strategy: Mapping[str, Any]
                ) -> dict[str, Any]:
    return {"name": name, "selector": dict(selector), "budget": dict(budget), "strategy": dict(strategy)}


def make_policy(
    name: str = "p",
    *,
    compartments: Iterable[Mapping[str, Any]] = (),
    default_budget: Mapping[str, int] | None = None,
    default_strategy: Mapping[str, Any] | None = None,
    windows: Iterable[Mapping[str, Any]] = (),
) -> DeploymentPolicy:
    default: dict[str, Any] = {}
    if default_budget is not None:
        default["budget"] = dict(default_budget)
    if default_strategy is not None:
        default["strategy"] = dict(default_strategy)
    spec = {"default": default, "compartments": list(compartments), "windows": list(windows)}
    return DeploymentPolicy.model_validate({"metadata": {"name": name}, "spec": spec})


def fixed(initial: int, **extra: Any) -> dict[str, Any]:
    return {"fixed": {"initialBatch": initial, **extra}}


def linear(initial: int, delta: int, **extra: Any) -> dict[str, Any]:
    return {"linear": {"initialBatch": initial, "delta": delta, **extra}}


def exponential(initial: int, factor: int, **extra: Any) -> dict[str, Any]:
    return {"exponential": {"initialBatch": initial, "growthFactor": factor, **extra}}


def running(batch: int) -> GateProgress:
    return GateProgress("in-progress", batch, disrupted=True)


def done(batch: int) -> GateProgress:
    return GateProgress("complete", batch)


def failed(batch: int, *, cordoned: bool = False) -> GateProgress:
    return GateProgress("failed", batch, disrupted=cordoned)


@dataclass
class Fleet:
    """An in-memory cluster for one gate, driven by plans like the operator drives nodes."""

    gate: NodeGate
    policy: DeploymentPolicy | None
    labels: dict[str, dict[str, str]]
    progress: dict[str, GateProgress] = field(default_factory=dict)
    others: dict[str, dict[str, GateProgress]] = field(default_factory=dict)
    gates: tuple[NodeGate, ...] = ()

    @classmethod
    def of(cls, gate: NodeGate, policy: DeploymentPolicy | None, labels: Mapping[str, Mapping[str, str]]) -> Fleet:
        return cls(gate, policy, {n: dict(lbl) for n, lbl in labels.items()})

    def snapshot(self) -> list[NodeSnapshot]:
        return [
            NodeSnapshot(
                name,
                labels,
                {self.gate.name: self.progress.get(name, GateProgress()), **self.others.get(name, {})},
            )
            for name, labels in self.labels.items()
        ]

    def plan(self, now: datetime = NOW) -> Plan:
        return plan(self.gate, self.policy, self.snapshot(), now=now, gates=self.gates)

    def step(self, now: datetime = NOW) -> Plan:
        """Plan, then do what a well-behaved operator does: record statuses, start the picked nodes."""
        result = self.plan(now)
        self.persist(result.statuses())
        for start in result.starts:
            self.progress[start.node] = running(start.batch)
        return result

    def persist(self, statuses: Iterable[CompartmentStatus]) -> None:
        # Through the wire form, as the API server would store it: nothing survives that is not in it.
        wire = {**self.gate.to_wire(), "status": {"compartments": [s.to_wire() for s in statuses]}}
        self.gate = NodeGate.model_validate(wire)

    def statuses(self) -> dict[str, CompartmentStatus]:
        status = self.gate.status
        return {c.name: c for c in status.compartments} if status is not None else {}

    def finish(self, node: str, *, ok: bool, keep_cordoned: bool = False) -> None:
        batch = self.progress[node].batch
        self.progress[node] = done(batch) if ok else failed(batch, cordoned=keep_cordoned)

    def in_flight(self) -> list[str]:
        return [n for n, p in self.progress.items() if p.in_flight]

    def finish_all(self, *, ok: bool = True) -> None:
        for node in self.in_flight():
            self.finish(node, ok=ok)
