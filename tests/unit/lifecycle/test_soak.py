"""The soak after a round: entering it, judging it (conditions, Ready, Prometheus), leaving it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gate.api.policy import DeploymentPolicy, Health
from gate.api.state import NodeGateState
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.fleet import progress_of
from gate.lifecycle.machine import decide
from gate.lifecycle.node import NodeContext, StagePod, Timing
from gate.lifecycle.soak import Reading, health_of, judge, soak_left
from tests.unit.lifecycle.test_machine import NOW, PKG, gate, node, one, run_until_quiet, started

GPU = {"type": "GpuUnhealthy", "status": "True"}


def health(**kw: Any) -> Health:
    return Health.model_validate({"soak": "10m", "nodeConditions": [GPU], **kw})


def soak_ctx(state: NodeGateState, h: Health | None, *, minutes: float = 0, ready: bool = True,
             conditions: dict[str, NodeCondition] | None = None, reading: Reading | None = None) -> NodeContext:
    return NodeContext(gate=gate({"p": PKG}), node=node(ready=ready, health_conditions=conditions or {}), state=state,
                       stage_pods={}, pods=[], now=NOW + timedelta(minutes=minutes), timing=Timing(), health=h,
                       reading=reading)


def soaking(h: Health) -> NodeGateState:
    """A node whose round just went through under `h`: the state the machine leaves it in."""
    g = gate({"p": PKG})
    s = started(g)
    pods: dict[str, StagePod] = {}
    for _ in range(10):
        d = decide(NodeContext(gate=g, node=node(), state=s, stage_pods=pods, pods=[], now=NOW, timing=Timing(),
                               health=h))
        s = d.state or s
        if s.phase == "soak" or s.status != "in-progress":
            break
        if d.create_pods:
            pods = one(d.create_pods[0])
    return s


def test_without_health_a_round_ends_complete() -> None:
    g = gate({"p": PKG})
    state, _, _ = run_until_quiet(g, started(g))
    assert (state.status, state.phase, state.soak_until) == ("complete", "idle", None)


def test_a_round_under_health_ends_in_soak_uncordoned_holding_no_budget() -> None:
    s = soaking(health())
    assert (s.status, s.phase) == ("in-progress", "soak")
    assert s.soak_until is not None and soak_left(s.soak_until, NOW) == 600
    progress = progress_of(s)
    assert progress.soaking and not progress.occupies_budget and not progress.finished and not progress.waiting


def test_a_soaking_node_completes_only_after_the_soak() -> None:
    s = soaking(health())
    early = decide(soak_ctx(s, health(), minutes=9))
    assert early.state is None and early.requeue_after is not None and 59 <= early.requeue_after <= 60
    late = decide(soak_ctx(s, health(), minutes=10))
    assert late.state is not None and late.state.status == "complete" and late.node.status == "complete"
    assert late.state.soak_until is None


def test_a_listed_condition_fails_the_node_unhealthy_naming_condition_and_message() -> None:
    s = soaking(health())
    bad = NodeCondition("GpuUnhealthy", "True", "XidError", "GPU 0 fell off the bus (Xid 79)")
    d = decide(soak_ctx(s, health(), minutes=3, conditions={"GpuUnhealthy": bad}))
    assert d.state is not None and d.state.status == "failed" and d.node.status == "failed"
    assert d.state.failure is not None and d.state.failure.reason == "Unhealthy"
    assert "GpuUnhealthy=True" in d.state.failure.message and "Xid 79" in d.state.failure.message


def test_a_condition_with_another_status_is_healthy() -> None:
    s = soaking(health())
    fine = NodeCondition("GpuUnhealthy", "False", "", "")
    d = decide(soak_ctx(s, health(), minutes=10, conditions={"GpuUnhealthy": fine}))
    assert d.state is not None and d.state.status == "complete"


def test_not_ready_during_the_soak_fails_the_node() -> None:
    s = soaking(health())
    d = decide(soak_ctx(s, health(), minutes=1, ready=False))
    assert d.state is not None and d.state.failure is not None
    assert d.state.failure.reason == "Unhealthy" and "not Ready" in d.state.failure.message


PROM = {"endpoint": "main", "query": 'ALERTS{node="$NODE"}'}


def test_prometheus_samples_fail_the_node_naming_query_endpoint_and_a_summary() -> None:
    h = health(prometheus=PROM)
    s = soaking(h)
    reading = Reading(at=NOW + timedelta(minutes=2), count=3, max_value="7",
                      own=('ALERTS{alertname="XidErrors", node="n1"} => 1',))
    d = decide(soak_ctx(s, h, minutes=2, reading=reading))
    assert d.state is not None and d.state.failure is not None and d.state.failure.reason == "Unhealthy"
    message = d.state.failure.message
    assert "ALERTS{node=" in message and "endpoint main" in message and "3 sample(s), the greatest 7" in message
    assert "XidErrors" in message
    alien = Reading(at=NOW + timedelta(minutes=2), count=2, max_value="1")
    d = decide(soak_ctx(s, h, minutes=2, reading=alien))
    assert d.state is not None and d.state.failure is not None
    assert "none of them is labelled with the node" in d.state.failure.message


def test_the_soak_passes_with_prometheus_only_on_a_good_reading_of_this_soak() -> None:
    h = health(prometheus=PROM)
    s = soaking(h)
    stale = Reading(at=NOW - timedelta(minutes=1))
    assert decide(soak_ctx(s, h, minutes=11, reading=stale)).state is None
    fresh = Reading(at=NOW + timedelta(minutes=10))
    d = decide(soak_ctx(s, h, minutes=11, reading=fresh))
    assert d.state is not None and d.state.status == "complete"


def test_an_unreadable_query_never_counts_as_healthy_and_fails_after_the_limit() -> None:
    h = health(prometheus=PROM)
    s = soaking(h)
    start = NOW + timedelta(minutes=1)
    # the soak is over, but the query has failed for 9.5 minutes only (the limit is the soak, 10m)
    reading = Reading(at=NOW + timedelta(minutes=10.5), error="connection refused", failing_since=start)
    d = decide(soak_ctx(s, h, minutes=10.5, reading=reading))
    assert d.state is not None and d.state.status == "in-progress" and d.state.phase == "soak"
    assert d.state.health_unreadable is not None and "connection refused" in d.state.health_unreadable
    later = Reading(at=NOW + timedelta(minutes=11.5), error="connection refused", failing_since=start)
    gone = decide(soak_ctx(d.state, h, minutes=11.5, reading=later))
    assert gone.state is not None and gone.state.status == "failed"
    assert gone.state.failure is not None and gone.state.failure.reason == "HealthUnreadable"


def test_judge_waits_for_a_first_reading_after_the_soak() -> None:
    h = health(prometheus=PROM)
    v = judge(h, ready=True, conditions={}, reading=None, soak_since=NOW, soak_until=NOW, now=NOW)
    assert v.outcome == "soaking"


def test_health_of_reads_the_compartment_then_the_default() -> None:
    policy = DeploymentPolicy.model_validate({"metadata": {"name": "p"}, "spec": {
        "default": {"health": {"soak": "1m"}},
        "compartments": [{"name": "gpu", "selector": {}, "budget": {"count": 1}, "health": {"soak": "10m"}},
                         {"name": "cpu", "selector": {}, "budget": {"count": 1}}]}})
    assert (h := health_of(policy, "gpu")) is not None and h.soak == "10m"
    assert health_of(policy, "cpu") is None
    assert (d := health_of(policy, "__default__")) is not None and d.soak == "1m"
    assert health_of(None, "gpu") is None
