"""A real Prometheus for the tests, scraping an exporter the test controls.

The fixtures `metrics_exporter` and `prometheus` (registered in tests/integration/conftest.py, one of
each per test session) give a test a running Prometheus (`gate/devcluster/prometheus.py`, the binary
built from the Go module proxy) that scrapes `metrics_exporter` every second and evaluates
`NODE_ALERT_RULES` every second. A test sets a node's series on the exporter and then waits until
Prometheus answers with it:

    metrics_exporter.set("gpu_xid_errors", {"node": "n1"}, 3)   # the next scrape serves it
    metrics_exporter.unhealthy("n1")                              # ALERTS{alertname="NodeUnhealthy", node="n1"} fires
    metrics_exporter.healthy("n1")                                # ... and resolves
    metrics_exporter.remove("gpu_xid_errors", {"node": "n1"})    # the series goes stale

Tests share the session's exporter, so each uses node names of its own (`tests.conftest.unique`).
The exporter is a real aiohttp server on its own thread and event loop: it answers scrapes while a
test blocks its own loop or runs synchronously.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

# The rules the session's Prometheus evaluates. `NodeUnhealthy` fires for every series of
# `nodegate_test_unhealthy` above 0 (`exporter.unhealthy(node)`) and carries its `node` label;
# `GpuXidErrors` fires for every node whose `gpu_xid_errors` is above 0. `for: 0s`: firing at the first
# evaluation that sees the series, no pending phase.
UNHEALTHY_METRIC = "nodegate_test_unhealthy"
NODE_ALERT = "NodeUnhealthy"
XID_ALERT = "GpuXidErrors"
NODE_ALERT_RULES: dict[str, Any] = {
    "groups": [{
        "name": "nodegate-test",
        "interval": "1s",
        "rules": [
            {"alert": NODE_ALERT, "expr": f"{UNHEALTHY_METRIC} > 0", "for": "0s",
             "labels": {"severity": "critical"},
             "annotations": {"summary": "node {{ $labels.node }} marked unhealthy"}},
            {"alert": XID_ALERT, "expr": "gpu_xid_errors > 0", "for": "0s", "labels": {"severity": "critical"}},
        ],
    }],
}
HANG_GUARD = 60.0  # seconds: a wait on Prometheus that takes this long is a hang, not a slow machine


def _labels_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsExporter:
    """An HTTP server whose `GET /metrics` serves exactly the series the test set (Prometheus text
    format, every metric a gauge). Thread-safe: the test writes, the server's thread reads."""

    def __init__(self) -> None:
        self._series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._lock = threading.Lock()
        self._scrapes = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="metrics-exporter", daemon=True)
        self.port = 0

    # -- the test's side ----------------------------------------------------------------------------

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        """Serve `name{labels} value` from the next scrape on (replacing that series' value)."""
        with self._lock:
            self._series.setdefault(name, {})[_labels_key(labels)] = value

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Stop serving one series of `name` (or all of them): Prometheus marks it stale at the next scrape."""
        with self._lock:
            if labels is None:
                self._series.pop(name, None)
            else:
                self._series.get(name, {}).pop(_labels_key(labels), None)

    def unhealthy(self, node: str) -> None:
        """Make the `NodeUnhealthy` alert fire for `node` (its series `nodegate_test_unhealthy` = 1)."""
        self.set(UNHEALTHY_METRIC, {"node": node}, 1)

    def healthy(self, node: str) -> None:
        """Resolve `node`'s `NodeUnhealthy` alert (the series is no longer served)."""
        self.remove(UNHEALTHY_METRIC, {"node": node})

    @property
    def scrapes(self) -> int:
        """How many times `/metrics` has been served."""
        with self._lock:
            return self._scrapes

    def render(self) -> str:
        """The exposition text of what is set now."""
        lines = []
        with self._lock:
            for name in sorted(self._series):
                lines.append(f"# TYPE {name} gauge")
                for key, value in sorted(self._series[name].items()):
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}")
        return "\n".join(lines) + "\n"

    # -- the server ---------------------------------------------------------------------------------

    @property
    def target(self) -> str:
        """`host:port`, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"

    async def _metrics(self, request: web.Request) -> web.Response:
        text = self.render()
        with self._lock:
            self._scrapes += 1
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Exposition": "text/plain; version=0.0.4"})

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A socket bound here, so its port is known without asking the site for its server.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock).start()
        return int(sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


def wait_for(check: Callable[[], bool], what: str, *, timeout: float = HANG_GUARD) -> None:
    """Poll `check` until it holds; fail naming `what` after `timeout` seconds (a hang guard only)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def exporter_session() -> Iterator[MetricsExporter]:
    """The body of the `metrics_exporter` fixture: a started exporter, stopped at the end."""
    exporter = MetricsExporter()
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()


def prometheus_session(state: Path, exporter: MetricsExporter) -> Iterator[str]:
    """The body of the `prometheus` fixture: the URL of a ready Prometheus that scrapes `exporter` and
    evaluates `NODE_ALERT_RULES`, in a process table of its own under `state`; stopped at the end."""
    from gate.devcluster.processes import ProcessTable
    from gate.devcluster.prometheus import start_prometheus

    procs = ProcessTable(state)
    try:
        port = start_prometheus(procs, [exporter.target], rules={"node-alerts.yml": NODE_ALERT_RULES},
                                progress=lambda m: None)
        # Ready is not yet scraped: wait for a first scrape so that a test's first query is meaningful.
        seen = exporter.scrapes
        wait_for(lambda: exporter.scrapes > seen, "Prometheus to scrape the exporter")
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop_all()
