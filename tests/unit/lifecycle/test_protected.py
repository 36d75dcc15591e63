"""Protected pods never hold the rollout, and blocked drains show: the pure side (plan_gate, the planner)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.fleet import GatePlan, plan_gate
from gate.rollout import GateProgress, NodeSnapshot, order_key, plan
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, gate, started

SERVICE = {**PKG, "interrupt": {"type": "reboot"}}
PROTECT = {"matchLabels": {"workload": "training"}}


def _gate(**spec: Any) -> NodeGate:
    return gate({"k": SERVICE}, **{"interruptionBudget": {"count": 1}, "podNonInterruptLabels": PROTECT, **spec})


def _by_pick_order(names: list[str]) -> list[str]:
    return sorted(names, key=order_key)


def _starts(p: GatePlan) -> list[str]:
    return sorted(n for n, u in p.updates.items() if u.state is not None and u.state.status == "in-progress")


def _cordons(p: GatePlan) -> list[str]:
    return sorted(n for n, u in p.updates.items() if u.change.unschedulable is True)


NODES = [f"n{i}" for i in range(4)]


def test_the_free_node_starts_while_the_protected_ones_wait_blocked_naming_their_pods() -> None:
    # The reported case: 4 nodes, budget 1, three of them run a protected job that never ends.
    order = _by_pick_order(NODES)
    free = order[-1]  # the last in pick order: the old planner picked a protected node first
    protected = {n: (f"default/job-{n}",) for n in order[:-1]}
    g = _gate()
    p = plan_gate(g, None, [fleet_node(n) for n in NODES], gates=[g], now=NOW, protected=protected)
    assert _starts(p) == [free]
    assert _cordons(p) == []  # nothing cordoned but through the free node's own round
    for n, pods in protected.items():
        assert p.updates[n].change.status == "blocked"
        wait = p.rollout.waits[n]  # type: ignore[union-attr]
        assert wait.reason == "protected-pods" and wait.pods == pods and pods[0] in wait.message
        condition = p.conditions[n]
        assert condition is not None and condition.reason == "ProtectedPods" and pods[0] in condition.message
        assert n in condition.message and condition.type == keys.blocked_condition("g")
    assert p.conditions.get(free) is None
    assert p.status.nodes.blocked == 3 and p.status.nodes.waiting_for_pods == 3
    assert p.status.nodes.in_progress == 1
    assert p.status.waiting_for_pods_since == "2026-11-30T12:00:00Z"  # first seen now
    assert p.status.compartments[0].in_progress == 1


def test_when_the_job_ends_the_node_is_picked_in_its_turn() -> None:
    order = _by_pick_order(NODES)
    g = _gate()
    states = {order[-1]: NodeGateState(status="complete", round=1, batch=1, compartment="__default__")}
    fleet = [fleet_node(n, state=states.get(n)) for n in NODES]
    still = {n: ("default/job",) for n in order[1:-1]}  # the first node's job ended
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected=still)
    assert _starts(p) == [order[0]]


def test_oldest_wait_comes_from_the_blocked_condition_on_the_node() -> None:
    g = _gate()
    kind = keys.blocked_condition("g")
    since = "2026-11-30T09:00:00Z"
    old = {kind: NodeCondition(kind, "True", "ProtectedPods", "x", since)}
    fleet = [fleet_node("a", conditions=old), fleet_node("b")]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected={"a": ("ns/p",), "b": ("ns/q",)})
    assert p.status.waiting_for_pods_since == since
    assert p.status.nodes.waiting_for_pods == 2


def test_no_node_is_cordoned_while_protected_pods_run_by_default() -> None:
    g = _gate()
    p = plan_gate(g, None, [fleet_node(n) for n in NODES], gates=[g], now=NOW,
                  protected={n: ("default/job",) for n in NODES})
    assert _starts(p) == [] and _cordons(p) == []
    assert p.status.compartments[0].in_progress == 0


def test_cordon_while_protected_holds_nodes_only_within_the_budget_left() -> None:
    order = _by_pick_order(NODES)
    free = order[-1]
    protected = {n: ("default/job",) for n in order[:-1]}
    g = _gate(cordonWhileProtected=True, interruptionBudget={"count": 2})
    p = plan_gate(g, None, [fleet_node(n) for n in NODES], gates=[g], now=NOW, protected=protected)
    assert _starts(p) == [free]
    held = [n for n in _cordons(p) if n != free]
    assert held == [order[0]]  # one node of budget left: the first protected node in pick order
    up = p.updates[order[0]]
    assert up.state is not None and up.state.status == "waiting" and up.state.cordoned
    assert up.change.cordoned_by == "g" and up.change.status == "blocked"
    assert p.status.compartments[0].in_progress == 2  # the held node counts against the budget
    assert "cordoned by the gate" in p.rollout.waits[order[0]].message  # type: ignore[union-attr]


def test_a_held_node_is_not_cordoned_again_and_starts_without_more_budget_once_its_pods_end() -> None:
    order = _by_pick_order(NODES)
    g = _gate(cordonWhileProtected=True)
    held = NodeGateState(status="waiting", cordoned=True)
    fleet = [fleet_node(order[0], state=held, unschedulable=True, annotations={keys.CORDONED_BY: "g"}),
             *(fleet_node(n) for n in order[1:])]
    protected = {n: ("default/job",) for n in order}
    # Budget 1 is taken by the held node: nothing else is cordoned, nothing starts.
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected=protected)
    assert _starts(p) == [] and _cordons(p) == []
    assert p.status.compartments[0].in_progress == 1
    # Its job ended: it starts, and the budget still holds only it.
    rest = {n: ("default/job",) for n in order[1:]}
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected=rest)
    assert _starts(p) == [order[0]] and p.status.compartments[0].in_progress == 1


def test_holds_are_let_go_when_the_gate_no_longer_cordons_while_protected() -> None:
    g = _gate()  # cordonWhileProtected: false (turned off)
    held = NodeGateState(status="waiting", cordoned=True)
    fleet = [fleet_node("a", state=held, unschedulable=True, annotations={keys.CORDONED_BY: "g"}), fleet_node("b")]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected={"a": ("default/job",)})
    up = p.updates["a"]
    assert up.change.unschedulable is False and up.change.clear_cordoned_by
    assert up.state is not None and not up.state.cordoned
    # The budget it frees goes to the next plan, once the uncordon is written: never two at once.
    assert _starts(p) == [] and p.status.compartments[0].in_progress == 0
    released = [fleet_node("a", state=up.state), fleet_node("b")]
    assert _starts(plan_gate(g, None, released, gates=[g], now=NOW, protected={"a": ("default/job",)})) == ["b"]


def test_free_nodes_go_before_any_hold_while_a_batch_runs() -> None:
    order = _by_pick_order(NODES)
    g = _gate(cordonWhileProtected=True, interruptionBudget={"count": 2})
    running = started(g)
    fleet = [fleet_node(order[0], state=running), *(fleet_node(n) for n in order[1:])]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected={order[1]: ("default/job",)})
    # order[2] and order[3] are free and wait for the batch: no budget goes to holding order[1].
    assert _cordons(p) == [] and _starts(p) == []


def test_wait_timeout_fails_a_node_that_waited_longer_than_it() -> None:
    g = _gate(waitTimeout="1h")
    kind = keys.blocked_condition("g")
    old = {kind: NodeCondition(kind, "True", "ProtectedPods", "x", "2026-11-30T10:00:00Z")}
    young = {kind: NodeCondition(kind, "True", "ProtectedPods", "x", "2026-11-30T11:30:00Z")}
    fleet = [fleet_node("a", conditions=old), fleet_node("b", conditions=young)]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW, protected={"a": ("ns/p",), "b": ("ns/q",)})
    up = p.updates["a"]
    assert up.state is not None and up.state.status == "failed" and up.change.status == "failed"
    assert up.state.failure is not None and up.state.failure.reason == "WaitTimeout"
    assert "ns/p" in up.state.failure.message
    assert p.conditions["a"] is None  # the failure condition says it from now on
    assert "b" not in p.updates or p.updates["b"].state is None
    assert p.recheck_after == 1800  # b reaches the timeout in half an hour: the operator plans again then


def test_a_drain_held_by_a_pdb_sets_drain_blocked_on_the_gate_and_the_node() -> None:
    g = _gate()
    state = started(g).model_copy(update={"phase": "drain", "drain_blocked_by": "pod default/web-0: The "
                                          "disruption budget web needs 1 healthy pods and has 1 currently"})
    fleet = [fleet_node("a", state=state), fleet_node("b")]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW)
    [cond] = [c for c in p.status.conditions if c.type == "DrainBlocked"]
    assert cond.status == "True" and "node a" in cond.message and "default/web-0" in cond.message
    assert "budget web" in cond.message
    node_condition = p.conditions["a"]
    assert node_condition is not None and node_condition.reason == "DrainBlocked"
    assert "node a" in node_condition.message and "default/web-0" in node_condition.message
    # The drain went on: both go.
    kind = keys.blocked_condition("g")
    going = state.model_copy(update={"phase": "stages", "drain_blocked_by": None})
    fleet = [fleet_node("a", state=going, conditions={kind: node_condition}), fleet_node("b")]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW)
    assert not [c for c in p.status.conditions if c.type == "DrainBlocked"]
    assert "a" in p.conditions and p.conditions["a"] is None


# -- the safety rule over arbitrary states --------------------------------------------------------

progresses = st.builds(GateProgress, status=st.sampled_from(["waiting", "in-progress", "complete", "failed"]),
                       batch=st.integers(0, 3), disrupted=st.booleans())


@settings(max_examples=300, deadline=None)
@given(nodes=st.lists(st.tuples(progresses, st.booleans()), min_size=1, max_size=12),
       count=st.integers(0, 4), cordon=st.booleans())
def test_no_plan_cordons_more_nodes_than_the_budget_allows(nodes: list[tuple[GateProgress, bool]], count: int,
                                                           cordon: bool) -> None:
    g = _gate(cordonWhileProtected=cordon, interruptionBudget={"count": count})
    snaps = [NodeSnapshot(f"n{i}", {}, {"g": prog}) for i, (prog, _) in enumerate(nodes)]
    protected = {f"n{i}": ("ns/p",) for i, (_, runs) in enumerate(nodes) if runs}
    result = plan(g, None, snaps, now=NOW, protected=protected)
    [c] = result.compartments
    by_name = {s.name: s.progress("g") for s in snaps}
    before = sum(p.occupies_budget for p in by_name.values())
    after = before + sum(not by_name[n].held for n in c.start) + len(c.hold) - len(c.release)
    assert after <= max(c.status.ceiling, before)
    assert c.status.in_progress == after
    assert not set(c.start) & set(protected), "a node whose protected pods run was picked"
    assert not set(c.hold) & set(c.start)
    if not cordon:
        assert c.hold == ()


