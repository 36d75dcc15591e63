"""What the planner reads about nodes: labels, and each gate's recorded progress on them."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from gate.api.common import LabelSelector
from gate.api.keys import IGNORE_LABEL, NodeStatus


@dataclass(frozen=True)
class GateProgress:
    """A node's progress for one gate, as the operator recorded it on the node.

    `batch` is the number of the batch the node was picked into (0: never picked); the operator keeps
    it in the node's `state.<gate>` annotation. `disrupted` is the operator's own verdict: the gate
    holds the node out of service right now (work in progress, failed and still cordoned by NodeGate,
    or cordoned while its protected pods finish).
    """

    status: NodeStatus = "waiting"
    batch: int = 0
    disrupted: bool = False
    soaking: bool = False  # its round went through; it serves while it proves healthy (`gate.lifecycle.soak`)
    # Held for hand-off (spec.leaveCordoned, `gate.lifecycle.handoff`): out of service for its validator,
    # not for this rollout, so a round on it takes nothing from the budget of the nodes that serve.
    handed_off: bool = False

    @property
    def finished(self) -> bool:
        return self.status in ("complete", "failed")

    @property
    def in_flight(self) -> bool:
        """Picked and not finished. A picked node stays in its batch until it finishes, whatever
        its label says meanwhile; `in-progress` without a batch number (state written by hand or
        by an older operator) counts too, so it can never slip past the budget."""
        return not self.finished and not self.soaking and (self.batch > 0 or self.status == "in-progress")

    @property
    def held(self) -> bool:
        """Cordoned by the gate while its protected pods finish, before it is picked (the gate's
        `cordonWhileProtected`): out of service, so it counts against the ceiling, but in no batch."""
        return self.disrupted and not self.finished and not self.in_flight and not self.soaking

    @property
    def waiting(self) -> bool:
        """Not picked yet (or back in line): neither finished, nor in a round, nor soaking."""
        return not self.finished and not self.in_flight and not self.soaking

    @property
    def occupies_budget(self) -> bool:
        """Counts against the compartment's ceiling. In-flight nodes count even before the
        operator cordons them: the ceiling is reserved at pick time, not at cordon time. A node held for
        hand-off never counts: it serves nobody while it waits for its validator."""
        return (self.disrupted or self.in_flight) and not self.handed_off


NOT_STARTED = GateProgress()


def memo_match(memo: dict[Hashable, bool], selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """`selector.matches(labels)`, looked up in (and added to) `memo`, a memo for these labels."""
    hit = memo.get(selector.key)
    if hit is None:
        hit = memo[selector.key] = selector.matches(labels)
    return hit


@dataclass(frozen=True)
class NodeSnapshot:
    """One node as the operator saw it: name, labels, and progress per gate (by gate name).

    A gate missing from `gates` has not touched the node: its progress is `NOT_STARTED`.

    `matched` memoizes which selectors match the labels. The operator hands in one dict per node
    *version* (`gate.lifecycle.fleet.FleetNode.matched`), so the plans of a 5,000-node fleet match
    only the nodes that changed since the last plan: the gate's, its compartments' and the
    higher-priority gates' selectors were most of a plan's time.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gates: Mapping[str, GateProgress] = field(default_factory=dict)
    matched: dict[Hashable, bool] = field(default_factory=dict, compare=False, repr=False)

    def progress(self, gate: str) -> GateProgress:
        return self.gates.get(gate, NOT_STARTED)

    def matches(self, selector: LabelSelector) -> bool:
        return memo_match(self.matched, selector, self.labels)

    @property
    def ignored(self) -> bool:
        return self.labels.get(IGNORE_LABEL) == "true"
