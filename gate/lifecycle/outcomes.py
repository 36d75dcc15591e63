"""What the next plan makes of what an applier met while writing (pure: no I/O).

An applier (`gate.controller.executor`) sends what a plan says and decides nothing. What it meets on
the way comes back to the reconciler as data, and the functions here decide what follows, as the
next plan:

* **A write refused for good** (`Refusal`: admission, a quota, validation; asking again would be
  refused again) fails the node with the server's message (`after_refusal`, which is
  `gate.lifecycle.round.write_refused`). A gate plan's write of a node that is not a round's
  (a status label, a request acted on) only says so in an Event on the node (`refused_update`).
* **The failure cannot be written either** (`unrecordable`): said where it still can be, the node's
  failure condition (its status subresource) and Events that say why it is not on the node.
* **A PodDisruptionBudget blocked an eviction** (`drain_blocked`): the node's record says which, once
  per blocking budget, with a Warning Event.

A ConfigMap found under a package's name that is not NodeGate's is decided by
`gate.lifecycle.round.config_refused`, and a stage pod held until its images are pinned by
`gate.lifecycle.images.held_requests`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.api.state import NodeGateState
from gate.lifecycle.condition import NodeCondition, failure_condition
from gate.lifecycle.fleet import NodeUpdate
from gate.lifecycle.node import Decision, EventRequest, NodeContext, Step
from gate.lifecycle.round import write_refused


@dataclass(frozen=True)
class Refusal:
    """A write of a node's round the API server refused for good, as the applier met it."""

    reason: str  # NodeWriteRefused, ConfigMapRefused, PodRefused, EvictionRefused
    what: str  # the write, as the node's failure message says it
    message: str  # the API server's
    step: Step | None = None  # the step the write was for
    stage: str = ""  # else the stage the node fails in ("": its phase)


def after_refusal(ctx: NodeContext, refusal: Refusal) -> Decision:
    """The node fails for the refused write, as it was (`ctx`) before that write."""
    return write_refused(ctx, refusal.reason, refusal.what, refusal.message, refusal.step, stage=refusal.stage)


def node_write_refusal(decision: Decision, node: str, message: str) -> Refusal:
    """A node decision's own write refused: a cordon fails the round in the cordon stage."""
    cordon = decision.node.unschedulable is True
    return Refusal("NodeWriteRefused", f"the {'cordon' if cordon else 'write'} of node {node}", message,
                   stage="cordon" if cordon else "")


def refused_update(gate: str, node: str, update: NodeUpdate, message: str) -> Refusal | EventRequest:
    """A gate plan's write of one node refused for good. A node the plan picked (or moved on) fails in
    that state, as its round would (a `Refusal`); a write of anything else (a status label, a request
    acted on) is said in an Event on the node, and left for the next plan."""
    if update.state is None or update.remove_state:
        return EventRequest("node", "Warning", "NodeWriteRefused",
                            f"NodeGate {gate}: the API server refused the write of node {node}: {message}")
    starts = update.state.status == "in-progress" and update.state.phase == "idle"
    return Refusal("NodeWriteRefused", f"the {'start of a round' if starts else 'write'} of node {node}", message,
                   stage="start" if starts else "")


@dataclass(frozen=True)
class Unrecordable:
    """A node's failure the node's write refused too: its Events, saying so, and its condition (written
    when `write_condition`; None then removes it)."""

    events: list[EventRequest]
    condition: NodeCondition | None
    write_condition: bool


def unrecordable(gate: str, decision: Decision, message: str) -> Unrecordable:
    """`decision` failed the node, and its write was refused (`message`): the failure's own Events (not
    an uncordon's, say: it was not written either), each saying why it is not on the node, and the
    failure condition of the state it would have written."""
    failure = decision.state.failure if decision.state is not None else None
    events = [EventRequest(e.target, e.type, e.reason, f"{e.message} (and recording it on the node was refused: "
                                                       f"{message})")
              for e in decision.events if failure is not None and e.reason == failure.reason]
    wanted = failure_condition(gate, decision.state) if decision.state is not None else None
    return Unrecordable(events, wanted, decision.state is not None)


def drain_blocked(state: NodeGateState, blocked: str) -> NodeUpdate | None:
    """A PodDisruptionBudget refused an eviction (`blocked` names the pod and the budget's message): the
    record says so, once per blocking budget (None: it already does), with a Warning Event."""
    if state.drain_blocked_by == blocked:
        return None
    return NodeUpdate(state=state.model_copy(update={"drain_blocked_by": blocked}),
                      events=[EventRequest("node", "Warning", "DrainBlocked", f"Eviction refused: {blocked}")])
