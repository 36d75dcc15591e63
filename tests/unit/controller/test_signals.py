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
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from gate.api.policy import PrometheusSignal
from gate.controller.endpoints import EndpointBook
from gate.controller.signals import SignalReader

T0 = datetime(2026, 12, 4, 5, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def book(tmp: Path, **urls: str) -> EndpointBook:
    path = tmp / "endpoints.yaml"
    path.write_text(yaml.safe_dump({name: {"url": url} for name, url in urls.items()}))
    return EndpointBook(str(path))


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
        if "secrets" in text:  # a query that reaches past the node: other series, only counted
            result = [{"metric": {"__name__": "secret", "key": f"k{i}"}, "value": [0, str(i)]} for i in range(4)]
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


async def test_a_failed_query_is_an_error_and_its_run_of_failures_is_remembered(tmp_path: Path) -> None:
    clock = Clock()
    reader = SignalReader(book(tmp_path, main=f"http://127.0.0.1:{closed_port()}"), interval=15, clock=clock,
                          timeout=2)
    signal = PrometheusSignal(endpoint="main", query='ALERTS{node="$NODE"}')
    try:
        first = await reader.read("g", "n1", signal)
        assert first.error and first.count == 0 and first.failing_since == T0
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


async def test_samples_are_summarized_to_the_nodes_own_series_and_queries_are_bounded(
        fake_prometheus: tuple[str, list[str], dict[str, int]], tmp_path: Path) -> None:
    url, firing, seen = fake_prometheus
    firing.append("n3")
    reader = SignalReader(book(tmp_path, main=url), interval=15, concurrency=2)
    signal = PrometheusSignal(endpoint="main", query='ALERTS{node="$NODE"}')
    try:
        readings = await asyncio.gather(*(reader.read("g", f"n{i}", signal) for i in range(8)))
        wide = await reader.read("other-gate", "n1", PrometheusSignal(endpoint="main", query="secrets"))
    finally:
        await reader.close()
    assert [r.count for r in readings] == [int(i == 3) for i in range(8)]
    assert readings[3].own == ('ALERTS{node="n3"} => 1',) and all(r.error is None for r in readings)
    assert seen["queries"] == 9 and seen["peak"] <= 2
    # Another series than the node's is counted and its value may be the greatest; its labels never kept.
    assert (wide.count, wide.max_value, wide.own) == (4, "3", ())


async def test_an_endpoint_the_operator_does_not_know_is_never_asked(
        fake_prometheus: tuple[str, list[str], dict[str, int]], tmp_path: Path) -> None:
    url, _, seen = fake_prometheus
    reader = SignalReader(book(tmp_path, main=url), interval=15)
    try:
        reading = await reader.read("g", "n1", PrometheusSignal(endpoint="other", query="up"))
    finally:
        await reader.close()
    assert reading.error is not None and "no endpoint named 'other'" in reading.error and "main" in reading.error
    assert seen["queries"] == 0


def test_the_endpoints_file_is_read_again_when_it_changes_and_a_broken_one_keeps_the_last_good(
        tmp_path: Path) -> None:
    endpoints = book(tmp_path, main="http://127.0.0.1:9090")
    assert endpoints.names() == {"main"}
    path = tmp_path / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"main": {"url": "http://127.0.0.1:9091"}, "second": {"url": "https://p:9090"}}))
    found = endpoints.get("main")
    assert endpoints.names() == {"main", "second"} and found is not None and found.url.endswith(":9091")
    path.write_text("main: {url: ftp://nowhere}\n")  # refused as a whole: the last good stays
    assert endpoints.names() == {"main", "second"}
    path.unlink()
    assert endpoints.names() == frozenset() and EndpointBook().names() == frozenset()


async def test_an_endpoints_token_is_sent_to_it_alone_and_a_redirect_is_not_followed(tmp_path: Path) -> None:
    """The bearer token is read from its file at each query and sent as Authorization; an endpoint that
    redirects is a failed reading (the token would follow), and a CA file that cannot be read too."""
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        seen.append(f"{request.path} {request.headers.get('Authorization', '-')}")
        if request.path.startswith("/moved"):
            raise web.HTTPFound("http://127.0.0.2:9/api/v1/query")
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    app = web.Application()
    app.router.add_post("/{tail:.*}", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    path = tmp_path / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"main": {"url": base, "bearerTokenFile": str(token)},
                                    "moved": {"url": f"{base}/moved", "bearerTokenFile": str(token)},
                                    "badca": {"url": base, "caFile": str(tmp_path / "missing.crt")}}))
    reader = SignalReader(EndpointBook(str(path)), interval=15, timeout=2)
    signal = PrometheusSignal(endpoint="main", query="up")
    try:
        assert (await reader.read("g", "n1", signal)).error is None
        token.write_text("r0tated")
        assert (await reader.read("g", "n2", signal)).error is None
        moved = await reader.read("g-moved", "n1", PrometheusSignal(endpoint="moved", query="up"))
        badca = await reader.read("g-badca", "n1", PrometheusSignal(endpoint="badca", query="up"))
    finally:
        await reader.close()
        await runner.cleanup()
    assert seen == ["/api/v1/query Bearer s3cret", "/api/v1/query Bearer r0tated",
                    "/moved/api/v1/query Bearer r0tated"]
    assert moved.error is not None and "redirect, which is not followed" in moved.error
    assert badca.error is not None and "cannot be read" in badca.error
