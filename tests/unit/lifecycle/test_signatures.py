"""Image signature verdicts in a rollout: what holds a gate, what its status and records say, and which
digests a stage pod may pull (gate.lifecycle.signatures, gate.lifecycle.images.pod_images)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gate.api.nodegate import ImageRecord, NodeGate
from gate.api.signatures import SignaturePolicy, Verdict
from gate.lifecycle.images import pinned_images, pod_images
from gate.lifecycle.signatures import (
    AGENT,
    Judged,
    agent_image,
    failure_message,
    held,
    hold_of,
    recorded_verdict,
    trusted_digests,
    verified_condition,
    warned,
)

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
PINNED = "registry.example.com/team/pinned@sha256:" + "3" * 64
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
OK = Verdict("Verified", "team", "team-2026", "verified")
MISSING = Verdict("SignatureMissing", "team", None, "no signature of this digest was found")


def gate(images: list[ImageRecord]) -> NodeGate:
    return NodeGate.model_validate({
        "metadata": {"name": "g"},
        "spec": {"packages": {"a": {"version": "1.0.0", "image": "registry.example.com/team/a"},
                              "p": {"version": "1.0.0", "image": PINNED}}},
        "status": {"images": [r.to_wire() for r in images]}})


def record(digest: str = D1) -> ImageRecord:
    return ImageRecord(package="a", reference="registry.example.com/team/a:1.0.0", digest=digest)


def test_enforce_holds_a_failed_image_and_says_package_image_digest_rule_and_why() -> None:
    policy = SignaturePolicy(mode="enforce")
    judged = [Judged(record(), MISSING), Judged(record(D2), OK)]
    refused = held(judged, policy)
    assert [j.verdict.reason for j in refused] == ["SignatureMissing"] and warned(judged, policy) == []
    message = failure_message(refused, mode="enforce")
    for part in ("package a", "registry.example.com/team/a:1.0.0", D1, "rule team", "SignatureMissing",
                 "no signature of this digest", "No node of this gate is cordoned"):
        assert part in message, part


def test_warn_mode_holds_nothing_and_its_condition_stays_true_with_the_failures_reason() -> None:
    policy = SignaturePolicy(mode="warn")
    judged = [Judged(record(), MISSING)]
    assert held(judged, policy) == [] and warned(judged, policy) == judged
    assert failure_message(judged, mode="warn").startswith("warn mode: package a")
    records = [recorded_verdict(j, policy, NOW) for j in judged]
    assert records[0].verified is not None and records[0].verified.mode == "warn"
    cond = verified_condition(records, [], NOW, 3)
    assert cond is not None and (cond.status, cond.reason) == ("True", "SignatureMissing")
    assert cond.message.startswith("warn mode") and D1 in cond.message


def test_the_record_says_the_verdict_under_the_policy_and_keeps_its_time_while_it_stays() -> None:
    policy = SignaturePolicy()
    first = recorded_verdict(Judged(record(), OK), policy, NOW)
    assert first.verified is not None
    assert (first.verified.policy, first.verified.reason, first.verified.rule, first.verified.key) == (
        policy.fingerprint(), "Verified", "team", "team-2026")
    assert recorded_verdict(Judged(first, OK), policy, NOW + timedelta(hours=1)) == first
    changed = recorded_verdict(Judged(first, MISSING), policy, NOW + timedelta(hours=1))
    assert changed.verified is not None and changed.verified.reason == "SignatureMissing"
    cond = verified_condition([first], [], NOW, 1)
    assert cond is not None and (cond.status, cond.reason) == ("True", "Verified")
    assert verified_condition([record()], [], NOW, 1) is None, "no policy, no condition"


def test_a_stage_pod_pulls_only_a_digest_the_operator_judged_runnable_whatever_the_status_says() -> None:
    enforce = SignaturePolicy()
    forged = recorded_verdict(Judged(record(D2), OK), enforce, NOW)  # the status claims a verdict
    g = gate([forged])
    trusted = trusted_digests({("registry.example.com/team/a:1.0.0", D1): OK}, enforce)
    images, missing = pod_images(g, ["a"], resolve=True, trusted=trusted)
    assert images == {} and missing == ["a"], "a digest the operator did not judge is not pulled"
    images, missing = pod_images(gate([record(D1)]), ["a"], resolve=True, trusted=trusted)
    assert missing == [] and images["a"].image == f"registry.example.com/team/a@{D1}"
    # A failed verdict lets the digest run only in warn mode.
    failing = {("registry.example.com/team/a:1.0.0", D1): MISSING}
    assert trusted_digests(failing, enforce) == frozenset()
    assert trusted_digests(failing, SignaturePolicy(mode="warn")) == frozenset(failing)
    # An image pinned in the spec is judged too: pulled only once it is trusted.
    [pinned] = pinned_images(g)
    assert (pinned.package, pinned.reference, pinned.digest) == ("p", "registry.example.com/team/pinned",
                                                                 "sha256:" + "3" * 64)
    assert pod_images(g, ["p"], resolve=True, trusted=trusted)[1] == ["p"]
    images, missing = pod_images(g, ["p"], resolve=True, trusted={(pinned.reference, pinned.digest)})
    assert missing == [] and images["p"].image == PINNED
    # Without a policy, nothing is filtered.
    assert pod_images(g, ["a", "p"], resolve=True)[1] == []


def test_the_agent_image_is_judged_when_pinned_by_digest_and_not_as_a_tag() -> None:
    pinned = agent_image("registry.example.com/nodegate/nodegate@" + D1)
    assert pinned is not None and (pinned.package, pinned.reference, pinned.digest) == (
        AGENT, "registry.example.com/nodegate/nodegate", D1)
    assert agent_image("ghcr.io/nodegate/nodegate:0.9.0") is None
    message = failure_message([Judged(pinned, MISSING)], mode="enforce")
    assert message.startswith("package (agent): image registry.example.com/nodegate/nodegate")


def test_an_image_that_does_not_resolve_holds_first_then_one_the_policy_refuses() -> None:
    refused = [Judged(record(), MISSING)]
    first = hold_of({"b": "HTTP 404"}, refused)
    assert first is not None and (first.condition, first.reason) == ("ImagesResolved", "ResolveFailed")
    assert "package b: HTTP 404" in first.message
    then = hold_of({}, refused)
    assert then is not None and (then.condition, then.reason) == ("ImagesVerified", "SignatureMissing")
    assert hold_of({}, []) is None
