"""Warning Events the webhook leaves when it lets a break-glass right through (`Verdict.notices`).

The Event is part of the answer: when it cannot be written the request is refused ("retry
shortly"), so no break-glass use goes without its trace. Events go in the object's namespace
(events.k8s.io/v1), where `kubectl describe pod` and `kubectl get events` show them, and they
outlive the pod (an hour, by the API server's event TTL).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

from gate.admission.rules.review import Notice
from gate.kube.client import EVENTS, KubeClient

CONTROLLER = "nodegate.io/webhook"


class NoticeSink(Protocol):
    async def record(self, notice: Notice, user: str) -> None:
        """Write the Event; raise when it could not be written."""
        ...


def event_of(notice: Notice, instance: str, now: datetime | None = None) -> dict[str, Any]:
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": f"{notice.name[:200]}.{uuid.uuid4().hex[:12]}", "namespace": notice.namespace},
        "eventTime": stamp,
        "reportingController": CONTROLLER,
        "reportingInstance": instance[:128],
        "action": notice.reason,
        "reason": notice.reason,
        "note": notice.note[:1024],
        "type": "Warning",
        "regarding": {"apiVersion": "v1", "kind": notice.kind, "name": notice.name, "namespace": notice.namespace},
    }


class KubeNotices:
    def __init__(self, client: KubeClient, instance: str) -> None:
        self.client = client
        self.instance = instance

    async def record(self, notice: Notice, user: str) -> None:
        await self.client.create(EVENTS, event_of(notice, self.instance), notice.namespace)

