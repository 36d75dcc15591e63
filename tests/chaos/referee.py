"""A referee inside the API server: a validating webhook that sees every write of the operator's replicas.

The replicas run as one ServiceAccount, each with a token of its own (a TokenRequest each). The API
server hands a webhook the token's ID (`userInfo.extra["authentication.kubernetes.io/credential-id"]`,
"JTI=<jti>"), so the referee knows which replica sent each write without asking the operator anything.
It records every write it admits (the API server calls it just before it stores an object), and it
can hold one replica's lease updates for a while before admitting them: that replica's renewals then
reach the API server late or not at all, while its other writes go through at once.

Registered with `matchConditions` on the operator's ServiceAccount, so nobody else's request is sent
to it, and `failurePolicy: Fail`, so no write of a replica goes unseen.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from gate.certs import pki
from gate.devcluster.cluster import free_port
from gate.kube.client import VALIDATING_WEBHOOKS, KubeClient

CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True)
class Write:
    at: float  # monotonic, when the referee admitted it
    replica: str
    operation: str
    resource: str  # group/resource[/subresource]
    name: str

    @property
    def lease(self) -> bool:
        return self.resource.startswith("coordination.k8s.io/leases")


def token_id(kubeconfig: Path) -> str:
    """The `jti` of the bearer token in a kubeconfig, as the API server reports it ("JTI=...")."""
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"JTI={claims['jti']}"


@dataclass
class Referee:
    username: str  # the ServiceAccount the replicas run as
    replicas: dict[str, str] = field(default_factory=dict)  # credential id -> replica name
    writes: list[Write] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # writes of the ServiceAccount by no known replica
    held: set[str] = field(default_factory=set)  # replicas whose lease updates are held
    hold_seconds: float = 25.0
    name: str = "nodegate-test-referee"
    _runner: web.AppRunner | None = None
    _ca: bytes = b""
    port: int = 0

    def of(self, replica: str, *, leases: bool = False) -> list[Write]:
        return [w for w in self.writes if w.replica == replica and w.lease == leases]

    async def _review(self, request: web.Request) -> web.Response:
        review: dict[str, Any] = await request.json()
        req = review["request"]
        extra = (req.get("userInfo") or {}).get("extra") or {}
        ids = extra.get(CREDENTIAL_ID) or []
        replica = next((self.replicas[i] for i in ids if i in self.replicas), None)
        res = req.get("resource") or {}
        resource = f"{res.get('group', '')}/{res.get('resource', '')}"
        if req.get("subResource"):
            resource += f"/{req['subResource']}"
        name = f"{req.get('namespace') or ''}/{req.get('name') or ''}"
        if replica is None:
            self.unknown.append(f"{req.get('operation')} {resource} {name} {ids}")
        else:
            write = Write(time.monotonic(), replica, str(req.get("operation")), resource, name)
            if write.lease and write.operation == "UPDATE" and replica in self.held:
                # Held: the replica's client gives up long before this ends, and a renewal admitted
                # this late carries a resourceVersion that someone else's takeover has made stale.
                await asyncio.sleep(self.hold_seconds)
                write = Write(time.monotonic(), replica, write.operation, write.resource, write.name)
            self.writes.append(write)
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": {"uid": req["uid"], "allowed": True}})

    async def start(self, kube: KubeClient) -> None:
        ca = pki.create_ca("nodegate-test-referee-ca")
        serving = pki.issue(ca, "127.0.0.1", hosts=["127.0.0.1"], server=True)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(serving.cert_pem)
            key.write_bytes(serving.key_pem)
            ctx.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_post("/review", self._review)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx).start()
        await kube.apply({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [{
                "name": "referee.nodegate.dev",
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/review",
                                 "caBundle": base64.b64encode(ca.cert_pem).decode()},
                "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
                           "resources": ["*/*"], "scope": "*"}],
                "matchConditions": [{"name": "operator-replicas",
                                     "expression": f"request.userInfo.username == '{self.username}'"}],
                "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 30,
                "admissionReviewVersions": ["v1"],
            }],
        }, field_manager="nodegate-test")

    async def stop(self, kube: KubeClient) -> None:
        await kube.delete(VALIDATING_WEBHOOKS, self.name)
        self.held.clear()
        if self._runner is not None:
            await self._runner.cleanup()
