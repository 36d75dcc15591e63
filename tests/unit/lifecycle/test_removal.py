"""Removing a gate is a rollout too: batches under the budget, failures judged, pause honoured."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import Installed, NodeGateState, spec_hash
from gate.lifecycle.node import StagePod
from gate.lifecycle.removal import plan_removal, removal_hash
from gate.lifecycle.uninstall import decide_removal
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, ctx, gate

SPEC = {"keep": PKG, "agent": {**PKG, "uninstall": {"enabled": True}}}


def _installed(g: NodeGate) -> dict[str, Installed]:
    return {n: Installed(version=p.version, spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()}


def _complete(g: NodeGate, **kw: Any) -> NodeGateState:
    return NodeGateState(status="complete", installed=_installed(g), round=1, batch=1, **kw)


def _with_status(g: NodeGate, status: dict[str, Any]) -> NodeGate:
    return NodeGate.model_validate({**g.to_wire(), "status": status})


def _policy(**strategy: Any) -> DeploymentPolicy:
    return DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, **strategy}}}}})


def test_the_removal_starts_within_the_budget_and_only_where_something_is_uninstalled() -> None:
    g = gate(SPEC, interruptionBudget={"count": 1})
    fleet = [fleet_node(f"n{i}", state=_complete(g)) for i in range(3)]
    fleet.append(fleet_node("plain", state=_complete(gate({"keep": PKG}))))
    rplan = plan_removal(g, None, fleet, now=NOW)
    started = [n for n, u in rplan.updates.items() if u.state is not None]
    assert len(started) == 1 and "plain" not in rplan.updates
    state = rplan.updates[started[0]].state
    assert state is not None and state.removing and state.status == "in-progress" and state.batch >= 1
    assert rplan.status.nodes.matched == 3 and rplan.status.nodes.in_progress == 1
    assert rplan.status.rollout_hash == removal_hash(g) and not rplan.releasable
    [cond] = [c for c in rplan.status.conditions if c.type == "Deleting"]
    assert cond.reason == "Removing"


def _run(g: NodeGate, fleet: dict[str, NodeGateState], *, policy: DeploymentPolicy | None = None,
         fail: frozenset[str] = frozenset(), steps: int = 20) -> list[set[str]]:
    """Drive the removal as the operator and the nodes would: each step plans, the nodes picked
    uninstall (or fail), and the nodes it may release are released. Returns who ran in each step."""
    ran: list[set[str]] = []
    for _ in range(steps):
        rplan = plan_removal(g, policy, [fleet_node(n, state=st) for n, st in fleet.items()], now=NOW)
        g = _with_status(g, rplan.status.to_wire())
        for name in rplan.releasable:
            del fleet[name]
        for name, update in rplan.updates.items():
            if update.state is not None:
                fleet[name] = update.state
        running = {n for n, st in fleet.items() if st.status == "in-progress"}
        if not running and not rplan.updates and not rplan.releasable:
            break
        if running:  # a step may only release nodes (their budget is free for the next one)
            ran.append(running)
        for name in running:
            st = fleet[name]
            fleet[name] = st.model_copy(update={"status": "failed"} if name in fail else
                                        {"status": "complete", "installed": {}})
    return ran


def test_nodes_uninstall_one_batch_at_a_time_and_go_once_their_batch_is_judged() -> None:
    g = _with_status(gate(SPEC, interruptionBudget={"count": 1}), {"rolloutHash": "install"})
    fleet = {f"n{i}": _complete(g) for i in range(3)}
    ran = _run(g, fleet)
    assert [len(r) for r in ran] == [1, 1, 1] and set().union(*ran) == {"n0", "n1", "n2"}
    assert fleet == {}  # every node released


def test_a_node_left_cordoned_starts_at_once_instead_of_waiting_for_the_budget_it_holds() -> None:
    g = _with_status(gate(SPEC, interruptionBudget={"count": 1}), {"rolloutHash": "install"})
    fleet = {"held": _complete(g).model_copy(update={"status": "failed", "cordoned": True}),
             "a": _complete(g)}
    ran = _run(g, fleet)
    assert ran[0] == {"held"} and ran[1] == {"a"} and fleet == {}


def test_a_failed_uninstall_stops_its_compartment_and_holds_the_rest() -> None:
    g = gate(SPEC, deploymentPolicy="p")
    failed = _complete(g).model_copy(update={"status": "failed", "removing": True, "batch": 1,
                                             "compartment": "__default__"})
    g = _with_status(g, {"rolloutHash": removal_hash(g), "compartments": [
        {"name": "__default__", "batch": 1, "batchSize": 1}]})
    fleet = [fleet_node("a", state=failed), fleet_node("b", state=_complete(g))]
    rplan = plan_removal(g, _policy(failureThreshold=1), fleet, now=NOW)
    [comp] = rplan.status.compartments
    assert comp.state == "stopped" and not [u for u in rplan.updates.values() if u.state is not None]
    assert rplan.releasable == frozenset() and "CompartmentStopped" in {e.reason for e in rplan.events}
    [cond] = [c for c in rplan.status.conditions if c.type == "Deleting"]
    assert cond.reason == "CompartmentStopped"
    # A person resumes it: the next node uninstalls.
    judged = _with_status(g, rplan.status.to_wire())  # the stop as the operator wrote it
    asked = NodeGate.model_validate({**judged.to_wire(), "metadata": {**g.to_wire()["metadata"],
                                                                      "annotations": {keys.RESUME_ANNOTATION: "*"}}})
    resumed = plan_removal(asked, _policy(failureThreshold=1), fleet, now=NOW)
    assert resumed.resumed and resumed.updates["b"].state is not None


def test_a_paused_gate_picks_nothing_and_says_why_once() -> None:
    g = gate(SPEC, paused=True)
    fleet = [fleet_node("a", state=_complete(g)), fleet_node("b", state=_complete(g))]
    rplan = plan_removal(g, None, fleet, now=NOW)
    assert not [u for u in rplan.updates.values() if u.state is not None]
    [cond] = [c for c in rplan.status.conditions if c.type == "Deleting"]
    assert cond.reason == "Paused" and "2 nodes wait to uninstall" in cond.message
    assert "nodegate delete g --force" in cond.message and rplan.status.status == "Deleting"
    assert [e.reason for e in rplan.events] == ["DeletionPaused"]
    again = _with_status(g, rplan.status.to_wire())
    assert plan_removal(again, None, fleet, now=NOW).events == []


def test_a_node_uninstalls_only_once_picked_and_is_released_only_once_its_batch_is_judged() -> None:
    g = gate(SPEC)
    waiting = _complete(g)
    assert not decide_removal(ctx(g, waiting)).create_pods  # not picked yet
    picked = waiting.model_copy(update={"status": "in-progress", "removing": True, "batch": 2})
    [req] = decide_removal(ctx(g, picked)).create_pods
    ended = StagePod(req.name, req.kind, "succeeded", req.steps, done=len(req.steps), round=req.round)
    done = decide_removal(replace(ctx(g, picked, stage_pods={req.name: ended}), release=False))
    assert done.state is not None and done.state.status == "complete" and done.node.status == "complete"
    assert not done.remove_state  # held: its batch is not judged yet
    assert not decide_removal(replace(ctx(g, done.state), release=False)).remove_state
    assert decide_removal(ctx(g, done.state)).remove_state  # released once the plan says its batch is judged
    # A node with nothing to uninstall takes no part in the removal: released at once.
    nothing = NodeGateState(status="complete", installed={"keep": _installed(g)["keep"]}, round=1)
    assert decide_removal(replace(ctx(g, nothing), release=False)).remove_state
