"""The watcher's merge of the node and pod watches: the checker sees changes in etcd's order."""

from __future__ import annotations

from typing import Any

from gate.testing.events import Blind, Change, Event, Relist
from gate.testing.watcher import RevisionMerge


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


def change(kind: str, name: str, rv: int) -> Change:
    return Change(kind, "MODIFIED", obj(name, rv), rv)  # type: ignore[arg-type]


def started() -> tuple[RevisionMerge, list[Event]]:
    fed: list[Event] = []
    merge = RevisionMerge(fed.append)
    merge.relisted("nodes", [], 0, 10, initial=True)
    merge.relisted("pods", [], 0, 10, initial=True)
    fed.clear()
    return merge, fed


def revisions(fed: list[Event]) -> list[int]:
    return [e.rv for e in fed if isinstance(e, Change)]


def test_an_event_waits_until_the_other_watch_has_passed_its_revision() -> None:
    merge, fed = started()
    merge.change(change("nodes", "n", 12))
    merge.change(change("nodes", "n", 14))
    assert fed == []  # the pod watch may still bring 11 or 13
    merge.change(change("pods", "j", 13))
    assert revisions(fed) == [12, 13]
    merge.advance("pods", 20)  # a bookmark: nothing else below 20 on the pod watch
    assert revisions(fed) == [12, 13, 14]


def test_specs_are_passed_on_at_once() -> None:
    merge, fed = started()
    gate = Change("nodegates", "ADDED", obj("g", 50), 50)
    merge.change(gate)
    assert fed == [gate]


def test_a_pod_relist_goes_to_the_start_of_its_window_and_a_node_relist_to_its_end() -> None:
    merge, fed = started()
    merge.change(change("nodes", "n", 12))
    merge.relisted("pods", [obj("j", 15)], 11, 20)  # the pod watch was blind from 12 to 20
    assert [type(e).__name__ for e in fed] == ["Relist", "Change"]  # the relist at 12 comes first
    fed.clear()
    merge.relisted("nodes", [obj("n", 18)], 12, 25)  # the node watch was blind from 13 to 25
    merge.change(change("pods", "j", 22))
    assert [(type(e).__name__, getattr(e, "rv", None)) for e in fed] == [("Blind", None), ("Change", 22)]
    assert isinstance(fed[0], Blind) and (fed[0].since, fed[0].until) == (12, 25)
    merge.flush()
    assert isinstance(fed[-1], Relist) and fed[-1].rv == 25


def test_flush_hands_over_everything_in_order() -> None:
    merge, fed = started()
    for kind, rv in (("nodes", 30), ("pods", 31), ("nodes", 33), ("pods", 32)):
        merge.change(change(kind, "x", rv))
    merge.flush()
    assert revisions(fed) == [30, 31, 32, 33]
