"""Only the operator's own records drive the operator (issue 27): the node-keys policy on the real API
server, as the identities a real cluster gives an attacker, and the operator's defence behind it.

* a node patcher: a ServiceAccount with the Node rights node-feature-discovery, an autoscaler or a
  node labeller has (get, list, create, patch, update nodes and nodes/status) and no right on NodeGates;
* a kubelet: `system:node:<name>` in `system:nodes`, with the Node authorizer and NodeRestriction on
  (the dev cluster's API server runs both), writing its own Node;
* a holder of `bypass` (break glass), and a user with `patch` on one gate.

Each refused write names the key, and the node read back is unchanged. The ServiceAccount's and the
kubelet's ordinary writes go through. Behind the policy, the operator never carries on a round recorded
on a node its gate does not select, and the readiness taint follows membership.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml

from gate.api import keys
from gate.api.common import Obj
from gate.api.state import NodeGateState
from gate.kube.client import CLUSTERROLEBINDINGS, CLUSTERROLES, EVENTS, NODES, SERVICEACCOUNTS, KubeClient
from tests.conftest import Kubectl, unique
from tests.integration.conftest import TAINT, Webhook, plain_node, readiness_holder
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg", "interrupt": {"type": "reboot"}}
NODE_RIGHTS = [{"apiGroups": [""], "resources": ["nodes", "nodes/status"],
                "verbs": ["get", "list", "watch", "create", "patch", "update"]}]
REFUSED = "NodeGate node keys are reserved to the NodeGate operator"


async def _bound(kube: KubeClient, name: str, subject: Obj, rules: list[Obj]) -> None:
    await kube.create(CLUSTERROLES, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                     "metadata": {"name": name}, "rules": rules})
    await kube.create(CLUSTERROLEBINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject]})


async def _unbind(kube: KubeClient, name: str) -> None:
    await kube.delete(CLUSTERROLEBINDINGS, name)
    await kube.delete(CLUSTERROLES, name)


@pytest.fixture
async def node_patcher(kube: KubeClient, operator: int) -> AsyncIterator[str]:
    """A ServiceAccount with a node labeller's rights on Nodes and none on NodeGates; its username."""
    name = unique("node-patcher")
    await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
                      "default")
    await _bound(kube, name, {"kind": "ServiceAccount", "name": name, "namespace": "default"}, NODE_RIGHTS)
    try:
        yield f"system:serviceaccount:default:{name}"
    finally:
        await _unbind(kube, name)
        await kube.delete(SERVICEACCOUNTS, name, "default")


def as_patcher(kubectl: Kubectl, user: str, *args: str, stdin: str | None = None) -> Any:
    return kubectl.run(*args, stdin=stdin, as_user=user, groups=("system:serviceaccounts",), check=False)


async def _annotations(kube: KubeClient, node: str) -> dict[str, str]:
    return dict((await kube.get(NODES, node))["metadata"].get("annotations") or {})


def _forged(gate: str, **state: Any) -> str:
    return NodeGateState.model_validate(state).dump()


# -- a node patcher ------------------------------------------------------------------------------------

FORGERIES: dict[str, Callable[[str], Obj]] = {
    # What the issue's attacker wrote: a round in progress, at its stages, with a reboot interrupt.
    "state: a round in progress": lambda g: {"metadata": {"annotations": {keys.state_annotation(g): _forged(
        g, status="in-progress", round=1, batch=1, compartment="__default__", phase="stages",
        interrupt={"type": "reboot"}, interrupted=["pkg"])}}},
    "state: a CVE fix marked complete": lambda g: {"metadata": {"annotations": {keys.state_annotation(g): _forged(
        g, status="complete", round=1)}}},
    "cordoned-by": lambda g: {"metadata": {"annotations": {keys.CORDONED_BY: g}}},
    "status label": lambda g: {"metadata": {"labels": {keys.status_label(g): "complete"}}},
    "the readiness taint, added": lambda g: {"spec": {"taints": [TAINT]}},
    # A hand-off hold forged (held-by) or dodged for good (hand-off-released) by someone else.
    "hand-off keys": lambda g: {"metadata": {"annotations": {keys.HELD_BY: g, keys.HAND_OFF_RELEASED: "now"}}},
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
async def test_a_node_patcher_cannot_write_the_operators_keys(kube: KubeClient, kubectl: Kubectl,
                                                             node_patcher: str, forgery: str) -> None:
    gate, name = unique("forged"), unique("sec-keys")
    await kube.create(NODES, plain_node(name, {"pool": unique("pool")}))
    try:
        before = await kube.get(NODES, name)
        patch = FORGERIES[forgery](gate)
        proc = as_patcher(kubectl, node_patcher, "patch", "node", name, "--type=merge", "-p", json.dumps(patch))
        assert proc.returncode != 0, proc.stdout
        assert REFUSED in proc.stderr and f'user "{node_patcher}" is not allowed verb "bypass"' in proc.stderr, \
            proc.stderr
        written = [*patch.get("metadata", {}).get("annotations", {}), *patch.get("metadata", {}).get("labels", {})]
        for key in written or [f"taint {keys.READINESS_TAINT_KEY}"]:
            assert key in proc.stderr, (key, proc.stderr)  # the message names the key
        assert _ours(await kube.get(NODES, name)) == _ours(before)
    finally:
        await kube.delete(NODES, name)


def _ours(node: Obj) -> tuple[object, ...]:
    """NodeGate's keys on a node: what a refused write must leave as it was."""
    meta = node["metadata"]
    return ({k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.GROUP)},
            {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(keys.GROUP)},
            [t for t in node["spec"].get("taints") or [] if t["key"] == keys.READINESS_TAINT_KEY],
            [c for c in (node.get("status") or {}).get("conditions") or []
             if c["type"].startswith(keys.CONDITION_PREFIX)])


async def test_a_node_patcher_cannot_erase_the_operators_keys_or_conditions(kube: KubeClient, kubectl: Kubectl,
                                                                          node_patcher: str) -> None:
    """Keys the operator wrote (here written by the admin, who holds bypass) cannot be removed or changed,
    whatever the write: merge patch, JSON patch, PUT; nor NodeGate's node condition through the status."""
    gate, name, pool = unique("erase"), unique("sec-keys"), unique("pool")
    async with readiness_holder(kube, {"pool": pool}) as holder:  # or the operator lifts a taint no gate holds
        await _erase(kube, kubectl, node_patcher, gate, name, pool, holder)


async def _erase(kube: KubeClient, kubectl: Kubectl, node_patcher: str, gate: str, name: str, pool: str,
                 holder: str) -> None:
    node = plain_node(name, {"pool": pool, keys.status_label(gate): "failed"}, [TAINT])
    node["metadata"]["annotations"] = {keys.state_annotation(gate): _forged(gate, status="failed"),  # type: ignore
                                       keys.CORDONED_BY: gate}
    await kube.create(NODES, node)
    condition = {"type": keys.failed_condition(gate), "status": "True", "reason": "StageFailed", "message": "x"}
    await kube.patch(NODES, name, {"status": {"conditions": [condition]}}, subresource="status")
    try:
        async def held() -> bool:  # the holder's own label written: nothing of ours moves after this
            return keys.status_label(holder) in (await kube.get(NODES, name))["metadata"]["labels"]

        await wait_for(held, what="the holder gate's label")
        obj = await kube.get(NODES, name)
        put = json.loads(json.dumps(obj))
        del put["metadata"]["annotations"][keys.state_annotation(gate)]
        del put["metadata"]["resourceVersion"]  # unconditional: the holder gate writes its own label meanwhile
        writes = {
            "merge patch removing the state": ("patch", "node", name, "--type=merge", "-p", json.dumps(
                {"metadata": {"annotations": {keys.state_annotation(gate): None}}})),
            "JSON patch replacing the labels": ("patch", "node", name, "--type=json", "-p", json.dumps(
                [{"op": "replace", "path": "/metadata/labels", "value": {"pool": "x"}}])),
            "merge patch removing the taint": ("patch", "node", name, "--type=merge", "-p",
                                               json.dumps({"spec": {"taints": []}})),
            "status patch clearing the condition": ("patch", "node", name, "--subresource=status", "--type=merge",
                                                    "-p", json.dumps({"status": {"conditions": [{
                                                        **condition, "status": "False"}]}})),
        }
        for what, args in writes.items():
            proc = as_patcher(kubectl, node_patcher, *args)
            assert proc.returncode != 0 and REFUSED in proc.stderr, (what, proc.stdout, proc.stderr)
        proc = as_patcher(kubectl, node_patcher, "replace", "-f", "-", stdin=yaml.safe_dump(put))
        assert proc.returncode != 0 and keys.state_annotation(gate) in proc.stderr, proc.stderr
        assert _ours(await kube.get(NODES, name)) == _ours(obj)
        # What a node labeller does every day still goes through: its own label, its own condition.
        proc = as_patcher(kubectl, node_patcher, "label", "node", name, "feature.example.com/gpu=true")
        assert proc.returncode == 0, proc.stderr
        proc = as_patcher(kubectl, node_patcher, "patch", "node", name, "--subresource=status", "--type=strategic",
                          "-p", json.dumps({"status": {"conditions": [{"type": "GpuUnhealthy", "status": "False",
                                                                       "reason": "Ok", "message": ""}]}}))
        assert proc.returncode == 0, proc.stderr
        types = {c["type"] for c in (await kube.get(NODES, name))["status"]["conditions"]}
        assert {"GpuUnhealthy", keys.failed_condition(gate)} <= types
    finally:
        await kube.delete(NODES, name)


# -- a kubelet -------------------------------------------------------------------------------------------

async def test_a_kubelet_cannot_mark_its_own_node_complete(kube: KubeClient, kubectl: Kubectl,
                                                           scenario: Scenario) -> None:
    """As its own kubelet, with the Node authorizer and NodeRestriction: a `complete` state for a paused
    CVE-fix gate, with the hashes of the live gate, is refused; its ordinary writes are not."""
    from gate.api.nodegate import NodeGate
    from gate.api.state import rollout_hash

    [node] = await scenario.add_nodes(1)
    gate = NodeGate.model_validate(await scenario.apply_gate({"cve-fix": PKG}, paused=True))
    kubelet = (f"system:node:{node}", ("system:nodes", "system:authenticated"))
    forged = _forged(scenario.name, status="complete", round=1, generation=gate.metadata.generation,
                     rollout_hash=rollout_hash(gate))
    proc = kubectl.run("annotate", "node", node, f"{keys.state_annotation(scenario.name)}={forged}",
                       as_user=kubelet[0], groups=kubelet[1], check=False)
    assert proc.returncode != 0 and REFUSED in proc.stderr and f'user "{kubelet[0]}"' in proc.stderr, proc.stderr
    proc = kubectl.run("label", "node", node, f"{keys.IGNORE_LABEL}=true", as_user=kubelet[0], groups=kubelet[1],
                       check=False)
    assert proc.returncode != 0 and "opts a node out of every NodeGate" in proc.stderr, proc.stderr
    assert keys.state_annotation(scenario.name) not in await _annotations(kube, node)
    # The kubelet's own writes: a label outside NodeGate's keys, an annotation, its status (a PUT of the
    # status: kubectl's status patch reads nodes/status first, which the Node authorizer does not allow).
    for args in (("label", "node", node, "example.com/rack=r1"),
                 ("annotate", "node", node, "example.com/driver=550")):
        proc = kubectl.run(*args, as_user=kubelet[0], groups=kubelet[1], check=False)
        assert proc.returncode == 0, (args, proc.stderr)
    obj = await kube.get(NODES, node)
    obj["status"]["conditions"].append({"type": "example.com/Thermal", "status": "False", "reason": "Cool",
                                        "message": "", "lastHeartbeatTime": "2026-12-03T00:00:00Z",
                                        "lastTransitionTime": "2026-12-03T00:00:00Z"})
    del obj["metadata"]["resourceVersion"]
    proc = kubectl.run("replace", "--subresource=status", "-f", "-", stdin=json.dumps(obj), as_user=kubelet[0],
                       groups=kubelet[1], check=False)
    assert proc.returncode == 0, proc.stderr
    assert "example.com/Thermal" in {c["type"] for c in (await kube.get(NODES, node))["status"]["conditions"]}
    # NodeRestriction keeps a kubelet to its own Node: the policy is not the only wall.
    [other] = await scenario.add_nodes(1, start=1)
    proc = kubectl.run("label", "node", other, "example.com/rack=r1", as_user=kubelet[0], groups=kubelet[1],
                       check=False)
    assert proc.returncode != 0


# -- ignore, and a person's requests ----------------------------------------------------------------------

async def test_a_node_cannot_opt_itself_out(kube: KubeClient, kubectl: Kubectl, node_patcher: str,
                                            scenario: Scenario, webhook: Webhook) -> None:
    """Creating or labelling a node with `ignore` needs `bypass`; without it, the readinessTaint gate's
    node joins tainted. A holder's ignored node is counted by the gate and loses the taint."""
    await scenario.apply_gate({"base": PKG}, paused=True, readinessTaint=True)
    await scenario.wait_condition("Paused")
    joining = plain_node(unique("sec-opt-out"), {"test": scenario.name, keys.IGNORE_LABEL: "true"})
    proc = as_patcher(kubectl, node_patcher, "create", "-f", "-", stdin=yaml.safe_dump(joining))
    assert proc.returncode != 0 and "opts a node out of every NodeGate" in proc.stderr, proc.stderr
    [member] = await scenario.add_nodes(1)
    assert TAINT in (await kube.get(NODES, member))["spec"]["taints"]  # joined after the gate: tainted
    proc = as_patcher(kubectl, node_patcher, "label", "node", member, f"{keys.IGNORE_LABEL}=true")
    assert proc.returncode != 0 and "opts a node out of every NodeGate" in proc.stderr, proc.stderr
    # A holder of bypass may (here the admin); the node then no longer waits for the gate.
    await kube.patch(NODES, member, {"metadata": {"labels": {keys.IGNORE_LABEL: "true"}}})

    async def released() -> bool:
        status = (await scenario.gate()).get("status") or {}
        return (TAINT not in ((await kube.get(NODES, member))["spec"].get("taints") or [])
                and status.get("nodes", {}).get("ignored") == 1)

    await wait_for(released, what="the ignored node untainted and counted")
    ready = {c["type"]: c for c in (await scenario.gate())["status"]["conditions"]}["Ready"]
    assert "ignored (nodegate.io/ignore=true)" in ready["message"], ready
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={member}")
    assert any(e["reason"] == "ReadinessTaintRemoved" and "ignored" in e["note"] for e in events), events


async def test_reset_and_rerun_need_patch_on_the_gate_they_name(kube: KubeClient, kubectl: Kubectl,
                                                                node_patcher: str) -> None:
    gate, other, name = unique("mine"), unique("theirs"), unique("sec-req")
    await kube.create(NODES, plain_node(name, {"pool": unique("pool")}))
    role = unique("patch-one-gate")
    try:
        for key in (keys.reset_annotation(gate), keys.rerun_annotation(gate)):
            proc = as_patcher(kubectl, node_patcher, "annotate", "node", name, f"{key}=pkg/apply")
            assert proc.returncode != 0 and key in proc.stderr and 'needs verb "patch"' in proc.stderr, proc.stderr
        await _bound(kube, role, {"kind": "ServiceAccount", "name": node_patcher.rsplit(":", 1)[1],
                                  "namespace": "default"},
                     [{"apiGroups": [keys.GROUP], "resources": ["nodegates"], "verbs": ["patch"],
                       "resourceNames": [gate]}])
        proc = as_patcher(kubectl, node_patcher, "annotate", "node", name, f"{keys.reset_annotation(gate)}=now")
        assert proc.returncode == 0, proc.stderr
        proc = as_patcher(kubectl, node_patcher, "annotate", "node", name, f"{keys.reset_annotation(other)}=now")
        assert proc.returncode != 0 and keys.reset_annotation(other) in proc.stderr, proc.stderr
        annotations = await _annotations(kube, name)
        assert keys.reset_annotation(gate) in annotations and keys.reset_annotation(other) not in annotations
    finally:
        await kube.delete(NODES, name)
        await _unbind(kube, role)


async def test_a_node_patchers_health_condition_can_fail_a_soaking_node_and_do_nothing_else(
        kube: KubeClient, kubectl: Kubectl, node_patcher: str, scenario: Scenario, step_log: StepLog) -> None:
    """A condition of `health.nodeConditions` is the signal itself, so whoever may patch nodes/status
    (node-problem-detector, and so a node patcher) may set it: it fails the soaking node, uncordoned,
    and no stage runs because of it. Clearing it again does not undo the verdict."""
    [node] = await scenario.add_nodes(1)
    policy = f"{scenario.name}-p"
    scenario.policies.append(policy)
    await kube.apply({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
                      "spec": {"default": {"budget": {"count": 1}, "health": {
                          "soak": "1h", "nodeConditions": [{"type": "GpuUnhealthy", "status": "True"}]}}}},
                     field_manager="test", force=True)
    await scenario.apply_gate({"base": {"version": "1.0.0", "image": "registry.example.com/pkg"}},
                              deploymentPolicy=policy)

    async def soaking() -> bool:
        return (await scenario.state(node)).get("phase") == "soak"

    await wait_for(soaking, what=f"{node} in its soak")
    steps = len(step_log.of(scenario.name, node))

    def condition(status: str) -> str:
        return json.dumps({"status": {"conditions": [{
            "type": "GpuUnhealthy", "status": status, "reason": "Injected", "message": "set by a node patcher",
            "lastHeartbeatTime": "2026-12-04T05:00:00Z", "lastTransitionTime": "2026-12-04T05:00:00Z"}]}})

    proc = as_patcher(kubectl, node_patcher, "patch", "node", node, "--subresource=status", "--type=strategic",
                      "-p", condition("True"))
    assert proc.returncode == 0, proc.stderr  # its right: the signal's writer
    await scenario.wait_node(node, "failed")
    failure = (await scenario.state(node))["failure"]
    assert failure["reason"] == "Unhealthy" and "GpuUnhealthy=True" in failure["message"], failure
    proc = as_patcher(kubectl, node_patcher, "patch", "node", node, "--subresource=status", "--type=strategic",
                      "-p", condition("False"))
    assert proc.returncode == 0, proc.stderr
    state = await scenario.state(node)
    # Failed is failed (its phase says where: soak): only a person's reset gives the node another round.
    assert state["status"] == "failed" and state["failure"]["reason"] == "Unhealthy", state
    assert not (await kube.get(NODES, node))["spec"].get("unschedulable")
    assert len(step_log.of(scenario.name, node)) == steps  # no stage ran because of the condition

# -- the operator, behind the policy -----------------------------------------------------------------------

async def test_the_operator_never_carries_on_a_round_on_a_node_its_gate_does_not_select(
        kube: KubeClient, scenario: Scenario, step_log: StepLog) -> None:
    """Written by someone who may (the admin holds bypass): a round in progress with a reboot, on a node
    the gate does not select. It is not the operator's record (unsigned, tests/security/test_record_signatures.py):
    no stage pod, no cordon; it is reported in a Warning Event on the gate naming the node."""
    [member] = await scenario.add_nodes(1)
    [outsider] = await scenario.add_nodes(1, {"test": f"{scenario.name}-out"}, start=1)
    await scenario.apply_gate({"base": PKG})
    await scenario.wait_ready()
    forged = FORGERIES["state: a round in progress"](scenario.name)
    await kube.patch(NODES, outsider, forged)

    async def reported() -> bool:
        events, _ = await kube.list(EVENTS, "default",
                                    field_selector=f"regarding.name={scenario.name},reason=RecordNotOurs")
        return any(outsider in e["note"] for e in events)

    await wait_for(reported, what="the forged record reported")
    node = await kube.get(NODES, outsider)
    assert not node["spec"].get("unschedulable")
    assert step_log.of(scenario.name, outsider) == [] and step_log.of(scenario.name, member) != []


async def test_the_readiness_taint_follows_membership(kube: KubeClient, scenario: Scenario, webhook: Webhook) -> None:
    """Relabelled out, a selector edited away, readinessTaint turned off, the gate deleted: each time the
    node that no readinessTaint gate selects any longer loses the taint, with an Event that says why."""
    await scenario.apply_gate({"base": PKG}, paused=True, readinessTaint=True,
                              nodeSelector={"matchLabels": {"test": scenario.name, "keep": "yes"}})
    await scenario.wait_condition("Paused")
    relabelled, edited = await scenario.add_nodes(2, {"keep": "yes"})
    last = (await scenario.add_nodes(1, {"keep": "yes", "last": "yes"}, start=2))[0]
    for node in (relabelled, edited, last):
        assert TAINT in (await kube.get(NODES, node))["spec"]["taints"], node

    async def untainted(node: str) -> bool:
        return TAINT not in ((await kube.get(NODES, node))["spec"].get("taints") or [])

    await kube.patch(NODES, relabelled, {"metadata": {"labels": {"keep": "no"}}})
    await wait_for(lambda: untainted(relabelled), what="the relabelled node untainted")
    assert not await untainted(edited)
    await scenario.patch_gate({"spec": {"nodeSelector": {"matchLabels": {"test": scenario.name, "last": "yes"}}}})
    await wait_for(lambda: untainted(edited), what="the node the edited selector left untainted")
    assert not await untainted(last)
    await scenario.patch_gate({"spec": {"readinessTaint": False}})
    await wait_for(lambda: untainted(last), what="the taint gone with readinessTaint off")
    for node in (relabelled, edited, last):
        notes: list[str] = []

        async def said(node: str = node) -> bool:  # the Event is written after the taint's removal
            nonlocal notes
            events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={node}")
            notes = [e["note"] for e in events if e["reason"] == "ReadinessTaintRemoved"]
            return bool(notes)

        await wait_for(said, what=f"the ReadinessTaintRemoved Event of {node}")
        assert "no readinessTaint NodeGate selects the node any longer" in notes[-1], (node, notes)
