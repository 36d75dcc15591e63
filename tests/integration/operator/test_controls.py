"""Readiness taint, uninstall, deletion, pause and crash safety on simulated nodes."""

from __future__ import annotations

import asyncio
import signal

from gate.api import keys
from gate.devcluster.cluster import DevCluster, node_manifest
from gate.devcluster.services import start_operator
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODES
from tests.integration.conftest import Webhook, readiness_holder
from tests.integration.operator.conftest import OPERATOR_FLAGS, Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}


def _tainted(node: dict) -> bool:  # type: ignore[type-arg]
    return any(t["key"] == keys.READINESS_TAINT_KEY for t in node["spec"].get("taints") or [])


async def test_node_joining_while_the_webhook_is_up_is_tainted_at_creation(
        scenario: Scenario, webhook: Webhook, step_log: StepLog) -> None:
    await scenario.apply_gate({"runtime": PKG}, readinessTaint=True)
    await scenario.wait_condition("Ready")
    created = await scenario.kube.create(NODES, node_manifest(f"{scenario.name}-0", {"test": scenario.name}))
    scenario.nodes.append(created["metadata"]["name"])
    assert _tainted(created), "the mutating webhook did not taint the joining node"
    await scenario.wait_node(created["metadata"]["name"], "complete")
    assert not _tainted(await scenario.node(created["metadata"]["name"]))


async def test_node_joining_while_the_webhook_is_down_is_tainted_by_the_operator_before_any_stage(
        scenario: Scenario, webhook: Webhook, cluster: DevCluster, step_log: StepLog) -> None:
    await scenario.add_nodes(1)  # an existing node: never tainted
    await scenario.apply_gate({"runtime": PKG}, readinessTaint=True)
    await scenario.wait_ready()
    [old] = scenario.nodes
    assert not _tainted(await scenario.node(old))
    name = f"{scenario.name}-1"
    # Watch the node from its creation: etcd revisions order its changes against the Jobs' creation.
    taint_revisions: list[int] = []
    watch = WatchCache(scenario.kube, NODES, field_selector=f"metadata.name={name}")
    watch.subscribe(lambda kind, obj: taint_revisions.append(int(obj["metadata"]["resourceVersion"]))
                    if _tainted(obj) else None)
    await watch.start()
    created = await scenario.join_while_webhook_down(name)
    try:
        assert not _tainted(created), "the webhook was supposed to be down"
        await scenario.wait_node(name, "complete")
    finally:
        await watch.stop()
    first_job = min(r.resource_version for r in step_log.of(scenario.name, name))
    assert taint_revisions and min(taint_revisions) < first_job, "a stage pod was created before the taint"
    assert not _tainted(await scenario.node(name)), "the taint was not lifted after the node completed"
    # Events follow the node write that they tell of (gate.controller.executor), so they may come a moment later.
    async def both_told() -> bool:
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={name}")
        return {"ReadinessTaintAdded", "ReadinessTaintRemoved"} <= {e["reason"] for e in events}

    await wait_for(both_told, what="the ReadinessTaintAdded and ReadinessTaintRemoved Events of the node")


async def test_readiness_taint_stays_until_every_readiness_gate_is_complete(scenario: Scenario) -> None:
    from gate.devcluster.stages import failing_stage

    # Until the two gates are there, a paused one holds the taint the node registers with (the operator
    # lifts a taint that no readinessTaint gate holds).
    async with readiness_holder(scenario.kube, {"test": scenario.name}) as holder:
        [node] = await scenario.add_nodes(1, taints=[{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}])
        other = f"{scenario.name}-second"
        # The second gate never completes on the node: its only stage fails there.
        await scenario.inject(failing_stage("fail", nodes=[node], package="never"))
        manifest = scenario.gate_manifest({"never": {**PKG, "retries": 0}}, readinessTaint=True)
        manifest["metadata"]["name"] = other
        await scenario.kube.apply(manifest, field_manager="test", force=True)
        await scenario.apply_gate({"fine": PKG}, readinessTaint=True)
        await scenario.delete_gate(holder)
    try:
        await scenario.wait_ready()
        assert _tainted(await scenario.node(node)), "tainted while another readinessTaint gate failed there"
    finally:
        await scenario.delete_gate(other)
    # With the failing gate gone, nothing requires the taint any more... but only this gate may
    # decide that now; the deletion of the other gate lifts it when this one is complete.
    async def untainted() -> bool:
        return not _tainted(await scenario.node(node))

    await wait_for(untainted, what="taint lifted once the remaining readiness gate is complete")


async def test_uninstall_apply_runs_uninstall_on_every_node(scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(2)
    pkg = {**PKG, "uninstall": {"enabled": True}}
    await scenario.apply_gate({"agent": pkg, "keep": PKG})
    await scenario.wait_ready()
    await scenario.apply_gate({"agent": {**pkg, "uninstall": {"enabled": True, "apply": True}}, "keep": PKG})
    await scenario.wait_ready()
    for node in nodes:
        assert [r.stage for r in step_log.of(scenario.name, node) if r.package == "agent"] == ["apply", "uninstall"]
        installed = (await scenario.state(node))["installed"]
        assert "agent" not in installed and "keep" in installed


async def test_deleting_the_gate_uninstalls_uncordons_and_removes_every_key(
        scenario: Scenario, step_log: StepLog) -> None:
    from gate.devcluster.stages import failing_stage

    good, failed = await scenario.add_nodes(2)
    # One node fails after cordon: deletion must still uncordon it and clean it up.
    await scenario.inject(failing_stage("fail", nodes=[failed], package="tool", stage="post-interrupt"))
    await scenario.apply_gate({
        "tool": {**PKG, "retries": 0, "uninstall": {"enabled": True},
                 "interrupt": {"type": "service", "services": ["t"]}},
        "plain": PKG,
    }, interruptionBudget={"percent": 100})
    await scenario.wait_node(failed, "failed")
    await scenario.wait_node(good, "complete")
    assert (await scenario.node(failed))["spec"].get("unschedulable") is True
    await scenario.delete_gate()  # returns once the gate is gone: its cleanup finished
    for node in (good, failed):
        obj = await scenario.node(node)
        annotations = obj["metadata"].get("annotations") or {}
        labels = obj["metadata"].get("labels") or {}
        assert not [k for k in annotations if k.startswith("nodegate.io/")], annotations
        assert not [k for k in labels if k.startswith("nodegate.io/")], labels
        assert not obj["spec"].get("unschedulable")
    uninstalls = [r.node for r in step_log.of(scenario.name) if r.stage == "uninstall"]
    assert sorted(uninstalls) == sorted([good, failed])  # only "tool" has uninstall enabled


async def test_deleting_a_gate_releases_nodes_it_never_started_on(scenario: Scenario, step_log: StepLog) -> None:
    # Paused from the start: one node joined with the readiness taint and waits, one waits untainted.
    # A paused gate over the tainted node alone holds its taint until this one is there (the operator
    # lifts a taint that no readinessTaint gate holds).
    async with readiness_holder(scenario.kube, {"test": scenario.name, "held": "yes"}) as holder:
        [tainted] = await scenario.add_nodes(1, {"held": "yes"},
                                             taints=[{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}])
        [plain] = await scenario.add_nodes(1, start=1)
        await scenario.apply_gate({"base": PKG}, paused=True, readinessTaint=True)
        await scenario.wait_condition("Paused")
        await scenario.delete_gate(holder)
    for node in (tainted, plain):
        await wait_for(lambda n=node: _is_waiting(scenario, n), what=f"{node} waiting in line")
    assert _tainted(await scenario.node(tainted))
    await scenario.delete_gate()
    for node in (tainted, plain):
        obj = await scenario.node(node)
        assert keys.status_label(scenario.name) not in (obj["metadata"].get("labels") or {}), obj["metadata"]
        assert not _tainted(obj), "the readiness taint outlived the only gate that wanted it"
    assert step_log.of(scenario.name) == []


async def _is_waiting(sc: Scenario, node: str) -> bool:
    return await sc.node_status(node) == "waiting"


async def test_paused_gate_starts_nothing_until_resumed(scenario: Scenario, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(2)
    await scenario.apply_gate({"base": PKG}, paused=True)
    gate = await scenario.wait_condition("Paused")
    await asyncio.sleep(2)
    assert step_log.of(scenario.name) == []
    gate = await scenario.gate()
    assert gate["status"]["status"] == "Paused" and gate["status"]["nodes"]["complete"] == 0
    for node in nodes:
        assert await scenario.node_status(node) == "waiting"
    await scenario.apply_gate({"base": PKG}, paused=False)
    await scenario.wait_ready()
    assert len(step_log.of(scenario.name)) == 2


async def test_pausing_mid_rollout_lets_running_nodes_finish_and_starts_no_more(
        scenario: Scenario, step_log: StepLog) -> None:
    from gate.devcluster.stages import slow_stage

    nodes = await scenario.add_nodes(4)
    # Every stage runs 4 s here: long enough to pause while the first batch is still at work.
    await scenario.inject(slow_stage("slow", nodes=nodes, package="base", seconds=4))
    # etcd revision at which each node first showed in-progress / complete, from a watch that sees
    # every change: it orders them against the pause and the resume without reading a clock.
    started: dict[str, int] = {}
    completed: dict[str, int] = {}
    label = keys.status_label(scenario.name)

    def on_node(kind: str, node: dict) -> None:  # type: ignore[type-arg]
        status = (node["metadata"].get("labels") or {}).get(label)
        name, revision = node["metadata"]["name"], int(node["metadata"]["resourceVersion"])
        if status == "in-progress":
            started.setdefault(name, revision)
        elif status == "complete":
            completed.setdefault(name, revision)

    watch = WatchCache(scenario.kube, NODES, label_selector=f"test={scenario.name}")
    watch.subscribe(on_node)
    await watch.start()
    try:
        # a budget of 2: the first batch is two nodes, the other two wait for it
        await scenario.apply_gate({"base": PKG}, interruptionBudget={"count": 2})

        async def first_batch_running() -> bool:
            return len({r.node for r in step_log.of(scenario.name) if r.finished is None}) == 2

        await wait_for(first_batch_running, what="the first batch's stage pods running")
        paused_at = int((await scenario.patch_gate({"spec": {"paused": True}}))["metadata"]["resourceVersion"])
        running = {node for node, revision in started.items() if revision < paused_at}
        waiting = set(nodes) - running
        assert len(running) == 2 and len(waiting) == 2, (started, paused_at)

        for node in running:
            await scenario.wait_node(node, "complete")
        await scenario.wait_condition("Paused")

        async def settled() -> bool:
            figures = ((await scenario.gate()).get("status") or {}).get("nodes") or {}
            return figures.get("complete") == 2 and figures.get("inProgress") == 0

        await wait_for(settled, what="the gate's status counting the first batch complete")
        await asyncio.sleep(2)  # a few operator polls in which the next batch could have started
        assert all(completed[node] > paused_at for node in running), "they had finished before the pause"
        for node in waiting:
            assert step_log.of(scenario.name, node) == [], f"a stage pod started on {node} while paused"
            assert await scenario.node_status(node) == "waiting"

        resumed_at = int((await scenario.patch_gate({"spec": {"paused": False}}))["metadata"]["resourceVersion"])
        await scenario.wait_ready()
    finally:
        await watch.stop()
    for node in waiting:
        assert started[node] > resumed_at, f"{node} started while the gate was paused"
        assert min(r.resource_version for r in step_log.of(scenario.name, node)) > resumed_at
    for node in nodes:
        assert await scenario.node_status(node) == "complete"
    assert not step_log.created_twice(scenario.name)


async def test_operator_killed_mid_rollout_resumes_without_repeating_or_overrunning(
        scenario: Scenario, cluster: DevCluster, step_log: StepLog) -> None:
    nodes = await scenario.add_nodes(6)
    await scenario.apply_gate({
        "first": {**PKG, "interrupt": {"type": "reboot"}},
        "second": {**PKG, "dependsOn": {"first": ">=1.0.0"}},
    }, interruptionBudget={"count": 2})
    disrupted_max = 0

    async def watch_budget() -> None:
        nonlocal disrupted_max
        while True:
            items, _ = await scenario.kube.list(NODES, label_selector=f"test={scenario.name}")
            now = sum(1 for n in items if n["spec"].get("unschedulable"))
            disrupted_max = max(disrupted_max, now)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_budget())
    try:
        for _ in range(3):
            await wait_for(lambda: _some_in_progress(scenario), what="nodes in progress")
            cluster.stop_process("operator", sig=signal.SIGKILL)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(start_operator, cluster, lambda m: None, extra=OPERATOR_FLAGS)
        await scenario.wait_ready(timeout=120)
    finally:
        watcher.cancel()
    assert disrupted_max <= 2, f"{disrupted_max} nodes were cordoned at once with a budget of 2"
    assert not step_log.created_twice(scenario.name), "a stage pod was created again after a restart"
    per_step: dict[tuple[str, str | None, str], int] = {}
    for r in step_log.of(scenario.name):
        key = (r.node, r.package, r.stage)
        per_step[key] = per_step.get(key, 0) + 1
    repeated = {k: v for k, v in per_step.items() if v > 1}
    assert not repeated, f"stages ran twice on a node: {repeated}"
    for node in nodes:
        obj = await scenario.node(node)
        assert not obj["spec"].get("unschedulable")
        assert (await scenario.state(node))["installed"].keys() == {"first", "second"}


async def _some_in_progress(sc: Scenario) -> bool:
    for node in sc.nodes:
        if await sc.node_status(node) == "in-progress":
            return True
    return False
