"""A write the API server refuses for good during a node's round fails the node with the server's
message (`gate.lifecycle.round.write_refused`); the round's cordon is undone while the host is as
the round found it, so the node leaves the budget instead of waiting cordoned for ever."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gate.api import keys
from gate.api.nodegate import Interrupt
from gate.api.state import NodeGateState
from gate.lifecycle.fleet import NodeUpdate, progress_of
from gate.lifecycle.machine import decide
from gate.lifecycle.node import Decision, EventRequest, NodeView, Step
from gate.lifecycle.outcomes import (
    Refusal,
    after_refusal,
    drain_blocked,
    node_write_refusal,
    refused_update,
    unrecordable,
)
from gate.lifecycle.round import write_refused
from tests.unit.lifecycle.test_machine import PKG, ctx, gate, node, one, started

REFUSAL = 'admission webhook "deny.example.com" denied the request: no ConfigMaps today'
REBOOTING = {"k": {**PKG, "interrupt": {"type": "reboot"}, "config": {"a.conf": "x"}}}


def drained_at_stages() -> tuple[Decision, NodeGateState]:
    """Drive a reboot round through cordon and drain to the decision that asks for the first stage pod."""
    g = gate(REBOOTING)
    state = started(g)
    view = node()
    for _ in range(10):
        d = decide(ctx(g, state, n=view, pods=[]))
        state = d.state or state
        if d.node.unschedulable:
            view = replace(view, unschedulable=True, annotations={keys.CORDONED_BY: "g"})
        if d.create_pods:
            return d, state
    raise AssertionError("the round never asked for a stage pod")


def cordoned_by_gate() -> NodeView:
    return replace(node(), unschedulable=True, annotations={keys.CORDONED_BY: "g"})


def test_a_refused_config_map_fails_the_drained_node_and_uncordons_it() -> None:
    d, state = drained_at_stages()
    assert state.phase == "stages" and state.cordoned
    step = d.create_pods[0].steps[0]
    failed = write_refused(ctx(gate(REBOOTING), state, n=cordoned_by_gate()), "ConfigMapRefused",
                           "the ConfigMap of package k", REFUSAL, step)
    assert failed.state is not None and failed.state.status == "failed"
    assert failed.state.failure is not None
    assert failed.state.failure.reason == "ConfigMapRefused"
    assert (failed.state.failure.package, failed.state.failure.stage) == ("k", step.stage)
    assert REFUSAL in failed.state.failure.message and "the ConfigMap of package k" in failed.state.failure.message
    assert failed.node.unschedulable is False and failed.node.clear_cordoned_by
    assert failed.node.status == "failed"
    assert not failed.state.cordoned
    assert not progress_of(failed.state).disrupted, "a failed node not cordoned leaves the budget"
    reasons = {(e.target, e.reason) for e in failed.events}
    assert {("node", "ConfigMapRefused"), ("gate", "ConfigMapRefused"), ("node", "Uncordoned")} <= reasons


def test_a_refused_cordon_write_fails_a_node_that_was_never_cordoned() -> None:
    g = gate(REBOOTING)
    state = started(g)
    first = decide(ctx(g, state, pods=[]))
    assert first.node.unschedulable, "the first step of a reboot round cordons"
    failed = write_refused(ctx(g, state), "NodeWriteRefused", "the write of node n1", "denied")
    assert failed.state is not None and failed.state.status == "failed" and not failed.state.cordoned
    assert failed.node.unschedulable is None, "nothing to undo: the cordon was never written"
    assert failed.state.failure is not None and failed.state.failure.stage == state.phase


def test_a_node_a_person_cordoned_stays_cordoned() -> None:
    d, state = drained_at_stages()
    theirs = replace(node(), unschedulable=True, annotations={})
    failed = write_refused(ctx(gate(REBOOTING), state.model_copy(update={"cordoned": False}), n=theirs),
                           "PodRefused", "the stage pod x", "denied", d.create_pods[0].steps[0])
    assert failed.node.unschedulable is None


@pytest.mark.parametrize("phase", ["interrupt", "post-interrupt"])
def test_a_host_past_its_stages_stays_cordoned(phase: str) -> None:
    g = gate(REBOOTING)
    state = started(g).model_copy(update={"phase": phase, "cordoned": True, "interrupt": Interrupt(type="reboot")})
    failed = write_refused(ctx(g, state, n=cordoned_by_gate()), "PodRefused", "the stage pod x", "denied",
                           Step(None, "interrupt"))
    assert failed.state is not None and failed.state.status == "failed" and failed.state.cordoned
    assert failed.node.unschedulable is None
    assert progress_of(failed.state).disrupted, "it keeps its place in the budget until a person looks"


def test_a_host_that_ran_a_step_of_the_round_stays_cordoned() -> None:
    d, state = drained_at_stages()
    request = d.create_pods[0]
    # the first pod failed a step (an attempt is counted), the retry's pod is refused
    retried = state.model_copy(update={"attempts": {request.steps[0].key: 1}})
    failed = write_refused(ctx(gate(REBOOTING), retried, n=cordoned_by_gate()), "PodRefused",
                           "the stage pod y", "denied", request.steps[0])
    assert failed.node.unschedulable is None and failed.state is not None and failed.state.cordoned
    # a pod of the round still in sight (its steps recorded in this very decision) counts too
    seen = ctx(gate(REBOOTING), state, n=cordoned_by_gate(), stage_pods=one(request))
    assert write_refused(seen, "PodRefused", "the stage pod z", "denied").node.unschedulable is None


def test_what_an_applier_met_becomes_the_next_plan() -> None:
    """`gate.lifecycle.outcomes`: a refused cordon fails the node in the cordon stage; a gate plan's refused
    start of a round fails it in `start`, and a refused label write is only said in an Event; a failure whose
    own write is refused is said in its Events and its condition; a blocking budget is recorded once."""
    g = gate(REBOOTING)
    state = started(g)
    cordon = Decision(state=state)
    cordon.node.unschedulable = True
    refusal = node_write_refusal(cordon, "n1", REFUSAL)
    assert (refusal.reason, refusal.stage, refusal.what) == ("NodeWriteRefused", "cordon", "the cordon of node n1")
    failed = after_refusal(ctx(g, state), refusal)
    assert failed.state is not None and failed.state.failure is not None
    assert failed.state.failure.stage == "cordon" and REFUSAL in failed.state.failure.message

    start = refused_update("g", "n1", NodeUpdate(state=state), REFUSAL)
    assert isinstance(start, Refusal) and start.stage == "start" and start.what == "the start of a round of node n1"
    label = refused_update("g", "n1", NodeUpdate(remove_state=True), REFUSAL)
    assert isinstance(label, EventRequest) and label.reason == "NodeWriteRefused" and REFUSAL in label.message

    said = unrecordable("g", failed, "denied again")
    assert said.write_condition and said.condition is not None and said.condition.reason == "NodeWriteRefused"
    assert said.events and all(e.reason == "NodeWriteRefused" and "denied again" in e.message for e in said.events)
    assert {e.target for e in said.events} == {"node", "gate"}

    update = drain_blocked(state, "pod ns/p: budget pdb")
    assert update is not None and update.state is not None and update.state.drain_blocked_by == "pod ns/p: budget pdb"
    assert [e.reason for e in update.events] == ["DrainBlocked"]
    assert drain_blocked(update.state, "pod ns/p: budget pdb") is None, "once per blocking budget"
