"""Package images pinned by digest for a rollout, on the real control plane with the real registry.

The session's operator runs with resolution off (the simulated nodes' images are served by no
registry); this module runs it with `--resolve-digests true` and puts the session's back afterwards.
Its package images live in the dev cluster's own registry (distribution), pushed by this test through
the registry API: a small OCI manifest and its config blob per content, under a repository of the
test's own. kwok pulls nothing, so what the tests read is what the operator asked for: each stage
pod's payload image and pull policy, recorded by a watch of our own as the pods are created.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.images import ImageResolver
from gate.controller.metrics import OperatorMetrics
from gate.controller.rbac import OPERATOR_SERVICE_ACCOUNT
from gate.controller.settings import OperatorSettings
from gate.devcluster import registry
from gate.devcluster.cluster import DevCluster
from gate.devcluster.services import start_operator
from gate.devcluster.stages import failing_stage
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, PODS, ROLEBINDINGS, ROLES, SECRETS, KubeClient
from tests.conftest import unique
from tests.integration.operator.conftest import NAMESPACE, OPERATOR_FLAGS, Scenario, wait_for
from tests.unit.controller.test_registry_client import DIGEST, Registry, serve

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def _request(url: str, method: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, method=method,
                                 headers=headers or {})
    return urllib.request.urlopen(req, timeout=10)


def upload_blob(port: int, repository: str, data: bytes) -> str:
    """Upload a blob to the repository (a monolithic upload); return its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _request(f"http://127.0.0.1:{port}/v2/{repository}/blobs/uploads/", "POST") as started:
        location = urllib.parse.urljoin(f"http://127.0.0.1:{port}", started.headers["Location"])
    separator = "&" if "?" in location else "?"
    with _request(f"{location}{separator}digest={digest}", "PUT", data,
                  {"Content-Type": "application/octet-stream"}) as done:
        assert done.status == 201
    return digest


def put_manifest(port: int, repository: str, tag: str, manifest: bytes) -> str:
    """Put an OCI manifest under `tag`; return its digest (checked against the bytes sent)."""
    with _request(f"http://127.0.0.1:{port}/v2/{repository}/manifests/{tag}", "PUT", manifest,
                  {"Content-Type": OCI_MANIFEST}) as put:
        assert put.status == 201
        digest = str(put.headers["Docker-Content-Digest"])
    assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()
    return digest


def push(port: int, repository: str, tag: str, content: str) -> str:
    """Push a config blob holding `content` and a manifest naming it under `tag`; return the manifest's digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"content": content}},
                         "rootfs": {"type": "layers", "diff_ids": []}}, sort_keys=True).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": upload_blob(port, repository, config),
                                      "size": len(config)},
                           "layers": []}).encode()
    return put_manifest(port, repository, tag, manifest)


@dataclass
class Pulls:
    """Every stage pod created, as created: its node, the version its agent runs, its payload images and
    the images of its other containers (NodeGate's agent)."""

    pods: dict[str, Obj] = field(default_factory=dict)

    def on_event(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        if kind == "DELETED" or name in self.pods:
            return
        spec = pod["spec"]
        containers = [*(spec.get("initContainers") or []), *spec["containers"]]
        payloads = {c["name"].removeprefix("payload-"): (c["image"], c.get("imagePullPolicy"))
                    for c in containers if c["name"].startswith("payload-")}
        versions = {c["args"][c["args"].index("--version") + 1] for c in containers if "--version" in c.get("args", [])}
        agents = {c["image"] for c in containers if not c["name"].startswith("payload-")}
        self.pods[name] = {"gate": (meta.get("annotations") or {}).get("nodegate.io/gate-name"),
                           "node": spec.get("nodeName"), "payloads": payloads, "versions": versions,
                           "agents": agents}

    def of(self, gate: str) -> list[Obj]:
        return [p for p in self.pods.values() if p["gate"] == gate and p["payloads"]]


@pytest.fixture(scope="module")
def resolving_operator(cluster: DevCluster, operator: int) -> Iterator[int]:
    """The session's operator, started again with resolution on; put back as it was afterwards."""
    cluster.stop_process("operator")
    flags = [*OPERATOR_FLAGS, "--resolve-digests", "true", "--resolve-timeout", "5"]
    try:
        yield start_operator(cluster, lambda m: None, extra=flags)
    finally:
        cluster.stop_process("operator")
        start_operator(cluster, lambda m: None, extra=OPERATOR_FLAGS)


@pytest.fixture(scope="module")
def registry_port(cluster: DevCluster) -> int:
    return registry.start_registry(cluster.procs, lambda m: None)


@pytest.fixture
async def pulls(kube: KubeClient) -> AsyncIterator[Pulls]:
    seen = Pulls()
    watch = WatchCache(kube, PODS, namespace=NAMESPACE, label_selector=f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}")
    watch.subscribe(seen.on_event)
    await watch.start()
    for pod in watch.items():
        seen.on_event("ADDED", pod)
    yield seen
    await watch.stop()


def images_of(gate: Obj) -> dict[str, Obj]:
    return {r["package"]: r for r in (gate.get("status") or {}).get("images") or []}


async def rolled_out(scenario: Scenario, package: str, digest: str, *, complete: int) -> None:
    """Wait until the gate's current generation records `digest` for `package` and counts `complete` nodes."""
    async def reached() -> bool:
        g = await scenario.gate()
        return (images_of(g).get(package, {}).get("digest") == digest
                and (g.get("status") or {}).get("nodes", {}).get("complete") == complete
                and g["status"].get("observedGeneration") == g["metadata"]["generation"])

    await wait_for(reached, what=f"{package} at {digest} on {complete} node(s)")


async def test_a_rollout_pulls_one_digest_on_every_node_though_the_tag_moves_and_a_new_version_resolves_again(
        resolving_operator: int, registry_port: int, scenario: Scenario, pulls: Pulls) -> None:
    repo = f"nodegate-test/{scenario.name}"
    image = f"127.0.0.1:{registry_port}/{repo}"
    first = push(registry_port, repo, "1.0.0", "first")
    await scenario.add_nodes(1)
    await scenario.apply_gate({"pkg": {"version": "1.0.0", "image": image}}, interruptionBudget={"count": 1})
    gate = await scenario.wait_ready()
    record = images_of(gate)["pkg"]
    assert (record["reference"], record["digest"]) == (f"{image}:1.0.0", first)
    conditions = {c["type"]: c for c in gate["status"]["conditions"]}
    assert conditions["ImagesResolved"]["status"] == "True"

    # The tag is pushed again with other content; nodes that join the same rollout get the recorded digest.
    moved = push(registry_port, repo, "1.0.0", "pushed again")
    assert moved != first and registry.manifest_digest(registry_port, repo, "1.0.0") == moved
    await scenario.add_nodes(2, start=1)

    async def all_complete() -> bool:
        return all([await scenario.node_status(n) == "complete" for n in scenario.nodes])

    await wait_for(all_complete, what="the nodes that joined complete")
    gate = await scenario.wait_ready()
    assert images_of(gate)["pkg"]["digest"] == first
    pods = pulls.of(scenario.name)
    assert {p["node"] for p in pods} == set(scenario.nodes)
    assert {p["payloads"]["pkg"] for p in pods} == {(f"{image}@{first}", "IfNotPresent")}

    # A new version is resolved again, and its pods pull its digest.
    second = push(registry_port, repo, "1.1.0", "second version")
    await scenario.apply_gate({"pkg": {"version": "1.1.0", "image": image}}, interruptionBudget={"count": 1})

    await rolled_out(scenario, "pkg", second, complete=3)
    gate = await scenario.wait_ready()
    assert images_of(gate)["pkg"]["reference"] == f"{image}:1.1.0"
    upgrades = [p for p in pulls.of(scenario.name) if "1.1.0" in p["versions"]]
    assert {p["node"] for p in upgrades} == set(scenario.nodes)
    assert {p["payloads"]["pkg"] for p in upgrades} == {(f"{image}@{second}", "IfNotPresent")}


async def test_an_image_that_does_not_resolve_holds_the_rollout_and_says_which(
        resolving_operator: int, registry_port: int, scenario: Scenario, pulls: Pulls, kube: KubeClient) -> None:
    repo = f"nodegate-test/{scenario.name}"
    image = f"127.0.0.1:{registry_port}/{repo}"
    await scenario.add_nodes(2)
    await scenario.apply_gate({"pkg": {"version": "2.0.0", "image": image}}, interruptionBudget={"count": 1})
    gate = await scenario.wait_condition("ImagesResolved", "False")
    condition = {c["type"]: c for c in gate["status"]["conditions"]}["ImagesResolved"]
    assert condition["reason"] == "ResolveFailed"
    assert f"{image}:2.0.0" in condition["message"] and "HTTP 404" in condition["message"]
    assert f"registry 127.0.0.1:{registry_port}" in condition["message"]
    held = {c["type"]: c for c in gate["status"]["conditions"]}
    assert (held["Ready"]["status"], held["Degraded"]["status"]) == ("False", "True")
    assert gate["status"]["status"] == "Degraded"
    assert "pkg" not in images_of(gate)
    # Nothing started anywhere: no stage pod, and no node in a round.
    assert pulls.of(scenario.name) == []
    for node in scenario.nodes:
        assert (await scenario.state(node)).get("status") != "in-progress"

    async def warned() -> bool:
        items, _ = await kube.list(EVENTS, "default")
        return any(e.get("reason") == "ResolveFailed" and (e.get("regarding") or {}).get("name") == scenario.name
                   and f"{image}:2.0.0" in e.get("note", "") for e in items)

    await wait_for(warned, what="a Warning Event naming the image")

    # Once the tag exists, a retry (with backoff) resolves it and the rollout goes on, by digest.
    digest = push(registry_port, repo, "2.0.0", "late")
    gate = await scenario.wait_ready()
    assert images_of(gate)["pkg"]["digest"] == digest
    assert {c["type"]: c for c in gate["status"]["conditions"]}["ImagesResolved"]["status"] == "True"
    assert {p["payloads"]["pkg"] for p in pulls.of(scenario.name)} == {(f"{image}@{digest}", "IfNotPresent")}


async def test_pull_credentials_come_from_a_pull_secret_the_operator_was_granted_by_name(
        cluster: DevCluster, operator: int, kube: KubeClient) -> None:
    """As the operator's ServiceAccount, against the real API server: with the chart's RBAC it reads no
    Secret, so a registry that wants credentials refuses, and the message names the Secret it could not
    read; with `get` on that one Secret by name (docs/security.md), the Bearer token is fetched with its
    credentials and the tag resolves. The registry is the test's own (the dev registry serves
    anonymously): it asks for a Bearer token that only robot:pw gets."""
    served = Registry(auth="bearer")
    runner = await serve(served)
    name = unique("pull")
    host = served.base.removeprefix("http://")
    config = {"auths": {host: {"auth": base64.b64encode(b"robot:pw").decode()}}}
    await kube.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
                                "metadata": {"name": name, "namespace": NAMESPACE},
                                "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}},
                      NAMESPACE)
    gate = NodeGate.model_validate({"metadata": {"name": name}, "spec": {"packages": {"pkg": {
        "version": "1.0.0", "image": f"{host}/team/pkg", "imagePullSecrets": [{"name": name}]}}}})
    as_operator = await KubeClient.from_kubeconfig(str(cluster.dir / "operator.kubeconfig"))
    resolver = ImageResolver(OperatorSettings(namespace=NAMESPACE, resolve_timeout=5), as_operator,
                             OperatorMetrics())
    try:
        records, problems = await resolver.resolve(gate)
        assert records == []
        assert f"pull Secret {NAMESPACE}/{name} not read (403 Forbidden)" in problems["pkg"]
        assert "refused a pull token (without credentials) (HTTP 401)" in problems["pkg"]
        assert f"{host}/team/pkg:1.0.0" in problems["pkg"]

        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [name]}]}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": NAMESPACE},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SERVICE_ACCOUNT, "namespace": NAMESPACE}]}
        await kube.create(ROLES, role, NAMESPACE)
        await kube.create(ROLEBINDINGS, binding, NAMESPACE)

        async def resolved() -> bool:  # RBAC changes reach the authorizer within moments
            records, problems = await resolver.resolve(gate)
            return [(r.package, r.reference, r.digest) for r in records] == [("pkg", f"{host}/team/pkg:1.0.0",
                                                                             DIGEST)] and not problems

        await wait_for(resolved, what="the tag resolved with the granted pull Secret")
        basic = "Basic " + base64.b64encode(b"robot:pw").decode()
        assert f"token test-registry repository:team/pkg:pull {basic}" in served.seen
    finally:
        await as_operator.close()
        await runner.cleanup()
        for resource in (ROLEBINDINGS, ROLES, SECRETS):
            await kube.delete(resource, name, NAMESPACE)


async def test_a_roll_back_pulls_the_previous_versions_digest_recorded_beside_the_failed_ones(
        resolving_operator: int, registry_port: int, scenario: Scenario, pulls: Pulls) -> None:
    repo, extra_repo = f"nodegate-test/{scenario.name}", f"nodegate-test/{scenario.name}-extra"
    image, extra = f"127.0.0.1:{registry_port}/{repo}", f"127.0.0.1:{registry_port}/{extra_repo}"
    first, second = push(registry_port, repo, "1.0.0", "first"), push(registry_port, repo, "2.0.0", "second")
    push(registry_port, extra_repo, "0.1.0", "extra")
    [node] = await scenario.add_nodes(1)
    policy = f"{scenario.name}-p"
    scenario.policies.append(policy)
    await scenario.kube.apply({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                               "metadata": {"name": policy}, "spec": {"default": {"budget": {"count": 1},
                                                                                  "rollback": True}}},
                              field_manager="test", force=True)
    await scenario.apply_gate({"pkg": {"version": "1.0.0", "image": image}}, deploymentPolicy=policy)
    await scenario.wait_ready()
    # The new spec: pkg 2.0.0 and a new package whose apply fails on the node, so the batch goes back.
    await scenario.inject(failing_stage("fail", nodes=[node], package="extra", stage="apply"))
    await scenario.apply_gate({"pkg": {"version": "2.0.0", "image": image},
                               "extra": {"version": "0.1.0", "image": extra, "retries": 0}}, deploymentPolicy=policy)

    async def back() -> bool:
        state = await scenario.state(node)
        return bool((state.get("rollback") or {}).get("done"))

    await wait_for(back, timeout=120, what="the node rolled back")
    assert (await scenario.state(node))["installed"]["pkg"]["version"] == "1.0.0"
    # While the compartment stays rolled back, the status records both of pkg's images, each by digest.
    records = {(r["package"], r["reference"]): r["digest"] for r in (await scenario.gate())["status"]["images"]}
    assert records[("pkg", f"{image}:1.0.0")] == first and records[("pkg", f"{image}:2.0.0")] == second
    # Each round pulled its own version's digest: forward 2.0.0, back 1.0.0; never a tag.
    pkg_pods = [p for p in pulls.of(scenario.name) if "pkg" in p["payloads"]]
    forward = {p["payloads"]["pkg"] for p in pkg_pods if "2.0.0" in p["versions"]}
    backward = {p["payloads"]["pkg"] for p in pkg_pods if "1.0.0" in p["versions"] and "2.0.0" not in p["versions"]}
    assert forward == {(f"{image}@{second}", "IfNotPresent")}, pkg_pods
    assert (f"{image}@{first}", "IfNotPresent") in backward and all("@sha256:" in i for i, _ in backward), pkg_pods
