"""The index of pods running on each node, and which gates a pod's change concerns."""

from __future__ import annotations

from typing import Any

from gate.api import keys
from gate.api.common import LabelSelector
from gate.controller.workloads import WorkloadIndex, gates_protecting, workload_fields

TRAINING = LabelSelector.model_validate({"matchLabels": {"workload": "training"}})


def _pod(name: str, node: str | None, phase: str = "Running", ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "managedFields": [{"x": 1}],
                         "resourceVersion": "7"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]} if node else {},
            "status": {"phase": phase, "conditions": [{"type": "Ready"}]}}


def test_the_index_holds_running_pods_by_node_and_matches_a_selector() -> None:
    index = WorkloadIndex("nodegate-system")
    assert index.pod_event("ADDED", _pod("a", "n1", workload="training")) == ({"workload": "training"},)
    index.pod_event("ADDED", _pod("b", "n1", workload="web"))
    index.pod_event("ADDED", _pod("c", "n2", workload="training"))
    index.pod_event("ADDED", _pod("pending", None, workload="training"))  # not bound: protects nothing
    assert index.matching(TRAINING, ["n1", "n2", "n3"]) == {"n1": ("default/a",), "n2": ("default/c",)}
    assert index.matching(TRAINING, ["n1"]) == {"n1": ("default/a",)}  # only the nodes asked about
    assert index.matching(LabelSelector(), ["n1", "n2"]) == {}  # no podNonInterruptLabels: nothing protected


def test_an_ended_or_deleted_pod_no_longer_protects_its_node_and_the_change_is_reported() -> None:
    index = WorkloadIndex("nodegate-system")
    index.pod_event("ADDED", _pod("a", "n1", workload="training"))
    assert index.pod_event("MODIFIED", _pod("a", "n1", workload="training")) == ()  # nothing that matters
    assert index.pod_event("MODIFIED", _pod("a", "n1", "Succeeded", workload="training")) == (
        {"workload": "training"},)
    assert index.matching(TRAINING, ["n1"]) == {} and len(index) == 0
    index.pod_event("ADDED", _pod("b", "n1", workload="training"))
    index.pod_event("DELETED", _pod("b", "n1", workload="training"))
    assert index.matching(TRAINING, ["n1"]) == {}


def test_a_relabelled_pod_reports_both_label_sets() -> None:
    index = WorkloadIndex("nodegate-system")
    index.pod_event("ADDED", _pod("a", "n1", workload="training"))
    changed = index.pod_event("MODIFIED", _pod("a", "n1", workload="web"))
    assert changed == ({"workload": "training"}, {"workload": "web"})
    assert gates_protecting(changed, [("g", TRAINING), ("h", None), ("i", LabelSelector())]) == ["g"]
    assert index.matching(TRAINING, ["n1"]) == {}


def test_nodegates_own_stage_pods_protect_nothing() -> None:
    index = WorkloadIndex("nodegate-system")
    pod = _pod("stage", "n1", ns="nodegate-system", workload="training", **{keys.MANAGED_BY_LABEL: keys.MANAGER})
    index.pod_event("ADDED", pod)
    assert index.matching(TRAINING, ["n1"]) == {}


def test_the_cache_keeps_only_what_the_index_reads() -> None:
    slim = workload_fields(_pod("a", "n1", workload="training"))
    assert slim == {"metadata": {"name": "a", "namespace": "default", "labels": {"workload": "training"},
                                 "resourceVersion": "7"},
                    "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def test_a_selector_becomes_the_query_the_api_server_filters_by() -> None:
    selector = LabelSelector.model_validate({"matchLabels": {"workload": "training", "a": "b"}, "matchExpressions": [
        {"key": "team", "operator": "In", "values": ["y", "x"]}, {"key": "tier", "operator": "NotIn", "values": ["z"]},
        {"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "DoesNotExist"}]})
    assert selector.query() == "a=b,workload=training,team in (x,y),tier notin (z),gpu,!spot"
