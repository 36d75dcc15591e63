"""Prepull pods: the I/O around `gate.lifecycle.prepull`, which decides.

Each gate's plan (`gate.lifecycle.reconcile.ReconcilePlan.prepull`) hands its candidates in (`sync`);
the prepuller keeps the latest of every gate, and under one lock (the bound is fleet-wide, and gates
are planned concurrently) reads every prepull pod from the cache, asks `plan_prepulls` what to create
and delete, and does it. A pod it creates is taken into the cache at once, so the next sync counts it
even before its watch event. A gate whose candidates are not known yet (not planned since this
replica leads) keeps its pods: a restart never deletes pods it has not decided about. Its pods go
with the gate (owner references), and a deleted or disabled gate hands in no candidates.

A node that reports every image of its round in `status.images` gets no prepull pod, and its round
does not wait for one (`gate.lifecycle.prepull`).

A prepull pod the API server refuses for good (admission, a quota) holds nothing back: said in a
Warning Event on the gate, and the node's round goes on as without prepull (its stage pods pull).

A prepull pod that cannot pull is said once, in a Warning Event on the gate naming the node and the
kubelet's message, while the node still waits in line; once the node is picked, its round says it in
the node's state and the gate's ImagePullFailing condition, and fails it before any cordon.
"""

from __future__ import annotations

import asyncio
import logging

from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.controller.events import EventRecorder
from gate.controller.executor import refused_for_good
from gate.controller.metrics import OperatorMetrics
from gate.controller.pods import prepull_owner, prepull_pod, stage_pod_view
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import NodeKey
from gate.controller.views import node_image_names
from gate.controller.world import World
from gate.kube.client import PODS, KubeClient
from gate.kube.errors import ApiError, Conflict
from gate.kube.objects import pod_ended
from gate.lifecycle.node import PULL_ERRORS, StagePod
from gate.lifecycle.prepull import (
    Candidate,
    Lookahead,
    PrepullPod,
    RoundImages,
    awaits_images,
    plan_prepulls,
    prepull_counts,
    round_images,
)

log = logging.getLogger("nodegate.operator")


class Prepuller:
    def __init__(self, settings: OperatorSettings, client: KubeClient, world: World, recorder: EventRecorder,
                 metrics: OperatorMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self.client = client
        self.world = world
        self.recorder = recorder
        self.by_gate: dict[str, list[Candidate]] = {}
        self.gates: dict[str, NodeGate] = {}
        self.reported: set[str] = set()  # prepull pods whose failing pull was said in an Event
        # Prepull pods the API server refused for good (admission, a quota): their rounds go on without
        # them, as without prepull; asked again only once their node is a candidate anew.
        self.refused: set[str] = set()
        self.lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.prepull_concurrency > 0

    @property
    def lookahead(self) -> Lookahead | None:
        """What a gate's plan needs to name its candidates; None while prepull is off."""
        if not self.enabled:
            return None
        return Lookahead(self.settings.prepull_ahead, self.settings.agent_image)

    async def forget(self, gate: NodeGate) -> None:
        """The gate plans nothing (deleted, disabled): none of its prepull pods is needed."""
        if self.enabled and (gate.name in self.by_gate or any(p.gate == gate.name for p, _ in self._pods())):
            await self.sync(gate, [])

    def _on_node(self, node: str, images: RoundImages) -> bool:
        """The node reports every image of the round already (`RoundImages.on_node`): no prepull pod."""
        obj = self.world.nodes.get(node)
        return obj is not None and images.on_node(node_image_names(obj))

    async def sync(self, gate: NodeGate, found: list[Candidate]) -> None:
        found = [c for c in found if not self._on_node(c.node, c.images)]
        async with self.lock:
            self.by_gate[gate.name] = found
            self.gates[gate.name] = gate
            pods = self._pods()
            plan = plan_prepulls(self.by_gate, [p for p, _ in pods], self.settings.prepull_concurrency)
            for name in plan.delete:  # a pod already gone is fine (missing_ok)
                await self.client.delete(PODS, name, self.settings.namespace)
            for cand in plan.create:
                owner = self.gates.get(cand.gate)
                if owner is None:
                    continue
                if cand.pod in self.refused:
                    continue
                try:
                    created = await self.client.create(PODS, prepull_pod(owner, cand, self.settings),
                                                       self.settings.namespace)
                except Conflict as exc:
                    if exc.already_exists:  # a name is its (gate, node, images): that very pod
                        continue
                    raise
                except ApiError as exc:
                    if not refused_for_good(exc):
                        raise
                    await self._refused(owner, cand, exc)
                    continue
                self.world.pods.observe(created)
                log.info("Created prepull pod; gate=%s node=%s pod=%s picked=%s", cand.gate, cand.node, cand.pod,
                         cand.picked)
            self.reported &= {p.name for p, _ in pods}
            self.refused &= {c.pod for cands in self.by_gate.values() for c in cands}
            await self._report(gate, pods)
            self._measure(self._pods())

    async def _refused(self, gate: NodeGate, cand: Candidate, exc: ApiError) -> None:
        """A prepull pod the API server will not admit: said once, and its round is not held back by it
        (a stage pod refused alike fails the node, uncordoned, as before)."""
        self.refused.add(cand.pod)
        log.warning("Prepull pod refused; gate=%s node=%s pod=%s error=%s", gate.name, cand.node, cand.pod, exc)
        obj = self.world.gates.get(gate.name)
        if obj is not None:
            await self.recorder.emit(obj, "Warning", "PrepullRefused",
                                     f"NodeGate {gate.name}: the API server refused the prepull pod of node "
                                     f"{cand.node} ({exc}); its round pulls its images itself, after the cordon")
        if cand.picked:
            self.world.queue.add(NodeKey(gate.name, cand.node))

    def _measure(self, pods: list[tuple[PrepullPod, StagePod]]) -> None:
        known = [g for g in self.by_gate if self.world.gates.get(g) is not None]
        for gate, by_state in prepull_counts(pods, known).items():
            for state, count in by_state.items():
                self.metrics.prepull_pods.labels(gate, state).set(count)

    def _pods(self) -> list[tuple[PrepullPod, StagePod]]:
        out = []
        for pod in self.world.pods.items():
            owner = prepull_owner(pod)
            if owner is None:
                continue
            meta = pod["metadata"]
            out.append((PrepullPod(meta["name"], owner[0], ended=pod_ended(pod),
                                   deleting=bool(meta.get("deletionTimestamp"))), stage_pod_view(pod)))
        return out

    async def _report(self, gate: NodeGate, pods: list[tuple[PrepullPod, StagePod]]) -> None:
        obj = self.world.gates.get(gate.name)
        if obj is None:
            return
        for pod, view in pods:
            if pod.gate != gate.name or view.waiting_reason not in PULL_ERRORS or pod.name in self.reported:
                continue
            self.reported.add(pod.name)
            self.metrics.prepull_failures.labels(gate.name).inc()
            node = next((c.node for c in self.by_gate.get(gate.name, []) if c.pod == pod.name), "?")
            await self.recorder.emit(obj, "Warning", "PrepullFailing",
                                     f"NodeGate {gate.name}: the images of node {node}'s next round cannot be "
                                     f"pulled ahead ({view.waiting_reason}: {view.message}); the node fails, "
                                     "uncordoned, when its turn comes if they still cannot")

    def pod_for(self, gate: NodeGate, state: NodeGateState, node: str) -> tuple[bool, StagePod | None]:
        """For the node reconcile: whether the round waits for its images, and its prepull pod."""
        if not self.enabled or not awaits_images(gate, state):
            return False, None
        images = round_images(gate, state, self.settings.agent_image, resolve=self.settings.resolve_digests)
        if images is None or self._on_node(node, images):
            return False, None
        name = Candidate(gate.name, node, images, picked=True).pod
        if name in self.refused:
            return False, None
        pod = self.world.pods.get(name, self.settings.namespace)
        return True, stage_pod_view(pod) if pod is not None else None
