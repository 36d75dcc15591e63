"""`nodegate status --watch` ends when its API server is gone, saying so, as `kubectl get -w` does.

A control plane of its own (etcd, the API server, the CRDs; no nodes, no operator): the test stops its
API server, which the session's cluster cannot spare.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate.devcluster import services
from gate.devcluster.cluster import DevCluster
from tests.processes import HANG_GUARD, group_process, read_until


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[DevCluster]:
    import asyncio

    cluster = DevCluster(tmp_path / "cluster")
    try:
        cluster.up(None, progress=lambda message: None)
        asyncio.run(services.install_crds(cluster))
        yield cluster
    finally:
        cluster.down(quiet=True)


def test_a_watch_whose_api_server_stops_says_so_and_exits_2(own_cluster: DevCluster) -> None:
    argv = [sys.executable, "-m", "gate.cli.main", "status", "--watch", "--kubeconfig", str(own_cluster.kubeconfig)]
    with group_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as watch:
        first = read_until(watch, lambda line: line.startswith("--- "))  # the first screen: it follows
        server = f"https://127.0.0.1:{own_cluster.ports()['apiserver']}"
        own_cluster.stop_process("kube-apiserver")
        rest, err = watch.communicate(timeout=HANG_GUARD)  # a hang guard: the watch must end on its own
    assert watch.returncode == 2, "".join(first) + rest + err
    lines = err.strip().splitlines()
    assert f"warning: the watch is retrying: cannot reach the Kubernetes API server at {server} (" in err, err
    assert lines[-1].startswith("error: lost the API server: 6 attempts in a row to watch "), err
    assert f"failed, the last with: cannot reach the Kubernetes API server at {server} (" in lines[-1], err
    assert all(line.startswith(("warning: the watch is retrying: ", "the API server at ")) for line in lines[:-1]), err
    assert "Traceback" not in err
