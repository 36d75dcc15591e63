"""The node's facts the operator hands to stage pods: what they keep, and that they stay bounded."""

from __future__ import annotations

from gate.api import keys
from gate.api.facts import ANNOTATIONS_BUDGET, LABELS_BUDGET, OMITTED_MAX, OperatorFacts, operator_facts


def test_the_facts_keep_labels_and_annotations_but_not_the_gates_state() -> None:
    facts = operator_facts("n1", {"pool": "gpu"}, {"team": "ml", keys.state_annotation("g"): "{}"})
    assert facts.labels == {"pool": "gpu"} and facts.annotations == {"team": "ml"} and facts.omitted == []
    assert OperatorFacts.model_validate_json(facts.dump()) == facts


def test_an_annotation_too_big_for_the_budget_is_left_out_by_name_and_the_small_ones_after_it_stay() -> None:
    big = "x" * (ANNOTATIONS_BUDGET + 1)
    facts = operator_facts("n1", {}, {"a-small": "1", "b-huge": big, "c-small": "2"})
    assert facts.annotations == {"a-small": "1", "c-small": "2"} and facts.omitted == ["b-huge"]
    assert len(facts.dump()) < ANNOTATIONS_BUDGET + LABELS_BUDGET + 16 * 1024


def test_many_labels_fill_their_budget_and_the_list_of_omitted_keys_is_bounded_too() -> None:
    labels = {f"example.com/label-{i:05d}": "v" * 63 for i in range(5000)}
    facts = operator_facts("n1", labels, {})
    assert 0 < len(facts.labels) < len(labels) and len(facts.omitted) == OMITTED_MAX
    assert sorted(facts.labels) == sorted(labels)[: len(facts.labels)]  # key order decides what stays
    assert len(facts.dump()) < LABELS_BUDGET + 16 * 1024
