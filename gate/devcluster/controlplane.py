"""The control plane of a dev cluster: its PKI and kubeconfigs, etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, on loopback with free ports.

A control plane for real nodes differs in three ways: the API server also listens on the bridge's
gateway (nodes reach it from their own network namespaces) and authorizes kubelets with the Node
authorizer and NodeRestriction, which it always runs; the node lifecycle controller runs (a real node
that stops heartbeating goes NotReady); and kwok heartbeats its simulated nodes so that it does not
mark them NotReady as well (gate/devcluster/simulated.py).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gate.certs import pki
from gate.devcluster.network import SERVICE_CIDR, ClusterNetwork
from gate.devcluster.processes import ClusterError, Process, ProcessTable, check_alive, http_ok, wait_until
from gate.kube.client import CRDS, NAMESPACES, SERVICEACCOUNTS, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed

Progress = Callable[[str], None]

NAMESPACE = "nodegate-system"
# Controllers the tests rely on, plus everything enabled by default. nodelifecycle is off: simulated
# nodes do not heartbeat (thousands of lease writes would starve two cores), and without a heartbeat
# that controller would taint every node unreachable and evict its pods.
CONTROLLERS = "*,-nodelifecycle,-cloud-node-lifecycle,-nodeipam,-service-lb-controller"
# With real nodes the node lifecycle controller runs: a real node that stops heartbeating (a reboot)
# goes NotReady and comes back, as on a real cluster; kwok then heartbeats the simulated nodes too.
REAL_NODE_CONTROLLERS = "*,-cloud-node-lifecycle,-nodeipam,-service-lb-controller"
PORTS = ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler")
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlane:
    """etcd, the API server, the controller manager and the scheduler of one state directory."""

    def __init__(self, state_dir: Path, procs: ProcessTable, network: ClusterNetwork) -> None:
        self.dir = state_dir
        self.procs = procs
        self.network = network
        self.pki = state_dir / "pki"
        self.kubeconfig = state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.procs.ports()['apiserver']}"

    async def client(self, **kw: Any) -> KubeClient:
        return await KubeClient.from_kubeconfig(str(self.kubeconfig), **kw)

    def ca(self) -> pki.KeyPair:
        return pki.KeyPair((self.pki / "ca.crt").read_bytes(), (self.pki / "ca.key").read_bytes())

    # -- start ------------------------------------------------------------------------------------

    def start(self, bins: dict[str, Path], ports: dict[str, int], procs: dict[str, Process], *, real: bool,
              deadline: float, progress: Progress) -> None:
        """Write the PKI and kubeconfigs, start the four processes into `procs` (recorded as they
        start) and return once the API server is ready; raises ClusterError naming what failed."""
        self.write_pki()
        self.write_kubeconfigs(ports["apiserver"])
        progress("Starting etcd ...")
        procs["etcd"] = self.procs.spawn("etcd", [
            str(bins["etcd"]), "--name", "nodegate-dev", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ports['etcd']}",
            "--advertise-client-urls", f"http://127.0.0.1:{ports['etcd']}",
            "--listen-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}",
            "--initial-cluster", f"nodegate-dev=http://127.0.0.1:{ports['etcd-peer']}",
            # A throwaway cluster: durability is not worth an fsync per write on a shared disk.
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
            "--log-level", "warn",
        ])
        self.procs.save(procs)
        wait_until(lambda: self.serving("etcd"), "etcd", procs, deadline, self.procs.logs / "etcd.log")

        progress("Starting kube-apiserver ...")
        p = self.pki
        procs["kube-apiserver"] = self.procs.spawn("kube-apiserver", [
            str(bins["kube-apiserver"]),
            "--etcd-servers", f"http://127.0.0.1:{ports['etcd']}",
            # Real nodes reach the API server at the bridge's gateway, from their own network namespaces.
            "--bind-address", "0.0.0.0" if real else "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(ports["apiserver"]),
            "--tls-cert-file", str(p / "apiserver.crt"), "--tls-private-key-file", str(p / "apiserver.key"),
            "--client-ca-file", str(p / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(p / "sa.pub"),
            "--service-account-signing-key-file", str(p / "sa.key"),
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            # Node: each kubelet may touch only its own Node and the pods bound to it.
            "--authorization-mode", "Node,RBAC",
            # `kubectl logs` and `exec` reach a real node's kubelet at its InternalIP on the bridge.
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            # No kube-proxy runs: the API server calls a webhook Service at its endpoints (the pod IPs
            # on real nodes, routed over the bridge), not at its ClusterIP.
            "--enable-aggregator-routing=true",
            "--kubelet-client-certificate", str(p / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(p / "apiserver-kubelet-client.key"),
            "--enable-admission-plugins", "NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,"
            "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy,PodSecurity,NodeRestriction",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--allow-privileged=true",
            "--max-requests-inflight", "800", "--max-mutating-requests-inflight", "400",
            "--profiling=false", "--v", "1",
        ])
        self.procs.save(procs)
        wait_until(lambda: self.serving("kube-apiserver"), "kube-apiserver", procs, deadline,
                   self.procs.logs / "kube-apiserver.log")

        progress("Starting kube-controller-manager and kube-scheduler ...")
        procs["kube-controller-manager"] = self.procs.spawn("kube-controller-manager", [
            str(bins["kube-controller-manager"]),
            "--kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--authentication-kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--authorization-kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--controllers", REAL_NODE_CONTROLLERS if real else CONTROLLERS,
            # A node silent for this long is NotReady (default 50 s): a real node's reboot is seen so.
            *(["--node-monitor-grace-period", "16s", "--node-monitor-period", "2s"] if real else []),
            "--service-account-private-key-file", str(p / "sa.key"),
            "--root-ca-file", str(p / "ca.crt"),
            "--use-service-account-credentials=true",
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", str(ports["kcm"]),
            # Client-side throttling would make the garbage collector, not NodeGate, set the pace of
            # a rollout over hundreds of simulated nodes; the API server's own fairness still applies.
            "--kube-api-qps", "2000", "--kube-api-burst", "4000",
            "--concurrent-job-syncs", "50", "--concurrent-gc-syncs", "50", "--v", "1",
        ])
        procs["kube-scheduler"] = self.procs.spawn("kube-scheduler", [
            str(bins["kube-scheduler"]),
            "--kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--authentication-kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--authorization-kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", str(ports["scheduler"]),
            "--v", "1",
        ])
        self.procs.save(procs)

    async def wait_controllers(self, deadline: float, procs: dict[str, Process]) -> None:
        """Until the controller manager is connected and reconciling: the service-account controller
        has created "default" in a namespace."""

        async with await self.client() as kube:
            while True:
                try:
                    await kube.get(NAMESPACES, "default")
                    await kube.get(SERVICEACCOUNTS, "default", "default")
                    return
                except (ApiError, ConnectionFailed):
                    pass
                check_alive(procs)
                if time.monotonic() > deadline:
                    raise ClusterError("kube-controller-manager did not create the default service account; "
                                       f"see {self.procs.logs / 'kube-controller-manager.log'}")
                await asyncio.sleep(0.2)

    def serving(self, name: str) -> bool:
        """etcd answers /health, or the API server /readyz."""
        ports = self.procs.ports()
        if name == "etcd":
            return http_ok(f"http://127.0.0.1:{ports['etcd']}/health")
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return http_ok(f"https://127.0.0.1:{ports['apiserver']}/readyz", ctx)

    # -- credentials ------------------------------------------------------------------------------

    def write_pki(self) -> None:
        """The dev CA and every pair issued from it. An existing CA is reused, so kubeconfigs handed out
        earlier stay valid across restarts; a pair that is missing (a state directory from an older
        NodeGate) is issued from it."""
        self.pki.mkdir(parents=True, exist_ok=True)
        if (self.pki / "ca.crt").exists():
            ca = self.ca()
        else:
            ca = pki.create_ca("nodegate-dev-ca")
            _write_pair(self.pki / "ca", ca)
        if not (self.pki / "apiserver.crt").exists():
            serving = pki.issue(
                ca, "kube-apiserver", server=True,
                hosts=["127.0.0.1", "localhost", "10.96.0.1", self.network.gateway, "kubernetes",
                       "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
            )
            _write_pair(self.pki / "apiserver", serving)
        clients = {
            "admin": ("nodegate-dev-admin", ["system:masters"]),
            "kcm": ("system:kube-controller-manager", []),
            "scheduler": ("system:kube-scheduler", []),
            # kwok writes node and pod status and applies Stage side effects to arbitrary objects.
            "kwok": ("kwok-controller", ["system:masters"]),
            # The API server's identity towards kubelets (logs, exec); they trust the dev CA.
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", []),
        }
        for name, (cn, orgs) in clients.items():
            if not (self.pki / f"{name}.crt").exists():
                _write_pair(self.pki / name, pki.issue(ca, cn, organizations=orgs, client=True))
        if not (self.pki / "sa.key").exists():
            private, public = pki.rsa_signing_key()
            (self.pki / "sa.key").write_bytes(private)
            (self.pki / "sa.pub").write_bytes(public)
        for path in self.pki.glob("*.key"):
            path.chmod(0o600)

    def write_kubeconfigs(self, port: int) -> None:
        for name, file in (("admin", self.kubeconfig), ("kcm", self.dir / "kcm.kubeconfig"),
                           ("scheduler", self.dir / "scheduler.kubeconfig"), ("kwok", self.dir / "kwok.kubeconfig")):
            file.write_text(yaml.safe_dump(kubeconfig_dict(
                f"https://127.0.0.1:{port}", (self.pki / "ca.crt").read_bytes(),
                user=name, cert=(self.pki / f"{name}.crt").read_bytes(), key=(self.pki / f"{name}.key").read_bytes(),
            )))
            file.chmod(0o600)


def kubeconfig_dict(server: str, ca_pem: bytes, *, user: str, cert: bytes | None = None, key: bytes | None = None,
                    token: str | None = None, cluster: str = "nodegate-dev") -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    creds: dict[str, str] = {}
    if cert and key:
        creds = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    if token:
        creds["token"] = token
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }


async def wait_established(kube: KubeClient, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = await kube.get(CRDS, name)
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            return
        await asyncio.sleep(0.1)
    raise ClusterError(f"CRD {name} was not established in {timeout:.0f}s")


def _write_pair(stem: Path, pair: pki.KeyPair) -> None:
    stem.with_suffix(".crt").write_bytes(pair.cert_pem)
    stem.with_suffix(".key").write_bytes(pair.key_pem)


__all__ = ["CONTROLLERS", "NAMESPACE", "REAL_NODE_CONTROLLERS", "ControlPlane", "kubeconfig_dict", "wait_established"]
