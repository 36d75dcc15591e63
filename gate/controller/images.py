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
from gate.api.signatures import Verdict
from gate.controller.imagetrust import ImageTrust
from gate.controller.metrics import OperatorMetrics
from gate.controller.registry import RegistryError, credentials_for, docker_config, resolve_digest, target_of
from gate.controller.settings import OperatorSettings
from gate.kube.client import SECRETS, KubeClient
from gate.kube.errors import ApiError
from gate.lifecycle.images import AGENT, pinned_images, to_resolve
from gate.lifecycle.signatures import Judged, agent_image, held, recorded_verdict, warned

log = logging.getLogger("nodegate.operator")


class ImagesUnresolved(Exception):
    """A gate's package images could not all be resolved: its reconcile is retried with backoff (the
    work queue's, as for a temporary API error), and nothing of those packages starts meanwhile."""


class ImagesUnverified(ImagesUnresolved):
    """A gate's package images failed the image signature policy in enforce mode: held and retried as
    an image that does not resolve, once the status and an Event say which image and why."""


class ImageResolver:
    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics,
                 trust: ImageTrust | None = None) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.trust = trust or ImageTrust(settings, metrics)
        self._agent_lock = asyncio.Lock()  # the agent's tag is resolved once, not by every gate at once

    async def verify(self, gate: NodeGate, records: Sequence[ImageRecord], also: Sequence[NodeGate] = (),
                     ) -> tuple[list[ImageRecord], list[Judged], dict[str, str]]:
        """With an image signature policy: the records with what it decided for each digest; each image
        judged (the records', and those pinned by digest in the specs, which have no record); and the
        packages whose signatures could not be read, with why (held as an image that does not resolve,
        and retried). The verifier answers from its cache once it has judged a digest under this policy."""
        policy = self.trust.current()
        if policy is None:  # none (any more): no record claims a verdict
            return [r.model_copy(update={"verified": None}) if r.verified else r for r in records], [], {}
        packages = {name: p for spec in (gate, *also) for name, p in reversed(spec.spec.packages.items())}
        agent = await self._agent(gate.name)
        images = [*records, *pinned_images(gate, also), *([agent] if isinstance(agent, ImageRecord) else [])]
        verdicts = await asyncio.gather(*(self._judge(gate.name, r, packages.get(r.package)) for r in images))
        judged = [Judged(r, v) for r, v in zip(images, verdicts, strict=True) if not isinstance(v, str)]
        unread = {r.package: v for r, v in zip(images, verdicts, strict=True) if isinstance(v, str)}
        if isinstance(agent, str):
            unread[AGENT] = agent
        now = datetime.now(UTC)
        kept = {(j.record.package, j.record.reference): j for j in judged}
        out = [recorded_verdict(j, policy, now) if (j := kept.get((r.package, r.reference))) else r for r in records]
        return out, judged, unread

    async def _agent(self, gate: str) -> ImageRecord | str:
        """NodeGate's own agent image as a record to judge, or why its tag could not be resolved (the gate is
        then held as for a package image that does not resolve, and retried). A tagged agent image (the
        chart's default, `image.tag`) is resolved once per process, the first time a policy needs it, and
        pinned: every stage and prepull pod made from then on names the digest that was judged, so the
        tag cannot name other content at a later pull (docs/supply-chain.md)."""
        async with self._agent_lock:
            image = self.settings.agent_image
            pinned = agent_image(image)
            if pinned is not None:
                return pinned
            try:
                digest = await self._digest(image, None)
            except RegistryError as exc:
                log.warning("Agent image not resolved, every gate waits; gate=%s image=%s error=%s", gate, image, exc)
                return (f"NodeGate's agent image {image} (in every stage pod) could not be resolved to a digest, so "
                        f"its signature cannot be verified: {exc}")
            self.settings.pin_agent_image(f"{image.rpartition(':')[0]}@{digest}")
            log.info("Pinned the agent image by digest, stage pods pull it so; image=%s digest=%s pinned=%s", image,
                     digest, self.settings.agent_image)
            record = agent_image(self.settings.agent_image)
            assert record is not None
            return record

    def verdicts_of(self, gate: str, judged: Sequence[Judged]) -> tuple[list[Judged], list[Judged]]:
        """The images that hold the gate (enforce mode) and those that run with a warning (warn mode)."""
        policy = self.trust.policy
        if policy is None:
            return [], []
        refused, warned_ = held(judged, policy), warned(judged, policy)
        self.metrics.images_unverified.labels(gate).set(len(refused) + len(warned_))
        return refused, warned_

    async def _judge(self, gate: str, record: ImageRecord, spec: Package | None) -> Verdict | str:
        notes: list[str] = []
        credentials = await self._credentials_of(record.reference, spec, notes)
        try:
            verdict = await self.trust.judge(record.reference, record.digest, credentials)
        except RegistryError as exc:
            log.warning("Image signatures not read; gate=%s package=%s image=%s digest=%s error=%s", gate,
                        record.package, record.reference, record.digest, exc)
            return (f"the signatures of {record.reference} (digest {record.digest}) could not be read: "
                    f"{exc}{''.join(f'; {n}' for n in notes)}")
        if not verdict.ok:
            log.warning("Image not verified; gate=%s package=%s image=%s digest=%s reason=%s rule=%s message=%s%s",
                        gate, record.package, record.reference, record.digest, verdict.reason, verdict.rule,
                        verdict.message, "".join(f"; {n}" for n in notes))
        return verdict

    async def _credentials_of(self, reference: str, spec: Package | None,
                              notes: list[str]) -> tuple[str, str] | None:
        """The package's pull credentials for the registry of `reference`, as its stage pods would use them."""
        secrets = [s.name for s in spec.image_pull_secrets] if spec is not None else []
        target = target_of(reference)
        if not secrets or isinstance(target, str):
            return None
        return await self._credentials(target.registry, secrets, notes)

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
        notes: list[str] = []
        credentials = await self._credentials_of(reference, spec, notes)
        try:
            digest = await self._digest(reference, credentials)
        except RegistryError as exc:
            log.warning("Image not resolved; gate=%s package=%s image=%s error=%s", gate, package, reference, exc)
            return f"{exc}{''.join(f'; {n}' for n in notes)}"
        log.info("Resolved image; gate=%s package=%s image=%s digest=%s", gate, package, reference, digest)
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return ImageRecord(package=package, reference=reference, digest=digest, resolved_at=now)

    async def _digest(self, reference: str, credentials: tuple[str, str] | None) -> str:
        """The digest the tag names now, counted; RegistryError when it cannot be resolved."""
        try:
            digest = await resolve_digest(reference, credentials, timeout=self.settings.resolve_timeout,
                                          token_hosts=self.settings.token_hosts,
                                          plain_http=self.settings.plain_http_registries)
        except RegistryError:
            self.metrics.image_resolutions.labels("failed").inc()
            raise
        self.metrics.image_resolutions.labels("resolved").inc()
        return digest

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
