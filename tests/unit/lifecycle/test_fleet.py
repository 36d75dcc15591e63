"""One gate across the fleet: starts, requeues, requests, taints and the status, without I/O."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import Failure, Installed, NodeGateState, StateParseError, rollout_hash, spec_hash
from gate.lifecycle.fleet import FleetNode, GatePlan, plan_gate, replan
from gate.lifecycle.taint import orphan_taint
from gate.lifecycle.work import constraint_error, constraint_satisfied, package_work
from tests.unit.lifecycle.test_machine import NOW, PKG, gate, node, started


def fleet_node(name: str, *, labels: dict[str, str] | None = None, state: NodeGateState | None = None,
               created_after: bool = False, **view: Any) -> FleetNode:
    states: dict[str, NodeGateState | StateParseError] = {"g": state} if state is not None else {}
    return FleetNode(node(name=name, labels=labels or {"pool": "a"}, **view),
                     NOW + timedelta(hours=1) if created_after else NOW - timedelta(days=1), states)


def complete(g: NodeGate, **kw: Any) -> NodeGateState:
    installed = {n: Installed(version=p.version, spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()}
    return NodeGateState(status="complete", installed=installed, round=1, batch=1, **kw)


def test_budget_bounds_the_first_starts_and_status_counts_them() -> None:
    g = gate({"k": PKG}, interruptionBudget={"count": 2})
    plan = plan_gate(g, None, [fleet_node(f"n{i}") for i in range(5)], gates=[g], now=NOW)
    started = [n for n, u in plan.updates.items() if u.state is not None and u.state.status == "in-progress"]
    assert len(started) == 2 and sorted(plan.active) == sorted(started)
    assert plan.status.nodes.in_progress == 2 and plan.status.nodes.waiting == 3
    assert plan.status.progress == "0/5" and plan.status.status == "Progressing"
    for name in started:
        assert plan.updates[name].state.round == 1  # type: ignore[union-attr]


def test_a_version_change_puts_complete_nodes_back_in_line() -> None:
    old = gate({"k": PKG})
    new = gate({"k": {**PKG, "version": "1.1.0"}})
    plan = plan_gate(new, None, [fleet_node("n1", state=complete(old))], gates=[new], now=NOW)
    update = plan.updates["n1"]
    assert update.state is not None and update.state.status == "in-progress" and update.state.round == 2


def _next_generation(g: NodeGate, **spec: Any) -> NodeGate:
    """`g` after a spec write: the API server bumps the generation for any change of spec, a pause too."""
    raw = g.to_wire()
    raw["metadata"]["generation"] = (g.metadata.generation or 0) + 1
    raw["spec"].update(spec)
    return NodeGate.model_validate(raw)


def _failed(g: NodeGate) -> NodeGateState:
    return NodeGateState(status="failed", round=1, batch=1, compartment="__default__",
                         failure=Failure(stage="apply", reason="StageFailed", generation=g.metadata.generation or 0,
                                         rollout_hash=rollout_hash(g)))


def _untouched(plan: GatePlan, node: str) -> bool:
    return node not in plan.updates or plan.updates[node].state is None


def test_failed_nodes_retry_only_after_the_rollout_spec_changed() -> None:
    g = gate({"k": PKG})
    failed = _failed(g)
    assert _untouched(plan_gate(g, None, [fleet_node("n1", state=failed)], gates=[g], now=NOW), "n1")
    fixed = _next_generation(g, packages={"k": {**PKG, "version": "1.0.1"}})
    retry = plan_gate(fixed, None, [fleet_node("n1", state=failed)], gates=[fixed], now=NOW)
    assert retry.updates["n1"].state is not None and retry.updates["n1"].state.status == "in-progress"


def test_pausing_and_unpausing_keep_a_failed_node_failed() -> None:
    g = gate({"k": PKG})
    failed = _failed(g)
    paused = _next_generation(g, paused=True)
    unpaused = _next_generation(paused, paused=False)
    for later in (paused, unpaused):
        plan = plan_gate(later, None, [fleet_node("n1", state=failed)], gates=[later], now=NOW)
        assert _untouched(plan, "n1") and plan.status.nodes.failed == 1, later.metadata.generation


def test_a_failure_recorded_without_the_hash_retries_after_a_generation_change() -> None:
    # A state written by an operator that did not record the hash yet: the generation decides, as it did.
    g = gate({"k": PKG})
    legacy = NodeGateState(status="failed", round=1, batch=1,
                           failure=Failure(stage="apply", reason="StageFailed", generation=1))
    assert _untouched(plan_gate(g, None, [fleet_node("n1", state=legacy)], gates=[g], now=NOW), "n1")
    newer = _next_generation(g)
    retry = plan_gate(newer, None, [fleet_node("n1", state=legacy)], gates=[newer], now=NOW)
    assert retry.updates["n1"].state is not None and retry.updates["n1"].state.status == "in-progress"


def _stopped(g: NodeGate) -> NodeGate:
    """`g` as the operator leaves it after its compartment stopped: batch 3 planned at size 1."""
    raw = g.to_wire()
    raw["status"] = {"observedGeneration": g.metadata.generation, "rolloutHash": rollout_hash(g),
                     "compartments": [{"name": "__default__", "state": "stopped", "batch": 3, "batchSize": 1,
                                       "consecutiveFailures": 2, "matched": 3, "failed": 2}]}
    return NodeGate.model_validate(raw)


def test_pausing_and_unpausing_keep_a_stopped_compartment_and_its_batch() -> None:
    g = gate({"k": PKG}, interruptionBudget={"count": 3})
    base = _stopped(g)
    fleet = [fleet_node("n1", state=_failed(g).model_copy(update={"batch": 1})),
             fleet_node("n2", state=_failed(g).model_copy(update={"batch": 2})), fleet_node("n3")]
    paused = _next_generation(base, paused=True)  # the status is the one written before the pause
    unpaused = _next_generation(paused, paused=False)
    for later in (base, paused, unpaused):
        plan = plan_gate(later, None, fleet, gates=[later], now=NOW)
        [comp] = plan.status.compartments
        assert (comp.state, comp.batch, comp.batch_size, comp.consecutive_failures) == ("stopped", 3, 1, 2)
        assert plan.active == [] and _untouched(plan, "n1") and _untouched(plan, "n2")
        assert plan.status.rollout_hash == rollout_hash(g)


def test_a_rollout_spec_change_resumes_a_stopped_compartment_and_starts_batches_small() -> None:
    g = gate({"k": PKG}, interruptionBudget={"count": 3})
    fixed = _next_generation(g, packages={"k": {**PKG, "version": "1.0.1"}})
    changed = _next_generation(_stopped(g), packages={"k": {**PKG, "version": "1.0.1"}})
    plan = plan_gate(changed, None, [fleet_node("n1", state=_failed(g)), fleet_node("n2")], gates=[changed],
                     now=NOW)
    [comp] = plan.status.compartments
    assert comp.state == "rolling" and comp.consecutive_failures == 0
    assert plan.status.rollout_hash == rollout_hash(fixed) != rollout_hash(g)


def test_the_rollout_hash_covers_all_of_the_spec_but_paused() -> None:
    g = gate({"k": PKG})
    assert rollout_hash(_next_generation(g, paused=True)) == rollout_hash(g)
    # A default spelt out, as the mutating webhook writes it, is no change either.
    assert rollout_hash(_next_generation(g, priority=200, packages={"k": {**PKG, "retries": 2}})) == rollout_hash(g)
    for change in ({"packages": {"k": {**PKG, "version": "1.0.1"}}},
                   {"packages": {"k": {**PKG, "config": {"a": "1"}}}},
                   {"packages": {"k": {**PKG, "env": [{"name": "X", "value": "1"}]}}},
                   {"packages": {"k": {**PKG, "image": "example.com/other"}}},
                   {"packages": {"k": {**PKG, "resources": {"limits": {"cpu": "1"}}}}},
                   {"nodeSelector": {"matchLabels": {"pool": "b"}}},
                   {"deploymentPolicy": "fleet"},
                   {"interruptionBudget": {"count": 1}}):
        assert rollout_hash(_next_generation(g, **change)) != rollout_hash(g), change


def test_a_node_joining_after_a_readiness_gate_is_tainted_and_an_old_one_is_not() -> None:
    g = gate({"k": PKG}, readinessTaint=True)
    plan = plan_gate(g, None, [fleet_node("old"), fleet_node("new", created_after=True)], gates=[g], now=NOW,
                     gate_created=NOW)
    assert plan.updates["new"].change.add_readiness_taint
    assert not plan.updates["old"].change.add_readiness_taint


def test_a_spec_change_never_puts_the_readiness_taint_back_on_nodes_that_passed() -> None:
    # Nodes that joined after the gate, passed it and lost the taint; then a version bump (budget 1).
    old = gate({"k": PKG}, readinessTaint=True)
    new = NodeGate.model_validate({**gate({"k": {**PKG, "version": "1.1.0"}}, readinessTaint=True,
                                          interruptionBudget={"count": 1}).to_wire(),
                                   "metadata": {"name": "g", "generation": 2}})
    fleet = [fleet_node(f"n{i}", state=complete(old, boot_id="boot-1", generation=1), created_after=True)
             for i in range(4)]
    plan = plan_gate(new, None, fleet, gates=[new], now=NOW, gate_created=NOW)
    assert not [n for n, u in plan.updates.items() if u.change.add_readiness_taint]
    requeued = [u.state for u in plan.updates.values() if u.state is not None and u.state.status == "waiting"]
    assert len(requeued) == 3 and all(s.passed for s in requeued)
    # The next reconcile reads the requeued (waiting) states back: still no taint.
    again = plan_gate(new, None, [fleet_node(f"n{i}", state=s, created_after=True) for i, s in enumerate(requeued)],
                      gates=[new], now=NOW, gate_created=NOW)
    assert not [n for n, u in again.updates.items() if u.change.add_readiness_taint]


def test_a_node_that_reboots_before_it_ever_passed_is_tainted_again() -> None:
    g = gate({"k": PKG}, readinessTaint=True)
    first = started(g).model_copy(update={"boot_id": "boot-1"})
    plan = plan_gate(g, None, [fleet_node("n1", state=first, boot_id="boot-2")], gates=[g], now=NOW,
                     gate_created=NOW)
    assert plan.updates["n1"].change.add_readiness_taint
    served = first.model_copy(update={"passed": True})
    plan = plan_gate(g, None, [fleet_node("n1", state=served, boot_id="boot-2")], gates=[g], now=NOW,
                     gate_created=NOW)
    assert "n1" not in plan.updates or not plan.updates["n1"].change.add_readiness_taint


def test_reset_request_starts_the_node_from_scratch_and_undoes_our_cordon() -> None:
    g = gate({"k": PKG})
    failed = complete(g).model_copy(update={"status": "failed", "cordoned": True})
    request = {keys.reset_annotation("g"): "now", keys.CORDONED_BY: "g"}
    plan = plan_gate(g, None, [fleet_node("n1", state=failed, annotations=request, unschedulable=True)],
                     gates=[g], now=NOW)
    up = plan.updates["n1"]
    assert up.state is not None and up.state.installed == {} and up.state.round == 2
    assert keys.reset_annotation("g") in up.remove_annotations
    assert up.change.unschedulable is False and up.change.clear_cordoned_by


def test_reset_replaces_an_unreadable_state() -> None:
    g = gate({"k": PKG})
    broken = FleetNode(node(name="n1", labels={}, annotations={keys.reset_annotation("g"): "x"}), None,
                       {"g": StateParseError("hand-edited")})
    plan = plan_gate(g, None, [broken], gates=[g], now=NOW)
    assert plan.updates["n1"].state is not None


def test_unreadable_state_is_reported_failed_and_left_alone() -> None:
    g = gate({"k": PKG})
    broken = FleetNode(node(name="n1", labels={}), None, {"g": StateParseError("hand-edited")})
    plan = plan_gate(g, None, [broken], gates=[g], now=NOW)
    up = plan.updates["n1"]
    assert up.change.status == "failed" and up.state is None and not up.remove_state
    assert plan.status.nodes.failed == 1


def test_a_node_leaving_the_selector_is_released() -> None:
    g = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "a"}})
    state = complete(g).model_copy(update={"status": "failed", "cordoned": True})
    plan = plan_gate(g, None, [fleet_node("n1", labels={"pool": "b"}, state=state, unschedulable=True,
                                          annotations={keys.CORDONED_BY: "g"})], gates=[g], now=NOW)
    up = plan.updates["n1"]
    assert up.remove_state and up.change.unschedulable is False


def test_resume_request_clears_a_stopped_compartment() -> None:
    raw = gate({"k": PKG}).to_wire()
    raw["metadata"]["annotations"] = {keys.RESUME_ANNOTATION: "*"}
    raw["status"] = {"observedGeneration": 1, "compartments": [{"name": "__default__", "state": "stopped",
                                                                "batch": 3, "batchSize": 1,
                                                                "consecutiveFailures": 3}]}
    g = NodeGate.model_validate(raw)
    plan = plan_gate(g, None, [fleet_node("n1")], gates=[g], now=NOW)
    assert plan.resumed
    [comp] = plan.status.compartments
    assert comp.state != "stopped" and comp.consecutive_failures == 0
    assert "n1" in plan.active


def test_package_work_table() -> None:
    g = gate({"p1": {**PKG, "config": {"a.conf": "1", "b.txt": "2"},
                     "configInterrupts": {"*.conf": {"type": "service", "services": ["s"]}},
                     "interrupt": {"type": "reboot"}, "uninstall": {"enabled": True}}})
    pkg = g.spec.packages["p1"]
    fresh = package_work("p1", pkg, None)
    assert fresh.stages == ("apply", "config") and fresh.interrupt.type == "reboot"
    ok = Installed(version="1.0.0", spec_hash=spec_hash(pkg), config={})
    only_config = package_work("p1", pkg, ok)
    assert only_config.stages == ("config",) and only_config.interrupt.type == "service"
    older = Installed(version="0.9.0", spec_hash="x")
    assert package_work("p1", pkg, older).stages[0] == "upgrade"
    newer = Installed(version="2.0.0", spec_hash="x")
    assert package_work("p1", pkg, newer).stages[:2] == ("uninstall", "apply")


def test_version_constraints() -> None:
    assert constraint_satisfied(">=1.2.0 <2", "1.9.9") and not constraint_satisfied(">=1.2.0 <2", "2.0.0")
    assert constraint_satisfied("^0.3", "0.3.9") and not constraint_satisfied("^0.3", "0.4.0")
    assert constraint_error("one point two") is not None and constraint_error("~1.2") is None


def test_a_rerun_of_a_failed_node_waits_until_its_batch_is_judged() -> None:
    raw = gate({"k": PKG}).to_wire()
    failed = NodeGateState(status="failed", round=1, batch=2, compartment="__default__",
                           failure=Failure(stage="apply", reason="StageFailed", generation=1))
    request = {keys.rerun_annotation("g"): "k/apply"}
    raw["status"] = {"observedGeneration": 1, "compartments": [{"name": "__default__", "batch": 2, "batchSize": 1}]}
    open_batch = NodeGate.model_validate(raw)
    held = plan_gate(open_batch, None, [fleet_node("n1", state=failed, annotations=request)], gates=[open_batch],
                     now=NOW)
    assert "n1" not in held.updates or keys.rerun_annotation("g") not in held.updates["n1"].remove_annotations
    raw["status"]["compartments"][0]["batch"] = 3
    judged = NodeGate.model_validate(raw)
    done = plan_gate(judged, None, [fleet_node("n1", state=failed, annotations=request)], gates=[judged], now=NOW)
    assert keys.rerun_annotation("g") in done.updates["n1"].remove_annotations


def test_a_node_leaving_the_selector_while_waiting_loses_the_gate_label() -> None:
    g = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "a"}})
    waiting = fleet_node("n1", labels={"pool": "b", keys.status_label("g"): "waiting"})
    plan = plan_gate(g, None, [waiting, fleet_node("n2", labels={"pool": "b"})], gates=[g], now=NOW)
    assert plan.updates["n1"].remove_state and "n2" not in plan.updates
    assert plan.status.nodes.matched == 0



def test_a_restart_request_starts_the_rollout_afresh_with_small_batches_and_is_acted_on_once() -> None:
    policy = DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"default": {
        "budget": {"count": 10}, "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}}}}})
    g = gate({"k": PKG}, deploymentPolicy="p")
    raw = g.to_wire()
    # Batches had grown to 4 when a person reset the gate: every node waits to run it again.
    raw["status"] = {"observedGeneration": g.metadata.generation, "rolloutHash": rollout_hash(g),
                     "compartments": [{"name": "__default__", "state": "rolling", "batch": 3, "batchSize": 4,
                                       "matched": 10}]}
    grown = NodeGate.model_validate(raw)
    fleet = [fleet_node(f"n{i}") for i in range(10)]
    carried_on = plan_gate(grown, policy, fleet, gates=[grown], now=NOW)
    raw["metadata"]["annotations"] = {keys.RESTART_ANNOTATION: "2026-12-01T00:00:00Z"}
    restarted_gate = NodeGate.model_validate(raw)
    restarted = plan_gate(restarted_gate, policy, fleet, gates=[restarted_gate], now=NOW)
    assert len(restarted.active) < len(carried_on.active)
    [comp] = restarted.status.compartments
    assert comp.batch_size == len(restarted.active) == 1
    assert restarted.requests_done == [keys.RESTART_ANNOTATION] and carried_on.requests_done == []
    assert [e.reason for e in restarted.events if e.reason == "Restarted"] == ["Restarted"]


def _summary(plan: GatePlan) -> tuple[object, ...]:
    starts = sorted(n for n, u in plan.updates.items() if u.state is not None and u.state.status == "in-progress")
    labels = sorted((n, u.change.status) for n, u in plan.updates.items())
    return tuple(starts), tuple(labels), plan.status.nodes, plan.status.compartments, sorted(plan.active)


def test_a_round_moving_through_its_phases_calls_for_no_plan_and_plans_alike() -> None:
    # The operator plans no gate on such node events (gate.controller.world.node_replans): this is
    # what makes that safe. Two fleets alike but for the phases of the rounds in progress plan alike.
    g = gate({"k": PKG}, interruptionBudget={"count": 3})
    running = NodeGateState(status="in-progress", round=1, batch=1, compartment="__default__", phase="stages",
                            cordoned=True, boot_id="b1")
    later = running.model_copy(update={"phase": "post-interrupt", "post_checked": ["k"], "attempts": {"k/apply": 1}})
    rest = [fleet_node(f"w{i}") for i in range(4)]
    before = [fleet_node("n1", state=running), *rest]
    after = [fleet_node("n1", state=later), *rest]
    assert replan(before[0], after[0]) is None
    assert _summary(plan_gate(g, None, before, gates=[g], now=NOW)) == _summary(
        plan_gate(g, None, after, gates=[g], now=NOW))
    # The kubelet's readiness is no input either: no plan reads it.
    assert replan(fleet_node("n1", ready=False), fleet_node("n1", ready=True)) is None


def test_a_change_that_may_let_a_node_start_calls_for_a_plan_now_and_one_that_moves_figures_soon() -> None:
    g = gate({"k": PKG})
    running = NodeGateState(status="in-progress", round=1, batch=1, compartment="__default__", phase="stages",
                            boot_id="b1")
    n1 = fleet_node("n1", state=running)
    # The round's end, and anything outside the operator: labels, a person's request, taints, a
    # reboot, a node joining or leaving.
    for change in ({"status": "complete"}, {"status": "failed"}):
        assert replan(n1, fleet_node("n1", state=running.model_copy(update=change))) == "now", change
    assert replan(fleet_node("n1", labels={"pool": "b"}), fleet_node("n1")) == "now"
    assert replan(fleet_node("n1"), fleet_node("n1", annotations={keys.reset_annotation("g"): ""})) == "now"
    assert replan(fleet_node("n1"), fleet_node("n1", taints=((keys.READINESS_TAINT_KEY, "NoSchedule"),))) == "now"
    assert replan(fleet_node("n1"), fleet_node("n1", boot_id="boot-2")) == "now"
    assert replan(None, n1) == replan(n1, None) == "now"
    done = complete(g)
    assert replan(fleet_node("n1", state=done), fleet_node("n1", state=done.model_copy(update={"round": 2}))) == "now"
    # A pick, a cordon within the round, a status label: the plan's and the node reconcile's own
    # writes, which start nobody; the status figures follow soon.
    assert replan(fleet_node("n1"), n1) == "soon"
    assert replan(fleet_node("n1", state=NodeGateState(status="waiting")), n1) == "soon"
    cordoned = fleet_node("n1", state=running.model_copy(update={"cordoned": True}), unschedulable=True,
                          annotations={keys.CORDONED_BY: "g"})
    assert replan(n1, cordoned) == "soon"
    assert replan(fleet_node("n1"), fleet_node("n1", labels={"pool": "a", keys.status_label("g"): "queued"})) == "soon"
    assert replan(n1, fleet_node("n1", state=running.model_copy(update={"batch": 2}))) == "soon"


def test_selections_are_memoized_per_node_version_and_a_relabelled_node_is_matched_afresh() -> None:
    """The plans match each node version once (`FleetNode.matched`): a second plan of the same fleet
    matches nothing again, and a relabelled node, a new version, is matched by its new labels."""
    g = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "a"}}, interruptionBudget={"count": 1})
    fleet = [fleet_node("n1"), fleet_node("n2"), fleet_node("n3", labels={"pool": "b"})]
    first = plan_gate(g, None, fleet, gates=[g], now=NOW)
    assert first.status.nodes.matched == 2
    assert all(g.spec.node_selector.key in n.matched for n in fleet)
    assert fleet[2].matched[g.spec.node_selector.key] is False
    # A memo entry is what the plan reads: planted ones show it never matched the labels again.
    for n in fleet:
        n.matched[g.spec.node_selector.key] = True
    assert plan_gate(g, None, fleet, gates=[g], now=NOW).status.nodes.matched == 3
    relabelled = [fleet_node("n1"), fleet_node("n2"), fleet_node("n3", labels={"pool": "b"})]
    assert plan_gate(g, None, relabelled, gates=[g], now=NOW).status.nodes.matched == 2


# -- trust: membership decides (issue 27) ------------------------------------------------------------

TAINTED = ((keys.READINESS_TAINT_KEY, keys.READINESS_TAINT_EFFECT),)


def test_a_round_on_a_node_that_left_the_gate_is_released_once_no_stage_pod_runs() -> None:
    g = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "a"}})
    state = started(g).model_copy(update={"cordoned": True, "phase": "stages"})
    left = fleet_node("n1", labels={"pool": "b"}, state=state, unschedulable=True,
                      annotations={keys.CORDONED_BY: "g"})
    running = plan_gate(g, None, [left], gates=[g], now=NOW, busy={"n1"})
    assert "n1" not in running.updates  # its stage pod finishes first
    plan = plan_gate(g, None, [left], gates=[g], now=NOW)
    up = plan.updates["n1"]
    assert up.remove_state and up.change.unschedulable is False and up.change.clear_cordoned_by
    assert [e.reason for e in up.events] == ["RoundStopped"]


def test_ignored_nodes_are_counted_and_named_by_ready() -> None:
    g = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "a"}})
    nodes = [fleet_node("n1", state=complete(g)),
             fleet_node("n2", labels={"pool": "a", keys.IGNORE_LABEL: "true"}),
             fleet_node("n3", labels={"pool": "b", keys.IGNORE_LABEL: "true"})]
    plan = plan_gate(g, None, nodes, gates=[g], now=NOW)
    assert plan.status.nodes.matched == 1 and plan.status.nodes.ignored == 1
    ready = next(c for c in plan.status.conditions if c.type == "Ready")
    assert ready.status == "True" and f"1 more that the selector matches are ignored ({keys.IGNORE_LABEL}=true)" \
        in ready.message


def test_the_readiness_taint_follows_membership() -> None:
    readiness = gate({"k": PKG}, readinessTaint=True, nodeSelector={"matchLabels": {"pool": "a"}})
    plain = gate({"k": PKG}, nodeSelector={"matchLabels": {"pool": "b"}})
    member = fleet_node("n1", taints=TAINTED)
    assert orphan_taint(member, [readiness]) is None
    assert orphan_taint(fleet_node("n1"), []) is None  # no taint, nothing to lift
    assert orphan_taint(member, []) == "no readinessTaint NodeGate selects the node any longer"  # deleted/disabled
    relabelled = fleet_node("n1", labels={"pool": "b"}, taints=TAINTED)
    assert orphan_taint(relabelled, [readiness, plain]) == "no readinessTaint NodeGate selects the node any longer"
    off = gate({"k": PKG}, readinessTaint=False, nodeSelector={"matchLabels": {"pool": "a"}})
    assert orphan_taint(member, [off]) is not None
    ignored = fleet_node("n1", labels={"pool": "a", keys.IGNORE_LABEL: "true"}, taints=TAINTED)
    assert "ignored" in (orphan_taint(ignored, [readiness]) or "")
