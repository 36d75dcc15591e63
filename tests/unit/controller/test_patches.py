"""The Node write of a step (gate.controller.patches): one merge patch, only what differs, guarded."""

from __future__ import annotations

from typing import Any

from gate.api import keys
from gate.api.state import NodeGateState
from gate.controller.patches import node_patch
from gate.lifecycle.fleet import NodeUpdate


def node(**meta: Any) -> dict[str, Any]:
    spec = meta.pop("spec", {})
    return {"metadata": {"name": "n1", "resourceVersion": "42", **meta}, "spec": spec}


def test_a_cordon_is_one_guarded_patch_with_the_state_label_and_marker() -> None:
    update = NodeUpdate(state=NodeGateState(status="in-progress", phase="wait-pods", cordoned=True))
    update.change.unschedulable = True
    update.change.cordoned_by = "g"
    body = node_patch("g", node(), update).body
    assert body is not None
    assert body["metadata"]["resourceVersion"] == "42" and body["spec"] == {"unschedulable": True}
    assert body["metadata"]["annotations"][keys.CORDONED_BY] == "g"
    assert body["metadata"]["labels"] == {keys.status_label("g"): "in-progress"}
    assert '"phase":"wait-pods"' in body["metadata"]["annotations"][keys.state_annotation("g")]


def test_nothing_that_differs_means_no_request() -> None:
    state = NodeGateState(status="complete")
    current = node(annotations={keys.state_annotation("g"): state.dump()},
                   labels={keys.status_label("g"): "complete"}, spec={"unschedulable": False})
    update = NodeUpdate(state=state)
    update.change.unschedulable = False
    update.change.clear_cordoned_by = True  # nothing to clear
    assert node_patch("g", current, update).body is None


def test_the_readiness_taint_is_added_once_and_removed_alone() -> None:
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    add = NodeUpdate()
    add.change.add_readiness_taint = True
    added = node_patch("g", node(spec={"taints": [other]}), add)
    assert added.taint_added and added.body is not None
    assert added.body["spec"]["taints"] == [other, {"key": keys.READINESS_TAINT_KEY,
                                                    "effect": keys.READINESS_TAINT_EFFECT}]
    tainted = node(spec={"taints": added.body["spec"]["taints"]})
    assert node_patch("g", tainted, add).body is None  # already there
    lift = NodeUpdate()
    lift.change.remove_readiness_taint = True
    lifted = node_patch("g", tainted, lift)
    assert lifted.taint_removed and lifted.body is not None and lifted.body["spec"]["taints"] == [other]


def test_releasing_a_node_removes_the_gates_keys_and_its_requests() -> None:
    current = node(annotations={keys.state_annotation("g"): "{}", keys.reset_annotation("g"): "now",
                                keys.CORDONED_BY: "g"}, labels={keys.status_label("g"): "complete"})
    update = NodeUpdate(remove_state=True)
    update.change.clear_cordoned_by = True
    body = node_patch("g", current, update).body
    assert body is not None
    assert body["metadata"]["annotations"] == {keys.state_annotation("g"): None, keys.reset_annotation("g"): None,
                                               keys.CORDONED_BY: None}
    assert body["metadata"]["labels"] == {keys.status_label("g"): None}
