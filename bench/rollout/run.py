"""Fleet rollout benchmark on the real control plane with kwok nodes.

    python -m bench.rollout.run --nodes 1000                  # issue 5: 3 compartments, budget 10%
    python -m bench.rollout.run --nodes 100 --budget 100 --compartments 1   # issue 4: operator overhead
    python -m bench.rollout.run --nodes 1000 --soak 0 --registry-images     # issue 34: beside ...
    python -m bench.rollout.run --nodes 1000 --soak 0 --image-signatures    # ... an enforcing policy

One NodeGate with three packages and a service interrupt; every step of a stage pod runs for
`--stage-seconds` on its simulated node. A node runs its round in one stage pod: the three applies,
the interrupt and the three post-interrupt checks, its steps one after another: seven stage times.
Figures printed:

* makespan: apply of the gate to its Ready condition;
* lower bound: batches needed under each compartment's ceiling x the time one node takes alone,
  measured in the same run on a node of its own (the baseline), and the same with the bare simulated
  stage time (7 x stage seconds) for reference;
* the same lower bound with the time one *batch* takes alone (every compartment's first batch at once
  on nodes of their own, measured in the same run): on two cores the control plane's throughput,
  not NodeGate, sets how long a batch of a hundred nodes takes, and this ratio isolates what the
  operator adds on top (gaps between batches, planning, its own requests);
* the most nodes disrupted (cordoned) at once per compartment, seen by a watcher of our own, next
  to the ceiling;
* API requests the operator sent per node; operator CPU seconds and peak RSS;
* during the fleet rollout (`during_fleet_rollout`), each control-plane process's and the operator's CPU,
  most cores over one interval and RSS, read from /proc, and the machine's load (a line every minute);
* with `--soak S` (default 30; 0: off), what a soak adds (DeploymentPolicy `health`): the same
  rollout again on the same nodes, under the same policy plus `health: {soak: S, nodeConditions}`,
  twice in the same run: with batches as large as the ceiling (each of the 11 batches waits for its
  nodes' soak before the next starts), and with one batch per compartment (a soaking node frees its
  slot, so nodes flow through the budget and only the last soak is waited for). Each makespan is
  printed with what it adds to the rollout without soak, and the most nodes in a round at once.

* with `--registry-images`, the packages' images (and NodeGate's agent image, by tag) are small
  images in the dev registry, and the operator resolves them to digests; `--image-signatures` adds
  an enforcing signature policy (the dev key, `gate.devcluster.cosign`, which signed them all), and
  prints the verifier's registry lookups and requests (issue 34's cost). kwok nodes pull nothing.
* with `--tracemalloc DIR`, the operator's Python allocations are traced from its first import
  (`bench/rollout/tracehook`), a snapshot is taken as the fleet rollout starts and as it ends, and
  `tracemalloc` lists what grew between them by source line, next to the operator's RSS at both
  moments (RSS beyond the traced total is the interpreter's arenas and the C heap). Tracing slows the
  operator: its CPU and makespan figures are not comparable then.
* with `--heap-stats DIR`, nothing is traced: the same hook splits the operator's RSS as the fleet rollout
  starts and ends (Python's small-object arenas, their live and free bytes; glibc's heap, in use and free;
  resident bytes by mapping), and says how long Python's garbage collector ran so far, by generation, at
  the operator's usual speed.

Nothing here asserts on time: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate.controller.settings import OperatorSettings
from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.devcluster.services import SOURCE_ROOT, install_crds, running_agent_image, start_operator
from gate.kube.cache import WatchCache
from gate.kube.client import NODEGATES, NODES, POLICIES, KubeClient

# Pinned by digest, as a resolved rollout's stage pods pull them (`gate.lifecycle.images`): a node that
# reports one in `status.images` has it, whatever tags point where.
PACKAGES = {
    name: {"version": "1.0.0",
           "image": f"registry.example.com/{name}@sha256:{hashlib.sha256(name.encode()).hexdigest()}",
           "interrupt": {"type": "service", "services": [name]}}
    for name in ("kernel-tuning", "gpu-driver-cfg", "security-agent")
}


async def report_images(client: KubeClient, agent_image: str) -> None:
    """Every node reports the round's images (the packages' and the agent's) in `status.images`, as a
    kubelet does for the images it holds: a fleet whose images were pulled before (an earlier rollout,
    a node image that bakes them in). The operator then starts no prepull pod for them."""
    names = [p["image"] for p in PACKAGES.values()] + [agent_image]
    images = [{"names": [n], "sizeBytes": 50_000_000} for n in names]
    nodes, _ = await client.list(NODES, transform=lambda n: {"metadata": {"name": n["metadata"]["name"]}})
    sem = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with sem:
            await client.patch(NODES, name, {"status": {"images": images}}, subresource="status")

    await asyncio.gather(*(one(n["metadata"]["name"]) for n in nodes))


AGENT_REPOSITORY = "nodegate/bench-agent"  # not nodegate/nodegate: the registry storage is shared


def use_registry_images(cluster: DevCluster, *, sign: bool) -> dict[str, str]:
    """Push a small image per package (and the agent's, under a tag) to the cluster's registry, point
    `PACKAGES` at them, and with `sign` sign them with the dev key and make the enforcing dev policy the
    operator's; the operator's environment (its agent image)."""
    from gate.devcluster import cosign, registry
    from gate.devcluster.services import AGENT_IMAGE_ENV, set_image_signatures

    port = registry.start_registry(cluster.procs, lambda m: print(m, flush=True))
    host = f"127.0.0.1:{port}"
    pushed = []
    for name, package in PACKAGES.items():
        digest = registry.push_small_image(port, f"nodegate/{name}", "1.0.0", f"bench {name}")
        package["image"] = f"{host}/nodegate/{name}"
        pushed.append(f"{host}/nodegate/{name}@{digest}")
    agent = registry.push_small_image(port, AGENT_REPOSITORY, "bench", "bench agent")
    pushed.append(f"{host}/{AGENT_REPOSITORY}@{agent}")
    if sign:
        public_key = cosign.sign_images(pushed, lambda m: print(m, flush=True))
        if public_key is None:
            raise SystemExit("--image-signatures needs cosign: python -m gate.devcluster.build builds it")
        set_image_signatures(cluster, cosign.dev_signature_policy([host], public_key.read_text()))
    return {AGENT_IMAGE_ENV: f"{host}/{AGENT_REPOSITORY}:bench"}


def signature_costs(lines: list[str]) -> dict[str, float]:
    """The operator's signature lookups and their HTTP requests so far, and the verdicts by result."""
    out: dict[str, float] = {}
    for line in lines:
        for name in ("nodegate_image_signature_lookups_total", "nodegate_image_signature_requests_total"):
            if line.startswith(f"{name} "):
                out[name.removeprefix("nodegate_image_signature_")] = float(line.split()[1])
        if line.startswith("nodegate_image_verifications_total{"):
            labels, value = sample(line)
            out[f"verdicts_{labels['result']}"] = value
    return out


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of a process, from /proc."""
    cpu, _, peak = proc_sample(pid)
    return cpu, peak


def proc_sample(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS bytes now, peak RSS bytes since it started) of a process, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return cpu, rss, peak


def machine_busy() -> float:
    """CPU seconds the whole machine was busy since boot (every process, other sessions' too)."""
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle, iowait
    return (sum(values[:8]) - idle) / ticks


class PlaneSampler:
    """What the control plane's processes and the operator use while the fleet rolls out, read from /proc
    every `every` seconds: per process the CPU seconds, the most cores used over one interval, the
    largest RSS seen and the peak RSS since it started (VmHWM, node creation included); for the machine
    the load average and its busy cores (every process on it, other sessions' too). With `report`, a
    line of the current figures every `report` seconds, so that a long run can be followed."""

    def __init__(self, pids: dict[str, int], *, every: float = 5.0, report: float = 0.0,
                 extra: Callable[[], str] | None = None) -> None:
        self.pids = pids
        self.every = every
        self.report = report
        self.extra = extra
        self.cpu0: dict[str, float] = {}
        self.cpu1: dict[str, float] = {}
        self.peak_cores: dict[str, float] = defaultdict(float)
        self.peak_rss: dict[str, int] = defaultdict(int)
        self.hwm: dict[str, int] = {}
        self.loads: list[float] = []
        self.busy: list[float] = []
        self.started = 0.0
        self.elapsed = 0.0
        self.busy0 = 0.0
        self.busy1 = 0.0

    def _read(self) -> dict[str, tuple[float, int, int]]:
        out = {}
        for name, pid in self.pids.items():
            try:
                out[name] = proc_sample(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return out

    async def run(self) -> None:
        self.started = last_t = time.monotonic()
        last = self._read()
        self.cpu0 = {n: v[0] for n, v in last.items()}
        self.busy0 = last_busy = machine_busy()
        next_report = self.started + self.report
        while True:
            await asyncio.sleep(self.every)
            now_t, now, busy = time.monotonic(), self._read(), machine_busy()
            span = max(now_t - last_t, 1e-3)
            cores = {n: (v[0] - last[n][0]) / span for n, v in now.items() if n in last}
            for n, (cpu, rss, hwm) in now.items():
                self.peak_cores[n] = max(self.peak_cores[n], cores.get(n, 0.0))
                self.peak_rss[n] = max(self.peak_rss[n], rss)
                self.hwm[n] = hwm
                self.cpu1[n] = cpu
            self.loads.append(os.getloadavg()[0])
            self.busy.append((busy - last_busy) / span)
            self.busy1, self.elapsed = busy, now_t - self.started
            if self.report and now_t >= next_report:
                next_report += self.report
                parts = ", ".join(f"{n} {cores.get(n, 0.0):.2f} cores {rss / 2**20:.0f} MiB"
                                  for n, (_, rss, _) in sorted(now.items()))
                more = f"; {self.extra()}" if self.extra else ""
                print(f"  {self.elapsed:.0f}s: load {self.loads[-1]:.1f}, machine {self.busy[-1]:.2f} cores busy"
                      f"{more}; {parts}", flush=True)
            last, last_t, last_busy = now, now_t, busy

    def figures(self) -> dict[str, Any]:
        elapsed = max(self.elapsed, 1e-3)
        procs = {n: {"cpu_s": round(self.cpu1[n] - self.cpu0.get(n, 0.0), 1),
                     "mean_cores": round((self.cpu1[n] - self.cpu0.get(n, 0.0)) / elapsed, 2),
                     "peak_cores": round(self.peak_cores[n], 2),
                     "peak_rss_sampled_mib": round(self.peak_rss[n] / 2**20, 1),
                     "peak_rss_since_start_mib": round(self.hwm[n] / 2**20, 1)}
                 for n in sorted(self.cpu1)}
        loads = self.loads or [0.0]
        return {"sampled_s": round(self.elapsed, 1), "every_s": self.every, "processes": procs,
                "machine": {"load_average_1m": {"min": round(min(loads), 1), "mean": round(sum(loads) / len(loads), 1),
                                                "max": round(max(loads), 1)},
                            "busy_cores_mean": round((self.busy1 - self.busy0) / elapsed, 2),
                            "busy_cores_peak": round(max(self.busy or [0.0]), 2),
                            "of_them_these_processes_mean": round(sum(p["mean_cores"] for p in procs.values()), 2)}}


def operator_metrics(port: int) -> list[str]:
    """The operator's /metrics, as lines of Prometheus text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode().splitlines()


def api_requests(lines: list[str]) -> tuple[float, dict[str, float]]:
    """The operator's requests so far: the total, and by "VERB resource"."""
    total, by = 0.0, {}
    for line in lines:
        if line.startswith("nodegate_api_requests "):
            total = float(line.split()[1])
        elif line.startswith("nodegate_api_requests_by_resource_total{"):
            labels, value = sample(line)
            by[f"{labels['verb']} {labels['resource']}"] = value
    return total, by


def reconciles(lines: list[str]) -> dict[str, tuple[float, float]]:
    """The operator's reconciles so far by kind (gate, node, ...): (how many, seconds spent)."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for line in lines:
        for field, index in (("count", 0), ("sum", 1)):
            if line.startswith(f"nodegate_reconcile_duration_seconds_{field}{{"):
                labels, value = sample(line)
                out[labels["kind"]][index] = value
    return {kind: (count, seconds) for kind, (count, seconds) in out.items()}


def sample(line: str) -> tuple[dict[str, str], float]:
    """The labels and value of one Prometheus text sample."""
    return dict(re.findall(r'(\w+)="([^"]*)"', line)), float(line.rsplit(" ", 1)[1])


async def server_writes(client: KubeClient) -> dict[str, float]:
    """Write requests the API server served so far, from every client (the operator, the controller
    manager, kwok), by "VERB resource": what the control plane spends its CPU on during a rollout. Those
    it refused (a 409 on a stale resourceVersion, a 404 on a pod already gone) are counted there too, as
    they always were here, and once more under "refused" (not part of the total)."""
    out: dict[str, float] = defaultdict(float)
    for line in (await client.get_text("/metrics")).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        pairs, value = sample(line)
        if pairs.get("verb") in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
            sub = f"/{pairs['subresource']}" if pairs.get("subresource") else ""
            out[f"{pairs['verb']} {pairs.get('resource', '')}{sub}"] += value
            if not str(pairs.get("code", "")).startswith("2"):
                out["refused (409, 404, ...)"] += value
    return out


def per_node(after: dict[str, float], before: dict[str, float], nodes: int) -> dict[str, float]:
    diff = {k: round((v - before.get(k, 0.0)) / nodes, 2) for k, v in after.items()}
    return dict(sorted(((k, v) for k, v in diff.items() if v > 0), key=lambda kv: -kv[1]))


class DisruptionWatch:
    """Counts cordoned nodes per compartment label, independently of the operator. Its cache keeps of a
    Node only what it reads (10,000 whole Nodes would be the bench's largest memory)."""

    def __init__(self, client: KubeClient, label: str) -> None:
        self.label = label
        self.cache = WatchCache(client, NODES, label_selector="bench=rollout", transform=self._keep)
        self.cordoned: dict[str, set[str]] = defaultdict(set)
        self.peak: dict[str, int] = defaultdict(int)
        self.cache.subscribe(self._on)

    def _keep(self, node: dict[str, Any]) -> dict[str, Any]:
        meta = node["metadata"]
        return {"metadata": {"name": meta["name"], "resourceVersion": meta.get("resourceVersion"),
                             "labels": {self.label: (meta.get("labels") or {}).get(self.label, "?")}},
                "spec": {"unschedulable": bool((node.get("spec") or {}).get("unschedulable"))}}

    def now(self) -> dict[str, int]:
        return {pool: len(names) for pool, names in sorted(self.cordoned.items())}

    def _on(self, kind: str, node: dict[str, Any]) -> None:
        pool = (node["metadata"].get("labels") or {}).get(self.label, "?")
        name = node["metadata"]["name"]
        if kind != "DELETED" and (node.get("spec") or {}).get("unschedulable"):
            self.cordoned[pool].add(name)
        else:
            self.cordoned[pool].discard(name)
        self.peak[pool] = max(self.peak[pool], len(self.cordoned[pool]))


# The status each gate showed last (`wait_ready`), for the progress lines of a long rollout.
LAST_STATUS: dict[str, dict[str, Any]] = {}


def progress_of(name: str) -> str:
    """Per compartment of the gate's last status: its batch, and its nodes complete of those matched."""
    comps = LAST_STATUS.get(name, {}).get("compartments") or []
    return ", ".join(f"{c.get('name')} batch {c.get('batch', 0)} {c.get('complete', 0)}/{c.get('matched', 0)} done"
                     for c in comps)


async def wait_ready(client: KubeClient, name: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        gate = await client.get(NODEGATES, name)
        status = LAST_STATUS[name] = gate.get("status") or {}
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if status.get("observedGeneration") == gate["metadata"]["generation"] and conds.get("Ready") == "True":
            return time.monotonic()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"gate {name} not Ready within {timeout:.0f}s")


def gate_manifest(name: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": selector}, "packages": PACKAGES, **spec}}


async def timed_rollout(client: KubeClient, manifest: dict[str, Any], timeout: float) -> float:
    """Apply to Ready, in seconds; printed as soon as it is known, so that a long run that is cut short
    still leaves the rollouts it finished (the summary is printed at the end)."""
    start = time.monotonic()
    name = manifest["metadata"]["name"]
    await client.apply(manifest, field_manager="bench", force=True)
    took = await wait_ready(client, name, timeout) - start
    print(f"rollout {name}: Ready after {took:.1f}s (load average {os.getloadavg()[0]:.1f})", flush=True)
    return took


def fleet_policy(name: str, pools: list[str], budget: int, batch: int, soak: float | None = None) -> dict[str, Any]:
    """A policy of one compartment per pool, `batch` the strategy's batch; with `soak`, nodes soak."""
    health = {"soak": f"{soak:g}s", "nodeConditions": [{"type": "GpuUnhealthy", "status": "True"}]}
    extra = {"health": health} if soak is not None else {}
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": name},
            "spec": {"default": {"budget": {"percent": budget}, **extra},
                     "compartments": [{"name": p, "selector": {"matchLabels": {"pool": p}},
                                       "budget": {"percent": budget}, "strategy": {"fixed": {"initialBatch": batch}},
                                       **extra} for p in pools]}}


async def soak_rollouts(client: KubeClient, args: argparse.Namespace, pools: list[str], ceiling: int,
                        without: float) -> dict[str, Any]:
    """The rollout again under a soak, with batches of the ceiling and with one batch per compartment."""
    out: dict[str, Any] = {"soak_s": args.soak}
    for mode, batch in (("batches_of_the_ceiling", ceiling), ("one_batch_per_compartment", args.nodes)):
        name = f"bench-soak-{'batched' if batch == ceiling else 'flow'}"
        await client.apply(fleet_policy(name, pools, args.budget, batch, args.soak), field_manager="bench", force=True)
        watch = DisruptionWatch(client, "pool")
        await watch.cache.start()
        makespan = await timed_rollout(client, gate_manifest(name, {"bench": "rollout"}, deploymentPolicy=name),
                                       args.timeout)
        await watch.cache.stop()
        out[mode] = {"makespan_s": round(makespan, 2), "added_by_soak_s": round(makespan - without, 2),
                     "peak_disrupted": dict(watch.peak)}
    return out


TRACEHOOK = Path(__file__).resolve().parent / "tracehook"


async def tracemalloc_snapshot(folder: Path | None, name: str) -> None:
    """Ask the operator's hook (`--tracemalloc` or `--heap-stats`) for a snapshot `name`; wait until it is
    written."""
    if folder is None:
        return
    (folder / f"{name}.request").touch()
    deadline = time.monotonic() + 600
    while (folder / f"{name}.request").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


def tracemalloc_growth(folder: Path, first: str, second: str, top: int = 25) -> dict[str, Any]:
    """What grew in the operator between two snapshots, by source line, and its RSS at both."""
    import tracemalloc

    before = tracemalloc.Snapshot.load(str(folder / f"{first}.snapshot"))
    after = tracemalloc.Snapshot.load(str(folder / f"{second}.snapshot"))
    at = {n: json.loads((folder / f"{n}.json").read_text()) for n in (first, second)}
    mib = 2**20
    by_line = after.compare_to(before, "lineno")
    largest = after.statistics("traceback")[:5]
    return {
        "traced_mib": {n: round(v["traced"] / mib, 1) for n, v in at.items()},
        "rss_mib": {n: round(v["rss"] / mib, 1) for n, v in at.items()},
        "grew_by_line": [{"where": str(d.traceback[0]), "kib": round(d.size_diff / 1024), "blocks": d.count_diff}
                         for d in by_line[:top]],
        "largest_at_end": [{"kib": round(st.size / 1024), "blocks": st.count,
                            "traceback": [str(f) for f in st.traceback[:8]]} for st in largest],
    }


def heap_stats(folder: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The operator's RSS split at each snapshot, in MiB (`--heap-stats`)."""
    def mib(figures: dict[str, int]) -> dict[str, float]:
        return {k: round(v / 2**20, 1) for k, v in figures.items() if k != "arenas"}

    out = {}
    for name in names:
        at = json.loads((folder / f"{name}.json").read_text())
        out[name] = {"rss_mib": round(at["rss"] / 2**20, 1), "pymalloc_mib": mib(at["pymalloc"]),
                     "glibc_mib": mib(at["glibc"]), "resident_by_mapping_mib": mib(at["resident_by_mapping"]),
                     "gc": at["gc"]}
    return out


PY_SPY = Path(sys.executable).parent / "py-spy"


def py_spy(out: Path | None, pid: int) -> subprocess.Popen[bytes] | None:
    """Sample the operator with py-spy during the fleet rollout (folded stacks into `out`), if asked."""
    if out is None:
        return None
    return subprocess.Popen([str(PY_SPY), "record", "--nonblocking", "-r", "40",
                             "-f", "raw", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measure(cluster: DevCluster, args: argparse.Namespace, pid: int, port: int) -> dict[str, Any]:
    client = await cluster.client(timeout=120)
    try:
        # Baseline: one node alone, same packages and interrupt: what one node takes end to end.
        baseline = await timed_rollout(client, gate_manifest("bench-baseline", {"bench": "baseline"}), 300)
        # Batch baseline: as many nodes as one batch of every compartment, all at once.
        batch_alone = await timed_rollout(client, gate_manifest("bench-batch", {"bench": "batch"},
                                                                interruptionBudget={"percent": 100}),
                                          max(600.0, args.nodes * 0.3))

        pools = [f"pool-{chr(ord('a') + i)}" for i in range(args.compartments)]
        spec: dict[str, Any]
        if args.compartments > 1 or args.budget < 100:
            policy = {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy",
                      "metadata": {"name": "bench-fleet"},
                      "spec": {"default": {"budget": {"percent": args.budget}},
                               "compartments": [
                                   {"name": p, "selector": {"matchLabels": {"pool": p}},
                                    "budget": {"percent": args.budget},
                                    # batches as large as the budget allows: the budget alone sets the pace
                                    "strategy": {"fixed": {"initialBatch": args.nodes}}}
                                   for p in pools]}}
            await client.apply(policy, field_manager="bench", force=True)
            spec = {"deploymentPolicy": "bench-fleet"}
        else:
            spec = {"interruptionBudget": {"percent": 100}}
        if not args.cold_nodes:  # once the operator knows the packages' repositories (the gates above name them)
            await report_images(client, running_agent_image(cluster) or OperatorSettings().agent_image)
        watch = DisruptionWatch(client, "pool")
        await watch.cache.start()
        cpu0, _ = proc_stats(pid)
        metrics0 = operator_metrics(port)
        req0, by0 = api_requests(metrics0)
        rec0 = reconciles(metrics0)
        writes0 = await server_writes(client)
        sampler = PlaneSampler({n: p.pid for n, p in cluster.processes().items()}, every=args.sample_seconds,
                               report=60.0, extra=lambda: f"cordoned now {watch.now()}, at most {dict(watch.peak)}; "
                                                          f"{progress_of('bench-fleet')}")
        sampling = asyncio.create_task(sampler.run())
        await tracemalloc_snapshot(args.tracemalloc or args.heap_stats, "fleet-start")
        profiler = py_spy(args.py_spy, pid)
        fleet_started = time.monotonic()
        finished = True
        timeout = args.timeout if args.end_by is None else max(60.0, min(args.timeout, args.end_by - time.time()))
        try:
            makespan = await timed_rollout(client, gate_manifest("bench-fleet", {"bench": "rollout"}, **spec),
                                           timeout)
        except TimeoutError as exc:  # figures of the part that ran, and how far it went
            print(f"{exc}: the figures below are of the rollout so far", flush=True)
            finished, makespan = False, time.monotonic() - fleet_started
        sampling.cancel()
        if profiler is not None:  # py-spy writes its file when interrupted
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=120)
        await tracemalloc_snapshot(args.tracemalloc or args.heap_stats, "fleet-end")
        cpu1, peak_rss = proc_stats(pid)
        metrics1 = operator_metrics(port)
        req1, by1 = api_requests(metrics1)
        rec1 = reconciles(metrics1)
        writes1 = await server_writes(client)
        await watch.cache.stop()
        signatures = {"whole_run": signature_costs(metrics1),
                      "fleet_rollout": {k: v - signature_costs(metrics0).get(k, 0.0)
                                        for k, v in signature_costs(metrics1).items()}}
        gate = await client.get(NODEGATES, "bench-fleet")
        comps = {c["name"]: c for c in gate["status"]["compartments"]}
        per_pool = {}
        batches = 0
        for pool in pools:
            comp = comps.get(pool) or comps["__default__"]
            need = math.ceil(comp["matched"] / max(1, comp["ceiling"]))
            batches = max(batches, need)
            per_pool[pool] = {"matched": comp["matched"], "ceiling": comp["ceiling"], "batches": need,
                              "peak_disrupted": watch.peak.get(pool, 0)}
        simulated = (2 * len(PACKAGES) + 1) * args.stage_seconds  # applies, the interrupt, the checks
        soak = None
        if args.soak > 0 and len(pools) > 1 and finished:
            ceiling = max(p["ceiling"] for p in per_pool.values())
            soak = await soak_rollouts(client, args, pools, ceiling, makespan)
        traced = tracemalloc_growth(args.tracemalloc, "fleet-start", "fleet-end") if args.tracemalloc else None
        return {
            "tracemalloc": traced,
            "heap_stats": heap_stats(args.heap_stats, ("fleet-start", "fleet-end")) if args.heap_stats else None,
            "images": "registry, signed, enforce" if args.image_signatures else
                      "registry, no policy" if args.registry_images else "registry.example.com (not resolved)",
            "signatures": signatures if args.image_signatures else None,
            "soak": soak,
            "nodes": args.nodes, "compartments": args.compartments, "budget_percent": args.budget,
            "event_loop": args.event_loop, "cold_nodes": args.cold_nodes,
            "stage_seconds": args.stage_seconds,
            "baseline_one_node_s": round(baseline, 2),
            "finished": finished,
            # Unfinished (--timeout): the time it ran, and the nodes done per compartment then.
            "makespan_s": round(makespan, 2),
            "progress_at_end": progress_of("bench-fleet"),
            "lower_bound_s": round(batches * baseline, 2),
            "ratio_vs_lower_bound": round(makespan / (batches * baseline), 3),
            "batch_alone_s": round(batch_alone, 2),
            "lower_bound_batch_s": round(batches * batch_alone, 2),
            "ratio_vs_batch_bound": round(makespan / (batches * batch_alone), 3),
            "simulated_lower_bound_s": round(batches * simulated, 2),
            "ratio_vs_simulated_bound": round(makespan / (batches * simulated), 3),
            "overhead_over_simulated_s": round(makespan - batches * simulated, 2),
            "compartments_detail": per_pool,
            "never_over_ceiling": all(p["peak_disrupted"] <= p["ceiling"] for p in per_pool.values()),
            "api_requests_per_node": round((req1 - req0) / args.nodes, 1),
            "operator_requests_per_node_by": per_node(by1, by0, args.nodes),
            "control_plane_writes_per_node": round(sum(v for k, v in per_node(writes1, writes0, args.nodes).items()
                                                       if not k.startswith("refused")), 1),
            "control_plane_writes_per_node_by": per_node(writes1, writes0, args.nodes),
            "operator_cpu_s": round(cpu1 - cpu0, 1),
            "operator_peak_rss_mib": round(peak_rss / 2**20, 1),
            # The control plane's own (and the operator's) CPU and memory during the fleet rollout, and the
            # machine's load then: on two cores shared with other work, what sets the pace.
            "during_fleet_rollout": sampler.figures(),
            # Where the operator's time goes: a gate reconcile plans the whole fleet; a node one steps a node.
            "operator_reconciles": {kind: {"count": int(n - rec0.get(kind, (0, 0))[0]),
                                           "seconds": round(s - rec0.get(kind, (0, 0))[1], 1)}
                                    for kind, (n, s) in sorted(rec1.items())},
        }
    finally:
        for name in ("bench-fleet", "bench-baseline", "bench-batch", "bench-soak-batched", "bench-soak-flow"):
            await client.delete(NODEGATES, name)
        for name in ("bench-fleet", "bench-soak-batched", "bench-soak-flow"):
            await client.delete(POLICIES, name)
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--compartments", type=int, default=3)
    parser.add_argument("--budget", type=int, default=10, help="percent per compartment")
    parser.add_argument("--stage-seconds", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=16, help="operator node reconcile workers")
    parser.add_argument("--event-loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the operator's event loop (its --event-loop), to compare the two")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the fleet rollout may take (default: an hour, or 0.6 s per node if more)")
    parser.add_argument("--end-by", type=float, default=None,
                        help="a Unix time by which the fleet rollout stops, finished or not (its figures so far are "
                             "printed): a long run on a shared machine that must end by a given hour")
    parser.add_argument("--sample-seconds", type=float, default=5.0,
                        help="how often the control plane's CPU and RSS are read from /proc during the fleet rollout")
    parser.add_argument("--soak", type=float, default=30.0,
                        help="seconds of soak for the rollouts that measure what a soak adds (0: none)")
    parser.add_argument("--cold-nodes", action="store_true",
                        help="nodes report no images (by default each reports the round's, as a node that pulled "
                             "them before does, and gets no prepull pod)")
    parser.add_argument("--registry-images", action="store_true",
                        help="package and agent images in the dev registry, resolved to digests by the operator")
    parser.add_argument("--image-signatures", action="store_true",
                        help="--registry-images, signed with the dev key, under an enforcing signature policy")
    parser.add_argument("--tracemalloc", type=Path, default=None, metavar="DIR",
                        help="trace the operator's allocations; snapshots at the fleet rollout's start and end go "
                             "to DIR, and what grew between them is printed (CPU figures are not comparable then)")
    parser.add_argument("--heap-stats", type=Path, default=None, metavar="DIR",
                        help="split the operator's RSS (Python's arenas, glibc's heap, mappings) as the fleet rollout "
                             "starts and ends, without tracing")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="FILE",
                        help="sample the operator with py-spy (40 Hz, without pausing it) during the fleet rollout; "
                             "folded stacks go to FILE")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.py_spy and not PY_SPY.exists():  # said now, not after the nodes are up
        parser.error(f"--py-spy needs py-spy beside this Python ({PY_SPY}): pip install py-spy")
    args.registry_images = args.registry_images or args.image_signatures
    if args.timeout is None:
        args.timeout = max(3600.0, args.nodes * 0.6)

    state = Path(tempfile.mkdtemp(prefix="nodegate-bench-"))
    cluster = DevCluster(state)
    try:
        t0 = time.monotonic()
        cluster.up(NodeSpec(1, {"bench": "baseline"}, prefix="baseline-"), job_seconds=args.stage_seconds,
                   progress=lambda m: print(m, flush=True))
        pools = [f"pool-{chr(ord('a') + i)}" for i in range(args.compartments)]
        per = args.nodes // len(pools)
        ceiling = max(1, per * args.budget // 100)
        # Ready within a second of nodes each at the least (creates and kwok's Ready status on two shared cores).
        asyncio.run(cluster.add_nodes(NodeSpec(ceiling * len(pools), {"bench": "batch"}, prefix="batch-"),
                                      timeout=max(600.0, ceiling * len(pools) * 1.0)))
        for i, pool in enumerate(pools):
            count = per if i < len(pools) - 1 else args.nodes - per * (len(pools) - 1)
            asyncio.run(cluster.add_nodes(NodeSpec(count, {"bench": "rollout", "pool": pool},
                                                   prefix=f"{pool}-"), timeout=max(600.0, count * 1.0)))
            print(f"{pool}: {count} nodes ready after {time.monotonic() - t0:.1f}s", flush=True)
        print(f"{args.nodes} nodes ready in {time.monotonic() - t0:.1f}s", flush=True)
        asyncio.run(install_crds(cluster))
        env = use_registry_images(cluster, sign=args.image_signatures) if args.registry_images else {}
        if args.tracemalloc:
            args.tracemalloc.mkdir(parents=True, exist_ok=True)
            env.update(PYTHONPATH=f"{TRACEHOOK}:{SOURCE_ROOT}", NODEGATE_BENCH_TRACEMALLOC=str(args.tracemalloc))
        elif args.heap_stats:
            args.heap_stats.mkdir(parents=True, exist_ok=True)
            env.update(PYTHONPATH=f"{TRACEHOOK}:{SOURCE_ROOT}", NODEGATE_BENCH_HEAPSTATS=str(args.heap_stats))
        resolve = ["--resolve-digests", "true"] if args.registry_images else []
        port = start_operator(cluster, lambda m: print(m, flush=True), env=env,
                              extra=["--workers", str(args.workers), "--poll-seconds", "1",
                                     "--event-loop", args.event_loop, *resolve])
        pid = cluster.processes()["operator"].pid
        result = asyncio.run(measure(cluster, args, pid, port))
        plane = {n: proc_stats(p.pid)[1] for n, p in cluster.processes().items() if n != "operator"}
        result["control_plane_peak_mib"] = round(sum(plane.values()) / 2**20, 1)
        result["kube_apiserver_peak_mib"] = round(plane.get("kube-apiserver", 0) / 2**20, 1)
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        cluster.down(quiet=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
