"""The one Node write of a step, built without I/O: what `NodeUpdate` asks for, as a merge patch.

A decision's state annotation, status label, cordon and readiness taint go to the API server in one
request, guarded by the resourceVersion the decision was made on, so a decision taken on a stale
copy is refused (409) and taken again (the optimistic concurrency of controller-runtime's
`client.MergeFromWithOptimisticLock`). Only what differs from the object as read is sent; nothing
differing means no request at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.lifecycle import taint
from gate.lifecycle.fleet import NodeUpdate


@dataclass(frozen=True)
class NodePatch:
    body: Obj | None  # None: the node already is as the update asks
    taint_added: bool = False
    taint_removed: bool = False


def node_patch(gate: str, obj: Obj, update: NodeUpdate) -> NodePatch:
    meta = obj["metadata"]
    current_ann = meta.get("annotations") or {}
    current_lab = meta.get("labels") or {}
    annotations: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    change = update.change
    state_key, label_key = keys.state_annotation(gate), keys.status_label(gate)
    for key in update.remove_annotations:
        annotations[key] = None
    if update.remove_state:
        annotations[state_key] = None
        labels[label_key] = None
        for request in (keys.reset_annotation(gate), keys.rerun_annotation(gate)):
            annotations[request] = None  # requests for a gate that is gone
    elif update.state is not None:
        annotations[state_key] = update.state.dump()
        labels[label_key] = update.state.status
    if change.status is not None and not update.remove_state:
        labels[label_key] = change.status
    if change.cordoned_by is not None:
        annotations[keys.CORDONED_BY] = change.cordoned_by
    if change.clear_cordoned_by and current_ann.get(keys.CORDONED_BY):
        annotations[keys.CORDONED_BY] = None
    if change.held_by is not None:
        annotations[keys.HELD_BY] = change.held_by
    if change.hand_off_released is not None:
        annotations[keys.HELD_BY] = None
        annotations[keys.HAND_OFF_RELEASED] = change.hand_off_released
    if change.unschedulable is not None and bool((obj.get("spec") or {}).get("unschedulable")) != change.unschedulable:
        spec["unschedulable"] = change.unschedulable
    taints = list((obj.get("spec") or {}).get("taints") or [])
    added = removed = False
    if change.add_readiness_taint and (written := taint.with_readiness_taint(taints)) is not None:
        spec["taints"], added = written, True
    elif change.remove_readiness_taint and (written := taint.without_readiness_taint(taints)) is not None:
        spec["taints"], removed = written, True
    annotations = {k: v for k, v in annotations.items() if current_ann.get(k) != v}
    labels = {k: v for k, v in labels.items() if current_lab.get(k) != v}
    if not annotations and not labels and not spec:
        return NodePatch(None)
    body: Obj = {"metadata": {"resourceVersion": meta["resourceVersion"]}}
    if annotations:
        body["metadata"]["annotations"] = annotations
    if labels:
        body["metadata"]["labels"] = labels
    if spec:
        body["spec"] = spec
    return NodePatch(body, taint_added=added, taint_removed=removed)
