"""Answers to the rules' access questions: SubjectAccessReviews, deduplicated, cached, bounded.

One write can ask many questions: a gate of 64 packages, each naming up to 144 Secrets and ConfigMaps,
asks up to 9,280, and anyone allowed to write a gate can send such writes in a loop. So:

* **Per request, each question once.** Checks with the same cache key (user, uid, groups, extra,
  verb, group, resource, namespace, name) are asked once and the answer is given to each of them.
* **Cached briefly, allow and deny alike**, for `cache_seconds` (the API server's own webhook
  authorizer caches both, allowed for 5 minutes and denied for 30 seconds). Caching denials is what
  keeps a refused write, repeated in a loop, from costing a SAR per check every time; its price is
  that a role granted a moment ago takes up to `cache_seconds` to be seen. A revoked right is seen
  as late, which is why the time is seconds, not minutes.
* **Bounded in number**: at most `max_entries` answers kept, the least recently used dropped first.
* **Bounded in concurrency**: at most `max_in_flight` SubjectAccessReviews are in flight to the API
  server from this process, and at most `per_request` of them for one admission request. Waiting
  questions get a free slot smallest request first (by the questions the request still had to ask),
  then in arrival order: a write with thousands of questions never queues them ahead of a small
  write's one, and holds at most `per_request` slots while it waits its turn.
* **Singleflight**: the same question asked by concurrent requests is sent once. The review runs in a
  task of its own, so one asker giving up (its request cancelled) cancels nobody else's answer.

A review that fails is not cached: the request is answered "retry shortly" and the next one asks
again. `AnswerCache` decides what is known (pure, clock passed in); `SubjectAccessReviewer` asks
the rest through an `AccessReviews`, the one seam to the API server.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gate.admission.rules.review import AccessCheck
from gate.kube.client import SUBJECT_ACCESS_REVIEWS, KubeClient

CacheKey = tuple[object, ...]
YIELD_EVERY = 256


class Authorizer(Protocol):
    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]:
        """One answer per check, in order: True when the check's user may do what it asks."""
        ...


class AccessReviews(Protocol):
    async def review(self, check: AccessCheck) -> bool:
        """Ask the API server one question (one SubjectAccessReview); raise when it cannot answer."""
        ...


def review_body(check: AccessCheck) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": check.user.username,
        "groups": check.user.groups,
        "resourceAttributes": {"verb": check.verb, "group": check.group, "resource": check.resource,
                               **({"name": check.name} if check.name else {}),
                               **({"namespace": check.namespace} if check.namespace else {})},
    }
    if check.user.uid:
        spec["uid"] = check.user.uid
    if check.user.extra:
        spec["extra"] = check.user.extra
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class KubeAccessReviews:
    """SubjectAccessReviews created through the API server."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def review(self, check: AccessCheck) -> bool:
        result = await self.client.create(SUBJECT_ACCESS_REVIEWS, review_body(check))
        status = result.get("status")
        return isinstance(status, dict) and status.get("allowed") is True


class AnswerCache:
    """Answers known for `ttl` seconds, at most `max_entries` of them, least recently used dropped first.
    Pure: the caller passes the time."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.ttl = ttl
        self.max_entries = max_entries
        self._answers: OrderedDict[CacheKey, tuple[bool, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: CacheKey, now: float) -> bool | None:
        known = self._answers.get(key)
        if known is None:
            return None
        allowed, until = known
        if until <= now:
            del self._answers[key]
            return None
        self._answers.move_to_end(key)
        return allowed

    def put(self, key: CacheKey, allowed: bool, now: float) -> None:
        if self.ttl <= 0:
            return
        self._answers[key] = (allowed, now + self.ttl)
        self._answers.move_to_end(key)
        while len(self._answers) > self.max_entries:
            self._answers.popitem(last=False)


class PrioritySlots:
    """A semaphore whose waiters are served lowest priority number first, then in arrival order."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    async def acquire(self, priority: int) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), handed))
        try:
            await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled():
                self.release()  # handed a slot in the same moment it was cancelled: pass it on
            raise  # a cancelled waiter stays in the heap, done: release() skips it

    def release(self) -> None:
        while self._waiting:
            _, _, handed = heapq.heappop(self._waiting)
            if not handed.done():
                handed.set_result(None)  # the slot goes straight to the waiter, never back to `free`
                return
        self.free += 1


@dataclass
class ReviewStats:
    """What the reviewer did, for the webhook's metrics (counters only grow)."""

    checks: int = 0
    """Access checks the rules asked for."""
    duplicates: int = 0
    """Of them, repeats of another check of the same request: answered by that one."""
    cache_hits: int = 0
    """Answered from the cache."""
    shared: int = 0
    """Answered by a review another request had in flight."""
    sent: int = 0
    """SubjectAccessReviews sent to the API server."""
    allowed: int = 0
    denied: int = 0
    failed: int = 0
    """Reviews that raised (not cached)."""
    in_flight: int = 0
    """Reviews in flight right now (a gauge)."""


class SubjectAccessReviewer:
    def __init__(self, reviews: AccessReviews, *, cache_seconds: float = 10.0, max_entries: int = 10_000,
                 max_in_flight: int = 16, per_request: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        if max_in_flight < 1 or per_request < 1:
            raise ValueError(f"max_in_flight ({max_in_flight}) and per_request ({per_request}) must be at least 1")
        self.reviews = reviews
        self.cache = AnswerCache(cache_seconds, max_entries)
        self.max_in_flight = max_in_flight
        self.per_request = per_request
        self.stats = ReviewStats()
        self._clock = clock
        self._slots = PrioritySlots(max_in_flight)
        self._inflight: dict[CacheKey, asyncio.Task[bool]] = {}

    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]:
        keys: list[CacheKey] = []
        first: dict[CacheKey, AccessCheck] = {}
        answers: dict[CacheKey, bool] = {}
        missing: list[CacheKey] = []
        now = self._clock()
        for i, check in enumerate(checks):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                # 9,280 checks take tens of milliseconds to key and look up: let the loop answer
                # other requests in between.
                await asyncio.sleep(0)
                now = self._clock()
            key = check.cache_key()
            keys.append(key)
            if key in first:
                continue
            first[key] = check
            known = self.cache.get(key, now)
            if known is None:
                missing.append(key)
            else:
                answers[key] = known
        self.stats.checks += len(checks)
        self.stats.duplicates += len(checks) - len(first)
        self.stats.cache_hits += len(first) - len(missing)
        if missing:
            queue = iter(missing)
            priority = len(missing)

            async def worker() -> None:
                # The workers share one iterator: each takes the next question when it has an answer.
                for key in queue:
                    answers[key] = await self._ask(key, first[key], priority)

            try:
                async with asyncio.TaskGroup() as group:  # one failure cancels the request's other workers
                    for _ in range(min(self.per_request, len(missing))):
                        group.create_task(worker())
            except ExceptionGroup as failed:
                # The caller handles an API error, not a group of them: the first says what went wrong.
                raise failed.exceptions[0] from None
        return [answers[key] for key in keys]

    async def _ask(self, key: CacheKey, check: AccessCheck, priority: int) -> bool:
        task = self._inflight.get(key)
        if task is None:
            # A task of its own, not the asker's coroutine: if the asker is cancelled, the others
            # waiting on the same question still get the answer, and the cache still learns it.
            task = asyncio.create_task(self._send(key, check, priority), name="subject-access-review")
            task.add_done_callback(_retrieved)
            self._inflight[key] = task
        else:
            self.stats.shared += 1
        return await asyncio.shield(task)

    async def _send(self, key: CacheKey, check: AccessCheck, priority: int) -> bool:
        try:
            await self._slots.acquire(priority)
            self.stats.sent += 1
            self.stats.in_flight += 1
            try:
                allowed = await self.reviews.review(check)
            finally:
                self.stats.in_flight -= 1
                self._slots.release()
        except Exception:
            self.stats.failed += 1
            raise
        finally:
            self._inflight.pop(key, None)
        self.stats.allowed += allowed
        self.stats.denied += not allowed
        self.cache.put(key, allowed, self._clock())
        return allowed


def _retrieved(task: asyncio.Task[bool]) -> None:
    # Every asker may have given up before a review failed: its exception is then nobody's to read,
    # and asyncio would log it as never retrieved.
    if not task.cancelled():
        task.exception()
