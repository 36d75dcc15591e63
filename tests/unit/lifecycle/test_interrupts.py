"""Merging interrupts: one per node and round, the strongest of what the packages ask for."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from gate.api.nodegate import Interrupt, InterruptType
from gate.api.state import INTERRUPT_RANK
from gate.lifecycle.interrupts import config_interrupts, merge

ORDER: list[InterruptType] = ["none", "drain", "service", "restartAllServices", "reboot"]


def _interrupt(kind: InterruptType, services: list[str] | None = None) -> Interrupt:
    return Interrupt(type=kind, services=services or (["s"] if kind == "service" else []))


def test_ranks_go_none_drain_service_restart_all_reboot() -> None:
    assert sorted(INTERRUPT_RANK, key=INTERRUPT_RANK.__getitem__) == ORDER
    assert set(INTERRUPT_RANK) == set(get_args(InterruptType))


def test_drain_is_stronger_than_none_and_weaker_than_every_restart() -> None:
    assert merge([None, Interrupt(), Interrupt(type="drain")]) == Interrupt(type="drain")
    for stronger in ("service", "restartAllServices", "reboot"):
        merged = merge([Interrupt(type="drain"), _interrupt(stronger), Interrupt(type="drain")])
        assert merged.type == stronger  # every stronger interrupt drains the node too


def test_service_keeps_the_union_of_the_units_next_to_a_drain() -> None:
    merged = merge([_interrupt("service", ["b"]), Interrupt(type="drain"), _interrupt("service", ["a", "b"])])
    assert merged == Interrupt(type="service", services=["a", "b"])


def test_nothing_asked_is_none() -> None:
    assert merge([]) == Interrupt()
    assert merge([None, None]) == Interrupt()


def test_a_drain_from_a_config_key_applies_to_a_change_of_that_key() -> None:
    rules = {"*.conf": Interrupt(type="drain"), "other": _interrupt("reboot")}
    assert config_interrupts(rules, ["a.conf"]) == [Interrupt(type="drain")]
    assert merge(config_interrupts(rules, ["a.conf", "other"])).type == "reboot"


@given(st.lists(st.sampled_from(ORDER), max_size=8), st.randoms(use_true_random=False))
def test_merge_keeps_the_strongest_whatever_the_order(kinds: list[InterruptType], rnd: object) -> None:
    items = [_interrupt(k) for k in kinds]
    shuffled = list(items)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    merged = merge(items)
    assert merged == merge(shuffled)
    assert INTERRUPT_RANK[merged.type] == max((INTERRUPT_RANK[k] for k in kinds), default=0)
    assert merged.services == (["s"] if merged.type == "service" else [])
