"""The thin Kubernetes layer against the real API server: watch cache and leader election."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gate.controller import events
from gate.kube.cache import WatchCache
from gate.kube.client import CONFIGMAPS, EVENTS, NAMESPACES, KubeClient
from gate.kube.errors import Conflict, LeadershipLost, NotFound
from gate.kube.fence import Fence
from gate.kube.lease import LeaderElector
from tests.conftest import unique
from tests.processes import HANG_GUARD


async def _eventually(check, timeout: float = HANG_GUARD) -> None:  # type: ignore[no-untyped-def]
    # The default is a hang guard: how long a busy machine takes is no failure.
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


async def test_watch_cache_follows_creates_updates_and_deletes(kube: KubeClient) -> None:
    """And a write observed ahead of its event is taken in, but not once the watch saw the object go: a
    copy put back after its DELETED event would stay for ever (the operator waited on a stage pod
    deleted while it wrote the pod's record)."""
    label = unique("cache")
    cache = WatchCache(kube, CONFIGMAPS, namespace="default", label_selector=f"test={label}")
    events: list[tuple[str, str]] = []
    cache.subscribe(lambda kind, obj: events.append((kind, obj["metadata"]["name"])))
    first = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": f"{label}-a", "namespace": "default", "labels": {"test": label}}, "data": {"k": "1"}}
    await kube.create(CONFIGMAPS, first)
    await cache.start()
    try:
        assert cache.synced and cache.get(f"{label}-a", "default") is not None
        second = await kube.create(CONFIGMAPS, {**first, "metadata": {**first["metadata"], "name": f"{label}-b"}})
        assert cache.observe(second) and cache.get(f"{label}-b", "default") is not None
        patched = await kube.patch(CONFIGMAPS, f"{label}-a", {"data": {"k": "2"}}, namespace="default")
        await kube.delete(CONFIGMAPS, f"{label}-a", "default")
        await _eventually(lambda: ("DELETED", f"{label}-a") in events)
        assert ("ADDED", f"{label}-b") in events and ("MODIFIED", f"{label}-a") in events
        assert not cache.observe(patched)
        assert [o["metadata"]["name"] for o in cache.items()] == [f"{label}-b"], "a deleted object put back"
    finally:
        await cache.stop()
        await kube.delete(CONFIGMAPS, f"{label}-b", "default")


async def test_typed_errors_carry_the_status(kube: KubeClient) -> None:
    with pytest.raises(NotFound):
        await kube.get(CONFIGMAPS, unique("missing"), "default")
    name = unique("dup")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}}
    await kube.create(CONFIGMAPS, cm)
    try:
        with pytest.raises(Conflict) as dup:
            await kube.create(CONFIGMAPS, cm)
        assert dup.value.already_exists
        stale = await kube.get(CONFIGMAPS, name, "default")
        await kube.patch(CONFIGMAPS, name, {"data": {"x": "1"}}, namespace="default")
        stale["data"] = {"x": "2"}
        with pytest.raises(Conflict) as lost:
            await kube.replace(CONFIGMAPS, stale)  # optimistic concurrency: the stale copy loses
        assert not lost.value.already_exists and lost.value.temporary
    finally:
        await kube.delete(CONFIGMAPS, name, "default")


async def test_a_write_queued_for_a_connection_before_the_fence_closed_does_not_go_out_after_it(
        kube: KubeClient) -> None:
    """The fence is judged when a write would leave, not when it was asked for: the work's client may
    have every connection busy, and a write waiting for one must not leave once leadership is lost."""
    fence = Fence(HANG_GUARD)
    fence.begin(time.monotonic())
    name = unique("fenced")
    one = kube.sibling(user_agent="nodegate-test-fenced", connections=1, fence=fence)
    try:
        watching = asyncio.Event()

        async def hold_the_connection() -> None:
            # From resourceVersion 0 the server replays what exists at once: the watch holds the only
            # connection from its first event until the server ends it.
            async for _ in one.watch(NAMESPACES, resource_version="0", timeout_seconds=2):
                watching.set()

        holder = asyncio.create_task(hold_the_connection())
        await asyncio.wait_for(watching.wait(), HANG_GUARD)
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}}
        write = asyncio.create_task(one.create(CONFIGMAPS, cm))
        await asyncio.sleep(0.2)
        sent_before = one.requests
        fence.revoke()  # leadership lost while the write waits for the connection
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(write, HANG_GUARD)
        # It had passed the early check (it was counted), so it was the connector that refused it.
        assert one.requests == sent_before == 2
        await holder
        with pytest.raises(NotFound):
            await kube.get(CONFIGMAPS, name, "default")
    finally:
        await one.close()


LONG_LEASE = 60


async def test_only_one_candidate_leads_and_a_standby_takes_over_on_release(kube: KubeClient) -> None:
    lease = unique("lease")
    leading: list[str] = []

    def elector(identity: str) -> LeaderElector:
        # A long lease: a standby that leads within half of it got there by the release, never by the
        # lease running out, however slowly a busy machine runs the test.
        return LeaderElector(kube, lease, "default", identity, lease_seconds=LONG_LEASE, renew_seconds=0.5,
                             renew_deadline=20, retry_seconds=0.2)

    ended: list[str] = []

    async def work(identity: str) -> None:
        leading.append(identity)
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(identity)

    a, b = elector("a"), elector("b")
    task_a = asyncio.create_task(a.run(lambda: work("a"), lambda: None))
    await _eventually(lambda: a.is_leader)
    task_b = asyncio.create_task(b.run(lambda: work("b"), lambda: None))
    await asyncio.sleep(1.5)  # several renew periods: b must stay a candidate
    assert leading == ["a"] and not b.is_leader
    task_a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_a
    # A cancelled elector's work (and its renewals, which would take the released lease back) ended
    # with it: they once ran on, and the standby waited for the lease to expire.
    assert ended == ["a"]
    await _eventually(lambda: b.is_leader, timeout=LONG_LEASE / 2)  # released: the lease need not run out
    assert leading == ["a", "b"]
    task_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_b


async def test_stopping_a_watch_cache_keeps_a_cancellation_of_the_caller(kube: KubeClient) -> None:
    """Ctrl-C in `asyncio.run` is a cancellation of the main task; one that arrives while the task stops
    a cache must still end the task (it was once swallowed there, and the demo carried on)."""
    cache = WatchCache(kube, CONFIGMAPS, namespace="default", label_selector=f"test={unique('stop')}")
    await cache.start()

    async def stopper() -> str:
        await cache.stop()
        return "carried on"

    task = asyncio.create_task(stopper())
    await asyncio.sleep(0)  # the stopper is inside stop(), waiting for the watch to end
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await cache.stop()  # idempotent: the watch is gone either way


async def test_a_watch_cache_stores_and_reports_its_objects_transformed(kube: KubeClient) -> None:
    """What the operator's node and stage pod caches rely on (`transform`, as client-go's SetTransform):
    every copy it keeps and every listener sees went through it, from the list (page by page), the
    watch and a write observed ahead of its event."""
    label = unique("transform")
    seen: list[dict[str, object]] = []

    def keep_small(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "data": {k: v for k, v in (obj.get("data") or {}).items() if k != "big"}}

    def manifest(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"big": "x" * 4096, "k": "1"},
                "metadata": {"name": name, "namespace": "default", "labels": {"test": label}}}

    cache = WatchCache(kube, CONFIGMAPS, namespace="default", label_selector=f"test={label}", transform=keep_small)
    cache.subscribe(lambda kind, obj: seen.append(obj["data"]))
    # More than a page of them before the cache starts: the first list comes in three pages.
    names = [f"{label}-{i}" for i in range(5)]
    for name in names[:4]:
        await kube.create(CONFIGMAPS, manifest(name))
    original = cache.client.list

    async def small_pages(*args: Any, **kwargs: Any) -> Any:
        return await original(*args, **{**kwargs, "page_size": 2})

    cache.client.list = small_pages  # type: ignore[method-assign]
    try:
        await cache.start()
        cache.client.list = original  # type: ignore[method-assign]
        assert sorted(o["metadata"]["name"] for o in cache.items()) == names[:4]
        await kube.create(CONFIGMAPS, manifest(names[4]))
        written = await kube.patch(CONFIGMAPS, names[0], {"data": {"k": "2"}}, namespace="default")
        cache.observe(written)
        await _eventually(lambda: cache.get(names[4], "default") is not None and len(seen) >= 2)
        for obj in cache.items():
            assert obj["data"]["k"] in ("1", "2") and "big" not in obj["data"], obj["metadata"]["name"]
        assert cache.get(names[0], "default")["data"] == {"k": "2"}  # type: ignore[index]
        assert seen and all("big" not in data for data in seen)
    finally:
        cache.client.list = original  # type: ignore[method-assign]
        await cache.stop()
        for name in names:
            await kube.delete(CONFIGMAPS, name, "default")


async def test_identical_events_are_sent_once_per_window_and_the_memory_of_them_is_pruned(
        kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": unique("events-node"), "uid": "u-1"}}
    clock = [1000.0]
    monkeypatch.setattr(events.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(events, "PRUNE_AT", 4)
    recorder = events.EventRecorder(kube, "test")

    async def sent(note: str) -> int:
        found, _ = await kube.list(EVENTS, events.CLUSTER_EVENTS_NAMESPACE)
        return sum(1 for e in found if e["regarding"]["name"] == node["metadata"]["name"] and e["note"] == note)

    await recorder.emit(node, "Warning", "DrainBlocked", "pdb x")
    await recorder.emit(node, "Warning", "DrainBlocked", "pdb x")  # within the window: not sent again
    await recorder.emit(node, "Warning", "DrainBlocked", "pdb y")  # another note is another Event
    assert (await sent("pdb x"), await sent("pdb y")) == (1, 1)
    clock[0] += events.DEDUPE_SECONDS + 1
    await recorder.emit(node, "Warning", "DrainBlocked", "pdb x")  # the window passed: sent again
    assert await sent("pdb x") == 2
    # Past PRUNE_AT entries the expired ones go, and the next pruning waits until the memory doubled.
    for i in range(4):
        await recorder.emit(node, "Normal", "Step", f"step {i}")
    assert len(recorder._recent) == 5 and recorder._prune_at == 8
