"""Safe interrupts on simulated nodes: protected pods, PodDisruptionBudgets, failures, timeouts."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import PDBS, PODS
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}
SERVICE = {"type": "service", "services": ["tuned"]}


def _pod(name: str, node: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}],
                     "terminationGracePeriodSeconds": 0, **spec}}


async def _pod_running(sc: Scenario, name: str) -> None:
    async def running() -> bool:
        return bool((await sc.kube.get(PODS, name, "default")).get("status", {}).get("phase") == "Running")

    await wait_for(running, what=f"pod {name} running")


async def test_protected_pods_are_waited_for_before_the_node_is_drained(scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    pod = f"{scenario.name}-train"
    await scenario.kube.create(PODS, _pod(pod, node, {"workload": "training"}))
    await _pod_running(scenario, pod)
    await scenario.apply_gate({"tuning": {**PKG, "interrupt": SERVICE}},
                              podNonInterruptLabels={"matchLabels": {"workload": "training"}})
    await scenario.wait_node(node, "blocked")
    await asyncio.sleep(2)  # several plans: it must keep waiting while the pod runs
    assert await scenario.node_status(node) == "blocked"
    assert (await scenario.state(node)).get("status") != "in-progress"  # not picked
    assert not (await scenario.node(node))["spec"].get("unschedulable")  # nor cordoned (no opt-in)
    assert (await scenario.kube.get(PODS, pod, "default"))["status"]["phase"] == "Running"  # not evicted
    await scenario.kube.delete(PODS, pod, "default", body={"gracePeriodSeconds": 0})  # the job finished
    await scenario.wait_ready()


async def test_wait_timeout_fails_the_node_naming_the_protected_pod(scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    pod = f"{scenario.name}-train"
    await scenario.kube.create(PODS, _pod(pod, node, {"workload": "training"}))
    await _pod_running(scenario, pod)
    try:
        await scenario.apply_gate({"tuning": {**PKG, "interrupt": SERVICE}}, waitTimeout="2s",
                                  podNonInterruptLabels={"matchLabels": {"workload": "training"}})
        await scenario.wait_node(node, "failed")
        failure = (await scenario.state(node))["failure"]
        assert failure["reason"] == "WaitTimeout"
        assert f"default/{pod}" in failure["message"]
        gate = await scenario.wait_condition("Degraded")
        assert gate["status"]["nodes"]["failed"] == 1 and gate["status"]["status"] == "Degraded"
    finally:
        await scenario.kube.delete(PODS, pod, "default", body={"gracePeriodSeconds": 0})


async def test_drain_blocked_by_a_pdb_waits_until_the_budget_allows_it(scenario: Scenario) -> None:
    node, _other = await scenario.add_nodes(2)
    app = f"{scenario.name}-web"
    await scenario.kube.create(PODS, _pod(f"{app}-0", node, {"app": app}))
    await scenario.kube.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": app, "namespace": "default"},
                                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})
    try:
        await _pod_running(scenario, f"{app}-0")
        await scenario.apply_gate({"tuning": {**PKG, "interrupt": SERVICE}},
                                  nodeSelector={"matchLabels": {"test": scenario.name}},
                                  interruptionBudget={"count": 1}, drain={"timeout": "5m"})

        async def blocked() -> bool:
            return bool((await scenario.state(node)).get("drainBlockedBy"))

        await wait_for(blocked, what="drain blocked by the PDB")
        state = await scenario.state(node)
        assert state["phase"] == "drain" and app in state["drainBlockedBy"]
        # Where operators look: the gate's DrainBlocked condition and the node's NodeGate condition,
        # each naming the node, the pod and the budget.
        gate = await scenario.wait_condition("DrainBlocked")
        [held] = [c for c in gate["status"]["conditions"] if c["type"] == "DrainBlocked"]
        assert held["reason"] == "PodDisruptionBudget"
        assert f"node {node}" in held["message"] and f"default/{app}-0" in held["message"]
        assert f"disruption budget {app} " in held["message"]
        node_condition = await _node_condition(scenario, node)
        assert node_condition is not None and node_condition["reason"] == "DrainBlocked"
        assert node_condition["status"] == "True" and f"node {node}" in node_condition["message"]
        assert f"default/{app}-0" in node_condition["message"] and f"budget {app} " in node_condition["message"]
        gate_label = f'gate="{scenario.name}"'

        async def gauge_is(value: float) -> bool:
            return _metric(scenario, "nodegate_drains_blocked", gate_label) == value

        await wait_for(lambda: gauge_is(1), what="nodegate_drains_blocked at 1")
        await asyncio.sleep(3)  # a few refused retries: the counter counts the blocked drain once
        assert _metric(scenario, "nodegate_drain_blocked_total", gate_label) == 1
        # A second replica elsewhere: the disruption controller now allows one eviction.
        await scenario.add_nodes(1, start=99, labels={"test": f"{scenario.name}-spare"})
        await scenario.kube.create(PODS, _pod(f"{app}-1", f"{scenario.name}-99", {"app": app}))
        await _pod_running(scenario, f"{app}-1")
        await wait_for(lambda: _node_complete(scenario, node), timeout=90, what="drain to finish")
        pods = [p["metadata"]["name"] for p in (await scenario.kube.list(PODS, "default",
                                                                        label_selector=f"app={app}"))[0]]
        assert f"{app}-0" not in pods  # evicted through the Eviction API
        await wait_for(lambda: gauge_is(0), what="nodegate_drains_blocked back at 0")

        async def cleared() -> bool:
            conditions = (await scenario.gate()).get("status", {}).get("conditions") or []
            return not any(c["type"] == "DrainBlocked" for c in conditions) and (
                await _node_condition(scenario, node)) is None

        await wait_for(cleared, what="DrainBlocked cleared on the gate and the node")
    finally:
        await scenario.kube.delete(PDBS, app, "default")
        for i in (0, 1):
            await scenario.kube.delete(PODS, f"{app}-{i}", "default", body={"gracePeriodSeconds": 0})


async def _node_condition(sc: Scenario, node: str) -> dict[str, Any] | None:
    kind = keys.blocked_condition(sc.name)
    conditions = (await sc.node(node)).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _metric(sc: Scenario, name: str, label: str) -> float | None:
    """A sample of the running operator's metrics: `name{...label...}`, or None when absent."""
    port = sc.cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{") and label in line:
                return float(line.rsplit(" ", 1)[1])
    return None


async def _node_complete(sc: Scenario, node: str) -> bool:
    return await sc.node_status(node) == "complete"


async def test_drain_timeout_fails_the_node_naming_the_blocking_pdb(scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    app = f"{scenario.name}-db"
    await scenario.kube.create(PODS, _pod(f"{app}-0", node, {"app": app}))
    await scenario.kube.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": app, "namespace": "default"},
                                      "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}})
    try:
        await _pod_running(scenario, f"{app}-0")
        await scenario.apply_gate({"tuning": {**PKG, "interrupt": SERVICE}}, drain={"timeout": "3s"})
        await scenario.wait_node(node, "failed")
        failure = (await scenario.state(node))["failure"]
        assert failure["reason"] == "DrainTimeout"
        assert app in failure["message"] and "disruption budget" in failure["message"].lower()
        # A failed node that NodeGate cordoned stays cordoned for a person to look at, and says so.
        assert (await scenario.node(node))["spec"].get("unschedulable") is True
    finally:
        await scenario.kube.delete(PDBS, app, "default")
        await scenario.kube.delete(PODS, f"{app}-0", "default", body={"gracePeriodSeconds": 0})


async def test_failing_stage_is_retried_then_fails_the_node_with_the_agent_summary(
        scenario: Scenario, step_log: StepLog) -> None:
    good, bad = await scenario.add_nodes(2)
    summary = '{"package":"tuning","stage":"apply","ok":false,"failedStep":"set-sysctl","exitCode":3}'
    await scenario.inject(failing_stage("fail", nodes=[bad], package="tuning", stage="apply", message=summary,
                                        exit_code=3))
    await scenario.apply_gate({"tuning": {**PKG, "retries": 1}})
    await scenario.wait_node(bad, "failed")
    await scenario.wait_node(good, "complete")
    failure = (await scenario.state(bad))["failure"]
    assert failure["reason"] == "StageFailed" and failure["package"] == "tuning" and failure["stage"] == "apply"
    assert "set-sysctl" in failure["message"]
    # retries: 1 means two attempts, each a pod of its own, the second made after the first failed.
    first, second = [r for r in step_log.of(scenario.name, bad)]
    assert first.pod != second.pod and not first.succeeded and not second.succeeded
    assert first.finished_rv is not None and first.finished_rv < second.resource_version
    assert (await scenario.state(bad))["attempts"] == {"tuning/apply": 2}


async def test_stage_timeout_fails_the_stage(scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    hang = failing_stage("hang", nodes=[node], package="slow", stage="apply", delay_ms=3_600_000)
    await scenario.inject(hang)
    await scenario.apply_gate({"slow": {**PKG, "timeout": "2s", "retries": 0}})
    await scenario.wait_node(node, "failed", timeout=90)
    failure = (await scenario.state(node))["failure"]
    assert failure["reason"] == "StageFailed"
    assert "DeadlineExceeded" in failure["message"]


async def test_image_pull_failure_fails_the_stage_instead_of_waiting_forever(scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    stage = failing_stage("pull", nodes=[node], package="ghost")
    # Its payload is never pulled, so no step ever runs: the pod is matched by its package's label.
    stage["spec"]["selector"]["matchExpressions"] = [
        {"key": ".spec.nodeName", "operator": "In", "values": [node]},
        {"key": '.metadata.labels["package.nodegate.io/ghost"]', "operator": "Exists"},
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}]
    stage["spec"]["next"] = {"statusTemplate": _PULL_ERROR}
    await scenario.inject(stage)
    await scenario.apply_gate({"ghost": {**PKG, "image": "registry.invalid/ghost"}})
    await scenario.wait_node(node, "failed")
    failure = (await scenario.state(node))["failure"]
    assert failure["reason"] == "ImagePullFailed"
    assert "ImagePullBackOff" in failure["message"] or "ErrImagePull" in failure["message"]


_PULL_ERROR = """\
phase: Pending
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  restartCount: 0
  state:
    waiting:
      reason: ImagePullBackOff
      message: {{ printf "Back-off pulling image %s" .image | Quote }}
{{ end }}
"""
