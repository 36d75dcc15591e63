"""The operator process: leader election, watch caches, the work queue, and the executor.

Work keys and the events that make them are `gate.controller.triggers`:

* `GateKey`: plan the gate across the fleet (`gate.lifecycle.fleet.plan_gate`): start the nodes the
  rollout planner picks, put finished nodes back in line after a spec change, label and taint
  nodes, write the gate's status. Debounced: many node events make one gate reconcile.
* `NodeKey`: one step of that node's state machine (`gate.lifecycle.machine.decide`).
* `JoinKey`: the readiness taint of a node that just joined.

All read only the caches, decide without I/O, then perform the decision here. Every Node write
carries the resourceVersion it was decided on, so a decision made on a stale copy is refused by the
API server (409) and simply decided again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from gate import __version__
from gate.api import keys
from gate.api.common import Condition
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, StateParseError, load_state
from gate.controller import triggers
from gate.controller.events import EventRecorder
from gate.controller.index import StageIndex
from gate.controller.metrics import OperatorMetrics
from gate.controller.patches import node_patch
from gate.controller.pods import config_map, container_name, facts_of, stage_pod, stage_pod_view
from gate.controller.queue import WorkQueue
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import GateKey, JoinKey, NodeKey, PolicyKey, Triggered, WorkKey
from gate.controller.views import fleet_node, node_view, pod_view
from gate.kube.cache import WatchCache
from gate.kube.client import CONFIGMAPS, NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.kube.errors import ApiError, ConnectionFailed, NotFound, TooManyRequests
from gate.kube.lease import LeaderElector
from gate.kube.objects import parse_time, pod_ended, state_status
from gate.lifecycle.condition import NodeCondition, condition_patch, failure_condition
from gate.lifecycle.fleet import (
    FleetNode,
    NodeUpdate,
    disabled,
    plan_gate,
    readiness_clear,
    selects,
    taint_reason,
)
from gate.lifecycle.health import KSTATUS_TYPES, STALLED, policy_status
from gate.lifecycle.machine import (
    Decision,
    EventRequest,
    NodeChange,
    NodeContext,
    NodeView,
    Timing,
    decide,
    decide_removal,
    pod_refused,
)
from gate.lifecycle.removal import plan_removal

log = logging.getLogger("nodegate.operator")

Obj = dict[str, Any]
GATE_DEBOUNCE = 0.3


class Operator:
    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics | None = None) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics or OperatorMetrics()
        self.recorder = EventRecorder(client, settings.identity)
        self.timing = Timing(image_pull_grace=settings.image_pull_grace, pending_timeout=settings.pending_timeout,
                             reboot_timeout=settings.reboot_timeout, poll=settings.poll_seconds)
        self.queue: WorkQueue[WorkKey] = WorkQueue()
        self.gates = WatchCache(client, NODEGATES)
        self.policies = WatchCache(client, POLICIES)
        self.nodes = WatchCache(client, NODES)
        selector = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}"
        self.pods = WatchCache(client, PODS, namespace=settings.namespace, label_selector=selector)
        self.ready = False
        self._fleet_memo: dict[str, tuple[str, FleetNode]] = {}
        self._gate_memo: dict[str, tuple[str, NodeGate]] = {}
        self.index = StageIndex()
        self._gate_seen: dict[str, tuple[Any, bool]] = {}
        self._gate_cost: dict[str, float] = {}  # seconds the last reconcile of each gate took
        self._removal_release: dict[str, frozenset[str]] = {}  # per deleted gate: nodes it may release
        self._requests_reported: dict[tuple[str, str], int] = {}  # what api_requests_by counted so far
        self.elector = LeaderElector(client, settings.lease_name, settings.namespace, settings.identity,
                                     lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds,
                                     renew_deadline=settings.renew_deadline,
                                     annotations={keys.OPERATOR_VERSION_ANNOTATION: __version__})

    # -- process ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve health and metrics, and do the work whenever this replica is the leader."""
        runner = await self._serve_health()
        try:
            await self.elector.run(self._lead, self._stand_down)
        finally:
            if runner is not None:
                await runner.cleanup()

    async def _lead(self) -> None:
        self.metrics.leader.set(1)
        self.queue = WorkQueue()
        for cache in (self.gates, self.policies, self.nodes, self.pods):
            cache.synced = False
        self.pods.subscribe(self._on_pod)
        self.nodes.subscribe(self._on_node)
        self.gates.subscribe(self._on_gate)
        self.policies.subscribe(self._on_policy)
        caches = (self.gates, self.policies, self.nodes, self.pods)
        try:
            await self._start_caches(caches)
            for pod in self.pods.items():
                self.index.pod_event("ADDED", pod)
            self.ready = True
            log.info("Caches synced; gates=%d nodes=%d", len(self.gates), len(self.nodes))
            for gate in self.gates.items():  # everything, as on a spec change of every gate
                self._queue(triggers.on_gate(gate, None, self.nodes.items()))
            for policy in self.policies.items():
                self.queue.add(PolicyKey(policy["metadata"]["name"]))
            workers = [asyncio.create_task(self._worker(i)) for i in range(self.settings.workers)]
            workers.append(asyncio.create_task(self._resync()))
            await asyncio.gather(*workers)
        finally:
            self.ready = False
            self.queue.close()
            for cache in caches:
                await cache.stop()
            self.pods._listeners.clear()
            self.nodes._listeners.clear()
            self.gates._listeners.clear()
            self.policies._listeners.clear()

    async def _start_caches(self, caches: tuple[WatchCache, ...]) -> None:
        delay = 0.5
        while True:
            try:
                await asyncio.gather(*(c.start() for c in caches if not c.synced))
                return
            except (ApiError, ConnectionFailed) as exc:
                hint = " (are the NodeGate CRDs installed?)" if isinstance(exc, ApiError) and exc.status == 404 else ""
                log.warning("Caches did not sync%s; error=%s retry_in=%.1fs", hint, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _stand_down(self) -> None:
        self.metrics.leader.set(0)
        self.ready = False
        log.warning("Stopped all work: not the leader")

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            # A safety net, not the engine: every change arrives as an event; this catches a lost one.
            for gate in self.gates.items():
                self._queue(triggers.on_gate(gate, None, self.nodes.items()))

    async def _worker(self, number: int) -> None:
        while True:
            key = await self.queue.get()
            started = time.monotonic()
            try:
                match key:
                    case GateKey(gate):
                        await self.reconcile_gate(gate)
                        self._gate_cost[gate] = time.monotonic() - started
                    case PolicyKey(policy):
                        await self.reconcile_policy(policy)
                    case JoinKey(gate, node):
                        await self.reconcile_join(gate, node)
                    case NodeKey(gate, node):
                        await self.reconcile_node(gate, node)
                self.queue.forget(key)
            except asyncio.CancelledError:
                raise
            except (ApiError, ConnectionFailed) as exc:
                delay = self.queue.retry(key)
                level = logging.DEBUG if isinstance(exc, ApiError) and exc.status == 409 else logging.WARNING
                log.log(level, "Reconcile failed; key=%s error=%s retry_in=%.2fs", key, exc, delay)
                self.metrics.reconcile_errors.labels(key.kind, type(exc).__name__).inc()
            except Exception as exc:
                delay = self.queue.retry(key)
                log.exception("Reconcile crashed; key=%s retry_in=%.2fs", key, delay)
                self.metrics.reconcile_errors.labels(key.kind, type(exc).__name__).inc()
            finally:
                self.queue.done(key)
                self.metrics.reconcile_duration.labels(key.kind).observe(time.monotonic() - started)
                self.metrics.queue_depth.set(len(self.queue))

    # -- event handlers: map changes to keys ------------------------------------------------------

    def _gate_later(self, gate: str) -> None:
        # Debounce node events into gate reconciles, and never spend more than about a third of the
        # time planning: a 5,000-node plan takes a while, and it only needs to be recent, not instant.
        delay = max(GATE_DEBOUNCE, 2 * self._gate_cost.get(gate, 0.0))
        self.queue.add_after(GateKey(gate), delay)

    def _queue(self, triggered: Triggered) -> None:
        for key in triggered.now:
            self.queue.add(key)
        for gate in triggered.later:
            self._gate_later(gate)

    def _on_gate(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        self._queue(triggers.on_gate(obj, self._gate_seen.get(name), self.nodes.items(), self.policies.items()))
        self._gate_seen[name] = triggers.gate_seen(obj)

    def _on_policy(self, kind: str, obj: Obj) -> None:
        self._queue(triggers.on_policy(kind, obj, self.gates.items()))

    def _on_node(self, kind: str, obj: Obj) -> None:
        if kind == "DELETED":
            self._fleet_memo.pop(obj["metadata"]["name"], None)
        self._queue(triggers.on_node(kind, obj, self.gates.items()))

    def _on_pod(self, kind: str, pod: Obj) -> None:
        self.index.pod_event(kind, pod)
        self._queue(triggers.on_pod(kind, pod))

    # -- reading ----------------------------------------------------------------------------------

    def _gate(self, name: str) -> NodeGate | None:
        obj = self.gates.get(name)
        if obj is None:
            return None
        rv = obj["metadata"].get("resourceVersion", "")
        memo = self._gate_memo.get(name)
        if memo is not None and memo[0] == rv:
            return memo[1]
        try:
            gate = NodeGate.model_validate(obj)
        except ValidationError as exc:
            log.error("NodeGate does not parse; gate=%s error=%s", name, str(exc).splitlines()[0])
            return None
        self._gate_memo[name] = (rv, gate)
        return gate

    def _all_gates(self) -> list[NodeGate]:
        out = []
        for obj in self.gates.items():
            gate = self._gate(obj["metadata"]["name"])
            if gate is not None and not gate.metadata.deletion_timestamp and not disabled(gate):
                out.append(gate)  # a disabled gate holds no node back, and no other gate waits for it
        return out

    def _fleet(self) -> list[FleetNode]:
        out = []
        for obj in self.nodes.items():
            name = obj["metadata"]["name"]
            rv = obj["metadata"].get("resourceVersion", "")
            memo = self._fleet_memo.get(name)
            if memo is None or memo[0] != rv:
                memo = (rv, fleet_node(obj))
                self._fleet_memo[name] = memo
            out.append(memo[1])
        return out

    def _busy_nodes(self, gate: str) -> set[str]:
        """Nodes where a stage pod of `gate` has not ended."""
        busy = set()
        for node, names in self.index.nodes_with_pods(gate):
            for name in names:
                pod = self.pods.get(name, self.settings.namespace)
                if pod is not None and not pod_ended(pod):
                    busy.add(node)
                    break
        return busy

    def _stage_pods_of(self, gate: str, node: str) -> dict[str, Any]:
        views = {}
        for name in self.index.pods_of(gate, node):
            pod = self.pods.get(name, self.settings.namespace)
            if pod is not None:
                views[name] = stage_pod_view(pod)
        return views

    # -- gate reconcile ---------------------------------------------------------------------------

    async def reconcile_gate(self, name: str) -> None:
        gate = self._gate(name)
        obj = self.gates.get(name)
        if obj is None:
            # Gone (its deletion event queued this): so are its metric series, or an alert on one of
            # them (NodeGateNodeFailed, say) would keep firing for a gate that no longer exists.
            if self.metrics.forget_gate(name):
                log.info("Removed the metric series of a deleted gate; gate=%s", name)
            for memo in (self._gate_memo, self._gate_seen, self._gate_cost, self._removal_release):
                memo.pop(name, None)
            return
        if gate is None:
            return
        if gate.metadata.deletion_timestamp:
            await self._finalize(gate, obj)
            return
        if keys.FINALIZER not in gate.metadata.finalizers:
            patched = await self.client.patch(NODEGATES, name, {"metadata": {
                "finalizers": [*gate.metadata.finalizers, keys.FINALIZER],
                "resourceVersion": gate.metadata.resource_version}})
            self.gates.observe(patched)
            return  # the watch brings the new version back to us
        if disabled(gate):
            await self._disabled(gate, obj)
            return
        found, policy = await self._policy_of(gate, obj)
        if not found:
            return
        now = datetime.now(UTC)
        created = parse_time(gate.metadata.creation_timestamp)
        fleet = self._fleet()
        gplan = plan_gate(gate, policy, fleet, gates=self._all_gates(), now=now, gate_created=created,
                          busy=self._busy_nodes(name))
        self.metrics.drains_blocked_now.labels(name).set(sum(1 for n in fleet if _drain_blocked(n.states.get(name))))
        # Node writes that lost a race are retried through the queue; status waits for them so that
        # compartment progress is never written ahead of the nodes it counts.
        await self._write_node_updates(gate, gplan.updates)
        await self._sync_failure_conditions(name)
        await self._write_status(obj, gplan.status.to_wire())
        if gplan.requests_done:
            annotations: dict[str, str | None] = dict.fromkeys(gplan.requests_done)
            self.gates.observe(await self.client.patch(NODEGATES, name, {"metadata": {"annotations": annotations}}))
        for event in gplan.events:
            await self.recorder.emit(obj, event.type, event.reason, event.message)
        self._gate_metrics(gate, gplan.status.to_wire())
        self.metrics.forget_gone(name, {c.name for c in gplan.status.compartments}, set(gate.spec.packages),
                                 self._packages_in_use())

    def _packages_in_use(self) -> set[str]:
        """Packages of every gate, those being deleted included (their uninstalls still record stages)."""
        used: set[str] = set()
        for obj in self.gates.items():
            gate = self._gate(obj["metadata"]["name"])
            if gate is not None:
                used |= set(gate.spec.packages)
        return used

    async def _sync_failure_conditions(self, gate: str) -> None:
        """Every node carries the failure condition of `gate` exactly while the gate's state on it says
        failed (gate.lifecycle.condition): added on a failure, removed once the node gets another round
        or leaves the gate."""
        sem = asyncio.Semaphore(16)

        async def sync(fnode: FleetNode) -> None:
            async with sem:
                await self._write_failure_condition(gate, fnode.view, failure_condition(gate, fnode.states.get(gate)))

        await asyncio.gather(*(sync(n) for n in self._fleet()))

    async def _write_failure_condition(self, gate: str, view: NodeView, wanted: NodeCondition | None) -> None:
        kind = keys.failed_condition(gate)
        patch = condition_patch(view.conditions.get(kind), wanted, kind, datetime.now(UTC))
        if patch is None:
            return
        try:
            # Strategic merge on the status subresource: only this entry of the list (merged by type)
            # changes, whatever the kubelet writes next to it; no resourceVersion needed.
            result = await self.client.patch(NODES, view.name, patch, patch_type="strategic", subresource="status")
        except NotFound:
            return
        self.nodes.observe(result)
        self._fleet_memo.pop(view.name, None)

    async def _write_node_updates(self, gate: NodeGate, updates: Mapping[str, NodeUpdate]) -> None:
        """Write a plan's node updates, 16 at a time; the first failure is raised once all are done."""
        sem = asyncio.Semaphore(16)

        async def apply(node: str, update: NodeUpdate) -> None:
            async with sem:
                await self._write_node_update(gate, node, update)

        results = await asyncio.gather(*(apply(n, u) for n, u in updates.items()), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _policy_of(self, gate: NodeGate, obj: Obj) -> tuple[bool, DeploymentPolicy | None]:
        """The DeploymentPolicy the gate names (None: it names none); (False, None) when it is missing,
        which the gate's status then says."""
        if not gate.spec.deployment_policy:
            return True, None
        raw_policy = self.policies.get(gate.spec.deployment_policy)
        if raw_policy is None:
            await self._gate_problem(obj, gate, "PolicyNotFound",
                                     f"DeploymentPolicy {gate.spec.deployment_policy} does not exist")
            return False, None
        try:
            return True, DeploymentPolicy.model_validate(raw_policy)
        except ValidationError as exc:
            await self._gate_problem(obj, gate, "PolicyInvalid",
                                     f"DeploymentPolicy {gate.spec.deployment_policy} cannot be used: "
                                     f"{_first_error(exc)}")
            return False, None

    async def reconcile_policy(self, name: str) -> None:
        """A DeploymentPolicy's status: which spec the operator read, whether it can use it, who uses it."""
        obj = self.policies.get(name)
        if obj is None:
            return
        problem = None
        try:
            DeploymentPolicy.model_validate(obj)
        except ValidationError as exc:
            problem = _first_error(exc)
        used_by = sorted(g["metadata"]["name"] for g in self.gates.items()
                         if (g.get("spec") or {}).get("deploymentPolicy") == name)
        meta = obj["metadata"]
        previous = [Condition.model_validate(c) for c in (obj.get("status") or {}).get("conditions") or []]
        status = policy_status(meta.get("generation") or 0, used_by, problem, previous, datetime.now(UTC)).to_wire()
        if _same_status(obj.get("status") or {}, status):
            return
        try:
            patched = await self.client.patch(POLICIES, name, {"status": status, "metadata": {
                "resourceVersion": meta["resourceVersion"]}}, subresource="status")
        except NotFound:
            return
        self.policies.observe(patched)

    async def _gate_problem(self, obj: Obj, gate: NodeGate, reason: str, message: str) -> None:
        status = dict(obj.get("status") or {})
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        # Degraded, and Stalled for kstatus: the gate cannot go on until a person fixes what it names.
        conditions = [c for c in status.get("conditions") or [] if c.get("type") not in ("Degraded", *KSTATUS_TYPES)]
        for type_ in ("Degraded", STALLED):
            conditions.append({"type": type_, "status": "True", "reason": reason, "message": message,
                               "lastTransitionTime": now, "observedGeneration": gate.metadata.generation or 0})
        status.update({"conditions": conditions, "status": "Degraded",
                       "observedGeneration": gate.metadata.generation or 0})
        await self._write_status(obj, status)
        await self.recorder.emit(obj, "Warning", reason, message)

    async def _write_status(self, obj: Obj, status: Obj) -> None:
        current = obj.get("status") or {}
        if _same_status(current, status):
            return
        patched = await self.client.patch(NODEGATES, obj["metadata"]["name"],
                                          {"status": status, "metadata": {
                                              "resourceVersion": obj["metadata"]["resourceVersion"]}},
                                          subresource="status")
        self.gates.observe(patched)

    def _gate_metrics(self, gate: NodeGate, status: Obj) -> None:
        nodes = status.get("nodes", {})
        for st, field in (("complete", "complete"), ("in-progress", "inProgress"), ("failed", "failed"),
                          ("waiting", "waiting"), ("blocked", "blocked")):
            self.metrics.nodes.labels(gate.name, st).set(nodes.get(field, 0))
        for c in status.get("compartments", []):
            labels = (gate.name, c["name"])
            self.metrics.c_matched.labels(*labels).set(c.get("matched", 0))
            self.metrics.c_ceiling.labels(*labels).set(c.get("ceiling", 0))
            self.metrics.c_in_progress.labels(*labels).set(c.get("inProgress", 0))
            self.metrics.c_complete.labels(*labels).set(c.get("complete", 0))
            self.metrics.c_failed.labels(*labels).set(c.get("failed", 0))
            self.metrics.c_batch.labels(*labels).set(c.get("batch", 0))
            self.metrics.c_failures.labels(*labels).set(c.get("consecutiveFailures", 0))
            self.metrics.c_stopped.labels(*labels).set(1 if c.get("state") == "stopped" else 0)

    async def _finalize(self, gate: NodeGate, obj: Obj) -> None:
        """Deleting a gate: uninstall what can be, uncordon, remove every node key, then let go."""
        annotation = keys.state_annotation(gate.name)
        holders = [n["metadata"]["name"] for n in self.nodes.items()
                   if annotation in (n["metadata"].get("annotations") or {})]
        if holders:
            # Removal is a rollout too (gate.lifecycle.removal): the planner picks who uninstalls now.
            found, policy = await self._policy_of(gate, obj)
            if not found:
                return
            rplan = plan_removal(gate, policy, self._fleet(), now=datetime.now(UTC))
            await self._write_node_updates(gate, rplan.updates)
            self._removal_release[gate.name] = rplan.releasable
            await self._sync_failure_conditions(gate.name)  # a failed uninstall shows on its node too
            await self._write_status(obj, rplan.status.to_wire())
            if rplan.resumed:
                annotations = {keys.RESUME_ANNOTATION: None}
                self.gates.observe(await self.client.patch(NODEGATES, gate.name,
                                                           {"metadata": {"annotations": annotations}}))
            for event in rplan.events:
                await self.recorder.emit(obj, event.type, event.reason, event.message)
            self._gate_metrics(gate, rplan.status.to_wire())
            for node in holders:
                self.queue.add(NodeKey(gate.name, node))
            return  # node reconciles uninstall and remove their keys; their events bring us back
        for node_obj in self.nodes.items():
            leftover = self._leftover_keys(gate, node_obj)
            if leftover is not None:  # a conflict raises: the gate is retried, and released only when clean
                await self._write_node_update(gate, node_obj["metadata"]["name"], leftover, base=node_obj)
            await self._write_failure_condition(gate.name, node_view(node_obj), None)
        if keys.FINALIZER in gate.metadata.finalizers:
            rest = [f for f in gate.metadata.finalizers if f != keys.FINALIZER]
            with contextlib.suppress(ApiError):
                await self.client.patch(NODEGATES, gate.name, {"metadata": {
                    "finalizers": rest, "resourceVersion": gate.metadata.resource_version}})
            log.info("Released gate; gate=%s", gate.name)

    async def _disabled(self, gate: NodeGate, obj: Obj) -> None:
        """A disabled gate plans nothing: no round starts (one running finishes, as the node reconcile
        drives it), and it lets go of the readiness taint on every node that no enabled gate holds back."""
        for node_obj in self.nodes.items():
            view = node_view(node_obj)
            if (gate.spec.readiness_taint and view.has_readiness_taint and selects(gate, view)
                    and readiness_clear(gate.name, fleet_node(node_obj), self._all_gates())):
                update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                         f"NodeGate {gate.name} is disabled; no other gate holds "
                                                         "the node back")])
                update.change.remove_readiness_taint = True
                await self._write_node_update(gate, view.name, update, base=node_obj)
        status = dict(obj.get("status") or {})
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        previous = {c.get("type"): c for c in status.get("conditions") or []}
        # Neither Reconciling nor Stalled: the gate does nothing, and Ready decides (gate.lifecycle.health).
        conditions = [c for c in status.get("conditions") or []
                      if c.get("type") not in ("Disabled", "Progressing", *KSTATUS_TYPES)]
        for type_, value, reason, message in (
                ("Disabled", "True", "Disabled", f"annotation {keys.DISABLED_ANNOTATION}=true: the gate does nothing"),
                ("Progressing", "False", "Disabled", "The gate is disabled: no new work starts")):
            old = previous.get(type_) or {}
            since = old.get("lastTransitionTime") if old.get("status") == value else now
            conditions.append({"type": type_, "status": value, "reason": reason, "message": message,
                               "lastTransitionTime": since or now, "observedGeneration": gate.metadata.generation or 0})
        status.update({"conditions": conditions, "status": "Disabled",
                       "observedGeneration": gate.metadata.generation or 0})
        await self._write_status(obj, status)

    def _leftover_keys(self, gate: NodeGate, node_obj: Obj) -> NodeUpdate | None:
        """What a deleted gate left on a node it never started on: its status label (a node waiting in
        line), a person's reset or rerun request, and the readiness taint of a node that joined and
        waited for this gate alone. None when the node carries nothing of the gate's."""
        meta = node_obj["metadata"]
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        view = node_view(node_obj)
        taint = (gate.spec.readiness_taint and view.has_readiness_taint and selects(gate, view)
                 and readiness_clear(gate.name, fleet_node(node_obj), self._all_gates()))
        requests = (keys.reset_annotation(gate.name), keys.rerun_annotation(gate.name))
        if keys.status_label(gate.name) not in labels and not any(r in annotations for r in requests) and not taint:
            return None
        update = NodeUpdate(remove_state=True)
        if taint:
            update.change.remove_readiness_taint = True
            update.events.append(EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                              f"NodeGate {gate.name} was deleted; no other gate holds the node back"))
        return update

    async def reconcile_join(self, gate_name: str, node_name: str) -> None:
        """The readiness-taint backstop for one joining node, ahead of the gate's plan (same rule)."""
        gate = self._gate(gate_name)
        node_obj = self.nodes.get(node_name)
        if gate is None or node_obj is None or gate.metadata.deletion_timestamp or disabled(gate):
            return
        fnode = fleet_node(node_obj)
        raw = fnode.states.get(gate_name)
        state = raw if isinstance(raw, NodeGateState) else None
        if not selects(gate, fnode.view) or isinstance(raw, StateParseError):
            return
        why = taint_reason(gate, fnode, state, state, parse_time(gate.metadata.creation_timestamp))
        if why is None:
            return
        update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintAdded",
                                                 f"NodeGate {gate_name} tainted the node: it {why}")])
        update.change.add_readiness_taint = True
        await self._write_node_update(gate, node_name, update, base=node_obj)

    # -- node reconcile ---------------------------------------------------------------------------

    async def reconcile_node(self, gate_name: str, node_name: str) -> None:
        gate = self._gate(gate_name)
        node_obj = self.nodes.get(node_name)
        if gate is None or node_obj is None:
            return
        raw = (node_obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate_name))
        if raw is None:
            return
        removing = bool(gate.metadata.deletion_timestamp)
        try:
            state = load_state(raw)
        except StateParseError:
            if not removing:
                return  # the gate reconcile reports it; nothing here may overwrite it while the gate lives
            # The gate is going away: what the node ran is unknown, so nothing can be uninstalled, but
            # the gate's keys (and a cordon it placed) must go, or the deletion would never finish.
            state = NodeGateState(status="failed")
        view = node_view(node_obj)
        if not removing and state.status != "in-progress":
            return
        pods = None
        if state.phase in ("wait-pods", "drain"):
            pods = await self._pods_on(node_name)
        fleet = self._fleet_memo.get(node_name)
        fnode = fleet[1] if fleet is not None else fleet_node(node_obj)
        ctx = NodeContext(gate=gate, node=view, state=state, stage_pods=self._stage_pods_of(gate_name, node_name),
                          pods=pods, now=datetime.now(UTC),
                          readiness_clear=readiness_clear(gate_name, fnode, self._all_gates()),
                          timing=self.timing, release=node_name in self._removal_release.get(gate_name, ()))
        decision = decide_removal(ctx) if removing else decide(ctx)
        await self._execute(gate, node_obj, decision, ctx)

    async def _pods_on(self, node: str) -> list[Any]:
        items, _ = await self.client.list(PODS, field_selector=f"spec.nodeName={node}")
        return [pod_view(p, self.settings.namespace) for p in items]

    async def _execute(self, gate: NodeGate, node_obj: Obj, decision: Decision, ctx: NodeContext) -> None:
        node = node_obj["metadata"]["name"]
        old_state = (node_obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate.name))
        if decision.writes_node or decision.remove_state:
            update = NodeUpdate(state=decision.state, change=decision.node, remove_state=decision.remove_state)
            node_obj = await self._write_node_update(gate, node, update, base=node_obj)
        for name in decision.delete_pods:
            pod = self.pods.get(name, self.settings.namespace)
            if pod is not None:
                self._stage_metrics(pod)
                self.index.pod_event("DELETED", pod)
            await self.client.delete(PODS, name, self.settings.namespace)
        for request in decision.create_pods:
            for package in dict.fromkeys(s.package for s in request.steps if s.package is not None):
                if gate.spec.packages[package].config:
                    await self._ensure(CONFIGMAPS, config_map(gate, package, self.settings))
            facts = facts_of(node, node_obj, decision.state or _parsed_or_none(old_state))
            try:
                created = await self._ensure(PODS, stage_pod(gate, node, request, self.settings, facts))
            except ApiError as exc:
                if exc.status not in (400, 403, 422):
                    raise
                # Refused by admission (a LimitRange, a quota, a policy): trying again changes nothing.
                log.warning("Stage pod refused; gate=%s node=%s pod=%s error=%s", gate.name, node, request.name, exc)
                seen = replace(ctx, state=decision.state or ctx.state, node=node_view(node_obj))
                await self._execute(gate, node_obj, pod_refused(seen, request, exc.message), seen)
                return
            if created is not None:
                # Seen at once by the next reconcile of this node, before the watch event arrives.
                self.pods.observe(created)
                self.index.pod_event("ADDED", created)
                log.info("Started stage pod; gate=%s node=%s kind=%s steps=%s pod=%s", gate.name, node,
                         request.kind, ",".join(f"{s.package or '-'}/{s.stage}" for s in request.steps),
                         request.name)
        blocked = await self._evict(gate, node, decision.evict) if decision.evict else None
        if blocked:
            state = decision.state or load_state(old_state)
            if state.drain_blocked_by != blocked:  # once per blocking budget, not at every retry
                self.metrics.drains_blocked.labels(gate.name).inc()
                state = state.model_copy(update={"drain_blocked_by": blocked})
                fresh = self.nodes.get(node) or node_obj
                await self._write_node_update(gate, node, NodeUpdate(state=state, events=[EventRequest(
                    "node", "Warning", "DrainBlocked", f"Eviction refused: {blocked}")]), base=fresh)
        gate_obj = self.gates.get(gate.name) or {"apiVersion": keys.API_VERSION, "kind": "NodeGate",
                                                 "metadata": {"name": gate.name}}
        for event in decision.events:
            target = gate_obj if event.target == "gate" else node_obj
            await self.recorder.emit(target, event.type, event.reason, event.message)
        if decision.state is not None and decision.state.status == "failed" and decision.state.failure:
            f = decision.state.failure
            self.metrics.stage_failures.labels(gate.name, f.package or "-", f.stage, f.reason).inc()
        if decision.requeue_after is not None:
            self.queue.add_after(NodeKey(gate.name, node), decision.requeue_after)
        new_status = decision.state.status if decision.state is not None else None
        if decision.remove_state or (new_status is not None and old_state is not None
                                     and state_status(old_state) != new_status):
            self._gate_later(gate.name)

    def _stage_metrics(self, pod: Obj) -> None:
        """A stage pod about to be deleted: the duration of each of its steps by outcome (succeeded,
        failed, or abandoned when a reset or a gate deletion cut it off), from the container's start
        to its end."""
        view = stage_pod_view(pod)
        status = pod.get("status") or {}
        states = {cs.get("name"): cs.get("state") or {} for cs in
                  [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]}
        for i, step in enumerate(view.steps):
            state = states.get(container_name(step), {})
            timing = state.get("terminated") or state.get("running")
            started = parse_time((timing or {}).get("startedAt"))
            if started is None:
                continue
            outcome = "succeeded" if i < view.done else ("failed" if "terminated" in state else "abandoned")
            ended = parse_time((state.get("terminated") or {}).get("finishedAt")) or datetime.now(UTC)
            self.metrics.stage_duration.labels(step.package or "-", step.stage, outcome).observe(
                max(0.0, (ended - started).total_seconds()))

    async def _ensure(self, resource: Any, obj: Obj) -> Obj | None:
        """Create; an object that already exists is fine (None): names are deterministic."""
        try:
            return await self.client.create(resource, obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return None

    async def _evict(self, gate: NodeGate, node: str, pods: Iterable[tuple[str, str]]) -> str | None:
        """Evict pods; returns the PodDisruptionBudget blocking one of them, if any."""
        grace = gate.spec.drain.grace_period_seconds
        blocked: str | None = None

        async def evict(namespace: str, name: str) -> str | None:
            body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction",
                         "metadata": {"name": name, "namespace": namespace}}
            if grace is not None:
                body["deleteOptions"] = {"gracePeriodSeconds": grace}
            try:
                await self.client.create(PODS, body, namespace, subresource_of=name, subresource="eviction")
            except TooManyRequests as exc:
                return _blocking_pdb(exc, namespace, name)
            except ApiError as exc:
                if exc.status != 404:
                    raise
            return None

        for result in await asyncio.gather(*(evict(ns, n) for ns, n in pods)):
            blocked = blocked or result
        return blocked

    # -- node writes ------------------------------------------------------------------------------

    async def _write_node_update(self, gate: NodeGate, node: str, update: NodeUpdate,
                                 base: Obj | None = None) -> Obj:
        """One merge patch: state annotation, status label, cordon and taint, guarded by resourceVersion."""
        obj = base or self.nodes.get(node)
        if obj is None:
            return {}
        built = node_patch(gate.name, obj, update)
        if built.body is None:
            for event in update.events:
                await self.recorder.emit(obj, event.type, event.reason, event.message)
            return obj
        if built.taint_added:
            self.metrics.taints_added.labels(gate.name).inc()
        if built.taint_removed:
            self.metrics.taint_removals.labels(gate.name).inc()
        result = await self.client.patch(NODES, node, built.body)
        self.nodes.observe(result)
        self._fleet_memo.pop(node, None)
        for event in update.events:
            await self.recorder.emit(result, event.type, event.reason, event.message)
        if update.state is not None and update.state.status == "in-progress":
            self.queue.add(NodeKey(gate.name, node))
        return result

    # -- health -----------------------------------------------------------------------------------

    def _sync_request_metrics(self) -> None:
        """The client counts its requests; the metrics catch up when scraped, not after every reconcile."""
        self.metrics.api_requests.set(self.client.requests)
        for kind, count in self.client.requests_by.items():
            seen = self._requests_reported.get(kind, 0)
            if count != seen:
                self.metrics.api_requests_by.labels(*kind).inc(count - seen)
                self._requests_reported[kind] = count

    async def _serve_health(self) -> web.AppRunner | None:
        if not self.settings.metrics_port:
            return None
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            self._sync_request_metrics()
            body = generate_latest(self.metrics.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            # A standby is ready too: it is healthy and waiting for the lease.
            if self.elector.is_leader and not self.ready:
                return web.Response(status=503, text="caches not synced")
            return web.Response(text="leader" if self.elector.is_leader else "standby")

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.metrics_host, self.settings.metrics_port)
        await site.start()
        return runner


def _blocking_pdb(exc: TooManyRequests, namespace: str, pod: str) -> str:
    for cause in exc.causes:
        if cause.get("reason") == "DisruptionBudget":
            return f"pod {namespace}/{pod}: {cause.get('message', '')}"
    return f"pod {namespace}/{pod}: {exc.message}"


def _drain_blocked(state: NodeGateState | StateParseError | None) -> bool:
    return (isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "drain"
            and bool(state.drain_blocked_by))


def _parsed_or_none(raw: str | None) -> NodeGateState | None:
    try:
        return load_state(raw) if raw else None
    except StateParseError:
        return None


def _first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, with the field it is about."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _same_status(current: Obj, new: Obj) -> bool:
    def strip(status: Obj) -> str:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []]
        return json.dumps({**status, "conditions": conds}, sort_keys=True)

    return strip(current) == strip(new)


__all__ = ["EventRequest", "NodeChange", "NodeGateState", "Operator"]
