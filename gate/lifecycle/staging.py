"""Stage while serving: which steps run on a node before its cordon, where, how many at once, and what
is undone when the node is not interrupted after all (pure: no I/O).

A package marks the first steps of its apply, upgrade or config as `serving` (docs/packages.md): their
effect waits for the interrupt (a file for the next boot, a downloaded package, a built initramfs),
and each has an undo. The operator runs them in a *staging pod* on the serving node, before its turn;
the agent runs the stage's serving steps alone (`agent run --part serving`) and records them on the
host, and the stage in the window skips them. So the window holds only the drain, what must run
drained, the interrupt and the checks after it.

What the operator knows. Which packages have serving steps is read from the catalog
(`ServingCatalog`, built from the catalog's inputs for the catalog's version): a package it does not
know stages nothing and runs whole in the window, as before. Knowing too much is harmless too: the
agent's staging of a package without serving steps runs nothing, and the window runs every step not
staged on the host for its version and generation.

Decisions:

* **Only rounds that cordon stage.** A round without an interrupt never leaves service: nothing waits.
* **The trigger is the pick order, bounded fleet-wide, as prepull's** (`gate.lifecycle.prepull`): the
  candidates are a gate's picked nodes whose round waits for its staging before the cordon, then the
  next `ahead` nodes in its line that wait for a reason that clears by itself. At most `limit` staging
  and undo pods run at once over every gate, picked nodes first.
* **A staging pod is the record.** Its name is its (gate, node, steps): picking the node does not change
  it, so the pod staged ahead is the one the round reads. While it exists, what it staged is known; it
  goes only when the round took the work over (the round passed its cordon) or the undo ran. So no gate
  owns it (a foreground deletion of the gate would take it first), and its undo pod runs what it ran,
  the staged version's payload, with `--part undo` (`gate.controller.pods.staging_pod`, `unstage_pod`).
* **The cordon waits for a succeeded staging** (`await_staging`, in the round before the cordon). A
  staging that fails fails the node before any cordon, reason StagingFailed; its undo then runs.
* **A running staging pod is never cut.** It ends; then its undo runs when its node is no longer a
  candidate. One pod per (gate, node) at a time: no staging starts on a node whose undo has not
  succeeded (the undo must not take back a newer staging's work).
* **Stop, pause, delete, roll back.** A paused gate keeps what is staged and stages no more (a resume
  goes on; the gate's generation changed, so the window runs the serving steps again). A stopped
  compartment (failure threshold), a roll-back (its compartment stopped), a node that failed or left
  the gate, a spec change (other steps, another pod name) and a deleted gate undo every staging not
  taken over; a deleted gate goes only once its staging and undo pods are gone (`gate_may_go`).
  A round that passed its cordon owns what was staged: its own failure, retry or roll-back deals
  with it, as with the rest of its work (the host's staged record goes with the window's stage).
* **A stage staged whole runs no container in the window** (`staged_whole`). Every step of its list a
  serving step, no overlay (`Serving.only`), the staging pod ran its check too (`gate.agent.plan`), at
  the gate's generation; the package depends on nothing and its own interrupt gives it a check after
  the interrupt. The round records the stage done in the write that moves it past its cordon (so the
  staging pod goes only once the state holds it), and the check after the interrupt takes the host's
  staged record over (`gate.agent.stage`): a retry, failure or roll-back of the round finds the stage
  recorded as any stage the window ran, and a round that fails before that check leaves the record
  to the next stage of the package on the node (its next round's check, a whole stage or uninstall);
  a later staging of another version or generation forgets such records without undoing them (no
  staging starts where an undo is left, so records it finds are an owning round's), and a staging pod
  whose undo exists is never the round's staging (`gate.controller.staging.Stager.pod_for`).
* **A staged node that reboots on its own.** Its staged work is live from that boot. When its turn
  comes (its pick, within the budget: the invariant checker's `over-ceiling` counts it from the pick as
  any other) and every stage of its round is serving-only (`Serving.only`) and its interrupt one a
  reboot satisfies (a reboot or a service restart, not a drain), the reboot counts as the round's
  interrupt (`state.own_reboot`): no cordon, no drain, no reboot pod; the stage in the window (its
  checks, the staged steps skipped) and the checks after the interrupt run on the serving node. A round
  with steps that must run drained cordons, drains and reboots as always. A node that reboots on its
  own between its staging's end and its pick is known by the boot the agent reported at the staging's
  end (`StagePod.boot_id`): a staging pod without one never counts a reboot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.lifecycle.fleet import GatePlan
from gate.lifecycle.node import Decision, StagePod, Step
from gate.lifecycle.prepull import AHEAD_REASONS, needs_cordon, picked_nodes, planned_state, planned_state_if_any
from gate.lifecycle.round import Round, install_order, round_work, stage_fingerprint, stuck_reason
from gate.lifecycle.serving import ServingCatalog
from gate.lifecycle.work import PackageWork, after_stage

# The interrupts a reboot of the node satisfies: a drain asks for a drained node during the stages.
REBOOT_SATISFIES = frozenset({"reboot", "service", "restartAllServices"})


def staging_steps(gate: NodeGate, state: NodeGateState, catalog: ServingCatalog) -> tuple[Step, ...]:
    """The steps a staging pod runs on the node for its next (or current, not yet cordoned) round, in
    install order (none when the round does not cordon): each package stage with serving steps and,
    when there is one, each other stage of a catalog package without config (but an uninstall), which
    the agent's `--part serving` runs no step of: it places the stage's payload on the host, so the
    window's stage reads it there with no payload copy of its own (`payload_placed`). A staging pod only
    for that is not made: it would cost the node a pod to save a container. A package with config is
    not placed: the operator creates a package's ConfigMap with the round's pods, a staging pod mounts
    none, and the agent refuses a config that is not the one its pod names."""
    if not catalog.serves(gate) or not needs_cordon(gate, state):
        return ()  # no package of the gate stages at its version: asked at every look of every node
    work = round_work(gate, state)
    known = [(name, serving) for name in install_order(gate)
             if (serving := catalog.of(gate, name)) is not None and not work[name].done]
    if not any(stage in serving.lists for name, serving in known for stage in work[name].stages):
        return ()  # nothing serving: no staging pod (and no step's fingerprint taken, at every plan)
    return tuple(step for name, serving in known for step in _package_steps(gate, name, work[name])
                 if step.stage in serving.lists
                 or (step.stage != "uninstall" and not gate.spec.packages[name].config))


def payload_placed(view: StagePod | None, gate: NodeGate, state: NodeGateState) -> list[str]:
    """The round's package stages (`package/stage` keys) whose payload its succeeded staging pod left on the
    host, each for the round's spec of it (the same fingerprint, so the same image): the window's first try
    of each reads it there (`gate.lifecycle.round.run_steps`). None for a roll-back (another spec's images)."""
    if view is None or view.phase != "succeeded" or (state.rollback is not None and not state.rollback.done):
        return []
    ran = {(s.package, s.stage, s.fingerprint) for s in view.steps}
    work = round_work(gate, state)
    return sorted(step.key for name in install_order(gate) if not work[name].done
                  for step in _package_steps(gate, name, work[name])
                  if (step.package, step.stage, step.fingerprint) in ran)


def _package_steps(gate: NodeGate, name: str, work: PackageWork) -> list[Step]:
    """Each stage the round runs of one package, as the step of a pod that runs it whole."""
    pkg = gate.spec.packages[name]
    return [Step(name, stage, stage_fingerprint(pkg, stage), version=pkg.version,
                 previous_version=work.previous_version) for stage in work.stages]


def serving_only(gate: NodeGate, state: NodeGateState, catalog: ServingCatalog) -> bool:
    """Every stage the round runs is serving steps only: staged, the window has nothing but checks."""
    work = round_work(gate, state)
    for name, w in work.items():
        serving = catalog.of(gate, name)
        if any(serving is None or stage not in serving.only for stage in w.stages):
            return False
    return True


def staging_pod_name(gate: str, node: str, steps: Sequence[Step]) -> str:
    key = "\0".join(f"{s.package}/{s.stage}/{s.fingerprint}" for s in steps)
    digest = hashlib.sha256(f"{gate}\0{node}\0{key}".encode()).hexdigest()
    return f"ng-staging-{digest[:20]}"


def undo_pod_name(staging_pod: str) -> str:
    """The undo of a staging pod: named after it, so it is found from it."""
    return staging_pod.replace("ng-staging-", "ng-unstage-", 1)


# ---- the round: before its cordon ----------------------------------------------------------------

def await_staging(r: Round, steps: Sequence[Step], catalog: ServingCatalog, interrupt_type: str) -> Decision | None:
    """Before the cordon: the round's serving steps are staged (its staging pod succeeded), or it waits.
    A staging that failed fails the node here, before anything disrupted it. None once the round may go
    on: to its cordon, or, when the node rebooted on its own since its staging and nothing must run
    drained, straight to its stages (the reboot counts as its interrupt)."""
    ctx, s = r.ctx, r.state
    view = ctx.staging_pod
    if view is not None and view.phase == "succeeded":
        _record_staged_whole(r, staged_whole(ctx.gate, s, catalog, view), view)
        placed = payload_placed(view, ctx.gate, s)
        if placed != s.payload_placed:
            s.payload_placed = placed
            r.changed = True
        rebooted = bool(view.boot_id) and view.boot_id != ctx.node.boot_id and ctx.node.ready
        if (rebooted and interrupt_type in REBOOT_SATISFIES and not s.own_reboot
                and serving_only(ctx.gate, s, catalog)):
            s.own_reboot = ctx.node.boot_id
            r.set_phase("stages")
            r.event("node", "Normal", "RebootCounted", f"The node booted on its own after NodeGate "
                    f"{ctx.gate.name} staged its steps (boot ID {view.boot_id} -> {ctx.node.boot_id}): that "
                    "boot counts as the round's interrupt, and the node is not cordoned")
        return None
    if view is not None and view.phase == "failed":
        return r.fail("StagingFailed", f"staging pod {view.name}: {view.message or 'failed'} (the node was "
                      "not cordoned; what was staged is undone)", stage="staging")
    if view is not None:
        stuck = stuck_reason(view, ctx)
        if stuck:
            return r.fail(stuck[0], f"staging pod {view.name}: {stuck[1]} (the node was not cordoned)",
                          stage="staging")
    current = r.decision.requeue_after
    r.decision.requeue_after = ctx.timing.poll if current is None else min(current, ctx.timing.poll)
    return r.finish_decision()


def staged_whole(gate: NodeGate, state: NodeGateState, catalog: ServingCatalog, view: StagePod) -> tuple[Step, ...]:
    """The round's package stages its succeeded staging pod ran whole, which the window runs no container
    for: every stage left of the package is serving steps only (`Serving.only`: no step must run drained,
    no overlay), the pod ran each for the round's spec (same fingerprint) at the gate's generation, the
    package depends on nothing (its stage never waits for another's), and its own interrupt gives it a
    check after the interrupt in this round: that check's agent takes the staged work over on the host
    (`gate.agent.stage`), and the staging pod already ran the stage's check (`gate.agent.plan`). A
    staging pod whose generation is unknown (an older operator's) stages nothing whole: the window runs
    the stage, skipping the staged steps, as before."""
    if view.phase != "succeeded" or view.generation is None or view.generation != (gate.metadata.generation or 0):
        return ()
    if state.rollback is not None and not state.rollback.done:
        return ()
    ran = {(s.package, s.stage, s.fingerprint) for s in view.steps}
    work = round_work(gate, state)
    out: list[Step] = []
    for name in install_order(gate):
        serving, w = catalog.of(gate, name), work[name]
        if serving is None or w.done or gate.spec.packages[name].depends_on or w.interrupt.type == "none":
            continue
        steps = _package_steps(gate, name, w)
        if all(st.stage in serving.only and (name, st.stage, st.fingerprint) in ran for st in steps):
            out += steps
    return tuple(out)


def _record_staged_whole(r: Round, steps: Sequence[Step], view: StagePod) -> None:
    """Before the cordon, in the write that moves the round past it: the stages staged whole are the
    round's, recorded done as the window's would be (its staging pod is then deleted: `_round_owns_it`)."""
    if not steps:
        return
    s, packages = r.state, r.gate.spec.packages
    installed = dict(s.installed)
    for step in steps:
        assert step.package is not None
        done = after_stage(step.stage, packages[step.package], installed.get(step.package))
        if done is None:
            installed.pop(step.package, None)
        else:
            installed[step.package] = done
    s.installed = installed
    r.changed = True
    names = ", ".join(f"{st.package} {st.stage}" for st in steps)
    r.event("node", "Normal", "StagedWhole", f"NodeGate {r.gate.name}: {names} ran whole in staging pod {view.name} "
            f"while the node served (generation {view.generation}, checks passed): the window runs no container "
            "for them; each package's check after the interrupt takes its staged work over on the host")


# ---- the fleet: which staging and undo pods exist ------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A node whose round's serving steps should be staged before its turn."""

    gate: str
    node: str
    steps: tuple[Step, ...]
    picked: bool  # its round started and waits for its staging before its cordon
    place: int = 0  # its place in its gate's line (0: the first node ahead)

    @property
    def pod(self) -> str:
        return staging_pod_name(self.gate, self.node, self.steps)


@dataclass(frozen=True)
class GateStaging:
    """One gate's part of the fleet-wide plan."""

    candidates: tuple[Candidate, ...] = ()
    taken_over: frozenset[str] = frozenset()  # nodes whose round passed its cordon: it owns the staged work
    keep: bool = False  # paused: what is staged stays, nothing more is staged
    deleting: bool = False  # the gate is being deleted: every staging not taken over is undone


StagingKind = Literal["staging", "undo"]


@dataclass(frozen=True)
class StagingPod:
    """A staging or undo pod as the planner needs it."""

    name: str
    gate: str
    node: str
    kind: StagingKind
    phase: Literal["pending", "running", "succeeded", "failed"] = "pending"
    deleting: bool = False

    @property
    def ended(self) -> bool:
        return self.phase in ("succeeded", "failed")


@dataclass
class StagingPlan:
    create: list[Candidate] = field(default_factory=list)
    undo: list[StagingPod] = field(default_factory=list)  # staging pods whose undo pod to create
    delete: list[str] = field(default_factory=list)
    undo_failed: list[StagingPod] = field(default_factory=list)  # undos that failed: for a person to see


def candidates(gate: NodeGate, picked: Mapping[str, NodeGateState], ahead: Iterable[tuple[str, NodeGateState]], *,
               catalog: ServingCatalog, limit_ahead: int) -> tuple[Candidate, ...]:
    """The gate's candidates: its picked nodes whose round waits for its staging (phase idle, in
    progress, will cordon), then the next `limit_ahead` nodes of `ahead` (its line, in pick order, the
    waits that clear by themselves: `gate.lifecycle.prepull.AHEAD_REASONS`) with serving steps to stage.
    Paused gates stage ahead for nobody."""
    if not catalog.serves(gate):
        return ()  # `staging_steps` would say so for each node: not walked
    out = []
    for node, state in sorted(picked.items()):
        if state.status != "in-progress" or state.phase != "idle" or (state.rollback and not state.rollback.done):
            continue
        steps = staging_steps(gate, state, catalog)
        if steps:
            out.append(Candidate(gate.name, node, steps, picked=True))
    if gate.spec.paused:
        return tuple(out)
    place = 0
    for node, state in ahead:
        if place >= limit_ahead:
            break
        if node in picked or state.status == "failed":
            continue
        steps = staging_steps(gate, state, catalog)
        if steps:
            out.append(Candidate(gate.name, node, steps, picked=False, place=place))
            place += 1
    return tuple(out)


def gate_staging(gate: NodeGate, gplan: GatePlan, states: Mapping[str, NodeGateState | None], *,
                 catalog: ServingCatalog, ahead: int) -> GateStaging:
    """A gate's part of the fleet-wide plan, from its plan (`gate.lifecycle.fleet.plan_gate`): its
    candidates (picked nodes waiting for their staging, then the next `ahead` of its line, as prepull's
    `candidates` reads the line), the nodes whose round passed its cordon, whether it keeps what is staged
    (paused) and whether it is being deleted. `states`: each node's state as recorded; the plan's updates
    (picks just made) take precedence."""

    picked = {n: planned_state(gplan, states, n) for n in picked_nodes(gplan)}
    # Each of these walks the gate's whole line or fleet at every plan: only as far as it must (a gate with
    # nothing to stage had them take a sixth of the operator's CPU at 3,000 nodes; bench/README.md).
    # The line is read lazily: `candidates` walks none of it for a gate that serves nothing.
    line = () if gplan.rollout is None else \
        ((node, planned_state(gplan, states, node)) for node, wait in gplan.rollout.waits.items()
         if wait.reason in AHEAD_REASONS)
    # A node with no state yet has nothing its round took over.
    taken = frozenset(n for n in {*states, *picked}
                      if (state := planned_state_if_any(gplan, states, n)) is not None and _round_owns_it(state))
    return GateStaging(candidates(gate, picked, line, catalog=catalog, limit_ahead=ahead), taken_over=taken,
                       keep=gate.spec.paused, deleting=gate.metadata.deletion_timestamp is not None)


@dataclass(frozen=True)
class StagingAhead:
    """What a gate's plan needs to name its staging candidates; the operator passes none while staging is off."""

    catalog: ServingCatalog
    ahead: int


# Failures of a round before its cordon: what was staged is still the fleet's to undo.
_BEFORE_CORDON = frozenset({"staging", "prepull"})


def _round_owns_it(state: NodeGateState) -> bool:
    """The node's round took over what was staged for it: it passed its cordon (its phase is past idle), or
    it is over, complete or failed past its cordon (its own failure, retry or roll-back deals with the
    staged work). A node whose staging failed, or whose images could not be pulled, never passed its
    cordon: its staging is undone."""
    if state.status == "failed":
        return state.failure is not None and state.failure.stage not in _BEFORE_CORDON
    return state.status == "complete" or state.phase != "idle"


def plan_stagings(by_gate: Mapping[str, GateStaging], pods: Sequence[StagingPod], limit: int) -> StagingPlan:
    """Which staging and undo pods to create and delete, over every gate. `by_gate`: the gates whose plan
    is known (a gate not planned yet keeps its pods, which count against the bound); `pods`: every
    staging and undo pod that exists; `limit`: at most this many that have not ended exist at once."""
    plan = StagingPlan()
    undos = {p.name: p for p in pods if p.kind == "undo"}
    busy_nodes = {(p.gate, p.node) for p in pods}  # one pod of a (gate, node) at a time, but its undo
    wanted = {c.pod for g in by_gate.values() for c in g.candidates}
    running = sum(1 for p in pods if not p.ended)
    room = limit - running
    for pod in pods:
        if pod.kind != "staging" or pod.deleting or pod.gate not in by_gate:
            continue
        gate = by_gate[pod.gate]
        undo = undos.get(undo_pod_name(pod.name))
        if pod.node in gate.taken_over and undo is None:
            plan.delete.append(pod.name)  # the round owns the staged work now
            continue
        if undo is not None:
            if undo.phase == "succeeded":
                plan.delete += [pod.name, undo.name]
            elif undo.phase == "failed":
                plan.undo_failed.append(undo)
            continue
        if pod.name in wanted or (gate.keep and not gate.deleting) or not pod.ended:
            continue  # still wanted, kept while paused, or running: never cut, undone once it ended
        if room > 0:
            plan.undo.append(pod)
            room -= 1
    existing = {p.name for p in pods}
    ordered = sorted((c for g in by_gate.values() if not g.deleting for c in g.candidates),
                     key=lambda c: (not c.picked, c.place, c.gate, c.node))
    for cand in ordered:
        if room <= 0:
            break
        if cand.pod in existing or (cand.gate, cand.node) in busy_nodes:
            continue
        plan.create.append(cand)
        busy_nodes.add((cand.gate, cand.node))
        room -= 1
    return plan


def gate_may_go(gate: str, pods: Iterable[StagingPod]) -> bool:
    """A deleted gate's finalizer waits until none of its staging or undo pods is left: what it staged on
    a serving node is undone first."""
    return not any(p.gate == gate for p in pods)


__all__ = [
    "REBOOT_SATISFIES",
    "Candidate",
    "GateStaging",
    "StagingAhead",
    "StagingPlan",
    "StagingPod",
    "await_staging",
    "candidates",
    "gate_may_go",
    "gate_staging",
    "payload_placed",
    "plan_stagings",
    "serving_only",
    "staged_whole",
    "staging_pod_name",
    "staging_steps",
    "undo_pod_name",
]
