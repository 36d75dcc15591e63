"""Shared fixtures. The integration tier runs against one real control plane per test session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster
    from gate.kube.client import KubeClient

REPO = Path(__file__).resolve().parent.parent

# A test run started as a `&` job of a non-interactive shell (a script, an agent's shell, some CI
# runners) inherits SIGINT ignored, and an ignored signal stays ignored in every process it starts:
# the tests that press Ctrl-C (`status --watch`, the demo) would send a signal nobody hears, and
# wait. With Python's handler here, the processes the tests start begin with SIGINT's default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def unique(prefix: str) -> str:
    """A DNS-safe name no other test uses: tests isolate themselves by name, not by cluster."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    from gate.api.crd import write_crds
    from gate.devcluster.cluster import DevCluster, NodeSpec

    state = Path(os.environ.get("NODEGATE_TEST_CLUSTER_DIR") or tmp_path_factory.mktemp("devcluster"))
    dev = DevCluster(state)
    dev.up(NodeSpec(10, {"nodegate.dev/pool": "test"}), job_seconds=0.5, progress=lambda m: None)
    crds = write_crds(tmp_path_factory.mktemp("crds"))
    files = [arg for crd in crds for arg in ("-f", str(crd))]
    subprocess.run([kubectl_path(), "--kubeconfig", str(dev.kubeconfig), "apply", *files],
                   check=True, capture_output=True)
    subprocess.run([kubectl_path(), "--kubeconfig", str(dev.kubeconfig), "wait", "--for=condition=established",
                    "crd/nodegates.nodegate.io", "crd/deploymentpolicies.nodegate.io"], check=True, capture_output=True)
    try:
        yield dev
    finally:
        dev.down(quiet=True)
        if not os.environ.get("NODEGATE_TEST_CLUSTER_DIR"):
            shutil.rmtree(state, ignore_errors=True)


def kubectl_path() -> str:
    from gate.devcluster.build import binary_paths

    return str(binary_paths(("kubernetes",))["kubectl"])


class Kubectl:
    """kubectl against the test cluster, as admin or as another user (`as_user`)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def run(self, *args: str, stdin: str | None = None, as_user: str | None = None,
            groups: tuple[str, ...] = (), check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_path(), "--kubeconfig", str(self.kubeconfig)]
        if as_user:
            cmd += ["--as", as_user, *[f"--as-group={g}" for g in groups]]
        proc = subprocess.run([*cmd, *args], input=stdin, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def apply(self, manifest: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", stdin=manifest, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def kubectl(cluster: DevCluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


@pytest.fixture
async def kube(cluster: DevCluster) -> AsyncIterator[KubeClient]:
    client = await cluster.client()
    try:
        yield client
    finally:
        await client.close()


