"""Stage while serving (`gate.lifecycle.staging`): what a staging pod runs, the round's wait for it before
the cordon, a reboot on the node's own counted as the interrupt, and the fleet-wide plan of staging and
undo pods (stop, pause, delete, roll back), decided without I/O."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.admission.rules.catalog_inputs import CATALOG_INPUTS
from gate.api.state import Failure, Installed, NodeGateState, Rollback
from gate.lifecycle.fleet import plan_gate
from gate.lifecycle.machine import decide
from gate.lifecycle.node import Decision, NodeContext, NodeView, StagePod, Timing
from gate.lifecycle.round import stage_fingerprint
from gate.lifecycle.serving import Serving, ServingCatalog
from gate.lifecycle.staging import (
    Candidate,
    GateStaging,
    StagingPod,
    candidates,
    gate_may_go,
    gate_staging,
    payload_placed,
    plan_stagings,
    staged_whole,
    staging_pod_name,
    staging_steps,
    undo_pod_name,
)
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, _apply_node, gate, node, ran, started

REBOOT_PKG = {**PKG, "interrupt": {"type": "reboot"}}
# `k` stages its whole apply and upgrade; `half` stages the first steps of its apply, the rest run drained.
CATALOG = ServingCatalog({"k": Serving("1.0.0", {"apply": ("write", "build"), "upgrade": ("write", "build")},
                                       frozenset({"apply", "upgrade"})),
                          "half": Serving("1.0.0", {"apply": ("download",)})})


def look(g: Any, state: NodeGateState, *, n: NodeView | None = None, staging: StagePod | None = None,
         stage_pods: dict[str, StagePod] | None = None, catalog: ServingCatalog = CATALOG) -> Decision:
    return decide(NodeContext(gate=g, node=n or node(), state=state, stage_pods=stage_pods or {}, pods=[],
                              now=NOW, timing=Timing(), serving=catalog, staging_pod=staging))


def staging_view(g: Any, state: NodeGateState, phase: Any = "succeeded", *, boot_id: str = "boot-1",
                 message: str = "") -> StagePod:
    steps = staging_steps(g, state, CATALOG)
    return StagePod(staging_pod_name(g.name, "n1", steps), "stages", phase, steps,
                    done=len(steps) if phase == "succeeded" else 0, message=message, boot_id=boot_id)


# -- what a staging pod runs --------------------------------------------------------------------

def test_staging_steps_are_the_round_stages_with_serving_steps_of_rounds_that_cordon() -> None:
    g = gate({"k": REBOOT_PKG, "other": PKG})
    steps = staging_steps(g, NodeGateState(), CATALOG)
    assert [(s.package, s.stage) for s in steps] == [("k", "apply")]
    assert steps[0].fingerprint == stage_fingerprint(g.spec.packages["k"], "apply")
    # An upgrade stages the upgrade; a round without an interrupt stages nothing (nothing waits).
    older = NodeGateState(installed={"k": Installed(version="0.9.0")})
    assert [(s.package, s.stage) for s in staging_steps(g, older, CATALOG)] == [("k", "upgrade")]
    assert staging_steps(gate({"k": PKG}), NodeGateState(), CATALOG) == ()
    # Another version than the catalog's, or a package it does not know: whole in the window.
    assert staging_steps(gate({"k": {**REBOOT_PKG, "version": "2.0.0"}}), NodeGateState(), CATALOG) == ()
    assert staging_steps(g, NodeGateState(), ServingCatalog()) == ()


def test_the_catalog_marks_grub_cmdline_and_module_blocklist_as_staged_whole() -> None:
    catalog = ServingCatalog.from_inputs(CATALOG_INPUTS)
    for name in ("grub-cmdline", "module-blocklist"):
        serving = catalog.packages[name]
        assert set(serving.lists) == {"apply", "upgrade"} and serving.only == {"apply", "upgrade"}, name


def test_the_pod_name_follows_the_steps_not_the_pick() -> None:
    g = gate({"k": REBOOT_PKG})
    steps = staging_steps(g, NodeGateState(), CATALOG)
    assert staging_steps(g, started(g), CATALOG) == steps
    name = staging_pod_name("g", "n1", steps)
    assert name.startswith("ng-staging-") and name != staging_pod_name("g", "n2", steps)
    assert undo_pod_name(name) == name.replace("ng-staging-", "ng-unstage-")


# -- the round: cordoned only once staged --------------------------------------------------------

def test_the_cordon_waits_for_a_succeeded_staging() -> None:
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    for view in (None, staging_view(g, s, "pending"), staging_view(g, s, "running")):
        d = look(g, s, staging=view)
        assert d.node.unschedulable is None and not d.create_pods, view
        assert d.requeue_after == Timing().poll
        assert (d.state or s).phase == "idle"
    d = look(g, s, staging=staging_view(g, s))
    assert d.node.unschedulable is True and d.state is not None and d.state.phase == "wait-pods"
    # Without a catalog (or for a package it does not know) the round cordons at once, as before.
    assert look(g, s, catalog=ServingCatalog()).node.unschedulable is True


def test_a_failed_staging_fails_the_node_before_any_cordon() -> None:
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    d = look(g, s, staging=staging_view(g, s, "failed", message="apply/write exited 1"))
    assert d.state is not None and d.state.status == "failed" and d.node.unschedulable is None
    assert d.state.failure is not None
    assert (d.state.failure.reason, d.state.failure.stage) == ("StagingFailed", "staging")
    assert "apply/write exited 1" in d.state.failure.message and "not cordoned" in d.state.failure.message


def drive(g: Any, state: NodeGateState, n: NodeView, staging: StagePod) -> tuple[NodeGateState, list[str], NodeView]:
    """The machine as the executor drives it, every stage pod succeeding; the staging pod as given."""
    pods: dict[str, StagePod] = {}
    timeline: list[str] = []
    for _ in range(30):
        d = look(g, state, n=n, staging=staging, stage_pods=pods)
        state = d.state or state
        timeline += [e.reason for e in d.events if e.target == "node"]
        timeline += [f"{s.package or '-'}:{s.stage}" for req in d.create_pods for s in req.steps]
        n = _apply_node(n, d)
        for name in d.delete_pods:
            pods.pop(name, None)
        for req in d.create_pods:
            pods[req.name] = ran(req)
            if req.interrupt and req.interrupt.type == "reboot":
                n = replace(n, boot_id=n.boot_id + "'")
        if state.status != "in-progress":
            break
    return state, timeline, n


def test_a_staged_node_that_rebooted_on_its_own_counts_that_reboot_and_is_never_cordoned() -> None:
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    staged = staging_view(g, s, boot_id="boot-0")  # the agent ended on an earlier boot: the node rebooted since
    state, timeline, n = drive(g, s, node(boot_id="boot-1"), staged)
    assert state.status == "complete"
    assert timeline[0] == "RebootCounted"
    assert "Cordoned" not in timeline and "-:interrupt" not in timeline
    assert timeline[1:3] == ["k:apply", "k:post-interrupt"]  # the window's stage (checks) and the check after
    assert not n.unschedulable and n.boot_id == "boot-1"
    assert state.own_reboot is None  # the round's bookkeeping went with it


def test_a_reboot_counts_only_when_nothing_must_run_drained() -> None:
    staged_boot = "boot-0"
    # `half` has steps that run drained: the node is cordoned and rebooted as always.
    g = gate({"half": REBOOT_PKG})
    s = started(g)
    _, timeline, _ = drive(g, s, node(), replace(staging_view(g, s), boot_id=staged_boot))
    assert "RebootCounted" not in timeline and "Cordoned" in timeline and "-:interrupt" in timeline
    # A drain is not what a reboot gives: the stage must run drained.
    g = gate({"k": {**PKG, "interrupt": {"type": "drain"}}})
    s = started(g)
    _, timeline, _ = drive(g, s, node(), replace(staging_view(g, s), boot_id=staged_boot))
    assert "RebootCounted" not in timeline and "Cordoned" in timeline
    # A staging pod that says no boot (an older agent) never counts one.
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    _, timeline, _ = drive(g, s, node(), staging_view(g, s, boot_id=""))
    assert "RebootCounted" not in timeline and "-:interrupt" in timeline


def test_a_staged_node_without_a_reboot_of_its_own_goes_through_the_window_as_before() -> None:
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    state, timeline, n = drive(g, s, node(), staging_view(g, s))
    assert state.status == "complete" and not n.unschedulable
    assert timeline.index("Cordoned") < timeline.index("k:apply") < timeline.index("-:interrupt")


def test_a_package_staged_whole_gets_no_container_in_the_window_and_its_check_after_the_interrupt_runs() -> None:
    # `k` stages its whole apply; `half` has steps that must run drained; `quiet` stages whole but asks for no
    # interrupt of its own (no check after it would take its staged work over); `dep` depends on another.
    g = gate({"k": REBOOT_PKG, "half": REBOOT_PKG, "quiet": PKG,
              "dep": {**REBOOT_PKG, "dependsOn": {"half": ">=1.0.0"}}})
    catalog = ServingCatalog({**CATALOG.packages, "quiet": CATALOG.packages["k"], "dep": CATALOG.packages["k"]})
    s = started(g)
    steps = staging_steps(g, s, catalog)
    view = StagePod(staging_pod_name(g.name, "n1", steps), "staging", "succeeded", steps, done=len(steps),
                    boot_id="boot-1", generation=1)
    assert [(st.package, st.stage) for st in staged_whole(g, s, catalog, view)] == [("k", "apply")]
    # Another generation, an unknown one (an older operator's pod) or a pod that did not succeed: none.
    for other in (replace(view, generation=2), replace(view, generation=None), replace(view, phase="running")):
        assert staged_whole(g, s, catalog, other) == ()

    pods: dict[str, StagePod] = {}
    n, state, created, events = node(), s, [], []
    for _ in range(30):
        d = look(g, state, n=n, staging=view, stage_pods=pods, catalog=catalog)
        if state.phase == "idle" and d.state is not None and d.state.phase != "idle":
            # The write that cordons records the stage staged whole, in one write with the phase past idle.
            assert d.node.unschedulable is True and d.state.installed["k"].version == "1.0.0"
        state = d.state or state
        events += [e for e in d.events if e.target == "node"]
        n = _apply_node(n, d)
        for name in d.delete_pods:
            pods.pop(name, None)
        for req in d.create_pods:
            created.append([f"{st.package or '-'}:{st.stage}" for st in req.steps])
            pods[req.name] = ran(req)
            if req.interrupt and req.interrupt.type == "reboot":
                n = replace(n, boot_id=n.boot_id + "'")
        if state.status != "in-progress":
            break
    assert state.status == "complete" and not n.unschedulable
    # The window's first pod: no container of `k`; the others' stages run as before, then the reboot.
    assert sorted(created[0][:-1]) == ["dep:apply", "half:apply", "quiet:apply"] and created[0][-1] == "-:interrupt"
    # After the reboot `k`'s check runs: its agent takes the staged work over on the host.
    assert sorted(created[1]) == ["dep:post-interrupt", "half:post-interrupt", "k:post-interrupt"]
    staged = [e for e in events if e.reason == "StagedWhole"]
    assert len(staged) == 1 and "k apply" in staged[0].message and view.name in staged[0].message

    # Every package staged whole and the node rebooted on its own: no cordon, only the checks run.
    g = gate({"k": REBOOT_PKG})
    s = started(g)
    steps = staging_steps(g, s, CATALOG)
    own = StagePod(staging_pod_name(g.name, "n1", steps), "staging", "succeeded", steps, done=len(steps),
                   boot_id="boot-0", generation=1)
    state, timeline, n = drive(g, s, node(boot_id="boot-1"), own)
    assert state.status == "complete" and state.installed["k"].version == "1.0.0"
    assert timeline[:3] == ["StagedWhole", "RebootCounted", "k:post-interrupt"] and "Cordoned" not in timeline
    # Not rebooted: cordoned, the window's pod holds the reboot alone, the check comes after it.
    state, timeline, n = drive(g, s, node(), replace(own, boot_id="boot-1"))
    assert state.status == "complete" and "k:apply" not in timeline
    assert timeline.index("Cordoned") < timeline.index("-:interrupt") < timeline.index("k:post-interrupt")


def test_a_staging_places_the_payload_of_the_stages_left_for_the_window_and_their_first_try_reads_it_there(
) -> None:
    """A staging pod that runs anyway (`k` has serving steps) also holds the round's other stages of catalog
    packages (`plain`: none of its steps serving), so their payload is on the host before the cordon; the
    window's first try of such a stage reads it there, a try after a failure copies from the image. A package
    the catalog does not know (`own`) is not staged at all, and a gate with nothing serving gets no staging pod."""
    catalog = ServingCatalog({**CATALOG.packages, "plain": Serving("1.0.0", {}), "conf": Serving("1.0.0", {})})
    g = gate({"k": REBOOT_PKG, "plain": REBOOT_PKG, "own": REBOOT_PKG})
    s = started(g)
    steps = staging_steps(g, s, catalog)
    assert [(st.package, st.stage) for st in steps] == [("k", "apply"), ("plain", "apply")]
    # A package with config is not placed: a staging pod mounts no ConfigMap (the round's pods create it).
    with_config = gate({"k": REBOOT_PKG, "conf": {**REBOOT_PKG, "config": {"a.conf": "x"}}})
    assert [(st.package, st.stage) for st in staging_steps(with_config, started(with_config), catalog)] == [
        ("k", "apply")]
    assert staging_steps(gate({"plain": REBOOT_PKG, "own": REBOOT_PKG}), s, catalog) == ()
    view = StagePod(staging_pod_name(g.name, "n1", steps), "staging", "succeeded", steps, done=len(steps),
                    boot_id="boot-1", generation=1)

    def window(state: NodeGateState) -> tuple[NodeGateState, Any]:
        pods: dict[str, StagePod] = {}
        n = node()
        for _ in range(10):
            d = look(g, state, n=n, staging=view, stage_pods=pods, catalog=catalog)
            state = d.state or state
            n = _apply_node(n, d)
            if d.create_pods:
                return state, d.create_pods[0]
        raise AssertionError("no pod of the window")

    state, first = window(s)
    assert state.payload_placed == ["plain/apply"]  # `k` staged whole: recorded done, no container at all
    assert sorted(st.package or "-" for st in first.steps) == ["-", "own", "plain"]
    assert first.payload_on_host == {"plain"}
    # After a failed try of `plain`'s apply, the next copies from the image.
    _, retry = window(state.model_copy(update={"attempts": {"plain/apply": 1}}))
    assert retry.steps == first.steps and retry.payload_on_host == frozenset()
    # A roll-back's stages are another spec's: nothing read from the host.
    back = Rollback(to="x", revision=1, rollout_hash="h", batch=1)
    assert payload_placed(view, g, s.model_copy(update={"rollback": back})) == []
    # The round's end forgets it.
    done, _, _ = drive(g, s, node(), view)
    assert done.status == "complete" and done.payload_placed == []
    # A service restart: the window's pod holds the stage and the check after the restart, which reads the copy
    # the stage read (on the host, no copy from the image for either).
    restart = {**PKG, "interrupt": {"type": "service", "services": ["s"]}}
    g = gate({"k": restart, "plain": restart})
    s = started(g)
    steps = staging_steps(g, s, catalog)
    view = StagePod(staging_pod_name(g.name, "n1", steps), "staging", "succeeded", steps, done=len(steps),
                    boot_id="boot-1", generation=1)
    state, first = window(s)
    assert [(st.package or "-", st.stage) for st in first.steps] == [
        ("plain", "apply"), ("-", "interrupt"), ("k", "post-interrupt"), ("plain", "post-interrupt")]
    assert state.payload_placed == ["plain/apply"] and first.payload_on_host == {"plain"}
    # ... and after a failed try of the stage, both copy from the image.
    _, retry = window(state.model_copy(update={"attempts": {"plain/apply": 1}}))
    assert retry.payload_on_host == frozenset()


# -- the fleet: candidates and the bound ---------------------------------------------------------

def test_candidates_are_the_picked_nodes_waiting_then_the_next_in_line_and_none_ahead_when_paused() -> None:
    g = gate({"k": REBOOT_PKG})
    picked = {"p1": started(g), "p2": started(g).model_copy(update={"phase": "cordon"})}
    line = [(f"w{i}", NodeGateState()) for i in range(5)]
    out = candidates(g, picked, line, catalog=CATALOG, limit_ahead=2)
    assert [(c.node, c.picked, c.place) for c in out] == [("p1", True, 0), ("w0", False, 0), ("w1", False, 1)]
    paused = gate({"k": REBOOT_PKG}, paused=True)
    assert [c.node for c in candidates(paused, picked, line, catalog=CATALOG, limit_ahead=2)] == ["p1"]
    failed = [("w0", NodeGateState(status="failed")), *line[1:]]
    assert [c.node for c in candidates(g, {}, failed, catalog=CATALOG, limit_ahead=1)] == ["w1"]


def test_a_gates_part_comes_from_its_plan_picks_first_then_its_line_and_a_round_past_its_cordon_owns_its_staging(
) -> None:
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 2})
    fresh = [fleet_node(f"n{i}") for i in range(8)]
    gplan = plan_gate(g, None, fresh, gates=[g], now=NOW)
    part = gate_staging(g, gplan, {}, catalog=CATALOG, ahead=2)
    picked = [c.node for c in part.candidates if c.picked]
    assert picked and sorted(picked) == sorted(gplan.active)
    line = [n for n, w in gplan.rollout.waits.items() if w.reason == "queued"]  # type: ignore[union-attr]
    assert [c.node for c in part.candidates if not c.picked] == line[:2]
    assert not part.keep and not part.deleting and part.taken_over == frozenset()
    # The picked node's round passed its cordon: it owns what was staged; the others wait their batch.
    past = started(g).model_copy(update={"phase": "drain"})
    running = [fleet_node("n0", state=past), *fresh[1:]]
    part = gate_staging(g, plan_gate(g, None, running, gates=[g], now=NOW), {"n0": past}, catalog=CATALOG, ahead=2)
    assert part.taken_over == {"n0"} and [c.picked for c in part.candidates] == [False, False]
    paused = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 2}, paused=True)
    kept = gate_staging(paused, plan_gate(paused, None, running, gates=[paused], now=NOW), {"n0": past},
                        catalog=CATALOG, ahead=2)
    assert kept.keep and kept.candidates == ()


def test_a_round_that_is_over_owns_its_staging_unless_it_failed_before_its_cordon() -> None:
    """A node whose round completed (or failed past its cordon) between two plans of its gate: its staging pod
    goes without an undo (the round's work is the staged work); one whose staging failed is never taken
    over (its pod stays the fleet's: undone once no longer wanted, or read again by its retry)."""
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 1})
    done = started(g).model_copy(update={"status": "complete", "phase": "idle"})
    drained = started(g).model_copy(update={"status": "failed", "phase": "drain",
                                            "failure": Failure(stage="drain", reason="DrainTimeout")})
    unstaged = started(g).model_copy(update={"status": "failed",
                                             "failure": Failure(stage="staging", reason="StagingFailed")})
    states = {"n0": done, "n1": drained, "n2": unstaged, "n3": None}
    fleet = [fleet_node(n, state=s) for n, s in states.items()]
    part = gate_staging(g, plan_gate(g, None, fleet, gates=[g], now=NOW), states, catalog=CATALOG, ahead=0)
    assert part.taken_over == {"n0", "n1"}
    pods = [pod_of(cand(n)) for n in ("n0", "n1", "n2")]
    plan = plan_stagings({"g": part}, pods, limit=5)
    assert plan.delete == [pods[0].name, pods[1].name] and pods[2].name not in plan.delete


def test_a_gate_with_nothing_to_stage_has_no_candidates_yet_its_rounds_still_take_over_what_was_staged() -> None:
    """`ServingCatalog.serves` spares each plan a walk of the gate's line: it says no only where no node of
    the gate could have a staging step (no package of the gate with serving steps at the gate's version).
    What an earlier spec staged is still taken over by the rounds that passed their cordon."""
    plain = ServingCatalog({"k": Serving("1.0.0", {})})
    other_version = ServingCatalog({"k": Serving("2.0.0", CATALOG.packages["k"].lists)})
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 2})
    assert CATALOG.serves(g) and not plain.serves(g) and not other_version.serves(g)
    assert not ServingCatalog().serves(g)
    for catalog in (plain, other_version, ServingCatalog()):
        assert staging_steps(g, NodeGateState(), catalog) == ()
    past = started(g).model_copy(update={"phase": "drain"})
    fleet = [fleet_node("n0", state=past), *(fleet_node(f"n{i}") for i in range(1, 8))]
    gplan = plan_gate(g, None, fleet, gates=[g], now=NOW)
    states: dict[str, NodeGateState | None] = {"n0": past, **{f"n{i}": None for i in range(1, 8)}}
    assert gate_staging(g, gplan, states, catalog=CATALOG, ahead=2).candidates  # the same fleet, with serving steps
    part = gate_staging(g, gplan, states, catalog=plain, ahead=2)
    assert part.candidates == () and part.taken_over == {"n0"}


STEPS = staging_steps(gate({"k": REBOOT_PKG}), NodeGateState(), CATALOG)


def cand(node_name: str, *, gate_name: str = "g", picked: bool = False, place: int = 0) -> Candidate:
    return Candidate(gate_name, node_name, STEPS, picked=picked, place=place)


def pod_of(c: Candidate, phase: Any = "succeeded", **kw: Any) -> StagingPod:
    return StagingPod(c.pod, c.gate, c.node, "staging", phase, **kw)


def undo_of(p: StagingPod, phase: Any = "pending") -> StagingPod:
    return StagingPod(undo_pod_name(p.name), p.gate, p.node, "undo", phase)


def test_stagings_are_bounded_fleet_wide_picked_nodes_first() -> None:
    by_gate = {"g": GateStaging((cand("w0", place=0), cand("w1", place=1), cand("p", picked=True))),
               "h": GateStaging((cand("x0", gate_name="h"),))}
    plan = plan_stagings(by_gate, [], limit=2)
    assert [(c.gate, c.node) for c in plan.create] == [("g", "p"), ("g", "w0")]
    # A running staging counts; one that ended does not.
    running = pod_of(cand("p", picked=True), "running")
    assert [c.node for c in plan_stagings(by_gate, [running], limit=2).create] == ["w0"]
    done = pod_of(cand("p", picked=True))
    assert [c.node for c in plan_stagings(by_gate, [done], limit=2).create] == ["w0", "x0"]


def test_a_staging_not_wanted_any_more_is_undone_once_it_ended_then_both_pods_go() -> None:
    gone = cand("w9")
    by_gate = {"g": GateStaging(())}
    # Running: never cut.
    assert plan_stagings(by_gate, [pod_of(gone, "running")], limit=5).undo == []
    staged = pod_of(gone)
    plan = plan_stagings(by_gate, [staged], limit=5)
    assert plan.undo == [staged] and plan.delete == []
    # The undo runs; no new staging starts on that node meanwhile, even when it is wanted again.
    older = replace(staged, name="ng-staging-old")
    plan = plan_stagings({"g": GateStaging((gone,))}, [older, undo_of(older)], limit=5)
    assert plan.create == [] and plan.undo == []
    # The undo succeeded: both go. It failed: both stay, for a person to see.
    assert sorted(plan_stagings(by_gate, [staged, undo_of(staged, "succeeded")], limit=5).delete) == sorted(
        [staged.name, undo_pod_name(staged.name)])
    failed = plan_stagings(by_gate, [staged, undo_of(staged, "failed")], limit=5)
    assert failed.delete == [] and failed.undo_failed == [undo_of(staged, "failed")]


def test_pause_keeps_what_is_staged_and_delete_or_a_stop_undoes_it_and_a_round_past_its_cordon_owns_it() -> None:
    staged = pod_of(cand("w0"))
    assert plan_stagings({"g": GateStaging((), keep=True)}, [staged], limit=5).undo == []  # paused
    assert plan_stagings({"g": GateStaging((), keep=True, deleting=True)}, [staged], limit=5).undo == [staged]
    # A stopped compartment or a roll-back: its nodes are no candidates any more.
    assert plan_stagings({"g": GateStaging(())}, [staged], limit=5).undo == [staged]
    # The round passed its cordon: the window's stage takes the staged work over; no undo.
    plan = plan_stagings({"g": GateStaging((), taken_over=frozenset({"w0"}))}, [staged], limit=5)
    assert (plan.delete, plan.undo) == ([staged.name], [])
    # A gate whose plan is not known yet keeps its pods; a deleted gate goes once none is left.
    assert plan_stagings({}, [staged], limit=5).undo == []
    assert not gate_may_go("g", [staged]) and gate_may_go("g", [pod_of(cand("x", gate_name="h"))])


def test_undos_count_against_the_bound() -> None:
    staged = [pod_of(cand(f"w{i}")) for i in range(4)]
    plan = plan_stagings({"g": GateStaging((cand("p", picked=True),))}, staged, limit=2)
    assert len(plan.undo) == 2 and plan.create == []


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["pending", "running", "succeeded", "failed"]),
                          st.booleans()), max_size=8),
       st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=8), st.integers(0, 4))
def test_the_bound_holds_and_one_pod_per_node(existing: list[tuple[int, str, bool]],
                                              wanted: list[tuple[int, bool]], limit: int) -> None:
    pods: list[StagingPod] = []
    for i, phase, wanted_now in existing:
        if any(p.node == f"n{i}" for p in pods):
            continue
        c = cand(f"n{i}")
        pods.append(pod_of(c, phase) if wanted_now else replace(pod_of(c, phase), name=f"ng-staging-old{i}"))
    cands = tuple({f"n{i}": cand(f"n{i}", picked=p) for i, p in wanted}.values())
    plan = plan_stagings({"g": GateStaging(cands)}, pods, limit)
    running = sum(1 for p in pods if not p.ended)
    assert running + len(plan.create) + len(plan.undo) <= max(limit, running)
    nodes = [c.node for c in plan.create] + [p.node for p in plan.undo]
    assert len(nodes) == len(set(nodes))
    assert not {c.node for c in plan.create} & {p.node for p in pods}


# -- the fleet and its rounds together: a small rollout driven the way the operator would ---------

@settings(max_examples=12, deadline=None)
@given(st.sets(st.integers(0, 4)), st.integers(1, 3), st.integers(1, 2))
def test_a_staged_rollout_cordons_only_staged_nodes_holds_its_bounds_and_counts_reboots_of_their_own(
        reboots_on_their_own: set[int], limit: int, budget: int) -> None:
    """Five nodes, a package whose whole apply stages, budget `budget`, at most `limit` staging pods
    at once. Each look: the fleet plan picks, the staging plan creates pods (which end one look later,
    on the node's boot then), and each picked node's round decides. Nodes of `reboots_on_their_own`
    reboot by themselves once staged. Throughout: never more than `limit` staging pods running, never
    more than `budget` nodes in a round, no cordon before a succeeded staging; in the end every node
    is complete, and a node that rebooted on its own was neither cordoned nor rebooted by the round."""
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": budget})
    names = [f"n{i}" for i in range(5)]
    views = {n: node(name=n, labels={"pool": "a"}, boot_id=f"{n}-boot-0") for n in names}
    states: dict[str, NodeGateState] = {}
    round_pods: dict[str, dict[str, StagePod]] = {n: {} for n in names}
    staging: dict[str, tuple[StagingPod, StagePod]] = {}  # by pod name
    interrupted: set[str] = set()
    cordoned: set[str] = set()
    for _ in range(200):
        # The kubelet: staging pods created at the last look end now, on the node's boot of now.
        for name, (pod, view) in list(staging.items()):
            if not pod.ended:
                ended = replace(view, phase="succeeded", done=len(view.steps), boot_id=views[pod.node].boot_id)
                staging[name] = (replace(pod, phase="succeeded"), ended)
                if int(pod.node[1:]) in reboots_on_their_own:
                    views[pod.node] = replace(views[pod.node], boot_id=views[pod.node].boot_id + "-own")
        gplan = plan_gate(g, None, [fleet_node(n, state=states.get(n), **{
            k: v for k, v in views[n].__dict__.items() if k in ("boot_id", "unschedulable", "annotations")})
            for n in names], gates=[g], now=NOW)
        for n, update in gplan.updates.items():
            if update.state is not None:
                states[n] = update.state
        part = gate_staging(g, gplan, dict(states), catalog=CATALOG, ahead=2)
        pods = [p for p, _ in staging.values()]
        splan = plan_stagings({"g": part}, pods, limit)
        running = sum(1 for p in pods if not p.ended)
        assert running + len(splan.create) + len(splan.undo) <= max(limit, running)
        assert splan.undo == [] and splan.undo_failed == []  # nothing stops, pauses or changes here
        for name in splan.delete:
            staging.pop(name, None)
        for cand in splan.create:
            staging[cand.pod] = (StagingPod(cand.pod, "g", cand.node, "staging", "running"),
                                 StagePod(cand.pod, "staging", "running", cand.steps))
        in_round = [n for n in names if n in states and states[n].status == "in-progress"]
        assert len(in_round) <= budget
        for n in in_round:
            s = states[n]
            name = staging_pod_name("g", n, staging_steps(g, s, CATALOG))
            seen = staging[name][1] if name in staging else None
            d = look(g, s, n=views[n], staging=seen, stage_pods=round_pods[n])
            if d.node.unschedulable:
                assert seen is not None and seen.phase == "succeeded", f"{n} cordoned before its staging"
                cordoned.add(n)
            states[n] = d.state or s
            views[n] = _apply_node(views[n], d)
            for pod_name in d.delete_pods:
                round_pods[n].pop(pod_name, None)
            for req in d.create_pods:
                round_pods[n][req.name] = ran(req)
                if req.interrupt is not None:
                    interrupted.add(n)
                    views[n] = replace(views[n], boot_id=views[n].boot_id + "'")
        if all(n in states and states[n].status == "complete" for n in names):
            break
    assert all(states[n].status == "complete" for n in names), {n: s.status for n, s in states.items()}
    own = {f"n{i}" for i in reboots_on_their_own}
    assert not own & (cordoned | interrupted)
    assert set(names) - own <= cordoned & interrupted
