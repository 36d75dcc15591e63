"""Findings of the invariant watcher, kept as regression tests.

Both reproduce the same hazard: a node failed in one package while another package's stage of the
same round still runs. A person's reset, or the deletion of the gate, must wait for that stage to end
before the node is uncordoned; the test then ends the stage (playing the kubelet) and checks the
request is carried out, with the watcher recording no violation throughout.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from gate.api import keys
from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.devcluster.services import start_operator
from gate.devcluster.stages import failing_stage
from gate.kube.client import KWOK_STAGES, NODEGATES, NODES, KubeClient
from gate.kube.errors import NotFound
from gate.testing.chaos import OPERATOR_FLAGS
from gate.testing.invariants import Violation
from gate.testing.watcher import InvariantWatcher
from tests.conftest import unique

OPERATOR = "findings-operator"
SERVICE = {"type": "service", "services": ["tuned.service"]}
SLOW_SECONDS = 600  # the slow package's stage outlives the test: the reproductions do not race it


@pytest.fixture
async def lone_operator(chaos_cluster: DevCluster) -> AsyncIterator[str]:
    await asyncio.to_thread(start_operator, chaos_cluster, lambda m: None, name=OPERATOR, extra=OPERATOR_FLAGS)
    try:
        yield OPERATOR
    finally:
        await asyncio.to_thread(chaos_cluster.stop_process, OPERATOR, sig=signal.SIGTERM)


class UncordonedDuringStage(AssertionError):
    """The violation these tests guard against (any other failure is a broken test, and says so)."""


async def _wait(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


async def _failed_node_with_a_stage_still_running(cluster: DevCluster, kube: KubeClient, name: str,
                                                  watcher: InvariantWatcher) -> str:
    """One node, two packages in parallel that both need a service restart (so the node is cordoned):
    `quick` fails at once, `slow` is still running when the node is marked failed and its batch judged."""
    [node] = await cluster.add_nodes(NodeSpec(1, {"test": name}, prefix=f"{name}-"))
    for stage in (failing_stage(f"{name}-quick", nodes=[node], package="quick", message="quick failed"),
                  failing_stage(f"{name}-slow", nodes=[node], package="slow", message="slow failed",
                                delay_ms=SLOW_SECONDS * 1000)):
        await kube.apply(stage, field_manager="test")
    pkg = {"version": "1.0.0", "interrupt": SERVICE}
    await kube.apply({"apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": {"name": name},
                      "spec": {"nodeSelector": {"matchLabels": {"test": name}}, "interruptionBudget": {"count": 1},
                               "packages": {"quick": {**pkg, "image": "registry.example.com/quick", "retries": 0},
                                            "slow": {**pkg, "image": "registry.example.com/slow"}}}},
                     field_manager="test")

    async def failed_and_judged() -> bool:
        labels = (await kube.get(NODES, node))["metadata"].get("labels") or {}
        comps = ((await kube.get(NODEGATES, name)).get("status") or {}).get("compartments") or []
        return labels.get(keys.status_label(name)) == "failed" and any(c.get("batch", 0) > 1 for c in comps)

    await _wait(failed_and_judged, "the node failed and its batch judged")
    slow = [p for p in watcher.checker.pods.values() if p.node == node and any(s.package == "slow" for s in p.steps)]
    if not slow or slow[0].ended_lo is not None:
        raise RuntimeError(f"the slow stage must still run for this reproduction: {slow}")
    return node


async def _cleanup(kube: KubeClient, name: str, node: str | None) -> None:
    # The node first: its slow stage never ends, so the gate would wait for it; without the node the
    # gate's finalizer has nothing to release, and its pods go with it (owner references).
    for stage in (f"{name}-quick", f"{name}-slow"):
        await kube.delete(KWOK_STAGES, stage)
    if node:
        await kube.delete(NODES, node)
    await kube.delete(NODEGATES, name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            await kube.get(NODEGATES, name)
        except NotFound:
            break
        await asyncio.sleep(0.5)


async def _held(kube: KubeClient, node: str, still: Callable[[dict[str, str]], bool]) -> None:
    """For several of the operator's polls, the request stays pending and the node stays cordoned."""
    for _ in range(12):
        obj = await kube.get(NODES, node)
        assert still(obj["metadata"].get("annotations") or {}), "acted on while a stage of the round runs"
        assert obj["spec"].get("unschedulable") is True, "uncordoned while a stage of the round runs"
        await asyncio.sleep(0.25)


async def _end_slow_stage(kube: KubeClient, node: str) -> None:
    """Play the kubelet: the slow stage's pod ends, its containers exiting 0 (kwok would only do so
    after ten minutes)."""
    from datetime import UTC, datetime

    from gate.kube.client import PODS

    pods, _ = await kube.list(PODS, "nodegate-system", label_selector=f"{keys.POD_PACKAGE_PREFIX}slow",
                              field_selector=f"spec.nodeName={node}")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for pod in pods:
        def done(containers: list[dict[str, str]]) -> list[dict[str, object]]:
            return [{"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                              "finishedAt": now}}} for c in containers]

        spec = pod["spec"]
        await kube.patch(PODS, pod["metadata"]["name"], {"status": {
            "phase": "Succeeded", "initContainerStatuses": done(spec.get("initContainers") or []),
            "containerStatuses": done(spec["containers"])}}, namespace="nodegate-system", subresource="status")


def _no_uncordon_during_stage(violations: list[Violation]) -> None:
    found = [v for v in violations if v.kind == "uncordoned-during-stage"]
    if found:
        raise UncordonedDuringStage("\n".join(map(str, found)))
    assert violations == [], "\n".join(map(str, violations))


@dataclass
class Reproduction:
    name: str
    watcher: InvariantWatcher
    node: str = ""


@asynccontextmanager
async def _reproduction(cluster: DevCluster, kube: KubeClient, prefix: str) -> AsyncIterator[Reproduction]:
    """A failed node with a stage of its round still running, watched from before it existed; the
    watcher, the gate and the node are cleaned up however the test ends."""
    run = Reproduction(unique(prefix), InvariantWatcher(await cluster.client()))
    await run.watcher.start()
    try:
        run.node = await _failed_node_with_a_stage_still_running(cluster, kube, run.name, run.watcher)
        yield run
    finally:
        if run.watcher._tasks:
            await run.watcher.stop()
        await run.watcher.client.close()
        await _cleanup(kube, run.name, run.node or None)


async def test_a_reset_failed_node_is_not_uncordoned_while_a_stage_of_its_round_still_runs(
        chaos_cluster: DevCluster, chaos_kube: KubeClient, lone_operator: str) -> None:
    async with _reproduction(chaos_cluster, chaos_kube, "reset-running") as run:
        name, node = run.name, run.node
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await chaos_kube.patch(NODES, node, {"metadata": {"annotations": {keys.reset_annotation(name): stamp}}})
        await _held(chaos_kube, node, lambda ann: keys.reset_annotation(name) in ann)
        await _end_slow_stage(chaos_kube, node)

        async def consumed() -> bool:
            annotations = (await chaos_kube.get(NODES, node))["metadata"].get("annotations") or {}
            return keys.reset_annotation(name) not in annotations

        await _wait(consumed, "the operator acting on the reset")
        _no_uncordon_during_stage((await run.watcher.stop()).violations)


async def test_deleting_a_gate_does_not_uncordon_a_failed_node_while_a_stage_of_its_round_still_runs(
        chaos_cluster: DevCluster, chaos_kube: KubeClient, lone_operator: str) -> None:
    async with _reproduction(chaos_cluster, chaos_kube, "delete-running") as run:
        name, node = run.name, run.node
        await chaos_kube.delete(NODEGATES, name)
        await _held(chaos_kube, node, lambda ann: keys.state_annotation(name) in ann)
        await _end_slow_stage(chaos_kube, node)

        async def released() -> bool:
            obj = await chaos_kube.get(NODES, node)
            return keys.state_annotation(name) not in (obj["metadata"].get("annotations") or {})

        await _wait(released, "the node released by the deleted gate")
        _no_uncordon_during_stage((await run.watcher.stop()).violations)
