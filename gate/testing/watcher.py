"""The invariant watcher: watches of its own on a real API server feeding `InvariantChecker`.

It shares nothing with the operator but the API: its own client (give it the admin kubeconfig), its
own lists and watches of Nodes, the stage pods of the operator's namespace (label
`app.kubernetes.io/managed-by: nodegate`), NodeGates and DeploymentPolicies. Node and pod events
arrive on two watches; the checker needs them in the order
etcd applied them, so they wait in a heap until both watches have passed their revision (a watch's
position moves with its events, its bookmarks and its relists), then go to the checker in revision
order. Specs go to the checker as they come.

A watch that expires (410 Gone, e.g. after the API server restarted) relists and hands the checker
the blind window (`Relist`, `Blind`); `stop` catches up with a last list so nothing the watches were
still carrying is lost, and returns the report. With `journal`, every event fed to the checker is
written as one JSON line: `gate.testing.invariants.replay` judges it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gate.api import keys
from gate.api.common import Obj
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient, Resource
from gate.kube.errors import ApiError, ConnectionFailed, Gone
from gate.testing.events import Blind, Change, Event, Relist, dump_event, resource_version, slim
from gate.testing.events import Resource as Kind
from gate.testing.findings import Coverage, Violation
from gate.testing.invariants import InvariantChecker

log = logging.getLogger("nodegate.testing.watcher")

ORDERED: tuple[Kind, ...] = ("nodes", "pods")
STAGE_PODS = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}"  # the operator's stage pods, not the workload's
SPECS: tuple[Kind, ...] = ("nodegates", "deploymentpolicies")


@dataclass
class WatchReport:
    violations: list[Violation]
    coverage: Coverage
    expired: Counter[str] = field(default_factory=Counter)  # 410 Gone per kind: watches that had to relist
    reconnects: Counter[str] = field(default_factory=Counter)  # watches resumed after a broken connection
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        gone = sum(self.expired.values())
        return (f"{len(self.violations)} violations; {self.coverage.summary()}; watch expiries (410) "
                f"{gone}, reconnects {sum(self.reconnects.values())}")


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


class RevisionMerge:
    """Node and pod events in the order etcd applied them (pure: no I/O).

    An event waits until both the node and the pod watch are past its revision; a watch's position
    moves with its events, bookmarks and relists. Specs are passed on at once.
    """

    def __init__(self, feed: Callable[[Event], None]) -> None:
        self._feed = feed
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()
        self.position: dict[Kind, float] = {}
        self.known: dict[Kind, dict[str, int]] = {k: {} for k in ORDERED}  # revision of each object received

    def change(self, event: Change) -> None:
        kind = event.resource
        if kind not in ORDERED:
            self._feed(event)
            return
        if event.type == "DELETED":
            self.known[kind].pop(_key(event.obj), None)
        else:
            self.known[kind][_key(event.obj)] = event.rv
        self._push(event.rv, event)
        self.advance(kind, event.rv)

    def relisted(self, kind: Kind, objects: list[Obj], since: int, rv: int, *, initial: bool = False) -> None:
        relist = Relist(kind, objects, since, rv, initial)
        if kind not in ORDERED:
            self._feed(relist)
            return
        self.known[kind] = {_key(o): resource_version(o) for o in objects}
        if kind == "pods":
            # Pod facts are kept as revision bounds: fed at the start of the window, the checker
            # knows a pod may have ended there before it judges the node changes of that window.
            self._push(since + 1, relist)
        else:
            # Node states are not bounds: the list is the state at `rv`. The window is announced at
            # its start, so pods created in it are not judged against a node state known to be stale.
            if not initial:
                self._push(since + 1, Blind(kind, since, rv))
            self._push(rv, relist)
        self.advance(kind, rv)

    def advance(self, kind: Kind, rv: float) -> None:
        """The watch of `kind` delivered everything up to `rv` (an event, a bookmark, a list)."""
        if kind not in ORDERED:
            return
        self.position[kind] = max(self.position.get(kind, 0), rv)
        if any(k not in self.position for k in ORDERED):
            return  # still starting: every ordered watch needs a position first
        mark = min(self.position[k] for k in ORDERED)
        while self._heap and self._heap[0][0] <= mark:
            self._feed(heapq.heappop(self._heap)[3])

    def flush(self) -> None:
        """The watches are over: everything left goes out, in order."""
        for kind in ORDERED:
            self.advance(kind, math.inf)

    def _push(self, at: float, event: Event) -> None:
        # At one revision: a window's announcement before anything else, then in arrival order.
        priority = 0 if isinstance(event, Blind | Relist) else 1
        heapq.heappush(self._heap, (at, priority, next(self._seq), event))


class InvariantWatcher:
    def __init__(self, client: KubeClient, *, namespace: str = "nodegate-system",
                 journal: Path | None = None) -> None:
        self.client = client
        self.checker = InvariantChecker()
        self._where: dict[Kind, tuple[Resource, str | None, str | None]] = {
            "nodes": (NODES, None, None), "pods": (PODS, namespace, STAGE_PODS), "nodegates": (NODEGATES, None, None),
            "deploymentpolicies": (POLICIES, None, None),
        }
        self.merge = RevisionMerge(self._feed)
        self._rv: dict[Kind, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.expired: Counter[str] = Counter()
        self.reconnects: Counter[str] = Counter()
        self._journal_path = journal
        self._journal: IO[str] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """List everything, then watch in the background. Returns once the first lists are in."""
        if self._journal_path is not None:
            self._journal = self._journal_path.open("w")
        for kind in (*SPECS, *ORDERED):
            items, rv = await self._list(kind)
            self._rv[kind] = rv
            self.merge.relisted(kind, [slim(kind, o) for o in items], 0, int(rv), initial=True)
        for kind in (*SPECS, *ORDERED):
            self._tasks.append(asyncio.create_task(self._watch(kind), name=f"invariants-{kind}"))

    async def stop(self, *, catch_up: float = 10.0) -> WatchReport:
        """Catch up with the cluster as it is now, stop watching, judge what is left; the report."""
        await self._catch_up(catch_up)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.merge.flush()
        self.checker.finish()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        return self.report()

    def report(self) -> WatchReport:
        return WatchReport(list(self.checker.violations), self.checker.coverage, Counter(self.expired),
                           Counter(self.reconnects), self.checker.problems)

    async def _catch_up(self, timeout: float) -> None:
        """Wait until the watches delivered every change a fresh list shows; what they could not
        deliver in `timeout` is handed over as a relist (a blind window), never silently dropped."""
        deadline = asyncio.get_running_loop().time() + timeout
        for kind in ORDERED:
            while True:
                items, rv = await self._list(kind)
                listed = {_key(o): resource_version(o) for o in items}
                position = self.merge.position[kind]
                if position >= int(rv) or listed == self.merge.known[kind]:
                    # Every object is as the watch last delivered it: nothing is on its way for this kind.
                    self.merge.advance(kind, int(rv))
                    break
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("Watch did not catch up; kind=%s position=%s list=%s", kind, position, rv)
                    self.merge.relisted(kind, [slim(kind, o) for o in items], int(position), int(rv))
                    break
                await asyncio.sleep(0.2)

    # -- watching ---------------------------------------------------------------------------------

    async def _list(self, kind: Kind) -> tuple[list[Obj], str]:
        resource, namespace, selector = self._where[kind]
        while True:
            try:
                return await self.client.list(resource, namespace, label_selector=selector)
            except (ApiError, ConnectionFailed) as exc:
                log.debug("List failed; kind=%s error=%s", kind, exc)
                await asyncio.sleep(0.2)

    async def _watch(self, kind: Kind) -> None:
        resource, namespace, selector = self._where[kind]
        backoff = 0.2
        while True:
            try:
                async for type_, obj in self.client.watch(resource, namespace, resource_version=self._rv[kind],
                                                          label_selector=selector):
                    backoff = 0.2
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv[kind]
                    self._rv[kind] = rv
                    if type_ == "BOOKMARK":
                        self.merge.advance(kind, int(rv))
                        continue
                    self.merge.change(Change(kind, type_, slim(kind, obj), resource_version(obj)))  # type: ignore[arg-type]
            except asyncio.CancelledError:
                raise
            except Gone:
                self.expired[kind] += 1
                since = int(self._rv[kind])
                items, rv = await self._list(kind)
                self._rv[kind] = rv
                self.merge.relisted(kind, [slim(kind, o) for o in items], since, int(rv))
            except (ApiError, ConnectionFailed) as exc:
                self.reconnects[kind] += 1
                log.debug("Watch interrupted; kind=%s error=%s", kind, exc)
                # Back soon: every moment the watch is away after a restart widens the blind window.
                await asyncio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 0.5)

    # -- feeding ----------------------------------------------------------------------------------

    def _feed(self, event: Event) -> None:
        if self._journal is not None:
            self._journal.write(dump_event(event) + "\n")
        self.checker.feed(event)
