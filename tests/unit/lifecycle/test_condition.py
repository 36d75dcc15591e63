"""NodeGate's condition on a failed node: derived from the gate's state alone, patched by type."""

from __future__ import annotations

from gate.api import keys
from gate.api.state import Failure, NodeGateState, StateParseError
from gate.lifecycle.condition import NodeCondition, condition_patch, failure_condition
from gate.lifecycle.fleet import plan_gate, replan
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, gate, started

KIND = keys.failed_condition("g")
SUMMARY = '{"failedStep":"install","exitCode":3,"message":"/etc/tool.conf: read-only file system"}'


def _failed(**failure: object) -> NodeGateState:
    return NodeGateState(status="failed", failure=Failure(**{"stage": "apply", "reason": "StageFailed", **failure}))


def test_a_failed_node_carries_the_package_stage_and_message() -> None:
    cond = failure_condition("g", _failed(package="tool", message=SUMMARY))
    assert cond == NodeCondition(KIND, "True", "StageFailed", "NodeGate g: package tool failed in stage apply: step "
                                 "install exited 3: /etc/tool.conf: read-only file system")
    assert KIND == "nodegate.io/failed.g"


def test_a_failed_node_step_is_named_as_a_step() -> None:
    cond = failure_condition("g", _failed(stage="drain", reason="DrainTimeout", message="blocked by pod a/b"))
    assert cond is not None and cond.reason == "DrainTimeout"
    assert cond.message == "NodeGate g: failed in step drain: blocked by pod a/b"


def test_an_unreadable_state_is_a_failure_too() -> None:
    cond = failure_condition("g", StateParseError("the state annotation does not parse: x"))
    assert cond is not None and cond.reason == "StateCorrupt" and "nodegate node reset" in cond.message


def test_only_a_failed_state_carries_the_condition() -> None:
    for state in (None, NodeGateState(), NodeGateState(status="complete"), NodeGateState(status="in-progress"),
                  NodeGateState(status="waiting")):
        assert failure_condition("g", state) is None, state


def test_the_patch_adds_updates_and_removes_only_this_entry() -> None:
    cond = NodeCondition(KIND, "True", "StageFailed", "first")
    added = condition_patch(None, cond, KIND, NOW)
    assert added == {"status": {"conditions": [{
        "type": KIND, "status": "True", "reason": "StageFailed", "message": "first",
        "lastHeartbeatTime": "2026-11-30T12:00:00Z", "lastTransitionTime": "2026-11-30T12:00:00Z"}]}}
    assert condition_patch(cond, cond, KIND, NOW) is None
    changed = condition_patch(cond, NodeCondition(KIND, "True", "DrainTimeout", "second"), KIND, NOW)
    assert changed is not None
    [entry] = changed["status"]["conditions"]
    assert entry["message"] == "second" and "lastTransitionTime" not in entry  # still failed since the first
    assert condition_patch(cond, None, KIND, NOW) == {"status": {"conditions": [{"type": KIND, "$patch": "delete"}]}}
    assert condition_patch(None, None, KIND, NOW) is None


def test_a_pull_that_fails_says_so_on_the_gate_and_the_node_at_once_and_both_go_when_it_pulls() -> None:
    g = gate({"k": PKG})
    failing = started(g).model_copy(update={"phase": "stages", "pull_failing": 'ImagePullBackOff: Back-off pulling '
                                            'image "example.com/pkg:1.0.0"'})
    fleet = [fleet_node("a", state=failing), fleet_node("b")]
    p = plan_gate(g, None, fleet, gates=[g], now=NOW)
    [cond] = [c for c in p.status.conditions if c.type == "ImagePullFailing"]
    assert cond.status == "True" and "node a" in cond.message and "example.com/pkg:1.0.0" in cond.message
    node_condition = p.conditions["a"]
    assert node_condition is not None and node_condition.reason == "ImagePullFailing"
    assert "example.com/pkg:1.0.0" in node_condition.message and "node a" in node_condition.message
    # the node's state starting to say it is what brings the plan that writes both
    assert replan(fleet_node("a", state=started(g).model_copy(update={"phase": "stages"})), fleet[0]) == "soon"
    pulled = failing.model_copy(update={"pull_failing": None})
    kind = keys.blocked_condition("g")
    p = plan_gate(g, None, [fleet_node("a", state=pulled, conditions={kind: node_condition}), fleet_node("b")],
                  gates=[g], now=NOW)
    assert not [c for c in p.status.conditions if c.type == "ImagePullFailing"]
    assert "a" in p.conditions and p.conditions["a"] is None
