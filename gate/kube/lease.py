"""Leader election through a coordination.k8s.io Lease, as client-go does it.

Expiry is judged by *our* clock: a lease is free when its record has not changed for its duration
since we first saw that record, so the candidates' clocks never need to agree. The holder renews
every `renew_seconds`; if it cannot renew within `renew_deadline` it stops its work at once, before
another candidate may take over (the deadline is shorter than the lease duration).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from gate.kube.client import LEASES, KubeClient, Obj
from gate.kube.errors import ApiError, ConnectionFailed

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, client: KubeClient, name: str, namespace: str, identity: str, *,
                 lease_seconds: int = 15, renew_seconds: float = 5.0, renew_deadline: float = 10.0,
                 retry_seconds: float = 2.0, annotations: dict[str, str] | None = None) -> None:
        """`annotations`: written on the Lease with every renewal, so readers learn about the leader
        (the operator records its version there for `nodegate version`)."""
        if not renew_seconds < renew_deadline < lease_seconds:
            raise ValueError("need renew_seconds < renew_deadline < lease_seconds")
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self.annotations = dict(annotations or {})
        self.is_leader = False
        self.transitions = 0
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0

    async def run(self, on_started: Callable[[], Coroutine[Any, Any, None]], on_stopped: Callable[[], None]) -> None:
        """Campaign forever; run `on_started()` while leading, cancel it the moment leadership is lost."""
        try:
            while True:
                await self._acquire()
                self.is_leader = True
                self.transitions += 1
                log.info("Became leader; lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
                work = asyncio.create_task(on_started(), name="leader-work")
                renew = asyncio.create_task(self._renew_loop(), name="lease-renew")
                try:
                    done, _ = await asyncio.wait({work, renew}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    # Also when this task is cancelled (a shutdown): the work and the renewals end with
                    # the leadership. Left running, the renewals took the lease back after its release,
                    # and a standby waited for it to expire.
                    self.is_leader = False
                    await _end(work, renew)
                    on_stopped()
                if work in done and not work.cancelled() and work.exception() is not None:
                    raise work.exception()  # type: ignore[misc]
                log.warning("Lost leadership; lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        finally:
            if self.is_leader:
                self.is_leader = False
                on_stopped()
            await self._release()

    async def _acquire(self) -> None:
        while True:
            try:
                if await self._try_take():
                    return
            except (ApiError, ConnectionFailed) as exc:
                log.debug("Lease acquire failed: %s", exc)
            await asyncio.sleep(self.retry_seconds)

    async def _renew_loop(self) -> None:
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self._try_take():
                    last_renew = time.monotonic()
                    continue
                return  # someone else holds it now
            except (ApiError, ConnectionFailed) as exc:
                log.warning("Lease renew failed: %s", exc)
            if time.monotonic() - last_renew >= self.renew_deadline:
                return

    async def _try_take(self) -> bool:
        """One attempt to create, take over or renew the lease. True when we hold it afterwards."""
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except ApiError as exc:
            if exc.status != 404:
                raise
            await self.client.create(LEASES, self._lease_body(None, transitions=0), self.namespace)
            return True
        spec: dict[str, Any] = lease.get("spec", {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime", "")))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        body = self._lease_body(lease, transitions=transitions,
                                acquired=spec.get("acquireTime") if holder == self.identity else None)
        try:
            updated = await self.client.replace(LEASES, body)  # resourceVersion makes this a compare-and-swap
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        uspec = updated.get("spec", {})
        self._observed, self._observed_at = (self.identity, str(uspec.get("renewTime", ""))), time.monotonic()
        return True

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
            lease = await self.client.get(LEASES, self.name, self.namespace)
            if lease.get("spec", {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            await self.client.replace(LEASES, lease)
        except (ApiError, ConnectionFailed, asyncio.CancelledError):
            pass


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
