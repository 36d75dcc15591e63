"""Health after the change, on the real control plane: soaking nodes, their batches, their verdicts.

kwok plays the kubelets; a test sets a node's condition as node-problem-detector would (a status
patch of the Node), takes a node down (NotReady, held so by an injected kwok Stage), or makes an alert
fire for it in the session's real Prometheus (tests/prometheus.py).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from gate.api import keys
from gate.controller.endpoints import PrometheusEndpoint
from gate.controller.promql import instant_query
from gate.devcluster.stages import node_down_stage
from gate.kube.cache import WatchCache
from gate.kube.client import NODES, POLICIES
from tests.integration.operator.conftest import Scenario, wait_for
from tests.prometheus import MetricsExporter

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}
GPU_CONDITION = {"type": "GpuUnhealthy", "status": "True"}


class Transitions:
    """An independent observer: every (node, status, phase, batch) the gate's nodes went through, in
    the order the API server served them."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.seen: list[tuple[str, str, str, int]] = []
        self.cache = WatchCache(sc.kube, NODES, label_selector=f"test={sc.name}")
        self.cache.subscribe(self._on)

    def _on(self, kind: str, node: dict[str, Any]) -> None:
        raw = (node["metadata"].get("annotations") or {}).get(keys.state_annotation(self.sc.name))
        if not raw:
            return
        state = json.loads(raw)
        entry = (node["metadata"]["name"], state.get("status", "waiting"), state.get("phase", "idle"),
                 int(state.get("batch", 0)))
        if not any(e[0] == entry[0] for e in self.seen) or next(e for e in reversed(self.seen)
                                                                if e[0] == entry[0]) != entry:
            self.seen.append(entry)

    def first(self, node: str, status: str, phase: str | None = None) -> int:
        for i, (n, s, p, _) in enumerate(self.seen):
            if n == node and s == status and (phase is None or p == phase):
                return i
        raise AssertionError(f"{node} never seen {status}/{phase}: {self.seen}")

    def disrupted_peak(self) -> int:
        """Most nodes in a round (in progress, not soaking) at once."""
        current: dict[str, tuple[str, str]] = {}
        peak = 0
        for n, s, p, _ in self.seen:
            current[n] = (s, p)
            peak = max(peak, sum(1 for st, ph in current.values() if st == "in-progress" and ph != "soak"))
        return peak

    async def __aenter__(self) -> Transitions:
        await self.cache.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cache.stop()


async def _policy(sc: Scenario, spec: dict[str, Any]) -> str:
    name = f"{sc.name}-p"
    sc.policies.append(name)
    await sc.kube.apply({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                         "metadata": {"name": name}, "spec": spec}, field_manager="test", force=True)
    return name


async def _soaking(sc: Scenario, node: str) -> None:
    async def soaking() -> bool:
        state = await sc.state(node)
        return state.get("status") == "in-progress" and state.get("phase") == "soak"

    await wait_for(soaking, what=f"{node} in its soak")


async def _first_soaking(sc: Scenario) -> str:
    found: list[str] = []

    async def any_soaking() -> bool:
        for n in sc.nodes:
            state = await sc.state(n)
            if state.get("phase") == "soak" and state.get("status") == "in-progress":
                found.append(n)
                return True
        return False

    await wait_for(any_soaking, what="a node in its soak")
    return found[0]


async def test_a_soaking_node_holds_no_slot_but_the_next_batch_waits_for_its_soak(scenario: Scenario) -> None:
    await scenario.add_nodes(3)
    policy = await _policy(scenario, {"default": {
        "budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 2}},
        "health": {"soak": "20s", "nodeConditions": [GPU_CONDITION]}}})
    async with Transitions(scenario) as seen:
        await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
        gate = await scenario.wait_ready()
    batches = {n: b for n, s, _, b in seen.seen if s == "complete"}
    first = sorted(n for n, b in batches.items() if b == 1)
    [last] = [n for n, b in batches.items() if b == 2]
    assert len(first) == 2 and sorted(batches) == sorted(scenario.nodes)
    a, b = sorted(first, key=lambda n: seen.first(n, "in-progress"))
    # b started while a soaked: a holds no slot under a budget of one ...
    assert seen.first(a, "in-progress", "soak") < seen.first(b, "in-progress") < seen.first(a, "complete")
    assert seen.disrupted_peak() == 1
    # ... yet batch 2 started only once both nodes of batch 1 passed their soak
    assert seen.first(last, "in-progress") > max(seen.first(a, "complete"), seen.first(b, "complete"))
    for n in scenario.nodes:
        assert not (await scenario.node(n))["spec"].get("unschedulable")
    comps = {c["name"]: c for c in gate["status"]["compartments"]}
    assert comps["__default__"]["complete"] == 3 and comps["__default__"]["soaking"] == 0


async def test_a_node_condition_during_the_soak_fails_the_node_and_the_thresholds_stop_the_compartment(
        scenario: Scenario) -> None:
    await scenario.add_nodes(3)
    policy = await _policy(scenario, {"default": {
        "budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}},
        "health": {"soak": "1h", "nodeConditions": [GPU_CONDITION]}}})
    await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
    node = await _first_soaking(scenario)
    assert not (await scenario.node(node))["spec"].get("unschedulable")  # uncordoned, serving

    async def counted() -> bool:
        comps = ((await scenario.gate()).get("status") or {}).get("compartments") or []
        return [c.get("soaking") for c in comps] == [1]

    await wait_for(counted, what="the gate's status to count the soaking node")
    # As node-problem-detector would: a condition on the Node's status.
    await scenario.set_condition(node, "GpuUnhealthy", "True", "XidError", "GPU 3 fell off the bus (Xid 79)")
    await scenario.wait_node(node, "failed")
    failure = (await scenario.state(node))["failure"]
    assert failure["reason"] == "Unhealthy" and failure["stage"] == "soak"
    assert "GpuUnhealthy=True" in failure["message"] and "Xid 79" in failure["message"]

    async def stopped() -> bool:
        comps = ((await scenario.gate()).get("status") or {}).get("compartments") or []
        return bool(comps) and comps[0].get("state") == "stopped"

    await wait_for(stopped, what="the compartment stopped by failureThreshold 1")
    others = [n for n in scenario.nodes if n != node]
    assert [await scenario.node_status(n) for n in others] == ["blocked", "blocked"]
    conds = {c["type"]: c for c in (await scenario.gate())["status"]["conditions"]}
    assert conds["Stalled"]["reason"] == "CompartmentStopped"


async def test_a_node_going_not_ready_during_the_soak_fails(scenario: Scenario) -> None:
    await scenario.add_nodes(1)
    policy = await _policy(scenario, {"default": {
        "budget": {"count": 1}, "health": {"soak": "1h"}}})
    await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
    [node] = scenario.nodes
    await _soaking(scenario, node)
    await scenario.inject(node_down_stage("down", nodes=[node]))
    await scenario.set_condition(node, "Ready", "False", "KubeletDown", "injected outage")
    await scenario.wait_node(node, "failed")
    failure = (await scenario.state(node))["failure"]
    assert failure["reason"] == "Unhealthy" and "not Ready" in failure["message"]

    async def condition() -> bool:
        conds = {c["type"]: c for c in (await scenario.node(node))["status"]["conditions"]}
        failed = conds.get(keys.failed_condition(scenario.name)) or {}
        return failed.get("reason") == "Unhealthy" and "not Ready" in failed.get("message", "")

    await wait_for(condition, what="the node's failed condition to say Unhealthy, not Ready")
    ready = {c["type"]: c for c in (await scenario.node(node))["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False"  # the outage held: the verdict was not a race with kwok


# -- the Prometheus signal, asked of the session's real Prometheus (tests/prometheus.py) -------------

ALERT_QUERY = 'ALERTS{alertstate="firing", node="$NODE"}'


async def test_a_firing_alert_fails_its_soaking_node_naming_the_query_and_series_while_a_quiet_node_passes(
        scenario: Scenario, prometheus: str, prometheus_endpoint: str, metrics_exporter: MetricsExporter) -> None:
    await scenario.add_nodes(2)
    sick, well = scenario.nodes
    # The alert fires before the rollout starts, so its verdict is no race with the soak's end; `well`
    # has no series at all, so its soak can only pass on a query that succeeded and returned nothing.
    metrics_exporter.unhealthy(sick)
    try:
        await wait_for(lambda: _firing(prometheus, sick), what=f"Prometheus to fire NodeUnhealthy for {sick}")
        policy = await _policy(scenario, {"default": {
            "budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}},
            "health": {"soak": "5s", "prometheus": {"endpoint": prometheus_endpoint, "query": ALERT_QUERY}}}})
        await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
        await scenario.wait_node(sick, "failed")
        await scenario.wait_node(well, "complete")
    finally:
        metrics_exporter.healthy(sick)
    failure = (await scenario.state(sick))["failure"]
    assert failure["reason"] == "Unhealthy" and failure["stage"] == "soak"
    assert ALERT_QUERY in failure["message"], failure["message"]  # the query as the policy wrote it
    assert "endpoint session" in failure["message"] and "1 sample(s)" in failure["message"]
    assert 'alertname="NodeUnhealthy"' in failure["message"] and f'node="{sick}"' in failure["message"]
    assert well not in failure["message"]  # $NODE made the query the node's own
    assert not (await scenario.node(sick))["spec"].get("unschedulable")  # a failed soak leaves it serving


async def test_a_query_prometheus_refuses_keeps_the_node_in_its_soak_past_its_end_until_the_query_is_fixed(
        scenario: Scenario, prometheus_endpoint: str) -> None:
    await scenario.add_nodes(1)
    [node] = scenario.nodes
    broken = 'ALERTS{alertstate="firing", node="$NODE"'  # the closing brace left out: Prometheus says bad_data
    policy = await _policy(scenario, {"default": {
        "budget": {"count": 1},
        "health": {"soak": "3s", "prometheus": {"endpoint": prometheus_endpoint, "query": broken}}}})
    await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=policy)
    await _soaking(scenario, node)

    async def unreadable() -> bool:
        conds = {c["type"]: c for c in ((await scenario.gate()).get("status") or {}).get("conditions") or []}
        cond = conds.get("HealthUnreadable") or {}
        return cond.get("status") == "True" and node in cond.get("message", "")

    await wait_for(unreadable, what="the gate's HealthUnreadable condition naming the node")
    message = {c["type"]: c for c in (await scenario.gate())["status"]["conditions"]}["HealthUnreadable"]["message"]
    assert "parse error" in message, message  # Prometheus' own reason travels to the condition

    state = await scenario.state(node)
    until = datetime.fromisoformat(state["soakUntil"].replace("Z", "+00:00"))
    while datetime.now(UTC) <= until + timedelta(seconds=2):  # the soak's end, and a poll or two past it
        await asyncio.sleep(0.5)
    state = await scenario.state(node)
    assert (state["status"], state["phase"]) == ("in-progress", "soak"), state  # never healthy on a failed query

    await scenario.kube.patch(POLICIES, policy, {"spec": {"default": {"health": {
        "prometheus": {"endpoint": prometheus_endpoint, "query": ALERT_QUERY}}}}}, patch_type="merge")
    await scenario.wait_node(node, "complete")

    async def cleared() -> bool:
        conds = {c["type"]: c for c in ((await scenario.gate()).get("status") or {}).get("conditions") or []}
        return conds.get("HealthUnreadable", {}).get("status") != "True"

    await wait_for(cleared, what="HealthUnreadable to clear once the query answers")


async def _firing(prometheus: str, node: str) -> bool:
    async with aiohttp.ClientSession() as session:
        return bool(await instant_query(session, PrometheusEndpoint(name="session", url=prometheus),
                                        f'ALERTS{{alertstate="firing", node="{node}"}}'))
