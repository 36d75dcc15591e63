"""The chaos tier: a control plane of its own, because these tests restart kube-apiserver and etcd.

The session's control plane is shared by every other tier; restarting its API server under their
webhook and operator would make their tests depend on ours. This one is started once for the
directory (a few seconds on a warm cache) and stopped after it. It runs no webhook, and operator
replicas only while a test drives them, so the planted-violation tests can write what they like to
its nodes.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from gate.devcluster.cluster import DevCluster
from gate.devcluster.services import install_crds
from gate.kube.client import KubeClient


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="package")  # stopped once this directory is done, not idling through the rest
def chaos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    state = tmp_path_factory.mktemp("chaos-cluster")
    cluster = DevCluster(state)
    # Stages of half a second, as the rest of the suite: a node's round (three stages, a reboot, two
    # checks) takes a few seconds, so a short run lasts long enough to be disturbed several times.
    cluster.up(job_seconds=0.5, progress=lambda m: None)
    asyncio.run(install_crds(cluster))
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
async def chaos_kube(chaos_cluster: DevCluster) -> AsyncIterator[KubeClient]:
    client = await chaos_cluster.client()
    try:
        yield client
    finally:
        await client.close()
