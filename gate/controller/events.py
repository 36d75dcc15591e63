"""Kubernetes Events (events.k8s.io/v1) on the objects a person will `kubectl describe`.

Identical events for the same object are sent at most once per ten minutes: a node that waits on a
PodDisruptionBudget for an hour should say so, not say so every poll.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from gate.kube.client import EVENTS, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed

log = logging.getLogger(__name__)

CONTROLLER = "nodegate.io/operator"
# Events of cluster-scoped objects (Nodes, NodeGates) live in "default", where kubectl describe
# and the kubelet put them.
CLUSTER_EVENTS_NAMESPACE = "default"
DEDUPE_SECONDS = 600.0
PRUNE_AT = 10000  # entries before the ones older than the window are dropped


class EventRecorder:
    def __init__(self, client: KubeClient, identity: str) -> None:
        self.client = client
        self.identity = identity
        # (kind, name, reason, hash of the note) -> when last sent. The note's hash, not the note: a
        # rollout of 5,000 nodes sends 20,000 distinct Events within the window.
        self._recent: dict[tuple[str, str, str, int], float] = {}
        self._prune_at = PRUNE_AT

    async def emit(self, regarding: dict[str, Any], type_: str, reason: str, note: str) -> None:
        meta = regarding.get("metadata", {})
        key = (regarding.get("kind", ""), meta.get("name", ""), reason, hash(note))
        now = time.monotonic()
        if now - self._recent.get(key, -DEDUPE_SECONDS) < DEDUPE_SECONDS:
            return
        self._recent[key] = now
        if len(self._recent) > self._prune_at:
            cutoff = now - DEDUPE_SECONDS
            self._recent = {k: t for k, t in self._recent.items() if t > cutoff}
            # Pruned again only once it doubled: a window holding more than PRUNE_AT recent Events
            # would otherwise be copied whole at every Event.
            self._prune_at = max(PRUNE_AT, 2 * len(self._recent))
        namespace = meta.get("namespace") or CLUSTER_EVENTS_NAMESPACE
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        event = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'object')[:200]}.{uuid.uuid4().hex[:12]}",
                         "namespace": namespace},
            "eventTime": stamp,
            "reportingController": CONTROLLER,
            "reportingInstance": self.identity[:128],
            "action": reason,
            "reason": reason,
            "note": note[:1024],
            "type": type_,
            "regarding": {"apiVersion": regarding.get("apiVersion", ""), "kind": regarding.get("kind", ""),
                          "name": meta.get("name", ""), "uid": meta.get("uid", ""),
                          **({"namespace": meta["namespace"]} if meta.get("namespace") else {})},
        }
        try:
            await self.client.create(EVENTS, event, namespace)
        except (ApiError, ConnectionFailed) as exc:  # events are best effort; never fail a reconcile on them
            log.debug("Event dropped; reason=%s error=%s", reason, exc)
