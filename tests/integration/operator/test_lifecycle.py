"""The per-node package lifecycle on simulated nodes: install, upgrade, config, order, interrupts."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gate.api import keys
from gate.kube.cache import WatchCache
from gate.kube.client import NODES, PODS
from gate.kube.errors import NotFound
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}


def _stages(log: StepLog, gate: str, node: str) -> list[tuple[str | None, str]]:
    return [(r.package, r.stage) for r in log.of(gate, node)]


async def test_first_install_runs_apply_on_every_node_and_reports_ready(scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(3)
    await scenario.apply_gate({"base": PKG})
    gate = await scenario.wait_ready()
    status = gate["status"]
    assert status["nodes"]["matched"] == 3 and status["nodes"]["complete"] == 3
    assert status["progress"] == "3/3" and status["status"] == "Ready"
    for node in nodes:
        assert await scenario.node_status(node) == "complete"
        state = await scenario.state(node)
        assert state["installed"]["base"]["version"] == "1.0.0"
        assert _stages(step_log, scenario.name, node) == [("base", "apply")]
        # no interrupt was asked for: the node was never cordoned
        assert not (await scenario.node(node))["spec"].get("unschedulable")


async def test_version_upgrade_runs_upgrade_with_the_previous_version(scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({"base": PKG})
    await scenario.wait_ready()
    await scenario.apply_gate({"base": {**PKG, "version": "1.1.0"}})
    await scenario.wait_ready()
    upgrade = [r for r in step_log.of(scenario.name, node) if r.stage == "upgrade"]
    assert len(upgrade) == 1
    args = upgrade[0].args
    assert args[args.index("--version") + 1] == "1.1.0"
    assert args[args.index("--previous-version") + 1] == "1.0.0"
    assert (await scenario.state(node))["installed"]["base"]["version"] == "1.1.0"


async def test_config_change_reruns_config_and_only_matching_config_interrupts(
        scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    pkg = {**PKG, "config": {"tuned.conf": "a=1", "notes.txt": "v1"},
           "configInterrupts": {"*.conf": {"type": "service", "services": ["tuned"]}}}
    await scenario.apply_gate({"tuning": pkg})
    await scenario.wait_ready()
    first = _stages(step_log, scenario.name, node)
    assert first == [("tuning", "apply"), ("tuning", "config"), (None, "interrupt"), ("tuning", "post-interrupt")]

    # A key that no configInterrupt matches: config runs again, nothing is interrupted.
    await scenario.apply_gate({"tuning": {**pkg, "config": {"tuned.conf": "a=1", "notes.txt": "v2"}}})
    await scenario.wait_ready()
    second = _stages(step_log, scenario.name, node)[len(first):]
    assert second == [("tuning", "config")]

    # A *.conf key: config, then the service restart with its cordon and check.
    await scenario.apply_gate({"tuning": {**pkg, "config": {"tuned.conf": "a=2", "notes.txt": "v2"}}})
    await scenario.wait_ready()
    third = _stages(step_log, scenario.name, node)[len(first) + len(second):]
    assert third == [("tuning", "config"), (None, "interrupt"), ("tuning", "post-interrupt")]
    interrupt = [r for r in step_log.of(scenario.name, node) if r.stage == "interrupt"][-1]
    assert interrupt.interrupt == "service" and interrupt.args[interrupt.args.index("--service"):][:2] == [
        "--service", "tuned"]


async def test_packages_run_in_dependency_order(scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({
        "driver": {**PKG, "dependsOn": {"kernel": ">=1.0.0"}},
        "kernel": {**PKG},
        "tools": {**PKG, "dependsOn": {"driver": "^1.0"}},
    })
    await scenario.wait_ready()
    records = step_log.of(scenario.name, node)
    order = [r.package for r in records]
    assert order == ["kernel", "driver", "tools"]
    assert len({r.pod for r in records}) == 1, "the stages of one round run in one pod"
    by_pkg = {r.package: r for r in records}
    # each starts only after its dependency finished
    for first, then in (("kernel", "driver"), ("driver", "tools")):  # ordered by etcd revision
        ended, started = by_pkg[first].finished_rv, by_pkg[then].started_rv
        assert ended is not None and started is not None and ended <= started, f"{then} started before {first} ended"


async def test_the_stages_of_a_round_run_one_after_another_in_one_pod(scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(2)
    packages = {name: PKG for name in ("alpha", "beta", "gamma")}
    await scenario.apply_gate(packages)
    await scenario.wait_ready()
    await scenario.apply_gate({name: {**PKG, "version": "2.0.0"} for name in packages})
    await scenario.wait_ready()
    for node in nodes:
        for stage in ("apply", "upgrade"):
            records = [r for r in step_log.of(scenario.name, node) if r.stage == stage]
            assert len(records) == 3 and len({r.pod for r in records}) == 1, f"{stage}: one pod for the round"
            assert all(r.succeeded for r in records)
            for before, after in itertools.pairwise(records):
                assert before.finished_rv is not None and after.started_rv is not None
                assert before.finished_rv <= after.started_rv, "stages of one node overlapped"


async def test_interrupts_merge_into_one_per_node(scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({
        "pa": {**PKG, "interrupt": {"type": "service", "services": ["svc-a"]}},
        "pb": {**PKG, "interrupt": {"type": "service", "services": ["svc-b", "svc-a"]}},
        "pc": {**PKG},
    })
    await scenario.wait_ready()
    interrupts = [r for r in step_log.of(scenario.name, node) if r.stage == "interrupt"]
    assert len(interrupts) == 1
    assert interrupts[0].interrupt == "service"
    args = interrupts[0].args
    assert args[args.index("--service"):][:4] == ["--service", "svc-a", "--service", "svc-b"]
    checks = sorted(r.package or "" for r in step_log.of(scenario.name, node) if r.stage == "post-interrupt")
    assert checks == ["pa", "pb"]  # pc asked for no interrupt: nothing to check after it
    # One pod for the round: the stages, the service restart and the checks (issue 37).
    assert len({r.pod for r in step_log.of(scenario.name, node)}) == 1

    await scenario.apply_gate({
        "pa": {**PKG, "version": "1.1.0", "interrupt": {"type": "service", "services": ["svc-a"]}},
        "pb": {**PKG, "version": "1.1.0", "interrupt": {"type": "restartAllServices"}},
        "pc": {**PKG, "version": "1.1.0"},
    })
    await scenario.wait_ready()
    interrupts = [r for r in step_log.of(scenario.name, node) if r.stage == "interrupt"]
    assert len(interrupts) == 2 and interrupts[1].interrupt == "restartAllServices"
    assert "--service" not in interrupts[1].args


async def test_reboot_waits_for_a_new_boot_id_and_ready(scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    before = (await scenario.node(node))["status"]["nodeInfo"]["bootID"]
    await scenario.apply_gate({"kernel": {**PKG, "interrupt": {"type": "reboot"}}})
    await scenario.wait_ready()
    after = await scenario.node(node)
    assert after["status"]["nodeInfo"]["bootID"] != before
    assert not after["spec"].get("unschedulable")
    assert keys.CORDONED_BY not in (after["metadata"].get("annotations") or {})
    stages = _stages(step_log, scenario.name, node)
    assert stages == [("kernel", "apply"), (None, "interrupt"), ("kernel", "post-interrupt")]
    assert [r.interrupt for r in step_log.of(scenario.name, node) if r.stage == "interrupt"] == ["reboot"]
    # One pod per boot: the stage and the reboot, its last step, in one; the check on the new boot in another.
    apply, reboot, check = step_log.of(scenario.name, node)
    assert apply.pod == reboot.pod != check.pod and apply.succeeded
    assert apply.finished_rv is not None and reboot.started_rv is not None and apply.finished_rv <= reboot.started_rv


async def test_a_drain_interrupt_cordons_and_drains_around_the_stage_and_restarts_nothing(
        scenario: Scenario, step_log: StepLog) -> None:
    [node] = await scenario.add_nodes(1)
    web = f"{scenario.name}-web"
    await scenario.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": web, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}],
                 "terminationGracePeriodSeconds": 0}})

    async def running() -> bool:
        return bool((await scenario.kube.get(PODS, web, "default")).get("status", {}).get("phase") == "Running")

    await wait_for(running, what=f"pod {web} running")
    # Watches of our own, in etcd's order (resourceVersions): when the node's cordon changed, when the
    # plain pod began to go.
    cordon: list[tuple[int, bool]] = []
    evicted: list[int] = []

    def on_node(kind: str, obj: dict[str, Any]) -> None:
        unschedulable = bool(obj["spec"].get("unschedulable"))
        if not cordon or cordon[-1][1] != unschedulable:
            cordon.append((int(obj["metadata"]["resourceVersion"]), unschedulable))

    def on_pod(kind: str, obj: dict[str, Any]) -> None:
        if not evicted and (kind == "DELETED" or obj["metadata"].get("deletionTimestamp")):
            evicted.append(int(obj["metadata"]["resourceVersion"]))

    client = await scenario.cluster.client()
    nodes = WatchCache(client, NODES, field_selector=f"metadata.name={node}")
    pods = WatchCache(client, PODS, namespace="default", field_selector=f"metadata.name={web}")
    nodes.subscribe(on_node)
    pods.subscribe(on_pod)
    await nodes.start()
    await pods.start()
    try:
        for obj in nodes.items():
            on_node("ADDED", obj)
        await scenario.apply_gate({"tuning": {**PKG, "interrupt": {"type": "drain"}, "gracefulShutdown": "45s"}})
        await scenario.wait_ready()
        await wait_for(lambda: _true(len(cordon) >= 3), what="the cordon and the uncordon seen by the watch")
    finally:
        await nodes.stop()
        await pods.stop()
        await client.close()
        await scenario.kube.delete(PODS, web, "default", body={"gracePeriodSeconds": 0})
    records = step_log.of(scenario.name, node)
    # No restart: no interrupt Job, and so no Job labelled nodegate.io/interrupt; the package's check runs.
    assert [(r.package, r.stage) for r in records] == [("tuning", "apply"), ("tuning", "post-interrupt")]
    assert [r.name for r in records if r.interrupt is not None] == []
    assert [u for _, u in cordon] == [False, True, False], cordon  # cordoned once, uncordoned once
    [_, (cordoned, _), (uncordoned, _)] = cordon
    # Cordoned, then drained (the plain pod evicted), then the stage and the check, all while cordoned.
    assert evicted and cordoned < evicted[0] < records[0].resource_version, (cordon, evicted, records)
    for record in records:
        assert record.grace_period == 45  # gracefulShutdown, through the CRD's schema to the stage pods
        assert record.succeeded and record.finished_rv is not None, record
        assert cordoned < record.resource_version and record.finished_rv < uncordoned, (cordon, record)
    with pytest.raises(NotFound):
        await scenario.kube.get(PODS, web, "default")
    after = await scenario.node(node)
    assert not after["spec"].get("unschedulable")
    assert keys.CORDONED_BY not in (after["metadata"].get("annotations") or {})
    assert await scenario.node_status(node) == "complete"


async def _true(value: bool) -> bool:
    return value


async def test_human_cordoned_node_stays_cordoned(scenario: Scenario) -> None:
    nodes = await scenario.add_nodes(2)
    from gate.kube.client import NODES

    await scenario.kube.patch(NODES, nodes[0], {"spec": {"unschedulable": True}})
    await scenario.apply_gate({"kernel": {**PKG, "interrupt": {"type": "service", "services": ["x"]}}})
    await scenario.wait_ready()
    human, ours = await scenario.node(nodes[0]), await scenario.node(nodes[1])
    assert human["spec"].get("unschedulable") is True, "NodeGate uncordoned a node someone else cordoned"
    assert not ours["spec"].get("unschedulable")

    async def no_marker() -> bool:
        for n in nodes:
            if keys.CORDONED_BY in ((await scenario.node(n))["metadata"].get("annotations") or {}):
                return False
        return True

    await wait_for(no_marker, what="cordoned-by annotations removed")
