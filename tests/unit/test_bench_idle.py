"""bench.realnode.idle: a round's watch and API times become the gaps of each transition, each named
with who it waits on."""

from __future__ import annotations

import pytest

from bench.realnode.idle import NodeSeen, PodSeen, summary, transitions


def test_a_rounds_transitions_name_the_kubelet_the_operator_and_the_reboot() -> None:
    node = [NodeSeen(99.0, False, "boot-1", True), NodeSeen(100.0, True, "boot-1", True),
            NodeSeen(130.0, True, "boot-2", False), NodeSeen(131.0, True, "boot-2", True),
            NodeSeen(150.0, False, "boot-2", True)]
    pods = [
        PodSeen("apply", added=100.2, running=101.0, steps_ended=111.5, ended=112.5, created=100.0,
                first_start=101.0, last_finish=111.0),
        PodSeen("interrupt", reboot=True, added=111.6, running=112.0, steps_ended=133.0, created=111.0,
                first_start=112.0),
        PodSeen("post", added=133.1, running=134.0, ended=146.0, created=133.0, first_start=134.0,
                last_finish=145.0),
    ]
    gaps = {g.what: (g.who, g.seconds) for g in transitions(pods, node)}
    assert gaps["cordon -> apply created"] == ("operator", pytest.approx(0.2))
    assert gaps["apply: finished -> end seen"] == ("kubelet", pytest.approx(0.5))
    assert gaps["apply: end seen -> terminal phase seen"] == ("(kubelet)", pytest.approx(1.0))
    # The operator moves on at the first sign of the end, the containers' or the phase's.
    assert gaps["apply end seen -> interrupt created"] == ("operator", pytest.approx(0.1))
    assert gaps["interrupt: started -> new boot ID seen"] == ("reboot", pytest.approx(18.0))
    assert gaps["new boot ID seen -> node Ready seen"] == ("kubelet", pytest.approx(1.0))
    assert gaps["node Ready -> interrupt end seen (or gone)"] == ("kubelet", pytest.approx(2.0))
    assert gaps["node Ready -> post created"] == ("operator", pytest.approx(2.1))
    assert gaps["post end seen -> uncordon"] == ("operator", pytest.approx(4.0))
    totals = summary(transitions(pods, node))
    assert totals["operator, pod ended to next created (transitions)"] == 1.0
    assert totals["reboot"] == pytest.approx(18.0)


def test_a_moment_not_seen_leaves_its_gap_unmeasured_not_zero() -> None:
    gaps = transitions([PodSeen("apply", added=1.0)], [])
    assert [(g.what, g.seconds) for g in gaps] == [("apply: finished -> end seen", None)]


def test_a_reboot_the_kubelet_never_reported_running_is_timed_from_the_apis_start_of_its_step() -> None:
    """On a real node the reboot step often runs and takes the node down before the kubelet reports it
    running: the watch never sees it, and the reboot is timed from its step's start by the API's time."""
    node = [NodeSeen(100.0, True, "boot-1", True), NodeSeen(112.5, True, "boot-1", False),
            NodeSeen(130.0, True, "boot-2", False), NodeSeen(131.0, True, "boot-2", True)]
    pods = [PodSeen("apply", reboot=True, added=100.2, created=100.0, first_start=101.0)]
    unseen = {g.what: g.seconds for g in transitions(pods, node)}
    assert unseen["apply: started -> new boot ID seen"] is None
    gaps = {g.what: (g.who, g.seconds) for g in transitions(pods, node, reboot_started=112.0)}
    assert gaps["apply: started (API time, whole seconds) -> new boot ID seen"] == ("reboot", pytest.approx(18.0))
    assert gaps["new boot ID seen -> node Ready seen"] == ("kubelet", pytest.approx(1.0))
