"""Staging and undo pods (stage while serving): the memory around `gate.lifecycle.staging`, which decides;
the gate applier writes (`gate.controller.gate_applier.GateApplier.apply_staging`).

As with prepull (`gate.controller.prepull`): each gate's plan hands its part in
(`gate.lifecycle.reconcile.ReconcilePlan.staging`); the stager keeps the latest of every gate and, under
one lock (the bound is fleet-wide), reads every staging and undo pod from the cache, asks
`plan_stagings` what to create and delete, and returns that as `StagingWrites`. A gate not planned since
this replica leads keeps its pods. Staging and undo pods are owned by no gate (`gate.controller.pods.
staging_pod`): a deleted gate hands in its part with `deleting`, and its finalizer waits for
`gate_may_go`.

An undo pod is the staging pod's own spec with `--part undo` (`unstage_pod`); the cache holds pods
slimmed, so the stager reads the staging pod from the API server to build it (a read, not a write).

**Only signed pods count.** A staging pod that succeeded moves its node to the cordon, and of a stage
staged whole has the round record the stage done without running it in the window; an undo pod that
succeeded lets the staging go. No node's state records these pods (they come before the round), so
each carries the operator's signature of its name and of what it runs as built, labels and annotations
under `nodegate.io/` included (`gate.api.records.sign_pod`, `gate.controller.podshape.built_digest`),
written in its create. A pod of these kinds without a valid one (planted under the label by someone who
may create pods in the namespace, or the operator's own with its generation or steps annotation
edited since) is not read: it is deleted, since it may hold the very name the operator's pod needs,
and reported once (Event `PodNotOurs`, `nodegate_pods_refused_total`). The staging pod read whole for
its undo is checked again, as read. What the signature cannot tell is a status written about a pod
that is the operator's (`gate.lifecycle.ownership`).

Which packages stage is the catalog's (`gate.admission.rules.catalog_inputs`, for the catalog's version:
`gate.lifecycle.serving.ServingCatalog`), handed in by the operator's command (`gate.cli.operator`): the
controller layer does not import admission's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.records import KeyRing, pod_refusal, sign_pod
from gate.api.state import NodeGateState
from gate.controller.imagetrust import ImageTrust
from gate.controller.metrics import OperatorMetrics
from gate.controller.pods import (
    GATE_NAME_ANNOTATION,
    NODE_NAME_ANNOTATION,
    STAGING_KINDS,
    facts_of,
    stage_pod_view,
    staging_pod,
    step_runs,
    unstage_pod,
)
from gate.controller.podshape import SIGNATURE_ANNOTATION, built_digest, built_shape
from gate.controller.settings import OperatorSettings
from gate.controller.world import World
from gate.kube.client import PODS, KubeClient
from gate.kube.errors import NotFound
from gate.lifecycle.images import pod_images
from gate.lifecycle.node import StagePod
from gate.lifecycle.serving import ServingCatalog
from gate.lifecycle.staging import (
    Candidate,
    GateStaging,
    StagingAhead,
    StagingPod,
    gate_may_go,
    plan_stagings,
    staging_pod_name,
    staging_steps,
    undo_pod_name,
)

log = logging.getLogger("nodegate.operator")


def staging_owner(pod: Obj) -> tuple[str, str, str] | None:
    """(gate, node, kind) of a staging or undo pod, None when the pod is not one."""
    meta = pod.get("metadata") or {}
    kind = (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL)
    if kind not in STAGING_KINDS:
        return None
    ann = meta.get("annotations") or {}
    gate, node = ann.get(GATE_NAME_ANNOTATION), ann.get(NODE_NAME_ANNOTATION)
    return (gate, node, kind) if gate and node else None


@dataclass(frozen=True)
class ForeignPod:
    """A pod of the staging kinds without the operator's signature of it as it is: deleted, reported once."""

    gate: str
    node: str
    name: str
    uid: str
    shape: str
    why: str


@dataclass
class StagingWrites:
    """What the gate applier writes of the staging and undo pods: the pods to delete, then those to create
    (staging pods and undo pods, with their manifests), and the pods of their kinds not the operator's (to
    report and delete, that very pod: by its uid)."""

    delete: list[str] = field(default_factory=list)
    create: list[tuple[str, str, Obj]] = field(default_factory=list)  # (gate, node, manifest)
    foreign: list[ForeignPod] = field(default_factory=list)


class Stager:
    def __init__(self, settings: OperatorSettings, world: World, client: KubeClient, catalog: ServingCatalog,
                 metrics: OperatorMetrics | None = None, trust: ImageTrust | None = None) -> None:
        self.settings = settings
        self.world = world
        self.client = client
        self.metrics = metrics or OperatorMetrics()
        self.trust = trust
        self.catalog = catalog
        self.by_gate: dict[str, GateStaging] = {}
        self.observed: set[str] = set()  # staging pods taken over whose steps were observed
        self.gates: dict[str, NodeGate] = {}
        self.lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.staging_concurrency > 0

    @property
    def ahead(self) -> StagingAhead | None:
        """What a gate's plan needs to name its staging candidates; None while staging is off."""
        return StagingAhead(self.catalog, self.settings.staging_ahead) if self.enabled else None

    def holds(self, gate: str) -> bool:
        """Staging or undo pods of the gate are left (its finalizer waits: `gate_may_go`)."""
        return not gate_may_go(gate, (p for p, _ in self._pods()))

    async def plan(self, gate: NodeGate, part: GateStaging) -> StagingWrites:
        """The gate's latest part taken in, what to write of every gate's staging and undo pods. Called under
        `lock`, held until the writes are sent."""
        self.by_gate[gate.name] = part
        self.gates[gate.name] = gate
        pods, foreign = self._scan()
        plan = plan_stagings(self.by_gate, [p for p, _ in pods], self.settings.staging_concurrency)
        out = StagingWrites(delete=list(plan.delete), foreign=foreign)
        self._taken_over_metrics(pods, plan.delete)
        for cand in plan.create:
            body = self._staging_pod(cand)
            if body is not None:
                out.create.append((cand.gate, cand.node, self._signed(body)))
        for pod in plan.undo:
            try:
                staged = await self.client.get(PODS, pod.name, self.settings.namespace)
            except NotFound:
                continue  # gone meanwhile: nothing to undo from it
            why = self._refusal(staged)
            if why is not None:  # changed since the cache's copy: not what the undo may run
                meta = staged["metadata"]
                out.foreign.append(ForeignPod(pod.gate, pod.node, pod.name, str(meta.get("uid") or ""),
                                              built_digest(staged), why))
                continue
            out.create.append((pod.gate, pod.node, self._signed(unstage_pod(staged, undo_pod_name(pod.name)))))
        for undo in plan.undo_failed:
            log.warning("Undo of a staging failed, left for a person; gate=%s node=%s pod=%s", undo.gate, undo.node,
                        undo.name)
        self._measure(pods)
        return out

    def _staging_pod(self, cand: Candidate) -> Obj | None:
        gate = self.gates[cand.gate]
        packages = list(dict.fromkeys(s.package for s in cand.steps if s.package is not None))
        trusted = self.trust.trusted() if self.trust is not None else None
        images, missing = pod_images(gate, packages, resolve=self.settings.resolve_digests, trusted=trusted)
        if missing:
            return None  # not pinned yet: staged once they are
        node = self.world.nodes.get(cand.node) or {}
        return staging_pod(gate, cand.node, cand.pod, cand.steps, self.settings,
                           facts_of(cand.node, node, None), images)

    def _ring(self) -> KeyRing:
        if self.world.signer is None:
            raise RuntimeError("staging pods are planned before the key ring is loaded")
        return self.world.signer.ring

    def _signed(self, body: Obj) -> Obj:
        meta = body["metadata"]
        meta["annotations"][SIGNATURE_ANNOTATION] = sign_pod(self._ring(), self.settings.namespace, meta["name"],
                                                             built_digest(body))
        return body

    def _refusal(self, pod: Obj) -> str | None:
        """Why a pod of the staging kinds (whole, or as the cache keeps it) is not one the operator signed."""
        meta = pod["metadata"]
        return pod_refusal(self._ring(), (meta.get("annotations") or {}).get(SIGNATURE_ANNOTATION),
                           self.settings.namespace, meta["name"], built_shape(pod))

    def _pods(self) -> list[tuple[StagingPod, StagePod]]:
        """Every staging and undo pod the operator signed, as it is (`_refusal`)."""
        return self._scan()[0]

    def _scan(self) -> tuple[list[tuple[StagingPod, StagePod]], list[ForeignPod]]:
        """The pods of the staging kinds: those the operator signed, as it is, and the others not being deleted."""
        out: list[tuple[StagingPod, StagePod]] = []
        foreign: list[ForeignPod] = []
        for pod in self.world.pods.items():
            owner = staging_owner(pod)
            if owner is None:
                continue
            meta = pod["metadata"]
            why = self._refusal(pod)
            if why is not None:
                if not meta.get("deletionTimestamp"):
                    foreign.append(ForeignPod(owner[0], owner[1], meta["name"], str(meta.get("uid") or ""),
                                              built_shape(pod), why))
                continue
            view = stage_pod_view(pod)
            out.append((StagingPod(view.name, owner[0], owner[1], "undo" if owner[2] == "unstage" else "staging",
                                   phase=view.phase, deleting=bool(meta.get("deletionTimestamp"))), view))
        return out, foreign

    def _taken_over_metrics(self, pods: list[tuple[StagingPod, StagePod]], deleted: list[str]) -> None:
        """A staging pod its round took over, about to go: its steps are the round's, observed as `staged`
        in `nodegate_stage_duration_seconds` (a stage staged whole runs no container in the window)."""
        names = {p.name for p, _ in pods}
        self.observed &= names  # once a pod: the plan names it again until its deletion is seen
        for pod, _ in pods:
            if (pod.name not in deleted or pod.kind != "staging" or undo_pod_name(pod.name) in names
                    or pod.name in self.observed):
                continue
            self.observed.add(pod.name)
            obj = self.world.pods.get(pod.name, self.settings.namespace)
            for step, outcome, seconds in step_runs(obj, done="staged") if obj is not None else ():
                self.metrics.stage_duration.labels(step.package or "-", step.stage, outcome).observe(seconds)

    def _measure(self, pods: list[tuple[StagingPod, StagePod]]) -> None:
        names = {p.name: p for p, _ in pods}
        counts: Counter[str] = Counter()
        for pod, _ in pods:
            if pod.kind == "undo":
                state = {"succeeded": "undone", "failed": "undo-failed"}.get(pod.phase, "undoing")
            elif undo_pod_name(pod.name) in names:
                continue  # counted as its undo
            else:
                state = {"succeeded": "staged", "failed": "failed"}.get(pod.phase, "staging")
            counts[state] += 1
        for state in ("staging", "staged", "failed", "undoing", "undone", "undo-failed"):
            self.metrics.stagings.labels(state).set(counts[state])

    def pod_for(self, gate: NodeGate, state: NodeGateState, node: str) -> StagePod | None:
        """For the node reconcile: the staging pod of the node's round, None while there is none, or while
        its undo exists (what it staged is being taken back, or was: the round waits for a staging anew)."""
        steps = staging_steps(gate, state, self.catalog)
        if not steps:
            return None
        name = staging_pod_name(gate.name, node, steps)
        pod = self.world.pods.get(name, self.settings.namespace)
        if pod is None or self._refusal(pod) is not None:
            return None  # none, or not the operator's (the next staging plan deletes it)
        if self.world.pods.get(undo_pod_name(name), self.settings.namespace) is not None:
            return None
        return stage_pod_view(pod)


__all__ = ["STAGING_KINDS", "ForeignPod", "Stager", "StagingWrites", "staging_owner"]
