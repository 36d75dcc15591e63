"""The facts read off Kubernetes objects (gate.kube.objects), on objects as the API server sends them."""

from __future__ import annotations

from datetime import UTC, datetime

from gate.api.state import NodeGateState
from gate.kube.objects import (
    created_at,
    node_ready,
    parse_time,
    pod_ended,
    pod_ended_at,
    pod_outcome,
    state_status,
)


def pod(phase: str | None, *finished: str | None) -> dict[str, object]:
    statuses = [{"name": f"c{i}", "state": {"terminated": {"exitCode": 0, "finishedAt": at}} if at else
                 {"running": {}}} for i, at in enumerate(finished)]
    return {"metadata": {"name": "p", "creationTimestamp": "2026-12-01T10:00:00Z"},
            "status": {"phase": phase, "initContainerStatuses": statuses[:-1], "containerStatuses": statuses[-1:]}}


def test_a_pod_ends_on_its_phase_only() -> None:
    running = pod("Running", "2026-12-01T10:00:30Z", None)
    assert pod_outcome(running) is None and not pod_ended(running) and pod_ended_at(running) is None
    # While init containers run a pod is Pending; a step that ended is not the pod's end.
    assert pod_outcome(pod("Pending", "2026-12-01T10:00:30Z", None)) is None
    done = pod("Succeeded", "2026-12-01T10:00:30Z", "2026-12-01T10:01:00Z")
    assert pod_outcome(done) == "succeeded" and pod_ended(done)
    assert pod_ended_at(done) == datetime(2026, 12, 1, 10, 1, tzinfo=UTC)
    assert pod_outcome(pod("Failed", "2026-12-01T10:00:30Z")) == "failed"
    assert pod_outcome({}) is None


def test_timestamps_and_readiness() -> None:
    assert parse_time("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert parse_time("2026-12-01T10:00:00+00:00") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert parse_time(None) is None and parse_time("") is None and parse_time("yesterday") is None
    assert created_at(pod(None)) == datetime(2026, 12, 1, 10, tzinfo=UTC) and created_at({}) is None
    assert node_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not node_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    assert not node_ready({})


def test_a_state_status_is_parsed_not_matched_as_text() -> None:
    # Any string field may hold a status' word (a compartment may be named so): only the record's own
    # status counts.
    failed = NodeGateState(status="failed", compartment="in-progress").dump()
    assert '"in-progress"' in failed and state_status(failed) == "failed"
    assert state_status(NodeGateState(status="in-progress").dump()) == "in-progress"
    assert state_status("{not json") == "unreadable"
