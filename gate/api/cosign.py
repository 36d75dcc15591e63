"""cosign's signature formats, read and judged without I/O (issue 34).

`gate.controller.signatures` fetches what a registry holds for an image digest; this module turns
those bytes into `Evidence` (one signature each) and `judge` decides, by the policy's rule, what the
operator does. Both formats cosign writes are read:

* **Simple signing** (cosign 1 and 2, and cosign 3 with `--new-bundle-format=false`): a manifest under
  the tag `sha256-<hex>.sig` in the image's repository; each layer of type
  `application/vnd.dev.cosign.simplesigning.v1+json` is a JSON payload whose
  `critical.image.docker-manifest-digest` names the signed digest, and its annotation
  `dev.cosignproject.cosign/signature` holds the base64 signature over the payload's exact bytes.
* **Sigstore bundles** (cosign 3's default): an OCI manifest whose `subject` is the image and whose
  layer is a bundle (`application/vnd.dev.sigstore.bundle.v0.3+json`) holding a DSSE envelope over an
  in-toto statement with predicate type `https://sigstore.dev/cosign/sign/v1`; the statement's
  subject digest names the signed image, and the signature is over the DSSE pre-authentication
  encoding (PAE) of the payload. A bundle with a `messageSignature` (a signature over the manifest's
  digest itself) is read too. Statements of other predicate types (attestations: SBOMs, provenance)
  are not signatures and are left aside.

Decisions:

* **A signature counts only over a payload that names this exact digest**, verified over the exact
  bytes fetched (whose digest the registry client checked). A valid signature over a payload naming
  another digest is a copied signature: `SignatureInvalid`, never a pass.
* **`UntrustedKey` only where the format names the key.** A bundle names its key
  (`verificationMaterial.publicKey.hint`, cosign's base64 SHA-256 of the key's DER): a hint of
  another key is `UntrustedKey`; a trusted key's hint whose signature fails was changed after signing
  (`SignatureInvalid`). The simple-signing format names no key, and a payload changed after signing
  cannot be told from another key's signature by the bytes; so there a signature no trusted key
  verifies is `SignatureInvalid` ("a signature that does not verify", as cosign itself reports it),
  and its message says it is by another key or was changed.
* **Order of reasons**, when an image carries several signatures: one that verifies wins
  (`Verified`); otherwise a definite sign of tampering (`SignatureInvalid`: another digest named, an
  unreadable signature, a trusted key's bundle that fails) before `UntrustedKey`, and
  `SignatureMissing` only when nothing was found.
* **Keys**: ECDSA P-256 signatures are ASN.1 DER over SHA-256, as cosign makes them; Ed25519
  signatures are verified as pure Ed25519. cosign 3 signs with an Ed25519 key as Ed25519ph by default,
  which `cryptography` does not verify: such a signature fails, and the message says to use an ECDSA
  P-256 key (cosign generate-key-pair's default).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, utils

from gate.api.signatures import (
    FORMAT_NAMES,
    Format,
    PublicKey,
    SignaturePolicy,
    SignatureRule,
    Verdict,
    key_der,
)

SIMPLESIGNING_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
BUNDLE_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
BUNDLE_PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
# Signatures read per image, the newest: a registry cannot make the operator read without end. cosign
# appends a new signature after the ones before it (a `.sig` manifest's layers, a fallback tag's index),
# so a key rotation's signature on an image signed many times before is the last, and is read.
MAX_SIGNATURES = 16


def signature_tag(digest: str) -> str:
    """The simple-signing format's tag for `digest`: `sha256-<hex>.sig`."""
    return digest.replace(":", "-") + ".sig"


def referrers_tag(digest: str) -> str:
    """The OCI referrers tag schema's fallback tag for `digest`: `sha256-<hex>`."""
    return digest.replace(":", "-")


def key_hint(key: PublicKey) -> str:
    """cosign's hint for a key in a bundle: base64 of the SHA-256 of its DER."""
    return base64.b64encode(hashlib.sha256(key_der(key)).digest()).decode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a DSSE signature is over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


@dataclass(frozen=True)
class Evidence:
    """One signature found for an image, as read from the registry."""

    format: Format
    where: str  # the tag or manifest digest it was found under, said in messages
    message: bytes = b""  # the exact bytes the signature is over (payload, PAE, or a digest)
    signature: bytes = b""
    named_digest: str | None = None  # the image digest the signed payload names
    hint: str | None = None  # the key the bundle says signed it (cosign's hint), if it says
    prehashed: bool = False  # `message` is a SHA-256 digest (a bundle's messageSignature)
    problem: str | None = None  # why it cannot be read as a signature at all


def _b64(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"is not base64 ({exc})") from None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"is not JSON ({exc})") from None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def simplesigning_layers(manifest: bytes) -> list[tuple[str, str | None]]:
    """(layer digest, base64 signature or None) of each simple-signing layer of a `.sig` manifest."""
    out = []
    for layer in _list(_dict(_json(manifest)).get("layers")):
        layer = _dict(layer)
        if layer.get("mediaType") == SIMPLESIGNING_TYPE and isinstance(layer.get("digest"), str):
            sig = _dict(layer.get("annotations")).get(SIGNATURE_ANNOTATION)
            out.append((layer["digest"], sig if isinstance(sig, str) else None))
    return out[-MAX_SIGNATURES:]


def simplesigning_evidence(where: str, payload: bytes, signature_b64: str | None) -> Evidence:
    """A simple-signing layer's payload (fetched by its digest) and its signature annotation."""
    if signature_b64 is None:
        return Evidence("simplesigning", where, problem=f"its layer has no {SIGNATURE_ANNOTATION} annotation")
    try:
        signature = _b64(signature_b64)
        doc = _json(payload)
        named = doc["critical"]["image"]["docker-manifest-digest"]
        if not isinstance(named, str):
            raise TypeError
    except ValueError as exc:
        return Evidence("simplesigning", where, problem=f"its signature or payload {exc}")
    except (KeyError, TypeError):
        return Evidence("simplesigning", where,
                        problem="its payload names no critical.image.docker-manifest-digest")
    return Evidence("simplesigning", where, payload, signature, named)


def referrer_candidates(index: bytes, subject: str) -> list[str]:
    """Digests of the manifests in a referrers index (the API's answer, or the fallback tag's index)
    that may hold a Sigstore bundle signing `subject`."""
    out = []
    for entry in _list(_dict(_json(index)).get("manifests")):
        entry = _dict(entry)
        if not isinstance(entry.get("digest"), str):
            continue
        kind = entry.get("artifactType")
        predicate = _dict(entry.get("annotations")).get(BUNDLE_PREDICATE_ANNOTATION)
        if isinstance(kind, str) and not kind.startswith(BUNDLE_TYPE_PREFIX):
            continue
        if isinstance(predicate, str) and predicate != COSIGN_SIGN_PREDICATE:
            continue  # an attestation, not a signature
        out.append(entry["digest"])
    return out[-MAX_SIGNATURES:]


def bundle_layers(manifest: bytes, subject: str) -> list[str] | str:
    """Digests of a referrer manifest's bundle layers, or why it is not one for `subject` (a fallback
    tag's index is written by whoever may push: each manifest must name this digest as its subject)."""
    doc = _json(manifest)
    if not isinstance(doc, dict):
        return "is not a manifest"
    named = _dict(doc.get("subject")).get("digest")
    if named != subject:
        return f"its subject is {named or 'missing'}, not {subject}"
    return [layer["digest"] for layer in _list(doc.get("layers"))
            if isinstance(layer, dict) and str(layer.get("mediaType", "")).startswith(BUNDLE_TYPE_PREFIX)
            and isinstance(layer.get("digest"), str)][:MAX_SIGNATURES]


def bundle_evidence(fmt: Format, where: str, raw: bytes) -> Evidence | None:
    """A Sigstore bundle as a signature, or None when it is an attestation of another predicate type."""
    try:
        bundle = _json(raw)
        if not isinstance(bundle, dict):
            raise ValueError("is not a JSON object")
        hint = _dict(_dict(bundle.get("verificationMaterial")).get("publicKey")).get("hint")
        hint = hint if isinstance(hint, str) else None
        if isinstance(bundle.get("dsseEnvelope"), dict):
            return _dsse(fmt, where, bundle["dsseEnvelope"], hint)
        if isinstance(bundle.get("messageSignature"), dict):
            sig = bundle["messageSignature"]
            md = _dict(sig.get("messageDigest"))
            if md.get("algorithm") != "SHA2_256":
                raise ValueError(f"has a message digest of {md.get('algorithm')}, not SHA2_256")
            digest = _b64(md.get("digest"))
            return Evidence(fmt, where, digest, _b64(sig.get("signature")), f"sha256:{digest.hex()}", hint,
                            prehashed=True)
        raise ValueError("holds neither a DSSE envelope nor a message signature")
    except ValueError as exc:
        return Evidence(fmt, where, problem=f"its bundle {exc}")


def _dsse(fmt: Format, where: str, envelope: dict[str, Any], hint: str | None) -> Evidence | None:
    payload_type = envelope.get("payloadType")
    if payload_type != INTOTO_PAYLOAD_TYPE:
        raise ValueError(f"has a DSSE payload of type {payload_type!r}, not {INTOTO_PAYLOAD_TYPE}")
    payload = _b64(envelope.get("payload"))
    statement = _json(payload)
    if not isinstance(statement, dict):
        raise ValueError("has a DSSE payload that is not an in-toto statement")
    if statement.get("predicateType") != COSIGN_SIGN_PREDICATE:
        return None
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs or not isinstance(sigs[0], dict):
        raise ValueError("has a DSSE envelope without signatures")
    named = [f"{alg}:{value}" for s in _list(statement.get("subject"))
             for alg, value in _dict(_dict(s).get("digest")).items()]
    # cosign writes one subject and one signature; each further signature is judged on its own.
    return Evidence(fmt, where, pae(payload_type, payload), _b64(sigs[0].get("sig")),
                    named[0] if len(named) == 1 else ",".join(named) or None, hint)


def signature_verifies(key: PublicKey, evidence: Evidence) -> bool:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            if evidence.prehashed:
                return False
            key.verify(evidence.signature, evidence.message)
        else:
            algorithm = utils.Prehashed(hashes.SHA256()) if evidence.prehashed else hashes.SHA256()
            key.verify(evidence.signature, evidence.message, ec.ECDSA(algorithm))
    except (InvalidSignature, ValueError):
        return False
    return True


def _keys(rule: SignatureRule) -> str:
    names = [k.name for k in rule.keys]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def judge(policy: SignaturePolicy, image: str, repository: str, digest: str,
          found: list[Evidence]) -> Verdict:
    """What `policy` decides for `image` (as the gate names it, `repository` qualified) at `digest`,
    given the signatures `found` for it (empty when the rule's lookup found none)."""
    subject = f"image {image}" if image.endswith(f"@{digest}") else f"image {image} ({digest})"
    rule = policy.rule_for(repository)
    if rule is None:
        if policy.unmatched == "allow":
            return Verdict("NotCovered", None, None,
                           f"{subject}: no rule of the signature policy covers repository {repository}, "
                           "and unmatched: allow lets it run unverified")
        return Verdict("NoRule", None, None,
                       f"{subject}: no rule of the signature policy covers repository {repository}, and "
                       "unmatched: refuse holds it: add a rule with the keys that sign it")
    needs = f"rule {rule.name} needs a signature by key {_keys(rule)}"
    if not found:
        return Verdict("SignatureMissing", rule.name, None,
                       f"{subject} has no cosign signature (looked for the tag {signature_tag(digest)} and for "
                       f"Sigstore bundles among its referrers); {needs}")
    hints = {key_hint(k.public_key): k.name for k in rule.keys}
    invalid: list[tuple[str | None, str, Format]] = []
    untrusted: list[tuple[str, Format]] = []
    for ev in found:
        if ev.problem is not None:
            invalid.append((None, f"the signature under {ev.where} is unreadable: {ev.problem}", ev.format))
            continue
        signer = next((k.name for k in rule.keys if signature_verifies(k.public_key, ev)), None)
        if signer is not None and ev.named_digest == digest:
            return Verdict("Verified", rule.name, signer,
                           f"{subject} is signed by key {signer} of rule {rule.name} "
                           f"({FORMAT_NAMES[ev.format]})", ev.format)
        if signer is not None:
            invalid.append((signer, f"the signature under {ev.where} is by key {signer} but over a payload naming "
                                    f"{ev.named_digest or 'no digest'}, not this digest (a signature copied from "
                                    "another image)", ev.format))
        elif ev.hint is not None and ev.hint in hints:
            named = hints[ev.hint]
            why = "its payload was changed after signing"
            if isinstance(next(k.public_key for k in rule.keys if k.name == named), ed25519.Ed25519PublicKey):
                why = "an Ed25519ph signature (what cosign 3 makes with an Ed25519 key), or " + why
            invalid.append((named, f"the bundle under {ev.where} names key {named} but its signature does not "
                                   f"verify: {why}", ev.format))
        elif ev.hint is not None:
            untrusted.append((f"the bundle under {ev.where} is signed by a key that is not in the rule "
                              f"(hint {ev.hint})", ev.format))
        else:
            invalid.append((None, f"no key of the rule verifies the signature under {ev.where}: it was made by "
                                  "another key, or its payload was changed after signing (this format does not "
                                  "name the key)", ev.format))
    ed25519_note = ""
    if any(isinstance(k.public_key, ed25519.Ed25519PublicKey) for k in rule.keys):
        ed25519_note = (" (an Ed25519 key's signature must be pure Ed25519: cosign 3 signs as Ed25519ph by default, "
                        "which NodeGate does not verify; sign with an ECDSA P-256 key)")
    if invalid:
        key, why, fmt = invalid[0]
        return Verdict("SignatureInvalid", rule.name, key, f"{subject}: {why}; {needs}{ed25519_note}", fmt)
    why, fmt = untrusted[0]
    return Verdict("UntrustedKey", rule.name, None, f"{subject}: {why}; {needs}", fmt)


__all__ = [
    "BUNDLE_TYPE_PREFIX",
    "COSIGN_SIGN_PREDICATE",
    "INTOTO_PAYLOAD_TYPE",
    "SIGNATURE_ANNOTATION",
    "SIMPLESIGNING_TYPE",
    "Evidence",
    "bundle_evidence",
    "bundle_layers",
    "judge",
    "key_hint",
    "pae",
    "referrer_candidates",
    "referrers_tag",
    "signature_tag",
    "signature_verifies",
    "simplesigning_evidence",
    "simplesigning_layers",
]
