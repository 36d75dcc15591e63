"""Properties of the planner over random fleets, policies, outcomes and clocks.

The walks drive the planner like the operator would (tests.unit.rollout.builders.Fleet) and compare
each plan with the rules restated independently in tests.unit.rollout.oracle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.api.keys import NODE_STATUSES, NodeStatus
from gate.api.nodegate import CompartmentStatus
from gate.api.policy import DEFAULT_COMPARTMENT, WEEKDAYS
from gate.rollout import GateProgress, NodeSnapshot, plan, resume, simulate
from tests.unit.rollout import oracle
from tests.unit.rollout.builders import NOW, Fleet, make_gate, make_policy

POOLS = ("a", "b", "c")
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

budgets = st.one_of(
    st.builds(lambda p: {"percent": p}, st.integers(0, 100)),
    st.builds(lambda c: {"count": c}, st.integers(0, 8)),
)
positive_budgets = st.one_of(
    st.builds(lambda p: {"percent": p}, st.integers(0, 100)),
    st.builds(lambda c: {"count": c}, st.integers(1, 8)),
)
common = st.fixed_dictionaries({
    "initialBatch": st.integers(1, 6),
    "batchThreshold": st.integers(1, 100),
    "failureThreshold": st.one_of(st.none(), st.integers(1, 4)),
    "safetyLimit": st.integers(1, 100),
})
strategies = st.one_of(
    st.builds(lambda c: {"fixed": c}, common),
    st.builds(lambda c, d: {"linear": {**c, "delta": d}}, common, st.integers(1, 3)),
    st.builds(lambda c, g: {"exponential": {**c, "growthFactor": g}}, common, st.integers(2, 3)),
)
hhmm = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.sampled_from([0, 30]))
windows = st.fixed_dictionaries({
    "days": st.lists(st.sampled_from(WEEKDAYS), min_size=1, max_size=7, unique=True),
    "start": hhmm,
    "end": hhmm,
    "timeZone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
})


@dataclass
class Rollout:
    """A random gate: nodes in pools, a policy whose compartments select pools (possibly overlapping)."""

    pools: dict[str, str]
    compartments: list[dict[str, Any]]
    default_budget: dict[str, int]
    default_strategy: dict[str, Any]
    windows: list[dict[str, Any]]

    def fleet(self) -> Fleet:
        policy = make_policy(
            compartments=self.compartments,
            default_budget=self.default_budget,
            default_strategy=self.default_strategy,
            windows=self.windows,
        )
        return Fleet.of(make_gate(policy="p"), policy, {n: {"pool": p} for n, p in self.pools.items()})

    def compartment_of(self, node: str) -> str:
        for c in self.compartments:
            if self.pools[node] in c["selector"]["matchExpressions"][0]["values"]:
                return str(c["name"])
        return DEFAULT_COMPARTMENT

    def budget(self, name: str) -> dict[str, int]:
        return next((c["budget"] for c in self.compartments if c["name"] == name), self.default_budget)

    def strategy(self, name: str) -> dict[str, Any]:
        return next((c["strategy"] for c in self.compartments if c["name"] == name), self.default_strategy)

    def names(self) -> list[str]:
        return [c["name"] for c in self.compartments] + [DEFAULT_COMPARTMENT]


@st.composite
def rollouts(draw: st.DrawFn, *, budget: st.SearchStrategy[dict[str, int]] = budgets,
             with_windows: bool = False, max_nodes: int = 30) -> Rollout:
    n = draw(st.integers(1, max_nodes))
    pools = {f"n{i:02d}": draw(st.sampled_from(POOLS)) for i in range(n)}
    compartments = [
        {
            "name": f"c{i}",
            "selector": {"matchExpressions": [{"key": "pool", "operator": "In", "values": draw(
                st.lists(st.sampled_from(POOLS), min_size=1, max_size=2, unique=True))}]},
            "budget": draw(budget),
            "strategy": draw(strategies),
        }
        for i in range(draw(st.integers(0, 3)))
    ]
    chosen = draw(st.lists(windows, max_size=2)) if with_windows else []
    return Rollout(pools, compartments, draw(budget), draw(strategies), chosen)


def _occupied(fleet: Fleet, rollout: Rollout) -> dict[str, int]:
    counts = dict.fromkeys(rollout.names(), 0)
    for node, progress in fleet.progress.items():
        if progress.occupies_budget:
            counts[rollout.compartment_of(node)] += 1
    return counts


def _matched(rollout: Rollout) -> dict[str, int]:
    counts = dict.fromkeys(rollout.names(), 0)
    for node in rollout.pools:
        counts[rollout.compartment_of(node)] += 1
    return counts


def _finish_some(fleet: Fleet, rng: random.Random) -> None:
    """Each running node completes, fails (maybe staying cordoned) or keeps running; cordoned failed
    nodes are sometimes released by a person."""
    for node, progress in list(fleet.progress.items()):
        if progress.in_flight:
            roll = rng.random()
            if roll < 0.45:
                fleet.finish(node, ok=True)
            elif roll < 0.65:
                fleet.finish(node, ok=False, keep_cordoned=rng.random() < 0.5)
        elif progress.status == "failed" and progress.disrupted and rng.random() < 0.2:
            fleet.progress[node] = GateProgress("failed", progress.batch)


@FAST
@given(rollout=rollouts(with_windows=True), rng=st.randoms(use_true_random=False))
def test_random_walk_never_exceeds_the_ceiling_and_batch_sizes_follow_the_strategy_exactly(
    rollout: Rollout, rng: random.Random
) -> None:
    fleet = rollout.fleet()
    matched = _matched(rollout)
    model = {name: oracle.Compartment(rollout.strategy(name)) for name in rollout.names()}
    for _ in range(40):
        now = NOW + timedelta(minutes=rng.randrange(0, 7 * 1440))
        if rng.random() < 0.1:  # a person runs `nodegate resume`
            fleet.persist(resume(list(fleet.statuses().values())))
            for m in model.values():
                m.resume()
        stopped_before = {n for n, s in fleet.statuses().items() if s.state == "stopped"}

        expected = {}
        for name, m in model.items():
            nodes = [n for n in rollout.pools if rollout.compartment_of(n) == name]
            progress = [fleet.progress.get(n, GateProgress()) for n in nodes]
            batch = [p for p in progress if p.batch == m.batch]
            if batch and all(p.finished for p in batch):
                complete = sum(p.status == "complete" for p in progress)
                m.close(len(batch), sum(p.status == "complete" for p in batch), complete, matched[name])
            in_flight = any(p.in_flight for p in progress)
            waiting = sum(not p.finished and not p.in_flight for p in progress)
            room = oracle.ceiling(rollout.budget(name), matched[name]) - _occupied(fleet, rollout)[name]
            can_start = not m.stopped and not in_flight and oracle.any_window_open(rollout.windows, now)
            expected[name] = max(0, min(m.planned, room, waiting)) if can_start else 0

        result = fleet.step(now)

        started = {name: [s for s in result.starts if s.compartment == name] for name in rollout.names()}
        assert {name: len(s) for name, s in started.items()} == expected
        for name, starts in started.items():
            assert all(s.batch == model[name].batch for s in starts)
            assert not (starts and name in stopped_before)
        occupied = _occupied(fleet, rollout)
        for name in rollout.names():
            assert occupied[name] <= oracle.ceiling(rollout.budget(name), matched[name])
        _finish_some(fleet, rng)


@FAST
@given(rollout=rollouts(budget=positive_budgets))
def test_every_node_is_picked_exactly_once_when_all_succeed(rollout: Rollout) -> None:
    fleet = rollout.fleet()
    picks: list[str] = []
    for _ in range(len(rollout.pools) + 1):
        picks += [s.node for s in fleet.step().starts]
        fleet.finish_all(ok=True)

    assert sorted(picks) == sorted(rollout.pools)
    assert {s.state for s in fleet.statuses().values()} == {"complete"}


@FAST
@given(rollout=rollouts(budget=positive_budgets), rng=st.randoms(use_true_random=False))
def test_simulation_lists_the_batches_the_planner_will_run_when_all_succeed(
    rollout: Rollout, rng: random.Random
) -> None:
    fleet = rollout.fleet()
    for _ in range(rng.randrange(0, 4)):  # part of the way in, with some failures
        fleet.step()
        _finish_some(fleet, rng)

    simulation = simulate(fleet.gate, fleet.policy, fleet.snapshot())
    stopped = {n for n, s in fleet.statuses().items() if s.state == "stopped"}
    # The simulation shows stopped compartments as they will run once resumed.
    fleet.persist(resume(list(fleet.statuses().values())))
    observed: dict[str, dict[int, list[str]]] = {name: {} for name in rollout.names()}
    for node, progress in fleet.progress.items():
        if progress.batch:
            observed[rollout.compartment_of(node)].setdefault(progress.batch, []).append(node)
    for _ in range(len(rollout.pools) + 2):
        fleet.finish_all(ok=True)
        for s in fleet.step().starts:
            observed[s.compartment].setdefault(s.batch, []).append(s.node)

    assert {c.name for c in simulation.compartments if c.stopped} == stopped
    for c in simulation.compartments:
        assert {b.number: sorted(b.nodes) for b in c.batches} == {k: sorted(v) for k, v in observed[c.name].items()}
        never = [n for n in rollout.pools if rollout.compartment_of(n) == c.name and n not in fleet.progress]
        assert sorted(c.unplanned) == sorted(never)


# Arbitrary snapshots, reachable or not: the safety rules must hold for any state the operator reads.
progresses = st.builds(
    GateProgress,
    status=st.sampled_from(NODE_STATUSES),
    batch=st.integers(0, 4),
    disrupted=st.booleans(),
)
compartment_states = st.builds(
    lambda batch, size, failures, state: {"batch": batch, "batchSize": size,
                                          "consecutiveFailures": failures, "state": state},
    st.integers(0, 5), st.integers(0, 6), st.integers(0, 4),
    st.sampled_from(["waiting", "rolling", "complete", "stopped", "outside-window"]),
)


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Rollout, list[NodeSnapshot], list[CompartmentStatus]]:
    rollout = draw(rollouts(with_windows=True, max_nodes=20))
    nodes = [NodeSnapshot(n, {"pool": p}, {"g": draw(progresses)}) for n, p in rollout.pools.items()]
    states = [
        CompartmentStatus.model_validate({"name": name, **draw(compartment_states)})
        for name in rollout.names()
        if draw(st.booleans())
    ]
    return rollout, nodes, states


@settings(max_examples=300, deadline=None)
@given(case=snapshots(), minutes=st.integers(0, 7 * 1440 - 1))
def test_from_any_state_the_planner_keeps_the_safety_rules(
    case: tuple[Rollout, list[NodeSnapshot], list[CompartmentStatus]], minutes: int
) -> None:
    rollout, nodes, states = case
    fleet = rollout.fleet()
    gate = make_gate(policy="p", compartments=states)
    now = NOW + timedelta(minutes=minutes)
    matched = _matched(rollout)
    before = {s.name: s.state for s in states}

    result = plan(gate, fleet.policy, nodes, now=now)

    by_name = {n.name: n.progress("g") for n in nodes}
    open_now = oracle.any_window_open(rollout.windows, now)
    for c in result.compartments:
        members = [n for n in rollout.pools if rollout.compartment_of(n) == c.name]
        occupied = sum(by_name[n].occupies_budget for n in members)
        ceiling = oracle.ceiling(rollout.budget(c.name), matched[c.name])
        if c.start:
            assert open_now, "a node started outside every window"
            assert before.get(c.name) != "stopped", "a stopped compartment started a node"
            assert not any(by_name[n].in_flight for n in members), "a batch started while one runs"
            # A node the gate holds cordoned (while protected pods finished) is counted in `occupied`.
            assert occupied + sum(not by_name[n].held for n in c.start) <= ceiling
            assert all(not by_name[n].finished and not by_name[n].in_flight for n in c.start)
        assert occupied + sum(not by_name[n].held for n in c.start) + len(c.hold) - len(c.release) <= max(
            ceiling, occupied), "the plan cordons more nodes than the budget allows"
        assert c.status.ceiling == ceiling


@settings(max_examples=100, deadline=None)
@given(case=snapshots(), minutes=st.integers(0, 7 * 1440 - 1), rng=st.randoms(use_true_random=False))
def test_plan_is_deterministic_and_ignores_the_order_nodes_are_listed_in(
    case: tuple[Rollout, list[NodeSnapshot], list[CompartmentStatus]], minutes: int, rng: random.Random
) -> None:
    rollout, nodes, states = case
    gate = make_gate(policy="p", compartments=states)
    policy = rollout.fleet().policy
    now = datetime(2025, 1, 6, tzinfo=UTC) + timedelta(minutes=minutes)
    shuffled = nodes[:]
    rng.shuffle(shuffled)

    assert plan(gate, policy, nodes, now=now) == plan(gate, policy, shuffled, now=now)


@settings(max_examples=150, deadline=None)
@given(
    labels=st.lists(st.sampled_from(POOLS), min_size=1, max_size=15),
    statuses=st.lists(st.sampled_from(NODE_STATUSES), min_size=15, max_size=15),
    priorities=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    sequencing=st.sampled_from(["node", "all"]),
)
def test_no_node_starts_before_higher_priority_gates_are_complete_as_sequencing_requires(
    labels: list[str], statuses: list[NodeStatus], priorities: tuple[int, int], sequencing: str
) -> None:
    other = make_gate("other", selector={"pool": "a"}, priority=priorities[0])
    gate = make_gate("g", priority=priorities[1], sequencing=sequencing)
    nodes = [
        NodeSnapshot(f"n{i}", {"pool": pool}, {"other": GateProgress(statuses[i])})
        for i, pool in enumerate(labels)
    ]
    unfinished = {n.name for n in nodes if n.labels["pool"] == "a" and n.progress("other").status != "complete"}

    result = plan(gate, None, nodes, now=NOW, gates=[other, gate])

    started = {s.node for s in result.starts}
    if priorities[0] >= priorities[1]:
        assert started == {n.name for n in nodes}
    elif sequencing == "node":
        assert started == {n.name for n in nodes} - unfinished
    else:
        assert started == (set() if unfinished else {n.name for n in nodes})
