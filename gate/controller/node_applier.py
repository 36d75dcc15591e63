"""The node applier: it sends a node decision (`gate.lifecycle.node.Decision`), and decides nothing.

In this order: one Node write (state annotation, status label, cordon, taint, guarded by the
resourceVersion it was decided on), the deletion of the stage pods it is done with, the creation of
the ones it asks for (but those the decision holds until their images are pinned), evictions
(`execute`), then, once the reconcile wrote what a blocked eviction asks (`write_drain_blocked`), the
decision's Events and metrics (`finish`). What it meets on the way ends the decision there and comes
back in `Applied` for the next plan (`gate.lifecycle.outcomes`; the rule: `gate.controller.executor`):
a write refused for good, a ConfigMap that is not NodeGate's, the budget that blocked an eviction.
The writes of the taint reconcile (a readiness taint lifted, a hand-off release) are sent here too
(`write_node_change`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass, replace
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, PodRecord
from gate.controller.executor import Writer, refused_for_good
from gate.controller.patches import node_patch
from gate.controller.pods import (
    config_map,
    config_map_problems,
    facts_of,
    stage_pod,
    stage_pod_ended,
    stage_pod_fields,
    stage_pod_view,
    step_runs,
)
from gate.controller.podshape import recorded_shape, shape_differences, shape_digest
from gate.controller.views import node_view
from gate.kube.client import CONFIGMAPS, NODES, PODS
from gate.kube.errors import ApiError, Conflict, ConnectionFailed, TooManyRequests
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.fleet import NodeUpdate
from gate.lifecycle.images import pod_images, request_packages
from gate.lifecycle.node import Decision, NodeContext, NodeView, PodRequest, Step
from gate.lifecycle.outcomes import Refusal, node_write_refusal
from gate.lifecycle.ownership import refusal as pod_refusal

log = logging.getLogger("nodegate.operator")

# Tries at recording a created stage pod when other writers of the node win the race (each on a newer copy).
_RECORD_ATTEMPTS = 4


@dataclass
class Applied:
    """What sending a node decision met. `node_obj` and `seen` are the node and its context as of the last
    write that went through (before the refused one, when one was): the next plan starts from them."""

    node_obj: Obj
    seen: NodeContext
    refusal: Refusal | None = None  # a write refused for good: the decision ended there
    foreign: tuple[PodRequest, str, str] | None = None  # a ConfigMap not NodeGate's: (request, package, why)
    blocked: str | None = None  # the PodDisruptionBudget blocking an eviction, as the refusal says it
    in_round: bool = False  # a write of a round in progress went through: its node is looked at again now
    unsettled: bool = False  # a stage pod not recorded, or one found under its name: looked at again soon


class NodeApplier(Writer):
    async def execute(self, gate: NodeGate, node_obj: Obj, decision: Decision, ctx: NodeContext, *,
                      held: Collection[str] = (), trusted: Container[tuple[str, str]] | None = None) -> Applied:
        """Send a node's decision up to its evictions; `held`: stage pods of it not created (their images
        are not pinned yet, or not judged runnable under the image signature policy, `trusted`, as
        `gate.lifecycle.images.held_requests` read it). A write refused for good, or a ConfigMap that is
        not NodeGate's, ends it there: the node is never left cordoned and drained, waiting for a write
        that cannot succeed."""
        node = node_obj["metadata"]["name"]
        out = Applied(node_obj, ctx)
        # The write waits for the pod's create and carries its record (`Decision.records_in_write`), and the
        # ended pods go once it is written; otherwise it comes first.
        fold = decision.records_in_write and not any(r.name in held for r in decision.create_pods)
        written = not fold
        if (decision.writes_node or decision.remove_state) and not fold:
            if not await self._write_decision(gate, node_obj, decision, out):
                return out
            node_obj = out.node_obj
        seen = replace(ctx, state=decision.state or ctx.state, node=node_view(node_obj))
        if not fold:
            out.node_obj, out.seen = node_obj, seen
            await self._delete_pods(decision.delete_pods)
        for request in decision.create_pods:
            if request.name in held:
                continue
            images = pod_images(gate, request_packages(request), resolve=self.settings.resolve_digests,
                                trusted=trusted)[0]
            try:
                foreign = await self._ensure_configs(gate, request)
            except _ConfigMapRefused as refused:
                out.refusal = Refusal("ConfigMapRefused", f"the ConfigMap of package {refused.package}",
                                      refused.error.message, refused.step)
                return out
            if foreign is not None:
                out.foreign = (request, *foreign)
                return out
            facts = facts_of(node, node_obj, seen.state)
            body = stage_pod(gate, node, request, self.settings, facts, images)
            try:
                created = await self._ensure(PODS, body)
            except ApiError as exc:
                if not refused_for_good(exc):
                    raise
                out.refusal = Refusal("PodRefused", f"the stage pod {request.name}", exc.message, request.steps[0])
                return out
            if created is not None:
                # Into the cache at once, as it keeps it (its shape digested once: for its record, for the cache,
                # and for its ADDED event, which often comes during the record's write). Into the index, where
                # the reconciles find it, only once recorded, as before.
                created = stage_pod_fields(created)
                self.world.pods.observe(created)
            recorded = False
            if not written:  # with the record of the pod made; a pod found under its name is judged after it
                if not await self._write_decision(gate, node_obj, decision, out, record=created):
                    return out
                node_obj, seen, written, recorded = out.node_obj, out.seen, True, created is not None
            if created is None:
                # A pod of this name is there, and the decision did not count it as the operator's.
                node_obj, seen = await self._found_pod(gate, node_obj, seen, body, out)
            else:
                if not recorded:
                    node_obj, seen = await self._record_pod(gate, node_obj, seen, created, out)
                # Seen at once by the next reconcile of this node, before the watch event arrives; not
                # when the watch saw it go already (deleted by someone while its record was written): its
                # DELETED event has queued this node, whose next look creates it again.
                if self.world.pods.observe(created):
                    self.world.index.pod_event("ADDED", created)
                log.info("Started stage pod; gate=%s node=%s kind=%s steps=%s pod=%s", gate.name, node, request.kind,
                         ",".join(f"{s.package or '-'}/{s.stage}" for s in request.steps), request.name)
            out.node_obj, out.seen = node_obj, seen
        if fold:  # written by now: its one pod was not held (`fold`), and each way out of the loop returned
            await self._delete_pods(decision.delete_pods)
        asked = {r.name for r in decision.create_pods}
        for other in self.world.stage_pods_of(gate.name, node, seen.state.pods).foreign:
            if other.pod.name not in asked:  # one asked for was judged by `_found_pod` just now
                await self.pod_not_ours(gate.name, node, other.pod.name, other.pod.uid, other.pod.shape, other.why)
        try:
            out.blocked = await self._evict(gate, node, decision.evict) if decision.evict else None
        except _EvictionRefused as refused:
            out.refusal = Refusal("EvictionRefused", f"the eviction of pod {refused.pod}", refused.error.message)
        return out

    async def _write_decision(self, gate: NodeGate, node_obj: Obj, decision: Decision, out: Applied,
                              record: Obj | None = None) -> bool:
        """The decision's node write, with the record of the pod `record` when it carries one (the records of
        pods gone from the node dropped); `out` holds the node written and its context. False: refused for
        good (`out.refusal`), and a pod made for it deleted."""
        node = node_obj["metadata"]["name"]
        state = decision.state
        if record is not None and state is not None:
            # The ended pods this decision deletes keep their records until they are gone (deleted after this
            # write): a pod without one would read as not the operator's meanwhile. The next record drops them.
            meta = record["metadata"]
            present = set(self.world.index.pods_of(gate.name, node)) | {meta["name"]}
            kept = {name: r for name, r in state.pods.items() if name in present}
            state = state.model_copy(update={"pods": {**kept, meta["name"]: PodRecord(
                uid=meta["uid"], shape=recorded_shape(record))}})
        update = NodeUpdate(state=state, change=decision.node, remove_state=decision.remove_state)
        try:
            written = await self.write_node_update(gate, node, update, base=node_obj)
            if decision.node.held_by is not None:
                self.metrics.hand_off_holds.labels(decision.node.held_by).inc()
        except ApiError as exc:
            if not refused_for_good(exc) or decision.remove_state:
                raise  # a removal that cannot be written cannot be recorded as failed either
            if record is not None:
                # Made a moment ago for a step whose state cannot be written: it goes before it runs, as it
                # would never have been made had the write come first.
                with contextlib.suppress(ApiError):
                    await self.client.delete(PODS, record["metadata"]["name"], self.settings.namespace,
                                             body={"gracePeriodSeconds": 0})
            out.refusal = node_write_refusal(decision, node, exc.message)
            return False
        out.node_obj, out.in_round = written.obj, written.in_round(update)
        out.seen = replace(out.seen, state=state or out.seen.state, node=node_view(written.obj))
        return True

    async def _delete_pods(self, names: Iterable[str]) -> None:
        for name in names:
            pod = self.world.pods.get(name, self.settings.namespace)
            body: Obj | None = None
            if pod is not None:
                self._stage_metrics(pod)
                if stage_pod_ended(pod):
                    # Nothing runs in it any more: gone at once, without the kubelet's confirmation
                    # (one write, not two), even before the kubelet wrote its terminal phase (the
                    # kubelet then stops its sandbox as an orphan's); out of the index until its DELETED
                    # event, so that a late status update does not bring it back to be deleted again.
                    self.world.index.deleted(pod)
                    body = {"gracePeriodSeconds": 0}
                else:
                    # One still running is stopped gracefully, and stays in sight while it stops: its
                    # next update brings it back to the index, so a release or an uncordon waits until it
                    # is gone (a reboot pod left after RebootTimeout, say, that its node's return runs).
                    self.world.index.pod_event("DELETED", pod)
                # The pod meant, not whatever holds its name by now: one made again under the name (by
                # the operator's next look, or by someone) must not go with a stale delete (409 then).
                uid = str((pod.get("metadata") or {}).get("uid") or "")
                if uid:
                    body = {**(body or {}), "preconditions": {"uid": uid}}
            try:
                await self.client.delete(PODS, name, self.settings.namespace, body=body)
            except Conflict:
                log.info("Stage pod not deleted: its name holds another pod now; pod=%s", name)

    async def write_drain_blocked(self, gate: NodeGate, node_obj: Obj, update: NodeUpdate) -> bool:
        """The record that says which budget blocks the drain (`gate.lifecycle.outcomes.drain_blocked`);
        whether it wrote a round in progress."""
        self.metrics.drains_blocked.labels(gate.name).inc()
        written = await self.write_node_update(gate, node_obj["metadata"]["name"], update, base=node_obj)
        return written.in_round(update)

    async def finish(self, gate: NodeGate, node_obj: Obj, decision: Decision) -> None:
        """A decision's Events, on the gate or the node as each says, and its failure's metric."""
        await self.emit_decision_events(gate, node_obj, decision.events)
        if decision.state is not None and decision.state.status == "failed" and decision.state.failure:
            f = decision.state.failure
            self.metrics.stage_failures.labels(gate.name, f.package or "-", f.stage, f.reason).inc()

    async def write_hand_off_condition(self, view: NodeView, wanted: NodeCondition | None) -> None:
        await self.write_condition(keys.HAND_OFF_CONDITION, view, wanted)

    async def _record_pod(self, gate: NodeGate, node_obj: Obj, seen: NodeContext, pod: Obj,
                          out: Applied) -> tuple[Obj, NodeContext]:
        """Record a stage pod as the operator's (`gate.lifecycle.ownership`): its uid and the digest of what it
        runs, in the node's signed state, in a write of its own (a create cannot carry the uid it gets). The
        records of pods gone from the node are dropped in the same write. A write that fails leaves the pod
        unrecorded: the next look asks for it again and `_found_pod` adopts it."""
        node = node_obj["metadata"]["name"]
        meta = pod["metadata"]
        present = set(self.world.index.pods_of(gate.name, node)) | {meta["name"]}
        record = PodRecord(uid=meta["uid"], shape=recorded_shape(pod))
        base, current = node_obj, seen.state
        for attempt in range(_RECORD_ATTEMPTS):
            kept = {name: r for name, r in current.pods.items() if name in present}
            state = current.model_copy(update={"pods": {**kept, meta["name"]: record}})
            try:
                update = NodeUpdate(state=state)
                written = await self.write_node_update(gate, node, update, base=base)
                out.in_round |= written.in_round(update)
                node_obj = written.obj
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
        out.unsettled = True
        return node_obj, seen

    async def _found_pod(self, gate: NodeGate, node_obj: Obj, seen: NodeContext, body: Obj,
                         out: Applied) -> tuple[Obj, NodeContext]:
        """A create found a pod under the stage pod's deterministic name that the decision did not count as
        the operator's. Adopted when its uid is not recorded and it runs exactly what `body` (the operator's
        manifest) says: a crash, or a lost race on the node's write, between the create and the record
        (`_record_pod`). Otherwise it is not the operator's: reported once, never read, and the node waits
        for it to go (a person deletes it; the next look creates the operator's)."""
        node, name = node_obj["metadata"]["name"], body["metadata"]["name"]
        out.unsettled = True
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
                if self.world.pods.observe(live):
                    self.world.index.pod_event("ADDED", live)
                return node_obj, seen
        else:
            differences = shape_differences(body, live)
            if not differences:
                log.info("Adopted a stage pod created before its record was written; gate=%s node=%s pod=%s",
                         gate.name, node, name)
                node_obj, seen = await self._record_pod(gate, node_obj, seen, live, out)
                if self.world.pods.observe(live):
                    self.world.index.pod_event("ADDED", live)
                return node_obj, seen
            shown = ", ".join(differences[:5]) + (f" and {len(differences) - 5} more" if len(differences) > 5 else "")
            why = (f"it holds the name of the stage pod the operator was about to create, but the operator did not "
                   f"record creating it, and it does not run what the operator builds (differs in {shown})")
        await self.pod_not_ours(gate.name, node, name, uid, shape, why)
        return node_obj, seen

    def _stage_metrics(self, pod: Obj) -> None:
        """A stage pod about to be deleted: the duration of each of its steps by outcome (succeeded,
        failed, or abandoned when a reset or a gate deletion cut it off), from the container's start
        to its end."""
        for step, outcome, seconds in step_runs(pod):
            self.metrics.stage_duration.labels(step.package or "-", step.stage, outcome).observe(seconds)

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

    async def write_node_change(self, node_obj: Obj, update: NodeUpdate) -> bool:
        """A node write of no gate's (the readiness taint of a node no gate holds back any longer, a
        hand-off release), guarded by the resourceVersion it was decided on, then its Events. Whether
        anything was written."""
        built = node_patch("", node_obj, update)
        if built.body is None:
            return False
        if built.taint_removed:
            self.metrics.taint_removals.labels("-").inc()  # no gate: "-", as for a node step's package
        if update.change.hand_off_released is not None:
            self.metrics.hand_off_releases.inc()
        result = await self.client.patch(NODES, node_obj["metadata"]["name"], built.body)
        self.world.nodes.observe(result)
        await self.emit(result, update.events)
        return True


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

