"""The operator's index of stage pods by gate and node.

client-go's informers keep such indexes (`cache.Indexer` with index functions) next to the cache so
that "the stage pods of gate G on node N" is a lookup, not a scan of every pod. This one is fed the
same watch events as the cache (and each pod the operator creates, before its event arrives); it
holds names only, and the cache holds the objects.
"""

from __future__ import annotations

from collections.abc import Iterator

from gate.api.common import Obj
from gate.controller.triggers import stage_owner

_MOST_DELETED = 10_000


class StageIndex:
    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], set[str]] = {}
        # Pods the operator deleted whose DELETED event has not come yet (by uid): a status update the kubelet
        # sent before the delete may still arrive, and must not put the pod back (it would be swept again:
        # a second DELETE, refused with a 404).
        self._deleted: set[str] = set()

    def deleted(self, pod: Obj) -> None:
        """The operator deleted this pod: out of the index now, and kept out until its DELETED event."""
        self.pod_event("DELETED", pod)
        uid = pod["metadata"].get("uid")
        if uid:
            if len(self._deleted) > _MOST_DELETED:  # DELETED events lost to a watch restart: start afresh
                self._deleted.clear()
            self._deleted.add(uid)

    def pod_event(self, kind: str, pod: Obj) -> None:
        owner = stage_owner(pod)
        if owner is None:
            return
        name = pod["metadata"]["name"]
        uid = pod["metadata"].get("uid")
        if uid in self._deleted:
            if kind != "DELETED":
                return
            self._deleted.discard(uid)
        if kind == "DELETED":
            names = self._pods.get(owner)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._pods[owner]
        else:
            self._pods.setdefault(owner, set()).add(name)

    def pods_of(self, gate: str, node: str) -> list[str]:
        return sorted(self._pods.get((gate, node), ()))

    def nodes_with_pods(self, gate: str) -> Iterator[tuple[str, list[str]]]:
        """(node, its stage pod names) for every node with a stage pod of `gate`."""
        for (g, node), names in list(self._pods.items()):
            if g == gate:
                yield node, sorted(names)
