"""What NodeGate reads off Kubernetes objects, in one place: timestamps, conditions, a Job's end, a
Node's readiness, a NodeGate state's status.

Each fact had been computed where it was needed (whether a Job ended in six places, timestamps in
three), and copies of one fact drift apart. The operator, the CLI, the invariant checker and the
benchmarks read them here. Pure functions of the
object's wire form (dicts as the API server sends them), as `k8s.io/apimachinery`'s helpers and
kubectl's `polymorphichelpers` are for Go code.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, Literal

from gate.api.state import StateParseError, load_state

Obj = dict[str, Any]
JobOutcome = Literal["succeeded", "failed"]


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp of the API (`2026-12-01T10:00:00Z`), None when unset or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def conditions(obj: Obj) -> dict[str, Obj]:
    """The object's status conditions by type."""
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def condition_true(obj: Obj, type_: str) -> bool:
    return conditions(obj).get(type_, {}).get("status") == "True"


def job_outcome(job: Obj) -> JobOutcome | None:
    """How a Job ended (its terminal condition `Complete` or `Failed` is True), None while it has not."""
    conds = conditions(job)
    if conds.get("Complete", {}).get("status") == "True":
        return "succeeded"
    if conds.get("Failed", {}).get("status") == "True":
        return "failed"
    return None


def job_finished(job: Obj) -> bool:
    return job_outcome(job) is not None


def job_ended_at(job: Obj) -> datetime | None:
    """When the Job's terminal condition turned True."""
    for cond in conditions(job).values():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def job_failure(job: Obj) -> str:
    """The Job controller's reason and message for a failed Job ("" when it did not fail)."""
    failed = conditions(job).get("Failed", {})
    if failed.get("status") != "True":
        return ""
    return f"{failed.get('reason', '')}: {failed.get('message', '')}".strip(": ")


def node_ready(node: Obj) -> bool:
    return condition_true(node, "Ready")


def created_at(obj: Obj) -> datetime | None:
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


@lru_cache(maxsize=16384)
def state_status(raw: str) -> str | None:
    """The status in a NodeGate state annotation, parsed (not substring-matched: a package or a
    message may contain any text), "unreadable" for one that does not parse. Cached by the text: a
    node event carries every gate's state, and most of them did not change."""
    try:
        return load_state(raw).status
    except StateParseError:
        return "unreadable"


__all__ = [
    "JobOutcome", "Obj", "condition_true", "conditions", "created_at", "job_ended_at", "job_failure", "job_finished",
    "job_outcome", "node_ready", "parse_time", "state_status",
]
