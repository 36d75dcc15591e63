"""The chart with `certManager.enabled=true`, installed into the session's control plane with stand-in
cert-manager CRDs; the test plays cert-manager's controller and cainjector (tests/chart/certmanager.py).
The webhook, run from the installed Deployment as the chart's ServiceAccount, then serves the issued
certificate, and a client trusting only the injected caBundle verifies it for the Service's name.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import ssl
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gate.devcluster.cluster import DevCluster, free_port, wait_established
from gate.kube.client import CRDS, DEPLOYMENTS, MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS, KubeClient
from tests.chart.certmanager import CERTIFICATES, INJECT, FakeCertManager
from tests.chart.conftest import CHART_DIR, Obj
from tests.chart.outofcluster import (
    DEV_CLUSTER_TOLERATIONS,
    Release,
    install,
    run_deployment,
    token_kubeconfig,
    uninstall,
    wait_https,
)
from tests.conftest import REPO, Kubectl, unique

CRD_FILE = Path(__file__).with_name("cert_manager_crds.yaml")


@dataclass
class CertManagerInstall:
    release: Release
    cert_manager: FakeCertManager
    ca: bytes
    tls_dir: Path  # what the kubelet would mount from the Secret at /tls


def mount(secret: Obj, directory: Path) -> None:
    """Write a Secret's keys as files, the way the kubelet projects a Secret volume (atomically)."""
    for key, value in secret["data"].items():
        tmp = directory / f".{key}.tmp"
        tmp.write_bytes(base64.b64decode(value))
        tmp.replace(directory / key)


@pytest.fixture(scope="module")
async def cm_installed(cluster: DevCluster) -> AsyncIterator[CertManagerInstall]:
    crds = list(yaml.safe_load_all(CRD_FILE.read_text()))
    async with await cluster.client() as kube:
        for crd in crds:
            await kube.apply(crd, field_manager="test")
        for crd in crds:
            await wait_established(kube, crd["metadata"]["name"])
    release = await asyncio.to_thread(install, cluster, "nodegate", unique("ng-cm"), unique("ngm"),
                                      {"certManager": {"enabled": True}})
    tls_dir = Path(tempfile.mkdtemp(prefix="nodegate-tls-"))
    try:
        async with await cluster.client() as kube:
            fake = FakeCertManager(kube)
            await fake.issue(release.namespace)
            ca = await fake.inject(release.prefix)
            secret = await kube.get(SECRETS, f"{release.prefix}-webhook-tls", release.namespace)
            mount(secret, tls_dir)
            yield CertManagerInstall(release, fake, ca, tls_dir)
    finally:
        await asyncio.to_thread(uninstall, cluster, release)
        async with await cluster.client() as kube:
            for crd in crds:
                await kube.delete(CRDS, crd["metadata"]["name"])


async def test_chart_objects_chain_from_issuer_to_injected_ca_bundle(cm_installed: CertManagerInstall,
                                                                     kube: KubeClient) -> None:
    release = cm_installed.release
    prefix, ns = release.prefix, release.namespace
    # the CA chain of the chart's own: self-signed Issuer -> CA Certificate -> CA Issuer -> serving cert
    assert sorted(cm_installed.cert_manager.issued) == [f"{ns}/{prefix}-ca", f"{ns}/{prefix}-webhook"]
    serving = await kube.get(CERTIFICATES, f"{prefix}-webhook", ns)
    assert {c["type"]: c["status"] for c in serving["status"]["conditions"]} == {"Ready": "True"}
    deployment = await kube.get(DEPLOYMENTS, f"{prefix}-webhook", ns)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == serving["spec"]["secretName"]
    ca_secret = await kube.get(SECRETS, f"{prefix}-ca", ns)
    assert base64.b64decode(ca_secret["data"]["tls.crt"]) == cm_installed.ca
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        config = await kube.get(res, prefix)
        assert config["metadata"]["annotations"][INJECT] == f"{ns}/{prefix}-webhook"
        assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == \
            {base64.b64encode(cm_installed.ca).decode()}


def _review(name: str) -> bytes:
    obj = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
           "spec": {"deploymentPolicy": "cert-manager-missing-policy"}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "nodegate.io", "version": "v1alpha1", "kind": "NodeGate"},
        "resource": {"group": "nodegate.io", "version": "v1alpha1", "resource": "nodegates"},
        "name": name, "operation": "CREATE", "userInfo": {"username": "admin", "groups": ["system:masters"]},
        "object": obj, "dryRun": True}}).encode()


def _call(port: int, ca: bytes, server_name: str) -> tuple[str, dict[str, object]]:
    """POST a review over TLS trusting only `ca` for `server_name`: (served cert fingerprint, response)."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    body = _review(unique("cm-probe"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: " + server_name.encode() + b"\r\n"
                    b"Content-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = b""
        while chunk := tls.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return hashlib.sha256(der).hexdigest(), json.loads(payload)["response"]


async def test_webhook_serves_the_issued_certificate_trusted_by_the_injected_bundle_and_reloads_renewals(
        cm_installed: CertManagerInstall, cluster: DevCluster, kube: KubeClient) -> None:
    release = cm_installed.release
    prefix, ns = release.prefix, release.namespace
    deployment = await kube.get(DEPLOYMENTS, f"{prefix}-webhook", ns)
    kubeconfig = await token_kubeconfig(cluster, f"{prefix}-webhook", ns)
    port = free_port()
    process = f"{prefix}-webhook-a"
    run_deployment(cluster, process, deployment, ns, kubeconfig, {
        "NODEGATE_WEBHOOK_LISTEN": f"127.0.0.1:{port}", "NODEGATE_WEBHOOK_CERT_DIR": str(cm_installed.tls_dir),
        "NODEGATE_WEBHOOK_CERT_CHECK_SECONDS": "1"})
    try:
        await asyncio.to_thread(wait_https, f"https://127.0.0.1:{port}/readyz", cluster=cluster, process=process)
        config = await kube.get(VALIDATING_WEBHOOKS, prefix)
        bundle = base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])
        service_name = f"{prefix}-webhook.{ns}.svc"  # the name the API server verifies
        first, answer = await asyncio.to_thread(_call, port, bundle, service_name)
        assert answer["allowed"] is False
        assert "cert-manager-missing-policy" in json.dumps(answer["status"])
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(_call, port, bundle, "somewhere-else.example.com")

        # cert-manager renews the serving certificate (new key, same CA); the kubelet updates the files
        await cm_installed.cert_manager.issue(ns, only=f"{prefix}-webhook")
        mount(await kube.get(SECRETS, f"{prefix}-webhook-tls", ns), cm_installed.tls_dir)
        deadline = time.monotonic() + 30
        while True:
            served, answer = await asyncio.to_thread(_call, port, bundle, service_name)
            if served != first:
                break
            assert time.monotonic() < deadline, "the webhook never served the renewed certificate"
            await asyncio.sleep(0.3)
        assert answer["allowed"] is False
    finally:
        cluster.stop_process(process)


def test_plain_cert_manager_manifests_are_accepted_by_the_api_server(cm_installed: CertManagerInstall,
                                                                      kubectl: Kubectl) -> None:
    proc = kubectl.run("apply", "--dry-run=server", "--validate=strict", "-k", str(REPO / "certs"))
    assert "certificate.cert-manager.io/nodegate-webhook created (server dry run)" in proc.stdout or \
        "certificate.cert-manager.io/nodegate-webhook configured (server dry run)" in proc.stdout, proc.stdout


async def test_helm_upgrade_changes_the_configurations_and_keeps_the_injected_ca_bundle(
        cm_installed: CertManagerInstall, kube: KubeClient) -> None:
    """The chart never renders caBundle: Helm's three-way merge leaves what cainjector (or the
    self-managed webhook) set, while the fields the chart owns follow the new values."""
    release = cm_installed.release
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
        yaml.safe_dump({"fullnameOverride": release.prefix, "certManager": {"enabled": True},
                        "webhook": {"timeoutSeconds": 7, "tolerations": DEV_CLUSTER_TOLERATIONS},
                        "operator": {"tolerations": DEV_CLUSTER_TOLERATIONS}}, vf)
        vf.flush()
        await asyncio.to_thread(release.helm, "upgrade", release.name, str(CHART_DIR), "--values", vf.name,
                                "--wait", "--timeout", "3m")
    bundle = base64.b64encode(cm_installed.ca).decode()
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        config = await kube.get(res, release.prefix)
        assert {w["clientConfig"]["caBundle"] for w in config["webhooks"]} == {bundle}
        assert {w["timeoutSeconds"] for w in config["webhooks"]} == ({7} if res is VALIDATING_WEBHOOKS else {7, 3})
