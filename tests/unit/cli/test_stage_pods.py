"""Which step of which stage pod `package logs` shows, how it reads, and the stage pods' own reading."""

from __future__ import annotations

from datetime import timedelta

from gate.cli import stagepods
from gate.cli.logs import pick_step, step_text, step_version
from gate.cli.report import Snapshot, build_reports
from tests.unit.cli.builders import NOW, PKG, gate, node, running, stage_pod

PACKAGES = {"a": {**PKG, "version": "2.1.0"}, "b": PKG}
STEPS: list[tuple[str | None, str]] = [("a", "apply"), ("b", "apply"), ("a", "config")]


def _pod(ends: list[str], *, created: timedelta = timedelta(), **kw: object) -> dict[str, object]:
    return stage_pod("g", "n1", STEPS, ends, packages=PACKAGES, created=NOW - created, **kw)  # type: ignore[arg-type]


def test_without_a_stage_it_shows_the_packages_last_step_that_ran_in_the_newest_pod() -> None:
    old = _pod(["done", "done", "failed"], created=timedelta(minutes=5))
    new = _pod(["done", "running"], attempt=1)
    pods = stagepods.of_node([old, new], "n1")
    assert pods == [new, old]

    picked = pick_step(pods, "a")
    assert picked is not None
    pod, step = picked
    assert pod is new and (step.container, step.phase) == ("apply-a", "succeeded")
    assert step_version(pod, step.container) == "2.1.0"
    picked = pick_step(pods, "b")
    assert picked is not None and (picked[1].container, picked[1].phase) == ("apply-b", "running")


def test_a_package_whose_steps_have_not_started_shows_its_first_step_and_a_stage_picks_its_own() -> None:
    pods = [_pod(["running"])]
    _, step = pick_step(pods, "a", "config") or (None, None)
    assert step is not None and (step.container, step.phase, step.ran) == ("config-a", "pending", False)
    _, step = pick_step(pods, "b") or (None, None)
    assert step is not None and step.container == "apply-b" and step_text(step, "running", "") == "pending"
    assert pick_step(pods, "a", "uninstall") is None
    assert pick_step(pods, "c") is None


def test_a_failed_step_reads_with_its_exit_code_and_the_agents_summary() -> None:
    pod = _pod(["done", "failed"])
    _, step = pick_step([pod], "b") or (None, None)
    assert step is not None and step_text(step, "failed", "") == "failed (exit code 1)"
    assert '"failedStep": "install"' in step.message
    _, never = pick_step([pod], "a", "config") or (None, None)
    assert never is not None
    assert step_text(never, "failed", "DeadlineExceeded: too long") == (
        "failed: it never ran, the pod failed (DeadlineExceeded: too long)")


def test_only_the_nodes_and_gates_pods_count_and_an_ended_pod_runs_no_step() -> None:
    other_node = stage_pod("g", "n2", [("b", "apply")], ["running"], packages=PACKAGES)
    other_gate = stage_pod("h", "n1", [("b", "apply")], ["running"], packages=PACKAGES)
    mine = _pod(["done", "done", "done"])
    assert stagepods.of_node([other_node, other_gate, mine], "n1", "g") == [mine]
    assert stagepods.current_step(mine) is None
    assert stagepods.running([other_node, other_gate, mine]) == {("g", "n2"): ("b apply",), ("h", "n1"): ("b apply",)}
    assert stagepods.has_package(mine, "a") and not stagepods.has_package(other_node, "a")


def test_a_step_in_turn_that_runs_before_its_turn_reads_as_pending() -> None:
    """Every step of a pod in turn runs from the pod's start (gate.controller.steporder): the one at its turn
    runs, those after it wait for theirs."""
    pod = _pod(["done", "running", "running"])
    assert [(s.container, s.phase) for s in stagepods.step_states(pod)] == [
        ("apply-a", "succeeded"), ("apply-b", "running"), ("config-a", "pending")]
    current = stagepods.current_step(pod)
    assert current is not None and current.container == "apply-b"


def test_without_permission_to_list_stage_pods_the_status_says_why_it_names_no_stage() -> None:
    snapshot = Snapshot([gate()], {}, [node("n1", states={"g": running()})], pods_visible=False)
    [report] = build_reports(snapshot, NOW, ["g"])
    assert "stage names unknown: no permission to list pods in the operator's namespace" in report.notes
    assert report.active[0].running == ()
