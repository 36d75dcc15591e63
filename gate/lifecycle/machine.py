"""The per-node state machine of one gate: one idempotent step at a time, decided without I/O.

A round on a node runs through phases:

    cordon -> wait-pods -> drain -> stages -> interrupt -> post-interrupt -> finish
    (cordon, wait-pods and drain only when this round needs an interrupt; interrupt and
     post-interrupt only when it does; an interrupt of type drain runs no interrupt Job)

The removal of a deleted gate runs the same phases on a node, with uninstall stages, and after the
interrupt each uninstalled package's post-uninstall check (`decide_removal`).

`decide` reads the world (the gate, the node, this gate's state on the node, the stage Jobs, the
pods on the node) and returns what to do next: a new state and node changes to write in one request,
Jobs to create or delete, pods to evict, events, and when to look again. The executor performs it.
Everything the next step depends on is either in the state annotation or in an object with a
deterministic name, so running `decide` again after a crash at any point does the same thing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from gate.api import keys
from gate.api.common import parse_duration
from gate.api.nodegate import Interrupt, NodeGate, Package
from gate.api.state import (
    PACKAGE_STAGES,
    Failure,
    Installed,
    NodeGateState,
    Phase,
    Stage,
    config_hash,
    failure_message,
    rollout_hash,
    spec_hash,
)
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.dag import topological_order
from gate.lifecycle.interrupts import merge
from gate.lifecycle.work import PackageWork, after_stage, constraint_satisfied, package_work

JobPhase = Literal["pending", "running", "succeeded", "failed"]


@dataclass(frozen=True)
class JobView:
    """A stage Job as the decider needs it (the executor builds this from the Job and its pod)."""

    name: str
    phase: JobPhase
    message: str = ""  # why it failed: the agent's summary from the termination message, or the Job's reason
    waiting_reason: str = ""  # the pod's container waiting reason (ErrImagePull, ImagePullBackOff, ...)
    waiting_since: datetime | None = None  # since when the pod is stuck in that reason
    created: datetime | None = None
    package: str | None = None  # from the Job's labels
    stage: str = ""
    # False while only the pod shows the success: the Job controller records it a moment later.
    settled: bool = True


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    labels: Mapping[str, str]
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    daemonset: bool = False
    mirror: bool = False
    empty_dir: bool = False
    deleting: bool = False
    ours: bool = False  # a NodeGate package pod: never evicted

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    boot_id: str
    ready: bool
    taints: tuple[tuple[str, str], ...] = ()  # (key, effect)
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)  # NodeGate's own, by type

    @property
    def cordoned_by(self) -> str | None:
        return self.annotations.get(keys.CORDONED_BY)

    @property
    def has_readiness_taint(self) -> bool:
        return any(k == keys.READINESS_TAINT_KEY for k, _ in self.taints)


@dataclass(frozen=True)
class Timing:
    """Operator settings the decider needs (durations in seconds)."""

    image_pull_grace: float = 120.0  # ErrImagePull/ImagePullBackOff this long -> stage failed
    pending_timeout: float = 600.0  # a stage pod not running after this long -> stage failed
    reboot_timeout: float = 900.0  # no new bootID and Ready after a reboot interrupt -> failed
    poll: float = 5.0  # how often to look again while waiting on pods or drains


@dataclass(frozen=True)
class JobRequest:
    """A stage Job to create; the controller renders the manifest."""

    name: str
    stage: Stage
    package: str | None  # None for the interrupt
    version: str | None = None
    previous_version: str | None = None
    interrupt: Interrupt | None = None


@dataclass(frozen=True)
class EventRequest:
    target: Literal["gate", "node"]
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class NodeChange:
    """Changes to the Node, written in one request together with the state annotation."""

    unschedulable: bool | None = None
    cordoned_by: str | None = None  # set the annotation to this value
    clear_cordoned_by: bool = False
    add_readiness_taint: bool = False
    remove_readiness_taint: bool = False
    status: keys.NodeStatus | None = None  # the status.<gate> label

    def empty(self) -> bool:
        return self == NodeChange()


@dataclass
class Decision:
    state: NodeGateState | None = None  # None: leave the annotation as it is
    node: NodeChange = field(default_factory=NodeChange)
    create_jobs: list[JobRequest] = field(default_factory=list)
    delete_jobs: list[str] = field(default_factory=list)
    evict: list[tuple[str, str]] = field(default_factory=list)
    events: list[EventRequest] = field(default_factory=list)
    requeue_after: float | None = None
    remove_state: bool = False  # drop the gate's annotation and label (the gate is being deleted)

    @property
    def writes_node(self) -> bool:
        return self.state is not None or not self.node.empty()


@dataclass(frozen=True)
class NodeContext:
    gate: NodeGate
    node: NodeView
    state: NodeGateState
    jobs: Mapping[str, JobView]  # this gate's stage Jobs on this node, by name
    pods: Sequence[PodView] | None  # pods on the node; None when not loaded (only needed to drain)
    now: datetime
    readiness_clear: bool = True  # every other readinessTaint gate selecting the node is complete
    timing: Timing = Timing()
    release: bool = True  # removal: a node that uninstalled may be released (its batch was judged)


def job_name(gate: str, node: str, round_: int, package: str | None, stage: str, fingerprint: str = "") -> str:
    """Deterministic: the same step of the same round always has the same Job, so a crash between
    creating a Job and recording it can never run a stage twice."""
    digest = hashlib.sha256(f"{gate}\0{node}\0{round_}\0{package}\0{stage}\0{fingerprint}".encode()).hexdigest()
    label = stage.replace("post-interrupt", "post")
    return f"ng-{label}-{digest[:20]}"


def stage_fingerprint(package: Package, stage: Stage) -> str:
    if stage == "config":
        return config_hash(package)
    return f"{package.version}/{spec_hash(package)}"


def _since(ts: str | None, now: datetime) -> float:
    if not ts:
        return 0.0
    return (now - datetime.fromisoformat(ts)).total_seconds()


def _iso(now: datetime) -> str:
    return now.isoformat()


class _Round:
    """Helpers over one decision in progress."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.gate = ctx.gate
        # Shallow: every change below assigns a new value (lists and dicts are replaced, never
        # mutated in place), so the caller's state is never touched. A deep copy per look was the
        # largest cost of a reconcile.
        self.state = ctx.state.model_copy()
        self.decision = Decision()
        self.changed = False

    def set_phase(self, phase: Phase) -> None:
        self.state.phase = phase
        self.state.phase_since = _iso(self.ctx.now)
        self.changed = True

    def event(self, target: Literal["gate", "node"], type_: Literal["Normal", "Warning"], reason: str,
              message: str) -> None:
        self.decision.events.append(EventRequest(target, type_, reason, message))

    def fail(self, reason: str, message: str, *, package: str | None = None, stage: str = "") -> Decision:
        self.state.status = "failed"
        self.state.failure = Failure(package=package, stage=stage or self.state.phase, reason=reason,
                                     message=message[:1000], generation=self.gate.metadata.generation or 0,
                                     rollout_hash=rollout_hash(self.gate))
        self.changed = True
        self.decision.node.status = "failed"
        where = f"package {package} stage {stage}" if package else f"step {stage or self.state.phase}"
        text = f"Node {self.ctx.node.name} failed in {where}: {reason}: {failure_message(message)}"
        self.event("node", "Warning", reason, text)
        self.event("gate", "Warning", reason, text)
        return self.finish_decision()

    def finish_decision(self) -> Decision:
        if self.changed:
            self.decision.state = self.state
        return self.decision

    def job_name(self, package: str | None, stage: str, fingerprint: str = "") -> str:
        return job_name(self.gate.name, self.ctx.node.name, self.state.round, package, stage, fingerprint)


def round_work(gate: NodeGate, state: NodeGateState) -> dict[str, PackageWork]:
    return {name: package_work(name, pkg, state.installed.get(name)) for name, pkg in gate.spec.packages.items()}


def pending_work(gate: NodeGate, state: NodeGateState) -> bool:
    """Whether the spec asks for anything that is not on the node yet."""
    return any(not w.done for w in round_work(gate, state).values())


def decide(ctx: NodeContext) -> Decision:
    """The next step for a node that is in progress for this gate."""
    r = _Round(ctx)
    s = r.state
    if s.status != "in-progress":
        return r.finish_decision()
    work = round_work(ctx.gate, s)
    required = _require(r, {n: w.interrupt for n, w in work.items() if not w.done})
    needs_interrupt = required.type != "none"
    paused = ctx.gate.spec.paused

    if s.phase in ("cordon", "wait-pods", "drain") and not needs_interrupt:
        r.set_phase("stages")
    outcome = _phases(r, required, paused, lambda: _stages(r, work, paused))
    if outcome is not None:
        return outcome

    if s.phase == "finish":
        if _unsettled(r):
            return r.finish_decision()
        _finish(r)
    return r.finish_decision()


def _require(r: _Round, asked: Mapping[str, Interrupt]) -> Interrupt:
    """The round's interrupt: the strongest of what it already needs and what the packages with work
    left ask for; those asking for one are recorded, for their checks after it."""
    s = r.state
    required = merge([s.interrupt, *asked.values()])
    if required != (s.interrupt or Interrupt()):
        s.interrupt = required if required.type != "none" else None
        s.interrupted = sorted(set(s.interrupted) | {n for n, i in asked.items() if i.type != "none"})
        r.changed = True
    return required


def _phases(r: _Round, required: Interrupt, paused: bool, stages: Callable[[], Decision | None]) -> Decision | None:
    """The phases of a round up to its finish, for an install round (`stages` runs the package stages)
    and a removal round (the uninstalls) alike. Returns a decision while the round is under way, None
    once it reached `finish`."""
    s = r.state
    needs_interrupt = required.type != "none"
    if s.phase == "idle":
        r.set_phase("cordon" if needs_interrupt else "stages")
    if s.phase in ("cordon", "wait-pods", "drain"):
        outcome = _prepare(r, required, paused)
        if outcome is not None:
            return outcome
    if s.phase == "stages":
        outcome = stages()
        if outcome is not None:
            return outcome
        if needs_interrupt:
            s.boot_id = r.ctx.node.boot_id
            r.set_phase("interrupt")
        else:
            r.set_phase("finish")
    if s.phase == "interrupt":
        outcome = _interrupt(r, required, paused)
        if outcome is not None:
            return outcome
        r.set_phase("post-interrupt")
    if s.phase == "post-interrupt":
        outcome = _post_interrupt(r, paused)
        if outcome is not None:
            return outcome
        r.set_phase("finish")
    return None


def _prepare(r: _Round, required: Interrupt, paused: bool) -> Decision | None:
    """Cordon, wait for protected pods, drain: the phases before an interrupt, of an install round and
    of a removal alike. Returns a decision while they last, None once the node is drained (the phase
    is then `stages`)."""
    ctx, s = r.ctx, r.state
    if s.phase == "cordon":
        if paused:
            return r.finish_decision()
        node = ctx.node
        if not node.unschedulable:
            r.decision.node.unschedulable = True
            r.decision.node.cordoned_by = ctx.gate.name
            s.cordoned = True
            r.event("node", "Normal", "Cordoned", f"NodeGate {ctx.gate.name} cordoned the node for a "
                    f"{required.type} interrupt")
        elif node.cordoned_by == ctx.gate.name:
            s.cordoned = True
        r.set_phase("wait-pods")
        r.decision.requeue_after = 0.0
        return r.finish_decision()

    if s.phase == "wait-pods":
        selector = ctx.gate.spec.pod_non_interrupt_labels
        if selector is not None and not selector.is_empty():
            if ctx.pods is None:
                r.decision.requeue_after = 0.0
                return r.finish_decision()
            protected = [p for p in ctx.pods if not p.terminal and not p.ours and selector.matches(dict(p.labels))]
            if protected:
                names = ", ".join(f"{p.namespace}/{p.name}" for p in protected[:5])
                limit = ctx.gate.spec.wait_timeout
                if limit and _since(s.phase_since, ctx.now) >= parse_duration(limit).total_seconds():
                    return r.fail("WaitTimeout", f"protected pods still running after {limit}: {names}")
                r.decision.requeue_after = ctx.timing.poll
                return r.finish_decision()
        r.set_phase("drain")

    if s.phase == "drain":
        if ctx.pods is None:
            r.decision.requeue_after = 0.0
            return r.finish_decision()
        if paused:
            return r.finish_decision()
        evictable = [p for p in ctx.pods if not (p.terminal or p.daemonset or p.mirror or p.ours)]
        if not evictable:
            if s.drain_blocked_by:
                s.drain_blocked_by = None
            r.event("node", "Normal", "Drained", f"NodeGate {ctx.gate.name} drained the node")
            r.set_phase("stages")
            return None
        if not ctx.gate.spec.drain.delete_empty_dir_data:
            local = [p for p in evictable if p.empty_dir]
            if local:
                return r.fail("DrainRefused", f"pod {local[0].namespace}/{local[0].name} uses emptyDir "
                              "data; set spec.drain.deleteEmptyDirData: true to evict it")
        timeout = parse_duration(ctx.gate.spec.drain.timeout).total_seconds()
        if _since(s.phase_since, ctx.now) >= timeout:
            blocked = s.drain_blocked_by or "pods that did not terminate"
            return r.fail("DrainTimeout", f"drain did not finish within {ctx.gate.spec.drain.timeout}; "
                          f"blocked by {blocked}")
        r.decision.evict = [(p.namespace, p.name) for p in evictable if not p.deleting]
        r.decision.requeue_after = drain_retry_after(_since(s.phase_since, ctx.now), timeout,
                                                     blocked=bool(s.drain_blocked_by))
        return r.finish_decision()
    return None


def _stages(r: _Round, work: Mapping[str, PackageWork], paused: bool) -> Decision | None:
    """Run package stages in dependency order. Returns a decision while work remains, None when done.

    Finished stages are recorded and the next ones started in the same decision: the executor writes
    the node (with the new `installed`) before it creates Jobs, so a crash in between only means
    the Jobs are created by the next look, under the same names.
    """
    ctx, s, gate = r.ctx, r.state, r.gate
    packages = gate.spec.packages
    order = topological_order({n: set(p.depends_on) for n, p in packages.items()})
    finished: set[str] = set()
    busy = _stale_stage_jobs(r, work)
    while True:
        running = len(busy)
        starts: list[tuple[str, Stage]] = []
        recorded = False
        for name in order:
            w = work[name]
            stage = w.next_stage
            if stage is None or name in busy:
                continue
            pkg = packages[name]
            job = r.job_name(name, stage, stage_fingerprint(pkg, stage))
            view = ctx.jobs.get(job)
            if view is None or job in finished:
                starts.append((name, stage))
                continue
            if view.phase == "succeeded":
                s.installed = dict(s.installed)
                record = after_stage(stage, pkg, s.installed.get(name))
                if record is None:
                    s.installed.pop(name, None)
                else:
                    s.installed[name] = record
                r.changed = recorded = True
                r.decision.delete_jobs.append(job)
                finished.add(job)
                continue
            if view.phase == "failed":
                return r.fail("StageFailed", view.message or "the stage Job failed", package=name, stage=stage)
            stuck = _stuck(view, ctx)
            if stuck:
                return r.fail(stuck[0], stuck[1], package=name, stage=stage)
            _look_again_for(r, view)
            running += 1
        if not recorded:
            break
        work = round_work(gate, s)  # what is left after the stages just recorded
    if not starts and running == 0:
        return None
    if paused:
        return r.finish_decision()
    blocked: list[str] = []
    for name, stage in starts:
        if gate.spec.serial and (running or r.decision.create_jobs):
            break
        deps = packages[name].depends_on
        waiting_on = [d for d in deps if d in work and not _dep_ready(d, deps[d], work, s.installed)]
        if waiting_on:
            blocked.append(name)
            continue
        pkg = packages[name]
        r.decision.create_jobs.append(JobRequest(
            r.job_name(name, stage, stage_fingerprint(pkg, stage)), stage, name, version=pkg.version,
            previous_version=work[name].previous_version,
        ))
    if not r.decision.create_jobs and running == 0 and blocked:
        missing = ", ".join(blocked)
        return r.fail("DependencyUnsatisfied", f"{missing} wait for dependencies whose installed version does "
                      "not satisfy the constraint", package=blocked[0], stage="apply")
    return r.finish_decision()


def _stale_stage_jobs(r: _Round, work: Mapping[str, PackageWork]) -> set[str]:
    """Packages with a stage Job from an earlier spec still running on the node.

    The spec changed under a running stage (a new version, say): the new stage waits until the old
    one ends, so two stages of one package never run on a host at once. Ended stale Jobs are removed.
    """
    busy: set[str] = set()
    packages = r.gate.spec.packages
    for view in r.ctx.jobs.values():
        if view.package is None or view.stage not in PACKAGE_STAGES:
            continue
        pkg = packages.get(view.package)
        w = work.get(view.package)
        current = None
        if pkg is not None and w is not None and w.next_stage is not None:
            current = r.job_name(view.package, w.next_stage, stage_fingerprint(pkg, w.next_stage))
        if view.name == current:
            continue
        if view.phase in ("pending", "running"):
            busy.add(view.package)
        elif view.name not in r.decision.delete_jobs:
            r.decision.delete_jobs.append(view.name)
    return busy


def _dep_ready(dep: str, constraint: str, work: Mapping[str, PackageWork], installed: Mapping[str, Installed]) -> bool:
    if not work[dep].done:
        return False
    record = installed.get(dep)
    return record is not None and constraint_satisfied(constraint, record.version)


def _stuck(view: JobView, ctx: NodeContext) -> tuple[str, str] | None:
    if view.waiting_reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
        since = view.waiting_since or view.created
        if since is None or (ctx.now - since).total_seconds() >= ctx.timing.image_pull_grace:
            return "ImagePullFailed", f"the stage image cannot be pulled: {view.waiting_reason}: {view.message}"
    if view.phase == "pending" and view.created is not None:
        if (ctx.now - view.created).total_seconds() >= ctx.timing.pending_timeout:
            return "StagePending", f"the stage pod did not start within {ctx.timing.pending_timeout:.0f}s: " + (
                view.waiting_reason or view.message or "pending")
    return None


def _look_again_for(r: _Round, view: JobView) -> None:
    """A Job that may turn out stuck is looked at again when its grace runs out: no event may come."""
    timing = r.ctx.timing
    if view.waiting_reason:
        since = view.waiting_since or view.created or r.ctx.now
        due = timing.image_pull_grace - (r.ctx.now - since).total_seconds()
    elif view.phase == "pending" and view.created is not None:
        due = timing.pending_timeout - (r.ctx.now - view.created).total_seconds()
    else:
        return
    due = max(0.1, due + 0.05)
    current = r.decision.requeue_after
    r.decision.requeue_after = due if current is None else min(current, due)


def _interrupt(r: _Round, required: Interrupt, paused: bool) -> Decision | None:
    ctx, s = r.ctx, r.state
    if required.type in ("none", "drain"):
        return None  # a drain is done by now (cordon, wait-pods, drain): no interrupt Job
    name = _interrupt_job(r, required)
    view = ctx.jobs.get(name)
    if required.type == "reboot":
        rebooted = bool(s.boot_id) and ctx.node.boot_id != s.boot_id
        if rebooted and ctx.node.ready and (view is None or view.phase != "running"):
            if view is not None:
                r.decision.delete_jobs.append(name)
            r.event("node", "Normal", "Rebooted", f"The node came back with a new boot ID after NodeGate "
                    f"{ctx.gate.name}'s reboot")
            return None
        if view is None:
            if rebooted:  # rebooted but not Ready yet
                r.decision.requeue_after = ctx.timing.poll
                return r.finish_decision()
            if paused:
                return r.finish_decision()
            r.decision.create_jobs.append(JobRequest(name, "interrupt", None, interrupt=required))
            r.event("node", "Normal", "Interrupting", f"NodeGate {ctx.gate.name} is rebooting the node")
            return r.finish_decision()
        if view.phase == "failed" and not rebooted:
            return r.fail("InterruptFailed", view.message or "the reboot Job failed", stage="interrupt")
        if _since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
            return r.fail("RebootTimeout", f"no new boot ID and Ready within {ctx.timing.reboot_timeout:.0f}s",
                          stage="interrupt")
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    if view is None:
        if paused:
            return r.finish_decision()
        r.decision.create_jobs.append(JobRequest(name, "interrupt", None, interrupt=required))
        return r.finish_decision()
    if view.phase == "succeeded":
        r.decision.delete_jobs.append(name)
        return None
    if view.phase == "failed":
        return r.fail("InterruptFailed", view.message or "the interrupt Job failed", stage="interrupt")
    stuck = _stuck(view, ctx)
    if stuck:
        return r.fail(stuck[0], stuck[1], stage="interrupt")
    _look_again_for(r, view)
    return r.finish_decision()


def _post_interrupt(r: _Round, paused: bool) -> Decision | None:
    ctx, s, gate = r.ctx, r.state, r.gate
    todo = [p for p in s.interrupted if p in gate.spec.packages and p not in s.post_checked]
    if not todo:
        return None
    waiting = False
    for name in todo:
        stage = _check_after_interrupt(s, name)
        job = r.job_name(name, stage, gate.spec.packages[name].version)
        view = ctx.jobs.get(job)
        if view is None:
            if not paused:
                pkg = gate.spec.packages[name]
                r.decision.create_jobs.append(JobRequest(job, stage, name, version=pkg.version))
            waiting = True
        elif view.phase == "succeeded":
            s.post_checked = sorted({*s.post_checked, name})
            r.changed = True
            r.decision.delete_jobs.append(job)
        elif view.phase == "failed":
            reason = "PostUninstallCheckFailed" if stage == "post-uninstall" else "PostInterruptCheckFailed"
            return r.fail(reason, view.message or f"the {stage} check failed", package=name, stage=stage)
        else:
            stuck = _stuck(view, ctx)
            if stuck:
                return r.fail(stuck[0], stuck[1], package=name, stage=stage)
            _look_again_for(r, view)
            waiting = True
    if waiting:
        return r.finish_decision()
    return None  # every check passed: finish in this same step


def _check_after_interrupt(state: NodeGateState, package: str) -> Stage:
    """A package this round uninstalled proves it is gone (post-uninstall); one it installed, upgraded
    or configured proves the change is live (post-interrupt)."""
    return "post-interrupt" if package in state.installed else "post-uninstall"


def _finish(r: _Round) -> None:
    ctx, s = r.ctx, r.state
    if not pending_work(ctx.gate, s):
        # Complete for this spec. When the spec changed during the round the round's own (older)
        # generation and hash stay, so the gate-level plan sees the remaining work and picks the node
        # again for a fresh round.
        s.generation = ctx.gate.metadata.generation or s.generation
        s.rollout_hash = rollout_hash(ctx.gate)
    s.passed = True
    s.failure = None
    s.reruns = {}
    _complete_round(r)
    change = r.decision.node
    if ctx.node.has_readiness_taint and ctx.readiness_clear and ctx.gate.spec.readiness_taint:
        change.remove_readiness_taint = True
        r.event("node", "Normal", "ReadinessTaintRemoved", "Every readinessTaint gate is complete on the node")
    r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node")


def _complete_round(r: _Round) -> None:
    """The end of a round that went through, install or removal: the node complete, the round's
    interrupt bookkeeping cleared, this round's cordon undone."""
    ctx, s = r.ctx, r.state
    s.status = "complete"
    s.phase = "idle"
    s.phase_since = _iso(ctx.now)
    s.interrupt = None
    s.interrupted = []
    s.post_checked = []
    s.drain_blocked_by = None
    s.boot_id = ctx.node.boot_id
    r.changed = True
    r.decision.node.status = "complete"
    _uncordon(r)


def _uncordon(r: _Round) -> None:
    """Undo this round's cordon; a node a person cordoned (no `cordoned-by` of the gate) stays cordoned."""
    ctx, s, change = r.ctx, r.state, r.decision.node
    if s.cordoned and ctx.node.unschedulable and ctx.node.cordoned_by == ctx.gate.name:
        change.unschedulable = False
        change.clear_cordoned_by = True
        r.event("node", "Normal", "Uncordoned", f"NodeGate {ctx.gate.name} uncordoned the node")
    elif ctx.node.cordoned_by == ctx.gate.name:
        change.clear_cordoned_by = True
    s.cordoned = False


def decide_removal(ctx: NodeContext) -> Decision:
    """The gate is being deleted: let running stages end, uninstall what allows it, then leave the node
    as NodeGate found it: uncordoned (if NodeGate cordoned it), untainted (unless another readinessTaint
    gate still needs the taint), without this gate's keys.

    Once the removal's planner (`gate.lifecycle.removal`) picked the node, the uninstall is a round
    like an install's: cordon, wait for protected pods and drain when an uninstall needs an interrupt
    (`uninstall.interrupt`, else the package's own), the uninstalls (dependents before what they
    depend on), the interrupt, each uninstalled package's post-uninstall check, the uncordon."""
    r = _Round(ctx)
    s = r.state
    gate = ctx.gate
    # Stages of the last round: a running one finishes first, even on a failed node (another
    # package's stage may still be changing the host): a host change is never cut off half way, and
    # the node is not uncordoned under it. Stuck ones (image pull, never started) will not finish and
    # are removed with the rest. One whose pod is done counts as running until its Job records it.
    own = _removal_jobs(r) if s.removing else set()
    leftovers = [v for v in ctx.jobs.values() if v.name not in own]
    running = [v for v in leftovers
               if (v.phase in ("pending", "running") and _stuck(v, ctx) is None) or not v.settled]
    if running:
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    r.decision.delete_jobs.extend(v.name for v in leftovers)
    reset = keys.reset_annotation(gate.name) in ctx.node.annotations
    if reset:
        # A person reset the node (after a failed uninstall, say, fixed by hand): what the gate installed
        # there is forgotten, so nothing is uninstalled, and the node is released below.
        s.installed = {}
        s.interrupted = []
        r.changed = True
        r.decision.delete_jobs.extend(n for n in own if n in ctx.jobs)
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
    if _unsettled(r):
        return r.finish_decision()
    r.decision.remove_state = True
    r.decision.state = None
    change = r.decision.node
    if ctx.node.cordoned_by == gate.name:
        change.clear_cordoned_by = True
        if ctx.node.unschedulable:
            change.unschedulable = False
    if ctx.node.has_readiness_taint and gate.spec.readiness_taint and ctx.readiness_clear:
        change.remove_readiness_taint = True
    r.event("node", "Normal", "Released", f"NodeGate {gate.name} was deleted; its keys were removed from the node")
    return r.decision


def _to_uninstall(gate: NodeGate, state: NodeGateState) -> list[str]:
    return sorted(n for n, p in gate.spec.packages.items() if p.uninstall.enabled and n in state.installed)


def _uninstall_job(r: _Round, package: str) -> str:
    return r.job_name(package, "uninstall", "gate-deleted")


def _interrupt_job(r: _Round, interrupt: Interrupt) -> str:
    return r.job_name(None, "interrupt", f"{interrupt.type}:{','.join(interrupt.services)}")


def _removal_jobs(r: _Round) -> set[str]:
    """The Jobs a removal round runs on the node (all others are left over from an install round)."""
    s, packages = r.state, r.gate.spec.packages
    names = {_uninstall_job(r, n) for n in packages}
    if s.interrupt is not None:
        names.add(_interrupt_job(r, s.interrupt))
    names |= {r.job_name(n, "post-uninstall", packages[n].version) for n in s.interrupted if n in packages}
    return names


def _removal_round(r: _Round) -> Decision | None:
    """A picked node's removal round; None once it completed (uncordoned, its status complete)."""
    s, gate = r.state, r.gate
    paused = gate.spec.paused
    if paused and s.phase == "idle":
        return r.finish_decision()  # nothing started: the unpause (a spec change) brings the node back
    packages = gate.spec.packages
    todo = _to_uninstall(gate, s)
    required = _require(r, {n: packages[n].uninstall_interrupt() for n in todo})
    outcome = _phases(r, required, paused, lambda: _uninstalls(r, todo, paused))
    if outcome is not None:
        return outcome
    if _unsettled(r):
        return r.finish_decision()
    _complete_round(r)
    r.event("node", "Normal", "Uninstalled", f"NodeGate {gate.name} was deleted: its packages are uninstalled")
    return None


def _uninstalls(r: _Round, todo: Sequence[str], paused: bool) -> Decision | None:
    """The uninstall stages of a removal round, each package after the packages that depend on it (and
    one at a time on a serial gate). Returns a decision while any is left, None when all are done."""
    ctx, s, gate = r.ctx, r.state, r.gate
    packages = gate.spec.packages
    order = [n for n in reversed(topological_order({n: set(p.depends_on) for n, p in packages.items()}))
             if n in todo]
    left = set(order)
    running = 0
    for name in order:
        job = _uninstall_job(r, name)
        view = ctx.jobs.get(job)
        if view is None:
            continue
        if view.phase == "succeeded":
            s.installed = {k: v for k, v in s.installed.items() if k != name}
            left.discard(name)
            r.changed = True
            r.decision.delete_jobs.append(job)
        elif view.phase == "failed":
            return r.fail("UninstallFailed", f"{view.message or 'the uninstall Job failed'}; the gate keeps "
                          "its finalizer until the node is fixed and reset", package=name, stage="uninstall")
        else:
            stuck = _stuck(view, ctx)
            if stuck:
                return r.fail(stuck[0], stuck[1], package=name, stage="uninstall")
            _look_again_for(r, view)
            running += 1
    if not left:
        return None
    if not paused:
        for name in order:
            job = _uninstall_job(r, name)
            if name not in left or job in ctx.jobs:
                continue
            if any(name in packages[other].depends_on for other in left if other != name):
                continue  # what depends on it goes first
            if gate.spec.serial and (running or r.decision.create_jobs):
                break
            r.decision.create_jobs.append(JobRequest(job, "uninstall", name, version=s.installed[name].version))
    return r.finish_decision()


def _unsettled(r: _Round) -> bool:
    """Jobs this step deletes whose pods are done but which have not recorded their end: the node is
    let go in the next step, once they are gone, so no Job is ever seen running on a released node."""
    if any(not r.ctx.jobs[n].settled for n in r.decision.delete_jobs if n in r.ctx.jobs):
        r.decision.requeue_after = r.ctx.timing.poll
        return True
    return False


def drain_retry_after(waited: float, timeout: float, *, blocked: bool) -> float:
    """When to try evicting again. Pods still terminating: in a second. Refused by a disruption
    budget (429): back off with the time already waited (a quarter of it, from 1 s up to 30 s), so a
    long-blocked drain does not hammer the API server, yet never past the drain timeout."""
    if not blocked:
        return 1.0
    return max(1.0, min(30.0, waited / 4, timeout - waited))


def start_round(state: NodeGateState, *, gate: NodeGate, batch: int, compartment: str, boot_id: str,
                now: datetime) -> NodeGateState:
    """The state of a node the planner just picked: a new round (new Job names), in progress."""
    s = state.model_copy(deep=True)
    s.status = "in-progress"
    s.round += 1
    s.batch = batch
    s.compartment = compartment
    s.generation = gate.metadata.generation or 0
    s.rollout_hash = rollout_hash(gate)
    # A round that stopped before it finished (it failed, and a person or a spec change starts another)
    # may have applied packages whose interrupt never came, or whose check after it never passed:
    # they keep it, so the new round interrupts the node and checks them again.
    unfinished = s.phase not in ("idle", "finish") and s.interrupt is not None
    s.phase = "idle"
    s.phase_since = _iso(now)
    s.failure = None
    if not unfinished:
        s.interrupt = None
        s.interrupted = []
    s.post_checked = []
    s.drain_blocked_by = None
    s.boot_id = s.boot_id or boot_id
    return s


def rerun(state: NodeGateState, package: str, stage: str) -> NodeGateState:
    """Forget that `package` completed `stage` so the next round runs it again."""
    s = state.model_copy(deep=True)
    record = s.installed.get(package)
    if record is None:
        return s
    if stage == "config":
        s.installed[package] = record.model_copy(update={"config": {}})
    else:
        s.installed.pop(package)
    if s.status in ("complete", "failed"):
        s.status = "waiting"
        s.batch = 0
        s.failure = None
    return s


__all__ = [
    "Decision", "EventRequest", "JobRequest", "JobView", "NodeChange", "NodeContext", "NodeView", "PodView",
    "Timing", "decide", "decide_removal", "job_name", "pending_work", "rerun", "start_round", "timedelta",
]
