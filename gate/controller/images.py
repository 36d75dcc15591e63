"""Resolving a gate's package images to digests (`gate.lifecycle.images` decides which; this asks).

`ImageResolver.resolve(gate)` resolves each package that `to_resolve` names, with the package's pull
credentials, and returns the records that resolved and, per package, why one did not. The gate
reconciler records them in the status once per rollout (`gate.controller.gates`).

Pull credentials: the package's `imagePullSecrets`, read from the namespace where its stage pods run
(the operator's), as the kubelet reads them for the pod. The operator's default RBAC grants no read
of Secrets there: that namespace also holds the webhook's serving key, and the names of pull Secrets
are the packages' own, unknown to the chart. A cluster admin who needs private registries grants
`get` on exactly the pull Secrets' names (resourceNames; docs/security.md). A Secret the operator
may not read is skipped, and a refusal by the registry then says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from gate.api.nodegate import ImageRecord, NodeGate, Package
from gate.controller.metrics import OperatorMetrics
from gate.controller.registry import RegistryError, credentials_for, docker_config, resolve_digest, target_of
from gate.controller.settings import OperatorSettings
from gate.kube.client import SECRETS, KubeClient
from gate.kube.errors import ApiError
from gate.lifecycle.images import to_resolve

log = logging.getLogger("nodegate.operator")


class ImagesUnresolved(Exception):
    """A gate's package images could not all be resolved: its reconcile is retried with backoff (the
    work queue's, as for a temporary API error), and nothing of those packages starts meanwhile."""


class ImageResolver:
    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics

    async def resolve(self, gate: NodeGate, also: Sequence[NodeGate] = ()) -> tuple[list[ImageRecord], dict[str, str]]:
        """Records of the images resolved now (the gate's, and those of the specs in `also`: where a
        failed batch goes back to), and the packages that failed with why."""
        wanted = sorted(to_resolve(gate, also).items())
        if not wanted:
            return [], {}
        results = await asyncio.gather(*(self._one(gate.name, name, ref, package) for (name, ref), package in wanted))
        records = [r for r in results if isinstance(r, ImageRecord)]
        problems = {name: r for ((name, _), _), r in zip(wanted, results, strict=True) if isinstance(r, str)}
        return records, problems

    async def _one(self, gate: str, package: str, reference: str, spec: Package) -> ImageRecord | str:
        secrets = [s.name for s in spec.image_pull_secrets]
        notes: list[str] = []
        credentials = None
        target = target_of(reference)
        if secrets and not isinstance(target, str):
            credentials = await self._credentials(target.registry, secrets, notes)
        try:
            digest = await resolve_digest(reference, credentials, timeout=self.settings.resolve_timeout,
                                          token_hosts=self.settings.token_hosts)
        except RegistryError as exc:
            self.metrics.image_resolutions.labels("failed").inc()
            log.warning("Image not resolved; gate=%s package=%s image=%s error=%s", gate, package, reference, exc)
            return f"{exc}{''.join(f'; {n}' for n in notes)}"
        self.metrics.image_resolutions.labels("resolved").inc()
        log.info("Resolved image; gate=%s package=%s image=%s digest=%s", gate, package, reference, digest)
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return ImageRecord(package=package, reference=reference, digest=digest, resolved_at=now)

    async def _credentials(self, registry: str, secrets: list[str], notes: list[str]) -> tuple[str, str] | None:
        namespace = self.settings.namespace
        for name in secrets:
            try:
                secret = await self.client.get(SECRETS, name, namespace)
            except ApiError as exc:
                notes.append(f"pull Secret {namespace}/{name} not read ({exc.status} {exc.reason})")
                continue
            config = docker_config(secret)
            if config is None:
                notes.append(f"pull Secret {namespace}/{name} holds no docker config")
                continue
            found = credentials_for(registry, config)
            if found is not None:
                return found
        return None
