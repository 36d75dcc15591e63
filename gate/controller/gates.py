"""The gate reconciler and the policy reconciler, each with `reconcile(key)`.

`GateReconciler.reconcile(GateKey)` is thin: it reads the caches (`gate.controller.world`), as
controller-runtime's reconcilers read their manager's cache; resolves the images of the gate's
packages (`gate.controller.images`: I/O, so here); asks the pure core for the plans of everything the
reconcile writes, and hands each to `GateApplier`, which sends it (the rule, one writer per
reconcile, is stated in `gate.controller.executor`): the finalizer (`plan_finalizer`), the image
records (`gate.lifecycle.images.plan_images`, before any other plan: no round starts before its
images are pinned), the gate (`gate.lifecycle.reconcile`: `plan_reconcile` for an enabled gate, which
plans the rollout with `gate.lifecycle.fleet.plan_gate`; `plan_removal_reconcile` once it is deleted
and nodes still hold its record; `plan_release` once none does; `plan_disabled`; `plan_problem` when
its DeploymentPolicy is missing or invalid), the prepull pods (`gate.controller.prepull`) and the
staging and undo pods (`gate.controller.staging`; a deleted gate is let go only once none of them is
left, `gate.lifecycle.staging.gate_may_go`). It returns when to look again (`gate.controller.result.Result`).
`PolicyReconciler.reconcile(PolicyKey)` writes a DeploymentPolicy's own status.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime

from pydantic import ValidationError

from gate.api.common import Condition, Obj
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.controller.endpoints import EndpointBook
from gate.controller.gate_applier import GateApplier
from gate.controller.images import ImageResolver, ImagesUnresolved, ImagesUnverified
from gate.controller.metrics import OperatorMetrics
from gate.controller.nodes import fail_refused
from gate.controller.prepull import Prepuller
from gate.controller.result import DONE, Result, look, merged
from gate.controller.staging import Stager
from gate.controller.triggers import GateKey, NodeKey, PolicyKey
from gate.controller.views import node_view
from gate.controller.world import World
from gate.kube.client import POLICIES, KubeClient
from gate.kube.errors import ApiError, NotFound
from gate.kube.objects import parse_time
from gate.lifecycle.fleet import NodeUpdate, disabled
from gate.lifecycle.health import policy_status
from gate.lifecycle.images import merged_records, plan_images
from gate.lifecycle.node import NodeContext
from gate.lifecycle.outcomes import Refusal, refused_update
from gate.lifecycle.prepull import Candidate
from gate.lifecycle.reconcile import (
    ReconcilePlan,
    holders,
    plan_disabled,
    plan_finalizer,
    plan_problem,
    plan_reconcile,
    plan_release,
    plan_removal_reconcile,
    same_status,
)
from gate.lifecycle.rollback import rollback_targets
from gate.lifecycle.signatures import hold_of, warnings
from gate.lifecycle.staging import GateStaging

log = logging.getLogger("nodegate.operator")


class GateReconciler:
    def __init__(self, metrics: OperatorMetrics, world: World, applier: GateApplier, resolver: ImageResolver,
                 prepuller: Prepuller | None = None, endpoints: EndpointBook | None = None,
                 stager: Stager | None = None) -> None:
        self.endpoints = endpoints or EndpointBook()
        self.metrics = metrics
        self.world = world
        self.applier = applier
        self.resolver = resolver
        self.prepuller = prepuller
        self.stager = stager

    async def reconcile(self, key: GateKey) -> Result:
        name = key.gate
        gate = self.world.gate(name)
        obj = self.world.gates.get(name)
        if obj is None:
            # Gone (its deletion event queued this): so are its metric series, or an alert on one of
            # them (NodeGateNodeFailed, say) would keep firing for a gate that no longer exists.
            if self.metrics.forget_gate(name):
                log.info("Removed the metric series of a deleted gate; gate=%s", name)
            self.world.forget_gate(name)
            return DONE
        if gate is None:
            return DONE
        result = DONE
        if self.prepuller is not None and (gate.metadata.deletion_timestamp or disabled(gate)) and \
                self.prepuller.forgets(gate):
            result = await self._prepull(self.prepuller, gate, [])
        if self.stager is not None and (gate.metadata.deletion_timestamp or disabled(gate)) and \
                (gate.name in self.stager.by_gate or self.stager.holds(gate.name)):
            # Every staging not taken over is undone (a deleted gate's finalizer waits for it: `_finalize`).
            await self._stage(self.stager, gate, GateStaging(deleting=bool(gate.metadata.deletion_timestamp)))
        if gate.metadata.deletion_timestamp:
            # An uninstall runs the package's image too; one that cannot resolve holds only its own pods.
            with contextlib.suppress(ImagesUnresolved):
                gate, obj = await self._resolve_images(gate, obj)
            return result | await self._finalize(gate, obj)
        finalizer = plan_finalizer(gate)
        if finalizer is not None:
            return result | await self._apply(gate, obj, finalizer)  # the watch brings the new version back
        if disabled(gate):
            return result | await self._disabled(gate, obj)
        found, policy = await self._policy_of(gate, obj)
        if not found:
            return result
        # Before any plan: no round starts on any node before its packages' images are pinned by digest.
        gate, obj = await self._resolve_images(gate, obj)
        fleet = self.world.fleet()
        plan = plan_reconcile(gate, policy, fleet, status=obj.get("status") or {}, gates=self.world.all_gates(),
                              now=datetime.now(UTC), gate_created=parse_time(gate.metadata.creation_timestamp),
                              busy=self.world.busy_nodes(name), protected=self.world.protected_pods(gate, fleet),
                              resolve_digests=self.resolver.settings.resolve_digests,
                              packages_in_use=self._packages_in_use(), reported=self.world.reported,
                              prepull=self.prepuller.lookahead if self.prepuller is not None else None,
                              revisions=self.world.revisions.get(name),
                              staging=self.stager.ahead if self.stager is not None else None)
        result |= await self._apply(gate, obj, plan)
        if self.prepuller is not None and plan.prepull is not None:  # after the picks are written
            result |= await self._prepull(self.prepuller, gate, plan.prepull)
        if self.stager is not None and plan.staging is not None:
            await self._stage(self.stager, gate, plan.staging)
        return result

    async def _stage(self, stager: Stager, gate: NodeGate, part: GateStaging) -> None:
        """The staging and undo pods of every gate, planned with this gate's part and sent, under one lock."""
        async with stager.lock:
            await self.applier.apply_staging(await stager.plan(gate, part))

    async def _apply(self, gate: NodeGate, obj: Obj, plan: ReconcilePlan) -> Result:
        """Send a plan (`GateApplier`): its node writes; for each refused for good, what follows
        (`gate.lifecycle.outcomes.refused_update`), written before anything after them; then the rest.
        Returns when to look again: the gate at `recheck_after`, its nodes in `node_keys` and those
        written with a round in progress now."""
        writes = await self.applier.write_node_updates(gate, plan.updates)
        result = DONE
        for node, (update, exc) in writes.refused.items():
            result |= await self._refused(gate, node, update, exc)
        if writes.error is not None:
            raise writes.error  # a lost race: nothing after it is written; the gate is retried
        if plan.releasable is not None:
            self.world.removal_release[gate.name] = plan.releasable
        await self.applier.apply_gate_plan(gate, obj, plan)
        if plan.recheck_after is not None:
            result |= look(GateKey(gate.name), plan.recheck_after + 0.5)
        return merged((result, *(look(NodeKey(gate.name, n)) for n in (*plan.node_keys, *writes.in_round))))

    async def _refused(self, gate: NodeGate, node: str, update: NodeUpdate, exc: ApiError) -> Result:
        obj = self.world.nodes.get(node)
        if obj is None:
            return DONE
        followed = refused_update(gate.name, node, update, exc.message)
        if not isinstance(followed, Refusal):
            log.warning("Node write refused; gate=%s node=%s error=%s", gate.name, node, exc)
            await self.applier.emit(obj, [followed])
            return DONE
        assert update.state is not None  # a Refusal is a round's write
        ctx = NodeContext(gate=gate, node=node_view(obj), state=update.state,
                          stage_pods=self.world.stage_pods_of(gate.name, node, update.state.pods).ours, pods=None,
                          now=datetime.now(UTC))
        return await fail_refused(self.applier, gate, obj, ctx, followed)

    async def _prepull(self, prepuller: Prepuller, gate: NodeGate, found: list[Candidate]) -> Result:
        """The prepull pods of every gate, planned with this gate's candidates and sent, under one lock."""
        async with prepuller.lock:
            refused = await self.applier.apply_prepull(prepuller.plan(gate, found))
            said, looks = prepuller.refused_now(refused)
            await self.applier.apply_prepull(said)
            prepuller.measure()
        return merged(look(k) for k in looks)

    async def _resolve_images(self, gate: NodeGate, obj: Obj) -> tuple[NodeGate, Obj]:
        """Resolve the images of the gate's packages that have no record of their image:version yet, judge
        their digests under the image signature policy (`gate.lifecycle.signatures`), and write what
        `gate.lifecycle.images.plan_images` makes of it, before anything is planned. Returns the gate and its
        object as they are after that write. Raises `ImagesUnresolved` or `ImagesUnverified` (the reconcile
        is retried with backoff) once the status and an Event say which image holds the gate and why."""
        if not self.resolver.settings.resolve_digests:
            return gate, obj
        back_to = rollback_targets(gate, self.world.revisions.get(gate.name))
        resolved, problems = await self.resolver.resolve(gate, back_to)
        # With an image signature policy, each digest is judged too (gate.lifecycle.signatures).
        records, verdicts, unread = await self.resolver.verify(gate, merged_records(gate, resolved, back_to),
                                                               back_to)
        refused, warned = self.resolver.verdicts_of(gate.name, verdicts)
        plan = plan_images(gate, obj.get("status") or {}, records, hold_of({**problems, **unread}, refused),
                           datetime.now(UTC), warnings(warned))
        patched = await self.applier.apply_images(gate, obj, plan)
        if patched is not None:
            obj, gate = patched, self.world.gate(gate.name) or gate
        if plan.held is not None:
            unverified = plan.held.condition == "ImagesVerified"
            raise ImagesUnverified(plan.held.message) if unverified else ImagesUnresolved(plan.held.message)
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
        # A problem plan writes the status and an Event only: nothing to look at again but what a person fixes.
        await self._apply(gate, obj, plan_problem(gate, status=obj.get("status") or {}, reason=reason,
                                                  message=message, now=datetime.now(UTC)))

    async def _finalize(self, gate: NodeGate, obj: Obj) -> Result:
        """Deleting a gate: uninstall what can be, uncordon, remove every node key, then let go."""
        fleet = self.world.fleet()
        holding = holders(gate, fleet)
        if holding:
            # Removal is a rollout too (gate.lifecycle.removal): the planner picks who uninstalls now.
            found, policy = await self._policy_of(gate, obj, endpoints=False)
            if not found:
                return DONE
            plan = plan_removal_reconcile(gate, policy, fleet, status=obj.get("status") or {},
                                          holders=holding, now=datetime.now(UTC),
                                          resolve_digests=self.resolver.settings.resolve_digests)
            return await self._apply(gate, obj, plan)  # node reconciles uninstall and remove their keys
        if self.stager is not None and self.stager.holds(gate.name):
            # What was staged on serving nodes is undone first (`gate_may_go`); its pods' events plan the gate.
            return look(GateKey(gate.name), self.stager.settings.poll_seconds)
        return await self._apply(gate, obj, plan_release(gate, fleet, self.world.all_gates()))

    async def _disabled(self, gate: NodeGate, obj: Obj) -> Result:
        plan = plan_disabled(gate, self.world.fleet(), status=obj.get("status") or {}, gates=self.world.all_gates(),
                             now=datetime.now(UTC))
        return await self._apply(gate, obj, plan)


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
