"""NodeGate's own processes next to the dev control plane: the admission webhook and the operator.

They run out of cluster as local processes (the API server reaches the webhook on 127.0.0.1), under
the same bookkeeping as the control plane so `nodegate dev down` stops them too.
"""

from __future__ import annotations

from collections.abc import Callable

from gate.devcluster.cluster import DevCluster

Progress = Callable[[str], None]


def start(cluster: DevCluster, *, webhook: bool, operator: bool, progress: Progress) -> None:
    """Start the webhook and the operator that are asked for and not yet running."""
    if webhook:
        start_webhook(cluster, progress)
    if operator:
        progress("The operator is not part of this build yet; starting without it.")


# -- the admission webhook ---------------------------------------------------------------------------

WEBHOOK_PROCESS = "webhook"
WEBHOOK_CONFIGURATION = "nodegate"
WEBHOOK_SECRET = "nodegate-webhook-tls"
# Passes the CRD schema and its CEL rules, so only the webhook can refuse it: proof that the API
# server really calls the webhook.
_PROBE_POLICY = "nodegate-dev-probe-missing-policy"


def webhook_argv(cluster: DevCluster, port: int) -> list[str]:
    import sys

    return [sys.executable, "-m", "gate.cli.main", "webhook", "serve",
            "--kubeconfig", str(cluster.kubeconfig), "--listen", f"127.0.0.1:{port}",
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
        port = free_port()
        env = {"PYTHONPATH": str(Path(gate.__file__).resolve().parent.parent), "PYTHONUNBUFFERED": "1"}
        cluster.register(WEBHOOK_PROCESS, webhook_argv(cluster, port), env)
    deadline = time.monotonic() + timeout
    _wait_webhook_ready(cluster, port, deadline)
    asyncio.run(_register_webhook(cluster, port, deadline))
    progress(f"Admission webhook ready on https://127.0.0.1:{port}.")


def _wait_webhook_ready(cluster: DevCluster, port: int, deadline: float) -> None:
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
    import asyncio
    import base64
    import time

    from gate.admission.configuration import webhook_configurations
    from gate.certs.rotation import TRUST_BUNDLE
    from gate.devcluster.cluster import ClusterError
    from gate.kube.client import NODEGATES, SECRETS
    from gate.kube.errors import ApiError

    async with await cluster.client() as kube:
        secret = await kube.get(SECRETS, WEBHOOK_SECRET, "nodegate-system")
        bundle = base64.b64decode(secret["data"][TRUST_BUNDLE])
        for config in webhook_configurations(mode="url", url=f"https://127.0.0.1:{port}", ca_bundle=bundle,
                                             name=WEBHOOK_CONFIGURATION):
            await kube.apply(config, field_manager="nodegate-dev")
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
