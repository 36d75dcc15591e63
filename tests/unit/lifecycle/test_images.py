"""Which image a package's stage pods pull, and when a tag is resolved (again): gate.lifecycle.images."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gate.api.nodegate import ImageRecord, NodeGate
from gate.lifecycle.images import (
    AGENT,
    by_digest,
    held_requests,
    merged_records,
    plan_images,
    pod_images,
    tagged_reference,
    to_resolve,
)
from gate.lifecycle.node import EventRequest, PodRequest, Step
from gate.lifecycle.signatures import hold_of

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
PINNED = "registry.example.com/pinned@sha256:" + "3" * 64
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def gate(packages: dict[str, Any], images: list[dict[str, str]] | None = None) -> NodeGate:
    return NodeGate.model_validate({"metadata": {"name": "g"}, "spec": {"packages": packages},
                                    "status": {"images": images or []}})


def record(package: str, reference: str, digest: str) -> dict[str, str]:
    return {"package": package, "reference": reference, "digest": digest}


def test_a_tagged_image_is_resolved_once_and_its_record_reused_while_image_and_version_stay() -> None:
    packages = {"a": {"version": "1.0.0", "image": "host:5000/team/a"}}
    assert list(to_resolve(gate(packages))) == [("a", "host:5000/team/a:1.0.0")]
    resolved = gate(packages, [record("a", "host:5000/team/a:1.0.0", D1)])
    assert to_resolve(resolved) == {}
    images, missing = pod_images(resolved, ["a"], resolve=True)
    assert missing == [] and images["a"].image == f"host:5000/team/a@{D1}"
    assert images["a"].pull_policy == "IfNotPresent"


def test_a_changed_version_or_image_is_resolved_again_and_its_old_record_is_not_used() -> None:
    old = [record("a", "host/team/a:1.0.0", D1)]
    for changed in ({"version": "1.1.0", "image": "host/team/a"}, {"version": "1.0.0", "image": "host/team/b"}):
        g = gate({"a": changed}, old)
        assert list(to_resolve(g)) == [("a", tagged_reference(g.spec.packages["a"]))]
        images, missing = pod_images(g, ["a"], resolve=True)
        assert images == {} and missing == ["a"], "fail closed: the old digest is never pulled for new code"


def test_an_image_pinned_by_digest_needs_no_resolution_and_is_pulled_as_given() -> None:
    g = gate({"p": {"version": "1.0.0", "image": PINNED}})
    assert to_resolve(g) == {} and tagged_reference(g.spec.packages["p"]) is None
    for resolve in (True, False):
        images, missing = pod_images(g, ["p"], resolve=resolve)
        assert missing == [] and images["p"].image == PINNED and images["p"].pull_policy == "IfNotPresent"


def test_with_resolution_off_a_tag_is_pulled_always() -> None:
    g = gate({"a": {"version": "1.0.0", "image": "host/team/a"}})
    images, missing = pod_images(g, ["a"], resolve=False)
    assert missing == [] and images["a"].image == "host/team/a:1.0.0" and images["a"].pull_policy == "Always"


def test_records_keep_what_still_matches_add_the_new_and_drop_packages_gone_or_pinned() -> None:
    g = gate({"a": {"version": "1.0.0", "image": "h/a"}, "b": {"version": "2.0.0", "image": "h/b"},
              "p": {"version": "1.0.0", "image": PINNED}},
             [record("a", "h/a:1.0.0", D1), record("b", "h/b:1.0.0", D1), record("gone", "h/gone:1.0.0", D1),
              record("p", "h/pinned:1.0.0", D1)])
    fresh = ImageRecord(package="b", reference="h/b:2.0.0", digest=D2)
    assert [(r.package, r.reference, r.digest) for r in merged_records(g, [fresh])] == [
        ("a", "h/a:1.0.0", D1), ("b", "h/b:2.0.0", D2)]
    # without a fresh record, b's stale one (1.0.0) is dropped rather than kept for 2.0.0
    assert [r.package for r in merged_records(g, [])] == ["a"]


def test_by_digest_drops_the_tag_and_keeps_a_registry_port() -> None:
    assert by_digest("host:5000/team/a:1.0.0", D1) == f"host:5000/team/a@{D1}"
    assert by_digest("ubuntu:24.04", D1) == f"ubuntu@{D1}"


def test_the_images_of_a_spec_a_failed_batch_goes_back_to_are_resolved_and_kept_beside_the_current() -> None:
    now = {"a": {"version": "2.0.0", "image": "h/a"}, "new": {"version": "1.0.0", "image": "h/new"}}
    back = gate({"a": {"version": "1.0.0", "image": "h/a"}})  # the revision before: a at 1.0.0
    g = gate(now, [record("a", "h/a:2.0.0", D2), record("new", "h/new:1.0.0", D1)])
    assert list(to_resolve(g)) == []
    assert list(to_resolve(g, [back])) == [("a", "h/a:1.0.0")]  # the same package, its older image
    old = ImageRecord(package="a", reference="h/a:1.0.0", digest=D1)
    merged = merged_records(g, [old], [back])
    assert [(r.package, r.reference) for r in merged] == [("a", "h/a:1.0.0"), ("a", "h/a:2.0.0"),
                                                          ("new", "h/new:1.0.0")]
    # Each round pulls its own spec's image of the package, by digest.
    with_both = gate(now, [r.to_wire() for r in merged])
    back_both = gate({"a": {"version": "1.0.0", "image": "h/a"}}, [r.to_wire() for r in merged])
    assert pod_images(with_both, ["a"], resolve=True)[0]["a"].image == f"h/a@{D2}"
    assert pod_images(back_both, ["a"], resolve=True)[0]["a"].image == f"h/a@{D1}"
    # Once nothing goes back any more, the older record goes.
    assert [(r.package, r.reference) for r in merged_records(with_both, [])] == [("a", "h/a:2.0.0"),
                                                                                 ("new", "h/new:1.0.0")]


def test_a_status_record_is_used_only_with_a_digest_and_only_for_the_specs_own_reference() -> None:
    """`status.images` may be written by anyone with the status subresource: a record that is no
    digest, or names another repository, never reaches a pod; the image is resolved again."""
    packages = {"a": {"version": "1.0.0", "image": "registry.example.com/team/a"}}
    ref = "registry.example.com/team/a:1.0.0"
    for digest in ("sha256:" + "1" * 63, "sha256:" + "A" * 64, f"{D1}/../../evil/b", "md5:" + "1" * 32,
                   f"sha256:{'1' * 32}@sha256:{'2' * 32}", ""):
        forged = gate(packages, [record("a", ref, digest)])
        images, missing = pod_images(forged, ["a"], resolve=True)
        assert (images, missing) == ({}, ["a"]), digest
        assert list(to_resolve(forged)) == [("a", ref)], digest
        assert merged_records(forged, []) == [], digest  # dropped from the status at the next write
    # A record for another repository under the package's name is never looked up: the spec's is.
    elsewhere = gate(packages, [record("a", "evil.example.com/a:1.0.0", D1)])
    assert pod_images(elsewhere, ["a"], resolve=True) == ({}, ["a"])
    good = gate(packages, [record("a", ref, D1)])
    assert pod_images(good, ["a"], resolve=True)[0]["a"].image == f"registry.example.com/team/a@{D1}"


def test_what_resolving_writes_is_planned_records_conditions_event_and_the_hold() -> None:
    """`plan_images`: new records are written alone; a hold (`gate.lifecycle.signatures.hold_of`) also writes
    its condition False, Ready False and Degraded True with its message, and a Warning Event after those of
    warn mode; a status that already says it all is not written again."""
    packages = {"a": {"version": "1.0.0", "image": "h/a"}, "b": {"version": "1.0.0", "image": "h/b"}}
    g = gate(packages)
    fresh = [ImageRecord(package="a", reference="h/a:1.0.0", digest=D1)]
    ok = plan_images(g, {}, fresh, None, NOW)
    assert ok.status == {"images": [record("a", "h/a:1.0.0", D1)]} and ok.events == [] and ok.held is None
    hold = hold_of({"b": "h/b:1.0.0: manifest unknown"}, [])
    warned = EventRequest("gate", "Warning", "SignatureMissing", "warn mode: image h/a")
    bad = plan_images(g, {}, fresh, hold, NOW, [warned])
    assert bad.held is not None and "package b: h/b:1.0.0: manifest unknown" in bad.held.message
    assert bad.status is not None and bad.status["status"] == "Degraded"
    assert {(c["type"], c["status"], c["reason"]) for c in bad.status["conditions"]} == {
        ("ImagesResolved", "False", "ResolveFailed"), ("Ready", "False", "ResolveFailed"),
        ("Degraded", "True", "ResolveFailed")}
    assert [(e.target, e.type, e.reason) for e in bad.events] == [
        ("gate", "Warning", "SignatureMissing"), ("gate", "Warning", "ResolveFailed")]
    written = gate(packages, [record("a", "h/a:1.0.0", D1)])
    again = plan_images(written, bad.status, fresh, hold, NOW)
    assert again.status is None and again.held == hold, "said already: not written, still held"


def test_a_stage_pod_whose_images_are_not_pinned_is_held() -> None:
    g = gate({"a": {"version": "1.0.0", "image": "h/a"}, "p": {"version": "1.0.0", "image": PINNED}})
    pods = [PodRequest("s-a", "stages", (Step("a", "apply"),)), PodRequest("s-p", "stages", (Step("p", "apply"),))]
    assert held_requests(g, pods, resolve=True) == {"s-a": ["a"]}
    assert held_requests(g, pods, resolve=False) == {}
    # With a signature policy, NodeGate's own agent image is judged too: by a digest not judged runnable,
    # or by a tag the operator has not pinned yet (None), every pod waits for it.
    trusted = {(PINNED.partition("@")[0], PINNED.partition("@")[2])}
    agent = ImageRecord(package=AGENT, reference="h/nodegate", digest=D1)
    assert held_requests(g, pods[1:], resolve=True, trusted=trusted, agent=agent) == {"s-p": [AGENT]}
    assert held_requests(g, pods[1:], resolve=True, trusted=trusted, agent=None) == {"s-p": [AGENT]}
    assert held_requests(g, pods[1:], resolve=True, trusted=trusted | {("h/nodegate", D1)}, agent=agent) == {}
