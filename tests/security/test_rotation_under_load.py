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
import json
import time
from pathlib import Path

from bench.admission.rotation import expire_ca_soon, expire_serving_soon, report, start_load
from gate.devcluster.cluster import DevCluster
from gate.kube.client import NODEGATES, KubeClient
from gate.kube.errors import ApiError
from tests.integration.conftest import Webhook

RATE = 1000.0
SECONDS = 16.0  # the CA move needs: notice (<= 2 s) + propagation (5 s) + notice (<= 2 s), after a start


async def test_certificates_rotate_under_load_without_a_failed_request(
        webhook: Webhook, cluster: DevCluster, kube: KubeClient, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    proc = await asyncio.to_thread(start_load, webhook.url, cluster.kubeconfig, RATE, SECONDS, out)
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
    try:
        await asyncio.sleep(2.0)
        await expire_serving_soon(kube)
        await asyncio.sleep(3.0)
        await expire_ca_soon(kube)
        await asyncio.to_thread(proc.wait, SECONDS + 60)
    finally:
        stop.set()
        await caller
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"the load process failed ({proc.returncode})"
    result = json.loads(out.read_text())
    print(f"\nrotation under load ({time.monotonic() - started:.0f} s):\n"
          + report(result, ["serving@2s", "CA@5s"])
          + f"\nthrough the API server: {len(through_api)} calls, "
          + f"{sum(o != 'denied' for o in through_api)} not answered by the webhook")
    assert result["failures"] == 0, result["failure_samples"]
    assert [o for o in through_api if o != "denied"] == [], through_api[:5]
    issuers = [result["issuers"][d] for d, _ in sorted(result["served"].items(), key=lambda kv: kv[1][0])]
    assert len(issuers) >= 3, f"expected the first, the renewed and the moved certificate to be served: {issuers}"
    assert issuers[-1] != issuers[0], "the serving certificate never moved to the new CA during the load"
    assert result["trust_updates"] >= 1, "the client never saw the new CA in the caBundle"
