"""Mutation: defaults and the readiness taint as minimal, idempotent RFC 6902 patches."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts, ReadinessGate
from gate.api.keys import IGNORE_LABEL, READINESS_TAINT_KEY
from tests.unit.admission.helpers import gate, request

TAINT = {"key": READINESS_TAINT_KEY, "effect": "NoSchedule"}
GATES = (ReadinessGate("gpu", {"matchLabels": {"gpu": "true"}}),
         ReadinessGate("infra", {"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}))


def mutated(kind: str, obj: dict[str, Any], facts: Facts | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    patch = decide.mutate(request(kind, "CREATE", obj), facts or Facts()).patch
    return patch, jsonpatch.apply_patch(copy.deepcopy(obj), patch)


def idempotent(kind: str, obj: dict[str, Any], facts: Facts | None = None) -> dict[str, Any]:
    patch, once = mutated(kind, obj, facts)
    again, twice = mutated(kind, once, facts)
    assert again == [] and twice == once
    assert all(op["op"] == "add" for op in patch)
    return once


def test_nodegate_defaults_fill_only_what_is_missing() -> None:
    assert idempotent("NodeGate", gate())["spec"] | {} == {"packages": {}, "priority": 200, "sequencing": "node"}
    kept = idempotent("NodeGate", gate(priority=7, sequencing="all"))
    assert kept["spec"]["priority"] == 7 and kept["spec"]["sequencing"] == "all"
    assert idempotent("NodeGate", {"metadata": {"name": "g"}})["spec"] == {"priority": 200, "sequencing": "node"}


@pytest.mark.parametrize(("kind", "extra"), [("fixed", {}), ("linear", {"delta": 1}),
                                             ("exponential", {"growthFactor": 2})])
def test_strategy_defaults(kind: str, extra: dict[str, int]) -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"compartments": [
        {"name": "a", "selector": {}, "budget": {"count": 1}, "strategy": {kind: {"initialBatch": 4}}}]}}
    out = idempotent("DeploymentPolicy", obj)
    assert out["spec"]["compartments"][0]["strategy"][kind] == {
        "initialBatch": 4, "batchThreshold": 100, "failureThreshold": 3, "safetyLimit": 50, **extra}
    assert out["spec"]["default"]["budget"] == {"percent": 100}


def test_invalid_strategy_is_left_for_validation_to_explain() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"default": {"budget": {"count": 1},
                                                           "strategy": {"fixed": {}, "linear": {}}}}}
    patch, _ = mutated("DeploymentPolicy", obj)
    assert patch == []


def node(labels: dict[str, str], spec: Any = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": labels}}
    if spec is not None:
        obj["spec"] = spec
    return obj


@pytest.mark.parametrize("spec", [None, {}, {"taints": None}, {"taints": []},
                                  {"taints": [{"key": "other", "effect": "NoExecute"}]}])
def test_selected_node_gets_exactly_one_readiness_taint(spec: Any) -> None:
    out = idempotent("Node", node({"gpu": "true"}, spec), Facts(readiness_gates=GATES))
    assert [t for t in out["spec"]["taints"] if t["key"] == READINESS_TAINT_KEY] == [TAINT]
    assert len(out["spec"]["taints"]) == len((spec or {}).get("taints") or []) + 1


def test_node_already_tainted_or_unselected_is_not_patched() -> None:
    facts = Facts(readiness_gates=GATES)
    assert mutated("Node", node({"gpu": "true"}, {"taints": [TAINT]}), facts)[0] == []
    assert mutated("Node", node({"gpu": "false"}), facts)[0] == []
    assert mutated("Node", node({"role": "infra"}), facts)[0] != []
    assert mutated("Node", node({"gpu": "true"}), Facts())[0] == []


def test_node_update_is_never_mutated() -> None:
    obj = node({"gpu": "true"}, {})
    assert decide.mutate(request("Node", "UPDATE", obj, obj), Facts(readiness_gates=GATES)).patch == []


def test_taint_removal_needs_operator_or_bypass() -> None:
    old = node({}, {"taints": [TAINT, {"key": "x", "effect": "NoSchedule"}]})
    new = node({}, {"taints": [{"key": "x", "effect": "NoSchedule"}]})
    v = decide.validate(request("Node", "UPDATE", new, old, user="bob"), Facts())
    assert [(c.verb, c.resource, c.group) for c in v.access] == [("bypass", "nodegates", "nodegate.io")]
    assert "spec.taints: removing the taint nodegate.io/runtime-required:NoSchedule is reserved" in \
        v.with_answers([False]).violations[0].message
    assert v.with_answers([True]).allowed
    operator = decide.validate(request("Node", "UPDATE", new, old, user=Facts().operator_username), Facts())
    assert operator.allowed
    kept = decide.validate(request("Node", "UPDATE", old, old, user="bob"), Facts())
    assert kept.allowed and not kept.access


def test_a_joining_node_cannot_opt_itself_out_with_the_ignore_label() -> None:
    """The node's own ignore label counts for nothing at CREATE: tainted as if it were absent."""
    facts = Facts(readiness_gates=GATES)
    assert mutated("Node", node({"gpu": "true", IGNORE_LABEL: "true"}), facts)[0] == \
        mutated("Node", node({"gpu": "true"}), facts)[0] != []
    assert mutated("Node", node({"gpu": "false", IGNORE_LABEL: "true"}), facts)[0] == []
