"""How the status and the plan look: bars, plain text, rich, data."""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from gate.api.nodegate import NodeGate
from gate.cli.render import bar_segments, duration, plan_data, plan_text, render_rich, render_text, report_data
from gate.cli.report import Snapshot, build_reports
from gate.rollout import NodeSnapshot, simulate
from tests.unit.cli.builders import NOW, agent_summary, complete, failed, gate, iso, node, running


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=4, max_size=4),
       st.integers(min_value=1, max_value=80))
def test_a_bar_fills_its_width_and_shows_every_non_zero_count(counts: list[int], width: int) -> None:
    sizes = bar_segments(counts, width)
    if sum(counts) == 0:
        assert sizes == [0, 0, 0, 0]
        return
    assert sum(sizes) == width
    assert all(s == 0 for s, c in zip(sizes, counts, strict=True) if c == 0)
    if sum(1 for c in counts if c) <= width:
        assert all(s >= 1 for s, c in zip(sizes, counts, strict=True) if c)


def test_a_bar_is_proportional() -> None:
    assert bar_segments([1, 1, 1, 3], 30) == [5, 5, 5, 15]
    assert bar_segments([999, 0, 1, 0], 30) == [29, 0, 1, 0]


def _reports(seconds_offset: int = 0):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    nodes = [node("n1", states={"g": complete()}),
             node("n2", states={"g": running()}),
             node("n3", states={"g": failed(message=agent_summary("install", 1, "disk full"), cordoned=True)}),
             node("n4"), node("n5"), node("n6")]
    return build_reports(Snapshot([gate(interruptionBudget={"count": 2})], {}, nodes), NOW + timedelta(
        seconds=seconds_offset))


def test_plain_text_has_the_headline_a_bar_per_compartment_and_every_section() -> None:
    text = render_text(_reports())
    lines = text.splitlines()
    assert lines[0] == "NodeGate g  Unknown  1/6 complete  generation 1"
    # n1, n2 and n3 were picked together: batch 1 has three nodes
    assert "  __default__  [#####>>>>>!!!!!...............]   1/6    1     1     3        2  1 (size 3)  rolling" in (
        lines)
    assert "    __default__  n2  batch 1  running stages  for 42s" in lines
    assert ("    __default__  n3  pkg apply: StageFailed: step install exited 1: disk full "
            "(still cordoned by NodeGate)") in lines
    assert ("    __default__  3 nodes (n4, n5, n6)  batch-running: waits for batch 1 of __default__ to finish"
            in lines)


def test_without_durations_two_moments_of_the_same_state_render_the_same() -> None:
    assert render_text(_reports(0)) != render_text(_reports(5))
    assert render_text(_reports(0), durations=False) == render_text(_reports(5), durations=False)


def test_long_lists_are_cut_with_a_pointer_to_the_full_list() -> None:
    nodes = [node(f"n{i:02d}", states={"g": running()}) for i in range(20)]
    text = render_text(build_reports(Snapshot([gate()], {}, nodes), NOW), limit=5)
    assert "... and 15 more (`nodegate node list --gate g`)" in text
    assert text.count("running stages") == 5


def test_rich_output_carries_the_same_facts() -> None:
    console = Console(record=True, width=160, color_system=None)
    console.print(render_rich(_reports()))
    text = console.export_text()
    for fact in ("NodeGate g", "1/6 complete", "__default__", "In progress (1)", "Failed (1)",
                 "step install exited 1: disk full", "batch-running: waits for batch 1 of __default__ to finish"):
        assert fact in text, fact


def test_no_gates_is_said_plainly() -> None:
    assert render_text([]) == "No NodeGates.\n"


def test_data_output_is_json_with_camel_case_keys() -> None:
    data = report_data(_reports()[0])
    again = json.loads(json.dumps(data))
    assert again["compartments"][0]["inProgress"] == 1
    assert again["failed"][0] == {"node": "n3", "compartment": "__default__", "package": "pkg", "stage": "apply",
                                  "reason": "StageFailed", "message": "step install exited 1: disk full",
                                  "cordoned": True}
    assert again["inProgress"][0]["secondsInPhase"] == 42.0


def test_durations_read_like_a_person_would_write_them() -> None:
    assert [duration(s) for s in (None, 0, 59.9, 61, 3600 + 120)] == ["-", "0s", "59s", "1m01s", "1h02m"]


def test_the_plan_lists_batches_per_compartment_and_cuts_long_node_lists() -> None:
    g = NodeGate.model_validate(gate(interruptionBudget={"count": 3}))
    sim = simulate(g, None, [NodeSnapshot(f"n{i}", {"pool": "x"}) for i in range(8)])
    text = plan_text(sim, None, names_per_line=2)
    assert "  __default__: 8 nodes, at most 3 at once, 3 batches" in text
    assert [line.split()[1] for line in text.splitlines() if line.startswith("    batch")] == ["1", "2", "3"]
    assert ", +1 more" in text
    data = plan_data(sim, None)
    assert sorted(n for b in data["compartments"][0]["batches"] for n in b["nodes"]) == [f"n{i}" for i in range(8)]


def test_status_shows_each_package_tag_and_the_digest_its_pods_pull() -> None:
    digest = "sha256:" + "c0ffee" * 10 + "abcd"
    raw = gate(interruptionBudget={"count": 2})
    raw["status"] = {**(raw.get("status") or {}), "images": [
        {"package": "pkg", "reference": "registry.example.com/pkg:1.0.0", "digest": digest}]}
    [report] = build_reports(Snapshot([raw], {}, [node("n1")]), NOW)
    assert "    pkg  registry.example.com/pkg:1.0.0  sha256:c0ffeec0ffee" in render_text([report]).splitlines()
    assert report_data(report)["images"] == [{"package": "pkg", "reference": "registry.example.com/pkg:1.0.0",
                                              "digest": digest}]
    console = Console(width=200, record=True)
    console.print(render_rich([report]))
    assert "registry.example.com/pkg:1.0.0" in console.export_text()


def test_status_and_plan_show_the_soak_time_left_of_a_soaking_node() -> None:
    soaking = running(phase="soak", soak_until=iso(NOW + timedelta(minutes=7, seconds=30)))
    [report] = build_reports(Snapshot([gate(interruptionBudget={"count": 1})], {}, [node("n1", states={
        "g": soaking})]), NOW)
    [active] = report.active
    assert active.soak_left == 450 and "soaking" in active.doing
    assert "soak left 7m30s" in render_text([report])
    assert report_data(report)["inProgress"][0]["soakLeftSeconds"] == 450
    g = NodeGate.model_validate(gate(interruptionBudget={"count": 1}))
    sim = simulate(g, None, [NodeSnapshot("n1", {"pool": "x"})])
    assert "soak left: n1 7m30s" in plan_text(sim, None, soaking={"n1": 450})
    assert plan_data(sim, None, {"n1": 450})["compartments"][0]["batches"][0]["soakLeftSeconds"] == {"n1": 450}
