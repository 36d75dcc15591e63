"""The per-node state machine of one gate: one idempotent step at a time, decided without I/O.

A round on a node runs through phases:

    cordon -> wait-pods -> drain -> stages -> interrupt -> post-interrupt -> finish [-> soak]
    (cordon, wait-pods and drain only when this round needs an interrupt; interrupt and
     post-interrupt only when it does; an interrupt of type drain runs no interrupt step; soak only
     under a DeploymentPolicy with `health`: `gate.lifecycle.soak` decides it)

`decide` reads the world (the gate, the node, this gate's state on the node, its stage pods, the
pods on the node) and returns what to do next: a new state and node changes to write in one request,
stage pods to create or delete, pods to evict, events, and when to look again. The node applier
(`gate.controller.node_applier`) sends it.
Everything the next step depends on is either in the state annotation or in an object with a
deterministic name, so running `decide` again after a crash at any point does the same thing.

This module holds the install round: which stages each package runs and in what order, the wait for
the round's images and for its staging (`gate.lifecycle.staging`) before the cordon, and the finish
(the readiness taint, the hand-off hold, a roll-back's end). The rooms around it:

* `gate.lifecycle.node`: the types the machine reads and returns (`NodeContext`, `Decision`, ...);
* `gate.lifecycle.round`: a round's start and end, and its steps run in stage pods (`run_steps`);
* `gate.lifecycle.disruption`: cordon, wait-pods, drain, the interrupt and the checks after it;
* `gate.lifecycle.soaking`: the soak phase under a policy with `health`;
* `gate.lifecycle.uninstall`: the removal round of a deleted gate (`decide_removal`).
"""

from __future__ import annotations

from datetime import datetime

from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, Phase, rollout_hash
from gate.lifecycle import taint
from gate.lifecycle.disruption import RoundSteps, cordon, require_interrupt, run_phases
from gate.lifecycle.handoff import hold_wanted
from gate.lifecycle.node import ROUND_KINDS, Decision, NodeContext, NodeView, StagePod, Step
from gate.lifecycle.round import (
    Round,
    complete_round,
    install_order,
    look_again_for,
    note_pull,
    pending_work,
    round_work,
    stage_fingerprint,
    stuck_reason,
)
from gate.lifecycle.serving import ServingCatalog
from gate.lifecycle.soaking import decide_soak, enter_soak
from gate.lifecycle.staging import await_staging, staging_steps
from gate.lifecycle.work import after_stage, constraint_satisfied


def decide(ctx: NodeContext) -> Decision:
    """The next step for a node that is in progress for this gate."""
    r = Round(ctx)
    s = r.state
    if s.status != "in-progress":
        return r.finish_decision()
    if s.phase == "soak":
        return decide_soak(r)
    work = round_work(ctx.gate, s)
    required = require_interrupt(r, {n: w.interrupt for n, w in work.items() if not w.done})
    needs_interrupt = required.type != "none"
    paused = ctx.gate.spec.paused

    if s.phase in ("cordon", "wait-pods", "drain") and not needs_interrupt:
        r.set_phase("stages")
    _sweep(r)
    if s.phase == "idle" and needs_interrupt and ctx.prepull:
        outcome = _await_images(r)
        if outcome is not None:
            return outcome
    if s.phase == "idle" and needs_interrupt and ctx.serving is not None:
        steps = staging_steps(ctx.gate, s, ctx.serving)
        if steps:
            outcome = await_staging(r, steps, ctx.serving, required.type)
            if outcome is not None:
                return outcome
    outcome = run_phases(r, required, paused, _stages(r))
    if outcome is not None:
        return outcome

    if s.phase == "finish":
        _finish(r)
    return r.finish_decision()


def cordon_at_pick(gate: NodeGate, node: NodeView, state: NodeGateState, now: datetime, *, images_wait: bool,
                   serving: ServingCatalog | None) -> Decision | None:
    """The first look of a round the planner picks now, taken in the pick's own write when that look
    would only cordon: the round interrupts the node and waits for nothing before its cordon (its
    images are on the node, `images_wait` False: the caller judges them as the node reconcile's
    prepull does; no serving step to stage; the gate not paused). Returns what `decide` would write
    at that look (the state at wait-pods, the cordon, the Cordoned Event), or None: the node
    reconcile takes the round from `idle`, as without this. A node someone else cordoned is left so
    (`cordon`)."""
    if state.status != "in-progress" or state.phase != "idle" or gate.spec.paused or images_wait:
        return None
    if state.rollback is not None and not state.rollback.done:
        return None  # a roll-back runs its revision's packages, not the gate's
    if serving is not None and staging_steps(gate, state, serving):
        return None  # it stages while serving first (`await_staging`)
    r = Round(NodeContext(gate=gate, node=node, state=state, stage_pods={}, pods=None, now=now))
    work = round_work(gate, state)
    required = require_interrupt(r, {n: w.interrupt for n, w in work.items() if not w.done})
    if required.type == "none":
        return None
    r.set_phase("wait-pods")
    cordon(r, required)
    return r.finish_decision()


_PHASE_ORDER: tuple[Phase, ...] = ("idle", "cordon", "wait-pods", "drain", "stages", "interrupt", "post-interrupt",
                                   "finish", "soak")


def _sweep(r: Round) -> None:
    """Delete the ended stage pods no phase still ahead of this round will read: those of earlier
    rounds, and those whose last step is of a phase the round is past (a pod that holds the reboot is
    read until the round is past its interrupt)."""
    s = r.state
    now = _PHASE_ORDER.index(s.phase)
    for pod in r.ctx.stage_pods.values():
        if pod.kind not in ROUND_KINDS:
            continue  # a staging pod is the fleet's to delete (`gate.lifecycle.staging`)
        if pod.ended and (pod.round != s.round or _PHASE_ORDER.index(_last_phase(pod)) < now):
            r.decision.delete_pods.append(pod.name)


def _last_phase(pod: StagePod) -> Phase:
    last = pod.steps[-1].stage if pod.steps else ""
    if last == "interrupt":
        return "interrupt"
    return "post-interrupt" if last in ("post-interrupt", "post-uninstall") else "stages"


def _await_images(r: Round) -> Decision | None:
    """Before the cordon: the round's images are on the node (its prepull pod ended), or it waits.
    A pull that keeps failing fails the node here, before anything touched it (`gate.lifecycle.prepull`);
    until then the state says it fails (`pull_failing`). None once the round may go on."""
    ctx, view = r.ctx, r.ctx.prepull_pod
    if view is not None and view.ended:
        if r.state.pull_failing is not None:
            r.state.pull_failing = None
            r.changed = True
        return None
    if view is not None:
        stuck = stuck_reason(view, ctx)
        if stuck:
            return r.fail(stuck[0], f"prepull pod {view.name}: {stuck[1]} (the node was not cordoned)",
                          stage="prepull")
        note_pull(r, view)
        look_again_for(r, view)
    # Its pod's creation or end (an event) usually comes first.
    current = r.decision.requeue_after
    r.decision.requeue_after = ctx.timing.poll if current is None else min(current, ctx.timing.poll)
    return r.finish_decision()


def _stages(r: Round) -> RoundSteps:
    """The package stages of an install round, as steps in dependency order (the round's first pod runs
    them, then its interrupt and checks: `gate.lifecycle.disruption.run_phases`)."""
    gate = r.gate
    packages = gate.spec.packages
    order = install_order(gate)
    blocked: list[str] = []

    def plan() -> list[Step]:
        # A package whose dependencies will not satisfy its constraints once this pod ran waits; it
        # fails the node once nothing else is left to run.
        work = round_work(gate, r.state)
        after: dict[str, str | None] = {n: (packages[n].version if not work[n].done else
                                            (r.state.installed[n].version if n in r.state.installed else None))
                                        for n in order}
        steps: list[Step] = []
        held: set[str] = set()
        blocked.clear()
        for name in order:
            w = work[name]
            deps = packages[name].depends_on
            unmet = [d for d in deps if d in held or (version := after.get(d)) is None
                     or not constraint_satisfied(deps[d], version)]
            if unmet:
                held.add(name)
                if not w.done:
                    blocked.append(name)
                continue
            pkg = packages[name]
            steps += [Step(name, stage, stage_fingerprint(pkg, stage), version=pkg.version,
                           previous_version=w.previous_version) for stage in w.stages]
        return steps

    def record(step: Step) -> None:
        assert step.package is not None
        installed = dict(r.state.installed)
        done = after_stage(step.stage, packages[step.package], installed.get(step.package))
        if done is None:
            installed.pop(step.package, None)
        else:
            installed[step.package] = done
        r.state.installed = installed

    def held() -> Decision | None:
        if not blocked:
            return None
        return r.fail("DependencyUnsatisfied", f"{', '.join(blocked)} wait for dependencies whose installed "
                      "version does not satisfy the constraint", package=blocked[0], stage="apply")

    return RoundSteps("stages", plan, record, lambda _, message: ("StageFailed", message),
                      blocked=lambda: bool(blocked), held=held)


def _finish(r: Round) -> None:
    ctx, s = r.ctx, r.state
    if s.rollback is not None and not s.rollback.done:
        _finish_rollback(r)
        return
    if not pending_work(ctx.gate, s):
        # Complete for this spec. When the spec changed during the round the round's own (older)
        # generation and hash stay, so the gate-level plan sees the remaining work and picks the node
        # again for a fresh round.
        s.generation = ctx.gate.metadata.generation or s.generation
        s.rollout_hash = rollout_hash(ctx.gate)
    s.passed = True
    s.failure = None
    s.reruns = {}
    if ctx.health is not None:
        enter_soak(r, ctx.health)
    else:
        complete_round(r)
    change = r.decision.node
    if taint.lifts(ctx.gate, ctx.node.taints, ctx.readiness_clear):
        change.remove_readiness_taint = True
        r.event("node", "Normal", "ReadinessTaintRemoved", "Every readinessTaint gate is complete on the node")
        _hold(r)
    if ctx.health is None:
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node")


def _finish_rollback(r: Round) -> None:
    """A roll-back went through: the node is back on the revision (`installed` says what it has) and
    waits, outside any batch, for its stopped compartment to be resumed or the spec to change."""
    ctx, s = r.ctx, r.state
    assert s.rollback is not None
    s.rollback = s.rollback.model_copy(update={"done": True})
    s.rollout_hash = s.rollback.to  # what the node has now; the gate's plan sees the current spec pending
    s.failure = None
    s.reruns = {}
    complete_round(r)
    s.status = "waiting"
    s.batch = 0
    r.decision.node.status = "waiting"
    to = f"revision {s.rollback.revision}" if s.rollback.revision else "no packages of the gate (its first spec)"
    r.event("node", "Normal", "RolledBack", f"NodeGate {ctx.gate.name} took the node back to {to}")


def _hold(r: Round) -> None:
    """Hand the joining node over (spec.leaveCordoned): cordoned, with `held-by`, in the very write that
    lifts its taint, so no crash can leave it schedulable in between. The hold carries no `cordoned-by`:
    later rounds find a node someone else cordoned, keep it so, and never uncordon it."""
    ctx, change = r.ctx, r.decision.node
    asker = hold_wanted(ctx.node.annotations, ctx.hold_asked_by)
    if asker is None:
        return
    change.unschedulable = True
    change.held_by = asker
    if ctx.node.cordoned_by == ctx.gate.name:
        change.clear_cordoned_by = True  # the round's own cordon becomes the hold
    # The round's uncordon, decided before, does not happen: no Event may say it did.
    r.decision.events = [e for e in r.decision.events if not (e.target == "node" and e.reason == "Uncordoned")]
    r.event("node", "Normal", "HeldForHandOff", f"NodeGate {asker} left the node cordoned for the validator "
            "that comes next (spec.leaveCordoned); `kubectl uncordon` releases it for good")

