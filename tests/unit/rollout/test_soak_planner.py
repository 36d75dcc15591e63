"""Batches under a policy with `health`: soaking nodes hold no slot, yet their batch waits for them."""

from __future__ import annotations

from gate.api.policy import DEFAULT_COMPARTMENT as D
from gate.rollout import GateProgress, simulate
from tests.unit.rollout.builders import Fleet, fixed, make_gate, make_policy

NODES = {f"n{i:02d}": {} for i in range(6)}


def soaking(batch: int) -> GateProgress:
    return GateProgress("in-progress", batch, disrupted=False, soaking=True)


def fleet(initial: int = 3, budget: int = 1, *, health: bool = True, **strategy: int) -> Fleet:
    policy = make_policy(default_budget={"count": budget}, default_strategy=fixed(initial, **strategy))
    if health:
        wire = policy.to_wire()
        wire["spec"]["default"]["health"] = {"soak": "10m", "nodeConditions": [{"type": "GpuUnhealthy"}]}
        policy = type(policy).model_validate(wire)
    return Fleet.of(make_gate(policy=policy.name), policy, NODES)


def test_a_soaking_node_frees_its_slot_and_the_batch_fills_in_pick_order() -> None:
    f = fleet(initial=3, budget=1)
    first = f.step()
    assert len(first.starts) == 1 and first.compartment(D).status.batch_size == 3
    a = first.starts[0].node
    assert f.step().starts == ()  # a runs: the budget of 1 is full
    f.progress[a] = soaking(1)
    second = f.step()
    assert [s.batch for s in second.starts] == [1]  # the next node goes, into the same batch
    status = second.compartment(D).status
    assert (status.soaking, status.in_progress, status.batch) == (1, 1, 1)


def test_the_next_batch_waits_until_every_node_passed_its_soak() -> None:
    f = fleet(initial=2, budget=2)
    first = f.step()
    names = [s.node for s in first.starts]
    assert len(names) == 2
    for n in names:
        f.progress[n] = soaking(1)
    held = f.step()
    assert held.starts == () and held.compartment(D).status.batch == 1
    waits = {w.reason for w in held.waits.values()}
    assert waits == {"batch-soaking"}
    f.finish(names[0], ok=True)
    assert f.step().starts == ()  # one still soaks
    f.finish(names[1], ok=True)
    after = f.step()
    assert after.compartment(D).closed[0].good and {s.batch for s in after.starts} == {2}


def test_a_node_failing_its_soak_fails_the_batch_and_thresholds_stop_the_compartment() -> None:
    f = fleet(initial=1, budget=1, failureThreshold=1)
    a = f.step().starts[0].node
    f.progress[a] = soaking(1)
    f.finish(a, ok=False)
    result = f.step()
    comp = result.compartment(D)
    assert comp.closed[0].good is False and comp.stopped_now and result.starts == ()


def test_without_health_a_batch_is_picked_whole_within_the_room() -> None:
    f = fleet(initial=3, budget=1, health=False)
    a = f.step().starts[0].node
    assert f.plan().compartment(D).status.batch_size == 1
    f.finish(a, ok=True)
    assert [s.batch for s in f.step().starts] == [2]


def test_the_simulation_fills_soak_batches_and_covers_every_node() -> None:
    f = fleet(initial=3, budget=1)
    sim = simulate(f.gate, f.policy, f.snapshot())
    (comp,) = sim.compartments
    assert [len(b.nodes) for b in comp.batches] == [3, 3] and not comp.unplanned
    a = f.step().starts[0].node
    f.progress[a] = soaking(1)
    sim = simulate(f.gate, f.policy, f.snapshot())
    assert sorted(n for b in sim.compartments[0].batches for n in b.nodes) == sorted(NODES)
