"""What cert-manager's controller and cainjector do for NodeGate's chart, done by the test.

* controller: for each Certificate, find its issuer (an Issuer in the namespace or a ClusterIssuer),
  sign (selfSigned: the certificate signs itself; ca: the issuer's Secret signs it), write the Secret
  `spec.secretName` (type kubernetes.io/tls with tls.crt, tls.key, ca.crt) and mark the Certificate
  Ready. A Certificate whose issuer's Secret does not exist yet waits for a later pass, as in
  cert-manager (the chart's CA chain needs two passes).
* cainjector: for each webhook configuration annotated `cert-manager.io/inject-ca-from: <ns>/<name>`,
  copy ca.crt of that Certificate's Secret into every webhook's caBundle.

Every reference is followed by name, so a chart whose names do not line up fails here.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from typing import Any

from gate.certs import pki
from gate.kube.client import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS, KubeClient, Resource
from gate.kube.errors import NotFound

CERTIFICATES = Resource("cert-manager.io", "v1", "certificates", True, "Certificate")
ISSUERS = Resource("cert-manager.io", "v1", "issuers", True, "Issuer")
CLUSTER_ISSUERS = Resource("cert-manager.io", "v1", "clusterissuers", False, "ClusterIssuer")
INJECT = "cert-manager.io/inject-ca-from"
Obj = dict[str, Any]


def go_duration(text: str) -> dt.timedelta:
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(h|m|s)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1}[unit]
    return dt.timedelta(seconds=total)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class FakeCertManager:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.issued: list[str] = []

    async def issue(self, namespace: str, *, only: str | None = None) -> None:
        """Issue every Certificate of `namespace` (or just `only`, again: a renewal)."""
        certificates, _ = await self.kube.list(CERTIFICATES, namespace)
        pending = [c for c in certificates if only is None or c["metadata"]["name"] == only]
        for _ in range(len(pending) + 1):
            waiting = []
            for cert in pending:
                if not await self._issue_one(cert):
                    waiting.append(cert)
            if not waiting:
                return
            pending = waiting
        raise AssertionError(f"Certificates never issued: {[c['metadata']['name'] for c in pending]}")

    async def _issue_one(self, cert: Obj) -> bool:
        spec, meta = cert["spec"], cert["metadata"]
        ns = meta["namespace"]
        ref = spec["issuerRef"]
        assert ref.get("group", "cert-manager.io") == "cert-manager.io", ref
        if ref.get("kind", "Issuer") == "ClusterIssuer":
            issuer = await self.kube.get(CLUSTER_ISSUERS, ref["name"])
        else:
            issuer = await self.kube.get(ISSUERS, ref["name"], ns)  # NotFound: a broken reference
        duration = go_duration(spec.get("duration", "2160h"))
        if "selfSigned" in issuer["spec"]:
            assert spec.get("isCA"), "a self-signed leaf is not what the chart asks for"
            pair = pki.create_ca(spec.get("commonName", meta["name"]), valid_for=duration)
            ca_pem = pair.cert_pem
        else:
            try:
                signer_secret = await self.kube.get(SECRETS, issuer["spec"]["ca"]["secretName"], ns)
            except NotFound:
                return False
            signer = pki.KeyPair(base64.b64decode(signer_secret["data"]["tls.crt"]),
                                 base64.b64decode(signer_secret["data"]["tls.key"]))
            pair = pki.issue(signer, spec.get("commonName", meta["name"]), hosts=spec.get("dnsNames", []),
                             server="server auth" in spec.get("usages", []), valid_for=duration)
            ca_pem = signer.cert_pem
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                  "metadata": {"name": spec["secretName"], "namespace": ns,
                               "annotations": {"cert-manager.io/certificate-name": meta["name"],
                                               "cert-manager.io/issuer-name": ref["name"]}},
                  "data": {"tls.crt": _b64(pair.cert_pem), "tls.key": _b64(pair.key_pem), "ca.crt": _b64(ca_pem)}}
        try:
            current = await self.kube.get(SECRETS, spec["secretName"], ns)
            secret["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.kube.replace(SECRETS, secret)
        except NotFound:
            await self.kube.create(SECRETS, secret, ns)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.kube.patch(CERTIFICATES, meta["name"], {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "Issued", "lastTransitionTime": now,
                            "message": "Certificate is up to date and has not expired"}],
            "notAfter": pair.not_after().strftime("%Y-%m-%dT%H:%M:%SZ")}},
            namespace=ns, subresource="status")
        self.issued.append(f"{ns}/{meta['name']}")
        return True

    async def inject(self, configuration: str) -> bytes:
        """cainjector: set caBundle of both configurations named `configuration`; returns the CA PEM."""
        ca = b""
        for res in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
            config = await self.kube.get(res, configuration)
            source = (config["metadata"].get("annotations") or {})[INJECT]
            ns, _, name = source.partition("/")
            cert = await self.kube.get(CERTIFICATES, name, ns)
            secret = await self.kube.get(SECRETS, cert["spec"]["secretName"], ns)
            ca = base64.b64decode(secret["data"]["ca.crt"])
            for hook in config["webhooks"]:
                hook["clientConfig"]["caBundle"] = _b64(ca)
            await self.kube.replace(res, config)
        return ca
