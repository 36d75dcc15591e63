"""A node's removal round: its gate is being deleted, so the node uninstalls what the gate installed
there and is then released, as NodeGate found it.

Which nodes uninstall now, under the gate's budgets, is the fleet's side (`gate.lifecycle.removal`).
On the node (`decide_removal`), the uninstall is a round like an install's, with stage pod names of
its own: cordon, wait for protected pods and drain when an uninstall needs an interrupt
(`gate.lifecycle.disruption`), the uninstalls (dependents before what they depend on), the
interrupt, each uninstalled package's post-uninstall check, the uncordon. The node is then released:
this gate's keys removed, uncordoned if NodeGate cordoned it, untainted unless another readinessTaint
gate still needs the taint.
"""

from __future__ import annotations

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.lifecycle import taint
from gate.lifecycle.disruption import RoundSteps, require_interrupt, run_phases
from gate.lifecycle.node import Decision, NodeContext, StagePod, Step
from gate.lifecycle.round import Round, complete_round, install_order, stuck_reason


def decide_removal(ctx: NodeContext) -> Decision:
    """The gate is being deleted: let running stages end, uninstall what allows it, then leave the node
    as NodeGate found it: uncordoned (if NodeGate cordoned it), untainted (unless another readinessTaint
    gate still needs the taint), without this gate's keys.

    Once the removal's planner (`gate.lifecycle.removal`) picked the node, the uninstall is a round
    like an install's: cordon, wait for protected pods and drain when an uninstall needs an interrupt
    (`uninstall.interrupt`, else the package's own), the uninstalls (dependents before what they
    depend on), the interrupt, each uninstalled package's post-uninstall check, the uncordon."""
    r = Round(ctx)
    s = r.state
    gate = ctx.gate
    # Stages of the last round: a running one finishes first, even on a failed node (another
    # package's stage may still be changing the host): a host change is never cut off half way, and
    # the node is not uncordoned under it. Stuck ones (image pull, never started) will not finish and
    # are removed with the rest.
    own = {v.name for v in ctx.stage_pods.values() if _removal_pod(r, v)}
    leftovers = [v for v in ctx.stage_pods.values() if v.name not in own]
    running = [v for v in leftovers if not v.ended and stuck_reason(v, ctx) is None]
    if running:
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    r.decision.delete_pods.extend(v.name for v in leftovers)
    reset = keys.reset_annotation(gate.name) in ctx.node.annotations
    if reset:
        # A person reset the node (after a failed uninstall, say, fixed by hand): what the gate installed
        # there is forgotten, so nothing is uninstalled, and the node is released below.
        s.installed = {}
        s.interrupted = []
        r.changed = True
        r.decision.delete_pods.extend(sorted(own))
    picked = s.removing and s.status == "in-progress"
    if picked:
        outcome = _removal_round(r)
        if outcome is not None:
            return outcome
    elif _to_uninstall(gate, s) or (s.removing and s.status == "failed" and not reset):
        # Not picked yet (the removal is a rollout, and a paused gate picks nothing): the gate's plan
        # brings the node back. Failed in the removal (an uninstall, or a check after its interrupt):
        # it waits for a person, as a failed install does.
        return r.finish_decision()
    if s.removing and not ctx.release:
        # Held until its batch is judged (gate.lifecycle.removal): a batch is judged on all its nodes.
        return r.finish_decision()
    r.decision.remove_state = True
    r.decision.state = None
    change = r.decision.node
    if ctx.node.cordoned_by == gate.name:
        change.clear_cordoned_by = True
        if ctx.node.unschedulable:
            change.unschedulable = False
    if taint.lifts(gate, ctx.node.taints, ctx.readiness_clear):
        change.remove_readiness_taint = True
    r.event("node", "Normal", "Released", f"NodeGate {gate.name} was deleted; its keys were removed from the node")
    return r.decision


def _to_uninstall(gate: NodeGate, state: NodeGateState) -> list[str]:
    return sorted(n for n, p in gate.spec.packages.items() if p.uninstall.enabled and n in state.installed)


def _removal_pod(r: Round, pod: StagePod) -> bool:
    """A pod of this removal's round (all others are left over from an install round): plan_removal
    starts the removal in a round of its own."""
    return r.state.removing and pod.round == r.state.round and pod.kind != "stages"


def _removal_round(r: Round) -> Decision | None:
    """A picked node's removal round; None once it completed (uncordoned, its status complete)."""
    s, gate = r.state, r.gate
    paused = gate.spec.paused
    if paused and s.phase == "idle":
        return r.finish_decision()  # nothing started: the unpause (a spec change) brings the node back
    packages = gate.spec.packages
    todo = _to_uninstall(gate, s)
    required = require_interrupt(r, {n: packages[n].uninstall_interrupt() for n in todo})
    outcome = run_phases(r, required, paused, _uninstalls(r))
    if outcome is not None:
        return outcome
    complete_round(r)
    r.event("node", "Normal", "Uninstalled", f"NodeGate {gate.name} was deleted: its packages are uninstalled")
    return None


def _uninstalls(r: Round) -> RoundSteps:
    """The uninstall stages of a removal round, each package after the packages that depend on it (the
    round's first pod runs them, then its interrupt and checks: `gate.lifecycle.disruption.run_phases`)."""
    order = list(reversed(install_order(r.gate)))

    def plan() -> list[Step]:
        todo = set(_to_uninstall(r.gate, r.state))
        return [Step(n, "uninstall", "gate-deleted", version=r.state.installed[n].version) for n in order if n in todo]

    def record(step: Step) -> None:
        r.state.installed = {k: v for k, v in r.state.installed.items() if k != step.package}

    def failure(_: Step, message: str) -> tuple[str, str]:
        return "UninstallFailed", f"{message}; the gate keeps its finalizer until the node is fixed and reset"

    return RoundSteps("removal", plan, record, failure)
