"""Ordering across gates: `priority` (lower first) and `sequencing`.

Only gates with a strictly lower priority number hold a gate back; gates of equal priority roll out
independently of each other (sorting them by name would invent an order nobody asked for; names are
used only to list blockers in a stable order).

* `sequencing: node` — a node waits while any higher-priority gate that selects it is not complete on
  it. Other nodes of the same gate go ahead.
* `sequencing: all` — the whole gate waits while any higher-priority gate is not complete on every
  node that gate selects.

"Complete" means status `complete`: a failed or paused higher-priority gate holds lower ones back
until a person fixes the node or opts it out with `nodegate.io/ignore=true`. Nodes already picked
into a batch are never held back: their work has begun and finishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gate.api.nodegate import NodeGate
from gate.rollout.snapshot import NodeSnapshot


def selects(gate: NodeGate, node: NodeSnapshot) -> bool:
    """The gate's selector matches and the node has not opted out."""
    return not node.ignored and node.matches(gate.spec.node_selector)


def higher_priority(gate: NodeGate, gates: Iterable[NodeGate]) -> tuple[NodeGate, ...]:
    """Gates that must go first, by (priority, name); `gate` itself is skipped if present."""
    first = {g.name: g for g in gates if g.name != gate.name and g.spec.priority < gate.spec.priority}
    return tuple(sorted(first.values(), key=lambda g: (g.spec.priority, g.name)))


def blockers(
    gate: NodeGate, gates: Iterable[NodeGate], nodes: Sequence[NodeSnapshot]
) -> Mapping[str, tuple[str, ...]]:
    """Node name -> higher-priority gates it waits for (only nodes that wait appear)."""
    ahead = higher_priority(gate, gates)
    if not ahead:
        return {}
    if gate.spec.sequencing == "all":
        unfinished = tuple(
            h.name
            for h in ahead
            if any(selects(h, n) and n.progress(h.name).status != "complete" for n in nodes)
        )
        return {n.name: unfinished for n in nodes} if unfinished else {}
    waiting: dict[str, tuple[str, ...]] = {}
    for node in nodes:
        pending = tuple(h.name for h in ahead if selects(h, node) and node.progress(h.name).status != "complete")
        if pending:
            waiting[node.name] = pending
    return waiting
