"""Validation of DeploymentPolicy specs, and of deleting one that gates still use."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Sequence
from typing import Any

from gate.admission.rules import syntax
from gate.admission.rules.nodegate import budget_violations, is_int
from gate.admission.rules.review import Violation
from gate.admission.rules.syntax import type_name
from gate.api.policy import COMPARTMENT_NAME_PATTERN, DEFAULT_COMPARTMENT, HHMM_PATTERN, WEEKDAYS

STRATEGY_KINDS = ("fixed", "linear", "exponential")
_COMPARTMENT_NAME = re.compile(COMPARTMENT_NAME_PATTERN)
_HHMM = re.compile(HHMM_PATTERN)
# (field, lowest, highest) per strategy kind; linear and exponential extend fixed
_FIXED = (("initialBatch", 1, None), ("batchThreshold", 1, 100), ("failureThreshold", 1, None),
          ("safetyLimit", 1, 100))
STRATEGY_BOUNDS: dict[str, tuple[tuple[str, int, int | None], ...]] = {
    "fixed": _FIXED,
    "linear": (*_FIXED, ("delta", 1, None)),
    "exponential": (*_FIXED, ("growthFactor", 2, None)),
}


def validate_spec(spec: object) -> list[Violation]:
    if not isinstance(spec, dict):
        return [Violation("spec", f"must be an object, not {type_name(spec)}")]
    out: list[Violation] = []
    default = spec.get("default")
    if default is not None:
        if not isinstance(default, dict):
            out.append(Violation("spec.default",
                                 f"must be an object with budget and strategy, not {type_name(default)}"))
        else:
            out += budget_violations(default.get("budget"), "spec.default.budget")
            out += strategy_violations(default.get("strategy"), "spec.default.strategy")
    compartments = spec.get("compartments")
    if compartments is not None and not isinstance(compartments, list):
        out.append(Violation("spec.compartments", f"must be a list of compartments, not {type_name(compartments)}"))
        compartments = []
    seen_names: dict[str, int] = {}
    seen_selectors: dict[tuple[object, ...], int] = {}
    for i, comp in enumerate(compartments or []):
        path = f"spec.compartments[{i}]"
        if not isinstance(comp, dict):
            out.append(Violation(path, f"must be an object with name, selector and budget, not {type_name(comp)}"))
            continue
        name = comp.get("name")
        if name == DEFAULT_COMPARTMENT:
            out.append(Violation(f"{path}.name", f"{DEFAULT_COMPARTMENT} is reserved for the nodes no compartment "
                                                 "selects; choose another name"))
        elif not isinstance(name, str) or not _COMPARTMENT_NAME.match(name):
            out.append(Violation(f"{path}.name", f"{name!r} must match {COMPARTMENT_NAME_PATTERN}"))
        elif name in seen_names:
            out.append(Violation(f"{path}.name", f'duplicate compartment name "{name}" '
                                                 f"(also spec.compartments[{seen_names[name]}])"))
        else:
            seen_names[name] = i
        selector = comp.get("selector")
        if selector is None:
            out.append(Violation(f"{path}.selector", "is required: the nodes of this compartment"))
        else:
            problems = syntax.selector_violations(selector, f"{path}.selector")
            out += problems
            if not problems:
                key = syntax.selector_canonical(selector)
                if key in seen_selectors:
                    out.append(Violation(f"{path}.selector", "selects exactly the nodes of "
                                         f"spec.compartments[{seen_selectors[key]}]; one of the two would never get "
                                         "a node (the first listed wins)"))
                else:
                    seen_selectors[key] = i
        if comp.get("budget") is None:
            out.append(Violation(f"{path}.budget", "is required: the ceiling of nodes disrupted at once"))
        else:
            out += budget_violations(comp.get("budget"), f"{path}.budget")
        out += strategy_violations(comp.get("strategy"), f"{path}.strategy")
    windows = spec.get("windows")
    if windows is not None and not isinstance(windows, list):
        out.append(Violation("spec.windows", f"must be a list of windows, not {type_name(windows)}"))
        windows = []
    for i, window in enumerate(windows or []):
        out += window_violations(window, f"spec.windows[{i}]")
    return out


def strategy_violations(strategy: object, path: str) -> list[Violation]:
    if strategy is None:
        return []
    if not isinstance(strategy, dict):
        return [Violation(path, "must be an object with one of fixed, linear or exponential, "
                                f"not {type_name(strategy)}")]
    chosen = [k for k in STRATEGY_KINDS if strategy.get(k) is not None]
    if len(chosen) != 1:
        found = f" (found {', '.join(chosen)})" if chosen else ""
        return [Violation(path, f"set exactly one of fixed, linear or exponential{found}")]
    kind = chosen[0]
    params = strategy[kind]
    if not isinstance(params, dict):
        return [Violation(f"{path}.{kind}", f"must be an object, not {type_name(params)}")]
    out: list[Violation] = []
    for name, low, high in STRATEGY_BOUNDS[kind]:
        value = params.get(name)
        if value is None:
            continue
        ok = is_int(value) and value >= low and (high is None or value <= high)
        if not ok:
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            out.append(Violation(f"{path}.{kind}.{name}", f"must be a whole number {bound}, not {value!r}"))
    return out


def window_violations(window: object, path: str) -> list[Violation]:
    if not isinstance(window, dict):
        return [Violation(path, f"must be an object with days, start and end, not {type_name(window)}")]
    out: list[Violation] = []
    days = window.get("days")
    if not isinstance(days, list) or not days:
        out.append(Violation(f"{path}.days", "needs at least one day: Mon, Tue, Wed, Thu, Fri, Sat or Sun"))
    else:
        for j, day in enumerate(days):
            if day not in WEEKDAYS:
                out.append(Violation(f"{path}.days[{j}]", f"{day!r} is not one of Mon, Tue, Wed, Thu, Fri, Sat, Sun"))
        if len(set(map(str, days))) != len(days):
            out.append(Violation(f"{path}.days", "lists a day twice"))
    for edge in ("start", "end"):
        value = window.get(edge)
        if not isinstance(value, str) or not _HHMM.match(value):
            out.append(Violation(f"{path}.{edge}", f"{value!r} is not a time of day HH:MM (00:00 to 23:59)"))
    if window.get("start") == window.get("end") and isinstance(window.get("start"), str):
        out.append(Violation(f"{path}.end", "equals start: the window would never be open"))
    zone = window.get("timeZone", "UTC")
    if not valid_time_zone(zone):
        out.append(Violation(f"{path}.timeZone", f"{zone!r} is not an IANA time zone like UTC or Europe/Berlin"))
    return out


def valid_time_zone(zone: object) -> bool:
    if not isinstance(zone, str) or not zone or len(zone) > 64 or zone.startswith("/") or ".." in zone:
        return False
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def delete_violations(name: str, referencing: Sequence[str]) -> list[Violation]:
    if not referencing:
        return []
    gates = ", ".join(sorted(referencing))
    return [Violation("metadata.name", f'DeploymentPolicy "{name}" is still referenced by NodeGate(s) {gates} '
                                       "(spec.deploymentPolicy); point them elsewhere or delete them first")]


def referencing_gates(policy: str, gates: Sequence[dict[str, Any]]) -> list[str]:
    return sorted(
        str(g.get("metadata", {}).get("name")) for g in gates
        if isinstance(g.get("spec"), dict) and g["spec"].get("deploymentPolicy") == policy
    )


def referencing_packages(policy: str, gates: Sequence[dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """gate -> its package names, for each gate naming `policy`."""
    out: dict[str, tuple[str, ...]] = {}
    for g in gates:
        spec = g.get("spec")
        if isinstance(spec, dict) and spec.get("deploymentPolicy") == policy:
            packages = spec.get("packages")
            out[str(g.get("metadata", {}).get("name"))] = tuple(sorted(map(str, packages))) \
                if isinstance(packages, dict) else ()
    return out
