"""The operator's health and metrics endpoints, as controller-runtime's manager serves them.

`/healthz` says the process runs; `/readyz` says the leader's caches are synced (a standby waiting for
the lease is ready too); `/metrics` is Prometheus' text, with the API client's request counts caught
up when scraped rather than after every reconcile.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gate.controller.metrics import OperatorMetrics
from gate.controller.settings import OperatorSettings
from gate.kube.client import KubeClient


class Health:
    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics,
                 leading: Callable[[], bool], synced: Callable[[], bool]) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.leading = leading
        self.synced = synced
        self._requests_reported: dict[tuple[str, str], int] = {}  # what api_requests_by counted so far

    def sync_request_metrics(self) -> None:
        """The client counts its requests; the metrics catch up when scraped, not after every reconcile."""
        self.metrics.api_requests.set(self.client.requests)
        if self.client.fence is not None:
            self.metrics.writes_refused.set(self.client.fence.refused)
        for kind, count in self.client.requests_by.items():
            seen = self._requests_reported.get(kind, 0)
            if count != seen:
                self.metrics.api_requests_by.labels(*kind).inc(count - seen)
                self._requests_reported[kind] = count

    async def serve(self) -> web.AppRunner | None:
        if not self.settings.metrics_port:
            return None
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            self.sync_request_metrics()
            # From the leader's clock, as /readyz: a leader past its renew deadline is none, even before
            # its renewal loop has noticed (a process that was frozen).
            self.metrics.leader.set(1 if self.leading() else 0)
            body = generate_latest(self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            # A standby is ready too: it is healthy and waiting for the lease.
            if self.leading() and not self.synced():
                return web.Response(status=503, text="caches not synced")
            return web.Response(text="leader" if self.leading() else "standby")

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.metrics_host, self.settings.metrics_port)
        await site.start()
        return runner
