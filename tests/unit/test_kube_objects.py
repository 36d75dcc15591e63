"""The facts read off Kubernetes objects (gate.kube.objects), on objects as the API server sends them."""

from __future__ import annotations

from datetime import UTC, datetime

from gate.api.state import NodeGateState
from gate.kube.objects import (
    created_at,
    job_ended_at,
    job_failure,
    job_finished,
    job_outcome,
    node_ready,
    parse_time,
    state_status,
)


def job(*conditions: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "j", "creationTimestamp": "2026-12-01T10:00:00Z"},
            "status": {"conditions": list(conditions), "active": 1}}


def test_a_job_ends_on_its_terminal_condition_only() -> None:
    running = job({"type": "SuccessCriteriaMet", "status": "True"})
    assert job_outcome(running) is None and not job_finished(running) and job_ended_at(running) is None
    done = job({"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T10:01:00Z"})
    assert job_outcome(done) == "succeeded" and job_finished(done) and job_failure(done) == ""
    assert job_ended_at(done) == datetime(2026, 12, 1, 10, 1, tzinfo=UTC)
    failed = job({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit"})
    assert job_outcome(failed) == "failed"
    assert job_failure(failed) == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    assert job_outcome(job({"type": "Failed", "status": "False"})) is None


def test_timestamps_and_readiness() -> None:
    assert parse_time("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert parse_time("2026-12-01T10:00:00+00:00") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert parse_time(None) is None and parse_time("") is None and parse_time("yesterday") is None
    assert created_at(job()) == datetime(2026, 12, 1, 10, tzinfo=UTC) and created_at({}) is None
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
