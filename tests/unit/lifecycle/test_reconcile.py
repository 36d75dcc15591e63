"""One gate reconcile as one plan (`gate.lifecycle.reconcile`): status with images, failure conditions
across the fleet, metric values, the disabled and the problem plans, without I/O."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.records import Refusal
from gate.api.state import Failure, NodeGateState, StateParseError, rollout_hash
from gate.lifecycle.condition import NodeCondition, failure_condition
from gate.lifecycle.fleet import FleetNode, NodeUpdate
from gate.lifecycle.reconcile import (
    failure_conditions,
    holders,
    plan_disabled,
    plan_finalizer,
    plan_problem,
    plan_reconcile,
    plan_release,
    plan_removal_reconcile,
    refused_reports,
    same_status,
    with_images,
)
from tests.unit.lifecycle.test_fleet import complete, fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, gate, node, started

TAINT = ((keys.READINESS_TAINT_KEY, "NoSchedule"),)
DIGEST = "sha256:" + "a" * 64


def _failed(g: NodeGate) -> NodeGateState:
    return NodeGateState(status="failed", round=1, batch=1, compartment="__default__",
                         failure=Failure(stage="apply", reason="StageFailed", package="k",
                                         generation=g.metadata.generation or 0, rollout_hash=rollout_hash(g)))


def _with_status(g: NodeGate, status: dict[str, Any]) -> NodeGate:
    return NodeGate.model_validate({**g.to_wire(), "status": status})


def _reconcile(g: NodeGate, fleet: list[FleetNode], status: dict[str, Any] | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = {"gates": [g], "now": NOW, "resolve_digests": True, "packages_in_use": {"k"}, **kw}
    return plan_reconcile(g, None, fleet, status=status or {}, **args)


# Failure conditions across the fleet.

def test_failure_conditions_follow_the_state_the_plan_leaves_on_each_node() -> None:
    g = gate({"k": PKG})
    kind = keys.failed_condition("g")
    failed = _failed(g)
    shown = failure_condition("g", failed)
    assert shown is not None
    fleet = [
        fleet_node("fails-now", state=started(g)),  # the plan fails it (a wait timeout, say)
        fleet_node("failed-shown", state=failed, conditions={kind: shown}),  # nothing to change
        fleet_node("retried", state=failed, conditions={kind: shown}),  # the plan gives it a new round
        fleet_node("left", state=failed, conditions={kind: shown}),  # the plan removes its record
        fleet_node("failed-unshown", state=failed),
        fleet_node("clean", state=complete(g)),
    ]
    updates = {"fails-now": NodeUpdate(state=failed), "retried": NodeUpdate(state=started(g)),
               "left": NodeUpdate(remove_state=True)}
    wanted = failure_conditions("g", fleet, updates)
    assert wanted == {"fails-now": shown, "retried": None, "left": None, "failed-unshown": shown}
    assert wanted["fails-now"] is not None and wanted["fails-now"].reason == "StageFailed"


def test_a_corrupt_record_shows_as_state_corrupt() -> None:
    corrupt = FleetNode(node(name="n1"), NOW, {"g": StateParseError("not JSON")})
    wanted = failure_conditions("g", [corrupt], {})
    assert wanted["n1"] is not None and wanted["n1"].reason == "StateCorrupt"


def test_a_reconcile_lists_the_failure_condition_of_a_node_that_failed() -> None:
    g = gate({"k": PKG})
    plan = _reconcile(g, [fleet_node("n1", state=_failed(g)), fleet_node("n2", state=complete(g))])
    assert set(plan.failure_conditions) == {"n1"}
    condition = plan.failure_conditions["n1"]
    assert isinstance(condition, NodeCondition) and condition.type == keys.failed_condition("g")


# The status, with the image records and ImagesResolved.

def test_the_status_keeps_the_image_records_and_says_images_resolved() -> None:
    record = {"package": "k", "reference": "example.com/pkg:1.0.0", "digest": DIGEST}
    g = _with_status(gate({"k": PKG, "p": {**PKG, "image": f"example.com/p@{DIGEST}"}}), {"images": [record]})
    status = with_images(g, {"conditions": []}, resolve_digests=True, now=NOW)
    assert status["images"] == [record]
    resolved = [c for c in status["conditions"] if c["type"] == "ImagesResolved"]
    assert len(resolved) == 1 and resolved[0]["status"] == "True"
    assert resolved[0]["message"] == ("1 package image(s) resolved to a digest for this rollout, "
                                      "1 pinned by digest in the spec")


def test_images_resolved_keeps_its_transition_time() -> None:
    earlier = (NOW - timedelta(days=2)).isoformat().replace("+00:00", "Z")
    resolved = {"type": "ImagesResolved", "status": "True", "reason": "Resolved", "message": "",
                "lastTransitionTime": earlier}
    g = _with_status(gate({"k": PKG}), {"conditions": [resolved]})
    status = with_images(g, {}, resolve_digests=True, now=NOW)
    assert status["conditions"][0]["lastTransitionTime"] == earlier


def test_without_digest_resolution_the_status_claims_no_record() -> None:
    record = {"package": "k", "reference": "example.com/pkg:1.0.0", "digest": DIGEST}
    g = _with_status(gate({"k": PKG}), {"images": [record]})
    status = with_images(g, {"conditions": []}, resolve_digests=False, now=NOW)
    assert status["images"] == [] and status["conditions"] == []


def test_the_reconcile_status_carries_images_and_removes_a_wait_that_ended() -> None:
    g = gate({"k": PKG})
    plan = _reconcile(g, [fleet_node("n1")], status={"waitingForPodsSince": "2026-11-30T11:00:00Z"})
    assert plan.status is not None
    assert plan.status["waitingForPodsSince"] is None  # a merge patch removes a field only when told
    assert plan.status["images"] == []
    assert "ImagesResolved" in {c["type"] for c in plan.status["conditions"]}


def test_a_status_written_already_is_not_written_again() -> None:
    g = gate({"k": PKG})
    fleet = [fleet_node("n1", state=complete(g))]
    first = _reconcile(g, fleet)
    assert first.status is not None
    later = NOW + timedelta(minutes=5)
    again = _reconcile(g, fleet, status=first.status, now=later)
    assert again.status is None
    assert same_status({"conditions": [{"type": "Ready", "lastTransitionTime": "a"}]},
                       {"conditions": [{"type": "Ready", "lastTransitionTime": "b"}]})
    assert not same_status({"status": "Ready"}, {"status": "Degraded"})


# Metric values.

def test_metric_values_count_nodes_compartments_drains_and_what_to_forget() -> None:
    g = gate({"k": PKG}, interruptionBudget={"count": 1})
    draining = started(g).model_copy(update={"phase": "drain", "drain_blocked_by": "pod a/b: budget"})
    fleet = [fleet_node("n1", state=draining), fleet_node("n2", state=complete(g)), fleet_node("n3", state=_failed(g)),
             fleet_node("n4")]
    plan = _reconcile(g, fleet, packages_in_use={"k", "other"})
    m = plan.metrics
    assert m is not None
    assert m.nodes["complete"] == 1 and m.nodes["failed"] == 1 and m.nodes["in-progress"] == 1
    assert m.nodes["waiting"] + m.nodes["blocked"] == 1
    assert m.drains_blocked == 1
    assert m.wait is not None and m.wait.nodes == 0 and m.wait.since is None
    default = m.compartments["__default__"]
    assert default.matched == 4 and default.ceiling == 1 and default.complete == 1 and default.failed == 1
    assert m.forget is not None and m.forget.compartments == {"__default__"}
    assert m.forget.packages == {"k"} and m.forget.all_packages == {"k", "other"}


def test_a_record_not_ours_is_reported_once() -> None:
    g = gate({"k": PKG})
    foreign = FleetNode(node(name="n1"), NOW, {}, refused={"g": Refusal(why="bad signature", record="r1")})
    plan = _reconcile(g, [foreign])
    assert [(r.node, r.record) for r in plan.refused] == [("n1", "r1")]
    assert [e.reason for e in plan.events if e.reason == "RecordNotOurs"] == ["RecordNotOurs"]
    assert "n1" in next(e.message for e in plan.events if e.reason == "RecordNotOurs")
    assert refused_reports("g", [foreign], {("g", "n1", "r1")}) == []
    again = _reconcile(g, [foreign], reported={("g", "n1", "r1")})
    assert again.refused == [] and all(e.reason != "RecordNotOurs" for e in again.events)


# The deleted gate, once no node holds its record.

def test_a_deleted_gate_waits_for_every_holder_then_cleans_what_it_left_and_lets_go() -> None:
    g = gate({"k": PKG}, readinessTaint=True, nodeSelector={"matchLabels": {"pool": "a"}})
    other = NodeGate.model_validate({**gate({"k": PKG}, readinessTaint=True).to_wire(),
                                     "metadata": {"name": "other", "generation": 1}})
    failed = NodeCondition(keys.failed_condition("g"), "True", "StageFailed", "apply failed")
    blocked = NodeCondition(keys.blocked_condition("g"), "True", "ProtectedPods", "job runs")
    fleet = [
        fleet_node("holder", annotations={keys.state_annotation("g"): "{}"}),
        fleet_node("waiting", labels={"pool": "a", keys.status_label("g"): "waiting"}),
        fleet_node("asked", annotations={keys.reset_annotation("g"): "true"}),
        fleet_node("tainted", taints=TAINT),
        fleet_node("conditions", conditions={failed.type: failed, blocked.type: blocked}),
        fleet_node("untouched"), fleet_node("not-selected", labels={"pool": "b"}, taints=TAINT),
    ]
    assert holders(g, fleet) == ["holder"]  # those uninstall first (plan_removal_reconcile)
    plan = plan_release(g, fleet[1:], gates=[g])
    assert plan.release is True
    assert set(plan.updates) == {"waiting", "asked", "tainted"}
    assert all(u.remove_state for u in plan.updates.values())  # the record's keys, the label, the requests
    assert plan.updates["tainted"].change.remove_readiness_taint is True
    assert [e.reason for e in plan.updates["tainted"].events] == ["ReadinessTaintRemoved"]
    assert not plan.updates["waiting"].change.remove_readiness_taint
    assert plan.failure_conditions == {"conditions": None} and plan.blocked_conditions == {"conditions": None}
    held = plan_release(g, fleet[1:], gates=[g, other])  # another gate still holds the taint
    assert "tainted" not in held.updates and held.release is True


# The disabled gate and the gate that cannot go on.

def test_a_disabled_gate_lifts_only_the_taints_it_alone_holds() -> None:
    g = gate({"k": PKG}, readinessTaint=True, nodeSelector={"matchLabels": {"pool": "a"}})
    other = NodeGate.model_validate({**gate({"k": PKG}, readinessTaint=True).to_wire(),
                                     "metadata": {"name": "other", "generation": 1}})
    fleet = [fleet_node("mine", taints=TAINT), fleet_node("not-selected", labels={"pool": "b"}, taints=TAINT),
             fleet_node("untainted")]
    plan = plan_disabled(g, fleet, status={}, gates=[], now=NOW)
    assert set(plan.updates) == {"mine"}
    assert plan.updates["mine"].change.remove_readiness_taint is True
    assert [e.reason for e in plan.updates["mine"].events] == ["ReadinessTaintRemoved"]
    held = plan_disabled(g, fleet, status={}, gates=[other], now=NOW)  # another gate holds the node back
    assert held.updates == {}


def test_a_disabled_gate_says_so_and_keeps_its_transition_times() -> None:
    g = gate({"k": PKG})
    plan = plan_disabled(g, [], status={"status": "Ready", "conditions": [
        {"type": "Reconciling", "status": "True"}, {"type": "Ready", "status": "True"}]}, gates=[], now=NOW)
    assert plan.status is not None and plan.status["status"] == "Disabled"
    by_type = {c["type"]: c for c in plan.status["conditions"]}
    assert set(by_type) == {"Ready", "Disabled", "Progressing"}  # neither Reconciling nor Stalled
    assert by_type["Progressing"]["status"] == "False"
    later = plan_disabled(g, [], status=plan.status, gates=[], now=NOW + timedelta(hours=1))
    assert later.status is None  # the same status: nothing to write
    assert plan.events == [] and plan.metrics is None and plan.failure_conditions == {}


def test_a_missing_policy_makes_the_gate_degraded_and_stalled() -> None:
    g = gate({"k": PKG})
    plan = plan_problem(g, status={"conditions": [{"type": "Ready", "status": "True"},
                                                  {"type": "Reconciling", "status": "True"}]},
                        reason="PolicyNotFound", message="DeploymentPolicy p does not exist", now=NOW)
    assert plan.status is not None and plan.status["status"] == "Degraded"
    by_type = {c["type"]: c for c in plan.status["conditions"]}
    assert set(by_type) == {"Ready", "Degraded", "Stalled"}
    assert by_type["Stalled"]["reason"] == "PolicyNotFound"
    assert [(e.type, e.reason, e.message) for e in plan.events] == [
        ("Warning", "PolicyNotFound", "DeploymentPolicy p does not exist")]
    assert plan.updates == {}
    # The problem holds an hour later: the conditions keep their time, so only the Event is planned again.
    later = plan_problem(g, status=plan.status, reason="PolicyNotFound", message="DeploymentPolicy p does not exist",
                         now=NOW + timedelta(hours=1))
    assert later.status is None and [e.reason for e in later.events] == ["PolicyNotFound"]
    # Another problem, the gate still Degraded: the new message is written, and the time is still the first one.
    other = plan_problem(g, status=plan.status, reason="PolicyInvalid", message="DeploymentPolicy p is invalid",
                         now=NOW + timedelta(hours=2))
    assert other.status is not None
    assert [(c["type"], c["reason"], c["lastTransitionTime"]) for c in other.status["conditions"][-2:]] == [
        (t, "PolicyInvalid", by_type[t]["lastTransitionTime"]) for t in ("Degraded", "Stalled")]


# The removal.

def test_a_removal_plan_looks_at_every_holder_and_keeps_the_images() -> None:
    g = gate({"k": {**PKG, "uninstall": {"enabled": True}}})
    g = NodeGate.model_validate({**g.to_wire(), "metadata": {**g.to_wire()["metadata"],
                                                              "deletionTimestamp": "2026-11-30T11:00:00Z"}})
    fleet = [fleet_node("n1", state=complete(g)), fleet_node("n2", state=complete(g))]
    plan = plan_removal_reconcile(g, None, fleet, status={}, holders=["n1", "n2"], now=NOW, resolve_digests=True)
    assert plan.node_keys == ["n1", "n2"]
    assert plan.releasable is not None
    assert plan.status is not None and "ImagesResolved" in {c["type"] for c in plan.status["conditions"]}
    assert plan.metrics is not None and plan.metrics.wait is None and plan.metrics.forget is None


def test_the_finalizer_is_a_plan_of_its_own_until_the_gate_has_it() -> None:
    g = gate({"k": PKG})
    plan = plan_finalizer(g.model_copy(update={"metadata": g.metadata.model_copy(update={"finalizers": []})}))
    assert plan is not None and plan.add_finalizer and not plan.updates and plan.status is None
    held = g.metadata.model_copy(update={"finalizers": [keys.FINALIZER]})
    assert plan_finalizer(g.model_copy(update={"metadata": held})) is None
