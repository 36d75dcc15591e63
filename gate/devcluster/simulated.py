"""The simulated fleet of a dev cluster: kwok, its Stages, and the nodes it plays.

kwok manages only the nodes that carry its annotation (`node_manifest`), so real nodes' kubelets and
kwok never fight over a node. Its Stages (gate/devcluster/stages.py) play what a kubelet would do with
NodeGate's stage pods: run them for a while, and reboot a node on request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gate.devcluster import stages
from gate.devcluster.controlplane import ControlPlane, wait_established
from gate.devcluster.processes import ClusterError, Process, ProcessTable, http_ok, wait_until
from gate.kube.client import NODES, KubeClient
from gate.kube.errors import ApiError
from gate.kube.objects import node_ready

Progress = Callable[[str], None]

NODE_NAME_PREFIX = "kwok-node-"


@dataclass
class NodeSpec:
    """Simulated nodes to create: `count` nodes named `<prefix><index>` with `labels`."""

    count: int
    labels: dict[str, str] = field(default_factory=dict)
    prefix: str = NODE_NAME_PREFIX
    start: int = 0
    taints: list[dict[str, str]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.start, self.start + self.count)]


def node_manifest(name: str, labels: dict[str, str], taints: Iterable[dict[str, str]] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {stages.KWOK_NODE_ANNOTATION: stages.KWOK_NODE_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {"taints": list(taints)},
    }


class SimulatedFleet:
    """kwok and the nodes it plays, on one control plane."""

    def __init__(self, plane: ControlPlane, procs: ProcessTable) -> None:
        self.plane = plane
        self.procs = procs

    def start(self, kwok_bin: Path, port: int, procs: dict[str, Process], *, job_seconds: float, real: bool,
              deadline: float, progress: Progress) -> None:
        """Install kwok's Stage CRD and the stages, then start kwok into `procs`; raises ClusterError."""
        progress("Installing kwok's Stage CRD and the simulated kubelet's stages ...")
        asyncio.run(self._install_stages(kwok_bin.parent, job_seconds))
        progress("Starting kwok ...")
        # kwok plays four pod stages at a time by default; a rollout over hundreds of nodes starts
        # hundreds of stage pods at once, and the simulated kubelet must not be the bottleneck.
        config = self.plane.dir / "kwok.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"podPlayStageParallelism": 64, "nodePlayStageParallelism": 16, "nodeLeaseParallelism": 16},
        }))
        procs["kwok"] = self.procs.spawn("kwok", [
            str(kwok_bin), "--config", str(config), "--kubeconfig", str(self.plane.dir / "kwok.kubeconfig"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", f"{stages.KWOK_NODE_ANNOTATION}={stages.KWOK_NODE_VALUE}",
            "--enable-crds", "Stage",
            # With real nodes the node lifecycle controller runs, and would mark silent nodes NotReady.
            "--node-lease-duration-seconds", "40" if real else "0",
            "--server-address", f"127.0.0.1:{port}",
            "--cidr", "10.0.0.0/8", "--node-ip", "192.168.0.1",
        ])
        self.procs.save(procs)
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), "kwok", procs, deadline,
                   self.procs.logs / "kwok.log")

    async def _install_stages(self, kwok_bin_dir: Path, job_seconds: float) -> None:
        crd = yaml.safe_load((kwok_bin_dir / "kwok.x-k8s.io_stages.yaml").read_text())
        async with await self.plane.client() as kube:
            await kube.apply(crd, field_manager="nodegate-dev")
            await wait_established(kube, crd["metadata"]["name"])
            for stage in [*stages.default_stages(job_seconds), stages.reboot_stage(job_seconds)]:
                await kube.apply(stage, field_manager="nodegate-dev")

    async def add_nodes(self, spec: NodeSpec, *, timeout: float = 120.0, concurrency: int = 32) -> list[str]:
        """Create simulated nodes (existing ones are left as they are) and wait until they are Ready."""
        names = spec.names()
        async with await self.plane.client() as kube:
            sem = asyncio.Semaphore(concurrency)

            async def create(name: str) -> None:
                async with sem:
                    try:
                        await kube.create(NODES, node_manifest(name, spec.labels, spec.taints))
                    except ApiError as exc:
                        if exc.status != 409:
                            raise

            await asyncio.gather(*(create(n) for n in names))
            await wait_nodes_ready(kube, set(names), timeout=timeout)
        return names


async def wait_nodes_ready(kube: KubeClient, names: set[str], *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    # A list of every Node is dear at thousands of nodes: poll less often the more there are to wait for,
    # and keep of each only its name and readiness.
    pause = min(2.0, max(0.25, len(names) / 4000))
    while True:
        items, _ = await kube.list(NODES, transform=lambda n: {"name": n["metadata"]["name"], "ready": node_ready(n)})
        ready = {n["name"] for n in items if n["ready"]}
        missing = names - ready
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{len(missing)} simulated nodes did not turn Ready (e.g. {sorted(missing)[:3]}); "
                               "is kwok running? see its log in the state directory")
        await asyncio.sleep(pause)


__all__ = ["NODE_NAME_PREFIX", "NodeSpec", "SimulatedFleet", "node_manifest", "wait_nodes_ready"]
