"""A write the API server refuses for good during a node's round fails that node with the server's
message, and never leaves it cordoned, drained and waiting (gate.controller.executor, gate.lifecycle.
machine.write_refused).

Each test installs a ValidatingAdmissionPolicy of its own, bound to its own objects only (the gate's
label on ConfigMaps and pods, the test's label on nodes), that refuses one kind of write the operator
makes mid-round: the package's ConfigMap, the stage pod on one node, the cordon of one node. The
budget is one node at a time, so the next node can start only once the refused one left the budget.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.kube.client import CONFIGMAPS, NODES, PODS, VALIDATING_POLICIES, VALIDATING_POLICY_BINDINGS, KubeClient
from gate.kube.errors import ApiError
from tests.integration.operator.conftest import NAMESPACE, Scenario, wait_for

DRAIN = {"type": "drain"}  # cordon and drain, restart nothing: no interrupt pod, no reboot to simulate


def _pkg(**extra: Any) -> Obj:
    return {"version": "1.0.0", "image": "registry.example.com/pkg", "interrupt": DRAIN, **extra}


@asynccontextmanager
async def refusing(kube: KubeClient, name: str, *, resource: str, operations: list[str], expression: str,
                   message: str, selector: dict[str, str], probe: Obj) -> AsyncIterator[None]:
    """A ValidatingAdmissionPolicy refusing `operations` on `resource` where `expression` is false,
    bound to objects labelled `selector`; active once `probe` (a dry-run create, or for a Node a dry-run
    merge patch `probe["patch"]`) is refused with `message`."""
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": operations, "resources": [resource]}]},
                       "validations": [{"expression": expression, "message": message}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"objectSelector": {"matchLabels": selector}}}}
    await kube.apply(policy, field_manager="test")
    await kube.apply(binding, field_manager="test")
    try:
        async def active() -> bool:
            try:
                if probe["kind"] == "Node":
                    await kube.patch(NODES, probe["metadata"]["name"], probe["patch"], dry_run=True)
                else:
                    await kube.create(CONFIGMAPS if probe["kind"] == "ConfigMap" else PODS, probe, dry_run=True)
            except ApiError as exc:
                return message in exc.message
            return False

        await wait_for(active, what=f"the ValidatingAdmissionPolicy {name} in force")
        yield
    finally:
        await kube.delete(VALIDATING_POLICY_BINDINGS, name)
        await kube.delete(VALIDATING_POLICIES, name)


def _node_probe(node: str, patch: Obj) -> Obj:
    return {"kind": "Node", "metadata": {"name": node}, "patch": patch}


async def _failure(sc: Scenario, node: str) -> Obj:
    await sc.wait_node(node, "failed")
    failure: Obj = (await sc.state(node))["failure"]
    return failure


async def _not_cordoned(sc: Scenario, node: str) -> None:
    obj = await sc.node(node)
    assert not obj["spec"].get("unschedulable"), f"{node} was left cordoned"
    assert keys.CORDONED_BY not in (obj["metadata"].get("annotations") or {})
    assert not (await sc.state(node)).get("cordoned")


async def _budget_free(sc: Scenario) -> Obj:
    async def settled() -> bool:
        status = (await sc.gate()).get("status") or {}
        return bool(status.get("nodes", {}).get("inProgress") == 0
                    and all(c.get("inProgress") == 0 for c in status.get("compartments") or []))

    await wait_for(settled, what=f"gate {sc.name}: no node in progress or holding the budget")
    return await sc.gate()


async def test_a_refused_config_map_fails_each_node_uncordoned_and_frees_its_budget_slot(scenario: Scenario) -> None:
    nodes = await scenario.add_nodes(2)
    message = f"{scenario.name}: ConfigMaps of this gate are refused by the test's policy"
    probe = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "probe", "namespace": NAMESPACE, "labels": {keys.STAGE_GATE_LABEL: scenario.name}}}
    async with refusing(scenario.kube, scenario.name, resource="configmaps", operations=["CREATE"],
                        expression="false", message=message, selector={keys.STAGE_GATE_LABEL: scenario.name},
                        probe=probe):
        await scenario.apply_gate({"tuned": _pkg(config={"tuned.conf": "x=1\n"})}, interruptionBudget={"count": 1})
        for node in nodes:  # one at a time: the second starts only once the first left the budget
            failure = await _failure(scenario, node)
            assert failure["reason"] == "ConfigMapRefused", failure
            assert "the ConfigMap of package tuned" in failure["message"] and message in failure["message"]
            assert failure["package"] == "tuned"
            await _not_cordoned(scenario, node)
        gate = await _budget_free(scenario)
        assert gate["status"]["nodes"]["failed"] == 2
        node_obj = await scenario.node(nodes[0])
        condition = {c["type"]: c for c in node_obj["status"].get("conditions") or []}.get(
            keys.failed_condition(scenario.name))
        assert condition is not None and condition["reason"] == "ConfigMapRefused" and message in condition["message"]


async def test_a_stage_pod_refused_on_one_node_fails_it_and_the_next_node_rolls_out(scenario: Scenario) -> None:
    refused, other = await scenario.add_nodes(2)
    message = f"{scenario.name}: no stage pods on {refused}"
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "probe", "namespace": NAMESPACE, "labels": {keys.STAGE_GATE_LABEL: scenario.name}},
             "spec": {"nodeName": refused, "containers": [{"name": "c", "image": "busybox"}]}}
    async with refusing(scenario.kube, scenario.name, resource="pods", operations=["CREATE"],
                        expression=f"object.spec.nodeName != '{refused}'", message=message,
                        selector={keys.STAGE_GATE_LABEL: scenario.name}, probe=probe):
        await scenario.apply_gate({"tuned": _pkg()}, interruptionBudget={"count": 1})
        await scenario.wait_node(refused, "failed")
        await scenario.wait_node(other, "complete")
        failure = (await scenario.state(refused))["failure"]
        assert failure["reason"] == "PodRefused" and message in failure["message"], failure
        await _not_cordoned(scenario, refused)
        await _not_cordoned(scenario, other)
        gate = await _budget_free(scenario)
        assert gate["status"]["nodes"]["failed"] == 1 and gate["status"]["nodes"]["complete"] == 1


async def test_a_refused_cordon_fails_a_node_that_is_never_cordoned(scenario: Scenario) -> None:
    refused, other = await scenario.add_nodes(2)
    message = f"{scenario.name}: {refused} may not be cordoned"
    cordon = {"spec": {"unschedulable": True}}
    expression = (f"object.metadata.name != '{refused}' || !has(object.spec.unschedulable) || "
                  "!object.spec.unschedulable")
    async with refusing(scenario.kube, scenario.name, resource="nodes", operations=["UPDATE"], expression=expression,
                        message=message, selector={"test": scenario.name}, probe=_node_probe(refused, cordon)):
        await scenario.apply_gate({"tuned": _pkg()}, interruptionBudget={"count": 1})
        await scenario.wait_node(refused, "failed")
        await scenario.wait_node(other, "complete")
        failure = (await scenario.state(refused))["failure"]
        assert failure["reason"] == "NodeWriteRefused" and message in failure["message"], failure
        assert failure["stage"] == "cordon" and f"the cordon of node {refused}" in failure["message"], failure
        await _not_cordoned(scenario, refused)
        await _budget_free(scenario)


async def test_a_refused_pick_fails_that_node_and_holds_back_none_of_the_others(scenario: Scenario) -> None:
    # The gate's plan writes the picked nodes (state and status label in-progress) itself; one refused
    # write must fail that node, not the plan of all of them.
    refused, *others = await scenario.add_nodes(3)
    label = keys.status_label(scenario.name)
    message = f"{scenario.name}: {refused} may not be put in progress"
    expression = (f"object.metadata.name != '{refused}' || !has(object.metadata.labels) || "
                  f"!('{label}' in object.metadata.labels) || object.metadata.labels['{label}'] != 'in-progress'")
    probe = _node_probe(refused, {"metadata": {"labels": {label: "in-progress"}}})
    async with refusing(scenario.kube, scenario.name, resource="nodes", operations=["UPDATE"], expression=expression,
                        message=message, selector={"test": scenario.name}, probe=probe):
        await scenario.apply_gate({"tuned": _pkg()})
        await scenario.wait_node(refused, "failed")
        for node in others:
            await scenario.wait_node(node, "complete")
        failure = (await scenario.state(refused))["failure"]
        assert failure["reason"] == "NodeWriteRefused" and message in failure["message"], failure
        assert failure["stage"] == "start", failure  # refused in the plan's write, before any step of the round
        await _not_cordoned(scenario, refused)
        gate = await _budget_free(scenario)
        assert gate["status"]["nodes"]["failed"] == 1 and gate["status"]["nodes"]["complete"] == 2


async def test_a_refused_step_write_deletes_the_pod_made_for_it_and_fails_the_node_uncordoned(
        scenario: Scenario) -> None:
    # The write of the stages step waits for its pod and carries the pod's record (Decision.records_in_write):
    # refused, the pod made a moment before goes, and the node fails as for any refused write.
    (refused,) = await scenario.add_nodes(1)
    message = f"{scenario.name}: no record of an apply pod on {refused}"
    expression = (f"object.metadata.name != '{refused}' || !has(object.metadata.annotations) || "
                  "!object.metadata.annotations.exists(k, object.metadata.annotations[k].contains('ng-apply-'))")
    probe = _node_probe(refused, {"metadata": {"annotations": {"example.com/probe": "ng-apply-probe"}}})
    async with refusing(scenario.kube, scenario.name, resource="nodes", operations=["UPDATE"], expression=expression,
                        message=message, selector={"test": scenario.name}, probe=probe):
        await scenario.apply_gate({"tuned": _pkg()}, interruptionBudget={"count": 1})
        failure = await _failure(scenario, refused)
        assert failure["reason"] == "NodeWriteRefused" and message in failure["message"], failure
        assert f"the write of node {refused}" in failure["message"], failure
        await _not_cordoned(scenario, refused)

        async def pod_gone() -> bool:
            selector = f"{keys.STAGE_GATE_LABEL}={scenario.name}"
            items, _ = await scenario.kube.list(PODS, NAMESPACE, label_selector=selector)
            return not [p for p in items if p["spec"].get("nodeName") == refused]

        await wait_for(pod_gone, what=f"no stage pod left on {refused}")
        await _budget_free(scenario)
