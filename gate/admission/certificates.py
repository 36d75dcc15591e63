"""Keeping the serving certificate current while the server runs.

Self-managed mode: every replica runs the same level-triggered loop: read the Secret, let the pure
planner (`gate.certs.rotation.plan`) decide, write the result back with the resourceVersion it read
(two replicas racing: one write wins, the other gets a 409 and re-reads), load the pair into the live
TLS context, and make both webhook configurations carry the trust bundle. No leader is needed: every
write is conditional and idempotent, and every replica reloads from the same Secret.

Files mode: the pair comes from files (cert-manager, or a mounted Secret); they are re-read on an
interval and reloaded when they change. A pair caught half-written is skipped until the next read.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from typing import Any

from gate.admission.configuration import ca_bundles_of
from gate.certs.reload import CertificateError, ReloadableCertificate
from gate.certs.rotation import TLS_CERT, TLS_KEY, TRUST_BUNDLE, CertPolicy, from_secret_data, plan, to_secret_data
from gate.kube.client import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS, KubeClient
from gate.kube.errors import ApiError, Conflict, ConnectionFailed, NotFound

log = logging.getLogger(__name__)


class SelfManagedCertificates:
    def __init__(self, client: KubeClient, serving: ReloadableCertificate, *, namespace: str, secret_name: str,
                 policy: CertPolicy, configuration_name: str | None, interval: float = 60.0) -> None:
        self.client = client
        self.serving = serving
        self.namespace = namespace
        self.secret_name = secret_name
        self.policy = policy
        self.configuration_name = configuration_name
        self.interval = interval
        self.trust_bundle: bytes = b""
        self.rotations = 0

    async def reconcile(self) -> None:
        """One pass: make the Secret current, serve what it holds, publish its trust bundle."""
        for _ in range(5):
            secret = await self._read()
            meta = (secret or {}).get("metadata", {})
            state = from_secret_data((secret or {}).get("data"), meta.get("annotations"))
            decision = plan(state, self.policy, dt.datetime.now(dt.UTC))
            if decision.changed:
                try:
                    secret = await self._write(secret, decision.state)
                except Conflict:
                    continue  # another replica wrote first: read its result and judge again
                self.rotations += 1
                log.info("Rotated webhook certificates; secret=%s/%s reasons=%s", self.namespace,
                         self.secret_name, "; ".join(decision.reasons))
            assert secret is not None
            data = secret.get("data") or {}
            cert, key = base64.b64decode(data[TLS_CERT]), base64.b64decode(data[TLS_KEY])
            # The configurations trust the bundle before the pair is served: a pair another writer put
            # in the Secret (cert-manager, when a `helm upgrade` switches to it) chains to a CA that
            # only this bundle names, and served first it would fail every call until published.
            self.trust_bundle = base64.b64decode(data.get(TRUST_BUNDLE, ""))
            await self.publish_trust_bundle()
            if self.serving.load(cert, key):
                log.info("Loaded serving certificate; notAfter=%s", self.serving.not_after)
            return
        raise ConnectionFailed("the certificate Secret kept changing under us; will retry")

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self.client.get(SECRETS, self.secret_name, self.namespace)
        except NotFound:
            return None

    async def _write(self, current: dict[str, Any] | None, state: Any) -> dict[str, Any]:
        data, annotations = to_secret_data(state)
        if current is None:
            body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": self.secret_name, "namespace": self.namespace, "annotations": annotations,
                                 "labels": {"app.kubernetes.io/name": "nodegate",
                                            "app.kubernetes.io/component": "webhook"}},
                    "data": data}
            return await self.client.create(SECRETS, body, self.namespace)  # AlreadyExists is a Conflict too
        updated = dict(current)
        updated["data"] = data
        updated["metadata"] = {**current["metadata"],
                               "annotations": {**(current["metadata"].get("annotations") or {}), **annotations}}
        return await self.client.replace(SECRETS, updated)  # carries resourceVersion: a race is a 409

    async def publish_trust_bundle(self) -> None:
        """Both webhook configurations trust our CAs (absent configurations are left to their creator)."""
        if not self.configuration_name or not self.trust_bundle:
            return
        wanted = base64.b64encode(self.trust_bundle).decode()
        for resource in (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS):
            try:
                config = await self.client.get(resource, self.configuration_name)
            except NotFound:
                continue
            if all(b == wanted for b in ca_bundles_of(config)):
                continue
            for hook in config.get("webhooks", []):
                hook.setdefault("clientConfig", {})["caBundle"] = wanted
            try:
                await self.client.replace(resource, config)
                log.info("Patched caBundle; configuration=%s kind=%s", self.configuration_name, resource.kind)
            except Conflict:
                log.info("caBundle patch raced another writer; will retry; configuration=%s", self.configuration_name)

    async def run(self) -> None:
        backoff = 1.0
        while True:
            try:
                await self.reconcile()
                backoff = 1.0
                await asyncio.sleep(self.interval)
            except asyncio.CancelledError:
                raise
            except (ApiError, ConnectionFailed, CertificateError, KeyError, ValueError) as exc:
                log.warning("Certificate reconcile failed; error=%s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.interval)


class FileCertificates:
    def __init__(self, serving: ReloadableCertificate, settings_files: tuple[Any, Any], *,
                 interval: float = 10.0) -> None:
        self.serving = serving
        self.cert_file, self.key_file = settings_files
        self.interval = interval

    async def reconcile(self) -> None:
        if self.serving.load_files(self.cert_file, self.key_file):
            log.info("Loaded serving certificate; file=%s notAfter=%s", self.cert_file, self.serving.not_after)

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except CertificateError as exc:
                log.warning("Serving certificate not (re)loaded; error=%s", exc)
            await asyncio.sleep(self.interval)
