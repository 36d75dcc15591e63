"""The invariant watcher on a real API server catches violations planted by hand.

No operator runs here: the tests play a misbehaving one, writing nodes and stage pods themselves (the
pods built by the operator's own `stage_pod`, pinned to nodes no kubelet plays — kwok manages only
nodes with its annotation — so they exist and never run), and the watcher — started first, with
watches of its own — must name each violation. A watcher that missed these would
make every zero-violation chaos run meaningless.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import Interrupt, NodeGate
from gate.controller.pods import stage_pod
from gate.controller.settings import OperatorSettings
from gate.devcluster.cluster import DevCluster, node_manifest
from gate.devcluster.services import install_operator_rbac
from gate.devcluster.stages import KWOK_NODE_ANNOTATION
from gate.kube.client import NODEGATES, NODES, PODS, KubeClient
from gate.lifecycle.node import PodRequest, Step, pod_name
from gate.testing.findings import Violation
from gate.testing.watcher import InvariantWatcher
from tests.conftest import unique

NAMESPACE = "nodegate-system"
PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}
TAINT = {"key": keys.READINESS_TAINT_KEY, "effect": keys.READINESS_TAINT_EFFECT}


@dataclass
class Plant:
    """One test's gate and nodes on the chaos cluster, a watcher on them, and a hand that misbehaves."""

    cluster: DevCluster
    kube: KubeClient
    name: str
    watcher: InvariantWatcher
    nodes: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    gate: NodeGate | None = None

    async def add_nodes(self, count: int, *, tainted: bool = False) -> list[str]:
        """Nodes as the dev cluster makes them, but without kwok's annotation: no kubelet plays them."""
        names = [f"{self.name}-{i}" for i in range(len(self.nodes), len(self.nodes) + count)]
        for name in names:
            node = node_manifest(name, {"test": self.name}, [TAINT] if tainted else [])
            del node["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
            await self.kube.create(NODES, node)
            self.nodes.append(name)
        return names

    async def apply_gate(self, **spec: Any) -> None:
        body = {"nodeSelector": {"matchLabels": {"test": self.name}}, "packages": {"pkg": PKG}, **spec}
        obj = await self.kube.apply({"apiVersion": keys.API_VERSION, "kind": "NodeGate",
                                     "metadata": {"name": self.name}, "spec": body}, field_manager="test")
        self.gate = NodeGate.model_validate(obj)

    async def patch_node(self, node: str, *, unschedulable: bool | None = None, cordoned_by: str | None = None,
                         state: Obj | None = None, taints: list[Obj] | None = None) -> None:
        annotations: Obj = {}
        if cordoned_by is not None:
            annotations[keys.CORDONED_BY] = cordoned_by or None
        if state is not None:
            annotations[keys.state_annotation(self.name)] = json.dumps({"v": 1, **state})
        patch: Obj = {"metadata": {"annotations": annotations}, "spec": {}}
        if unschedulable is not None:
            patch["spec"]["unschedulable"] = unschedulable
        if taints is not None:
            patch["spec"]["taints"] = taints
        await self.kube.patch(NODES, node, patch)

    async def cordon(self, node: str) -> None:
        await self.patch_node(node, unschedulable=True, cordoned_by=self.name)

    async def uncordon(self, node: str) -> None:
        await self.patch_node(node, unschedulable=False, cordoned_by="")

    async def stage_pod(self, node: str, *, stage: str = "apply", round_: int = 1, reboot: bool = False) -> str:
        """A stage pod exactly as the operator renders it, on a node no kubelet plays: it exists and
        never ends."""
        assert self.gate is not None
        if reboot:
            step = Step(None, "interrupt", "reboot:")
            request = PodRequest(pod_name(self.name, node, round_, "interrupt", step), "interrupt", (step,),
                                 round=round_, interrupt=Interrupt(type="reboot"))
        else:
            step = Step("pkg", stage, "1.0.0/planted", version="1.0.0")  # type: ignore[arg-type]
            request = PodRequest(pod_name(self.name, node, round_, "stages", step), "stages", (step,), round=round_)
        pod = stage_pod(self.gate, node, request, OperatorSettings(namespace=NAMESPACE))
        await self.kube.create(PODS, pod)
        self.pods.append(request.name)
        return request.name

    async def delete_pod(self, name: str) -> None:
        # At once: no kubelet is there to stop its containers and confirm.
        await self.kube.delete(PODS, name, NAMESPACE, body={"gracePeriodSeconds": 0})

    async def verdict(self, *, converged: bool = False) -> list[Violation]:
        report = await self.watcher.stop()
        found = list(report.violations)
        if converged:
            found += self.watcher.checker.check_converged()
        return found


@pytest.fixture
async def plant(request: pytest.FixtureRequest, chaos_cluster: DevCluster,
                chaos_kube: KubeClient) -> AsyncIterator[Plant]:
    base = request.node.name.removeprefix("test_").replace("_", "-")[:16].strip("-")
    await install_operator_rbac(chaos_cluster)  # the packages' ServiceAccount the stage pods run as
    watcher = InvariantWatcher(await chaos_cluster.client())
    await watcher.start()
    p = Plant(chaos_cluster, chaos_kube, unique(base), watcher)
    try:
        yield p
    finally:
        if watcher._tasks:
            await watcher.stop()
        await watcher.client.close()
        for pod in p.pods:
            await p.delete_pod(pod)
        await chaos_kube.delete(NODEGATES, p.name)
        for node in p.nodes:
            await chaos_kube.delete(NODES, node)


def only(found: list[Violation]) -> Violation:
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


async def test_nodes_cordoned_by_hand_beyond_the_budget_are_over_the_ceiling(plant: Plant) -> None:
    a, b, _ = await plant.add_nodes(3)
    await plant.apply_gate(interruptionBudget={"count": 1})
    await plant.cordon(a)  # one node disrupted: the ceiling
    await plant.cordon(b)  # a second one: over it
    v = only(await plant.verdict())
    assert (v.kind, v.gate, v.node) == ("over-ceiling", plant.name, b)
    assert "2 nodes disrupted at once, ceiling 1 of 3 matched" in v.message
    peak = plant.watcher.checker.coverage.peaks[(plant.name, "__default__")]
    assert (peak.disrupted, peak.ceiling) == (2, 1)


async def test_nodes_picked_by_hand_beyond_the_budget_count_from_the_pick(plant: Plant) -> None:
    nodes = await plant.add_nodes(4)
    await plant.apply_gate(interruptionBudget={"percent": 50})  # 4 nodes: 2 at once
    for node in nodes[:3]:
        await plant.patch_node(node, state={"status": "in-progress", "batch": 1})  # not cordoned yet
    v = only(await plant.verdict())
    assert (v.kind, v.node) == ("over-ceiling", nodes[2])


async def test_uncordoning_a_node_while_its_stage_pod_runs_is_caught(plant: Plant) -> None:
    [node] = await plant.add_nodes(1)
    await plant.apply_gate()
    await plant.cordon(node)
    pod = await plant.stage_pod(node)
    await plant.uncordon(node)
    v = only(await plant.verdict())
    assert (v.kind, v.node) == ("uncordoned-during-stage", node)
    assert pod in v.message


async def test_an_interrupt_pod_on_a_schedulable_node_is_caught(plant: Plant) -> None:
    [node] = await plant.add_nodes(1)
    await plant.apply_gate()
    await plant.stage_pod(node, reboot=True)
    v = only(await plant.verdict())
    assert (v.kind, v.node) == ("interrupt-uncordoned", node)


async def test_removing_the_readiness_taint_before_the_gate_completed_is_caught(plant: Plant) -> None:
    [node] = await plant.add_nodes(1, tainted=True)
    await plant.apply_gate(readinessTaint=True)
    await plant.patch_node(node, state={"status": "in-progress", "batch": 1})
    await plant.patch_node(node, taints=[])
    v = only(await plant.verdict())
    assert (v.kind, v.node) == ("taint-lifted-early", node)


async def test_the_same_stage_created_again_without_failure_or_request_is_caught(plant: Plant) -> None:
    [node] = await plant.add_nodes(1)
    await plant.apply_gate()
    first = await plant.stage_pod(node, round_=1)
    await plant.delete_pod(first)  # while it "ran": no failure
    second = await plant.stage_pod(node, round_=2)  # another name: same package, version, stage, generation
    v = only(await plant.verdict())
    assert (v.kind, v.node) == ("duplicate-stage", node)
    assert first in v.message and second in v.message


async def test_a_rerun_request_makes_the_second_creation_a_retry(plant: Plant) -> None:
    [node] = await plant.add_nodes(1)
    await plant.apply_gate()
    first = await plant.stage_pod(node, round_=1)
    await plant.delete_pod(first)
    await plant.kube.patch(NODES, node, {"metadata": {"annotations": {keys.rerun_annotation(plant.name): "pkg"}}})
    await plant.kube.patch(NODES, node, {"metadata": {"annotations": {keys.rerun_annotation(plant.name): None}}})
    await plant.stage_pod(node, round_=2)
    assert await plant.verdict() == []


async def test_nodes_left_cordoned_or_tainted_after_convergence_are_caught(plant: Plant) -> None:
    cordoned, tainted, clean = await plant.add_nodes(3)
    await plant.apply_gate(readinessTaint=True)
    done = {"status": "complete", "generation": 1}
    await plant.patch_node(cordoned, state=done, unschedulable=True, cordoned_by=plant.name)
    await plant.patch_node(tainted, state=done, taints=[TAINT])
    await plant.patch_node(clean, state=done)
    found = await plant.verdict(converged=True)
    assert sorted((v.kind, v.node) for v in found) == [("left-cordoned", cordoned), ("left-tainted", tainted)]
