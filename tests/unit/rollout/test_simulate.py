"""`simulate`: the whole rollout from a snapshot, as `nodegate plan` prints it."""

from __future__ import annotations

from gate.api.nodegate import CompartmentStatus
from gate.api.policy import DEFAULT_COMPARTMENT
from gate.rollout import simulate
from tests.unit.rollout.builders import Fleet, done, exponential, failed, fixed, make_gate, make_policy, running

D = DEFAULT_COMPARTMENT


def _fleet(n: int, strategy: dict[str, object], budget: dict[str, int]) -> Fleet:
    policy = make_policy(default_budget=budget, default_strategy=strategy)
    return Fleet.of(make_gate(policy="p"), policy, {f"n{i:02d}": {} for i in range(n)})


def test_simulation_from_scratch_lists_every_batch_in_pick_order() -> None:
    fleet = _fleet(20, exponential(1, 2), {"count": 6})

    (only,) = simulate(fleet.gate, fleet.policy, fleet.snapshot()).compartments

    assert [len(b.nodes) for b in only.batches] == [1, 2, 4, 6, 6, 1]
    assert [b.number for b in only.batches] == [1, 2, 3, 4, 5, 6]
    assert {b.phase for b in only.batches} == {"planned"}
    assert only.batches[0].nodes == tuple(s.node for s in fleet.plan().starts)
    assert sorted(n for b in only.batches for n in b.nodes) == sorted(fleet.labels)
    assert (only.matched, only.ceiling, only.unplanned) == (20, 6, ())


def test_simulation_shows_done_and_running_batches_before_the_planned_ones() -> None:
    fleet = _fleet(8, fixed(2), {"percent": 100})
    fleet.progress.update({"n00": done(1), "n01": done(1), "n02": done(2), "n03": running(2)})
    fleet.persist([CompartmentStatus(name=D, batch=2, batch_size=2)])

    (only,) = simulate(fleet.gate, fleet.policy, fleet.snapshot()).compartments

    assert [(b.number, b.phase, len(b.nodes)) for b in only.batches] == [
        (1, "done", 2), (2, "running", 2), (3, "planned", 2), (4, "planned", 2)
    ]


def test_simulation_of_a_stopped_compartment_shows_what_runs_after_resume() -> None:
    fleet = _fleet(4, fixed(1, failureThreshold=1), {"count": 1})
    fleet.progress["n00"] = failed(1)
    fleet.persist([CompartmentStatus(name=D, batch=2, batch_size=1, consecutive_failures=1, state="stopped")])

    (only,) = simulate(fleet.gate, fleet.policy, fleet.snapshot()).compartments

    assert only.stopped
    assert [len(b.nodes) for b in only.batches if b.phase == "planned"] == [1, 1, 1]


def test_nodes_the_budget_never_reaches_are_listed_as_unplanned() -> None:
    fleet = _fleet(3, fixed(1), {"count": 1})
    fleet.progress["n00"] = failed(1, cordoned=True)  # holds the only unit of budget for good
    fleet.persist([CompartmentStatus(name=D, batch=2, batch_size=1)])

    (only,) = simulate(fleet.gate, fleet.policy, fleet.snapshot()).compartments

    assert [b.phase for b in only.batches] == ["done"]
    assert sorted(only.unplanned) == ["n01", "n02"]


def test_simulation_ignores_windows_pauses_and_higher_priority_gates() -> None:
    weekend = [{"days": ["Sat"], "start": "01:00", "end": "02:00", "timeZone": "UTC"}]
    policy = make_policy(default_budget={"count": 2}, default_strategy=fixed(2), windows=weekend)
    gate = make_gate(policy="p", paused=True)
    fleet = Fleet.of(gate, policy, {f"n{i}": {} for i in range(4)})

    (only,) = simulate(fleet.gate, fleet.policy, fleet.snapshot()).compartments

    assert fleet.plan().starts == ()
    assert [len(b.nodes) for b in only.batches] == [2, 2]
