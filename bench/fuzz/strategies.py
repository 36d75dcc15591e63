"""Hypothesis strategies for hostile input to NodeGate: AdmissionReview bodies (valid reviews of every
kind the webhook handles, then mutated) and raw requests (content types, paths, damaged bytes).

The seeds are reviews the API server really sends, chosen so that between them every lookup the
webhook makes is reached: a NodeGate naming a DeploymentPolicy (policy lookup, live on a cache miss),
an UPDATE removing an uninstall-enabled package (the nodes' state annotations, live), a
DeploymentPolicy DELETE (gates referencing it, live), packages (SubjectAccessReviews), a Node
CREATE (readiness gates from the cache) and a Node UPDATE removing the readiness taint (bypass SAR).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from gate.api.common import Obj

TAINT = {"key": "nodegate.io/runtime-required", "effect": "NoSchedule"}


def _gvk(kind: str) -> Obj:
    return {"group": "", "version": "v1", "kind": kind} if kind == "Node" else \
        {"group": "nodegate.io", "version": "v1alpha1", "kind": kind}


def review(kind: str, operation: str, obj: Obj | None, old: Obj | None = None, *, user: str = "alice",
           groups: tuple[str, ...] = ("system:authenticated",)) -> Obj:
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "fuzz-0000", "kind": _gvk(kind), "resource": {"group": _gvk(kind)["group"], "version": "v1",
                                                             "resource": kind.lower() + "s"},
        "operation": operation, "name": name, "object": obj, "oldObject": old, "dryRun": False,
        "userInfo": {"username": user, "uid": "u-1", "groups": list(groups), "extra": {}}}}


def _package(version: str = "1.0.0", **extra: Any) -> Obj:
    return {"version": version, "image": "registry.example.com:5000/team/tool", **extra}


def _gate(packages: Obj, name: str = "fuzz-gate", **spec: Any) -> Obj:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}, "packages": packages, **spec}}


def seeds() -> list[Obj]:
    full = _package("1.2.0", interrupt={"type": "service", "services": ["tuned"]}, config={"a.conf": "x"},
                    configInterrupts={"*.conf": {"type": "service", "services": ["tuned"]}},
                    dependsOn={"base": ">=1.0.0"}, env=[{"name": "A", "value": "b"}],
                    resources={"requests": {"cpu": "100m"}, "limits": {"memory": "256Mi"}}, timeout="30m",
                    retries=2, uninstall={"enabled": True})
    policy = {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "fleet"},
              "spec": {"default": {"budget": {"percent": 25}, "strategy": {"fixed": {"initialBatch": 1}}},
                       "compartments": [{"name": "canary", "selector": {"matchLabels": {"pool": "c"}},
                                         "budget": {"count": 1}, "strategy": {"exponential": {
                                             "initialBatch": 1, "growthFactor": 2}}}],
                       "windows": [{"days": ["Sat", "Sun"], "start": "01:00", "end": "05:00", "timeZone": "UTC"}]}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"pool": "gpu"}}, "spec": {}}
    tainted = {**node, "spec": {"taints": [TAINT]}}
    return [
        review("NodeGate", "CREATE", _gate({"base": _package(), "tuned": full}, deploymentPolicy="fleet")),
        review("NodeGate", "CREATE", _gate({"base": _package()}, readinessTaint=True, priority=5,
                                           interruptionBudget={"percent": 33}, waitTimeout="2h",
                                           drain={"timeout": "15m"}), user="mallory"),
        review("NodeGate", "UPDATE", _gate({"base": _package()}), _gate({"base": _package(), "tuned": full})),
        review("NodeGate", "UPDATE", _gate({"base": _package("2.0.0")}), _gate({"base": _package("1.0.0")})),
        review("DeploymentPolicy", "CREATE", policy),
        review("DeploymentPolicy", "DELETE", None, policy),
        review("Node", "CREATE", node, user="system:node:n1", groups=("system:nodes",)),
        review("Node", "UPDATE", node, tainted, user="bob"),
        review("Node", "UPDATE", node, tainted, user="x", groups=("system:masters",)),
    ]


# No lone surrogates: they cannot be encoded as UTF-8, so no client could send them.
text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=24)
json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False)
                | text | st.sampled_from(["", "1.0.0", "*", "../../etc", "a" * 300, "CREATE",
                                                          "NodeGate", "system:masters", "1d", "-1", "💥"]))
json_values = st.recursive(json_scalars, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(text, children, max_size=4), max_leaves=24)


def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and indexes), the root's empty path first."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += json_paths(v, (*prefix, i))
    return out


def slot(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    """The container that holds the value at a non-empty `path`, and its key or index there."""
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    return parent, path[-1]


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


# Most mutations go to what the rules read (the objects and the user); some to the envelope.
_RULES_READ = ("object", "oldObject", "userInfo")


@st.composite
def mutated_review(draw: st.DrawFn) -> Obj:
    doc = json.loads(json.dumps(draw(st.sampled_from(seeds()))))
    envelope = draw(st.integers(0, 9)) == 0
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in json_paths(doc) if p and (envelope or (len(p) > 2 and p[1] in _RULES_READ))]
        if not paths:
            break
        parent, key = slot(doc, draw(st.sampled_from(paths)))
        action = draw(st.sampled_from(["replace", "replace", "delete", "wrap", "deep", "huge", "add"]))
        if action == "delete":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(json_values)
        elif action == "wrap":
            parent[key] = [parent[key]]
        elif action == "deep":  # around the JSON parser's depth limit
            parent[key] = _nested(draw(st.sampled_from([50, 150, 190, 250, 400])))
        elif action == "huge":
            parent[key] = "x" * draw(st.sampled_from([1_000, 70_000, 300_000]))
        elif isinstance(parent[key], dict):
            parent[key][draw(text)] = draw(json_values)
    return doc


@st.composite
def request_body(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(path, content type, body): mostly mutated reviews, some raw bytes or random JSON, some damage."""
    transport = draw(st.integers(0, 19)) == 0  # one in twenty: a wrong path or content type
    path = draw(st.sampled_from(["/", "/validate/", "/metrics", "/mutate?x=1"])) if transport and \
        draw(st.booleans()) else draw(st.sampled_from(["/validate", "/mutate"]))
    content_type = draw(st.sampled_from(["text/plain", "application/yaml", "", "application/json; charset=latin-1"])) \
        if transport else "application/json"
    kind = draw(st.integers(0, 19))
    if kind < 17:
        raw = json.dumps(draw(mutated_review())).encode()
        if draw(st.integers(0, 9)) == 0:  # damage the bytes
            cut = draw(st.integers(0, len(raw)))
            raw = raw[:cut] + draw(st.binary(max_size=8)) + raw[cut + draw(st.integers(0, 8)):]
    elif kind < 19:
        raw = json.dumps(draw(json_values)).encode()
    else:
        raw = draw(st.binary(max_size=512))
    return path, content_type, raw
