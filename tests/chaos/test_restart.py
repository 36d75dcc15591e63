"""DevCluster.restart: etcd and kube-apiserver come back on their ports with their data, and a watch
resumed across an API server restart expires (410 Gone), which is what the chaos runs rely on."""

from __future__ import annotations

import asyncio
import signal

import pytest

from gate.devcluster.cluster import DevCluster
from gate.kube.client import NAMESPACES, KubeClient
from gate.kube.errors import Gone
from tests.conftest import unique


async def test_etcd_killed_and_restarted_keeps_its_data_and_port(chaos_cluster: DevCluster,
                                                                 chaos_kube: KubeClient) -> None:
    name = unique("kept")
    await chaos_kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    before = chaos_cluster.processes()["etcd"]
    after = await asyncio.to_thread(chaos_cluster.restart, "etcd", sig=signal.SIGKILL)
    assert after.pid != before.pid and after.argv == before.argv and not before.alive()
    assert (await chaos_kube.get(NAMESPACES, name))["metadata"]["name"] == name
    await chaos_kube.delete(NAMESPACES, name)


async def test_a_watch_resumed_across_an_api_server_restart_expires(chaos_cluster: DevCluster,
                                                                    chaos_kube: KubeClient) -> None:
    _, rv = await chaos_kube.list(NAMESPACES)
    name = unique("after")  # a write after the list: the resumed revision is older than the new cache
    await chaos_kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    server = chaos_cluster.server
    await asyncio.to_thread(chaos_cluster.restart, "kube-apiserver", sig=signal.SIGKILL)
    assert chaos_cluster.server == server  # same port: every kubeconfig handed out still works
    client = await chaos_cluster.client()
    try:
        with pytest.raises(Gone):
            async for _ in client.watch(NAMESPACES, resource_version=rv, timeout_seconds=5):
                pass
        assert (await client.get(NAMESPACES, name))["metadata"]["name"] == name
        await client.delete(NAMESPACES, name)
    finally:
        await client.close()
