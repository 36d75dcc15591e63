"""Chaos on real nodes: the faults real hosts have, again and again, at random moments of a round.

    python -m bench.chaos.run --real-nodes 2 --rounds 12     # root only; real nodes (docs/realnodes.md)

A dev cluster with real nodes, NodeGate's webhook and operator. Each round applies a shellscript gate
to one real node, chosen at random, whose apply step runs a few seconds, and injects one fault of
`gate.devcluster.faults`, chosen in turn from a shuffled list, at a random moment:

* kubelet, containerd, power-cut: at a random moment of the apply step;
* operator: at a random moment of a reboot interrupt (the node down);
* hold-boot: the node's reboot held past the operator's reboot timeout, released once the node failed;
* registry: the registry down when the stage pod pulls (the node forgot the image), back after a
  random outage.

A round survives when the gate converges, or when the node failed with a reason that names the
fault (RebootTimeout for a held boot; an image pull reason for the registry), with no node left
cordoned after the gate is deleted. One invariant watcher judges every round. Printed: each round,
faults injected and survived per kind, violations. Nothing asserts on time; the exit status is 1
when a round did not survive or an invariant was violated. Short runs of each fault are the
real-node tier's (`tests/realnode/test_faults.py`); long repeated runs are this.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gate.api import keys
from gate.devcluster import faults, hostside, realnode, services
from gate.devcluster.cluster import DevCluster, RealNodeSpec
from gate.devcluster.images import ensure_images
from gate.kube.client import NODEGATES, NODES, KubeClient
from gate.testing.watcher import InvariantWatcher

FAULTS = ("kubelet", "containerd", "power-cut", "operator", "hold-boot", "registry")
# The failure reasons that name each fault: a node failed with one of these survived the fault.
NAMING = {"hold-boot": ("RebootTimeout",), "registry": ("ImagePull", "ErrImagePull")}
REBOOT_TIMEOUT = 90.0
STEP_SECONDS = 8
POOL = "nodegate.dev/pool"


def gate_manifest(name: str, node: str, image: str, *, reboot: bool, sleep: int) -> dict[str, Any]:
    apply = f"echo started >> /var/tmp/{name}.log\nsleep {sleep}\necho {name} > /etc/nodegate-chaos-{name}\n"
    return {
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL: "real", "kubernetes.io/hostname": node}},
                 "interruptionBudget": {"count": 1},
                 "packages": {"shellscript": {
                     "version": "1.0.0", "image": image, "interrupt": {"type": "reboot" if reboot else "none"},
                     "config": {"apply.sh": apply,
                                "apply-check.sh": f"grep -qx {name} /etc/nodegate-chaos-{name}\n"}}}},
    }


def node_sh(dev: DevCluster, node: str, script: str) -> subprocess.CompletedProcess[str]:
    config = faults.node_config(dev.dir, node)
    return subprocess.run(realnode.in_node(config, "/bin/sh", "-c", script), capture_output=True, text=True,
                          timeout=60)


def node_up(dev: DevCluster, node: str) -> bool:
    try:
        faults.node_processes(faults.node_config(dev.dir, node), "kubelet")
        return True
    except (hostside.RealNodeError, OSError):  # no init, or it ended as we looked
        return False


async def state_of(client: KubeClient, gate: str, node: str) -> dict[str, Any]:
    obj = await client.get(NODES, node)
    raw = (obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate))
    return dict(json.loads(raw)) if raw else {}


async def until(what: str, ready: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await ready():
            return value
        await asyncio.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


async def one_round(client: KubeClient, dev: DevCluster, image: str, name: str, fault: str, node: str,
                    rng: random.Random, timeout: float) -> dict[str, Any]:
    """Apply the round's gate, inject `fault` at a random moment, wait for its outcome, clean up."""
    reboot = fault in ("operator", "hold-boot")
    injected_at = ""
    if fault == "registry":
        # The sandbox image stays (as on a node that ran its DaemonSets); the package's image goes.
        pause = f"{faults.node_config(dev.dir, node).registry}/{realnode.PAUSE_IMAGE}"
        node_sh(dev, node, f"ctr -n k8s.io images pull --plain-http {pause} >/dev/null; "
                           f"ctr -n k8s.io images rm {image} >/dev/null 2>&1; true")
        faults.registry_down(dev.dir)
    if fault == "hold-boot":
        faults.hold_boot(dev.dir, node, 3600)
    await client.apply(gate_manifest(name, node, image, reboot=reboot, sleep=STEP_SECONDS), field_manager="bench")
    try:
        if fault == "registry":
            await asyncio.sleep(rng.uniform(3, 20))
            faults.registry_up(dev.dir)
            injected_at = "down from before the pull"
        elif fault == "operator":
            await until("the reboot", lambda: asyncio.to_thread(lambda: not node_up(dev, node)), timeout, 0.2)
            delay = rng.uniform(0, 15)
            await asyncio.sleep(delay)
            faults.kill_operator(dev.dir, down_seconds=rng.uniform(0, 5))
            injected_at = f"{delay:.1f}s into the reboot"
        elif fault in ("kubelet", "containerd", "power-cut"):
            await until("the step", lambda: asyncio.to_thread(
                lambda: "started" in node_sh(dev, node, f"cat /var/tmp/{name}.log 2>/dev/null").stdout), timeout)
            delay = rng.uniform(0, STEP_SECONDS - 1)
            await asyncio.sleep(delay)
            {"kubelet": faults.kill_kubelet, "containerd": faults.kill_containerd,
             "power-cut": faults.power_cut}[fault](dev.dir, node)
            injected_at = f"{delay:.1f}s into the step"
        else:
            injected_at = "the reboot held"

        async def outcome() -> dict[str, Any] | None:
            state = await state_of(client, name, node)
            return state if state.get("status") in ("complete", "failed") else None

        state = await until(f"{name}: complete or failed", outcome, timeout, 2.0)
    finally:
        with contextlib.suppress(faults.FaultError):
            faults.registry_up(dev.dir)
        faults.release_boot(dev.dir, node)
    failure = state.get("failure") or {}
    named = state["status"] == "failed" and failure.get("reason", "").startswith(NAMING.get(fault, ("-",)))
    await client.delete(NODEGATES, name)

    async def settled() -> bool:
        with contextlib.suppress(Exception):
            await client.get(NODEGATES, name)
            return False
        obj = await client.get(NODES, node)
        ready = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}.get("Ready") == "True"
        return ready and not obj["spec"].get("unschedulable")

    left_cordoned = False
    try:
        await until(f"{name} gone, {node} Ready and uncordoned", settled, timeout, 2.0)
    except TimeoutError:
        left_cordoned = True
    node_sh(dev, node, f"rm -f /etc/nodegate-chaos-{name} /var/tmp/{name}.log")
    return {"round": name, "fault": fault, "node": node, "at": injected_at, "status": state["status"],
            "reason": failure.get("reason"), "message": (failure.get("message") or "")[:200],
            "left_cordoned": left_cordoned,
            "survived": (state["status"] == "complete" or named) and not left_cordoned}


async def rounds(dev: DevCluster, image: str, nodes: list[str], count: int, seed: int,
                 timeout: float) -> tuple[list[dict[str, Any]], list[str]]:
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        batch = list(FAULTS)
        rng.shuffle(batch)
        order += batch
    results = []
    async with await dev.client() as client:
        watcher = InvariantWatcher(client)
        await watcher.start()
        try:
            for i, fault in enumerate(order[:count]):
                result = await one_round(client, dev, image, f"chaos-rn-{i + 1}", fault, rng.choice(nodes), rng,
                                         timeout)
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            report = await watcher.stop()
    return results, [str(v) for v in report.violations]


def main(args: argparse.Namespace) -> None:
    if reason := realnode.unsupported_reason():
        raise SystemExit(f"real nodes cannot run here: {reason}")
    state = Path(tempfile.mkdtemp(prefix="nodegate-chaos-real-", dir="/var/tmp"))
    dev = DevCluster(state)
    started = time.monotonic()
    try:
        dev.up(real_nodes=RealNodeSpec(args.real_nodes, {POOL: "real"}), progress=print)
        images = ensure_images(dev, host=dev.network.gateway, progress=print)
        asyncio.run(services.install_crds(dev))
        services.start_webhook(dev, print)
        services.start_operator(dev, print, env={"NODEGATE_POLL_SECONDS": "2", "NODEGATE_IMAGE_PULL_GRACE": "60",
                                                 "NODEGATE_REBOOT_TIMEOUT": str(REBOOT_TIMEOUT)})
        nodes = realnode.node_names(args.real_nodes)
        results, violations = asyncio.run(rounds(dev, images["shellscript"], nodes, args.rounds, args.seed,
                                                 args.timeout))
    finally:
        dev.down(quiet=True)
        # The nodes' mounts lived in their own mount namespaces, gone with them; never delete through one.
        if not any(line.split()[1].startswith(str(state)) for line in Path("/proc/mounts").read_text().splitlines()):
            shutil.rmtree(state, ignore_errors=True)
    injected = Counter(r["fault"] for r in results)
    survived = Counter(r["fault"] for r in results if r["survived"])
    print()
    print(f"Real-node chaos: {len(results)} rounds on {args.real_nodes} real nodes "
          f"({time.monotonic() - started:.0f}s wall)")
    for fault in FAULTS:
        print(f"  {fault:<11} injected {injected[fault]:>2}, survived {survived[fault]:>2}")
    print(f"faults survived: {sum(survived.values())} of {len(results)}; violations: {len(violations)}")
    for v in violations:
        print(f"  VIOLATION {v}")
    if args.json:
        args.json.write_text(json.dumps({"mode": "real-nodes", "rounds": results, "injected": dict(injected),
                                         "survived": dict(survived), "violations": violations}, indent=2) + "\n")
    raise SystemExit(0 if not violations and all(r["survived"] for r in results) else 1)
