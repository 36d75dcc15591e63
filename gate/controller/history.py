"""The gate's history: its current spec recorded as its newest ControllerRevision (`gate.rollout.history`).

A `HistoryKey` comes with every spec write of a gate (and once per gate when this replica starts to
lead). The reconciler lists the gate's ControllerRevisions in the operator's namespace, keeps the
ones it signed, and performs the one step `plan_history` decides: create the current spec's revision
or renumber it, delete the oldest beyond `OperatorSettings.revision_history_limit`.

* **Where**: the operator's namespace. A ControllerRevision is namespaced and a NodeGate is not; its
  owner reference to the gate (controller, no blockOwnerDeletion, as the package ConfigMaps) lets the
  garbage collector delete the history with the gate.
* **Only its own**: a revision without the operator's signature (which covers its number), or signed
  for another gate or an earlier gate of the same name, is ignored (one log line per object); one squatting the name the
  operator needs is deleted (with its uid as a precondition) and written anew. `data` of a
  ControllerRevision cannot change once created, so overwriting is delete and create.
* **Remembered**: the rollout hash last recorded per gate (and its uid), so a spec write that is no
  rollout (a pause) or an operator restart costs one list at most, no write.
"""

from __future__ import annotations

import logging

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import rollout_hash
from gate.controller.pods import GATE_NAME_ANNOTATION, owner_reference
from gate.controller.result import DONE, Result, replan
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import HistoryKey
from gate.controller.world import World
from gate.kube.client import CONTROLLER_REVISIONS, KubeClient
from gate.kube.errors import Conflict
from gate.rollout.history import (
    HASH_LABEL,
    SIGNATURE_ANNOTATION,
    HistoryStep,
    Revision,
    history_selector,
    parse_revision,
    plan_history,
    revision_refusal,
    revision_spec,
    sign_revision,
)

log = logging.getLogger("nodegate.operator")


def revision_object(gate: NodeGate, number: int, sig: str, namespace: str) -> Obj:
    spec_hash = rollout_hash(gate)
    return {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {
            "name": f"{gate.name}-{spec_hash}", "namespace": namespace,
            "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER, keys.STAGE_GATE_LABEL: gate.name,
                       HASH_LABEL: spec_hash},
            "annotations": {GATE_NAME_ANNOTATION: gate.name, SIGNATURE_ANNOTATION: sig},
            "ownerReferences": [owner_reference(gate)],
        },
        "data": {"spec": revision_spec(gate)},
        "revision": number,
    }


def kept_history(gate: NodeGate, own: list[Revision], step: HistoryStep) -> list[Revision]:
    """The gate's revisions once `step` is written: what roll-backs read (`World.revisions`)."""
    kept = [r for r in own if r.name not in step.delete and r.name != step.name]
    current = next((r for r in own if r.name == step.name), None)
    spec_hash = rollout_hash(gate)
    if current is None:
        current = Revision(name=step.name, number=step.number, spec_hash=spec_hash, spec=revision_spec(gate))
    return [*kept, Revision(name=current.name, number=step.number, spec_hash=current.spec_hash or spec_hash,
                            spec=current.spec)]


class HistoryReconciler:
    def __init__(self, settings: OperatorSettings, client: KubeClient, world: World) -> None:
        self.settings = settings
        self.client = client
        self.world = world
        self.recorded: dict[str, tuple[str, str]] = {}  # gate -> (uid, rollout hash) recorded last
        self.reported: set[str] = set()  # foreign revisions already logged (by name and resourceVersion)

    async def reconcile(self, key: HistoryKey) -> Result:
        gate = self.world.gate(key.gate)
        signer = self.world.signer
        if gate is None or gate.metadata.deletion_timestamp or signer is None or not gate.metadata.uid:
            self.recorded.pop(key.gate, None)
            self.world.revisions.pop(key.gate, None)
            return DONE
        uid, spec_hash = gate.metadata.uid, rollout_hash(gate)
        if self.recorded.get(gate.name) == (uid, spec_hash):
            return DONE
        ns = self.settings.namespace
        objs, _ = await self.client.list(CONTROLLER_REVISIONS, ns, label_selector=history_selector(gate.name))
        own, foreign = self._own(gate, objs)
        step = plan_history(gate, own, self.settings.revision_history_limit)
        if step.create:
            await self._create(gate, step, foreign)
        elif step.renumber:
            current = next(r for r in own if r.name == step.name)
            sig = sign_revision(signer.ring, gate.name, uid, current.spec_hash, current.spec, step.number)
            # The number and its signature in one write, guarded by the version that was checked.
            await self.client.patch(CONTROLLER_REVISIONS, step.name, {
                "revision": step.number, "metadata": {"resourceVersion": current.resource_version,
                                                      "annotations": {SIGNATURE_ANNOTATION: sig}}}, namespace=ns)
            log.info("Renumbered a revision, its spec applied again; gate=%s revision=%s number=%d",
                     gate.name, step.name, step.number)
        for name in step.delete:
            await self.client.delete(CONTROLLER_REVISIONS, name, ns)
            log.info("Deleted a revision beyond the history limit; gate=%s revision=%s limit=%d",
                     gate.name, name, self.settings.revision_history_limit)
        self.recorded[gate.name] = (uid, spec_hash)
        self.world.revisions[gate.name] = kept_history(gate, own, step)
        return replan([gate.name])  # a roll-back may wait for the history (`gate.lifecycle.rollback`)

    def _own(self, gate: NodeGate, objs: list[Obj]) -> tuple[list[Revision], dict[str, Obj]]:
        """The gate's revisions the operator signed, and every other object under its label, by name."""
        signer, uid = self.world.signer, gate.metadata.uid or ""
        assert signer is not None
        own, foreign = [], {}
        for obj in objs:
            meta = obj.get("metadata") or {}
            revision = parse_revision(obj, gate.name, uid)
            why = "it is not controlled by this gate (name and uid) or holds no spec" if revision is None else \
                revision_refusal(signer.ring, gate.name, uid, revision)
            if revision is not None and why is None:
                own.append(revision)
                continue
            name = str(meta.get("name", ""))
            foreign[name] = obj
            seen = f"{name}@{meta.get('resourceVersion', '')}"
            if seen not in self.reported:
                self.reported.add(seen)
                log.warning("Ignored a ControllerRevision the operator did not write for this gate; gate=%s "
                            "revision=%s/%s why=%s", gate.name, self.settings.namespace, name, why)
        return own, foreign

    async def _create(self, gate: NodeGate, step: HistoryStep, foreign: dict[str, Obj]) -> None:
        ns, signer = self.settings.namespace, self.world.signer
        assert signer is not None
        squatter = foreign.get(step.name)
        if squatter is not None:  # its data cannot change: delete it (that very object) and write ours
            uid = squatter["metadata"].get("uid")
            await self.client.delete(CONTROLLER_REVISIONS, step.name, ns,
                                     body={"preconditions": {"uid": uid}} if uid else None)
            log.warning("Deleted a ControllerRevision under the name of this gate's revision that the operator did "
                        "not write; gate=%s revision=%s/%s", gate.name, ns, step.name)
        sig = sign_revision(signer.ring, gate.name, gate.metadata.uid or "", rollout_hash(gate), revision_spec(gate),
                            step.number)
        try:
            await self.client.create(CONTROLLER_REVISIONS, revision_object(gate, step.number, sig, ns), ns)
        except Conflict:
            self.recorded.pop(gate.name, None)
            raise  # there since the list (another write, or one the list missed): decided again, with backoff
        log.info("Recorded a revision of the gate's spec; gate=%s revision=%s number=%d", gate.name, step.name,
                 step.number)
