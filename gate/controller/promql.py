"""Prometheus instant queries over its HTTP API (`GET /api/v1/query`), for a node's health signals.

`instant_query(session, endpoint, query)` asks a Prometheus endpoint that the installer configured
(`gate.controller.endpoints`) to evaluate one PromQL expression now and returns the samples of its
result. A health signal is unhealthy when its result is not empty
(an alert that fires, a series above a threshold), so this module only says what came back; what it
means is decided in the pure core.

Decisions:

* **A result is data, a failure is an error.** An answer with `"status": "success"` returns its
  samples, possibly none; anything else (a connection refused, a timeout, an HTTP error, a PromQL
  error, a body that is not the API's) raises `QueryFailed`, naming the endpoint, the query and
  what went wrong (only the `errorType`/`error` of a Prometheus-shaped answer, its label sets
  blanked, never a body). A
  caller must never read a failed query as "no samples": that would pass a node nobody looked at.
* **Every result type is samples.** A vector gives one sample per series; a scalar or a string gives
  one sample with no labels; a matrix (a range selector at the top of the query) one per series with
  its newest value.
* **`$NODE` is the node.** `node_query` puts the node's name in place of `$NODE`, escaped as a
  PromQL string (node names are DNS subdomains, so this changes nothing for real names, but a query
  never becomes something its author did not write).
* **Bounded.** The request has a total timeout; the answer is read up to `MAX_BODY` bytes.
* **Only the endpoint is asked**: no redirect is followed (the token would go along).
* **Summarized, never copied** (`summarize`): what leaves the operator (a node's failure message, the
  gate's status) is how many samples came back, the greatest value, and the labels of the node's own
  series (a label whose value is the node's name, or `<node>:<port>`); another series is only counted.
  A query is the policy writer's, the series are everyone's: node status must not become a way to
  read any series in Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gate.controller.endpoints import PrometheusEndpoint

MAX_BODY = 4 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0
NODE_PLACEHOLDER = "$NODE"


class QueryFailed(Exception):
    """A query got no answer to read: the message names the endpoint, the query and the problem."""

    def __init__(self, endpoint: str, query: str, problem: str) -> None:
        super().__init__(f"Prometheus endpoint {endpoint} did not answer the query {query!r}: {problem}")
        self.endpoint = endpoint
        self.query = query
        self.problem = problem


@dataclass(frozen=True)
class Sample:
    """One element of a query's result: its labels (none for a scalar) and its value, as Prometheus
    wrote it (a decimal string, `NaN` or `+Inf` included)."""

    value: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """`{a="b", c="d"} => 1`, as the Prometheus UI shows a series."""
        if not self.labels:
            return self.value
        name = self.labels.get("__name__", "")
        rest = ", ".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()) if k != "__name__")
        return f"{name}{{{rest}}} => {self.value}"


def escape_string(text: str) -> str:
    """`text` as the inside of a double-quoted PromQL string."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def node_query(query: str, node: str) -> str:
    """The query with every `$NODE` replaced by the node's name, escaped for a PromQL string."""
    return query.replace(NODE_PLACEHOLDER, escape_string(node))


@dataclass(frozen=True)
class Summary:
    """What may be shown of a query's result: `count` samples, the greatest value (`max_value`, as
    Prometheus wrote it; NaN only when every value is NaN) and the node's own series, described."""

    count: int = 0
    max_value: str = ""
    own: tuple[str, ...] = ()


def node_series(labels: Mapping[str, str], node: str) -> bool:
    """The series is the node's: one of its labels is the node's name (`node="n1"`), or its host part
    (`instance="n1:9100"`)."""
    return any(value == node or value.rpartition(":")[0] == node for value in labels.values())


def summarize(samples: list[Sample], node: str, *, shown: int = 5) -> Summary:
    """The summary of `samples` for `node`: the count, the greatest value, at most `shown` of the
    node's own series."""
    best: tuple[float, str] | None = None
    for sample in samples:
        try:
            number = float(sample.value)
        except ValueError:
            continue
        if number != number:  # NaN orders with nothing
            continue
        if best is None or number > best[0]:
            best = (number, sample.value)
    highest = best[1] if best is not None else (samples[0].value if samples else "")
    own = tuple(s.describe() for s in samples if s.labels and node_series(s.labels, node))[:shown]
    return Summary(count=len(samples), max_value=highest, own=own)


MAX_ERROR = 300
_LABEL_SET = re.compile(r"\{[^{}]*\}")


def redacted(error: str) -> str:
    """A Prometheus error message without the label sets it may quote (an execution error such as
    "found duplicate series for the match group {...}" lists other series, which would leave through
    the node's status), at most `MAX_ERROR` characters."""
    text = _LABEL_SET.sub("{…}", error)
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR] + "…"


def samples_of(url: str, query: str, body: Any) -> list[Sample]:
    """The samples of an API answer (`{"status": "success", "data": {"resultType", "result"}}`);
    `QueryFailed` when it is an error or not the API's shape."""
    if not isinstance(body, dict):
        raise QueryFailed(url, query, "the answer is not a JSON object")
    if body.get("status") != "success":
        kind, error = body.get("errorType") or "error", body.get("error") or "no error message"
        raise QueryFailed(url, query, f"{redacted(str(kind))}: {redacted(str(error))}")
    data = body.get("data")
    if not isinstance(data, dict):
        raise QueryFailed(url, query, "the answer has no data")
    kind, result = data.get("resultType"), data.get("result")
    if not isinstance(result, list):
        raise QueryFailed(url, query, f"a {kind} answer without a result list")
    try:
        if kind in ("scalar", "string"):
            return [Sample(value=str(result[1]))]
        if kind == "vector":
            return [Sample(value=str(item["value"][1]), labels=dict(item.get("metric") or {})) for item in result]
        if kind == "matrix":
            return [Sample(value=str(item["values"][-1][1]), labels=dict(item.get("metric") or {}))
                    for item in result if item.get("values")]
    except (KeyError, IndexError, TypeError) as exc:
        raise QueryFailed(url, query, f"a {kind} result that cannot be read ({exc!r})") from exc
    raise QueryFailed(url, query, f"unknown result type {kind!r}")


async def instant_query(session: aiohttp.ClientSession, endpoint: PrometheusEndpoint, query: str, *,
                        timeout: float = DEFAULT_TIMEOUT) -> list[Sample]:
    """Evaluate `query` at the endpoint's current time; its samples, or `QueryFailed`."""
    name = endpoint.name
    try:
        async with session.post(endpoint.url + "/api/v1/query", data={"query": query},
                                headers=endpoint.headers(), ssl=endpoint.ssl(), allow_redirects=False,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if 300 <= response.status < 400:
                raise QueryFailed(name, query, f"HTTP {response.status}: a redirect, which is not followed")
            raw = await response.content.read(MAX_BODY + 1)
            if len(raw) > MAX_BODY:
                raise QueryFailed(name, query, f"the answer is larger than {MAX_BODY} bytes")
            try:
                body = json.loads(raw)
            except ValueError:
                raise QueryFailed(name, query, f"HTTP {response.status} with a body that is not JSON") from None
            if response.status >= 400 and not (isinstance(body, dict) and body.get("status") == "error"):
                raise QueryFailed(name, query, f"HTTP {response.status}")
            return samples_of(name, query, body)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise QueryFailed(name, query, str(exc) or type(exc).__name__) from exc
    except OSError as exc:  # the CA or token file of the endpoint cannot be read
        raise QueryFailed(name, query, f"the endpoint's files cannot be read: {exc}") from exc
