"""Integration tier: markers, and the admission webhook shared by the admission and operator tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from gate.api.keys import READINESS_TAINT_KEY
from tests.conftest import unique

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster
    from gate.kube.client import KubeClient
    from tests.prometheus import MetricsExporter

TAINT = {"key": READINESS_TAINT_KEY, "effect": "NoSchedule"}
OPERATOR_SERVICE_ACCOUNT = {"kind": "ServiceAccount", "name": "nodegate-operator", "namespace": "nodegate-system"}


def plain_node(name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, object]:
    """A Node without kwok's annotation: nothing but the API server and the webhook touch it."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints} if taints is not None else {}}


@asynccontextmanager
async def readiness_holder(kube: KubeClient, labels: dict[str, str]) -> AsyncIterator[str]:
    """A paused readinessTaint NodeGate over the nodes with `labels`, while inside: it keeps their readiness
    taint on (the operator lifts the taint of a node that no readinessTaint gate selects) and starts nothing."""
    from gate.kube.client import NODEGATES
    from gate.kube.errors import NotFound

    name = unique("hold")
    await kube.create(NODEGATES, {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
                                  "spec": {"readinessTaint": True, "paused": True,
                                           "nodeSelector": {"matchLabels": labels}}})
    try:
        yield name
    finally:
        with contextlib.suppress(NotFound):  # the test may have deleted it already
            await kube.delete(NODEGATES, name)


@asynccontextmanager
async def cluster_role_for(kube: KubeClient, name: str, user: str, rules: list[dict[str, Any]]) -> AsyncIterator[None]:
    """A ClusterRole with `rules`, bound to `user` and to the operator's ServiceAccount while inside."""
    from gate.kube.client import CLUSTERROLEBINDINGS, CLUSTERROLES

    await kube.create(CLUSTERROLES, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                     "metadata": {"name": name}, "rules": rules})
    await kube.create(CLUSTERROLEBINDINGS, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"},
                     OPERATOR_SERVICE_ACCOUNT]})
    try:
        yield
    finally:
        await kube.delete(CLUSTERROLEBINDINGS, name)
        await kube.delete(CLUSTERROLES, name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@dataclass(frozen=True)
class Webhook:
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def webhook(cluster: DevCluster) -> Iterator[Webhook]:
    from gate.devcluster.services import start_webhook, webhook_port

    start_webhook(cluster, progress=lambda message: None)
    port = webhook_port(cluster)
    assert port is not None
    yield Webhook(port)


@pytest.fixture(scope="session")
def metrics_exporter() -> Iterator[MetricsExporter]:
    """An exporter whose series the test sets (tests/prometheus.py), scraped by `prometheus`."""
    from tests.prometheus import exporter_session

    yield from exporter_session()


@pytest.fixture(scope="session")
def prometheus(metrics_exporter: MetricsExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a real Prometheus scraping `metrics_exporter` every second and evaluating
    `tests.prometheus.NODE_ALERT_RULES` (alerts `NodeUnhealthy`, `GpuXidErrors`) every second."""
    from tests.prometheus import prometheus_session

    yield from prometheus_session(tmp_path_factory.mktemp("prometheus"), metrics_exporter)


SESSION_ENDPOINT = "session"


@pytest.fixture(scope="session")
def prometheus_endpoint(cluster: DevCluster, prometheus: str) -> Iterator[str]:
    """The name (`session`) under which the dev operator knows `prometheus`: what a DeploymentPolicy's
    `health.prometheus.endpoint` names, as an installer's chart value would configure it."""
    from gate.devcluster.services import set_prometheus_endpoints

    set_prometheus_endpoints(cluster, {SESSION_ENDPOINT: prometheus})
    yield SESSION_ENDPOINT
    set_prometheus_endpoints(cluster, {})
