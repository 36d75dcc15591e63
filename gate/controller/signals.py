"""The Prometheus health signal of soaking nodes: asked here (I/O), judged in `gate.lifecycle.soak`.

`SignalReader.read(gate, node, signal)` returns the node's last `Reading`, asking Prometheus again
when it is older than `interval`. Decisions:

* **Only soaking nodes are asked**, and only when their node reconcile looks at them (the machine
  requeues a soaking node at most `health_poll` seconds apart while its policy has a query), so
  the load on Prometheus follows the nodes in soak, not the fleet.
* **Bounded**: at most `concurrency` queries are in flight at once over one HTTP session; a node's
  query is asked at most once per `interval`, however often its node changes.
* **Only the installer's endpoints** (`gate.controller.endpoints`): a signal naming an endpoint the
  operator does not know is a failed reading that says so, and nothing is asked anywhere.
* **Summarized at once** (`gate.controller.promql.summarize`): the reading keeps the count, the
  greatest value and the node's own series, nothing else of the answer.
* **A failure is remembered as one**: the reading carries the error and since when the queries of
  that node have failed without a break (`Reading.failing_since`), which the pure verdict needs to
  decide when an unreadable signal fails the node. It lives in memory: after a restart the run of
  failures starts again, which delays that verdict and never hastens it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from gate.api.policy import PrometheusSignal
from gate.controller.endpoints import EndpointBook
from gate.controller.promql import QueryFailed, instant_query, node_query, summarize
from gate.lifecycle.soak import Reading


class SignalReader:
    def __init__(self, endpoints: EndpointBook, *, interval: float = 15.0, concurrency: int = 8,
                 timeout: float = 10.0, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.endpoints = endpoints
        self.interval = interval
        self.timeout = timeout
        self._clock = clock
        self._slots = asyncio.Semaphore(concurrency)
        self._readings: dict[tuple[str, str], Reading] = {}
        self._session: aiohttp.ClientSession | None = None

    async def read(self, gate: str, node: str, signal: PrometheusSignal) -> Reading:
        """The node's reading, fresh within `interval` (see the module docstring)."""
        key = (gate, node)
        last = self._readings.get(key)
        if last is not None and (self._clock() - last.at).total_seconds() < self.interval:
            return last
        endpoint = self.endpoints.get(signal.endpoint)
        async with self._slots:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            try:
                if endpoint is None:
                    known = ", ".join(sorted(self.endpoints.names())) or "none"
                    raise QueryFailed(signal.endpoint, signal.query, f"the operator has no endpoint named "
                                      f"{signal.endpoint!r} (operator.health.prometheus.endpoints; configured: "
                                      f"{known}); nothing was asked")
                samples = await instant_query(self._session, endpoint, node_query(signal.query, node),
                                              timeout=self.timeout)
                summary = summarize(samples, node)
                reading = Reading(at=self._clock(), count=summary.count, max_value=summary.max_value,
                                  own=summary.own)
            except QueryFailed as exc:
                now = self._clock()
                since = last.failing_since if last is not None and last.error is not None else now
                reading = Reading(at=now, error=exc.problem, failing_since=since)
        self._readings[key] = reading
        return reading

    def forget(self, gate: str, node: str) -> None:
        """The node left its soak: its readings mean nothing for the next one."""
        self._readings.pop((gate, node), None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
