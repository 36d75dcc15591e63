"""The webhook's certificates rotate under load without a failed request.

The session's webhook (`nodegate webhook serve`, self-managed certificates in the Secret, checked
every 2 s, a new CA trusted 5 s before the serving certificate moves to it) gets 1,000 AdmissionReviews
a second offered from a separate process (bench/admission/rotation.py: keep-alive connections, every
20th request on a new one, trusting the configuration's caBundle as the API server does) while the
API server keeps calling it too. Two rotations happen during the load, both decided by the webhook's
own planner: the serving certificate nears expiry (renewed from the same CA), then the CA does (a new
CA enters the caBundle, the serving certificate moves to it after the propagation delay). Zero
requests may fail, from either client, and the new certificates must really have been served.
The rate reached on this machine is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from bench.admission.rotation import expire_ca_soon, expire_serving_soon, report, start_load
from gate.devcluster.cluster import DevCluster
from gate.kube.client import NODEGATES, KubeClient
from gate.kube.errors import ApiError
from tests.integration.conftest import Webhook

RATE = 1000.0
MAX_SECONDS = 60.0  # the load stops once both rotations were served, long before this


def served(port: int) -> tuple[str, str]:
    """(fingerprint, issuer) of the certificate the webhook serves a new connection now."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only looking at what is served
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()[:16], x509.load_der_x509_certificate(der).issuer.rfc4514_string()


async def _until_served(port: int, check: Callable[[tuple[str, str]], bool], what: str,
                        timeout: float = 40.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        now = await asyncio.to_thread(served, port)
        if check(now):
            return now
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_certificates_rotate_under_load_without_a_failed_request(
        webhook: Webhook, cluster: DevCluster, kube: KubeClient, tmp_path: Path) -> None:
    out, stop_file = tmp_path / "load.json", tmp_path / "stop"
    first = await asyncio.to_thread(served, webhook.port)
    proc = await asyncio.to_thread(start_load, webhook.url, cluster.kubeconfig, RATE, MAX_SECONDS, out,
                                   stop_file=stop_file)
    probe = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": "rotation-load-probe"},
             "spec": {"deploymentPolicy": "no-such-policy-rotation-load"}}
    through_api: list[str] = []
    stop = asyncio.Event()

    async def api_server_calls() -> None:
        while not stop.is_set():
            try:
                await kube.create(NODEGATES, probe, dry_run=True)
                through_api.append("admitted")
            except ApiError as exc:
                through_api.append("denied" if "no-such-policy-rotation-load" in exc.message
                                   else f"failed: {exc.message}")
            await asyncio.sleep(0.05)

    caller = asyncio.create_task(api_server_calls())
    started = time.monotonic()
    marks = []
    try:
        await asyncio.sleep(2.0)
        await expire_serving_soon(kube)
        renewed = await _until_served(webhook.port, lambda now: now[0] != first[0], "the renewed serving certificate")
        marks.append(f"serving renewed@{time.monotonic() - started:.1f}s")
        await asyncio.sleep(1.0)
        await expire_ca_soon(kube)
        await _until_served(webhook.port, lambda now: now[1] != renewed[1], "a serving certificate from the new CA")
        marks.append(f"moved to the new CA@{time.monotonic() - started:.1f}s")
        await asyncio.sleep(2.0)  # keep the load on the moved certificate for a while
    finally:
        stop_file.touch()
        stop.set()
        await caller
        await asyncio.to_thread(proc.wait, 60)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"the load process failed ({proc.returncode})"
    result = json.loads(out.read_text())
    print("\nrotation under load:\n" + report(result, marks)
          + f"\nthrough the API server: {len(through_api)} calls, "
          + f"{sum(o != 'denied' for o in through_api)} not answered by the webhook")
    assert result["failures"] == 0, result["failure_samples"]
    assert [o for o in through_api if o != "denied"] == [], through_api[:5]
    issuers = [result["issuers"][d] for d, _ in sorted(result["served"].items(), key=lambda kv: kv[1][0])]
    assert len(issuers) >= 3, f"expected the first, the renewed and the moved certificate to be served: {issuers}"
    assert issuers[-1] != issuers[0], "the load never saw the certificate from the new CA"
    assert result["trust_updates"] >= 1, "the client never saw the new CA in the caBundle"
