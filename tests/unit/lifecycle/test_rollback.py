"""`rollback: true`, without I/O: the failed batch's nodes picked to go back, to which revision, within the
budget; the roll-back round on a node; what the gate's status says."""

from __future__ import annotations

from typing import Any

from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import Failure, Installed, NodeGateState, Rollback, rollout_hash, spec_hash
from gate.lifecycle.fleet import FleetNode, GatePlan, plan_gate
from gate.lifecycle.machine import decide
from gate.lifecycle.rollback import rollback_targets, target_gate, target_of
from gate.rollout import order_key
from gate.rollout.history import Revision, revision_name, revision_spec
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, ctx, gate, run_until_quiet

TOOL = {"version": "1.0.0", "image": "example.com/tool"}
EXTRA = {"version": "0.1.0", "image": "example.com/extra"}
BATCH = 3  # the failed rollout's first batch: the one before it ran batches 1 and 2


def _policy(**default: Any) -> DeploymentPolicy:
    return DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"default": {
        "budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}, "rollback": True, **default}}})


OLD = gate({"tool": TOOL}, deploymentPolicy="p")
NEW_SPEC = {"tool": {**TOOL, "version": "2.0.0"}, "extra": EXTRA}


def _new(**compartment: Any) -> NodeGate:
    """The gate at its failed spec, its status between batches: batch BATCH running."""
    g = gate(NEW_SPEC, deploymentPolicy="p")
    status = {"rolloutHash": rollout_hash(g), "compartments": [
        {"name": "__default__", "batch": BATCH, "batchSize": 2, "state": "rolling", **compartment}]}
    return NodeGate.model_validate({**g.to_wire(), "status": status})


NEW = _new()


def _installed(g: NodeGate, *names: str) -> dict[str, Installed]:
    return {n: Installed(version=p.version, spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()
            if n in names}


def _revisions(*gates: NodeGate, first: int = 1) -> list[Revision]:
    return [Revision(revision_name("g", rollout_hash(g)), i, rollout_hash(g), revision_spec(g))
            for i, g in enumerate(gates, start=first)]


NAMES = sorted(["n1", "n2", "n3", "n4"], key=order_key)
BAD, GOOD = NAMES[:2]


def _fleet(*, bad_cordoned: bool = False, other_cordoned: bool = False) -> list[FleetNode]:
    """The failed batch (BAD failed installing extra, GOOD complete) and two nodes outside it; with
    `other_cordoned`, the first of those failed in an earlier batch of this rollout and is still cordoned."""
    h = rollout_hash(NEW)
    failure = Failure(package="extra", stage="apply", reason="StageFailed", rollout_hash=h, generation=1)
    bad = NodeGateState(status="failed", batch=BATCH, compartment="__default__", rollout_hash=h, round=2,
                        failure=failure, cordoned=bad_cordoned, installed={"tool": _installed(NEW, "tool")["tool"]})
    good = NodeGateState(status="complete", batch=BATCH, compartment="__default__", rollout_hash=h, round=2,
                         installed=_installed(NEW, "tool", "extra"))
    rest = NodeGateState(status="waiting", batch=0, compartment="__default__", rollout_hash=rollout_hash(OLD),
                         round=1, passed=True, installed=_installed(OLD, "tool"))
    extra: dict[str, Any] = {"unschedulable": True, "annotations": {"nodegate.io/cordoned-by": "g"}} \
        if bad_cordoned else {}
    others = [fleet_node(n, state=rest) for n in NAMES[2:]]
    if other_cordoned:
        earlier = bad.model_copy(update={"batch": BATCH - 1, "cordoned": True})
        others[0] = fleet_node(NAMES[2], state=earlier, unschedulable=True,
                               annotations={"nodegate.io/cordoned-by": "g"})
    return [fleet_node(BAD, state=bad, **extra), fleet_node(GOOD, state=good), *others]


def _first(g: NodeGate = NEW, revisions: list[Revision] | None = None, fleet: list[FleetNode] | None = None,
           **kw: Any) -> GatePlan:
    return plan_gate(g, _policy(), fleet if fleet is not None else _fleet(), gates=[g], now=NOW,
                     revisions=_revisions(OLD, NEW) if revisions is None else revisions, **kw)


def _plan(g: NodeGate = NEW, revisions: list[Revision] | None = None, fleet: list[FleetNode] | None = None,
          **kw: Any) -> GatePlan:
    """The plan once the gate's status holds what the plan before it wrote (the roll-back record)."""
    first = _first(g, revisions, fleet, **kw)
    persisted = NodeGate.model_validate({**g.to_wire(), "status": first.status.to_wire()})
    return _first(persisted, revisions, fleet, **kw)


def _picked(plan: GatePlan) -> list[str]:
    return sorted(n for n, u in plan.updates.items() if u.state is not None and u.state.rollback is not None)


def test_a_failed_batch_stops_its_compartment_and_its_changed_nodes_go_back_to_the_previous_revision() -> None:
    plan = _plan()
    comp = plan.status.compartments[0]
    assert comp.state == "stopped" and comp.consecutive_failures == 1  # the first failure stops it
    assert comp.rollback is not None and comp.rollback.reason == "RolledBack"
    assert (comp.rollback.batch, comp.rollback.revision, comp.rollback.to) == (BATCH, 1, rollout_hash(OLD))
    assert sorted(comp.rollback.nodes) == sorted([BAD, GOOD])
    assert _picked(plan) == sorted([BAD, GOOD]) and comp.in_progress == 2
    for name in (BAD, GOOD):
        state = plan.updates[name].state
        assert state is not None and state.status == "in-progress" and state.failure is None
        assert state.rollback == Rollback(to=rollout_hash(OLD), revision=1, rollout_hash=rollout_hash(NEW),
                                          batch=BATCH)
        assert state.round == 3 and plan.updates[name].change.status == "in-progress"
    for name in NAMES[2:]:  # outside the batch: untouched, and not picked forward while stopped
        assert plan.updates.get(name) is None or plan.updates[name].state is None
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert degraded.status == "True" and degraded.reason == "RolledBack"
    assert BAD in degraded.message and "revision 1" in degraded.message
    assert "RolledBack" not in {e.reason for e in plan.events}  # told once, by the plan that wrote the record


def test_the_plan_that_judges_the_batch_writes_the_record_and_lets_nodes_go_back_only_in_the_next() -> None:
    first = _first()
    comp = first.status.compartments[0]
    assert comp.state == "stopped" and comp.rollback is not None and comp.rollback.reason == "RolledBack"
    assert not _picked(first) and first.recheck_after is not None and first.recheck_after <= 1.0
    assert "RolledBack" in {e.reason for e in first.events}
    # The node writes of a lost plan are harmless: the record in the status brings the same picks again.
    assert _picked(_plan()) == sorted([BAD, GOOD])


def test_without_rollback_a_failed_batch_only_counts_towards_the_failure_threshold() -> None:
    policy = DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"default": {
        "budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}})
    plan = plan_gate(NEW, policy, _fleet(), gates=[NEW], now=NOW, revisions=_revisions(OLD, NEW))
    comp = plan.status.compartments[0]
    assert comp.state != "stopped" and comp.rollback is None and not _picked(plan)


def test_roll_backs_take_only_the_budget_left() -> None:
    # A node of an earlier batch is still cordoned by its failed round: one slot of two is taken.
    plan = _plan(fleet=_fleet(other_cordoned=True))
    comp = plan.status.compartments[0]
    assert len(_picked(plan)) == 1 and comp.in_progress == 2
    # The next plan, with that roll-back running, starts none.
    picked = _picked(plan)[0]
    after = [FleetNode(f.view, f.created, {"g": plan.updates[picked].state}) if f.view.name == picked else f
             for f in _fleet(other_cordoned=True)]  # type: ignore[dict-item]
    again = _plan(_gate_after(plan), fleet=after)
    assert not [n for n in _picked(again) if n != picked] and again.status.compartments[0].in_progress == 2


def test_a_node_its_failed_round_left_cordoned_goes_back_at_no_extra_cost() -> None:
    plan = _plan(fleet=_fleet(bad_cordoned=True))
    assert _picked(plan) == sorted([BAD, GOOD]) and plan.status.compartments[0].in_progress == 2


def _gate_after(plan: GatePlan) -> NodeGate:
    """NEW with the status the plan wrote."""
    return NodeGate.model_validate({**NEW.to_wire(), "status": plan.status.to_wire()})


def test_the_history_not_read_yet_holds_the_roll_back_pending() -> None:
    plan = plan_gate(NEW, _policy(), _fleet(), gates=[NEW], now=NOW, revisions=None)
    comp = plan.status.compartments[0]
    assert comp.state == "stopped" and comp.rollback is not None and comp.rollback.reason == "Pending"
    assert not _picked(plan)
    # Once read, the next plan resolves it from the stored record.
    later = _plan(_gate_after(plan))
    assert later.status.compartments[0].rollback.reason == "RolledBack"  # type: ignore[union-attr]
    assert _picked(later) == sorted([BAD, GOOD])


def test_a_pruned_previous_revision_rolls_nothing_back_and_says_no_revision() -> None:
    plan = _plan(revisions=_revisions(NEW, first=2))  # revision 1 is gone
    comp = plan.status.compartments[0]
    assert comp.state == "stopped" and comp.rollback is not None and comp.rollback.reason == "NoRevision"
    assert not _picked(plan)
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert degraded.reason == "NoRevision" and "no previous revision" in degraded.message


def test_the_gates_first_spec_goes_back_to_no_packages() -> None:
    assert target_of(_revisions(NEW), rollout_hash(NEW), 1).reason == "RolledBack"
    assert target_of(_revisions(NEW), rollout_hash(NEW), 1).revision is None
    plan = _plan(revisions=_revisions(NEW))
    state = plan.updates[GOOD].state
    assert state is not None and state.rollback is not None and (state.rollback.revision, state.rollback.to) == (0, "")
    target = target_gate(NEW, None)
    assert sorted(target.spec.packages) == ["extra", "tool"]
    assert all(p.uninstall.apply for p in target.spec.packages.values())


def test_a_history_without_the_current_spec_is_not_read_up_to_now() -> None:
    assert target_of(_revisions(OLD), rollout_hash(NEW), 2).reason == "Pending"
    assert target_of([], rollout_hash(NEW), 2).reason == "Pending"


def test_a_history_that_restarted_at_one_under_a_changed_gate_says_no_revision_and_uninstalls_nothing() -> None:
    # The older revisions were deleted (or the gate is older than its history): revision 1 is the failed
    # spec, but the gate's generation says it had specs before; going to no packages would uninstall them.
    assert target_of(_revisions(NEW), rollout_hash(NEW), 2).reason == "NoRevision"
    changed = NodeGate.model_validate({**NEW.to_wire(), "metadata": {"name": "g", "generation": 2}})
    plan = _plan(changed, revisions=_revisions(changed))
    comp = plan.status.compartments[0]
    assert comp.rollback is not None and comp.rollback.reason == "NoRevision"
    assert not _picked(plan)


def test_the_roll_back_round_uninstalls_the_new_package_and_downgrades_the_old_one() -> None:
    state = _plan().updates[GOOD].state
    assert state is not None
    target = target_gate(NEW, revision_spec(OLD))
    timeline: list[str] = []
    done, created, _ = run_until_quiet(target, state, timeline=timeline)
    assert sorted(created) == ["extra:uninstall", "tool:apply"]
    assert done.installed == _installed(OLD, "tool")
    assert done.status == "waiting" and done.batch == 0 and done.rollback is not None and done.rollback.done
    assert done.rollout_hash == rollout_hash(OLD) and done.failure is None
    assert "RolledBack" in timeline
    # The gate's plan leaves it waiting for the current spec: blocked while its compartment is stopped.
    fleet = [FleetNode(f.view, f.created, {"g": done}) if f.view.name == GOOD else f for f in _fleet()]
    again = _plan(_gate_after(_plan()), fleet=fleet)
    assert GOOD not in _picked(again)
    assert (again.updates[GOOD].state is None if GOOD in again.updates else True)


def test_a_failed_roll_back_stays_failed_under_the_failed_rollout() -> None:
    state = _plan().updates[GOOD].state
    assert state is not None
    no_retries = gate({"tool": {**TOOL, "retries": 0}}, deploymentPolicy="p")
    target = target_gate(NEW, revision_spec(no_retries))
    failed, _, _ = run_until_quiet(target, state, fail=lambda package, stage: package == "tool")
    assert failed.status == "failed" and failed.failure is not None
    assert failed.failure.rollout_hash == rollout_hash(NEW)  # not retried until the spec changes
    assert failed.rollback is not None and not failed.rollback.done
    fleet = [FleetNode(f.view, f.created, {"g": failed}) if f.view.name == GOOD else f for f in _fleet()]
    again = _plan(_gate_after(_plan()), fleet=fleet)
    assert GOOD not in _picked(again)
    assert GOOD not in again.updates or again.updates[GOOD].state is None


def test_resume_ends_the_roll_back_and_rolled_back_nodes_go_forward_in_their_turn() -> None:
    stopped = _gate_after(_plan())
    resumed = NodeGate.model_validate({**stopped.to_wire(), "metadata": {
        **stopped.to_wire()["metadata"], "annotations": {"nodegate.io/resume": "*"}}})
    back = NodeGateState(status="waiting", batch=0, compartment="__default__", rollout_hash=rollout_hash(OLD),
                         round=3, passed=True, installed=_installed(OLD, "tool"),
                         rollback=Rollback(to=rollout_hash(OLD), revision=1, rollout_hash=rollout_hash(NEW),
                                           batch=BATCH, done=True))
    fleet = [fleet_node(n, state=back) for n in NAMES]
    plan = _plan(resumed, fleet=fleet)
    comp = plan.status.compartments[0]
    assert comp.state == "rolling" and comp.rollback is None
    started = [n for n, u in plan.updates.items() if u.state is not None and u.state.status == "in-progress"]
    assert len(started) == 1  # the batch after a failed one is smaller (fixed: halved)
    for name in started:
        assert plan.updates[name].state.rollback is None  # type: ignore[union-attr]


def test_a_machine_decision_of_a_roll_back_uses_the_revisions_packages() -> None:
    state = _plan().updates[GOOD].state
    assert state is not None
    d = decide(ctx(target_gate(NEW, revision_spec(OLD)), state))
    assert sorted((s.package or "", s.stage, s.version) for r in d.create_pods for s in r.steps) == [
        ("extra", "uninstall", "0.1.0"), ("tool", "apply", "1.0.0")]


def test_a_removal_ignores_rollback() -> None:
    from gate.lifecycle.removal import _without_rollback

    policy = _without_rollback(_policy())
    assert policy is not None and not policy.spec.default.rollback


def test_a_roll_back_pulls_no_images_ahead() -> None:
    from gate.lifecycle.prepull import candidates

    plan = _plan()
    rebooting = gate({name: {**p, "interrupt": {"type": "reboot"}} for name, p in NEW_SPEC.items()},
                     deploymentPolicy="p")
    forward = plan.updates[BAD].state
    assert forward is not None
    plan.updates[BAD].state = forward.model_copy(update={"rollback": None})
    picked = candidates(rebooting, plan, {}, ahead=0, agent_image="agent", resolve=False)
    assert [c.node for c in picked] == [BAD]  # the same node, on a forward round, would pull
    plan.updates[BAD].state = forward
    assert not candidates(rebooting, plan, {}, ahead=0, agent_image="agent", resolve=False)


def test_the_rolled_back_gauge_is_one_while_the_roll_back_holds_the_compartment() -> None:
    from gate.lifecycle.reconcile import gate_metrics

    gauges = gate_metrics(_plan().status.to_wire()).compartments["__default__"]
    assert (gauges.stopped, gauges.rolled_back) == (1, 1)
    policy = DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"default": {
        "budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2, "failureThreshold": 1}}}}})
    plain = plan_gate(NEW, policy, _fleet(), gates=[NEW], now=NOW)  # stopped by failureThreshold only
    gauges = gate_metrics(plain.status.to_wire()).compartments["__default__"]
    assert (gauges.stopped, gauges.rolled_back) == (1, 0)


def test_a_node_that_failed_its_soak_goes_back_like_one_whose_stage_failed() -> None:
    h = rollout_hash(NEW)
    unhealthy = NodeGateState(status="failed", batch=BATCH, compartment="__default__", rollout_hash=h, round=2,
                              installed=_installed(NEW, "tool", "extra"), failure=Failure(
                                  stage="soak", reason="Unhealthy", rollout_hash=h, generation=1))
    fleet = [fleet_node(BAD, state=unhealthy), *_fleet()[1:]]
    plan = _plan(fleet=fleet)
    assert _picked(plan) == sorted([BAD, GOOD])
    state = plan.updates[BAD].state
    assert state is not None
    _, created, _ = run_until_quiet(target_gate(NEW, revision_spec(OLD)), state)
    assert sorted(created) == ["extra:uninstall", "tool:apply"]


def test_the_spec_a_stopped_compartment_goes_back_to_is_a_target_for_image_resolution() -> None:
    plan = _first()
    stopped = NEW.model_copy(update={"status": plan.status})
    [target] = rollback_targets(stopped, _revisions(OLD, NEW))
    assert target.spec.packages["tool"].version == TOOL["version"]  # OLD's tool, whose image is resolved too
    assert rollback_targets(stopped, None) == [] and rollback_targets(NEW, _revisions(OLD, NEW)) == []
    assert rollback_targets(stopped, _revisions(NEW, first=2)) == []  # the revision is gone: nothing to pull
