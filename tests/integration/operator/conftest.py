"""Fixtures for the operator's scenarios: one operator per session, one set of nodes per test.

Every test creates its own simulated nodes (labelled with the test's unique name) and a gate
selecting only them, so tests never see each other's nodes or budgets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from gate.api import keys
from gate.api.common import Obj
from gate.controller.pods import container_name, pod_steps
from gate.devcluster.cluster import DevCluster, NodeSpec, node_manifest
from gate.devcluster.services import start_operator
from gate.kube.cache import WatchCache
from gate.kube.client import KWOK_STAGES, NODEGATES, NODES, PODS, KubeClient
from gate.kube.errors import NotFound
from tests.processes import HANG_GUARD

NAMESPACE = "nodegate-system"
# Fast settings for simulated nodes: their stages take half a second.
OPERATOR_FLAGS = ["--poll-seconds", "0.5", "--lease-seconds", "6", "--renew-seconds", "1", "--renew-deadline", "4",
                  "--image-pull-grace", "2", "--pending-timeout", "60",
                  "--reboot-timeout", "60", "--resync-seconds", "30",
                  # A small bound, so that test_prepull sees it hold over a rollout of six nodes.
                  "--prepull-concurrency", "2", "--prepull-ahead", "3",
                  # Staging (on by default, 10) bounded small for test_staging: only catalog packages stage.
                  "--staging-concurrency", "2", "--staging-ahead", "1",
                  # test_soak asks the session's real Prometheus about soaking nodes; every second, not 15.
                  "--health-poll-seconds", "1"]


@pytest.fixture(scope="session")
def operator(cluster: DevCluster) -> Iterator[int]:
    """The operator as a separate process, authenticated as its ServiceAccount; yields its metrics port."""
    port = start_operator(cluster, lambda m: None, extra=OPERATOR_FLAGS)
    yield port
    cluster.stop_process("operator")


@dataclass
class StepRecord:
    """One step of a stage pod (a container: a package's stage, or the interrupt)."""

    name: str  # pod/container
    pod: str
    gate: str
    node: str
    package: str | None
    stage: str
    interrupt: str | None
    args: list[str]
    created: float
    resource_version: int = 0  # etcd revision of its pod's creation: orders it against other objects' changes
    started_rv: int | None = None  # etcd revision at which its container was first seen started
    finished: float | None = None
    succeeded: bool | None = None
    finished_rv: int | None = None  # etcd revision at which it was seen ended (or its pod ended or went)
    grace_period: int | None = None  # the pod's terminationGracePeriodSeconds


@dataclass
class StepLog:
    """Every step of every stage pod the operator created in this session, recorded by an independent watch."""

    records: dict[str, StepRecord] = field(default_factory=dict)
    creations: list[str] = field(default_factory=list)
    uids: dict[str, set[str]] = field(default_factory=dict)  # a pod name created again gets a second uid

    def on_event(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        steps = pod_steps(pod)
        if not steps:
            return
        name = meta["name"]
        self.uids.setdefault(name, set()).add(meta.get("uid", ""))
        spec = pod["spec"]
        containers = {c["name"]: c for c in [*(spec.get("initContainers") or []), *spec["containers"]]}
        labels = meta.get("labels") or {}
        rv = int(meta.get("resourceVersion", "0"))
        status = pod.get("status") or {}
        states = {cs.get("name"): cs.get("state") or {} for cs in
                  [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]}
        ended = status.get("phase") in ("Succeeded", "Failed") or kind == "DELETED"
        # Steps in turn (gate.controller.steporder) all run from the pod's start: a step's own run starts once
        # every step before it succeeded, its turn.
        in_turn = labels.get(keys.IN_TURN_LABEL) == "true"
        turn = True
        for step in steps:
            container = container_name(step)
            key = f"{name}/{container}"
            if key not in self.records:
                self.records[key] = StepRecord(
                    name=key, pod=name, gate=ann.get("nodegate.io/gate-name", ""),
                    node=ann.get("nodegate.io/node-name", ""), package=step.package, stage=step.stage,
                    # The interrupt step's type (its pod's label; a pod may hold package steps too).
                    interrupt=labels.get(keys.INTERRUPT_LABEL) if step.package is None else None,
                    args=list(containers[container].get("args", [])),
                    created=time.monotonic(), resource_version=rv,
                    grace_period=spec.get("terminationGracePeriodSeconds"),
                )
                self.creations.append(key)
            rec = self.records[key]
            state = states.get(container, {})
            if rec.started_rv is None and turn and ("running" in state or "terminated" in state):
                rec.started_rv = rv
            term = state.get("terminated")
            turn = turn and (not in_turn or bool(term and term.get("exitCode") == 0))
            if rec.finished is None and (term or ended):
                rec.finished = time.monotonic()
                rec.succeeded = bool(term) and term.get("exitCode") == 0
                rec.finished_rv = rv

    def created_twice(self, gate: str) -> list[str]:
        """Names of this gate's stage pods that were created more than once (deleted and made again)."""
        return sorted({r.pod for r in self.of(gate) if len(self.uids.get(r.pod, ())) > 1})

    def of(self, gate: str, node: str | None = None) -> list[StepRecord]:
        return [self.records[n] for n in self.creations
                if self.records[n].gate == gate and (node is None or self.records[n].node == node)]


@pytest.fixture(scope="session")
async def step_log(cluster: DevCluster) -> AsyncIterator[StepLog]:
    client = await cluster.client()
    log = StepLog()
    pods = WatchCache(client, PODS, namespace=NAMESPACE)
    pods.subscribe(log.on_event)
    await pods.start()
    for pod in pods.items():
        log.on_event("ADDED", pod)
    yield log
    await pods.stop()
    await client.close()


async def wait_for(check: Callable[[], Awaitable[bool]], *, timeout: float = HANG_GUARD, what: str = "condition",
                   interval: float = 0.25) -> None:
    """Until `check()` holds. `timeout` is a hang guard, not a measure: a busy machine is slow, and a
    test passes however long the condition takes below it."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


class Scenario:
    """One test's gate and nodes, with helpers to drive and observe them."""

    def __init__(self, cluster: DevCluster, kube: KubeClient, name: str) -> None:
        self.cluster = cluster
        self.kube = kube
        self.name = name
        self.nodes: list[str] = []
        self.stages: list[str] = []
        self.policies: list[str] = []  # deleted after the gate is gone (the webhook refuses it before)

    async def add_nodes(self, count: int, labels: dict[str, str] | None = None, *, start: int = 0,
                        taints: list[dict[str, str]] | None = None) -> list[str]:
        spec = NodeSpec(count, {"test": self.name, **(labels or {})}, prefix=f"{self.name}-", start=start,
                        taints=taints or [])
        names = await self.cluster.add_nodes(spec)
        self.nodes += names
        return names

    def gate_manifest(self, packages: Obj, **spec: Any) -> Obj:
        body: Obj = {"nodeSelector": {"matchLabels": {"test": self.name}}, "packages": packages}
        body.update(spec)
        return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": self.name},
                "spec": body}

    async def apply_gate(self, packages: Obj, **spec: Any) -> Obj:
        return await self.kube.apply(self.gate_manifest(packages, **spec), field_manager="test", force=True)

    async def patch_gate(self, patch: Obj) -> Obj:
        return await self.kube.patch(NODEGATES, self.name, patch)

    async def gate(self) -> Obj:
        return await self.kube.get(NODEGATES, self.name)

    async def node(self, name: str) -> Obj:
        return await self.kube.get(NODES, name)

    async def node_status(self, name: str) -> str | None:
        labels = (await self.node(name))["metadata"].get("labels") or {}
        return labels.get(keys.status_label(self.name))

    async def set_condition(self, node: str, type_: str, status: str, reason: str, message: str) -> None:
        """A condition on the Node's status, written as node-problem-detector (or a kubelet) writes it."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await self.kube.patch(NODES, node, {"status": {"conditions": [{
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, patch_type="strategic", subresource="status")

    async def state(self, name: str) -> Obj:
        import json

        raw = ((await self.node(name))["metadata"].get("annotations") or {}).get(keys.state_annotation(self.name))
        return json.loads(raw) if raw else {}

    async def wait_ready(self, timeout: float = HANG_GUARD) -> Obj:
        async def ready() -> bool:
            status = (await self.gate()).get("status") or {}
            gen = (await self.gate())["metadata"]["generation"]
            conds = {c["type"]: c for c in status.get("conditions") or []}
            return (status.get("observedGeneration") == gen and conds.get("Ready", {}).get("status") == "True")

        await wait_for(ready, timeout=timeout, what=f"gate {self.name} Ready")
        return await self.gate()

    async def wait_condition(self, type_: str, status: str = "True", timeout: float = HANG_GUARD) -> Obj:
        async def reached() -> bool:
            conds = {c["type"]: c for c in ((await self.gate()).get("status") or {}).get("conditions") or []}
            return bool(conds.get(type_, {}).get("status") == status)

        await wait_for(reached, timeout=timeout, what=f"gate {self.name} {type_}={status}")
        return await self.gate()

    async def wait_node(self, node: str, status: str, timeout: float = HANG_GUARD) -> None:
        async def reached() -> bool:
            return await self.node_status(node) == status

        await wait_for(reached, timeout=timeout, what=f"node {node} {status}")

    async def join_while_webhook_down(self, name: str) -> Obj:
        """Create a kwok node while the admission webhook is frozen (SIGSTOP): the API server's call
        times out and the Node mutation's failurePolicy Ignore lets the node in unmutated."""
        webhook_pid = self.cluster.processes()["webhook"].pid
        os.kill(webhook_pid, signal.SIGSTOP)
        try:
            created: Obj = await self.kube.create(NODES, node_manifest(name, {"test": self.name}))
        finally:
            os.kill(webhook_pid, signal.SIGCONT)
        self.nodes.append(name)
        return created

    async def delete_gate(self, name: str | None = None, *, timeout: float = HANG_GUARD) -> None:
        """Delete a gate (this scenario's by default) and wait until the operator released it."""
        gate = name or self.name
        await self.kube.delete(NODEGATES, gate)

        async def gone() -> bool:
            try:
                await self.kube.get(NODEGATES, gate)
                return False
            except NotFound:
                return True

        await wait_for(gone, timeout=timeout, what=f"gate {gate} deleted")

    async def inject(self, stage: Obj) -> None:
        """Add a kwok Stage (failure, hang, pull error) for this test; removed at cleanup."""
        stage = {**stage, "metadata": {**stage["metadata"], "name": f"{self.name}-{stage['metadata']['name']}"}}
        await self.kube.apply(stage, field_manager="test", force=True)
        self.stages.append(stage["metadata"]["name"])

    async def cleanup(self) -> None:
        for stage in self.stages:
            await self.kube.delete(KWOK_STAGES, stage)
        try:
            await self.delete_gate()
        finally:
            from gate.kube.client import POLICIES

            for policy in self.policies:
                await self.kube.delete(POLICIES, policy)
            for node in self.nodes:
                await self.kube.delete(NODES, node)


@pytest.fixture
async def scenario(request: pytest.FixtureRequest, cluster: DevCluster, operator: int, kube: KubeClient,
                   step_log: StepLog) -> AsyncIterator[Scenario]:
    from tests.conftest import unique

    base = request.node.name.removeprefix("test_").replace("_", "-")[:20].strip("-")
    sc = Scenario(cluster, kube, unique(base))
    try:
        yield sc
    finally:
        await sc.cleanup()


def dump(obj: Obj) -> str:
    return yaml.safe_dump(obj)
