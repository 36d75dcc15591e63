"""Roll-back of a failed batch (DeploymentPolicy `rollback: true`): which nodes go back, to what. Pure.

The planner (`gate.rollout.planner.decide`) stops a compartment with `rollback` at the first failed
batch and records `CompartmentRollback(batch=N)` in its status. Everything after is here:

* **To what**: the gate's previous revision (`gate.rollout.history`): the newest revision whose hash is
  not the current rollout's. With the current revision the only one and numbered 1, the failed spec was
  the gate's first: there is nothing before it, so the packages it brought are uninstalled (the target
  is an empty spec). "First" also needs the gate's `metadata.generation` to be 1, which only the API
  server writes: a history that lost its older revisions (deleted by someone who may delete
  ControllerRevisions in the operator's namespace, or a gate older than its history) restarts at
  number 1, and must not make a failed upgrade uninstall what the fleet had before it. With no previous
  revision otherwise (pruned, `revisionHistoryLimit`, or deleted), the record says `NoRevision` and
  nothing is rolled back: going back to a guess would be worse than stopping.
  While the history is not read yet (an operator that just started), the record stays `Pending`.
* **Which nodes**: the batch's changed nodes, those whose round started under the failed rollout
  (their `rolloutHash`), complete or failed. Nodes of other batches were never touched by it.
* **How**: an ordinary round whose target is the previous spec (`target_gate`), so `gate.lifecycle.work`
  yields the downgrade, config and uninstall stages, and the round cordons, drains and interrupts as
  any round does. The picks take the budget left in the compartment (`ceiling - inProgress`); nothing
  else starts in a stopped compartment, so the ceiling bounds roll-backs exactly as it bounds rounds.
* **Crash safety**: nodes are picked to go back only by a plan that finds the record (batch, revision)
  in the gate's status already; the plan that judges the batch writes the record and looks again. A
  roll-back takes its node out of the batch when it ends, so without the durable record a crash
  between the node writes and the status write would leave the batch never judged, the compartment
  never stopped, and the next batch picked forward.
* **After**: a node whose roll-back went through is `waiting` (label `blocked` while the compartment is
  stopped) with `rollback.done`, its `installed` the versions it is back on; one whose roll-back failed
  is `failed`, with the roll-back's failure, and not tried again. The record is the compartment's until
  a person resumes it (`nodegate resume`: the rollout goes on forward, and the rolled-back nodes are
  picked for the current spec again in their turn; roll-backs not started yet are dropped) or the spec
  changes (a new rollout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gate.api.common import Obj
from gate.api.nodegate import CompartmentRollback, CompartmentStatus, NodeGate, NodeGateSpec
from gate.api.state import NodeGateState, Rollback, rollout_hash
from gate.lifecycle.node import EventRequest
from gate.lifecycle.round import start_round
from gate.rollout import Plan, order_key
from gate.rollout.history import Revision


@dataclass(frozen=True)
class Target:
    """Where a failed rollout goes back to: `revision` None with reason RolledBack is the empty spec."""

    reason: Literal["Pending", "RolledBack", "NoRevision"]
    revision: Revision | None = None


def target_of(revisions: Sequence[Revision] | None, current_hash: str, generation: int) -> Target:
    """The revision to go back to from the rollout `current_hash` (module docstring). `revisions`: the
    operator's own, None while not read; `generation`: the gate's `metadata.generation`."""
    if revisions is None or not any(r.spec_hash == current_hash for r in revisions):
        return Target("Pending")  # the history does not hold the current spec yet: it is not read up to now
    older = sorted((r for r in revisions if r.spec_hash != current_hash), key=lambda r: r.number)
    if older:
        return Target("RolledBack", older[-1])
    if generation == 1 and all(r.number == 1 for r in revisions):
        return Target("RolledBack")  # the gate's first spec: nothing was there before it
    return Target("NoRevision")


def target_gate(gate: NodeGate, spec: Obj | None) -> NodeGate:
    """The gate as a roll-back round sees it: the revision's `spec` (None: no packages at all), paused as
    the gate is, plus each of the gate's packages that the revision lacks, set to be uninstalled (the
    uninstall stage runs only where it is installed). Built from the wire, so no memo of the gate's own
    spec carries over."""
    wire: Obj = dict(spec) if spec is not None else {**gate.spec.model_dump(by_alias=True, mode="json"),
                                                       "packages": {}}
    wire["paused"] = gate.spec.paused
    packages: Obj = dict(wire.get("packages") or {})
    for name, package in gate.spec.packages.items():
        if name in packages:
            continue
        dumped = package.model_dump(by_alias=True, mode="json", exclude_none=True)
        dumped["uninstall"] = {**(dumped.get("uninstall") or {}), "enabled": True, "apply": True}
        dumped.pop("dependsOn", None)  # what it depended on may be gone in the revision
        packages[name] = dumped
    wire["packages"] = packages
    return gate.model_copy(update={"spec": NodeGateSpec.model_validate(wire)})


def rollback_targets(gate: NodeGate, revisions: Sequence[Revision] | None) -> list[NodeGate]:
    """The specs the gate's stopped compartments go back to (as `target_gate` builds them), one per
    revision: the gate reconcile resolves their images beside the current spec's, so that a roll-back's
    stage pods pull by digest as any round's do. None without a resolved record or a kept revision."""
    if gate.status is None or not revisions:
        return []
    out: dict[str, NodeGate] = {}
    for compartment in gate.status.compartments:
        record = compartment.rollback
        if record is None or record.reason != "RolledBack" or not record.to or record.to in out:
            continue
        found = next((r for r in revisions if r.spec_hash == record.to), None)
        if found is not None:
            out[record.to] = target_gate(gate, found.spec)
    return list(out.values())


@dataclass
class RollbackPlan:
    """What the roll-backs add to a gate's plan: new states of the nodes picked, compartment statuses
    with their records completed and the picks counted, Events."""

    states: dict[str, NodeGateState] = field(default_factory=dict)
    statuses: list[CompartmentStatus] = field(default_factory=list)
    events: list[EventRequest] = field(default_factory=list)  # on the gate
    node_events: dict[str, list[EventRequest]] = field(default_factory=dict)
    recheck: bool = False  # a record to be written before its nodes go back: plan again once it is


def changed_node(state: NodeGateState | None, compartment: str, record: CompartmentRollback) -> bool:
    """The node is one of the failed batch's changed nodes, not (yet) rolled back."""
    return (state is not None and state.compartment == compartment and state.batch == record.batch
            and state.rollout_hash == record.rollout_hash and state.status in ("complete", "failed")
            and state.rollback is None)


def plan_rollbacks(gate: NodeGate, rollout: Plan, states: Mapping[str, NodeGateState | None], *,
                   revisions: Sequence[Revision] | None, previous: Sequence[CompartmentStatus], boot_ids:
                   Mapping[str, str], now: datetime) -> RollbackPlan:
    """Complete each stopped compartment's roll-back record and pick the nodes that go back now.

    `states`: each node's state as the plan leaves it so far; `previous`: the compartment statuses the
    gate had (an Event is told when a record first resolves); `boot_ids` by node."""
    out = RollbackPlan()
    current = rollout_hash(gate)
    before = {c.name: c.rollback for c in previous}
    for cp in rollout.compartments:
        status = cp.status
        record = status.rollback
        if record is None or status.state != "stopped":
            out.statuses.append(status)
            continue
        if not record.rollout_hash:
            record = record.model_copy(update={"rollout_hash": current})
        if record.rollout_hash != current:  # recorded under another spec: that rollout is over
            out.statuses.append(status.model_copy(update={"rollback": None}))
            continue
        if record.reason == "Pending":
            target = target_of(revisions, current, gate.metadata.generation or 0)
            found = target.revision
            record = record.model_copy(update={
                "reason": target.reason, "revision": found.number if found else 0,
                "to": found.spec_hash if found else ""})
        members = sorted((n for n, s in states.items() if s is not None and s.compartment == cp.name
                          and s.batch == record.batch and s.rollout_hash == record.rollout_hash
                          and (s.status in ("complete", "failed") or s.rollback is not None)),
                         key=order_key)
        # Once back, a node leaves the batch (batch 0, the revision's hash): the record keeps naming it.
        named = sorted(set(record.nodes) | set(members), key=order_key)
        record = record.model_copy(update={"nodes": named[:1000]})
        picked: list[str] = []
        spent = 0
        old = before.get(cp.name)
        # Nodes go back only once the record is in the gate's status: a crash after their writes and before
        # the status's would otherwise leave the failed batch unjudged and its nodes rolled back out of it.
        durable = (old is not None and old.reason == "RolledBack" and old.batch == record.batch
                   and old.rollout_hash == record.rollout_hash and old.revision == record.revision
                   and old.to == record.to)
        if record.reason == "RolledBack" and not durable:
            out.recheck = True
        if record.reason == "RolledBack" and durable:
            room = status.ceiling - status.in_progress
            for name in members:
                state = states[name]
                if not changed_node(state, cp.name, record):
                    continue
                assert state is not None
                cost = 0 if state.cordoned else 1  # a node its failed round left cordoned is counted already
                if spent + cost > room:
                    continue
                spent += cost
                new = start_round(state, gate=gate, batch=record.batch, compartment=cp.name,
                                  boot_id=boot_ids.get(name, ""), now=now)
                new.rollback = Rollback(to=record.to, revision=record.revision, rollout_hash=record.rollout_hash,
                                        batch=record.batch)
                out.states[name] = new
                picked.append(name)
                to = f"revision {record.revision}" if record.revision else "no packages of this gate (its first spec)"
                out.node_events[name] = [EventRequest("node", "Normal", "RollingBack",
                                               f"NodeGate {gate.name} takes the node back to {to}: batch "
                                                      f"{record.batch} of compartment {cp.name} failed")]
        if record.reason != "Pending" and (old is None or old.reason != record.reason or old.batch != record.batch):
            out.events.append(EventRequest("gate", "Warning", record.reason, rollback_message(cp.name, record)))
        out.statuses.append(status.model_copy(update={"rollback": record,
                                                      "in_progress": status.in_progress + spent}))
    return out


def rollback_message(compartment: str, record: CompartmentRollback) -> str:
    """The condition's and Event's text for a compartment's roll-back."""
    nodes = ", ".join(record.nodes[:10]) + (f" and {len(record.nodes) - 10} more" if len(record.nodes) > 10 else "")
    if record.reason == "NoRevision":
        return (f"compartment {compartment}: batch {record.batch} failed, and no previous revision of the gate is "
                f"kept to roll back to (pruned): nothing was rolled back; nodes {nodes or '-'}")
    if record.reason == "Pending":
        return f"compartment {compartment}: batch {record.batch} failed; reading the gate's history to roll back"
    to = f"revision {record.revision}" if record.revision else "no packages (the gate's first spec)"
    return (f"compartment {compartment}: batch {record.batch} failed; its nodes {nodes or '-'} go back to {to}; "
            "`nodegate resume` continues the rollout")


def rolled_back(state: NodeGateState) -> bool:
    """The node's round is a roll-back not finished yet."""
    return state.rollback is not None and not state.rollback.done
