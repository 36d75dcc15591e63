"""Planning the overlay: what is written, saved, removed and restored, decided from digests alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gate.agent.history import OverlayFile
from gate.agent.overlay import plan_install, plan_removal

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_first_install_writes_every_file_and_saves_the_host_files_it_replaces() -> None:
    plan = plan_install({"/etc/new.conf": A, "/etc/existing.conf": B}, [], {"/etc/new.conf": None,
                                                                             "/etc/existing.conf": C})
    assert plan.write == ["/etc/existing.conf", "/etc/new.conf"]
    assert plan.backup == ["/etc/existing.conf"]
    assert {f.path: f.backed_up for f in plan.owned} == {"/etc/existing.conf": True, "/etc/new.conf": False}


def test_a_host_file_identical_to_the_overlay_is_still_saved_so_uninstall_leaves_it() -> None:
    plan = plan_install({"/etc/same.conf": A}, [], {"/etc/same.conf": A})
    assert (plan.write, plan.backup) == ([], ["/etc/same.conf"])
    assert plan.owned[0].backed_up


def test_a_rerun_with_everything_in_place_changes_nothing() -> None:
    owned = [OverlayFile(path="/etc/x", sha256=A, backed_up=True)]
    plan = plan_install({"/etc/x": A}, owned, {"/etc/x": A})
    assert not plan.changes_host() and plan.backup == [] and plan.owned == owned


def test_a_file_changed_on_the_host_is_rewritten_without_saving_it_as_an_original() -> None:
    owned = [OverlayFile(path="/etc/x", sha256=A)]
    plan = plan_install({"/etc/x": A}, owned, {"/etc/x": B})
    assert (plan.write, plan.backup) == (["/etc/x"], [])


def test_an_upgrade_that_drops_a_file_removes_it_and_restores_what_it_had_replaced() -> None:
    owned = [OverlayFile(path="/etc/keep", sha256=A), OverlayFile(path="/etc/gone", sha256=B, backed_up=True),
             OverlayFile(path="/etc/gone-new", sha256=B)]
    plan = plan_install({"/etc/keep": C}, owned, {"/etc/keep": A, "/etc/gone": B, "/etc/gone-new": B})
    assert plan.write == ["/etc/keep"]
    assert plan.remove == ["/etc/gone", "/etc/gone-new"]
    assert plan.restore == ["/etc/gone"]
    assert [f.path for f in plan.owned] == ["/etc/keep"]


def test_removal_takes_every_file_away_and_restores_only_the_saved_ones() -> None:
    owned = [OverlayFile(path="/etc/b", sha256=A, backed_up=True), OverlayFile(path="/etc/a", sha256=B)]
    plan = plan_removal(owned)
    assert (plan.remove, plan.restore, plan.owned) == (["/etc/a", "/etc/b"], ["/etc/b"], [])


paths = st.sampled_from([f"/etc/f{i}" for i in range(6)])
digests = st.sampled_from([A, B, C])


@given(
    source=st.dictionaries(paths, digests),
    host=st.dictionaries(paths, digests),
    upgrade=st.dictionaries(paths, digests),
)
def test_install_upgrade_uninstall_restores_exactly_the_files_that_were_there_before(
    source: dict[str, str], host: dict[str, str], upgrade: dict[str, str]
) -> None:
    """Simulate the host as a dict through install, an upgrade to another overlay, and uninstall."""
    state: dict[str, str] = dict(host)
    saved: dict[str, str] = {}
    owned: list[OverlayFile] = []
    for overlay in (source, upgrade):
        involved = set(overlay) | {f.path for f in owned}
        plan = plan_install(overlay, owned, {p: state.get(p) for p in involved})
        for p in plan.backup:
            saved[p] = state[p]
        for p in plan.write:
            state[p] = overlay[p]
        for p in plan.remove:
            state.pop(p, None)
        for p in plan.restore:
            state[p] = saved.pop(p)
        owned = plan.owned
        assert {p: state[p] for p in overlay} == overlay
    removal = plan_removal(owned)
    for p in removal.remove:
        state.pop(p, None)
    for p in removal.restore:
        state[p] = saved.pop(p)
    assert state == host
