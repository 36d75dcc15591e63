"""kstatus' Reconciling and Stalled as NodeGate decides them (gate.lifecycle.health): which phase of a
rollout gets which, and the abnormal-true rule (present only while True, never both)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.api.common import Condition
from gate.api.nodegate import CompartmentStatus, NodeCounts
from gate.lifecycle.health import KSTATUS_TYPES, policy_status, rollout_verdict, with_verdict

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _comp(state: str) -> CompartmentStatus:
    return CompartmentStatus(name=f"c-{state}", state=state)  # type: ignore[arg-type]


@pytest.mark.parametrize(("counts", "states", "paused", "expected"), [
    (NodeCounts(matched=4, complete=1, in_progress=1, waiting=2), ["rolling"], False, ("Reconciling", "RollingOut")),
    (NodeCounts(matched=4, complete=4), ["complete"], False, None),
    (NodeCounts(matched=0), [], False, None),
    (NodeCounts(matched=4, failed=1, blocked=3), ["stopped"], False, ("Stalled", "CompartmentStopped")),
    # A stopped compartment stalls the gate even while another compartment still rolls.
    (NodeCounts(matched=8, failed=1, blocked=3, in_progress=2, waiting=2), ["stopped", "rolling"], False,
     ("Stalled", "CompartmentStopped")),
    (NodeCounts(matched=4, complete=3, failed=1), ["complete"], False, ("Stalled", "NodesFailed")),
    # Failures below the threshold while others still have work: the rollout goes on by itself.
    (NodeCounts(matched=4, failed=1, waiting=3), ["rolling"], False, ("Reconciling", "RollingOut")),
    (NodeCounts(matched=4, in_progress=1, waiting=3), ["rolling"], True, ("Reconciling", "Paused")),
    (NodeCounts(matched=4, complete=4), ["complete"], True, None),
    (NodeCounts(matched=4, waiting=4), ["outside-window"], False, ("Reconciling", "OutsideWindow")),
    (NodeCounts(matched=4, blocked=4), ["waiting"], False, ("Reconciling", "Blocked")),
])
def test_each_phase_of_a_rollout_gets_its_verdict(counts: NodeCounts, states: list[str], paused: bool,
                                                   expected: tuple[str, str] | None) -> None:
    verdict = rollout_verdict("g", counts, [_comp(s) for s in states], paused)
    assert (None if verdict is None else (verdict.type, verdict.reason)) == expected


def test_a_stalled_verdict_tells_the_person_what_to_run() -> None:
    verdict = rollout_verdict("gpu", NodeCounts(matched=2, failed=1, blocked=1), [_comp("stopped")], False)
    assert verdict is not None and "nodegate resume gpu" in verdict.message and "c-stopped" in verdict.message


_counts = st.builds(NodeCounts, matched=st.integers(0, 9), complete=st.integers(0, 9), in_progress=st.integers(0, 9),
                    failed=st.integers(0, 9), waiting=st.integers(0, 9), blocked=st.integers(0, 9))
_states = st.lists(st.sampled_from(["waiting", "rolling", "complete", "stopped", "outside-window"]), max_size=4)


@given(_counts, _states, st.booleans(), st.lists(st.sampled_from(KSTATUS_TYPES), max_size=2))
def test_the_kstatus_conditions_are_abnormal_true_and_never_both(counts: NodeCounts, states: list[str], paused: bool,
                                                                 before: list[str]) -> None:
    previous = [Condition(type=t, status="True", reason="Old", last_transition_time="2026-01-01T00:00:00Z")
                for t in before]
    verdict = rollout_verdict("g", counts, [_comp(s) for s in states], paused)
    out = with_verdict(previous, verdict, previous, NOW, 3)
    kstatus = [c for c in out if c.type in KSTATUS_TYPES]
    assert len(kstatus) == (0 if verdict is None else 1)
    assert all(c.status == "True" and c.observed_generation == 3 for c in kstatus)
    # Work left and no failure: Reconciling; nothing left and no failure: neither.
    left = counts.in_progress + counts.waiting + counts.blocked
    if not counts.failed and "stopped" not in states:
        assert (verdict is not None and verdict.type == "Reconciling") == bool(left)


def test_a_condition_that_stays_true_keeps_its_transition_time() -> None:
    verdict = rollout_verdict("g", NodeCounts(matched=2, waiting=2), [_comp("rolling")], False)
    first = with_verdict([], verdict, [], NOW, 1)
    later = with_verdict(first, verdict, first, NOW + timedelta(minutes=5), 2)
    assert later[0].last_transition_time == "2026-12-01T12:00:00Z" and later[0].observed_generation == 2


def test_a_policy_is_ready_once_read_and_stalled_while_its_spec_cannot_be_used() -> None:
    ok = policy_status(2, ["a", "b"], None, [], NOW)
    assert ok.observed_generation == 2 and ok.used_by == ["a", "b"]
    assert [(c.type, c.status) for c in ok.conditions] == [("Ready", "True")] and "a, b" in ok.conditions[0].message
    bad = policy_status(3, [], "spec.compartments.0.budget: field required", ok.conditions, NOW)
    assert [(c.type, c.status, c.reason) for c in bad.conditions] == [("Ready", "False", "InvalidSpec"),
                                                                      ("Stalled", "True", "InvalidSpec")]
    assert "budget" in bad.conditions[1].message
