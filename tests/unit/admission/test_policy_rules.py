"""DeploymentPolicy validation and the refused DELETE of a policy in use."""

from __future__ import annotations

from typing import Any

import pytest

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from tests.unit.admission.helpers import request


def policy(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "fleet"},
            "spec": spec}


def comp(name: str = "a", selector: Any = None, budget: Any = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "selector": selector if selector is not None else {"matchLabels": {"pool": name}},
            "budget": budget if budget is not None else {"count": 1}, **extra}


def messages(obj: dict[str, Any]) -> list[str]:
    return [v.message for v in decide.validate(request("DeploymentPolicy", "CREATE", obj), Facts()).violations]


CASES = [
    (policy(compartments=[comp(strategy={})]),
        "spec.compartments[0].strategy: set exactly one of fixed, linear or exponential"),
    (policy(compartments=[comp(strategy={"fixed": {}, "exponential": {}})]), "(found fixed, exponential)"),
    (policy(default={"budget": {"percent": 1, "count": 1}}),
        "spec.default.budget: set exactly one of percent or count"),
    (policy(compartments=[comp(budget={"percent": 200})]), "spec.compartments[0].budget.percent"),
    (policy(compartments=[comp(budget={"count": -3})]), "spec.compartments[0].budget.count"),
    (policy(compartments=[comp(strategy={"fixed": {"batchThreshold": 0}})]),
     "spec.compartments[0].strategy.fixed.batchThreshold: must be a whole number from 1 to 100"),
    (policy(compartments=[comp(strategy={"linear": {"safetyLimit": 101}})]), "strategy.linear.safetyLimit"),
    (policy(compartments=[comp(strategy={"exponential": {"growthFactor": 1}})]),
     "strategy.exponential.growthFactor: must be a whole number of at least 2"),
    (policy(compartments=[comp(strategy={"linear": {"delta": 0}})]),
        "strategy.linear.delta: must be a whole number of at least 1"),
    (policy(default={"strategy": {"fixed": {"initialBatch": 0}}}), "spec.default.strategy.fixed.initialBatch"),
    (policy(compartments=[comp("a"), comp("a", {"matchLabels": {"x": "y"}})]),
     'spec.compartments[1].name: duplicate compartment name "a" (also spec.compartments[0])'),
    (policy(compartments=[comp("__default__")]), "spec.compartments[0].name: __default__ is reserved"),
    (policy(compartments=[comp("a", {"matchLabels": {"p": "q"}}), comp("b", {"matchLabels": {"p": "q"}})]),
     "spec.compartments[1].selector: selects exactly the nodes of spec.compartments[0]"),
    (policy(compartments=[comp("a", {"matchLabels": {"bad key": "q"}})]),
        "spec.compartments[0].selector.matchLabels[bad key]"),
    (policy(compartments=[{"name": "a", "budget": {"count": 1}}]), "spec.compartments[0].selector: is required"),
    (policy(windows=[{"days": [], "start": "01:00", "end": "02:00"}]), "spec.windows[0].days: needs at least one day"),
    (policy(windows=[{"days": ["Someday"], "start": "01:00", "end": "02:00"}]), "spec.windows[0].days[0]: 'Someday'"),
    (policy(windows=[{"days": ["Mon", "Mon"], "start": "01:00", "end": "02:00"}]), "lists a day twice"),
    (policy(windows=[{"days": ["Mon"], "start": "1:00", "end": "02:00"}]),
        "spec.windows[0].start: '1:00' is not a time"),
    (policy(windows=[{"days": ["Mon"], "start": "01:00", "end": "24:00"}]), "spec.windows[0].end"),
    (policy(windows=[{"days": ["Mon"], "start": "01:00", "end": "01:00"}]), "spec.windows[0].end: equals start"),
    (policy(windows=[{"days": ["Mon"], "start": "01:00", "end": "02:00", "timeZone": "Europe/Nowhere"}]),
     "spec.windows[0].timeZone: 'Europe/Nowhere' is not an IANA time zone"),
    (policy(windows=[{"days": ["Mon"], "start": "01:00", "end": "02:00", "timeZone": "../../etc/passwd"}]),
     "spec.windows[0].timeZone"),
]


@pytest.mark.parametrize(("obj", "fragment"), CASES, ids=[c[1][:50] for c in CASES])
def test_bad_policy_is_denied_naming_field_and_reason(obj: dict[str, Any], fragment: str) -> None:
    found = messages(obj)
    assert any(fragment in m for m in found), found


def test_good_policy_is_allowed() -> None:
    obj = policy(default={"budget": {"percent": 25}, "strategy": {"fixed": {"initialBatch": 1}}},
                 compartments=[comp("canary", strategy={"exponential": {"growthFactor": 3}}),
                               comp("gpu", {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                                    {"percent": 10}, strategy={"linear": {"delta": 2}})],
                 windows=[{"days": ["Sat", "Sun"], "start": "22:00", "end": "04:00", "timeZone": "America/New_York"}])
    assert messages(obj) == []


def test_delete_is_refused_while_referenced_naming_the_gates() -> None:
    req = request("DeploymentPolicy", "DELETE", None, policy())
    assert decide.plan_lookups(req, "validate").gates_referencing == "fleet"
    v = decide.validate(req, Facts(referencing_gates=("gpu-b", "gpu-a")))
    assert [x.message for x in v.violations] == [
        'metadata.name: DeploymentPolicy "fleet" is still referenced by NodeGate(s) gpu-a, gpu-b '
        "(spec.deploymentPolicy); point them elsewhere or delete them first"]
    assert decide.validate(req, Facts()).allowed
