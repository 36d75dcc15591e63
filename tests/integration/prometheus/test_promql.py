"""gate/controller/promql.py against a real Prometheus that scrapes an exporter the test controls.

Each test uses node names of its own: the session's exporter and Prometheus are shared. Waits poll
Prometheus until the answer changes (a scrape and a rule evaluation happen every second); their
timeout is a hang guard, never an assertion on time.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from gate.controller.endpoints import PrometheusEndpoint
from gate.controller.promql import QueryFailed, Sample, instant_query, node_query
from gate.devcluster.build import binary_paths
from gate.devcluster.processes import free_port
from tests.conftest import unique
from tests.prometheus import HANG_GUARD, NODE_ALERT, XID_ALERT, MetricsExporter

FIRING = 'ALERTS{alertstate="firing", node="$NODE"}'


def ep(url: str) -> PrometheusEndpoint:
    """The endpoint the operator would be configured with for `url` (named `session`)."""
    return PrometheusEndpoint(name="session", url=url)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def answer_until(session: aiohttp.ClientSession, url: str, query: str,
                       done: Callable[[list[Sample]], bool], what: str) -> list[Sample]:
    """Ask `query` until its samples satisfy `done`; those samples (fails after the hang guard)."""
    deadline = time.monotonic() + HANG_GUARD
    while True:
        samples = await instant_query(session, ep(url), query)
        if done(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {query!r} still answers {[s.describe() for s in samples]}")
        await asyncio.sleep(0.2)


def test_the_binary_is_the_pinned_prometheus_release() -> None:
    out = subprocess.run([str(binary_paths(("prometheus",))["prometheus"]), "--version"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert "prometheus, version 3.16.0" in out.stdout + out.stderr


async def test_a_query_returns_the_series_the_exporter_serves_once_scraped(
        prometheus: str, metrics_exporter: MetricsExporter, session: aiohttp.ClientSession) -> None:
    node = unique("xid")
    query = node_query('gpu_xid_errors{node="$NODE"}', node)
    assert await instant_query(session, ep(prometheus), query) == []  # nothing served for it yet

    metrics_exporter.set("gpu_xid_errors", {"node": node}, 3)
    samples = await answer_until(session, prometheus, query, bool, "the exporter's series")
    assert [s.value for s in samples] == ["3"]
    assert samples[0].labels == {"__name__": "gpu_xid_errors", "node": node,
                                 "job": "nodegate-test", "instance": metrics_exporter.target}

    metrics_exporter.set("gpu_xid_errors", {"node": node}, 5)
    samples = await answer_until(session, prometheus, query, lambda s: [x.value for x in s] != ["3"], "the new value")
    assert [s.value for s in samples] == ["5"]

    # A series the exporter stops serving is stale at the next scrape: no five-minute lookback.
    metrics_exporter.remove("gpu_xid_errors", {"node": node})
    assert await answer_until(session, prometheus, query, lambda s: not s, "the series to go stale") == []


async def test_a_healthy_node_answers_no_samples_while_an_unhealthy_one_does(
        prometheus: str, metrics_exporter: MetricsExporter, session: aiohttp.ClientSession) -> None:
    sick, well = unique("sick"), unique("well")
    metrics_exporter.set("gpu_xid_errors", {"node": sick}, 2)
    metrics_exporter.set("gpu_xid_errors", {"node": well}, 0)
    signal = 'gpu_xid_errors{node="$NODE"} > 0'
    sick_answer = await answer_until(session, prometheus, node_query(signal, sick), bool, "the unhealthy node")
    assert [s.labels["node"] for s in sick_answer] == [sick]
    # Both series were in the same scrape, so the healthy one is there too, and the signal is empty.
    present = await instant_query(session, ep(prometheus), node_query('gpu_xid_errors{node="$NODE"}', well))
    assert [s.value for s in present] == ["0"]
    assert await instant_query(session, ep(prometheus), node_query(signal, well)) == []


async def test_an_alert_fires_for_the_node_the_test_marks_and_resolves_after(
        prometheus: str, metrics_exporter: MetricsExporter, session: aiohttp.ClientSession) -> None:
    node, other = unique("alert"), unique("calm")
    metrics_exporter.set("nodegate_test_unhealthy", {"node": other}, 0)
    metrics_exporter.unhealthy(node)

    firing = await answer_until(session, prometheus, node_query(FIRING, node), bool, "the alert to fire")
    assert [(s.labels["alertname"], s.labels["severity"], s.value) for s in firing] == [(NODE_ALERT, "critical", "1")]
    assert await instant_query(session, ep(prometheus), node_query(FIRING, other)) == []

    metrics_exporter.healthy(node)
    resolved = await answer_until(session, prometheus, node_query(FIRING, node), lambda s: not s, "its resolution")
    assert resolved == []


async def test_the_xid_alert_fires_from_the_series_alone(
        prometheus: str, metrics_exporter: MetricsExporter, session: aiohttp.ClientSession) -> None:
    node = unique("gpu")
    metrics_exporter.set("gpu_xid_errors", {"node": node}, 1)
    firing = await answer_until(session, prometheus, node_query(FIRING, node), bool, "the XID alert to fire")
    assert {s.labels["alertname"] for s in firing} == {XID_ALERT}
    metrics_exporter.set("gpu_xid_errors", {"node": node}, 0)
    await answer_until(session, prometheus, node_query(FIRING, node), lambda s: not s, "the XID alert to resolve")


async def test_scalar_string_and_range_results_are_samples(prometheus: str, metrics_exporter: MetricsExporter,
                                                           session: aiohttp.ClientSession) -> None:
    assert await instant_query(session, ep(prometheus), "1 + 1") == [Sample(value="2")]
    assert await instant_query(session, ep(prometheus), '"hello"') == [Sample(value="hello")]
    node = unique("range")
    metrics_exporter.set("gpu_xid_errors", {"node": node}, 7)
    query = node_query('gpu_xid_errors{node="$NODE"}[1m]', node)
    samples = await answer_until(session, prometheus, query, bool, "a range of the series")
    assert [s.value for s in samples] == ["7"] and samples[0].labels["node"] == node


async def test_a_query_prometheus_cannot_parse_fails_naming_its_error(prometheus: str,
                                                                      session: aiohttp.ClientSession) -> None:
    with pytest.raises(QueryFailed) as failed:
        await instant_query(session, ep(prometheus), "sum(gpu_xid_errors")
    assert failed.value.endpoint == "session" and failed.value.query == "sum(gpu_xid_errors"
    assert failed.value.problem.startswith("bad_data: ")
    assert "parse error" in failed.value.problem


async def test_an_unreachable_server_fails_the_query(session: aiohttp.ClientSession) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens there
    with pytest.raises(QueryFailed, match=r"did not answer the query 'up'") as failed:
        await instant_query(session, ep(url), "up")
    assert failed.value.endpoint == "session" and url.removeprefix("http://") in failed.value.problem


async def test_a_server_that_is_not_prometheus_fails_the_query(metrics_exporter: MetricsExporter,
                                                               session: aiohttp.ClientSession) -> None:
    url = f"http://{metrics_exporter.target}"  # an HTTP server without /api/v1/query
    with pytest.raises(QueryFailed) as failed:
        await instant_query(session, ep(url), "up")
    assert failed.value.problem == "HTTP 404 with a body that is not JSON"
