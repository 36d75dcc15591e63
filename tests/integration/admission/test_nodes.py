"""The readiness taint: put on joining nodes a readinessTaint gate selects, protected from removal."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from gate.api.keys import IGNORE_LABEL, READINESS_TAINT_KEY
from gate.kube.client import NODEGATES, NODES, KubeClient
from tests.conftest import Kubectl, unique
from tests.integration.conftest import TAINT, Webhook, cluster_role_for, plain_node, readiness_holder


def readiness_taints(obj: dict[str, object]) -> list[object]:
    taints = obj.get("spec", {}).get("taints") or []  # type: ignore[union-attr]
    return [t for t in taints if t.get("key") == READINESS_TAINT_KEY]


@pytest.fixture
async def readiness_gate(kube: KubeClient, webhook: Webhook) -> AsyncIterator[str]:
    """A readinessTaint gate selecting nodes labelled `pool=<unique>`; yields the pool label value."""
    pool = unique("pool")
    name = unique("ready")
    await kube.create(NODEGATES, {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate",
                                  "metadata": {"name": name},
                                  "spec": {"readinessTaint": True, "nodeSelector": {"matchLabels": {"pool": pool}}}})
    # The webhook reads gates from its watch cache: wait until a dry-run node of the pool comes back
    # tainted, so the tests below never race the cache.
    deadline = time.monotonic() + 30
    while not readiness_taints(await kube.create(NODES, plain_node(unique("probe"), {"pool": pool}), dry_run=True)):
        assert time.monotonic() < deadline, "the webhook never saw the readinessTaint gate"
        await asyncio.sleep(0.1)
    yield pool
    await kube.delete(NODEGATES, name)


async def _create(kube: KubeClient, obj: dict[str, object]) -> dict[str, object]:
    created = await kube.create(NODES, obj)
    return created


async def test_node_joining_a_readiness_gate_gets_the_taint(kube: KubeClient, readiness_gate: str) -> None:
    name = unique("join")
    try:
        created = await _create(kube, plain_node(name, {"pool": readiness_gate}))
        assert readiness_taints(created) == [TAINT]
        assert readiness_taints(await kube.get(NODES, name)) == [TAINT]
    finally:
        await kube.delete(NODES, name)


async def test_taint_is_added_once_next_to_other_taints(kube: KubeClient, readiness_gate: str) -> None:
    other = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}
    names = [unique("join"), unique("join")]
    try:
        # (the API server's own admission adds node.kubernetes.io/not-ready next to ours)
        with_other = await _create(kube, plain_node(names[0], {"pool": readiness_gate}, [other]))
        assert other in with_other["spec"]["taints"]  # type: ignore[index]
        assert readiness_taints(with_other) == [TAINT]
        already = await _create(kube, plain_node(names[1], {"pool": readiness_gate}, [TAINT]))
        assert readiness_taints(already) == [TAINT]
    finally:
        for n in names:
            await kube.delete(NODES, n)


async def test_unselected_nodes_join_untainted_and_ignored_ones_tainted(kube: KubeClient, readiness_gate: str) -> None:
    # The node's own ignore label counts for nothing at CREATE (a node cannot opt itself out); the
    # operator lifts the taint of an ignored node, which no gate selects (tests/security/test_node_keys.py).
    ignored = await kube.create(NODES, plain_node(unique("x"), {"pool": readiness_gate, IGNORE_LABEL: "true"}),
                                dry_run=True)
    assert readiness_taints(ignored) == [TAINT]
    elsewhere = await kube.create(NODES, plain_node(unique("x"), {"pool": "some-other-pool"}), dry_run=True)
    assert readiness_taints(elsewhere) == []


@pytest.fixture
async def tainted_node(kube: KubeClient, webhook: Webhook) -> AsyncIterator[str]:
    name, pool = unique("tainted"), unique("pool")
    async with readiness_holder(kube, {"pool": pool}):  # or the operator lifts a taint no gate holds
        await kube.create(NODES, plain_node(name, {"pool": pool}, [TAINT]))
        yield name
        await kube.delete(NODES, name)


@pytest.fixture
async def node_patcher(kube: KubeClient) -> AsyncIterator[str]:
    """A ClusterRole that may patch nodes, bound to a fresh user and to the operator's ServiceAccount."""
    name, user = unique("node-patcher"), unique("bob")
    async with cluster_role_for(kube, name, user, [{"apiGroups": [""], "resources": ["nodes"],
                                                    "verbs": ["get", "patch", "update"]}]):
        yield user


REMOVE_TAINT = json.dumps({"spec": {"taints": []}})


def test_ordinary_user_cannot_remove_the_readiness_taint(kubectl: Kubectl, tainted_node: str,
    node_patcher: str) -> None:
    proc = kubectl.run("patch", "node", tainted_node, "--type=merge", "-p", REMOVE_TAINT, as_user=node_patcher,
                       check=False)
    assert proc.returncode != 0
    # The node-keys policy refuses it first (inside the API server), when the operator installed it;
    # the taint webhook otherwise. Both name the user, the right and the taint.
    assert ("denied the request" in proc.stderr and "spec.taints" in proc.stderr) or \
        f"taint {READINESS_TAINT_KEY}" in proc.stderr, proc.stderr
    assert f'user "{node_patcher}" is not allowed verb "bypass" on nodegates.nodegate.io' in proc.stderr
    # kubectl taint is refused the same way
    proc = kubectl.run("taint", "node", tainted_node, f"{READINESS_TAINT_KEY}:NoSchedule-", as_user=node_patcher,
                       check=False)
    assert proc.returncode != 0 and "reserved to the NodeGate operator" in proc.stderr, proc.stderr


def test_ordinary_user_may_change_other_node_fields(kubectl: Kubectl, tainted_node: str, node_patcher: str) -> None:
    proc = kubectl.run("label", "node", tainted_node, "team=infra", as_user=node_patcher, check=False)
    assert proc.returncode == 0, proc.stderr


def test_operator_service_account_removes_the_taint(kubectl: Kubectl, tainted_node: str, node_patcher: str) -> None:
    proc = kubectl.run("patch", "node", tainted_node, "--type=merge", "-p", REMOVE_TAINT,
                       as_user="system:serviceaccount:nodegate-system:nodegate-operator", check=False)
    assert proc.returncode == 0, proc.stderr


def test_user_with_bypass_removes_the_taint(kubectl: Kubectl, tainted_node: str, node_patcher: str) -> None:
    kubectl.run("apply", "-f", "config/rbac/package-user.yaml")
    binding = unique("bypass")
    kubectl.run("create", "clusterrolebinding", binding, "--clusterrole=nodegate-taint-bypass",
        f"--user={node_patcher}")
    try:
        proc = kubectl.run("patch", "node", tainted_node, "--type=merge", "-p", REMOVE_TAINT, as_user=node_patcher,
                           check=False)
        assert proc.returncode == 0, proc.stderr
    finally:
        kubectl.run("delete", "clusterrolebinding", binding, check=False)
