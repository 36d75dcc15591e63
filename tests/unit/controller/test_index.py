"""The index of stage Jobs by gate and node, and of their pods by Job (gate.controller.index)."""

from __future__ import annotations

from gate.controller.index import StageIndex
from gate.controller.jobs import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION


def job(name: str, gate: str, node: str) -> dict[str, object]:
    return {"metadata": {"name": name, "annotations": {GATE_NAME_ANNOTATION: gate, NODE_NAME_ANNOTATION: node}}}


def pod(name: str, job_name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"job-name": job_name}}}


def test_jobs_are_found_by_gate_and_node_and_forgotten_when_deleted() -> None:
    index = StageIndex()
    for name, gate, node in (("a", "g", "n1"), ("b", "g", "n1"), ("c", "g", "n2"), ("d", "h", "n1")):
        index.job_event("ADDED", job(name, gate, node))
    index.job_event("MODIFIED", job("a", "g", "n1"))
    index.job_event("ADDED", {"metadata": {"name": "not-ours"}})
    assert index.jobs_of("g", "n1") == ["a", "b"] and index.jobs_of("h", "n1") == ["d"]
    assert dict(index.nodes_with_jobs("g")) == {"n1": ["a", "b"], "n2": ["c"]}
    index.job_event("DELETED", job("c", "g", "n2"))
    assert dict(index.nodes_with_jobs("g")) == {"n1": ["a", "b"]} and index.jobs_of("g", "n2") == []


def test_pods_are_found_by_their_job() -> None:
    index = StageIndex()
    index.pod_event("ADDED", pod("a-1", "a"))
    index.pod_event("ADDED", pod("a-2", "a"))  # a retry
    index.pod_event("ADDED", {"metadata": {"name": "unrelated"}})
    assert index.pods_of("a") == ["a-1", "a-2"]
    index.pod_event("DELETED", pod("a-1", "a"))
    index.pod_event("DELETED", pod("a-2", "a"))
    assert index.pods_of("a") == []
