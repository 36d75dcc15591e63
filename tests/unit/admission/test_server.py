"""The webhook server over real TLS: reviews in, reviews out; bad input gets a 4xx with a message,
never a 5xx; probes and metrics; the certificate replaced while serving without a failed request."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz.strategies import json_paths, slot
from gate.admission.testing import FixedAuthorizer, StaticFacts
from gate.certs import pki
from tests.unit.admission.helpers import gate, package, review, ten_package_gate
from tests.unit.admission.server import Running, running_server


def post(srv: Running, path: str, body: bytes, content_type: str = "application/json",
         conn: Any = None) -> tuple[int, dict[str, Any] | str]:
    own = conn is None
    conn = conn or srv.connection()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        if own:
            conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data.decode(errors="replace")


@pytest.fixture(scope="module")
def srv() -> Iterator[Running]:
    readiness = gate(name="gpu", readinessTaint=True, nodeSelector={"matchLabels": {"gpu": "true"}})
    with running_server(facts=StaticFacts(gates=[readiness], policies=["fleet"])) as running:
        yield running


def test_valid_gate_is_allowed_and_answers_the_same_uid(srv: Running) -> None:
    status, body = post(srv, "/validate", json.dumps(review("NodeGate", "CREATE", ten_package_gate())).encode())
    assert status == 200 and isinstance(body, dict)
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"] == {"uid": "0000-1111", "allowed": True}


def test_invalid_gate_is_denied_with_field_and_reason(srv: Running) -> None:
    status, body = post(srv, "/validate", json.dumps(review("NodeGate", "CREATE", gate(waitTimeout="1d"))).encode())
    assert status == 200 and isinstance(body, dict)
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 422
    assert body["response"]["status"]["message"].startswith("spec.waitTimeout: '1d' is not a duration")
    assert body["response"]["status"]["details"]["causes"][0]["field"] == "spec.waitTimeout"


def test_denied_package_use_is_forbidden() -> None:
    with running_server(authorizer=FixedAuthorizer(allowed=False)) as srv:
        _, body = post(srv, "/validate", json.dumps(review("NodeGate", "CREATE", gate({"tuned": package()}))).encode())
    assert isinstance(body, dict) and body["response"]["status"]["code"] == 403
    assert 'may not use package "tuned"' in body["response"]["status"]["message"]


def test_node_create_is_patched_with_the_taint(srv: Running) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"gpu": "true"}}, "spec": {}}
    status, body = post(srv, "/mutate", json.dumps(review("Node", "CREATE", node)).encode())
    assert status == 200 and isinstance(body, dict)
    assert body["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/spec/taints",
                      "value": [{"key": "nodegate.io/runtime-required", "effect": "NoSchedule"}]}]


@pytest.mark.parametrize(("body", "content_type", "status", "message"), [
    (b"{not json", "application/json", 400, "not valid JSON"),
    (b"{}", "text/plain", 415, "content type must be application/json"),
    (b"[]", "application/json", 422, "not an AdmissionReview v1"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "application/json", 422,
     "request: Field required"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {}}}).encode(),
     "application/json", 422, "does not handle kind 'Pod'"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "request": {"uid": "u", "kind": {"group": "nodegate.io", "kind": "NodeGate"},
                             "operation": "CREATE"}}).encode(), "application/json", 422, "request.object is required"),
])
def test_bad_input_gets_a_4xx_with_a_message(srv: Running, body: bytes, content_type: str, status: int,
                                              message: str) -> None:
    got, answer = post(srv, "/validate", body, content_type)
    assert got == status
    assert isinstance(answer, dict) and message in answer["error"], answer


def test_oversized_body_is_refused_with_413() -> None:
    with running_server(max_body_bytes=1024) as srv:
        got, answer = post(srv, "/validate", b"{" + b" " * 4096 + b"}")
    assert got == 413 and isinstance(answer, dict) and "larger than 1024 bytes" in answer["error"]


def test_readyz_waits_for_a_serving_certificate() -> None:
    with running_server(load_certificate=False) as srv:
        assert srv.server.not_ready_reason() == "no serving certificate loaded yet"
        leaf = pki.issue(srv.ca, "webhook", hosts=["127.0.0.1"], server=True)
        srv.certificate.load(leaf.cert_pem, leaf.key_pem)
        conn = srv.connection()
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 200


def test_metrics_count_by_kind_operation_and_verdict(srv: Running) -> None:
    post(srv, "/validate", json.dumps(review("NodeGate", "CREATE", gate(waitTimeout="1d"))).encode())
    conn = srv.connection()
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    assert 'nodegate_admission_requests_total{kind="NodeGate",operation="CREATE",verdict="denied",webhook="validate"}' \
        in text
    assert "nodegate_admission_duration_seconds_bucket" in text


def test_certificate_swapped_while_serving_fails_no_request(srv: Running) -> None:
    """Clients hammer the server over fresh TLS connections while the certificate is replaced."""
    body = json.dumps(review("NodeGate", "CREATE", gate())).encode()
    failures: list[str] = []
    served: set[bytes] = set()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            conn = srv.connection()
            try:
                status, _ = post(srv, "/validate", body, conn=conn)
                sock = conn.sock
                assert isinstance(sock, ssl.SSLSocket)
                der = sock.getpeercert(binary_form=True)
                if der:
                    served.add(der)
                if status != 200:
                    failures.append(str(status))
            except Exception as exc:
                failures.append(repr(exc))
            finally:
                conn.close()

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(5):
            leaf = pki.issue(srv.ca, "webhook", hosts=["127.0.0.1"], server=True)
            srv.loop.call_soon_threadsafe(srv.certificate.load, leaf.cert_pem, leaf.key_pem)
            threading.Event().wait(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert len(served) >= 3  # the new certificates were really served


# -- fuzzing ----------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
SEEDS = [
    review("NodeGate", "CREATE", ten_package_gate()),
    review("NodeGate", "UPDATE", gate({"tuned": package("1.0.0")}), gate({"tuned": package("2.0.0")})),
    review("DeploymentPolicy", "CREATE", {"metadata": {"name": "p"}, "spec": {"compartments": [
        {"name": "a", "selector": {"matchLabels": {"a": "b"}}, "budget": {"count": 1},
         "strategy": {"linear": {}}}], "windows": [{"days": ["Mon"], "start": "01:00", "end": "02:00"}]}}),
    review("DeploymentPolicy", "DELETE", None, {"metadata": {"name": "fleet"}}),
    review("Node", "CREATE", {"metadata": {"name": "n", "labels": {"gpu": "true"}}, "spec": {}}),
    review("Node", "UPDATE", {"metadata": {"name": "n"}, "spec": {}},
           {"metadata": {"name": "n"}, "spec": {"taints": [{"key": "nodegate.io/runtime-required",
                                                            "effect": "NoSchedule"}]}}),
]


@st.composite
def mutated_reviews(draw: st.DrawFn) -> bytes:
    doc = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in json_paths(doc) if p]
        if not paths:
            break
        parent, key = slot(doc, draw(st.sampled_from(paths)))
        action = draw(st.sampled_from(["replace", "delete", "wrap"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(json_values)
        else:
            parent[key] = [parent[key]]
    raw = json.dumps(doc).encode()
    if draw(st.booleans()) and draw(st.booleans()):  # sometimes damage the bytes too
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.binary(max_size=8)) + raw[cut:]
    return raw


@pytest.fixture(scope="module")
def fuzz_conn(srv: Running) -> Iterator[Any]:
    conn = srv.connection()
    yield conn
    conn.close()


def _rule_failures(srv: Running) -> float:
    """How many requests a rule raised on: the server answers those politely, only this counter tells."""
    return sum(sample.value for family in srv.server.metrics.errors.collect() for sample in family.samples
               if sample.name.endswith("_total") and sample.labels.get("stage") == "rules")


def _never_5xx_nor_a_failed_rule(srv: Running, conn: Any, body: bytes, path: str) -> None:
    failed_before = _rule_failures(srv)
    try:
        status, answer = post(srv, path, body, conn=conn)
    except (ConnectionError, OSError):
        conn.close()
        raise
    assert status < 500, answer
    if status == 200:
        assert isinstance(answer, dict) and isinstance(answer["response"]["allowed"], bool)
    else:
        assert 400 <= status < 500 and isinstance(answer, dict) and answer["error"]
    # the counter is raised before the answer is written, so a failure of this request is already counted
    assert _rule_failures(srv) == failed_before, f"a rule raised on {body!r}"


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=mutated_reviews(), path=st.sampled_from(["/validate", "/mutate"]))
def test_mutated_reviews_never_get_a_5xx_nor_fail_a_rule(srv: Running, fuzz_conn: Any, body: bytes,
                                                          path: str) -> None:
    _never_5xx_nor_a_failed_rule(srv, fuzz_conn, body, path)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=256), json_values.map(lambda v: json.dumps(v).encode())),
       path=st.sampled_from(["/validate", "/mutate"]))
def test_random_bodies_never_get_a_5xx_nor_fail_a_rule(srv: Running, fuzz_conn: Any, body: bytes,
                                                        path: str) -> None:
    _never_5xx_nor_a_failed_rule(srv, fuzz_conn, body, path)


def test_a_rule_that_raises_is_denied_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the fuzz tests rely on: a raising rule is answered (not a 5xx) and shows in the counter."""
    from gate.admission.rules import decide

    def broken(*_: Any) -> Any:
        raise KeyError("spec")

    with running_server() as running:
        assert _rule_failures(running) == 0
        monkeypatch.setattr(decide, "validate", broken)
        status, answer = post(running, "/validate", json.dumps(review("NodeGate", "CREATE", gate())).encode())
        assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is False, answer
        assert "admission rules failed" in answer["response"]["status"]["message"]
        assert _rule_failures(running) == 1


# -- what a hostile client can do to the process ------------------------------------------------------

def _series(srv: Running, metric: str) -> list[str]:
    conn = srv.connection()
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return [line for line in text.splitlines() if line.startswith(metric + "{")]


def test_request_kinds_cannot_grow_the_metrics_without_bound(srv: Running, fuzz_conn: Any) -> None:
    """The kind label comes from the request; 300 invented kinds must not become 300 time series."""
    for i in range(300):
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "evil.example", "kind": f"Kind{i}"}, "operation": "CREATE",
            "object": {}}}).encode()
        status, _ = post(srv, "/validate", body, conn=fuzz_conn)
        assert status == 422
    series = _series(srv, "nodegate_admission_requests_total")
    assert not [s for s in series if "Kind1" in s], series
    assert any('kind="other"' in s for s in series), series
    assert len(series) < 40, len(series)


class _BrokenFacts:
    """Facts whose lookup raises what no one planned for (a RecursionError from a node annotation)."""

    synced = True

    async def facts(self, lookups: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")


def test_an_unexpected_lookup_failure_is_a_denial_not_a_5xx() -> None:
    from gate.admission.server import AdmissionServer

    with running_server() as running:
        running.server.facts = _BrokenFacts()
        update = review("NodeGate", "UPDATE", gate({"keep": package()}),
                        gate({"keep": package(), "gone": package(uninstall={"enabled": True})}))
        status, answer = post(running, "/validate", json.dumps(update).encode())
        assert status == 200 and isinstance(answer, dict), answer
        assert answer["response"]["allowed"] is False
        assert "could not look up" in answer["response"]["status"]["message"]
        node = review("Node", "CREATE", {"metadata": {"name": "n", "labels": {"gpu": "true"}}, "spec": {}})
        status, answer = post(running, "/mutate", json.dumps(node).encode())
        assert status == 200 and isinstance(answer, dict) and answer["response"]["allowed"] is True
        assert "patch" not in answer["response"] and "not mutated" in answer["response"]["warnings"][0]
        assert isinstance(running.server, AdmissionServer)
        errors = _series(running, "nodegate_admission_errors_total")
        assert any('stage="lookup"' in s and 'webhook="validate"' in s for s in errors), errors
