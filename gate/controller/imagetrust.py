"""The cluster's image signature policy as the operator holds it: its file, its verifier, its verdicts.

`--image-signatures FILE` (the chart mounts `operator.imageSignatures` from a ConfigMap) names the
policy (`gate.api.signatures`). `ImageTrust` reads it, asks the verifier (`gate.controller.signatures`)
about each digest the image resolver hands it (`gate.controller.images`), and keeps the verdicts that
the stage pods' images are checked against (`trusted`: `gate.lifecycle.signatures`).

Decisions:

* **Read at start, strictly.** A file that is missing or does not parse stops the operator's start
  with the field named (`read_policy`): a typo must not start an operator that verifies nothing.
* **Read again when it changes** (its modification time and size, looked at on each use and by the
  operator's watch, `changed`): a ConfigMap mounted as a volume changes in place. A new version that
  does not parse keeps the last good policy, and the log says why (the operator does not fall open).
  A new fingerprint starts a new verifier and forgets every verdict: every digest is judged again
  before another stage pod pulls it, and the operator reconciles every gate at once.
* **A verdict is asked again at each reconcile of its gate.** The verifier answers from its cache by
  digest and policy fingerprint, so this costs a registry round trip only once per digest and policy;
  what is kept here is only what the node reconciles look up, in memory, never from the status.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gate.api.signatures import SignaturePolicy, Verdict, load_policy
from gate.controller.metrics import OperatorMetrics
from gate.controller.settings import OperatorSettings
from gate.controller.signatures import SignatureVerifier
from gate.lifecycle.signatures import agent_image, trusted_digests

log = logging.getLogger("nodegate.operator")


def read_policy(path: str) -> SignaturePolicy:
    """The policy in the file; ValueError naming the file and the field when it cannot be used."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"image signature policy {path} cannot be read: {exc.strerror or exc}") from None
    return load_policy(text, source=path)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class ImageTrust:
    """The policy of the file `settings.image_signatures` (none: nothing is verified) and its verdicts."""

    def __init__(self, settings: OperatorSettings, metrics: OperatorMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.path = Path(settings.image_signatures) if settings.image_signatures else None
        self.policy: SignaturePolicy | None = None
        self.verifier: SignatureVerifier | None = None
        self._stamp: tuple[int, int] | None = None
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._trusted: frozenset[tuple[str, str]] | None = None
        self._counted = (0, 0)
        if self.path is not None:
            self._stamp = _stamp(self.path)
            self._use(read_policy(str(self.path)))
            if agent_image(settings.agent_image) is None:
                log.info("The agent image is a tag: it is resolved to a digest, judged like a package's and "
                         "pulled by that digest once a gate needs it; agent_image=%s", settings.agent_image)

    def _use(self, policy: SignaturePolicy) -> None:
        self.policy = policy
        self.verifier = SignatureVerifier(policy, timeout=self.settings.resolve_timeout,
                                          token_hosts=self.settings.token_hosts,
                                          plain_http=self.settings.plain_http_registries)
        self._verdicts = {}
        self._trusted = None
        self._counted = (0, 0)  # the verifier's lookups and requests already counted in the metrics
        log.info("Read the image signature policy; path=%s mode=%s unmatched=%s rules=%s fingerprint=%s", self.path,
                 policy.mode, policy.unmatched, ",".join(r.name for r in policy.rules) or "none",
                 policy.fingerprint())

    def changed(self) -> bool:
        """Read the file again if it changed; True when the policy did (every gate is then reconciled)."""
        if self.path is None:
            return False
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy = read_policy(str(self.path))
        except ValueError as exc:
            log.error("Image signature policy not read, the last good one is kept; path=%s error=%s", self.path, exc)
            return False
        if self.policy is not None and policy.fingerprint() == self.policy.fingerprint():
            return False
        self._use(policy)
        return True

    def current(self) -> SignaturePolicy | None:
        self.changed()
        return self.policy

    def trusted(self) -> frozenset[tuple[str, str]] | None:
        """(reference, digest) pairs a stage pod may pull; None without a policy (any recorded digest)."""
        if self.current() is None or self.policy is None:
            return None
        if self._trusted is None:
            self._trusted = trusted_digests(self._verdicts, self.policy)
        return self._trusted

    async def judge(self, reference: str, digest: str, credentials: tuple[str, str] | None) -> Verdict:
        """The policy's verdict on the image digest (the verifier's, cached by digest and policy)."""
        if self.verifier is None:
            raise RuntimeError("no image signature policy is configured")
        verifier = self.verifier
        verdict = await verifier.verify(reference, digest, credentials)
        if verifier is not self.verifier:  # the policy changed meanwhile: this verdict is of the old one
            return await self.judge(reference, digest, credentials)
        lookups, requests = self._counted
        self.metrics.signature_lookups.inc(verifier.lookups - lookups)
        self.metrics.signature_requests.inc(verifier.requests - requests)
        self._counted = (verifier.lookups, verifier.requests)
        key = (reference, digest)
        if self._verdicts.get(key) != verdict:
            self._verdicts[key] = verdict
            self._trusted = None
            self.metrics.image_verifications.labels(verdict.reason).inc()
        return verdict
