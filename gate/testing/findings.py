"""What the invariant checker reports: the violations it found, and how much each invariant was
exercised (`Coverage`: a check that never ran proves nothing). The invariants themselves are
defined in `gate.testing.invariants`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

ViolationKind = Literal["over-ceiling", "uncordoned-during-stage", "interrupt-uncordoned", "taint-lifted-early",
                        "duplicate-stage", "left-cordoned", "left-tainted", "hold-unasked"]


VIOLATION_KINDS: tuple[ViolationKind, ...] = (
    "over-ceiling", "uncordoned-during-stage", "interrupt-uncordoned", "taint-lifted-early", "duplicate-stage",
    "left-cordoned", "left-tainted", "hold-unasked")


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    gate: str
    node: str | None  # None when a compartment as a whole is at fault
    rv: int  # the revision at which it was seen
    message: str

    def __str__(self) -> str:
        where = f" node {self.node}" if self.node else ""
        return f"[{self.kind}] gate {self.gate}{where} at rv {self.rv}: {self.message}"


@dataclass
class Peak:
    disrupted: int = 0
    ceiling: int = 0
    matched: int = 0


@dataclass
class Coverage:
    """How much each invariant was exercised: a check that never ran proves nothing."""

    node_events: int = 0
    pod_events: int = 0
    relists: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    disruptions_judged: int = 0  # nodes becoming disrupted, each judged against its ceiling
    uncordons_judged: int = 0
    interrupts_judged: int = 0
    taint_lifts_judged: int = 0
    pods_seen: int = 0
    steps_seen: int = 0
    unverified: int = 0  # transitions inside blind windows that could not be judged
    peaks: dict[tuple[str, str], Peak] = field(default_factory=dict)

    def summary(self) -> str:
        relists = ", ".join(f"{k} {v}" for k, v in sorted(self.relists.items())) or "none"
        return (f"{self.node_events} node and {self.pod_events} pod events; {self.disruptions_judged} disruptions, "
                f"{self.uncordons_judged} uncordons, {self.interrupts_judged} interrupts, "
                f"{self.taint_lifts_judged} taint removals and {self.pods_seen} pods ({self.steps_seen} steps) "
                f"judged; "
                f"relists: {relists}; unverified in blind windows: {self.unverified}")
