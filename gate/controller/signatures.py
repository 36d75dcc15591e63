"""Image signature verification against the cluster's policy (issue 34): the registry reads.

`SignatureVerifier(policy).verify(reference, digest, credentials)` finds the cosign signatures of
one image digest at its registry and returns the policy's `Verdict` (`gate.api.cosign.judge`, pure).
It never shells out to cosign: the formats are read and the signatures checked with `cryptography`.

Decisions:

* **Both formats, looked up side by side.** The simple-signing manifest (tag `sha256-<hex>.sig`) and
  the Sigstore bundles (the OCI referrers API, `GET /v2/<name>/referrers/<digest>`, and when the
  registry does not offer it, the tag schema's fallback index under `sha256-<hex>`) are asked for at
  once; each signature's payload or bundle is then fetched by digest, and checked against it by the
  registry client (`gate.controller.registry.RegistrySession`).
* **Once per digest and policy.** A verdict is cached by (repository, digest, policy fingerprint):
  the same digest in the next rollout costs no request, and a changed policy (a new fingerprint)
  verifies again. Concurrent verifications of one digest share one lookup. A verdict that fails is
  kept only `FAILURE_TTL` seconds: an image signed after it was refused runs on a later retry of its
  gate (the work queue's backoff), without a policy change or a restart.
* **A registry that cannot be read is an error, not a verdict.** A 401, a timeout or a malformed
  answer raises `RegistryError`, as a resolution does; the operator retries it like one. Only what
  was read decides (a 404 under the signature tag is "no signature there"). Errors are not cached.
* **The requests**: the simple-signing tag, the referrers API and its fallback tag in parallel (one
  round trip); then the payload blobs of a `.sig` manifest (a second), or the referrer manifests and
  then their bundles (a second and a third). `requests` counts them (docs/supply-chain.md has the
  figures on distribution v3.1.2, which has no referrers API).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Collection
from dataclasses import dataclass
from typing import TypeVar, cast

from gate.api.cosign import (
    Evidence,
    bundle_evidence,
    bundle_layers,
    judge,
    referrer_candidates,
    referrers_tag,
    signature_tag,
    simplesigning_evidence,
    simplesigning_layers,
)
from gate.api.references import qualified
from gate.api.signatures import Format, SignaturePolicy, Verdict
from gate.controller.registry import (
    DigestMismatch,
    RegistryError,
    RegistrySession,
    Target,
    registry_session,
    target_of,
)

T = TypeVar("T")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MAX_BUNDLE = 1024 * 1024  # a Sigstore bundle with a certificate chain is a few KiB
CACHE_SIZE = 4096
FAILURE_TTL = 30.0  # seconds a failed verdict is kept: a signature pushed after a refusal is seen soon


async def _all(*aws: Awaitable[T]) -> list[T]:
    """Every result, awaited side by side; the first failure is raised once all have ended (none is
    left running against a session about to close, and none goes unretrieved)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


def repository_of(reference: str) -> Target | str:
    """The registry and repository of a reference, tagged or pinned by digest, or why it names none."""
    name, _, pinned = reference.partition("@")
    last = name.rpartition("/")[2]
    target = target_of(name if ":" in last else f"{name}:latest")
    if isinstance(target, str):
        return target
    return Target(target.registry, target.repository, pinned or target.tag)


@dataclass(frozen=True)
class Lookup:
    """What a lookup found: the signatures, and where the bundles were listed (for the CLI and docs)."""

    evidence: list[Evidence]
    referrers_api: bool  # the registry answered the OCI referrers API (else its fallback tag was read)


class SignatureVerifier:
    """Finds an image digest's cosign signatures and judges them by the policy, once per digest."""

    def __init__(self, policy: SignaturePolicy, *, timeout: float = 10.0, token_hosts: Collection[str] = (),
                 plain_http: Collection[str] = ()) -> None:
        self.policy = policy  # hashed once per assignment (the setter), not per verification
        self.timeout = timeout
        self.token_hosts = tuple(token_hosts)
        self.plain_http = tuple(plain_http)
        self._cache: OrderedDict[tuple[str, str, str], tuple[Verdict, float | None]] = OrderedDict()
        self._pending: dict[tuple[str, str, str], asyncio.Future[Verdict]] = {}
        self.lookups = 0  # registry lookups made (cache misses that reached a registry): the cost figure
        self.requests = 0  # HTTP requests those lookups sent

    @property
    def policy(self) -> SignaturePolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: SignaturePolicy) -> None:
        """A new policy: verdicts under the old one stay cached but are no longer found (another
        fingerprint), so every digest is verified again."""
        self._policy = policy
        self._fingerprint = policy.fingerprint()

    async def verify(self, reference: str, digest: str, credentials: tuple[str, str] | None = None) -> Verdict:
        """The policy's verdict on `reference` at `digest`; raises RegistryError when the registry
        cannot be read."""
        target = repository_of(reference)
        if isinstance(target, str):
            raise RegistryError(reference, "", target)
        repository = qualified(f"{target.registry}/{target.repository}")
        key = (repository, digest, self._fingerprint)
        cached = self._cache.get(key)
        if cached is not None:
            verdict, expires = cached
            if expires is None or time.monotonic() < expires:
                self._cache.move_to_end(key)
                return verdict
            del self._cache[key]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            verdict = await self._verify(reference, target, repository, digest, credentials)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else awaited is not logged as unhandled
            raise
        finally:
            del self._pending[key]
        future.set_result(verdict)
        self._cache[key] = (verdict, None if verdict.ok else time.monotonic() + FAILURE_TTL)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return verdict

    async def _verify(self, reference: str, target: Target, repository: str, digest: str,
                      credentials: tuple[str, str] | None) -> Verdict:
        image = reference
        if self.policy.rule_for(repository) is None:
            return judge(self.policy, image, repository, digest, [])  # no registry request needed
        self.lookups += 1
        found = await self.lookup(target, reference, digest, credentials)
        return judge(self.policy, image, repository, digest, found.evidence)

    async def explain(self, reference: str, digest: str,
                      credentials: tuple[str, str] | None = None) -> tuple[Verdict, Lookup]:
        """The verdict and every signature found, looked up even where no rule needs it and never
        cached: what `nodegate package verify` shows."""
        target = repository_of(reference)
        if isinstance(target, str):
            raise RegistryError(reference, "", target)
        repository = qualified(f"{target.registry}/{target.repository}")
        image = reference
        found = await self.lookup(target, reference, digest, credentials)
        return judge(self.policy, image, repository, digest, found.evidence), found

    async def lookup(self, target: Target, reference: str, digest: str,
                     credentials: tuple[str, str] | None = None) -> Lookup:
        """Every signature of `digest` the registry holds, in both formats."""
        async with registry_session(reference, target, credentials, timeout=self.timeout,
                                    token_hosts=self.token_hosts, plain_http=self.plain_http) as reg:
            try:
                legacy, bundled = await asyncio.gather(_simplesigning(reg, digest), _bundles(reg, digest),
                                                       return_exceptions=True)
                if isinstance(legacy, BaseException):
                    raise legacy
                if isinstance(bundled, BaseException):
                    raise bundled
            finally:
                self.requests += reg.requests
        return Lookup([*legacy, *bundled[0]], bundled[1])


async def _simplesigning(reg: RegistrySession, digest: str) -> list[Evidence]:
    tag = signature_tag(digest)
    manifest = await reg.manifest(tag, (OCI_MANIFEST, DOCKER_MANIFEST))
    if manifest is None:
        return []
    try:
        layers = simplesigning_layers(manifest)
    except ValueError as exc:
        return [Evidence("simplesigning", f"tag {tag}", problem=f"its manifest {exc}")]
    payloads = await _all(*(_blob(reg, layer) for layer, _ in layers))
    out = []
    for (layer, signature), payload in zip(layers, payloads, strict=True):
        where = f"tag {tag} (layer {layer})"
        if isinstance(payload, str):
            out.append(Evidence("simplesigning", where, problem=payload))
        elif payload is None:
            out.append(Evidence("simplesigning", where, problem="its payload blob is missing from the registry"))
        else:
            out.append(simplesigning_evidence(where, payload, signature))
    return out


async def _blob(reg: RegistrySession, digest: str, limit: int = MAX_BUNDLE) -> bytes | str | None:
    """A signature's blob; None when missing; why, when the registry served other bytes than its digest
    names (that signature is unreadable: a verdict, not a registry error to retry)."""
    try:
        return await reg.blob(digest, limit)
    except DigestMismatch:
        return f"the registry served other bytes than its digest {digest} names"


async def _bundles(reg: RegistrySession, digest: str) -> tuple[list[Evidence], bool]:
    """The Sigstore bundles among `digest`'s referrers, and whether the registry offers the API."""
    # The API and its fallback tag at once: one round trip whichever the registry offers (a registry
    # with the API answers the tag with a 404, one request more).
    index, fallback = await _all(reg.referrers(digest), reg.manifest(referrers_tag(digest), (OCI_INDEX,)))
    api = index is not None
    fmt: Format = "bundle-referrers" if api else "bundle-tag"
    index = index if api else fallback
    if index is None:
        return [], api
    try:
        candidates = referrer_candidates(index, digest)
    except ValueError as exc:
        return [Evidence(fmt, f"the referrers of {digest}", problem=f"the referrers index {exc}")], api
    manifests = await _all(*(reg.manifest(d, (OCI_MANIFEST,)) for d in candidates))
    wanted: list[tuple[str, str]] = []
    out: list[Evidence] = []
    for manifest_digest, manifest in zip(candidates, manifests, strict=True):
        if manifest is None:
            continue  # listed but gone: a referrer deleted since
        try:
            layers = bundle_layers(manifest, digest)
        except ValueError as exc:
            out.append(Evidence(fmt, f"referrer {manifest_digest}", problem=f"its manifest {exc}"))
            continue
        if isinstance(layers, str):
            out.append(Evidence(fmt, f"referrer {manifest_digest}", problem=f"its manifest {layers}"))
            continue
        wanted += [(manifest_digest, layer) for layer in layers]
    blobs = await _all(*(_blob(reg, layer, MAX_BUNDLE) for _, layer in wanted))
    for (manifest_digest, layer), blob in zip(wanted, blobs, strict=True):
        where = f"referrer {manifest_digest}"
        if isinstance(blob, str):
            out.append(Evidence(fmt, where, problem=blob))
            continue
        if blob is None:
            out.append(Evidence(fmt, where, problem=f"its bundle blob {layer} is missing from the registry"))
            continue
        evidence = bundle_evidence(fmt, where, blob)
        if evidence is not None:
            out.append(evidence)
    return out, api


__all__ = ["Lookup", "SignatureVerifier", "repository_of"]
