"""Read API objects (dicts) into the views the pure layers decide on."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from gate.api import keys
from gate.api.common import Obj
from gate.api.records import Refusal, record_digest, unsigned
from gate.api.state import NodeGateState, StateParseError, load_state
from gate.kube.cache import slim
from gate.kube.objects import node_ready, parse_time
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.fleet import FleetNode
from gate.lifecycle.node import NodeView, PodView
from gate.lifecycle.prepull import repository

_SIGNAL_FIELDS = frozenset({"type", "status", "reason", "message", "lastTransitionTime"})
# Strings up to this long are kept as one copy shared by every node that holds them (`_shared`).
_SHARED_LENGTH = 128


def _shared(value: object) -> object:
    """A short string as the one copy of it (`sys.intern`): the nodes of a fleet hold the same label keys
    and values, annotation keys and condition fields, and each parsed Node had its own copies (about 2 KB
    a node of 5 KB kept; `bench.rollout.footprint`). A long one (a state annotation) stays as it is."""
    return sys.intern(value) if isinstance(value, str) and len(value) <= _SHARED_LENGTH else value


def _shared_map(mapping: Mapping[str, object] | None) -> dict[str, object] | None:
    if mapping is None:
        return None
    return {sys.intern(k): _shared(v) for k, v in mapping.items()}


def node_fields(node: Obj, repositories: Collection[str] = ()) -> Obj:
    """A Node as the operator's cache keeps it: what `node_view`, `fleet_node`, the node patches and
    Events read (metadata less managedFields, the spec, the Ready condition and NodeGate's own whole,
    the other conditions without their heartbeat, which a soak reads as health signals, the boot ID),
    and nothing of the rest of the status: images, capacity and addresses are most of a Node's size,
    and no part of the operator reads them: 5,000 kwok Nodes take 2.6 times less memory kept so
    (`bench.rollout.footprint`), real ones, with their image lists, more (`gate.kube.cache.WatchCache`'s
    transform). Of the node's images only the names in `repositories` are kept (the agent's and the
    gates' packages', `World.image_repositories`): what the prepuller asks of a node
    (`node_image_names`) is whether it has a round's images already."""
    meta = slim(node).get("metadata") or {}
    for field in ("labels", "annotations"):
        if field in meta:
            meta[field] = _shared_map(meta[field])
    status = node.get("status") or {}
    kept = [_shared_map(c) if c.get("type") == "Ready" or str(c.get("type", "")).startswith(keys.CONDITION_PREFIX)
            else {sys.intern(k): _shared(v) for k, v in c.items() if k in _SIGNAL_FIELDS}
            for c in status.get("conditions") or []]
    slim_status: Obj = {"conditions": kept, "nodeInfo": {"bootID": (status.get("nodeInfo") or {}).get("bootID", "")}}
    if repositories:
        names = [n for image in status.get("images") or [] for n in image.get("names") or []
                 if repository(n) in repositories]
        if names:
            slim_status["images"] = [{"names": names}]
    return {
        "apiVersion": node.get("apiVersion", "v1"), "kind": node.get("kind", "Node"), "metadata": meta,
        "spec": node.get("spec") or {}, "status": slim_status,
    }


def node_image_names(node: Obj) -> frozenset[str]:
    """Every reference the node reports an image of its under (`status.images`)."""
    images = (node.get("status") or {}).get("images") or []
    return frozenset(n for image in images for n in image.get("names") or [])


def node_view(node: Obj) -> NodeView:
    meta = node.get("metadata", {})
    spec = node.get("spec", {}) or {}
    status = node.get("status", {}) or {}
    ready = node_ready(node)
    taints = tuple((t.get("key", ""), t.get("effect", "")) for t in spec.get("taints") or [])
    ours: dict[str, NodeCondition] = {}
    others: dict[str, NodeCondition] = {}
    for c in status.get("conditions") or []:
        kind = str(c.get("type", ""))
        if kind == "Ready":
            continue
        into = ours if kind.startswith(keys.CONDITION_PREFIX) else others
        into[kind] = NodeCondition(kind, str(c.get("status", "")), str(c.get("reason", "")), str(c.get("message", "")),
                                   c.get("lastTransitionTime"))
    return NodeView(
        name=meta.get("name", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        unschedulable=bool(spec.get("unschedulable")),
        boot_id=(status.get("nodeInfo") or {}).get("bootID", ""),
        ready=ready,
        taints=taints,
        conditions=ours,
        health_conditions=others,
    )


def node_states(node: Obj, gates: Iterable[str] | None = None) -> dict[str, NodeGateState | StateParseError]:
    """Every gate's state on the node (or only those named), parsed; a bad one as its error."""
    out: dict[str, NodeGateState | StateParseError] = {}
    wanted = set(gates) if gates is not None else None
    for key, value in (node.get("metadata", {}).get("annotations") or {}).items():
        gate = keys.gate_of_state_annotation(key)
        if gate is None or (wanted is not None and gate not in wanted):
            continue
        try:
            out[gate] = load_state(value)
        except StateParseError as exc:
            out[gate] = exc
    return out


class RecordCheck(Protocol):
    def __call__(self, gate: str, node: Obj, state: NodeGateState) -> str | None:
        """Why the node's record for `gate` is not the operator's, or None when it is (`gate.api.records`)."""


def node_records(node: Obj, check: RecordCheck | None) -> tuple[dict[str, NodeGateState | StateParseError],
                                                               dict[str, Refusal]]:
    """The node's states as the operator may act on them, and the records it refused.

    With `check` (the operator's, `gate.controller.signing.Signer.check`), a record that parses but that
    the operator did not write is left out of the states, as if the node had none for that gate, and
    returned with why; the states kept lose their signature (it is written anew with each write). A
    record that does not parse stays a `StateParseError`, reported as before. Without `check` (the
    CLI, which holds no key) every record is taken as it reads."""
    states = node_states(node)
    if check is None:
        return states, {}
    annotations = node.get("metadata", {}).get("annotations") or {}
    kept: dict[str, NodeGateState | StateParseError] = {}
    refused: dict[str, Refusal] = {}
    for gate, state in states.items():
        if isinstance(state, StateParseError):
            kept[gate] = state
            continue
        why = check(gate, node, state)
        if why is None:
            kept[gate] = unsigned(state)
        else:
            refused[gate] = Refusal(why, record_digest(annotations[keys.state_annotation(gate)]))
    return kept, refused


def fleet_node(node: Obj, check: RecordCheck | None = None) -> FleetNode:
    """The node as the planners see it; the operator passes its `check` (`World.fleet_node`)."""
    created = node.get("metadata", {}).get("creationTimestamp")
    states, refused = node_records(node, check)
    return FleetNode(node_view(node), parse_time(created), states, refused)


def pod_view(pod: Obj, operator_namespace: str) -> PodView:
    meta = pod.get("metadata", {})
    owners = meta.get("ownerReferences") or []
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        labels=labels,
        phase=(pod.get("status") or {}).get("phase", "Unknown"),
        daemonset=any(o.get("kind") == "DaemonSet" for o in owners),
        mirror="kubernetes.io/config.mirror" in annotations,
        empty_dir=any("emptyDir" in v for v in volumes),
        deleting=bool(meta.get("deletionTimestamp")),
        ours=meta.get("namespace") == operator_namespace and labels.get(keys.MANAGED_BY_LABEL) == keys.MANAGER,
    )
