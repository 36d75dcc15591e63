"""The invariant checker on event sequences: each violation is caught, legal sequences raise nothing."""

from __future__ import annotations

from gate.api import keys
from gate.api.facts import FACTS_ANNOTATION, OperatorFacts
from gate.api.nodegate import NodeGate
from gate.controller.pods import stage_pod
from gate.controller.settings import OperatorSettings
from gate.lifecycle.node import PodRequest, Step, pod_name
from gate.testing.events import Blind, Change, Relist, dump_event, load_event, resource_version, slim
from gate.testing.findings import Violation
from gate.testing.invariants import InvariantChecker, replay
from tests.unit.testing.builders import Cluster, state

GATE = "fleet"


def judge(c: Cluster, *, converged: bool = False) -> list[Violation]:
    checker = InvariantChecker().feed_all(c.events)
    found = checker.finish()
    if converged:
        found += checker.check_converged()
    return found


def kinds(violations: list[Violation]) -> list[str]:
    return [v.kind for v in violations]


def legal_round(c: Cluster, node: str, *, gate: str = GATE, interrupt: bool = True, readiness: bool = False,
                round_: int = 1, generation: int = 1) -> None:
    """One round as the operator runs it: pick, cordon, stage, reboot, check, finish (uncordon, untaint)."""
    c.update(node, state={gate: state("in-progress", batch=1, round=round_, phase="idle")})
    if interrupt:
        c.update(node, cordon=gate, state={gate: state("in-progress", batch=1, round=round_, phase="drain",
                                                       cordoned=True)})
    apply = f"{node}-apply-{round_}"
    c.pod(apply, gate=gate, node=node, generation=generation)
    c.end_pod(apply)
    c.update(node, state={gate: state("in-progress", batch=1, round=round_, phase="stages", cordoned=interrupt,
                                      installed={"pkg": {"version": "1.0.0"}})})
    c.delete_pod(apply)
    if interrupt:
        reboot = f"{node}-reboot-{round_}"
        c.pod(reboot, gate=gate, node=node, interrupt="reboot")
        c.end_pod(reboot)
        if readiness:
            c.update(node, taint=True)  # the operator taints a node that rebooted before completing
        c.delete_pod(reboot)
        post = f"{node}-post-{round_}"
        c.pod(post, gate=gate, node=node, stages=("post-interrupt",), generation=generation)
        c.end_pod(post)
    c.update(node, state={gate: state("complete", round=round_, generation=generation,
                                      installed={"pkg": {"version": "1.0.0"}})},
             uncordon=interrupt, untaint=readiness)
    if interrupt:
        c.delete_pod(f"{node}-post-{round_}")


# -- legal sequences ------------------------------------------------------------------------------


def test_a_rollout_one_node_at_a_time_with_reboots_raises_nothing_and_exercises_every_check() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1}, readiness=True)
    for i in range(3):
        c.node(f"n{i}", tainted=True)
    for i in range(3):
        legal_round(c, f"n{i}", readiness=True)
    checker = InvariantChecker().feed_all(c.events)
    assert checker.finish() == []
    assert checker.converged()
    assert checker.check_converged() == []
    cov = checker.coverage
    assert (cov.disruptions_judged, cov.uncordons_judged, cov.interrupts_judged, cov.taint_lifts_judged,
            cov.pods_seen) == (3, 3, 3, 3, 9)
    assert cov.peaks[(GATE, "__default__")].disrupted == 1


def test_nodes_of_separate_compartments_may_be_disrupted_together() -> None:
    c = Cluster()
    c.policy("p", [{"name": "left", "selector": {"matchLabels": {"side": "left"}}, "budget": {"count": 1}}],
             default_budget={"count": 1})
    c.gate(GATE, policy="p")
    c.node("l", {"side": "left"})
    c.node("r", {"side": "right"})
    c.update("l", cordon=GATE, state={GATE: state("in-progress", batch=1)})
    c.update("r", cordon=GATE, state={GATE: state("in-progress", batch=1)})
    assert judge(c) == []


def test_a_percent_budget_is_a_ceiling_of_its_compartments_nodes_rounded_down() -> None:
    c = Cluster()
    c.gate(GATE, budget={"percent": 25})  # 8 nodes: 2 at once
    for i in range(8):
        c.node(f"n{i}")
    c.update("n0", state={GATE: state("in-progress", batch=1)})
    c.update("n1", state={GATE: state("in-progress", batch=1)})
    assert judge(c) == []
    c.update("n2", state={GATE: state("in-progress", batch=1)})
    [v] = judge(c)
    assert v.kind == "over-ceiling" and v.node == "n2"
    assert "3 nodes disrupted at once, ceiling 2 of 8 matched" in v.message


def test_the_operator_may_uncordon_after_its_stages_ended_and_someone_elses_cordon_is_not_judged() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", state={GATE: state("in-progress")}, annotations={keys.CORDONED_BY: None})
    c.update("n", cordon="someone")
    c.update("n", annotations={keys.CORDONED_BY: None})  # a person's cordon, no cordoned-by
    c.pod("j", gate=GATE, node="n")
    c.update("n", uncordon=True)
    assert judge(c) == []


# -- over-ceiling ---------------------------------------------------------------------------------


def test_two_nodes_in_progress_under_a_budget_of_one_is_over_the_ceiling() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    c.node("a")
    c.node("b")
    c.update("a", state={GATE: state("in-progress", batch=1)})
    c.update("b", state={GATE: state("in-progress", batch=2)})
    [v] = judge(c)
    assert (v.kind, v.gate, v.node) == ("over-ceiling", GATE, "b")
    assert "compartment __default__: 2 nodes disrupted at once, ceiling 1" in v.message


def test_staged_nodes_and_a_reboot_of_their_own_counted_as_the_interrupt_stay_under_the_budget() -> None:
    """Stage while serving (gate.lifecycle.staging): both nodes staged ahead while serving; n0's round is
    the usual one, n1 rebooted on its own after its staging, so its round (picked after n0's, within the
    budget of 1) is neither cordoned nor rebooted: its window's apply (the staged steps skipped) and its
    check after the interrupt run on the serving node. Nothing is over the ceiling, and a staging's apply
    followed by the window's apply is no duplicate stage."""
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    for n in ("n0", "n1"):
        c.node(n)
        c.pod(f"{n}-staging", gate=GATE, node=n, kind="staging")
        c.end_pod(f"{n}-staging")
    legal_round(c, "n0")
    c.delete_pod("n0-staging")  # its round passed its cordon: the round owns what was staged
    c.update("n1", state={GATE: state("in-progress", batch=2, round=1, phase="idle")})
    c.update("n1", state={GATE: state("in-progress", batch=2, round=1, phase="stages", ownReboot="boot-2")})
    c.pod("n1-apply", gate=GATE, node="n1")
    c.end_pod("n1-apply")
    c.delete_pod("n1-staging")
    c.pod("n1-post", gate=GATE, node="n1", stages=("post-interrupt",))
    c.end_pod("n1-post")
    c.update("n1", state={GATE: state("complete", round=1, installed={"pkg": {"version": "1.0.0"}})})
    c.delete_pod("n1-apply")
    c.delete_pod("n1-post")
    checker = InvariantChecker().feed_all(c.events)
    assert checker.finish() == [] and checker.check_converged() == []
    assert checker.coverage.peaks[(GATE, "__default__")].disrupted == 1
    # The same window's apply twice, without a failure between, is still a duplicate.
    c.pod("n1-apply-again", gate=GATE, node="n1")
    assert kinds(judge(c)) == ["duplicate-stage"]


def test_a_roll_back_round_is_judged_against_the_ceiling_like_any_round() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    c.node("a")
    c.node("b")
    back = {"to": "0123456789abcdef", "revision": 1, "rolloutHash": "fedcba9876543210", "batch": 1}
    c.update("a", state={GATE: state("in-progress", batch=1, rollback=back)})
    assert judge(c) == []
    c.update("b", state={GATE: state("in-progress", batch=1, rollback=back)})
    [v] = judge(c)
    assert (v.kind, v.node) == ("over-ceiling", "b")


def test_a_failed_node_still_cordoned_keeps_counting_against_the_ceiling() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    c.node("a")
    c.node("b")
    c.update("a", cordon=GATE, state={GATE: state("failed", cordoned=True)})
    c.update("b", state={GATE: state("in-progress", batch=2)})
    assert kinds(judge(c)) == ["over-ceiling"]


def test_cordons_count_per_compartment_of_the_policy() -> None:
    c = Cluster()
    c.policy("p", [{"name": "canary", "selector": {"matchLabels": {"ring": "canary"}}, "budget": {"count": 1}}])
    c.gate(GATE, policy="p")
    c.node("c1", {"ring": "canary"})
    c.node("c2", {"ring": "canary"})
    c.node("other")
    c.update("other", cordon=GATE)
    c.update("c1", cordon=GATE)
    assert judge(c) == []
    c.update("c2", cordon=GATE)
    [v] = judge(c)
    assert v.node == "c2" and "compartment canary" in v.message


def test_lowering_a_budget_is_not_a_violation_but_starting_another_node_above_it_is() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 2})
    for name in "abc":
        c.node(name)
    c.update("a", state={GATE: state("in-progress")})
    c.update("b", state={GATE: state("in-progress")})
    c.gate(GATE, budget={"count": 1}, generation=2)
    assert judge(c) == []
    c.update("c", state={GATE: state("in-progress")})
    assert kinds(judge(c)) == ["over-ceiling"]


def test_a_gate_first_seen_while_it_already_overruns_its_ceiling_is_judged() -> None:
    c = Cluster()
    c.node("a")
    c.node("b")
    c.update("a", state={GATE: state("in-progress")})
    c.update("b", state={GATE: state("in-progress")})
    c.gate(GATE, budget={"count": 1})
    [v] = judge(c)
    assert v.kind == "over-ceiling" and "already disrupted when the gate was first seen" in v.message


def test_a_gate_waiting_for_its_missing_policy_is_not_judged_until_the_policy_exists() -> None:
    c = Cluster()
    c.gate(GATE, policy="late")
    c.node("a")
    c.node("b")
    c.update("a", state={GATE: state("in-progress")})
    c.update("b", state={GATE: state("in-progress")})
    assert judge(c) == []
    c.policy("late", [], default_budget={"count": 1})
    assert kinds(judge(c)) == ["over-ceiling"]


# -- uncordoned during a stage --------------------------------------------------------------------


def test_uncordoning_while_a_stage_pod_of_the_gate_runs_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE, state={GATE: state("in-progress", cordoned=True)})
    c.pod("apply", gate=GATE, node="n")
    c.update("n", uncordon=True)
    [v] = judge(c)
    assert (v.kind, v.node) == ("uncordoned-during-stage", "n")
    assert "pod apply (stages: pkg apply)" in v.message


def test_a_stage_pod_whose_steps_all_ended_is_not_running_before_its_terminal_phase() -> None:
    """The kubelet writes the containers' ends first and the terminal phase once it stopped the
    sandbox: an uncordon in between finds nothing running; with a step still to run it would."""
    for outcome, step_left, expected in (("Succeeded", False, []), ("Failed", False, []),
                                         ("Succeeded", True, ["uncordoned-during-stage"])):
        c = Cluster()
        c.gate(GATE)
        c.node("n")
        c.update("n", cordon=GATE, state={GATE: state("in-progress", cordoned=True)})
        c.pod("apply", gate=GATE, node="n", stages=("apply", "config"))
        ended = c.end_pod("apply", outcome, phase="Running", emit=not step_left)
        if step_left:  # the first step's end written, the second's not yet
            status = ended["status"]
            status["containerStatuses"] = [{"name": "config-pkg", "state": {"running": {}}}]
            c.events.append(Change("pods", "MODIFIED", ended, resource_version(ended)))
        c.update("n", uncordon=True)
        assert kinds(judge(c)) == expected, (outcome, step_left)


def test_uncordoning_during_the_reboot_is_a_violation_and_after_it_is_not() -> None:
    for reboot_ended_first, expected in ((True, []), (False, ["uncordoned-during-stage"])):
        c = Cluster()
        c.gate(GATE)
        c.node("n")
        c.update("n", cordon=GATE)
        c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
        if reboot_ended_first:
            c.end_pod("reboot")
        c.update("n", uncordon=True)
        assert kinds(judge(c)) == expected


def test_a_deleted_pod_is_no_longer_running() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE)
    c.pod("apply", gate=GATE, node="n")
    c.delete_pod("apply")
    c.update("n", uncordon=True)
    assert judge(c) == []


def test_a_pod_of_another_gate_does_not_hold_this_gates_cordon() -> None:
    c = Cluster()
    c.gate(GATE)
    c.gate("other")
    c.node("n")
    c.update("n", cordon=GATE)
    c.pod("theirs", gate="other", node="n")
    c.update("n", uncordon=True)
    assert judge(c) == []


# -- interrupt without cordon ---------------------------------------------------------------------


def test_an_interrupt_pod_created_on_a_schedulable_node_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", state={GATE: state("in-progress")})
    c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
    [v] = judge(c)
    assert (v.kind, v.node) == ("interrupt-uncordoned", "n")


def test_an_interrupt_pod_on_a_node_someone_else_cordoned_is_fine() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon="a-person")
    c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
    assert judge(c) == []


# -- readiness taint ------------------------------------------------------------------------------


def test_lifting_the_readiness_taint_before_the_gate_completed_there_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: state("in-progress")})
    c.update("n", untaint=True)
    [v] = judge(c)
    assert (v.kind, v.node) == ("taint-lifted-early", "n")
    assert "status there is in-progress" in v.message


def test_the_taint_stays_until_every_readiness_gate_selecting_the_node_is_complete() -> None:
    c = Cluster()
    c.gate("first", readiness=True)
    c.gate("second", readiness=True)
    c.gate("plain", readiness=False)  # not a readiness gate: never waited for
    c.gate("elsewhere", readiness=True, selector={"pool": "gpu"})  # does not select the node
    c.node("n", tainted=True)
    c.update("n", state={"first": state("complete"), "plain": state("in-progress")})
    c.update("n", untaint=True)
    [v] = judge(c)
    assert (v.gate, v.kind) == ("second", "taint-lifted-early")
    assert "absent (never started)" in v.message


def test_lifting_the_taint_in_the_write_that_completes_the_last_readiness_gate_is_legal() -> None:
    c = Cluster()
    c.gate("first", readiness=True)
    c.gate("second", readiness=True)
    c.node("n", tainted=True)
    c.update("n", state={"first": state("complete")})
    c.update("n", state={"second": state("complete")}, untaint=True)
    assert judge(c) == []


def test_a_gate_being_deleted_no_longer_holds_the_taint() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True, deleting=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: None}, untaint=True)
    assert judge(c) == []


def test_an_unreadable_state_is_not_complete() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)
    c.node("n", tainted=True)
    c.update("n", annotations={keys.state_annotation(GATE): "{not json"})
    c.update("n", untaint=True)
    [v] = judge(c)
    assert "unreadable" in v.message


# -- duplicate stages -----------------------------------------------------------------------------


def test_the_same_stage_created_twice_is_a_duplicate() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("first", gate=GATE, node="n")
    c.end_pod("first")
    c.delete_pod("first")
    c.pod("again", gate=GATE, node="n")  # another round's name: same package, version, stage, generation
    [v] = judge(c)
    assert (v.kind, v.node) == ("duplicate-stage", "n")
    assert "pod again step pkg apply repeats pod first step pkg apply" in v.message
    assert "after it succeeded there" in v.message


def test_recreating_a_pod_under_its_own_name_is_a_duplicate() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE)
    c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
    c.delete_pod("reboot")
    c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
    assert kinds(judge(c)) == ["duplicate-stage"]


def test_a_stage_created_again_after_it_failed_is_a_retry() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("first", gate=GATE, node="n")
    c.end_pod("first", "Failed")
    c.pod("retry", gate=GATE, node="n")
    assert judge(c) == []


def test_a_stage_created_again_after_a_person_asked_for_a_rerun_is_a_retry() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("first", gate=GATE, node="n")
    c.end_pod("first")
    c.update("n", annotations={keys.rerun_annotation(GATE): "pkg/apply"})
    c.update("n", annotations={keys.rerun_annotation(GATE): None})
    c.pod("rerun", gate=GATE, node="n")
    assert judge(c) == []


def test_a_request_before_the_first_pod_does_not_excuse_the_second() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", annotations={keys.reset_annotation(GATE): "true"})
    c.update("n", annotations={keys.reset_annotation(GATE): None})
    c.pod("first", gate=GATE, node="n")
    c.end_pod("first")
    c.pod("again", gate=GATE, node="n")
    assert kinds(judge(c)) == ["duplicate-stage"]


def test_a_retry_pod_starting_at_the_failed_step_is_legal_for_it_and_the_steps_after_it() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("first", gate=GATE, node="n", stages=("apply", "config", "upgrade"))
    c.end_pod("first", "Failed", failed_step=1)  # apply done, config failed, upgrade never ran
    c.pod("retry", gate=GATE, node="n", stages=("config", "upgrade"))
    c.end_pod("retry")
    checker = InvariantChecker().feed_all(c.events)
    assert checker.finish() == []
    assert (checker.coverage.pods_seen, checker.coverage.steps_seen) == (2, 5)


def test_a_step_that_succeeded_in_a_failed_pod_run_again_in_the_retry_is_a_duplicate() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("first", gate=GATE, node="n", stages=("apply", "config"))
    c.end_pod("first", "Failed", failed_step=1)
    c.pod("retry", gate=GATE, node="n", stages=("apply", "config"))  # restarted from apply, which was done
    [v] = judge(c)
    assert (v.kind, v.node) == ("duplicate-stage", "n")
    assert "pod retry step pkg apply repeats pod first step pkg apply" in v.message
    assert "after it succeeded there" in v.message


def test_a_succeeded_step_in_a_later_pod_of_another_phase_is_a_duplicate_and_the_other_steps_are_not() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("stages", gate=GATE, node="n", steps=[("a", "apply"), ("b", "apply")])
    c.end_pod("stages")
    c.pod("checks", gate=GATE, node="n", steps=[("a", "post-interrupt"), ("b", "apply")])
    [v] = judge(c)
    assert "pod checks step b apply repeats pod stages step b apply" in v.message


def test_a_change_made_again_after_a_roll_back_took_it_away_is_legal() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("forward", gate=GATE, node="n", stages=("upgrade",), version="2.0.0", generation=2)
    c.end_pod("forward")
    c.pod("back", gate=GATE, node="n", stages=("apply",), version="1.0.0", generation=2)  # the roll-back
    c.end_pod("back")
    c.pod("resumed", gate=GATE, node="n", stages=("upgrade",), version="2.0.0", generation=2)
    assert judge(c) == []


def test_a_step_between_that_failed_or_kept_the_version_does_not_excuse_a_repeat() -> None:
    for between, outcome in ((("apply", "1.0.0"), "Failed"), (("config", "2.0.0"), "Succeeded")):
        c = Cluster()
        c.gate(GATE)
        c.node("n")
        c.pod("forward", gate=GATE, node="n", stages=("upgrade",), version="2.0.0", generation=2)
        c.end_pod("forward")
        stage, version = between
        c.pod("between", gate=GATE, node="n", stages=(stage,), version=version, generation=2)
        c.end_pod("between", outcome)
        c.pod("again", gate=GATE, node="n", stages=("upgrade",), version="2.0.0", generation=2)
        assert kinds(judge(c)) == ["duplicate-stage"], between


def test_the_same_step_twice_in_one_pod_is_a_duplicate() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("twice", gate=GATE, node="n", stages=("apply", "apply"))
    [v] = judge(c)
    assert v.kind == "duplicate-stage" and "twice in one pod" in v.message


def test_a_pod_deleted_while_running_and_created_again_is_a_duplicate_of_its_unfinished_step() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.pod("apply", gate=GATE, node="n")
    c.delete_pod("apply")  # by hand: the step was running on the host
    c.pod("apply", gate=GATE, node="n")
    [v] = judge(c)
    assert v.kind == "duplicate-stage" and "without a failure or a rerun request" in v.message


def test_an_interrupt_retried_in_its_round_after_it_failed_is_legal() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE)
    c.pod("reboot-0", gate=GATE, node="n", interrupt="reboot")
    c.end_pod("reboot-0", "Failed")
    c.pod("reboot-1", gate=GATE, node="n", interrupt="reboot")
    assert judge(c) == []


def test_stages_of_other_generations_versions_or_nodes_are_not_duplicates() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.node("m")
    c.update("n", cordon=GATE)
    c.pod("g1", gate=GATE, node="n", generation=1)
    c.pod("g2", gate=GATE, node="n", generation=2)
    c.pod("v2", gate=GATE, node="n", version="2.0.0", generation=2)
    c.pod("cfg", gate=GATE, node="n", stages=("config",), generation=2)
    c.pod("m1", gate=GATE, node="m", generation=1)
    c.pod("r1", gate=GATE, node="n", interrupt="reboot")
    c.pod("r2", gate=GATE, node="n", interrupt="reboot", round_=2)  # another round's reboot
    assert judge(c) == []


# -- after convergence ----------------------------------------------------------------------------


def test_a_node_left_cordoned_by_nodegate_after_convergence_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE, state={GATE: state("complete")})
    [v] = judge(c, converged=True)
    assert (v.kind, v.node) == ("left-cordoned", "n")


def test_a_node_left_tainted_after_every_readiness_gate_completed_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: state("complete")})
    [v] = judge(c, converged=True)
    assert (v.kind, v.node) == ("left-tainted", "n")


def test_a_cordon_or_taint_that_is_not_nodegates_is_left_alone() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: state("in-progress")})
    c.update("n", cordon="someone", annotations={keys.CORDONED_BY: None})
    checker = InvariantChecker().feed_all(c.events)
    assert not checker.converged()
    assert checker.check_converged() == []  # tainted: the gate is not complete there; cordon: a person's


# -- blind windows (a watch expired and relisted) -------------------------------------------------


def test_a_pod_that_ended_somewhere_in_a_blind_window_may_have_ended_before_an_uncordon_in_it() -> None:
    for ended, expected in ((True, []), (False, ["uncordoned-during-stage"])):
        c = Cluster()
        c.gate(GATE)
        c.node("n")
        c.update("n", cordon=GATE)
        c.pod("apply", gate=GATE, node="n")
        since = c.next_rv()  # the last revision the pod watch delivered before it expired
        if ended:
            c.end_pod("apply", emit=False)  # missed by the pod watch
        node = c.update("n", uncordon=True, emit=False)  # seen by the node watch, inside the window
        relist = Relist("pods", list(c.pods.values()), since, c.next_rv())
        # as the watcher merges them: the pod relist at the start of its window, then the uncordon
        c.events += [relist, Change("nodes", "MODIFIED", node, resource_version(node))]
        assert kinds(judge(c)) == expected


def test_a_pod_still_running_after_a_blind_window_was_running_throughout_it() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    c.update("n", cordon=GATE)
    c.pod("apply", gate=GATE, node="n")
    since = c.next_rv()
    node = c.update("n", uncordon=True, emit=False)
    c.relist("nodes", since)
    assert node["spec"]["unschedulable"] is False
    assert kinds(judge(c)) == ["uncordoned-during-stage"]


def test_a_transition_inside_a_node_blind_window_that_cannot_be_judged_is_counted_not_guessed() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)
    c.node("n", tainted=True)
    c.update("n", cordon=GATE)
    since = c.next_rv()
    c.update("n", state={GATE: state("in-progress")}, untaint=True, emit=False)
    c.pod("apply", gate=GATE, node="n")  # created inside the window: may not have run at the uncordon
    c.update("n", uncordon=True, emit=False)
    c.relist("nodes", since)
    checker = InvariantChecker().feed_all(c.events)
    assert checker.finish() == []
    assert checker.coverage.unverified == 2  # the taint removal and the uncordon
    assert checker.coverage.relists["nodes"] == 1


def test_an_interrupt_created_while_the_node_watch_is_blind_is_not_judged_on_a_stale_node() -> None:
    c = Cluster()
    c.gate(GATE)
    c.node("n")
    since = c.next_rv()
    c.update("n", cordon=GATE, emit=False)
    c.events.append(Blind("nodes", since, since + 10))
    c.pod("reboot", gate=GATE, node="n", interrupt="reboot")
    checker = InvariantChecker().feed_all(c.events)
    assert checker.finish() == []
    assert checker.coverage.unverified == 1


def test_a_relisted_fleet_over_its_ceiling_was_over_its_ceiling() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    c.node("a")
    c.node("b")
    since = c.next_rv()
    c.update("a", state={GATE: state("in-progress")}, emit=False)
    c.update("b", state={GATE: state("in-progress")}, emit=False)
    c.relist("nodes", since)
    assert kinds(judge(c)) == ["over-ceiling"]


# -- journals -------------------------------------------------------------------------------------


def test_a_journal_replays_to_the_same_verdict() -> None:
    c = Cluster()
    c.gate(GATE, budget={"count": 1})
    c.node("a")
    c.node("b")
    c.update("a", state={GATE: state("in-progress")})
    c.events.append(Blind("nodes", 1, 2))
    since = c.next_rv()
    c.update("b", state={GATE: state("in-progress")}, emit=False)
    c.relist("nodes", since)
    lines = [dump_event(e) for e in c.events]
    assert [load_event(line) for line in lines] == c.events
    assert [v.kind for v in replay(lines).finish()] == ["over-ceiling"]


def test_the_operators_own_stage_pod_slimmed_for_a_journal_keeps_its_steps_and_how_they_ended() -> None:
    gate = NodeGate.model_validate({
        "apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": {"name": GATE, "generation": 3, "uid": "u"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "test"}}, "packages": {
            "a": {"version": "1.2.0", "image": "registry.example.com/a"},
            "b": {"version": "2.0.0", "image": "registry.example.com/b"}}}})
    steps = (Step("a", "apply", "1.2.0/x", version="1.2.0"), Step("b", "config", "cfg", version="2.0.0"))
    request = PodRequest(pod_name(GATE, "n", 1, "stages", steps[0]), "stages", steps, round=1)
    pod = stage_pod(gate, "n", request, OperatorSettings(), OperatorFacts(node="n"))
    pod["metadata"] |= {"uid": "p1", "resourceVersion": "7"}
    pod["status"] = {"phase": "Failed", "initContainerStatuses": [
        {"name": c["name"], "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        for c in pod["spec"]["initContainers"]],
        "containerStatuses": [{"name": "apply-a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                              {"name": "config-b", "state": {"terminated": {"exitCode": 1, "message": "{...}"}}}]}
    slimmed = slim("pods", pod)
    assert FACTS_ANNOTATION in pod["metadata"]["annotations"]
    assert FACTS_ANNOTATION not in slimmed["metadata"]["annotations"]
    checker = InvariantChecker().feed_all([load_event(dump_event(Change("pods", "ADDED", slimmed, 7)))])
    [facts] = checker.pods.values()
    assert (facts.gate, facts.node, facts.kind, facts.round) == (GATE, "n", "stages", "1")
    assert [(s.package, s.stage, s.container, s.version, s.generation) for s in facts.steps] == [
        ("a", "apply", "apply-a", "1.2.0", "3"), ("b", "config", "config-b", "2.0.0", "3")]
    assert facts.succeeded == {"payload-a", "apply-a", "payload-b"}
    assert facts.failed_lo == 7 and facts.ended_lo == 7


def _hold(c: Cluster, node: str, gate: str = GATE, **kw: object) -> None:
    """The write that ends a joining node's last round: complete, untainted, cordoned and marked held-by."""
    c.update(node, state={gate: state("complete")}, cordon=gate,
             annotations={keys.CORDONED_BY: None, keys.HELD_BY: gate}, **kw)  # type: ignore[arg-type]


def test_a_hold_for_hand_off_in_the_write_that_lifts_the_taint_is_legal_and_outlives_convergence() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True, leave_cordoned=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: state("in-progress", batch=1, round=1, phase="idle")})
    _hold(c, "n", untaint=True)
    assert judge(c, converged=True) == []
    c.update("n", uncordon=True)  # the validator's uncordon: nothing NodeGate ran is cut short
    assert judge(c, converged=True) == []


def test_a_hold_nobody_asked_for_or_apart_from_the_taint_lift_or_after_a_release_is_a_violation() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True)  # no leaveCordoned
    c.node("n", tainted=True)
    _hold(c, "n", untaint=True)
    assert [(v.kind, v.node) for v in judge(c)] == [("hold-unasked", "n")]

    c = Cluster()
    c.gate(GATE, readiness=True, leave_cordoned=True)
    c.node("n", tainted=True)
    c.update("n", state={GATE: state("complete")}, untaint=True)  # a schedulable moment before the hold
    _hold(c, "n")
    [v] = judge(c)
    assert v.kind == "hold-unasked" and "lifted the readiness taint" in v.message

    c = Cluster()
    c.gate(GATE, readiness=True, leave_cordoned=True)
    c.node("n", tainted=True)
    c.update("n", annotations={keys.HAND_OFF_RELEASED: "2026-12-05T11:00:00Z"})
    _hold(c, "n", untaint=True)
    [v] = judge(c)
    assert v.kind == "hold-unasked" and "released" in v.message


def test_a_round_on_a_held_node_takes_no_budget() -> None:
    c = Cluster()
    c.gate(GATE, readiness=True, leave_cordoned=True, budget={"count": 1})
    c.node("held", tainted=True)
    c.node("m")
    _hold(c, "held", untaint=True)
    c.update("held", state={GATE: state("in-progress", batch=2, round=2, phase="idle")})
    c.update("m", state={GATE: state("in-progress", batch=2, round=1, phase="idle")})
    assert judge(c) == []
