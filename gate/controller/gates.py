"""The gate reconciler and the policy reconciler, each with `reconcile(key)`.

`GateReconciler.reconcile(GateKey)` plans one gate across the fleet (`gate.lifecycle.fleet.plan_gate`;
its removal, `gate.lifecycle.removal.plan_removal`, once it is deleted) and writes what the plan
says: the node updates (through the executor), the failure conditions, the status, the requests it
carried out, Events and metrics. `PolicyReconciler.reconcile(PolicyKey)` writes a DeploymentPolicy's
own status. They read only the caches (`gate.controller.world`), as controller-runtime's reconcilers
read their manager's cache, and decide with the pure core.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from gate.api import keys
from gate.api.common import Condition
from gate.api.nodegate import NodeGate, NodeGateStatus
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, StateParseError
from gate.controller.events import EventRecorder
from gate.controller.executor import Executor
from gate.controller.images import ImageResolver, ImagesUnresolved
from gate.controller.metrics import OperatorMetrics
from gate.controller.prepull import Prepuller
from gate.controller.triggers import GateKey, NodeKey, PolicyKey
from gate.controller.views import node_view
from gate.controller.world import World
from gate.kube.client import NODEGATES, POLICIES, KubeClient
from gate.kube.errors import ApiError, NotFound
from gate.kube.objects import parse_time
from gate.lifecycle.fleet import FleetNode, NodeUpdate, disabled, plan_gate, readiness_clear, selects
from gate.lifecycle.health import KSTATUS_TYPES, STALLED, condition, policy_status
from gate.lifecycle.images import merged_records, records_wire, same_records, unresolved_message
from gate.lifecycle.machine import EventRequest
from gate.lifecycle.removal import plan_removal

log = logging.getLogger("nodegate.operator")

Obj = dict[str, Any]


class GateReconciler:
    def __init__(self, client: KubeClient, metrics: OperatorMetrics, recorder: EventRecorder, world: World,
                 executor: Executor, resolver: ImageResolver, prepuller: Prepuller | None = None) -> None:
        self.client = client
        self.metrics = metrics
        self.recorder = recorder
        self.world = world
        self.executor = executor
        self.resolver = resolver
        self.prepuller = prepuller

    async def reconcile(self, key: GateKey) -> None:
        name = key.gate
        gate = self.world.gate(name)
        obj = self.world.gates.get(name)
        if obj is None:
            # Gone (its deletion event queued this): so are its metric series, or an alert on one of
            # them (NodeGateNodeFailed, say) would keep firing for a gate that no longer exists.
            if self.metrics.forget_gate(name):
                log.info("Removed the metric series of a deleted gate; gate=%s", name)
            self.world.forget_gate(name)
            return
        if gate is None:
            return
        if self.prepuller is not None and (gate.metadata.deletion_timestamp or disabled(gate)):
            await self.prepuller.forget(gate)
        if gate.metadata.deletion_timestamp:
            # An uninstall runs the package's image too; one that cannot resolve holds only its own pods.
            with contextlib.suppress(ImagesUnresolved):
                gate, obj = await self._resolve_images(gate, obj)
            await self._finalize(gate, obj)
            return
        if keys.FINALIZER not in gate.metadata.finalizers:
            patched = await self.client.patch(NODEGATES, name, {"metadata": {
                "finalizers": [*gate.metadata.finalizers, keys.FINALIZER],
                "resourceVersion": gate.metadata.resource_version}})
            self.world.gates.observe(patched)
            return  # the watch brings the new version back to us
        if disabled(gate):
            await self._disabled(gate, obj)
            return
        found, policy = await self._policy_of(gate, obj)
        if not found:
            return
        # Before any plan: no round starts on any node before its packages' images are pinned by digest.
        gate, obj = await self._resolve_images(gate, obj)
        now = datetime.now(UTC)
        created = parse_time(gate.metadata.creation_timestamp)
        fleet = self.world.fleet()
        gplan = plan_gate(gate, policy, fleet, gates=self.world.all_gates(), now=now, gate_created=created,
                          busy=self.world.busy_nodes(name), protected=self.world.protected_pods(gate, fleet))
        self.metrics.drains_blocked_now.labels(name).set(sum(1 for n in fleet if _drain_blocked(n.states.get(name))))
        # Node writes that lost a race are retried through the queue; status waits for them so that
        # compartment progress is never written ahead of the nodes it counts.
        await self.executor.write_node_updates(gate, gplan.updates)
        await self.executor.sync_failure_conditions(name)
        await self.executor.write_blocked_conditions(name, gplan.conditions)
        status = self._with_images(gate, gplan.status.to_wire())
        if "waitingForPodsSince" in (obj.get("status") or {}) and "waitingForPodsSince" not in status:
            status["waitingForPodsSince"] = None  # a merge patch removes a field only when told so
        await self._write_status(obj, status)
        if gplan.requests_done:
            annotations: dict[str, str | None] = dict.fromkeys(gplan.requests_done)
            patched = await self.client.patch(NODEGATES, name, {"metadata": {"annotations": annotations}})
            self.world.gates.observe(patched)
        for event in gplan.events:
            await self.recorder.emit(obj, event.type, event.reason, event.message)
        await self._report_refused(obj, name, fleet)
        self._gate_metrics(gate, gplan.status.to_wire())
        self._wait_metrics(name, gplan.status)
        if gplan.recheck_after is not None:  # a node reaches waitTimeout then, with no event to say so
            self.world.queue.add_after(GateKey(name), gplan.recheck_after + 0.5)
        self.metrics.forget_gone(name, {c.name for c in gplan.status.compartments}, set(gate.spec.packages),
                                 self._packages_in_use())
        if self.prepuller is not None:  # after the picks are written: a picked node's round reads its pod
            await self.prepuller.plan(gate, gplan, fleet)

    async def _resolve_images(self, gate: NodeGate, obj: Obj) -> tuple[NodeGate, Obj]:
        """Resolve the images of the gate's packages that have no record of their image:version yet
        (`gate.lifecycle.images`), and record them in the status, before anything is planned. Returns the
        gate and its object as they are after that write. Raises `ImagesUnresolved` (the reconcile is
        retried with backoff) once the status and an Event say which image failed and why."""
        if not self.resolver.settings.resolve_digests:
            return gate, obj
        resolved, problems = await self.resolver.resolve(gate)
        current = gate.status.images if gate.status is not None else []
        records = merged_records(gate, resolved)
        status: Obj = {}
        message = unresolved_message(problems) if problems else ""
        if not same_records(current, records):
            status["images"] = records_wire(records)
        if problems:
            # Ready no longer (the spec's packages cannot start), Degraded, and the condition that says why.
            previous = gate.status.conditions if gate.status is not None else []
            now, generation = datetime.now(UTC), gate.metadata.generation or 0
            held: dict[str, Literal["True", "False"]] = {"ImagesResolved": "False", "Ready": "False",
                                                         "Degraded": "True"}
            kept = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") not in held]
            status["conditions"] = [*kept, *(condition(type_, value, "ResolveFailed", message, previous, now,
                                                       generation).to_wire() for type_, value in held.items())]
            status.update({"status": "Degraded", "observedGeneration": generation})
        current_status = obj.get("status") or {}
        if status and not _same_status(current_status, {**current_status, **status}):
            patched = await self.client.patch(NODEGATES, gate.name, {"status": status, "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"]}}, subresource="status")
            self.world.gates.observe(patched)
            obj, gate = patched, self.world.gate(gate.name) or gate
        if problems:
            await self.recorder.emit(obj, "Warning", "ResolveFailed", message)
            raise ImagesUnresolved(message)
        return gate, obj

    def _with_images(self, gate: NodeGate, status: Obj) -> Obj:
        """A planned status with the gate's image records kept (the planner does not know them) and the
        ImagesResolved condition, while the operator resolves images."""
        if not self.resolver.settings.resolve_digests:
            status["images"] = []  # pods pull tags then; a record would claim what they do not do
            return status
        records = gate.status.images if gate.status is not None else []
        status["images"] = records_wire(records)
        previous = gate.status.conditions if gate.status is not None else []
        pinned = sum(1 for p in gate.spec.packages.values() if "@" in p.image)
        message = f"{len(records)} package image(s) resolved to a digest for this rollout"
        if pinned:
            message += f", {pinned} pinned by digest in the spec"
        resolved = condition("ImagesResolved", "True", "Resolved", message, previous, datetime.now(UTC),
                             gate.metadata.generation or 0)
        status["conditions"] = [*status.get("conditions", []), resolved.to_wire()]
        return status

    async def _report_refused(self, obj: Obj, name: str, fleet: list[FleetNode]) -> None:
        """Records of this gate that the operator did not write (`FleetNode.refused`): the plan took each
        node as having no record; here each distinct one is reported once, in a Warning Event on the gate
        that names the node, and counted. The annotation stays until the operator writes its own record
        there (when it picks the node) or removes the gate's keys (the node left the gate, the gate went)."""
        for node in fleet:
            refused = node.refused.get(name)
            if refused is None:
                continue
            seen = (name, node.view.name, refused.record)
            if seen in self.world.reported:
                continue
            self.world.reported.add(seen)
            self.metrics.records_refused.labels(name).inc()
            log.warning("Record not the operator's, ignored; gate=%s node=%s why=%s", name, node.view.name,
                        refused.why)
            await self.recorder.emit(obj, "Warning", "RecordNotOurs",
                                     f"NodeGate {name}: the record {keys.state_annotation(name)} on node "
                                     f"{node.view.name} was not written by the operator ({refused.why}). It is "
                                     "ignored: the node counts as having no record for this gate. Find out who "
                                     "wrote it (the API server's audit log); docs/security.md")

    def _packages_in_use(self) -> set[str]:
        """Packages of every gate, those being deleted included (their uninstalls still record stages)."""
        used: set[str] = set()
        for obj in self.world.gates.items():
            gate = self.world.gate(obj["metadata"]["name"])
            if gate is not None:
                used |= set(gate.spec.packages)
        return used

    async def _policy_of(self, gate: NodeGate, obj: Obj) -> tuple[bool, DeploymentPolicy | None]:
        """The DeploymentPolicy the gate names (None: it names none); (False, None) when it is missing,
        which the gate's status then says."""
        if not gate.spec.deployment_policy:
            return True, None
        raw_policy = self.world.policies.get(gate.spec.deployment_policy)
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
        self.world.gates.observe(patched)

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

    def _wait_metrics(self, gate: str, status: NodeGateStatus) -> None:
        self.metrics.waiting_for_pods.labels(gate).set(status.nodes.waiting_for_pods)
        since = parse_time(status.waiting_for_pods_since) if status.waiting_for_pods_since else None
        if since is not None:
            self.metrics.waiting_for_pods_since.labels(gate).set(since.timestamp())
        else:
            self.metrics.waiting_for_pods_since.remove_where(lambda s: s.get("gate") == gate)

    async def _finalize(self, gate: NodeGate, obj: Obj) -> None:
        """Deleting a gate: uninstall what can be, uncordon, remove every node key, then let go."""
        annotation = keys.state_annotation(gate.name)
        holders = [n["metadata"]["name"] for n in self.world.nodes.items()
                   if annotation in (n["metadata"].get("annotations") or {})]
        if holders:
            # Removal is a rollout too (gate.lifecycle.removal): the planner picks who uninstalls now.
            found, policy = await self._policy_of(gate, obj)
            if not found:
                return
            rplan = plan_removal(gate, policy, self.world.fleet(), now=datetime.now(UTC))
            await self.executor.write_node_updates(gate, rplan.updates)
            self.world.removal_release[gate.name] = rplan.releasable
            await self.executor.sync_failure_conditions(gate.name)  # a failed uninstall shows on its node too
            await self._write_status(obj, self._with_images(gate, rplan.status.to_wire()))
            if rplan.resumed:
                annotations = {keys.RESUME_ANNOTATION: None}
                self.world.gates.observe(await self.client.patch(NODEGATES, gate.name,
                                                           {"metadata": {"annotations": annotations}}))
            for event in rplan.events:
                await self.recorder.emit(obj, event.type, event.reason, event.message)
            self._gate_metrics(gate, rplan.status.to_wire())
            for node in holders:
                self.world.queue.add(NodeKey(gate.name, node))
            return  # node reconciles uninstall and remove their keys; their events bring us back
        for node_obj in self.world.nodes.items():
            leftover = self._leftover_keys(gate, node_obj)
            if leftover is not None:  # a conflict raises: the gate is retried, and released only when clean
                await self.executor.write_node_update(gate, node_obj["metadata"]["name"], leftover, base=node_obj)
            await self.executor.write_failure_condition(gate.name, node_view(node_obj), None)
            await self.executor.write_blocked_conditions(gate.name, {node_obj["metadata"]["name"]: None},
                                                         only_present=True)
        if keys.FINALIZER in gate.metadata.finalizers:
            rest = [f for f in gate.metadata.finalizers if f != keys.FINALIZER]
            with contextlib.suppress(ApiError):
                await self.client.patch(NODEGATES, gate.name, {"metadata": {
                    "finalizers": rest, "resourceVersion": gate.metadata.resource_version}})
            log.info("Released gate; gate=%s", gate.name)

    async def _disabled(self, gate: NodeGate, obj: Obj) -> None:
        """A disabled gate plans nothing: no round starts (one running finishes, as the node reconcile
        drives it), and it lets go of the readiness taint on every node that no enabled gate holds back."""
        for node_obj in self.world.nodes.items():
            view = node_view(node_obj)
            if (gate.spec.readiness_taint and view.has_readiness_taint and selects(gate, view)
                    and readiness_clear(gate.name, self.world.fleet_node(node_obj), self.world.all_gates())):
                update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                         f"NodeGate {gate.name} is disabled; no other gate holds "
                                                         "the node back")])
                update.change.remove_readiness_taint = True
                await self.executor.write_node_update(gate, view.name, update, base=node_obj)
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
                 and readiness_clear(gate.name, self.world.fleet_node(node_obj), self.world.all_gates()))
        requests = (keys.reset_annotation(gate.name), keys.rerun_annotation(gate.name))
        if keys.status_label(gate.name) not in labels and not any(r in annotations for r in requests) and not taint:
            return None
        update = NodeUpdate(remove_state=True)
        if taint:
            update.change.remove_readiness_taint = True
            update.events.append(EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                              f"NodeGate {gate.name} was deleted; no other gate holds the node back"))
        return update


class PolicyReconciler:
    def __init__(self, client: KubeClient, world: World) -> None:
        self.client = client
        self.world = world

    async def reconcile(self, key: PolicyKey) -> None:
        name = key.policy
        """A DeploymentPolicy's status: which spec the operator read, whether it can use it, who uses it."""
        obj = self.world.policies.get(name)
        if obj is None:
            return
        problem = None
        try:
            DeploymentPolicy.model_validate(obj)
        except ValidationError as exc:
            problem = _first_error(exc)
        used_by = sorted(g["metadata"]["name"] for g in self.world.gates.items()
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
        self.world.policies.observe(patched)


def _drain_blocked(state: NodeGateState | StateParseError | None) -> bool:
    return (isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "drain"
            and bool(state.drain_blocked_by))


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
