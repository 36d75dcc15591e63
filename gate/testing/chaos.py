"""Chaos runs: a rollout with drains and reboots on a dev cluster while the harness kills operators,
restarts kube-apiserver and etcd, and an independent watcher judges every change.

One run (`chaos_run`) on an existing `DevCluster`:

1. creates the run's simulated nodes in three compartments (canary, pool-a, the default one), a
   workload of one pod per node under a PodDisruptionBudget (so every drain evicts, and some
   evictions are refused), and starts the operator replicas (two by default, leader election);
2. starts an `InvariantWatcher` (its own client and watches), then applies a DeploymentPolicy and a
   readinessTaint NodeGate with two packages, one asking for a reboot: every node is cordoned,
   drained, runs three stages in one stage pod whose last step reboots it (a new bootID,
   NotReady, the taint back until done), runs two post-interrupt checks in a second pod and is
   uncordoned. A few nodes join after the gate exists, half
   tainted at creation (as the webhook would) and half not (the operator's backstop taints them);
3. disturbs it, in a random order at random moments (a pause drawn from `Chaos.pause` after the
   operator leads again): `kill` SIGKILLs the leading replica and starts it again at once (a
   container restart: same identity, so it takes the lease straight back); `failover` SIGKILLs the
   leader and brings it back only after the standby took over; `apiserver` SIGKILLs kube-apiserver
   and starts it again (its new watch cache answers resumed watches with 410 Gone: every client
   relists); `graceful-apiserver` does it with SIGTERM (the server closes the watches itself);
   `etcd` SIGKILLs etcd and starts it again; opt-in, `pause` freezes the leader (SIGSTOP) until the
   standby leads, then lets it run again (a zombie leader waking up with a stale view);
4. waits until the gate is Ready at its generation with every node complete, stops disturbing, lets
   the watcher catch up, and judges convergence (nothing left cordoned or tainted);
5. removes what it created.

The result carries the time from applying the gate to Ready, what was done, the watcher's report
(violations, how much each invariant was exercised, the 410s its own watches got) and the drains'
evictions. Nothing here asserts on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gate.api import keys
from gate.api.common import Obj
from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.devcluster.services import python_env, start_operator
from gate.kube.cache import WatchCache
from gate.kube.client import NAMESPACES, NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed, NotFound
from gate.testing.watcher import InvariantWatcher, WatchReport

Progress = Callable[[str], None]
T = TypeVar("T")

RUN_LABEL = "nodegate.dev/chaos"
POOL_LABEL = "nodegate.dev/chaos-pool"
# Fast settings for simulated nodes (as the operator tests use): a lost leader is replaced within
# about 8 s, nodes waiting on drains and reboots are looked at twice a second.
OPERATOR_FLAGS = ["--poll-seconds", "0.5", "--lease-seconds", "6", "--renew-seconds", "1", "--renew-deadline", "4",
                  "--resync-seconds", "30", "--pending-timeout", "300", "--reboot-timeout", "300"]
ACTIONS = ("kill", "failover", "pause", "apiserver", "graceful-apiserver", "etcd")
PACKAGES: Obj = {
    "kernel-params": {"version": "1.0.0", "image": "registry.example.com/kernel-params",
                      "interrupt": {"type": "reboot"}},
    "node-agent": {"version": "2.1.0", "image": "registry.example.com/node-agent",
                   "dependsOn": {"kernel-params": ">=1.0.0"},
                   "interrupt": {"type": "service", "services": ["node-agent.service"]},
                   "config": {"agent.conf": "level=info\n"}},
}


@dataclass(frozen=True)
class Fleet:
    nodes: int = 100  # nodes of the rollout, the late ones included
    late: int = 10  # join once the gate exists
    replicas: int = 2  # operator replicas (leader election)
    pods_per_node: float = 1.0  # workload pods under a PodDisruptionBudget, spread over the nodes

    def pools(self) -> dict[str, int]:
        early = self.nodes - self.late
        canary = max(1, early // 20)
        pool_a = (early - canary) // 2
        return {"canary": canary, "a": pool_a, "b": early - canary - pool_a}


@dataclass(frozen=True)
class Chaos:
    """How many of each disturbance one run gets, and the pause before each (seconds, uniform)."""

    kills: int = 0
    failovers: int = 0
    apiserver_restarts: int = 0
    graceful_apiserver_restarts: int = 0
    etcd_restarts: int = 0
    leader_pauses: int = 0  # opt-in: SIGSTOP the leader past its lease, SIGCONT once the standby leads
    pause: tuple[float, float] = (0.5, 6.0)

    def plan(self, rng: random.Random) -> list[str]:
        actions = (["kill"] * self.kills + ["failover"] * self.failovers + ["apiserver"] * self.apiserver_restarts
                   + ["graceful-apiserver"] * self.graceful_apiserver_restarts + ["etcd"] * self.etcd_restarts
                   + ["pause"] * self.leader_pauses)
        rng.shuffle(actions)
        return actions

    @property
    def total(self) -> int:
        return (self.kills + self.failovers + self.apiserver_restarts + self.graceful_apiserver_restarts
                + self.etcd_restarts + self.leader_pauses)


@dataclass
class RunResult:
    name: str
    chaos: Chaos
    seconds: float | None  # gate applied -> Ready at its generation, every node complete
    done: Counter[str]
    report: WatchReport
    evictions: int
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        return self.seconds is not None and self.error is None

    @property
    def ok(self) -> bool:
        return self.converged and not self.report.violations

    @property
    def kills(self) -> int:
        return self.done["kill"] + self.done["failover"]


# -- manifests ------------------------------------------------------------------------------------


def policy_manifest(run: str) -> Obj:
    return {"apiVersion": keys.API_VERSION, "kind": "DeploymentPolicy", "metadata": {"name": run},
            "spec": {
                "default": {"budget": {"percent": 15}, "strategy": {"linear": {"initialBatch": 2, "delta": 2}}},
                "compartments": [
                    {"name": "canary", "selector": {"matchLabels": {POOL_LABEL: "canary"}}, "budget": {"count": 1},
                     "strategy": {"fixed": {"initialBatch": 1}}},
                    {"name": "pool-a", "selector": {"matchLabels": {POOL_LABEL: "a"}}, "budget": {"percent": 20},
                     "strategy": {"exponential": {"initialBatch": 2, "growthFactor": 2}}},
                ]}}


def gate_manifest(run: str) -> Obj:
    return {"apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": {"name": run},
            "spec": {"nodeSelector": {"matchLabels": {RUN_LABEL: run}}, "deploymentPolicy": run,
                     "readinessTaint": True, "drain": {"timeout": "15m"}, "packages": PACKAGES}}


def workload_manifests(run: str, replicas: int) -> list[Obj]:
    namespace = run
    labels = {"app": "web"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": namespace},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "nodeSelector": {RUN_LABEL: run},
                      "terminationGracePeriodSeconds": 0,
                      "containers": [{"name": "web", "image": "registry.example.com/web:1"}],
                      # The API server's TaintNodesByCondition admission taints every new node not-ready,
                      # and the dev cluster runs no node lifecycle controller to lift it (simulated nodes
                      # send no heartbeats): a workload here must tolerate it to be scheduled at all.
                      "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                       "effect": "NoSchedule"}],
                      # one per node, so that every drain has something to evict
                      "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                     "whenUnsatisfiable": "ScheduleAnyway",
                                                     "labelSelector": {"matchLabels": labels}}]}}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": namespace},
         "spec": {"maxUnavailable": "10%", "selector": {"matchLabels": labels}}},
    ]


# -- operators ------------------------------------------------------------------------------------


def replica_names(count: int) -> list[str]:
    return [f"chaos-operator-{chr(ord('a') + i)}" for i in range(count)]


def _readyz(cluster: DevCluster, name: str) -> str | None:
    """"leader", "syncing" (leads, caches not synced), "standby", or None when it does not answer."""
    port = cluster.ports().get(name)
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return "syncing" if exc.code == 503 else None
    except OSError:
        return None


def leader(cluster: DevCluster, names: list[str]) -> str | None:
    for name in names:
        if _readyz(cluster, name) in ("leader", "syncing"):
            return name
    return None


async def wait_leading(cluster: DevCluster, names: list[str], timeout: float = 60.0) -> str:
    """Wait until a replica leads with its caches synced; its name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in names:
            if await asyncio.to_thread(_readyz, cluster, name) == "leader":
                return name
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no operator replica led within {timeout:.0f}s")


# -- disturbances ---------------------------------------------------------------------------------


async def disturb(cluster: DevCluster, action: str, names: list[str], progress: Progress) -> None:
    """Perform one disturbance; returns once the operator leads again."""
    env = python_env()
    if action in ("kill", "failover"):
        target = await asyncio.to_thread(leader, cluster, names) or random.choice(names)
        if action == "failover" and len(names) > 1:
            argv = cluster.processes()[target].argv
            await asyncio.to_thread(cluster.stop_process, target, sig=signal.SIGKILL)
            others = [n for n in names if n != target]
            took = await wait_leading(cluster, others)
            progress(f"  failover: SIGKILLed leader {target}; {took} took over")
            await asyncio.to_thread(cluster.register, target, argv, env)
        else:
            await asyncio.to_thread(cluster.restart, target, sig=signal.SIGKILL, env=env, wait=False)
            progress(f"  kill: SIGKILLed leader {target} and started it again")
    elif action == "pause":
        current = await asyncio.to_thread(leader, cluster, names)
        frozen = current or random.choice(names)
        pid = cluster.processes()[frozen].pid
        os.killpg(pid, signal.SIGSTOP)
        try:
            others = [n for n in names if n != frozen]
            if others:
                took = await wait_leading(cluster, others)
                await asyncio.sleep(1.0)  # the new leader works while the old one is frozen
            else:
                took = "nobody"
                await asyncio.sleep(8.0)  # past the lease: a lone replica wakes up to an expired lease
        finally:
            os.killpg(pid, signal.SIGCONT)
        progress(f"  pause: froze leader {frozen} until {took} led, then let it run again")
    elif action in ("apiserver", "graceful-apiserver"):
        sig = signal.SIGKILL if action == "apiserver" else signal.SIGTERM
        started = time.monotonic()
        await asyncio.to_thread(cluster.restart, "kube-apiserver", sig=sig)
        progress(f"  {action}: kube-apiserver serves again after {time.monotonic() - started:.1f}s")
    elif action == "etcd":
        started = time.monotonic()
        await asyncio.to_thread(cluster.restart, "etcd", sig=signal.SIGKILL)
        progress(f"  etcd: etcd serves again after {time.monotonic() - started:.1f}s")
    else:
        raise ValueError(f"unknown disturbance {action!r}; one of {', '.join(ACTIONS)}")
    await wait_leading(cluster, names, timeout=120)


async def retrying(call: Callable[[], Awaitable[T]], *, timeout: float = 120.0) -> T:
    """An API call that rides out the API server and etcd restarts the harness causes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except (ConnectionFailed, ApiError) as exc:
            if isinstance(exc, ApiError) and not exc.temporary:
                raise
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


# -- one run --------------------------------------------------------------------------------------


async def _wait_available(kube: KubeClient, namespace: str, replicas: int, timeout: float) -> None:
    from gate.kube.client import DEPLOYMENTS

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep = await retrying(lambda: kube.get(DEPLOYMENTS, "web", namespace))
        if (dep.get("status") or {}).get("availableReplicas", 0) >= replicas:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the workload in {namespace} did not become available in {timeout:.0f}s")


async def _gate_done(kube: KubeClient, run: str, nodes: int) -> bool:
    gate = await retrying(lambda: kube.get(NODEGATES, run))
    status = gate.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    counts = status.get("nodes") or {}
    return bool(status.get("observedGeneration") == gate["metadata"].get("generation")
                and conds.get("Ready") == "True" and counts.get("matched") == nodes
                and counts.get("complete") == nodes)


async def _diagnose(kube: KubeClient, run: str) -> str:
    with contextlib.suppress(ApiError, ConnectionFailed):
        items, _ = await kube.list(NODES, label_selector=f"{RUN_LABEL}={run}")
        statuses: Counter[str] = Counter()
        failures = []
        for node in items:
            labels = node["metadata"].get("labels") or {}
            statuses[labels.get(keys.status_label(run), "none")] += 1
            raw = (node["metadata"].get("annotations") or {}).get(keys.state_annotation(run), "")
            if '"failed"' in raw:
                failures.append(f"{node['metadata']['name']}: {raw[:300]}")
        gate = await kube.get(NODEGATES, run)
        return (f"node statuses {dict(statuses)}; gate status {(gate.get('status') or {}).get('compartments')}; "
                f"failed: {failures[:3]}")
    return "(no diagnosis: the API server did not answer)"


async def chaos_run(cluster: DevCluster, name: str, fleet: Fleet, chaos: Chaos, *, seed: int = 0,
                    timeout: float = 900.0, progress: Progress = print, journal: Path | None = None) -> RunResult:
    """One rollout under `chaos` (see the module docstring); cleans up after itself."""
    rng = random.Random(seed)
    run = name
    names = replica_names(fleet.replicas)
    strangers = [p.name for p in cluster.processes().values()
                 if p.name not in names and "operator" in p.argv and "run" in p.argv and p.alive()]
    if strangers:
        raise RuntimeError(f"another operator runs on this cluster ({', '.join(strangers)}): it would take part "
                           "in the leader election and the run would not disturb the operator that works")
    done: Counter[str] = Counter()
    kube = await cluster.client(timeout=60)
    watcher = InvariantWatcher(await cluster.client(timeout=60), journal=journal)
    evictions = 0

    def count_evictions(kind: str, _pod: Obj) -> None:
        nonlocal evictions
        evictions += kind == "DELETED"

    pods = WatchCache(kube, PODS, namespace=run)
    seconds: float | None = None
    error: str | None = None
    watching = False
    notes: list[str] = []
    chaos_task: asyncio.Task[None] | None = None
    try:
        pools = fleet.pools()
        progress(f"{run}: {fleet.nodes} nodes ({pools['canary']} canary, {pools['a']} pool-a, {pools['b']} "
                 f"default, {fleet.late} joining late), {fleet.replicas} operator replicas")
        for pool, count in pools.items():
            await cluster.add_nodes(NodeSpec(count, {RUN_LABEL: run, POOL_LABEL: pool}, prefix=f"{run}-{pool}-"),
                                    timeout=300)
        replicas = max(1, round(fleet.pods_per_node * (fleet.nodes - fleet.late)))
        for manifest in workload_manifests(run, replicas):
            await kube.apply(manifest, field_manager="chaos")
        await _wait_available(kube, run, replicas, timeout=300)
        pods.subscribe(count_evictions)
        await pods.start()
        for i, name_ in enumerate(names):
            await asyncio.to_thread(start_operator, cluster, lambda m: None, name=name_, extra=OPERATOR_FLAGS,
                                    wait_leader=i == 0)
        await watcher.start()
        watching = True
        await kube.apply(policy_manifest(run), field_manager="chaos")
        started = time.monotonic()
        await kube.apply(gate_manifest(run), field_manager="chaos")
        # Creation timestamps have a resolution of one second: the late nodes must be visibly younger.
        await asyncio.sleep(1.1)
        tainted = fleet.late // 2
        taint = [{"key": keys.READINESS_TAINT_KEY, "effect": keys.READINESS_TAINT_EFFECT}]
        late_labels = {RUN_LABEL: run, POOL_LABEL: "late"}
        if tainted:
            await cluster.add_nodes(NodeSpec(tainted, late_labels, prefix=f"{run}-late-", taints=taint), timeout=300)
        if fleet.late - tainted:
            await cluster.add_nodes(NodeSpec(fleet.late - tainted, late_labels, prefix=f"{run}-late-",
                                             start=tainted), timeout=300)

        finished = asyncio.Event()

        async def disturbances() -> None:
            await wait_leading(cluster, names)
            for action in chaos.plan(rng):
                await asyncio.sleep(rng.uniform(*chaos.pause))
                if finished.is_set():
                    return
                await disturb(cluster, action, names, progress)
                done[action] += 1

        chaos_task = asyncio.create_task(disturbances())
        deadline = started + timeout
        while not await _gate_done(kube, run, fleet.nodes):
            if chaos_task.done() and chaos_task.exception() is not None:
                raise chaos_task.exception()  # type: ignore[misc]
            if time.monotonic() > deadline:
                raise TimeoutError(f"did not converge within {timeout:.0f}s: {await _diagnose(kube, run)}")
            await asyncio.sleep(0.25)
        seconds = time.monotonic() - started
        finished.set()
        await chaos_task  # a disturbance in progress ends, and the operator leads again
        skipped = chaos.total - sum(done.values())
        if skipped:
            notes.append(f"converged before {skipped} planned disturbances")
        progress(f"{run}: converged in {seconds:.1f}s after {dict(done) or 'no disturbance'}")
    except Exception as exc:  # the run's outcome, reported with the watcher's findings
        error = f"{type(exc).__name__}: {exc}"
        progress(f"{run}: FAILED: {error}")
    finally:
        if chaos_task is not None and not chaos_task.done():
            chaos_task.cancel()  # a failed run: stop disturbing (a frozen leader is let go) before cleaning up
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await chaos_task
        try:
            report = await watcher.stop() if watching else watcher.report()
            if error is None:
                if not watcher.checker.converged():
                    error = f"the watcher does not see a converged fleet: {watcher.checker.unfinished()}"
                watcher.checker.check_converged()
                report = watcher.report()
        finally:
            await pods.stop()
            await watcher.client.close()
            with contextlib.suppress(Exception):
                await cleanup(cluster, kube, run, names)
            await kube.close()
    return RunResult(run, chaos, seconds if error is None else None, done, report, evictions, error, notes)


async def cleanup(cluster: DevCluster, kube: KubeClient, run: str, names: list[str]) -> None:
    """Delete the run's gate (the operator releases its nodes), policy, workload, nodes, operators."""
    with contextlib.suppress(NotFound):
        await retrying(lambda: kube.delete(NODEGATES, run))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                await kube.get(NODEGATES, run)
            except NotFound:
                break
            await asyncio.sleep(0.5)
    await retrying(lambda: kube.delete(POLICIES, run))
    await retrying(lambda: kube.delete(NAMESPACES, run))
    for name in names:
        await asyncio.to_thread(cluster.stop_process, name)
    items, _ = await retrying(lambda: kube.list(NODES, label_selector=f"{RUN_LABEL}={run}"))
    for node in items:
        await retrying(lambda n=node: kube.delete(NODES, n["metadata"]["name"]))  # type: ignore[misc]


# -- reporting ------------------------------------------------------------------------------------


def table(results: list[RunResult], baseline: RunResult | None) -> str:
    head = (f"{'run':<22} {'converged':>10} {'vs undisturbed':>15} {'kills':>6} {'failovers':>9} "
            f"{'apiserver':>9} {'etcd':>5} {'410s':>5} {'evictions':>9} {'violations':>10}")
    lines = [head, "-" * len(head)]
    base = baseline.seconds if baseline is not None and baseline.converged else None
    for r in results:
        took = f"{r.seconds:.1f}s" if r.seconds is not None else "NO"
        ratio = f"{r.seconds / base:.2f}x" if r.seconds is not None and base else "-"
        api = r.done["apiserver"] + r.done["graceful-apiserver"]
        gone = sum(r.report.expired.values())
        lines.append(f"{r.name:<22} {took:>10} {ratio:>15} {r.done['kill']:>6} {r.done['failover']:>9} {api:>9} "
                     f"{r.done['etcd']:>5} {gone:>5} {r.evictions:>9} {len(r.report.violations):>10}")
    return "\n".join(lines)
