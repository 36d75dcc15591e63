"""The operator acts only on its own records: the checked fleet view and the plan built on it."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import pytest

from gate.api import keys
from gate.api.records import KeyRing, KeyRingError
from gate.api.state import Installed, NodeGateState, rollout_hash, spec_hash
from gate.controller.signing import Signer, needs_signing, new_key_id, ring_of
from gate.controller.views import fleet_node
from gate.lifecycle.fleet import plan_gate, replan
from tests.unit.lifecycle.test_machine import NOW, PKG, gate

RING = KeyRing({"20261201T000000Z": b"k" * 32})


def _gate(**spec: Any) -> Any:
    g = gate({"fix": PKG}, **spec)
    return g.model_copy(update={"metadata": g.metadata.model_copy(update={"uid": "uid-g"})})


def _node(name: str, state: NodeGateState | None = None, *, raw: str | None = None, uid: str | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {}
    if state is not None or raw is not None:
        annotations[keys.state_annotation("g")] = raw if raw is not None else state.dump()  # type: ignore[union-attr]
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "resourceVersion": "1",
                         "creationTimestamp": "2026-01-01T00:00:00Z", "labels": labels or {"pool": "a"},
                         "annotations": annotations},
            "spec": {}, "status": {"nodeInfo": {"bootID": "b"}}}


def _complete(g: Any) -> NodeGateState:
    installed = {"fix": Installed(version=PKG["version"], spec_hash=spec_hash(g.spec.packages["fix"]))}
    return NodeGateState(status="complete", generation=g.metadata.generation or 0, rollout_hash=rollout_hash(g),
                         installed=installed, round=1, batch=1)


def _signer(g: Any) -> Signer:
    return Signer(RING, lambda name: g.metadata.uid if name == g.name else None)


def test_a_signed_record_is_kept_without_its_signature_and_an_unsigned_one_is_refused() -> None:
    g = _gate()
    signer = _signer(g)
    mine = _node("n1")
    mine["metadata"]["annotations"][keys.state_annotation("g")] = signer.sign(g, mine, _complete(g)).dump()
    kept = fleet_node(mine, signer.check)
    assert kept.states["g"] == _complete(g) and not kept.refused
    forged = fleet_node(_node("n2", _complete(g)), signer.check)
    assert "g" not in forged.states
    assert forged.refused["g"].why == "it carries no signature"
    # without the operator's check (the CLI), every record is taken as it reads
    assert fleet_node(_node("n2", _complete(g))).states["g"] == _complete(g)


def test_a_record_copied_from_another_node_is_refused() -> None:
    g = _gate()
    signer = _signer(g)
    source = _node("n1")
    copied = signer.sign(g, source, _complete(g)).dump()
    target = fleet_node(_node("n2", raw=copied), signer.check)
    assert "g" not in target.states and "does not match" in target.refused["g"].why


def test_a_record_of_a_gate_that_does_not_exist_is_not_taken() -> None:
    g = _gate()
    node = _node("n1")
    node["metadata"]["annotations"][keys.state_annotation("gone")] = NodeGateState(status="complete").dump()
    view = fleet_node(node, _signer(g).check)
    assert "gone" not in view.states and "does not exist" in view.refused["gone"].why


def test_a_forged_complete_record_does_not_skip_the_node() -> None:
    """The plan sees a node with a forged "complete" as a node with no record: it is picked, and the
    operator's own record replaces the forged one."""
    g = _gate(interruptionBudget={"percent": 100})
    signer = _signer(g)
    fleet = [fleet_node(_node("forged", _complete(g)), signer.check)]
    plan = plan_gate(g, None, fleet, gates=[g], now=NOW)
    update = plan.updates["forged"]
    assert update.state is not None and update.state.status == "in-progress" and update.state.installed == {}
    assert plan.status.nodes.complete == 0
    # the same record, signed by the operator, is complete: nothing to do
    mine = _node("mine")
    mine["metadata"]["annotations"][keys.state_annotation("g")] = signer.sign(g, mine, _complete(g)).dump()
    plan = plan_gate(g, None, [fleet_node(mine, signer.check)], gates=[g], now=NOW)
    assert "mine" not in plan.updates or plan.updates["mine"].state is None
    assert plan.status.nodes.complete == 1


def test_a_forged_round_on_a_node_the_gate_does_not_select_starts_nothing() -> None:
    g = _gate(nodeSelector={"matchLabels": {"pool": "a"}})
    signer = _signer(g)
    forged = NodeGateState(status="in-progress", phase="interrupt", batch=1, round=1,
                           interrupt={"type": "reboot"}, interrupted=["fix"])
    fleet = [fleet_node(_node("outside", forged, labels={"pool": "other"}), signer.check)]
    plan = plan_gate(g, None, fleet, gates=[g], now=NOW)
    assert plan.active == [] and "outside" not in plan.updates
    assert plan.status.nodes.matched == 0
    # read as the operator did before signing, the same record is a round to stop on a node it left
    trusting = plan_gate(g, None, [fleet_node(_node("outside", forged, labels={"pool": "other"}))], gates=[g],
                         now=NOW)
    assert trusting.updates["outside"].remove_state


def test_a_new_forged_record_asks_for_a_plan_so_that_it_is_reported() -> None:
    g = _gate()
    signer = _signer(g)
    before = fleet_node(_node("n1"), signer.check)
    after = fleet_node(_node("n1", _complete(g)), signer.check)
    assert after.states == before.states
    assert replan(before, after) == "now"


def test_the_key_secret_is_read_and_an_unusable_one_is_refused_naming_the_key() -> None:
    good = {"data": {"20261201T000000Z": base64.b64encode(b"k" * 32).decode(),
                     "20261202T000000Z": base64.b64encode(b"j" * 32).decode()}}
    assert ring_of(good, "nodegate-state-key").signing_id == "20261202T000000Z"
    short = {"data": {"k1": base64.b64encode(b"k" * 8).decode()}}
    with pytest.raises(KeyRingError, match=r"nodegate-state-key.*'k1' has 8 bytes"):
        ring_of(short, "nodegate-state-key")
    with pytest.raises(KeyRingError, match="no key"):
        ring_of({"data": {}}, "nodegate-state-key")


def test_key_ids_sort_by_time() -> None:
    earlier = new_key_id(datetime(2026, 12, 1, 23, 59, tzinfo=UTC))
    later = new_key_id(datetime(2026, 12, 2, 0, 1, tzinfo=UTC))
    assert earlier < later and max(earlier, later) == later


def test_the_signer_refuses_to_sign_for_a_gate_without_a_uid() -> None:
    g = gate({"fix": PKG})
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        _signer(g).sign(g, _node("n1"), NodeGateState())


def test_before_work_the_leader_signs_anew_only_older_keys_records_and_while_adopting_unsigned_ones() -> None:
    g = _gate()
    old, new = "20261201T000000Z", "20261202T000000Z"
    before = Signer(KeyRing({old: b"o" * 32}), lambda name: "uid-g")
    after = Signer(KeyRing({old: b"o" * 32, new: b"n" * 32}), lambda name: "uid-g")
    node = _node("n1")
    of_old = before.sign(g, node, _complete(g))
    of_new = after.sign(g, node, _complete(g))
    assert needs_signing(after, "g", node, of_old, adopt=False)
    assert not needs_signing(after, "g", node, of_new, adopt=False)
    unsigned_record = _complete(g)
    assert not needs_signing(after, "g", node, unsigned_record, adopt=False), "after adoption, unsigned is forged"
    assert needs_signing(after, "g", node, unsigned_record, adopt=True)
    # a record copied from another node is adopted too while adopting, and never otherwise
    copied = after.sign(g, _node("n2"), _complete(g))
    assert not needs_signing(after, "g", node, copied, adopt=False)
