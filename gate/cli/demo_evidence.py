"""What `nodegate demo` shows at its end: the evidence that the rollout did what the story said.

While the rollout runs, a `PodLedger` watches the stage pods in nodegate-system and counts what ran
where (package stages, interrupts, checks after them). At the end the demo reads the nodes, their
state and the Events (`_evidence`, once they settled) and `summary_lines` says it in a few lines:
every node cordoned, drained, rebooted and uncordoned, which stages ran, how the planted failure
stopped its compartment and what the operator said about it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from gate.cli.demo_settings import DEMO_LABEL, FAILING_POOL, GATE, DemoError, client, manifest

# The operator's Events on a node that mark the steps of a round with an interrupt, in order.
NODE_STEPS = (("Cordoned", "cordoned"), ("Drained", "drained"), ("Rebooted", "rebooted (a new boot ID)"),
              ("Uncordoned", "uncordoned"))


# The steps of stage pods, in the order a round runs them, and how each reads.
STEP_STAGES = {"uninstall": "uninstall", "upgrade": "upgrade", "apply": "apply", "config": "config",
               "interrupt": "interrupt", "post-interrupt": "post-interrupt check",
               "post-uninstall": "post-uninstall check"}


# Pods that run a round's serving steps on the serving node before its cordon, or take them back (stage
# while serving, docs/concepts.md): not the window's. Their steps are told apart from the stages'.
STAGING_KINDS = ("staging", "unstage")


class PodLedger:
    """Every stage pod of the demo's gate as last seen, by a watch of the operator's namespace that runs
    in a thread of its own for the whole rollout. The operator deletes each stage pod once the node's
    state records its steps, so only a watch sees them all; a relist after a lost watch may miss a pod
    created and deleted in between (the summary then counts fewer, never more)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def observe(self, kind: str, pod: dict[str, Any]) -> None:
        """A watch event: keep the newest copy of each of the gate's pods (a DELETED event's is its last)."""
        from gate.cli.stagepods import gate_of

        if gate_of(pod) != GATE:
            return
        meta = pod.get("metadata") or {}
        with self._lock:
            old = self._pods.get(meta.get("name", ""))
            if old is None or _resource_version(pod) >= _resource_version(old):
                self._pods[meta.get("name", "")] = pod

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Stage pods by kind, their steps that ran (whose container terminated) by stage, and how many
        of those failed. A staging or undo pod's steps are not counted: the window's stage runs those
        packages again, skipping what was staged, or, for a stage staged whole, runs no container (the
        check after the interrupt takes it over)."""
        from gate.cli.stagepods import kind_of, step_states

        with self._lock:
            pods = list(self._pods.values())
        kinds: dict[str, int] = {}
        steps: dict[str, int] = {}
        failed = 0
        for pod in pods:
            kinds[kind_of(pod)] = kinds.get(kind_of(pod), 0) + 1
            if kind_of(pod) in STAGING_KINDS:
                continue
            for step in step_states(pod):
                if step.phase in ("succeeded", "failed"):
                    steps[step.step.stage] = steps.get(step.step.stage, 0) + 1
                    failed += step.phase == "failed"
        return kinds, steps, failed

    def start(self, timeout: float = 30.0) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), name="demo-stage-pods",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self.error is not None:
            self.stop()
            raise DemoError(f"could not watch the stage pods in nodegate-system: {self.error or 'no answer'}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)

    async def _watch(self) -> None:
        from gate.cli.stagepods import SELECTOR
        from gate.kube.cache import WatchCache
        from gate.kube.client import PODS

        try:
            async with await client() as kube:
                cache = WatchCache(kube, PODS, namespace="nodegate-system", label_selector=SELECTOR)
                cache.subscribe(self.observe)
                await cache.start()
                self._ready.set()
                try:
                    while not self._stop.is_set():
                        await asyncio.sleep(0.1)
                finally:
                    await cache.stop()
        except Exception as exc:  # said by start(), or the summary counts what was seen until then
            self.error = exc
            self._ready.set()


def _resource_version(obj: dict[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class Evidence:
    """What the cluster shows once the rollout is over, for the summary to state and nothing else.

    Events are best effort (and the operator sends an identical one at most once per ten minutes), so
    they prove that a step happened on a node, never how often."""

    node_reasons: dict[str, frozenset[str]]  # demo node -> reasons of the operator's Events about it
    installed: dict[str, dict[str, str]]  # demo node -> package -> version, from its state annotation
    cordoned: tuple[str, ...]  # demo nodes unschedulable now
    gate_reasons: dict[str, int]  # reason -> how many of the operator's Events about the gate
    gate_warnings: tuple[tuple[str, str], ...]  # (reason, note) of the gate's Warning and Resumed Events
    pods: dict[str, int]  # kind (stages, interrupt, post-interrupt, ...) -> stage pods the watch saw
    steps: dict[str, int]  # stage -> steps of those pods whose container terminated
    steps_failed: int  # of those, the ones that exited non-zero
    wanted: dict[str, str]  # package -> version the gate asks for


def summary_lines(report: Any, ev: Evidence, bad_node: str) -> list[str]:
    """The summary, each statement counted from `report` (the gate status and node labels) or `ev`."""
    nodes = sorted(ev.node_reasons)
    total = len(nodes)
    failed_nodes = f", {len(report.failed)} failed" if report.failed else ""
    lines = [f"NodeGate {GATE}: {report.summary}, {report.complete} of {report.matched} nodes complete{failed_nodes}."]

    good, bad = ev.gate_reasons.get("BatchSucceeded", 0), ev.gate_reasons.get("BatchFailed", 0)
    lines.append(f"{good + bad} batches across {len(report.compartments)} compartments, {bad} failed "
                 "(the gate's Events).")

    seen = {reason: [n for n in nodes if reason in ev.node_reasons[n]] for reason, _ in NODE_STEPS}
    if total and all(len(v) == total for v in seen.values()):
        lines.append(f"Every node ({total}) was " + _series([text for _, text in NODE_STEPS]) +
                     ", by the operator's Events on the nodes.")
    else:
        parts = [f"{len(seen[reason])} of {total} {text}" for reason, text in NODE_STEPS]
        lines.append("The operator's Events on the nodes: " + ", ".join(parts) + ".")
    lines.append("Cordoned now: " + (", ".join(ev.cordoned) if ev.cordoned else "none") + ".")

    full = [n for n in nodes if all(ev.installed.get(n, {}).get(p) == v for p, v in ev.wanted.items())]
    versions = ", ".join(f"{p} {v}" for p, v in sorted(ev.wanted.items()))
    lines.append(f"{len(full)} of {total} nodes record all {len(ev.wanted)} packages installed at the gate's "
                 f"versions in their state annotation ({versions}).")

    if ev.pods:
        ran = ", ".join(f"{ev.steps[s]} {STEP_STAGES[s]}" for s in STEP_STAGES if s in ev.steps)
        pods = sum(n for kind, n in ev.pods.items() if kind not in STAGING_KINDS)
        steps = sum(ev.steps.values())
        lines.append(f"{pods} stage pods ran {steps} steps ({ran or 'none'}); {ev.steps_failed} failed "
                     "(a watch of the stage pods).")
        staged, undone = (ev.pods.get(kind, 0) for kind in STAGING_KINDS)
        if staged:
            lines.append(f"{staged} staging pods ran the serving steps on nodes still serving, before their cordon"
                         + (f"; {undone} undo pods took back what was staged for a node not interrupted." if undone
                            else "."))
        whole = [n for n in nodes if "StagedWhole" in ev.node_reasons[n]]
        if whole:
            lines.append(f"On {len(whole)} of {total} nodes stages staged whole ran no container in the window "
                         "(Event StagedWhole): their checks after the reboot took them over.")
        interrupts = ev.steps.get("interrupt", 0)
        if interrupts == total and len(seen["Rebooted"]) == total:
            lines.append(f"{interrupts} interrupt steps for {total} nodes: the packages' interrupts were merged "
                         "into one reboot per node.")
    else:
        lines.append("The watch of the operator's namespace saw no stage pod: no count of steps run.")

    stopped = ev.gate_reasons.get("CompartmentStopped", 0)
    resumed = ev.gate_reasons.get("Resumed", 0)
    if stopped and resumed and bad_node in ev.installed and bad_node in full:
        lines.append(f"The planted failure on {bad_node} stopped {FAILING_POOL} after {bad} failed "
                     f"batch{'es' if bad != 1 else ''}; a rerun and a resume finished it.")
    else:
        lines.append(f"The planted failure on {bad_node}: {stopped} CompartmentStopped and {resumed} Resumed "
                     f"Events; {bad_node} is {report.node_states.get(bad_node, 'unknown')}.")
    if ev.gate_warnings:
        lines.append("What the NodeGate's Events say about it:")
        for reason, note in ev.gate_warnings[:8]:
            kind = "Normal" if reason == "Resumed" else "Warning"
            lines.append(f"  {kind:8} {reason:20} {_readable(note)}")
    return lines


def _series(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


async def _evidence(nodes: list[str], ledger: PodLedger) -> Evidence:
    from gate.api import keys
    from gate.api.state import StateParseError, load_state
    from gate.controller.events import CLUSTER_EVENTS_NAMESPACE, CONTROLLER
    from gate.kube.client import EVENTS, NODES

    wanted = {name: pkg["version"] for name, pkg in manifest("gate.yaml")["spec"]["packages"].items()}
    async with await client() as kube:
        (node_items, _), (events, _) = await asyncio.gather(
            kube.list(NODES, label_selector=f"{DEMO_LABEL}=true"), kube.list(EVENTS, CLUSTER_EVENTS_NAMESPACE))
    installed: dict[str, dict[str, str]] = {}
    cordoned = []
    for node in node_items:
        name = node["metadata"]["name"]
        try:
            state = load_state((node["metadata"].get("annotations") or {}).get(keys.state_annotation(GATE)))
        except StateParseError:
            state = None
        installed[name] = {p: i.version for p, i in state.installed.items()} if state else {}
        if (node.get("spec") or {}).get("unschedulable"):
            cordoned.append(name)
    reasons: dict[str, set[str]] = {n: set() for n in nodes}
    gate_reasons: dict[str, int] = {}
    warnings = []
    for e in sorted(events, key=lambda e: e.get("eventTime") or ""):
        regarding = e.get("regarding") or {}
        if e.get("reportingController") != CONTROLLER:
            continue
        if regarding.get("kind") == "Node" and regarding.get("name") in reasons:
            reasons[regarding["name"]].add(e.get("reason", ""))
        elif regarding.get("kind") == "NodeGate" and regarding.get("name") == GATE:
            gate_reasons[e.get("reason", "")] = gate_reasons.get(e.get("reason", ""), 0) + 1
            if e.get("type") == "Warning" or e.get("reason") == "Resumed":
                warnings.append((e.get("reason", ""), e.get("note", "")))
    pods, steps, steps_failed = ledger.counts()
    return Evidence(node_reasons={n: frozenset(r) for n, r in reasons.items()}, installed=installed,
                    cordoned=tuple(sorted(cordoned)), gate_reasons=gate_reasons, gate_warnings=tuple(warnings),
                    pods=pods, steps=steps, steps_failed=steps_failed, wanted=wanted)


async def settled_evidence(nodes: list[str], ledger: PodLedger, timeout: float = 10.0) -> Evidence:
    """The evidence once the operator's last Events are in: it sends a node's Complete Event after the
    node's write that the status reflects, so a summary read at once could miss the last few."""
    deadline = time.monotonic() + timeout
    last = await _evidence(nodes, ledger)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        ev = await _evidence(nodes, ledger)
        if ev == last and all("Complete" in r for r in ev.node_reasons.values()):
            return ev
        last = ev
    return last


def _readable(note: str) -> str:
    """An Event's note on one line, with an agent's JSON summary in it shown as `failure_message` does."""
    from gate.api.state import failure_message

    start = note.find("{")
    if start >= 0:
        note = note[:start] + failure_message(note[start:])
    line = " ".join(note.split())
    return line if len(line) <= 140 else line[:137] + "..."
