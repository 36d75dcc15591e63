"""A restart at any line is harmless: the machine, driven by an executor that dies mid-decision.

The simulated executor performs a decision's effects in the operator's order (the node write, then
pod deletions, then creations) but may stop after any of them, as a SIGKILL would. Whatever it lost,
deciding again from what was persisted must finish the round without running a stage twice and
without leaving the node cordoned.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.lifecycle.machine import decide
from gate.lifecycle.node import NodeView, StagePod
from tests.unit.lifecycle.test_machine import PKG, ctx, gate, node, started

GATES = [
    gate({"base": PKG, "app": {**PKG, "dependsOn": {"base": "*"}}}),
    gate({"k": {**PKG, "interrupt": {"type": "reboot"}}, "cfg": {**PKG, "config": {"a.conf": "x"},
                                                               "configInterrupts": {"*.conf": {"type": "service",
                                                                                               "services": ["s"]}}}}),
    gate({"a1": {**PKG, "interrupt": {"type": "service", "services": ["x"]}}, "b1": PKG, "c1": PKG}, serial=True),
    gate({"d": {**PKG, "interrupt": {"type": "drain"}}, "e": PKG}),
]


def _drive(g: NodeGate, crashes: list[int]) -> tuple[NodeGateState, dict[tuple[str | None, str], int], NodeView]:
    """Decide and perform until the round completes, killing the executor as `crashes` says (how many
    effects of each decision survive); the persisted state, how often each stage ran, the node."""
    persisted = started(g)
    view: NodeView = node()
    pods: dict[str, StagePod] = {}
    runs: dict[tuple[str | None, str], int] = {}
    crash_plan = iter(crashes)
    for _ in range(200):
        d = decide(ctx(g, persisted, stage_pods=pods, pods=[], n=view))
        effects: list[Any] = []
        if d.state is not None or not d.node.empty():
            effects.append(("node", d))
        effects += [("delete", name) for name in d.delete_pods]
        effects += [("create", r) for r in d.create_pods]
        cut = next(crash_plan, 99)  # how many effects survive before the "kill"
        for kind, item in effects[:cut]:
            if kind == "node":
                if item.state is not None:
                    persisted = item.state
                fields = dict(view.__dict__)
                annotations = dict(view.annotations)
                if item.node.unschedulable is not None:
                    fields["unschedulable"] = item.node.unschedulable
                if item.node.cordoned_by:
                    annotations[keys.CORDONED_BY] = item.node.cordoned_by
                if item.node.clear_cordoned_by:
                    annotations.pop(keys.CORDONED_BY, None)
                fields["annotations"] = annotations
                view = NodeView(**fields)
            elif kind == "create":
                if item.name not in pods:  # creating an existing pod is a no-op (409 AlreadyExists)
                    for step in item.steps:
                        runs[(step.package, step.stage)] = runs.get((step.package, step.stage), 0) + 1
                    pods[item.name] = StagePod(item.name, item.kind, "succeeded", item.steps, done=len(item.steps),
                                               round=item.round, attempt=item.attempt)
                    if item.interrupt is not None and item.interrupt.type == "reboot":
                        view = NodeView(**{**view.__dict__, "boot_id": view.boot_id + "+"})
            else:
                pods.pop(item, None)
        if persisted.status == "complete":
            break
    return persisted, runs, view


UNINTERRUPTED = [_drive(g, []) for g in GATES]


@settings(max_examples=300, deadline=None)
@given(which=st.sampled_from(range(len(GATES))), crashes=st.lists(st.integers(0, 6), min_size=0, max_size=40))
def test_killed_at_any_point_the_round_completes_once(which: int, crashes: list[int]) -> None:
    g = GATES[which]
    persisted, runs, view = _drive(g, crashes)
    assert persisted.status == "complete", persisted
    assert all(count == 1 for count in runs.values()), runs
    assert not view.unschedulable and keys.CORDONED_BY not in view.annotations
    assert set(persisted.installed) == set(g.spec.packages)
    # no stage was skipped either: the same stages ran as in a round no one killed
    expected_state, expected_runs, _ = UNINTERRUPTED[which]
    assert set(runs) == set(expected_runs), (runs, expected_runs)
    assert persisted.installed == expected_state.installed
