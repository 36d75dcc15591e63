"""Mutation: defaults for both kinds, and the readiness taint on nodes that join.

Patches are minimal RFC 6902: only `add` operations for what is missing, so applying the mutation to
an already mutated object yields an empty patch (the API server may call a webhook twice when another
webhook changed the object: `reinvocationPolicy`). Default values come from the API models: one source.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gate.admission.rules import syntax
from gate.admission.rules.facts import ReadinessGate
from gate.admission.rules.review import JsonPatch
from gate.api.keys import IGNORE_LABEL, READINESS_TAINT_EFFECT, READINESS_TAINT_KEY
from gate.api.nodegate import NodeGateSpec
from gate.api.policy import CompartmentDefault, ExponentialStrategy, FixedStrategy, LinearStrategy, default_strategy

NODEGATE_DEFAULTS: dict[str, Any] = {
    "priority": NodeGateSpec.model_fields["priority"].default,
    "sequencing": NodeGateSpec.model_fields["sequencing"].default,
}
STRATEGY_DEFAULTS: dict[str, dict[str, Any]] = {
    "fixed": FixedStrategy().to_wire(),
    "linear": LinearStrategy().to_wire(),
    "exponential": ExponentialStrategy().to_wire(),
}
DEFAULT_STRATEGY: dict[str, Any] = default_strategy().to_wire()
DEFAULT_COMPARTMENT: dict[str, Any] = CompartmentDefault().to_wire()
READINESS_TAINT: dict[str, str] = {"key": READINESS_TAINT_KEY, "effect": READINESS_TAINT_EFFECT}


def pointer(*parts: str | int) -> str:
    """An RFC 6901 JSON pointer."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _fill(target: dict[str, Any], defaults: dict[str, Any], path: tuple[str | int, ...], patch: JsonPatch) -> None:
    for key, value in defaults.items():
        if key not in target:
            patch.append({"op": "add", "path": pointer(*path, key), "value": copy.deepcopy(value)})


def nodegate_defaults(obj: dict[str, Any]) -> JsonPatch:
    patch: JsonPatch = []
    spec = obj.get("spec")
    if spec is None:
        return [{"op": "add", "path": "/spec", "value": dict(NODEGATE_DEFAULTS)}]
    if isinstance(spec, dict):
        _fill(spec, NODEGATE_DEFAULTS, ("spec",), patch)
    return patch


def policy_defaults(obj: dict[str, Any]) -> JsonPatch:
    patch: JsonPatch = []
    spec = obj.get("spec")
    if spec is None:
        return [{"op": "add", "path": "/spec", "value": {"default": copy.deepcopy(DEFAULT_COMPARTMENT)}}]
    if not isinstance(spec, dict):
        return patch
    default = spec.get("default")
    if default is None:
        patch.append({"op": "add", "path": "/spec/default", "value": copy.deepcopy(DEFAULT_COMPARTMENT)})
    elif isinstance(default, dict):
        _strategy_defaults(default, ("spec", "default"), patch)
        if "budget" not in default:
            budget = copy.deepcopy(DEFAULT_COMPARTMENT["budget"])
            patch.append({"op": "add", "path": "/spec/default/budget", "value": budget})
    compartments = spec.get("compartments")
    if isinstance(compartments, list):
        for i, comp in enumerate(compartments):
            if isinstance(comp, dict):
                _strategy_defaults(comp, ("spec", "compartments", i), patch)
    return patch


def _strategy_defaults(holder: dict[str, Any], path: tuple[str | int, ...], patch: JsonPatch) -> None:
    strategy = holder.get("strategy")
    if strategy is None:
        patch.append({"op": "add", "path": pointer(*path, "strategy"), "value": copy.deepcopy(DEFAULT_STRATEGY)})
        return
    if not isinstance(strategy, dict):
        return
    chosen = [k for k in STRATEGY_DEFAULTS if strategy.get(k) is not None]
    if len(chosen) != 1 or not isinstance(strategy[chosen[0]], dict):
        return  # invalid: validation explains it; guessing a default would hide the mistake
    kind = chosen[0]
    _fill(strategy[kind], STRATEGY_DEFAULTS[kind], (*path, "strategy", kind), patch)


def node_taint(node: dict[str, Any], gates: Sequence[ReadinessGate]) -> JsonPatch:
    """Taint a joining node that a readinessTaint gate selects, unless it has the taint already.

    The node's own `nodegate.io/ignore` label counts for nothing here: a node cannot opt itself out by
    registering with it. Only a holder of `bypass` may set it (the node-keys policy refuses anyone
    else's CREATE with it); such a node is tainted like any other, and the operator lifts the taint
    within seconds, since no gate selects an ignored node (`gate.lifecycle.fleet.orphan_taint`).
    Failing closed costs an opted-out node a few seconds; failing open let any node skip every gate."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    labels = {str(k): str(v) for k, v in labels.items() if k != IGNORE_LABEL} if isinstance(labels, dict) else {}
    if not any(syntax.selector_matches(g.node_selector, labels) for g in gates):
        return []
    spec = node.get("spec")
    if not isinstance(spec, dict):
        return [{"op": "add", "path": "/spec", "value": {"taints": [dict(READINESS_TAINT)]}}]
    taints = spec.get("taints")
    if not isinstance(taints, list):
        return [{"op": "add", "path": "/spec/taints", "value": [dict(READINESS_TAINT)]}]
    if has_readiness_taint(taints):
        return []
    return [{"op": "add", "path": "/spec/taints/-", "value": dict(READINESS_TAINT)}]


def has_readiness_taint(taints: object) -> bool:
    return isinstance(taints, list) and any(
        isinstance(t, dict) and t.get("key") == READINESS_TAINT_KEY and t.get("effect") == READINESS_TAINT_EFFECT
        for t in taints
    )
