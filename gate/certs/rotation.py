"""Self-managed webhook certificates: a CA, a serving certificate, and when to replace which.

Pure: `plan(state, policy, now)` returns the next state and why, and the caller stores it (a Secret)
and loads it. Rotation never breaks a request in flight or a handshake:

* The serving certificate is replaced a third of its life before expiry (90 days, renewed at 30 left),
  signed by the current CA, which the API server already trusts.
* The CA is replaced a year before it expires. The new CA goes into the trust bundle (the webhook
  configurations' caBundle) next to the old one first, and the serving certificate moves to the new CA
  only once the bundle had `propagation` time to reach every API server. Old CAs stay in the bundle
  until they expire.
* Only when nothing could be working anyway (no certificate, an unparsable or expired one, or one no
  trusted CA signed) is everything issued at once.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from gate.certs import pki

# Keys of the Secret (type kubernetes.io/tls, so it mounts like a cert-manager one).
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
TRUST_BUNDLE = "ca.crt"
SIGNER_CERT = "signer.crt"
SIGNER_KEY = "signer.key"
SIGNER_ADDED_ANNOTATION = "nodegate.io/signer-added-at"
MAX_TRUSTED = 4


@dataclass(frozen=True)
class CertPolicy:
    hosts: tuple[str, ...]
    """SANs of the serving certificate: the Service's DNS names, 127.0.0.1 for the dev cluster."""
    common_name: str = "nodegate-webhook"
    ca_validity: dt.timedelta = dt.timedelta(days=5 * 365)
    ca_renew_before: dt.timedelta = dt.timedelta(days=365)
    serving_validity: dt.timedelta = dt.timedelta(days=90)
    serving_renew_before: dt.timedelta = dt.timedelta(days=30)
    propagation: dt.timedelta = dt.timedelta(minutes=10)
    """How long a new CA sits in the trust bundle before the serving certificate may depend on it."""


@dataclass(frozen=True)
class CertState:
    signer: pki.KeyPair | None = None
    trust: tuple[bytes, ...] = ()
    serving: pki.KeyPair | None = None
    signer_added: dt.datetime | None = None

    @property
    def trust_bundle(self) -> bytes:
        return b"".join(self.trust)


@dataclass(frozen=True)
class Plan:
    state: CertState
    reasons: tuple[str, ...] = ()
    next_check: dt.datetime | None = field(default=None, compare=False)

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


def plan(state: CertState, policy: CertPolicy, now: dt.datetime) -> Plan:
    reasons: list[str] = []
    trust = [pem for pem in state.trust if _valid_at(pem, now)]
    if len(trust) != len(state.trust):
        reasons.append("dropped expired or unreadable CAs from the trust bundle")
    signer, added = state.signer, state.signer_added
    if signer is None or not _usable_pair(signer, now) or pki.needs_rotation(signer, before=policy.ca_renew_before,
                                                                              now=now):
        reasons.append("created a new CA" if signer is None else "replaced the CA before it expires")
        signer = pki.create_ca(f"{policy.common_name}-ca-{now:%Y%m%d%H%M%S}", valid_for=policy.ca_validity, now=now)
        added = now
    if signer.cert_pem not in trust:
        trust.insert(0, signer.cert_pem)
        added = added or now
        if "created a new CA" not in reasons and "replaced the CA before it expires" not in reasons:
            reasons.append("added the signing CA to the trust bundle")
    trust = trust[:MAX_TRUSTED]
    added = added or now

    serving = state.serving
    wait_until: dt.datetime | None = None
    issue_reason: str | None = None
    if serving is None:
        issue_reason = "issued the serving certificate"
    elif not _usable_pair(serving, now) or not any(_issued_by(serving.cert, pem) for pem in trust):
        issue_reason = "replaced a serving certificate that was unusable or signed by no trusted CA"
    else:
        stale = pki.needs_rotation(serving, before=policy.serving_renew_before, now=now)
        wrong_hosts = set(hosts_of(serving.cert)) != set(policy.hosts)
        old_signer = not _issued_by(serving.cert, signer.cert_pem)
        if stale or wrong_hosts or old_signer:
            why = ("renewed the serving certificate before it expires" if stale else
                   "reissued the serving certificate for new hosts" if wrong_hosts else
                   "moved the serving certificate to the new CA")
            ready_at = added + policy.propagation
            expires_soon = serving.not_after() - now <= policy.propagation
            if not old_signer or now >= ready_at or expires_soon:
                issue_reason = why
            else:
                wait_until = ready_at
    if issue_reason is not None:
        serving = pki.issue(signer, policy.common_name, hosts=policy.hosts, server=True,
                            valid_for=policy.serving_validity, now=now)
        reasons.append(issue_reason)
    assert serving is not None
    new = CertState(signer=signer, trust=tuple(trust), serving=serving, signer_added=added)
    renew_at = serving.not_after() - policy.serving_renew_before
    next_check = min(t for t in (wait_until, renew_at, signer.not_after() - policy.ca_renew_before) if t is not None)
    if not reasons:
        return Plan(state, (), next_check)
    return Plan(new, tuple(reasons), next_check)


# -- the Secret ------------------------------------------------------------------------------------


def to_secret_data(state: CertState) -> tuple[dict[str, str], dict[str, str]]:
    """(data, annotations) of the Secret holding `state`; data values base64 as the API wants them."""
    assert state.signer is not None and state.serving is not None

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    data = {
        TLS_CERT: b64(state.serving.cert_pem), TLS_KEY: b64(state.serving.key_pem),
        TRUST_BUNDLE: b64(state.trust_bundle),
        SIGNER_CERT: b64(state.signer.cert_pem), SIGNER_KEY: b64(state.signer.key_pem),
    }
    annotations = {SIGNER_ADDED_ANNOTATION: (state.signer_added or dt.datetime.now(dt.UTC)).isoformat()}
    return data, annotations


def from_secret_data(data: Mapping[str, str] | None, annotations: Mapping[str, str] | None) -> CertState:
    """The state a Secret holds; anything unreadable comes back as missing, so `plan` replaces it."""
    raw = {k: _unb64(v) for k, v in (data or {}).items()}
    signer = _pair(raw.get(SIGNER_CERT), raw.get(SIGNER_KEY))
    serving = _pair(raw.get(TLS_CERT), raw.get(TLS_KEY))
    trust = tuple(split_pem(raw.get(TRUST_BUNDLE) or b""))
    added = None
    text = (annotations or {}).get(SIGNER_ADDED_ANNOTATION)
    if text:
        try:
            added = dt.datetime.fromisoformat(text)
            added = added if added.tzinfo else added.replace(tzinfo=dt.UTC)
        except ValueError:
            added = None
    return CertState(signer=signer, trust=trust, serving=serving, signer_added=added)


def split_pem(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM block."""
    out = []
    end = b"-----END CERTIFICATE-----"
    for block in bundle.split(end):
        start = block.find(b"-----BEGIN CERTIFICATE-----")
        if start >= 0:
            out.append(block[start:] + end + b"\n")
    return out


def hosts_of(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


def with_added(state: CertState, added: dt.datetime) -> CertState:
    return replace(state, signer_added=added)


# -- helpers ---------------------------------------------------------------------------------------


def _unb64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return b""


def _pair(cert: bytes | None, key: bytes | None) -> pki.KeyPair | None:
    if not cert or not key:
        return None
    pair = pki.KeyPair(cert, key)
    return pair if pair_matches(pair) else None


def pair_matches(pair: pki.KeyPair) -> bool:
    """The certificate parses and belongs to the private key."""
    try:
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
        cert = pair.cert
    except (ValueError, TypeError):
        return False
    pub = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    own = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pub == own


def _usable_pair(pair: pki.KeyPair, now: dt.datetime) -> bool:
    try:
        return pair.not_before() <= now < pair.not_after()
    except ValueError:
        return False


def _valid_at(pem: bytes, now: dt.datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return False
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def _issued_by(cert: x509.Certificate, ca_pem: bytes) -> bool:
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
