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
