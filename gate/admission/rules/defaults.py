"""Mutation: defaults for both kinds, and the readiness taint on nodes that join (`gate.lifecycle.taint`).

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
from gate.api.nodegate import NodeGateSpec
from gate.api.policy import CompartmentDefault, ExponentialStrategy, FixedStrategy, LinearStrategy, default_strategy
from gate.lifecycle import taint

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
    """The readiness taint on a joining node that a readinessTaint gate selects (`gate.lifecycle.taint`
    decides and builds the patch; the gates' raw selectors are matched here)."""
    return taint.join_patch(node, lambda labels: any(syntax.selector_matches(g.node_selector, dict(labels))
                                                     for g in gates))
