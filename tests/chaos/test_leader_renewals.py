"""One leader at a time: a leader whose renewals do not get through stops acting before a standby leads.

Two operator replicas roll a gate out (budget: two nodes at a time, a reboot per node). Mid-rollout
the leader's renewals stop getting through, in one of two ways:

* `renewals-held`: the referee webhook (tests/chaos/referee.py) holds the leader's Lease updates
  for 25 s inside the API server, while the leader's other writes go through at once. That is the
  failure of issue 27: a renewal outliving the renew deadline while the work goes on. Before the
  lease had its own client and deadlines, the leader kept working until its renewal came back;
* `frozen`: the leader's process is stopped (SIGSTOP) until the standby leads and has written, then
  let go: a zombie leader waking up with work half done, its renewal loop not yet aware of it.

Evidence, none of it from the operator's own account: the referee records every write of each
replica as the API server admits it (told apart by their tokens' IDs), and the invariant watcher
judges every node and stage pod change (never over the budget, never uncordoned during a stage, no
stage run twice). Asserted: the old leader wrote nothing after the new leader's first write, the
budget was never exceeded, and the rollout converged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gate.api import keys
from gate.controller.rbac import OPERATOR_SERVICE_ACCOUNT
from gate.devcluster.cluster import NAMESPACE, DevCluster, NodeSpec, free_port
from gate.devcluster.services import (
    install_operator_rbac,
    operator_argv,
    python_env,
    service_account_kubeconfig,
    wait_ready,
)
from gate.kube.client import CONFIGMAPS, NODEGATES, KubeClient
from gate.testing.chaos import OPERATOR_FLAGS, PACKAGES, RUN_LABEL, cleanup, wait_leading
from gate.testing.watcher import InvariantWatcher
from tests.chaos.referee import Referee, token_id
from tests.conftest import unique
from tests.processes import HANG_GUARD

NODES = 8
BUDGET = 2


async def until(check: Callable[[], bool], what: str, timeout: float = HANG_GUARD) -> None:
    """A hang guard, not a measure: however long a busy machine takes below it is no failure."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:.0f}s: {what}")
        await asyncio.sleep(0.1)


async def gate_done(kube: KubeClient, name: str) -> bool:
    gate = await kube.get(NODEGATES, name)
    status = gate.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return bool(ready and status.get("observedGeneration") == gate["metadata"]["generation"]
                and (status.get("nodes") or {}).get("complete") == NODES)


async def start_replica(cluster: DevCluster, name: str, kubeconfig: Path, *, leader: bool) -> None:
    port = free_port()
    cluster.set_port(name, port)
    cluster.register(name, operator_argv(kubeconfig, port, name, OPERATOR_FLAGS), python_env())
    await asyncio.to_thread(wait_ready, cluster, name, port, want="leader" if leader else "standby")


@pytest.mark.parametrize("disturbance", ["renewals-held", "frozen"])
async def test_a_leader_whose_renewals_do_not_get_through_stops_acting_before_the_standby_leads(
        chaos_cluster: DevCluster, disturbance: str) -> None:
    cluster = chaos_cluster
    run = unique("lease")
    old, new = names = [f"{run}-a", f"{run}-b"]
    kube = await cluster.client(timeout=60)
    referee = Referee(f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}")
    watcher = InvariantWatcher(await cluster.client(timeout=60))
    watching = False
    frozen: int | None = None
    try:
        await install_operator_rbac(cluster)
        await referee.start(kube)
        configs = {}
        for name in names:
            configs[name] = await service_account_kubeconfig(cluster, OPERATOR_SERVICE_ACCOUNT, NAMESPACE,
                                                              cluster.dir / f"{name}.kubeconfig")
            referee.replicas[token_id(configs[name])] = name
        # The API server calls the referee before anything counts: a dry-run write as the old leader.
        async with await KubeClient.from_kubeconfig(str(configs[old])) as probe:
            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{run}-probe", "namespace": NAMESPACE}}
            deadline = time.monotonic() + HANG_GUARD
            while not referee.of(old) and time.monotonic() < deadline:
                await probe.create(CONFIGMAPS, cm, dry_run=True)
                await asyncio.sleep(0.2)
        assert referee.of(old), "the API server never called the referee"
        assert not referee.unknown, referee.unknown
        referee.writes.clear()

        await start_replica(cluster, old, configs[old], leader=True)
        await start_replica(cluster, new, configs[new], leader=False)
        await cluster.add_nodes(NodeSpec(NODES, {RUN_LABEL: run}, prefix=f"{run}-"), timeout=300)
        await watcher.start()
        watching = True
        await kube.apply({"apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": {"name": run},
                          "spec": {"nodeSelector": {"matchLabels": {RUN_LABEL: run}},
                                   "interruptionBudget": {"count": BUDGET}, "packages": PACKAGES}},
                         field_manager="nodegate-test")

        # The old leader is in the middle of the rollout: it has cordoned nodes and started stage pods.
        def acting(replica: str, resource: str) -> int:
            return sum(w.resource.startswith(resource) for w in referee.of(replica))

        await until(lambda: acting(old, "/nodes") >= BUDGET and acting(old, "/pods") >= 1, "the leader at work")
        assert not await gate_done(kube, run)

        disturbed = time.monotonic()
        if disturbance == "renewals-held":
            referee.held.add(old)
        else:
            frozen = cluster.processes()[old].pid
            os.killpg(frozen, signal.SIGSTOP)
        try:
            await wait_leading(cluster, [new], timeout=HANG_GUARD)
            await until(lambda: bool(referee.of(new)), "the new leader at work")
            await asyncio.sleep(2.0)  # the new leader works while the old one is held or frozen
        finally:
            referee.held.discard(old)
            if frozen is not None:
                os.killpg(frozen, signal.SIGCONT)

        deadline = time.monotonic() + HANG_GUARD
        while not await gate_done(kube, run):
            assert time.monotonic() < deadline, "the rollout did not converge"
            await asyncio.sleep(0.5)

        report = await watcher.stop()
        watching = False
        assert watcher.checker.converged(), watcher.checker.unfinished()
        watcher.checker.check_converged()
        report = watcher.report()
    finally:
        if watching:
            await watcher.stop()
        await watcher.client.close()
        try:
            await cleanup(cluster, kube, run, names)
        finally:
            await referee.stop(kube)
            await kube.close()

    log = (cluster.logs / f"{old}.log").read_text()
    first_new = min(w.at for w in referee.of(new))
    late = [w for w in referee.of(old) if w.at >= first_new]
    print(f"{disturbance}: old leader {len(referee.of(old))} writes, new leader {len(referee.of(new))}; "
          f"lease writes {len(referee.of(old, leases=True))} / {len(referee.of(new, leases=True))}; "
          f"{report.summary()}")
    last_old = max(w.at for w in referee.of(old))
    print(f"  from the disturbance: the old leader's last write at {last_old - disturbed:+.2f}s, "
          f"the new leader's first at {first_new - disturbed:+.2f}s")
    renewals = ", ".join(f"{w.at - disturbed:+.1f}s" for w in referee.of(old, leases=True))
    print(f"  old leader's lease writes admitted at {renewals}")
    print("\n".join("  " + line for line in log.splitlines() if "Lease" in line or "leader" in line
                     or "not sent" in line))
    # Never two leaders acting: nothing of the old leader's reached the API server once the new one acted.
    assert late == [], late
    # Never a budget exceeded, no stage twice, nothing uncordoned under a stage.
    assert report.violations == [], "\n".join(map(str, report.violations))
    assert report.coverage.disruptions_judged >= NODES
    assert not referee.unknown, referee.unknown
    assert "reason=renew deadline passed" in log, "the old leader did not stop at its renew deadline"
