"""The pure parts of the Prometheus client: reading answers and filling in the node."""

import pytest

from gate.controller.promql import QueryFailed, Sample, node_query, samples_of

URL, QUERY = "http://prom:9090", "up"


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
