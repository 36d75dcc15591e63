"""The local real control plane: etcd, kube-apiserver, kube-controller-manager, kwok.

Everything runs on loopback with free ports, as child processes in their own sessions so they outlive
`nodegate dev up`. The state directory holds the PKI, the etcd data, the kubeconfig, one log file per
process and `processes.json` (pid and start time of each, so `down` never kills a recycled pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gate.certs import pki
from gate.devcluster import build, realnode, stages
from gate.devcluster.network import MAX_REAL_NODES, SERVICE_CIDR, ClusterNetwork
from gate.kube.client import CRDS, KWOK_STAGES, NAMESPACES, NODES, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed
from gate.kube.objects import node_ready

Progress = Callable[[str], None]

NAMESPACE = "nodegate-system"
# Controllers the tests rely on, plus everything enabled by default. nodelifecycle is off: simulated
# nodes do not heartbeat (thousands of lease writes would starve two cores), and without a heartbeat
# that controller would taint every node unreachable and evict its pods.
CONTROLLERS = "*,-nodelifecycle,-cloud-node-lifecycle,-nodeipam,-service-lb-controller"
NODE_NAME_PREFIX = "kwok-node-"
# With real nodes the node lifecycle controller runs: a real node that stops heartbeating (a reboot)
# goes NotReady and comes back, as on a real cluster; kwok then heartbeats the simulated nodes too.
REAL_NODE_CONTROLLERS = "*,-cloud-node-lifecycle,-nodeipam,-service-lb-controller"


class ClusterError(RuntimeError):
    """The dev cluster could not start or is not running; the message says what to look at."""


def default_state_dir() -> Path:
    return Path(os.environ.get("NODEGATE_DEV_DIR", build.cache_root() / "dev"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of a live `pid` (clock ticks since boot), to recognise it later.

    None when there is no such process or it is a zombie: a child we started and killed stays in the
    process table until reaped, and must not count as running.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces, so split after its closing parenthesis;
    # then field 3 (state) is at index 0 and field 22 (start time) at index 19.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        _reap(pid)
        return None
    return fields[19]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: init reaps it


@dataclass
class Process:
    name: str
    pid: int
    started: str
    log: str
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return _proc_start_time(self.pid) == self.started


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


@dataclass
class RealNodeSpec:
    """Real nodes to start (gate/devcluster/realnode.py): `count` nodes named `real-node-<index>`.

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


class DevCluster:
    """A control plane rooted in one state directory. All methods are idempotent."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.dir = (state_dir or default_state_dir()).resolve()
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.kubeconfig = self.dir / "kubeconfig"
        self._procs_file = self.dir / "processes.json"
        self._ports_file = self.dir / "ports.json"
        self._mode_file = self.dir / "mode.json"
        self.network = ClusterNetwork.of(self.dir)
        # Processes started but not yet in processes.json: a Ctrl-C between the two must not leave one
        # that no `down` knows of, so `down` on this object stops these too.
        self._unrecorded: dict[str, int] = {}

    # -- bookkeeping ------------------------------------------------------------------------------

    def processes(self) -> dict[str, Process]:
        if not self._procs_file.exists():
            return {}
        data = json.loads(self._procs_file.read_text())
        return {name: Process(**p) for name, p in data.items()}

    def _save_processes(self, procs: dict[str, Process]) -> None:
        # Written aside and renamed: interrupted half-way, the file is the old one, never a torn one.
        part = self._procs_file.with_suffix(".json.part")
        part.write_text(json.dumps({n: p.__dict__ for n, p in procs.items()}, indent=1))
        os.replace(part, self._procs_file)
        for name, proc in procs.items():
            if self._unrecorded.get(name) == proc.pid:
                del self._unrecorded[name]

    def ports(self) -> dict[str, int]:
        return json.loads(self._ports_file.read_text()) if self._ports_file.exists() else {}

    def set_port(self, name: str, port: int) -> None:
        ports = self.ports()
        ports[name] = port
        self._ports_file.write_text(json.dumps(ports))

    def real_nodes_enabled(self) -> bool:
        """Whether this control plane was started for real nodes (see `up(real_nodes=...)`)."""
        return bool(self._mode_file.exists() and json.loads(self._mode_file.read_text()).get("real_nodes"))

    def running(self) -> bool:
        procs = self.processes()
        core = ("etcd", "kube-apiserver", "kube-controller-manager", "kwok")
        return all(n in procs and procs[n].alive() for n in core)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports()['apiserver']}"

    # -- start ------------------------------------------------------------------------------------

    def up(self, nodes: NodeSpec | None = None, *, job_seconds: float = 1.0, progress: Progress = print,
           timeout: float = 120.0, real_nodes: RealNodeSpec | None = None) -> None:
        """Start everything that is not running, create `nodes` (simulated) and `real_nodes`, and return
        once all is ready.

        A control plane for real nodes differs in three ways: the API server also listens on the
        bridge's gateway (nodes reach it from their own network namespaces) and authorizes kubelets
        with the Node authorizer; the node lifecycle controller runs (a real node that stops
        heartbeating goes NotReady); and kwok heartbeats its simulated nodes so that it does not
        mark them NotReady as well.
        """
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
            self._start(bins, job_seconds, progress, timeout, real=want_real)
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
        self._write_pki()
        self._mode_file.write_text(json.dumps({"real_nodes": real}))
        if real:
            realnode.ensure_bridge(self.network)
        ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver", "kcm", "kwok", "scheduler")}
        self._ports_file.write_text(json.dumps(ports))
        self._write_kubeconfigs(ports["apiserver"])
        procs: dict[str, Process] = {}
        deadline = time.monotonic() + timeout

        progress("Starting etcd ...")
        procs["etcd"] = self._spawn("etcd", [
            str(bins["etcd"]), "--name", "nodegate-dev", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ports['etcd']}",
            "--advertise-client-urls", f"http://127.0.0.1:{ports['etcd']}",
            "--listen-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}",
            "--initial-cluster", f"nodegate-dev=http://127.0.0.1:{ports['etcd-peer']}",
            # A throwaway cluster: durability is not worth an fsync per write on a shared disk.
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
            "--log-level", "warn",
        ])
        self._save_processes(procs)
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), "etcd", procs, deadline)

        progress("Starting kube-apiserver ...")
        p = self.pki
        procs["kube-apiserver"] = self._spawn("kube-apiserver", [
            str(bins["kube-apiserver"]),
            "--etcd-servers", f"http://127.0.0.1:{ports['etcd']}",
            # Real nodes reach the API server at the bridge's gateway, from their own network namespaces.
            "--bind-address", "0.0.0.0" if real else "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(ports["apiserver"]),
            "--tls-cert-file", str(p / "apiserver.crt"), "--tls-private-key-file", str(p / "apiserver.key"),
            "--client-ca-file", str(p / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(p / "sa.pub"),
            "--service-account-signing-key-file", str(p / "sa.key"),
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            # Node: each kubelet may touch only its own Node and the pods bound to it.
            "--authorization-mode", "Node,RBAC",
            # `kubectl logs` and `exec` reach a real node's kubelet at its InternalIP on the bridge.
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            # No kube-proxy runs: the API server calls a webhook Service at its endpoints (the pod IPs
            # on real nodes, routed over the bridge), not at its ClusterIP.
            "--enable-aggregator-routing=true",
            "--kubelet-client-certificate", str(p / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(p / "apiserver-kubelet-client.key"),
            "--enable-admission-plugins", "NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,"
            "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy,PodSecurity,NodeRestriction",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--allow-privileged=true",
            "--max-requests-inflight", "800", "--max-mutating-requests-inflight", "400",
            "--profiling=false", "--v", "1",
        ])
        self._save_processes(procs)
        self._wait(lambda: self._apiserver_ready(ports["apiserver"]), "kube-apiserver", procs, deadline)

        progress("Starting kube-controller-manager and kube-scheduler ...")
        procs["kube-controller-manager"] = self._spawn("kube-controller-manager", [
            str(bins["kube-controller-manager"]),
            "--kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--authentication-kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--authorization-kubeconfig", str(self.dir / "kcm.kubeconfig"),
            "--controllers", REAL_NODE_CONTROLLERS if real else CONTROLLERS,
            # A node silent for this long is NotReady (default 50 s): a real node's reboot is seen so.
            *(["--node-monitor-grace-period", "16s", "--node-monitor-period", "2s"] if real else []),
            "--service-account-private-key-file", str(p / "sa.key"),
            "--root-ca-file", str(p / "ca.crt"),
            "--use-service-account-credentials=true",
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", str(ports["kcm"]),
            # Client-side throttling would make the garbage collector, not NodeGate, set the pace of
            # a rollout over hundreds of simulated nodes; the API server's own fairness still applies.
            "--kube-api-qps", "2000", "--kube-api-burst", "4000",
            "--concurrent-job-syncs", "50", "--concurrent-gc-syncs", "50", "--v", "1",
        ])
        procs["kube-scheduler"] = self._spawn("kube-scheduler", [
            str(bins["kube-scheduler"]),
            "--kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--authentication-kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--authorization-kubeconfig", str(self.dir / "scheduler.kubeconfig"),
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", str(ports["scheduler"]),
            "--v", "1",
        ])
        self._save_processes(procs)

        progress("Installing kwok's Stage CRD and the simulated kubelet's stages ...")
        asyncio.run(self._install_kwok_objects(bins["kwok"].parent, job_seconds))

        progress("Starting kwok ...")
        # kwok plays four pod stages at a time by default; a rollout over hundreds of nodes starts
        # hundreds of stage pods at once, and the simulated kubelet must not be the bottleneck.
        kwok_config = self.dir / "kwok.yaml"
        kwok_config.write_text(yaml.safe_dump({
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"podPlayStageParallelism": 64, "nodePlayStageParallelism": 16, "nodeLeaseParallelism": 16},
        }))
        procs["kwok"] = self._spawn("kwok", [
            str(bins["kwok"]), "--config", str(kwok_config), "--kubeconfig", str(self.dir / "kwok.kubeconfig"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", f"{stages.KWOK_NODE_ANNOTATION}={stages.KWOK_NODE_VALUE}",
            "--enable-crds", "Stage",
            "--node-lease-duration-seconds", "40" if real else "0",
            "--server-address", f"127.0.0.1:{ports['kwok']}",
            "--cidr", "10.0.0.0/8", "--node-ip", "192.168.0.1",
        ])
        self._save_processes(procs)
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), "kwok", procs, deadline)
        asyncio.run(self._wait_controllers(deadline, procs))

    async def _install_kwok_objects(self, kwok_bin_dir: Path, job_seconds: float) -> None:
        crd = yaml.safe_load((kwok_bin_dir / "kwok.x-k8s.io_stages.yaml").read_text())
        async with await self.client() as kube:
            await kube.apply(crd, field_manager="nodegate-dev")
            await wait_established(kube, crd["metadata"]["name"])
            for stage in [*stages.default_stages(job_seconds), stages.reboot_stage(job_seconds)]:
                await kube.apply(stage, field_manager="nodegate-dev")
            await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                             field_manager="nodegate-dev")

    async def _wait_controllers(self, deadline: float, procs: dict[str, Process]) -> None:
        # The service-account controller creating "default" in a namespace proves the controller
        # manager is connected and reconciling.
        async with await self.client() as kube:
            while True:
                try:
                    await kube.get(NAMESPACES, "default")
                    from gate.kube.client import SERVICEACCOUNTS

                    await kube.get(SERVICEACCOUNTS, "default", "default")
                    return
                except (ApiError, ConnectionFailed):
                    pass
                self._check_alive(procs)
                if time.monotonic() > deadline:
                    raise ClusterError("kube-controller-manager did not create the default service account; "
                                       f"see {self.logs / 'kube-controller-manager.log'}")
                await asyncio.sleep(0.2)

    # -- nodes ------------------------------------------------------------------------------------

    async def add_nodes(self, spec: NodeSpec, *, timeout: float = 120.0, concurrency: int = 32) -> list[str]:
        """Create simulated nodes (existing ones are left as they are) and wait until they are Ready."""
        names = spec.names()
        async with await self.client() as kube:
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

    def real_node_configs(self) -> list[realnode.NodeConfig]:
        base = self.dir / "realnodes"
        if not base.is_dir():
            return []
        return [realnode.NodeConfig.load(d) for d in sorted(base.iterdir()) if (d / "node.json").is_file()]

    def add_real_nodes(self, spec: RealNodeSpec, *, progress: Progress = print, timeout: float = 180.0) -> list[str]:
        """Start real nodes (those already running are left as they are) and wait until they are Ready.

        A node is created once: its directory is its disk, kept across reboots and restarts of
        its supervisor, and removed by `down`.
        """
        from gate.devcluster.registry import start_registry

        roots, tools = realnode.prepare(spec.used_suites(), progress)
        registry = f"{self.network.gateway}:{start_registry(self, progress=progress)}"
        realnode.push_pause_image(registry, progress)
        kubelet = build.binary_paths(("kubernetes",))["kubelet"]
        names = realnode.node_names(spec.count)
        for index, name in enumerate(names):
            suite = spec.suite_of(index)
            config = realnode.NodeConfig(
                name=name, index=index, cluster_dir=str(self.dir), lower=str(roots[suite]), kubelet=str(kubelet),
                tools=str(tools), apiserver_port=self.ports()["apiserver"], registry=registry,
                labels={realnode.REAL_NODE_LABEL: "true", realnode.REAL_NODE_OS_LABEL: realnode.NODE_OS[suite],
                        **spec.labels},
                taints=list(spec.taints),
            )
            if not (config.dir / "node.json").exists():
                config.save()
                realnode.write_node_disk(config, self.ca())
            progress(f"Starting real node {name} ...")
            self.register(f"realnode-{name}", realnode.supervisor_argv(config.dir))
        asyncio.run(self._wait_real_nodes(set(names), timeout))
        return names

    def remove_real_node(self, name: str) -> None:
        """Stop a real node for good: its supervisor, what is left of it on this machine, its disk and
        its Node object (as a machine leaving the fleet)."""
        configs = {c.name: c for c in self.real_node_configs()}
        if name not in configs:
            raise ClusterError(f"{name} is not a real node of this cluster ({self.dir})")
        self.stop_process(f"realnode-{name}")
        realnode.clean_up(configs[name])
        shutil.rmtree(configs[name].dir, ignore_errors=True)

        async def delete() -> None:
            async with await self.client() as kube:
                with contextlib.suppress(ApiError):
                    await kube.delete(NODES, name)

        asyncio.run(delete())

    async def _wait_real_nodes(self, names: set[str], timeout: float) -> None:
        async with await self.client() as kube:
            try:
                await wait_nodes_ready(kube, names, timeout=timeout)
            except ClusterError:
                logs = ", ".join(str(self.dir / "realnodes" / n / "console.log") for n in sorted(names))
                raise ClusterError(f"real nodes {sorted(names)} did not turn Ready in {timeout:.0f}s; "
                                   f"see {logs} and each node's /var/log/kubelet.log") from None

    # -- stop -------------------------------------------------------------------------------------

    def down(self, *, quiet: bool = False, keep_state: bool = False) -> list[str]:
        """Stop every process this state directory started; return the names of those stopped."""
        procs = self.processes()
        stopped = []
        for pid in self._unrecorded.values():  # started, and interrupted before it was recorded
            _kill(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # our child, SIGKILLed: gone at once
        self._unrecorded.clear()
        # Reverse start order: clients before the API server, the API server before etcd.
        for name in reversed(list(procs)):
            proc = procs[name]
            if proc.alive():
                _terminate(proc.pid)
                stopped.append(name)
        # Wait for all of them at once; whoever ignores SIGTERM for 5 s gets SIGKILL.
        deadline = time.monotonic() + 5
        while any(p.alive() for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in procs.values():
            if proc.alive():
                _kill(proc.pid)
        deadline = time.monotonic() + 5
        while any(p.alive() for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._procs_file.unlink(missing_ok=True)
        if self.real_nodes_enabled() or (self.dir / "realnodes").exists():
            # Each supervisor stops its node and removes its cgroups and links; this does it again for
            # one that was killed before it could, then removes the cluster's bridge.
            for config in self.real_node_configs():
                try:
                    realnode.clean_up(config)
                except (realnode.RealNodeError, ValueError, OSError) as exc:  # the others still go
                    print(f"warning: cleaning up real node {config.name}: {exc}")
            realnode.remove_bridge(self.network)
        if not keep_state:
            shutil.rmtree(self.dir / "etcd", ignore_errors=True)
            # A node's disk belongs to its Node object, which went with etcd's data.
            shutil.rmtree(self.dir / "realnodes", ignore_errors=True)
        if not quiet and not stopped:
            print("Nothing was running.")
        return stopped

    def register(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start another process (webhook, operator) under this cluster's bookkeeping."""
        procs = self.processes()
        if name in procs and procs[name].alive():
            return procs[name]
        procs[name] = self._spawn(name, argv, env)
        self._save_processes(procs)
        return procs[name]

    def stop_process(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        procs = self.processes()
        proc = procs.pop(name, None)
        if proc and proc.alive():
            os.killpg(proc.pid, sig) if sig == signal.SIGKILL else _terminate(proc.pid)
            deadline = time.monotonic() + 10
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.alive():
                _kill(proc.pid)
        self._save_processes(procs)

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
        procs = self.processes()
        if name not in procs:
            raise ClusterError(f"{name} is not a process of this cluster ({self.dir})")
        old = procs[name]
        if not old.argv:
            raise ClusterError(f"{name} was recorded without its command line; it cannot be restarted")
        if old.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(old.pid, sig)
            if not _wait_exited(old.pid, 10):
                _kill(old.pid)
            if not _wait_exited(old.pid, 10):
                raise ClusterError(f"{name} (pid {old.pid}) did not exit; not starting a second copy")
        new = self._spawn(name, old.argv, env)
        procs = self.processes()  # re-read, so an entry another caller registered meanwhile is kept
        procs[name] = new
        self._save_processes(procs)
        if wait and name in ("etcd", "kube-apiserver"):
            deadline = time.monotonic() + timeout
            while not self._serving(name):
                if not new.alive():
                    raise ClusterError(f"{name} exited after a restart; last lines of {new.log}:\n"
                                       f"{_tail(Path(new.log))}")
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name} did not serve again within {timeout:.0f}s of a restart; "
                                       f"see {new.log}")
                time.sleep(0.05)
        return new

    def _serving(self, name: str) -> bool:
        ports = self.ports()
        if name == "etcd":
            return _http_ok(f"http://127.0.0.1:{ports['etcd']}/health")
        return self._apiserver_ready(ports["apiserver"])

    # -- helpers ----------------------------------------------------------------------------------

    async def client(self, **kw: Any) -> KubeClient:
        return await KubeClient.from_kubeconfig(str(self.kubeconfig), **kw)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.logs / f"{name}.log"
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir, env={**os.environ, **(env or {})},
            )
            self._unrecorded[name] = proc.pid
        started = _proc_start_time(proc.pid) or ""
        return Process(name, proc.pid, started, str(log), argv)

    def _check_alive(self, procs: dict[str, Process]) -> None:
        for name, proc in procs.items():
            if not proc.alive():
                tail = _tail(Path(proc.log))
                self.down(quiet=True)
                raise ClusterError(f"{name} exited during start-up; last lines of {proc.log}:\n{tail}")

    def _wait(self, ready: Callable[[], bool], what: str, procs: dict[str, Process], deadline: float) -> None:
        while not ready():
            self._check_alive(procs)
            if time.monotonic() > deadline:
                self.down(quiet=True)
                raise ClusterError(f"{what} did not become ready in time; see {self.logs / (what + '.log')}")
            time.sleep(0.1)

    def _apiserver_ready(self, port: int) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return _http_ok(f"https://127.0.0.1:{port}/readyz", ctx)

    def _write_pki(self) -> None:
        """The dev CA and every pair issued from it. An existing CA is reused, so kubeconfigs handed out
        earlier stay valid across restarts; a pair that is missing (a state directory from an older
        NodeGate) is issued from it."""
        self.pki.mkdir(parents=True, exist_ok=True)
        if (self.pki / "ca.crt").exists():
            ca = self.ca()
        else:
            ca = pki.create_ca("nodegate-dev-ca")
            _write_pair(self.pki / "ca", ca)
        if not (self.pki / "apiserver.crt").exists():
            serving = pki.issue(
                ca, "kube-apiserver", server=True,
                hosts=["127.0.0.1", "localhost", "10.96.0.1", self.network.gateway, "kubernetes",
                       "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
            )
            _write_pair(self.pki / "apiserver", serving)
        clients = {
            "admin": ("nodegate-dev-admin", ["system:masters"]),
            "kcm": ("system:kube-controller-manager", []),
            "scheduler": ("system:kube-scheduler", []),
            # kwok writes node and pod status and applies Stage side effects to arbitrary objects.
            "kwok": ("kwok-controller", ["system:masters"]),
            # The API server's identity towards kubelets (logs, exec); they trust the dev CA.
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", []),
        }
        for name, (cn, orgs) in clients.items():
            if not (self.pki / f"{name}.crt").exists():
                _write_pair(self.pki / name, pki.issue(ca, cn, organizations=orgs, client=True))
        if not (self.pki / "sa.key").exists():
            private, public = pki.rsa_signing_key()
            (self.pki / "sa.key").write_bytes(private)
            (self.pki / "sa.pub").write_bytes(public)
        for path in self.pki.glob("*.key"):
            path.chmod(0o600)

    def ca(self) -> pki.KeyPair:
        return pki.KeyPair((self.pki / "ca.crt").read_bytes(), (self.pki / "ca.key").read_bytes())

    def _write_kubeconfigs(self, port: int) -> None:
        for name, file in (("admin", self.kubeconfig), ("kcm", self.dir / "kcm.kubeconfig"),
                           ("scheduler", self.dir / "scheduler.kubeconfig"), ("kwok", self.dir / "kwok.kubeconfig")):
            file.write_text(yaml.safe_dump(kubeconfig_dict(
                f"https://127.0.0.1:{port}", (self.pki / "ca.crt").read_bytes(),
                user=name, cert=(self.pki / f"{name}.crt").read_bytes(), key=(self.pki / f"{name}.key").read_bytes(),
            )))
            file.chmod(0o600)


def kubeconfig_dict(server: str, ca_pem: bytes, *, user: str, cert: bytes | None = None, key: bytes | None = None,
                    token: str | None = None, cluster: str = "nodegate-dev") -> dict[str, Any]:
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    creds: dict[str, str] = {}
    if cert and key:
        creds = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    if token:
        creds["token"] = token
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }


async def wait_nodes_ready(kube: KubeClient, names: set[str], *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        items, _ = await kube.list(NODES)
        ready = {n["metadata"]["name"] for n in items if node_ready(n)}
        missing = names - ready
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{len(missing)} simulated nodes did not turn Ready (e.g. {sorted(missing)[:3]}); "
                               "is kwok running? see its log in the state directory")
        await asyncio.sleep(0.25)


async def wait_established(kube: KubeClient, name: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = await kube.get(CRDS, name)
        conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established") == "True":
            return
        await asyncio.sleep(0.1)
    raise ClusterError(f"CRD {name} was not established in {timeout:.0f}s")


def _write_pair(stem: Path, pair: pki.KeyPair) -> None:
    stem.with_suffix(".crt").write_bytes(pair.cert_pem)
    stem.with_suffix(".key").write_bytes(pair.key_pem)


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _wait_exited(pid: int, timeout: float) -> bool:
    """Wait until every thread of `pid` has exited (so its ports are free again); reap our child.

    A multi-threaded process shows its leader as a zombie while other threads are still exiting and
    holding its sockets, so a zombie leader alone does not mean the process is gone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return True  # reaped
        states = []
        for task in tasks:
            try:
                states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        if all(state in ("Z", "X") for state in states):
            _reap(pid)
            return True
        time.sleep(0.02)
    return False


def _terminate(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


__all__ = ["KWOK_STAGES", "NAMESPACE", "ClusterError", "DevCluster", "NodeSpec", "RealNodeSpec", "node_manifest"]
