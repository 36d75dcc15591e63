"""The readiness taint, in one home: when a node gets it, when it loses it, and both writes.

`nodegate.io/runtime-required:NoSchedule` says "a NodeGate has work to finish here before workloads
may come". Three places add it, all through this module: the admission webhook at a node's CREATE
(`join_patch`), the join backstop for a node the webhook missed (`gate.controller.nodes.JoinReconciler`)
and the fleet planner for a node that joined or rebooted before passing (`taint_reason`). It comes off
when the last readinessTaint gate selecting the node is done with it (`lifts`, for the node machine and
the plans of a deleted or disabled gate) or when no such gate selects it any longer (`orphan_taint`).
The node patch (`with_readiness_taint`, `without_readiness_taint`) and the webhook's JSON patch are
built here too. Pure: it reads the API models and wire objects, and writes nothing itself.

Only the taint with its effect counts (`has_readiness_taint`): a taint with NodeGate's key and another
effect is someone else's; the operator neither counts it as its own nor removes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Final, Protocol

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, StateParseError

READINESS_TAINT: Final[Mapping[str, str]] = {"key": keys.READINESS_TAINT_KEY, "effect": keys.READINESS_TAINT_EFFECT}


def _is_readiness_taint(taint: object) -> bool:
    if isinstance(taint, tuple):
        return taint == (keys.READINESS_TAINT_KEY, keys.READINESS_TAINT_EFFECT)
    return (isinstance(taint, dict) and taint.get("key") == keys.READINESS_TAINT_KEY
            and taint.get("effect") == keys.READINESS_TAINT_EFFECT)


def has_readiness_taint(taints: object) -> bool:
    """Whether `taints` hold the readiness taint, key and effect: a Node's `spec.taints` as sent (any
    value: admission reads objects that no schema checked yet) or a `NodeView`'s (key, effect) pairs."""
    return isinstance(taints, (list, tuple)) and any(_is_readiness_taint(t) for t in taints)


def node_taints(node: Obj) -> object:
    """A Node's `spec.taints`, as sent."""
    spec = node.get("spec")
    return spec.get("taints") if isinstance(spec, dict) else None


# -- the writes --------------------------------------------------------------------------------------

def with_readiness_taint(taints: list[Obj]) -> list[Obj] | None:
    """The node's taints with the readiness taint added, or None when it has it already."""
    return None if has_readiness_taint(taints) else [*taints, dict(READINESS_TAINT)]


def without_readiness_taint(taints: list[Obj]) -> list[Obj] | None:
    """The node's taints without the readiness taint, or None when it has none to lose."""
    return [t for t in taints if not _is_readiness_taint(t)] if has_readiness_taint(taints) else None


def join_patch(node: Obj, selected: Callable[[Mapping[str, str]], bool]) -> list[Obj]:
    """The admission webhook's JSON patch (RFC 6902 `add` operations) for a Node CREATE: the readiness
    taint when a readinessTaint gate selects the node's labels (`selected`: the gates' raw selectors,
    matched by the admission rules) and the node has no readiness taint yet, else nothing.

    The node's own `nodegate.io/ignore` label counts for nothing here: a node cannot opt itself out by
    registering with it. Only a holder of `bypass` may set it (the node-keys policy refuses anyone
    else's CREATE with it); such a node is tainted like any other, and the operator lifts the taint
    within seconds, since no gate selects an ignored node (`orphan_taint`). Failing closed costs an
    opted-out node a few seconds; failing open let any node skip every gate."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    labels = {str(k): str(v) for k, v in labels.items() if k != keys.IGNORE_LABEL} if isinstance(labels, dict) else {}
    if not selected(labels):
        return []
    spec = node.get("spec")
    if not isinstance(spec, dict):
        return [{"op": "add", "path": "/spec", "value": {"taints": [dict(READINESS_TAINT)]}}]
    taints = spec.get("taints")
    if not isinstance(taints, list):
        return [{"op": "add", "path": "/spec/taints", "value": [dict(READINESS_TAINT)]}]
    if has_readiness_taint(taints):
        return []
    return [{"op": "add", "path": "/spec/taints/-", "value": dict(READINESS_TAINT)}]


# -- the decisions -----------------------------------------------------------------------------------

class _View(Protocol):
    @property
    def taints(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def boot_id(self) -> str: ...


class Member(Protocol):
    """What the decisions read of a node (`gate.lifecycle.fleet.FleetNode`)."""

    @property
    def view(self) -> _View: ...
    @property
    def created(self) -> datetime | None: ...
    @property
    def states(self) -> Mapping[str, NodeGateState | StateParseError]: ...
    @property
    def ignored(self) -> bool: ...
    def selected_by(self, gate: NodeGate) -> bool: ...
    def matches(self, gate: NodeGate) -> bool: ...


def passed(state: NodeGateState | StateParseError | None) -> bool:
    """The node completed the gate once (it may be in a later round now: an upgrade, a reset)."""
    return isinstance(state, NodeGateState) and (state.status == "complete" or state.passed)


def taint_reason(gate: NodeGate, node: Member, state: NodeGateState | None, effective: NodeGateState | None,
                 gate_created: datetime | None) -> str | None:
    """Why a node the gate selects must get the readiness taint back, or None: it joined after the gate
    (the webhook may have missed it) or rebooted, and has not passed the gate yet. A node that passed
    once keeps serving through later rounds (an upgrade, a config change, a reset)."""
    if (not gate.spec.readiness_taint or has_readiness_taint(node.view.taints) or passed(state)
            or passed(effective)):
        return None
    if gate_created is not None and node.created is not None and node.created > gate_created:
        return "joined without it"
    if effective is not None and effective.boot_id and effective.boot_id != node.view.boot_id:
        return "rebooted before completing"
    return None


def readiness_clear(gate_name: str, node: Member, gates: Iterable[NodeGate]) -> bool:
    """Every *other* readinessTaint gate that selects the node is complete on it."""
    for other in gates:
        if other.name == gate_name or not other.spec.readiness_taint or not node.selected_by(other):
            continue
        if not passed(node.states.get(other.name)):
            return False
    return True


def lifts(gate: NodeGate, taints: tuple[tuple[str, str], ...], clear: bool) -> bool:
    """A readinessTaint gate that is done with a node (complete there, deleted, or disabled) takes the
    taint off when the node has it and every other readinessTaint gate selecting it is complete there
    (`clear`: `readiness_clear`)."""
    return gate.spec.readiness_taint and clear and has_readiness_taint(taints)


def orphan_taint(node: Member, gates: Iterable[NodeGate]) -> str | None:
    """Why the readiness taint must come off a node that no readinessTaint gate selects any longer, or
    None (no taint, or a gate still holds the node back). `gates`: the live, enabled gates
    (`World.all_gates`): a deleted or disabled gate holds no node back.

    The taint says "a NodeGate has work to finish here before workloads may come"; with no gate to
    finish it, nobody else may lift it (only the operator or a holder of `bypass` may), so a node
    relabelled out of its gate, ignored, or left by an edited, disabled or deleted gate would keep it
    for ever."""
    if not has_readiness_taint(node.view.taints):
        return None
    if any(g.spec.readiness_taint and node.selected_by(g) for g in gates):
        return None
    if node.ignored and any(g.spec.readiness_taint and node.matches(g) for g in gates):
        return f"the node is ignored ({keys.IGNORE_LABEL}=true), so no readinessTaint NodeGate holds it back"
    return "no readinessTaint NodeGate selects the node any longer"


