"""`rollback: true` on the real control plane: a failed batch's changed nodes go back to the previous revision.

kwok plays the kubelets; a test makes one package stage fail on one node with an injected kwok Stage
(`gate.devcluster.stages.failing_stage`). The StepLog (conftest) records every stage pod step the
operator created; the InvariantWatcher judges every disruption against its compartment's ceiling.
"""

from __future__ import annotations

from typing import Any

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import EVENTS
from gate.rollout import order_key
from gate.testing.watcher import InvariantWatcher
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

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
