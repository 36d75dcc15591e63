"""Prepull pods: the memory around `gate.lifecycle.prepull`, which decides; the gate applier writes.

Each gate's plan (`gate.lifecycle.reconcile.ReconcilePlan.prepull`) hands its candidates in (`plan`);
the prepuller keeps the latest of every gate, and under one lock (the bound is fleet-wide, and gates
are planned concurrently; the gate reconcile holds it until the writes are sent) reads every prepull
pod from the cache, asks `plan_prepulls` what to create and delete, and returns that as `PrepullWrites`
for `gate.controller.gate_applier.GateApplier.apply_prepull`. A pod it creates is taken into the
cache at once, so the next plan counts it even before its watch event. A gate whose candidates are
not known yet (not planned since this replica leads) keeps its pods: a restart never deletes pods it
has not decided about. Its pods go with the gate (owner references), and a deleted or disabled gate
hands in no candidates.

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
from dataclasses import dataclass, field

from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.controller.metrics import OperatorMetrics
from gate.controller.pods import stage_pod_view
from gate.controller.prepull_pod import prepull_owner, prepull_pod
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import NodeKey
from gate.controller.views import node_image_names
from gate.controller.world import World
from gate.kube.errors import ApiError
from gate.kube.objects import pod_ended
from gate.lifecycle.node import PULL_ERRORS, EventRequest, StagePod
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


@dataclass
class PrepullWrites:
    """What the gate applier writes of the prepull pods: the pods to delete, those to create (with their
    manifests), then the Events, each on the gate it names."""

    delete: list[str] = field(default_factory=list)
    create: list[tuple[Candidate, Obj]] = field(default_factory=list)
    events: list[tuple[str, EventRequest]] = field(default_factory=list)


class Prepuller:
    def __init__(self, settings: OperatorSettings, world: World, metrics: OperatorMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or OperatorMetrics()
        self.world = world
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
        return Lookahead(self.settings.prepull_ahead, self.settings.agent_image, self._present)

    def forgets(self, gate: NodeGate) -> bool:
        """The gate plans nothing (deleted, disabled): whether it has prepull pods to let go (planned with
        no candidates, `plan`)."""
        return self.enabled and (gate.name in self.by_gate or any(p.gate == gate.name for p, _ in self._pods()))

    def _present(self, node: str) -> frozenset[str]:
        """The image names the node reports, as the cache keeps them (none for a node not in it)."""
        obj = self.world.nodes.get(node)
        return node_image_names(obj) if obj is not None else frozenset()

    def _on_node(self, node: str, images: RoundImages) -> bool:
        """The node reports every image of the round already (`RoundImages.on_node`): no prepull pod."""
        return images.on_node(self._present(node))

    def plan(self, gate: NodeGate, found: list[Candidate]) -> PrepullWrites:
        """The gate's latest candidates taken in, what to write of every gate's prepull pods (no I/O).
        Called under `lock`, which the caller holds until the writes are sent and `refused` is told."""
        self.by_gate[gate.name] = [c for c in found if not self._on_node(c.node, c.images)]
        self.gates[gate.name] = gate
        pods = self._pods()
        plan = plan_prepulls(self.by_gate, [p for p, _ in pods], self.settings.prepull_concurrency)
        create = []
        for cand in plan.create:
            owner = self.gates.get(cand.gate)
            if owner is not None and cand.pod not in self.refused:
                create.append((cand, prepull_pod(owner, cand, self.settings)))
        self.reported &= {p.name for p, _ in pods}
        self.refused &= {c.pod for cands in self.by_gate.values() for c in cands}
        return PrepullWrites(delete=list(plan.delete), create=create, events=self._report(gate, pods))

    def refused_now(self, refused: list[tuple[Candidate, ApiError]]) -> tuple[PrepullWrites, list[NodeKey]]:
        """Prepull pods the API server will not admit: said once, and their rounds are not held back by them
        (a stage pod refused alike fails the node, uncordoned, as before). Returns the Events, and the
        picked nodes whose reconcile looks again now (they await no prepull pod any longer)."""
        events, looks = [], []
        for cand, exc in refused:
            self.refused.add(cand.pod)
            log.warning("Prepull pod refused; gate=%s node=%s pod=%s error=%s", cand.gate, cand.node, cand.pod, exc)
            events.append((cand.gate, EventRequest(
                "gate", "Warning", "PrepullRefused", f"NodeGate {cand.gate}: the API server refused the prepull pod "
                f"of node {cand.node} ({exc}); its round pulls its images itself, after the cordon")))
            if cand.picked:
                looks.append(NodeKey(cand.gate, cand.node))
        return PrepullWrites(events=events), looks

    def measure(self) -> None:
        self._measure(self._pods())

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

    def _report(self, gate: NodeGate, pods: list[tuple[PrepullPod, StagePod]]) -> list[tuple[str, EventRequest]]:
        events: list[tuple[str, EventRequest]] = []
        if self.world.gates.get(gate.name) is None:
            return events
        for pod, view in pods:
            if pod.gate != gate.name or view.waiting_reason not in PULL_ERRORS or pod.name in self.reported:
                continue
            self.reported.add(pod.name)
            self.metrics.prepull_failures.labels(gate.name).inc()
            node = next((c.node for c in self.by_gate.get(gate.name, []) if c.pod == pod.name), "?")
            events.append((gate.name, EventRequest(
                "gate", "Warning", "PrepullFailing", f"NodeGate {gate.name}: the images of node {node}'s next round "
                f"cannot be pulled ahead ({view.waiting_reason}: {view.message}); the node fails, uncordoned, when "
                "its turn comes if they still cannot")))
        return events

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
