"""No way into a running stage pod: exec, attach and port-forward into NodeGate's pods are refused by
admission, for every identity, cluster admins included (issue 33, item 2).

The attacker is an on-call engineer allowed `get pods` and `create` (and `get`) on pods/exec,
pods/attach and pods/portforward in the operator's namespace, as many clusters grant on-call
engineers. The targets are pods shaped as stage pods (privileged, hostPID, the host's root mounted),
created by an admin in the operator's namespace on a kwok node: one labelled as a stage pod (kwok
ends it within a second, as it ends every stage pod; admission does not look at the phase), and one
with the host access alone, which kwok keeps running for `kubectl exec` (which refuses a pod that
ended before it asks the server). kwok serves no exec at all: a refusal at admission (the webhook's
message, naming the pod) comes before the API server contacts any kubelet, so it proves the point; a
request admission lets through fails later, differently, and the tests assert it is not the
admission refusal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

NS = "nodegate-system"
ROLES = REPO / "config" / "rbac" / "package-user.yaml"
REFUSED = 'admission webhook "stage-pod-connect.validate.nodegate.io" denied the request'


def _pod(name: str, node: str, *, host: bool, stage: bool = False) -> str:
    spec: dict[str, object] = {"nodeName": node, "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                               "containers": [{"name": "agent", "image": "ghcr.io/nodegate/nodegate:0.1.0"}]}
    labels = {}
    if stage:
        labels = {"app.kubernetes.io/managed-by": "nodegate", "nodegate.io/gate": unique("no-such-gate"),
                  "nodegate.io/node": node, "nodegate.io/stage": "stages"}
    if host:
        spec.update(hostPID=True, volumes=[{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}])
        spec["containers"] = [{"name": "agent", "image": "ghcr.io/nodegate/nodegate:0.1.0",
                               "securityContext": {"privileged": True},
                               "volumeMounts": [{"name": "host", "mountPath": "/host"}]}]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec})


@pytest.fixture
def pods(kubectl: Kubectl, webhook: Webhook) -> Iterator[tuple[str, str, str]]:
    """(a labelled stage pod, a running pod with a stage pod's host access, a plain running pod) on a kwok
    node in the operator's namespace, all named ng-*."""
    node = kubectl.run("get", "nodes", "-l", "nodegate.dev/pool=test", "-o",
                       "jsonpath={.items[0].metadata.name}").stdout
    stage, host, plain = unique("ng-sec-stage"), unique("ng-sec-host"), unique("ng-sec-plain")
    kubectl.apply(_pod(stage, node, host=True, stage=True))
    kubectl.apply(_pod(host, node, host=True))
    kubectl.apply(_pod(plain, node, host=False))
    kubectl.run("wait", "-n", NS, "--for=jsonpath={.status.phase}=Running", f"pod/{host}", f"pod/{plain}",
                "--timeout=60s")
    try:
        yield stage, host, plain
    finally:
        kubectl.run("delete", "pod", "-n", NS, stage, host, plain, "--grace-period=0", "--force",
                    "--ignore-not-found", check=False)


@pytest.fixture
def oncall(kubectl: Kubectl) -> Iterator[str]:
    """A user allowed get pods and exec, attach and port-forward in the operator's namespace."""
    user, role = unique("oncall"), unique("sec-oncall")
    kubectl.apply(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role, "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                  {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"],
                   "verbs": ["get", "create"]}]}))
    kubectl.run("create", "rolebinding", role, "-n", NS, f"--role={role}", f"--user={user}")
    try:
        yield user
    finally:
        kubectl.run("delete", "rolebinding,role", role, "-n", NS, "--ignore-not-found", check=False)


def _raw(kubectl: Kubectl, user: str | None, pod: str, sub: str) -> str:
    """POST to the pod's connect subresource as `user` (None: the cluster admin), without asking for an
    upgrade: admission runs before any stream is opened, so what comes back is its refusal or, past
    admission, the API server's "Upgrade request required"."""
    query = {"exec": "?command=true&stdout=true", "attach": "?stdout=true", "portforward": "?ports=80"}[sub]
    proc = kubectl.run("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{pod}/{sub}{query}", "-f", "/dev/null",
                       as_user=user, check=False)
    assert proc.returncode != 0, f"{sub} into {pod} streamed: kwok serves none, so nothing can"
    return proc.stderr + proc.stdout


def test_exec_attach_and_port_forward_into_a_stage_pod_are_refused_to_on_call_and_to_cluster_admins(
        kubectl: Kubectl, pods: tuple[str, str, str], oncall: str) -> None:
    stage, host, plain = pods
    for user in (oncall, None):
        for pod in (stage, host):
            for sub in ("exec", "attach", "portforward"):
                out = _raw(kubectl, user, pod, sub)
                assert REFUSED in out and f"pod {NS}/{pod}" in out, (user, sub, out)
                assert ("by a wildcard" in out) if user is None else ('"exec-stage-pods"' in out), out
        # the same on the plain pod: admission lets it through, and the API server goes on to open the
        # stream (which a plain POST cannot upgrade)
        for sub in ("exec", "attach", "portforward"):
            out = _raw(kubectl, user, plain, sub)
            assert "denied the request" not in out and "Upgrade request required" in out, (user, sub, out)
    # and as people do it: kubectl exec, by the on-call engineer and by the admin
    for user in (oncall, None):
        proc = kubectl.run("exec", "-n", NS, host, "--", "id", as_user=user, check=False)
        assert proc.returncode != 0 and host in proc.stderr and "denied the request" in proc.stderr, proc.stderr
    assert kubectl.run("get", "pod", "-n", NS, host, "-o", "jsonpath={.status.phase}").stdout == "Running"


def test_the_break_glass_verb_by_name_lets_one_in_and_leaves_an_event(
        kubectl: Kubectl, pods: tuple[str, str, str], oncall: str) -> None:
    stage, _, _ = pods
    kubectl.run("apply", "-f", str(ROLES))
    binding = unique("sec-glass")
    kubectl.run("create", "clusterrolebinding", binding, "--clusterrole=nodegate-stage-pod-exec", f"--user={oncall}")
    try:
        deadline = time.monotonic() + 60  # RBAC informers, and the webhook's 10 s cache of the first denial
        while REFUSED in (out := _raw(kubectl, oncall, stage, "exec")):
            assert time.monotonic() < deadline, out
            time.sleep(0.5)
        # past admission: the API server went on to open the stream, which a plain POST cannot upgrade
        assert "denied the request" not in out and "Upgrade request required" in out, out
        events = json.loads(kubectl.run("get", "events.events.k8s.io", "-n", NS, "-o", "json").stdout)["items"]
        mine = [e for e in events if e.get("regarding", {}).get("name") == stage and e["reason"] == "BreakGlassExec"]
        assert mine, "no BreakGlassExec Event on the pod"
        assert mine[0]["type"] == "Warning" and f'"{oncall}"' in mine[0]["note"] and stage in mine[0]["note"]
    finally:
        kubectl.run("delete", "clusterrolebinding", binding, "--ignore-not-found", check=False)
