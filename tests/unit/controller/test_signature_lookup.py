"""The signature lookup's conversations that the real registry (tests/integration/signatures) cannot
show: a private repository (Bearer token with the package's pull credentials, for the signature
reads too), a registry refusing the reads (an error, not a verdict, and not cached), and a lying
registry serving other bytes under a signature's digest. A fake registry served here (aiohttp)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gate.api.cosign import SIGNATURE_ANNOTATION, SIMPLESIGNING_TYPE, signature_tag
from gate.api.signatures import SignatureKey, SignaturePolicy, SignatureRule
from gate.controller.registry import RegistryError
from gate.controller.signatures import SignatureVerifier
from tests.unit.controller.test_registry_client import serve_answer

KEY = ec.generate_private_key(ec.SECP256R1())
IMAGE_DIGEST = "sha256:" + "c" * 64
PAYLOAD = json.dumps({"critical": {"image": {"docker-manifest-digest": IMAGE_DIGEST}}}).encode()
PAYLOAD_DIGEST = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
SIG_MANIFEST = json.dumps({"schemaVersion": 2, "layers": [{
    "mediaType": SIMPLESIGNING_TYPE, "digest": PAYLOAD_DIGEST, "size": len(PAYLOAD),
    "annotations": {SIGNATURE_ANNOTATION: base64.b64encode(KEY.sign(PAYLOAD, ec.ECDSA(hashes.SHA256()))).decode()}}]})
ROBOT = "Basic " + base64.b64encode(b"robot:pw").decode()


@dataclass
class FakeRegistry:
    """A private repository holding one `.sig` signature; `lie`: serve other bytes for its payload."""

    lie: bool = False
    base: str = ""
    seen: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/token":
            return web.json_response({"token": "t0ken"}) if request.headers.get("Authorization") == ROBOT \
                else web.Response(status=401)
        kind, ref = request.path.split("/")[-2:]
        self.seen.append(f"{request.method} {kind}/{ref}")
        if request.headers.get("Authorization") != "Bearer t0ken":
            return web.Response(status=401, headers={
                "WWW-Authenticate": f'Bearer realm="{self.base}/token",service="fake"'})
        if kind == "manifests" and ref == signature_tag(IMAGE_DIGEST):
            return web.Response(body=SIG_MANIFEST.encode(), content_type="application/vnd.oci.image.manifest.v1+json")
        if kind == "blobs" and ref == PAYLOAD_DIGEST:
            return web.Response(body=PAYLOAD.replace(b"ccc", b"ddd") if self.lie else PAYLOAD)
        return web.Response(status=404)


@pytest.fixture
async def fake() -> AsyncIterator[FakeRegistry]:
    registry = FakeRegistry()
    runner, host = await serve_answer(registry.handle)
    registry.base = f"http://{host}"
    try:
        yield registry
    finally:
        await runner.cleanup()


def _verifier(fake: FakeRegistry) -> SignatureVerifier:
    pem = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    host = fake.base.removeprefix("http://")
    return SignatureVerifier(SignaturePolicy(rules=[SignatureRule(
        name="team", repositories=[f"{host}/team/*"], keys=[SignatureKey(name="ci", pem=pem.decode())])]))


async def test_a_private_repositorys_signatures_are_read_with_the_pull_credentials_and_a_refusal_is_no_verdict(
        fake: FakeRegistry) -> None:
    verifier = _verifier(fake)
    reference = f"{fake.base.removeprefix('http://')}/team/pkg:1.0"
    with pytest.raises(RegistryError, match=r"token service .* refused a pull token \(without credentials\)"):
        await verifier.verify(reference, IMAGE_DIGEST)
    verdict = await verifier.verify(reference, IMAGE_DIGEST, ("robot", "pw"))  # the refusal was not cached
    assert (verdict.reason, verdict.key) == ("Verified", "ci")
    assert f"GET manifests/{signature_tag(IMAGE_DIGEST)}" in fake.seen and f"GET blobs/{PAYLOAD_DIGEST}" in fake.seen


async def test_a_registry_serving_other_bytes_under_a_signatures_digest_makes_it_invalid(fake: FakeRegistry) -> None:
    fake.lie = True
    verdict = await _verifier(fake).verify(f"{fake.base.removeprefix('http://')}/team/pkg:1.0", IMAGE_DIGEST,
                                           ("robot", "pw"))
    assert verdict.reason == "SignatureInvalid"
    assert f"the registry served other bytes than its digest {PAYLOAD_DIGEST} names" in verdict.message



async def test_a_failed_verdict_is_kept_briefly_and_a_passing_one_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signature pushed after a refusal is seen once the failure's short cache ends; a pass stays."""
    from gate.api.signatures import Verdict
    from gate.controller import signatures

    pem = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    verifier = SignatureVerifier(SignaturePolicy(rules=[SignatureRule(
        name="team", repositories=["registry.example.com/team/*"], keys=[SignatureKey(name="ci", pem=pem.decode())])]))
    answers = iter([Verdict("SignatureMissing", "team", None, "no signature"), Verdict("Verified", "team", "ci", "ok")])
    calls: list[str] = []

    async def judged(self: object, reference: str, target: object, repository: str, digest: str,
                     credentials: object) -> Verdict:
        calls.append(digest)
        return next(answers)

    monkeypatch.setattr(SignatureVerifier, "_verify", judged)
    clock = [1000.0]
    monkeypatch.setattr(signatures.time, "monotonic", lambda: clock[0])
    digest, image = "sha256:" + "a" * 64, "registry.example.com/team/pkg:1"
    seen = [(await verifier.verify(image, digest)).reason, (await verifier.verify(image, digest)).reason]
    clock[0] += signatures.FAILURE_TTL + 1
    seen.append((await verifier.verify(image, digest)).reason)
    clock[0] += 10_000
    seen.append((await verifier.verify(image, digest)).reason)
    assert seen == ["SignatureMissing", "SignatureMissing", "Verified", "Verified"]
    assert calls == [digest, digest]
