"""`rollback: true` on the real control plane: a failed batch's changed nodes go back to the previous revision.

kwok plays the kubelets; a test makes one package stage fail on one node with an injected kwok Stage
(`gate.devcluster.stages.failing_stage`). The StepLog (conftest) records every stage pod step the
operator created; the InvariantWatcher judges every disruption against its compartment's ceiling.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import CONTROLLER_REVISIONS, EVENTS, NODEGATES
from gate.rollout import order_key
from gate.rollout.history import history_selector
from gate.testing.watcher import InvariantWatcher
from tests.integration.operator.conftest import NAMESPACE, Scenario, StepLog, wait_for

TOOL = {"version": "1.0.0", "image": "registry.example.com/tool"}
EXTRA = {"version": "0.1.0", "image": "registry.example.com/extra", "retries": 0}


async def _policy(sc: Scenario, name: str, spec: dict[str, Any]) -> None:
    sc.policies.append(name)
    await sc.kube.apply({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                         "metadata": {"name": name}, "spec": spec}, field_manager="test", force=True)


def _version(args: list[str]) -> str:
    return args[args.index("--version") + 1]


async def test_a_failed_batch_goes_back_to_the_previous_revision_within_the_budget_and_stops(
        scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(4)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}},
                                                 "rollback": True}})
    await scenario.apply_gate({"tool": TOOL}, deploymentPolicy=policy)
    await scenario.wait_ready(timeout=120)
    before = {n: await scenario.state(n) for n in nodes}
    assert all(s["installed"]["tool"]["version"] == "1.0.0" for s in before.values())
    seen = {r.name for r in step_log.of(scenario.name)}

    # The new rollout's first batch is the first two nodes in pick order (gate.rollout.order): one of them
    # fails installing the new package; the other goes through.
    first, rest = sorted(nodes, key=order_key)[:2], sorted(nodes, key=order_key)[2:]
    bad, good = first
    await scenario.inject(failing_stage("fail", nodes=[bad], package="extra", stage="apply"))
    watcher = InvariantWatcher(scenario.kube)
    await watcher.start()
    try:
        await scenario.apply_gate({"tool": {**TOOL, "version": "2.0.0"}, "extra": EXTRA}, deploymentPolicy=policy)

        async def rolled_back() -> bool:
            comps = {c["name"]: c for c in ((await scenario.gate()).get("status") or {}).get("compartments") or []}
            record = comps.get("__default__", {}).get("rollback") or {}
            if comps.get("__default__", {}).get("state") != "stopped" or record.get("reason") != "RolledBack":
                return False
            return all([((await scenario.state(n)).get("rollback") or {}).get("done") for n in first])

        await wait_for(rolled_back, timeout=120, what="the failed batch rolled back")
    finally:
        report = await watcher.stop()
    assert not report.violations, report.summary()  # the budget of two held during the roll-back too
    assert report.coverage.disruptions_judged >= 2

    # Back on the previous revision: tool 1.0.0, and the package new in the failed spec uninstalled.
    for node in first:
        state = await scenario.state(node)
        assert state["installed"]["tool"]["version"] == "1.0.0", state
        assert "extra" not in state["installed"], state
        assert state["rollback"]["revision"] == 1 and state["rollback"]["to"] == before[node]["rolloutHash"]
        assert state.get("status", "waiting") == "waiting" and "failure" not in state
        await scenario.wait_node(node, "blocked", timeout=30)  # the gate's next plan: its compartment is stopped
        assert not (await scenario.node(node))["spec"].get("unschedulable")
    steps = [r for r in step_log.of(scenario.name) if r.name not in seen]
    good_steps = [(r.package, r.stage, _version(r.args)) for r in steps if r.node == good and r.package]
    # The forward round (upgrade, the new package's apply), then the roll-back: the new package
    # uninstalled and tool applied at its previous version (a downgrade without uninstall: apply).
    assert sorted(good_steps[:2]) == [("extra", "apply", "0.1.0"), ("tool", "upgrade", "2.0.0")], good_steps
    assert sorted(good_steps[2:]) == [("extra", "uninstall", "0.1.0"), ("tool", "apply", "1.0.0")], good_steps
    bad_steps = [(r.package, r.stage, _version(r.args)) for r in steps if r.node == bad and r.package]
    assert ("extra", "uninstall", "0.1.0") not in bad_steps  # it never got it
    # Nodes outside the batch were never touched by the failed rollout.
    assert not [r for r in steps if r.node in rest]
    for node in rest:
        state = await scenario.state(node)
        assert state["installed"] == before[node]["installed"] and state.get("batch", 0) == 0
        assert await scenario.node_status(node) == "blocked"

    gate = await scenario.gate()
    comp = {c["name"]: c for c in gate["status"]["compartments"]}["__default__"]
    assert comp["rollback"]["batch"] > 0 and sorted(comp["rollback"]["nodes"]) == sorted(first)
    assert comp["rollback"]["revision"] == 1
    conds = {c["type"]: c for c in gate["status"]["conditions"]}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "RolledBack"
    assert bad in conds["Degraded"]["message"] and "revision 1" in conds["Degraded"]["message"]

    async def told() -> bool:
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={scenario.name}")
        return "RolledBack" in {e["reason"] for e in events}

    await wait_for(told, what="a RolledBack Event on the gate")
    assert keys.RESUME_ANNOTATION not in gate["metadata"].get("annotations", {})


async def test_under_a_budget_of_one_the_roll_backs_go_one_node_at_a_time(
        scenario: Scenario, step_log: StepLog) -> None:
    # With `health` a batch is not capped by the budget (it fills as slots free): a batch of two under a
    # budget of one. Its roll-back takes the budget as any round does: one node at a time.
    nodes = await scenario.add_nodes(3)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 2}},
                                                 "health": {"soak": "1s"}, "rollback": True}})
    await scenario.apply_gate({"tool": TOOL}, deploymentPolicy=policy)
    await scenario.wait_ready(timeout=120)
    seen = {r.name for r in step_log.of(scenario.name)}
    first = sorted(nodes, key=order_key)[:2]
    # The new package goes on first (install order), then tool's upgrade fails on one node: both nodes
    # of the batch have something to take back.
    await scenario.inject(failing_stage("fail", nodes=[first[0]], package="tool", stage="upgrade"))
    watcher = InvariantWatcher(scenario.kube)
    await watcher.start()
    try:
        await scenario.apply_gate({"tool": {**TOOL, "version": "2.0.0"}, "extra": EXTRA}, deploymentPolicy=policy)

        async def rolled_back() -> bool:
            return all([((await scenario.state(n)).get("rollback") or {}).get("done") for n in first])

        await wait_for(rolled_back, timeout=150, what="the failed batch rolled back")
    finally:
        report = await watcher.stop()
    assert not report.violations, report.summary()
    for node in first:
        state = await scenario.state(node)
        assert state["installed"]["tool"]["version"] == "1.0.0" and "extra" not in state["installed"], state
    undo = sorted((r for r in step_log.of(scenario.name) if r.name not in seen and r.stage == "uninstall"),
                  key=lambda r: r.resource_version)
    assert sorted(r.node for r in undo) == sorted(first)
    # One at a time: the second node's roll-back started only after the first one's had ended.
    assert undo[0].finished_rv is not None and undo[1].resource_version > undo[0].finished_rv
    assert not [r for r in step_log.of(scenario.name) if r.name not in seen and r.node not in first]


async def test_a_node_unhealthy_in_its_soak_goes_back_and_a_resume_takes_the_rollout_forward_again(
        scenario: Scenario, step_log: StepLog) -> None:
    # The batch fails in its soak, not in a stage: health is what judges it, and the roll-back follows.
    nodes = await scenario.add_nodes(2)
    sick, later = sorted(nodes, key=order_key)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {"default": {
        "budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}, "rollback": True,
        "health": {"soak": "1s", "nodeConditions": [{"type": "GpuUnhealthy", "status": "True"}]}}})
    await scenario.apply_gate({"tool": TOOL}, deploymentPolicy=policy)
    await scenario.wait_ready(timeout=120)
    seen = {r.name for r in step_log.of(scenario.name)}
    # As node-problem-detector would, before the new rollout: the first node's soak finds it at once.
    await scenario.set_condition(sick, "GpuUnhealthy", "True", "XidError", "GPU 3 fell off the bus (Xid 79)")
    watcher = InvariantWatcher(scenario.kube)
    await watcher.start()
    try:
        await scenario.apply_gate({"tool": {**TOOL, "version": "2.0.0"}}, deploymentPolicy=policy)

        async def rolled_back() -> bool:
            return bool(((await scenario.state(sick)).get("rollback") or {}).get("done"))

        await wait_for(rolled_back, timeout=120, what="the node that failed its soak rolled back")
        comp = {c["name"]: c for c in (await scenario.gate())["status"]["compartments"]}["__default__"]
        assert comp["state"] == "stopped" and comp["rollback"]["reason"] == "RolledBack", comp
        assert comp["rollback"]["nodes"] == [sick] and comp["rollback"]["revision"] == 1, comp
        state = await scenario.state(sick)
        assert state["installed"]["tool"]["version"] == "1.0.0", state
        assert not (await scenario.node(sick))["spec"].get("unschedulable")
        assert (await scenario.state(later)).get("installed", {})["tool"]["version"] == "1.0.0"  # never picked
        forward = [(r.node, r.stage, _version(r.args)) for r in step_log.of(scenario.name)
                   if r.name not in seen and r.package == "tool"]
        assert forward == [(sick, "upgrade", "2.0.0"), (sick, "apply", "1.0.0")], forward

        # The GPU is mended; a person resumes the compartment: the rollout goes on forward, the
        # rolled-back node picked for the current spec again in its turn.
        await scenario.set_condition(sick, "GpuUnhealthy", "False", "Healthy", "replaced")
        await scenario.kube.patch(NODEGATES, scenario.name, {"metadata": {"annotations": {
            keys.RESUME_ANNOTATION: "*"}}})
        await scenario.wait_ready(timeout=120)
    finally:
        report = await watcher.stop()
    assert not report.violations, report.summary()
    for node in nodes:
        state = await scenario.state(node)
        assert state["installed"]["tool"]["version"] == "2.0.0" and state["status"] == "complete", state
    comp = {c["name"]: c for c in (await scenario.gate())["status"]["compartments"]}["__default__"]
    assert comp["state"] != "stopped" and not comp.get("rollback"), comp


async def test_a_history_deleted_by_someone_makes_a_failed_batch_stop_with_no_revision_and_uninstall_nothing(
        scenario: Scenario, step_log: StepLog) -> None:
    # Whoever may delete ControllerRevisions in the operator's namespace deletes the gate's history. The
    # failed spec then becomes revision 1 of a new history, yet it was not the gate's first: taking the
    # nodes "back to before the first spec" would uninstall what they had. Nothing goes back.
    nodes = await scenario.add_nodes(2)
    bad = sorted(nodes, key=order_key)[0]
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}},
                                                 "rollback": True}})
    await scenario.apply_gate({"tool": TOOL}, deploymentPolicy=policy)
    await scenario.wait_ready(timeout=120)
    selector = history_selector(scenario.name)

    async def recorded() -> bool:
        return bool((await scenario.kube.list(CONTROLLER_REVISIONS, NAMESPACE, label_selector=selector))[0])

    await wait_for(recorded, what="the gate's first revision")
    revisions, _ = await scenario.kube.list(CONTROLLER_REVISIONS, NAMESPACE, label_selector=selector)
    for revision in revisions:
        await scenario.kube.delete(CONTROLLER_REVISIONS, revision["metadata"]["name"], NAMESPACE)
    seen = {r.name for r in step_log.of(scenario.name)}
    await scenario.inject(failing_stage("fail", nodes=[bad], package="tool", stage="upgrade"))
    await scenario.apply_gate({"tool": {**TOOL, "version": "2.0.0"}}, deploymentPolicy=policy)

    async def stopped() -> bool:
        comps = {c["name"]: c for c in ((await scenario.gate()).get("status") or {}).get("compartments") or []}
        return (comps.get("__default__", {}).get("rollback") or {}).get("reason") == "NoRevision"

    await wait_for(stopped, timeout=120, what="the compartment stopped with NoRevision")
    [revision] = (await scenario.kube.list(CONTROLLER_REVISIONS, NAMESPACE, label_selector=selector))[0]
    assert revision["revision"] == 1  # the new history starts again at 1 ...
    assert (await scenario.gate())["metadata"]["generation"] == 2  # ... but the gate says it had a spec before
    comp = {c["name"]: c for c in (await scenario.gate())["status"]["compartments"]}["__default__"]
    assert comp["state"] == "stopped" and comp["rollback"]["revision"] == 0 and comp["rollback"]["to"] == ""
    conds = {c["type"]: c for c in (await scenario.gate())["status"]["conditions"]}
    assert conds["Degraded"]["reason"] == "NoRevision" and "no previous revision" in conds["Degraded"]["message"]
    await asyncio.sleep(3)  # plans go on (poll 0.5 s): none of them may start a roll-back
    state = await scenario.state(bad)
    assert state["status"] == "failed" and "rollback" not in state, state
    assert state["installed"]["tool"]["version"] == "1.0.0"  # the failed upgrade left it; nothing uninstalled it
    after = [(r.node, r.stage) for r in step_log.of(scenario.name) if r.name not in seen and r.package]
    assert set(after) == {(bad, "upgrade")}, after  # the failed upgrade and its retries; no roll-back step
