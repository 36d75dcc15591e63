"""The executor: it performs what the pure parts decided, and nothing else.

A node decision (`gate.lifecycle.machine.Decision`) becomes, in this order: one Node write (state
annotation, status label, cordon, taint, guarded by the resourceVersion it was decided on), the
deletion of the stage pods it is done with, the creation of the ones it asks for, evictions, Events
and metrics, and when to look again. The order is what makes a crash at any line harmless
(`gate.lifecycle.machine`).

A gate's plan (`gate.lifecycle.reconcile.ReconcilePlan`) is written by `apply_gate_plan`, the only
writer of a gate reconcile, in this order: the node writes (16 at a time; a write that lost a race
stops the rest, and the gate is retried), the node conditions (failed, blocked), the gate's status,
the removal of the gate's requests acted on, Events, metrics, and when to look again.

Like controller-runtime's client writes, every write here is observed into the cache at once, so the
next reconcile of the same object sees it before its watch event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, PodRecord
from gate.controller.events import EventRecorder
from gate.controller.imagetrust import ImageTrust
from gate.controller.metrics import OperatorMetrics
from gate.controller.patches import node_patch
from gate.controller.pods import (
    config_map,
    config_map_problems,
    container_name,
    facts_of,
    request_packages,
    stage_pod,
    stage_pod_ended,
    stage_pod_fields,
    stage_pod_view,
)
from gate.controller.podshape import shape_differences, shape_digest
from gate.controller.settings import OperatorSettings
from gate.controller.signing import Signer
from gate.controller.triggers import GateKey, NodeKey
from gate.controller.views import node_view
from gate.controller.world import World
from gate.kube.client import CONFIGMAPS, NODEGATES, NODES, PODS, KubeClient
from gate.kube.errors import ApiError, Conflict, ConnectionFailed, NotFound, TooManyRequests
from gate.kube.objects import container_states, parse_time, state_status
from gate.lifecycle.condition import NodeCondition, condition_patch, failure_condition
from gate.lifecycle.fleet import NodeUpdate
from gate.lifecycle.images import pod_images
from gate.lifecycle.machine import (
    Decision,
    EventRequest,
    NodeContext,
    NodeView,
    PodRequest,
    Step,
    config_refused,
    write_refused,
)
from gate.lifecycle.ownership import refusal as pod_refusal
from gate.lifecycle.reconcile import GateMetrics, ReconcilePlan
from gate.lifecycle.signatures import AGENT, agent_image

log = logging.getLogger("nodegate.operator")


# Refusals that asking again cannot change: not found (404: the object went, the next look decides
# anew), conflicts (409: decided again on the fresh copy), throttling and PodDisruptionBudgets (429),
# a timeout (408) and the operator's own credentials (401: every write would fail alike, the node is
# not the problem) are temporary; they go back to the queue with backoff.
_TEMPORARY_4XX = frozenset({401, 404, 408, 409, 429})


def refused_for_good(exc: ApiError) -> bool:
    """The API server refused a write, and would refuse it again as is: admission (a webhook, a
    ValidatingAdmissionPolicy, a quota, a LimitRange), validation, RBAC, a body too large."""
    return 400 <= exc.status < 500 and exc.status not in _TEMPORARY_4XX


# Tries at recording a created stage pod when other writers of the node win the race (each on a newer copy).
_RECORD_ATTEMPTS = 4


class Executor:
    def __init__(self, settings: OperatorSettings, client: KubeClient, metrics: OperatorMetrics,
                 recorder: EventRecorder, world: World, trust: ImageTrust | None = None) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.recorder = recorder
        self.world = world
        self.trust = trust  # the image signature policy's verdicts: the digests a stage pod may pull

    async def apply_gate_plan(self, gate: NodeGate, gate_obj: Obj, plan: ReconcilePlan) -> None:
        """Write what one gate reconcile decided (`gate.lifecycle.reconcile`), the only writes of a gate
        reconcile, in an order that makes a crash between two of them harmless: the node writes (a
        write that lost a race raises once all are done, and the gate is retried through the queue:
        nothing after it is written, so the status never counts progress ahead of the nodes it counts),
        the node conditions, the status, the removal of the requests acted on (once the status says
        what they did), Events, metrics, and when to look again."""
        await self.write_node_updates(gate, plan.updates)
        if plan.releasable is not None:
            self.world.removal_release[gate.name] = plan.releasable
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
        for event in plan.events:
            await self.recorder.emit(gate_obj, event.type, event.reason, event.message)
        if plan.metrics is not None:
            self._gate_metrics(gate.name, plan.metrics)
        if plan.recheck_after is not None:
            self.world.queue.add_after(GateKey(gate.name), plan.recheck_after + 0.5)
        for node in plan.node_keys:
            self.world.queue.add(NodeKey(gate.name, node))

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
        now = datetime.now(UTC)
        patches = []
        for node, condition in wanted.items():
            obj = self.world.nodes.get(node)
            if obj is None:
                continue  # gone: nothing to write on
            current = node_view(obj).conditions.get(kind)
            patch = condition_patch(current, condition, kind, now)
            if patch is not None:
                patches.append((node, patch))

        async def sync(node: str, patch: Obj) -> None:
            async with sem:
                await self._patch_condition(node, patch)

        await asyncio.gather(*(sync(node, patch) for node, patch in patches))

    async def write_failure_condition(self, gate: str, view: NodeView, wanted: NodeCondition | None) -> None:
        kind = keys.failed_condition(gate)
        patch = condition_patch(view.conditions.get(kind), wanted, kind, datetime.now(UTC))
        if patch is not None:
            await self._patch_condition(view.name, patch)

    async def write_hand_off_condition(self, view: NodeView, wanted: NodeCondition | None) -> None:
        kind = keys.HAND_OFF_CONDITION
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

    async def write_node_updates(self, gate: NodeGate, updates: Mapping[str, NodeUpdate]) -> None:
        """Write a plan's node updates, 16 at a time; the first failure is raised once all are done.
        A write refused for good fails its node (`_refused_update`) and holds back none of the others."""
        sem = asyncio.Semaphore(16)

        async def apply(node: str, update: NodeUpdate) -> None:
            async with sem:
                try:
                    await self.write_node_update(gate, node, update)
                except ApiError as exc:
                    if not refused_for_good(exc):
                        raise
                    await self._refused_update(gate, node, update, exc)

        results = await asyncio.gather(*(apply(n, u) for n, u in updates.items()), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def execute(self, gate: NodeGate, node_obj: Obj, decision: Decision, ctx: NodeContext) -> None:
        """Perform a node's decision. A write of it that the API server refuses for good fails the node
        with the server's message (`gate.lifecycle.machine.write_refused`) and ends the decision there:
        the node is never left cordoned and drained, waiting for a write that cannot succeed."""
        node = node_obj["metadata"]["name"]
        old_state = (node_obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate.name))
        if decision.writes_node or decision.remove_state:
            update = NodeUpdate(state=decision.state, change=decision.node, remove_state=decision.remove_state)
            try:
                node_obj = await self.write_node_update(gate, node, update, base=node_obj)
                if decision.node.held_by is not None:
                    self.metrics.hand_off_holds.labels(decision.node.held_by).inc()
            except ApiError as exc:
                if not refused_for_good(exc) or decision.remove_state:
                    raise  # a removal that cannot be written cannot be recorded as failed either
                cordon = decision.node.unschedulable is True
                await self._fail_refused(gate, node_obj, ctx, "NodeWriteRefused",
                                         f"the {'cordon' if cordon else 'write'} of node {node}", exc,
                                         stage="cordon" if cordon else "")
                return
        seen = replace(ctx, state=decision.state or ctx.state, node=node_view(node_obj))
        for name in decision.delete_pods:
            pod = self.world.pods.get(name, self.settings.namespace)
            body = None
            if pod is not None:
                self._stage_metrics(pod)
                self.world.index.pod_event("DELETED", pod)
                if stage_pod_ended(pod):
                    # Nothing runs in it any more: gone at once, without the kubelet's confirmation
                    # (one write, not two), even before the kubelet wrote its terminal phase (the
                    # kubelet then stops its sandbox as an orphan's). One still running is stopped
                    # gracefully.
                    body = {"gracePeriodSeconds": 0}
            await self.client.delete(PODS, name, self.settings.namespace, body=body)
        for request in decision.create_pods:
            trusted = self.trust.trusted() if self.trust is not None else None
            images, unresolved = pod_images(gate, request_packages(request), resolve=self.settings.resolve_digests,
                                            trusted=trusted)
            agent = agent_image(self.settings.agent_image)
            if trusted is not None and (agent is None or (agent.reference, agent.digest) not in trusted):
                unresolved.append(AGENT)  # NodeGate's own image, pinned and judged as a package's
            if unresolved:
                # Fail closed: no stage pod pulls a tag that the rollout has not resolved to a digest yet,
                # nor a digest the image signature policy has not let run in this process. The gate
                # reconcile resolves and judges it (or says why it cannot); this node looks again after it.
                log.info("Stage pod held until its images are resolved; gate=%s node=%s pod=%s packages=%s",
                         gate.name, node, request.name, ",".join(unresolved))
                self.world.gate_later(gate.name)
                self.world.queue.add_after(NodeKey(gate.name, node), max(self.settings.poll_seconds, 1.0))
                continue
            try:
                foreign = await self._ensure_configs(gate, request)
            except _ConfigMapRefused as refused:
                await self._fail_refused(gate, node_obj, seen, "ConfigMapRefused",
                                         f"the ConfigMap of package {refused.package}", refused.error, refused.step)
                return
            if foreign is not None:
                log.warning("ConfigMap not NodeGate's, stage pod not created; gate=%s node=%s pod=%s error=%s",
                            gate.name, node, request.name, foreign[1])
                await self.execute(gate, node_obj, config_refused(seen, request, *foreign), seen)
                return
            facts = facts_of(node, node_obj, seen.state)
            body = stage_pod(gate, node, request, self.settings, facts, images)
            try:
                created = await self._ensure(PODS, body)
            except ApiError as exc:
                if not refused_for_good(exc):
                    raise
                await self._fail_refused(gate, node_obj, seen, "PodRefused", f"the stage pod {request.name}", exc,
                                         request.steps[0])
                return
            if created is None:
                # A pod of this name is there, and the decision did not count it as the operator's.
                node_obj, seen = await self._found_pod(gate, node_obj, seen, body)
                continue
            node_obj, seen = await self._record_pod(gate, node_obj, seen, created)
            # Seen at once by the next reconcile of this node, before the watch event arrives.
            self.world.pods.observe(created)
            self.world.index.pod_event("ADDED", created)
            log.info("Started stage pod; gate=%s node=%s kind=%s steps=%s pod=%s", gate.name, node,
                     request.kind, ",".join(f"{s.package or '-'}/{s.stage}" for s in request.steps), request.name)
        asked = {r.name for r in decision.create_pods}
        for other in self.world.stage_pods_of(gate.name, node, seen.state.pods).foreign:
            if other.pod.name not in asked:  # one asked for was judged by `_found_pod` just now
                await self._pod_not_ours(gate, node, other.pod.name, other.pod.uid, other.pod.shape, other.why)
        try:
            blocked = await self._evict(gate, node, decision.evict) if decision.evict else None
        except _EvictionRefused as refused:
            await self._fail_refused(gate, node_obj, seen, "EvictionRefused", f"the eviction of pod {refused.pod}",
                                     refused.error)
            return
        if blocked:
            state = decision.state or ctx.state  # the record as checked, never the annotation's text
            if state.drain_blocked_by != blocked:  # once per blocking budget, not at every retry
                self.metrics.drains_blocked.labels(gate.name).inc()
                state = state.model_copy(update={"drain_blocked_by": blocked})
                fresh = self.world.nodes.get(node) or node_obj
                await self.write_node_update(gate, node, NodeUpdate(state=state, events=[EventRequest(
                    "node", "Warning", "DrainBlocked", f"Eviction refused: {blocked}")]), base=fresh)
        gate_obj = self._gate_obj(gate)
        for event in decision.events:
            target = gate_obj if event.target == "gate" else node_obj
            await self.recorder.emit(target, event.type, event.reason, event.message)
        if decision.state is not None and decision.state.status == "failed" and decision.state.failure:
            f = decision.state.failure
            self.metrics.stage_failures.labels(gate.name, f.package or "-", f.stage, f.reason).inc()
        if decision.requeue_after is not None:
            self.world.queue.add_after(NodeKey(gate.name, node), decision.requeue_after)
        new_status = decision.state.status if decision.state is not None else None
        if decision.remove_state or (new_status is not None and old_state is not None
                                     and state_status(old_state) != new_status):
            self.world.gate_later(gate.name)

    async def _record_pod(self, gate: NodeGate, node_obj: Obj, seen: NodeContext, pod: Obj) -> tuple[Obj, NodeContext]:
        """Record a stage pod as the operator's (`gate.lifecycle.ownership`): its uid and the digest of what it
        runs, in the node's signed state, in a write of its own (a create cannot carry the uid it gets). The
        records of pods gone from the node are dropped in the same write. A write that fails leaves the pod
        unrecorded: the next look asks for it again and `_found_pod` adopts it."""
        node = node_obj["metadata"]["name"]
        meta = pod["metadata"]
        present = set(self.world.index.pods_of(gate.name, node)) | {meta["name"]}
        record = PodRecord(uid=meta["uid"], shape=shape_digest(pod))
        base, current = node_obj, seen.state
        for attempt in range(_RECORD_ATTEMPTS):
            kept = {name: r for name, r in current.pods.items() if name in present}
            state = current.model_copy(update={"pods": {**kept, meta["name"]: record}})
            try:
                node_obj = await self.write_node_update(gate, node, NodeUpdate(state=state), base=base)
                return node_obj, replace(seen, state=state, node=node_view(node_obj))
            except Conflict as exc:
                # Written meanwhile (another gate's round on the same node, the gate's plan): again on a newer
                # copy, the gate's record on it checked as on every read (`World.fleet_node`). The cache's copy
                # when it has one; the API server's when the watch has not brought it yet (a list by name: the
                # operator lists and watches nodes, and gets none).
                error: ApiError = exc
                if attempt == _RECORD_ATTEMPTS - 1:
                    break
                fresh = self.world.nodes.get(node)
                if fresh is None or fresh is base:
                    try:
                        listed, _ = await self.client.list(NODES, field_selector=f"metadata.name={node}")
                    except (ApiError, ConnectionFailed) as failed:
                        error = failed if isinstance(failed, ApiError) else exc
                        break
                    fresh = listed[0] if listed else None
                if fresh is None:
                    break
                again = self.world.fleet_node(fresh).states.get(gate.name)
                if not isinstance(again, NodeGateState):
                    break
                base, current = fresh, again
            except ApiError as exc:
                error = exc
                break
        log.warning("Stage pod not recorded, adopted at the next look; gate=%s node=%s pod=%s error=%s",
                    gate.name, node, meta["name"], error)
        self.world.queue.add_after(NodeKey(gate.name, node), max(self.settings.poll_seconds, 1.0))
        return node_obj, seen

    async def _found_pod(self, gate: NodeGate, node_obj: Obj, seen: NodeContext, body: Obj) -> tuple[Obj, NodeContext]:
        """A create found a pod under the stage pod's deterministic name that the decision did not count as
        the operator's. Adopted when its uid is not recorded and it runs exactly what `body` (the operator's
        manifest) says: a crash, or a lost race on the node's write, between the create and the record
        (`_record_pod`). Otherwise it is not the operator's: reported once, never read, and the node waits
        for it to go (a person deletes it; the next look creates the operator's)."""
        node, name = node_obj["metadata"]["name"], body["metadata"]["name"]
        self.world.queue.add_after(NodeKey(gate.name, node), max(self.settings.poll_seconds, 1.0))
        # A list by name, not a get: the operator's RBAC lists and watches pods, and gets none.
        found, _ = await self.client.list(PODS, self.settings.namespace, field_selector=f"metadata.name={name}")
        if not found:
            return node_obj, seen  # gone since: the next look creates it
        live = found[0]
        if live["metadata"].get("deletionTimestamp"):
            # On its way out (the operator's own, deleted, or anyone's): neither adopted nor put back into the
            # cache, whose watch may already have seen it go; the next look, after it is gone, creates it anew.
            return node_obj, seen
        uid, shape = str(live["metadata"].get("uid") or ""), shape_digest(live)
        record = seen.state.pods.get(name)
        if record is not None and record.uid == uid:
            why = pod_refusal(stage_pod_view(stage_pod_fields(live)), record)
            if why is None:  # the operator's, and unchanged: the cache had not seen it yet
                self.world.pods.observe(live)
                self.world.index.pod_event("ADDED", live)
                return node_obj, seen
        else:
            differences = shape_differences(body, live)
            if not differences:
                log.info("Adopted a stage pod created before its record was written; gate=%s node=%s pod=%s",
                         gate.name, node, name)
                node_obj, seen = await self._record_pod(gate, node_obj, seen, live)
                self.world.pods.observe(live)
                self.world.index.pod_event("ADDED", live)
                return node_obj, seen
            shown = ", ".join(differences[:5]) + (f" and {len(differences) - 5} more" if len(differences) > 5 else "")
            why = (f"it holds the name of the stage pod the operator was about to create, but the operator did not "
                   f"record creating it, and it does not run what the operator builds (differs in {shown})")
        await self._pod_not_ours(gate, node, name, uid, shape, why)
        return node_obj, seen

    async def _pod_not_ours(self, gate: NodeGate, node: str, name: str, uid: str, shape: str, why: str) -> None:
        """Report a pod carrying the gate's stage pod labels that is not the operator's: once per pod and shape
        (a Warning Event `PodNotOurs` on the gate, `nodegate_pods_refused_total`, a log line)."""
        seen = (gate.name, uid or f"{self.settings.namespace}/{name}", shape)
        if seen in self.world.pods_reported:
            return
        self.world.pods_reported.add(seen)
        self.metrics.pods_refused.labels(gate.name).inc()
        log.warning("Stage pod not the operator's, ignored; gate=%s node=%s pod=%s/%s why=%s", gate.name, node,
                    self.settings.namespace, name, why)
        await self.recorder.emit(self._gate_obj(gate), "Warning", "PodNotOurs",
                                 f"Pod {self.settings.namespace}/{name} on node {node} carries NodeGate {gate.name}'s "
                                 f"stage pod labels but is not the operator's: {why}. It is not read as a stage "
                                 "result. Find who created or changed it (the API server's audit log), then delete it")

    def _stage_metrics(self, pod: Obj) -> None:
        """A stage pod about to be deleted: the duration of each of its steps by outcome (succeeded,
        failed, or abandoned when a reset or a gate deletion cut it off), from the container's start
        to its end."""
        view = stage_pod_view(pod)
        states = container_states(pod)
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

    async def _ensure_configs(self, gate: NodeGate, request: PodRequest) -> tuple[str, str] | None:
        """Create the ConfigMaps of the request's packages; one that exists already must be the one NodeGate
        renders (`config_map_problems`). Returns the package and why, for the first one that is not."""
        firsts: dict[str, Step] = {}  # each package's first step: its ConfigMap, once
        for step in request.steps:
            if step.package is not None:
                firsts.setdefault(step.package, step)
        for package, step in firsts.items():
            if not gate.spec.packages[package].config:
                continue  # nothing to create; the agent still holds whatever it finds against the digest
            wanted = config_map(gate, package, self.settings)
            try:
                created = await self._ensure(CONFIGMAPS, wanted)
            except ApiError as exc:
                if not refused_for_good(exc):
                    raise
                raise _ConfigMapRefused(package, step, exc) from exc
            if created is not None:
                continue
            name, namespace = wanted["metadata"]["name"], wanted["metadata"]["namespace"]
            # One read per stage pod whose ConfigMap exists (every node's after the first): the operator
            # keeps no ConfigMap cache, and a verdict remembered from an earlier read would miss a
            # ConfigMap deleted and planted again since (the agent's digest check would still catch it).
            problems = config_map_problems(await self.client.get(CONFIGMAPS, name, namespace), wanted)
            if problems:
                return package, (f"ConfigMap {namespace}/{name} exists but is not NodeGate's config of package "
                                 f"{package}: {'; '.join(problems)}. Nothing ran. Someone else created or replaced "
                                 "it: find out who, delete it, then rerun the node")
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
                if refused_for_good(exc):
                    raise _EvictionRefused(f"{namespace}/{name}", exc) from exc
                if exc.status != 404:
                    raise
            return None

        for result in await asyncio.gather(*(evict(ns, n) for ns, n in pods)):
            blocked = blocked or result
        return blocked

    async def lift_readiness_taint(self, node_obj: Obj, why: str) -> None:
        """Remove the readiness taint of a node that no gate holds back any longer (no gate's keys move)."""
        update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                 f"NodeGate lifted the readiness taint: {why}")])
        update.change.remove_readiness_taint = True
        built = node_patch("", node_obj, update)
        if built.body is None:
            return
        self.metrics.taint_removals.labels("-").inc()  # no gate: "-", as for a node step's package
        result = await self.client.patch(NODES, node_obj["metadata"]["name"], built.body)
        self.world.nodes.observe(result)
        log.info("Lifted the readiness taint; node=%s why=%s", node_obj["metadata"]["name"], why)
        for event in update.events:
            await self.recorder.emit(result, event.type, event.reason, event.message)

    async def release_hand_off(self, node_obj: Obj) -> None:
        """Someone uncordoned a node held for hand-off: drop `held-by` and record the release for good,
        guarded by the resourceVersion it was seen at (a node cordoned again meanwhile is looked at again)."""
        name = node_obj["metadata"]["name"]
        holder = (node_obj["metadata"].get("annotations") or {}).get(keys.HELD_BY, "")
        update = NodeUpdate(events=[EventRequest("node", "Normal", "HandOffReleased",
                                                 f"The node was uncordoned: NodeGate {holder}'s hand-off hold "
                                                 "ended, and NodeGate never holds this node again")])
        update.change.hand_off_released = datetime.now(UTC).isoformat(timespec="seconds")
        built = node_patch("", node_obj, update)
        if built.body is None:
            return
        self.metrics.hand_off_releases.inc()
        result = await self.client.patch(NODES, name, built.body)
        self.world.nodes.observe(result)
        log.info("Noticed a hand-off release; node=%s gate=%s", name, holder)
        for event in update.events:
            await self.recorder.emit(result, event.type, event.reason, event.message)

    async def _fail_refused(self, gate: NodeGate, node_obj: Obj, ctx: NodeContext, reason: str, what: str,
                            exc: ApiError, step: Step | None = None, stage: str = "") -> None:
        """Fail the node for a write refused for good (`what`, as the message says it), as the node was
        (`node_obj`, `ctx`) before that write."""
        node = node_obj["metadata"]["name"]
        log.warning("Write refused; gate=%s node=%s reason=%s what=%s error=%s", gate.name, node, reason, what, exc)
        decision = write_refused(ctx, reason, what, exc.message, step, stage=stage)
        update = NodeUpdate(state=decision.state, change=decision.node,
                            events=[e for e in decision.events if e.target == "node"])
        try:
            await self.write_node_update(gate, node, update, base=node_obj)
        except ApiError as again:
            if not refused_for_good(again):
                raise
            await self._unrecordable(gate, node_obj, decision, again)
            return
        gate_obj = self._gate_obj(gate)
        for event in decision.events:
            if event.target == "gate":
                await self.recorder.emit(gate_obj, event.type, event.reason, event.message)
        if decision.state is not None and decision.state.failure:
            f = decision.state.failure
            self.metrics.stage_failures.labels(gate.name, f.package or "-", f.stage, f.reason).inc()
        self.world.gate_later(gate.name)  # the batch is judged and the budget slot counted again

    async def _refused_update(self, gate: NodeGate, node: str, update: NodeUpdate, exc: ApiError) -> None:
        """A gate plan's write of one node refused for good. A node the plan picked (or moved on) fails
        in that state, as its round would; a write of anything else (a status label, a request acted
        on) is reported, and left for the next plan."""
        obj = self.world.nodes.get(node)
        if obj is None:
            return
        if update.state is None or update.remove_state:
            log.warning("Node write refused; gate=%s node=%s error=%s", gate.name, node, exc)
            await self.recorder.emit(obj, "Warning", "NodeWriteRefused",
                                     f"NodeGate {gate.name}: the API server refused the write of node {node}: "
                                     f"{exc.message}")
            return
        view = node_view(obj)
        ctx = NodeContext(gate=gate, node=view, state=update.state,
                          stage_pods=self.world.stage_pods_of(gate.name, node, update.state.pods).ours, pods=None,
                          now=datetime.now(UTC))
        starts = update.state.status == "in-progress" and update.state.phase == "idle"
        await self._fail_refused(gate, obj, ctx, "NodeWriteRefused",
                                 f"the {'start of a round' if starts else 'write'} of node {node}", exc,
                                 stage="start" if starts else "")

    async def _unrecordable(self, gate: NodeGate, node_obj: Obj, decision: Decision, exc: ApiError) -> None:
        """The node's failure cannot be written either (whatever refuses the node's writes refuses this
        one too): say it where it can still be said, the node's condition (its status subresource) and
        Events on the node and the gate, and leave the node to the next look."""
        node = node_obj["metadata"]["name"]
        log.error("Node failure could not be recorded; gate=%s node=%s error=%s", gate.name, node, exc)
        gate_obj = self._gate_obj(gate)
        failure = decision.state.failure if decision.state is not None else None
        for event in decision.events:
            if failure is None or event.reason != failure.reason:
                continue  # an uncordon, say: it was not written either
            await self.recorder.emit(gate_obj if event.target == "gate" else node_obj, event.type, event.reason,
                                     f"{event.message} (and recording it on the node was refused: {exc.message})")
        if decision.state is not None:
            await self.write_failure_condition(gate.name, node_view(node_obj),
                                               failure_condition(gate.name, decision.state))

    def _signer(self) -> Signer:
        if self.world.signer is None:
            raise RuntimeError("the operator's record signing key is not loaded: no record can be written")
        return self.world.signer

    def _gate_obj(self, gate: NodeGate) -> Obj:
        return self.world.gates.get(gate.name) or {"apiVersion": keys.API_VERSION, "kind": "NodeGate",
                                                   "metadata": {"name": gate.name}}

    async def write_node_update(self, gate: NodeGate, node: str, update: NodeUpdate,
                                 base: Obj | None = None) -> Obj:
        """One merge patch: state annotation, status label, cordon and taint, guarded by resourceVersion.
        The state is signed for this gate and node here, the one place the operator writes a record
        (`gate.controller.signing`): whatever state it writes is its own from then on."""
        obj = base or self.world.nodes.get(node)
        if obj is None:
            return {}
        if update.state is not None:
            update = replace(update, state=self._signer().sign(gate, obj, update.state))
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
        self.world.nodes.observe(result)
        self.world.fleet_memo.pop(node, None)
        for event in update.events:
            await self.recorder.emit(result, event.type, event.reason, event.message)
        if update.state is not None and update.state.status == "in-progress":
            self.world.queue.add(NodeKey(gate.name, node))
        return result


class _ConfigMapRefused(Exception):
    """The create of a package's ConfigMap refused for good: its node's round cannot go on."""

    def __init__(self, package: str, step: Step, error: ApiError) -> None:
        super().__init__(f"ConfigMap of package {package} refused: {error}")
        self.package = package
        self.step = step
        self.error = error


class _EvictionRefused(Exception):
    """An eviction refused for good (not by a PodDisruptionBudget): the drain cannot go on."""

    def __init__(self, pod: str, error: ApiError) -> None:
        super().__init__(f"eviction of {pod} refused: {error}")
        self.pod = pod
        self.error = error


def _blocking_pdb(exc: TooManyRequests, namespace: str, pod: str) -> str:
    for cause in exc.causes:
        if cause.get("reason") == "DisruptionBudget":
            return f"pod {namespace}/{pod}: {cause.get('message', '')}"
    return f"pod {namespace}/{pod}: {exc.message}"

