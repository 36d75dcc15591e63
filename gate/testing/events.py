"""What the invariant checker is fed: the changes that watches of the cluster see, as events.

A `Change` is one watch event (the object after it, at its revision); a `Relist` is a watch that lost
track and listed again, known only by its end state; a `Blind` marks the window before such a
relist. `gate.testing.watcher` records them as JSON lines (`dump_event`, with each object cut down
to what the checker reads: `slim`), and `gate.testing.invariants.replay` reads them back
(`load_event`) to judge a run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from gate.api import keys
from gate.api.common import Obj
from gate.api.facts import FACTS_ANNOTATION

Resource = Literal["nodes", "pods", "nodegates", "deploymentpolicies"]


@dataclass(frozen=True)
class Change:
    """One watch event: the object as it is after the change, at revision `rv`."""

    resource: Resource
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: Obj
    rv: int


@dataclass(frozen=True)
class Relist:
    """The watch of `resource` lost track after revision `since` and listed again at revision `rv`:
    `objects` is every object at `rv`; what happened in between is known only by its end state."""

    resource: Resource
    objects: list[Obj]
    since: int
    rv: int
    initial: bool = False  # the first list of a watcher: a starting state, not a lost window


@dataclass(frozen=True)
class Blind:
    """From `since`+1 to `until` the node watch is blind (its Relist at `until` follows). Fed at
    `since`+1, so pods created in that window are not judged against a node state known to be stale."""

    resource: Resource
    since: int
    until: int


Event = Change | Relist | Blind


def resource_version(obj: Obj) -> int:
    raw = (obj.get("metadata") or {}).get("resourceVersion") or "0"
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"resourceVersion {raw!r} is not an etcd revision; the checker needs one etcd") from exc


def slim(resource: Resource, obj: Obj) -> Obj:
    """Only what the checker reads: keeps a journal of a long run small."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                                 "deletionTimestamp") if k in meta}
    kept["labels"] = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    if resource == "nodes":
        kept["annotations"] = {k: v for k, v in annotations.items() if k.startswith(f"{keys.GROUP}/")}
        spec = obj.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if t.get("key") == keys.READINESS_TAINT_KEY]
        return {"metadata": kept, "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": taints}}
    if resource == "pods":
        # Not the node facts: a copy of the node's labels and annotations on every pod.
        kept["annotations"] = {k: v for k, v in annotations.items() if k != FACTS_ANNOTATION}
        return {"metadata": kept, **_slim_pod(obj)}
    kept["annotations"] = dict(annotations)
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept,
            "spec": obj.get("spec") or {}}


def _slim_pod(obj: Obj) -> Obj:
    """A stage pod's containers by name with their args, its phase, and how each container ended."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    slimmed: Obj = {"spec": {}, "status": {"phase": status.get("phase")}}
    for key in ("initContainers", "containers"):
        slimmed["spec"][key] = [{"name": c.get("name"), "args": list(c.get("args") or [])}
                                for c in spec.get(key) or []]
    for key in ("initContainerStatuses", "containerStatuses"):
        ended = []
        for cs in status.get(key) or []:
            term = (cs.get("state") or {}).get("terminated")
            if term is not None:
                ended.append({"name": cs.get("name"), "state": {"terminated": {"exitCode": term.get("exitCode")}}})
        slimmed["status"][key] = ended
    return slimmed


def dump_event(event: Event) -> str:
    """One line of a journal (JSON); `load_event` reads it back."""
    if isinstance(event, Change):
        data: Obj = {"t": "change", "resource": event.resource, "type": event.type, "rv": event.rv,
                     "obj": event.obj}
    elif isinstance(event, Relist):
        data = {"t": "relist", "resource": event.resource, "since": event.since, "rv": event.rv,
                "objects": event.objects, "initial": event.initial}
    else:
        data = {"t": "blind", "resource": event.resource, "since": event.since, "until": event.until}
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def load_event(line: str) -> Event:
    data = json.loads(line)
    if data["t"] == "change":
        return Change(data["resource"], data["type"], data["obj"], int(data["rv"]))
    if data["t"] == "relist":
        return Relist(data["resource"], list(data["objects"]), int(data["since"]), int(data["rv"]),
                      bool(data.get("initial")))
    return Blind(data["resource"], int(data["since"]), int(data["until"]))
