"""The real-node tier: a control plane of its own with two real nodes (gate/devcluster/realnode.py).

Each node is a kubelet, containerd and runc in namespaces of its own, booted into its own Debian root
(real-node-0 Debian 12 bookworm, real-node-1 Debian 13 trixie);
NodeGate's image and the packages' images are built from their Dockerfiles and pulled by the nodes from
the cluster's registry. Effects are checked from outside the node, in its own root and namespaces
(`RealCluster.node_sh`), never through the API alone.

Where this machine cannot run a real node (not root, no unshare, no containerd's prerequisites), the
tier is skipped with the reason in one line; it never passes without running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.kube.client import NODES, KubeClient
from tests.conftest import Kubectl, unique

REAL_NODES = 2
# The Debian releases of the nodes' roots, in turn: real-node-0 runs Debian 12, real-node-1 Debian 13.
# Every test that rolls a package over all real nodes proves it on both (the packages' `testedOn`).
REAL_NODE_SUITES = ("bookworm", "trixie")
POOL_LABEL = "nodegate.dev/pool"
SIMULATED_TAINT = {"key": "nodegate.dev/simulated", "value": "true", "effect": "NoSchedule"}
# The operator's settings in this tier: an image that cannot be pulled fails its stage after 20 s here,
# not the default 2 minutes; stage while serving on, at the default's bound, whatever the default is
# (tests/realnode/test_staging.py runs the catalog's serving steps through it).
OPERATOR_ENV = {"NODEGATE_POLL_SECONDS": "2", "NODEGATE_IMAGE_PULL_GRACE": "20", "NODEGATE_STAGING_CONCURRENCY": "10"}


@dataclass
class RealCluster:
    """The real-node control plane, its nodes and the images pushed to its registry."""

    dev: Any  # DevCluster
    images: dict[str, str]
    kubectl: Kubectl
    nodes: list[str] = field(default_factory=list)
    progress: Callable[[str], None] = print

    @property
    def registry(self) -> str:
        """The cluster's registry as the nodes reach it (`host:port`)."""
        return self.images["nodegate"].split("/", 1)[0]

    def signature_policy(self) -> str:
        """The tier's image signature policy: enforce, the machine's dev key (which `ensure_images` signs
        every image with) for the registry's `nodegate/**`, as the nodes and as this machine reach it."""
        from gate.devcluster import cosign

        public_key = cosign.dev_public_key(self.progress)
        if public_key is None:
            raise AssertionError("cosign is not built, so the tier's images are unsigned and its enforcing policy "
                                 "would hold them all: `python -m gate.devcluster.build` builds it")
        port = self.registry.rpartition(":")[2]
        return cosign.dev_signature_policy([self.registry, f"127.0.0.1:{port}"], public_key)

    def start_services(self) -> None:
        from gate.devcluster import services

        services.start_webhook(self.dev, self.progress)
        # The operator enforces the dev cluster's signature policy: every catalog image and NodeGate's own
        # agent image it runs must carry the dev key's signature (docs/supply-chain.md).
        services.set_image_signatures(self.dev, self.signature_policy())
        # OPERATOR_ENV; no agent image is given: on a cluster with real nodes the dev operator takes the one built for
        # them from the cluster's registry, as `nodegate dev up --real-nodes` does for a person.
        services.start_operator(self.dev, self.progress, env=dict(OPERATOR_ENV))
        assert services.running_agent_image(self.dev) == self.images["nodegate"]

    def services_running(self) -> bool:
        procs = self.dev.processes()
        return any(name in procs and procs[name].alive() for name in ("webhook", "operator"))

    def stop_services(self) -> None:
        from gate.cli.manifests import remove_webhook_configurations
        from gate.devcluster.services import WEBHOOK_CONFIGURATION

        for name in ("operator", "webhook"):
            self.dev.stop_process(name)
        asyncio.run(remove_webhook_configurations(WEBHOOK_CONFIGURATION, str(self.dev.kubeconfig)))
        # and the operator's node-keys policy (start_services puts it back), which a release of the chart
        # brings under the same name
        from gate.devcluster.services import remove_node_keys_policy

        asyncio.run(remove_node_keys_policy(self.dev))
        # Their RBAC too (start_services puts it back): a Helm release of the chart names its own
        # objects the same (cluster roles, roles in other namespaces) and refuses to take over
        # objects it did not create.
        from gate.controller.rbac import operator_rbac, webhook_rbac
        from gate.devcluster.services import NAMESPACE, WEBHOOK_SECRET

        for obj in [*operator_rbac(NAMESPACE), *webhook_rbac(NAMESPACE, configuration_name=WEBHOOK_CONFIGURATION,
                                                              secret_name=WEBHOOK_SECRET)]:
            meta = obj["metadata"]
            where = ["-n", meta["namespace"]] if meta.get("namespace") else []
            self.kubectl.run("delete", obj["kind"].lower(), meta["name"], *where, "--ignore-not-found")

    def config(self, node: str) -> Any:
        from gate.devcluster import realnode

        return realnode.NodeConfig.load(self.dev.dir / "realnodes" / node)

    def os_of(self, node: str) -> str:
        """The node's OS as its `nodegate.dev/os` label says (debian-12, debian-13)."""
        from gate.devcluster import realnode

        return self.config(node).labels[realnode.REAL_NODE_OS_LABEL]

    def node_sh(self, node: str, script: str, *, namespaces: str = "--mount --uts --pid --net",
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside `node` (its root, its namespaces), as a person on it would."""
        from gate.devcluster import realnode

        argv = realnode.in_node(self.config(node), "/bin/sh", "-c", script, namespaces=namespaces)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"on {node}: {script!r} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc

    def node_file(self, node: str, path: str) -> str | None:
        proc = self.node_sh(node, f"cat {path}", check=False)
        return proc.stdout if proc.returncode == 0 else None

    def boot_id(self, node: str) -> str:
        out = self.kubectl.run("get", "node", node, "-o", "jsonpath={.status.nodeInfo.bootID}").stdout
        return out.strip()

    def node_ready(self, node: str) -> bool:
        proc = self.kubectl.run("get", "node", node, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        conditions = json.loads(proc.stdout).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    @contextlib.contextmanager
    def node_away(self, node: str, timeout: float = 180.0) -> Iterator[None]:
        """`node` leaves the cluster and joins it again, as a machine does after `kubectl delete node` and
        a restart of its kubelet. Inside the block its Node object is gone; on leaving the block its kubelet
        is killed, the node's boot script starts it again (its unit's Restart=always), and the new kubelet
        registers a new Node, which goes through admission as any joining machine's does.

        A join that costs one kubelet start: the node keeps its boot, its root and the images its
        containerd pulled (a node of its own, `dev.add_real_nodes`, boots and pulls every image anew).
        What the API held on the old Node (labels and annotations set after registration) is gone; the
        kubelet's own labels come back with it."""
        from gate.devcluster import faults

        self.kubectl.run("delete", "node", node)
        try:
            yield
        finally:
            faults.kill_kubelet(self.dev.dir, node)
            self.wait(f"{node} registered again and Ready", lambda: self.node_ready(node), timeout)

    def wait(self, what: str, ready: Callable[[], bool], timeout: float = 300.0, every: float = 1.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(every)

    def gate_status(self, name: str) -> dict[str, Any]:
        out = self.kubectl.run("get", "nodegates.nodegate.io", name, "-o", "yaml").stdout
        return dict((yaml.safe_load(out) or {}).get("status") or {})

    def wait_complete(self, name: str, timeout: float = 600.0) -> dict[str, Any]:
        def done() -> bool:
            nodes = self.gate_status(name).get("nodes") or {}
            return bool(nodes.get("matched")) and nodes.get("complete") == nodes.get("matched")

        self.wait(f"gate {name} complete on every node", done, timeout, every=2.0)
        return self.gate_status(name)

    def delete_gate(self, name: str, timeout: float = 600.0) -> None:
        """Delete the gate and wait until it is gone. A deletion already asked for (a test's cleanup that ran
        first) may have finished before this call: gone is what is wanted, so not found is no error."""
        self.kubectl.run("delete", "nodegates.nodegate.io", name, "--ignore-not-found", "--wait=false")
        self.wait(f"gate {name} gone",
                  lambda: self.kubectl.run("get", "nodegates.nodegate.io", name, check=False).returncode != 0,
                  timeout, every=2.0)


def real_pool_gate(name: str, packages: dict[str, Any]) -> str:
    """A NodeGate of `packages` over the real nodes, one node disrupted at a time, as YAML."""
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real"}}, "interruptionBudget": {"count": 1},
                 "packages": packages},
    })


async def first_version_of(kube: KubeClient, name: str, since: str, timeout: float) -> dict[str, Any]:
    """The Node `name` as it was created (its ADDED event on a watch that began before it joined)."""
    async with asyncio.timeout(timeout):
        async for kind, obj in kube.watch(NODES, resource_version=since, field_selector=f"metadata.name={name}"):
            if kind == "ADDED":
                return obj
    raise AssertionError(f"no ADDED event for {name}")


def _skip_reason() -> str | None:
    from gate.devcluster import realnode

    return realnode.unsupported_reason()


def _progress(log: Path) -> Callable[[str], None]:
    """Progress of the cold build (roots, images) on the terminal, as it can take minutes, and in a log."""

    def progress(message: str) -> None:
        with open(log, "a") as out:
            out.write(message + "\n")
        if message.startswith(("Building", "Built", "Pushed", "  ")):
            print(f"[realnode] {message}", file=sys.__stderr__, flush=True)

    return progress


# Stopped once this directory is done, as the chaos tier's: the worker that ran the tier goes on with
# other files, and two idle kubelets and their control plane would only take CPU from them.
@pytest.fixture(scope="package")
def real_nodes() -> Iterator[RealCluster]:
    """The control plane, its real nodes and the images in its registry; no NodeGate processes."""
    if reason := _skip_reason():
        pytest.skip(f"real nodes cannot run on this machine: {reason}")
    from gate.devcluster import services
    from gate.devcluster.cluster import DevCluster, NodeSpec, RealNodeSpec
    from gate.devcluster.images import ensure_images

    # Not under pytest's basetemp: a pytest run of another session on this machine prunes all but
    # its three newest basetemps, and would take the nodes' roots away under them.
    state = Path(tempfile.mkdtemp(prefix="nodegate-realcluster-", dir="/var/tmp"))
    dev = DevCluster(state)
    progress = _progress(state / "progress.log")
    try:
        # One kwok node next to the real ones, tainted so that no pod of a test lands on it by chance.
        simulated = NodeSpec(1, {POOL_LABEL: "kwok"}, taints=[SIMULATED_TAINT])
        dev.up(simulated, real_nodes=RealNodeSpec(REAL_NODES, {POOL_LABEL: "real"}, suites=list(REAL_NODE_SUITES)),
               progress=progress)
        images = ensure_images(dev, host=dev.network.gateway, progress=progress)
        asyncio.run(services.install_crds(dev))
        yield RealCluster(dev, images, Kubectl(dev.kubeconfig), [f"real-node-{i}" for i in range(REAL_NODES)],
                          progress)
    finally:
        dev.down(quiet=True)
        # The nodes' mounts lived in their own mount namespaces, gone with them; never delete through one.
        if not any(line.split()[1].startswith(str(state)) for line in Path("/proc/mounts").read_text().splitlines()):
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="package")
def real(real_nodes: RealCluster) -> RealCluster:
    """The real nodes with NodeGate's webhook and operator as processes of this machine (the agent in
    stage pods is the real image, pulled by the nodes)."""
    real_nodes.start_services()
    return real_nodes


@pytest.fixture
def gate_name() -> str:
    return unique("rn")
