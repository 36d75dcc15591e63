"""The node reconciler and the join reconciler, each with `reconcile(key)`.

`NodeReconciler.reconcile(NodeKey)` is one step of a node's state machine for one gate: it builds
the node's context from the caches (the gate, the node, its state, its stage pods, the pods on the
node when it drains), decides with `gate.lifecycle.machine.decide` (or
`gate.lifecycle.uninstall.decide_removal` for a deleted gate), hands the decision to `NodeApplier`,
plans what the applier met (`gate.lifecycle.outcomes`) and returns when to look again.
`JoinReconciler.reconcile(JoinKey)` is the
readiness-taint backstop for a node that just joined, ahead of the gate's plan, and
`TaintReconciler.reconcile(TaintKey)` lifts the taint of a node that no readinessTaint gate selects, and
notices that someone released a node held for hand-off (spec.leaveCordoned).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, StateParseError
from gate.controller.endpoints import EndpointBook
from gate.controller.executor import Writer
from gate.controller.imagetrust import ImageTrust
from gate.controller.node_applier import NodeApplier
from gate.controller.prepull import Prepuller
from gate.controller.result import DONE, Result, look, replan
from gate.controller.settings import OperatorSettings
from gate.controller.signals import SignalReader
from gate.controller.staging import Stager
from gate.controller.triggers import JoinKey, NodeKey, TaintKey
from gate.controller.views import node_view, pod_view
from gate.controller.world import World
from gate.kube.client import PODS, KubeClient
from gate.kube.objects import parse_time, state_status
from gate.lifecycle.fleet import NodeUpdate, disabled, hold_asked_by, selects
from gate.lifecycle.handoff import hold_condition, release_noticed
from gate.lifecycle.images import held_requests
from gate.lifecycle.machine import decide
from gate.lifecycle.node import Decision, EventRequest, NodeContext, Timing
from gate.lifecycle.outcomes import Refusal, after_refusal, drain_blocked, unrecordable
from gate.lifecycle.rollback import rolled_back, target_gate
from gate.lifecycle.round import config_refused, fail_round
from gate.lifecycle.signatures import agent_image
from gate.lifecycle.soak import health_of
from gate.lifecycle.taint import orphan_taint, readiness_clear, taint_reason
from gate.lifecycle.uninstall import decide_removal

log = logging.getLogger("nodegate.operator")


class NodeReconciler:
    def __init__(self, settings: OperatorSettings, client: KubeClient, timing: Timing, world: World,
                 applier: NodeApplier, signals: SignalReader | None = None,
                 prepuller: Prepuller | None = None, trust: ImageTrust | None = None,
                 stager: Stager | None = None) -> None:
        self.settings = settings
        self.prepuller = prepuller
        self.stager = stager
        self.trust = trust  # the image signature policy's verdicts: the digests a stage pod may pull
        self.client = client
        self.timing = timing
        self.world = world
        self.applier = applier
        self.signals = signals or SignalReader(EndpointBook(settings.prometheus_endpoints or None),
                                               interval=timing.health_poll)

    async def reconcile(self, key: NodeKey) -> Result:
        gate_name, node_name = key.gate, key.node
        gate = self.world.gate(gate_name)
        node_obj = self.world.nodes.get(node_name)
        if gate is None or node_obj is None:
            return DONE
        if keys.state_annotation(gate_name) not in (node_obj["metadata"].get("annotations") or {}):
            return DONE
        removing = bool(gate.metadata.deletion_timestamp)
        fnode = self.world.fleet_node(node_obj)
        recorded = fnode.states.get(gate_name)
        if isinstance(recorded, NodeGateState):
            state = recorded
        else:
            # Unreadable (StateParseError), or not the operator's (`fnode.refused`: no valid signature):
            # never acted on. The gate reconcile reports it; nothing here may overwrite it while the gate
            # lives. When the gate is going away, what the node ran is unknown, so nothing can be
            # uninstalled, but the gate's keys must go, or the deletion would never finish.
            if not removing:
                return DONE
            state = NodeGateState(status="failed")
        view = node_view(node_obj)
        if not removing and state.status != "in-progress":
            return DONE
        if not removing and not selects(gate, view):
            # Defence in depth behind the node-keys policy: a round goes on only where the gate selects
            # the node. One that left mid-round (relabelled, ignored) is released by the gate's plan once
            # no stage pod of it runs (`plan_gate`); a record someone wrote on a node the gate never
            # selected is never acted on.
            return replan([gate_name])
        target = gate
        if not removing and rolled_back(state):
            assert state.rollback is not None
            revisions = self.world.revisions.get(gate_name)
            if revisions is None:
                return DONE  # the history is not read yet; its reconcile plans the gate again when it is
            found = next((r for r in revisions if r.spec_hash == state.rollback.to), None)
            if state.rollback.to and found is None:
                ctx = NodeContext(gate=gate, node=node_view(node_obj), state=state, pods=None, now=datetime.now(UTC),
                                  stage_pods=self.world.stage_pods_of(gate_name, node_name, state.pods).ours)
                return await self._apply(gate, node_obj, fail_round(
                    ctx, "NoRevision", f"revision {state.rollback.revision} of the gate, which the node was going "
                    "back to, is no longer kept (pruned)", stage="rollback"), ctx)
            target = target_gate(gate, found.spec if found is not None else None)
        pods = None
        if state.phase in ("wait-pods", "drain"):
            pods = await self._pods_on(node_name)
        health = None
        if not removing:
            known, policy = self.world.policy_of(gate)
            if not known and state.phase == "soak":
                return DONE  # whether the node is healthy cannot be told without its policy: the gate says why
            # A roll-back soaks no more: its compartment is stopped already, nothing waits for its verdict.
            health = None if target is not gate else health_of(policy, state.compartment)
        reading = None
        if health is not None and health.prometheus is not None and state.phase == "soak":
            reading = await self.signals.read(gate_name, node_name, health.prometheus)
        else:
            self.signals.forget(gate_name, node_name)
        prepull, prepull_pod = (False, None)
        # A roll-back's images are the revision's, which the gate's prepull candidates never hold: not awaited.
        if self.prepuller is not None and not removing and target is gate:
            prepull, prepull_pod = self.prepuller.pod_for(gate, state, node_name)
        serving, staged = None, None
        # Likewise a roll-back's steps are the revision's: only the gate's own rounds wait for a staging.
        if self.stager is not None and self.stager.enabled and not removing and target is gate:
            serving, staged = self.stager.catalog, self.stager.pod_for(gate, state, node_name)
        ctx = NodeContext(gate=target, node=view, state=state,
                          stage_pods=self.world.stage_pods_of(gate_name, node_name, state.pods).ours,
                          pods=pods, now=datetime.now(UTC),
                          readiness_clear=readiness_clear(gate_name, fnode, self.world.all_gates()),
                          hold_asked_by=hold_asked_by(gate, fnode, self.world.all_gates()),
                          timing=self.timing, release=node_name in self.world.removal_release.get(gate_name, ()),
                          health=health, reading=reading, prepull=prepull, prepull_pod=prepull_pod,
                          serving=serving, staging_pod=staged)
        decision = decide_removal(ctx) if removing else decide(ctx)
        return await self._apply(target, node_obj, decision, ctx)

    async def _apply(self, gate: NodeGate, node_obj: Obj, decision: Decision, ctx: NodeContext) -> Result:
        """Send a decision (`NodeApplier`), and plan what it met (`gate.lifecycle.outcomes`): a write refused
        for good fails the node; a ConfigMap not NodeGate's fails it too (`config_refused`); a blocked
        eviction is recorded. Returns when to look again: the decision's `requeue_after`, now after a write
        of a round in progress, soon for a stage pod held or not recorded, and the gate when the node's
        status moved."""
        node = node_obj["metadata"]["name"]
        old_state = (node_obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate.name))
        trusted = self.trust.trusted() if self.trust is not None else None
        held = held_requests(gate, decision.create_pods, resolve=self.settings.resolve_digests, trusted=trusted,
                             agent=agent_image(self.settings.agent_image))
        for name, packages in held.items():
            log.info("Stage pod held until its images are resolved; gate=%s node=%s pod=%s packages=%s",
                     gate.name, node, name, ",".join(packages))
        applied = await self.applier.execute(gate, node_obj, decision, ctx, held=held, trusted=trusted)
        soon = max(self.settings.poll_seconds, 1.0)
        result = (replan([gate.name]) | look(NodeKey(gate.name, node), soon)) if held else DONE
        if applied.in_round:
            result |= look(NodeKey(gate.name, node))
        if applied.unsettled:
            result |= look(NodeKey(gate.name, node), soon)
        if applied.refusal is not None:
            return result | await fail_refused(self.applier, gate, applied.node_obj, applied.seen, applied.refusal)
        if applied.foreign is not None:
            request, package, why = applied.foreign
            log.warning("ConfigMap not NodeGate's, stage pod not created; gate=%s node=%s pod=%s error=%s",
                        gate.name, node, request.name, why)
            return result | await self._apply(gate, applied.node_obj,
                                              config_refused(applied.seen, request, package, why), applied.seen)
        if applied.blocked:
            update = drain_blocked(decision.state or ctx.state, applied.blocked)  # the record as checked
            if update is not None and await self.applier.write_drain_blocked(
                    gate, self.world.nodes.get(node) or applied.node_obj, update):
                result |= look(NodeKey(gate.name, node))
        await self.applier.finish(gate, applied.node_obj, decision)
        if decision.requeue_after is not None:
            result |= look(NodeKey(gate.name, node), decision.requeue_after)
        new_status = decision.state.status if decision.state is not None else None
        if decision.remove_state or (new_status is not None and old_state is not None
                                     and state_status(old_state) != new_status):
            result |= replan([gate.name])
        return result

    async def _pods_on(self, node: str) -> list[Any]:
        items, _ = await self.client.list(PODS, field_selector=f"spec.nodeName={node}")
        return [pod_view(p, self.settings.namespace) for p in items]


async def fail_refused(applier: Writer, gate: NodeGate, node_obj: Obj, ctx: NodeContext,
                       refusal: Refusal) -> Result:
    """A write refused for good fails the node (`gate.lifecycle.outcomes.after_refusal`), as it was (`node_obj`,
    `ctx`) before that write; when that write is refused too, the failure is said where it still can be
    (`unrecordable`). The gate is planned again: its batch is judged and the budget slot counted anew."""
    node = node_obj["metadata"]["name"]
    log.warning("Write refused; gate=%s node=%s reason=%s what=%s error=%s", gate.name, node, refusal.reason,
                refusal.what, refusal.message)
    decision = after_refusal(ctx, refusal)
    again = await applier.apply_failure(gate, node_obj, decision)
    if again is None:
        return replan([gate.name])
    log.error("Node failure could not be recorded; gate=%s node=%s error=%s", gate.name, node, again)
    await applier.apply_unrecordable(gate, node_obj, unrecordable(gate.name, decision, again.message))
    return DONE


class JoinReconciler:
    def __init__(self, world: World, applier: NodeApplier) -> None:
        self.world = world
        self.applier = applier

    async def reconcile(self, key: JoinKey) -> Result:
        """The readiness-taint backstop for one joining node, ahead of the gate's plan (same rule)."""
        gate_name, node_name = key.gate, key.node
        gate = self.world.gate(gate_name)
        node_obj = self.world.nodes.get(node_name)
        if gate is None or node_obj is None or gate.metadata.deletion_timestamp or disabled(gate):
            return DONE
        fnode = self.world.fleet_node(node_obj)
        raw = fnode.states.get(gate_name)
        state = raw if isinstance(raw, NodeGateState) else None
        if not selects(gate, fnode.view) or isinstance(raw, StateParseError):
            return DONE
        why = taint_reason(gate, fnode, state, state, parse_time(gate.metadata.creation_timestamp))
        if why is None:
            return DONE
        update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintAdded",
                                                 f"NodeGate {gate_name} tainted the node: it {why}")])
        update.change.add_readiness_taint = True
        await self.applier.write_node_update(gate, node_name, update, base=node_obj)
        return DONE


class TaintReconciler:
    def __init__(self, world: World, applier: NodeApplier) -> None:
        self.world = world
        self.applier = applier

    async def reconcile(self, key: TaintKey) -> Result:
        """The readiness taint follows membership: off a node no readinessTaint gate selects any longer.
        And a hand-off hold someone ended (`gate.lifecycle.handoff`): its mark goes, the release stays."""
        node_obj = self.world.nodes.get(key.node)
        if node_obj is None:
            return DONE
        view = node_view(node_obj)
        await self.applier.write_hand_off_condition(view, hold_condition(view.annotations, view.unschedulable))
        if release_noticed(view.annotations, view.unschedulable):
            # Someone uncordoned a node held for hand-off: `held-by` goes and the release is recorded for good.
            holder = view.annotations.get(keys.HELD_BY, "")
            update = NodeUpdate(events=[EventRequest("node", "Normal", "HandOffReleased",
                                                     f"The node was uncordoned: NodeGate {holder}'s hand-off hold "
                                                     "ended, and NodeGate never holds this node again")])
            update.change.hand_off_released = datetime.now(UTC).isoformat(timespec="seconds")
            if await self.applier.write_node_change(node_obj, update):
                log.info("Noticed a hand-off release; node=%s gate=%s", key.node, holder)
            return DONE  # the write's own event brings the node back for its taint
        why = orphan_taint(self.world.fleet_node(node_obj), self.world.all_gates())
        if why is not None:
            update = NodeUpdate(events=[EventRequest("node", "Normal", "ReadinessTaintRemoved",
                                                     f"NodeGate lifted the readiness taint: {why}")])
            update.change.remove_readiness_taint = True  # no gate's keys move
            if await self.applier.write_node_change(node_obj, update):
                log.info("Lifted the readiness taint; node=%s why=%s", key.node, why)
        return DONE
