"""Prometheus instant queries over its HTTP API (`GET /api/v1/query`), for a node's health signals.

`instant_query(session, url, query)` asks a Prometheus server to evaluate one PromQL expression now
and returns the samples of its result. A health signal is unhealthy when its result is not empty
(an alert that fires, a series above a threshold), so this module only says what came back; what it
means is decided in the pure core.

Decisions:

* **A result is data, a failure is an error.** An answer with `"status": "success"` returns its
  samples, possibly none; anything else (a connection refused, a timeout, an HTTP error, a PromQL
  error, a body that is not the API's) raises `QueryFailed`, naming the server, the query and what
  went wrong. A caller must never read a failed query as "no samples": that would pass a node that
  nobody looked at.
* **Every result type is samples.** A vector gives one sample per series; a scalar or a string gives
  one sample with no labels; a matrix (a range selector at the top of the query) one per series with
  its newest value.
* **`$NODE` is the node.** `node_query` puts the node's name in place of `$NODE`, escaped as a
  PromQL string (node names are DNS subdomains, so this changes nothing for real names, but a query
  never becomes something its author did not write).
* **Bounded.** The request has a total timeout; the answer is read up to `MAX_BODY` bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

MAX_BODY = 4 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0
NODE_PLACEHOLDER = "$NODE"


class QueryFailed(Exception):
    """A query got no answer to read: the message names the server, the query and the problem."""

    def __init__(self, url: str, query: str, problem: str) -> None:
        super().__init__(f"Prometheus at {url} did not answer the query {query!r}: {problem}")
        self.url = url
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


def samples_of(url: str, query: str, body: Any) -> list[Sample]:
    """The samples of an API answer (`{"status": "success", "data": {"resultType", "result"}}`);
    `QueryFailed` when it is an error or not the API's shape."""
    if not isinstance(body, dict):
        raise QueryFailed(url, query, "the answer is not a JSON object")
    if body.get("status") != "success":
        kind, error = body.get("errorType") or "error", body.get("error") or "no error message"
        raise QueryFailed(url, query, f"{kind}: {error}")
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


async def instant_query(session: aiohttp.ClientSession, url: str, query: str, *,
                        timeout: float = DEFAULT_TIMEOUT) -> list[Sample]:
    """Evaluate `query` at the server's current time; its samples, or `QueryFailed`."""
    endpoint = url.rstrip("/") + "/api/v1/query"
    try:
        async with session.post(endpoint, data={"query": query},
                                timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            raw = await response.content.read(MAX_BODY + 1)
            if len(raw) > MAX_BODY:
                raise QueryFailed(url, query, f"the answer is larger than {MAX_BODY} bytes")
            try:
                body = json.loads(raw)
            except ValueError:
                raise QueryFailed(url, query, f"HTTP {response.status} with a body that is not JSON") from None
            if response.status >= 400 and not (isinstance(body, dict) and body.get("status") == "error"):
                raise QueryFailed(url, query, f"HTTP {response.status}")
            return samples_of(url, query, body)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise QueryFailed(url, query, str(exc) or type(exc).__name__) from exc
