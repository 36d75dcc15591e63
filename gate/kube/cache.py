"""A watch cache (an informer): one list, then a watch that keeps a local copy current.

Readers ask the cache, never the API server; subscribers hear about every change so a controller can
enqueue work. A watch that ends is resumed from the last resourceVersion seen (bookmarks keep it
fresh); a 410 Gone means the server compacted past it, so the cache relists and reports the difference
as ordinary events, exactly as if it had seen them.

A cache retries a server it cannot reach forever by default, as an operator must (client-go's
reflector does the same). A command that follows the cluster for a person passes `give_up_after`:
after that many failed attempts in a row the cache stops and says why in `lost`, as `kubectl get -w`
ends when its watch does.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from gate.api.common import Obj
from gate.kube.client import KubeClient, Resource
from gate.kube.errors import ApiError, ConnectionFailed, Gone

log = logging.getLogger(__name__)

Listener = Callable[[str, Obj], None]
Transform = Callable[[Obj], Obj]


def slim(obj: Obj) -> Obj:
    """Drop managedFields: server-side apply bookkeeping, often half of an object's size, which no
    reader of the cache needs (writes go through patches guarded by resourceVersion)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class WatchCache:
    """A local, always-current copy of one kind (optionally one namespace or label selector).

    `transform` is applied to every object before it is stored or handed to a listener, as client-go's
    `SharedInformer.SetTransform` is: a cache of 5,000 Nodes need not hold what no reader looks at
    (their images, capacity, addresses). It must return an object its readers can still use, resourceVersion
    and all; the default only drops managedFields (`slim`)."""

    def __init__(self, client: KubeClient, resource: Resource, *, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 give_up_after: int | None = None, transform: Transform = slim) -> None:
        self.client = client
        self.transform = transform
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self._store: dict[str, Obj] = {}
        self._listeners: list[Listener] = []
        self._rv = ""
        self._task: asyncio.Task[None] | None = None
        self.synced = False
        self.relists = 0  # how often the cache had to relist (410 Gone), for tests and metrics
        self.give_up_after = give_up_after
        self.failures = 0  # failed attempts in a row to watch or relist; 0 while the server answers
        self.last_error: ConnectionFailed | ApiError | None = None  # the latest of those failures
        self.lost: ConnectionFailed | ApiError | None = None  # set when the cache gave up: it follows no more

    # -- reading ----------------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def items(self) -> list[Obj]:
        return list(self._store.values())

    def __len__(self) -> int:
        return len(self._store)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def observe(self, obj: Obj) -> bool:
        """Take in an object we just wrote, ahead of its watch event (newer resourceVersion wins); whether
        it was taken in.

        Lets a reconcile that runs right after its own write see that write, instead of acting on
        the stale copy and losing an optimistic-concurrency race against itself. An object the cache
        does not hold although its watch is already past the write (the object's resourceVersion) was
        deleted since: its DELETED event came while the writer awaited something else, and putting it
        back would keep a ghost that no event ever takes out (a stage pod deleted right after its
        create: the operator waited on it for ever).
        """
        key = object_key(obj)
        old = self._store.get(key)
        if old is None:
            if 0 < _rv(obj) <= _version(self._rv):
                return False
        elif _rv(obj) < _rv(old):
            return False
        self._store[key] = self.transform(obj)
        return True

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """List, then keep watching in the background. Returns once the first list is in."""
        await self._relist()
        self.synced = True
        self._task = asyncio.create_task(self._run(), name=f"watch-{self.resource.plural}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # asyncio.wait, not `await task` in a try/except CancelledError: that except would also swallow
        # a cancellation of the caller arriving meanwhile (asyncio.run's answer to Ctrl-C), and the
        # caller would carry on as if nothing had been asked.
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            log.error("Watch ended with an error; resource=%s error=%s", self.resource.plural, task.exception())

    async def _relist(self) -> None:
        # Transformed page by page: the full objects of one page at most are held at once.
        items, rv = await self.client.list(self.resource, self.namespace, label_selector=self.label_selector,
                                           field_selector=self.field_selector, transform=self.transform)
        fresh = {object_key(o): o for o in items}
        old = self._store
        self._store = fresh
        self._rv = rv
        if self.synced:  # report what changed while we were not watching
            for key, obj in old.items():
                if key not in fresh:
                    self._emit("DELETED", obj)
            for key, obj in fresh.items():
                prev = old.get(key)
                if prev is None:
                    self._emit("ADDED", obj)
                elif _rv(prev) != _rv(obj):
                    self._emit("MODIFIED", obj)

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async for kind, obj in self.client.watch(
                    self.resource, self.namespace, resource_version=self._rv,
                    label_selector=self.label_selector, field_selector=self.field_selector,
                ):
                    backoff = 0.2
                    self._answered()
                    new_rv = obj.get("metadata", {}).get("resourceVersion")
                    if new_rv:
                        self._rv = new_rv
                    if kind == "BOOKMARK":
                        continue
                    self._apply(kind, obj)
                self._answered()  # the server ended the watch in order: it is there
            except asyncio.CancelledError:
                raise
            except Gone:
                self.relists += 1
                if not await self._relist_with_retry():
                    return
            except (ConnectionFailed, ApiError) as exc:
                if self._give_up(exc):
                    return
                log.warning("Watch interrupted; resource=%s error=%s", self.resource.plural, exc)
                await asyncio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 10.0)
            except Exception:  # a bug here must not silently freeze the cache
                log.exception("Watch failed; resource=%s", self.resource.plural)
                await asyncio.sleep(1.0)

    async def _relist_with_retry(self) -> bool:
        """Relist until it works (True), or until the cache gives up (False)."""
        backoff = 0.2
        while True:
            try:
                await self._relist()
                self._answered()
                return True
            except (ConnectionFailed, ApiError) as exc:
                if self._give_up(exc):
                    return False
                log.warning("Relist failed; resource=%s error=%s", self.resource.plural, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _answered(self) -> None:
        self.failures = 0
        self.last_error = None

    def _give_up(self, exc: ConnectionFailed | ApiError) -> bool:
        """Count a failed attempt; True when it was the last one `give_up_after` allows."""
        self.failures += 1
        self.last_error = exc
        if self.give_up_after is None or self.failures < self.give_up_after:
            return False
        self.lost = exc
        log.warning("Watch gave up; resource=%s attempts=%d error=%s", self.resource.plural, self.failures, exc)
        return True

    def _apply(self, kind: str, obj: Obj) -> None:
        obj = self.transform(obj)
        key = object_key(obj)
        if kind == "DELETED":
            self._store.pop(key, None)
        else:
            old = self._store.get(key)
            if old is not None and _rv(old) > _rv(obj):
                return  # we already hold a newer copy (observe() of our own write)
            self._store[key] = obj
        self._emit(kind, obj)

    def _emit(self, kind: str, obj: Obj) -> None:
        for listener in self._listeners:
            try:
                listener(kind, obj)
            except Exception:
                log.exception("Cache listener failed; resource=%s", self.resource.plural)


def _rv(obj: Obj) -> int:
    return _version(obj.get("metadata", {}).get("resourceVersion", "0"))


def _version(raw: Any) -> int:
    # resourceVersions are opaque strings by contract, but etcd-backed servers use integers; ordering
    # them is only used to keep the newer of two copies of the same object (0: not an integer).
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0
