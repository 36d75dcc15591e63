"""The per-node state machine of one gate: one idempotent step at a time, decided without I/O.

A round on a node runs through phases:

    cordon -> wait-pods -> drain -> stages -> interrupt -> post-interrupt -> finish [-> soak]
    (cordon, wait-pods and drain only when this round needs an interrupt; interrupt and
     post-interrupt only when it does; an interrupt of type drain runs no interrupt pod; soak only
     under a DeploymentPolicy with `health`: `gate.lifecycle.soak` decides it)

Each phase that runs something on the host runs it in one pod: all the package stages of the round
(apply, upgrade, config, uninstall, in dependency order) are the steps of one stage pod, the
interrupt has a pod, and the checks after it share one. A step is a container of the pod (init
containers run one after another, the last step is the pod's container), and its result is its
container's termination. A pod that ends is read step by step: the steps that succeeded are recorded
in one write, and a failed step is retried from where it failed, in a new pod that starts with it
(`Step`, `StagePod`, `_run_steps`).

The removal of a deleted gate runs the same phases on a node, with uninstall stages, and after the
interrupt each uninstalled package's post-uninstall check (`decide_removal`).

`decide` reads the world (the gate, the node, this gate's state on the node, its stage pods, the
pods on the node) and returns what to do next: a new state and node changes to write in one request,
stage pods to create or delete, pods to evict, events, and when to look again. The executor performs it.
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
from gate.api.common import parse_duration, parse_time
from gate.api.nodegate import Interrupt, NodeGate, Package
from gate.api.policy import Health
from gate.api.state import (
    Failure,
    NodeGateState,
    Phase,
    Stage,
    config_hash,
    failure_message,
    rollout_hash,
    spec_hash,
)
from gate.lifecycle import taint
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.dag import topological_order
from gate.lifecycle.handoff import hold_wanted
from gate.lifecycle.interrupts import merge
from gate.lifecycle.soak import Reading, judge, soak_end
from gate.lifecycle.work import PackageWork, after_stage, constraint_satisfied, package_work

RunPhase = Literal["pending", "running", "succeeded", "failed"]
PodKind = Literal["stages", "interrupt", "post-interrupt", "removal"]


@dataclass(frozen=True)
class Step:
    """One stage of one package (or the interrupt, `package` None) as a step of a stage pod.

    `fingerprint` ties the step to the spec it was started for (the version and spec hash, or the
    config hash): a step is recorded only while the spec still asks for exactly it."""

    package: str | None
    stage: Stage
    fingerprint: str = ""
    version: str | None = field(default=None, compare=False)
    previous_version: str | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """Where its attempts are counted in the state: `package/stage`."""
        return f"{self.package or '-'}/{self.stage}"


@dataclass(frozen=True)
class StagePod:
    """A stage pod as the decider needs it (the executor builds this from the pod)."""

    name: str
    kind: PodKind
    phase: RunPhase  # pending until a container started; running; succeeded or failed once it ended
    steps: tuple[Step, ...] = ()
    done: int = 0  # how many of its steps, from the first, succeeded
    message: str = ""  # why it failed: the failed step's termination message (the agent's summary), or the pod's reason
    waiting_reason: str = ""  # a container's waiting reason (ErrImagePull, ImagePullBackOff, ...)
    waiting_since: datetime | None = None  # since when the pod is stuck in that reason
    created: datetime | None = None
    round: int = 0
    attempt: int = 0  # of its first step
    deadline: float | None = None  # its activeDeadlineSeconds
    uid: str = ""  # its metadata.uid and the digest of what it runs: whether it is the operator's
    shape: str = ""  # (`gate.lifecycle.ownership`; the decider only ever sees pods that are)

    @property
    def ended(self) -> bool:
        return self.phase in ("succeeded", "failed")

    @property
    def current_step(self) -> Step | None:
        """The step it is at: the first that has not succeeded (the last, once all have)."""
        return self.steps[min(self.done, len(self.steps) - 1)] if self.steps else None

    @property
    def failed_step(self) -> Step | None:
        """The step it failed in: the first that did not succeed (a pod that failed before any step
        ran, evicted or past its deadline, failed in its first)."""
        if self.phase != "failed" or self.done >= len(self.steps):
            return None
        return self.steps[self.done]


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
    # Every other condition but Ready, by type (node-problem-detector's, DCGM's, ...): the health
    # signals a soak reads (`gate.lifecycle.soak`). Not among what the fleet plans read.
    health_conditions: Mapping[str, NodeCondition] = field(default_factory=dict, compare=False)

    @property
    def cordoned_by(self) -> str | None:
        return self.annotations.get(keys.CORDONED_BY)


@dataclass(frozen=True)
class Timing:
    """Operator settings the decider needs (durations in seconds)."""

    image_pull_grace: float = 120.0  # ErrImagePull/ImagePullBackOff this long -> stage failed
    pending_timeout: float = 600.0  # a stage pod not running after this long -> stage failed
    reboot_timeout: float = 900.0  # no new bootID and Ready after a reboot interrupt -> failed
    # A stage pod still not ended this long past its deadline fails its step: the kubelet ends it at the
    # deadline, but not on a node that is gone or whose kubelet is down.
    deadline_grace: float = 30.0
    poll: float = 5.0  # how often to look again while waiting on pods or drains
    health_poll: float = 15.0  # how often a soaking node's Prometheus query is asked again


@dataclass(frozen=True)
class PodRequest:
    """A stage pod to create; the controller renders the manifest."""

    name: str
    kind: PodKind
    steps: tuple[Step, ...]
    round: int = 0
    attempt: int = 0
    interrupt: Interrupt | None = None  # the interrupt pod's


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
    held_by: str | None = None  # a hand-off hold: the held-by annotation, naming the gate that asked
    hand_off_released: str | None = None  # someone uncordoned a held node: drop held-by, record this time

    def empty(self) -> bool:
        return self == NodeChange()


@dataclass
class Decision:
    state: NodeGateState | None = None  # None: leave the annotation as it is
    node: NodeChange = field(default_factory=NodeChange)
    create_pods: list[PodRequest] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
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
    stage_pods: Mapping[str, StagePod]  # this gate's stage pods on this node, by name
    pods: Sequence[PodView] | None  # pods on the node; None when not loaded (only needed to drain)
    now: datetime
    readiness_clear: bool = True  # every other readinessTaint gate selecting the node is complete
    # The readinessTaint gate selecting the node that asks for a hand-off hold (spec.leaveCordoned):
    # this gate if it asks, else another (`gate.lifecycle.fleet.hold_asked_by`); None: nobody asks.
    hold_asked_by: str | None = None
    timing: Timing = Timing()
    release: bool = True  # removal: a node that uninstalled may be released (its batch was judged)
    health: Health | None = None  # the `health` of the node's compartment (None: no soak)
    reading: Reading | None = None  # the last Prometheus reading for the node, while it soaks
    # The operator pulls a round's images ahead (`gate.lifecycle.prepull`): a round that cordons waits
    # for them first. `prepull_pod` is the node's prepull pod for this round, None while there is none.
    prepull: bool = False
    prepull_pod: StagePod | None = None


_POD_LABELS: Mapping[str, str] = {"post-interrupt": "post", "post-uninstall": "post"}


def pod_name(gate: str, node: str, round_: int, kind: PodKind, first: Step, attempt: int = 0) -> str:
    """Deterministic: a pod is named by where it starts (its round, kind and first step) and the
    attempt of that step, so a crash between creating a pod and recording it can never run a step
    twice, and a retry (the next attempt) is a new pod."""
    text = f"{gate}\0{node}\0{round_}\0{kind}\0{first.package}\0{first.stage}\0{first.fingerprint}\0{attempt}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    label = _POD_LABELS.get(first.stage, first.stage)
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
        self.state.pull_failing = None  # the failure says it now
        self.state.failure = Failure(package=package, stage=stage or self.state.phase, reason=reason,
                                     message=message[:1000], generation=self.gate.metadata.generation or 0,
                                     rollout_hash=_rollout_of(self.state, self.gate))
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

    def pod_name(self, kind: PodKind, first: Step, attempt: int = 0) -> str:
        return pod_name(self.gate.name, self.ctx.node.name, self.state.round, kind, first, attempt)


def install_order(gate: NodeGate) -> list[str]:
    """The gate's packages, each after those it depends on (a removal goes the other way)."""
    return topological_order({n: set(p.depends_on) for n, p in gate.spec.packages.items()})


def round_work(gate: NodeGate, state: NodeGateState) -> dict[str, PackageWork]:
    return {name: package_work(name, pkg, state.installed.get(name)) for name, pkg in gate.spec.packages.items()}


def pending_work(gate: NodeGate, state: NodeGateState) -> bool:
    """Whether the spec asks for anything that is not on the node yet."""
    return any(not w.done for w in round_work(gate, state).values())


def fail_round(ctx: NodeContext, reason: str, message: str, *, stage: str) -> Decision:
    """The node's round fails now, for a reason found outside the round (its roll-back's revision is gone)."""
    return _Round(ctx).fail(reason, message, stage=stage)


def decide(ctx: NodeContext) -> Decision:
    """The next step for a node that is in progress for this gate."""
    r = _Round(ctx)
    s = r.state
    if s.status != "in-progress":
        return r.finish_decision()
    if s.phase == "soak":
        return _soak(r)
    work = round_work(ctx.gate, s)
    required = _require(r, {n: w.interrupt for n, w in work.items() if not w.done})
    needs_interrupt = required.type != "none"
    paused = ctx.gate.spec.paused

    if s.phase in ("cordon", "wait-pods", "drain") and not needs_interrupt:
        r.set_phase("stages")
    _sweep(r)
    if s.phase == "idle" and needs_interrupt and ctx.prepull:
        outcome = _await_images(r)
        if outcome is not None:
            return outcome
    outcome = _phases(r, required, paused, lambda: _stages(r, paused))
    if outcome is not None:
        return outcome

    if s.phase == "finish":
        _finish(r)
    return r.finish_decision()


_KIND_PHASE: Mapping[PodKind, Phase] = {"stages": "stages", "removal": "stages", "interrupt": "interrupt",
                                        "post-interrupt": "post-interrupt"}
_PHASE_ORDER: tuple[Phase, ...] = ("idle", "cordon", "wait-pods", "drain", "stages", "interrupt", "post-interrupt",
                                   "finish", "soak")


def _sweep(r: _Round) -> None:
    """Delete the ended stage pods no phase still ahead of this round will read: those of earlier
    rounds, and those of phases the round is past."""
    s = r.state
    now = _PHASE_ORDER.index(s.phase)
    for pod in r.ctx.stage_pods.values():
        if pod.ended and (pod.round != s.round or _PHASE_ORDER.index(_KIND_PHASE[pod.kind]) < now):
            r.decision.delete_pods.append(pod.name)


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
            protected = [p for p in ctx.pods if not p.terminal and not p.ours and selector.matches(p.labels)]
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


def _stages(r: _Round, paused: bool) -> Decision | None:
    """The package stages of an install round, as the steps of one stage pod in dependency order.
    Returns a decision while work remains, None when done."""
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

    outcome = _run_steps(r, "stages", plan, record, lambda _, message: ("StageFailed", message), paused)
    if outcome is not None:
        return outcome
    if blocked:
        return r.fail("DependencyUnsatisfied", f"{', '.join(blocked)} wait for dependencies whose installed "
                      "version does not satisfy the constraint", package=blocked[0], stage="apply")
    return None


def _run_steps(r: _Round, kind: PodKind, plan: Callable[[], list[Step]], record: Callable[[Step], None],
               failure: Callable[[Step, str], tuple[str, str]], paused: bool) -> Decision | None:
    """Run `plan`'s steps in stage pods of `kind`. Returns a decision while any is left, None when all
    are done.

    Level-triggered: `plan` is what is left, recomputed from the state after each `record`. A pod
    that ended is read step by step: each step it completed that is the next one planned is
    recorded (all of them in this one decision, so the node's state is written once per pod), a
    failed step counts an attempt of that step, and the pod is deleted. The executor writes the node
    before it deletes or creates pods, so a crash in between only means the next look does the same
    again. The next pod starts with the first step left; while any stage pod of the gate still runs
    on the node, nothing new starts (two stages never change one host at once).
    """
    ctx, s = r.ctx, r.state
    ours = sorted((p for p in ctx.stage_pods.values() if p.kind == kind and p.round == s.round),
                  key=lambda p: (p.created or ctx.now, p.name))
    steps = plan()
    for pod in ours:
        if not pod.ended:
            continue
        for step in pod.steps[:pod.done]:
            if steps and steps[0] == step:
                record(step)
                r.changed = True
                steps = plan()
        failed = pod.failed_step
        if failed is not None and steps and steps[0] == failed:
            attempts = (pod.attempt if pod.steps[0] == failed else 0) + 1
            if attempts > s.attempts.get(failed.key, 0):
                s.attempts = {**s.attempts, failed.key: attempts}
                s.retry_at = _iso(ctx.now + timedelta(seconds=retry_backoff(attempts)))
                r.changed = True
            if s.attempts[failed.key] > _retries(r, failed):
                # Its last attempt's pod is kept, for `kubectl logs` and `nodegate logs`, until the node
                # gets another round (a reset, a rerun, a spec change) or leaves the gate.
                reason, message = failure(failed, pod.message or f"the {failed.stage} step failed")
                return r.fail(reason, message, package=failed.package, stage=failed.stage)
        r.decision.delete_pods.append(pod.name)
    if s.pull_failing is not None and not any(p.waiting_reason in PULL_ERRORS for p in ours if not p.ended):
        s.pull_failing = None  # the pod it was about pulled, ended or went
        r.changed = True
    running = [p for p in ctx.stage_pods.values() if not p.ended]
    if not steps:
        if running:
            r.decision.requeue_after = ctx.timing.poll
            return r.finish_decision()
        return None
    head = steps[0]
    name = r.pod_name(kind, head, s.attempts.get(head.key, 0))
    current = ctx.stage_pods.get(name)
    if current is not None and not current.ended:
        left = _past_deadline(current, ctx)
        if left is not None and left <= 0:
            where = current.current_step or head
            r.decision.delete_pods.append(current.name)
            reason, message = failure(where, f"DeadlineExceeded: the stage pod {current.name} did not end within "
                                      f"its deadline of {current.deadline:.0f}s")
            return r.fail(reason, message, package=where.package, stage=where.stage)
        stuck = _stuck(current, ctx)
        if stuck:
            where = current.current_step or head
            r.decision.delete_pods.append(current.name)
            return r.fail(stuck[0], stuck[1], package=where.package, stage=where.stage)
        _note_pull(r, current)
        _look_again_for(r, current)
        return r.finish_decision()
    if running or current is not None:
        # Another stage pod of the gate still runs on the node (a spec change under it), or this one
        # ended and is deleted above: look again when it is gone.
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    if paused:
        return r.finish_decision()
    wait = -_since(s.retry_at, ctx.now) if s.retry_at else 0.0
    if wait > 0:  # the backoff after a failed attempt
        r.decision.requeue_after = wait
        return r.finish_decision()
    r.decision.create_pods.append(PodRequest(name, kind, tuple(steps), round=s.round,
                                             attempt=s.attempts.get(head.key, 0)))
    return r.finish_decision()


def write_refused(ctx: NodeContext, reason: str, what: str, message: str, step: Step | None = None, *,
                  stage: str = "") -> Decision:
    """The API server refused a write of this node's round for good (admission, a quota, validation:
    asking again would be refused again): the node fails with the server's message (`reason`:
    NodeWriteRefused, ConfigMapRefused, PodRefused, EvictionRefused), in `step` when the write was for
    one, else in `stage` (the node's phase when unset). While nothing of the round has run on the host
    yet, the round's cordon is undone too: the host is as the round found it, so it goes back to work
    and leaves the budget, and a person fixes what the message names and reruns the node. A host that
    ran a step of the round stays cordoned, as after any failure."""
    r = _Round(ctx)
    if _host_untouched(ctx):
        _uncordon(r)
    return r.fail(reason, f"the API server refused {what}: {message}",
                  package=step.package if step else None, stage=step.stage if step else stage)


def _host_untouched(ctx: NodeContext) -> bool:
    """No step of this round has run on the host: it is before the stages, or at them with no stage
    pod of the round seen and no attempt failed (the pods that ran are deleted once recorded, but a
    decision that records one still sees it)."""
    s = ctx.state
    if s.phase in ("idle", "cordon", "wait-pods", "drain"):
        return True
    return s.phase == "stages" and not s.attempts and not any(p.round == s.round for p in ctx.stage_pods.values())


def config_refused(ctx: NodeContext, request: PodRequest, package: str, message: str) -> Decision:
    """A ConfigMap the stage pod would mount exists under its content-addressed name but is not what
    NodeGate renders (someone created it ahead or replaced it): the node fails for this gate, in the
    package's first step of the pod, and no pod starts; asking again would meet the same object."""
    r = _Round(ctx)
    stage = next((s.stage for s in request.steps if s.package == package), request.steps[0].stage)
    return r.fail("ConfigMapNotOurs", message, package=package, stage=stage)


def retry_backoff(attempts: int) -> float:
    """Seconds before the next attempt of a step that failed `attempts` times: 10 s, doubled each time,
    at most 5 minutes (the Job controller's backoff, which ran the retries until stage pods did)."""
    return float(min(300.0, 10.0 * 2.0 ** (attempts - 1)))


def _retries(r: _Round, step: Step) -> int:
    pkg = r.gate.spec.packages.get(step.package or "")
    return pkg.retries if pkg is not None else 0


def _past_deadline(view: StagePod, ctx: NodeContext) -> float | None:
    """Seconds until a pod counts as past its deadline (<= 0: it is), None when it has none."""
    if view.deadline is None or view.created is None:
        return None
    return view.deadline + ctx.timing.deadline_grace - (ctx.now - view.created).total_seconds()


PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def _note_pull(r: _Round, view: StagePod) -> None:
    """Say at once that the stage pod's image cannot be pulled (the state, hence the node's blocked
    condition, the gate's ImagePullFailing condition and `nodegate status`), long before the pull
    grace fails the node; unsaid once the pull goes on. The Event is sent when it starts failing."""
    failing = f"{view.waiting_reason}: {view.message}"[:500] if view.waiting_reason in PULL_ERRORS else None
    if r.state.pull_failing == failing:
        return
    if failing is not None and r.state.pull_failing is None:
        grace = r.ctx.timing.image_pull_grace
        r.event("node", "Warning", "ImagePullFailing", f"NodeGate {r.gate.name}: the stage pod {view.name} cannot "
                f"pull its image ({failing}); the node fails if it still cannot after {grace:.0f}s")
    r.state.pull_failing = failing
    r.changed = True


def _await_images(r: _Round) -> Decision | None:
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
        stuck = _stuck(view, ctx)
        if stuck:
            return r.fail(stuck[0], f"prepull pod {view.name}: {stuck[1]} (the node was not cordoned)",
                          stage="prepull")
        _note_pull(r, view)
        _look_again_for(r, view)
    # Its pod's creation or end (an event) usually comes first.
    current = r.decision.requeue_after
    r.decision.requeue_after = ctx.timing.poll if current is None else min(current, ctx.timing.poll)
    return r.finish_decision()


def _stuck(view: StagePod, ctx: NodeContext) -> tuple[str, str] | None:
    if view.waiting_reason in PULL_ERRORS:
        since = view.waiting_since or view.created
        if since is None or (ctx.now - since).total_seconds() >= ctx.timing.image_pull_grace:
            return "ImagePullFailed", f"the stage image cannot be pulled: {view.waiting_reason}: {view.message}"
    if view.phase == "pending" and view.created is not None:
        if (ctx.now - view.created).total_seconds() >= ctx.timing.pending_timeout:
            return "StagePending", f"the stage pod did not start within {ctx.timing.pending_timeout:.0f}s: " + (
                view.waiting_reason or view.message or "pending")
    return None


def _look_again_for(r: _Round, view: StagePod) -> None:
    """A pod that may turn out stuck, or run past its deadline, is looked at again when its grace
    runs out: no event may come."""
    timing = r.ctx.timing
    left = _past_deadline(view, r.ctx)
    if left is not None:
        due = max(0.1, left + 0.05)
        current = r.decision.requeue_after
        r.decision.requeue_after = due if current is None else min(current, due)
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
        return None  # a drain is done by now (cordon, wait-pods, drain): no interrupt pod
    step = _interrupt_step(required)
    name = r.pod_name("interrupt", step)
    view = ctx.stage_pods.get(name)
    request = PodRequest(name, "interrupt", (step,), round=s.round, interrupt=required)
    if required.type == "reboot":
        rebooted = bool(s.boot_id) and ctx.node.boot_id != s.boot_id
        if rebooted and ctx.node.ready and (view is None or view.phase != "running"):
            if view is not None:
                r.decision.delete_pods.append(name)
            r.event("node", "Normal", "Rebooted", f"The node came back with a new boot ID after NodeGate "
                    f"{ctx.gate.name}'s reboot")
            return None
        if view is None:
            if rebooted:  # rebooted but not Ready yet
                r.decision.requeue_after = ctx.timing.poll
                return r.finish_decision()
            if paused:
                return r.finish_decision()
            r.decision.create_pods.append(request)
            r.event("node", "Normal", "Interrupting", f"NodeGate {ctx.gate.name} is rebooting the node")
            return r.finish_decision()
        if view.phase == "failed" and not rebooted:
            return r.fail("InterruptFailed", view.message or "the reboot pod failed", stage="interrupt")
        if _since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
            # The reboot pod goes too: on the boot that does come, the kubelet would run it again (its
            # sandbox is gone, so it starts afresh) and reboot the node once more; and a release of
            # the node waits until it is gone instead of uncordoning under it.
            r.decision.delete_pods.append(name)
            return r.fail("RebootTimeout", f"no new boot ID and Ready within {ctx.timing.reboot_timeout:.0f}s",
                          stage="interrupt")
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    if view is None:
        if paused:
            return r.finish_decision()
        r.decision.create_pods.append(request)
        return r.finish_decision()
    if view.phase == "succeeded":
        r.decision.delete_pods.append(name)
        return None
    if view.phase == "failed":
        return r.fail("InterruptFailed", view.message or "the interrupt pod failed", stage="interrupt")
    left = _past_deadline(view, ctx)
    if left is not None and left <= 0:
        r.decision.delete_pods.append(name)
        return r.fail("InterruptFailed", f"DeadlineExceeded: the interrupt pod {name} did not end within its "
                      f"deadline of {view.deadline:.0f}s", stage="interrupt")
    stuck = _stuck(view, ctx)
    if stuck:
        return r.fail(stuck[0], stuck[1], stage="interrupt")
    _look_again_for(r, view)
    return r.finish_decision()


def _interrupt_step(interrupt: Interrupt) -> Step:
    return Step(None, "interrupt", f"{interrupt.type}:{','.join(interrupt.services)}")


def _post_interrupt(r: _Round, paused: bool) -> Decision | None:
    """Every check after the interrupt, as the steps of one pod: post-interrupt for what the round
    installed or changed, post-uninstall for what it uninstalled."""
    packages = r.gate.spec.packages
    order = install_order(r.gate)

    def plan() -> list[Step]:
        s = r.state
        todo = set(s.interrupted) - set(s.post_checked)
        return [Step(n, _check_after_interrupt(s, n), packages[n].version, version=packages[n].version)
                for n in order if n in todo]

    def record(step: Step) -> None:
        r.state.post_checked = sorted({*r.state.post_checked, step.package or ""})

    def failure(step: Step, message: str) -> tuple[str, str]:
        return ("PostUninstallCheckFailed" if step.stage == "post-uninstall" else "PostInterruptCheckFailed"), message

    return _run_steps(r, "post-interrupt", plan, record, failure, paused)


def _check_after_interrupt(state: NodeGateState, package: str) -> Stage:
    """A package this round uninstalled proves it is gone (post-uninstall); one it installed, upgraded
    or configured proves the change is live (post-interrupt)."""
    return "post-interrupt" if package in state.installed else "post-uninstall"


def _rollout_of(state: NodeGateState, gate: NodeGate) -> str:
    """The rollout a round belongs to: a roll-back's is the failed rollout's (`gate` is then the revision
    it goes back to, `gate.lifecycle.rollback`), so its failure stays until the spec changes."""
    if state.rollback is not None and not state.rollback.done:
        return state.rollback.rollout_hash
    return rollout_hash(gate)


def _finish_rollback(r: _Round) -> None:
    """A roll-back went through: the node is back on the revision (`installed` says what it has) and
    waits, outside any batch, for its stopped compartment to be resumed or the spec to change."""
    ctx, s = r.ctx, r.state
    assert s.rollback is not None
    s.rollback = s.rollback.model_copy(update={"done": True})
    s.rollout_hash = s.rollback.to  # what the node has now; the gate's plan sees the current spec pending
    s.failure = None
    s.reruns = {}
    _complete_round(r)
    s.status = "waiting"
    s.batch = 0
    r.decision.node.status = "waiting"
    to = f"revision {s.rollback.revision}" if s.rollback.revision else "no packages of the gate (its first spec)"
    r.event("node", "Normal", "RolledBack", f"NodeGate {ctx.gate.name} took the node back to {to}")


def _finish(r: _Round) -> None:
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
        _enter_soak(r, ctx.health)
    else:
        _complete_round(r)
    change = r.decision.node
    if taint.lifts(ctx.gate, ctx.node.taints, ctx.readiness_clear):
        change.remove_readiness_taint = True
        r.event("node", "Normal", "ReadinessTaintRemoved", "Every readinessTaint gate is complete on the node")
        _hold(r)
    if ctx.health is None:
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node")


def _hold(r: _Round) -> None:
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


def _enter_soak(r: _Round, health: Health) -> None:
    """The round's work is done: the node serves again (uncordoned, its taint lifted by `_finish`),
    but it is complete only once it stayed healthy through the soak (`gate.lifecycle.soak`)."""
    ctx = r.ctx
    until = soak_end(health, ctx.now)
    _end_round(r, "soak", soak_until=_iso(until))
    r.event("node", "Normal", "Soaking", f"NodeGate {ctx.gate.name} finished its round on the node; it serves again "
            f"and must stay Ready and healthy for {health.soak} (until {until.isoformat(timespec='seconds')}) "
            "before it counts as complete")
    r.decision.requeue_after = _soak_look(ctx, health.soak_seconds)


def _soak_look(ctx: NodeContext, left: float | None) -> float:
    """When to look at a soaking node again: at the soak's end, sooner while a query is to be asked."""
    wait = ctx.timing.poll if left is None else max(0.5, left)
    health = ctx.health
    if health is not None and health.prometheus is not None:
        wait = min(wait, ctx.timing.health_poll)
    return wait


def _soak(r: _Round) -> Decision:
    """One look at a soaking node: fail it (Unhealthy, HealthUnreadable), keep it soaking, or complete it."""
    ctx, s = r.ctx, r.state
    health = ctx.health
    if health is None:
        # The policy no longer asks for health (or the gate left it): nothing is left to prove.
        _complete_round(r)
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node (its policy no "
                "longer asks for a soak)")
        return r.finish_decision()
    verdict = judge(health, ready=ctx.node.ready, conditions=ctx.node.health_conditions, reading=ctx.reading,
                    soak_since=parse_time(s.phase_since) or ctx.now, soak_until=parse_time(s.soak_until) or ctx.now,
                    now=ctx.now)
    if verdict.outcome in ("unhealthy", "unreadable-failed"):
        s.health_unreadable = None
        return r.fail(verdict.reason, verdict.message, stage="soak")
    if verdict.outcome == "passed":
        _complete_round(r)
        r.event("node", "Normal", "Complete", f"NodeGate {ctx.gate.name} is complete on the node: it stayed Ready "
                f"and healthy through its soak of {health.soak}")
        return r.finish_decision()
    unreadable = verdict.message if verdict.outcome == "unreadable" else None
    if s.health_unreadable != unreadable:
        s.health_unreadable = unreadable
        r.changed = True
        if unreadable is not None:
            r.event("node", "Warning", "HealthUnreadable", f"NodeGate {ctx.gate.name}: {unreadable}; the node stays "
                    "in its soak (a signal that cannot be read never counts as healthy)")
    r.decision.requeue_after = _soak_look(ctx, verdict.recheck_after)
    return r.finish_decision()


def _complete_round(r: _Round) -> None:
    """The end of a round that went through, install or removal: the node complete, the round's
    interrupt bookkeeping cleared, this round's cordon undone."""
    r.state.status = "complete"
    r.decision.node.status = "complete"
    _end_round(r, "idle", soak_until=None)


def _end_round(r: _Round, phase: Phase, *, soak_until: str | None) -> None:
    """The round's work is over (into its soak, or complete): its interrupt bookkeeping cleared, the
    boot it ended on recorded, and this round's cordon undone."""
    ctx, s = r.ctx, r.state
    s.phase = phase
    s.phase_since = _iso(ctx.now)
    s.soak_until = soak_until
    s.health_unreadable = None
    s.interrupt = None
    s.interrupted = []
    s.post_checked = []
    s.drain_blocked_by = None
    s.boot_id = ctx.node.boot_id
    r.changed = True
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
    # are removed with the rest.
    own = {v.name for v in ctx.stage_pods.values() if _removal_pod(r, v)}
    leftovers = [v for v in ctx.stage_pods.values() if v.name not in own]
    running = [v for v in leftovers if not v.ended and _stuck(v, ctx) is None]
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


def _removal_pod(r: _Round, pod: StagePod) -> bool:
    """A pod of this removal's round (all others are left over from an install round): plan_removal
    starts the removal in a round of its own."""
    return r.state.removing and pod.round == r.state.round and pod.kind != "stages"


def _removal_round(r: _Round) -> Decision | None:
    """A picked node's removal round; None once it completed (uncordoned, its status complete)."""
    s, gate = r.state, r.gate
    paused = gate.spec.paused
    if paused and s.phase == "idle":
        return r.finish_decision()  # nothing started: the unpause (a spec change) brings the node back
    packages = gate.spec.packages
    todo = _to_uninstall(gate, s)
    required = _require(r, {n: packages[n].uninstall_interrupt() for n in todo})
    outcome = _phases(r, required, paused, lambda: _uninstalls(r, paused))
    if outcome is not None:
        return outcome
    _complete_round(r)
    r.event("node", "Normal", "Uninstalled", f"NodeGate {gate.name} was deleted: its packages are uninstalled")
    return None


def _uninstalls(r: _Round, paused: bool) -> Decision | None:
    """The uninstall stages of a removal round, as the steps of one pod, each package after the
    packages that depend on it. Returns a decision while any is left, None when all are done."""
    order = list(reversed(install_order(r.gate)))

    def plan() -> list[Step]:
        todo = set(_to_uninstall(r.gate, r.state))
        return [Step(n, "uninstall", "gate-deleted", version=r.state.installed[n].version) for n in order if n in todo]

    def record(step: Step) -> None:
        r.state.installed = {k: v for k, v in r.state.installed.items() if k != step.package}

    def failure(_: Step, message: str) -> tuple[str, str]:
        return "UninstallFailed", f"{message}; the gate keeps its finalizer until the node is fixed and reset"

    return _run_steps(r, "removal", plan, record, failure, paused)


def drain_retry_after(waited: float, timeout: float, *, blocked: bool) -> float:
    """When to try evicting again. Pods still terminating: in a second. Refused by a disruption
    budget (429): back off with the time already waited (a quarter of it, from 1 s up to 30 s), so a
    long-blocked drain does not hammer the API server, yet never past the drain timeout."""
    if not blocked:
        return 1.0
    return max(1.0, min(30.0, waited / 4, timeout - waited))


def start_round(state: NodeGateState, *, gate: NodeGate, batch: int, compartment: str, boot_id: str,
                now: datetime) -> NodeGateState:
    """The state of a node the planner just picked: a new round (new stage pod names), in progress."""
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
    unfinished = s.phase not in ("idle", "finish", "soak") and s.interrupt is not None
    s.phase = "idle"
    s.phase_since = _iso(now)
    s.failure = None
    if not unfinished:
        s.interrupt = None
        s.interrupted = []
    s.post_checked = []
    s.attempts = {}
    s.retry_at = None
    s.drain_blocked_by = None
    s.soak_until = None
    s.health_unreadable = None
    s.boot_id = s.boot_id or boot_id
    s.rollback = None  # a forward round; a roll-back's pick sets it again (`gate.lifecycle.rollback`)
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
    "Decision",
    "EventRequest",
    "NodeChange",
    "NodeContext",
    "NodeView",
    "PodKind",
    "PodRequest",
    "PodView",
    "RunPhase",
    "StagePod",
    "Step",
    "Timing",
    "config_refused",
    "decide",
    "decide_removal",
    "fail_round",
    "pending_work",
    "pod_name",
    "rerun",
    "start_round",
    "timedelta",
    "write_refused",
]
