"""Image signatures made by the real cosign, read by NodeGate's verifier from the real registry (issue 34).

One registry (distribution, as the dev cluster runs it) in a process table of this module's own, no
control plane: the verifier reads only the registry. cosign v3 (built into the cache from the Go
module proxy, versions.toml `[cosign]`) signs offline with generated key pairs, in both formats it
writes: Sigstore bundles attached as OCI referrers (its default) and the simple-signing `.sig` tag.
Each image is a tiny OCI manifest pushed through the registry API under a repository of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gate.api.cosign import referrers_tag, signature_tag
from gate.api.signatures import SignatureKey, SignaturePolicy, SignatureRule, load_policy
from gate.controller.registry import resolve_digest
from gate.controller.signatures import SignatureVerifier
from gate.devcluster import cosign, registry
from gate.devcluster.processes import ProcessTable
from tests.conftest import unique


@dataclass(frozen=True)
class Keys:
    cosign: Path
    trusted: tuple[Path, Path]  # (cosign.key, cosign.pub)
    rotated_in: tuple[Path, Path]
    foreign: tuple[Path, Path]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    binary = cosign.binary()
    if binary is None:
        pytest.skip("cosign is not built in the cache (versions.toml [cosign]); `python -m gate.devcluster.build`")
    base = tmp_path_factory.mktemp("cosign-keys")
    return Keys(binary, *(cosign.generate_key_pair(binary, base / name) for name in ("trusted", "new", "foreign")))


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    procs = ProcessTable(tmp_path_factory.mktemp("signature-registry"))
    try:
        yield registry.start_registry(procs, lambda m: None)
    finally:
        procs.stop_all()


def _policy(*pubs: Path, pattern: str) -> SignaturePolicy:
    return SignaturePolicy(rules=[SignatureRule(
        name="team", repositories=[pattern],
        keys=[SignatureKey(name=pub.parent.name, pem=pub.read_text()) for pub in pubs])])


def _image(port: int, content: str) -> tuple[str, str, str]:
    """A new repository holding one tiny image: (repository, tagged reference, digest)."""
    repository = f"sigtest/{unique('img')}"
    digest = registry.push_small_image(port, repository, "1.0", content)
    return repository, f"127.0.0.1:{port}/{repository}:1.0", digest


def _by_digest(reference: str, digest: str) -> str:
    return f"{reference.rsplit(':', 1)[0]}@{digest}"


async def test_images_cosign_signed_in_either_format_verify_by_any_trusted_key_once_per_digest_and_policy(
        keys: Keys, port: int) -> None:
    pattern = f"127.0.0.1:{port}/sigtest/*"
    images = {}
    for name, key, fmt in (("legacy", keys.trusted, "simplesigning"), ("bundle", keys.trusted, "bundle"),
                           ("rotated", keys.rotated_in, "bundle"), ("foreign", keys.foreign, "bundle"),
                           ("foreign-legacy", keys.foreign, "simplesigning"), ("unsigned", None, None)):
        repository, reference, digest = _image(port, name)
        if key is not None and fmt is not None:
            cosign.sign(keys.cosign, _by_digest(reference, digest), key[0], fmt=fmt)  # type: ignore[arg-type]
        images[name] = (repository, reference, digest)

    # What cosign wrote, as the registry holds it: distribution v3.1.2 has no referrers API, so
    # cosign (go-containerregistry) kept the tag schema's fallback index under sha256-<hex>.
    legacy_repo, _, legacy_digest = images["legacy"]
    sig = json.loads(registry.get_manifest(port, legacy_repo, signature_tag(legacy_digest)))
    assert sig["layers"][0]["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    bundle_repo, _, bundle_digest = images["bundle"]
    index = json.loads(registry.get_manifest(port, bundle_repo, referrers_tag(bundle_digest)))
    assert index["manifests"][0]["artifactType"].startswith("application/vnd.dev.sigstore.bundle")

    verifier = SignatureVerifier(_policy(keys.trusted[1], keys.rotated_in[1], pattern=pattern))
    verdicts = {name: await verifier.verify(ref, digest) for name, (_, ref, digest) in images.items()}
    assert {n: (v.reason, v.key, v.format) for n, v in verdicts.items()} == {
        "legacy": ("Verified", "trusted", "simplesigning"),
        "bundle": ("Verified", "trusted", "bundle-tag"),
        "rotated": ("Verified", "new", "bundle-tag"),  # two keys during a rotation: either verifies
        "foreign": ("UntrustedKey", None, "bundle-tag"),
        # The simple-signing format names no key: another key's signature does not verify (gate.api.cosign).
        "foreign-legacy": ("SignatureInvalid", None, "simplesigning"),
        "unsigned": ("SignatureMissing", None, None),
    }
    _, ref, digest = images["unsigned"]
    assert verdicts["unsigned"].message == (
        f"image {ref} ({digest}) has no cosign signature (looked for the tag {signature_tag(digest)} "
        "and for Sigstore bundles among its referrers); rule team needs a signature by key trusted or new")
    assert "is signed by a key that is not in the rule" in verdicts["foreign"].message
    assert all(images[n][2] in v.message and "rule team" in v.message for n, v in verdicts.items())

    # The cost of one verification: the .sig tag, the referrers API and its fallback tag at once, then
    # the payload, or the referrer manifest and then its bundle.
    counted = {}
    for name in ("legacy", "bundle", "unsigned"):
        fresh = SignatureVerifier(verifier.policy)
        await fresh.verify(*images[name][1:])
        counted[name] = fresh.requests
    assert counted == {"legacy": 4, "bundle": 5, "unsigned": 3}

    # Cached by digest: asking again costs no lookup; a changed policy (the rotation done) looks again.
    lookups = verifier.lookups
    assert (await verifier.verify(*images["bundle"][1:])).reason == "Verified"
    assert verifier.lookups == lookups
    verifier.policy = _policy(keys.rotated_in[1], pattern=pattern)
    assert (await verifier.verify(*images["bundle"][1:])).reason == "UntrustedKey"
    assert (await verifier.verify(*images["rotated"][1:])).reason == "Verified"
    assert verifier.lookups == lookups + 2


async def test_a_re_pushed_tag_a_copied_signature_and_an_edited_payload_fail_naming_why(keys: Keys, port: int) -> None:
    policy = _policy(keys.trusted[1], pattern=f"127.0.0.1:{port}/sigtest/**")

    # A tag pushed again after signing names a new digest, which nobody signed.
    repository, reference, signed = _image(port, "first")
    cosign.sign(keys.cosign, _by_digest(reference, signed), keys.trusted[0])
    registry.push_small_image(port, repository, "1.0", "pushed again")
    moved = await resolve_digest(reference)
    assert moved != signed
    again = await SignatureVerifier(policy).verify(reference, moved)
    assert again.reason == "SignatureMissing" and moved in again.message
    assert (await SignatureVerifier(policy).verify(reference, signed)).reason == "Verified"

    # A signature copied from another image: its .sig manifest put under this image's signature tag.
    other = registry.push_small_image(port, repository, "other", "other")
    cosign.sign(keys.cosign, _by_digest(reference, other), keys.trusted[0], fmt="simplesigning")
    registry.put_manifest(port, repository, signature_tag(moved),
                          registry.get_manifest(port, repository, signature_tag(other)))
    copied = await SignatureVerifier(policy).verify(reference, moved)
    assert (copied.reason, copied.key, copied.format) == ("SignatureInvalid", "trusted", "simplesigning")
    assert f"by key trusted but over a payload naming {other}, not this digest (a signature copied" in copied.message

    # A bundle copied from another image: its referrer manifest put again with this image as subject.
    repository, reference, digest = _image(port, "bundle-copied")
    donor = registry.push_small_image(port, repository, "donor", "donor")
    cosign.sign(keys.cosign, _by_digest(reference, donor), keys.trusted[0])
    index = json.loads(registry.get_manifest(port, repository, referrers_tag(donor)))
    manifest = json.loads(registry.get_manifest(port, repository, index["manifests"][0]["digest"]))
    manifest["subject"]["digest"] = digest
    body = json.dumps(manifest).encode()
    index["manifests"][0]["digest"] = registry.put_manifest(port, repository, "copied", body)
    index["manifests"][0]["size"] = len(body)
    registry.put_manifest(port, repository, referrers_tag(digest), json.dumps(index).encode(),
                          "application/vnd.oci.image.index.v1+json")
    copied = await SignatureVerifier(policy).verify(reference, digest)
    assert (copied.reason, copied.key, copied.format) == ("SignatureInvalid", "trusted", "bundle-tag")
    assert f"over a payload naming {donor}, not this digest" in copied.message

    # A bundle's payload edited after signing: the statement changed, the signature kept.
    repository, reference, digest = _image(port, "edited")
    cosign.sign(keys.cosign, _by_digest(reference, digest), keys.trusted[0])
    _edit_bundle(port, repository, digest)
    edited = await SignatureVerifier(policy).verify(reference, digest)
    assert (edited.reason, edited.key) == ("SignatureInvalid", "trusted")
    assert "names key trusted but its signature does not verify: its payload was changed after signing" \
        in edited.message

    # A simple-signing payload edited after signing (its manifest re-pointed at the edited blob).
    repository, reference, digest = _image(port, "edited-legacy")
    cosign.sign(keys.cosign, _by_digest(reference, digest), keys.trusted[0], fmt="simplesigning")
    manifest = json.loads(registry.get_manifest(port, repository, signature_tag(digest)))
    layer = manifest["layers"][0]
    payload = json.loads(registry.get_blob(port, repository, layer["digest"]))
    payload["optional"] = {"note": "edited"}
    blob = json.dumps(payload).encode()
    layer["digest"], layer["size"] = registry.put_blob(port, repository, blob), len(blob)
    registry.put_manifest(port, repository, signature_tag(digest), json.dumps(manifest).encode())
    edited = await SignatureVerifier(policy).verify(reference, digest)
    assert edited.reason == "SignatureInvalid" and "its payload was changed after signing" in edited.message


def _edit_bundle(port: int, repository: str, digest: str) -> None:
    """Replace the image's bundle by one whose DSSE payload is changed, under a new referrer manifest
    that the fallback index lists instead (what someone able to push could do)."""
    import base64

    index = json.loads(registry.get_manifest(port, repository, referrers_tag(digest)))
    entry = index["manifests"][0]
    manifest = json.loads(registry.get_manifest(port, repository, entry["digest"]))
    layer = manifest["layers"][0]
    bundle = json.loads(registry.get_blob(port, repository, layer["digest"]))
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"] = {"edited": True}
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    blob = json.dumps(bundle).encode()
    layer["digest"], layer["size"] = registry.put_blob(port, repository, blob), len(blob)
    body = json.dumps(manifest).encode()
    entry["digest"], entry["size"] = registry.put_manifest(port, repository, "edited", body), len(body)
    registry.put_manifest(port, repository, referrers_tag(digest), json.dumps(index).encode(),
                          "application/vnd.oci.image.index.v1+json")


def test_package_verify_says_what_the_operator_would_decide_and_exits_0_only_when_it_runs(
        keys: Keys, port: int, tmp_path: Path) -> None:
    _, signed_ref, signed = _image(port, "cli-signed")
    cosign.sign(keys.cosign, _by_digest(signed_ref, signed), keys.trusted[0])
    _, unsigned_ref, unsigned = _image(port, "cli-unsigned")

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gate", "package", "verify", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    ok = verify(signed_ref, "--key", str(keys.trusted[1]), "--key", str(keys.rotated_in[1]))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        f"image:    {signed_ref}",
        f"digest:   {signed}",
        f"rule:     command-line (keys: {keys.trusted[1]}, {keys.rotated_in[1]})",
        "found:    1 Sigstore bundle found through the referrers tag schema (sha256-<hex>) (the registry has no "
        f"OCI referrers API: its fallback tag {referrers_tag(signed)} was read)",
        f"verdict:  Verified by key {keys.trusted[1]}",
        f"why:      image {signed_ref} ({signed}) is signed by key {keys.trusted[1]} of rule command-line "
        "(Sigstore bundle found through the referrers tag schema (sha256-<hex>))",
        "operator: the image runs",
    ]
    policy = tmp_path / "policy.yaml"
    policy.write_text(cosign.dev_signature_policy([f"127.0.0.1:{port}"], keys.trusted[1].read_text(), mode="warn",
                                                  under="sigtest/*"))
    held = verify(_by_digest(unsigned_ref, unsigned), "--policy", str(policy))
    assert held.returncode == 1, held.stderr
    assert "verdict:  SignatureMissing" in held.stdout
    assert "operator: the image runs, with a warning (mode: warn)" in held.stdout
    assert f"rule:     {cosign.DEV_RULE_NAME} (keys: {cosign.DEV_KEY_NAME})" in held.stdout
    refused = verify(signed_ref)
    assert refused.returncode != 0 and "give the keys to trust (--key FILE" in refused.stderr


async def test_dev_images_signs_with_the_machines_dev_key_once_and_the_dev_policy_trusts_it(
        keys: Keys, port: int) -> None:
    repository = f"nodegate/{unique('sigtest')}"
    digest = registry.push_small_image(port, repository, "1.0", "dev catalog")
    reference = f"127.0.0.1:{port}/{repository}@{digest}"
    said: list[str] = []
    pub = cosign.sign_images([reference], said.append)
    assert pub is not None
    assert said == [f"Signed 127.0.0.1:{port}/{repository} ({digest[:19]}...) with the dev key {pub}"]
    assert cosign.sign_images([reference], said.append) == pub and len(said) == 1  # signed already: nothing to do
    policy = load_policy(cosign.dev_signature_policy([f"127.0.0.1:{port}", f"10.0.0.1:{port}"], pub.read_text()))
    verdict = await SignatureVerifier(policy).verify(f"127.0.0.1:{port}/{repository}:1.0", digest)
    assert (verdict.reason, verdict.rule, verdict.key) == ("Verified", cosign.DEV_RULE_NAME, cosign.DEV_KEY_NAME)
    other = registry.push_small_image(port, repository, "2.0", "not signed")
    refused = await SignatureVerifier(policy).verify(f"127.0.0.1:{port}/{repository}:2.0", other)
    assert refused.reason == "SignatureMissing"


async def test_cosigns_ed25519_signatures_are_ed25519ph_which_is_not_verified_and_the_verdict_says_so(
        keys: Keys, port: int, tmp_path: Path) -> None:
    """docs/supply-chain.md's limit, shown: cosign 3 signs with an Ed25519 key as Ed25519ph, which
    `cryptography` does not verify (pure Ed25519 signatures are, tests/unit/test_api_signatures.py)."""
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    private = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ed.pem").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    subprocess.run([str(keys.cosign), "import-key-pair", "--key", str(tmp_path / "ed.pem"), "--output-key-prefix",
                    str(tmp_path / "ed")], env=dict(os.environ, COSIGN_PASSWORD=""), check=True, capture_output=True)
    _, reference, digest = _image(port, "ed25519")
    cosign.sign(keys.cosign, _by_digest(reference, digest), tmp_path / "ed.key")
    verdict = await SignatureVerifier(_policy(tmp_path / "ed.pub", pattern=f"127.0.0.1:{port}/sigtest/*")).verify(
        reference, digest)
    assert (verdict.reason, verdict.key) == ("SignatureInvalid", tmp_path.name)
    assert "an Ed25519ph signature (what cosign 3 makes with an Ed25519 key)" in verdict.message
