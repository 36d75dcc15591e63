"""RBAC proven, not assumed: every verb of every rule in gate/controller/rbac.py (the chart's RBAC,
test_render.py shows they are the same) is needed.

For each (rule, verb): take the verb out of its Role or ClusterRole, and show that the API call the
rule exists for (the same call, through the same client, that the operator, the webhook or the
pre-delete hook makes) is then refused with 403 for that ServiceAccount; put it back and show the call
is allowed again. Calls are side-effect free: dry runs, reads, and writes to objects that do not exist
(authorization comes before the lookup: 404 means allowed). Identities are ServiceAccounts of a test
namespace, authenticated by TokenRequest tokens, bound exactly as the chart binds its own.

That the full set is also enough is shown end to end by every integration test: the dev cluster runs
the operator and the webhook as their ServiceAccounts with these rules, and tests/chart/test_install.py
runs both from the installed chart with the RBAC `helm install` created.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gate.admission.authz import review_body
from gate.admission.notices import event_of
from gate.admission.rules.review import AccessCheck, Notice, UserInfo, Violation
from gate.api.common import Obj
from gate.controller import rbac
from gate.kube.client import (
    CONFIGMAPS,
    CONTROLLER_REVISIONS,
    EVENTS,
    JOBS,
    LEASES,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    NODEGATES,
    NODES,
    PODS,
    POLICIES,
    SECRETS,
    SERVICEACCOUNTS,
    SUBJECT_ACCESS_REVIEWS,
    VALIDATING_WEBHOOKS,
    KubeClient,
    Resource,
    resource_for,
)
from gate.kube.errors import ApiError
from tests.conftest import unique

Call = Callable[["Identities"], Awaitable[Any]]
MISSING = "nodegate-rbac-probe-missing"


@dataclass
class Identities:
    namespace: str
    prefix: str
    configuration: str
    secret: str
    admin: KubeClient
    clients: dict[str, KubeClient]  # by component: operator, webhook, pre-delete
    objects: list[Obj]


def _as(component: str) -> Callable[[Identities], KubeClient]:
    return lambda ids: ids.clients[component]


async def _watch(client: KubeClient, res: Resource, namespace: str | None = None) -> None:
    """Open a watch as WatchCache does; an open watch (events or the server's 1 s timeout) is allowed."""
    stream = client.watch(res, namespace, resource_version="0", timeout_seconds=1)
    with contextlib.suppress(StopAsyncIteration, TimeoutError):
        await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()


async def _absent_ok(call: Awaitable[Any]) -> None:
    """A call on an object that does not exist. 404 (or 409 for an update of a missing Lease, which
    Leases allow to create, with a stale resourceVersion) comes after authorization: allowed."""
    try:
        await call
    except ApiError as exc:
        if exc.status not in (404, 409):
            raise


def _pod_spec() -> Obj:
    return {"restartPolicy": "Never", "nodeName": MISSING,
            "containers": [{"name": "agent", "image": "example.com/agent:1"}]}


def _stage_pod(ns: str) -> Obj:
    # a bare pod pinned to its node, as gate.controller.pods.stage_pod renders a stage pod
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": unique("probe"), "namespace": ns},
            "spec": _pod_spec()}


def _job(ns: str) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": unique("probe"), "namespace": ns},
            "spec": {"template": {"spec": _pod_spec()}}}


def _event(ns: str) -> Obj:
    # as gate.controller.events.EventRecorder builds them
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": unique("probe"), "namespace": ns},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "nodegate.io/operator",
            "reportingInstance": "probe", "action": "Cordoned", "reason": "Cordoned", "note": "probe",
            "type": "Normal", "regarding": {"apiVersion": "v1", "kind": "Node", "name": MISSING}}


# Updates carry a resourceVersion, as every update NodeGate sends does (compare-and-swap).
def _lease(ns: str, *, update: bool = False) -> Obj:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": MISSING, "namespace": ns, **({"resourceVersion": "1"} if update else {})},
            "spec": {"holderIdentity": "probe", "leaseDurationSeconds": 15}}


def _configuration(res: Resource, name: str) -> Obj:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": res.kind,
            "metadata": {"name": name, "resourceVersion": "1"}, "webhooks": []}


def _secret(ns: str, name: str, *, update: bool = False) -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": ns, **({"resourceVersion": "1"} if update else {})},
            "data": {"tls.crt": "", "tls.key": ""}}


op, wh, hook = _as("operator"), _as("webhook"), _as("pre-delete")
SAR = review_body(AccessCheck(user=UserInfo(username="alice", groups=["devs"]), verb="use", group="nodegate.io",
                              resource="packages", name="nvidia-tuned", denied=Violation("", "")))

# (rule set, first resource of the rule, verb) -> the call that rule exists for, as the code makes it
PROBES: dict[tuple[str, str, str], Call] = {
    # the operator's caches (gate.kube.cache.WatchCache: list, then watch)
    ("operator-cluster", "nodegates", "list"): lambda i: op(i).list(NODEGATES),
    ("operator-cluster", "nodegates", "watch"): lambda i: _watch(op(i), NODEGATES),
    ("operator-cluster", "deploymentpolicies", "list"): lambda i: op(i).list(POLICIES),
    ("operator-cluster", "deploymentpolicies", "watch"): lambda i: _watch(op(i), POLICIES),
    ("operator-cluster", "nodes", "list"): lambda i: op(i).list(NODES),
    ("operator-cluster", "nodes", "watch"): lambda i: _watch(op(i), NODES),
    # GateApplier (finalizer, status); Writer.write_node_update, write_condition; NodeApplier._evict;
    # NodeReconciler._pods_on
    ("operator-cluster", "nodegates", "patch"): lambda i: _absent_ok(
        op(i).patch(NODEGATES, MISSING, {"metadata": {"finalizers": [], "resourceVersion": "1"}})),
    ("operator-cluster", "nodegates/status", "patch"): lambda i: _absent_ok(
        op(i).patch(NODEGATES, MISSING, {"status": {}}, subresource="status")),
    # PolicyReconciler.reconcile
    ("operator-cluster", "deploymentpolicies/status", "patch"): lambda i: _absent_ok(
        op(i).patch(POLICIES, MISSING, {"status": {}}, subresource="status")),
    ("operator-cluster", "nodes", "patch"): lambda i: _absent_ok(
        op(i).patch(NODES, MISSING, {"spec": {"unschedulable": True}})),
    ("operator-cluster", "nodes/status", "patch"): lambda i: _absent_ok(op(i).patch(
        NODES, MISSING, {"status": {"conditions": [{"type": "nodegate.io/failed.probe", "$patch": "delete"}]}},
        patch_type="strategic", subresource="status")),
    ("operator-cluster", "pods", "list"): lambda i: op(i).list(PODS, field_selector=f"spec.nodeName={MISSING}"),
    # the workload cache (gate.controller.workloads) and the stage pod cache in its namespace
    ("operator-cluster", "pods", "watch"): lambda i: _watch(op(i), PODS),
    ("operator-cluster", "pods/eviction", "create"): lambda i: _absent_ok(op(i).create(
        PODS, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": MISSING, "namespace": "default"}},
        "default", subresource_of=MISSING, subresource="eviction")),
    # stage pods and their config, the Lease (NodeApplier.execute, _ensure; gate.kube.lease)
    ("operator-namespace", "pods", "create"): lambda i: op(i).create(PODS, _stage_pod(i.namespace), dry_run=True),
    ("operator-namespace", "pods", "delete"): lambda i: _absent_ok(
        op(i).delete(PODS, MISSING, i.namespace, missing_ok=False)),
    # a staging pod read whole, for the undo pod that copies it (gate.controller.staging.Stager)
    ("operator-namespace", "pods", "get"): lambda i: _absent_ok(op(i).get(PODS, MISSING, i.namespace)),
    ("operator-namespace", "configmaps", "create"): lambda i: op(i).create(CONFIGMAPS, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": unique("probe"), "namespace": i.namespace},
        "immutable": True, "data": {}}, dry_run=True),
    ("operator-namespace", "configmaps", "get"): lambda i: _absent_ok(op(i).get(CONFIGMAPS, MISSING, i.namespace)),
    ("operator-namespace", "leases", "get"): lambda i: _absent_ok(op(i).get(LEASES, MISSING, i.namespace)),
    ("operator-namespace", "leases", "create"): lambda i: op(i).create(LEASES, _lease(i.namespace), dry_run=True),
    ("operator-namespace", "leases", "update"): lambda i: _absent_ok(
        op(i).replace(LEASES, _lease(i.namespace, update=True))),
    # a gate's history (gate.controller.history.HistoryReconciler)
    ("operator-namespace", "controllerrevisions", "list"): lambda i: op(i).list(
        CONTROLLER_REVISIONS, i.namespace, label_selector="nodegate.io/gate=probe"),
    ("operator-namespace", "controllerrevisions", "create"): lambda i: op(i).create(CONTROLLER_REVISIONS, {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": unique("probe"), "namespace": i.namespace}, "data": {"spec": {}}, "revision": 1},
        i.namespace, dry_run=True),
    ("operator-namespace", "controllerrevisions", "patch"): lambda i: _absent_ok(op(i).patch(
        CONTROLLER_REVISIONS, MISSING, {"revision": 2, "metadata": {"resourceVersion": "1"}}, namespace=i.namespace)),
    ("operator-namespace", "controllerrevisions", "delete"): lambda i: _absent_ok(
        op(i).delete(CONTROLLER_REVISIONS, MISSING, i.namespace, missing_ok=False)),
    # the record signing key (gate.controller.signing.load_or_create, adoption_done)
    ("operator-namespace", "secrets", "create"): lambda i: op(i).create(SECRETS, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": unique("probe"), "namespace": i.namespace},
        "data": {}}, dry_run=True),
    ("operator-namespace", "secrets", "get"): lambda i: _absent_ok(
        op(i).get(SECRETS, rbac.state_key_secret(i.prefix), i.namespace)),
    ("operator-namespace", "secrets", "patch"): lambda i: _absent_ok(op(i).patch(
        SECRETS, rbac.state_key_secret(i.prefix), {"metadata": {"annotations": {"nodegate.io/adopt-records": None}}},
        namespace=i.namespace)),
    ("operator-events", "events", "create"): lambda i: op(i).create(EVENTS, _event("default"), dry_run=True),
    # the webhook (gate.admission.authz, gate.admission.facts, gate.admission.certificates)
    ("webhook-cluster", "subjectaccessreviews", "create"): lambda i: wh(i).create(SUBJECT_ACCESS_REVIEWS, SAR),
    ("webhook-cluster", "nodegates", "list"): lambda i: wh(i).list(NODEGATES),
    ("webhook-cluster", "nodegates", "watch"): lambda i: _watch(wh(i), NODEGATES),
    ("webhook-cluster", "deploymentpolicies", "list"): lambda i: wh(i).list(POLICIES),
    ("webhook-cluster", "deploymentpolicies", "watch"): lambda i: _watch(wh(i), POLICIES),
    ("webhook-cluster", "deploymentpolicies", "get"): lambda i: _absent_ok(wh(i).get(POLICIES, MISSING)),
    ("webhook-cluster", "nodes", "list"): lambda i: wh(i).list(NODES, label_selector="nodegate.io/status.probe"),
    # gate.admission.facts (the pod of an exec), gate.admission.notices (a break-glass Event)
    ("webhook-namespace", "pods", "get"): lambda i: _absent_ok(wh(i).get(PODS, MISSING, i.namespace)),
    ("webhook-namespace", "events", "create"): lambda i: wh(i).create(EVENTS, event_of(
        Notice(i.namespace, "Pod", MISSING, "BreakGlassExec", "probe"), "probe"), dry_run=True),
    ("webhook-self-managed-cluster", "validatingwebhookconfigurations", "get"): lambda i: _both(
        i, lambda res: _absent_ok(wh(i).get(res, i.configuration))),
    ("webhook-self-managed-cluster", "validatingwebhookconfigurations", "update"): lambda i: _both(
        i, lambda res: _absent_ok(wh(i).replace(res, _configuration(res, i.configuration)))),
    ("webhook-self-managed-namespace", "secrets", "create"): lambda i: wh(i).create(
        SECRETS, _secret(i.namespace, unique("probe")), dry_run=True),
    ("webhook-self-managed-namespace", "secrets", "get"): lambda i: _absent_ok(
        wh(i).get(SECRETS, i.secret, i.namespace)),
    ("webhook-self-managed-namespace", "secrets", "update"): lambda i: _absent_ok(
        wh(i).replace(SECRETS, _secret(i.namespace, i.secret, update=True))),
    # the chart's pre-delete hook (gate.cli.manifests.remove_webhook_configurations)
    ("pre-delete", "validatingwebhookconfigurations", "delete"): lambda i: _both(
        i, lambda res: _absent_ok(hook(i).delete(res, i.configuration, missing_ok=False))),
}


async def _both(ids: Identities, call: Callable[[Resource], Awaitable[Any]]) -> None:
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        await call(res)


# Which role object holds each rule set, and whose rules come first in it.
def _role_of(rule_set: str, ids: Identities) -> tuple[Obj, int]:
    p, ns = ids.prefix, ids.namespace
    where = {
        "operator-cluster": ("ClusterRole", f"{p}-operator", None, 0),
        "operator-namespace": ("Role", f"{p}-operator", ns, 0),
        "operator-events": ("Role", f"{p}-operator-events", rbac.EVENTS_NAMESPACE, 0),
        "webhook-cluster": ("ClusterRole", f"{p}-webhook", None, 0),
        "webhook-namespace": ("Role", f"{p}-webhook-pods", ns, 0),
        "webhook-self-managed-cluster": ("ClusterRole", f"{p}-webhook", None, len(rbac.WEBHOOK_CLUSTER_RULES)),
        "webhook-self-managed-namespace": ("Role", f"{p}-webhook-certs", ns, 0),
        "pre-delete": ("ClusterRole", f"{p}-pre-delete", None, 0),
    }
    kind, name, namespace, offset = where[rule_set]
    [role] = [o for o in ids.objects if o["kind"] == kind and o["metadata"]["name"] == name
              and o["metadata"].get("namespace") == namespace]
    return role, offset


def _cases() -> list[tuple[str, int, str]]:
    return [(name, index, verb) for name, rules in rbac.RULE_SETS.items()
            for index, rule in enumerate(rules) for verb in rule.verbs]


async def _refused(call: Call, ids: Identities) -> bool:
    try:
        await call(ids)
        return False
    except ApiError as exc:
        if exc.status == 403:
            return True
        raise


async def _until(want_refused: bool, call: Call, ids: Identities, what: str, timeout: float = 20.0) -> None:
    # RBAC changes reach the API server's authorizer through its informers: a moment, not at once
    deadline = time.monotonic() + timeout
    while await _refused(call, ids) != want_refused:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {'allowed' if want_refused else 'refused'} after {timeout:.0f}s")
        await asyncio.sleep(0.05)


@pytest.fixture
async def identities(kube: KubeClient) -> AsyncIterator[Identities]:
    ns, prefix = unique("rbac-probe"), unique("probe")
    configuration, secret = unique("probe-config"), unique("probe-tls")
    objects = [*rbac.operator_rbac(ns, prefix=prefix),
               *rbac.webhook_rbac(ns, prefix=prefix, configuration_name=configuration, secret_name=secret),
               *rbac.pre_delete_rbac(ns, prefix=prefix, configuration_name=configuration)]
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    clients: dict[str, KubeClient] = {}
    try:
        for obj in objects:
            await kube.apply(obj, field_manager="test")
        for component in ("operator", "webhook", "pre-delete"):
            request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": 3600}}
            token = await kube.create(SERVICEACCOUNTS, request, ns, subresource_of=f"{prefix}-{component}",
                                      subresource="token")
            clients[component] = kube.with_token(token["status"]["token"])
        yield Identities(ns, prefix, configuration, secret, kube, clients, objects)
    finally:
        for client in clients.values():
            await client.close()
        for obj in objects:
            meta = obj["metadata"]
            await kube.delete(resource_for(obj), meta["name"], meta.get("namespace"))
        await kube.delete(NAMESPACES, ns)


def test_every_verb_of_every_rule_has_a_probe() -> None:
    have = set(PROBES)
    want = {(name, rbac.RULE_SETS[name][index].resources[0], verb) for name, index, verb in _cases()}
    assert want == have, f"rules without a probe: {want - have}; probes without a rule: {have - want}"


async def test_removing_any_one_verb_of_any_rule_gets_its_call_refused(identities: Identities) -> None:
    ids = identities
    for name, index, verb in _cases():
        rule = rbac.RULE_SETS[name][index]
        call = PROBES[(name, rule.resources[0], verb)]
        label = f"{name}: {rule.resources} {verb} ({rule.why})"
        await _until(False, call, ids, f"with every rule, {label}")
        role, offset = _role_of(name, ids)
        reduced = copy.deepcopy(role)
        verbs = [v for v in reduced["rules"][offset + index]["verbs"] if v != verb]
        if verbs:
            reduced["rules"][offset + index]["verbs"] = verbs
        else:
            del reduced["rules"][offset + index]
        await ids.admin.apply(reduced, field_manager="test")
        try:
            await _until(True, call, ids, f"without {label}")
        finally:
            await ids.admin.apply(role, field_manager="test")
        await _until(False, call, ids, f"with {label} back")


async def test_named_rules_reach_only_their_names(identities: Identities) -> None:
    """resourceNames narrow the certificate and cleanup rules to NodeGate's own objects."""
    ids = identities
    other = unique("someone-elses")
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        await _until(False, lambda i, r=res: _absent_ok(wh(i).get(r, i.configuration)), ids, "own configuration")
        assert await _refused(lambda i, r=res: wh(i).get(r, other), ids)
        assert await _refused(lambda i, r=res: hook(i).delete(r, other, missing_ok=False), ids)
    assert await _refused(lambda i: wh(i).get(SECRETS, other, i.namespace), ids)
    # the operator reads its own signing key and no other Secret
    assert await _refused(lambda i: op(i).get(SECRETS, other, i.namespace), ids)
    assert await _refused(lambda i: op(i).get(SECRETS, i.secret, i.namespace), ids)
    # the operator may create Events only where Kubernetes keeps those of Nodes and NodeGates
    assert await _refused(lambda i: op(i).create(EVENTS, _event(i.namespace), dry_run=True), ids)
    # stage pods are bare pods: the operator may neither create nor read Jobs, here or anywhere
    assert await _refused(lambda i: op(i).create(JOBS, _job(i.namespace), dry_run=True), ids)
    assert await _refused(lambda i: op(i).list(JOBS, i.namespace), ids)
    assert await _refused(lambda i: op(i).list(JOBS), ids)
    # ... nor create pods outside its namespace (package pods never leave it)
    assert await _refused(lambda i: op(i).create(PODS, _stage_pod("default"), dry_run=True), ids)
    # package pods' ServiceAccount has no rules and no mounted token
    [package_sa] = [o for o in ids.objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith(
        "-package")]
    assert package_sa["automountServiceAccountToken"] is False
