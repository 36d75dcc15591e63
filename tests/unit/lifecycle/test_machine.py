"""The per-node state machine, decided without I/O: one step at a time, from the world as it is."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gate.api import keys
from gate.api.nodegate import Interrupt, NodeGate
from gate.api.state import Installed, NodeGateState, rollout_hash, spec_hash
from gate.lifecycle import taint
from gate.lifecycle.machine import decide
from gate.lifecycle.node import Decision, NodeContext, NodeView, PodRequest, PodView, RunPhase, StagePod, Step, Timing
from gate.lifecycle.round import config_refused, rerun, start_round
from gate.lifecycle.uninstall import decide_removal

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PKG = {"version": "1.0.0", "image": "example.com/pkg"}


def gate(packages: dict[str, Any], **spec: Any) -> NodeGate:
    return NodeGate.model_validate({"metadata": {"name": "g", "generation": 1},
                                    "spec": {"packages": packages, **spec}})


def node(**kw: Any) -> NodeView:
    base: dict[str, Any] = {"name": "n1", "labels": {}, "annotations": {}, "unschedulable": False,
                            "boot_id": "boot-1", "ready": True}
    base.update(kw)
    return NodeView(**base)


def started(g: NodeGate, **kw: Any) -> NodeGateState:
    return start_round(NodeGateState(**kw), gate=g, batch=1, compartment="__default__", boot_id="boot-1", now=NOW)


REBOOT = {"interrupt": Interrupt(type="reboot"), "interrupted": ["k"]}


def ctx(g: NodeGate, state: NodeGateState, *, stage_pods: dict[str, StagePod] | None = None,
        pods: list[PodView] | None = None, n: NodeView | None = None, now: datetime = NOW,
        readiness_clear: bool = True, release: bool = True) -> NodeContext:
    return NodeContext(gate=g, node=n or node(), state=state, stage_pods=stage_pods or {}, pods=pods, now=now,
                       readiness_clear=readiness_clear, timing=Timing(image_pull_grace=60, pending_timeout=300),
                       release=release)


def ran(req: PodRequest, phase: RunPhase = "succeeded", *, message: str = "", done: int | None = None,
        **kw: Any) -> StagePod:
    """The pod of `req` as the executor would see it: every step done when it succeeded, none when it
    failed (unless `done` says how many did)."""
    if done is None:
        done = len(req.steps) if phase == "succeeded" else 0
    return StagePod(req.name, req.kind, phase, req.steps, done=done, message=message, round=req.round,
                    attempt=req.attempt, **kw)


def one(req: PodRequest, phase: RunPhase = "succeeded", **kw: Any) -> dict[str, StagePod]:
    return {req.name: ran(req, phase, **kw)}


def steps(d: Decision) -> list[tuple[str | None, str]]:
    """The steps of the pods a decision creates."""
    return [(s.package, s.stage) for req in d.create_pods for s in req.steps]


def run_until_quiet(g: NodeGate, state: NodeGateState, *, n: NodeView | None = None,
                    outcome: RunPhase = "succeeded", max_steps: int = 50,
                    decider: Callable[[NodeContext], Decision] = decide,
                    timeline: list[str] | None = None, fail: Callable[[str | None, str], bool] | None = None,
                    release: bool = True) -> tuple[NodeGateState, list[str], NodeView]:
    """Drive the machine like the executor would, with every stage pod ending in `outcome` (a pod
    whose steps `fail` picks fails at the first of them). Fails if the node is let go under a pod not
    ended. A removal (`decider=decide_removal`) is run with `release=False` to see the node complete."""
    pods: dict[str, StagePod] = {}
    created: list[str] = []
    view = n or node()
    for _ in range(max_steps):
        d = decider(ctx(g, state, stage_pods=pods, pods=[], n=view, release=release))
        if d.state is not None:
            state = d.state
        if timeline is not None:
            timeline += [e.reason for e in d.events if e.target == "node"]
            timeline += [f"{s.package or '-'}:{s.stage}" for req in d.create_pods for s in req.steps]
        if d.node.unschedulable is False:
            running = sorted(name for name, pod in pods.items() if not pod.ended)
            assert not running, f"uncordoned while the pods {running} had not ended"
        view = _apply_node(view, d)
        for name in d.delete_pods:
            pods.pop(name, None)
        for req in d.create_pods:
            created += [f"{s.package or '-'}:{s.stage}" for s in req.steps]
            failing = [i for i, s in enumerate(req.steps) if fail is not None and fail(s.package, s.stage)]
            if failing:
                pods[req.name] = ran(req, "failed", done=failing[0], message="injected")
            else:
                pods[req.name] = ran(req, outcome)
            if req.interrupt and req.interrupt.type == "reboot":
                view = node(**{**view.__dict__, "boot_id": view.boot_id + "'"})
        if state.status != "in-progress":
            return state, created, view
        if not d.create_pods and not d.delete_pods and d.state is None and d.node.empty():
            break
    return state, created, view


def _apply_node(view: NodeView, d: Decision) -> NodeView:
    fields = dict(view.__dict__)
    annotations = dict(view.annotations)
    if d.node.unschedulable is not None:
        fields["unschedulable"] = d.node.unschedulable
    if d.node.cordoned_by:
        annotations[keys.CORDONED_BY] = d.node.cordoned_by
    if d.node.clear_cordoned_by:
        annotations.pop(keys.CORDONED_BY, None)
    if d.node.remove_readiness_taint:
        fields["taints"] = ()
    fields["annotations"] = annotations
    return NodeView(**fields)


def test_a_round_without_interrupt_runs_stages_in_dependency_order_and_never_cordons() -> None:
    g = gate({"app": {**PKG, "dependsOn": {"base": ">=1.0.0"}}, "base": PKG})
    state, created, view = run_until_quiet(g, started(g))
    assert state.status == "complete"
    assert created == ["base:apply", "app:apply"]
    assert not view.unschedulable
    assert state.installed["app"].version == "1.0.0" and state.installed["base"].spec_hash == spec_hash(
        g.spec.packages["base"])


def test_an_interrupt_round_cordons_drains_interrupts_checks_and_uncordons() -> None:
    g = gate({"tuned": {**PKG, "interrupt": {"type": "service", "services": ["tuned"]}, "config": {"a.conf": "1"}}})
    decisions: list[Decision] = []

    def seen(c: NodeContext) -> Decision:
        decisions.append(decide(c))
        return decisions[-1]

    state, created, view = run_until_quiet(g, started(g), decider=seen)
    assert state.status == "complete"
    assert created == ["tuned:apply", "tuned:config", "-:interrupt", "tuned:post-interrupt"]
    assert not view.unschedulable and keys.CORDONED_BY not in view.annotations
    # One pod for the whole round: the stages, the service restart and the check, in that order, carrying
    # the interrupt (its label); the phase written follows the steps recorded, straight to the end.
    [pod] = [req for d in decisions for req in d.create_pods]
    assert pod.kind == "stages" and pod.interrupt == Interrupt(type="service", services=["tuned"])
    assert [d.state.phase for d in decisions if d.state is not None] == ["wait-pods", "stages", "idle"]


def test_a_round_runs_one_pod_per_boot() -> None:
    """A service restart or a drain: one pod for the round; a reboot: its stages and the reboot in one, the
    checks in another on the new boot (on a removal round too)."""
    for interrupt, pods in (({"type": "service", "services": ["s"]}, [["a:apply", "b:apply", "-:interrupt",
                                                                        "a:post-interrupt", "b:post-interrupt"]]),
                            ({"type": "drain"}, [["a:apply", "b:apply", "a:post-interrupt", "b:post-interrupt"]]),
                            ({"type": "reboot"}, [["a:apply", "b:apply", "-:interrupt"],
                                                  ["a:post-interrupt", "b:post-interrupt"]])):
        g = gate({"a": {**PKG, "interrupt": interrupt}, "b": {**PKG, "interrupt": interrupt}})
        made: list[list[str]] = []

        def seen(c: NodeContext, into: list[list[str]] = made) -> Decision:
            d = decide(c)
            into += [[f"{s.package or '-'}:{s.stage}" for s in req.steps] for req in d.create_pods]
            return d

        state, _, _ = run_until_quiet(g, started(g), decider=seen)
        assert state.status == "complete" and made == pods, interrupt
    g = gate({"grub": {**PKG, "interrupt": {"type": "service", "services": ["s"]}, "uninstall": {"enabled": True}}})
    removal: list[list[str]] = []

    def removed(c: NodeContext) -> Decision:
        d = decide_removal(c)
        removal.extend([f"{s.package or '-'}:{s.stage}" for s in req.steps] for req in d.create_pods)
        return d

    state, _, _ = run_until_quiet(g, removing(g), decider=removed, release=False)
    assert state.status == "complete" and removal == [["grub:uninstall", "-:interrupt", "grub:post-uninstall"]]


def test_a_pod_is_recorded_in_its_steps_node_write_but_a_reboots() -> None:
    """`Decision.records_in_write`: the write of a step's state waits for its one pod and carries its record,
    except where the node must change first (the cordon) or the state must be there before the pod can act
    (the boot ID a reboot is judged by)."""
    for interrupt, folded in (({"type": "service", "services": ["tuned"]}, ["tuned:apply", "-:interrupt",
                                                                            "tuned:post-interrupt"]),
                              ({"type": "reboot"}, ["tuned:post-interrupt"])):
        g = gate({"tuned": {**PKG, "interrupt": interrupt}})
        decisions: list[Decision] = []

        def seen(c: NodeContext, into: list[Decision] = decisions) -> Decision:
            into.append(decide(c))
            return into[-1]

        state, created, _ = run_until_quiet(g, started(g), decider=seen)
        assert state.status == "complete" and len(created) == 3
        # The pod that holds the reboot is made after the write of the boot it is judged by.
        assert not any(d.records_in_write for d in decisions for p in d.create_pods if p.interrupt
                       and p.interrupt.type == "reboot")
        assert [f"{s.package or '-'}:{s.stage}" for d in decisions if d.records_in_write
                for s in d.create_pods[0].steps] == folded
        assert not any(d.records_in_write for d in decisions if d.node.unschedulable is not None)


def test_a_drain_round_cordons_drains_runs_stages_checks_and_uncordons_with_no_interrupt_job() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "drain"}}})
    web = PodView("web", "web-0", {}, "Running")
    # Cordoned first, in one write with the marker; nothing runs yet.
    d = decide(ctx(g, started(g), pods=[web]))
    assert d.node.unschedulable is True and d.node.cordoned_by == "g" and not d.create_pods
    assert d.state is not None and d.state.phase == "wait-pods" and d.state.interrupt == Interrupt(type="drain")
    view = _apply_node(node(), d)
    # Drained through evictions before any stage starts.
    d = decide(ctx(g, d.state, pods=[web], n=view))
    assert d.evict == [("web", "web-0")] and not d.create_pods
    assert d.state is not None and d.state.phase == "drain"
    # Then the stage, on the still cordoned node, and in the same pod (no interrupt step: the drain was
    # it) the package's post-interrupt check (it may have one).
    d = decide(ctx(g, d.state, pods=[], n=view))
    assert d.state is not None and d.state.phase == "stages" and d.node.unschedulable is None
    [apply] = d.create_pods
    assert [(st.package, st.stage) for st in apply.steps] == [("k", "apply"), ("k", "post-interrupt")]
    assert apply.interrupt is None
    # The check passed: complete, and uncordoned in the same write.
    d = decide(ctx(g, d.state, stage_pods=one(apply), pods=[], n=view))
    assert d.state is not None and d.state.status == "complete" and d.state.interrupt is None
    assert d.node.unschedulable is False and d.node.clear_cordoned_by and not d.create_pods
    # The whole round, driven to the end: the same Jobs and nothing else.
    state, created, view = run_until_quiet(g, started(g))
    assert state.status == "complete"
    assert created == ["k:apply", "k:post-interrupt"]
    assert not view.unschedulable and keys.CORDONED_BY not in view.annotations


def test_a_drain_from_config_interrupts_drains_a_config_change_only() -> None:
    g = gate({"k": {**PKG, "config": {"a.conf": "1", "b.txt": "1"}, "configInterrupts": {"*.conf": {"type": "drain"}}}})
    installed = {"k": Installed(version="1.0.0", spec_hash=spec_hash(g.spec.packages["k"]),
                                config={"a.conf": "stale", "b.txt": "stale"})}
    d = decide(ctx(g, started(g, installed=installed), pods=[]))
    assert d.node.unschedulable is True and d.state is not None and d.state.interrupt == Interrupt(type="drain")
    state, created, view = run_until_quiet(g, started(g, installed=installed))
    assert state.status == "complete" and created == ["k:config", "k:post-interrupt"] and not view.unschedulable


def test_a_drain_next_to_a_service_restart_is_the_service_restart() -> None:
    g = gate({"a": {**PKG, "interrupt": {"type": "drain"}},
              "b": {**PKG, "interrupt": {"type": "service", "services": ["s"]}}})
    state, created, view = run_until_quiet(g, started(g))
    assert state.status == "complete" and not view.unschedulable
    assert created[:2] == ["a:apply", "b:apply"] and created[2] == "-:interrupt"
    assert sorted(created[3:]) == ["a:post-interrupt", "b:post-interrupt"]  # both asked, both are checked


def test_cordon_is_one_write_with_the_marker_and_the_state() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    d = decide(ctx(g, started(g)))
    assert d.node.unschedulable is True and d.node.cordoned_by == "g"
    assert d.state is not None and d.state.cordoned and d.state.phase == "wait-pods"
    assert not d.create_pods  # nothing runs before the node is drained


def test_a_node_someone_else_cordoned_is_not_uncordoned() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "service", "services": ["s"]}}})
    state, _, view = run_until_quiet(g, started(g), n=node(unschedulable=True))
    assert state.status == "complete"
    assert view.unschedulable, "NodeGate uncordoned a node it did not cordon"


def test_protected_pods_hold_the_drain_until_wait_timeout() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}}, waitTimeout="10m",
             podNonInterruptLabels={"matchLabels": {"workload": "training"}})
    state = started(g).model_copy(update={"phase": "wait-pods", "phase_since": NOW.isoformat(), "cordoned": True,
                                          **REBOOT})
    training = PodView("ml", "train-0", {"workload": "training"}, "Running")
    d = decide(ctx(g, state, pods=[training], now=NOW + timedelta(minutes=5)))
    assert d.state is None and d.requeue_after is not None and not d.evict
    d = decide(ctx(g, state, pods=[training], now=NOW + timedelta(minutes=10)))
    assert d.state is not None and d.state.status == "failed"
    assert d.state.failure is not None and d.state.failure.reason == "WaitTimeout"
    assert "ml/train-0" in d.state.failure.message


def test_drain_evicts_only_what_a_drain_should() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    state = started(g).model_copy(update={"phase": "drain", "phase_since": NOW.isoformat(), "cordoned": True,
                                          **REBOOT})
    pods = [
        PodView("web", "web-0", {}, "Running"),
        PodView("kube-system", "ds-0", {}, "Running", daemonset=True),
        PodView("kube-system", "static-0", {}, "Running", mirror=True),
        PodView("batch", "done-0", {}, "Succeeded"),
        PodView("nodegate-system", "stage-0", {}, "Running", ours=True),
        PodView("web", "web-1", {}, "Running", deleting=True),
    ]
    d = decide(ctx(g, state, pods=pods))
    assert d.evict == [("web", "web-0")]
    d = decide(ctx(g, state, pods=pods[1:5]))
    assert d.state is not None and d.state.phase == "stages"


def test_drain_refuses_emptydir_pods_unless_allowed() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    state = started(g).model_copy(update={"phase": "drain", "phase_since": NOW.isoformat(), **REBOOT})
    cache = PodView("web", "cache-0", {}, "Running", empty_dir=True)
    d = decide(ctx(g, state, pods=[cache]))
    assert d.state is not None and d.state.failure is not None and d.state.failure.reason == "DrainRefused"
    g2 = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}}, drain={"deleteEmptyDirData": True})
    assert decide(ctx(g2, state, pods=[cache])).evict == [("web", "cache-0")]


def test_drain_timeout_names_what_blocked_it() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}}, drain={"timeout": "1m"})
    state = started(g).model_copy(update={"phase": "drain", "phase_since": NOW.isoformat(),
                                          "drain_blocked_by": "pod web/web-0: needs 1 healthy", **REBOOT})
    d = decide(ctx(g, state, pods=[PodView("web", "web-0", {}, "Running")], now=NOW + timedelta(minutes=1)))
    assert d.state is not None and d.state.failure is not None
    assert d.state.failure.reason == "DrainTimeout" and "web/web-0" in d.state.failure.message


def test_a_failed_stage_fails_the_node_with_the_step_message() -> None:
    g = gate({"k": {**PKG, "retries": 0}})
    d0 = decide(ctx(g, started(g)))
    [req] = d0.create_pods
    state = d0.state or started(g)
    d = decide(ctx(g, state, stage_pods=one(req, "failed", message='{"failedStep":"x"}')))
    assert d.state is not None and d.state.status == "failed"
    assert d.state.failure is not None and d.state.failure.package == "k" and "failedStep" in d.state.failure.message
    assert d.node.status == "failed"
    # What it failed under: the rollout spec (a pause, which bumps only the generation, is no reason to retry).
    assert d.state.failure.rollout_hash == rollout_hash(g) != ""


def test_a_node_records_the_rollout_spec_it_completed() -> None:
    g = gate({"k": PKG})
    assert started(g).rollout_hash == rollout_hash(g)
    final, _, _ = run_until_quiet(g, started(g).model_copy(update={"rollout_hash": "older"}))
    assert final.status == "complete" and final.rollout_hash == rollout_hash(g)


def test_image_pull_errors_fail_the_stage_after_the_grace() -> None:
    g = gate({"k": PKG})
    state = decide(ctx(g, started(g))).state or started(g)
    name = decide(ctx(g, state)).create_pods[0].name
    [req] = decide(ctx(g, state)).create_pods
    message = 'Back-off pulling image "example.com/pkg:1.0.0"'
    view = ran(req, "pending", waiting_reason="ImagePullBackOff", waiting_since=NOW, message=message)
    early = decide(ctx(g, state, stage_pods={name: view}, now=NOW + timedelta(seconds=30)))
    assert early.requeue_after == pytest.approx(30.05)
    # said at once, long before the grace ends: the state (and so the conditions and the CLI), an Event
    assert early.state is not None and early.state.status == "in-progress" and early.state.failure is None
    assert early.state.pull_failing == f"ImagePullBackOff: {message}"
    [event] = early.events
    assert (event.type, event.reason) == ("Warning", "ImagePullFailing") and "example.com/pkg:1.0.0" in event.message
    again = decide(ctx(g, early.state, stage_pods={name: view}, now=NOW + timedelta(seconds=40)))
    assert again.state is None and not again.events  # nothing new to write, nor to say
    late = decide(ctx(g, early.state, stage_pods={name: view}, now=NOW + timedelta(seconds=61)))
    assert late.state is not None and late.state.failure is not None
    assert late.state.failure.reason == "ImagePullFailed" and late.state.pull_failing is None


def test_a_pull_that_goes_on_is_no_longer_said_to_fail() -> None:
    g = gate({"k": PKG})
    state = decide(ctx(g, started(g))).state or started(g)
    [req] = decide(ctx(g, state)).create_pods
    failing = decide(ctx(g, state, stage_pods=one(req, "pending", waiting_reason="ErrImagePull",
                                                   waiting_since=NOW, message="registry unreachable"))).state
    assert failing is not None and failing.pull_failing == "ErrImagePull: registry unreachable"
    pulled = decide(ctx(g, failing, stage_pods=one(req, "running"), now=NOW + timedelta(seconds=5))).state
    assert pulled is not None and pulled.pull_failing is None
    # the pod ends while the state still says it (a missed event): said no longer either
    ended = decide(ctx(g, failing, stage_pods=one(req, "succeeded"), now=NOW + timedelta(seconds=9))).state
    assert ended is not None and ended.pull_failing is None and "k" in ended.installed


def test_reboot_completes_only_with_a_new_boot_id_and_ready() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    installed = {"k": Installed(version="1.0.0", spec_hash=spec_hash(g.spec.packages["k"]))}
    state = started(g).model_copy(update={"phase": "interrupt", "phase_since": NOW.isoformat(), "boot_id": "boot-1",
                                          "installed": installed, **REBOOT})
    d = decide(ctx(g, state))
    [req] = d.create_pods
    assert req.interrupt is not None and req.interrupt.type == "reboot"
    done = one(req)
    same_boot = decide(ctx(g, state, stage_pods=done))
    assert same_boot.state is None, "a pod that succeeded without a reboot is not a reboot"
    not_ready = decide(ctx(g, state, stage_pods=done, n=node(boot_id="boot-2", ready=False)))
    assert not_ready.state is None
    back = decide(ctx(g, state, stage_pods=done, n=node(boot_id="boot-2")))
    assert back.state is not None and back.state.phase == "post-interrupt"


def test_a_reboot_pod_not_ended_on_the_new_boot_goes_before_the_round_goes_on() -> None:
    # Found on a real node (tests/realnode/test_faults.py, the operator killed during the reboot): on the
    # new boot the kubelet had not yet said the reboot pod ended (or started it afresh, its sandbox gone),
    # and the same decision that deleted it went on to the uncordon while it still ran.
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    installed = {"k": Installed(version="1.0.0", spec_hash=spec_hash(g.spec.packages["k"]))}
    state = started(g).model_copy(update={"phase": "interrupt", "phase_since": NOW.isoformat(), "boot_id": "boot-1",
                                          "installed": installed, **REBOOT})
    [req] = decide(ctx(g, state)).create_pods
    for phase in ("pending", "running"):
        d = decide(ctx(g, state, stage_pods=one(req, phase), n=node(boot_id="boot-2")))
        assert d.delete_pods == [req.name], phase
        assert d.state is None and d.node.unschedulable is None and not d.create_pods, phase
        assert d.requeue_after is not None, phase
    gone = decide(ctx(g, state, n=node(boot_id="boot-2")))
    assert gone.state is not None and gone.state.phase == "post-interrupt"
    # one that never goes is bounded as a reboot is: the node fails, its pod asked to go once more
    late = NOW + timedelta(seconds=Timing().reboot_timeout + 1)
    stuck = decide(ctx(g, state, stage_pods=one(req, "running"), n=node(boot_id="boot-2"), now=late))
    assert stuck.state is not None and stuck.state.failure is not None
    assert stuck.state.failure.reason == "RebootTimeout" and req.name in stuck.state.failure.message
    assert stuck.delete_pods == [req.name]


def test_the_stages_pod_that_holds_the_reboot_is_judged_at_its_reboot_step_and_never_run_again() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    state = started(g).model_copy(update={"phase": "drain", "phase_since": NOW.isoformat(), "boot_id": "boot-0"})
    made = decide(ctx(g, state, pods=[]))
    [req] = made.create_pods
    assert [(st.package, st.stage) for st in req.steps] == [("k", "apply"), (None, "interrupt")]
    assert req.kind == "stages" and req.interrupt == Interrupt(type="reboot")
    # Written before the pod is made: the boot its reboot is judged by.
    assert made.state is not None and made.state.boot_id == "boot-1" and not made.records_in_write
    state = made.state
    # At its reboot step: the stages before it are recorded now, and the round is in its interrupt.
    at = decide(ctx(g, state, stage_pods=one(req, "running", done=1)))
    assert at.state is not None and at.state.phase == "interrupt" and "k" in at.state.installed
    assert not at.delete_pods and not at.create_pods and [e.reason for e in at.events] == ["Interrupting"]
    # It failed there, on the same boot: the interrupt failed.
    failed = decide(ctx(g, at.state, stage_pods=one(req, "failed", done=1, message="reboot refused")))
    assert failed.state is not None and failed.state.failure is not None
    assert (failed.state.failure.reason, failed.state.failure.stage) == ("InterruptFailed", "interrupt")
    # On the new boot, not said to have ended: it goes first; once gone, the checks in a pod of their own.
    new_boot = node(boot_id="boot-2")
    held = decide(ctx(g, at.state, stage_pods=one(req, "running", done=1), n=new_boot))
    assert held.delete_pods == [req.name] and held.state is None and not held.create_pods
    back = decide(ctx(g, at.state, n=new_boot))
    assert back.state is not None and back.state.phase == "post-interrupt"
    assert [e.reason for e in back.events] == ["Rebooted"]
    [check] = back.create_pods
    assert check.kind == "post-interrupt" and [(s.package, s.stage) for s in check.steps] == [("k", "post-interrupt")]
    # Ended after its reboot before the operator saw it at the step (kwok, a missed update): the same.
    ended = decide(ctx(g, state, stage_pods=one(req, "succeeded"), n=new_boot))
    assert ended.state is not None and ended.state.phase == "post-interrupt" and "k" in ended.state.installed
    assert ended.delete_pods == [req.name] and [c.kind for c in ended.create_pods] == ["post-interrupt"]
    # Started afresh on a new boot before it was seen at its reboot step (the kubelet lost its sandbox, or
    # the node rebooted on its own under its stages): it goes first, under the reboot's bound, and never
    # runs its stages and a reboot again on its own; once gone, a new pod from the first step not recorded.
    again = decide(ctx(g, state, stage_pods=one(req, "running", done=0), n=new_boot))
    assert again.delete_pods == [req.name] and not again.create_pods
    assert again.state is not None and again.state.boot_id == "boot-2", "the pod made again runs on this boot"
    # While it stops, nothing new starts, under the reboot's bound.
    stopping = one(req, "running", done=0, created=NOW, deleting=True)
    wait = decide(ctx(g, again.state, stage_pods=stopping, n=new_boot))
    assert not wait.create_pods and not wait.delete_pods and wait.requeue_after is not None
    late = NOW + timedelta(seconds=Timing().reboot_timeout + 1)
    stuck = decide(ctx(g, again.state, stage_pods=stopping, n=new_boot, now=late))
    assert stuck.state is not None and stuck.state.failure is not None
    assert stuck.state.failure.reason == "RebootTimeout" and req.name in stuck.state.failure.message
    gone = decide(ctx(g, again.state, n=new_boot))
    assert [p.steps for p in gone.create_pods] == [req.steps] and gone.state is None
    # A crash between its create and its record, and the node rebooted meanwhile: the decider does not see the
    # pod yet and asks for it again (its create adopts it) on the boot recorded before, never this one.
    crashed = decide(ctx(g, state, n=new_boot))
    [redo] = crashed.create_pods
    assert redo.name == req.name and (crashed.state is None or crashed.state.boot_id == "boot-1")


def test_a_merged_pod_that_fails_is_retried_from_its_failed_step_named_by_that_steps_phase() -> None:
    g = gate({"k": {**PKG, "retries": 1, "interrupt": {"type": "service", "services": ["s"]}}})
    state = started(g).model_copy(update={"phase": "stages", "phase_since": NOW.isoformat()})
    made = decide(ctx(g, state))
    [req] = made.create_pods
    assert [(s.package, s.stage) for s in req.steps] == [("k", "apply"), (None, "interrupt"), ("k", "post-interrupt")]
    state = made.state or state
    # Failed in its stage: nothing after it ran; the retry starts with it and holds the rest again.
    d = decide(ctx(g, state, stage_pods=one(req, "failed", done=0, message="apply failed")))
    assert d.state is not None and d.state.phase == "stages" and d.state.interrupt is not None
    later = NOW + timedelta(seconds=60)
    [retry] = decide(ctx(g, d.state, now=later)).create_pods
    assert retry.steps == req.steps and retry.attempt == 1 and retry.name != req.name
    # Failed in its check: the stage and the restart recorded, the check retried in a pod of its own.
    d = decide(ctx(g, state, stage_pods=one(req, "failed", done=2, message="not live")))
    assert d.state is not None and d.state.phase == "post-interrupt" and "k" in d.state.installed
    assert d.state.attempts == {"k/post-interrupt": 1} and d.state.status == "in-progress"
    [check] = decide(ctx(g, d.state, now=later)).create_pods
    assert check.kind == "post-interrupt" and [(s.package, s.stage) for s in check.steps] == [("k", "post-interrupt")]
    failed = decide(ctx(g, d.state, stage_pods=one(check, "failed", message="still not live"), now=later))
    assert failed.state is not None and failed.state.failure is not None
    assert (failed.state.failure.reason, failed.state.failure.stage, failed.state.failure.package) == (
        "PostInterruptCheckFailed", "post-interrupt", "k")
    # Failed in the restart: the interrupt failed (no retry), in phase interrupt.
    d = decide(ctx(g, state, stage_pods=one(req, "failed", done=1, message="restart failed")))
    assert d.state is not None and d.state.failure is not None and d.state.phase == "interrupt"
    assert (d.state.failure.reason, d.state.failure.stage) == ("InterruptFailed", "interrupt")


def test_a_reboot_that_does_not_come_back_in_time_fails_the_node_and_deletes_its_reboot_pod() -> None:
    # Found on a real node (tests/realnode/test_faults.py): left in place, the reboot pod ran again on
    # the boot that came at last, and the gate's deletion uncordoned the node while it ran.
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}}})
    since = NOW - timedelta(seconds=Timing().reboot_timeout + 1)
    state = started(g).model_copy(update={"phase": "interrupt", "phase_since": since.isoformat(),
                                          "boot_id": "boot-1", **REBOOT})
    [req] = decide(ctx(g, state.model_copy(update={"phase_since": NOW.isoformat()}))).create_pods
    d = decide(ctx(g, state, stage_pods=one(req, "running"), n=node(boot_id="boot-1", ready=False)))
    assert d.state is not None and d.state.status == "failed"
    assert d.state.failure is not None and d.state.failure.reason == "RebootTimeout"
    assert d.delete_pods == [req.name]


def test_readiness_taint_is_lifted_only_when_every_readiness_gate_is_done() -> None:
    g = gate({"k": PKG}, readinessTaint=True)
    tainted = node(taints=((keys.READINESS_TAINT_KEY, "NoSchedule"),))
    state, _, view = run_until_quiet(g, started(g), n=tainted)
    assert state.status == "complete" and not taint.has_readiness_taint(view.taints)
    final = started(g).model_copy(update={"phase": "finish"})
    d = decide(ctx(g, final, n=tainted, readiness_clear=False))
    assert d.state is not None and d.state.status == "complete" and not d.node.remove_readiness_taint


def test_paused_gate_records_results_but_starts_nothing() -> None:
    g = gate({"one": PKG, "two": {**PKG, "dependsOn": {"one": "*"}}}, paused=True)
    d = decide(ctx(g, started(g)))
    assert not d.create_pods


def test_removal_uninstalls_enabled_packages_then_releases_the_node() -> None:
    g = gate({"keep": PKG, "gone": {**PKG, "uninstall": {"enabled": True}}})
    installed = {n: Installed(version="1.0.0", spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()}
    # Picked into a batch of the removal (gate.lifecycle.removal): only then does it uninstall.
    state = NodeGateState(status="in-progress", removing=True, batch=1, installed=installed, round=1)
    cordoned = node(unschedulable=True, annotations={keys.CORDONED_BY: "g"})
    d = decide_removal(ctx(g, state, n=cordoned))
    assert steps(d) == [("gone", "uninstall")]
    assert not d.remove_state
    [req] = d.create_pods
    # Once the uninstall succeeded the node is released in the same step: keys gone, cordon undone.
    d = decide_removal(ctx(g, state, n=cordoned, stage_pods=one(req)))
    assert req.name in d.delete_pods
    assert d.remove_state and d.node.unschedulable is False and d.node.clear_cordoned_by


def test_removal_of_a_paused_gate_starts_no_uninstall_but_releases_nodes_with_nothing_to_uninstall() -> None:
    g = gate({"keep": PKG, "gone": {**PKG, "uninstall": {"enabled": True}}}, paused=True)
    installed = {n: Installed(version="1.0.0", spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()}
    state = NodeGateState(status="in-progress", removing=True, batch=1, installed=installed, round=1)
    held = decide_removal(ctx(g, state))
    assert not held.create_pods and not held.remove_state and held.state is None
    assert held.requeue_after is None  # the unpause (a spec change) brings the node back, no polling
    nothing = NodeGateState(status="complete", installed={"keep": installed["keep"]}, round=1)
    assert decide_removal(ctx(g, nothing)).remove_state
    unpaused = gate({"keep": PKG, "gone": {**PKG, "uninstall": {"enabled": True}}})
    assert [stage for _, stage in steps(decide_removal(ctx(unpaused, state)))] == ["uninstall"]


def test_a_reset_releases_a_node_whose_uninstall_failed_while_the_gate_is_deleted() -> None:
    g = gate({"gone": {**PKG, "retries": 0, "uninstall": {"enabled": True}}})
    installed = {"gone": Installed(version="1.0.0", spec_hash=spec_hash(g.spec.packages["gone"]))}
    state = NodeGateState(status="in-progress", removing=True, batch=1, installed=installed, round=1)
    [req] = decide_removal(ctx(g, state)).create_pods
    failed = decide_removal(ctx(g, state, stage_pods=one(req, "failed", message="boom")))
    assert failed.state is not None and failed.state.failure is not None
    assert failed.state.failure.reason == "UninstallFailed"
    stuck = decide_removal(ctx(g, failed.state, stage_pods=one(req, "failed")))
    assert not stuck.remove_state and not stuck.create_pods  # a failed uninstall is not retried by itself
    reset = node(annotations={keys.reset_annotation("g"): "now"})
    released = decide_removal(ctx(g, failed.state, n=reset, stage_pods=one(req, "failed")))
    assert released.remove_state and req.name in released.delete_pods and not released.create_pods


def test_job_names_are_deterministic_and_change_with_the_round() -> None:
    g = gate({"k": PKG})
    first = decide(ctx(g, started(g))).create_pods[0].name
    again = decide(ctx(g, started(g))).create_pods[0].name
    later = decide(ctx(g, started(g, round=5))).create_pods[0].name
    assert first == again and first != later and len(first) <= 63


def test_a_spec_change_under_a_running_stage_waits_for_it_before_the_new_one() -> None:
    old = gate({"k": PKG})
    first = decide(ctx(old, started(old)))
    [req] = first.create_pods
    state = first.state or started(old)
    running = one(req, "running")
    new = gate({"k": {**PKG, "version": "2.0.0"}})
    d = decide(ctx(new, state, stage_pods=running))
    assert not d.create_pods, "a second stage of the same package started while the first runs"
    d = decide(ctx(new, state, stage_pods=one(req)))
    assert req.name in d.delete_pods
    assert [(st.package, st.version) for r in d.create_pods for st in r.steps] == [("k", "2.0.0")]


def test_a_drain_refused_by_a_budget_backs_off_but_never_past_its_timeout() -> None:
    from gate.lifecycle.disruption import drain_retry_after

    assert drain_retry_after(100, 600, blocked=False) == 1.0  # pods terminating: look again soon
    waits = [drain_retry_after(t, 600, blocked=True) for t in (0, 8, 40, 100, 400)]
    assert waits == sorted(waits) and waits[0] == 1.0 and waits[-1] == 30.0
    assert drain_retry_after(590, 600, blocked=True) == 10.0  # the timeout is checked on time


def test_a_package_applied_in_a_failed_round_still_gets_its_interrupt_and_check_in_the_next() -> None:
    g = gate({"blocklist": {**PKG, "interrupt": {"type": "reboot"}},
              "later": {**PKG, "retries": 0, "dependsOn": {"blocklist": ">=1.0.0"}, "interrupt": {"type": "service",
                                                                                 "services": ["s"]}}})
    # blocklist applies, then later's apply fails: the node fails before the reboot
    state, _, view = run_until_quiet(g, started(g), fail=lambda package, stage: package == "later")
    assert state.status == "failed" and "blocklist" in state.installed and "later" not in state.installed
    # A person reruns the failed package; the next round picks the node again.
    again = start_round(rerun(state, "later", "apply"), gate=g, batch=2, compartment="__default__",
                        boot_id=view.boot_id, now=NOW)
    state, created, view = run_until_quiet(g, again, n=view)
    assert state.status == "complete"
    assert created == ["later:apply", "-:interrupt", "blocklist:post-interrupt", "later:post-interrupt"]
    assert state.interrupt is None and not state.interrupted


def removing(g: NodeGate, **kw: Any) -> NodeGateState:
    """A node the removal's planner just picked, with every package of the gate installed."""
    installed = {n: Installed(version="1.0.0", spec_hash=spec_hash(p)) for n, p in g.spec.packages.items()}
    return NodeGateState(status="in-progress", removing=True, batch=1, installed=installed, round=2, **kw)


def test_a_removal_that_needs_a_reboot_cordons_drains_uninstalls_reboots_checks_then_uncordons() -> None:
    g = gate({"grub": {**PKG, "interrupt": {"type": "reboot"}, "uninstall": {"enabled": True}}})
    timeline: list[str] = []
    state, created, view = run_until_quiet(g, removing(g), decider=decide_removal, timeline=timeline,
                                           release=False)
    assert state.status == "complete" and state.installed == {}
    assert created == ["grub:uninstall", "-:interrupt", "grub:post-uninstall"]
    assert timeline == ["Cordoned", "Drained", "grub:uninstall", "-:interrupt", "Interrupting", "Rebooted",
                        "grub:post-uninstall", "Uncordoned", "Uninstalled"]
    # Uncordoned as soon as its checks passed: no longer disrupted, though released only once its
    # batch is judged (gate.lifecycle.removal), when the gate's keys go.
    assert not view.unschedulable and keys.CORDONED_BY not in view.annotations and not state.cordoned
    held = decide_removal(ctx(g, state, n=view, release=False))
    assert not held.remove_state and not held.create_pods
    assert decide_removal(ctx(g, state, n=view)).remove_state


def test_uninstall_interrupt_overrides_the_packages_own_interrupt() -> None:
    quiet = gate({"k": {**PKG, "interrupt": {"type": "reboot"},
                        "uninstall": {"enabled": True, "interrupt": {"type": "none"}}}})
    state, created, view = run_until_quiet(quiet, removing(quiet), decider=decide_removal, release=False)
    assert state.status == "complete" and created == ["k:uninstall"]
    restart = gate({"k": {**PKG, "uninstall": {"enabled": True,
                                                "interrupt": {"type": "service", "services": ["kubelet"]}}}})
    timeline: list[str] = []
    state, created, view = run_until_quiet(restart, removing(restart), decider=decide_removal, timeline=timeline,
                                           release=False)
    assert created == ["k:uninstall", "-:interrupt", "k:post-uninstall"] and state.status == "complete"
    assert timeline[0] == "Cordoned" and not view.unschedulable


def test_a_removal_uninstalls_what_depends_on_a_package_before_the_package() -> None:
    g = gate({"base": {**PKG, "uninstall": {"enabled": True}},
              "app": {**PKG, "dependsOn": {"base": ">=1.0.0"}, "uninstall": {"enabled": True}},
              "kept": {**PKG, "dependsOn": {"base": ">=1.0.0"}}})
    state, created, _ = run_until_quiet(g, removing(g), decider=decide_removal, release=False)
    assert created == ["app:uninstall", "base:uninstall"]
    assert set(state.installed) == {"kept"} and state.status == "complete"


def test_a_failed_post_uninstall_check_fails_the_node_and_keeps_it_cordoned() -> None:
    g = gate({"grub": {**PKG, "retries": 0, "interrupt": {"type": "reboot"}, "uninstall": {"enabled": True}}})
    state, _, view = run_until_quiet(g, removing(g), decider=decide_removal, release=False,
                                     fail=lambda package, stage: stage == "post-uninstall")
    assert state.status == "failed" and state.failure is not None
    assert (state.failure.reason, state.failure.package, state.failure.stage) == (
        "PostUninstallCheckFailed", "grub", "post-uninstall")
    assert view.unschedulable and view.annotations[keys.CORDONED_BY] == "g"
    # A failed node is left as it is for a person: nothing retried, nothing released.
    again = decide_removal(ctx(g, state, pods=[], n=view))
    assert not again.create_pods and not again.remove_state and again.node.unschedulable is None


def test_protected_pods_hold_a_removal_before_its_uninstall() -> None:
    g = gate({"grub": {**PKG, "interrupt": {"type": "reboot"}, "uninstall": {"enabled": True}}},
             podNonInterruptLabels={"matchLabels": {"job": "training"}})
    training = PodView("ml", "trainer", {"job": "training"}, "Running")
    d = decide_removal(ctx(g, removing(g), pods=[training]))
    assert d.node.unschedulable is True and not d.create_pods
    assert d.state is not None and d.state.phase == "wait-pods"
    held = decide_removal(ctx(g, d.state, pods=[training], n=node(unschedulable=True,
                                                                   annotations={keys.CORDONED_BY: "g"})))
    assert not held.create_pods and not held.evict and held.requeue_after is not None
    gone = decide_removal(ctx(g, held.state or d.state, pods=[], n=node(unschedulable=True,
                                                                          annotations={keys.CORDONED_BY: "g"})))
    assert [stage for _, stage in steps(gone)] == ["uninstall", "interrupt"]


def test_uninstall_apply_interrupts_and_checks_with_the_post_uninstall_check() -> None:
    g = gate({"k": {**PKG, "interrupt": {"type": "reboot"}, "uninstall": {"enabled": True, "apply": True}}})
    installed = {"k": Installed(version="1.0.0", spec_hash=spec_hash(g.spec.packages["k"]))}
    state, created, view = run_until_quiet(g, started(g, installed=installed))
    assert created == ["k:uninstall", "-:interrupt", "k:post-uninstall"]
    assert state.status == "complete" and "k" not in state.installed and not view.unschedulable


def test_every_stage_of_a_round_is_a_step_of_one_pod_in_dependency_order() -> None:
    g = gate({"app": {**PKG, "dependsOn": {"base": ">=1.0.0"}, "config": {"a.conf": "1"}},
              "base": PKG, "other": PKG})
    d = decide(ctx(g, started(g)))
    [pod] = d.create_pods
    assert pod.kind == "stages" and steps(d) == [("base", "apply"), ("other", "apply"), ("app", "apply"),
                                                 ("app", "config")]
    # All of them recorded in one write once the pod ended, and the pod deleted after it.
    done = decide(ctx(g, d.state or started(g), stage_pods=one(pod)))
    assert done.state is not None and set(done.state.installed) == {"app", "base", "other"}
    assert done.delete_pods == [pod.name] and done.state.status == "complete"


def test_a_failed_step_is_retried_after_a_backoff_from_where_it_failed_then_fails_the_node() -> None:
    g = gate({"a": PKG, "b": {**PKG, "retries": 1}, "c": PKG})
    first = decide(ctx(g, started(g)))
    [pod] = first.create_pods
    state = first.state or started(g)
    # b failed: a is recorded, b's attempt counted, and nothing starts before the backoff ran out.
    failed = decide(ctx(g, state, stage_pods=one(pod, "failed", done=1, message="b broke")))
    assert failed.state is not None and set(failed.state.installed) == {"a"}
    assert failed.state.attempts == {"b/apply": 1} and failed.state.status == "in-progress"
    assert failed.delete_pods == [pod.name] and not failed.create_pods
    assert failed.requeue_after == pytest.approx(10.0)
    # Then a new pod, starting with b: its name is new (the attempt is part of it).
    later = NOW + timedelta(seconds=11)
    retry = decide(ctx(g, failed.state, now=later))
    [again] = retry.create_pods
    assert steps(retry) == [("b", "apply"), ("c", "apply")] and again.name != pod.name and again.attempt == 1
    # Seeing the first pod again (a crash before its deletion) counts nothing twice.
    seen = decide(ctx(g, failed.state, stage_pods=one(pod, "failed", done=1), now=later))
    assert seen.state is None or seen.state.attempts == {"b/apply": 1}
    # The retry fails too: b's retries are spent, the node fails naming b.
    out = decide(ctx(g, failed.state, stage_pods=one(again, "failed", message="b broke again"), now=later))
    assert out.state is not None and out.state.status == "failed" and out.state.failure is not None
    assert (out.state.failure.package, out.state.failure.stage, out.state.failure.reason) == (
        "b", "apply", "StageFailed")
    assert "b broke again" in out.state.failure.message
    assert out.delete_pods == []  # the last attempt's pod stays, for its logs, until the next round
    # A person's rerun starts the next round: its first look deletes the pod of the round before.
    nxt = start_round(out.state, gate=g, batch=2, compartment="__default__", boot_id="boot-1", now=later)
    kept = ran(again, "failed")
    assert kept.name in decide(ctx(g, nxt, stage_pods={kept.name: kept}, now=later)).delete_pods


def test_the_checks_after_an_interrupt_share_one_pod() -> None:
    g = gate({"a": {**PKG, "interrupt": {"type": "service", "services": ["s"]}},
              "b": {**PKG, "interrupt": {"type": "service", "services": ["t"]}}})
    timeline: list[str] = []
    state, created, _ = run_until_quiet(g, started(g), timeline=timeline)
    assert state.status == "complete"
    assert created == ["a:apply", "b:apply", "-:interrupt", "a:post-interrupt", "b:post-interrupt"]


def test_a_removal_waits_for_a_running_stage_pod_of_an_earlier_round() -> None:
    """A host change is never cut off half way, and a node is not let go under one, failed or not."""
    g = gate({"k": {**PKG, "uninstall": {"enabled": True}}})
    state = NodeGateState(status="failed", installed={}, round=1)
    leftover = StagePod("ng-apply-x", "stages", "running", (), round=1)
    cordoned = node(unschedulable=True, annotations={keys.CORDONED_BY: "g"})
    held = decide_removal(ctx(g, state, stage_pods={leftover.name: leftover}, n=cordoned))
    assert not held.remove_state and not held.delete_pods and held.node.empty() and held.requeue_after
    ended = StagePod("ng-apply-x", "stages", "failed", (), round=1)
    released = decide_removal(ctx(g, state, stage_pods={ended.name: ended}, n=cordoned))
    assert released.remove_state and released.delete_pods == [ended.name] and released.node.unschedulable is False


def test_a_stage_pod_past_its_deadline_fails_its_running_step_even_when_no_kubelet_says_so() -> None:
    """The kubelet ends a pod at its activeDeadlineSeconds; on a node that is gone nothing would."""
    g = gate({"a": PKG, "b": {**PKG, "retries": 0}})
    first = decide(ctx(g, started(g)))
    [req] = first.create_pods
    state = first.state or started(g)
    pod = ran(req, "running", done=1, deadline=120, created=NOW)
    early = decide(ctx(g, state, stage_pods={req.name: pod}, now=NOW + timedelta(seconds=100)))
    assert early.state is None and early.requeue_after == pytest.approx(50.05)  # 120 s + the 30 s grace
    late = decide(ctx(g, state, stage_pods={req.name: pod}, now=NOW + timedelta(seconds=151)))
    assert late.state is not None and late.state.failure is not None and late.delete_pods == [req.name]
    assert (late.state.failure.package, late.state.failure.stage) == ("b", "apply")
    assert late.state.failure.message.startswith("DeadlineExceeded")


def test_a_config_map_that_is_not_ours_fails_the_node_in_that_packages_step_and_starts_nothing() -> None:
    g = gate({"base": PKG, "tuned": {**PKG, "config": {"a.conf": "x"}}})
    state = started(g, status="in-progress")
    request = PodRequest(name="ng-p", kind="stages", steps=(Step("base", "apply", "f"), Step("tuned", "apply", "f"),
                                                            Step("tuned", "config", "f")))
    d = config_refused(ctx(g, state), request, "tuned", "ConfigMap ng/ng-config-1 exists but is not NodeGate's")
    assert d.create_pods == [] and d.state is not None and d.node.status == "failed"
    failure = d.state.failure
    assert failure is not None
    assert (failure.reason, failure.package, failure.stage) == ("ConfigMapNotOurs", "tuned", "apply")
    assert failure.message == "ConfigMap ng/ng-config-1 exists but is not NodeGate's"
    assert {(e.target, e.reason) for e in d.events} == {("node", "ConfigMapNotOurs"), ("gate", "ConfigMapNotOurs")}
