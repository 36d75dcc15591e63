"""Which work a change of the world asks for: typed work keys, and the pure map from watch events to them.

controller-runtime draws a controller as event sources, *handlers* that map an event to
`reconcile.Request`s, a work queue of those requests, and reconcilers. This module is the handlers'
part, kept pure: a function per kind of object, taking the event and the few facts it needs (the
gates and nodes as the caches hold them), returning the keys to reconcile now and the gates to plan
after the debounce. The operator (`gate.controller.operator`) owns the caches, the queue and the
indexes, and only feeds these functions and queues what they return.

Three kinds of keys:

* `GateKey(gate)`: plan the gate across the fleet (`gate.lifecycle.fleet.plan_gate`), or its removal.
* `NodeKey(gate, node)`: one step of that node's state machine (`gate.lifecycle.machine`).
* `JoinKey(gate, node)`: a node that joined after the gate, which may need the readiness taint now.
* `TaintKey(node)`: a node with the readiness taint, which must lose it once no readinessTaint gate
  selects it (`gate.lifecycle.taint.orphan_taint`).
* `PolicyKey(policy)`: a DeploymentPolicy's own status (accepted, the gates that use it).
* `HistoryKey(gate)`: record the gate's current spec as its newest ControllerRevision
  (`gate.controller.history`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import astuple, dataclass
from typing import Any, Literal

from gate.api import keys
from gate.api.common import Obj
from gate.controller.pods import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION, stage_pod_ended
from gate.controller.prepull_pod import prepull_owner
from gate.kube.objects import created_at, pod_ended, state_status, stuck_wait
from gate.lifecycle import taint
from gate.lifecycle.fleet import Replan

EventKind = Literal["ADDED", "MODIFIED", "DELETED"] | str


class _Key:
    """A work key reads as a path in logs (`node/GATE/NODE`); its kind labels the metrics."""

    kind = ""

    def __str__(self) -> str:
        return "/".join((self.kind, *(str(v) for v in astuple(self))))  # type: ignore[call-overload]


@dataclass(frozen=True)
class GateKey(_Key):
    gate: str
    kind = "gate"


@dataclass(frozen=True)
class NodeKey(_Key):
    gate: str
    node: str
    kind = "node"


@dataclass(frozen=True)
class JoinKey(_Key):
    gate: str
    node: str
    kind = "join"


@dataclass(frozen=True)
class TaintKey(_Key):
    node: str
    kind = "taint"


@dataclass(frozen=True)
class PolicyKey(_Key):
    policy: str
    kind = "policy"


@dataclass(frozen=True)
class HistoryKey(_Key):
    gate: str
    kind = "history"


WorkKey = GateKey | NodeKey | JoinKey | TaintKey | PolicyKey | HistoryKey


@dataclass(frozen=True)
class Triggered:
    """What an event asks for: keys to reconcile now, gates to plan after the debounce, and gates to
    plan within a few seconds (their figures moved, and no node can start because of it)."""

    now: tuple[WorkKey, ...] = ()
    later: tuple[str, ...] = ()
    soon: tuple[str, ...] = ()


# The parts of a gate the operator acts on: the spec (its generation) and the deletion, which its
# nodes care about too, and the annotations (requests, disabled) and finalizers, which its plan reads;
# not the status the operator keeps writing.
GateSeen = tuple[Any, bool, tuple[tuple[str, str], ...], tuple[str, ...]]


def gate_seen(obj: Obj) -> GateSeen:
    meta = obj["metadata"]
    return (meta.get("generation"), bool(meta.get("deletionTimestamp")),
            tuple(sorted((meta.get("annotations") or {}).items())), tuple(meta.get("finalizers") or ()))


def on_gate(obj: Obj, seen_before: GateSeen | None, nodes: Iterable[Obj], policies: Iterable[Obj] = (), *,
            kind: EventKind = "MODIFIED") -> Triggered:
    """A gate changed: plan it; when its spec or deletion changed, step every node holding its state,
    and when its spec changed, look at its history (`HistoryKey`).
    A policy's status names the gates that use it, and a gate that left a policy no longer names it,
    so every policy is looked at (there are few, and an unchanged status is not written).

    A change of its status alone asks for nothing: the operator wrote it, from the plan it just
    made (a plan closes a batch and starts the next in one go, `gate.rollout.planner.decide`)."""
    name = obj["metadata"]["name"]
    seen = gate_seen(obj)
    if kind != "DELETED" and seen == seen_before:
        return Triggered()
    now: list[WorkKey] = [GateKey(name), *(PolicyKey(p["metadata"]["name"]) for p in policies)]
    nodes = list(nodes)
    if seen_before is None or seen[:2] != seen_before[:2]:
        annotation = keys.state_annotation(name)
        now += [NodeKey(name, n["metadata"]["name"]) for n in nodes
                if annotation in (n["metadata"].get("annotations") or {})]
    # Its selector, readinessTaint, deletion or disabling may leave a tainted node with no gate to lift
    # the taint: every tainted node is looked at (few, and the look is cheap).
    now += [TaintKey(n["metadata"]["name"]) for n in nodes if taint.has_readiness_taint(taint.node_taints(n))]
    if kind != "DELETED" and not seen[1] and (seen_before is None or seen[0] != seen_before[0]):
        now.append(HistoryKey(name))  # a spec write (or the first look): the history may need a revision
    return Triggered(now=tuple(now))


def on_policy(kind: EventKind, obj: Obj, gates: Iterable[Obj]) -> Triggered:
    """A DeploymentPolicy changed: its own status, and a plan of every gate that uses it."""
    name = obj["metadata"]["name"]
    own: tuple[WorkKey, ...] = () if kind == "DELETED" else (PolicyKey(name),)
    return Triggered(now=own + tuple(GateKey(g["metadata"]["name"]) for g in gates
                                     if (g.get("spec") or {}).get("deploymentPolicy") == name))


def on_node(kind: EventKind, obj: Obj, gates: Iterable[Obj], *, replan: Replan = "now",
            in_round: Collection[str] | None = None) -> Triggered:
    """A node changed: step the gates in progress on it, and plan every gate as `replan` says
    (`gate.lifecycle.fleet.replan`): after the debounce when a node may start now, a little later
    when the change only moves the rollout's figures, not at all when no plan reads it (a phase of a
    round in progress, a heartbeat).

    A node joining after a readinessTaint gate may need the taint (the webhook may have missed it):
    it is tainted at once, without waiting for a plan of the whole fleet, to leave the scheduler as
    little time as possible, and the gate is planned now. The nodes of the initial list, older than
    the gate, are left to the plan (`gate.lifecycle.taint.taint_reason` decides).

    `in_round`: the gates whose state on the node says a round is in progress, when the caller has
    parsed the states already (the operator has, for its plans); otherwise read off the annotations."""
    node = obj["metadata"]["name"]
    annotations = obj["metadata"].get("annotations") or {}
    # A tainted node relabelled out of its gates, or ignored, must lose the taint: looked at each time.
    # So must a node held for hand-off that someone uncordoned lose its mark (`gate.lifecycle.handoff`).
    now: list[WorkKey] = [TaintKey(node)] if kind != "DELETED" and needs_taint_look(obj) else []
    later: list[str] = []
    for gate in gates:
        gname = gate["metadata"]["name"]
        if in_round is None:
            stepping = state_status(annotations.get(keys.state_annotation(gname)) or "") == "in-progress"
        else:
            stepping = gname in in_round
        if stepping and kind != "DELETED":
            now.append(NodeKey(gname, node))
        if kind == "ADDED" and (gate.get("spec") or {}).get("readinessTaint") and joined_after(obj, gate):
            now += [JoinKey(gname, node), GateKey(gname)]
        elif replan is not None:
            later.append(gname)
    if replan == "soon":
        return Triggered(now=tuple(now), soon=tuple(later))
    return Triggered(now=tuple(now), later=tuple(later))


def stage_owner(pod: Obj) -> tuple[str, str] | None:
    """The (gate, node) a stage pod belongs to, from its annotations."""
    ann = pod["metadata"].get("annotations") or {}
    gate, node = ann.get(GATE_NAME_ANNOTATION), ann.get(NODE_NAME_ANNOTATION)
    return (gate, node) if gate and node else None


def pod_may_be_stuck(pod: Obj) -> bool:
    """A container of the pod waits for a reason other than starting up (ErrImagePull, say)."""
    return stuck_wait(pod) is not None


def on_pod(kind: EventKind, pod: Obj, *, in_round: bool = False) -> Triggered:
    """A stage pod moves its node on when it ended (or vanished before it did), and matters before
    that only when it may be stuck or runs its reboot step (`reboot_step_runs`). The status updates of
    its steps in between do not: the node's state is written once the pod ended, for all its steps.
    Ended is `stage_pod_ended`: at its last container's end, not a second or two later at the terminal
    phase, so the node's next pod starts as soon as the host is idle.

    The gate is planned too when the pod ends, since a person's request held while it ran can be
    acted on now; not when the node's round is still in progress (`in_round`), since a request waits
    for the round's end, whose node write plans the gate anyway."""
    owner = stage_owner(pod)
    if owner is None:
        return Triggered()
    ended = stage_pod_ended(pod)
    if ended and (pod["metadata"].get("deletionTimestamp") or kind == "DELETED"):
        return Triggered()  # the operator deletes the pods it is done with: their going changes nothing
    if kind == "DELETED" or ended:
        return Triggered(now=(NodeKey(*owner),), later=() if in_round else (owner[0],))
    if pod_may_be_stuck(pod) or reboot_step_runs(pod):
        return Triggered(now=(NodeKey(*owner),))
    return Triggered()


def reboot_step_runs(pod: Obj) -> bool:
    """The pod holds a reboot, its last step, and runs it (its phase Running: every init container ended
    well): its node's round records the steps before it and says it reboots, before the boot ends."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(keys.INTERRUPT_LABEL) == "reboot" and (pod.get("status") or {}).get("phase") == "Running"


def on_prepull_pod(kind: EventKind, pod: Obj) -> tuple[str, str] | None:
    """The (gate, node) a prepull pod event is about, when the pod is one and the event matters: it
    ended, went, or its pull fails (its gate's plan then frees or fills a slot, and its node's round,
    waiting before its cordon, goes on or fails). Its pulls in between matter to no one."""
    owner = prepull_owner(pod)
    if owner is None:
        return None
    if kind == "DELETED" or pod_ended(pod) or pod_may_be_stuck(pod):
        return owner
    return None


def is_staging_pod(pod: Obj) -> bool:
    """A staging or undo pod (`gate.lifecycle.staging`): the fleet's, not a round's stage pod."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(keys.STAGE_KIND_LABEL) in ("staging", "unstage")


def on_staging_pod(kind: EventKind, pod: Obj) -> tuple[str, str] | None:
    """The (gate, node) a staging or undo pod event is about, when the event matters: the pod ended, went,
    or may be stuck. Its steps in between matter to no one."""
    owner = stage_owner(pod)
    if owner is None or not is_staging_pod(pod):
        return None
    if kind == "DELETED" or stage_pod_ended(pod) or pod_may_be_stuck(pod):
        return owner
    return None


def needs_taint_look(node: Obj) -> bool:
    """The node's taint or hand-off mark may have to go, or its hand-off condition change: the
    readiness taint, a `held-by` mark (released, or its condition not written yet), or the condition."""
    annotations = node["metadata"].get("annotations") or {}
    conditions = (node.get("status") or {}).get("conditions") or ()
    told = any(c.get("type") == keys.HAND_OFF_CONDITION for c in conditions)
    return keys.HELD_BY in annotations or told or taint.has_readiness_taint(taint.node_taints(node))


def joined_after(node: Obj, gate: Obj) -> bool:
    node_created, gate_created = created_at(node), created_at(gate)
    return node_created is not None and gate_created is not None and node_created > gate_created


__all__ = [
    "GateKey", "GateSeen", "JoinKey", "NodeKey", "PolicyKey", "TaintKey", "Triggered", "WorkKey", "gate_seen",
    "is_staging_pod", "joined_after", "needs_taint_look", "on_gate", "on_node", "on_pod", "on_policy",
    "on_prepull_pod", "on_staging_pod", "pod_may_be_stuck", "stage_owner",
]
