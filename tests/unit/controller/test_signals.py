"""The Prometheus signal reader of soaking nodes: bounded, cached per interval, failures remembered.

A query that gets no answer is a real one (nothing listens on the port). For an answer, a fake
Prometheus (an aiohttp server that answers /api/v1/query): the real Prometheus is exercised by the
integration test of the Prometheus tier.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from gate.api.policy import PrometheusSignal
from gate.controller.signals import SignalReader

T0 = datetime(2026, 12, 4, 5, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def fake_prometheus() -> AsyncIterator[tuple[str, list[str], dict[str, int]]]:
    """A fake Prometheus: `firing` lists the nodes with an alert; `seen` counts queries and the most at once."""
    firing: list[str] = []
    seen = {"queries": 0, "at_once": 0, "peak": 0}

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        seen["queries"] += 1
        seen["at_once"] += 1
        seen["peak"] = max(seen["peak"], seen["at_once"])
        await asyncio.sleep(0.05)
        seen["at_once"] -= 1
        text = str(form["query"])
        result = [{"metric": {"__name__": "ALERTS", "node": n}, "value": [0, "1"]} for n in firing if f'"{n}"' in text]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", firing, seen
    await runner.cleanup()


async def test_a_failed_query_is_an_error_and_its_run_of_failures_is_remembered() -> None:
    clock = Clock()
    reader = SignalReader(interval=15, clock=clock, timeout=2)
    signal = PrometheusSignal(url=f"http://127.0.0.1:{closed_port()}", query='ALERTS{node="$NODE"}')
    try:
        first = await reader.read("g", "n1", signal)
        assert first.error and first.samples == () and first.failing_since == T0
        clock.now = T0 + timedelta(seconds=5)
        assert await reader.read("g", "n1", signal) is first  # within the interval: not asked again
        clock.now = T0 + timedelta(seconds=20)
        second = await reader.read("g", "n1", signal)
        assert second.at == clock.now and second.failing_since == T0  # the same run of failures
        reader.forget("g", "n1")
        clock.now = T0 + timedelta(seconds=21)
        assert (await reader.read("g", "n1", signal)).failing_since == clock.now
    finally:
        await reader.close()


async def test_samples_name_the_series_and_queries_are_bounded(
        fake_prometheus: tuple[str, list[str], dict[str, int]]) -> None:
    url, firing, seen = fake_prometheus
    firing.append("n3")
    reader = SignalReader(interval=15, concurrency=2)
    signal = PrometheusSignal(url=url, query='ALERTS{node="$NODE"}')
    try:
        readings = await asyncio.gather(*(reader.read("g", f"n{i}", signal) for i in range(8)))
    finally:
        await reader.close()
    assert [bool(r.samples) for r in readings] == [i == 3 for i in range(8)]
    assert 'node="n3"' in readings[3].samples[0] and all(r.error is None for r in readings)
    assert seen["queries"] == 8 and seen["peak"] <= 2
