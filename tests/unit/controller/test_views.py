"""The operator's node cache keeps only what the operator reads (`gate.controller.views.node_fields`)."""

from __future__ import annotations

import copy
import json
from typing import Any

from gate.api import keys
from gate.api.state import NodeGateState
from gate.controller.patches import node_patch
from gate.controller.views import fleet_node, node_fields, node_image_names, node_view
from gate.lifecycle.fleet import NodeUpdate


def _condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": "2026-12-03T08:20:05Z", "lastTransitionTime": "2026-12-03T08:20:05Z"}


def _real_node() -> dict[str, Any]:
    """A Node as a real kubelet reports it: images, capacity, addresses, every condition."""
    state = NodeGateState(status="in-progress", batch=2, compartment="pool-a", phase="stages")
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": "gpu-7", "uid": "u-7", "resourceVersion": "812", "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"pool": "pool-a", keys.status_label("tuning"): "in-progress"},
            "annotations": {keys.state_annotation("tuning"): state.dump(), keys.CORDONED_BY: "tuning"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"podCIDR": "10.0.7.0/24", "unschedulable": True,
                 "taints": [{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                             "timeAdded": "2026-12-03T08:21:00Z"}]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.1.0.7"}],
            "capacity": {"cpu": "64", "nvidia.com/gpu": "8"}, "allocatable": {"cpu": "63", "nvidia.com/gpu": "8"},
            "conditions": [_condition("MemoryPressure", "False"), _condition("Ready", "True", "KubeletReady"),
                           _condition(keys.failed_condition("other"), "True", "StageFailed", "apply failed")],
            "nodeInfo": {"bootID": "b-1", "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12"},
            "images": [{"names": [f"registry.example.com/img-{i}:1"], "sizeBytes": 1000 + i} for i in range(50)],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }


def test_the_operator_reads_the_same_node_from_the_kept_fields() -> None:
    node = _real_node()
    kept = node_fields(copy.deepcopy(node))
    assert node_view(kept) == node_view(node)
    assert fleet_node(kept) == fleet_node(node)
    for field in ("images", "capacity", "allocatable", "addresses", "daemonEndpoints"):
        assert field not in kept["status"]
    # Every condition stays (the others are health signals a soak reads), the others without heartbeat.
    assert [c["type"] for c in kept["status"]["conditions"]] == ["MemoryPressure", "Ready",
                                                                 keys.failed_condition("other")]
    assert "lastHeartbeatTime" not in kept["status"]["conditions"][0]
    assert node_view(kept).health_conditions == node_view(node).health_conditions
    assert set(node_view(kept).health_conditions) == {"MemoryPressure"}
    assert set(node_view(kept).conditions) == {keys.failed_condition("other")}
    assert kept["status"]["nodeInfo"] == {"bootID": "b-1"}
    assert "managedFields" not in kept["metadata"]


def test_the_kept_fields_hold_the_images_of_the_repositories_asked_for() -> None:
    """The prepuller reads a node's images of the repositories a round pulls from (`World.image_repositories`)."""
    node = _real_node()
    node["status"]["images"].append({"names": ["registry.example.com/img-3@sha256:" + "c" * 64,
                                               "registry.example.com/img-3:2"], "sizeBytes": 9})
    kept = node_fields(copy.deepcopy(node), frozenset({"registry.example.com/img-3"}))
    assert node_image_names(kept) == {"registry.example.com/img-3:1", "registry.example.com/img-3:2",
                                      "registry.example.com/img-3@sha256:" + "c" * 64}
    assert node_image_names(kept) <= node_image_names(node)
    assert node_view(kept) == node_view(node)
    assert "images" not in node_fields(copy.deepcopy(node), frozenset({"elsewhere.example/x"}))["status"]


def test_a_node_patch_from_the_kept_fields_is_the_same() -> None:
    """The taints are written as a whole list: the kept spec must hold every taint as the server has it."""
    node = _real_node()
    update = NodeUpdate()
    update.change.remove_readiness_taint = True
    update.change.unschedulable = False
    assert node_patch("tuning", node_fields(copy.deepcopy(node)), update) == node_patch("tuning", node, update)


def test_a_node_without_status_keeps_an_empty_boot_id() -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "new", "resourceVersion": "1"}}
    kept = node_fields(node)
    assert node_view(kept) == node_view(node)
    assert not node_view(kept).ready


def test_nodes_kept_share_their_short_strings_and_keep_their_long_ones() -> None:
    """A fleet's nodes hold one copy of each label, annotation key and condition field, not one per node.
    Each is parsed from its own JSON, as the API sends it: each has its own copies before it is kept."""
    first, second = (node_fields(json.loads(json.dumps(_real_node()))) for _ in range(2))
    for path in (("metadata", "labels", "pool"), ("metadata", "labels", keys.status_label("tuning"))):
        a, b = first, second
        for key in path:
            a, b = a[key], b[key]
        assert a == "pool-a" or a == "in-progress"
        assert a is b
    conditions = zip(first["status"]["conditions"], second["status"]["conditions"], strict=True)
    for a, b in conditions:
        assert a == b
        for key in a:
            assert a[key] is b[key], key
    state = keys.state_annotation("tuning")
    assert first["metadata"]["annotations"][state] == _real_node()["metadata"]["annotations"][state]
    assert first["metadata"]["annotations"][keys.CORDONED_BY] is second["metadata"]["annotations"][keys.CORDONED_BY]
