"""The image signature policy (gate.api.signatures) and the judgement of cosign's formats
(gate.api.cosign), without a registry: patterns at whole path components, errors naming the field,
and each verdict over signatures made here with `cryptography` in cosign's layouts (the real cosign
signs in tests/integration/signatures)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from gate.api.cosign import (
    COSIGN_SIGN_PREDICATE,
    MAX_SIGNATURES,
    Evidence,
    bundle_evidence,
    bundle_layers,
    judge,
    key_hint,
    pae,
    referrer_candidates,
    signature_tag,
    simplesigning_evidence,
    simplesigning_layers,
)
from gate.api.signatures import (
    SignatureKey,
    SignaturePolicy,
    SignatureRule,
    load_policy,
    policy_for_keys,
)

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
IMAGE = "registry.example.com/nodegate/agent"


def _pem(private: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode()


P256 = ec.generate_private_key(ec.SECP256R1())
P256_OTHER = ec.generate_private_key(ec.SECP256R1())
ED = ed25519.Ed25519PrivateKey.generate()


def _rule(name: str, *patterns: str, keys: dict[str, str] | None = None) -> SignatureRule:
    keys = keys or {"k": _pem(P256)}
    return SignatureRule(name=name, repositories=list(patterns),
                         keys=[SignatureKey(name=n, pem=p) for n, p in keys.items()])


def test_patterns_match_whole_path_components_and_the_most_specific_rule_wins_whatever_the_order() -> None:
    policy = SignaturePolicy(rules=[
        _rule("deep", "registry.example.com/nodegate/**"),
        _rule("one", "registry.example.com/nodegate/*"),
        _rule("exact", "registry.example.com/nodegate/agent"),
        _rule("hub", "docker.io/library/ubuntu"),
    ])
    named = {repo: (r.name if (r := policy.rule_for(repo)) else None) for repo in (
        "registry.example.com/nodegate/agent", "registry.example.com/nodegate/sysctl",
        "registry.example.com/nodegate/team/sysctl", "registry.example.com/nodegate",
        "registry.example.com/nodegate-evil/agent", "registry.example.com/nodegateway/x/y", "ubuntu",
        "index.docker.io/library/ubuntu")}
    assert named == {
        "registry.example.com/nodegate/agent": "exact",
        "registry.example.com/nodegate/sysctl": "one",  # * before ** at equal literal components
        "registry.example.com/nodegate/team/sysctl": "deep",
        "registry.example.com/nodegate": None,  # ** needs at least one component below
        "registry.example.com/nodegate-evil/agent": None,  # never a string prefix
        "registry.example.com/nodegateway/x/y": None,
        "ubuntu": "hub", "index.docker.io/library/ubuntu": "hub",  # qualified as containerd does
    }
    tie = SignaturePolicy(rules=[_rule("first", "r.example/*/agent"), _rule("second", "r.example/nodegate/*")])
    assert tie.rule_for("r.example/nodegate/agent").name == "first"  # type: ignore[union-attr]


@pytest.mark.parametrize(("doc", "expected"), [
    ({"rules": [{"name": "a", "repositories": ["nodegate/*"], "keys": [{"name": "k", "pem": "@P256"}]}]},
     "rules[0].repositories (a): 'nodegate/*' must start with a registry host"),
    ({"rules": [{"name": "a", "repositories": ["r.example/nodegate-*"], "keys": [{"name": "k", "pem": "@P256"}]}]},
     "a wildcard must be a whole path component ('nodegate-*')"),
    ({"rules": [{"name": "a", "repositories": ["r.example/**/x"], "keys": [{"name": "k", "pem": "@P256"}]}]},
     "** may only be the last path component"),
    ({"rules": [{"name": "a", "repositories": ["r.example/x"], "keys": [{"name": "k", "pem": "junk"}]}]},
     "rules[0].keys[0].pem (a / k): is not a PEM public key"),
    ({"rules": [{"name": "a", "repositories": ["r.example/x"], "keys": [{"name": "k", "pem": "@P384"}]}]},
     "rules[0].keys[0].pem (a / k): is an ECDSA key on secp384r1; only P-256"),
    ({"rules": [{"name": "a", "repositories": ["r.example/x"], "keys": []}]},
     "rules[0].keys (a): List should have at least 1 item"),
    ({"mode": "audit"}, "mode: Input should be 'enforce' or 'warn'"),
    ({"unmatched": "deny"}, "unmatched: Input should be 'allow' or 'refuse'"),
    ({"rules": [{"name": "a", "repositories": ["r.example/x"], "keys": [{"name": "k", "pem": "@P256"}], "key": 1}]},
     "rules[0].key (a): Extra inputs are not permitted"),
    ({"rules": [{"name": "a", "repositories": ["r.example/x"], "keys": [{"name": "k", "pem": "@P256"}]}] * 2},
     "rule names must be unique: a appears twice"),
])
def test_a_bad_policy_is_refused_naming_the_file_the_field_and_why(doc: dict[str, object], expected: str) -> None:
    p384 = _pem(ec.generate_private_key(ec.SECP384R1()))
    text = json.dumps(doc).replace('"@P256"', json.dumps(_pem(P256))).replace('"@P384"', json.dumps(p384))
    with pytest.raises(ValueError) as caught:
        load_policy(text, source="sig.yaml")
    assert str(caught.value).startswith("sig.yaml: ")
    assert expected in str(caught.value)


def test_the_fingerprint_changes_with_what_decides_and_not_with_how_a_key_is_wrapped() -> None:
    yaml_text = f"""
mode: enforce
rules:
  - name: catalog
    repositories: [registry.example.com/nodegate/**]
    keys:
      - name: k
        pem: |
{chr(10).join('          ' + line for line in _pem(P256).splitlines())}
"""
    policy = load_policy(yaml_text)
    assert load_policy(json.dumps(policy.model_dump())).fingerprint() == policy.fingerprint()
    assert policy.model_copy(update={"mode": "warn"}).fingerprint() != policy.fingerprint()
    rotated = SignaturePolicy(rules=[_rule("catalog", "registry.example.com/nodegate/**",
                                           keys={"k": _pem(P256), "k2": _pem(ED)})])
    assert rotated.fingerprint() != policy.fingerprint()
    assert load_policy("").rules == [] and load_policy("").unmatched == "allow"


def _simplesigning(private: ec.EllipticCurvePrivateKey, digest: str) -> tuple[bytes, str]:
    payload = json.dumps({"critical": {"identity": {"docker-reference": IMAGE},
                                       "image": {"docker-manifest-digest": digest},
                                       "type": "cosign container image signature"}, "optional": None}).encode()
    return payload, base64.b64encode(private.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()


def _bundle(private: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey, digest: str, *,
            predicate: str = COSIGN_SIGN_PREDICATE, edit: bool = False) -> bytes:
    algorithm, hexdigest = digest.split(":")
    statement = json.dumps({"_type": "https://in-toto.io/Statement/v1", "subject": [{"digest": {algorithm: hexdigest}}],
                            "predicateType": predicate, "predicate": {}}).encode()
    message = pae("application/vnd.in-toto+json", statement)
    sig = (private.sign(message) if isinstance(private, ed25519.Ed25519PrivateKey)
           else private.sign(message, ec.ECDSA(hashes.SHA256())))
    if edit:
        statement = statement.replace(b'"predicate": {}', b'"predicate": {"edited": true}')
    public = private.public_key()
    hint = key_hint(public)
    return json.dumps({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": hint}},
        "dsseEnvelope": {"payload": base64.b64encode(statement).decode(), "payloadType": "application/vnd.in-toto+json",
                         "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}).encode()


POLICY = SignaturePolicy(rules=[_rule("catalog", "registry.example.com/nodegate/**",
                                      keys={"old": _pem(P256_OTHER), "new": _pem(P256), "ed": _pem(ED)})])


def _judge(*found: Evidence | None, policy: SignaturePolicy = POLICY) -> tuple[str, str | None, str]:
    verdict = judge(policy, f"{IMAGE}@{DIGEST}", IMAGE, DIGEST, [e for e in found if e is not None])
    return verdict.reason, verdict.key, verdict.message


def test_each_format_verifies_by_any_key_of_the_rule_and_says_which() -> None:
    payload, sig = _simplesigning(P256, DIGEST)
    assert _judge(simplesigning_evidence("tag x.sig", payload, sig))[:2] == ("Verified", "new")
    payload, sig = _simplesigning(P256_OTHER, DIGEST)  # the key being rotated out still verifies
    assert _judge(simplesigning_evidence("tag x.sig", payload, sig))[:2] == ("Verified", "old")
    reason, key, message = _judge(bundle_evidence("bundle-tag", "referrer sha256:r", _bundle(P256, DIGEST)))
    assert (reason, key) == ("Verified", "new")
    assert message == (f"image {IMAGE}@{DIGEST} is signed by key new of rule catalog (Sigstore bundle "
                       "found through the referrers tag schema (sha256-<hex>))")
    assert _judge(bundle_evidence("bundle-referrers", "r", _bundle(ED, DIGEST)))[:2] == ("Verified", "ed")


def test_what_fails_says_why_naming_the_image_the_digest_and_the_rule() -> None:
    stranger = ec.generate_private_key(ec.SECP256R1())
    reason, _, message = _judge()
    assert reason == "SignatureMissing"
    assert message == (f"image {IMAGE}@{DIGEST} has no cosign signature (looked for the tag "
                       f"{signature_tag(DIGEST)} and for Sigstore bundles among its referrers); rule catalog needs "
                       "a signature by key old, new or ed")
    copied_payload, copied_sig = _simplesigning(P256, OTHER)
    reason, key, message = _judge(simplesigning_evidence("tag y.sig", copied_payload, copied_sig))
    assert (reason, key) == ("SignatureInvalid", "new")
    assert f"by key new but over a payload naming {OTHER}, not this digest (a signature copied" in message
    reason, key, message = _judge(bundle_evidence("bundle-tag", "referrer r", _bundle(P256, DIGEST, edit=True)))
    assert (reason, key) == ("SignatureInvalid", "new")
    assert "names key new but its signature does not verify: its payload was changed after signing" in message
    reason, _, message = _judge(bundle_evidence("bundle-tag", "referrer r", _bundle(stranger, DIGEST)))
    assert reason == "UntrustedKey" and "signed by a key that is not in the rule" in message
    payload, sig = _simplesigning(stranger, DIGEST)
    reason, _, message = _judge(simplesigning_evidence("tag z.sig", payload, sig))
    assert reason == "SignatureInvalid" and "made by another key, or its payload was changed" in message
    # An edited simple-signing payload cannot be told from another key's signature: both read so.
    payload, sig = _simplesigning(P256, DIGEST)
    edited = payload.replace(b'"optional": null', b'"optional": {"x": 1}')
    assert _judge(simplesigning_evidence("tag e.sig", edited, sig))[0] == "SignatureInvalid"
    assert _judge(simplesigning_evidence("tag n.sig", payload, None))[0] == "SignatureInvalid"
    # One good signature among bad ones verifies; an attestation is no signature.
    assert _judge(simplesigning_evidence("tag y.sig", copied_payload, copied_sig),
                  simplesigning_evidence("tag x.sig", payload, sig))[0] == "Verified"
    assert bundle_evidence("bundle-tag", "r", _bundle(P256, DIGEST, predicate="https://spdx.dev/Document")) is None


def test_repositories_no_rule_covers_follow_unmatched() -> None:
    allow = judge(POLICY, "other.example/x@" + DIGEST, "other.example/x", DIGEST, [])
    assert (allow.reason, allow.ok) == ("NotCovered", True)
    refuse = judge(POLICY.model_copy(update={"unmatched": "refuse"}), "other.example/x", "other.example/x", DIGEST, [])
    assert (refuse.reason, refuse.ok) == ("NoRule", False)
    assert "no rule of the signature policy covers repository other.example/x" in refuse.message
    keys_only = policy_for_keys({"cosign.pub": _pem(P256)}, "r.example:5000/nodegate/a")
    assert keys_only.rule_for("r.example:5000/nodegate/a") is not None
    assert keys_only.rule_for("r.example:5000/nodegate/b") is None
    # a key file that is no key: refused as a policy file's is, naming the file (`package verify --key`)
    named = r"^--key: rules\[0\]\.keys\[0\]\.pem \(command-line / bad\.pub\): is not a PEM"
    with pytest.raises(ValueError, match=named):
        policy_for_keys({"bad.pub": "bad\n"}, "r.example:5000/nodegate/a")


def test_the_manifests_are_read_as_cosign_writes_them() -> None:
    sig_manifest = json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": "sha256:1",
         "annotations": {"dev.cosignproject.cosign/signature": "c2ln"}},
        {"mediaType": "application/octet-stream", "digest": "sha256:2"}]}).encode()
    assert simplesigning_layers(sig_manifest) == [("sha256:1", "c2ln")]
    index = json.dumps({"manifests": [
        {"digest": "sha256:s", "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json",
         "annotations": {"dev.sigstore.bundle.predicateType": COSIGN_SIGN_PREDICATE}},
        {"digest": "sha256:att", "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json",
         "annotations": {"dev.sigstore.bundle.predicateType": "https://slsa.dev/provenance/v1"}},
        {"digest": "sha256:sbom", "artifactType": "application/spdx+json"}]}).encode()
    assert referrer_candidates(index, DIGEST) == ["sha256:s"]
    referrer = {"subject": {"digest": DIGEST}, "layers": [
        {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "digest": "sha256:b"}]}
    assert bundle_layers(json.dumps(referrer).encode(), DIGEST) == ["sha256:b"]
    assert bundle_layers(json.dumps(referrer).encode(), OTHER) == f"its subject is {DIGEST}, not {OTHER}"
    assert hashlib.sha256(pae("t", b"p")).hexdigest() == hashlib.sha256(b"DSSEv1 1 t 1 p").hexdigest()


def test_an_image_signed_more_often_than_is_read_has_its_newest_signatures_read() -> None:
    # cosign appends: a rotated key's signature comes after every older one. With the first ones read,
    # an image signed 16 times before never showed the new key's (the signature test failed so, on a
    # registry kept across runs, once the agent image had collected more than 16 signatures).
    many = MAX_SIGNATURES + 4
    sig_manifest = json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": f"sha256:{i}",
         "annotations": {"dev.cosignproject.cosign/signature": f"s{i}"}} for i in range(many)]}).encode()
    read = simplesigning_layers(sig_manifest)
    assert len(read) == MAX_SIGNATURES and read[-1] == (f"sha256:{many - 1}", f"s{many - 1}")
    assert ("sha256:0", "s0") not in read
    index = json.dumps({"manifests": [
        {"digest": f"sha256:r{i}", "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"}
        for i in range(many)]}).encode()
    assert referrer_candidates(index, DIGEST) == [f"sha256:r{i}" for i in range(4, many)]
