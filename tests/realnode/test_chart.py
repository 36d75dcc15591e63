"""`helm install` of the chart with NodeGate's real image: the operator and the webhook run as pods on
real nodes, not as processes of this machine. A real node that joins under a readinessTaint gate is
tainted by the webhook pod as it registers, and released by the operator pod once its package passed.

The out-of-cluster webhook and operator of the other real-node tests are stopped meanwhile (both
would claim the same webhook configurations), and started again afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gate.api import keys
from gate.devcluster.build import binary_paths
from gate.devcluster.cluster import RealNodeSpec
from gate.kube.client import NODES
from gate.testing.watcher import InvariantWatcher
from tests.conftest import REPO
from tests.realnode.conftest import POOL_LABEL, RealCluster, first_version_of

# The first test of the tier builds what is missing (node root, images): minutes from a cold cache.
pytestmark = pytest.mark.timeout(1800)

NAMESPACE = "nodegate-chart"
JOINING = "real-node-2"


def helm(real: RealCluster, *args: str, check: bool = True) -> str:
    import subprocess

    proc = subprocess.run([str(binary_paths(("helm",))["helm"]), "--kubeconfig", str(real.dev.kubeconfig), *args],
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {proc.stderr or proc.stdout}")
    return proc.stdout


@pytest.fixture
def chart(real_nodes: RealCluster) -> Iterator[RealCluster]:
    real = real_nodes
    restart = real.services_running()
    if restart:
        real.stop_services()
    repository, digest = real.images["nodegate"].split("@")
    # The chart binds the catalog's sysctl-tuning to its published repository; this cluster runs the
    # one built here, so the release binds that, as a cluster with its own mirror would.
    sysctl = real.images["sysctl-tuning"].split("@")[0]
    values = {
        "image": {"repository": repository, "digest": digest},
        "operator": {"replicas": 1, "pollSeconds": 2},
        "webhook": {"replicas": 1, "imagePolicy": {"packages": {"sysctl-tuning": [sysctl]}}},
    }
    real.kubectl.run("create", "namespace", NAMESPACE)
    # Package pods run privileged in NodeGate's namespace (docs/install.md).
    real.kubectl.run("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(values, file)
            file.flush()
            helm(real, "install", "nodegate", str(REPO / "charts" / "nodegate"), "-n", NAMESPACE,
                 "--values", file.name, "--wait", "--timeout", "5m")
        yield real
    finally:
        helm(real, "uninstall", "nodegate", "-n", NAMESPACE, "--wait", "--timeout", "3m", check=False)
        real.kubectl.run("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
        if restart:
            real.start_services()


def readiness_gate(name: str, image: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "join"}}, "readinessTaint": True,
                 "interruptionBudget": {"count": 1},
                 "packages": {"sysctl-tuning": {"version": "1.0.0", "image": image, "interrupt": {"type": "none"},
                                                "uninstall": {"enabled": True}}}},
    })


async def test_the_chart_runs_on_real_nodes_and_its_pods_release_a_joining_node(
        chart: RealCluster, gate_name: str) -> None:
    real = chart
    pods = json.loads(real.kubectl.run("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    running = {p["metadata"]["labels"].get("app.kubernetes.io/component"): p for p in pods
               if p["status"].get("phase") == "Running"}
    for component in ("operator", "webhook"):
        pod = running.get(component)
        assert pod is not None, f"no running {component} pod: {[p['metadata']['name'] for p in pods]}"
        assert pod["spec"]["nodeName"] in real.nodes
        assert pod["spec"]["containers"][0]["image"] == real.images["nodegate"]
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    max_map_count = Path("/proc/sys/vm/max_map_count").read_text()
    real.kubectl.apply(readiness_gate(gate_name, real.images["sysctl-tuning"]))
    try:
        async with await real.dev.client() as kube:
            _, since = await kube.list(NODES)
            watcher = InvariantWatcher(kube, namespace=NAMESPACE)
            await watcher.start()
            created = asyncio.create_task(first_version_of(kube, JOINING, since, 300.0))
            await asyncio.to_thread(real.dev.add_real_nodes, RealNodeSpec(3, {POOL_LABEL: "join"}),
                                    progress=real.progress)
            node = await created
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            # No --register-with-taints: only the webhook pod can have put it there, at creation.
            assert keys.READINESS_TAINT_KEY in taints, node["spec"]
            await asyncio.to_thread(real.wait_complete, gate_name, 600.0)

            def released() -> bool:
                out = real.kubectl.run("get", "node", JOINING, "-o", "jsonpath={.spec.taints[*].key}").stdout
                return keys.READINESS_TAINT_KEY not in out

            await asyncio.to_thread(real.wait, "the readiness taint to go from the joining node", released, 120.0)
            assert real.node_sh(JOINING, "sysctl -n net.core.somaxconn").stdout.strip() == "8192"
            report = await watcher.stop()
        assert not report.violations, report.summary()
        assert report.coverage.taint_lifts_judged >= 1, report.summary()
    finally:
        with contextlib.suppress(AssertionError):
            await asyncio.to_thread(real.delete_gate, gate_name, 300.0)
        await asyncio.to_thread(real.dev.remove_real_node, JOINING)
        Path("/proc/sys/vm/swappiness").write_text(swappiness)
        Path("/proc/sys/vm/max_map_count").write_text(max_map_count)
