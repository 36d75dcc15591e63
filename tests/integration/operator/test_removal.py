"""Removing a gate is a rollout too: the uninstalls of a deleted gate run in batches under its budget,
each node cordoned, drained, interrupted and checked as its uninstall needs, and a failed uninstall
stops its compartment until a person resumes it."""

from __future__ import annotations

import itertools

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import KWOK_STAGES, NODEGATES, NODES
from gate.kube.errors import NotFound
from gate.rollout import order_key
from gate.testing.watcher import InvariantWatcher
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

AGENT = {"version": "1.0.0", "image": "registry.example.com/agent", "retries": 0, "uninstall": {"enabled": True}}
KEEP = {"version": "1.0.0", "image": "registry.example.com/keep"}


async def _gone(sc: Scenario) -> bool:
    try:
        await sc.gate()
        return False
    except NotFound:
        return True


async def _deleting_reason(sc: Scenario) -> str | None:
    conds = {c["type"]: c for c in ((await sc.gate()).get("status") or {}).get("conditions") or []}
    return conds.get("Deleting", {}).get("reason")


async def _clean(sc: Scenario, node: str) -> bool:
    meta = (await sc.node(node))["metadata"]
    return not [k for k in (*meta.get("annotations", {}), *meta.get("labels", {})) if k.startswith("nodegate.io/")]


async def test_the_uninstalls_of_a_deleted_gate_run_one_batch_at_a_time_under_its_budget(
        scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(3)
    await scenario.apply_gate({"agent": AGENT, "keep": KEEP}, interruptionBudget={"count": 1})
    await scenario.wait_ready(timeout=120)
    await scenario.kube.delete(NODEGATES, scenario.name)
    await wait_for(lambda: _gone(scenario), timeout=120, what="the gate released")
    uninstalls = sorted((r for r in step_log.of(scenario.name) if r.stage == "uninstall"),
                        key=lambda r: r.resource_version)
    assert sorted(r.node for r in uninstalls) == sorted(nodes) and {r.package for r in uninstalls} == {"agent"}
    # The budget of one node: each uninstall started only after the one before had ended (etcd revisions).
    for before, after in itertools.pairwise(uninstalls):
        assert before.finished_rv is not None and after.resource_version > before.finished_rv, (before, after)
    for node in nodes:
        assert await _clean(scenario, node)


async def test_a_failed_uninstall_stops_the_removal_until_a_person_resumes_it(
        scenario: Scenario, step_log: StepLog) -> None:
    g = scenario.name
    policy = f"{g}-policy"
    scenario.policies.append(policy)
    nodes = await scenario.add_nodes(3)
    await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"default": {"budget": {"count": 1},
                             "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}}}},
        field_manager="test", force=True)
    await scenario.apply_gate({"agent": AGENT}, deploymentPolicy=policy)
    await scenario.wait_ready(timeout=120)
    await scenario.inject(failing_stage("fail", nodes=nodes, package="agent", stage="uninstall"))
    await scenario.kube.delete(NODEGATES, g)

    async def stopped() -> bool:
        return await _deleting_reason(scenario) == "CompartmentStopped"

    await wait_for(stopped, timeout=60, what="the removal stopped by the failed uninstall")
    [failed] = [r.node for r in step_log.of(g) if r.stage == "uninstall"]
    assert await scenario.node_status(failed) == "failed"
    assert sorted([await scenario.node_status(n) for n in nodes if n != failed]) == ["blocked", "blocked"]

    # The host is fixed and the failed node reset; a person resumes the removal: the rest uninstall.
    for stage in scenario.stages:
        await scenario.kube.delete(KWOK_STAGES, stage)
    scenario.stages.clear()
    await scenario.kube.patch(NODES, failed, {"metadata": {"annotations": {keys.reset_annotation(g): "now"}}})
    await scenario.kube.patch(NODEGATES, g, {"metadata": {"annotations": {keys.RESUME_ANNOTATION: "*"}}})
    await wait_for(lambda: _gone(scenario), timeout=120, what="the gate released")
    uninstalled = sorted(r.node for r in step_log.of(g) if r.stage == "uninstall")
    assert uninstalled == sorted(nodes)  # the failed node's one try, then one each for the others
    for node in nodes:
        assert await _clean(scenario, node)


async def test_a_node_left_cordoned_by_a_failure_does_not_hold_a_budget_of_one_forever(
        scenario: Scenario, step_log: StepLog) -> None:
    # In pick order: `good` installs first, then `failed` fails after its cordon and stays cordoned,
    # holding the only unit of the budget.
    good, failed = sorted(await scenario.add_nodes(2), key=order_key)
    await scenario.inject(failing_stage("fail", nodes=[failed], package="agent", stage="post-interrupt"))
    await scenario.apply_gate({"agent": {**AGENT, "interrupt": {"type": "service", "services": ["agent"]}}},
                              interruptionBudget={"count": 1})
    await scenario.wait_node(failed, "failed", timeout=90)
    await scenario.wait_node(good, "complete", timeout=90)
    assert (await scenario.node(failed))["spec"].get("unschedulable") is True
    await scenario.kube.delete(NODEGATES, scenario.name)
    await wait_for(lambda: _gone(scenario), timeout=120, what="the gate released")
    assert sorted(r.node for r in step_log.of(scenario.name) if r.stage == "uninstall") == sorted([good, failed])
    for node in (good, failed):
        assert await _clean(scenario, node)
        assert not (await scenario.node(node))["spec"].get("unschedulable")


async def test_a_removal_that_needs_a_reboot_cordons_drains_reboots_and_checks_each_node_in_turn(
        scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(3)
    # Installed with no interrupt; its uninstall needs a reboot (`uninstall.interrupt`).
    uninstall = {"enabled": True, "interrupt": {"type": "reboot"}}
    await scenario.apply_gate({"agent": {**AGENT, "uninstall": uninstall}}, interruptionBudget={"count": 1})
    await scenario.wait_ready(timeout=120)
    booted = {n: (await scenario.node(n))["status"]["nodeInfo"]["bootID"] for n in nodes}
    installed = {r.name for r in step_log.of(scenario.name)}
    watcher = InvariantWatcher(scenario.kube)
    await watcher.start()
    try:
        await scenario.kube.delete(NODEGATES, scenario.name)
        await wait_for(lambda: _gone(scenario), timeout=240, what="the gate released")
    finally:
        report = await watcher.stop()
    # The budget of one held on the removal's reboots, and no node was uncordoned under a stage.
    assert not report.violations, report.summary()
    assert report.coverage.disruptions_judged >= len(nodes) and report.coverage.interrupts_judged >= len(nodes)
    removal = sorted((r for r in step_log.of(scenario.name) if r.name not in installed),
                     key=lambda r: r.resource_version)
    for node in nodes:
        # Uninstall, then the reboot (the node came back with a new boot ID), then the check after it.
        assert [(r.stage, r.interrupt) for r in removal if r.node == node] == [
            ("uninstall", None), ("interrupt", "reboot"), ("post-uninstall", None)], removal
        assert [r.args[r.args.index("--stage") + 1] for r in removal if r.node == node and r.package] == [
            "uninstall", "post-uninstall"]
        assert (await scenario.node(node))["status"]["nodeInfo"]["bootID"] != booted[node]
        assert await _clean(scenario, node)
        assert not (await scenario.node(node))["spec"].get("unschedulable")
    # One node at a time: each node's removal started only after the one before had ended.
    by_node = [[r for r in removal if r.node == n] for n in sorted(nodes, key=lambda n: min(
        r.resource_version for r in removal if r.node == n))]
    for before, after in itertools.pairwise(by_node):
        assert before[-1].finished_rv is not None and after[0].resource_version > before[-1].finished_rv
