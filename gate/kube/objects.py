"""What NodeGate reads off Kubernetes objects, in one place: timestamps, conditions, a pod's end, a
Node's readiness, a NodeGate state's status.

Each fact had been computed where it was needed (whether a stage had ended in six places, timestamps in
three), and copies of one fact drift apart. The operator, the CLI, the invariant checker and the
benchmarks read them here. Pure functions of the
object's wire form (dicts as the API server sends them), as `k8s.io/apimachinery`'s helpers and
kubectl's `polymorphichelpers` are for Go code.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Literal

from gate.api.common import Obj, parse_time
from gate.api.state import StateParseError, load_state

Outcome = Literal["succeeded", "failed"]


def conditions(obj: Obj) -> dict[str, Obj]:
    """The object's status conditions by type."""
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def condition_true(obj: Obj, type_: str) -> bool:
    return conditions(obj).get(type_, {}).get("status") == "True"


def pod_outcome(pod: Obj) -> Outcome | None:
    """How a pod ended (its phase `Succeeded` or `Failed`), None while it has not."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed":
        return "failed"
    return None


def pod_ended(pod: Obj) -> bool:
    return pod_outcome(pod) is not None


def container_statuses(pod: Obj) -> list[Obj]:
    """The pod's container statuses in the order its containers run: init containers, then the rest."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def container_states(pod: Obj) -> dict[str, Obj]:
    """Each container's state (`running`, `waiting` or `terminated`), by container name."""
    return {str(cs.get("name")): cs.get("state") or {} for cs in container_statuses(pod)}


# A container waiting for these is starting up; any other reason (ErrImagePull, say) may be stuck.
STARTING_UP: tuple[str | None, ...] = (None, "", "PodInitializing", "ContainerCreating")


def stuck_wait(pod: Obj) -> Obj | None:
    """The first container's `waiting` state whose reason is not starting up, None when there is none."""
    for cs in container_statuses(pod):
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting is not None and waiting.get("reason") not in STARTING_UP:
            return dict(waiting)
    return None


def pod_ended_at(pod: Obj) -> datetime | None:
    """When the last of its containers finished (None while one has not, or none ran)."""
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for cs in container_statuses(pod)]
    known = [t for t in ends if t is not None]
    return max(known) if known and len(known) == len(ends) else None


def node_ready(node: Obj) -> bool:
    return condition_true(node, "Ready")


def created_at(obj: Obj) -> datetime | None:
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


@lru_cache(maxsize=1024)
def state_status(raw: str) -> str | None:
    """The status in a NodeGate state annotation, parsed (not substring-matched: a package or a
    message may contain any text), "unreadable" for one that does not parse, None for no state.
    Cached by the text, a little: the operator reads the status of a node event's states from its
    parsed fleet view (`gate.controller.triggers.on_node`'s `in_round`), and a cache as large as the
    fleet kept every old version of every node's state alive (7 MiB at 5,000 nodes)."""
    if not raw:
        return None
    try:
        return load_state(raw).status
    except StateParseError:
        return "unreadable"


__all__ = [
    "STARTING_UP", "Obj", "Outcome", "condition_true", "conditions", "container_states", "container_statuses",
    "created_at", "node_ready", "parse_time", "pod_ended", "pod_ended_at", "pod_outcome", "state_status",
    "stuck_wait",
]
