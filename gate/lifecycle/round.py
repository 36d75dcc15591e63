"""One round on a node as a decision builds it: its start, its steps in stage pods, its failure, its end.

A round starts when the planner picks the node (`start_round`: a new round number, hence new stage
pod names). Each look at the node builds one decision over a `Round`, which holds the state being
changed and the decision being made.

What runs on the host runs as the steps of stage pods (`run_steps`): the package stages of an install
round, the uninstalls of a removal and the checks after an interrupt alike. A step is a container of
the pod (init containers run one after another, the last step is the pod's container), and its result
is its container's termination. A pod that ends is read step by step: the steps that succeeded are
recorded in one write, and a failed step is retried from where it failed, after a backoff
(`retry_backoff`), in a new pod that starts with it. A pod whose image cannot be pulled, that never
starts, or that runs past its deadline fails its step (`stuck_reason`, `past_deadline`).

A round ends failed (`Round.fail`; also when the API server refuses a write of it for good:
`write_refused`, `config_refused`) or gone through (`complete_round`, or `end_round` into a soak):
its interrupt bookkeeping cleared and this round's cordon undone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from gate.api.nodegate import Interrupt, NodeGate, Package
from gate.api.state import Failure, NodeGateState, Phase, Stage, config_hash, failure_message, rollout_hash, spec_hash
from gate.lifecycle.dag import topological_order
from gate.lifecycle.node import (
    PULL_ERRORS,
    ROUND_KINDS,
    Decision,
    EventRequest,
    NodeContext,
    PodKind,
    PodRequest,
    StagePod,
    Step,
    pod_name,
)
from gate.lifecycle.work import PackageWork, package_work


def seconds_since(ts: str | None, now: datetime) -> float:
    if not ts:
        return 0.0
    return (now - datetime.fromisoformat(ts)).total_seconds()


def iso_time(now: datetime) -> str:
    return now.isoformat()


class Round:
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
        self.state.phase_since = iso_time(self.ctx.now)
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


def stage_fingerprint(package: Package, stage: Stage) -> str:
    if stage == "config":
        return config_hash(package)
    return f"{package.version}/{spec_hash(package)}"


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
    return Round(ctx).fail(reason, message, stage=stage)


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
    s.phase_since = iso_time(now)
    s.failure = None
    if not unfinished:
        s.interrupt = None
        s.interrupted = []
    s.post_checked = []
    s.payload_placed = []
    s.attempts = {}
    s.retry_at = None
    s.drain_blocked_by = None
    s.soak_until = None
    s.health_unreadable = None
    s.boot_id = s.boot_id or boot_id
    s.own_reboot = None
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


def run_steps(r: Round, kind: Callable[[], PodKind], plan: Callable[[], list[Step]], record: Callable[[Step], None],
              failure: Callable[[Step, str], tuple[str, str]], paused: bool, *,
              interrupt: Interrupt | None = None) -> Decision | None:
    """Run `plan`'s steps in stage pods, each of the `kind` its round is at when it is made (`kind` is asked
    then). Returns a decision while any is left, None when all are done. A pod that holds the interrupt step
    (package None) carries `interrupt`.

    Level-triggered: `plan` is what is left, recomputed from the state after each `record`. A pod
    that ended is read step by step: each step it completed that is the next one planned is
    recorded (all of them in this one decision, so the node's state is written once per pod), a
    failed step counts an attempt of that step, and the pod is deleted. The node applier writes the
    node before it deletes or creates pods, so a crash in between only means the next look does the same
    again. The next pod starts with the first step left; while any stage pod of the gate still runs
    on the node, nothing new starts (two stages never change one host at once).
    """
    ctx, s = r.ctx, r.state
    ours = sorted((p for p in ctx.stage_pods.values() if p.kind in ROUND_KINDS and p.round == s.round),
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
                s.retry_at = iso_time(ctx.now + timedelta(seconds=retry_backoff(attempts)))
                r.changed = True
            if s.attempts[failed.key] > _retries(r, failed):
                # Its last attempt's pod is kept, for `kubectl logs` and `nodegate logs`, until the node
                # gets another round (a reset, a rerun, a spec change) or leaves the gate.
                reason, message = failure(failed, pod.message or f"the {failed.stage} step failed")
                return r.fail(reason, message, package=failed.package, stage=failed.stage)
        if pod.name not in r.decision.delete_pods:
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
    pod_kind = kind()
    name = r.pod_name(pod_kind, head, s.attempts.get(head.key, 0))
    current = ctx.stage_pods.get(name)
    if current is not None and not current.ended:
        left = past_deadline(current, ctx)
        if left is not None and left <= 0:
            where = current.current_step or head
            r.decision.delete_pods.append(current.name)
            reason, message = failure(where, f"DeadlineExceeded: the stage pod {current.name} did not end within "
                                      f"its deadline of {current.deadline:.0f}s")
            return r.fail(reason, message, package=where.package, stage=where.stage)
        stuck = stuck_reason(current, ctx)
        if stuck:
            where = current.current_step or head
            r.decision.delete_pods.append(current.name)
            return r.fail(stuck[0], stuck[1], package=where.package, stage=where.stage)
        note_pull(r, current)
        look_again_for(r, current)
        return r.finish_decision()
    if running or current is not None:
        # Another stage pod of the gate still runs on the node (a spec change under it), or this one
        # ended and is deleted above: look again when it is gone.
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    if paused:
        return r.finish_decision()
    wait = -seconds_since(s.retry_at, ctx.now) if s.retry_at else 0.0
    if wait > 0:  # the backoff after a failed attempt
        r.decision.requeue_after = wait
        return r.finish_decision()
    holds = interrupt if any(st.package is None and st.stage == "interrupt" for st in steps) else None
    r.decision.create_pods.append(PodRequest(name, pod_kind, tuple(steps), round=s.round,
                                             attempt=s.attempts.get(head.key, 0), interrupt=holds,
                                             payload_on_host=_placed_on_host(s, steps)))
    return r.finish_decision()


def _placed_on_host(s: NodeGateState, steps: Sequence[Step]) -> frozenset[str]:
    """The packages of a pod whose every stage in it had its payload placed on the host by the round's
    staging (`gate.lifecycle.staging.payload_placed`) and none of which failed yet this round: their
    agent reads that copy. A try after a failure copies from the image again, whatever the host holds.
    The check after a service restart in the same pod reads the copy the package's stage before it read
    (as every check after the interrupt does, `gate.controller.pods.payload_from_host`)."""
    packages = {st.package for st in steps if st.package is not None}
    return frozenset(p for p in packages
                     if any(st.package == p and st.stage != "post-interrupt" for st in steps)
                     and all(st.stage == "post-interrupt" or (st.key in s.payload_placed and not s.attempts.get(st.key))
                             for st in steps if st.package == p))


def retry_backoff(attempts: int) -> float:
    """Seconds before the next attempt of a step that failed `attempts` times: 10 s, doubled each time,
    at most 5 minutes (the Job controller's backoff, which ran the retries until stage pods did)."""
    return float(min(300.0, 10.0 * 2.0 ** (attempts - 1)))


def _retries(r: Round, step: Step) -> int:
    pkg = r.gate.spec.packages.get(step.package or "")
    return pkg.retries if pkg is not None else 0


def past_deadline(view: StagePod, ctx: NodeContext) -> float | None:
    """Seconds until a pod counts as past its deadline (<= 0: it is), None when it has none."""
    if view.deadline is None or view.created is None:
        return None
    return view.deadline + ctx.timing.deadline_grace - (ctx.now - view.created).total_seconds()


def note_pull(r: Round, view: StagePod) -> None:
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


def stuck_reason(view: StagePod, ctx: NodeContext) -> tuple[str, str] | None:
    if view.waiting_reason in PULL_ERRORS:
        since = view.waiting_since or view.created
        if since is None or (ctx.now - since).total_seconds() >= ctx.timing.image_pull_grace:
            return "ImagePullFailed", f"the stage image cannot be pulled: {view.waiting_reason}: {view.message}"
    if view.phase == "pending" and view.created is not None:
        if (ctx.now - view.created).total_seconds() >= ctx.timing.pending_timeout:
            return "StagePending", f"the stage pod did not start within {ctx.timing.pending_timeout:.0f}s: " + (
                view.waiting_reason or view.message or "pending")
    return None


def look_again_for(r: Round, view: StagePod) -> None:
    """A pod that may turn out stuck, or run past its deadline, is looked at again when its grace
    runs out: no event may come."""
    timing = r.ctx.timing
    left = past_deadline(view, r.ctx)
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


def _rollout_of(state: NodeGateState, gate: NodeGate) -> str:
    """The rollout a round belongs to: a roll-back's is the failed rollout's (`gate` is then the revision
    it goes back to, `gate.lifecycle.rollback`), so its failure stays until the spec changes."""
    if state.rollback is not None and not state.rollback.done:
        return state.rollback.rollout_hash
    return rollout_hash(gate)


def complete_round(r: Round) -> None:
    """The end of a round that went through, install or removal: the node complete, the round's
    interrupt bookkeeping cleared, this round's cordon undone."""
    r.state.status = "complete"
    r.decision.node.status = "complete"
    end_round(r, "idle", soak_until=None)


def end_round(r: Round, phase: Phase, *, soak_until: str | None) -> None:
    """The round's work is over (into its soak, or complete): its interrupt bookkeeping cleared, the
    boot it ended on recorded, and this round's cordon undone."""
    ctx, s = r.ctx, r.state
    s.phase = phase
    s.phase_since = iso_time(ctx.now)
    s.soak_until = soak_until
    s.health_unreadable = None
    s.interrupt = None
    s.interrupted = []
    s.post_checked = []
    s.payload_placed = []
    s.drain_blocked_by = None
    s.own_reboot = None
    s.boot_id = ctx.node.boot_id
    r.changed = True
    _uncordon(r)


def _uncordon(r: Round) -> None:
    """Undo this round's cordon; a node a person cordoned (no `cordoned-by` of the gate) stays cordoned."""
    ctx, s, change = r.ctx, r.state, r.decision.node
    if s.cordoned and ctx.node.unschedulable and ctx.node.cordoned_by == ctx.gate.name:
        change.unschedulable = False
        change.clear_cordoned_by = True
        r.event("node", "Normal", "Uncordoned", f"NodeGate {ctx.gate.name} uncordoned the node")
    elif ctx.node.cordoned_by == ctx.gate.name:
        change.clear_cordoned_by = True
    s.cordoned = False


def write_refused(ctx: NodeContext, reason: str, what: str, message: str, step: Step | None = None, *,
                  stage: str = "") -> Decision:
    """The API server refused a write of this node's round for good (admission, a quota, validation:
    asking again would be refused again): the node fails with the server's message (`reason`:
    NodeWriteRefused, ConfigMapRefused, PodRefused, EvictionRefused), in `step` when the write was for
    one, else in `stage` (the node's phase when unset). While nothing of the round has run on the host
    yet, the round's cordon is undone too: the host is as the round found it, so it goes back to work
    and leaves the budget, and a person fixes what the message names and reruns the node. A host that
    ran a step of the round stays cordoned, as after any failure."""
    r = Round(ctx)
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
    r = Round(ctx)
    stage = next((s.stage for s in request.steps if s.package == package), request.steps[0].stage)
    return r.fail("ConfigMapNotOurs", message, package=package, stage=stage)
