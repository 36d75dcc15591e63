"""The SubjectAccessReviewer with a fake AccessReviews (the seam to the API server): each question once
per request, answers cached (allowed and denied) and bounded in number, reviews bounded in flight
overall and per request, identical questions in flight shared, failures never cached."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gate.admission.authz import AnswerCache, PrioritySlots, SubjectAccessReviewer
from gate.admission.rules.review import AccessCheck, UserInfo, Violation


def check(name: str = "p", *, user: str = "alice", groups: tuple[str, ...] = ("devs",), uid: str = "",
          extra: dict[str, list[str]] | None = None, verb: str = "use", resource: str = "packages",
          namespace: str = "", where: str = "") -> AccessCheck:
    return AccessCheck(user=UserInfo(username=user, groups=list(groups), uid=uid, extra=extra or {}), verb=verb,
                       group="nodegate.io", resource=resource, name=name, namespace=namespace,
                       denied=Violation(where or f"spec.packages[{name}]", "no", forbidden=True))


class FakeReviews:
    """Answers by a rule, counting reviews and the most in flight at once. Each review yields to the
    loop `steps` times, so concurrent askers really overlap; `gate`, when set, holds every review."""

    def __init__(self, rule: Callable[[AccessCheck], bool] = lambda c: True, steps: int = 3) -> None:
        self.rule = rule
        self.steps = steps
        self.asked: list[AccessCheck] = []
        self.in_flight = 0
        self.peak = 0
        self.gate: asyncio.Event | None = None
        self.fail_with: Exception | None = None

    async def review(self, c: AccessCheck) -> bool:
        self.asked.append(c)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            for _ in range(self.steps):
                await asyncio.sleep(0)
            if self.fail_with is not None:
                raise self.fail_with
            return self.rule(c)
        finally:
            self.in_flight -= 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_one_request_asks_each_question_once_and_answers_every_check() -> None:
    fake = FakeReviews(rule=lambda c: c.name != "secret-b")
    reviewer = SubjectAccessReviewer(fake)
    # 3 packages naming the same two Secrets: 6 checks of Secrets, 2 distinct questions, + 3 packages.
    checks = [check(p) for p in ("a", "b", "c")]
    for p in ("a", "b", "c"):
        for s in ("secret-a", "secret-b"):
            checks.append(check(s, verb="get", resource="secrets", namespace="ops",
                                where=f"spec.packages[{p}].env"))
    answers = await reviewer.answer(checks)
    assert answers == [True, True, True] + [True, False] * 3
    assert len(fake.asked) == 5
    assert reviewer.stats.checks == 9 and reviewer.stats.duplicates == 4 and reviewer.stats.sent == 5


async def test_allowed_and_denied_answers_are_cached_until_they_expire() -> None:
    fake = FakeReviews(rule=lambda c: c.name == "ok")
    clock = Clock()
    reviewer = SubjectAccessReviewer(fake, cache_seconds=10, clock=clock)
    assert await reviewer.answer([check("ok"), check("no")]) == [True, False]
    clock.now += 9.9
    assert await reviewer.answer([check("ok"), check("no")]) == [True, False]
    assert len(fake.asked) == 2 and reviewer.stats.cache_hits == 2
    assert reviewer.stats.allowed == 1 and reviewer.stats.denied == 1
    clock.now += 0.1
    assert await reviewer.answer([check("ok"), check("no")]) == [True, False]
    assert len(fake.asked) == 4


@pytest.mark.parametrize("other", [
    check(user="bob"), check(groups=("devs", "admins")), check(uid="1234"), check(extra={"scopes": ["x"]}),
    check(verb="get"), check(resource="secrets"), check(namespace="ops"), check(name="q"),
])
async def test_a_cached_answer_is_only_for_the_same_question(other: AccessCheck) -> None:
    """Every part of the question is in the key: a "yes" for alice never answers bob, a group, an
    extra or a uid of its own, another verb, resource, namespace or name."""
    fake = FakeReviews(rule=lambda c: c == check())
    reviewer = SubjectAccessReviewer(fake)
    assert await reviewer.answer([check()]) == [True]
    assert await reviewer.answer([other]) == [False]
    assert len(fake.asked) == 2


async def test_groups_in_another_order_are_the_same_question() -> None:
    fake = FakeReviews()
    reviewer = SubjectAccessReviewer(fake)
    await reviewer.answer([check(groups=("a", "b"))])
    await reviewer.answer([check(groups=("b", "a"))])
    assert len(fake.asked) == 1


def test_the_cache_keeps_at_most_max_entries_and_drops_the_least_recently_used() -> None:
    cache = AnswerCache(ttl=10, max_entries=2)
    cache.put(("a",), True, 0)
    cache.put(("b",), False, 0)
    assert cache.get(("a",), 1) is True  # a is now the most recently used
    cache.put(("c",), True, 1)
    assert len(cache) == 2
    assert cache.get(("b",), 1) is None
    assert cache.get(("a",), 1) is True and cache.get(("c",), 1) is True


def test_a_cache_of_zero_seconds_keeps_nothing() -> None:
    cache = AnswerCache(ttl=0, max_entries=10)
    cache.put(("a",), True, 0)
    assert cache.get(("a",), 0) is None and len(cache) == 0


async def test_a_large_cache_bound_holds_under_many_questions() -> None:
    fake = FakeReviews(steps=0)
    reviewer = SubjectAccessReviewer(fake, max_entries=100, per_request=16)
    await reviewer.answer([check(f"p{i}") for i in range(1000)])
    assert len(reviewer.cache) == 100


async def test_reviews_in_flight_are_bounded_for_the_whole_process() -> None:
    fake = FakeReviews(steps=5)
    reviewer = SubjectAccessReviewer(fake, max_in_flight=6, per_request=4)
    await asyncio.gather(*(reviewer.answer([check(f"r{r}-{i}") for i in range(20)]) for r in range(10)))
    assert len(fake.asked) == 200
    assert fake.peak == 6  # reached, never passed


async def test_reviews_in_flight_are_bounded_per_request() -> None:
    fake = FakeReviews(steps=5)
    reviewer = SubjectAccessReviewer(fake, max_in_flight=64, per_request=3)
    await reviewer.answer([check(f"p{i}") for i in range(50)])
    assert fake.peak == 3


async def test_a_small_request_is_not_queued_behind_a_large_ones_questions() -> None:
    """A write with 1,000 questions is under way; a write with one question arrives: its review is
    among the first few sent, not the 1,001st."""
    fake = FakeReviews(steps=5)
    reviewer = SubjectAccessReviewer(fake, max_in_flight=8, per_request=4)
    large = asyncio.create_task(reviewer.answer([check(f"big-{i}") for i in range(1000)]))
    await asyncio.sleep(0)
    small = asyncio.create_task(reviewer.answer([check("mine", user="bob")]))
    await small
    position = next(i for i, c in enumerate(fake.asked) if c.user.username == "bob")
    assert position <= 8, position
    assert not large.done()
    await large


async def test_a_small_request_goes_first_even_when_a_large_one_may_fill_every_slot() -> None:
    """Fairness by priority alone (no per-request bound): the large write's 1,000 questions wait
    behind the small write's one, which needs only the next free slot."""
    fake = FakeReviews(steps=5)
    reviewer = SubjectAccessReviewer(fake, max_in_flight=8, per_request=1000)
    large = asyncio.create_task(reviewer.answer([check(f"big-{i}") for i in range(1000)]))
    await asyncio.sleep(0)
    await reviewer.answer([check("mine", user="bob")])
    position = next(i for i, c in enumerate(fake.asked) if c.user.username == "bob")
    assert position <= 8, position
    await large


async def test_slots_go_to_the_lowest_priority_number_then_in_arrival_order() -> None:
    slots = PrioritySlots(1)
    await slots.acquire(0)
    order: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        await slots.acquire(priority)
        order.append(name)
        slots.release()

    tasks = [asyncio.create_task(waiter(n, p)) for n, p in (("big-1", 100), ("small", 1), ("big-2", 100))]
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*tasks)
    assert order == ["small", "big-1", "big-2"]
    assert slots.free == 1


async def test_a_cancelled_waiter_loses_no_slot() -> None:
    slots = PrioritySlots(1)
    await slots.acquire(0)
    gone = asyncio.create_task(slots.acquire(1))
    stays = asyncio.create_task(slots.acquire(2))
    await asyncio.sleep(0)
    gone.cancel()
    slots.release()
    await stays  # the slot went past the cancelled waiter
    slots.release()
    assert slots.free == 1 and gone.cancelled()


async def test_identical_questions_in_flight_share_one_review() -> None:
    fake = FakeReviews()
    fake.gate = asyncio.Event()
    reviewer = SubjectAccessReviewer(fake)
    askers = [asyncio.create_task(reviewer.answer([check("p")])) for _ in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    fake.gate.set()
    assert await asyncio.gather(*askers) == [[True]] * 5
    assert len(fake.asked) == 1 and reviewer.stats.shared == 4


async def test_an_asker_that_gives_up_cancels_nobody_elses_answer() -> None:
    fake = FakeReviews()
    fake.gate = asyncio.Event()
    reviewer = SubjectAccessReviewer(fake)
    first = asyncio.create_task(reviewer.answer([check("p")]))
    await asyncio.sleep(0)
    second = asyncio.create_task(reviewer.answer([check("p")]))
    for _ in range(3):
        await asyncio.sleep(0)
    first.cancel()
    fake.gate.set()
    assert await second == [True]
    assert first.cancelled()
    assert await reviewer.answer([check("p")]) == [True]  # and the cache learnt it
    assert len(fake.asked) == 1


async def test_a_failed_review_is_raised_and_not_cached() -> None:
    fake = FakeReviews()
    fake.fail_with = ConnectionError("API server gone")
    reviewer = SubjectAccessReviewer(fake)
    with pytest.raises(ConnectionError, match="API server gone"):  # as such, for the server to answer
        await reviewer.answer([check("p"), check("q")])
    fake.fail_with = None
    assert await reviewer.answer([check("p"), check("q")]) == [True, True]
    assert reviewer.stats.failed >= 1 and reviewer.stats.in_flight == 0


async def test_the_metrics_count_reviews_sent_and_checks_answered_without_one() -> None:
    from prometheus_client import generate_latest

    from gate.admission.server import Metrics

    reviewer = SubjectAccessReviewer(FakeReviews(rule=lambda c: c.name == "ok"))
    await reviewer.answer([check("ok"), check("ok"), check("no")])
    await reviewer.answer([check("ok")])
    metrics = Metrics()
    metrics.watch(reviews=reviewer.stats)
    text = generate_latest(metrics.registry).decode()
    assert "nodegate_admission_access_checks_total 4.0" in text
    assert 'nodegate_admission_access_checks_answered_without_review_total{by="duplicate"} 1.0' in text
    assert 'nodegate_admission_access_checks_answered_without_review_total{by="cache"} 1.0' in text
    assert "nodegate_admission_subject_access_reviews_sent_total 2.0" in text
    assert 'nodegate_admission_subject_access_reviews_total{result="denied"} 1.0' in text
