"""The real nodes of a dev cluster: each a kubelet and containerd in namespaces of its own, under a
supervisor process (gate/devcluster/realnode.py is one node; this is the fleet of them).

A node is created once: its directory under `<state>/realnodes/<name>` is its disk, kept across
reboots and restarts of its supervisor, and removed with the cluster's etcd data (the Node object it
belongs to goes with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from gate.devcluster import build, hostside, realnode
from gate.devcluster.controlplane import ControlPlane
from gate.devcluster.network import ClusterNetwork
from gate.devcluster.processes import ClusterError, ProcessTable
from gate.devcluster.simulated import wait_nodes_ready
from gate.kube.client import NODES
from gate.kube.errors import ApiError

Progress = Callable[[str], None]


@dataclass
class RealNodeSpec:
    """Real nodes to start: `count` nodes named `real-node-<index>`.

    `suites` are the Debian releases of their roots (realnode.NODE_ROOTS), taken in turn: node `i`
    runs `suites[i % len(suites)]`, so ["bookworm", "trixie"] makes real-node-0 Debian 12 and
    real-node-1 Debian 13. Each node carries its OS as the label `nodegate.dev/os` (debian-12, debian-13).
    """

    count: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[str] = field(default_factory=list)  # kubelet --register-with-taints, key=value:Effect
    suites: list[str] = field(default_factory=lambda: [realnode.DEFAULT_SUITE])

    def __post_init__(self) -> None:
        realnode.check_suites(self.suites)

    def suite_of(self, index: int) -> str:
        return self.suites[index % len(self.suites)]

    def used_suites(self) -> list[str]:
        return list(dict.fromkeys(self.suite_of(i) for i in range(self.count)))


def supervisor(name: str) -> str:
    """The process name of a real node's supervisor in the cluster's process table."""
    return f"realnode-{name}"


class RealFleet:
    """The real nodes of one state directory."""

    def __init__(self, plane: ControlPlane, procs: ProcessTable, network: ClusterNetwork) -> None:
        self.plane = plane
        self.procs = procs
        self.network = network
        self.base = plane.dir / "realnodes"

    def configs(self) -> list[realnode.NodeConfig]:
        if not self.base.is_dir():
            return []
        return [realnode.NodeConfig.load(d) for d in sorted(self.base.iterdir()) if (d / "node.json").is_file()]

    def add(self, spec: RealNodeSpec, *, progress: Progress = print, timeout: float = 180.0) -> list[str]:
        """Start real nodes (those already running are left as they are) and wait until they are Ready."""
        from gate.devcluster.registry import start_registry

        roots, tools = realnode.prepare(spec.used_suites(), progress)
        registry = f"{self.network.gateway}:{start_registry(self.procs, progress=progress)}"
        realnode.push_pause_image(registry, progress)
        kubelet = build.binary_paths(("kubernetes",))["kubelet"]
        names = realnode.node_names(spec.count)
        for index, name in enumerate(names):
            suite = spec.suite_of(index)
            config = realnode.NodeConfig(
                name=name, index=index, cluster_dir=str(self.plane.dir), lower=str(roots[suite]),
                kubelet=str(kubelet), tools=str(tools), apiserver_port=self.procs.ports()["apiserver"],
                registry=registry,
                labels={realnode.REAL_NODE_LABEL: "true", realnode.REAL_NODE_OS_LABEL: realnode.NODE_OS[suite],
                        **spec.labels},
                taints=list(spec.taints),
            )
            if not (config.dir / "node.json").exists():
                config.save()
                realnode.write_node_disk(config, self.plane.ca())
            progress(f"Starting real node {name} ...")
            self.procs.register(supervisor(name), realnode.supervisor_argv(config.dir), realnode.supervisor_env())
        asyncio.run(self._wait_ready(set(names), timeout))
        return names

    def remove(self, name: str) -> None:
        """Stop a real node for good: its supervisor, what is left of it on this machine, its disk and
        its Node object (as a machine leaving the fleet)."""
        configs = {c.name: c for c in self.configs()}
        if name not in configs:
            raise ClusterError(f"{name} is not a real node of this cluster ({self.plane.dir})")
        self.procs.stop(supervisor(name))
        realnode.clean_up(configs[name])
        shutil.rmtree(configs[name].dir, ignore_errors=True)

        async def delete() -> None:
            async with await self.plane.client() as kube:
                with contextlib.suppress(ApiError):
                    await kube.delete(NODES, name)

        asyncio.run(delete())

    def clean_up(self) -> None:
        """After the supervisors stopped: each removes its node's cgroups and links as it exits; this
        does it again for one killed before it could, then removes the cluster's bridge (the disks
        stay: `DevCluster.down` removes them with etcd's data)."""
        for config in self.configs():
            try:
                realnode.clean_up(config)
            except (hostside.RealNodeError, ValueError, OSError) as exc:  # the others still go
                print(f"warning: cleaning up real node {config.name}: {exc}")
        hostside.remove_bridge(self.network)

    def exists(self) -> bool:
        return self.base.exists()

    async def _wait_ready(self, names: set[str], timeout: float) -> None:
        async with await self.plane.client() as kube:
            try:
                await wait_nodes_ready(kube, names, timeout=timeout)
            except ClusterError:
                logs = ", ".join(str(self.base / n / "console.log") for n in sorted(names))
                raise ClusterError(f"real nodes {sorted(names)} did not turn Ready in {timeout:.0f}s; "
                                   f"see {logs} and each node's /var/log/kubelet.log") from None


__all__ = ["RealFleet", "RealNodeSpec", "supervisor"]
