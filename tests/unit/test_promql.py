"""The pure parts of the Prometheus client: reading answers and filling in the node."""

import re

import pytest

from gate.controller.endpoints import parse_endpoints
from gate.controller.promql import QueryFailed, Sample, node_query, node_series, samples_of, summarize

URL, QUERY = "main", "up"  # samples_of names the endpoint, never its address


def test_vector_gives_a_sample_per_series() -> None:
    body = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "ALERTS", "node": "n1"}, "value": [1.0, "1"]},
        {"metric": {"node": "n2"}, "value": [1.0, "0"]}]}}
    assert samples_of(URL, QUERY, body) == [Sample("1", {"__name__": "ALERTS", "node": "n1"}),
                                            Sample("0", {"node": "n2"})]
    assert samples_of(URL, QUERY, body)[0].describe() == 'ALERTS{node="n1"} => 1'


def test_empty_vector_is_no_samples_not_an_error() -> None:
    assert samples_of(URL, QUERY, {"status": "success", "data": {"resultType": "vector", "result": []}}) == []


def test_scalar_and_matrix() -> None:
    assert samples_of(URL, QUERY, {"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}}) \
        == [Sample("3")]
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"a": "b"}, "values": [[1, "1"], [2, "7"]]}]}}
    assert samples_of(URL, QUERY, matrix) == [Sample("7", {"a": "b"})]


@pytest.mark.parametrize(("body", "said"), [
    ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
    ([], "not a JSON object"),
    ({"status": "success"}, "no data"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}, "cannot be read"),
    ({"status": "success", "data": {"resultType": "histogram", "result": []}}, "unknown result type"),
])
def test_an_answer_that_is_not_a_result_raises_naming_server_and_query(body: object, said: str) -> None:
    with pytest.raises(QueryFailed) as caught:
        samples_of(URL, QUERY, body)
    assert said in str(caught.value) and URL in str(caught.value) and "'up'" in str(caught.value)


def test_node_is_filled_in_and_escaped() -> None:
    assert node_query('ALERTS{node="$NODE"}', "gpu-1") == 'ALERTS{node="gpu-1"}'
    assert node_query('x{node="$NODE"}', 'a"b\\') == 'x{node="a\\"b\\\\"}'


def test_a_summary_keeps_the_count_the_greatest_value_and_only_the_nodes_own_series() -> None:
    samples = [Sample("1", {"__name__": "ALERTS", "node": "gpu-1"}), Sample("NaN", {"instance": "gpu-1:9100"}),
               Sample("42", {"__name__": "aws_secret", "key": "AKIA"}), Sample("+Inf", {"node": "gpu-10"}),
               Sample("3")]
    summary = summarize(samples, "gpu-1")
    assert summary.count == 5 and summary.max_value == "+Inf"
    assert summary.own == ('ALERTS{node="gpu-1"} => 1', '{instance="gpu-1:9100"} => NaN')
    assert not any("AKIA" in s or "gpu-10" in s for s in summary.own)
    assert summarize([Sample("NaN", {"a": "b"})], "n").max_value == "NaN"
    assert summarize([], "n").count == 0
    assert node_series({"node": "n1"}, "n1") and node_series({"instance": "n1:9100"}, "n1")
    assert not node_series({"node": "n10"}, "n1") and not node_series({"instance": "n10:9100"}, "n1")


@pytest.mark.parametrize(("data", "said"), [
    ([], "a mapping of name to endpoint"),
    ({"Main": {"url": "http://p:9090"}}, "endpoint name 'Main'"),
    ({"main": {"url": "ftp://p"}}, "url must be an http(s) URL"),
    ({"main": {"url": "http://p", "tls": {}}}, "unknown key(s) tls"),
    ({"main": {"url": "http://p", "insecureSkipVerify": "yes"}}, "insecureSkipVerify must be true or false"),
    ({"main": {"url": "http://p", "bearerTokenFile": ""}}, "bearerTokenFile must be a path"),
])
def test_an_endpoints_file_that_is_wrong_says_which_entry_and_key(data: object, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_endpoints(data)


def test_an_endpoints_file_is_read_as_the_installer_wrote_it() -> None:
    found = parse_endpoints({"main": {"url": "https://prom.monitoring:9090/", "caFile": "/ca",
                                      "bearerTokenFile": "/t"}, "local": {"url": "http://127.0.0.1:9090"}})
    assert found["main"].url == "https://prom.monitoring:9090" and found["main"].ca_file == "/ca"
    assert found["local"].ssl() is True and found["local"].headers() == {}
    assert parse_endpoints(None) == {}


def test_an_error_never_carries_the_series_it_quotes() -> None:
    body = {"status": "error", "errorType": "execution", "error": 'found duplicate series for the match group '
            '{node="n1"} on the right hand-side of the operation: [{__name__="aws_secret", key="AKIA"}, '
            '{__name__="aws_secret", key="AKIB"}];many-to-many matching not allowed'}
    with pytest.raises(QueryFailed) as caught:
        samples_of(URL, QUERY, body)
    assert "AKIA" not in str(caught.value) and "many-to-many matching not allowed" in caught.value.problem
    assert "match group {…}" in caught.value.problem
    with pytest.raises(QueryFailed) as caught:
        samples_of(URL, QUERY, {"status": "error", "errorType": "bad_data", "error": "x" * 5000})
    assert len(caught.value.problem) < 400
