"""Across gates: lower priority numbers go first, per node or for the whole fleet."""

from __future__ import annotations

from gate.api.nodegate import NodeGate
from gate.rollout import GateProgress
from tests.unit.rollout.builders import Fleet, done, make_gate, running

GPU = {"gpu": "true"}


def _fleet(base: NodeGate, lower: NodeGate) -> Fleet:
    """`lower` is planned; `base` runs on the gpu nodes: complete on g1, running on g2, failed on g3."""
    fleet = Fleet.of(lower, None, {"g1": GPU, "g2": GPU, "g3": GPU, "c1": {}})
    fleet.gates = (base, lower)
    fleet.others = {
        "g1": {base.name: done(1)},
        "g2": {base.name: running(1)},
        "g3": {base.name: GateProgress("failed", 1)},
    }
    return fleet


def test_sequencing_node_holds_back_only_nodes_where_a_higher_priority_gate_is_not_complete() -> None:
    base = make_gate("base", selector=GPU, priority=100)
    fleet = _fleet(base, make_gate("tuning", priority=200, sequencing="node"))

    result = fleet.plan()

    assert sorted(s.node for s in result.starts) == ["c1", "g1"]
    assert {n: (w.reason, w.status, w.gates) for n, w in result.waits.items()} == {
        "g2": ("priority", "blocked", ("base",)),
        "g3": ("priority", "blocked", ("base",)),  # a failed node holds lower gates back too
    }
    assert "on this node" in result.waits["g2"].message


def test_sequencing_all_holds_back_the_whole_gate_until_higher_gates_are_complete_everywhere() -> None:
    base = make_gate("base", selector=GPU, priority=100)
    fleet = _fleet(base, make_gate("tuning", priority=200, sequencing="all"))

    before = fleet.plan()
    fleet.others = {n: {"base": done(1)} for n in ("g1", "g2", "g3")}
    after = fleet.plan()

    assert before.starts == ()
    assert set(before.waits) == {"g1", "g2", "g3", "c1"}
    assert {w.gates for w in before.waits.values()} == {("base",)}
    assert "on all their nodes" in before.waits["c1"].message
    assert len(after.starts) == 4


def test_equal_priority_gates_do_not_wait_for_each_other() -> None:
    base = make_gate("base", selector=GPU, priority=200)
    fleet = _fleet(base, make_gate("tuning", priority=200, sequencing="all"))

    assert len(fleet.plan().starts) == 4


def test_lower_priority_gate_does_not_wait_for_a_higher_priority_number() -> None:
    later = make_gate("later", selector=GPU, priority=300)
    fleet = _fleet(later, make_gate("tuning", priority=200, sequencing="all"))

    assert len(fleet.plan().starts) == 4


def test_blockers_are_listed_by_priority_then_name() -> None:
    gates = (
        make_gate("zeta", priority=50),
        make_gate("alpha", priority=100),
        make_gate("beta", priority=100),
    )
    fleet = Fleet.of(make_gate("tuning", priority=200), None, {"n1": {}})
    fleet.gates = gates

    assert fleet.plan().waits["n1"].gates == ("zeta", "alpha", "beta")


def test_node_already_picked_is_not_held_back_by_a_higher_priority_gate_that_appears_later() -> None:
    base = make_gate("base", selector=GPU, priority=100)
    fleet = _fleet(base, make_gate("tuning", priority=200, budget={"count": 3}))
    fleet.progress["g2"] = running(1)
    fleet.persist([])

    result = fleet.plan()

    assert result.compartment("__default__").running == ("g2",)
    assert "g2" not in result.waits

