"""Failures are visible where operators look (a Node condition next to the status label), and metric
series follow their objects (a deleted gate, a dropped compartment or package leaves no series)."""

from __future__ import annotations

import json
import urllib.request

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import KWOK_STAGES, NODEGATES, NODES
from tests.conftest import Kubectl
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg", "retries": 0}
SUMMARY = {"package": "tool", "stage": "apply", "ok": False, "failedStep": "install", "exitCode": 3,
           "message": "/etc/tool.conf: read-only file system"}


def _condition(kubectl: Kubectl, node: str, gate: str) -> dict[str, str] | None:
    """NodeGate's condition for `gate` on the node, as kubectl shows it."""
    conds = json.loads(kubectl.run("get", "node", node, "-o", "jsonpath={.status.conditions}").stdout or "[]")
    found = [c for c in conds if c["type"] == keys.failed_condition(gate)]
    assert len(found) <= 1, conds
    return found[0] if found else None


async def _until_condition(kubectl: Kubectl, node: str, gate: str, *, present: bool) -> dict[str, str] | None:
    async def reached() -> bool:
        return (_condition(kubectl, node, gate) is not None) == present

    await wait_for(reached, what=f"the failure condition on {node} {'present' if present else 'gone'}")
    return _condition(kubectl, node, gate)


async def test_a_failed_node_carries_a_condition_until_it_recovers_or_the_gate_goes(
        scenario: Scenario, kubectl: Kubectl, step_log: StepLog) -> None:
    g = scenario.name
    bad, worse, good = await scenario.add_nodes(3)
    await scenario.inject(failing_stage("fail", nodes=[bad, worse], package="tool", stage="apply",
                                        message=json.dumps(SUMMARY), exit_code=3))
    await scenario.apply_gate({"tool": PKG})
    for node in (bad, worse):
        await scenario.wait_node(node, "failed")
    await scenario.wait_node(good, "complete")

    cond = await _until_condition(kubectl, bad, g, present=True)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "StageFailed")
    assert cond["message"] == (f"NodeGate {g}: package tool failed in stage apply: step install exited 3: "
                               "/etc/tool.conf: read-only file system")
    described = kubectl.run("describe", "node", bad).stdout
    assert f"nodegate.io/failed.{g}" in described and "StageFailed" in described
    assert _condition(kubectl, good, g) is None
    # The kubelet's (kwok's) conditions are still there next to it.
    conds = json.loads(kubectl.run("get", "node", bad, "-o", "jsonpath={.status.conditions}").stdout)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    # The node is fixed and a person reruns it: the condition goes once it has another round.
    for stage in scenario.stages:
        await scenario.kube.delete(KWOK_STAGES, stage)
    scenario.stages.clear()
    await scenario.kube.patch(NODES, bad, {"metadata": {"annotations": {
        keys.rerun_annotation(g): "tool/apply"}}})
    await scenario.wait_node(bad, "complete")
    assert await _until_condition(kubectl, bad, g, present=False) is None
    assert _condition(kubectl, worse, g) is not None  # the other failed node keeps its own

    # Deleting the gate removes the condition from the node still failed.
    await scenario.delete_gate()
    assert _condition(kubectl, worse, g) is None
    assert keys.status_label(g) not in (await scenario.node(worse))["metadata"].get("labels", {})


def _series(sc: Scenario, gate: str) -> list[str]:
    """The running operator's metric lines labelled with `gate` (its port changes when a test restarts it)."""
    port = sc.cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines() if not line.startswith("#") and f'gate="{gate}"' in line]


async def test_metric_series_go_with_their_compartment_package_and_gate(scenario: Scenario) -> None:
    g = scenario.name
    policy = f"{g}-policy"
    scenario.policies.append(policy)
    canary = await scenario.add_nodes(1, {"tier": "canary"})
    await scenario.add_nodes(1, {"tier": "main"}, start=10)
    await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"compartments": [{"name": "canary", "selector": {"matchLabels": {"tier": "canary"}},
                                   "budget": {"count": 1}}]}}, field_manager="test", force=True)
    await scenario.inject(failing_stage("fail", nodes=canary, package="tool", stage="apply"))
    await scenario.apply_gate({"tool": PKG, "extra": PKG}, deploymentPolicy=policy)
    await scenario.wait_node(canary[0], "failed")

    async def present(fragment: str) -> bool:
        return any(fragment in line for line in _series(scenario, g))

    async def gone(fragment: str) -> bool:
        return not await present(fragment)

    await wait_for(lambda: present('compartment="canary"'), what="the canary compartment's series")
    await wait_for(lambda: present('nodegate_stage_failures_total{gate="' + g + '",package="tool"'),
                   what="the failure's series")
    await wait_for(lambda: present('nodegate_nodes{gate="' + g + '",status="failed"} 1.0'), what="the failed count")

    # No more policy (one compartment, __default__), no more package `tool`: their series go.
    await scenario.kube.patch(NODEGATES, g, {"spec": {"deploymentPolicy": None, "interruptionBudget": {"count": 1},
                                                      "packages": {"tool": None}}})
    await wait_for(lambda: gone('compartment="canary"'), what="the canary series gone")
    await wait_for(lambda: gone('package="tool"'), what="the package's series gone")
    assert await present('compartment="__default__"')
    await scenario.wait_ready()

    await scenario.delete_gate()
    await wait_for(lambda: _none_left(scenario, g), what=f"every series of gate {g} gone")


async def _none_left(sc: Scenario, gate: str) -> bool:
    return _series(sc, gate) == []



async def test_a_failed_uninstall_shows_on_its_node_and_a_reset_lets_the_deleted_gate_go(
        scenario: Scenario, kubectl: Kubectl) -> None:
    g = scenario.name
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({"agent": {**PKG, "uninstall": {"enabled": True}}})
    await scenario.wait_ready()
    await scenario.inject(failing_stage("fail", nodes=[node], package="agent", stage="uninstall"))
    await scenario.kube.delete(NODEGATES, g)
    await scenario.wait_node(node, "failed")
    cond = await _until_condition(kubectl, node, g, present=True)
    assert cond is not None and cond["reason"] == "UninstallFailed"
    assert cond["message"].startswith(f"NodeGate {g}: package agent failed in stage uninstall")
    assert (await scenario.gate())["metadata"]["finalizers"] == [keys.FINALIZER]  # held: the node is not clean

    # Fixed by hand, the node is reset (what `nodegate node reset` asks): released, and the gate goes.
    await scenario.kube.patch(NODES, node, {"metadata": {"annotations": {keys.reset_annotation(g): "now"}}})
    await scenario.delete_gate()
    meta = (await scenario.node(node))["metadata"]
    assert [k for k in (*meta.get("annotations", {}), *meta.get("labels", {})) if k.startswith("nodegate.io/")] == []
    assert _condition(kubectl, node, g) is None
