"""The operator's index of stage Jobs by gate and node, and of their pods by Job.

client-go's informers keep such indexes (`cache.Indexer` with index functions) next to the cache so
that "the Jobs of gate G on node N" is a lookup, not a scan of every Job. This one is fed the same
watch events as the caches (and each Job the operator creates, before its event arrives); it holds
names only, and the caches hold the objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gate.controller.triggers import job_owner

Obj = dict[str, Any]


class StageIndex:
    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], set[str]] = {}
        self._pods: dict[str, set[str]] = {}

    def job_event(self, kind: str, job: Obj) -> None:
        owner = job_owner(job)
        if owner is None:
            return
        name = job["metadata"]["name"]
        if kind == "DELETED":
            names = self._jobs.get(owner)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._jobs[owner]
        else:
            self._jobs.setdefault(owner, set()).add(name)

    def pod_event(self, kind: str, pod: Obj) -> None:
        job: str | None = (pod["metadata"].get("labels") or {}).get("job-name")
        if not job:
            return
        if kind == "DELETED":
            names = self._pods.get(job)
            if names is not None:
                names.discard(pod["metadata"]["name"])
                if not names:
                    del self._pods[job]
        else:
            self._pods.setdefault(job, set()).add(pod["metadata"]["name"])

    def jobs_of(self, gate: str, node: str) -> list[str]:
        return sorted(self._jobs.get((gate, node), ()))

    def nodes_with_jobs(self, gate: str) -> Iterator[tuple[str, list[str]]]:
        """(node, its Job names) for every node with a stage Job of `gate`."""
        for (g, node), names in list(self._jobs.items()):
            if g == gate:
                yield node, sorted(names)

    def pods_of(self, job: str) -> list[str]:
        return sorted(self._pods.get(job, ()))
