"""The gate reconciler and the policy reconciler, each with `reconcile(key)`.

`GateReconciler.reconcile(GateKey)` is thin: it reads the caches (`gate.controller.world`), as
controller-runtime's reconcilers read their manager's cache; resolves the images of the gate's
packages (`gate.controller.images`: I/O, so here); asks the pure core for one plan of everything the
reconcile writes (`gate.lifecycle.reconcile`: `plan_reconcile` for an enabled gate, which plans the
rollout with `gate.lifecycle.fleet.plan_gate`; `plan_removal_reconcile` once it is deleted and nodes
still hold its record; `plan_disabled`; `plan_problem` when its DeploymentPolicy is missing or
invalid); and hands that plan to `Executor.apply_gate_plan`, the one place that writes it. What stays
here are the steps around a plan: adding the finalizer, recording resolved images before any plan
(no round starts before its images are pinned), and releasing a deleted gate once no node holds it.
`PolicyReconciler.reconcile(PolicyKey)` writes a DeploymentPolicy's own status.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import Literal

from pydantic import ValidationError

from gate.api import keys
from gate.api.common import Condition, Obj
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.controller.endpoints import EndpointBook
from gate.controller.events import EventRecorder
from gate.controller.executor import Executor
from gate.controller.images import ImageResolver, ImagesUnresolved, ImagesUnverified
from gate.controller.metrics import OperatorMetrics
from gate.controller.prepull import Prepuller
from gate.controller.triggers import GateKey, PolicyKey
from gate.controller.world import World
from gate.kube.client import NODEGATES, POLICIES, KubeClient
from gate.kube.errors import NotFound
from gate.kube.objects import parse_time
from gate.lifecycle.fleet import disabled
from gate.lifecycle.health import condition, policy_status
from gate.lifecycle.images import merged_records, records_wire, same_records
from gate.lifecycle.reconcile import (
    holders,
    plan_disabled,
    plan_problem,
    plan_reconcile,
    plan_release,
    plan_removal_reconcile,
    same_status,
)
from gate.lifecycle.rollback import rollback_targets
from gate.lifecycle.signatures import failure_message, hold_of

log = logging.getLogger("nodegate.operator")


class GateReconciler:
    def __init__(self, client: KubeClient, metrics: OperatorMetrics, recorder: EventRecorder, world: World,
                 executor: Executor, resolver: ImageResolver, prepuller: Prepuller | None = None,
                 endpoints: EndpointBook | None = None) -> None:
        self.client = client
        self.endpoints = endpoints or EndpointBook()
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
        fleet = self.world.fleet()
        plan = plan_reconcile(gate, policy, fleet, status=obj.get("status") or {}, gates=self.world.all_gates(),
                              now=datetime.now(UTC), gate_created=parse_time(gate.metadata.creation_timestamp),
                              busy=self.world.busy_nodes(name), protected=self.world.protected_pods(gate, fleet),
                              resolve_digests=self.resolver.settings.resolve_digests,
                              packages_in_use=self._packages_in_use(), reported=self.world.reported,
                              prepull=self.prepuller.lookahead if self.prepuller is not None else None,
                              revisions=self.world.revisions.get(name))
        await self.executor.apply_gate_plan(gate, obj, plan)
        if self.prepuller is not None and plan.prepull is not None:  # after the picks are written
            await self.prepuller.sync(gate, plan.prepull)

    async def _resolve_images(self, gate: NodeGate, obj: Obj) -> tuple[NodeGate, Obj]:
        """Resolve the images of the gate's packages that have no record of their image:version yet
        (`gate.lifecycle.images`), and record them in the status, before anything is planned. Returns the
        gate and its object as they are after that write. Raises `ImagesUnresolved` (the reconcile is
        retried with backoff) once the status and an Event say which image failed and why."""
        if not self.resolver.settings.resolve_digests:
            return gate, obj
        back_to = rollback_targets(gate, self.world.revisions.get(gate.name))
        resolved, problems = await self.resolver.resolve(gate, back_to)
        current = gate.status.images if gate.status is not None else []
        # With an image signature policy, each digest is judged too (gate.lifecycle.signatures).
        records, verdicts, unread = await self.resolver.verify(gate, merged_records(gate, resolved, back_to),
                                                               back_to)
        refused, warned = self.resolver.verdicts_of(gate.name, verdicts)
        status: Obj = {}
        hold = hold_of({**problems, **unread}, refused)
        if not same_records(current, records):
            status["images"] = records_wire(records)
        if hold is not None:
            # Ready no longer (the spec's packages cannot start), Degraded, and the condition that says why.
            previous = gate.status.conditions if gate.status is not None else []
            now, generation = datetime.now(UTC), gate.metadata.generation or 0
            held: dict[str, Literal["True", "False"]] = {hold.condition: "False", "Ready": "False",
                                                         "Degraded": "True"}
            kept = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") not in held]
            status["conditions"] = [*kept, *(condition(type_, value, hold.reason, hold.message, previous, now,
                                                       generation).to_wire() for type_, value in held.items())]
            status.update({"status": "Degraded", "observedGeneration": generation})
        current_status = obj.get("status") or {}
        if status and not same_status(current_status, {**current_status, **status}):
            patched = await self.client.patch(NODEGATES, gate.name, {"status": status, "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"]}}, subresource="status")
            self.world.gates.observe(patched)
            obj, gate = patched, self.world.gate(gate.name) or gate
        if warned:
            await self.recorder.emit(obj, "Warning", warned[0].verdict.reason, failure_message(warned, mode="warn"))
        if hold is not None:
            await self.recorder.emit(obj, "Warning", hold.reason, hold.message)
            unverified = hold.condition == "ImagesVerified"
            raise ImagesUnverified(hold.message) if unverified else ImagesUnresolved(hold.message)
        return gate, obj

    def _packages_in_use(self) -> set[str]:
        """Packages of every gate, those being deleted included (their uninstalls still record stages)."""
        used: set[str] = set()
        for obj in self.world.gates.items():
            gate = self.world.gate(obj["metadata"]["name"])
            if gate is not None:
                used |= set(gate.spec.packages)
        return used

    async def _policy_of(self, gate: NodeGate, obj: Obj, *,
                         endpoints: bool = True) -> tuple[bool, DeploymentPolicy | None]:
        """The DeploymentPolicy the gate names (None: it names none); (False, None) when it is missing,
        invalid or (with `endpoints`) names a Prometheus endpoint the operator does not know, which the
        gate's status then says. A removal soaks nothing, so it is never held by an endpoint."""
        if not gate.spec.deployment_policy:
            return True, None
        raw_policy = self.world.policies.get(gate.spec.deployment_policy)
        if raw_policy is None:
            await self._gate_problem(obj, gate, "PolicyNotFound",
                                     f"DeploymentPolicy {gate.spec.deployment_policy} does not exist")
            return False, None
        try:
            policy = DeploymentPolicy.model_validate(raw_policy)
        except ValidationError as exc:
            await self._gate_problem(obj, gate, "PolicyInvalid",
                                     f"DeploymentPolicy {gate.spec.deployment_policy} cannot be used: "
                                     f"{_first_error(exc)}")
            return False, None
        unknown = policy.unknown_endpoint(self.endpoints.names()) if endpoints else None
        if unknown is not None:
            # Refused, not asked: a policy names an endpoint, the installer says where it is (docs/security.md).
            await self._gate_problem(obj, gate, "EndpointNotConfigured",
                                     f"DeploymentPolicy {gate.spec.deployment_policy} cannot be used: {unknown}")
            return False, None
        return True, policy

    async def _gate_problem(self, obj: Obj, gate: NodeGate, reason: str, message: str) -> None:
        await self.executor.apply_gate_plan(gate, obj, plan_problem(gate, status=obj.get("status") or {},
                                                                    reason=reason, message=message,
                                                                    now=datetime.now(UTC)))

    async def _finalize(self, gate: NodeGate, obj: Obj) -> None:
        """Deleting a gate: uninstall what can be, uncordon, remove every node key, then let go."""
        fleet = self.world.fleet()
        holding = holders(gate, fleet)
        if holding:
            # Removal is a rollout too (gate.lifecycle.removal): the planner picks who uninstalls now.
            found, policy = await self._policy_of(gate, obj, endpoints=False)
            if not found:
                return
            plan = plan_removal_reconcile(gate, policy, fleet, status=obj.get("status") or {},
                                          holders=holding, now=datetime.now(UTC),
                                          resolve_digests=self.resolver.settings.resolve_digests)
            await self.executor.apply_gate_plan(gate, obj, plan)
            return  # node reconciles uninstall and remove their keys; their events bring us back
        await self.executor.apply_gate_plan(gate, obj, plan_release(gate, fleet, self.world.all_gates()))

    async def _disabled(self, gate: NodeGate, obj: Obj) -> None:
        plan = plan_disabled(gate, self.world.fleet(), status=obj.get("status") or {}, gates=self.world.all_gates(),
                             now=datetime.now(UTC))
        await self.executor.apply_gate_plan(gate, obj, plan)


class PolicyReconciler:
    def __init__(self, client: KubeClient, world: World, endpoints: EndpointBook | None = None) -> None:
        self.client = client
        self.world = world
        self.endpoints = endpoints or EndpointBook()

    async def reconcile(self, key: PolicyKey) -> None:
        """A DeploymentPolicy's status: which spec the operator read, whether it can use it, who uses it."""
        name = key.policy
        obj = self.world.policies.get(name)
        if obj is None:
            return
        problem = None
        try:
            problem = DeploymentPolicy.model_validate(obj).unknown_endpoint(self.endpoints.names())
        except ValidationError as exc:
            problem = _first_error(exc)
        used_by = sorted(g["metadata"]["name"] for g in self.world.gates.items()
                         if (g.get("spec") or {}).get("deploymentPolicy") == name)
        meta = obj["metadata"]
        previous = [Condition.model_validate(c) for c in (obj.get("status") or {}).get("conditions") or []]
        status = policy_status(meta.get("generation") or 0, used_by, problem, previous, datetime.now(UTC)).to_wire()
        if same_status(obj.get("status") or {}, status):
            return
        try:
            patched = await self.client.patch(POLICIES, name, {"status": status, "metadata": {
                "resourceVersion": meta["resourceVersion"]}}, subresource="status")
        except NotFound:
            return
        self.world.policies.observe(patched)


def _first_error(exc: ValidationError) -> str:
    """The first problem pydantic found, with the field it is about."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])
