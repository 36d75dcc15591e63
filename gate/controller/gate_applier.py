"""The gate applier: it sends what a gate reconcile planned, in the plan's order, and decides nothing.

Four plans of the gate reconcile come here (`gate.controller.executor` states the rule): the image
records and conditions of `gate.lifecycle.images.plan_images` (`apply_images`, before anything else
is planned), the `gate.lifecycle.reconcile.ReconcilePlan` (`write_node_updates`, then
`apply_gate_plan`), the prepull pods (`apply_prepull`) and the staging and undo pods
(`apply_staging`). A node write refused for good is handed back (`NodeWrites.refused`) for the
reconcile to plan what follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.executor import Writer, refused_for_good
from gate.controller.prepull import PrepullWrites
from gate.controller.staging import StagingWrites
from gate.controller.views import node_view
from gate.kube.client import NODEGATES, PODS
from gate.kube.errors import ApiError, Conflict
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.fleet import NodeUpdate
from gate.lifecycle.images import ImagesPlan
from gate.lifecycle.prepull import Candidate
from gate.lifecycle.reconcile import GateMetrics, ReconcilePlan

log = logging.getLogger("nodegate.operator")


@dataclass
class NodeWrites:
    """What a plan's node writes met: the nodes written with something to send, the writes refused for
    good (node -> the update and the refusal), and the first other error (raised once the refusals are
    planned and written)."""

    sent: set[str] = field(default_factory=set)
    in_round: set[str] = field(default_factory=set)  # written with a round in progress
    refused: dict[str, tuple[NodeUpdate, ApiError]] = field(default_factory=dict)
    error: BaseException | None = None


class GateApplier(Writer):
    async def apply_images(self, gate: NodeGate, obj: Obj, plan: ImagesPlan) -> Obj | None:
        """The image records and conditions (guarded by the resourceVersion they were planned on), then
        the Events, on the gate as written. Returns the gate's object after the write; None: nothing
        was written."""
        patched = None
        if plan.status is not None:
            patched = await self.client.patch(NODEGATES, gate.name, {"status": plan.status, "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"]}}, subresource="status")
            self.world.gates.observe(patched)
        await self.emit(patched or obj, plan.events)
        return patched

    async def write_node_updates(self, gate: NodeGate, updates: Mapping[str, NodeUpdate]) -> NodeWrites:
        """A plan's node updates, 16 at a time; a write refused for good holds back none of the others."""
        sem = asyncio.Semaphore(16)
        out = NodeWrites()

        async def apply(node: str, update: NodeUpdate) -> None:
            async with sem:
                try:
                    written = await self.write_node_update(gate, node, update)
                except ApiError as exc:
                    if not refused_for_good(exc):
                        raise
                    out.refused[node] = (update, exc)
                    return
                if written.sent:
                    out.sent.add(node)
                if written.in_round(update):
                    out.in_round.add(node)

        results = await asyncio.gather(*(apply(n, u) for n, u in updates.items()), return_exceptions=True)
        out.error = next((r for r in results if isinstance(r, BaseException)), None)
        return out

    async def apply_gate_plan(self, gate: NodeGate, gate_obj: Obj, plan: ReconcilePlan) -> None:
        """The rest of a plan once its node writes are done (`write_node_updates`), in its order: the
        finalizer added, the node conditions, the status, the finalizer released, the requests acted on
        removed, the records not the operator's reported, Events and metrics."""
        if plan.add_finalizer:
            patched = await self.client.patch(NODEGATES, gate.name, {"metadata": {
                "finalizers": [*gate.metadata.finalizers, keys.FINALIZER],
                "resourceVersion": gate.metadata.resource_version}})
            self.world.gates.observe(patched)
        await self._write_conditions(keys.failed_condition(gate.name), plan.failure_conditions)
        await self._write_conditions(keys.blocked_condition(gate.name), plan.blocked_conditions)
        if plan.status is not None:
            patched = await self.client.patch(NODEGATES, gate.name, {"status": plan.status, "metadata": {
                "resourceVersion": gate_obj["metadata"]["resourceVersion"]}}, subresource="status")
            self.world.gates.observe(patched)
        if plan.release and keys.FINALIZER in gate.metadata.finalizers:
            rest = [f for f in gate.metadata.finalizers if f != keys.FINALIZER]
            with contextlib.suppress(ApiError):  # gone already, or changed meanwhile: the next look decides
                await self.client.patch(NODEGATES, gate.name, {"metadata": {
                    "finalizers": rest, "resourceVersion": gate.metadata.resource_version}})
            log.info("Released gate; gate=%s", gate.name)
        if plan.drop_annotations:
            annotations: dict[str, str | None] = dict.fromkeys(plan.drop_annotations)
            patched = await self.client.patch(NODEGATES, gate.name, {"metadata": {"annotations": annotations}})
            self.world.gates.observe(patched)
        for report in plan.refused:
            self.world.reported.add((gate.name, report.node, report.record))
            self.metrics.records_refused.labels(gate.name).inc()
            log.warning("Record not the operator's, ignored; gate=%s node=%s why=%s", gate.name, report.node,
                        report.why)
        await self.emit(gate_obj, plan.events)
        if plan.metrics is not None:
            self._gate_metrics(gate.name, plan.metrics)

    def _gate_metrics(self, gate: str, values: GateMetrics) -> None:
        m = self.metrics
        for state, count in values.nodes.items():
            m.nodes.labels(gate, state).set(count)
        for name, c in values.compartments.items():
            for gauge, value in ((m.c_matched, c.matched), (m.c_ceiling, c.ceiling), (m.c_in_progress, c.in_progress),
                                 (m.c_complete, c.complete), (m.c_failed, c.failed), (m.c_batch, c.batch),
                                 (m.c_failures, c.consecutive_failures), (m.c_stopped, c.stopped),
                                 (m.c_rolled_back, c.rolled_back)):
                gauge.labels(gate, name).set(value)
        if values.drains_blocked is not None:
            m.drains_blocked_now.labels(gate).set(values.drains_blocked)
        if values.wait is not None:
            m.waiting_for_pods.labels(gate).set(values.wait.nodes)
            if values.wait.since is not None:
                m.waiting_for_pods_since.labels(gate).set(values.wait.since)
            else:
                m.waiting_for_pods_since.remove_where(lambda s: s.get("gate") == gate)
        if values.forget is not None:
            f = values.forget
            m.forget_gone(gate, f.compartments, f.packages, f.all_packages)

    async def _write_conditions(self, kind: str, wanted: Mapping[str, NodeCondition | None]) -> None:
        """Write node conditions of type `kind` a plan decided (node -> wanted, None: remove), 16 at a
        time, where the node's (as the cache has it now) differs."""
        sem = asyncio.Semaphore(16)

        async def sync(node: str, condition: NodeCondition | None) -> None:
            obj = self.world.nodes.get(node)
            if obj is None:
                return  # gone: nothing to write on
            async with sem:
                await self.write_condition(kind, node_view(obj), condition)

        await asyncio.gather(*(sync(node, condition) for node, condition in wanted.items()))

    async def _create_pod(self, body: Obj) -> bool | ApiError:
        """A pod the fleet's plan asks for (prepull, staging, undo): True once created (and taken into the cache),
        False when one of its name is there already (that very pod: its name says what it runs), or the API
        server's refusal for good."""
        try:
            created = await self.client.create(PODS, body, self.settings.namespace)
        except Conflict as exc:
            if exc.already_exists:
                return False
            raise
        except ApiError as exc:
            if not refused_for_good(exc):
                raise
            return exc
        self.world.pods.observe(created)
        return True

    async def apply_prepull(self, writes: PrepullWrites) -> list[tuple[Candidate, ApiError]]:
        """The prepull pods to delete and to create, then the Events; returns the creates refused for good
        (a pod already there under its name, (gate, node, images), is that very pod)."""
        refused = []
        for name in writes.delete:  # a pod already gone is fine (missing_ok)
            await self.client.delete(PODS, name, self.settings.namespace)
        for cand, body in writes.create:
            outcome = await self._create_pod(body)
            if isinstance(outcome, ApiError):
                refused.append((cand, outcome))
            elif outcome:
                log.info("Created prepull pod; gate=%s node=%s pod=%s picked=%s", cand.gate, cand.node, cand.pod,
                         cand.picked)
        for gate, event in writes.events:
            obj = self.world.gates.get(gate)
            if obj is not None:
                await self.recorder.emit(obj, event.type, event.reason, event.message)
        return refused

    async def apply_staging(self, writes: StagingWrites) -> None:
        """The staging and undo pods to delete, then those to create (a pod already there under its name is
        that very pod; one refused for good is said in the log, and asked again at the gate's next plan), and the
        pods of their kinds not the operator's reported (deleted with the others)."""
        for pod in writes.foreign:
            await self.pod_not_ours(pod.gate, pod.node, pod.name, pod.uid, pod.shape, pod.why, deleted=True)
            with contextlib.suppress(Conflict):  # another pod under its name by now: judged at the next plan
                await self.client.delete(PODS, pod.name, self.settings.namespace, body={
                    "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}})
        for name in writes.delete:  # a pod already gone is fine (missing_ok)
            # Not observed into the cache: the answer may come after the watch's DELETED event and bring back a
            # pod that is gone. Until that event, the next plan asks again (missing_ok).
            await self.client.delete(PODS, name, self.settings.namespace)
        for gate, node, body in writes.create:
            outcome = await self._create_pod(body)
            name, kind = body["metadata"]["name"], body["metadata"]["labels"][keys.STAGE_KIND_LABEL]
            if isinstance(outcome, ApiError):
                log.warning("Staging pod refused; gate=%s node=%s pod=%s error=%s", gate, node, name, outcome)
            elif outcome:
                log.info("Created %s pod; gate=%s node=%s pod=%s", kind, gate, node, name)
