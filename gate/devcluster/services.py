"""NodeGate's own processes next to the dev control plane: the admission webhook and the operator.

They run out of cluster as local processes (the API server reaches the webhook on 127.0.0.1), under
the same bookkeeping as the control plane so `nodegate dev down` stops them too. The operator runs
as its ServiceAccount with the RBAC the chart grants (a token from the TokenRequest API), so the dev
cluster exercises exactly the permissions a real install has.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml

import gate
from gate.controller.rbac import OPERATOR_SERVICE_ACCOUNT, WEBHOOK_SERVICE_ACCOUNT, operator_rbac, webhook_rbac
from gate.devcluster.cluster import NAMESPACE, ClusterError, DevCluster, free_port, kubeconfig_dict
from gate.kube.client import SERVICEACCOUNTS

Progress = Callable[[str], None]
NODE_KEYS_POLICY = "nodegate-node-keys"  # the chart's name for release "nodegate"
AGENT_IMAGE_ENV = "NODEGATE_AGENT_IMAGE"
SOURCE_ROOT = Path(gate.__file__).resolve().parent.parent


def start(cluster: DevCluster, *, webhook: bool, operator: bool, progress: Progress) -> None:
    """Install the CRDs, then start the webhook and the operator that are asked for and not running."""
    asyncio.run(install_crds(cluster))
    if webhook:
        start_webhook(cluster, progress)
    if operator:
        start_operator(cluster, progress)


def python_env() -> dict[str, str]:
    """Run NodeGate's processes from this same source tree, installed or not."""
    return {"PYTHONPATH": str(SOURCE_ROOT), "PYTHONUNBUFFERED": "1"}


async def service_account_kubeconfig(cluster: DevCluster, name: str, namespace: str, path: Path,
                                     *, hours: int = 168) -> Path:
    """A kubeconfig authenticating as a ServiceAccount, by a token from the TokenRequest API."""
    async with await cluster.client() as kube:
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": hours * 3600}}
        token = await kube.create(SERVICEACCOUNTS, request, namespace, subresource_of=name, subresource="token")
    config = kubeconfig_dict(cluster.server, (cluster.pki / "ca.crt").read_bytes(),
                             user=f"system:serviceaccount:{namespace}:{name}", token=token["status"]["token"])
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


async def install_operator_rbac(cluster: DevCluster) -> None:
    async with await cluster.client() as kube:
        for obj in operator_rbac(NAMESPACE):
            await kube.apply(obj, field_manager="nodegate-dev")


async def install_node_keys_policy(cluster: DevCluster) -> None:
    """The policy on NodeGate's node keys, for the operator's ServiceAccount (gate.admission.node_keys)."""
    from gate.admission.node_keys import node_keys_policy

    username = f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
    async with await cluster.client() as kube:
        for obj in node_keys_policy(name=NODE_KEYS_POLICY, operator_username=username):
            await kube.apply(obj, field_manager="nodegate-dev")


async def remove_node_keys_policy(cluster: DevCluster) -> None:
    """Take the dev operator's node-keys policy away (a chart installed in its place brings its own, with
    the same name for release "nodegate", and exempts its own operator)."""
    from gate.kube.client import VALIDATING_POLICIES, VALIDATING_POLICY_BINDINGS

    async with await cluster.client() as kube:
        for resource in (VALIDATING_POLICY_BINDINGS, VALIDATING_POLICIES):
            await kube.delete(resource, NODE_KEYS_POLICY, missing_ok=True)


async def install_webhook_rbac(cluster: DevCluster) -> None:
    async with await cluster.client() as kube:
        for obj in webhook_rbac(NAMESPACE, configuration_name=WEBHOOK_CONFIGURATION, secret_name=WEBHOOK_SECRET):
            await kube.apply(obj, field_manager="nodegate-dev")


async def install_crds(cluster: DevCluster) -> None:
    """The CRDs as generated from the models of this source tree (what `nodegate crds` writes)."""
    from gate.api.crd import all_crds
    from gate.devcluster.cluster import wait_established

    async with await cluster.client() as kube:
        for crd in all_crds().values():
            await kube.apply(crd, field_manager="nodegate-dev")
        for crd in all_crds().values():
            await wait_established(kube, crd["metadata"]["name"])


def operator_argv(kubeconfig: Path, port: int, identity: str, extra: list[str] | None = None,
                  endpoints: Path | None = None) -> list[str]:
    """The dev operator's command line. Image resolution is off unless `extra` turns it on
    (`--resolve-digests true`, later flags win): the simulated nodes' package images
    (ghcr.io/example/...) are served by no registry, and kwok pulls nothing. `endpoints`: the
    cluster's Prometheus endpoints file (`set_prometheus_endpoints`), which the operator reads again
    whenever it changes."""
    where = ["--prometheus-endpoints", str(endpoints)] if endpoints is not None else []
    return [sys.executable, "-m", "gate.cli.main", "operator", "run", "--kubeconfig", str(kubeconfig),
            "--namespace", NAMESPACE, "--metrics-host", "127.0.0.1", "--metrics-port", str(port),
            "--identity", identity, "--resolve-digests", "false", *where, *(extra or [])]


def prometheus_endpoints_file(cluster: DevCluster) -> Path:
    """The dev operator's Prometheus endpoints (`gate.controller.endpoints`), as the chart's ConfigMap
    holds them in a cluster."""
    return cluster.dir / "prometheus-endpoints.yaml"


def set_prometheus_endpoints(cluster: DevCluster, urls: Mapping[str, str]) -> Path:
    """Make `urls` (name -> base URL) the endpoints a DeploymentPolicy of the dev cluster may name,
    replacing those before (a running operator reads the file again when it changes)."""
    path = prometheus_endpoints_file(cluster)
    text = yaml.safe_dump({name: {"url": url} for name, url in sorted(urls.items())})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # whole or not at all: the operator may read it at any moment
    return path


def image_signatures_file(cluster: DevCluster) -> Path:
    """The dev operator's image signature policy (`gate.controller.imagetrust`), as the chart's ConfigMap
    holds it in a cluster; the operator runs without one while this file does not exist."""
    return cluster.dir / "image-signatures.yaml"


def set_image_signatures(cluster: DevCluster, text: str | None) -> Path:
    """Make `text` (a policy's YAML, checked as the operator reads it) the dev cluster's image signature
    policy; None removes it. A running operator started with a policy reads the file again when it
    changes; one started without needs a restart to take one (`nodegate dev up --image-signatures`)."""
    from gate.api.signatures import load_policy

    path = image_signatures_file(cluster)
    if text is None:
        path.unlink(missing_ok=True)
        return path
    load_policy(text, source=str(path))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # whole or not at all: the operator may read it at any moment
    return path


def start_operator(cluster: DevCluster, progress: Progress, *, name: str = "operator",
                   extra: list[str] | None = None, env: dict[str, str] | None = None,
                   wait_leader: bool = True) -> int:
    """Start one operator replica as the operator's ServiceAccount; returns its metrics port."""
    procs = cluster.processes()
    if name in procs and procs[name].alive():
        return int(cluster.ports().get(name, 0))
    progress(f"Starting the operator ({name}) ...")
    asyncio.run(install_operator_rbac(cluster))
    asyncio.run(install_node_keys_policy(cluster))
    kubeconfig = asyncio.run(service_account_kubeconfig(
        cluster, OPERATOR_SERVICE_ACCOUNT, NAMESPACE, cluster.dir / "operator.kubeconfig"))
    port = free_port()
    cluster.set_port(name, port)
    env = {**python_env(), **(env or {})}
    if AGENT_IMAGE_ENV not in env and cluster.real_nodes_enabled():
        env[AGENT_IMAGE_ENV] = agent_image(cluster, progress)
    if cluster.real_nodes_enabled() and "NODEGATE_REGISTRY_PLAIN_HTTP" not in env:
        # The nodes pull from the cluster's registry at their gateway over plain HTTP (their containerd
        # is configured so); the operator resolves and verifies the same names there.
        from gate.devcluster.network import gateway_ip
        from gate.devcluster.registry import start_registry

        env["NODEGATE_REGISTRY_PLAIN_HTTP"] = f"{gateway_ip(cluster.dir)}:{start_registry(cluster.procs, progress)}"
    recorded = _agent_image_file(cluster, name)
    if AGENT_IMAGE_ENV in env:
        recorded.write_text(env[AGENT_IMAGE_ENV])
    else:
        recorded.unlink(missing_ok=True)
    endpoints = prometheus_endpoints_file(cluster)
    if not endpoints.exists():
        set_prometheus_endpoints(cluster, {})
    signatures = image_signatures_file(cluster)
    if signatures.exists():
        # Judged for a digest: with a policy, resolution is on (the images must be in a registry then).
        extra = ["--image-signatures", str(signatures), "--resolve-digests", "true", *(extra or [])]
    cluster.register(name, operator_argv(kubeconfig, port, name, extra, endpoints), env)
    wait_ready(cluster, name, port, want="leader" if wait_leader else None)
    return port


def agent_image(cluster: DevCluster, progress: Progress) -> str:
    """NodeGate's image as the cluster's real nodes pull it: built from this source tree if it changed,
    pushed to the cluster's registry, by digest. Simulated nodes never pull, so only a cluster with
    real nodes needs it; without it the operator would name `ghcr.io/nodegate/nodegate`, which a dev
    machine cannot reach (the stage pods would sit in ImagePullBackOff)."""
    from gate.devcluster.images import NODEGATE, ensure_images
    from gate.devcluster.network import gateway_ip

    progress("Building NodeGate's image for the real nodes (once per change of the source) ...")
    return ensure_images(cluster, host=gateway_ip(cluster.dir), progress=progress, only=(NODEGATE,))[NODEGATE]


def _agent_image_file(cluster: DevCluster, name: str) -> Path:
    """Where the agent image an operator process was started with is kept, for `dev images`."""
    return cluster.dir / f"{name}.agent-image"


def running_agent_image(cluster: DevCluster, name: str = "operator") -> str | None:
    """The agent image the running operator `name` was started with, None when it is not running or
    was started with the default."""
    proc = cluster.processes().get(name)
    path = _agent_image_file(cluster, name)
    if proc is None or not proc.alive() or not path.exists():
        return None
    return path.read_text().strip() or None


def wait_ready(cluster: DevCluster, name: str, port: int, *, want: str | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = cluster.processes().get(name)
        if proc is None or not proc.alive():
            log = Path(proc.log).read_text()[-2000:] if proc else ""
            raise ClusterError(f"{name} exited during start-up:\n{log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                body = resp.read().decode()
                if want is None or body == want:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ClusterError(f"{name} did not become ready in {timeout:.0f}s; see {cluster.logs / (name + '.log')}")


# -- the admission webhook ---------------------------------------------------------------------------

WEBHOOK_PROCESS = "webhook"
WEBHOOK_CONFIGURATION = "nodegate"
WEBHOOK_SECRET = "nodegate-webhook-tls"
# Passes the CRD schema and its CEL rules, so only the webhook can refuse it: proof that the API
# server really calls the webhook.
_PROBE_POLICY = "nodegate-dev-probe-missing-policy"


def webhook_argv(cluster: DevCluster, port: int, kubeconfig: Path | None = None) -> list[str]:
    import sys

    return [sys.executable, "-m", "gate.cli.main", "webhook", "serve",
            "--kubeconfig", str(kubeconfig or cluster.kubeconfig), "--listen", f"127.0.0.1:{port}",
            "--cert-mode", "self-managed", "--hosts", "127.0.0.1,localhost",
            "--secret-namespace", "nodegate-system", "--secret-name", WEBHOOK_SECRET,
            "--configuration-name", WEBHOOK_CONFIGURATION,
            # short intervals: tests rotate certificates and expect the process to notice soon
            "--cert-check-seconds", "2", "--cert-propagation-seconds", "5"]


def webhook_port(cluster: DevCluster) -> int | None:
    """The port of the running webhook process (None when it does not run)."""
    proc = cluster.processes().get(WEBHOOK_PROCESS)
    if proc is None or not proc.alive() or "--listen" not in proc.argv:
        return None
    return int(proc.argv[proc.argv.index("--listen") + 1].rpartition(":")[2])


def start_webhook(cluster: DevCluster, progress: Progress, *, timeout: float = 60.0) -> None:
    """Start `nodegate webhook serve` on 127.0.0.1 (self-managed certificate in a Secret), register
    both webhook configurations in url mode with its caBundle, and return once the API server calls it."""
    import asyncio
    import time
    from pathlib import Path

    import gate
    from gate.devcluster.cluster import free_port

    port = webhook_port(cluster)
    if port is None:
        progress("Starting the admission webhook ...")
        # As its ServiceAccount with the RBAC the chart grants (gate/controller/rbac.py), by a token
        # from the TokenRequest API: the dev cluster exercises exactly a real install's permissions.
        asyncio.run(install_webhook_rbac(cluster))
        kubeconfig = asyncio.run(service_account_kubeconfig(
            cluster, WEBHOOK_SERVICE_ACCOUNT, NAMESPACE, cluster.dir / "webhook.kubeconfig"))
        port = free_port()
        env = {"PYTHONPATH": str(Path(gate.__file__).resolve().parent.parent), "PYTHONUNBUFFERED": "1"}
        cluster.register(WEBHOOK_PROCESS, webhook_argv(cluster, port, kubeconfig), env)
    deadline = time.monotonic() + timeout
    wait_webhook_ready(cluster, port, deadline)
    asyncio.run(_register_webhook(cluster, port, deadline))
    progress(f"Admission webhook ready on https://127.0.0.1:{port}.")


def wait_webhook_ready(cluster: DevCluster, port: int, deadline: float) -> None:
    import ssl
    import time
    import urllib.request
    from pathlib import Path

    from gate.devcluster.cluster import ClusterError

    # Only readiness is probed here, so the certificate is not verified; the API server verifies it
    # against the caBundle on every call.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    while True:
        proc = cluster.processes().get(WEBHOOK_PROCESS)
        if proc is None or not proc.alive():
            tail = Path(proc.log).read_text(errors="replace")[-2000:] if proc else ""
            raise ClusterError(f"the admission webhook exited during start-up:\n{tail}")
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"the admission webhook did not become ready; see {cluster.logs / 'webhook.log'}")
        time.sleep(0.1)


async def _register_webhook(cluster: DevCluster, port: int, deadline: float) -> None:
    import base64

    from gate.admission.configuration import webhook_configurations
    from gate.certs.rotation import TRUST_BUNDLE
    from gate.kube.client import SECRETS

    async with await cluster.client() as kube:
        secret = await kube.get(SECRETS, WEBHOOK_SECRET, "nodegate-system")
        bundle = base64.b64decode(secret["data"][TRUST_BUNDLE])
        for config in webhook_configurations(mode="url", url=f"https://127.0.0.1:{port}", ca_bundle=bundle,
                                             name=WEBHOOK_CONFIGURATION):
            await kube.apply(config, field_manager="nodegate-dev")
    await wait_webhook_called(cluster, deadline)


async def wait_webhook_called(cluster: DevCluster, deadline: float) -> None:
    """Until the API server calls the webhook: a dry-run create that only the webhook refuses."""
    import asyncio
    import time

    from gate.devcluster.cluster import ClusterError
    from gate.kube.client import NODEGATES
    from gate.kube.errors import ApiError

    async with await cluster.client() as kube:
        probe = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate",
                 "metadata": {"name": "nodegate-dev-webhook-probe"},
                 "spec": {"deploymentPolicy": _PROBE_POLICY}}
        last = ""
        while True:
            try:
                await kube.create(NODEGATES, probe, dry_run=True)
                last = "the API server admitted the probe without calling the webhook"
            except ApiError as exc:
                if "denied the request" in exc.message and _PROBE_POLICY in exc.message:
                    return
                last = exc.message
            if time.monotonic() > deadline:
                raise ClusterError(f"the API server does not call the admission webhook: {last}")
            await asyncio.sleep(0.2)
