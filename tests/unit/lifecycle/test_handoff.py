"""The onboarding hand-off (spec.leaveCordoned): pure decisions and the one node write that carries them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.controller.patches import node_patch
from gate.lifecycle.fleet import FleetNode, NodeUpdate, hold_asked_by, progress_of
from gate.lifecycle.handoff import held, release_noticed
from gate.lifecycle.machine import decide
from gate.lifecycle.node import Decision, NodeContext
from gate.lifecycle.taint import has_readiness_taint
from tests.unit.lifecycle.test_machine import PKG, ctx, node, run_until_quiet, started

TAINT = ((keys.READINESS_TAINT_KEY, "NoSchedule"),)
REBOOT = {"k": {**PKG, "interrupt": {"type": "reboot"}}}


def gate(name: str = "g", packages: dict[str, object] | None = None, **spec: object) -> NodeGate:
    return NodeGate.model_validate({"metadata": {"name": name, "generation": 1},
                                    "spec": {"packages": packages or {"k": PKG}, **spec}})


def asking(name: str = "g") -> object:
    def decider(c: NodeContext) -> Decision:
        return decide(replace(c, hold_asked_by=name))
    return decider


def last_round(g: NodeGate, *, cordoned: bool = False, **kw: object) -> Decision:
    """The decision that ends a round and lifts the taint of a joining node."""
    final = started(g).model_copy(update={"phase": "finish", "cordoned": cordoned})
    return decide(replace(ctx(g, final, n=node(taints=TAINT, **kw)), hold_asked_by="g"))


def test_the_taint_lift_and_the_cordon_are_one_node_patch() -> None:
    # The operator killed between the lift and the cordon: there is no such moment, as both are one request.
    g = gate(packages=REBOOT, readinessTaint=True, leaveCordoned=True)
    state, _, view = run_until_quiet(g, started(g), n=node(taints=TAINT), decider=asking())  # type: ignore[arg-type]
    assert state.status == "complete" and not has_readiness_taint(view.taints)
    assert view.unschedulable, "a joining node of a gate asking for the hand-off was let into service"
    d = last_round(g, cordoned=True, unschedulable=True, annotations={keys.CORDONED_BY: "g"})
    assert d.node.remove_readiness_taint and d.node.unschedulable is True and d.node.held_by == "g"
    reasons = [e.reason for e in d.events]
    assert "HeldForHandOff" in reasons and "Uncordoned" not in reasons, reasons
    obj = {"metadata": {"name": "n1", "resourceVersion": "7", "annotations": {keys.CORDONED_BY: "g"}},
           "spec": {"unschedulable": True, "taints": [{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}]}}
    patch = node_patch("g", obj, NodeUpdate(state=d.state, change=d.node))
    assert patch.body is not None and patch.taint_removed
    assert patch.body["spec"]["taints"] == [], "the taint is not lifted in the write that holds the node"
    assert "unschedulable" not in patch.body["spec"], "the node was uncordoned by the write that lifts its taint"
    annotations = patch.body["metadata"]["annotations"]
    assert annotations[keys.HELD_BY] == "g" and annotations[keys.CORDONED_BY] is None
    assert patch.body["metadata"]["resourceVersion"] == "7"
    plain = node_patch("g", {**obj, "metadata": {"name": "n1", "resourceVersion": "7"}, "spec": {
        "taints": obj["spec"]["taints"]}}, NodeUpdate(state=last_round(g).state, change=last_round(g).node)).body
    assert plain is not None and plain["spec"] == {"taints": [], "unschedulable": True}


def test_no_hold_without_the_taint_before_the_others_are_done_or_after_a_release() -> None:
    g = gate(readinessTaint=True, leaveCordoned=True)
    final = started(g).model_copy(update={"phase": "finish"})
    existing = decide(replace(ctx(g, final), hold_asked_by="g"))  # in service already: never held
    assert existing.node.unschedulable is None and existing.node.held_by is None
    waiting = decide(replace(ctx(g, final, n=node(taints=TAINT), readiness_clear=False), hold_asked_by="g"))
    assert waiting.node.unschedulable is None and not waiting.node.remove_readiness_taint
    released = last_round(g, annotations={keys.HAND_OFF_RELEASED: "2026-12-05T11:00:00+00:00"})
    assert released.node.remove_readiness_taint and released.node.held_by is None
    assert released.node.unschedulable is None, "a node released once was held again"
    nobody = decide(ctx(g, final, n=node(taints=TAINT)))
    assert nobody.node.remove_readiness_taint and nobody.node.held_by is None


def test_a_later_round_on_a_held_node_keeps_it_held() -> None:
    g = gate(packages=REBOOT, readinessTaint=True, leaveCordoned=True)
    held_view = node(unschedulable=True, annotations={keys.HELD_BY: "g"})
    state, _, view = run_until_quiet(g, started(g), n=held_view, decider=asking())  # type: ignore[arg-type]
    assert state.status == "complete"
    assert view.unschedulable and view.annotations.get(keys.HELD_BY) == "g", "a round released the hold"


def test_the_hold_names_the_asking_gate_when_two_gates_select_the_node() -> None:
    asks = gate("asks", readinessTaint=True, leaveCordoned=True)
    plain = gate("plain", readinessTaint=True)
    fnode = FleetNode(view=node(taints=TAINT), created=datetime(2026, 1, 1, tzinfo=UTC), states={})
    assert hold_asked_by(plain, fnode, [asks, plain]) == "asks"
    assert hold_asked_by(asks, fnode, [asks, plain]) == "asks"
    assert hold_asked_by(plain, fnode, [plain]) is None
    elsewhere = gate("elsewhere", readinessTaint=True, leaveCordoned=True, nodeSelector={"matchLabels": {"a": "b"}})
    assert hold_asked_by(plain, fnode, [plain, elsewhere]) is None


def test_a_held_node_takes_no_budget_and_an_uncordon_is_a_release() -> None:
    in_round = NodeGateState(status="in-progress", batch=2)
    assert progress_of(in_round).occupies_budget
    assert not progress_of(in_round, handed_off=True).occupies_budget
    fnode = FleetNode(view=node(unschedulable=True, annotations={keys.HELD_BY: "g"}), created=None,
                      states={"g": in_round})
    assert fnode.handed_off and not fnode.progresses["g"].occupies_budget
    assert held({keys.HELD_BY: "g"}, True) == "g" and held({keys.HELD_BY: "g"}, False) is None
    assert release_noticed({keys.HELD_BY: "g"}, unschedulable=False)
    assert not release_noticed({keys.HELD_BY: "g"}, unschedulable=True) and not release_noticed({}, False)
    update = NodeUpdate()
    update.change.hand_off_released = "2026-12-05T11:00:00+00:00"
    obj = {"metadata": {"name": "n1", "resourceVersion": "9", "annotations": {keys.HELD_BY: "g"}}, "spec": {}}
    body = node_patch("", obj, update).body
    assert body is not None and "spec" not in body
    assert body["metadata"]["annotations"] == {keys.HELD_BY: None, keys.HAND_OFF_RELEASED: "2026-12-05T11:00:00+00:00"}
