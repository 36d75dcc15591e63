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


class StageIndex:
    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], set[str]] = {}

    def pod_event(self, kind: str, pod: Obj) -> None:
        owner = stage_owner(pod)
        if owner is None:
            return
        name = pod["metadata"]["name"]
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
