"""The arithmetic of leader election (gate.kube.fence): the leader stops acting before a standby may lead."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gate.kube.client import CONFIGMAPS, NODES, KubeClient
from gate.kube.config import Connection
from gate.kube.errors import ConnectionFailed, LeadershipLost
from gate.kube.fence import Fence, LeaseTiming


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("lease", "renew", "deadline", "named"), [
    (15, 5, 15, "renew_deadline (15) < lease_seconds (15)"),
    (15, 10, 10, "renew_seconds (10) < renew_deadline (10)"),
    (15, 0, 10, "0 < renew_seconds (0)"),
    (10, 5, 12, "renew_deadline (12) < lease_seconds (10)"),
])
def test_timings_that_let_two_leaders_act_are_refused_naming_the_durations(
        lease: float, renew: float, deadline: float, named: str) -> None:
    with pytest.raises(ValueError, match="must stop acting before a standby may take over") as err:
        LeaseTiming(lease, renew, deadline)
    assert named in str(err.value)


def test_the_margin_is_what_separates_the_leaders_last_moment_from_a_standbys_first() -> None:
    assert LeaseTiming(15, 5, 10).margin == 5


def test_the_fence_holds_from_the_send_of_the_renewal_not_from_its_answer() -> None:
    clock = Clock()
    fence = Fence(10, clock)
    assert not fence.holds()  # never led: nothing may be written
    fence.begin(sent=100.0)
    clock.now = 108.0  # the answer took 8 s: 2 s are left, not 10
    assert fence.holds() and fence.remaining() == pytest.approx(2.0)
    clock.now = 110.0
    assert not fence.holds()
    with pytest.raises(LeadershipLost, match="PATCH /api/v1/nodes/n1: not sent"):
        fence.check("PATCH /api/v1/nodes/n1")
    assert fence.refused == 1


def test_renewals_move_the_deadline_on_and_never_back() -> None:
    clock = Clock(100.0)
    fence = Fence(10, clock)
    fence.begin(sent=100.0)
    fence.extend(sent=105.0)
    assert fence.remaining() == pytest.approx(15.0)
    fence.extend(sent=103.0)  # an older renewal answered late
    assert fence.remaining() == pytest.approx(15.0)


def test_a_renewal_answered_after_the_term_ended_does_not_reopen_it() -> None:
    clock = Clock(100.0)
    fence = Fence(10, clock)
    fence.begin(sent=100.0)
    fence.revoke()
    fence.extend(sent=101.0)
    assert not fence.holds()
    fence.begin(sent=102.0)  # only a new term (the lease taken again) does
    assert fence.holds()


# A model of the protocol, every moment on one time line (monotonic clocks tick at the same rate):
# the leader sends renewal i at s_i; the API server applies it at a_i >= s_i; the answer reaches the
# leader at r_i >= a_i, which extends the fence only if the term is still open; the standby first
# sees a record at some o >= a_i and takes over lease_seconds after it first saw the last record.
@given(
    timing=st.tuples(st.floats(0.5, 5), st.floats(0.1, 5), st.floats(0.1, 10)).map(
        lambda t: LeaseTiming(lease_seconds=t[0] + t[1] + t[2], renew_seconds=t[0], renew_deadline=t[0] + t[1])),
    delays=st.lists(st.tuples(st.floats(0, 20), st.floats(0, 20), st.floats(0, 20)), min_size=1, max_size=12),
)
# Found by hypothesis: the two moments equal but for the last bit of a float.
@example(timing=LeaseTiming(lease_seconds=2.1625, renew_seconds=1.9375, renew_deadline=2.0625),
         delays=[(0.0, 0.0, 0.0)])
def test_the_fence_closes_before_any_standby_may_take_over(timing: LeaseTiming,
                                                           delays: list[tuple[float, float, float]]) -> None:
    clock = Clock(0.0)
    fence = Fence(timing.renew_deadline, clock)
    fence.begin(sent=0.0)
    last_applied_seen = 0.0  # when the standby first saw the newest record (the takeover's start: at a_0 >= 0)
    sent = 0.0
    answers: list[tuple[float, float]] = []  # (received, sent)
    for to_server, to_leader, to_standby in delays:
        sent += timing.renew_seconds
        applied = sent + to_server
        answers.append((applied + to_leader, sent))
        last_applied_seen = max(last_applied_seen, applied + to_standby)
    takeover = last_applied_seen + timing.lease_seconds
    # Replay the leader's view in time order: answers extend the fence when they arrive.
    for received, sent_at in sorted(answers):
        clock.now = received
        if fence.holds():
            fence.extend(sent_at)
    clock.now = takeover
    assert not fence.holds()
    # ... and it closed at least the margin before: a write let through at its last moment has that long
    # to reach the API server. With no delays the two moments are equal in exact arithmetic; in floats
    # (margin = lease - deadline, each a sum) they may differ in the last bit, hence the nanosecond.
    clock.now = takeover - timing.margin + 1e-9
    assert not fence.holds()


async def test_a_fenced_client_sends_no_write_after_the_deadline_but_still_reads() -> None:
    cfg = Connection("https://127.0.0.1:9")  # nothing listens: a request that goes out fails to connect
    clock = Clock(0.0)
    fence = Fence(10, clock)
    async with KubeClient(cfg, fence=fence, timeout=2) as client:
        with pytest.raises(LeadershipLost):
            await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "default")
        assert client.requests == 0  # refused before it was counted, let alone sent
        with pytest.raises(ConnectionFailed) as err:
            await client.get(CONFIGMAPS, "x", "default")
        assert not isinstance(err.value, LeadershipLost)
        assert client.requests == 1


def test_the_operator_refuses_to_start_with_timings_that_let_two_leaders_act(
        capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli.main import main

    assert main(["operator", "run", "--lease-seconds", "10", "--renew-deadline", "10"]) == 2
    err = capsys.readouterr().err
    assert "--renew-deadline" in err and "renew_deadline (10) < lease_seconds (10)" in err


def test_the_writes_the_fence_kept_back_are_a_metric() -> None:
    from prometheus_client import generate_latest

    from gate.controller.health import Health
    from gate.controller.metrics import OperatorMetrics
    from gate.controller.settings import OperatorSettings

    fence = Fence(10, Clock(0.0))
    client = KubeClient(Connection("https://127.0.0.1:9"), fence=fence)
    for _ in range(3):
        with pytest.raises(LeadershipLost):
            fence.check("POST /api/v1/namespaces/x/events")
    metrics = OperatorMetrics()
    Health(OperatorSettings(), client, metrics, lambda: False, lambda: False).sync_request_metrics()
    assert "nodegate_leader_writes_refused 3.0" in generate_latest(metrics.registry).decode()


@pytest.mark.parametrize(("method", "body", "expected"), [
    ("PATCH", {"metadata": {"resourceVersion": "7"}, "spec": {}}, True),
    ("PUT", {"metadata": {"name": "n", "resourceVersion": "7"}}, True),
    ("DELETE", {"preconditions": {"resourceVersion": "7"}}, True),
    ("PATCH", {"status": {"conditions": []}}, False),  # a node condition (strategic merge)
    ("PATCH", {"metadata": {"annotations": {"a": None}}}, False),  # a merge patch
    ("PATCH", [{"op": "remove", "path": "/spec/x"}], False),  # a JSON patch
    ("DELETE", None, False),
    ("DELETE", {"preconditions": {"uid": "u"}}, False),  # a uid is no compare-and-swap on the content
    ("POST", {"apiVersion": "policy/v1", "kind": "Eviction"}, False),
    ("POST", {"metadata": {"resourceVersion": "7"}}, False),  # a create: nothing to compare with
])
def test_a_write_is_versioned_only_when_the_api_server_compares_a_resource_version(
        method: str, body: object, expected: bool) -> None:
    from gate.kube.client import versioned

    assert versioned(method, body) is expected


def test_an_unversioned_write_gets_no_more_time_than_the_fence_has_left() -> None:
    clock = Clock(100.0)
    fence = Fence(10, clock)
    fence.begin(sent=100.0)
    clock.now = 107.5
    assert fence.budget("PATCH /api/v1/nodes/n1/status", 30.0) == pytest.approx(2.5)
    assert fence.budget("PATCH /api/v1/nodes/n1/status", 1.0) == pytest.approx(1.0)
    clock.now = 110.0
    with pytest.raises(LeadershipLost, match="PATCH /api/v1/nodes/n1/status: not sent"):
        fence.budget("PATCH /api/v1/nodes/n1/status", 30.0)


async def test_an_unversioned_write_is_abandoned_at_the_fence_and_a_versioned_one_is_not() -> None:
    """The work client's own timeout (30 s) outlives the renew deadline: an unversioned write still
    waiting for its answer is given up when the fence closes (the connection closed, the request
    cancelled in the API server); a versioned one may finish, a standby's write would make it fail."""
    import asyncio
    import time

    from aiohttp import web

    seen: list[str] = []

    async def slow(request: web.Request) -> web.Response:
        seen.append(request.method)
        await asyncio.sleep(1.0)
        return web.json_response({"metadata": {"name": "n1"}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/nodes/n1", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        fence = Fence(10)
        fence.begin(sent=time.monotonic() - 9.8)  # 0.2 s of the term left
        async with KubeClient(Connection(f"http://127.0.0.1:{port}"), fence=fence, timeout=30) as client:
            with pytest.raises(ConnectionFailed, match="PATCH /api/v1/nodes/n1"):
                await client.patch(NODES, "n1", {"metadata": {"annotations": {"a": "b"}}})
            fence.begin(sent=time.monotonic() - 9.8)
            done = await client.patch(NODES, "n1", {"metadata": {"resourceVersion": "3", "annotations": {"a": "b"}}})
            assert done["metadata"]["name"] == "n1"
        assert seen == ["PATCH", "PATCH"]  # both went out: the fence held when each was sent
    finally:
        await runner.cleanup()
