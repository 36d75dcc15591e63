"""Which compartment a node belongs to, and how big each compartment's ceiling is."""

from __future__ import annotations

import pytest

from gate.api.policy import DEFAULT_COMPARTMENT
from gate.rollout import GateProgress, NodeSnapshot, PolicyMismatch, plan
from tests.unit.rollout.builders import NOW, Fleet, compartment, fixed, make_gate, make_policy


def _pools(**pools: str) -> dict[str, dict[str, str]]:
    return {node: {"pool": pool} for node, pool in pools.items()}


def test_node_matched_by_two_selectors_goes_to_the_first_listed() -> None:
    wide = compartment("wide", {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
                       {"count": 1}, fixed(1))
    narrow = compartment("narrow", {"matchLabels": {"pool": "b"}}, {"count": 1}, fixed(1))
    labels = _pools(n1="a", n2="b", n3="c")

    wide_first = Fleet.of(make_gate(policy="p"), make_policy(compartments=[wide, narrow]), labels).plan()
    narrow_first = Fleet.of(make_gate(policy="p"), make_policy(compartments=[narrow, wide]), labels).plan()

    assert wide_first.assignment == {"n1": "wide", "n2": "wide", "n3": DEFAULT_COMPARTMENT}
    assert narrow_first.assignment == {"n1": "wide", "n2": "narrow", "n3": DEFAULT_COMPARTMENT}


def test_compartments_come_in_policy_order_with_default_last_even_when_empty() -> None:
    policy = make_policy(compartments=[
        compartment("b", {"matchLabels": {"pool": "b"}}, {"count": 1}, fixed(1)),
        compartment("a", {"matchLabels": {"pool": "a"}}, {"count": 1}, fixed(1)),
    ])
    result = Fleet.of(make_gate(policy="p"), policy, _pools(n1="a", n2="b")).plan()

    assert [c.name for c in result.compartments] == ["b", "a", DEFAULT_COMPARTMENT]
    default = result.compartment(DEFAULT_COMPARTMENT).status
    assert (default.matched, default.ceiling, default.state) == (0, 0, "complete")


@pytest.mark.parametrize(
    ("matched", "budget", "ceiling"),
    [
        (10, {"percent": 25}, 2),  # 2.5 rounds down
        (3, {"percent": 10}, 1),  # 0.3 rounds down to 0, but at least 1
        (7, {"percent": 50}, 3),
        (4, {"percent": 100}, 4),
        (5, {"percent": 0}, 1),  # percent 0 still lets one node through: "at least 1"
        (3, {"count": 5}, 3),  # a count above matched is capped at matched
        (6, {"count": 2}, 2),
    ],
)
def test_ceiling_rounds_percent_down_but_to_at_least_one(matched: int, budget: dict[str, int], ceiling: int) -> None:
    labels: dict[str, dict[str, str]] = {f"n{i}": {} for i in range(matched)}
    result = Fleet.of(make_gate(budget=budget), None, labels).plan()

    status = result.compartment(DEFAULT_COMPARTMENT).status
    assert status.ceiling == ceiling
    assert len(result.starts) == ceiling  # the implicit strategy fills the budget


def test_budget_count_zero_starts_nothing_and_says_the_budget_is_full() -> None:
    result = Fleet.of(make_gate(budget={"count": 0}), None, {"n1": {}, "n2": {}}).plan()

    assert result.starts == ()
    assert {w.reason for w in result.waits.values()} == {"budget-full"}


def test_interruption_budget_without_policy_is_one_default_compartment_filling_the_budget() -> None:
    labels = {f"n{i}": {"pool": "a" if i % 2 else "b"} for i in range(10)}
    fleet = Fleet.of(make_gate(budget={"count": 3}), None, labels)

    first = fleet.step()
    fleet.finish_all()
    second = fleet.step()

    assert [c.name for c in first.compartments] == [DEFAULT_COMPARTMENT]
    assert [len(first.starts), len(second.starts)] == [3, 3]
    assert {s.batch for s in second.starts} == {2}


def test_gate_without_budget_or_policy_starts_every_node_at_once() -> None:
    result = Fleet.of(make_gate(), None, {f"n{i}": {} for i in range(7)}).plan()

    assert len(result.starts) == 7
    assert result.compartment(DEFAULT_COMPARTMENT).status.ceiling == 7


def test_nodes_outside_the_gate_selector_or_opted_out_are_not_part_of_the_rollout() -> None:
    labels = {
        "gpu1": {"gpu": "true"},
        "gpu2": {"gpu": "true", "nodegate.io/ignore": "true"},
        "cpu1": {},
    }
    result = Fleet.of(make_gate(selector={"gpu": "true"}), None, labels).plan()

    assert result.assignment == {"gpu1": DEFAULT_COMPARTMENT}
    assert [s.node for s in result.starts] == ["gpu1"]


def test_planning_with_a_policy_the_gate_does_not_name_is_refused() -> None:
    nodes = [NodeSnapshot("n1")]
    with pytest.raises(PolicyMismatch):
        plan(make_gate(policy="p"), None, nodes, now=NOW)
    with pytest.raises(PolicyMismatch):
        plan(make_gate(policy="p"), make_policy("other"), nodes, now=NOW)
    with pytest.raises(PolicyMismatch):
        plan(make_gate(), make_policy("p"), nodes, now=NOW)


def test_the_same_node_twice_in_a_snapshot_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        plan(make_gate(), None, [NodeSnapshot("n1"), NodeSnapshot("n1", gates={"g": GateProgress()})], now=NOW)
