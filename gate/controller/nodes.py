"""The node reconciler and the join reconciler, each with `reconcile(key)`.

`NodeReconciler.reconcile(NodeKey)` is one step of a node's state machine for one gate: it builds
the node's context from the caches (the gate, the node, its state, its stage pods, the pods on the
node when it drains), decides with `gate.lifecycle.machine.decide` (or `gate.lifecycle.uninstall.decide_removal` for a
deleted gate) and hands the decision to the executor. `JoinReconciler.reconcile(JoinKey)` is the
readiness-taint backstop for a node that just joined, ahead of the gate's plan, and
`TaintReconciler.reconcile(TaintKey)` lifts the taint of a node that no readinessTaint gate selects, and
notices that someone released a node held for hand-off (spec.leaveCordoned).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gate.api import keys
from gate.api.state import NodeGateState, StateParseError
from gate.controller.endpoints import EndpointBook
from gate.controller.executor import Executor
from gate.controller.prepull import Prepuller
from gate.controller.settings import OperatorSettings
from gate.controller.signals import SignalReader
from gate.controller.triggers import JoinKey, NodeKey, TaintKey
from gate.controller.views import node_view, pod_view
from gate.controller.world import World
from gate.kube.client import PODS, KubeClient
from gate.kube.objects import parse_time
from gate.lifecycle.fleet import NodeUpdate, disabled, hold_asked_by, selects
from gate.lifecycle.handoff import hold_condition, release_noticed
from gate.lifecycle.machine import decide
from gate.lifecycle.node import EventRequest, NodeContext, Timing
from gate.lifecycle.rollback import rolled_back, target_gate
from gate.lifecycle.round import fail_round
from gate.lifecycle.soak import health_of
from gate.lifecycle.taint import orphan_taint, readiness_clear, taint_reason
from gate.lifecycle.uninstall import decide_removal


class NodeReconciler:
    def __init__(self, settings: OperatorSettings, client: KubeClient, timing: Timing, world: World,
                 executor: Executor, signals: SignalReader | None = None,
                 prepuller: Prepuller | None = None) -> None:
        self.settings = settings
        self.prepuller = prepuller
        self.client = client
        self.timing = timing
        self.world = world
        self.executor = executor
        self.signals = signals or SignalReader(EndpointBook(settings.prometheus_endpoints or None),
                                               interval=timing.health_poll)

    async def reconcile(self, key: NodeKey) -> None:
        gate_name, node_name = key.gate, key.node
        gate = self.world.gate(gate_name)
        node_obj = self.world.nodes.get(node_name)
        if gate is None or node_obj is None:
            return
        if keys.state_annotation(gate_name) not in (node_obj["metadata"].get("annotations") or {}):
            return
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
                return
            state = NodeGateState(status="failed")
        view = node_view(node_obj)
        if not removing and state.status != "in-progress":
            return
        if not removing and not selects(gate, view):
            # Defence in depth behind the node-keys policy: a round goes on only where the gate selects
            # the node. One that left mid-round (relabelled, ignored) is released by the gate's plan once
            # no stage pod of it runs (`plan_gate`); a record someone wrote on a node the gate never
            # selected is never acted on.
            self.world.gate_later(gate_name)
            return
        target = gate
        if not removing and rolled_back(state):
            assert state.rollback is not None
            revisions = self.world.revisions.get(gate_name)
            if revisions is None:
                return  # the history is not read yet; its reconcile plans the gate again when it is
            found = next((r for r in revisions if r.spec_hash == state.rollback.to), None)
            if state.rollback.to and found is None:
                ctx = NodeContext(gate=gate, node=node_view(node_obj), state=state, pods=None, now=datetime.now(UTC),
                                  stage_pods=self.world.stage_pods_of(gate_name, node_name, state.pods).ours)
                await self.executor.execute(gate, node_obj, fail_round(
                    ctx, "NoRevision", f"revision {state.rollback.revision} of the gate, which the node was going "
                    "back to, is no longer kept (pruned)", stage="rollback"), ctx)
                return
            target = target_gate(gate, found.spec if found is not None else None)
        pods = None
        if state.phase in ("wait-pods", "drain"):
            pods = await self._pods_on(node_name)
        health = None
        if not removing:
            known, policy = self.world.policy_of(gate)
            if not known and state.phase == "soak":
                return  # whether the node is healthy cannot be told without its policy: the gate says why
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
        ctx = NodeContext(gate=target, node=view, state=state,
                          stage_pods=self.world.stage_pods_of(gate_name, node_name, state.pods).ours,
                          pods=pods, now=datetime.now(UTC),
                          readiness_clear=readiness_clear(gate_name, fnode, self.world.all_gates()),
                          hold_asked_by=hold_asked_by(gate, fnode, self.world.all_gates()),
                          timing=self.timing, release=node_name in self.world.removal_release.get(gate_name, ()),
                          health=health, reading=reading, prepull=prepull, prepull_pod=prepull_pod)
        decision = decide_removal(ctx) if removing else decide(ctx)
        await self.executor.execute(target, node_obj, decision, ctx)

    async def _pods_on(self, node: str) -> list[Any]:
        items, _ = await self.client.list(PODS, field_selector=f"spec.nodeName={node}")
        return [pod_view(p, self.settings.namespace) for p in items]


class JoinReconciler:
    def __init__(self, world: World, executor: Executor) -> None:
        self.world = world
        self.executor = executor

    async def reconcile(self, key: JoinKey) -> None:
        """The readiness-taint backstop for one joining node, ahead of the gate's plan (same rule)."""
        gate_name, node_name = key.gate, key.node
        gate = self.world.gate(gate_name)
        node_obj = self.world.nodes.get(node_name)
        if gate is None or node_obj is None or gate.metadata.deletion_timestamp or disabled(gate):
            return
        fnode = self.world.fleet_node(node_obj)
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
        await self.executor.write_node_update(gate, node_name, update, base=node_obj)


class TaintReconciler:
    def __init__(self, world: World, executor: Executor) -> None:
        self.world = world
        self.executor = executor

    async def reconcile(self, key: TaintKey) -> None:
        """The readiness taint follows membership: off a node no readinessTaint gate selects any longer.
        And a hand-off hold someone ended (`gate.lifecycle.handoff`): its mark goes, the release stays."""
        node_obj = self.world.nodes.get(key.node)
        if node_obj is None:
            return
        view = node_view(node_obj)
        await self.executor.write_hand_off_condition(view, hold_condition(view.annotations, view.unschedulable))
        if release_noticed(view.annotations, view.unschedulable):
            await self.executor.release_hand_off(node_obj)
            return  # the write's own event brings the node back for its taint
        why = orphan_taint(self.world.fleet_node(node_obj), self.world.all_gates())
        if why is not None:
            await self.executor.lift_readiness_taint(node_obj, why)
