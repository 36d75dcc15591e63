"""Package pods get host access only in the operator's namespace and only as the operator's own
stage pods: the chart's ValidatingAdmissionPolicy, as shipped in the plain manifests
(operator/host-access-policy.yaml), installed into the real API server for this module.

Every refusal here is made by an identity RBAC allows to create the object (a cluster admin, a
namespace admin, another ServiceAccount given admin, the operator's own ServiceAccount given `edit`
elsewhere): what refuses is the policy. Each refused object is followed by the same object without
host access from the same identity, admitted, and the operator's real stage pods run to the end.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml

from gate.api.common import Obj
from tests.conftest import REPO, Kubectl, unique
from tests.integration.operator.conftest import Scenario, StepLog

NS = "nodegate-system"
OPERATOR = f"system:serviceaccount:{NS}:nodegate-operator"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
POLICY_FILE = REPO / "operator" / "host-access-policy.yaml"
REFUSED_HERE = "is reserved to the NodeGate operator's stage pods"
REFUSED_ELSEWHERE = "runs package pods with host access only in namespace nodegate-system"

TOLERATE_ALL = [{"operator": "Exists"}]


def pod_spec(**host: Any) -> Obj:
    """A pod spec shaped like a stage pod; `host` adds the host access under test."""
    spec: Obj = {"restartPolicy": "Never", "tolerations": TOLERATE_ALL,
                 "containers": [{"name": "agent", "image": "ghcr.io/nodegate/nodegate:0.1.0"}]}
    container = spec["containers"][0]
    if host.get("privileged"):
        container["securityContext"] = {"privileged": True}
    if host.get("capability"):
        container["securityContext"] = {"capabilities": {"add": [host["capability"]]}}
    if host.get("hostPort"):
        container["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    if host.get("hostPath"):
        spec["volumes"] = [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}]
        container["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        if host.get(key):
            spec[key] = True
    if host.get("package"):
        spec["serviceAccountName"] = "nodegate-package"
        spec["automountServiceAccountToken"] = False
    return spec


STAGE_LIKE = {"privileged": True, "hostPID": True, "hostPath": True, "package": True}


def workload(kind: str, name: str, namespace: str, spec: Obj) -> Obj:
    meta = {"name": name, "namespace": namespace}
    labels = {"app": name}
    template = {"metadata": {"labels": labels}, "spec": spec}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                "spec": {"backoffLimit": 0, "template": template}}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
                "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}}
    always = {**spec, "restartPolicy": "Always"}
    body: Obj = {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": always}}
    api = "apps/v1"
    if kind == "ReplicationController":
        api, body = "v1", {"selector": labels, "template": body["template"]}
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": body}


def without_host_access(obj: Obj) -> Obj:
    clean = copy.deepcopy(obj)
    spec = clean["spec"]
    pod = (spec if clean["kind"] == "Pod" else spec["jobTemplate"]["spec"]["template"]["spec"]
           if clean["kind"] == "CronJob" else spec["template"]["spec"])
    for key in ("hostPID", "hostNetwork", "hostIPC", "volumes"):
        pod.pop(key, None)
    for container in pod["containers"]:
        for key in ("securityContext", "ports", "volumeMounts"):
            container.pop(key, None)
    return clean


@pytest.fixture(scope="module")
def host_access_policy(kubectl: Kubectl, operator: int) -> Iterator[None]:
    """The policy of the plain manifests, enforced once the API server refuses a probe with it (the
    operator runs, so its ServiceAccounts, the package one included, exist)."""
    kubectl.run("apply", "-f", str(POLICY_FILE))
    probe = yaml.safe_dump(workload("Pod", unique("probe"), NS, pod_spec(privileged=True)))
    deadline = time.monotonic() + 30
    while True:
        proc = kubectl.run("create", "--dry-run=server", "-f", "-", stdin=probe, check=False)
        if proc.returncode != 0 and REFUSED_HERE in proc.stderr:
            break
        assert time.monotonic() < deadline, f"the policy never took effect: {proc.stderr}"
        time.sleep(0.2)
    yield
    kubectl.run("delete", "-f", str(POLICY_FILE), "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def identities(kubectl: Kubectl, host_access_policy: None) -> Iterator[dict[str, str | None]]:
    """Who tries: a cluster admin (system:masters), a user and another ServiceAccount with `admin` in the
    operator's namespace. Each may create every object below as far as RBAC goes."""
    user = unique("nsadmin")
    binding = unique("sec-admin")
    kubectl.run("create", "rolebinding", binding, "-n", NS, "--clusterrole=admin", f"--user={user}",
                f"--serviceaccount={NS}:nodegate-webhook")
    yield {"cluster admin": None, "namespace admin": user,
           "another ServiceAccount": f"system:serviceaccount:{NS}:nodegate-webhook"}
    kubectl.run("delete", "rolebinding", binding, "-n", NS, "--ignore-not-found", check=False)


OBJECTS = {
    "privileged Pod": ("Pod", {"privileged": True}),
    "hostPath Pod": ("Pod", {"hostPath": True}),
    "hostPID Pod": ("Pod", {"hostPID": True}),
    "hostNetwork Pod": ("Pod", {"hostNetwork": True}),
    "SYS_ADMIN Pod": ("Pod", {"capability": "SYS_ADMIN"}),
    "hostPort Pod": ("Pod", {"hostPort": True}),
    "stage Job look-alike": ("Job", STAGE_LIKE),
    "privileged CronJob": ("CronJob", {"privileged": True}),
    "hostPath Deployment": ("Deployment", {"hostPath": True}),
    "privileged DaemonSet": ("DaemonSet", {"privileged": True}),
    "hostPID StatefulSet": ("StatefulSet", {"hostPID": True}),
    "privileged ReplicationController": ("ReplicationController", {"privileged": True}),
}


def _create(kubectl: Kubectl, obj: Obj, as_user: str | None, *, dry_run: bool = True) -> tuple[int, str]:
    args = ("create", "--dry-run=server", "-f", "-") if dry_run else ("create", "-f", "-")
    proc = kubectl.run(*args, stdin=yaml.safe_dump(obj), as_user=as_user, check=False)
    return proc.returncode, proc.stderr + proc.stdout


@pytest.mark.parametrize("who", ["cluster admin", "namespace admin", "another ServiceAccount"])
def test_host_access_in_the_operators_namespace_is_refused_to_every_other_identity(
        kubectl: Kubectl, identities: dict[str, str | None], who: str) -> None:
    as_user = identities[who]
    refused = []
    for label, (kind, host) in OBJECTS.items():
        obj = workload(kind, unique("sec-host"), NS, pod_spec(**host))
        code, out = _create(kubectl, obj, as_user)
        if code == 0 or REFUSED_HERE not in out:
            refused.append(f"{label}: {out.strip()}")
            continue
        code, out = _create(kubectl, without_host_access(obj), as_user)
        assert code == 0, f"{label} without host access was refused too: {out}"
    assert not refused, "admitted with host access:\n" + "\n".join(refused)


@pytest.fixture
def elsewhere(kubectl: Kubectl, host_access_policy: None) -> Iterator[str]:
    """Another namespace where the operator's ServiceAccount was (wrongly) given `edit`."""
    namespace = unique("sec-elsewhere")
    kubectl.run("create", "namespace", namespace)
    kubectl.run("create", "rolebinding", "operator-edit", "-n", namespace, "--clusterrole=edit",
                f"--serviceaccount={NS}:nodegate-operator")
    yield namespace
    kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_operators_service_account_gets_no_host_access_outside_its_namespace(
        kubectl: Kubectl, elsewhere: str) -> None:
    for kind, host in (("Job", STAGE_LIKE), ("Pod", {"privileged": True}), ("Deployment", {"hostPath": True})):
        obj = workload(kind, unique("sec-out"), elsewhere, pod_spec(**host))
        if host.get("package"):  # the package ServiceAccount does not exist there: use the default one
            obj["spec"]["template"]["spec"].pop("serviceAccountName")
        code, out = _create(kubectl, obj, OPERATOR)
        assert code != 0 and REFUSED_ELSEWHERE in out, out
        code, out = _create(kubectl, without_host_access(obj), OPERATOR)
        assert code == 0, out  # RBAC allowed it: the policy is what refused the host access


def test_other_namespaces_are_left_to_their_own_pod_security(kubectl: Kubectl, elsewhere: str) -> None:
    """The policy evaluates nothing outside NodeGate's namespace but the operator's own requests: a
    privileged DaemonSet of someone else (a CNI, a device plugin) is not NodeGate's to refuse."""
    code, out = _create(kubectl, workload("DaemonSet", unique("cni"), elsewhere, pod_spec(privileged=True,
                                                                                           hostNetwork=True)), None)
    assert code == 0, out


def _stage_pod(name: str, node: str = "kwok-node-0") -> Obj:
    pod = workload("Pod", name, NS, {**pod_spec(**STAGE_LIKE), "nodeName": node})
    pod["spec"]["containers"][0]["command"] = ["nodegate", "agent", "run"]
    return pod


def test_only_the_operator_creates_stage_pods_and_only_running_as_the_package_account(
        kubectl: Kubectl, host_access_policy: None) -> None:
    """The operator's identity alone is not enough: the pod must run as the package ServiceAccount.
    And nothing that makes pods gets host access, not even from the operator: no Job path (a Job's
    pods would come from the job controller, which the policy admits nothing from)."""
    code, out = _create(kubectl, _stage_pod(unique("sec-stagepod")), OPERATOR)
    assert code == 0, out
    other_account = _stage_pod(unique("sec-stagepod"))
    other_account["spec"]["serviceAccountName"] = "default"
    code, out = _create(kubectl, other_account, OPERATOR)
    assert code != 0 and REFUSED_HERE in out, f"default ServiceAccount: {out}"
    job = workload("Job", unique("sec-job"), NS, pod_spec(**STAGE_LIKE))
    code, out = _create(kubectl, job, OPERATOR)
    assert code != 0 and "cannot create resource \"jobs\"" in out, out  # its RBAC has no Jobs
    binding = unique("sec-operator-edit")  # were it given them, the policy would still refuse
    kubectl.run("create", "rolebinding", binding, "-n", NS, "--clusterrole=edit",
                f"--serviceaccount={NS}:nodegate-operator")
    try:
        deadline = time.monotonic() + 30
        while _create(kubectl, without_host_access(job), OPERATOR)[0] != 0:
            assert time.monotonic() < deadline, "the operator was never allowed Jobs by the RoleBinding"
            time.sleep(0.2)
        code, out = _create(kubectl, job, OPERATOR)
        assert code != 0 and REFUSED_HERE in out, f"the operator's Job: {out}"
    finally:
        kubectl.run("delete", "rolebinding", binding, "-n", NS, "--ignore-not-found", check=False)
    from_a_job = _stage_pod(unique("sec-jobpod"))
    from_a_job["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "ng-stage", "controller": True,
         "uid": "00000000-0000-0000-0000-000000000001", "blockOwnerDeletion": True}]
    code, out = _create(kubectl, from_a_job, JOB_CONTROLLER)
    assert code != 0 and REFUSED_HERE in out, f"the job controller's pod for a Job: {out}"


@pytest.fixture
async def stage_pod(kubectl: Kubectl, host_access_policy: None) -> AsyncIterator[str]:
    """A stage pod created as the operator's ServiceAccount on a simulated node."""
    name = unique("sec-stage")
    code, out = _create(kubectl, _stage_pod(name), OPERATOR, dry_run=False)
    assert code == 0, out
    yield name
    kubectl.run("delete", "pod", name, "-n", NS, "--ignore-not-found", "--wait=false", check=False)


def test_a_debug_container_cannot_be_added_to_a_stage_pod(kubectl: Kubectl, stage_pod: str) -> None:
    """`kubectl debug` into a package pod would be a shell on the host: refused, even to a cluster admin."""
    proc = kubectl.run("debug", "-n", NS, f"pod/{stage_pod}", "--image=busybox", "--profile=general", "--", "true",
                       check=False)
    assert proc.returncode != 0 and REFUSED_HERE in proc.stderr, proc.stderr
    ephemeral = json.loads(kubectl.run("get", "pod", stage_pod, "-n", NS, "-o", "json").stdout)["spec"]
    assert not ephemeral.get("ephemeralContainers")


def test_metadata_writes_and_deletion_of_stage_pods_still_work(kubectl: Kubectl, stage_pod: str) -> None:
    """Only writes of a pod spec are judged: labels, annotations and a deletion of a stage pod (by
    identities other than the operator) go through."""
    kubectl.run("label", "pod", stage_pod, "-n", NS, "audited=true")
    kubectl.run("annotate", "pod", stage_pod, "-n", NS, "audited=true")
    kubectl.run("delete", "pod", stage_pod, "-n", NS, "--cascade=foreground", "--grace-period=0", "--force",
                "--timeout=60s")
    assert kubectl.run("get", "pod", stage_pod, "-n", NS, check=False).returncode != 0


async def test_the_operators_stage_pods_run_under_the_policy(scenario: Scenario, step_log: StepLog,
                                                             host_access_policy: None) -> None:
    nodes = await scenario.add_nodes(2)
    await scenario.apply_gate({"tool": {"version": "1.0.0", "image": "registry.example.com/tool",
                                        "interrupt": {"type": "reboot"}}}, interruptionBudget={"percent": 100})
    gate = await scenario.wait_ready()
    assert gate["status"]["nodes"]["complete"] == 2
    records = step_log.of(scenario.name)
    assert {r.node for r in records} == set(nodes)
    assert {(r.stage, r.interrupt) for r in records} == {("apply", None), ("interrupt", "reboot"),
                                                         ("post-interrupt", None)}
    assert all(r.succeeded for r in records)


REFUSED_UPDATE = "(a NodeGate stage pod) cannot be changed after it was created, not even by the operator"

# What the API server lets change in a running pod's spec (besides ephemeral containers, above): each
# would let the pod run other code as the host's root, or run it somewhere or for longer than started.
SPEC_CHANGES: dict[str, Obj] = {
    "container image": {"spec": {"containers": [{"name": "agent", "image": "evil.example.com/rootkit:1"}]}},
    "added toleration": {"spec": {"tolerations": [*TOLERATE_ALL, {"key": "evil", "operator": "Exists"}]}},
    "active deadline": {"spec": {"activeDeadlineSeconds": 86400}},
}


def _patch(kubectl: Kubectl, name: str, patch: Obj, as_user: str | None, subresource: str | None = None
           ) -> tuple[int, str]:
    args = ["patch", "pod", name, "-n", NS, "--type=strategic", "-p", json.dumps(patch)]
    if subresource:
        args.append(f"--subresource={subresource}")
    proc = kubectl.run(*args, as_user=as_user, check=False)
    return proc.returncode, proc.stderr + proc.stdout


def _spec(kubectl: Kubectl, name: str) -> Obj:
    spec: Obj = json.loads(kubectl.run("get", "pod", name, "-n", NS, "-o", "json").stdout)["spec"]
    return spec


@pytest.fixture
def operator_with_edit(kubectl: Kubectl, identities: dict[str, str | None]) -> Iterator[dict[str, str | None]]:
    """The identities above, and the operator's ServiceAccount given `edit` in its namespace: RBAC lets
    every one of them patch pods there, so what refuses below is the policy."""
    binding = unique("sec-operator-edit")
    kubectl.run("create", "rolebinding", binding, "-n", NS, "--clusterrole=edit",
                f"--serviceaccount={NS}:nodegate-operator")
    deadline = time.monotonic() + 30
    while kubectl.run("auth", "can-i", "patch", "pods", "-n", NS, as_user=OPERATOR, check=False).returncode != 0:
        assert time.monotonic() < deadline, "the operator was never allowed to patch pods by the RoleBinding"
        time.sleep(0.2)
    yield {**identities, "the operator": OPERATOR}
    kubectl.run("delete", "rolebinding", binding, "-n", NS, "--ignore-not-found", check=False)


@pytest.mark.parametrize("who", ["cluster admin", "namespace admin", "another ServiceAccount", "the operator"])
def test_a_stage_pods_spec_cannot_be_changed_by_anyone(
        kubectl: Kubectl, stage_pod: str, operator_with_edit: dict[str, str | None], who: str) -> None:
    """The API server allows a running pod's image to be changed: on a stage pod, that would run any
    code privileged on the host. Refused to every identity, the operator's own included; the same
    change of a pod without host access in the namespace, by the same identity, is admitted."""
    as_user = operator_with_edit[who]
    plain = unique("sec-plain")
    _create(kubectl, workload("Pod", plain, NS, {**pod_spec(), "nodeName": "kwok-node-0"}), None, dry_run=False)
    try:
        before = _spec(kubectl, stage_pod)
        admitted = []
        for label, patch in SPEC_CHANGES.items():
            code, out = _patch(kubectl, stage_pod, patch, as_user)
            if code == 0 or REFUSED_UPDATE not in out:
                admitted.append(f"{label}: {out.strip()}")
                continue
            assert f"update of Pod {stage_pod} by {as_user or ''}" in " ".join(out.split()), out
            code, out = _patch(kubectl, plain, patch, as_user)
            assert code == 0, f"{label} of a pod without host access was refused too: {out}"
        assert not admitted, "changed a stage pod's spec:\n" + "\n".join(admitted)
        assert _spec(kubectl, stage_pod) == before
    finally:
        kubectl.run("delete", "pod", plain, "-n", NS, "--ignore-not-found", "--wait=false", check=False)


def test_a_stage_pods_resources_cannot_be_resized(kubectl: Kubectl, host_access_policy: None) -> None:
    """In-place resize (the pods/resize subresource) is a spec change too: refused on a stage pod,
    admitted on the same pod without host access."""
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    resize = {"spec": {"containers": [{"name": "agent", "resources": {
        "requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}]}}
    # Pinned to no node: a pod whose containers run on a kwok node reports no resources in its status,
    # which the API server reads as a node without resize support, and refuses before any policy.
    nowhere = unique("sec-no-node")
    stage, plain = _stage_pod(unique("sec-resize"), nowhere), _stage_pod(unique("sec-resize-plain"), nowhere)
    stage["spec"]["containers"][0]["resources"] = resources
    plain = without_host_access(plain)
    plain["spec"]["containers"][0]["resources"] = resources
    code, out = _create(kubectl, stage, OPERATOR, dry_run=False)
    assert code == 0, out
    code, out = _create(kubectl, plain, None, dry_run=False)
    assert code == 0, out
    try:
        code, out = _patch(kubectl, stage["metadata"]["name"], resize, None, subresource="resize")
        assert code != 0 and REFUSED_UPDATE in out and "refused resize update of Pod" in " ".join(out.split()), out
        assert _spec(kubectl, stage["metadata"]["name"])["containers"][0]["resources"] == resources
        code, out = _patch(kubectl, plain["metadata"]["name"], resize, None, subresource="resize")
        assert code == 0, f"the resize of a pod without host access was refused too: {out}"
    finally:
        for pod in (stage, plain):
            kubectl.run("delete", "pod", pod["metadata"]["name"], "-n", NS, "--ignore-not-found", "--wait=false",
                        check=False)
