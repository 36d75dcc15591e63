"""The index of stage pods by gate and node (gate.controller.index)."""

from __future__ import annotations

from gate.controller.index import StageIndex
from gate.controller.pods import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION


def pod(name: str, gate: str, node: str) -> dict[str, object]:
    return {"metadata": {"name": name, "annotations": {GATE_NAME_ANNOTATION: gate, NODE_NAME_ANNOTATION: node}}}


def test_stage_pods_are_found_by_gate_and_node_and_forgotten_when_deleted() -> None:
    index = StageIndex()
    for name, gate, node in (("a", "g", "n1"), ("b", "g", "n1"), ("c", "g", "n2"), ("d", "h", "n1")):
        index.pod_event("ADDED", pod(name, gate, node))
    index.pod_event("MODIFIED", pod("a", "g", "n1"))
    index.pod_event("ADDED", {"metadata": {"name": "not-ours"}})
    assert index.pods_of("g", "n1") == ["a", "b"] and index.pods_of("h", "n1") == ["d"]
    assert dict(index.nodes_with_pods("g")) == {"n1": ["a", "b"], "n2": ["c"]}
    index.pod_event("DELETED", pod("c", "g", "n2"))
    assert dict(index.nodes_with_pods("g")) == {"n1": ["a", "b"]} and index.pods_of("g", "n2") == []


def test_a_pod_the_operator_deleted_stays_out_until_its_deleted_event() -> None:
    """A status update sent before the delete, arriving after it, does not put the pod back (a second
    DELETE would follow, refused with a 404); a new pod under the same name (another uid) is indexed."""
    index = StageIndex()
    old = {**pod("a", "g", "n1"), "metadata": {**pod("a", "g", "n1")["metadata"], "uid": "u1"}}
    index.pod_event("ADDED", old)
    index.deleted(old)
    index.pod_event("MODIFIED", old)
    assert index.pods_of("g", "n1") == []
    index.pod_event("DELETED", old)
    again = {**old, "metadata": {**old["metadata"], "uid": "u2"}}
    index.pod_event("ADDED", again)
    assert index.pods_of("g", "n1") == ["a"]
    index.pod_event("MODIFIED", old)  # its own DELETED came: no longer held out, nor in the way
    assert index.pods_of("g", "n1") == ["a"]
