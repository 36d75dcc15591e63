"""The chart as an OCI artifact: `helm package`, `helm push` to the dev cluster's real registry
(distribution, plain HTTP), then `helm install oci://...` into the control plane, as a user installs
a published release.

The pushed version is the chart's own with a pre-release suffix of this run (`0.1.0-oci.<hex>`): the
registry's storage is shared by every checkout on the machine, and two runs pushing the same tag
would install each other's chart. The tag is deleted at the end.
"""

from __future__ import annotations

import asyncio
import json
import re
import tarfile
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gate.api.common import Obj
from gate.devcluster import registry
from gate.devcluster.cluster import DevCluster
from gate.kube.client import DEPLOYMENTS, KubeClient, resource_for
from tests.chart.conftest import CHART_DIR, helm, rendered
from tests.chart.outofcluster import (
    DEV_CLUSTER_TOLERATIONS,
    Release,
    ServedWebhook,
    install,
    serve_release_webhook,
    uninstall,
)
from tests.conftest import Kubectl, unique

REPOSITORY = "charts/nodegate"
CHART_VERSION = str(yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"])


@dataclass
class Pushed:
    port: int
    version: str
    digest: str  # what `helm push` reported
    package: Path
    push_output: str

    @property
    def reference(self) -> str:
        return f"oci://127.0.0.1:{self.port}/{REPOSITORY}"


@pytest.fixture(scope="module")
def pushed(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    port = registry.start_registry(cluster.procs, progress=lambda m: None)
    out = tmp_path_factory.mktemp("oci")
    version = f"{CHART_VERSION}-oci.{uuid.uuid4().hex[:8]}"
    packaged = helm("package", str(CHART_DIR), "--version", version, "--destination", str(out))
    package = out / f"nodegate-{version}.tgz"
    assert package.exists(), packaged.stdout
    proc = helm("push", str(package), f"oci://127.0.0.1:{port}/charts", "--plain-http")
    text = proc.stdout + proc.stderr
    match = re.search(r"Digest: (sha256:[0-9a-f]{64})", text)
    assert match, text
    try:
        yield Pushed(port, version, match.group(1), package, text)
    finally:
        _delete_manifest(port, REPOSITORY, match.group(1))


def _delete_manifest(port: int, repository: str, digest: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/{repository}/manifests/{digest}", method="DELETE")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except OSError:
        pass  # cleanup only: a tag left behind costs one small blob


def test_helm_push_stores_the_packaged_chart_in_the_registry_under_its_version(pushed: Pushed) -> None:
    assert f"Pushed: 127.0.0.1:{pushed.port}/{REPOSITORY}:{pushed.version}" in pushed.push_output
    assert REPOSITORY in registry.catalog(pushed.port)
    # the registry serves the tag as the manifest helm pushed: an OCI manifest whose config is Helm's
    assert registry.manifest_digest(pushed.port, REPOSITORY, pushed.version) == pushed.digest
    request = urllib.request.Request(f"http://127.0.0.1:{pushed.port}/v2/{REPOSITORY}/manifests/{pushed.version}",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        manifest = json.load(resp)
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == \
        ["application/vnd.cncf.helm.chart.content.v1.tar+gzip"]
    # `helm show chart` reads Chart.yaml back from the registry
    shown = yaml.safe_load(helm("show", "chart", pushed.reference, "--version", pushed.version, "--plain-http").stdout)
    assert (shown["name"], shown["version"]) == ("nodegate", pushed.version)
    assert shown["annotations"]["nodegate.io/kube-version"] == ">=1.30.0-0"


def test_the_pulled_chart_is_the_packaged_one_with_its_crds_and_schema(
        pushed: Pushed, tmp_path_factory: pytest.TempPathFactory) -> None:
    into = tmp_path_factory.mktemp("pulled")
    helm("pull", pushed.reference, "--version", pushed.version, "--plain-http", "--destination", str(into))
    pulled = into / pushed.package.name
    assert pulled.read_bytes() == pushed.package.read_bytes()
    with tarfile.open(pulled) as tar:
        names = set(tar.getnames())
    assert {"nodegate/values.schema.json", "nodegate/crds/nodegate.io_nodegates.yaml",
            "nodegate/crds/nodegate.io_deploymentpolicies.yaml", "nodegate/templates/_rules.tpl"} <= names


# The safe image policy of the chart's docs, set at install: the release's own webhook enforces it. The
# catalog's tuned is bound to this cluster's mirrors of it (merged over the chart's default binding).
IMAGE_POLICY: Obj = {"allowedRepositories": ["registry.example.com/nodegate", "ghcr.io/acme"], "requireDigest": True,
                     "packages": {"tuned": ["ghcr.io/acme/tuned", "registry.example.com/nodegate/tuned"]}}
DIGEST = "sha256:" + "0c" * 32


def gate_with(image: str) -> Obj:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": unique("oci-gate")},
            "spec": {"packages": {"tuned": {"version": "1.0.0", "image": image}}}}


@dataclass
class OciRelease:
    release: Release
    webhook: ServedWebhook


@pytest.fixture(scope="module")
async def oci_release(cluster: DevCluster, pushed: Pushed) -> AsyncIterator[OciRelease]:
    dev = {"tolerations": DEV_CLUSTER_TOLERATIONS}
    release = await asyncio.to_thread(
        install, cluster, "nodegate", unique("ng-oci"), unique("ngo"),
        {"operator": dev, "webhook": {**dev, "imagePolicy": IMAGE_POLICY}},
        chart=pushed.reference, helm_args=("--version", pushed.version, "--plain-http"))
    try:
        served = await serve_release_webhook(cluster, release, probe=lambda: gate_with("quay.io/x/y@" + DIGEST),
                                             refused="outside the allowed repositories")
        yield OciRelease(release, served)
    finally:
        cluster.stop_process(f"{release.prefix}-webhook-a")
        proc = await asyncio.to_thread(uninstall, cluster, release)
        assert proc.returncode == 0, proc.stderr


async def test_helm_install_from_the_oci_registry_deploys_every_object_of_the_chart(
        oci_release: OciRelease, pushed: Pushed, kube: KubeClient) -> None:
    release = oci_release.release
    status = json.loads(release.helm("status", release.name, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    metadata = json.loads(release.helm("get", "metadata", release.name, "-o", "json").stdout)
    assert (metadata["chart"], metadata["version"]) == ("nodegate", pushed.version)
    manifest = release.manifest()
    # the same objects as the checkout's chart renders with the same values (install()'s)
    dev = {"tolerations": DEV_CLUSTER_TOLERATIONS}
    local = rendered({"fullnameOverride": release.prefix, "operator": dev,
                      "webhook": {**dev, "imagePolicy": IMAGE_POLICY}}, namespace=release.namespace, hooks=False)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in manifest) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in local)
    for obj in manifest:
        meta = obj["metadata"]
        live = await kube.get(resource_for(obj), meta["name"], meta.get("namespace"))
        assert live["metadata"]["labels"]["helm.sh/chart"] == f"nodegate-{pushed.version}"
    for name in (f"{release.prefix}-webhook", f"{release.prefix}-operator"):
        deployment = await kube.get(DEPLOYMENTS, name, release.namespace)
        assert deployment["status"].get("availableReplicas") == 2, deployment["status"]


@pytest.mark.parametrize(("image", "refusal"), [
    ("ghcr.io/acme/tuned@" + DIGEST, None),
    ("registry.example.com/nodegate/tuned@" + DIGEST, None),
    ("quay.io/evil/tuned@" + DIGEST, "is outside the allowed repositories (imagePolicy.allowedRepositories: "
                                     "registry.example.com/nodegate, ghcr.io/acme"),
    ("ghcr.io/acme/tuned", "has no digest, and the cluster requires one (imagePolicy.requireDigest: true)"),
    ("ghcr.io/acme/other@" + DIGEST, "is not from a repository bound to that package (imagePolicy.packages.tuned: "
                                     "ghcr.io/acme/tuned, registry.example.com/nodegate/tuned"),
])
def test_the_oci_installed_webhook_enforces_the_image_policy_set_in_values(
        oci_release: OciRelease, kubectl: Kubectl, image: str, refusal: str | None) -> None:
    """values -> the chart pulled from the registry -> the Deployment's env -> the release's webhook,
    as its ServiceAccount -> the API server -> kubectl."""
    proc = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(gate_with(image)), check=False)
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0
    assert f'denied the request: spec.packages[tuned].image: image "{image}" of package "tuned" {refusal}' \
        in proc.stderr, proc.stderr
    # Only the release's webhook can say this: no other webhook of the session has an image policy.
