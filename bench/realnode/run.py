"""One node from apply to complete for the four example packages: a real node against a kwok node.

    python -m bench.realnode.run                # cold: the real node pulls every image first
    python -m bench.realnode.run --reboot-seconds 0

One control plane with one real node (a kubelet, containerd and runc of its own; gate/devcluster/
realnode.py) and one kwok node, the webhook and the operator. The same gate, the four packages of
`packages/` with their real images by digest (a merged reboot interrupt), is applied to each node in
turn. Figures printed:

* apply to complete on the real node and on the kwok node (the baseline, in the same run: kwok plays
  each stage pod for `--job-seconds`), and their ratio;
* where the real node's time goes, from its stage pods (watched as they run, since the operator
  deletes the pods of stages that succeeded) and the kubelet's Events: image pulls (the kubelet's own
  measure), pod start (creation to the payload copy starting, pulls excluded), the payload copy, the
  agent's steps (its container's run), the node's reboot (its boot ID changing to Ready again), and
  what is left: the operator's and the control plane's share (watching, deciding, cordoning, Job
  machinery);
* the stage pods and images pulled.

Nothing here asserts on time: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gate.devcluster import services
from gate.devcluster.cluster import DevCluster, NodeSpec, RealNodeSpec
from gate.devcluster.images import ensure_images
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODEGATES, NODES, PODS, KubeClient

PACKAGES = ("sysctl-tuning", "chrony-conf", "grub-cmdline", "module-blocklist")
NAMESPACE = "nodegate-system"
PULLED = re.compile(r"in ([0-9.]+)(ms|s) \(")


def gate_manifest(name: str, node: str, images: dict[str, str]) -> dict[str, Any]:
    interrupts = {"sysctl-tuning": {"type": "none"},
                  "chrony-conf": {"type": "service", "services": ["chrony.service"]},
                  "grub-cmdline": {"type": "reboot"}, "module-blocklist": {"type": "reboot"}}
    env = {"grub-cmdline": [{"name": "KERNEL_ARGS", "value": "nodegate.bench=1"}],
           "module-blocklist": [{"name": "MODULES", "value": "nodegate_no_such_module"}]}
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
                     "interruptionBudget": {"count": 1},
                     "packages": {p: {"version": "1.0.0", "image": images[p], "interrupt": interrupts[p],
                                      "env": env.get(p, [])} for p in PACKAGES}}}


def _t(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


class PodTimes:
    """The last status seen of every stage pod on one node (the operator deletes them when done)."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.cache = WatchCache(client, PODS, namespace=NAMESPACE, field_selector=f"spec.nodeName={node}")
        self.cache.subscribe(self._on)

    def _on(self, kind: str, pod: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.pods[pod["metadata"]["name"]] = pod

    def phases(self) -> dict[str, float]:
        start = copy = agent = 0.0
        for pod in self.pods.values():
            created = _t(pod["metadata"].get("creationTimestamp"))
            status = pod.get("status") or {}
            init = {c["name"]: c for c in status.get("initContainerStatuses") or []}
            main = {c["name"]: c for c in status.get("containerStatuses") or []}
            payload = (init.get("payload") or {}).get("state", {}).get("terminated") or {}
            run = (main.get("agent") or {}).get("state", {}).get("terminated") or {}
            p_start, p_end = _t(payload.get("startedAt")), _t(payload.get("finishedAt"))
            a_start, a_end = _t(run.get("startedAt")), _t(run.get("finishedAt"))
            first = p_start if p_start is not None else a_start
            if created is not None and first is not None:
                start += first - created
            if p_start is not None and p_end is not None:
                copy += p_end - p_start
            if a_start is not None and a_end is not None:
                agent += a_end - a_start
        return {"pod start (incl. pulls)": start, "payload copy": copy, "agent steps": agent}


async def pull_seconds(client: KubeClient, node: str) -> tuple[float, int]:
    """The kubelet's own measure of every image it pulled on `node` ("Successfully pulled ... in 1.2s")."""
    items, _ = await client.list(EVENTS, NAMESPACE, field_selector="reason=Pulled")
    total, count = 0.0, 0
    for event in items:
        if (event.get("source") or {}).get("host") != node and event.get("reportingInstance") != node:
            continue
        match = PULLED.search(event.get("message") or "")
        if match:
            value = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
            total += value
            count += 1
    return total, count


async def reboot_seconds(client: KubeClient, node: str, boot_id: str, applied: float, timeout: float) -> float:
    """From the node going away (NotReady or a new boot ID) to Ready with the new boot ID, watched."""
    down = up = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and up is None:
        obj = await client.get(NODES, node)
        ready = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}.get("Ready")
        new = obj["status"]["nodeInfo"]["bootID"] != boot_id
        if down is None and (ready != "True" or new):
            down = time.monotonic()
        if down is not None and new and ready == "True":
            up = time.monotonic()
        await asyncio.sleep(0.25)
    return (up - down) if up and down else 0.0


async def complete(client: KubeClient, name: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = (await client.get(NODEGATES, name)).get("status") or {}
        nodes = status.get("nodes") or {}
        if nodes.get("matched") and nodes.get("complete") == nodes.get("matched"):
            return time.monotonic()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"gate {name} did not complete within {timeout:.0f}s")


async def one_node(client: KubeClient, name: str, node: str, images: dict[str, str], *, real: bool,
                   timeout: float) -> dict[str, float]:
    times = PodTimes(client, node)
    await times.cache.start()
    boot_id = (await client.get(NODES, node))["status"]["nodeInfo"]["bootID"]
    started = time.monotonic()
    await client.apply(gate_manifest(name, node, images), field_manager="bench")
    reboot = asyncio.create_task(reboot_seconds(client, node, boot_id, started, timeout)) if real else None
    done = await complete(client, name, timeout)
    await asyncio.sleep(1)
    await times.cache.stop()
    figures = {"apply to complete": done - started, **times.phases(), "stage pods": float(len(times.pods))}
    if reboot is not None:
        figures["reboot (down to Ready)"] = await reboot
        pulls, count = await pull_seconds(client, node)
        figures["image pulls (kubelet)"] = pulls
        figures["images pulled"] = float(count)
    return figures


async def measure(dev: DevCluster, images: dict[str, str], timeout: float) -> tuple[dict[str, float], dict[str, float]]:
    async with await dev.client() as client:
        real = await one_node(client, "bench-real", "real-node-0", images, real=True, timeout=timeout)
        kwok = await one_node(client, "bench-kwok", "kwok-node-0", images, real=False, timeout=timeout)
        for name in ("bench-real", "bench-kwok"):
            with contextlib.suppress(Exception):
                await client.delete(NODEGATES, name)
    return real, kwok


def report(real: dict[str, float], kwok: dict[str, float], job_seconds: float, reboot: float) -> None:
    print(f"\nOne node, four packages (merged reboot interrupt); kwok stage pods run {job_seconds:g} s, "
          f"a real reboot waits {reboot:g} s down")
    print(f"  apply to complete: real {real['apply to complete']:.1f} s, kwok {kwok['apply to complete']:.1f} s, "
          f"ratio {real['apply to complete'] / kwok['apply to complete']:.2f}")
    print(f"  stage pods: real {real['stage pods']:.0f}, kwok {kwok['stage pods']:.0f}")
    print("\nWhere the real node's time goes (seconds, summed over its stage pods):")
    pulls = real.get("image pulls (kubelet)", 0.0)
    rows = [
        ("image pulls (the kubelet's measure)", pulls),
        ("pod start, pulls excluded (sandbox, CNI, containers)", real["pod start (incl. pulls)"] - pulls),
        ("payload copy (init container)", real["payload copy"]),
        ("agent steps (the agent container's run)", real["agent steps"]),
        ("reboot: down to Ready with a new boot ID", real.get("reboot (down to Ready)", 0.0)),
    ]
    accounted = sum(v for _, v in rows)
    rows.append(("the rest: operator and control plane (watch, decide, cordon, Jobs)",
                 real["apply to complete"] - accounted))
    for label, value in rows:
        share = 100 * value / real["apply to complete"]
        print(f"  {label:<68} {value:7.1f}  {share:5.1f}%")
    print(f"  ({real.get('images pulled', 0):.0f} images pulled; pod phases overlap where stage pods run side "
          "by side, so the rest can be negative)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job-seconds", type=float, default=1.0, help="kwok stage pod run time (default 1)")
    parser.add_argument("--reboot-seconds", type=float, default=20.0,
                        help="how long the real node stays down in a reboot (default 20, as in the tests)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    os.environ["NODEGATE_REALNODE_REBOOT_SECONDS"] = str(args.reboot_seconds)
    with tempfile.TemporaryDirectory(prefix="ng-bench-realnode-") as tmp:
        dev = DevCluster(Path(tmp))
        try:
            dev.up(NodeSpec(1), job_seconds=args.job_seconds, real_nodes=RealNodeSpec(1), progress=print)
            images = ensure_images(dev, host=dev.network.gateway, progress=print)
            asyncio.run(services.install_crds(dev))
            services.start_webhook(dev, print)
            services.start_operator(dev, print, env={"NODEGATE_AGENT_IMAGE": images["nodegate"],
                                                     "NODEGATE_POLL_SECONDS": "1"})
            real, kwok = asyncio.run(measure(dev, images, args.timeout))
            report(real, kwok, args.job_seconds, args.reboot_seconds)
        finally:
            dev.down(quiet=True)


if __name__ == "__main__":
    main()
