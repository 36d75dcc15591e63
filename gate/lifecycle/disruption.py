"""The phases of a round that disrupt the node: cordon, wait-pods and drain before its stages, the
interrupt and the checks after it.

A round needs an interrupt when a package with work left asks for one (`require_interrupt`: the
strongest asked, `gate.lifecycle.interrupts.merge`). Before its stages run, the node is then
cordoned, the pods that `podNonInterruptLabels` protects are waited for, and the others are evicted
(`drain_retry_after` paces the evictions a disruption budget refuses). After the stages, the
interrupt pod reboots the node or restarts services (an interrupt of type drain runs none), and every
package that asked for it proves its change is live (post-interrupt) or gone (post-uninstall), as the
steps of one pod of checks. `run_phases` runs these phases around the stages, for an install round
and a removal round alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gate.api.common import parse_duration
from gate.api.nodegate import Interrupt
from gate.api.state import NodeGateState, Stage
from gate.lifecycle.interrupts import merge
from gate.lifecycle.node import Decision, PodRequest, Step
from gate.lifecycle.round import (
    Round,
    install_order,
    look_again_for,
    past_deadline,
    run_steps,
    seconds_since,
    stuck_reason,
)


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


def run_phases(r: Round, required: Interrupt, paused: bool, stages: Callable[[], Decision | None]) -> Decision | None:
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
            # A node that rebooted on its own after its staging had its interrupt (`gate.lifecycle.staging`).
            r.set_phase("post-interrupt" if s.own_reboot else "interrupt")
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
    ctx, s = r.ctx, r.state
    if required.type in ("none", "drain"):
        return None  # a drain is done by now (cordon, wait-pods, drain): no interrupt pod
    step = _interrupt_step(required)
    name = r.pod_name("interrupt", step)
    view = ctx.stage_pods.get(name)
    request = PodRequest(name, "interrupt", (step,), round=s.round, interrupt=required)
    if required.type == "reboot":
        rebooted = bool(s.boot_id) and ctx.node.boot_id != s.boot_id
        if rebooted and ctx.node.ready and view is not None and not view.ended:
            # The boot ended what ran in it, but the kubelet has not said so yet, or it starts the pod afresh
            # on the new boot (its sandbox is gone), which would reboot the node once more. It goes first (a
            # graceful delete: gone once the kubelet has stopped what runs in it), and the round goes on,
            # to its checks and its uncordon, only once it is gone or ended. The reboot's bound holds meanwhile.
            r.decision.delete_pods.append(name)
            if seconds_since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
                return r.fail("RebootTimeout", f"the node rebooted, but its reboot pod {name} was not gone within "
                              f"{ctx.timing.reboot_timeout:.0f}s", stage="interrupt")
            r.decision.requeue_after = ctx.timing.poll
            return r.finish_decision()
        if rebooted and ctx.node.ready:
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
        if seconds_since(s.phase_since, ctx.now) >= ctx.timing.reboot_timeout:
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
    left = past_deadline(view, ctx)
    if left is not None and left <= 0:
        r.decision.delete_pods.append(name)
        return r.fail("InterruptFailed", f"DeadlineExceeded: the interrupt pod {name} did not end within its "
                      f"deadline of {view.deadline:.0f}s", stage="interrupt")
    stuck = stuck_reason(view, ctx)
    if stuck:
        return r.fail(stuck[0], stuck[1], stage="interrupt")
    look_again_for(r, view)
    return r.finish_decision()


def _interrupt_step(interrupt: Interrupt) -> Step:
    return Step(None, "interrupt", f"{interrupt.type}:{','.join(interrupt.services)}")


def _post_interrupt(r: Round, paused: bool) -> Decision | None:
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

    return run_steps(r, "post-interrupt", plan, record, failure, paused)


def _check_after_interrupt(state: NodeGateState, package: str) -> Stage:
    """A package this round uninstalled proves it is gone (post-uninstall); one it installed, upgraded
    or configured proves the change is live (post-interrupt)."""
    return "post-interrupt" if package in state.installed else "post-uninstall"
