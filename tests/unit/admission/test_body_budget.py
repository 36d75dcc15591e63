"""Request bodies held at once are bounded: a body claims its declared length before it is read; what
does not fit is answered 429 at once, a quarter of the budget stays for small bodies, a declared
length above the per-body limit is answered 413 before a byte of it is read, and a client that goes
away mid-body gives its claim back."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from gate.admission.bodies import BodyBudget
from gate.admission.server import AdmissionServer
from gate.admission.testing import FixedAuthorizer, StaticFacts
from gate.certs.reload import ReloadableCertificate
from tests.unit.admission.helpers import gate, review
from tests.unit.admission.server import Running, running_server

KIB = 1024


def test_claims_fit_in_the_budget_and_are_given_back() -> None:
    budget = BodyBudget(1024 * KIB, small=64 * KIB)
    assert budget.take(500 * KIB) and budget.take(268 * KIB)  # 768 KiB of large bodies: three quarters
    assert not budget.take(65 * KIB)  # a large one more does not fit in the large share
    assert budget.take(64 * KIB)  # a small one does: the reserved quarter
    assert budget.refused == 1 and budget.held == 832 * KIB
    budget.give(500 * KIB)
    budget.give(268 * KIB)
    budget.give(64 * KIB)
    assert budget.held == 0 and budget.held_large == 0


def test_small_bodies_cannot_overrun_the_whole_budget() -> None:
    budget = BodyBudget(256 * KIB, small=64 * KIB)
    assert all(budget.take(64 * KIB) for _ in range(4))
    assert not budget.take(1)


def test_a_budget_too_small_for_four_small_bodies_is_refused() -> None:
    with pytest.raises(ValueError, match="at least four small bodies"):
        BodyBudget(100 * KIB, small=64 * KIB)


def test_a_server_whose_budget_cannot_hold_one_largest_body_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one body of max_body_bytes"):
        AdmissionServer(facts=StaticFacts(), authorizer=FixedAuthorizer(), certificate=ReloadableCertificate(),
                        max_body_bytes=1024 * KIB, bodies=BodyBudget(1024 * KIB))


@contextmanager
def budget_server(total: int, max_body: int) -> Iterator[Running]:
    with running_server(max_body_bytes=max_body, bodies=BodyBudget(total)) as srv:
        yield srv


def open_body(srv: Running, length: int) -> ssl.SSLSocket:
    """A request whose headers declare `length` bytes of body, none of which is sent yet."""
    raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock = srv.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
    sock.sendall(f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode() + b"{")
    return sock


def status_of(sock: ssl.SSLSocket) -> int:
    head = sock.recv(65536)
    return int(head.split(b" ", 2)[1])


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30  # a hang guard, not a measure
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def post(sock_srv: Running, body: bytes) -> int:
    conn = sock_srv.connection()
    try:
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_bodies_over_the_budget_get_429_at_once_and_small_ones_still_pass() -> None:
    with budget_server(total=1024 * KIB, max_body=400 * KIB) as srv, ExitStack() as stack:
        # Two slow large bodies hold 800 KiB: more than the large share (768 KiB) would let in.
        held = [stack.enter_context(open_body(srv, 300 * KIB)) for _ in range(2)]
        wait_for(lambda: srv.server.bodies.held == 600 * KIB, "the two slow bodies claimed their length")
        third = stack.enter_context(open_body(srv, 300 * KIB))
        assert status_of(third) == 429  # answered while its body is still unsent
        small = json.dumps(review("NodeGate", "CREATE", gate())).encode()
        assert post(srv, small) == 200
        assert srv.server.bodies.refused == 1
        for sock in held:
            sock.close()  # gone mid-body: their claims come back
        wait_for(lambda: srv.server.bodies.held == 0, "the claims of the abandoned bodies were given back")


def test_a_declared_length_above_the_limit_gets_413_before_the_body_is_read() -> None:
    with budget_server(total=1024 * KIB, max_body=100 * KIB) as srv:
        with open_body(srv, 100 * KIB + 1) as sock:
            assert status_of(sock) == 413
        assert srv.server.bodies.held == 0


def test_metrics_show_the_body_budget() -> None:
    with budget_server(total=1024 * KIB, max_body=100 * KIB) as srv:
        conn = srv.connection()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    assert "nodegate_admission_body_bytes_held 0.0" in text
    assert "nodegate_admission_body_bytes_budget 1.048576e+06" in text
    assert "nodegate_admission_bodies_refused_total 0.0" in text


@pytest.mark.parametrize("allowed", [True, False])
def test_a_large_body_is_judged_like_a_small_one(allowed: bool) -> None:
    """Above 64 KiB the review is parsed and judged in the large-body thread: same verdict, same
    questions asked, each distinct one once."""
    env = [{"name": f"E{i}", "valueFrom": {"secretKeyRef": {"name": f"secret-{i % 40}-{'x' * 100}", "key": "k"}}}
           for i in range(128)]
    packages = {f"pkg-{chr(97 + p)}": {"version": "1.0.0", "image": f"ghcr.io/example/p{p}", "env": env}
                for p in range(8)}
    body = json.dumps(review("NodeGate", "CREATE", gate(packages))).encode()
    assert len(body) > 128 * KIB
    authorizer = FixedAuthorizer(allowed=allowed)
    with running_server(authorizer=authorizer) as srv:
        conn = srv.connection()
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())["response"]
    assert answer["allowed"] is allowed
    assert len(authorizer.asked) == 8 + 8 * 128  # every check of the rules reached the authorizer
    if not allowed:
        assert 'spec.packages[pkg-h].env[127].valueFrom.secretKeyRef' in answer["status"]["message"]


def test_a_chunked_body_claims_the_largest_size_and_gets_413_past_the_limit() -> None:
    with budget_server(total=1024 * KIB, max_body=100 * KIB) as srv:
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        with srv.client_context().wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            wait_for(lambda: srv.server.bodies.held == 100 * KIB, "the chunked body claimed the largest size")
            chunk = b"x" * (16 * KIB)
            try:
                for _ in range(8):  # 128 KiB: past the limit
                    sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            except OSError:
                pass  # the server may close as soon as it answered
            assert status_of(sock) == 413
        wait_for(lambda: srv.server.bodies.held == 0, "the claim was given back")


def test_json_nested_past_the_parsers_limit_gets_400() -> None:
    deep = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":' \
           b'{"kind":"NodeGate"},"operation":"CREATE","object":{"spec":' + b"[" * 100_000 + b"]" * 100_000 + b"}}}"
    with budget_server(total=1024 * KIB, max_body=256 * KIB) as srv:
        conn = srv.connection()
        conn.request("POST", "/validate", body=deep, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 400
        assert "not valid JSON" in json.loads(response.read())["error"]
        assert srv.server.bodies.held == 0
