"""The phases of a round that disrupt the node: cordon, wait-pods and drain before its stages, the
interrupt and the checks after it.

A round needs an interrupt when a package with work left asks for one (`require_interrupt`: the
strongest asked, `gate.lifecycle.interrupts.merge`). Before its stages run, the node is then
cordoned, the pods that `podNonInterruptLabels` protects are waited for, and the others are evicted
(`drain_retry_after` paces the evictions a disruption budget refuses). After the stages, the
interrupt reboots the node or restarts services (an interrupt of type drain runs none), and every
package that asked for it proves its change is live (post-interrupt) or gone (post-uninstall).
`run_phases` runs these phases around the stages, for an install round and a removal round alike, in
as few pods as they need: one per boot (the stages, a service restart and the checks in one; the
stages and the reboot in one, the checks in another on the new boot).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gate.api.common import parse_duration
from gate.api.nodegate import Interrupt
from gate.api.state import NodeGateState, Stage
from gate.lifecycle.interrupts import merge
from gate.lifecycle.node import ROUND_KINDS, Decision, PodKind, PodRequest, StagePod, Step
from gate.lifecycle.round import Round, install_order, run_steps, seconds_since


def require_interrupt(r: Round, asked: Mapping[str, Interrupt]) -> Interrupt:
    """The round's interrupt: the strongest of what it already needs and what the packages with work
    left ask for; those asking for one are recorded, for their checks after it."""
    s = r.state
    required = merge([s.interrupt, *asked.values()])
    if required != (s.interrupt or Interrupt()):
        s.interrupt = required if required.type != "none" else None
        s.interrupted = sorted(set(s.interrupted) | {n for n, i in asked.items() if i.type != "none"})
        r.changed = True
    return required


@dataclass(frozen=True)
class RoundSteps:
    """The steps of a round before its interrupt, as its caller plans, records and names their failures:
    the package stages of an install round (`kind` stages), the uninstalls of a removal (`kind` removal).
    `blocked` says, once `plan` was asked, that steps are left that cannot run: nothing after them runs
    (no interrupt, no check), and `held` then says how the round ends (a failure), once the rest ran."""

    kind: PodKind
    plan: Callable[[], list[Step]]
    record: Callable[[Step], None]
    failure: Callable[[Step, str], tuple[str, str]]
    blocked: Callable[[], bool] = lambda: False
    held: Callable[[], Decision | None] = lambda: None


def run_phases(r: Round, required: Interrupt, paused: bool, work: RoundSteps) -> Decision | None:
    """The phases of a round up to its finish, for an install round and a removal round alike. Returns a
    decision while the round is under way, None once it reached `finish`.

    The round runs in as few pods as its phases need, one per boot: its steps, the interrupt (a service
    restart: a step, container `interrupt`) and the checks after it are the steps of one pod; a reboot is
    the last step of its pod, and the checks run in a second pod on the new boot; a drain (no interrupt
    step) and a node that rebooted on its own after its staging run their checks in the first pod too.
    The phase follows the steps recorded (`_advance`): stages, interrupt, post-interrupt, finish."""
    s = r.state
    if s.phase == "idle":
        r.set_phase("cordon" if required.type != "none" else "stages")
    if s.phase in ("cordon", "wait-pods", "drain"):
        outcome = _prepare(r, required, paused)
        if outcome is not None:
            return outcome
    if s.phase == "stages" and _reboots(r, required):
        if r.ctx.state.phase != "stages":
            _judge_reboot_by_this_boot(r)  # the round's first pod that holds the reboot may be made now
        outcome = _reboot_reached(r, required, work)
        if outcome is not None:
            return outcome
    if s.phase in ("stages", "post-interrupt") or (s.phase == "interrupt" and not _reboots(r, required)):
        outcome = _round_steps(r, required, paused, work)
        if outcome is not None:
            return outcome
        if s.phase == "stages":  # steps are left that cannot run (`work.blocked`)
            outcome = work.held()
            if outcome is not None:
                return outcome
    if s.phase == "interrupt":
        outcome = _interrupt(r, required, paused)
        if outcome is not None:
            return outcome
        r.set_phase("post-interrupt")
        return _round_steps(r, required, paused, work)  # the checks on the new boot, None once none is left
    return None


def _reboots(r: Round, required: Interrupt) -> bool:
    """Whether the round's interrupt is a reboot pod's: not when the node rebooted on its own after its
    staging (`gate.lifecycle.staging`: that reboot was the interrupt)."""
    return required.type == "reboot" and not r.state.own_reboot


def _interrupt_step_runs(r: Round, required: Interrupt) -> bool:
    return required.type not in ("none", "drain") and not r.state.own_reboot


def _round_plan(r: Round, required: Interrupt, work: RoundSteps) -> list[Step]:
    """What is left of the round, as the steps of its next pod: the stages (in phase stages), the
    interrupt (but no check after a reboot: they run on the new boot) and the checks after it."""
    s = r.state
    steps: list[Step] = []
    if s.phase == "stages":
        steps = work.plan()
        if work.blocked():
            return steps
    if s.phase in ("stages", "interrupt") and _interrupt_step_runs(r, required):
        if required.type == "reboot":  # its pod's last step; `_interrupt` judges it (a pod of its own when alone)
            return [*steps, _interrupt_step(required)] if s.phase == "stages" else []
        steps.append(_interrupt_step(required))
    if required.type != "none":
        steps += _checks(r, steps)
    return steps


def _advance(r: Round, required: Interrupt, work: RoundSteps) -> None:
    """The phase as the steps recorded say: past the stages once none is left (and none blocked), past
    the checks once they all passed."""
    s = r.state
    if s.phase == "stages" and not work.plan() and not work.blocked():
        if required.type == "none":
            r.set_phase("finish")
            return
        s.boot_id = r.ctx.node.boot_id
        # A node that rebooted on its own after its staging had its interrupt (`gate.lifecycle.staging`).
        r.set_phase("interrupt" if _interrupt_step_runs(r, required) else "post-interrupt")
    if s.phase == "post-interrupt" and not _checks(r):
        r.set_phase("finish")


def _round_steps(r: Round, required: Interrupt, paused: bool, work: RoundSteps) -> Decision | None:
    """The steps left of the round from its phase on, in pods of the phase they start in."""
    s = r.state
    _advance(r, required, work)
    if s.phase not in ("stages", "interrupt", "post-interrupt") or (s.phase == "interrupt" and _reboots(r, required)):
        return None

    def record(step: Step) -> None:
        if step.stage == "interrupt":
            r.set_phase("post-interrupt")
        elif step.stage in ("post-interrupt", "post-uninstall"):
            s.post_checked = sorted({*s.post_checked, step.package or ""})
        else:
            work.record(step)
        _advance(r, required, work)

    def failure(step: Step, message: str) -> tuple[str, str]:
        if step.stage == "interrupt":
            return "InterruptFailed", message
        if step.stage == "post-uninstall":
            return "PostUninstallCheckFailed", message
        if step.stage == "post-interrupt":
            return "PostInterruptCheckFailed", message
        return work.failure(step, message)

    def kind() -> PodKind:
        kinds: dict[str, PodKind] = {"stages": work.kind, "interrupt": "interrupt"}
        return kinds.get(s.phase, "post-interrupt")

    return run_steps(r, kind, lambda: _round_plan(r, required, work), record, failure, paused,
                     interrupt=required if _interrupt_step_runs(r, required) else None)


def _reboot_reached(r: Round, required: Interrupt, work: RoundSteps) -> Decision | None:
    """A pod of the round that holds the reboot has reached it (running it or ended after it, on this boot
    or after it): its steps before it are recorded, and the round is in its interrupt. A pod of the round
    that has not, still there on a boot other than the one it was made on (the kubelet starts it afresh
    on a new boot: its stages again, then a reboot nobody asked for), goes first, under the reboot's bound;
    the round goes on from its first step not recorded, in a new pod, once it is gone."""
    ctx, s = r.ctx, r.state
    step = _interrupt_step(required)
    for pod in _round_pods(r):
        if step not in pod.steps:
            continue
        at = pod.steps.index(step)
        if pod.ended and pod.done < at:
            _judge_reboot_by_this_boot(r)  # it failed before its reboot: the next pod runs on this boot
        if pod.done >= at:
            for done in pod.steps[:at]:
                left = work.plan()
                if left and left[0] == done:
                    work.record(done)
                    r.changed = True
            if not work.plan():
                r.set_phase("interrupt")
                _interrupting(r)
                return None
        if pod.ended or not (pod.deleting or (s.boot_id and ctx.node.boot_id != s.boot_id and ctx.node.ready)):
            continue
        if not pod.deleting:
            r.decision.delete_pods.append(pod.name)
            _judge_reboot_by_this_boot(r)  # the pod made again once it is gone runs on this boot
        if pod.created is not None and (ctx.now - pod.created).total_seconds() >= ctx.timing.reboot_timeout:
            return r.fail("RebootTimeout", f"the node rebooted, but the pod {pod.name} that holds its reboot was "
                          f"not gone within {ctx.timing.reboot_timeout:.0f}s", stage="interrupt")
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    return None


def _judge_reboot_by_this_boot(r: Round) -> None:
    """The boot the round's next pod that holds the reboot runs on, which its reboot is judged by: recorded in
    a write before that pod is made (`Decision.records_in_write`). Never when a pod is made again under the
    same name (a crash between its create and its record): the pod found there may have rebooted the node
    already, and only the boot it was made on tells."""
    if r.state.boot_id != r.ctx.node.boot_id:
        r.state.boot_id = r.ctx.node.boot_id
        r.changed = True


def _round_pods(r: Round) -> list[StagePod]:
    return [p for p in r.ctx.stage_pods.values() if p.round == r.state.round and p.kind in ROUND_KINDS]


def _prepare(r: Round, required: Interrupt, paused: bool) -> Decision | None:
    """Cordon, wait for protected pods, drain: the phases before an interrupt, of an install round and
    of a removal alike. Returns a decision while they last, None once the node is drained (the phase
    is then `stages`)."""
    ctx, s = r.ctx, r.state
    if s.phase == "cordon":
        if paused:
            return r.finish_decision()
        cordon(r, required)
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
                if limit and seconds_since(s.phase_since, ctx.now) >= parse_duration(limit).total_seconds():
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
        if seconds_since(s.phase_since, ctx.now) >= timeout:
            blocked = s.drain_blocked_by or "pods that did not terminate"
            return r.fail("DrainTimeout", f"drain did not finish within {ctx.gate.spec.drain.timeout}; "
                          f"blocked by {blocked}")
        r.decision.evict = [(p.namespace, p.name) for p in evictable if not p.deleting]
        r.decision.requeue_after = drain_retry_after(seconds_since(s.phase_since, ctx.now), timeout,
                                                     blocked=bool(s.drain_blocked_by))
        return r.finish_decision()
    return None


def cordon(r: Round, required: Interrupt) -> None:
    """Cordon the node for the round's interrupt: `unschedulable`, `cordoned-by` and the state's
    `cordoned` in the decision's one write, with the Cordoned Event. A node someone else cordoned is
    left as it is (NodeGate never takes over another's cordon, so the round's end leaves it cordoned);
    one this gate cordoned before (a hold while protected pods ran) is the round's."""
    ctx, s = r.ctx, r.state
    if not ctx.node.unschedulable:
        r.decision.node.unschedulable = True
        r.decision.node.cordoned_by = ctx.gate.name
        s.cordoned = True
        r.event("node", "Normal", "Cordoned", f"NodeGate {ctx.gate.name} cordoned the node for a "
                f"{required.type} interrupt")
    elif ctx.node.cordoned_by == ctx.gate.name:
        s.cordoned = True
    r.changed = True


def drain_retry_after(waited: float, timeout: float, *, blocked: bool) -> float:
    """When to try evicting again. Pods still terminating: in a second. Refused by a disruption
    budget (429): back off with the time already waited (a quarter of it, from 1 s up to 30 s), so a
    long-blocked drain does not hammer the API server, yet never past the drain timeout."""
    if not blocked:
        return 1.0
    return max(1.0, min(30.0, waited / 4, timeout - waited))


def _interrupt(r: Round, required: Interrupt, paused: bool) -> Decision | None:
    """The reboot, once the round's steps before it were recorded: judged by a new boot ID and Ready. The
    pod that holds it is the round's last pod before the new boot (its steps before the reboot ran in
    it), or, when none does (nothing was left to run before it), a pod of its own."""
    ctx, s = r.ctx, r.state
    if not _reboots(r, required):
        return None  # a drain is done by now (cordon, wait-pods, drain); a service restart was a step
    step = _interrupt_step(required)
    holding = [p for p in _round_pods(r) if step in p.steps]
    view = next((p for p in holding if not p.ended), holding[-1] if holding else None)
    name = view.name if view is not None else r.pod_name("interrupt", step)
    rebooted = bool(s.boot_id) and ctx.node.boot_id != s.boot_id
    if rebooted and ctx.node.ready and view is not None and not view.ended:
        # The boot ended what ran in it, but the kubelet has not said so yet, or it starts the pod afresh
        # on the new boot (its sandbox is gone and the runtime lists none of its containers), which would
        # run its steps again (its reboot step would not reboot again: the host keeps the boot this pod
        # asked on, `gate.agent.reboots`). It goes first (a graceful delete: gone once the kubelet has
        # stopped what runs in it), and the round goes on, to its checks and its uncordon, only once it
        # is gone or ended. The reboot's bound holds meanwhile.
        r.decision.delete_pods.append(name)
        if seconds_since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
            return r.fail("RebootTimeout", f"the node rebooted, but its reboot pod {name} was not gone within "
                          f"{ctx.timing.reboot_timeout:.0f}s", stage="interrupt")
        r.decision.requeue_after = ctx.timing.poll
        return r.finish_decision()
    if rebooted and ctx.node.ready:
        r.decision.delete_pods.extend(p.name for p in holding if p.name not in r.decision.delete_pods)
        r.event("node", "Normal", "Rebooted", f"The node came back with a new boot ID after NodeGate "
                f"{ctx.gate.name}'s reboot")
        return None
    if view is None:
        if rebooted:  # rebooted but not Ready yet
            r.decision.requeue_after = ctx.timing.poll
            return r.finish_decision()
        if paused:
            return r.finish_decision()
        r.decision.create_pods.append(PodRequest(name, "interrupt", (step,), round=s.round, interrupt=required))
        _interrupting(r)
        return r.finish_decision()
    if view.phase == "failed" and not rebooted:
        return r.fail("InterruptFailed", view.message or "the reboot pod failed", stage="interrupt")
    if seconds_since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
        # The reboot pod goes too: on the boot that does come, the kubelet may run it again (its
        # sandbox is gone) and its steps with it, on a node that failed; and a release of the node
        # waits until it is gone instead of uncordoning under it.
        r.decision.delete_pods.append(name)
        return r.fail("RebootTimeout", f"no new boot ID and Ready within {ctx.timing.reboot_timeout:.0f}s",
                      stage="interrupt")
    r.decision.requeue_after = ctx.timing.poll
    return r.finish_decision()


def _interrupting(r: Round) -> None:
    r.event("node", "Normal", "Interrupting", f"NodeGate {r.ctx.gate.name} is rebooting the node")


def _interrupt_step(interrupt: Interrupt) -> Step:
    return Step(None, "interrupt", f"{interrupt.type}:{','.join(interrupt.services)}")


def _checks(r: Round, planned: Sequence[Step] = ()) -> list[Step]:
    """Every check after the interrupt left, in install order: post-interrupt for what the round installs or
    changes, post-uninstall for what it uninstalls, as the state says once `planned` (the round's steps
    before the interrupt, still to run) ran."""
    s, packages = r.state, r.gate.spec.packages
    todo = set(s.interrupted) - set(s.post_checked)
    last = {step.package: step.stage for step in planned if step.package is not None}
    return [Step(n, _check_after_interrupt(s, n, last.get(n)), packages[n].version, version=packages[n].version)
            for n in install_order(r.gate) if n in todo]


def _check_after_interrupt(state: NodeGateState, package: str, last: Stage | None) -> Stage:
    """A package this round uninstalls proves it is gone (post-uninstall); one it installs, upgrades or
    configures proves the change is live (post-interrupt). `last`: its last step still to run, if any."""
    installed = last != "uninstall" if last is not None else package in state.installed
    return "post-interrupt" if installed else "post-uninstall"
