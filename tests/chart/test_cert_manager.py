"""The chart with `certManager.enabled=true` against the real cert-manager: its controller and its
cainjector (gate/devcluster/certmanager.py, built from the module pinned in versions.toml), run out
of cluster beside the session's control plane, with the CRDs of that release.

cert-manager issues the chart's CA chain and the webhook's serving certificate and its cainjector
fills both configurations' caBundle; nothing here issues or injects anything. The webhook runs from
the installed Deployment as the chart's ServiceAccount, with the Secret projected into a directory
as the kubelet does it (an atomic `..data` symlink swap, `SecretVolume`).

The API server cannot reach a Service here (no kube-proxy, no pod network), so the test points the
configurations at the local process (url https://127.0.0.1:PORT, the caBundle left to cainjector);
for that URL to verify, the test adds 127.0.0.1 to the Certificate's ipAddresses, and cert-manager
reissues it. Every other change to a chart object is cert-manager's.

The first test runs before cert-manager is installed (the module's fixture installs it): it is the
failure a user meets most.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import ssl
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from gate.api.common import Obj
from gate.devcluster import certmanager
from gate.devcluster.cluster import DevCluster, free_port
from gate.kube.client import (
    CRDS,
    DEPLOYMENTS,
    MUTATING_WEBHOOKS,
    NODEGATES,
    SECRETS,
    VALIDATING_WEBHOOKS,
    KubeClient,
    Resource,
)
from gate.kube.errors import ApiError, NotFound
from tests.chart.outofcluster import (
    Release,
    install,
    point_at_loopback,
    run_deployment,
    token_kubeconfig,
    uninstall,
    wait_for,
    wait_https,
)
from tests.conftest import unique

CERTIFICATES = Resource("cert-manager.io", "v1", "certificates", True, "Certificate")
CERTIFICATE_REQUESTS = Resource("cert-manager.io", "v1", "certificaterequests", True, "CertificateRequest")
ISSUERS = Resource("cert-manager.io", "v1", "issuers", True, "Issuer")
INJECT = "cert-manager.io/inject-ca-from"
PROBE_POLICY = "cert-manager-missing-policy"


def probe(name: str) -> Obj:
    # passes the CRD schema and its CEL rules: only the webhook can refuse it
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"deploymentPolicy": PROBE_POLICY}}


def condition(obj: Obj, kind: str) -> Obj:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


# -- cert-manager absent ------------------------------------------------------------------------------

async def test_without_cert_manager_the_install_says_what_is_missing_and_status_names_the_webhook(
        cluster: DevCluster, kube: KubeClient, capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli.main import main

    try:
        await kube.get(CRDS, certmanager.CERTIFICATES_CRD)
        pytest.fail("cert-manager's CRDs are installed already: this test runs first in its module, on a "
                    "control plane without them (a reused NODEGATE_TEST_CLUSTER_DIR keeps them)")
    except NotFound:
        pass
    # 1. No CRDs: the chart says what is missing, before creating anything.
    with pytest.raises(AssertionError) as refused:
        await asyncio.to_thread(install, cluster, "nodegate", unique("ng-nocm"), unique("ngn"),
                                {"certManager": {"enabled": True}})
    message = str(refused.value)
    assert "certManager.enabled=true needs cert-manager" in message, message
    assert "cert-manager.io/v1 Certificate, cert-manager.io/v1 Issuer" in message, message
    # 2. CRDs but no cert-manager running: the install succeeds, the webhook cannot be called, and
    # `nodegate status` says so, naming the configuration, the Certificate and what it lacks.
    crds = await certmanager.install_crds(kube)
    release = await asyncio.to_thread(install, cluster, "nodegate", unique("ng-nocm"), unique("ngn"),
                                      {"certManager": {"enabled": True}})
    try:
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["status", "--kubeconfig", str(cluster.kubeconfig)]) == 0
        err = capsys.readouterr().err
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            assert (f"warning: admission webhook: {kind} {release.prefix} has no caBundle for "
                    in err), err
        assert (f"cert-manager's cainjector fills it from Certificate {release.namespace}/{release.prefix}-webhook: "
                "it has no status yet (is cert-manager's controller running?)") in err, err
    finally:
        await asyncio.to_thread(uninstall, cluster, release)
    # the CRDs stay: the module's fixture installs the same ones
    assert certmanager.CERTIFICATES_CRD in crds


# -- cert-manager running -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cert_manager(cluster: DevCluster) -> Iterator[None]:
    certmanager.start(cluster, progress=lambda m: None)
    try:
        yield
    finally:
        certmanager.stop(cluster.procs)


class SecretVolume:
    """A Secret projected into a directory the way the kubelet does it: the keys are symlinks into
    `..data`, itself a symlink to a timestamped directory that is swapped atomically on a change."""

    def __init__(self, kube: KubeClient, name: str, namespace: str) -> None:
        self.kube, self.name, self.namespace = kube, name, namespace
        self.dir = Path(tempfile.mkdtemp(prefix="nodegate-tls-"))
        self.version = ""
        self.updates = 0
        self._task: asyncio.Task[None] | None = None

    async def sync(self) -> bool:
        secret = await self.kube.get(SECRETS, self.name, self.namespace)
        if secret["metadata"]["resourceVersion"] == self.version:
            return False
        stamp = self.dir / f"..{time.time_ns()}"
        stamp.mkdir()
        for key, value in secret["data"].items():
            (stamp / key).write_bytes(base64.b64decode(value))
        tmp = self.dir / "..data_tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(stamp.name)
        old = (self.dir / "..data").resolve() if (self.dir / "..data").is_symlink() else None
        os.replace(tmp, self.dir / "..data")
        for key in secret["data"]:
            if not (self.dir / key).is_symlink():
                (self.dir / key).symlink_to(f"..data/{key}")
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.version = secret["metadata"]["resourceVersion"]
        self.updates += 1
        return True

    async def _loop(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Served:
    release: Release
    volume: SecretVolume
    process: str
    port: int
    requests: list[int] = field(default_factory=list)


def served_fingerprint(port: int, ca: bytes, server_name: str) -> str:
    """The SHA-256 of the certificate the webhook serves, verified against `ca` for `server_name`."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def fingerprint_of(pem: bytes) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return hashlib.sha256(x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)).hexdigest()


async def bundles(kube: KubeClient, name: str) -> set[str]:
    found: set[str] = set()
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        config = await kube.get(res, name)
        found |= {w["clientConfig"].get("caBundle", "") for w in config["webhooks"]}
    return found


async def issued(kube: KubeClient, name: str, namespace: str, *, after: str = "") -> Obj:
    """The Certificate once cert-manager reports it Ready at a revision after `after`."""
    async def ready() -> Obj | None:
        cert = await kube.get(CERTIFICATES, name, namespace)
        revision = str((cert.get("status") or {}).get("revision", ""))
        ok = condition(cert, "Ready").get("status") == "True" and revision != after
        return cert if ok else None

    result: Obj = await wait_for(ready, what=f"cert-manager to issue Certificate {namespace}/{name}")
    return result


@pytest.fixture(scope="module")
async def served(cluster: DevCluster, cert_manager: None) -> AsyncIterator[Served]:
    release = await asyncio.to_thread(install, cluster, "nodegate", unique("ng-cm"), unique("ngm"),
                                      {"certManager": {"enabled": True}})
    prefix, ns = release.prefix, release.namespace
    process = f"{prefix}-webhook-a"
    async with await cluster.client() as kube:
        volume = SecretVolume(kube, f"{prefix}-webhook-tls", ns)
        try:
            cert = await issued(kube, f"{prefix}-webhook", ns)
            # the API server calls the local process at 127.0.0.1: that name must be in the certificate
            await kube.patch(CERTIFICATES, f"{prefix}-webhook", {"spec": {"ipAddresses": ["127.0.0.1"]}},
                             namespace=ns, patch_type="merge")
            await issued(kube, f"{prefix}-webhook", ns, after=str(cert["status"]["revision"]))
            await volume.sync()
            volume.start()
            deployment = await kube.get(DEPLOYMENTS, f"{prefix}-webhook", ns)
            kubeconfig = await token_kubeconfig(cluster, f"{prefix}-webhook", ns)
            port = free_port()
            run_deployment(cluster, process, deployment, ns, kubeconfig, {
                "NODEGATE_WEBHOOK_LISTEN": f"127.0.0.1:{port}", "NODEGATE_WEBHOOK_CERT_DIR": str(volume.dir),
                "NODEGATE_WEBHOOK_CERT_CHECK_SECONDS": "1"})
            await asyncio.to_thread(wait_https, f"https://127.0.0.1:{port}/readyz", cluster=cluster,
                                    process=process)

            async def injected() -> str | None:
                found = await bundles(kube, prefix)
                return found.pop() if len(found) == 1 and "" not in found else None

            bundle = await wait_for(injected, what="cainjector to fill both configurations' caBundle")
            await point_at_loopback(kube, prefix, port, bundle)
            yield Served(release, volume, process, port)
        finally:
            await volume.stop()
            cluster.stop_process(process)
            await asyncio.to_thread(uninstall, cluster, release)


async def refused_by_webhook(kube: KubeClient) -> str:
    """The API server's answer to a dry-run create of the probe: "" when the webhook refused it as
    expected, else what went wrong (a failed call, an admission)."""
    try:
        await kube.create(NODEGATES, probe(unique("cm-probe")), dry_run=True)
    except ApiError as exc:
        if "denied the request" in exc.message and PROBE_POLICY in exc.message:
            return ""
        return exc.message
    return "admitted"


async def test_cert_manager_issues_the_chain_injects_the_ca_and_the_api_server_calls_the_webhook(
        served: Served, kube: KubeClient) -> None:
    prefix, ns = served.release.prefix, served.release.namespace
    # the chart's Issuers are Ready: cert-manager checked them
    for issuer in (f"{prefix}-selfsigned", f"{prefix}-ca"):
        obj = await wait_for(lambda name=issuer: _ready_issuer(kube, name, ns), what=f"Issuer {issuer} Ready")
        assert condition(obj, "Ready")["status"] == "True"
    # the serving certificate was issued by cert-manager: an approved CertificateRequest of the
    # Certificate, signed by the chart's CA (itself issued by the self-signed Issuer)
    serving = await kube.get(CERTIFICATES, f"{prefix}-webhook", ns)
    requests, _ = await kube.list(CERTIFICATE_REQUESTS, ns)
    mine = [r for r in requests if r["metadata"]["annotations"].get("cert-manager.io/certificate-name")
            == f"{prefix}-webhook"]
    assert mine and all(condition(r, "Approved").get("status") == "True" for r in mine), mine
    assert all(condition(r, "Ready").get("reason") == "Issued" for r in mine), mine
    secret = await kube.get(SECRETS, f"{prefix}-webhook-tls", ns)
    annotations = secret["metadata"]["annotations"]
    assert annotations["cert-manager.io/certificate-name"] == f"{prefix}-webhook"
    assert annotations["cert-manager.io/issuer-name"] == f"{prefix}-ca"
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca_pem = base64.b64decode((await kube.get(SECRETS, f"{prefix}-ca", ns))["data"]["tls.crt"])
    ca = x509.load_pem_x509_certificate(ca_pem)
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{prefix}-webhook.{ns}.svc" in names.get_values_for_type(x509.DNSName)
    assert serving["spec"]["secretName"] == f"{prefix}-webhook-tls"
    # cainjector: both configurations carry the chart's CA, from the annotation
    assert await bundles(kube, prefix) == {base64.b64encode(ca_pem).decode()}
    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        config = await kube.get(res, prefix)
        assert config["metadata"]["annotations"][INJECT] == f"{ns}/{prefix}-webhook"
    # the webhook serves cert-manager's certificate, verified for the Service's name as the API server
    # verifies it, and the API server calls it: a bad spec is refused
    served_now = await asyncio.to_thread(served_fingerprint, served.port, ca_pem, f"{prefix}-webhook.{ns}.svc")
    current = base64.b64decode((await kube.get(SECRETS, f"{prefix}-webhook-tls", ns))["data"]["tls.crt"])
    assert served_now == fingerprint_of(current)
    assert await wait_for(lambda: _refused(kube), what="the API server to call the webhook") == "refused"


async def _ready_issuer(kube: KubeClient, name: str, namespace: str) -> Obj | None:
    obj = await kube.get(ISSUERS, name, namespace)
    return obj if condition(obj, "Ready").get("status") == "True" else None


async def _refused(kube: KubeClient) -> str | None:
    return "refused" if await refused_by_webhook(kube) == "" else None


async def test_renewals_are_picked_up_under_a_steady_stream_of_requests_with_no_failed_admission(
        served: Served, kube: KubeClient) -> None:
    prefix, ns = served.release.prefix, served.release.namespace
    name = f"{prefix}-webhook"
    ca_pem = base64.b64decode((await kube.get(SECRETS, f"{prefix}-ca", ns))["data"]["tls.crt"])
    service = f"{prefix}-webhook.{ns}.svc"
    first = await kube.get(CERTIFICATES, name, ns)
    failures: list[str] = []
    calls = 0
    stop = asyncio.Event()

    async def stream() -> None:
        nonlocal calls
        while not stop.is_set():
            outcome = await refused_by_webhook(kube)
            calls += 1
            if outcome:
                failures.append(outcome)
            await asyncio.sleep(0.05)

    streaming = asyncio.create_task(stream())
    try:
        # a short renewal window: cert-manager renews 5 s after each issuance (new key each time)
        await kube.patch(CERTIFICATES, name, {"spec": {"renewBefore": "2159h59m55s"}}, namespace=ns,
                         patch_type="merge")
        seen = {await asyncio.to_thread(served_fingerprint, served.port, ca_pem, service)}
        revision = str(first["status"]["revision"])
        for _ in range(2):  # two renewals, each served by the running webhook
            cert = await issued(kube, name, ns, after=revision)
            revision = str(cert["status"]["revision"])
            secret = await kube.get(SECRETS, f"{prefix}-webhook-tls", ns)
            want = fingerprint_of(base64.b64decode(secret["data"]["tls.crt"]))

            async def serving(want: str = want) -> bool:
                return await asyncio.to_thread(served_fingerprint, served.port, ca_pem, service) == want

            await wait_for(serving, what=f"the webhook to serve revision {revision}")
            seen.add(want)
        assert len(seen) >= 3, seen
    finally:
        await kube.patch(CERTIFICATES, name, {"spec": {"renewBefore": first["spec"]["renewBefore"]}}, namespace=ns,
                         patch_type="merge")
        stop.set()
        await streaming
    assert calls > 20, calls
    assert failures == [], failures[:5]
    # the CA did not move: the caBundle cainjector keeps is the one the renewals chain to
    assert await bundles(kube, prefix) == {base64.b64encode(ca_pem).decode()}


def test_helm_renders_the_plain_cert_manager_manifests_the_api_server_accepts(
        served: Served, cluster: DevCluster) -> None:
    """certs/ (the chart in cert-manager mode, rendered) against cert-manager's own CRDs."""
    from tests.conftest import REPO, Kubectl

    proc = Kubectl(cluster.kubeconfig).run("apply", "--dry-run=server", "--validate=strict", "-k", str(REPO / "certs"))
    assert "certificate.cert-manager.io/nodegate-webhook created (server dry run)" in proc.stdout or \
        "certificate.cert-manager.io/nodegate-webhook configured (server dry run)" in proc.stdout, proc.stdout



# -- switching modes with helm upgrade ----------------------------------------------------------------

def admission_call(port: int, bundle: bytes, server_name: str) -> str:
    """What the API server does for one request through the Service: verify the webhook's certificate
    against the configuration's caBundle for the Service's name, POST the review of the probe. ""
    when the webhook refused the probe as it should, else what went wrong."""
    name = unique("cm-switch")
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "nodegate.io", "version": "v1alpha1", "kind": "NodeGate"},
        "resource": {"group": "nodegate.io", "version": "v1alpha1", "resource": "nodegates"},
        "name": name, "operation": "CREATE", "userInfo": {"username": "admin", "groups": ["system:masters"]},
        "object": probe(name), "dryRun": True}}).encode()
    try:
        ctx = ssl.create_default_context(cadata=bundle.decode())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname=server_name) as tls:
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: " + server_name.encode() + b"\r\n"
                        b"Content-Type: application/json\r\nConnection: close\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            raw = b""
            while chunk := tls.recv(65536):
                raw += chunk
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; an empty bundle a ValueError
        return f"{type(exc).__name__}: {exc}"
    head, _, payload = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return head.decode(errors="replace").splitlines()[0]
    answer = json.loads(payload)["response"]
    return "" if answer["allowed"] is False and PROBE_POLICY in json.dumps(answer.get("status")) else str(answer)


@dataclass
class Endpoints:
    """The webhook pods the Service would route to (their local ports), and what each call met."""

    ports: list[int]
    failures: list[str] = field(default_factory=list)
    calls: int = 0


async def leave(endpoints: Endpoints, port: int) -> None:
    """Take a pod out of the Service and wait until no call to it is in flight, as the endpoints'
    removal reaches the API server before the pod stops. (The webhook closes its listener at SIGTERM:
    a call the API server sends a terminating pod before the removal reaches it is lost; the chart has
    no preStop delay for that. Not what this module tests, so the test orders the two.)"""
    endpoints.ports.remove(port)
    seen = endpoints.calls

    async def drained() -> bool:
        return endpoints.calls >= seen + 2

    await wait_for(drained, what="the calls in flight to a pod leaving the Service")


async def call_steadily(kube: KubeClient, prefix: str, service_name: str, endpoints: Endpoints,
                        stop: asyncio.Event) -> None:
    """A steady stream of reviews, round-robin over the ready pods, each verified against the
    ValidatingWebhookConfiguration's caBundle as it is at that moment."""
    while not stop.is_set():
        config = await kube.get(VALIDATING_WEBHOOKS, prefix)
        bundle = base64.b64decode(config["webhooks"][0]["clientConfig"].get("caBundle", ""))
        port = endpoints.ports[endpoints.calls % len(endpoints.ports)]
        outcome = await asyncio.to_thread(admission_call, port, bundle, service_name)
        endpoints.calls += 1
        if outcome:
            endpoints.failures.append(f"call {endpoints.calls} to :{port}: {outcome}")
        await asyncio.sleep(0.05)


async def test_helm_upgrade_from_self_managed_to_cert_manager_and_back_loses_no_admission(
        cluster: DevCluster, cert_manager: None, kube: KubeClient) -> None:
    """Each upgrade is followed as a rolling update does it: the new pod starts from the upgraded
    Deployment and joins the Service once ready, then the old one leaves and stops. The calls go to
    the pods as the API server's would through the Service (which it cannot reach here): verified
    against the configuration's caBundle of the moment, for the Service's name.

    The old pods stay trusted because cert-manager's cainjector appends its CA to the caBundle there.
    On the switch to cert-manager the old self-managed pods and cert-manager share the Secret: one early
    run lost one call to an old pod that served a certificate its published bundle did not trust yet.
    The self-managed webhook now publishes the bundle before it serves what the Secret holds
    (gate/admission/certificates.py); the loss was not seen again, but neither could it be reproduced
    on demand with the old order. The pods check their certificate every second (the chart's default
    is 60 s), so an old pod meets cert-manager's pair during the switch."""
    release = await asyncio.to_thread(install, cluster, "nodegate", unique("ng-sw"), unique("ngs"), {})
    prefix, ns = release.prefix, release.namespace
    service_name = f"{prefix}-webhook.{ns}.svc"
    kubeconfig = await token_kubeconfig(cluster, f"{prefix}-webhook", ns)
    volume = SecretVolume(kube, f"{prefix}-webhook-tls", ns)
    started: list[str] = []

    async def start_pod(suffix: str, overrides: dict[str, str] | None = None) -> int:
        deployment = await kube.get(DEPLOYMENTS, f"{prefix}-webhook", ns)
        port, process = free_port(), f"{prefix}-webhook-{suffix}"
        run_deployment(cluster, process, deployment, ns, kubeconfig, {
            "NODEGATE_WEBHOOK_LISTEN": f"127.0.0.1:{port}", "NODEGATE_WEBHOOK_CERT_CHECK_SECONDS": "1",
            **(overrides or {})})
        started.append(process)
        await asyncio.to_thread(wait_https, f"https://127.0.0.1:{port}/readyz", cluster=cluster, process=process)
        return port

    async def upgrade(values: Obj) -> None:
        from tests.chart.outofcluster import DEV_CLUSTER_TOLERATIONS

        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
            import yaml

            yaml.safe_dump({"fullnameOverride": prefix, "webhook": {"tolerations": DEV_CLUSTER_TOLERATIONS},
                            "operator": {"tolerations": DEV_CLUSTER_TOLERATIONS}, **values}, vf)
            vf.flush()
            from tests.chart.conftest import CHART_DIR

            await asyncio.to_thread(release.helm, "upgrade", release.name, str(CHART_DIR), "--values", vf.name,
                                    "--wait", "--timeout", "3m")

    stop = asyncio.Event()
    streaming: asyncio.Task[None] | None = None
    try:
        endpoints = Endpoints([await start_pod("a")])

        async def published() -> bool:
            return "" not in await bundles(kube, prefix)

        await wait_for(published, what="the self-managed webhook to publish its caBundle")
        streaming = asyncio.create_task(call_steadily(kube, prefix, service_name, endpoints, stop))
        await asyncio.sleep(1)
        # self-managed -> cert-manager
        await upgrade({"certManager": {"enabled": True}})
        await issued(kube, f"{prefix}-webhook", ns)
        await volume.sync()
        volume.start()
        endpoints.ports.append(await start_pod("b", {"NODEGATE_WEBHOOK_CERT_DIR": str(volume.dir)}))
        await leave(endpoints, endpoints.ports[0])
        cluster.stop_process(started[0])
        await asyncio.sleep(2)
        calls_with_cert_manager = endpoints.calls
        # cert-manager -> self-managed
        await upgrade({})
        endpoints.ports.append(await start_pod("c"))
        await leave(endpoints, endpoints.ports[0])
        cluster.stop_process(started[1])
        await asyncio.sleep(2)
    finally:
        stop.set()
        if streaming is not None:
            await streaming
        await volume.stop()
        for process in started:
            cluster.stop_process(process)
        await asyncio.to_thread(uninstall, cluster, release)
    assert endpoints.calls > calls_with_cert_manager > 20, (calls_with_cert_manager, endpoints.calls)
    assert endpoints.failures == [], f"{len(endpoints.failures)} of {endpoints.calls}: {endpoints.failures[:5]}"
