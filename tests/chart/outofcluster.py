"""Running the chart's webhook and operator out of cluster, exactly as its Deployments configure them.

The dev cluster has no container runtime (kwok plays the kubelet), so the chart's pods "run" without
a process behind them. These helpers take an installed Deployment's command and environment, and run
that command here, authenticated as the Deployment's ServiceAccount by a TokenRequest token: the
RBAC a process gets is exactly what `helm install` created for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gate.api.common import Obj
from gate.devcluster.cluster import DevCluster, Process, free_port
from gate.devcluster.services import python_env, service_account_kubeconfig, wait_ready
from tests.chart.conftest import CHART_DIR, helm

if TYPE_CHECKING:
    from gate.kube.client import KubeClient

RELEASE_KIND_ORDER = ("CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                      "Role", "RoleBinding", "Service", "Deployment", "PodDisruptionBudget",
                      "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


@dataclass
class Release:
    name: str
    namespace: str
    prefix: str  # fullnameOverride: every object is "<prefix>-..."; the configurations are "<prefix>"
    kubeconfig: Path

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return helm(*args, "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace, check=check)

    def manifest(self) -> list[Obj]:
        out = self.helm("get", "manifest", self.name).stdout
        return [o for o in yaml.safe_load_all(out) if o]


# The dev cluster runs no node lifecycle controller, so its simulated nodes keep the not-ready taint
# they register with: pods that the scheduler places need to tolerate it (stage pods name their node).
DEV_CLUSTER_TOLERATIONS = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]


def install(cluster: DevCluster, name: str, namespace: str, prefix: str, values: Obj, *,
            chart: str = str(CHART_DIR), helm_args: tuple[str, ...] = ()) -> Release:
    """`helm install` of `chart` (the checkout's by default; an oci:// reference with `helm_args`
    such as --version and --plain-http) into a namespace of its own, labelled for privileged pods."""
    subprocess.run([_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "create", "namespace", namespace],
                   check=True, capture_output=True)
    # Package pods run privileged in NodeGate's namespace (docs/install.md).
    subprocess.run([_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=privileged"], check=True, capture_output=True)
    release = Release(name, namespace, prefix, cluster.kubeconfig)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
        dev = {"operator": {"tolerations": DEV_CLUSTER_TOLERATIONS},
               "webhook": {"tolerations": DEV_CLUSTER_TOLERATIONS}}
        yaml.safe_dump({"fullnameOverride": prefix, **dev, **values}, vf)
        vf.flush()
        release.helm("install", name, chart, *helm_args, "--values", vf.name, "--wait", "--timeout", "3m")
    return release


def uninstall(cluster: DevCluster, release: Release) -> subprocess.CompletedProcess[str]:
    proc = release.helm("uninstall", release.name, "--wait", "--timeout", "3m", check=False)
    subprocess.run([_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "delete", "namespace", release.namespace,
                    "--wait=false", "--ignore-not-found"], capture_output=True)
    return proc


def _kubectl() -> str:
    from tests.conftest import kubectl_path

    return kubectl_path()


def container_env(deployment: Obj, namespace: str, pod: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it for a pod named `pod`."""
    refs = {"metadata.namespace": namespace, "metadata.name": pod}
    env = {}
    for item in deployment["spec"]["template"]["spec"]["containers"][0].get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = refs[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:  # the API server stores value "" as no value at all
            env[item["name"]] = str(item.get("value", ""))
    return env


def command_of(deployment: Obj) -> list[str]:
    """The container's command, run from this source tree (`nodegate` is `python -m gate.cli.main`)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["nodegate"], container["command"]
    return [sys.executable, "-m", "gate.cli.main", *container["args"]]


async def token_kubeconfig(cluster: DevCluster, service_account: str, namespace: str) -> Path:
    path = cluster.dir / f"{namespace}-{service_account}.kubeconfig"
    return await service_account_kubeconfig(cluster, service_account, namespace, path, hours=2)


def run_deployment(cluster: DevCluster, process: str, deployment: Obj, namespace: str, kubeconfig: Path,
                   overrides: dict[str, str]) -> Process:
    """Start the Deployment's container command as a local process named `process` (pod name too)."""
    env = {**container_env(deployment, namespace, process), **overrides, **python_env()}
    return cluster.register(process, [*command_of(deployment), "--kubeconfig", str(kubeconfig)], env)


def log_of(cluster: DevCluster, process: str) -> str:
    return (cluster.logs / f"{process}.log").read_text(errors="replace")


def wait_https(url: str, *, timeout: float = 60.0, cluster: DevCluster | None = None, process: str = "") -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    while True:
        if cluster is not None and process:
            proc = cluster.processes().get(process)
            if proc is None or not proc.alive():
                raise AssertionError(f"{process} exited:\n{log_of(cluster, process)[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            tail = log_of(cluster, process)[-3000:] if cluster is not None and process else ""
            raise AssertionError(f"{url} did not answer 200 in {timeout:.0f}s\n{tail}")
        time.sleep(0.1)


def metrics_text(url: str) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=5, context=ctx if url.startswith("https") else None) as resp:
        return str(resp.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.contextmanager
def session_operator_paused(cluster: DevCluster) -> Iterator[None]:
    """Stop the session's operator (other tests' fixture) while a test runs operators of its own: two
    leaders of different Leases would both act on every gate. Restarted as it was afterwards."""
    proc = cluster.processes().get("operator")
    running = proc is not None and proc.alive()
    if running:
        assert proc is not None
        cluster.stop_process("operator")  # SIGTERM: it releases its lease
    try:
        yield
    finally:
        if running:
            assert proc is not None
            cluster.register("operator", proc.argv, python_env())
            port = int(proc.argv[proc.argv.index("--metrics-port") + 1])
            wait_ready(cluster, "operator", port, want=None)


@dataclass
class ServedWebhook:
    process: str
    port: int
    unreachable: str  # what the API server said while the configurations pointed at the Service


async def serve_release_webhook(cluster: DevCluster, release: Release, *, probe: Callable[[], Obj],
                                refused: str, overrides: dict[str, str] | None = None) -> ServedWebhook:
    """Run the release's webhook Deployment here (as its ServiceAccount), wait until it published its
    caBundle in the release's configurations, record what the API server says while they point at the
    Service (unreachable here: no kube-proxy), point them at the local process (url), and return once
    the API server's answer to a dry-run create of `probe()` contains `refused`. The caller stops
    the process (and uninstalls the release) when done, also when this raises."""
    from gate.kube.client import DEPLOYMENTS, MUTATING_WEBHOOKS, NODEGATES, VALIDATING_WEBHOOKS
    from gate.kube.errors import ApiError

    prefix, ns = release.prefix, release.namespace
    process = f"{prefix}-webhook-a"
    async with await cluster.client() as kube:
        deployment = await kube.get(DEPLOYMENTS, f"{prefix}-webhook", ns)
        kubeconfig = await token_kubeconfig(cluster, f"{prefix}-webhook", ns)
        port = free_port()
        hosts = [*container_env(deployment, ns, process)["NODEGATE_WEBHOOK_HOSTS"].split(","), "127.0.0.1"]
        run_deployment(cluster, process, deployment, ns, kubeconfig, {
            "NODEGATE_WEBHOOK_LISTEN": f"127.0.0.1:{port}",  # the API server calls it on loopback
            "NODEGATE_WEBHOOK_HOSTS": ",".join(hosts),
            "NODEGATE_WEBHOOK_CERT_CHECK_SECONDS": "1", **(overrides or {})})
        await asyncio.to_thread(wait_https, f"https://127.0.0.1:{port}/readyz", cluster=cluster, process=process)

        async def published() -> str | None:
            bundles = set()
            for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
                config = await kube.get(res, prefix)
                bundles |= {w["clientConfig"].get("caBundle", "") for w in config["webhooks"]}
            return bundles.pop() if len(bundles) == 1 and "" not in bundles else None

        bundle = await wait_for(published, what="the webhook to publish its caBundle in the release's configurations")
        try:
            await kube.create(NODEGATES, probe(), dry_run=True)
            unreachable = "admitted"
        except ApiError as exc:
            unreachable = exc.message
        await point_at_loopback(kube, prefix, port, bundle)

        async def called() -> bool:
            try:
                await kube.create(NODEGATES, probe(), dry_run=True)
            except ApiError as exc:
                return "denied the request" in exc.message and refused in exc.message
            return False

        await wait_for(called, what="the API server to call the release's webhook")
    return ServedWebhook(process, port, unreachable)


async def wait_for(check: Callable[[], Awaitable[Any]], *, timeout: float = 60.0, what: str) -> Any:
    """Poll `check` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


async def point_at_loopback(kube: KubeClient, prefix: str, port: int, bundle: str) -> None:
    """Point every webhook of the release's two configurations at the webhook served on 127.0.0.1:`port`
    (the dev API server cannot reach a Service), keeping each path and trusting `bundle`."""
    from gate.kube.client import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS

    for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
        config = await kube.get(res, prefix)
        ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                "value": {"url": f"https://127.0.0.1:{port}{w['clientConfig']['service']['path']}",
                          "caBundle": bundle}} for i, w in enumerate(config["webhooks"])]
        await kube.patch(res, prefix, ops, patch_type="json")
