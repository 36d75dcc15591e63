"""Signing and checking node records (gate.api.records): only what the operator wrote checks."""

from __future__ import annotations

import json

import pytest

from gate.api.records import Binding, KeyRing, KeyRingError, refusal, sign, unsigned
from gate.api.state import Installed, NodeGateState, load_state

OLD, NEW = "20260101T000000Z", "20261201T000000Z"
RING = KeyRing({OLD: b"o" * 32, NEW: b"n" * 32})
HERE = Binding(gate="cve-fix", gate_uid="uid-gate-1", node="n1", node_uid="uid-node-1")
COMPLETE = NodeGateState(status="complete", generation=3, rollout_hash="abc",
                         installed={"fix": Installed(version="1.0.1", spec_hash="s")})


def test_a_signed_record_checks_after_the_round_trip_through_the_annotation() -> None:
    signed = sign(COMPLETE, RING, HERE)
    assert signed.sig.startswith(f"{NEW}:"), "the newest key signs"
    assert refusal(load_state(signed.dump()), RING, HERE) is None


def test_a_record_without_a_signature_is_refused() -> None:
    assert refusal(COMPLETE, RING, HERE) == "it carries no signature"


@pytest.mark.parametrize("other", [
    Binding("cve-fix", "uid-gate-1", "n2", "uid-node-2"),   # copied to another node
    Binding("cve-fix", "uid-gate-1", "n1", "uid-node-9"),   # a node deleted and registered again under its name
    Binding("cve-fix", "uid-gate-2", "n1", "uid-node-1"),   # the gate deleted and created again under its name
    Binding("other-gate", "uid-gate-1", "n1", "uid-node-1"),  # moved to another gate's annotation
])
def test_a_record_does_not_check_for_another_gate_or_node(other: Binding) -> None:
    signed = sign(COMPLETE, RING, HERE)
    why = refusal(signed, RING, other)
    assert why is not None and "does not match" in why and other.node in why


def test_a_changed_field_breaks_the_signature() -> None:
    signed = sign(NodeGateState(status="in-progress", phase="stages"), RING, HERE)
    forged = signed.model_copy(update={"status": "complete"})
    assert refusal(forged, RING, HERE) is not None
    # ... and so does a change made in the annotation's text
    data = json.loads(sign(COMPLETE, RING, HERE).dump())
    data["installed"]["fix"]["version"] = "9.9.9"
    assert refusal(load_state(json.dumps(data)), RING, HERE) is not None


def test_a_field_the_format_does_not_know_is_not_part_of_what_is_signed() -> None:
    data = json.loads(sign(COMPLETE, RING, HERE).dump())
    data["comment"] = "added by hand"
    assert refusal(load_state(json.dumps(data)), RING, HERE) is None


def test_any_key_of_the_ring_verifies_and_an_unknown_one_is_named() -> None:
    old_only = KeyRing({OLD: b"o" * 32})
    signed_old = sign(COMPLETE, old_only, HERE)
    assert refusal(signed_old, RING, HERE) is None, "a record of the previous key checks during a rotation"
    signed_new = sign(COMPLETE, RING, HERE)
    why = refusal(signed_new, old_only, HERE)
    assert why is not None and NEW in why
    # the same key id with other bytes: a key lost and made again
    assert refusal(signed_old, KeyRing({OLD: b"x" * 32}), HERE) is not None


@pytest.mark.parametrize("sig", ["nocolon", f"{NEW}:", ":abc", f"{NEW}:" + "0" * 64])
def test_a_malformed_or_guessed_signature_is_refused(sig: str) -> None:
    assert refusal(COMPLETE.model_copy(update={"sig": sig}), RING, HERE) is not None


def test_unsigned_drops_the_signature_and_the_dump_of_an_unsigned_state_has_none() -> None:
    signed = sign(COMPLETE, RING, HERE)
    assert unsigned(signed) == COMPLETE
    assert "sig" not in json.loads(COMPLETE.dump())


@pytest.mark.parametrize(("keys", "named"), [
    ({}, "no key"),
    ({"k1": b"short"}, "'k1' has 5 bytes"),
    ({"bad id": b"x" * 32}, "'bad id'"),
])
def test_an_unusable_key_ring_is_refused_naming_the_key(keys: dict[str, bytes], named: str) -> None:
    with pytest.raises(KeyRingError, match=named):
        KeyRing(keys)
