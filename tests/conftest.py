"""Shared fixtures. The integration tier runs against one real control plane per test session (per xdist worker)."""

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


# `make test` runs the suite in pytest-xdist workers (`-n`): the tests wait on control planes and nodes
# far more than they use the CPU. A session fixture is one per worker, so every worker that runs a test
# of the shared control plane starts its own (`cluster` below; a few seconds on a warm cache), and a
# test may run in any worker: tests isolate themselves by name, never by what ran before them. What one
# worker must run whole, in order, is a tier with a control plane of its own (chaos, realnode: their
# fixtures build it once for the directory); every other file is a unit of its own. Units go out in
# TIER_ORDER, the longest tier first (the real-node tier starts at once), and the pure files fill the
# end. Without `-n` nothing changes.
#
# The units are the scheduler's scopes, not `xdist_group` marks: `--dist loadgroup` carries a group by
# rewriting each test's node id, which pytest 9.2 no longer lets it do (pytest-dev/pytest-xdist#1386:
# the groups are silently ignored).
WHOLE_TIERS = ("realnode", "chaos")
TIER_ORDER = ("realnode", "chaos", "chart", "integration", "security", "docs", "agent", "unit")


def _tier(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def unit_of(nodeid: str) -> str:
    """The unit of work one xdist worker runs whole: a tier with a control plane of its own, or a file."""
    tier = _tier(nodeid)
    return tier if tier in WHOLE_TIERS else nodeid.split("::")[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the units in the order the workers collected them
    return TierScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # only the order the work goes out in; one process runs in order
        rank = {tier: i for i, tier in enumerate(TIER_ORDER)}
        items.sort(key=lambda item: rank.get(_tier(item.nodeid), len(TIER_ORDER)))


def unique(prefix: str) -> str:
    """A DNS-safe name no other test uses: tests isolate themselves by name, not by cluster."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    from gate.api.crd import write_crds
    from gate.devcluster.cluster import DevCluster, NodeSpec

    kept = os.environ.get("NODEGATE_TEST_CLUSTER_DIR")
    # one state directory per xdist worker (gw0, gw1, ...): each worker runs a control plane of its own
    state = Path(kept) / os.environ.get("PYTEST_XDIST_WORKER", "") if kept else tmp_path_factory.mktemp("devcluster")
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


