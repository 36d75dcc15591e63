"""A dev cluster: one state directory, and the parts that run from it.

`DevCluster` is the face the CLI and the tests use; each part has its own home:

* `processes.ProcessTable`: every process the directory started (pids, ports, logs), and where a
  fault is injected into one (`stop_process`, `restart` with a signal);
* `controlplane.ControlPlane`: PKI, kubeconfigs, etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler;
* `simulated.SimulatedFleet`: kwok, its Stages and the simulated nodes;
* `realfleet.RealFleet`: the real nodes (each one: gate/devcluster/realnode.py);
* the image registry (gate/devcluster/registry.py), started on demand on the process table.

Everything runs on loopback with free ports, as child processes in their own sessions so they outlive
`nodegate dev up`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate.certs import pki
from gate.devcluster import build, hostside, realnode
from gate.devcluster.controlplane import NAMESPACE, ControlPlane, kubeconfig_dict, wait_established
from gate.devcluster.network import MAX_REAL_NODES, ClusterNetwork
from gate.devcluster.processes import ClusterError, Process, ProcessTable, free_port, tail
from gate.devcluster.realfleet import RealFleet, RealNodeSpec
from gate.devcluster.simulated import NodeSpec, SimulatedFleet, node_manifest
from gate.kube.client import KubeClient

Progress = Callable[[str], None]

CORE = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok")


def default_state_dir() -> Path:
    return Path(os.environ.get("NODEGATE_DEV_DIR", build.cache_root() / "dev"))


class DevCluster:
    """A control plane rooted in one state directory, with its fleets. All methods are idempotent."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.dir = (state_dir or default_state_dir()).resolve()
        self.network = ClusterNetwork.of(self.dir)
        self.procs = ProcessTable(self.dir)
        self.plane = ControlPlane(self.dir, self.procs, self.network)
        self.simulated = SimulatedFleet(self.plane, self.procs)
        self.real = RealFleet(self.plane, self.procs, self.network)
        self.pki = self.plane.pki
        self.logs = self.procs.logs
        self.kubeconfig = self.plane.kubeconfig
        self._mode_file = self.dir / "mode.json"

    # -- what runs --------------------------------------------------------------------------------

    def processes(self) -> dict[str, Process]:
        return self.procs.all()

    def ports(self) -> dict[str, int]:
        return self.procs.ports()

    def set_port(self, name: str, port: int) -> None:
        self.procs.set_port(name, port)

    def real_nodes_enabled(self) -> bool:
        """Whether this control plane was started for real nodes (see `up(real_nodes=...)`)."""
        return bool(self._mode_file.exists() and json.loads(self._mode_file.read_text()).get("real_nodes"))

    def running(self) -> bool:
        procs = self.processes()
        return all(n in procs and procs[n].alive() for n in CORE)

    @property
    def server(self) -> str:
        return self.plane.server

    async def client(self, **kw: Any) -> KubeClient:
        return await self.plane.client(**kw)

    def ca(self) -> pki.KeyPair:
        return self.plane.ca()

    # -- start ------------------------------------------------------------------------------------

    def up(self, nodes: NodeSpec | None = None, *, job_seconds: float = 1.0, progress: Progress = print,
           timeout: float = 120.0, real_nodes: RealNodeSpec | None = None) -> None:
        """Start everything that is not running, create `nodes` (simulated) and `real_nodes`, and return
        once all is ready. A control plane for real nodes differs from one without (see
        gate/devcluster/controlplane.py), so real nodes join only a cluster started with them."""
        started = time.monotonic()
        if real_nodes is not None and not 0 <= real_nodes.count <= MAX_REAL_NODES:
            raise ClusterError(f"--real-nodes {real_nodes.count}: a dev cluster runs 0 to {MAX_REAL_NODES} real nodes "
                               "(two cores carry two or three)")
        bins = build.ensure_built(progress=progress)
        want_real = real_nodes is not None and real_nodes.count > 0
        if want_real:
            assert real_nodes is not None
            realnode.prepare(real_nodes.used_suites(), progress)
        if self.running():
            if want_real and not self.real_nodes_enabled():
                raise ClusterError(f"the control plane in {self.dir} was started without real nodes; "
                                   "stop it (`nodegate dev down`) and start it again with --real-nodes")
            progress(f"Control plane already running ({self.dir}).")
        else:
            self.down(quiet=True)  # clear leftovers of a crashed run (half-dead processes)
            for attempt in range(3):
                try:
                    self._start(bins, job_seconds, progress, timeout, real=want_real)
                    break
                except ClusterError as exc:
                    self.down(quiet=True)
                    # A port picked free was taken by another process before ours bound it: new ports.
                    if "address already in use" not in str(exc) or attempt == 2:
                        raise
                    progress("A port of the control plane was taken while it started; starting again on new ports")
        if nodes is not None and nodes.count:
            asyncio.run(self.add_nodes(nodes, timeout=timeout))
        if want_real:
            assert real_nodes is not None
            self.add_real_nodes(real_nodes, progress=progress, timeout=max(timeout, 180.0))
        progress(f"Control plane ready in {time.monotonic() - started:.1f}s; kubeconfig: {self.kubeconfig}")

    def _start(self, bins: dict[str, Path], job_seconds: float, progress: Progress, timeout: float,
               *, real: bool = False) -> None:
        for path in (self.dir / "etcd", self.logs):
            shutil.rmtree(path, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._mode_file.write_text(json.dumps({"real_nodes": real}))
        if real:
            hostside.ensure_bridge(self.network)
        ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kcm", "kwok", "scheduler")}
        self.procs.write_ports(ports)
        procs: dict[str, Process] = {}
        deadline = time.monotonic() + timeout
        self.plane.start(bins, ports, procs, real=real, deadline=deadline, progress=progress)
        self.simulated.start(bins["kwok"], ports["kwok"], procs, job_seconds=job_seconds, real=real,
                             deadline=deadline, progress=progress)
        asyncio.run(self._settle(deadline, procs))

    async def _settle(self, deadline: float, procs: dict[str, Process]) -> None:
        async with await self.client() as kube:
            await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                             field_manager="nodegate-dev")
        await self.plane.wait_controllers(deadline, procs)

    # -- nodes ------------------------------------------------------------------------------------

    async def add_nodes(self, spec: NodeSpec, *, timeout: float = 120.0, concurrency: int = 32) -> list[str]:
        """Create simulated nodes (existing ones are left as they are) and wait until they are Ready."""
        return await self.simulated.add_nodes(spec, timeout=timeout, concurrency=concurrency)

    def real_node_configs(self) -> list[realnode.NodeConfig]:
        return self.real.configs()

    def add_real_nodes(self, spec: RealNodeSpec, *, progress: Progress = print, timeout: float = 180.0) -> list[str]:
        """Start real nodes (those already running are left as they are) and wait until they are Ready."""
        return self.real.add(spec, progress=progress, timeout=timeout)

    def remove_real_node(self, name: str) -> None:
        """Stop a real node for good (gate/devcluster/realfleet.py)."""
        self.real.remove(name)

    # -- stop -------------------------------------------------------------------------------------

    def down(self, *, quiet: bool = False, keep_state: bool = False) -> list[str]:
        """Stop every process this state directory started; return the names of those stopped."""
        stopped = self.procs.stop_all()
        if self.real_nodes_enabled() or self.real.exists():
            self.real.clean_up()
        if not keep_state:
            shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            # A node's disk belongs to its Node object, which went with etcd's data.
            shutil.rmtree(self.real.base, ignore_errors=True)
        if not quiet and not stopped:
            print("Nothing was running.")
        return stopped

    # -- one process ------------------------------------------------------------------------------

    def register(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start another process (webhook, operator) under this cluster's bookkeeping."""
        return self.procs.register(name, argv, env)

    def stop_process(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        self.procs.stop(name, sig=sig)

    def restart(self, name: str, *, sig: int = signal.SIGTERM, env: dict[str, str] | None = None,
                timeout: float = 60.0, wait: bool = True) -> Process:
        """Stop one process by its pid (`sig`, SIGKILL after 10 s) and start it again with the same
        argv, so it keeps its ports, data directory and log; returns the new Process.

        For etcd and kube-apiserver it returns once they serve again (etcd /health, the API server
        /readyz) unless `wait` is False. `env` is added to this process's environment, as `register`
        does (the bookkeeping keeps only the argv, so NodeGate's own processes pass their env again).
        A restarted kube-apiserver starts a new watch cache, so clients resuming a watch from an older
        resourceVersion get 410 Gone and relist.
        """
        new = self.procs.restart(name, sig=sig, env=env)
        if wait and name in ("etcd", "kube-apiserver"):
            deadline = time.monotonic() + timeout
            while not self.plane.serving(name):
                if not new.alive():
                    raise ClusterError(f"{name} exited after a restart; last lines of {new.log}:\n"
                                       f"{tail(Path(new.log))}")
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name} did not serve again within {timeout:.0f}s of a restart; "
                                       f"see {new.log}")
                time.sleep(0.05)
        return new


__all__ = ["NAMESPACE", "ClusterError", "DevCluster", "NodeSpec", "Process",
           "RealNodeSpec", "free_port", "kubeconfig_dict", "node_manifest", "wait_established"]
