"""One node from apply to complete for the four example packages: a real node against a kwok node.

    python -m bench.realnode.run                # cold: the real node pulls every image first
    python -m bench.realnode.run --reboot-seconds 0

One control plane with one real node (a kubelet, containerd and runc of its own; gate/devcluster/
realnode.py) and one kwok node, the webhook and the operator. The same gate, the four packages of
`packages/` with their real images by digest (a merged reboot interrupt), is applied to each node in
turn. Figures printed:

* apply to complete on the real node and on the kwok node (the baseline, in the same run: kwok plays
  each stage pod for `--job-seconds`), and their ratio;
* where the real node's time goes, from its stage pods (one per phase of the round, watched as they
  run, since the operator deletes the pods that ended) and the kubelet's Events: image pulls (the
  kubelet's own measure), pod start (creation to its first container, and the gaps between its
  containers: sandbox, image pulls and container creation), the payload copies (a `payload-<package>`
  init container each), the agent's steps (one container per stage of a package), the node's reboot
  (its boot ID changing to Ready again), and what is left: the operator's and the control plane's
  share (watching, deciding, cordoning, creating and deleting pods);
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
from pathlib import Path
from typing import Any

from gate.api import keys
from gate.devcluster import services
from gate.devcluster.cluster import DevCluster, NodeSpec, RealNodeSpec
from gate.devcluster.images import ensure_images
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODEGATES, NODES, PODS, KubeClient
from gate.kube.objects import parse_time

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
    at = parse_time(text)
    return at.timestamp() if at else None


class PodTimes:
    """The last status seen of every stage pod on one node (the operator deletes them when done)."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.cache = WatchCache(client, PODS, namespace=NAMESPACE, field_selector=f"spec.nodeName={node}",
                                label_selector=f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}")
        self.cache.subscribe(self._on)

    def _on(self, kind: str, pod: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.pods[pod["metadata"]["name"]] = pod

    def intervals(self) -> dict[str, list[tuple[float, float]]]:
        """Wall-clock intervals of each kind of work on the node, from the stage pods' own timestamps."""
        out: dict[str, list[tuple[float, float]]] = {"pod start": [], "payload copy": [], "agent steps": []}
        for pod in self.pods.values():
            if keys.INTERRUPT_LABEL in (pod["metadata"].get("labels") or {}):
                continue  # the reboot: measured on its own, from this pod's start to the node's return
            status = pod.get("status") or {}
            # Its containers in the order they ran: the init containers (payload copies and every
            # step but the last), then the last step.
            previous = _t(pod["metadata"].get("creationTimestamp"))
            for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
                run = (container.get("state") or {}).get("terminated") or {}
                start, end = _t(run.get("startedAt")), _t(run.get("finishedAt"))
                if start is None or end is None:
                    continue
                # Sandbox, image pulls and container creation: before the first container and between
                # one and the next (a package's image, or NodeGate's, is pulled only when first needed).
                if previous is not None:
                    out["pod start"].append((previous, start))
                out["payload copy" if container["name"].startswith("payload-") else "agent steps"].append((start, end))
                previous = end
        return out

    def interrupt_started(self) -> float | None:
        """When the reboot's agent container started (it never ends: the reboot kills it)."""
        for pod in self.pods.values():
            if keys.INTERRUPT_LABEL not in (pod["metadata"].get("labels") or {}):
                continue
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                state = status.get("state") or {}
                started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
                last = ((status.get("lastState") or {}).get("terminated") or {}).get("startedAt")
                if started or last:
                    return _t(last or started)
        return None


async def pull_seconds(client: KubeClient, node: str) -> tuple[float, int]:
    """The kubelet's own measure of every image it pulled on `node` ("Successfully pulled ... in 1.2s")."""
    items, _ = await client.list(EVENTS, NAMESPACE, field_selector="reason=Pulled")
    total, count = 0.0, 0
    for event in items:
        host = (event.get("deprecatedSource") or {}).get("host") or event.get("reportingInstance")
        match = PULLED.search(event.get("note") or "")
        if host == node and match:
            total += float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
            count += 1
    return total, count


async def back_with_new_boot_id(client: KubeClient, node: str, boot_id: str, timeout: float) -> float:
    """When (epoch seconds) `node` is Ready again with a boot ID other than `boot_id`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj = await client.get(NODES, node)
        ready = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}.get("Ready")
        if obj["status"]["nodeInfo"]["bootID"] != boot_id and ready == "True":
            return time.time()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{node} did not come back from its reboot within {timeout:.0f}s")


async def complete(client: KubeClient, name: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = (await client.get(NODEGATES, name)).get("status") or {}
        nodes = status.get("nodes") or {}
        if nodes.get("matched") and nodes.get("complete") == nodes.get("matched"):
            return time.monotonic()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"gate {name} did not complete within {timeout:.0f}s")


def union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval (stage pods run side by side)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


async def one_node(client: KubeClient, name: str, node: str, images: dict[str, str], *, real: bool,
                   timeout: float) -> dict[str, float]:
    times = PodTimes(client, node)
    await times.cache.start()
    boot_id = (await client.get(NODES, node))["status"]["nodeInfo"]["bootID"]
    started, wall_started = time.monotonic(), time.time()
    await client.apply(gate_manifest(name, node, images), field_manager="bench")
    back = asyncio.create_task(back_with_new_boot_id(client, node, boot_id, timeout)) if real else None
    done = await complete(client, name, timeout)
    wall_done = wall_started + (done - started)
    await asyncio.sleep(1)
    await times.cache.stop()
    spans = times.intervals()
    if back is not None:
        began = times.interrupt_started()
        spans["reboot"] = [(began, await back)] if began else []
    figures = {kind: union(found) for kind, found in spans.items()}
    figures["apply to complete"] = done - started
    inside = [(max(a, wall_started), min(b, wall_done)) for found in spans.values() for a, b in found]
    figures["node idle"] = figures["apply to complete"] - union([(a, b) for a, b in inside if b > a])
    figures["stage pods"] = float(len(times.pods))
    if real:
        figures["image pulls (summed)"], count = await pull_seconds(client, node)
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
          f"a real reboot stays down {reboot:g} s")
    print(f"  apply to complete: real {real['apply to complete']:.1f} s, kwok {kwok['apply to complete']:.1f} s, "
          f"ratio {real['apply to complete'] / kwok['apply to complete']:.2f}")
    print(f"  stage pods: real {real['stage pods']:.0f}, kwok {kwok['stage pods']:.0f}")
    total = real["apply to complete"]
    print("\nWhere the real node's time goes (wall clock; kinds of work overlap when pods run side by side):")
    rows = [
        ("pod start: sandbox, CNI, image pulls, container create", real["pod start"]),
        ("payload copy (init container)", real["payload copy"]),
        ("agent steps (the agent container's run)", real["agent steps"]),
        ("reboot: the interrupt's start to Ready with a new boot ID", real.get("reboot", 0.0)),
        ("nothing runs on the node: the operator and the control plane", real["node idle"]),
    ]
    for label, value in rows:
        print(f"  {label:<64} {value:6.1f} s  {100 * value / total:5.1f}%")
    print(f"  image pulls, the kubelet's own measure summed over {real['images pulled']:.0f} pulls "
          f"(they overlap): {real['image pulls (summed)']:.1f} s")
    print(f"  kwok, for comparison: nothing runs {kwok['node idle']:.1f} s of {kwok['apply to complete']:.1f} s")


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
