"""GitOps tools judge real NodeGate objects in each phase of a real rollout: kstatus (cli-utils'
status.Compute, what Flux and kpt wait on) and Argo CD's health scripts (on a real Lua runtime).

Each phase is reached on the cluster, the object is read back from the API server, and both
evaluators must agree with what a person sees: rolling is InProgress/Progressing, done is
Current/Healthy, a stopped compartment or failed nodes with nothing else left is Failed/Degraded,
paused is InProgress/Suspended (gate.lifecycle.health says why). With NODEGATE_RECORD_GITOPS=1 the
objects are stored as the Argo CD script tests' testdata (tests/gitops.py).
"""

from __future__ import annotations

from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.devcluster.stages import failing_stage, slow_stage
from gate.kube.client import POLICIES
from tests.gitops import Health, argocd_health, kstatus, record
from tests.integration.operator.conftest import Scenario, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}


def _conditions(obj: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _observed(obj: Obj) -> bool:
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]


def _judge(obj: Obj, name: str, kstatus_status: str, argocd_status: str) -> tuple[str, Health]:
    """Both evaluators on a live object; returns kstatus' message and Argo CD's verdict."""
    [verdict] = kstatus([obj])
    health = argocd_health(obj)
    assert (verdict.status, health.status) == (kstatus_status, argocd_status), (
        f"{name}: kstatus {verdict.status} ({verdict.message}), Argo CD {health.status} ({health.message}); "
        f"conditions {_conditions(obj)}")
    record(name, obj, health)
    return verdict.message, health


async def _until(sc: Scenario, what: str, check: Any, timeout: float = 60) -> Obj:
    """The gate once `check(gate)` holds on an object whose latest spec the operator has observed."""
    seen: list[Obj] = []

    async def reached() -> bool:
        gate = await sc.gate()
        seen[:] = [gate]
        return _observed(gate) and bool(check(gate))

    await wait_for(reached, timeout=timeout, what=what)
    return seen[0]


async def test_a_rollout_reads_in_progress_paused_then_current_to_kstatus_and_argocd(scenario: Scenario) -> None:
    nodes = await scenario.add_nodes(4)
    # Each node's stage runs 2 s and one node goes at a time: the rollout is seen mid-way.
    await scenario.inject(slow_stage("slow", nodes=nodes, package="tuning", seconds=2))
    created = await scenario.apply_gate({"tuning": PKG}, interruptionBudget={"count": 1})
    # The API server's answer, before the operator wrote anything: the CRD's status default makes it
    # read "generation not yet observed" (kstatus would call an object without conditions Current).
    assert created["status"] == {"observedGeneration": 0}
    message, _ = _judge(created, "created", "InProgress", "Progressing")
    assert "latest observed generation is 0" in message

    rolling = await _until(scenario, "a node in progress", lambda g: g["status"]["nodes"].get("inProgress", 0) >= 1
                           and g["status"]["nodes"].get("complete", 0) < 3)
    assert _conditions(rolling)["Reconciling"]["status"] == "True"
    assert _conditions(rolling)["Reconciling"]["observedGeneration"] == rolling["metadata"]["generation"]
    assert "Stalled" not in _conditions(rolling)
    message, health = _judge(rolling, "rolling", "InProgress", "Progressing")
    assert "in progress" in message and "in progress" in health.message

    await scenario.patch_gate({"spec": {"paused": True}})
    paused = await _until(scenario, "the pause observed", lambda g: _conditions(g)["Paused"]["status"] == "True")
    assert paused["status"]["nodes"]["complete"] < 4, "the rollout ended before the pause: nothing was paused"
    assert _conditions(paused)["Reconciling"]["reason"] == "Paused"
    message, health = _judge(paused, "paused", "InProgress", "Suspended")
    assert "spec.paused is true" in message and "spec.paused is true" in health.message

    await scenario.patch_gate({"spec": {"paused": False}})
    done = await _until(scenario, "the rollout complete", lambda g: _conditions(g)["Ready"]["status"] == "True",
                        timeout=90)
    assert not {"Reconciling", "Stalled"} & set(_conditions(done)), "abnormal-true conditions left on a done gate"
    _judge(done, "healthy", "Current", "Healthy")

    # Disabled (`nodegate disable`): the operator does nothing; Argo CD says so, kstatus goes by Ready.
    await scenario.patch_gate({"metadata": {"annotations": {keys.DISABLED_ANNOTATION: "true"}}})
    off = await _until(scenario, "the gate disabled", lambda g: _conditions(g).get("Disabled", {}).get("status")
                       == "True")
    _judge(off, "disabled", "Current", "Suspended")


async def test_a_stopped_compartment_reads_failed_and_degraded_and_its_policy_current(scenario: Scenario) -> None:
    bad = await scenario.add_nodes(3, {"pool": "bad"})
    policy = f"{scenario.name}-p"
    scenario.policies.append(policy)
    created = await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"compartments": [{"name": "bad", "selector": {"matchLabels": {"pool": "bad"}},
                                   "budget": {"count": 1},
                                   "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}}]}},
        field_manager="test", force=True)
    _judge(created, "created", "InProgress", "Progressing")
    await scenario.inject(failing_stage("fail", nodes=bad, package="tuning"))
    await scenario.apply_gate({"tuning": {**PKG, "retries": 0}}, deploymentPolicy=policy)

    stopped = await _until(scenario, "the compartment stopped", lambda g: any(
        c["state"] == "stopped" for c in g["status"].get("compartments") or []), timeout=90)
    stalled = _conditions(stopped)["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "CompartmentStopped")
    assert "Reconciling" not in _conditions(stopped)
    message, health = _judge(stopped, "compartment-stopped", "Failed", "Degraded")
    assert f"nodegate resume {scenario.name}" in message and message == health.message

    async def policy_read() -> bool:
        obj = await scenario.kube.get(POLICIES, policy)
        return _observed(obj) and scenario.name in (obj.get("status") or {}).get("usedBy", [])

    await wait_for(policy_read, what="the policy's status naming the gate")
    accepted = await scenario.kube.get(POLICIES, policy)
    assert _conditions(accepted)["Ready"]["reason"] == "Accepted"
    _judge(accepted, "accepted", "Current", "Healthy")


async def test_failed_nodes_with_nothing_left_to_do_read_failed_and_degraded(scenario: Scenario) -> None:
    """Below the failure threshold nothing stops, but once every other node is done the failed one
    waits for a person: Stalled (NodesFailed), not Reconciling forever."""
    good, bad = await scenario.add_nodes(2)
    await scenario.inject(failing_stage("fail", nodes=[bad], package="tuning"))
    await scenario.apply_gate({"tuning": {**PKG, "retries": 0}}, interruptionBudget={"count": 2})
    gate = await _until(scenario, "the gate stalled", lambda g: _conditions(g).get("Stalled", {}).get("status")
                        == "True", timeout=90)
    assert _conditions(gate)["Stalled"]["reason"] == "NodesFailed"
    assert gate["status"]["nodes"]["complete"] == 1 and gate["status"]["nodes"]["failed"] == 1
    assert await scenario.node_status(good) == "complete"
    message, health = _judge(gate, "nodes-failed", "Failed", "Degraded")
    assert "nodegate node reset" in message and message == health.message
