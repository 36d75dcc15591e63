"""Admission across an object's life: defaults, UPDATE rules, DELETE of a referenced policy, and the
webhook's own certificate rotated while the API server keeps calling it."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import json
import ssl
import time

import pytest

from gate.api.keys import DISABLED_ANNOTATION, state_annotation, status_label
from gate.certs import pki
from gate.certs.rotation import SIGNER_CERT, SIGNER_KEY, TLS_CERT, TLS_KEY
from gate.devcluster.services import WEBHOOK_SECRET
from gate.kube.client import NODEGATES, NODES, POLICIES, SECRETS, KubeClient
from gate.kube.errors import ApiError
from tests.conftest import Kubectl, unique
from tests.integration.conftest import Webhook


def nodegate(name: str, packages: dict[str, dict[str, object]], **spec: object) -> dict[str, object]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"packages": packages, **spec}}


async def test_defaults_are_filled_on_create(kube: KubeClient, webhook: Webhook) -> None:
    policy, gate = unique("dp"), unique("ng")
    created = await kube.create(POLICIES, {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                                           "metadata": {"name": policy}, "spec": {"compartments": [
                                               {"name": "canary", "selector": {"matchLabels": {"pool": "c"}},
                                                "budget": {"count": 1}, "strategy": {"exponential": {}}}]}})
    try:
        strategy = created["spec"]["compartments"][0]["strategy"]["exponential"]
        assert strategy == {"initialBatch": 1, "batchThreshold": 100, "failureThreshold": 3, "safetyLimit": 50,
                            "growthFactor": 2}
        assert created["spec"]["default"]["strategy"] == {"fixed": {"initialBatch": 1, "batchThreshold": 100,
                                                                    "failureThreshold": 3, "safetyLimit": 50}}
        ng = await kube.create(NODEGATES, nodegate(gate, {}, deploymentPolicy=policy))
        assert ng["spec"]["priority"] == 200 and ng["spec"]["sequencing"] == "node"
        kept = await kube.create(NODEGATES, nodegate(unique("ng"), {}, priority=5, sequencing="all"), dry_run=True)
        assert kept["spec"]["priority"] == 5 and kept["spec"]["sequencing"] == "all"
    finally:
        await kube.delete(NODEGATES, gate)
        await _delete_policy_eventually(kube, policy)


async def _delete_policy_eventually(kube: KubeClient, name: str) -> None:
    # The gate may still carry the operator's finalizer for a moment; until it is gone it references.
    deadline = time.monotonic() + 30
    while True:
        try:
            await kube.delete(POLICIES, name)
            return
        except ApiError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_policy_delete_is_refused_while_a_gate_references_it(kubectl: Kubectl, kube: KubeClient,
                                                                    webhook: Webhook) -> None:
    policy, gate = unique("dp"), unique("ng")
    await kube.create(POLICIES, {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                                 "metadata": {"name": policy}, "spec": {}})
    await kube.create(NODEGATES, nodegate(gate, {}, deploymentPolicy=policy))
    try:
        proc = kubectl.run("delete", "deploymentpolicies.nodegate.io", policy, check=False)
        assert proc.returncode != 0
        assert f'DeploymentPolicy "{policy}" is still referenced by NodeGate(s) {gate}' in proc.stderr, proc.stderr
    finally:
        await kube.delete(NODEGATES, gate)
    await _delete_policy_eventually(kube, policy)


async def test_downgrade_needs_the_uninstall_path(kube: KubeClient, webhook: Webhook) -> None:
    gate = unique("ng")
    pkg = {"version": "1.2.0", "image": "ghcr.io/example/tuned"}
    await kube.create(NODEGATES, nodegate(gate, {"tuned": pkg}))
    try:
        down = [{"op": "replace", "path": "/spec/packages/tuned/version", "value": "1.1.0"}]
        try:
            await kube.patch(NODEGATES, gate, down, patch_type="json")
            raise AssertionError("the downgrade was admitted")
        except ApiError as exc:
            assert "spec.packages[tuned].version: downgrade from 1.2.0 to 1.1.0 needs the uninstall path" \
                in exc.message, exc.message
        # with uninstall enabled first, the same downgrade goes through
        await kube.patch(NODEGATES, gate, {"spec": {"packages": {"tuned": {"uninstall": {"enabled": True}}}}})
        await kube.patch(NODEGATES, gate, down, patch_type="json")
    finally:
        await kube.delete(NODEGATES, gate)


async def test_package_removal_waits_until_uninstalled_everywhere(kube: KubeClient, webhook: Webhook) -> None:
    gate, node = unique("ng"), unique("node")
    pkg = {"version": "1.0.0", "image": "ghcr.io/example/tuned", "uninstall": {"enabled": True}}
    other = {"version": "1.0.0", "image": "ghcr.io/example/other"}
    # Disabled: an operator running in the session (tests/docs start one) would otherwise take the
    # node's hand-written record for a forged one and write its own over it, with nothing installed,
    # and the removal this test expects refused would be admitted (CI stop 32 failed on that race).
    await kube.create(NODEGATES, {**nodegate(gate, {"tuned": pkg, "other": other}),
                                  "metadata": {"name": gate, "annotations": {DISABLED_ANNOTATION: "true"}}})
    state = json.dumps({"v": 1, "status": "complete", "installed": {"tuned": {"version": "1.0.0"}}})
    await kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {status_label(gate): "complete"}, "annotations": {state_annotation(gate): state}}})
    remove = [{"op": "remove", "path": "/spec/packages/tuned"}]
    try:
        try:
            await kube.patch(NODEGATES, gate, remove, patch_type="json")
            raise AssertionError("the removal was admitted")
        except ApiError as exc:
            assert f"spec.packages[tuned]: cannot be removed while still installed on 1 node(s) ({node})" \
                in exc.message, exc.message
        # once the operator recorded the uninstall, the removal goes through
        done = json.dumps({"v": 1, "status": "complete", "installed": {}})
        await kube.patch(NODES, node, {"metadata": {"annotations": {state_annotation(gate): done}}})
        await kube.patch(NODEGATES, gate, remove, patch_type="json")
    finally:
        await kube.delete(NODEGATES, gate)
        await kube.delete(NODES, node)


def _served_fingerprint(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


async def test_serving_certificate_rotates_without_a_failed_request(kube: KubeClient, webhook: Webhook) -> None:
    """Another replica (simulated) puts a new serving certificate into the Secret; the running webhook
    serves it without a restart while the API server keeps calling it, and no call fails."""
    before = _served_fingerprint(webhook.port)
    secret = await kube.get(SECRETS, WEBHOOK_SECRET, "nodegate-system")
    data = secret["data"]
    signer = pki.KeyPair(base64.b64decode(data[SIGNER_CERT]), base64.b64decode(data[SIGNER_KEY]))
    fresh = pki.issue(signer, "nodegate-webhook", hosts=["127.0.0.1", "localhost"], server=True,
                      valid_for=dt.timedelta(days=90))
    probe = nodegate("rotation-probe", {}, deploymentPolicy="no-such-policy-rotation")
    outcomes: list[str] = []
    stop = asyncio.Event()

    async def keep_calling() -> None:
        while not stop.is_set():
            try:
                await kube.create(NODEGATES, probe, dry_run=True)
                outcomes.append("admitted")
            except ApiError as exc:
                outcomes.append("denied" if "no-such-policy-rotation" in exc.message else f"failed: {exc.message}")
            await asyncio.sleep(0.02)

    caller = asyncio.create_task(keep_calling())
    try:
        await asyncio.sleep(0.5)
        secret["data"] = {**data, TLS_CERT: base64.b64encode(fresh.cert_pem).decode(),
                          TLS_KEY: base64.b64encode(fresh.key_pem).decode()}
        await kube.replace(SECRETS, secret)
        deadline = time.monotonic() + 30
        while _served_fingerprint(webhook.port) == before:
            assert time.monotonic() < deadline, "the webhook never served the new certificate"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # calls over new connections after the switch
    finally:
        stop.set()
        await caller
    assert outcomes and set(outcomes) == {"denied"}, [o for o in outcomes if o != "denied"][:3]


DENIED_NODEGATE_CREATES = ('nodegate_admission_requests_total{kind="NodeGate",operation="CREATE",verdict="denied",'
                           'webhook="validate"}')


def _scrape(webhook: Webhook) -> str:
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"{webhook.url}/metrics", context=ctx, timeout=5) as resp:
        return str(resp.read().decode())


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_by_kind_operation_and_verdict(kube: KubeClient, webhook: Webhook) -> None:
    before = _sample(await asyncio.to_thread(_scrape, webhook), DENIED_NODEGATE_CREATES)
    with pytest.raises(ApiError) as denied:  # the webhook's own denial: CEL knows nothing of other objects
        await kube.create(NODEGATES, nodegate(unique("ng"), {}, deploymentPolicy="no-such-policy-metrics"),
                          dry_run=True)
    assert 'DeploymentPolicy "no-such-policy-metrics" does not exist' in denied.value.message, denied.value.message
    text = await asyncio.to_thread(_scrape, webhook)
    assert _sample(text, DENIED_NODEGATE_CREATES) >= before + 1, text
    timed = [line for line in text.splitlines() if line.startswith("nodegate_admission_duration_seconds_bucket{")
             and all(label in line for label in ('kind="NodeGate"', 'operation="CREATE"', 'verdict="denied"',
                                                  'le="+Inf"'))]
    assert timed and float(timed[0].rsplit(" ", 1)[1]) >= 1, timed
