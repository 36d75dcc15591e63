"""The dev control plane is real: a real API server, real controllers, kwok as the kubelet."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate.devcluster.cluster import DevCluster, NodeSpec, node_manifest
from gate.kube.client import JOBS, NODES, PDBS, PODS, KubeClient
from gate.kube.errors import TooManyRequests
from tests.conftest import Kubectl, unique


def test_server_reports_the_pinned_kubernetes_release(kubectl: Kubectl) -> None:
    from gate.devcluster.build import load_components

    version = json.loads(kubectl.run("version", "-o", "json").stdout)
    expected = load_components()["kubernetes"].version
    assert version["serverVersion"]["gitVersion"] == expected
    assert version["clientVersion"]["gitVersion"] == expected


def test_simulated_nodes_turn_ready(kubectl: Kubectl) -> None:
    nodes = json.loads(kubectl.run("get", "nodes", "-l", "nodegate.dev/pool=test", "-o", "json").stdout)["items"]
    assert len(nodes) == 10
    ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])]
    assert len(ready) == 10
    assert all(n["status"]["nodeInfo"]["bootID"] for n in nodes)


def test_get_nodegates_shows_printer_columns(kubectl: Kubectl) -> None:
    name = unique("columns")
    kubectl.apply(f"""
apiVersion: nodegate.io/v1alpha1
kind: DeploymentPolicy
metadata: {{name: {name}-policy}}
spec:
  default: {{budget: {{percent: 10}}, strategy: {{fixed: {{initialBatch: 1}}}}}}
---
apiVersion: nodegate.io/v1alpha1
kind: NodeGate
metadata: {{name: {name}}}
spec:
  nodeSelector: {{matchLabels: {{nothing: selects-this}}}}
  deploymentPolicy: {name}-policy
  packages:
    tuning: {{version: 1.0.0, image: example.com/tuning}}
""")
    try:
        out = kubectl.run("get", "ng", name).stdout
        header = out.splitlines()[0].split()
        assert header[:2] == ["NAME", "STATUS"]
        for column in ("COMPLETE", "IN", "PROGRESS", "FAILED", "POLICY", "AGE"):
            assert column in header
        assert f"{name}-policy" in out.splitlines()[1]
        # the short name of the other kind resolves too
        assert kubectl.run("get", "dp", check=False).returncode == 0
    finally:
        kubectl.run("delete", "ng", name)
        kubectl.run("delete", "dp", f"{name}-policy")


# Every name kubectl knows each kind by: `kubectl get nodegate NAME` once failed with "you must specify
# only one resource", because the kinds' category was `nodegate` too (it is `nodegate-all` now).
NAMES = {"NodeGate": ("nodegate", "nodegates", "ng", "nodegates.nodegate.io"),
         "DeploymentPolicy": ("deploymentpolicy", "deploymentpolicies", "dp", "deploymentpolicies.nodegate.io")}


def _objects(name: str, count: int) -> str:
    docs = []
    for i in range(count):
        docs.append(f"""apiVersion: nodegate.io/v1alpha1
kind: DeploymentPolicy
metadata: {{name: {name}-{i}}}
spec:
  default: {{budget: {{count: 1}}}}
---
apiVersion: nodegate.io/v1alpha1
kind: NodeGate
metadata: {{name: {name}-{i}}}
spec:
  nodeSelector: {{matchLabels: {{nothing: selects-this}}}}
  packages:
    tuning: {{version: 1.0.0, image: example.com/tuning}}
""")
    return "---\n".join(docs)


def test_everyday_kubectl_verbs_work_by_singular_plural_and_short_name(kubectl: Kubectl, tmp_path: Path) -> None:
    name = unique("verbs")
    # A fresh discovery cache: kubectl would otherwise answer from what it cached of earlier CRDs.
    cache = ("--cache-dir", str(tmp_path / "kube-cache"))
    kubectl.apply(_objects(name, 4))
    try:
        for kind, names in NAMES.items():
            for resource in names:
                got = kubectl.run(*cache, "get", resource, f"{name}-0", "-o", "name")
                assert got.stdout.strip() == f"{kind.lower()}.nodegate.io/{name}-0", (resource, got.stdout)
                described = kubectl.run(*cache, "describe", resource, f"{name}-0").stdout
                assert re.search(rf"^Kind:\s+{kind}$", described, re.M), (resource, described)
                assert re.search(rf"^Name:\s+{name}-0$", described, re.M), (resource, described)
        listed = kubectl.run(*cache, "get", "nodegate-all", "-o", "name").stdout.split()
        for i in range(4):
            assert {f"nodegate.nodegate.io/{name}-{i}", f"deploymentpolicy.nodegate.io/{name}-{i}"} <= set(listed)
        # Delete each object by another of its kind's names.
        for kind, names in NAMES.items():
            for i, resource in enumerate(names):
                deleted = kubectl.run(*cache, "delete", resource, f"{name}-{i}", "--wait=false")
                assert f'{kind.lower()}.nodegate.io "{name}-{i}" deleted' in deleted.stdout, (resource, deleted.stdout)
    finally:
        for plural in ("nodegates", "deploymentpolicies"):
            kubectl.run("delete", f"{plural}.nodegate.io", *(f"{name}-{i}" for i in range(4)),
                        "--ignore-not-found", "--wait=false", check=False)


def _causes(stderr: str) -> list[str]:
    """The `field: reason` causes of kubectl's "is invalid" error: one inline, or several as a list."""
    _, _, rest = stderr.partition(" is invalid: ")
    # Kubernetes 1.34 and older print a CEL rule's value as its type ("object") before the message;
    # 1.35 leaves it out (`make test-matrix` runs this on both).
    rest = rest.replace('Invalid value: "object": ', "Invalid value: ")
    if rest.startswith("\n"):
        return [line[2:] for line in rest.splitlines() if line.startswith("* ")]
    return [rest.strip()] if rest.strip() else []


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ("interruptionBudget: {percent: 10, count: 2}\n  packages: {}",
         "spec.interruptionBudget", "exactly one of percent or count must be set"),
        # a rule on the spec object itself: the API server names `spec`, no deeper field
        ("interruptionBudget: {percent: 10}\n  deploymentPolicy: p\n  packages: {}",
         "spec", "set at most one of deploymentPolicy and interruptionBudget"),
        ("packages:\n    Bad_Name: {version: 1.0.0, image: x}", "spec.packages",
         "package name Bad_Name must match ^[a-z][-a-z0-9]{0,41}[a-z]$ (lowercase letters, digits and '-', "
         "2 to 43 characters)"),
        ("packages:\n    good-one: {version: 1.0.0, image: x}\n    Bad_Name: {version: 1.0.0, image: x}",
         "spec.packages", "package name Bad_Name must match ^[a-z][-a-z0-9]{0,41}[a-z]$ (lowercase letters, digits "
         "and '-', 2 to 43 characters)"),
        ("packages:\n    tool: {version: 1.0.0, image: x, interrupt: {type: service}}",
         "spec.packages[tool].interrupt", "an interrupt of type service needs at least one entry in services"),
        ("interruptionBudget: {percent: 150}\n  packages: {}", "spec.interruptionBudget.percent",
         "150: spec.interruptionBudget.percent in body should be less than or equal to 100"),
    ],
)
def test_cel_rule_rejects_bad_nodegate_naming_the_field(kubectl: Kubectl, spec: str, field: str, message: str) -> None:
    name = unique("bad")
    manifest = f"apiVersion: nodegate.io/v1alpha1\nkind: NodeGate\nmetadata: {{name: {name}}}\nspec:\n  {spec}\n"
    proc = kubectl.apply(manifest, check=False)
    assert proc.returncode != 0
    # exactly the one cause this manifest breaks, at its field
    assert _causes(proc.stderr) == [f"{field}: Invalid value: {message}"], proc.stderr


def test_cel_rule_rejects_policy_with_two_strategies(kubectl: Kubectl) -> None:
    name = unique("bad-dp")
    proc = kubectl.apply(f"""
apiVersion: nodegate.io/v1alpha1
kind: DeploymentPolicy
metadata: {{name: {name}}}
spec:
  compartments:
  - name: canary
    selector: {{matchLabels: {{pool: canary}}}}
    budget: {{count: 1}}
    strategy: {{fixed: {{initialBatch: 1}}, linear: {{delta: 1}}}}
""", check=False)
    assert proc.returncode != 0
    assert "spec.compartments[0].strategy" in proc.stderr
    assert "exactly one of fixed, linear or exponential" in proc.stderr


async def test_job_pinned_to_a_simulated_node_completes(kube: KubeClient) -> None:
    name = unique("pinned")
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "nodeName": "kwok-node-3", "restartPolicy": "Never",
            "initContainers": [{"name": "copy", "image": "busybox"}],
            "containers": [{"name": "main", "image": "busybox"}],
        }}},
    }
    await kube.create(JOBS, job)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = await kube.get(JOBS, name, "default")
            conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
            if conds.get("Complete") == "True":
                break
            assert conds.get("Failed") != "True", got["status"]
            await asyncio.sleep(0.2)
        else:
            pytest.fail("the Job did not complete")
        pods, _ = await kube.list(PODS, "default", label_selector=f"job-name={name}")
        assert [p["spec"]["nodeName"] for p in pods] == ["kwok-node-3"]
        assert pods[0]["status"]["phase"] == "Succeeded"
    finally:
        await kube.delete(JOBS, name, "default", body={"propagationPolicy": "Background"})


async def _evict(kube: KubeClient, name: str, namespace: str) -> None:
    await kube.create(PODS, {"apiVersion": "policy/v1", "kind": "Eviction",
                             "metadata": {"name": name, "namespace": namespace}},
                      namespace, subresource_of=name, subresource="eviction")


async def test_eviction_is_refused_by_a_pdb_until_the_disruption_controller_allows_it(kube: KubeClient) -> None:
    app = unique("web")
    ns = "default"

    def pod(i: int) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{app}-{i}", "namespace": ns, "labels": {"app": app}},
                "spec": {"nodeName": f"kwok-node-{i}", "containers": [{"name": "c", "image": "nginx"}]}}

    await kube.create(PODS, pod(1))
    await kube.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                             "metadata": {"name": app, "namespace": ns},
                             "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})
    try:
        # With one healthy pod and minAvailable 1, the budget allows no disruption.
        await _wait_pdb(kube, app, ns, healthy=1)
        with pytest.raises(TooManyRequests) as refused:
            await _evict(kube, f"{app}-1", ns)
        assert "disruption budget" in refused.value.message
        # A second healthy pod lets the disruption controller allow one eviction.
        await kube.create(PODS, pod(2))
        await _wait_pdb(kube, app, ns, healthy=2)
        await _evict(kube, f"{app}-1", ns)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pods, _ = await kube.list(PODS, ns, label_selector=f"app={app}")
            if f"{app}-1" not in {p["metadata"]["name"] for p in pods}:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail("the evicted pod was not deleted")
    finally:
        await kube.delete(PDBS, app, ns)
        for i in (1, 2):
            await kube.delete(PODS, f"{app}-{i}", ns, body={"gracePeriodSeconds": 0})


async def _wait_pdb(kube: KubeClient, name: str, ns: str, *, healthy: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pdb = await kube.get(PDBS, name, ns)
        status = pdb.get("status", {})
        current = status.get("observedGeneration") == pdb["metadata"]["generation"]
        if current and status.get("currentHealthy") == healthy:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"PDB {name} never saw {healthy} healthy pods: {pdb.get('status')}")


async def test_simulated_reboot_gives_the_node_a_new_boot_id(kube: KubeClient) -> None:
    node = "kwok-node-7"
    before = (await kube.get(NODES, node))["status"]["nodeInfo"]["bootID"]
    name = unique("reboot")
    await kube.create(JOBS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"nodegate.io/stage": "interrupt", "nodegate.io/interrupt": "reboot"}},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}},
    })
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = await kube.get(NODES, node)
            ready = [c["status"] for c in got["status"]["conditions"] if c["type"] == "Ready"]
            if got["status"]["nodeInfo"]["bootID"] != before and ready == ["True"]:
                return
            await asyncio.sleep(0.2)
        pytest.fail("the node did not come back with a new bootID")
    finally:
        await kube.delete(JOBS, name, "default", body={"propagationPolicy": "Background"})


def test_dev_up_and_down_from_the_cli_leave_no_process(tmp_path: pytest.TempPathFactory) -> None:
    state = str(tmp_path)
    up = subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "up", "--nodes", "2", "--state-dir", state,
                         "--no-webhook", "--no-operator"], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    kubeconfig = up.stdout.strip().splitlines()[-1]
    dev = DevCluster(tmp_path)  # type: ignore[arg-type]
    assert kubeconfig == str(dev.kubeconfig)
    procs = dev.processes()
    assert set(procs) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kwok"}
    again = subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "up", "--nodes", "2", "--state-dir", state,
                            "--no-webhook", "--no-operator"], capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and "already running" in again.stderr  # idempotent: reused, not restarted
    assert {n: p.pid for n, p in dev.processes().items()} == {n: p.pid for n, p in procs.items()}
    down = subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "down", "--state-dir", state],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    for proc in procs.values():
        assert not proc.alive(), f"{proc.name} (pid {proc.pid}) is still running"
    assert dev.processes() == {}


def test_node_manifest_is_managed_by_kwok() -> None:
    node = node_manifest("n1", {"pool": "a"})
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"]["pool"] == "a"
    assert NodeSpec(3, prefix="x-", start=5).names() == ["x-5", "x-6", "x-7"]
