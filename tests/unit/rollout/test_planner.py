"""One reconcile at a time: sticky batches, restarts, failures, stops, windows, pauses, the budget."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from gate.api.nodegate import CompartmentStatus
from gate.api.policy import DEFAULT_COMPARTMENT, DeploymentPolicy
from gate.rollout import GateProgress, resume
from tests.unit.rollout.builders import (
    NOW,
    Fleet,
    done,
    exponential,
    failed,
    fixed,
    linear,
    make_gate,
    make_policy,
)

D = DEFAULT_COMPARTMENT


def _fleet(n: int, strategy: dict[str, Any], budget: dict[str, int] | None = None, **policy: Any) -> Fleet:
    gate = make_gate(policy="p")
    pol = make_policy(default_budget=budget or {"percent": 100}, default_strategy=strategy, **policy)
    return Fleet.of(gate, pol, {f"n{i:02d}": {} for i in range(n)})


def _sizes(fleet: Fleet, outcomes: list[bool]) -> list[int]:
    """Batch sizes picked while each batch in turn succeeds or fails as `outcomes` says."""
    sizes = []
    for ok in outcomes:
        started = fleet.step().starts
        sizes.append(len(started))
        fleet.finish_all(ok=ok)
    return sizes


def test_nodes_are_picked_in_order_of_the_sha256_of_their_name() -> None:
    fleet = _fleet(12, fixed(12))

    picked = [s.node for s in fleet.plan().starts]

    assert picked == sorted(fleet.labels, key=lambda n: hashlib.sha256(n.encode()).hexdigest())


def test_plan_is_the_same_for_the_same_snapshot_in_any_node_order() -> None:
    fleet = _fleet(20, exponential(3, 2), {"percent": 30})
    fleet.progress.update({"n03": done(1), "n07": failed(1, cordoned=True)})
    fleet.persist([CompartmentStatus(name=D, batch=1, batch_size=3)])
    forward = fleet.plan()
    fleet.labels = dict(reversed(list(fleet.labels.items())))

    assert fleet.plan() == forward


def test_batch_sizes_per_strategy_when_every_batch_succeeds() -> None:
    assert _sizes(_fleet(30, fixed(3)), [True] * 5) == [3, 3, 3, 3, 3]
    assert _sizes(_fleet(30, linear(1, 2)), [True] * 5) == [1, 3, 5, 7, 9]
    assert _sizes(_fleet(40, exponential(1, 3)), [True] * 4) == [1, 3, 9, 27]


def test_budget_caps_growth_and_growth_continues_from_the_capped_size() -> None:
    # ceiling 5 of 40: exponential 1, 2, 4, then 8 is capped at 5, and 5*2 again at 5
    assert _sizes(_fleet(40, exponential(1, 2), {"count": 5}), [True] * 6) == [1, 2, 4, 5, 5, 5]


def test_last_batch_takes_only_the_nodes_left() -> None:
    assert _sizes(_fleet(10, linear(2, 2)), [True] * 4) == [2, 4, 4, 0]


def test_failed_batch_below_safety_limit_shrinks_the_next_per_strategy() -> None:
    never_stop = {"failureThreshold": None, "safetyLimit": 100}
    assert _sizes(_fleet(40, fixed(4, **never_stop)), [False, False, False, True, True]) == [4, 2, 1, 1, 4]
    assert _sizes(_fleet(40, linear(5, 2, **never_stop)), [False, False, False, True]) == [5, 3, 1, 1]
    assert _sizes(_fleet(80, exponential(8, 2, **never_stop)), [True, False, False, True]) == [8, 16, 8, 4]


def test_failed_batch_at_or_above_safety_limit_keeps_its_size() -> None:
    fleet = _fleet(10, linear(1, 2, safetyLimit=40, failureThreshold=None))

    sizes = _sizes(fleet, [True, True, False])  # 1 + 3 = 4 of 10 complete = 40% when batch 3 fails
    fleet.step()

    assert sizes == [1, 3, 5]
    assert fleet.statuses()[D].batch_size == 1  # 1 node left, though the planned size stayed 5


def test_batch_threshold_judges_a_partly_failed_batch() -> None:
    fleet = _fleet(20, linear(4, 4, batchThreshold=75, failureThreshold=None))
    first = fleet.step()
    for node in [s.node for s in first.starts][:3]:
        fleet.finish(node, ok=True)
    fleet.finish(first.starts[3].node, ok=False)  # 3 of 4 = 75%: good

    second = fleet.step()

    assert len(second.starts) == 8
    assert second.compartment(D).closed[0].good


def test_a_new_batch_starts_only_after_every_node_of_the_previous_one_finished() -> None:
    fleet = _fleet(10, fixed(3))
    first = fleet.step()
    fleet.finish(first.starts[0].node, ok=True)
    fleet.finish(first.starts[1].node, ok=False)

    while_running = fleet.step()
    fleet.finish(first.starts[2].node, ok=True)
    after = fleet.step()

    assert while_running.starts == ()
    assert while_running.compartment(D).running == (first.starts[2].node,)
    assert {w.reason for w in while_running.waits.values()} == {"batch-running"}
    assert {w.status for w in while_running.waits.values()} == {"waiting"}
    # 1 of 3 failed below the safety limit: fixed halves 3 to 1
    assert len(after.starts) == 1 and {s.batch for s in after.starts} == {2}


def test_a_batch_is_not_topped_up_when_budget_frees_while_it_runs() -> None:
    fleet = _fleet(10, fixed(3), {"count": 3})
    fleet.progress["n00"] = failed(0, cordoned=True)  # holds one unit of budget
    first = fleet.step()
    fleet.progress["n00"] = failed(0)  # someone uncordons it

    assert len(first.starts) == 2
    assert fleet.step().starts == ()


def test_replanning_from_persisted_state_alone_keeps_batches_sticky() -> None:
    fleet = _fleet(12, exponential(2, 2))
    first = fleet.step()
    batch_one = sorted(s.node for s in first.starts)
    fleet.finish(batch_one[0], ok=True)

    # A "restart": a fresh gate object from the stored wire form, fresh node snapshots.
    fleet.persist(fleet.statuses().values())
    again = fleet.step()
    fleet.finish(batch_one[1], ok=True)
    then = fleet.step()

    assert again.starts == ()
    assert fleet.progress[batch_one[1]].batch == 1
    assert [len(then.starts), then.starts[0].batch] == [4, 2]
    assert not set(batch_one) & {s.node for s in then.starts}


def test_crash_after_writing_status_but_before_the_nodes_picks_the_same_batch_again() -> None:
    fleet = _fleet(12, exponential(2, 2))
    fleet.step()
    fleet.finish_all()
    result = fleet.plan()
    fleet.persist(result.statuses())  # the status write succeeded; the node writes were lost

    retried = fleet.plan()

    assert retried.starts == result.starts
    assert {s.batch for s in retried.starts} == {2}


def test_crash_after_writing_the_nodes_but_before_the_status_starts_no_extra_batch() -> None:
    fleet = _fleet(12, exponential(2, 2))
    fleet.step()
    fleet.finish_all()
    stale = list(fleet.statuses().values())
    second = fleet.step()
    fleet.persist(stale)  # the status write was lost; the nodes carry batch 2

    result = fleet.plan()

    assert result.starts == ()
    assert sorted(result.compartment(D).running) == sorted(s.node for s in second.starts)
    assert result.compartment(D).status.batch == 2


def test_lost_status_is_rebuilt_from_the_batch_numbers_on_the_nodes() -> None:
    fleet = _fleet(20, exponential(1, 2, failureThreshold=None, safetyLimit=100))
    fleet.progress.update({"n00": done(1), "n01": done(2), "n02": done(2), "n03": done(3), "n04": failed(3)})

    result = fleet.plan()  # no status at all: replay batches 1 (good), 2 (good), 3 (failed)

    assert [c.number for c in result.compartment(D).closed] == [1, 2, 3]
    assert [len(result.starts), result.starts[0].batch] == [1, 4]  # 2 nodes failed below safety: 2 // 2
    assert result.compartment(D).status.consecutive_failures == 1


def test_failure_threshold_stops_the_compartment_until_resumed() -> None:
    fleet = _fleet(10, fixed(1, failureThreshold=2))
    fleet.step()
    fleet.finish_all(ok=False)
    fleet.step()
    fleet.finish_all(ok=False)

    stopping = fleet.step()
    still = fleet.step()
    fleet.persist(resume(list(fleet.statuses().values())))
    resumed = fleet.step()

    assert stopping.starts == () and stopping.compartment(D).stopped_now
    assert stopping.compartment(D).status.state == "stopped"
    assert still.starts == () and not still.compartment(D).stopped_now
    assert {w.reason for w in still.waits.values()} == {"stopped"}
    assert {w.status for w in still.waits.values()} == {"blocked"}
    assert "nodegate resume g" in next(iter(still.waits.values())).message
    assert len(resumed.starts) == 1 and resumed.compartment(D).status.consecutive_failures == 0


def test_resume_touches_only_the_named_stopped_compartments() -> None:
    statuses = [
        CompartmentStatus(name="a", state="stopped", consecutive_failures=3),
        CompartmentStatus(name="b", state="stopped", consecutive_failures=2),
        CompartmentStatus(name="c", state="rolling", consecutive_failures=1),
    ]

    resumed = resume(statuses, {"a", "c"})

    assert [(s.state, s.consecutive_failures) for s in resumed] == [("waiting", 0), ("stopped", 2), ("rolling", 1)]


def test_one_stopped_compartment_does_not_hold_back_the_others() -> None:
    gate = make_gate(policy="p")
    policy = make_policy(
        compartments=[{"name": "canary", "selector": {"matchLabels": {"pool": "canary"}},
                       "budget": {"count": 1}, "strategy": fixed(1, failureThreshold=1)}],
        default_strategy=fixed(1),
    )
    fleet = Fleet.of(gate, policy, {"c1": {"pool": "canary"}, "c2": {"pool": "canary"}, "m1": {}, "m2": {}})
    first = fleet.step()
    canary_node = next(s.node for s in first.starts if s.compartment == "canary")
    fleet.finish(canary_node, ok=False)
    fleet.finish_all()

    second = fleet.step()

    assert second.compartment("canary").status.state == "stopped"
    assert [s.compartment for s in second.starts] == [D]


def test_outside_every_window_nothing_new_starts_but_running_nodes_continue() -> None:
    weekend = [{"days": ["Sat", "Sun"], "start": "01:00", "end": "05:00", "timeZone": "UTC"}]
    fleet = _fleet(6, fixed(2), windows=weekend)
    saturday = datetime(2025, 1, 11, 2, 0, tzinfo=UTC)
    first = fleet.step(saturday)
    fleet.finish(first.starts[0].node, ok=True)

    monday = fleet.step(NOW)
    fleet.finish_all()
    monday_later = fleet.step(NOW)

    assert len(first.starts) == 2
    assert monday.starts == () and monday.compartment(D).running == (first.starts[1].node,)
    assert monday.compartment(D).status.state == "rolling"
    assert monday_later.starts == () and monday_later.compartment(D).status.state == "outside-window"
    assert {w.reason for w in monday_later.waits.values()} == {"outside-window"}
    assert len(fleet.step(saturday).starts) == 2


def test_paused_gate_starts_nothing() -> None:
    fleet = _fleet(4, fixed(2))
    fleet.gate = make_gate(policy="p", paused=True)

    result = fleet.step()

    assert result.starts == ()
    assert {(w.reason, w.status) for w in result.waits.values()} == {("paused", "waiting")}


def test_failed_nodes_still_cordoned_fill_the_budget() -> None:
    fleet = _fleet(6, fixed(3), {"count": 2})
    fleet.progress.update({"n00": failed(1, cordoned=True), "n01": failed(1, cordoned=True)})
    fleet.persist([CompartmentStatus(name=D, batch=1, batch_size=2)])

    full = fleet.plan()
    fleet.progress["n01"] = failed(1)
    freed = fleet.plan()

    assert full.starts == ()
    assert {w.reason for w in full.waits.values()} == {"budget-full"}
    assert full.compartment(D).status.in_progress == 2
    assert len(freed.starts) == 1


def test_node_relabelled_out_of_the_gate_while_running_still_counts_against_the_ceiling() -> None:
    fleet = Fleet.of(make_gate(selector={"gpu": "true"}, budget={"count": 1}), None,
                     {"a": {"gpu": "true"}, "b": {"gpu": "true"}, "c": {"gpu": "true"}})
    first = fleet.step()
    fleet.labels[first.starts[0].node] = {}

    result = fleet.step()

    assert result.starts == ()
    assert result.compartment(D).status.in_progress == 1


def test_in_progress_without_a_batch_number_counts_as_running() -> None:
    fleet = _fleet(4, fixed(2), {"count": 2})
    fleet.progress["n00"] = GateProgress("in-progress", 0, disrupted=False)

    result = fleet.plan()

    assert result.starts == ()
    assert result.compartment(D).running == ("n00",)


def test_waiting_nodes_not_in_the_new_batch_are_queued() -> None:
    result = _fleet(5, fixed(2)).plan()

    assert len(result.starts) == 2
    assert len(result.waits) == 3 and {w.reason for w in result.waits.values()} == {"queued"}


def test_compartment_status_counts_after_the_plan() -> None:
    fleet = _fleet(10, fixed(3), {"percent": 50})
    fleet.progress.update({"n00": done(1), "n01": failed(1, cordoned=True), "n02": done(1)})
    fleet.persist([CompartmentStatus(name=D, batch=1, batch_size=3)])

    status = fleet.plan().compartment(D).status

    # batch 1 failed (2 of 3) at 20% progress: the next is 3 // 2 = 1; in progress = 1 cordoned + 1 started
    expected = dict(matched=10, ceiling=5, in_progress=2, complete=2, failed=1, soaking=0, batch=2, batch_size=1,
                    consecutive_failures=1, state="rolling", rollback=None)
    assert status.model_dump(exclude={"name"}) == expected


def test_compartment_where_every_node_finished_is_complete_with_failures_counted() -> None:
    fleet = _fleet(3, fixed(3, failureThreshold=None))
    first = fleet.step()
    fleet.finish(first.starts[0].node, ok=False)
    fleet.finish_all()

    status = fleet.step().compartment(D).status

    assert (status.state, status.complete, status.failed) == ("complete", 2, 1)


def test_rollback_stops_the_compartment_at_the_first_failed_batch_and_records_it() -> None:
    gate = make_gate(policy="p")
    pol = DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"default": {
        "budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2, "failureThreshold": 3}},
        "rollback": True}}})
    fleet = Fleet.of(gate, pol, {f"n{i:02d}": {} for i in range(6)})
    fleet.step()
    fleet.finish_all(ok=True)  # a good batch: no roll-back, the rollout goes on
    second = fleet.step()
    assert len(second.starts) == 2 and second.compartment(D).status.rollback is None
    fleet.finish_all(ok=False)
    stopped = fleet.step()
    comp = stopped.compartment(D)
    assert comp.status.state == "stopped" and comp.stopped_now and not stopped.starts
    assert comp.status.consecutive_failures == 1  # below failureThreshold: the roll-back stopped it
    assert comp.status.rollback is not None and comp.status.rollback.batch == 2
    assert fleet.step().compartment(D).status.rollback == comp.status.rollback  # kept while stopped
    resumed = resume(list(fleet.statuses().values()))
    assert resumed[0].state == "waiting" and resumed[0].rollback is None
