"""Metric series follow their objects: a gate's, a compartment's and a package's go when they go."""

from __future__ import annotations

from prometheus_client import generate_latest

from gate.controller.metrics import OperatorMetrics


def _scrape(m: OperatorMetrics) -> str:
    return generate_latest(m.registry).decode()


def _fill(m: OperatorMetrics) -> None:
    for gate in ("a", "b"):
        m.nodes.labels(gate, "failed").set(1)
        m.drains_blocked_now.labels(gate).set(0)
        m.taints_added.labels(gate).inc()
        m.stage_failures.labels(gate, "tool", "apply", "StageFailed").inc()
        m.stage_failures.labels(gate, "-", "drain", "DrainTimeout").inc()
        for comp in ("canary", "main"):
            m.c_stopped.labels(gate, comp).set(1)
    m.stage_duration.labels("tool", "apply", "failed").observe(1)
    m.stage_duration.labels("old", "apply", "succeeded").observe(1)


def test_forgetting_a_gate_removes_every_series_labelled_with_it_and_no_other() -> None:
    m = OperatorMetrics()
    _fill(m)
    assert 'gate="a"' in _scrape(m)
    assert m.forget_gate("a") == 7
    text = _scrape(m)
    assert 'gate="a"' not in text
    assert 'nodegate_nodes{gate="b",status="failed"} 1.0' in text
    assert 'nodegate_compartment_stopped{compartment="main",gate="b"} 1.0' in text
    assert m.forget_gate("a") == 0


def test_a_gate_that_lost_a_compartment_or_a_package_loses_their_series() -> None:
    m = OperatorMetrics()
    _fill(m)
    m.forget_gone("a", compartments={"main"}, packages=set(), all_packages={"tool"})
    text = _scrape(m)
    assert 'nodegate_compartment_stopped{compartment="canary",gate="a"}' not in text
    assert 'nodegate_compartment_stopped{compartment="main",gate="a"} 1.0' in text
    assert 'package="tool",reason="StageFailed",stage="apply"} 1.0' in text  # gate b's
    assert text.count('nodegate_stage_failures_total{gate="a"') == 1  # the node step's (no package) stays
    assert 'package="old"' not in text  # no gate has it
    assert 'nodegate_stage_duration_seconds_count{outcome="failed",package="tool"' in text
    assert 'compartment="canary",gate="b"' in text
