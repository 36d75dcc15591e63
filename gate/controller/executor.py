"""The appliers, and the rule they keep: one writer per reconcile.

**Every write of a gate reconcile and of a node reconcile is a field of a plan that a pure function
returns, and one applier per kind sends it.** The gate reconcile (`gate.controller.gates`) plans with
`gate.lifecycle.reconcile` (the rollout, the finalizer), `gate.lifecycle.images` (the image records,
their conditions and Event) and `gate.controller.prepull` over `gate.lifecycle.prepull` (the prepull
pods); `GateApplier` (`gate.controller.gate_applier`) sends those plans. The node reconcile
(`gate.controller.nodes`) decides with `gate.lifecycle.machine` and `NodeApplier`
(`gate.controller.node_applier`) sends the decision. Both share the node writes here (`Writer`).

An applier decides nothing. What it meets while sending (a write refused for good, a ConfigMap that
is not NodeGate's, a PodDisruptionBudget that blocks an eviction, a stage pod it could not record)
comes back as data (`node_applier.Applied`, `gate_applier.NodeWrites`), and the reconciler asks
`gate.lifecycle.outcomes` what follows: that is the next plan, sent by the same applier. A stage pod
whose images are not pinned yet is held by the decision (`gate.lifecycle.images.held_requests`),
never by the applier. No applier touches the work queue: a reconcile returns when to look again
(`gate.controller.result.Result`), and the worker turns that into the queue's calls. Nothing else in
`gate.controller` calls a write verb of the client on a reconcile's path:
`tests/unit/controller/test_one_writer.py` fails, naming the module and line, when one does.

The order of a node decision's writes: one Node write (state annotation, status label, cordon,
taint, guarded by the resourceVersion it was decided on), the deletion of the stage pods it is done
with, the creation of the ones it asks for, evictions, Events and metrics. The order of a gate plan's
writes is in `gate.lifecycle.reconcile`. Both make a crash at any line harmless.

Like controller-runtime's client writes, every write here is observed into the cache at once, so the
next reconcile of the same object sees it before its watch event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.events import EventRecorder
from gate.controller.metrics import OperatorMetrics
from gate.controller.patches import node_patch
from gate.controller.settings import OperatorSettings
from gate.controller.signing import Signer
from gate.controller.views import node_view
from gate.controller.world import World
from gate.kube.client import NODES, KubeClient
from gate.kube.errors import ApiError, Forbidden, NotFound
from gate.lifecycle.condition import NodeCondition, condition_patch
from gate.lifecycle.fleet import NodeUpdate
from gate.lifecycle.node import Decision, EventRequest, NodeView
from gate.lifecycle.outcomes import Unrecordable

log = logging.getLogger("nodegate.operator")


# Refusals that asking again cannot change: not found (404: the object went, the next look decides
# anew), conflicts (409: decided again on the fresh copy), throttling and PodDisruptionBudgets (429),
# a timeout (408) and the operator's own credentials and rights (401, and a 403 of the authorizer:
# every write of the kind would fail alike, the node is not the problem, and a kube-apiserver just
# started refuses for a moment what its RBAC caches have not loaded yet) are temporary; they go back
# to the queue with backoff.
_TEMPORARY_4XX = frozenset({401, 404, 408, 409, 429})


def refused_for_good(exc: ApiError) -> bool:
    """The API server refused a write, and would refuse it again as is: admission (a webhook, a
    ValidatingAdmissionPolicy, a quota, a LimitRange), validation, a body too large."""
    if isinstance(exc, Forbidden) and exc.by_authorizer:
        return False
    return 400 <= exc.status < 500 and exc.status not in _TEMPORARY_4XX


@dataclass(frozen=True)
class NodeWrite:
    """A node write as sent: the node after it, and whether anything was sent (a write that changes
    nothing is not)."""

    obj: Obj
    sent: bool

    def in_round(self, update: NodeUpdate) -> bool:
        """It wrote a round in progress: the node's own reconcile looks at once."""
        return self.sent and update.state is not None and update.state.status == "in-progress"


class Writer:
    """The node writes both appliers send, and the failure of a node for a refused write."""

    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics,
                 recorder: EventRecorder, world: World) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.recorder = recorder
        self.world = world

    async def write_node_update(self, gate: NodeGate, node: str, update: NodeUpdate,
                                base: Obj | None = None) -> NodeWrite:
        """One merge patch: state annotation, status label, cordon and taint, guarded by resourceVersion.
        The state is signed for this gate and node here, the one place the operator writes a record
        (`gate.controller.signing`): whatever state it writes is its own from then on."""
        obj = base or self.world.nodes.get(node)
        if obj is None:
            return NodeWrite({}, False)
        if update.state is not None:
            update = replace(update, state=self._signer().sign(gate, obj, update.state))
        built = node_patch(gate.name, obj, update)
        if built.body is None:
            await self.emit(obj, update.events)
            return NodeWrite(obj, False)
        if built.taint_added:
            self.metrics.taints_added.labels(gate.name).inc()
        if built.taint_removed:
            self.metrics.taint_removals.labels(gate.name).inc()
        result = await self.client.patch(NODES, node, built.body)
        self.world.nodes.observe(result)
        self.world.fleet_memo.pop(node, None)
        await self.emit(result, update.events)
        return NodeWrite(result, True)

    async def write_condition(self, kind: str, view: NodeView, wanted: NodeCondition | None) -> None:
        """The node condition of type `kind` as `wanted` (None: removed), where the node's differs."""
        patch = condition_patch(view.conditions.get(kind), wanted, kind, datetime.now(UTC))
        if patch is not None:
            await self._patch_condition(view.name, patch)

    async def _patch_condition(self, node: str, patch: Obj) -> None:
        try:
            # Strategic merge on the status subresource: only this entry of the list (merged by type)
            # changes, whatever the kubelet writes next to it; no resourceVersion needed.
            result = await self.client.patch(NODES, node, patch, patch_type="strategic", subresource="status")
        except NotFound:
            return
        except ApiError as exc:
            if not refused_for_good(exc):
                raise
            # The state annotation and the status label still say it; one node's refused condition
            # must not hold back the gate's plan and status.
            log.warning("Node condition refused; node=%s error=%s", node, exc)
            return
        self.world.nodes.observe(result)
        self.world.fleet_memo.pop(node, None)

    async def emit(self, obj: Obj, events: Iterable[EventRequest]) -> None:
        for event in events:
            await self.recorder.emit(obj, event.type, event.reason, event.message)

    async def emit_decision_events(self, gate: NodeGate, node_obj: Obj, events: Iterable[EventRequest]) -> None:
        """Events of a decision: each on the gate or on the node, as it says."""
        gate_obj = self._gate_obj(gate)
        for event in events:
            await self.recorder.emit(gate_obj if event.target == "gate" else node_obj, event.type, event.reason,
                                     event.message)

    async def apply_failure(self, gate: NodeGate, node_obj: Obj, decision: Decision) -> ApiError | None:
        """Write a decision that fails the node for a refused write (`gate.lifecycle.outcomes`), on the node
        as it was before that write: its record, change and node Events, then its gate Events and the
        failure's metric. Returns the API server's refusal when this write is refused for good too."""
        update = NodeUpdate(state=decision.state, change=decision.node,
                            events=[e for e in decision.events if e.target == "node"])
        try:
            await self.write_node_update(gate, node_obj["metadata"]["name"], update, base=node_obj)
        except ApiError as again:
            if not refused_for_good(again):
                raise
            return again
        await self.emit_decision_events(gate, node_obj, (e for e in decision.events if e.target == "gate"))
        if decision.state is not None and decision.state.failure:
            f = decision.state.failure
            self.metrics.stage_failures.labels(gate.name, f.package or "-", f.stage, f.reason).inc()
        return None

    async def apply_unrecordable(self, gate: NodeGate, node_obj: Obj, unrecorded: Unrecordable) -> None:
        """A failure the node's write refused too: its Events and its condition (`outcomes.unrecordable`)."""
        await self.emit_decision_events(gate, node_obj, unrecorded.events)
        if unrecorded.write_condition:
            await self.write_condition(keys.failed_condition(gate.name), node_view(node_obj), unrecorded.condition)

    def _signer(self) -> Signer:
        if self.world.signer is None:
            raise RuntimeError("the operator's record signing key is not loaded: no record can be written")
        return self.world.signer

    async def pod_not_ours(self, gate: str, node: str, name: str, uid: str, shape: str, why: str, *,
                           deleted: bool = False) -> None:
        """Report a pod carrying the gate's stage pod labels that is not the operator's: once per pod and shape
        (a Warning Event `PodNotOurs` on the gate, `nodegate_pods_refused_total`, a log line). `deleted`: the
        operator deletes it (a staging or undo pod, `gate.controller.staging`); else it leaves it be."""
        seen = (gate, uid or f"{self.settings.namespace}/{name}", shape)
        if seen in self.world.pods_reported:
            return
        self.world.pods_reported.add(seen)
        self.metrics.pods_refused.labels(gate).inc()
        log.warning("Stage pod not the operator's, %s; gate=%s node=%s pod=%s/%s why=%s",
                    "deleted" if deleted else "ignored", gate, node, self.settings.namespace, name, why)
        then = ("The operator deletes it. Find who created or changed it (the API server's audit log)" if deleted
                else "Find who created or changed it (the API server's audit log), then delete it")
        await self.recorder.emit(self._gate_obj(gate), "Warning", "PodNotOurs",
                                 f"Pod {self.settings.namespace}/{name} on node {node} carries NodeGate {gate}'s "
                                 f"stage pod labels but is not the operator's: {why}. It is not read as a stage "
                                 f"result. {then}")

    def _gate_obj(self, gate: NodeGate | str) -> Obj:
        name = gate if isinstance(gate, str) else gate.name
        return self.world.gates.get(name) or {"apiVersion": keys.API_VERSION, "kind": "NodeGate",
                                              "metadata": {"name": name}}
