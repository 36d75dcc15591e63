"""What GitOps tools read off NodeGate's two kinds: kstatus' `Reconciling` and `Stalled`, and `Ready`.

kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status; Flux, kpt and cli-utils judge objects with it)
decides an object's status from its conditions, in this order:

* `metadata.generation` != `status.observedGeneration`: InProgress (the operator has not seen the spec);
* `Reconciling` True: InProgress; `Stalled` True: Failed;
* otherwise `Ready`: True is Current, False or Unknown is InProgress.

Its conditions are "abnormal-true": present, with status True, only while something unusual goes on;
absent means normal. NodeGate follows that to the letter (as Flux's own controllers do): a status
carries `Reconciling` or `Stalled` only while it is True, never both, and drops it afterwards, so
the last word is always `Ready`'s.

The decisions that kstatus leaves to each API:

* **Reconciling** while nodes of the gate still have work: in progress, waiting for their batch, for a
  maintenance window, or for a higher-priority gate. All of these end by themselves.
* **Stalled** when the rollout cannot end without a person: a compartment stopped (its failure
  threshold was reached; `nodegate resume` continues it), or nodes failed and nothing else is left to
  do (failed nodes get another round only after a spec change or `nodegate node reset`), or the gate
  names a DeploymentPolicy that does not exist.
* **Paused** (spec.paused) with work left is Reconciling with reason `Paused`, so kstatus says
  InProgress: a pause is a person's choice, not a failure, and a pipeline that waits for Current
  keeps waiting (up to its own timeout) instead of reporting a broken rollout. A paused gate with
  nothing left is Current. Argo CD, which has a word for it, shows Suspended (docs/operations.md).
* **Disabled** (`nodegate disable`): the operator does nothing, so neither condition is set and
  `Ready` decides (Current when every node was complete, InProgress otherwise).
* **Deleting**: kstatus says Terminating for any object with a deletionTimestamp before it reads a
  condition; the removal still sets Reconciling (uninstalls running) or Stalled (an uninstall
  failed, or a compartment stopped) for tools that read the conditions themselves.

A DeploymentPolicy is configuration: it is Ready once the operator has read it (observedGeneration
says which spec) and Stalled when its spec cannot be read (it got past admission, e.g. while the
webhook was not serving); `usedBy` lists the gates that name it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from gate.api.common import Condition, Obj
from gate.api.nodegate import CompartmentStatus, NodeCounts
from gate.api.policy import DeploymentPolicyStatus
from gate.lifecycle.condition import timestamp as timestamp
from gate.lifecycle.condition import transition_time

KstatusType = Literal["Reconciling", "Stalled"]
RECONCILING: Final[KstatusType] = "Reconciling"
STALLED: Final[KstatusType] = "Stalled"
KSTATUS_TYPES = (RECONCILING, STALLED)


@dataclass(frozen=True)
class Verdict:
    """The one abnormal-true condition an object carries now (None elsewhere means: neither)."""

    type: KstatusType
    reason: str
    message: str


def condition(type_: str, status: Literal["True", "False"], reason: str, message: str,
              previous: Sequence[Condition], now: datetime, generation: int) -> Condition:
    """A condition that keeps its lastTransitionTime while its status stays the same. The one builder of
    gate and policy conditions (`previous_conditions` reads them from a status as sent); a node's own
    conditions keep theirs in `gate.lifecycle.condition.condition_patch`; both by `transition_time`."""
    before = next(((old.status, old.last_transition_time) for old in reversed(previous)
                   if old.type == type_ and old.status == status and old.last_transition_time), None)
    since = transition_time(before, status, now)
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=since,
                     observed_generation=generation)


def previous_conditions(status: Obj) -> list[Condition]:
    """The conditions of a status as the API server sent it, for `condition` to keep their times; an
    entry that does not parse (a hand edit through the status subresource) counts as absent."""
    out = []
    for raw in status.get("conditions") or []:
        try:
            out.append(Condition.model_validate(raw))
        except ValueError:
            continue
    return out


def rollout_verdict(gate: str, counts: NodeCounts, compartments: Sequence[CompartmentStatus],
                    paused: bool) -> Verdict | None:
    """Reconciling or Stalled for a gate's rollout (see the module docstring), or None when it is done."""
    stopped = [c.name for c in compartments if c.state == "stopped"]
    if stopped:
        return Verdict(STALLED, "CompartmentStopped",
                       f"Compartments stopped after failed batches: {', '.join(stopped)} (failed nodes: "
                       f"{counts.failed}); fix the package, then `nodegate resume {gate}` continues them")
    left = counts.in_progress + counts.waiting + counts.blocked
    if counts.failed and not left:
        return Verdict(STALLED, "NodesFailed",
                       f"Failed nodes: {counts.failed}, and no other node has work left; fix them, then "
                       f"`nodegate node reset NODE --gate {gate}` (or change the spec) gives them another round")
    if not left:
        return None
    if paused:
        return Verdict(RECONCILING, "Paused",
                       f"spec.paused is true: no new work starts until the gate is resumed (nodes waiting: "
                       f"{counts.waiting + counts.blocked}, still finishing: {counts.in_progress})")
    rolling = [c for c in compartments if c.state not in ("complete",)]
    if rolling and all(c.state == "outside-window" for c in rolling):
        return Verdict(RECONCILING, "OutsideWindow",
                       f"Nodes waiting for the next maintenance window of the DeploymentPolicy: {counts.waiting}")
    if counts.in_progress == 0 and counts.waiting == 0:
        return Verdict(RECONCILING, "Blocked", f"Nodes waiting for higher-priority gates: {counts.blocked}")
    return Verdict(RECONCILING, "RollingOut",
                   f"{counts.complete} of {counts.matched} nodes complete, {counts.in_progress} in progress, "
                   f"{counts.waiting + counts.blocked} waiting")


def with_verdict(conditions: Sequence[Condition], verdict: Verdict | None, previous: Sequence[Condition],
                 now: datetime, generation: int) -> list[Condition]:
    """`conditions` without either kstatus condition, plus the verdict's (abnormal-true: only when True)."""
    kept = [c for c in conditions if c.type not in KSTATUS_TYPES]
    if verdict is None:
        return kept
    return [*kept, condition(verdict.type, "True", verdict.reason, verdict.message, previous, now, generation)]


def policy_status(generation: int, used_by: Sequence[str], problem: str | None,
                  previous: Sequence[Condition], now: datetime) -> DeploymentPolicyStatus:
    """A DeploymentPolicy's status: Ready once read, Stalled while its spec cannot be read (`problem`)."""
    users = ", ".join(used_by) if used_by else "no NodeGate"
    if problem is None:
        ready = condition("Ready", "True", "Accepted", f"The operator read this spec; used by {users}",
                          previous, now, generation)
        conditions = [ready]
    else:
        message = f"The spec cannot be used: {problem}; gates naming this policy stop until it is fixed"
        conditions = [condition("Ready", "False", "InvalidSpec", message, previous, now, generation),
                      condition(STALLED, "True", "InvalidSpec", message, previous, now, generation)]
    return DeploymentPolicyStatus(observed_generation=generation, conditions=conditions, used_by=list(used_by))


__all__ = ["KSTATUS_TYPES", "RECONCILING", "STALLED", "Verdict", "condition", "policy_status", "rollout_verdict",
           "timestamp", "with_verdict"]


def same_status(current: Obj, new: Obj) -> bool:
    """Two status objects that differ at most in their conditions' lastTransitionTimes."""

    def strip(status: Obj) -> str:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []]
        return json.dumps({**status, "conditions": conds}, sort_keys=True)

    return strip(current) == strip(new)
