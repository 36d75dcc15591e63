"""The API models: parsing the documented examples, defaults, selectors, budgets, durations."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gate.api.common import Budget, LabelSelector, parse_duration
from gate.api.crd import all_crds, stale_crds
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy, Strategy

REPO = Path(__file__).resolve().parents[2]


def test_documented_nodegate_example_parses_with_every_field() -> None:
    gate = NodeGate.model_validate(yaml.safe_load((REPO / "examples/gpu-tuning.yaml").read_text()))
    assert gate.name == "gpu-tuning"
    assert gate.spec.readiness_taint is True
    assert gate.spec.drain.delete_empty_dir_data is True
    tuned = gate.spec.packages["nvidia-tuned"]
    assert tuned.depends_on == {"base-sysctl": ">=1.2.0"}
    assert tuned.config_interrupts["*.conf"].services == ["tuned"]
    assert tuned.interrupt_or_none().type == "reboot"
    assert gate.spec.packages["base-sysctl"].interrupt_or_none().type == "none"


def test_documented_policy_example_parses() -> None:
    policy = DeploymentPolicy.model_validate(yaml.safe_load((REPO / "examples/gpu-fleet-policy.yaml").read_text()))
    canary = policy.spec.compartments[0]
    assert canary.strategy.kind == "exponential"
    assert canary.strategy.params.failure_threshold == 1
    assert policy.spec.default.budget.percent == 25
    assert policy.spec.windows[0].days == ["Sat", "Sun"]


def test_defaults_match_the_design() -> None:
    spec = NodeGate.model_validate({"metadata": {"name": "g"}, "spec": {"packages": {
        "p": {"version": "1.0.0", "image": "x"}}}}).spec
    assert (spec.priority, spec.sequencing, spec.serial, spec.paused) == (200, "node", False, False)
    assert spec.packages["p"].timeout == "30m" and spec.packages["p"].retries == 2
    fixed = Strategy.model_validate({"fixed": {}}).params
    assert (fixed.initial_batch, fixed.batch_threshold, fixed.safety_limit) == (1, 100, 50)
    linear = Strategy.model_validate({"linear": {}}).linear
    exponential = Strategy.model_validate({"exponential": {}}).exponential
    assert linear is not None and linear.delta == 1
    assert exponential is not None and exponential.growth_factor == 2


def test_wire_form_round_trips_in_camel_case() -> None:
    raw = yaml.safe_load((REPO / "examples/gpu-tuning.yaml").read_text())
    wire = NodeGate.model_validate(raw).to_wire()
    assert wire["spec"]["packages"]["nvidia-tuned"]["dependsOn"] == {"base-sysctl": ">=1.2.0"}
    assert wire["spec"]["podNonInterruptLabels"] == {"matchLabels": {"workload": "long-running-training"},
                                                     "matchExpressions": []}
    assert NodeGate.model_validate(wire) == NodeGate.model_validate(raw)


@pytest.mark.parametrize(("budget", "matched", "ceiling"), [
    ({"percent": 25}, 40, 10), ({"percent": 33}, 10, 3), ({"percent": 10}, 5, 1), ({"percent": 0}, 5, 1),
    ({"percent": 100}, 7, 7), ({"count": 2}, 40, 2), ({"count": 5}, 3, 3), ({"count": 0}, 3, 0),
    ({"percent": 50}, 0, 0),
])
def test_budget_ceiling_rounds_down_but_at_least_one(budget: dict[str, int], matched: int, ceiling: int) -> None:
    assert Budget.model_validate(budget).ceiling(matched) == ceiling


@pytest.mark.parametrize("budget", [{}, {"percent": 10, "count": 1}, {"percent": 101}, {"count": -1}])
def test_budget_refuses_bad_combinations(budget: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Budget.model_validate(budget)


def test_strategy_needs_exactly_one_kind() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        Strategy.model_validate({})
    with pytest.raises(ValidationError, match="exactly one"):
        Strategy.model_validate({"fixed": {}, "linear": {}})


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("1h30m", 5400), ("250ms", 0.25),
                                               ("1.5h", 5400), ("24h", 86400)])
def test_durations_parse_like_go(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "15", "1d", "m5", "-5m", "1h 30m"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_label_selector_semantics() -> None:
    sel = LabelSelector.model_validate({
        "matchLabels": {"pool": "a"},
        "matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["a100", "h100"]},
            {"key": "broken", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "NotIn", "values": ["z9"]},
            {"key": "rack", "operator": "Exists"},
        ],
    })
    assert sel.matches({"pool": "a", "gpu": "h100", "rack": "r1"})
    assert not sel.matches({"pool": "a", "gpu": "h100"})  # rack missing
    assert not sel.matches({"pool": "a", "gpu": "t4", "rack": "r1"})
    assert not sel.matches({"pool": "a", "gpu": "h100", "rack": "r1", "broken": "yes"})
    assert not sel.matches({"pool": "a", "gpu": "h100", "rack": "r1", "zone": "z9"})
    assert LabelSelector().matches({}) and LabelSelector().is_empty()


def test_committed_crds_are_generated_from_the_models() -> None:
    assert stale_crds(REPO / "crds") == [], "run `nodegate crds --output crds`"


def test_crd_schema_is_structural_and_described() -> None:
    def walk(node: dict, path: str) -> None:  # type: ignore[type-arg]
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        if not node.get("x-kubernetes-int-or-string") and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, path
        for name, sub in node.get("properties", {}).items():
            if path != "" or name not in ("metadata",):
                assert "description" in sub, f"{path}.{name} has no description"
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], path + "[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "{}")

    for crd in all_crds().values():
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        walk(version["schema"]["openAPIV3Schema"], "")


def test_the_category_is_no_name_of_either_kind() -> None:
    # kubectl expands a category before it resolves a name: a category equal to `nodegate` made
    # `kubectl get nodegate NAME` a get of both kinds ("you must specify only one resource").
    crds = list(all_crds().values())
    names = {n for crd in crds for key in ("plural", "singular", "kind")
             for n in [crd["spec"]["names"][key].lower()]}
    names |= {s for crd in crds for s in crd["spec"]["names"]["shortNames"]}
    categories = {c for crd in crds for c in crd["spec"]["names"]["categories"]}
    assert names >= {"nodegate", "nodegates", "ng", "deploymentpolicy", "deploymentpolicies", "dp"}
    assert categories == {"nodegate-all"} and not categories & names


def test_parsed_states_share_equal_installed_records_which_cannot_change_in_place() -> None:
    from gate.api.state import Installed, NodeGateState, load_state

    def text(boot: str, config: dict[str, str]) -> str:
        record = Installed(version="1.0.0", spec_hash="abc", config=config)
        return NodeGateState(status="complete", boot_id=boot, installed={"tuning": record, "agent": record}).dump()

    one, two = load_state(text("boot-1", {"a": "1"})), load_state(text("boot-2", {"a": "1"}))
    assert one.installed["tuning"] is two.installed["tuning"] is two.installed["agent"]
    other = load_state(text("boot-3", {"a": "2"}))  # another config applied: a record of its own
    assert other.installed["tuning"] is not one.installed["tuning"]
    assert other.installed["tuning"].config == {"a": "2"} and one.installed["tuning"].config == {"a": "1"}
    assert load_state(text("boot-1", {"a": "1"})) == one and one.dump() == text("boot-1", {"a": "1"})
    with pytest.raises(ValidationError):
        one.installed["tuning"].version = "2.0.0"  # type: ignore[misc]
