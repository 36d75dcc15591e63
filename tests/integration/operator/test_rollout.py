"""The rollout across compartments, observed on the cluster: batches, stops, windows, priorities."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODEGATES, NODES
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}


class BatchWatch:
    """An independent observer: which node joined which batch of which compartment, and when nodes
    of a compartment were in progress together."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.batches: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.in_progress: dict[str, set[str]] = defaultdict(set)
        self.peak: dict[str, int] = defaultdict(int)
        self.started_at: dict[str, float] = {}
        self.cache = WatchCache(sc.kube, NODES, label_selector=f"test={sc.name}")
        self.cache.subscribe(self._on)
        self.gate = sc.name

    def _on(self, kind: str, node: dict[str, Any]) -> None:
        raw = (node["metadata"].get("annotations") or {}).get(keys.state_annotation(self.gate))
        if not raw:
            return
        state = json.loads(raw)
        name = node["metadata"]["name"]
        comp = state.get("compartment") or "?"
        if state.get("batch"):
            self.batches[(comp, state["batch"])].add(name)
        if state.get("status") == "in-progress":
            self.in_progress[comp].add(name)
            self.started_at.setdefault(name, asyncio.get_running_loop().time())
        else:
            self.in_progress[comp].discard(name)
        self.peak[comp] = max(self.peak[comp], len(self.in_progress[comp]))

    def sizes(self, compartment: str) -> list[int]:
        return [len(nodes) for (c, _), nodes in sorted(self.batches.items()) if c == compartment]

    async def __aenter__(self) -> BatchWatch:
        await self.cache.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cache.stop()


async def _policy(sc: Scenario, name: str, spec: dict[str, Any]) -> None:
    sc.policies.append(name)
    await sc.kube.apply({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                         "metadata": {"name": name}, "spec": spec}, field_manager="test", force=True)


async def test_each_strategy_sets_the_batch_sizes_within_the_budget(scenario: Scenario) -> None:
    await scenario.add_nodes(7, {"pool": "fixed"})
    await scenario.add_nodes(7, {"pool": "lin"}, start=10)
    await scenario.add_nodes(7, {"pool": "exp"}, start=20)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {}}},
        "compartments": [
            {"name": "fixed", "selector": {"matchLabels": {"pool": "fixed"}}, "budget": {"count": 2},
             "strategy": {"fixed": {"initialBatch": 2}}},
            {"name": "lin", "selector": {"matchLabels": {"pool": "lin"}}, "budget": {"count": 3},
             "strategy": {"linear": {"initialBatch": 1, "delta": 1}}},
            {"name": "exp", "selector": {"matchLabels": {"pool": "exp"}}, "budget": {"percent": 60},
             "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}}},
        ]})
    async with BatchWatch(scenario) as watch:
        await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
        gate = await scenario.wait_ready(timeout=120)
    assert watch.sizes("fixed") == [2, 2, 2, 1]
    assert watch.sizes("lin") == [1, 2, 3, 1]      # +1 per good batch, capped by the ceiling of 3
    assert watch.sizes("exp") == [1, 2, 4]         # x2 per good batch; ceiling 60% of 7 = 4
    assert watch.peak == {"fixed": 2, "lin": 3, "exp": 4}
    ceilings = {c["name"]: c["ceiling"] for c in gate["status"]["compartments"]}
    assert ceilings == {"fixed": 2, "lin": 3, "exp": 4, "__default__": 0}


async def test_overlapping_selectors_put_a_node_in_the_first_compartment_listed(scenario: Scenario) -> None:
    await scenario.add_nodes(2, {"pool": "a", "gpu": "true"})
    await scenario.add_nodes(2, {"pool": "b"}, start=10)
    await scenario.add_nodes(1, {"pool": "c"}, start=20)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {
        "default": {"budget": {"count": 1}},
        "compartments": [
            {"name": "gpu", "selector": {"matchLabels": {"gpu": "true"}}, "budget": {"count": 1}},
            {"name": "pool-a", "selector": {"matchLabels": {"pool": "a"}}, "budget": {"count": 1}},
            {"name": "pool-b", "selector": {"matchLabels": {"pool": "b"}}, "budget": {"count": 1}},
        ]})
    await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
    gate = await scenario.wait_ready()
    matched = {c["name"]: c["matched"] for c in gate["status"]["compartments"]}
    assert matched == {"gpu": 2, "pool-a": 0, "pool-b": 2, "__default__": 1}
    for node in scenario.nodes:
        comp = (await scenario.state(node))["compartment"]
        labels = (await scenario.node(node))["metadata"]["labels"]
        expected = "gpu" if labels.get("gpu") else {"b": "pool-b", "c": "__default__"}[labels["pool"]]
        assert comp == expected


async def test_failure_threshold_stops_one_compartment_while_the_others_finish(scenario: Scenario) -> None:
    bad = await scenario.add_nodes(4, {"pool": "bad"})
    good = await scenario.add_nodes(4, {"pool": "good"}, start=10)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {
        "compartments": [
            {"name": "bad", "selector": {"matchLabels": {"pool": "bad"}}, "budget": {"count": 1},
             "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 2}}},
            {"name": "good", "selector": {"matchLabels": {"pool": "good"}}, "budget": {"count": 2},
             "strategy": {"fixed": {"initialBatch": 2}}},
        ]})
    await scenario.inject(failing_stage("fail", nodes=bad, package="tuning"))
    await scenario.apply_gate({"tuning": {**PKG, "retries": 0}}, deploymentPolicy=policy)

    async def settled() -> bool:
        status = (await scenario.gate()).get("status") or {}
        comps = {c["name"]: c for c in status.get("compartments") or []}
        return comps.get("bad", {}).get("state") == "stopped" and comps.get("good", {}).get("state") == "complete"

    await wait_for(settled, timeout=90, what="bad stopped and good complete")
    status = (await scenario.gate())["status"]
    comps = {c["name"]: c for c in status["compartments"]}
    assert comps["bad"]["failed"] == 2 and comps["bad"]["consecutiveFailures"] == 2
    assert comps["good"]["complete"] == 4
    statuses = [await scenario.node_status(n) for n in bad]
    assert statuses.count("failed") == 2 and statuses.count("blocked") == 2
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Degraded"]["status"] == "True" and "bad" in conds["Degraded"]["message"]

    async def stop_told() -> bool:  # the Event follows the status write that it tells of
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={scenario.name}")
        return "CompartmentStopped" in {e["reason"] for e in events}

    await wait_for(stop_told, what="a CompartmentStopped Event on the gate")
    await asyncio.sleep(2)  # nothing resumes by itself
    assert [await scenario.node_status(n) for n in bad].count("failed") == 2

    # A person resumes: the stop clears and the run of failures starts again at 0, so the next batch
    # runs, fails, and the one after it runs too; its failure is the second in a row and stops the
    # compartment again. (Wait for that end state: the moment with exactly three failed nodes may
    # last less than one poll.)
    await scenario.kube.patch(NODEGATES, scenario.name, {"metadata": {"annotations": {
        keys.RESUME_ANNOTATION: "bad"}}})

    async def stopped_again() -> bool:
        comps = {c["name"]: c for c in ((await scenario.gate()).get("status") or {}).get("compartments") or []}
        return comps.get("bad", {}).get("state") == "stopped" and comps["bad"].get("failed") == 4

    await wait_for(stopped_again, what="the resumed compartment to run two more batches and stop again")
    gate = await scenario.gate()
    comps = {c["name"]: c for c in gate["status"]["compartments"]}
    assert comps["bad"]["consecutiveFailures"] == 2
    assert sorted([(await scenario.state(n))["batch"] for n in bad]) == [1, 2, 3, 4]  # one node a batch
    assert [await scenario.node_status(n) for n in bad] == ["failed"] * 4
    assert keys.RESUME_ANNOTATION not in gate["metadata"].get("annotations", {})  # acted on, then removed
    assert all([await scenario.node_status(n) == "complete" for n in good])


async def test_a_window_closing_mid_rollout_lets_running_nodes_finish_and_starts_no_more(
        scenario: Scenario) -> None:
    from gate.devcluster.stages import slow_stage

    nodes = await scenario.add_nodes(30)
    # Each node's apply takes 3 s: one node at a time cannot finish all 30 in the minute the window is open.
    await scenario.inject(slow_stage("slow", nodes=nodes, package="slow", stage="apply", seconds=3))
    now = datetime.now(UTC)
    if now.second > 45:  # leave at least a few seconds of open window, never more than ~60
        await asyncio.sleep(61 - now.second)
        now = datetime.now(UTC)
    opened = now.strftime("%H:%M")
    closes = (now + timedelta(minutes=1)).strftime("%H:%M")
    today = now.strftime("%a")
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
        "windows": [{"days": [today], "start": opened, "end": closes, "timeZone": "UTC"}]})
    async with BatchWatch(scenario) as watch:
        await scenario.apply_gate({"slow": {**PKG, "interrupt": {"type": "service", "services": ["s"]}}},
                                  deploymentPolicy=policy)
        close_at = datetime.strptime(f"{now:%Y-%m-%d} {closes}", "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
        await asyncio.sleep(max(0.0, (close_at - datetime.now(UTC)).total_seconds()) + 1.0)
        started_by_close = len(watch.started_at)
        assert 0 < started_by_close < 30, "the rollout was supposed to be running when the window closed"

        async def quiet() -> bool:
            comp = ((await scenario.gate()).get("status") or {}).get("compartments") or [{}]
            return bool(comp[0].get("state") == "outside-window" and comp[0].get("inProgress") == 0)

        await wait_for(quiet, what="running nodes to finish after the window closed")
        await asyncio.sleep(2)
        assert len(watch.started_at) == started_by_close, "a node started outside the window"
        statuses = [await scenario.node_status(n) for n in scenario.nodes]
        assert "in-progress" not in statuses and statuses.count("complete") == started_by_close


async def test_priority_with_node_sequencing_orders_gates_per_node(scenario: Scenario, step_log: StepLog) -> None:
    await scenario.add_nodes(3)
    first = f"{scenario.name}-first"
    # The etcd revision at which each node first showed the higher-priority gate complete, seen by a
    # watch started before either gate exists: it orders the node's change against the Jobs' creation.
    first_complete: dict[str, int] = {}

    def on_node(kind: str, node: dict[str, Any]) -> None:
        raw = (node["metadata"].get("annotations") or {}).get(keys.state_annotation(first))
        if raw and json.loads(raw).get("status") == "complete":
            first_complete.setdefault(node["metadata"]["name"], int(node["metadata"]["resourceVersion"]))

    watch = WatchCache(scenario.kube, NODES, label_selector=f"test={scenario.name}")
    watch.subscribe(on_node)
    await watch.start()
    manifest = scenario.gate_manifest({"base": PKG}, priority=100, interruptionBudget={"count": 1})
    manifest["metadata"]["name"] = first
    try:
        await scenario.kube.apply(manifest, field_manager="test", force=True)
        await scenario.apply_gate({"after": PKG}, priority=200, sequencing="node")
        await scenario.wait_ready()
        for node in scenario.nodes:
            assert (await scenario.state(node))["status"] == "complete"
    finally:
        await watch.stop()
        await scenario.kube.delete(NODEGATES, first)
    # each node ran the second gate only once the first was complete there
    started: dict[str, int] = {}
    for node in scenario.nodes:
        jobs = step_log.of(scenario.name, node)
        assert jobs, f"no stage pod of the second gate on {node}"
        started[node] = min(r.resource_version for r in jobs)
        assert node in first_complete, f"the first gate never completed on {node}"
        assert first_complete[node] < started[node], f"the second gate started on {node} before the first completed"
    # with node sequencing the second gate does not wait for the first to finish everywhere (the first
    # goes one node at a time, the second follows node by node)
    assert min(started.values()) < max(first_complete.values()), (started, first_complete)


async def test_priority_with_all_sequencing_waits_for_the_whole_fleet(scenario: Scenario) -> None:
    nodes = await scenario.add_nodes(4)
    first = f"{scenario.name}-first"
    manifest = scenario.gate_manifest({"base": {**PKG, "retries": 0}}, priority=100)
    manifest["metadata"]["name"] = first
    # One node never completes the first gate: the second gate with sequencing all waits everywhere.
    await scenario.inject(failing_stage("fail", nodes=[nodes[0]], package="base"))
    await scenario.kube.apply(manifest, field_manager="test", force=True)
    try:
        await scenario.apply_gate({"after": PKG}, priority=200, sequencing="all")

        async def first_settled() -> bool:
            status = (await scenario.kube.get(NODEGATES, first)).get("status") or {}
            nodes_ = status.get("nodes") or {}
            return nodes_.get("complete") == 3 and nodes_.get("failed") == 1

        await wait_for(first_settled, what="first gate settled with one failure")
        await asyncio.sleep(2)
        statuses = {await scenario.node_status(n) for n in nodes}
        assert statuses == {"blocked"}, statuses
        # With node sequencing the healthy nodes would go ahead: switch and watch them finish.
        await scenario.apply_gate({"after": PKG}, priority=200, sequencing="node")
        for node in nodes[1:]:
            await scenario.wait_node(node, "complete")
        assert await scenario.node_status(nodes[0]) == "blocked"
    finally:
        await scenario.kube.delete(NODEGATES, first)
