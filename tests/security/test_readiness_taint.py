"""An ordinary user cannot take the readiness taint off a node, whatever the write looks like.

`kubectl --as` a user who may get, patch, update, create and delete Nodes (far more than most people
get) but is not the operator and may not `bypass`: merge patch, JSON patch (remove, replace the list,
change the effect, change the key), strategic merge patch,
`kubectl taint ... -`, update (PUT), server-side apply, and the status subresource. After every
attempt the node is read back: the taint must still be there. The operator's ServiceAccount, given
the same role, then makes the same write and it goes through: the refusal is about who asks.
Deleting the node and creating it again without the taint does not shed it either: the mutating
webhook puts it back on the new node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import yaml

from gate.api.keys import READINESS_TAINT_KEY
from gate.devcluster.cluster import DevCluster
from gate.kube.client import NODEGATES, NODES, KubeClient
from tests.chart.outofcluster import session_operator_paused
from tests.conftest import Kubectl, unique
from tests.integration.conftest import TAINT, Webhook, cluster_role_for, plain_node, readiness_holder

OTHER = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}
OPERATOR = "system:serviceaccount:nodegate-system:nodegate-operator"


@pytest.fixture(scope="module", autouse=True)
def no_session_operator(cluster: DevCluster) -> Iterator[None]:
    """The session's operator, when another file of this process started it, stopped for this module and
    started again after it. The writes here are about admission; the operator's readiness-taint backstop
    puts the taint back on a node that joined after a readinessTaint gate (`taint_reason`: "joined
    without it"), and would race the read that follows the operator identity's write."""
    with session_operator_paused(cluster):
        yield


@pytest.fixture
async def node_admin(kube: KubeClient, kubectl: Kubectl, webhook: Webhook) -> AsyncIterator[str]:
    """A ClusterRole with every write on Nodes, bound to a fresh user and to the operator's ServiceAccount."""
    name, user = unique("node-admin"), unique("trudy")
    async with cluster_role_for(kube, name, user, [{"apiGroups": [""], "resources": ["nodes", "nodes/status"],
                                                    "verbs": ["get", "list", "patch", "update", "create",
                                                              "delete"]}]):
        # The API server's RBAC informers take a moment to see a new binding (longer on a busy machine):
        # until both identities may get nodes, a refusal would come from RBAC, not from the webhook.
        deadline = time.monotonic() + 60  # a hang guard
        for who in (user, OPERATOR):
            while kubectl.run("auth", "can-i", "get", "nodes", as_user=who, check=False).stdout.strip() != "yes":
                assert time.monotonic() < deadline, f"{who} still may not get nodes"
                await asyncio.sleep(0.2)
        yield user


@pytest.fixture
async def tainted(kube: KubeClient, kubectl: Kubectl, webhook: Webhook) -> AsyncIterator[str]:
    name, pool = unique("sec-taint"), unique("pool")
    async with readiness_holder(kube, {"pool": pool}):  # or the operator lifts a taint no gate holds
        kubectl.apply(yaml.safe_dump(plain_node(name, {"pool": pool}, [OTHER, TAINT])))
        yield name
        kubectl.run("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def taints_of(kubectl: Kubectl, name: str) -> list[dict[str, str]]:
    obj = json.loads(kubectl.run("get", "node", name, "-o", "json").stdout)
    return list(obj["spec"].get("taints") or [])


def index_of_taint(kubectl: Kubectl, name: str) -> int:
    return next(i for i, t in enumerate(taints_of(kubectl, name)) if t["key"] == READINESS_TAINT_KEY)


def _without_taint(kubectl: Kubectl, name: str, *, apply: bool = False) -> str:
    obj = json.loads(kubectl.run("get", "node", name, "-o", "json").stdout)
    obj["spec"]["taints"] = [t for t in obj["spec"]["taints"] if t["key"] != READINESS_TAINT_KEY]
    # Unconditional (Nodes allow it): the node lifecycle controller may write the node between our
    # read and the PUT, and a 409 Conflict would come before admission ever saw the write.
    del obj["metadata"]["resourceVersion"]
    if apply:  # what a person would apply: the fields they care about, no server-set metadata
        obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
               "spec": {"taints": obj["spec"]["taints"]}}
    return yaml.safe_dump(obj)


WRITES = {
    "merge patch": lambda k, n: (("patch", "node", n, "--type=merge", "-p", json.dumps({"spec": {"taints": [OTHER]}})),
                                 None),
    "JSON patch remove": lambda k, n: (("patch", "node", n, "--type=json", "-p", json.dumps(
        [{"op": "remove", "path": f"/spec/taints/{index_of_taint(k, n)}"}])), None),
    "JSON patch replacing the list": lambda k, n: (("patch", "node", n, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/taints", "value": []}])), None),
    "JSON patch softening the effect": lambda k, n: (("patch", "node", n, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": f"/spec/taints/{index_of_taint(k, n)}/effect", "value": "PreferNoSchedule"}])),
        None),
    "JSON patch renaming the key": lambda k, n: (("patch", "node", n, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": f"/spec/taints/{index_of_taint(k, n)}/key", "value": "nodegate.io/runtime"}])),
        None),
    # Node taints are an atomic list (no merge key): a strategic merge patch replaces the whole list
    # (a `$patch: delete` directive in it is an unknown field and leaves our taint in place).
    "strategic merge patch": lambda k, n: (("patch", "node", n, "--type=strategic", "-p", json.dumps(
        {"spec": {"taints": [OTHER]}})), None),
    "kubectl taint": lambda k, n: (("taint", "node", n, f"{READINESS_TAINT_KEY}:NoSchedule-"), None),
    "update (PUT)": lambda k, n: (("replace", "-f", "-"), _without_taint(k, n)),
    "server-side apply": lambda k, n: (("apply", "--server-side", "--force-conflicts", "--field-manager", "sec",
                                        "-f", "-"), _without_taint(k, n, apply=True)),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_an_ordinary_user_cannot_remove_the_readiness_taint(kubectl: Kubectl, tainted: str, node_admin: str,
                                                            write: str) -> None:
    args, stdin = WRITES[write](kubectl, tainted)
    proc = kubectl.run(*args, stdin=stdin, as_user=node_admin, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "reserved to the NodeGate operator" in proc.stderr, proc.stderr
    assert f'user "{node_admin}" is not allowed verb "bypass"' in proc.stderr
    assert TAINT in taints_of(kubectl, tainted) and OTHER in taints_of(kubectl, tainted)
    # The same write by the operator's ServiceAccount (same role) takes the taint off.
    args, stdin = WRITES[write](kubectl, tainted)
    proc = kubectl.run(*args, stdin=stdin, as_user=OPERATOR, check=False)
    assert proc.returncode == 0, proc.stderr
    assert TAINT not in taints_of(kubectl, tainted)


def test_the_status_subresource_cannot_remove_the_taint(kubectl: Kubectl, tainted: str, node_admin: str) -> None:
    proc = kubectl.run("patch", "node", tainted, "--subresource=status", "--type=merge", "-p",
                       json.dumps({"spec": {"taints": []}, "status": {"phase": "Running"}}),
                       as_user=node_admin, check=False)
    assert proc.returncode == 0, proc.stderr  # accepted: status ignores the spec
    assert TAINT in taints_of(kubectl, tainted)


async def test_recreating_the_node_does_not_shed_the_taint(kube: KubeClient, kubectl: Kubectl,
                                                          node_admin: str) -> None:
    """Delete the tainted node and create it again without the taint: the Node CREATE mutation taints
    the new node as it would any node joining a readinessTaint gate."""
    pool, gate, name = unique("pool"), unique("sec-ready"), unique("sec-rejoin")
    spec = {"readinessTaint": True, "paused": True, "nodeSelector": {"matchLabels": {"pool": pool}}}
    await kube.create(NODEGATES, {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate",
                                  "metadata": {"name": gate}, "spec": spec})
    try:
        deadline = time.monotonic() + 30
        while TAINT not in (await kube.create(NODES, plain_node(unique("probe"), {"pool": pool}, []), dry_run=True)
                            )["spec"].get("taints", []):
            assert time.monotonic() < deadline, "the webhook never saw the readinessTaint gate"
            await asyncio.sleep(0.1)
        kubectl.apply(yaml.safe_dump(plain_node(name, {"pool": pool}, [TAINT])))
        kubectl.run("delete", "node", name, as_user=node_admin)
        proc = kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(plain_node(name, {"pool": pool}, [])),
                           as_user=node_admin)
        assert proc.returncode == 0
        assert TAINT in taints_of(kubectl, name)
    finally:
        kubectl.run("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
        await kube.delete(NODEGATES, gate)
