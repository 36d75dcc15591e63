"""The real cert-manager next to the dev control plane: its controller and its cainjector, out of cluster.

The chart's cert-manager mode (`certManager.enabled=true`) is tested against cert-manager itself, and
`nodegate dev up --cert-manager` runs it for a person trying that mode. Both processes are one binary
of NodeGate's own (`gate/devcluster/cert_manager/main.go`, subcommands `controller` and `cainjector`),
built like the control plane from the pinned cert-manager module (versions.toml, `[cert-manager]`).

Decisions:

* **Out of cluster, as the cluster's admin.** The dev cluster has no container runtime, so
  cert-manager runs as local processes of the cluster's process table (`nodegate dev down` stops them
  with the rest), with the admin kubeconfig: cert-manager's own RBAC is its chart's business, not
  what NodeGate tests.
* **The CRDs come from the module** (`deploy/crds/`, copied next to the binary by the build), so they
  match the controller that reads them. They are applied before the processes start.
* **Only what the chart uses.** The controller runs the SelfSigned and CA issuers and every
  Certificate loop; no ACME, Vault or Venafi, no ingress shim, no cert-manager admission webhook (its
  checks of a Certificate's spec are not made; the CRDs' OpenAPI schemas still are).
* **Ready means synced.** Each process answers `GET /readyz` with 200 once its informers have synced,
  on a loopback port of its own.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gate.api.common import Obj
from gate.devcluster import build
from gate.devcluster.processes import ClusterError, Process, ProcessTable, free_port, http_ok, wait_until
from gate.kube.client import KubeClient, Resource

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster

Progress = Callable[[str], None]

COMPONENT = "cert-manager"
CONTROLLER = "cert-manager-controller"
CAINJECTOR = "cert-manager-cainjector"
PROCESSES = (CONTROLLER, CAINJECTOR)
# The CRD whose absence means "cert-manager is not installed" (the cainjector waits for it too).
CERTIFICATES_CRD = "certificates.cert-manager.io"


def version() -> str:
    """The cert-manager release that is built and tested (versions.toml)."""
    return build.load_components()[COMPONENT].version


def crd_documents() -> list[Obj]:
    """cert-manager's CRDs as its module ships them (built on demand)."""
    build.ensure_built((COMPONENT,))
    component = build.load_components()[COMPONENT]
    directory = build.bin_dir(component)
    docs: list[Obj] = []
    for name in sorted(component.assets):
        docs += [d for d in yaml.safe_load_all((directory / name).read_text()) if d]
    return docs


async def install_crds(kube: KubeClient) -> list[str]:
    """Apply cert-manager's CRDs and wait until the API server serves them; returns their names."""
    from gate.devcluster.controlplane import wait_established

    crds = crd_documents()
    for crd in crds:
        await kube.apply(crd, field_manager="nodegate-dev")
    for crd in crds:
        await wait_established(kube, crd["metadata"]["name"])
    return [str(crd["metadata"]["name"]) for crd in crds]


def argv(binary: Path, command: str, kubeconfig: Path, port: int) -> list[str]:
    return [str(binary), command, "--kubeconfig", str(kubeconfig), "--ready-address", f"127.0.0.1:{port}"]


def running(procs: ProcessTable) -> bool:
    table = procs.all()
    return all(name in table and table[name].alive() for name in PROCESSES)


def start(cluster: DevCluster, *, progress: Progress = print, timeout: float = 60.0) -> None:
    """Install cert-manager's CRDs and start its controller and cainjector (those not running) as
    processes of the cluster, with its admin kubeconfig, and return once both report their informers
    synced."""
    binary = build.ensure_built((COMPONENT,), progress=progress)[COMPONENT]

    async def crds() -> list[str]:
        async with await cluster.client() as kube:
            return await install_crds(kube)

    asyncio.run(crds())
    procs, kubeconfig = cluster.procs, cluster.kubeconfig
    table = procs.all()
    ports = procs.ports()
    started: dict[str, Process] = {}
    for name, command in ((CONTROLLER, "controller"), (CAINJECTOR, "cainjector")):
        if name in table and table[name].alive() and name in ports:
            started[name] = table[name]
            continue
        port = free_port()
        procs.set_port(name, port)
        started[name] = procs.register(name, argv(binary, command, kubeconfig, port))
    progress(f"Starting cert-manager {version()} (controller and cainjector, out of cluster) ...")
    deadline = time.monotonic() + timeout
    ports = procs.ports()
    for name, proc in started.items():
        url = f"http://127.0.0.1:{ports[name]}/readyz"
        wait_until(functools.partial(http_ok, url), f"{name} (its informers synced, {url})", {name: proc}, deadline,
                   Path(proc.log))
    progress(f"cert-manager {version()} ready (logs: {procs.logs / (CONTROLLER + '.log')}, "
             f"{procs.logs / (CAINJECTOR + '.log')}).")


def stop(procs: ProcessTable) -> None:
    """Stop the controller and the cainjector (the CRDs stay)."""
    for name in PROCESSES:
        procs.stop(name)


# -- the dev cluster's webhook with certificates from cert-manager (`nodegate demo --cert-manager`) ----

INJECT_CA_FROM = "cert-manager.io/inject-ca-from"
RESOURCES = {kind: Resource("cert-manager.io", "v1", kind.lower() + "s", True, kind)
             for kind in ("Issuer", "Certificate")}
DEV_ISSUER = "nodegate-dev-selfsigned"
DEV_CA = "nodegate-dev-ca"
DEV_CERTIFICATE = "nodegate-dev-webhook"
DEV_SECRET = "nodegate-dev-webhook-tls"


def dev_certificates(namespace: str) -> list[Obj]:
    """The chart's CA chain for the local webhook: a self-signed Issuer signs a CA, the CA Issuer signs
    the serving certificate, for 127.0.0.1 and localhost (the API server calls the webhook by URL)."""
    def meta(name: str) -> Obj:
        return {"name": name, "namespace": namespace}

    return [
        {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": meta(DEV_ISSUER),
         "spec": {"selfSigned": {}}},
        {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": meta(DEV_CA),
         "spec": {"isCA": True, "commonName": DEV_CA, "secretName": DEV_CA,
                  "privateKey": {"algorithm": "ECDSA", "size": 256},
                  "issuerRef": {"name": DEV_ISSUER, "kind": "Issuer", "group": "cert-manager.io"}}},
        {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": meta(DEV_CA),
         "spec": {"ca": {"secretName": DEV_CA}}},
        {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": meta(DEV_CERTIFICATE),
         "spec": {"secretName": DEV_SECRET, "commonName": "localhost", "dnsNames": ["localhost"],
                  "ipAddresses": ["127.0.0.1"], "usages": ["server auth", "digital signature"],
                  "privateKey": {"algorithm": "ECDSA", "size": 256},
                  "issuerRef": {"name": DEV_CA, "kind": "Issuer", "group": "cert-manager.io"}}},
    ]


def start_webhook(cluster: DevCluster, progress: Progress, *, timeout: float = 120.0) -> None:
    """Like `services.start_webhook`, with the serving certificate from cert-manager: start cert-manager,
    have it issue `dev_certificates`, run `nodegate webhook serve --cert-mode files` on a copy of the
    Secret (the Certificate lasts 90 days, longer than any demo), and register both configurations
    with the annotation `cert-manager.io/inject-ca-from` and no caBundle: cert-manager's cainjector
    fills it. Returns once the API server calls the webhook."""
    import base64

    from gate.admission.configuration import webhook_configurations
    from gate.controller.rbac import WEBHOOK_SERVICE_ACCOUNT
    from gate.devcluster import services
    from gate.devcluster.controlplane import NAMESPACE
    from gate.kube.client import SECRETS
    from gate.kube.errors import NotFound

    start(cluster, progress=progress)
    deadline = time.monotonic() + timeout
    tls_dir = cluster.dir / "webhook-tls"

    async def issue() -> None:
        async with await cluster.client() as kube:
            for obj in dev_certificates(NAMESPACE):
                await kube.patch(RESOURCES[obj["kind"]], obj["metadata"]["name"], obj, namespace=NAMESPACE,
                                 patch_type="apply", field_manager="nodegate-dev", force=True)
            while True:
                try:
                    secret = await kube.get(SECRETS, DEV_SECRET, NAMESPACE)
                    if {"tls.crt", "tls.key"} <= set(secret.get("data") or {}):
                        break
                except NotFound:
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError(f"cert-manager did not issue Certificate {NAMESPACE}/{DEV_CERTIFICATE}; "
                                       f"see {cluster.logs / (CONTROLLER + '.log')}")
                await asyncio.sleep(0.2)
        tls_dir.mkdir(exist_ok=True)
        for key in ("tls.crt", "tls.key"):
            (tls_dir / key).write_bytes(base64.b64decode(secret["data"][key]))

    progress(f"cert-manager issues the webhook's certificate (Certificate {NAMESPACE}/{DEV_CERTIFICATE}) ...")
    asyncio.run(issue())
    port = services.webhook_port(cluster)
    if port is None:
        asyncio.run(services.install_webhook_rbac(cluster))
        kubeconfig = asyncio.run(services.service_account_kubeconfig(
            cluster, WEBHOOK_SERVICE_ACCOUNT, NAMESPACE, cluster.dir / "webhook.kubeconfig"))
        port = free_port()
        argv = [sys.executable, "-m", "gate.cli.main", "webhook", "serve", "--kubeconfig", str(kubeconfig),
                "--listen", f"127.0.0.1:{port}", "--cert-mode", "files", "--cert-dir", str(tls_dir),
                "--configuration-name", services.WEBHOOK_CONFIGURATION, "--cert-check-seconds", "2"]
        cluster.register(services.WEBHOOK_PROCESS, argv, services.python_env())
    services.wait_webhook_ready(cluster, port, deadline)

    async def register() -> None:
        async with await cluster.client() as kube:
            for config in webhook_configurations(mode="url", url=f"https://127.0.0.1:{port}", ca_bundle=None,
                                                 name=services.WEBHOOK_CONFIGURATION):
                config["metadata"]["annotations"] = {INJECT_CA_FROM: f"{NAMESPACE}/{DEV_CERTIFICATE}"}
                await kube.apply(config, field_manager="nodegate-dev")
        await services.wait_webhook_called(cluster, deadline)

    asyncio.run(register())
    progress(f"Admission webhook ready on https://127.0.0.1:{port}, its certificate from cert-manager "
             "and its caBundle from cert-manager's cainjector.")


__all__ = ["CAINJECTOR", "CERTIFICATES_CRD", "COMPONENT", "CONTROLLER", "PROCESSES", "crd_documents",
           "dev_certificates", "install_crds", "running", "start", "start_webhook", "stop", "version"]
