"""`nodegate status [GATE] [-w]`: what a rollout is doing, once or live.

Once: one snapshot (`gate.cli.snapshot`), reports built from it (`gate.cli.report`), rendered as rich
in a terminal, plain text in a pipe, or data with `-o`. Live (`--watch`): watch caches of what the
status reads keep it current, as an informer does, and the screen is redrawn whenever they change.

A live status ends on Ctrl-C (exit 130), or when the API server is gone: the caches retry a lost
server a bounded number of times (`WATCH_ATTEMPTS`, with backoff), saying so on stderr, then the
command exits 2 with the reason, as `kubectl get -w` ends when its watch does. A watch that outlived
its cluster would follow nothing forever.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TextIO

from gate.cli import stagepods
from gate.cli.errors import CliError
from gate.cli.kubectx import api_errors, connect
from gate.cli.output import print_data
from gate.cli.render import render_rich, render_text, report_data
from gate.cli.report import GateReport, Snapshot
from gate.cli.snapshot import fetch_snapshot, protected_queries, reports_of
from gate.controller.workloads import workload_fields
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed, Forbidden

PLAIN_INTERVAL = 2.0
# Failed attempts in a row, per cache, before a live status gives up on the API server: with the
# caches' backoff (0.2 s doubling, times 1-2 at random) the last one comes 6 to 12 s after the first.
WATCH_ATTEMPTS = 6


class StatusFeed:
    """Watch caches of what the status reads, and an event set whenever any of it changes."""

    def __init__(self, client: KubeClient, namespace: str, *, give_up_after: int | None = WATCH_ATTEMPTS) -> None:
        from gate.kube.cache import WatchCache

        self.server = client.base_url
        self.changed = asyncio.Event()
        self.gates = WatchCache(client, NODEGATES, give_up_after=give_up_after)
        self.policies = WatchCache(client, POLICIES, give_up_after=give_up_after)
        self.nodes = WatchCache(client, NODES, give_up_after=give_up_after)
        self.pods = WatchCache(client, PODS, namespace=namespace, label_selector=stagepods.SELECTOR,
                               give_up_after=give_up_after)
        self.caches = (self.gates, self.policies, self.nodes, self.pods)
        self.client = client
        self.namespace = namespace
        self.give_up_after = give_up_after
        self.protected: list[WatchCache] = []  # per podNonInterruptLabels of the gates at the start
        self.pods_visible = True
        for cache in self.caches:
            cache.subscribe(lambda kind, obj: self.changed.set())

    async def start(self) -> None:
        await asyncio.gather(self.gates.start(), self.policies.start(), self.nodes.start())
        try:
            await self.pods.start()
        except Forbidden:
            self.pods_visible = False
        # The protected pods of the gates there are now, for which nodes wait for them (a gate created
        # while the status runs is planned without its protected pods until the next run).
        from gate.kube.cache import WatchCache

        for query in protected_queries(self.gates.items()):
            cache = WatchCache(self.client, PODS, label_selector=query, give_up_after=self.give_up_after,
                               transform=workload_fields)
            try:
                await cache.start()
            except Forbidden:
                break
            cache.subscribe(lambda kind, obj: self.changed.set())
            self.protected.append(cache)

    async def stop(self) -> None:
        for cache in (*self.caches, *self.protected):
            await cache.stop()

    def snapshot(self) -> Snapshot:
        return Snapshot(gates=self.gates.items(),
                        policies={p["metadata"]["name"]: p for p in self.policies.items()},
                        nodes=self.nodes.items(), pods=self.pods.items(), pods_visible=self.pods_visible,
                        workloads=[p for c in self.protected for p in c.items()], namespace=self.namespace)

    def failing(self) -> ConnectionFailed | ApiError | None:
        """Why a cache cannot reach the API server right now (it is retrying), or None."""
        return next((c.last_error for c in self.caches if c.last_error is not None), None)

    def check(self) -> None:
        """Raise a CliError once a cache gave up on the API server: the status would no longer change."""
        for cache in self.caches:
            if cache.lost is not None:
                from gate.cli.kubectx import explain

                raise CliError(f"lost the API server: {cache.failures} attempts in a row to watch "
                               f"{cache.resource.plural} failed, the last with: {explain(cache.lost, self.server)}")

    async def wait(self, timeout: float) -> None:
        """Until something changed or `timeout` passed; then `check()`."""
        # asyncio.timeout, not asyncio.wait_for: in Python 3.11 wait_for returns the result when the
        # event fires in the same turn as a cancellation of the caller (Ctrl-C), and the cancellation
        # is lost.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()
        self.changed.clear()
        self.check()


class ConnectionNotes:
    """Says on stderr when the API server stops answering a live status, and when it answers again."""

    def __init__(self, feed: StatusFeed) -> None:
        self.feed = feed
        self.down = False

    def update(self) -> None:
        failing = self.feed.failing()
        if failing is not None and not self.down:
            from gate.cli.kubectx import explain

            print(f"warning: the watch is retrying: {explain(failing, self.feed.server)}", file=sys.stderr, flush=True)
        elif failing is None and self.down:
            print(f"the API server at {self.feed.server} answers again", file=sys.stderr, flush=True)
        self.down = failing is not None


def use_rich(stream: TextIO | None = None) -> bool:
    return (stream or sys.stdout).isatty()


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch and args.output != "text":
        raise CliError("--watch shows the live status as text; leave out -o")
    return asyncio.run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        await warn_webhook_problems(client)
        if args.watch:
            return await watch_status(client, args.namespace, args.gate)
        reports = reports_of(await fetch_snapshot(client, args.namespace, args.gate), args.gate)
    if args.output != "text":
        data = [report_data(r) for r in reports]
        print_data(data[0] if args.gate else {"items": data}, args.output)
    elif use_rich():
        from rich.console import Console

        Console().print(render_rich(reports))
    else:
        sys.stdout.write(render_text(reports))
    return 0


async def warn_webhook_problems(client: KubeClient) -> None:
    """Say on stderr when the API server cannot call NodeGate's admission webhooks (gate.cli.webhook_health):
    every write to a NodeGate would fail, whatever the rollout's status says."""
    from gate.cli.webhook_health import webhook_problems

    for problem in await webhook_problems(client):
        print(f"warning: {problem}", file=sys.stderr, flush=True)


async def watch_status(client: KubeClient, namespace: str, gate: str | None, *,
                       until: Callable[[list[GateReport]], bool] | None = None, tick: float = 1.0) -> int:
    """Keep the status on screen, current, until Ctrl-C (or `until` holds, or the API server is gone).
    A terminal gets a live rich view; a pipe gets a new plain rendering whenever something other than
    the clock changed."""
    feed = StatusFeed(client, namespace)
    notes = ConnectionNotes(feed)
    caches_log = logging.getLogger("gate.kube.cache")
    if not caches_log.hasHandlers():
        # Without logging set up, Python would print the caches' warnings, one per cache and attempt:
        # the notes say it once.
        caches_log.addHandler(logging.NullHandler())
    with api_errors(client.base_url):
        await feed.start()
    try:
        reports = reports_of(feed.snapshot(), gate)
        if gate is not None and not reports:
            raise CliError(f"no NodeGate named {gate} (`kubectl get ng` lists them)")
        if use_rich():
            from rich.live import Live

            with Live(render_rich(reports), refresh_per_second=4, auto_refresh=False) as live:
                while until is None or not until(reports):
                    await feed.wait(tick)
                    notes.update()
                    reports = reports_of(feed.snapshot(), gate)
                    live.update(render_rich(reports), refresh=True)
        else:
            last = ""
            while True:
                key = render_text(reports, durations=False)
                if key != last:
                    stamp = datetime.now().strftime("%H:%M:%S")
                    sys.stdout.write(f"--- {stamp}\n{render_text(reports)}")
                    sys.stdout.flush()
                    last = key
                if until is not None and until(reports):
                    break
                # A pipe gets at most one rendering per `PLAIN_INTERVAL`: a rollout changes many
                # times a second, a log reader wants the picture every few seconds.
                await asyncio.sleep(PLAIN_INTERVAL)
                await feed.wait(tick)
                notes.update()
                reports = reports_of(feed.snapshot(), gate)
    finally:
        await feed.stop()
    return 0
