"""Real nodes out of service: from apply to complete for the four example packages, against a kwok node.

    python -m bench.realnode.run                       # two real nodes, cold then warm
    python -m bench.realnode.run --reboot-seconds 0 --json figures.json
    python -m bench.realnode.run --staging-concurrency 0   # stage while serving off: every step in the window
    python -m bench.realnode.run --no-reboot            # the interrupt is chrony's restart: no reboot

One control plane with real nodes (a kubelet, containerd and runc of their own; gate/devcluster/
realnode.py), one kwok node, the webhook and the operator. The same gate, the four packages of
`packages/` with their real images by digest (a merged reboot interrupt), is applied twice: cold
(the nodes pull every image) and warm (a second gate of the same packages: the images are there).
Each pass goes over the real nodes one at a time (budget 1), then over the kwok node, the baseline
of the same run. Figures printed, per pass:

* each node's **out-of-service window**: from its cordon to its uncordon (from its first stage pod's
  start to its last one's end where the round needs no cordon), and the **host work** inside it: the
  agent's steps (one container per stage of a package) and the node's reboot (the interrupt's start to
  Ready with a new boot ID); the rest of the window is overhead (pod starts, pulls, the operator);
* the **serving work** outside it: the steps a staging pod ran on the node before its cordon (stage
  while serving, `--staging-concurrency`: grub-cmdline's and module-blocklist's serving steps), from
  the staging pod's container times. Staging, undo and prepull pods run before the cordon by design:
  they are kept apart, so neither the window, its host work nor its transitions count them;
* apply to complete per node, real against kwok;
* where a real node's time goes, from its stage pods (watched as they run, since the operator deletes
  the pods that ended) and the kubelet's Events: image pulls, pod start (sandbox, pulls, container
  creation), the payload copies, the agent's steps, the reboot, and what is left (the operator's and
  the control plane's share).

`--json FILE` writes `out_of_service_s`, `host_work_s`, `serving_work_s` and `host_work_own_timing_s` (the agent's own
time of each step, not the API's whole-second container times, plus the reboot; medians over the run's real
nodes, warm) beside every node's figures. Nothing here asserts on time: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.realnode import idle
from gate.api import keys
from gate.controller.pods import pod_steps, stage_pod_ended
from gate.controller.steporder import side_by_side
from gate.devcluster import services
from gate.devcluster.cluster import DevCluster, NodeSpec, RealNodeSpec
from gate.devcluster.images import ensure_images
from gate.devcluster.realnode import KUBELET_FEATURE_GATES_ENV, NODE_OS, feature_gates
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODEGATES, NODES, PODS, KubeClient
from gate.kube.objects import container_statuses, parse_time, pod_ended

PACKAGES = ("sysctl-tuning", "chrony-conf", "grub-cmdline", "module-blocklist")
NAMESPACE = "nodegate-system"
PULLED = re.compile(r"in ([0-9.]+)(ms|s) \(")
# The pods of a round that run before its cordon, while the node serves: not the window's.
AHEAD_KINDS = frozenset({"staging", "unstage", keys.PREPULL_KIND})
# gate -> node -> the round's transitions ([who, seconds, what]), for --json
TRANSITIONS: dict[str, dict[str, list[list[Any]]]] = {}


def gate_manifest(name: str, nodes: list[str], images: dict[str, str], *, reboot: bool = True) -> dict[str, Any]:
    """The gate of the four packages; without `reboot` (--no-reboot), grub-cmdline's and module-blocklist's
    change is left for the node's next boot, so the round's interrupt is chrony's restart alone."""
    boot = {"type": "reboot" if reboot else "none"}
    interrupts = {"sysctl-tuning": {"type": "none"},
                  "chrony-conf": {"type": "service", "services": ["chrony.service"]},
                  "grub-cmdline": boot, "module-blocklist": boot}
    env = {"grub-cmdline": [{"name": "KERNEL_ARGS", "value": "nodegate.bench=1"}],
           "module-blocklist": [{"name": "MODULES", "value": "nodegate_no_such_module"}]}
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                             "values": nodes}]},
                     "interruptionBudget": {"count": 1},
                     "packages": {p: {"version": "1.0.0", "image": images[p], "interrupt": interrupts[p],
                                      "env": env.get(p, [])} for p in PACKAGES}}}


def _t(text: str | None) -> float | None:
    at = parse_time(text)
    return at.timestamp() if at else None


class PodTimes:
    """The last status seen of every stage pod on one node (the operator deletes them when done): the
    window's in `pods`, the staging pods (run before the cordon) in `staging`."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.staging: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, idle.PodSeen] = {}  # when the watch saw each pod created, ended, gone
        # Every container run seen to end, per pod, from any of its statuses: a pod that held a reboot may be
        # read last on the new boot, where the kubelet no longer reports the steps that ran before it.
        self.runs: dict[str, dict[str, tuple[float, float]]] = {}
        # The agent's own time of each step that ended, per pod (its summary's durationSeconds): the API's
        # container times are whole seconds, so a step of 30 ms may read as 0 or 1 s of host work.
        self.durations: dict[str, dict[str, float]] = {}
        self.reboot_started: float | None = None
        self.trace: list[tuple[float, str, str, list[Any]]] = []  # NODEGATE_BENCH_TRACE: each event's container states
        self.cache = WatchCache(client, PODS, namespace=NAMESPACE, field_selector=f"spec.nodeName={node}",
                                label_selector=f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}")
        self.cache.subscribe(self._on)

    def _on(self, kind: str, pod: dict[str, Any]) -> None:
        name, now = pod["metadata"]["name"], time.time()
        ahead = (pod["metadata"].get("labels") or {}).get(keys.STAGE_KIND_LABEL)
        if ahead in AHEAD_KINDS:
            if ahead == "staging" and kind != "DELETED":
                self.staging[name] = pod
            return
        reboot = (pod["metadata"].get("labels") or {}).get(keys.INTERRUPT_LABEL) == "reboot"
        seen = self.seen.setdefault(name, idle.PodSeen(name, reboot, added=now))
        if kind == "DELETED":
            seen.gone = seen.gone or now
            return
        self.pods[name] = pod
        for container, start, end in _ran(pod):
            self.runs.setdefault(name, {}).setdefault(container, (start, end))
        for status in container_statuses(pod):
            took = _agent_seconds(status)
            if took is not None:
                self.durations.setdefault(name, {}).setdefault(status["name"], took)
        if reboot:  # the reboot step's start, from the first status that shows it (running or ended)
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                state = status.get("state") or {}
                at = _t((state.get("running") or state.get("terminated") or {}).get("startedAt"))
                if status.get("name") == "interrupt" and at is not None:
                    self.reboot_started = min(at, self.reboot_started or at)
        if os.environ.get("NODEGATE_BENCH_TRACE"):
            self.trace.append((now, kind, name, [(c.get("name"), c.get("state")) for c in container_statuses(pod)]))
        # A pod that holds the reboot (its last step) counts as running once that step runs.
        running = [c for c in container_statuses(pod) if "running" in (c.get("state") or {})
                   and (not reboot or c.get("name") == "interrupt")]
        if seen.running is None and running:
            seen.running = now
        if seen.steps_ended is None and not pod_ended(pod) and stage_pod_ended(pod):
            seen.steps_ended = now
        if seen.ended is None and pod_ended(pod):
            seen.ended = now

    def seen_pods(self) -> list[idle.PodSeen]:
        """Each pod's watch times, with the API's own timestamps of its last status seen."""
        for name, seen in self.seen.items():
            pod = self.pods.get(name)
            if pod is None:
                continue
            seen.created = _t(pod["metadata"].get("creationTimestamp"))
            starts, ends = [], []
            for container in container_statuses(pod):
                for state in (container.get("state") or {}, container.get("lastState") or {}):
                    run = state.get("terminated") or state.get("running") or {}
                    if (at := _t(run.get("startedAt"))) is not None:
                        starts.append(at)
                    if (at := _t(run.get("finishedAt"))) is not None:
                        ends.append(at)
            seen.first_start = min(starts) if starts else None
            seen.last_finish = max(ends) if ends else None
        return list(self.seen.values())

    def intervals(self) -> dict[str, list[tuple[float, float]]]:
        """Wall-clock intervals of each kind of work on the node, from the stage pods' own timestamps."""
        out: dict[str, list[tuple[float, float]]] = {"pod start": [], "payload copy": [], "agent steps": []}
        for pod in self.pods.values():
            labels = pod["metadata"].get("labels") or {}
            reboot = labels.get(keys.INTERRUPT_LABEL) == "reboot"
            in_turn = labels.get(keys.IN_TURN_LABEL) == "true"
            previous = _t(pod["metadata"].get("creationTimestamp"))
            runs = self.runs.get(pod["metadata"]["name"], {})
            for container, (start, end) in sorted(runs.items(), key=lambda run: run[1]):
                if reboot and container == "interrupt":
                    continue  # the reboot, the last step of its pod: measured on its own, to the node's return
                if in_turn and previous is not None and not container.startswith("payload-"):
                    # Steps in turn start with the pod, and each runs from the end of the one before it: the
                    # wait for its turn is not host work.
                    start = min(end, max(start, previous))
                # Sandbox, image pulls and container creation: before the first container and between
                # one and the next (a package's image, or NodeGate's, is pulled only when first needed).
                # Checks side by side overlap: nothing starts between them.
                if previous is not None and start > previous:
                    out["pod start"].append((previous, start))
                out["payload copy" if container.startswith("payload-") else "agent steps"].append((start, end))
                previous = end if previous is None else max(previous, end)
        return out

    def agent_seconds(self) -> float:
        """The window's agent steps by the agent's own timing: one after another in a pod (a chain or in turn),
        the longest of checks side by side; the reboot's step is left to the reboot's own measure."""
        total = 0.0
        for name, pod in self.pods.items():
            labels = pod["metadata"].get("labels") or {}
            took = {c: t for c, t in self.durations.get(name, {}).items()
                    if not (c == "interrupt" and labels.get(keys.INTERRUPT_LABEL) == "reboot")}
            total += max(took.values(), default=0.0) if side_by_side(pod_steps(pod)) else sum(took.values())
        return total

    def serving(self) -> list[tuple[float, float]]:
        """The staged steps: the agent containers of the node's staging pods, before its cordon."""
        return [(start, end) for pod in self.staging.values() for container, start, end in _ran(pod)
                if not container.startswith("payload-")]

    def interrupt_started(self) -> float | None:
        """When the reboot's agent container started (it never ends: the reboot kills it)."""
        if self.reboot_started is not None:
            return self.reboot_started
        for pod in self.pods.values():
            if (pod["metadata"].get("labels") or {}).get(keys.INTERRUPT_LABEL) != "reboot":
                continue
            for status in (pod.get("status") or {}).get("containerStatuses") or []:  # the reboot: the pod's last step
                state = status.get("state") or {}
                started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
                last = ((status.get("lastState") or {}).get("terminated") or {}).get("startedAt")
                if started or last:
                    return _t(last or started)
        return None


def _agent_seconds(status: dict[str, Any]) -> float | None:
    """An ended agent container's own run time, from its JSON summary (None for a payload copy, or no summary)."""
    term = (status.get("state") or {}).get("terminated") or {}
    if str(status.get("name", "")).startswith("payload-") or not term.get("message"):
        return None
    try:
        took = json.loads(term["message"]).get("durationSeconds")
    except (ValueError, AttributeError):
        return None
    return float(took) if isinstance(took, (int, float)) else None


def _ran(pod: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(container, start, finish) of each container of the pod that ended, in the order they ran: its
    init containers (payload copies and every step but the last), then the last step."""
    status = pod.get("status") or {}
    out = []
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        run = (container.get("state") or {}).get("terminated") or {}
        start, end = _t(run.get("startedAt")), _t(run.get("finishedAt"))
        if start is not None and end is not None:
            out.append((container["name"], start, end))
    return out


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


class NodeTrail:
    """What the node showed, when: its cordon, boot ID and readiness at each of its watch events."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.seen: list[tuple[float, bool, str, bool]] = []  # (when, unschedulable, boot ID, Ready)
        self.cache = WatchCache(client, NODES, field_selector=f"metadata.name={node}")
        self.cache.subscribe(self._on)

    def _on(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        ready = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}.get("Ready") == "True"
        self.seen.append((time.time(), bool(obj["spec"].get("unschedulable")),
                          obj["status"].get("nodeInfo", {}).get("bootID", ""), ready))

    def events(self) -> list[idle.NodeSeen]:
        return [idle.NodeSeen(*seen) for seen in self.seen]

    def cordoned(self) -> tuple[float, float] | None:
        """From the first cordon to the uncordon after it, as the watch saw them."""
        start = next((t for t, cordoned, _, _ in self.seen if cordoned), None)
        if start is None:
            return None
        end = next((t for t, cordoned, _, _ in self.seen if t > start and not cordoned), None)
        return (start, end) if end is not None else None

    def back_from_reboot(self, after: float) -> float | None:
        """When the node was Ready with a boot ID other than the one it had at `after`."""
        before = [boot for t, _, boot, _ in self.seen if t <= after]
        if not before:
            return None
        return next((t for t, _, boot, ready in self.seen if t > after and boot != before[-1] and ready), None)


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


async def one_pass(client: KubeClient, name: str, nodes: list[str], images: dict[str, str], *, real: bool,
                   timeout: float, reboot: bool) -> dict[str, dict[str, float]]:
    """Apply the gate to `nodes` (one at a time: budget 1) and measure each: node -> figures."""
    times = {node: PodTimes(client, node) for node in nodes}
    trails = {node: NodeTrail(client, node) for node in nodes}
    for watch in [*times.values(), *trails.values()]:
        await watch.cache.start()
    started = time.monotonic()
    await client.apply(gate_manifest(name, nodes, images, reboot=reboot), field_manager="bench")
    done = await complete(client, name, timeout)
    await asyncio.sleep(1)
    for watch in [*times.values(), *trails.values()]:
        await watch.cache.stop()
    if trace := os.environ.get("NODEGATE_BENCH_TRACE"):
        with open(f"{trace}-{name}.json", "w") as f:
            json.dump({node: t.trace for node, t in times.items()}, f, indent=1)
    out = {}
    for node in nodes:
        figures = _figures(times[node], trails[node], real=real)
        figures["apply to complete (gate)"] = done - started
        if real:
            figures["image pulls (summed)"], count = await pull_seconds(client, node)
            figures["images pulled"] = float(count)
        out[node] = figures
        gaps = idle.transitions(times[node].seen_pods(), trails[node].events(), times[node].interrupt_started())
        TRANSITIONS.setdefault(name, {})[node] = [[g.who, g.seconds, g.what] for g in gaps]
        figures.update({f"idle: {who}": seconds for who, seconds in idle.summary(gaps).items()})
        print(f"\nTransitions of {name} (watch times exact, API times whole seconds):")
        print("\n".join(idle.table(node, gaps)))
    return out


def _figures(times: PodTimes, trail: NodeTrail, *, real: bool) -> dict[str, float]:
    spans = times.intervals()
    began = times.interrupt_started()
    back = trail.back_from_reboot(began) if real and began is not None else None
    spans["reboot"] = [(began, back)] if began is not None and back is not None else []
    pods = [iv for kind, found in spans.items() if kind != "reboot" for iv in found]
    window = trail.cordoned() or ((min(a for a, _ in pods), max(b for _, b in pods)) if pods else (0.0, 0.0))
    start, end = window

    def inside(found: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(max(a, start), min(b, end)) for a, b in found if min(b, end) > max(a, start)]

    figures = {kind: union(inside(found)) for kind, found in spans.items()}
    figures["out of service"] = end - start
    figures["host work"] = union(inside(spans["agent steps"] + spans["reboot"]))
    figures["host work (own timing)"] = times.agent_seconds() + figures["reboot"]
    serving = times.serving()
    figures["serving work"] = union(serving)  # outside the window: the staging pod ends before the cordon
    figures["serving work in the window"] = union(inside(serving))  # 0 when the cordon waited for it
    figures["node idle"] = figures["out of service"] - union(inside([iv for found in spans.values() for iv in found]))
    figures["stage pods"] = float(len(times.pods))
    return figures


async def measure(dev: DevCluster, images: dict[str, str], real_nodes: list[str], kwok_node: str,
                  timeout: float, reboot: bool) -> dict[str, dict[str, dict[str, float]]]:
    """pass ("cold", "warm") -> node -> figures, the kwok node's beside the real ones'."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    async with await dev.client() as client:
        for label in ("cold", "warm"):
            out[label] = await one_pass(client, f"bench-{label}-real", real_nodes, images, real=True,
                                        timeout=timeout, reboot=reboot)
            out[label].update(await one_pass(client, f"bench-{label}-kwok", [kwok_node], images, real=False,
                                             timeout=timeout, reboot=reboot))
        for label in ("cold", "warm"):
            for kind in ("real", "kwok"):
                with contextlib.suppress(Exception):
                    await client.delete(NODEGATES, f"bench-{label}-{kind}")
    return out


def report(runs: dict[str, dict[str, dict[str, float]]], kwok_node: str, job_seconds: float,
           reboot: float) -> dict[str, Any]:
    print(f"\nFour packages (merged reboot interrupt) per node, one node at a time; kwok stage pods run "
          f"{job_seconds:g} s, a real reboot stays down {reboot:g} s")
    print(f"\n  {'pass':<5} {'node':<14} {'out of service':>15} {'host work':>10} {'overhead':>9} "
          f"{'pod start':>10} {'idle':>6} {'pulls (sum)':>12} {'staged before':>14}")
    for label, nodes in runs.items():
        for node, f in nodes.items():
            print(f"  {label:<5} {node:<14} {f['out of service']:>13.1f} s {f['host work']:>8.1f} s "
                  f"{f['out of service'] - f['host work']:>7.1f} s {f['pod start']:>8.1f} s {f['node idle']:>4.1f} s "
                  f"{f.get('image pulls (summed)', 0.0):>10.1f} s {f['serving work']:>12.1f} s")
    warm = [f for node, f in runs["warm"].items() if node != kwok_node]
    summary = {"out_of_service_s": round(statistics.median(f["out of service"] for f in warm), 2),
               "host_work_s": round(statistics.median(f["host work"] for f in warm), 2),
               "serving_work_s": round(statistics.median(f["serving work"] for f in warm), 2),
               "host_work_own_timing_s": round(statistics.median(f["host work (own timing)"] for f in warm), 2)}
    extra = summary["out_of_service_s"] - summary["host_work_s"]
    own = summary["out_of_service_s"] - summary["host_work_own_timing_s"]
    kwok = runs["warm"][kwok_node]
    print(f"\nWarm, median over {len(warm)} real nodes: out of service {summary['out_of_service_s']:.1f} s, host "
          f"work {summary['host_work_s']:.1f} s, beyond the host work {extra:.1f} s (target: at most 3 s; "
          f"{own:.1f} s beyond the agent's own timing of its steps and the reboot); "
          f"staged while serving, outside the window: {summary['serving_work_s']:.1f} s; "
          f"kwok: out of service {kwok['out of service']:.1f} s, idle {kwok['node idle']:.1f} s")
    first = next(f for node, f in runs["cold"].items() if node != kwok_node)
    total = first["out of service"]
    print("\nWhere a cold real node's window goes (wall clock; kinds of work overlap when pods run side by side):")
    rows = [
        ("pod start: sandbox, CNI, image pulls, container create", first["pod start"]),
        ("payload copy (init container)", first["payload copy"]),
        ("agent steps (the agent container's run)", first["agent steps"]),
        ("reboot: the interrupt's start to Ready with a new boot ID", first["reboot"]),
        ("nothing runs on the node: the operator and the control plane", first["node idle"]),
    ]
    for label, value in rows:
        print(f"  {label:<64} {value:6.1f} s  {100 * value / total if total else 0:5.1f}%")
    return {**summary, "passes": runs, "transitions": TRANSITIONS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-nodes", type=int, default=2, help="real nodes, measured one at a time (default 2)")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="kwok stage pod run time (default 1)")
    parser.add_argument("--reboot-seconds", type=float, default=20.0,
                        help="how long a real node stays down in a reboot (default 20, as in the tests)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    parser.add_argument("--staging-concurrency", type=int, default=None, metavar="N",
                        help="the operator's --staging-concurrency (default: the operator's own, stage while serving "
                             "on; 0: off, every step runs in the window)")
    parser.add_argument("--suite", default="bookworm", choices=sorted(NODE_OS),
                        help="Debian release of the real nodes' roots (default bookworm: containerd 1.6; "
                             "trixie: containerd 1.7, which sends the container events EventedPLEG needs)")
    parser.add_argument("--no-reboot", action="store_true",
                        help="grub-cmdline and module-blocklist with interrupt none: the round's interrupt is "
                             "chrony's restart, its window the stages, the restart and the check after it")
    parser.add_argument("--kubelet-feature-gates", default="", metavar="GATES",
                        help="the real nodes' kubelet feature gates, e.g. EventedPLEG=true (default none)")
    args = parser.parse_args()
    os.environ["NODEGATE_REALNODE_REBOOT_SECONDS"] = str(args.reboot_seconds)
    feature_gates(args.kubelet_feature_gates)  # refused here, before a cluster starts
    os.environ[KUBELET_FEATURE_GATES_ENV] = args.kubelet_feature_gates
    with tempfile.TemporaryDirectory(prefix="ng-bench-realnode-") as tmp:
        dev = DevCluster(Path(tmp))
        try:
            spec = NodeSpec(1)
            dev.up(spec, job_seconds=args.job_seconds, real_nodes=RealNodeSpec(args.real_nodes, suites=[args.suite]),
                   progress=print)
            images = ensure_images(dev, host=dev.network.gateway, progress=print)
            asyncio.run(services.install_crds(dev))
            services.start_webhook(dev, print)
            env = {"NODEGATE_POLL_SECONDS": "1"}
            if args.staging_concurrency is not None:
                env["NODEGATE_STAGING_CONCURRENCY"] = str(args.staging_concurrency)
            services.start_operator(dev, print, env=env)
            real_nodes = [c.name for c in dev.real_node_configs()]
            runs = asyncio.run(measure(dev, images, real_nodes, spec.names()[0], args.timeout,
                                       reboot=not args.no_reboot))
            figures = report(runs, spec.names()[0], args.job_seconds, args.reboot_seconds)
            if args.json:
                Path(args.json).write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
                print(f"\nFigures written to {args.json}")
        finally:
            dev.down(quiet=True)


if __name__ == "__main__":
    main()
