"""Leader election through a coordination.k8s.io Lease, as client-go does it.

Expiry is judged by *our* clock: a lease is free when its record has not changed for its duration
since we first saw that record, so the candidates' clocks never need to agree. The holder renews
`renew_seconds` after its last renewal was sent; if it has not renewed by `renew_deadline` after
that, it stops acting, before another candidate may take over (`gate.kube.fence` has the arithmetic
and the fence that the work's writes pass).

The elector talks through a client of its own (its own connections, `gate.controller.clients`), so
a renewal never queues behind the work's requests, and each of its requests has its own deadline:
what is left before the renew deadline. A renewal that cannot be answered in time cannot keep the
leader acting past it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from gate.api.common import Obj
from gate.kube.client import LEASES, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed
from gate.kube.fence import Fence, LeaseTiming

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _DeadlinePassed(Exception):
    """No time is left before the renew deadline for another request."""


class LeaderElector:
    def __init__(self, client: KubeClient, name: str, namespace: str, identity: str, *,
                 lease_seconds: int = 15, renew_seconds: float = 5.0, renew_deadline: float = 10.0,
                 retry_seconds: float = 2.0, annotations: dict[str, str] | None = None,
                 fence: Fence | None = None) -> None:
        """`client`: the elector's own (never the work's: its renewals must not wait for connections
        the work holds). `fence`: the one the work's client checks before each write; the elector
        opens it for each term and closes it when the term ends. `annotations`: written on the Lease
        with every renewal, so readers learn about the leader (the operator records its version there
        for `nodegate version`)."""
        self.timing = LeaseTiming(lease_seconds, renew_seconds, renew_deadline)
        self.fence = fence if fence is not None else Fence(renew_deadline)
        if self.fence.renew_deadline != renew_deadline:
            raise ValueError(f"the fence's renew deadline ({self.fence.renew_deadline:g}s) is not the elector's "
                             f"({renew_deadline:g}s)")
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self.annotations = dict(annotations or {})
        self.transitions = 0
        self._leading = False
        self._last_sent = 0.0  # monotonic moment the last successful renewal (or the takeover) was sent
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0

    @property
    def is_leader(self) -> bool:
        """Leading, and still before the renew deadline. Read from the clock, not from the renewal
        loop: a process that was frozen past its deadline is no leader the moment it wakes."""
        return self._leading and self.fence.holds()

    async def run(self, on_started: Callable[[], Coroutine[Any, Any, None]], on_stopped: Callable[[], None]) -> None:
        """Campaign forever; run `on_started()` while leading, cancel it the moment leadership is lost."""
        try:
            while True:
                await self._acquire()
                self._leading = True
                self.transitions += 1
                log.info("Became leader; lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
                work = asyncio.create_task(on_started(), name="leader-work")
                renew = asyncio.create_task(self._renew_loop(), name="lease-renew")
                deadline = asyncio.create_task(self._until_deadline(), name="lease-deadline")
                expired = False
                try:
                    done, _ = await asyncio.wait({work, renew, deadline}, return_when=asyncio.FIRST_COMPLETED)
                    expired = self.fence.remaining() <= 0
                finally:
                    # First the fence: from here no write of the work goes out, whatever is still on
                    # its way. Also when this task is cancelled (a shutdown): the work and the renewals
                    # end with the leadership. Left running, the renewals took the lease back after its
                    # release, and a standby waited for it to expire.
                    self.fence.revoke()
                    self._leading = False
                    await _end(work, renew, deadline)
                    on_stopped()
                if work in done and not work.cancelled() and work.exception() is not None:
                    raise work.exception()  # type: ignore[misc]
                why = "renew deadline passed" if expired else "another candidate holds the lease"
                log.warning("Lost leadership; lease=%s/%s identity=%s reason=%s", self.namespace, self.name,
                            self.identity, why)
        finally:
            self.fence.revoke()
            if self._leading:
                self._leading = False
                on_stopped()
            await self._release()

    async def _acquire(self) -> None:
        while True:
            try:
                sent = await self._try_take(lambda: self.renew_deadline)
                if sent is not None:
                    self._last_sent = sent
                    self.fence.begin(sent)
                    if self.fence.holds():
                        return
                    # Answered after the deadline of the term it opened: too late to act on. The lease
                    # is ours still; the next attempt renews it.
            except (ApiError, ConnectionFailed) as exc:
                log.debug("Lease acquire failed: %s", exc)
            await asyncio.sleep(self.retry_seconds)

    async def _until_deadline(self) -> None:
        """Returns at the renew deadline (it moves on with every renewal), whatever the renewals do."""
        while (left := self.fence.remaining()) > 0:
            await asyncio.sleep(left)

    async def _renew_loop(self) -> None:
        """Renew `renew_seconds` after the last renewal was sent, retry a failure after `retry_seconds`;
        return when another candidate holds the lease. The deadline is `_until_deadline`'s to keep."""
        next_at = self._last_sent + self.renew_seconds
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            try:
                sent = await self._try_take(self.fence.remaining)
            except _DeadlinePassed:
                return
            except (ApiError, ConnectionFailed) as exc:
                log.warning("Lease renew failed; error=%s left=%.1fs", exc, self.fence.remaining())
                next_at = time.monotonic() + self.retry_seconds
                continue
            if sent is None:
                return  # someone else holds it now
            self._last_sent = sent
            self.fence.extend(sent)
            next_at = sent + self.renew_seconds

    async def _try_take(self, budget: Callable[[], float]) -> float | None:
        """One attempt to create, take over or renew the lease, each request given `budget()` seconds
        (`_DeadlinePassed` when none are left). The moment the write that took or renewed the lease was
        sent, or None when another holder's lease is still valid by our clock. A write refused by
        optimistic concurrency (409: someone else wrote first) raises: the next attempt looks again."""
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace, timeout=_left(budget))
        except ApiError as exc:
            if exc.status != 404:
                raise
            body = self._lease_body(None, transitions=0)
            timeout = _left(budget)
            sent = time.monotonic()
            await self.client.create(LEASES, body, self.namespace, timeout=timeout)
            self._observed, self._observed_at = (self.identity, body["spec"]["renewTime"]), time.monotonic()
            return sent
        spec: dict[str, Any] = lease.get("spec", {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime", "")))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return None
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        body = self._lease_body(lease, transitions=transitions,
                                acquired=spec.get("acquireTime") if holder == self.identity else None)
        timeout = _left(budget)
        # Taken before the request, so never later than the moment it really left: the deadline is
        # counted from the send, as the standby's lease duration is (gate.kube.fence).
        sent = time.monotonic()
        updated = await self.client.replace(LEASES, body, timeout=timeout)  # resourceVersion: a compare-and-swap
        uspec = updated.get("spec", {})
        self._observed, self._observed_at = (self.identity, str(uspec.get("renewTime", ""))), time.monotonic()
        return sent

    def _lease_body(self, current: Obj | None, *, transitions: int, acquired: str | None = None) -> Obj:
        now = _now_micro()
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            meta["annotations"] = dict(current["metadata"].get("annotations") or {})
        if self.annotations:
            meta["annotations"] = {**meta.get("annotations", {}), **self.annotations}
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                     "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions},
        }

    async def _release(self) -> None:
        """Give the lease up on a clean shutdown so a standby takes over at once, not after expiry."""
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace, timeout=self.renew_deadline)
            if lease.get("spec", {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            await self.client.replace(LEASES, lease, timeout=self.renew_deadline)
        except (ApiError, ConnectionFailed, asyncio.CancelledError):
            pass


def _left(budget: Callable[[], float]) -> float:
    left = budget()
    if left <= 0:
        raise _DeadlinePassed
    return left


async def _end(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the tasks and wait until they are done, their errors retrieved (the caller reads them)."""
    for task in tasks:
        task.cancel()
    # asyncio.wait, not `await task` under suppress(CancelledError): that would also swallow a
    # cancellation of the caller arriving meanwhile.
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()
