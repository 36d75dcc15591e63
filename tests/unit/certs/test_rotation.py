"""Self-managed certificates: when each piece is replaced, and that no step ever serves a certificate
the API server does not yet trust."""

from __future__ import annotations

import datetime as dt

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gate.certs import pki
from gate.certs.reload import CertificateError, ReloadableCertificate
from gate.certs.rotation import (
    CertPolicy,
    CertState,
    from_secret_data,
    hosts_of,
    plan,
    split_pem,
    to_secret_data,
)

POLICY = CertPolicy(hosts=("nodegate-webhook.nodegate-system.svc", "127.0.0.1"))
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_bootstrap_issues_ca_and_serving_certificate_with_sans() -> None:
    first = plan(CertState(), POLICY, T0)
    assert first.reasons == ("created a new CA", "issued the serving certificate")
    assert first.state.serving is not None and first.state.signer is not None
    assert sorted(hosts_of(first.state.serving.cert)) == sorted(POLICY.hosts)
    assert split_pem(first.state.trust_bundle) == [first.state.signer.cert_pem]
    assert not plan(first.state, POLICY, T0 + dt.timedelta(days=1)).changed


def test_secret_round_trip_keeps_everything() -> None:
    state = plan(CertState(), POLICY, T0).state
    data, annotations = to_secret_data(state)
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "signer.crt", "signer.key"}
    assert from_secret_data(data, annotations) == state


def test_garbage_in_the_secret_is_replaced_not_fatal() -> None:
    broken = from_secret_data({"tls.crt": "bm90IGEgY2VydA==", "tls.key": "%%%", "ca.crt": ""}, {})
    assert broken.serving is None and broken.signer is None
    assert plan(broken, POLICY, T0).state.serving is not None


def test_serving_certificate_renewed_a_third_of_its_life_before_expiry() -> None:
    state = plan(CertState(), POLICY, T0).state
    assert not plan(state, POLICY, T0 + dt.timedelta(days=59)).changed
    renewed = plan(state, POLICY, T0 + dt.timedelta(days=61))
    assert renewed.reasons == ("renewed the serving certificate before it expires",)
    assert renewed.state.signer == state.signer  # the CA stays


def test_new_hosts_reissue_the_serving_certificate() -> None:
    state = plan(CertState(), POLICY, T0).state
    wider = CertPolicy(hosts=(*POLICY.hosts, "localhost"))
    assert plan(state, wider, T0).reasons == ("reissued the serving certificate for new hosts",)


def test_ca_rotation_publishes_the_new_ca_before_serving_with_it() -> None:
    state = plan(CertState(), POLICY, T0).state
    state = plan(state, POLICY, T0 + dt.timedelta(days=4 * 365 - 20)).state  # a fresh serving cert, old CA
    when = T0 + dt.timedelta(days=4 * 365 + 1)  # inside the CA's last year
    step1 = plan(state, POLICY, when)
    assert step1.reasons == ("replaced the CA before it expires",)
    assert len(step1.state.trust) == 2 and step1.state.serving == state.serving  # old serving cert kept
    assert step1.next_check == when + POLICY.propagation
    step2 = plan(step1.state, POLICY, when + POLICY.propagation)
    assert step2.reasons == ("moved the serving certificate to the new CA",)
    assert step2.state.serving is not None and step2.state.signer is not None
    step2.state.serving.cert.verify_directly_issued_by(step2.state.signer.cert)


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.integers(1, 29 * 24 * 60), min_size=5, max_size=200))
@example(steps=[29 * 24 * 60] * 80)  # the 73rd step replaces the CA: the move waits for propagation
@example(steps=[29 * 24 * 60] * 73 + [1] * 20 + [29 * 24 * 60] * 2)  # minute by minute after a new CA
def test_every_served_certificate_was_trusted_long_enough_before(steps: list[int]) -> None:
    """Walk time forward in random steps (minutes, up to 29 days, but never past the `next_check` the
    last plan asked for: the real loop checks every minute); no certificate may ever lapse, and each
    new serving certificate must be signed by a CA that had been in the published bundle without a
    break for `propagation`, unless the old one had become unusable anyway."""
    result = plan(CertState(), POLICY, T0)
    state = result.state
    # when each CA in the bundle was last put there (the bootstrap CA counts as long published)
    published: dict[bytes, dt.datetime] = {pem: T0 - POLICY.propagation for pem in state.trust}
    now = T0
    for minutes in steps:
        wanted = now + dt.timedelta(minutes=minutes)
        asked = result.next_check
        now = min(wanted, asked) if asked is not None and asked > now else wanted
        before = state
        result = plan(state, POLICY, now)
        state = result.state
        published = {pem: published.get(pem, now) for pem in state.trust}
        assert state.serving is not None and before.serving is not None
        issuer = next((pem for pem in state.trust if _signed(state.serving, pem)), None)
        assert issuer is not None, "served a certificate no CA in the bundle signed"
        if state.serving != before.serving:
            assert now < before.serving.not_after(), "the old certificate expired: a gap between checks"
            usable_before = before.serving.not_after() - now > POLICY.propagation
            if usable_before:
                trusted_for = now - published[issuer]
                assert trusted_for >= POLICY.propagation, f"served from a CA published only {trusted_for} before"
        assert state.serving.not_after() > now


def _signed(pair: pki.KeyPair, ca_pem: bytes) -> bool:
    from cryptography import x509

    try:
        pair.cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
        return True
    except Exception:
        return False


def test_reload_refuses_a_mismatched_pair_and_keeps_serving_the_old_one() -> None:
    ca = pki.create_ca("ca")
    a, b = pki.issue(ca, "a", hosts=["127.0.0.1"], server=True), pki.issue(ca, "b", hosts=["127.0.0.1"], server=True)
    cert = ReloadableCertificate()
    assert cert.load(a.cert_pem, a.key_pem) and not cert.load(a.cert_pem, a.key_pem)
    before = cert.fingerprint
    try:
        cert.load(a.cert_pem, b.key_pem)
        raise AssertionError("a mismatched pair was loaded")
    except CertificateError:
        pass
    assert cert.fingerprint == before and cert.reloads == 1
