"""A gate's history as ControllerRevisions (gate.rollout.history): numbering, reuse, pruning, trust, undo."""

from __future__ import annotations

from typing import Any

import pytest

from gate.api.nodegate import NodeGate
from gate.api.records import KeyRing
from gate.api.state import rollout_hash
from gate.rollout.history import (
    Revision,
    UndoError,
    parse_revision,
    plan_history,
    revision_name,
    revision_refusal,
    revision_spec,
    sign_revision,
    spec_summary,
    undo_target,
)

RING = KeyRing({"20261201T000000Z": b"k" * 32})


def gate(version: str, *, paused: bool = False, uid: str = "uid-1") -> NodeGate:
    return NodeGate.model_validate({"metadata": {"name": "g", "uid": uid}, "spec": {
        "paused": paused, "packages": {"tool": {"version": version, "image": "registry.example.com/tool"}}}})


def revision(g: NodeGate, number: int) -> Revision:
    h = rollout_hash(g)
    return Revision(name=revision_name(g.name, h), number=number, spec_hash=h, spec=revision_spec(g),
                    sig=sign_revision(RING, g.name, g.metadata.uid or "", h, revision_spec(g), number))


def test_a_new_spec_gets_the_greatest_number_plus_one_and_the_same_spec_is_left_alone() -> None:
    assert plan_history(gate("1.0.0"), [], 10).create
    first = plan_history(gate("1.0.0"), [], 10)
    assert (first.name, first.number) == (revision_name("g", rollout_hash(gate("1.0.0"))), 1)
    step = plan_history(gate("2.0.0"), [revision(gate("1.0.0"), 1)], 10)
    assert step.create and step.number == 2 and not step.delete
    same = plan_history(gate("2.0.0"), [revision(gate("1.0.0"), 1), revision(gate("2.0.0"), 2)], 10)
    assert same.empty and same.number == 2


def test_pausing_is_no_new_revision_and_a_revision_holds_no_paused() -> None:
    assert rollout_hash(gate("1.0.0", paused=True)) == rollout_hash(gate("1.0.0"))
    assert plan_history(gate("1.0.0", paused=True), [revision(gate("1.0.0"), 1)], 10).empty
    assert "paused" not in revision_spec(gate("1.0.0", paused=True))


def test_a_spec_applied_again_reuses_its_revision_renumbered_to_the_newest() -> None:
    history = [revision(gate("1.0.0"), 1), revision(gate("2.0.0"), 2)]
    step = plan_history(gate("1.0.0"), history, 10)
    assert step.renumber and not step.create
    assert (step.name, step.number) == (history[0].name, 3)


def test_only_limit_previous_revisions_are_kept_and_never_the_current_one() -> None:
    history = [revision(gate(f"1.0.{i}"), i + 1) for i in range(5)]   # 1.0.0 .. 1.0.4 as revisions 1 .. 5
    step = plan_history(gate("2.0.0"), history, 2)
    assert step.create and step.number == 6
    assert step.delete == tuple(sorted(r.name for r in history[:3]))
    # The current spec is an old one, renumbered: it is not counted among the previous ones.
    again = plan_history(gate("1.0.0"), history, 2)
    assert again.renumber and history[0].name not in again.delete
    assert again.delete == tuple(sorted(r.name for r in history[1:3]))
    assert plan_history(gate("2.0.0"), history, 0).delete == tuple(sorted(r.name for r in history))


def test_only_a_revision_the_operator_signed_for_this_gate_is_its_own() -> None:
    own = revision(gate("1.0.0"), 1)
    assert revision_refusal(RING, "g", "uid-1", own) is None
    assert revision_refusal(RING, "g", "uid-2", own) is not None, "an earlier gate of the same name"
    forged = Revision(own.name, own.number, own.spec_hash, {**own.spec, "priority": 1}, sig=own.sig)
    assert "does not match" in str(revision_refusal(RING, "g", "uid-1", forged))
    assert revision_refusal(RING, "g", "uid-1", Revision(own.name, 1, own.spec_hash, own.spec)) == \
        "it carries no signature"
    other_key = KeyRing({"20261201T000000Z": b"x" * 32})
    assert revision_refusal(other_key, "g", "uid-1", own) is not None
    renamed = Revision("g-0000000000000000", 1, own.spec_hash, own.spec, sig=own.sig)
    assert "name" in str(revision_refusal(RING, "g", "uid-1", renamed))


def test_a_revision_whose_number_was_changed_is_not_the_operators_and_undo_skips_it() -> None:
    """Whoever may patch a ControllerRevision chose which old spec came back when its number was outside
    the signature: 1.0.0 made the newest previous revision picks it for undo and for the history's order."""
    one, two, three = revision(gate("1.0.0"), 1), revision(gate("2.0.0"), 2), revision(gate("3.0.0"), 3)
    bumped = Revision(one.name, 7, one.spec_hash, one.spec, sig=one.sig)
    why = revision_refusal(RING, "g", "uid-1", bumped)
    assert why is not None and "number (7)" in why
    own = [r for r in (bumped, two, three) if revision_refusal(RING, "g", "uid-1", r) is None]
    assert undo_target(own, three.spec_hash, None).name == two.name  # not the forged "newest"
    with pytest.raises(UndoError, match="no revision 7"):
        undo_target(own, three.spec_hash, 7)
    # Renumbered by the operator: signed anew for its number, it checks.
    renumbered = Revision(one.name, 4, one.spec_hash, one.spec,
                          sig=sign_revision(RING, "g", "uid-1", one.spec_hash, one.spec, 4))
    assert revision_refusal(RING, "g", "uid-1", renumbered) is None


def test_a_revision_signed_without_its_number_is_not_counted() -> None:
    import hashlib
    import hmac
    import json

    old = revision(gate("1.0.0"), 1)
    message = json.dumps(["nodegate.io/revision.v1", "g", "uid-1", old.spec_hash, old.spec], sort_keys=True,
                         separators=(",", ":")).encode()
    kid = RING.signing_id
    v1 = Revision(old.name, 1, old.spec_hash, old.spec,
                  sig=f"{kid}:{hmac.new(RING.keys[kid], message, hashlib.sha256).hexdigest()}")
    assert "signed before the number was" in str(revision_refusal(RING, "g", "uid-1", v1))


def _object(owner_uid: str, *, data: Any = None, number: Any = 1) -> dict[str, Any]:
    return {"metadata": {"name": "g-abc", "labels": {"nodegate.io/rollout-hash": "abc"},
                         "ownerReferences": [{"kind": "NodeGate", "name": "g", "uid": owner_uid, "controller": True}]},
            "data": {"spec": {"packages": {}}} if data is None else data, "revision": number}


def test_parse_takes_only_revisions_controlled_by_this_gate_that_hold_a_spec() -> None:
    parsed = parse_revision(_object("uid-1"), "g", "uid-1")
    assert parsed is not None and (parsed.number, parsed.spec_hash) == (1, "abc")
    assert parse_revision(_object("uid-0"), "g", "uid-1") is None
    assert parse_revision(_object("uid-1", data={"other": 1}), "g", "uid-1") is None
    assert parse_revision(_object("uid-1", number="1"), "g", "uid-1") is None


def test_undo_goes_to_the_newest_other_spec_or_the_one_named_and_says_why_not() -> None:
    history = [revision(gate("1.0.0"), 1), revision(gate("2.0.0"), 2), revision(gate("3.0.0"), 3)]
    now = rollout_hash(gate("3.0.0"))
    assert undo_target(history, now, None).number == 2
    assert undo_target(history, now, 1).number == 1
    with pytest.raises(UndoError, match=r"no revision 7 of this gate; it has revision\(s\) 1, 2, 3"):
        undo_target(history, now, 7)
    with pytest.raises(UndoError, match="no previous revision"):
        undo_target(history[2:], now, None)
    with pytest.raises(UndoError, match=r"revision\(s\) kept: none"):
        undo_target([], now, None)


def test_a_revision_reads_as_its_packages_and_versions() -> None:
    assert spec_summary(revision_spec(gate("1.2.3"))) == "tool@1.2.3"
    assert spec_summary({}) == "-"
