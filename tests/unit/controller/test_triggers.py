"""Which work each watch event asks for (gate.controller.triggers): pure, on objects as the API sends them."""

from __future__ import annotations

import json
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.api.state import NodeGateState
from gate.controller.pods import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION, STEPS_ANNOTATION
from gate.controller.triggers import (
    GateKey,
    HistoryKey,
    JoinKey,
    NodeKey,
    PolicyKey,
    TaintKey,
    Triggered,
    gate_seen,
    on_gate,
    on_node,
    on_pod,
    on_policy,
)


def gate(name: str, *, generation: int = 1, created: str = "2026-12-01T10:00:00Z", **spec: Any) -> Obj:
    return {"metadata": {"name": name, "generation": generation, "creationTimestamp": created}, "spec": spec}


def node(name: str, *, created: str = "2026-12-01T09:00:00Z", states: dict[str, str] | None = None) -> Obj:
    annotations = {keys.state_annotation(g): NodeGateState(status=s).dump() for g, s in (states or {}).items()}
    return {"metadata": {"name": name, "creationTimestamp": created, "annotations": annotations}}


def owned(kind: str, *, conditions: list[Obj] | None = None, phase: str | None = None,
          waiting: str | None = None) -> Obj:
    status: Obj = {"conditions": conditions or []}
    if phase:
        status["phase"] = phase
    if waiting:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting}}}]
    return {"kind": kind, "metadata": {"name": "ng-apply-1", "annotations": {GATE_NAME_ANNOTATION: "g",
                                                                            NODE_NAME_ANNOTATION: "n1"}},
            "status": status}


def test_a_gate_event_plans_the_gate_and_steps_its_nodes_only_when_its_spec_or_deletion_changed() -> None:
    nodes = [node("n1", states={"g": "complete"}), node("n2", states={"other": "in-progress"}), node("n3")]
    first = on_gate(gate("g"), None, nodes)
    assert first == Triggered(now=(GateKey("g"), NodeKey("g", "n1"), HistoryKey("g")))
    # Its status written again (same generation, not deleted): the operator wrote it from its plan.
    assert on_gate(gate("g"), gate_seen(gate("g")), nodes) == Triggered()
    # A request or a finalizer: the plan reads them, its nodes do not.
    asked = gate("g")
    asked["metadata"]["annotations"] = {keys.RESUME_ANNOTATION: "*"}
    assert on_gate(asked, gate_seen(gate("g")), nodes) == Triggered(now=(GateKey("g"),))
    finalized = gate("g")
    finalized["metadata"]["finalizers"] = [keys.FINALIZER]
    assert on_gate(finalized, gate_seen(gate("g")), nodes) == Triggered(now=(GateKey("g"),))
    assert on_gate(gate("g", generation=2), gate_seen(gate("g")), nodes).now[1:] == (NodeKey("g", "n1"),
                                                                                   HistoryKey("g"))
    # Gone: plan it once more (its metrics go), whatever it looked like last.
    assert on_gate(gate("g"), gate_seen(gate("g")), nodes, kind="DELETED").now == (GateKey("g"),)
    deleting = gate("g")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T11:00:00Z"
    assert NodeKey("g", "n1") in on_gate(deleting, gate_seen(gate("g")), nodes).now
    # A gate being deleted gets no new revision.
    assert HistoryKey("g") not in on_gate(deleting, gate_seen(gate("g")), nodes).now


def test_a_policy_event_plans_the_gates_that_use_it() -> None:
    gates = [gate("a", deploymentPolicy="p"), gate("b", deploymentPolicy="q"), gate("c")]
    assert on_policy("MODIFIED", {"metadata": {"name": "p"}}, gates) == Triggered(now=(PolicyKey("p"), GateKey("a")))
    assert on_policy("DELETED", {"metadata": {"name": "p"}}, gates) == Triggered(now=(GateKey("a"),))
    # A gate event looks at every policy: the one it left no longer lists it.
    policies = [{"metadata": {"name": "p"}}, {"metadata": {"name": "q"}}]
    assert on_gate(gate("g", generation=2), gate_seen(gate("g")), [], policies).now == (
        GateKey("g"), PolicyKey("p"), PolicyKey("q"), HistoryKey("g"))


def test_a_node_event_steps_gates_in_progress_there_and_plans_the_rest_after_the_debounce() -> None:
    gates = [gate("busy"), gate("done"), gate("taints", readinessTaint=True)]
    n = node("n1", states={"busy": "in-progress", "done": "complete"})
    changed = on_node("MODIFIED", n, gates)
    assert changed == Triggered(now=(NodeKey("busy", "n1"),), later=("busy", "done", "taints"))
    assert on_node("DELETED", n, gates).now == ()
    # A node older than the gate (the initial list) is the plan's to taint; one joining after it, now.
    assert JoinKey("taints", "n1") not in on_node("ADDED", n, gates).now
    joined = node("n2", created="2026-12-01T12:00:00Z")
    assert on_node("ADDED", joined, gates) == Triggered(now=(JoinKey("taints", "n2"), GateKey("taints")),
                                                        later=("busy", "done"))


def test_a_node_event_steps_the_gates_the_caller_parsed_in_a_round_without_reading_the_annotations() -> None:
    gates = [gate("busy"), gate("done")]
    n = node("n1", states={"busy": "in-progress", "done": "complete"})
    assert on_node("MODIFIED", n, gates, in_round={"busy"}) == on_node("MODIFIED", n, gates)
    # What the operator parsed is what counts: it read the same annotations once, for its plans.
    assert on_node("MODIFIED", n, gates, in_round=()).now == ()
    assert on_node("MODIFIED", node("n2"), gates, in_round={"done"}).now == (NodeKey("done", "n2"),)
    assert on_node("DELETED", n, gates, in_round={"busy"}).now == ()


def test_a_node_event_that_cannot_change_a_plan_plans_no_gate_but_still_steps_the_node() -> None:
    gates = [gate("busy"), gate("taints", readinessTaint=True)]
    n = node("n1", states={"busy": "in-progress"})
    assert on_node("MODIFIED", n, gates, replan=None) == Triggered(now=(NodeKey("busy", "n1"),))
    assert on_node("MODIFIED", n, gates, replan="soon") == Triggered(now=(NodeKey("busy", "n1"),),
                                                                     soon=("busy", "taints"))
    # A node joining after a readiness gate is tainted and the gate planned whatever the rest says.
    joined = node("n2", created="2026-12-01T12:00:00Z")
    assert on_node("ADDED", joined, gates, replan=None).now == (JoinKey("taints", "n2"), GateKey("taints"))


def test_a_node_is_stepped_on_its_parsed_status_not_on_text_in_its_state() -> None:
    n = node("n1")
    n["metadata"]["annotations"][keys.state_annotation("g")] = NodeGateState(
        status="failed", compartment="in-progress").dump()
    assert on_node("MODIFIED", n, [gate("g")]).now == ()


def test_a_stage_pod_moves_its_node_when_it_ended_vanished_or_may_be_stuck() -> None:
    # Its steps' progress in between does not: the node is written once the pod ended.
    assert on_pod("MODIFIED", owned("Pod", phase="Running")) == Triggered()
    assert on_pod("MODIFIED", owned("Pod", phase="Pending", waiting="PodInitializing")) == Triggered()
    assert on_pod("MODIFIED", owned("Pod", phase="Pending", waiting="ErrImagePull")).now == (NodeKey("g", "n1"),)
    # A pod that holds a reboot, at its last step (Running): the steps before it are recorded before the boot ends.
    reboot = owned("Pod", phase="Running")
    reboot["metadata"].setdefault("labels", {})[keys.INTERRUPT_LABEL] = "reboot"
    assert on_pod("MODIFIED", reboot).now == (NodeKey("g", "n1"),)
    for phase in ("Succeeded", "Failed"):
        assert on_pod("MODIFIED", owned("Pod", phase=phase)) == Triggered(now=(NodeKey("g", "n1"),), later=("g",))
    assert on_pod("DELETED", owned("Pod", phase="Running")) == Triggered(now=(NodeKey("g", "n1"),), later=("g",))
    # Mid-round, the gate waits for the round's end (its node write plans it), not for each pod's.
    for kind, phase in (("MODIFIED", "Succeeded"), ("DELETED", "Running")):
        assert on_pod(kind, owned("Pod", phase=phase), in_round=True) == Triggered(now=(NodeKey("g", "n1"),))
    # The operator deleting a pod it recorded: nothing to do again.
    gone = owned("Pod", phase="Succeeded")
    assert on_pod("DELETED", gone) == Triggered()
    gone["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    assert on_pod("MODIFIED", gone) == Triggered()
    assert on_pod("MODIFIED", {"metadata": {"name": "someone-elses"}}) == Triggered()


def test_a_stage_pod_moves_its_node_at_its_last_container_end_not_at_the_terminal_phase() -> None:
    """The kubelet writes the terminal phase a second or two after the containers' ends (once it stopped
    the sandbox): the node's next pod need not wait for it."""
    pod = owned("Pod", phase="Running")
    pod["metadata"]["annotations"][STEPS_ANNOTATION] = json.dumps([["base", "apply", "fp", None]])
    pod["status"]["initContainerStatuses"] = [{"name": "payload-base", "state": {"terminated": {"exitCode": 0}}}]
    pod["status"]["containerStatuses"] = [{"name": "apply-base", "state": {"running": {}}}]
    assert on_pod("MODIFIED", pod) == Triggered()
    pod["status"]["containerStatuses"] = [{"name": "apply-base", "state": {"terminated": {"exitCode": 0}}}]
    assert on_pod("MODIFIED", pod) == Triggered(now=(NodeKey("g", "n1"),), later=("g",))
    # Its going after the operator deleted it changes nothing, terminal phase written or not.
    pod["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    assert on_pod("MODIFIED", pod) == Triggered()
    assert on_pod("DELETED", pod) == Triggered()


def test_keys_read_as_paths_in_logs_and_name_their_kind_for_metrics() -> None:
    assert (str(NodeKey("g", "n1")), NodeKey("g", "n1").kind) == ("node/g/n1", "node")
    assert (str(GateKey("g")), GateKey("g").kind, JoinKey("g", "n").kind) == ("gate/g", "gate", "join")


def tainted(name: str) -> Obj:
    obj = node(name)
    obj["spec"] = {"taints": [{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}]}
    return obj


def test_a_tainted_node_is_looked_at_on_each_of_its_events_and_on_each_gate_change() -> None:
    """The readiness taint follows membership: the taint reconcile decides, the triggers only ask."""
    assert TaintKey("n1") in on_node("MODIFIED", tainted("n1"), []).now
    assert TaintKey("n1") not in on_node("MODIFIED", node("n1"), []).now
    assert TaintKey("n1") not in on_node("DELETED", tainted("n1"), []).now
    nodes = [tainted("n1"), node("n2")]
    edited = on_gate(gate("g", generation=2), gate_seen(gate("g")), nodes)
    assert TaintKey("n1") in edited.now and TaintKey("n2") not in edited.now
    assert TaintKey("n1") in on_gate(gate("g"), gate_seen(gate("g")), nodes, kind="DELETED").now


def test_a_node_held_for_hand_off_or_told_so_is_looked_at_by_the_taint_reconcile() -> None:
    held = node("n1")
    held["metadata"]["annotations"][keys.HELD_BY] = "g"
    held["spec"] = {"unschedulable": True}
    assert on_node("MODIFIED", held, []).now == (TaintKey("n1"),)  # its condition may be due
    held["spec"] = {"unschedulable": False}
    assert on_node("MODIFIED", held, []).now == (TaintKey("n1"),)  # released: the mark must go
    told = node("n2")
    told["status"] = {"conditions": [{"type": keys.HAND_OFF_CONDITION, "status": "True"}]}
    assert on_node("MODIFIED", told, []).now == (TaintKey("n2"),)  # released: the condition must go
    assert on_node("MODIFIED", node("n3"), []).now == ()
    assert on_node("DELETED", held, []).now == ()
