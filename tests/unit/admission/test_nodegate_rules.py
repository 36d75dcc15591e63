"""NodeGate validation: each denial names the field path and the reason."""

from __future__ import annotations

from typing import Any

import pytest

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from gate.admission.rules.review import Verdict
from tests.unit.admission.helpers import gate, package, request, ten_package_gate


def verdict(obj: dict[str, Any], facts: Facts | None = None, old: dict[str, Any] | None = None) -> Verdict:
    return decide.validate(request("NodeGate", "UPDATE" if old else "CREATE", obj, old), facts or Facts())


def messages(obj: dict[str, Any], **kw: Any) -> list[str]:
    return [v.message for v in verdict(obj, **kw).violations]


CASES = [
    (gate(interruptionBudget={"percent": 10, "count": 2}),
        "spec.interruptionBudget: set exactly one of percent or count"),
    (gate(interruptionBudget={}), "spec.interruptionBudget: set exactly one of percent or count"),
    (gate(leaveCordoned=True), "spec.leaveCordoned: holds a node that joined with the readiness taint, and this gate "
     "gives no node that taint: set spec.readinessTaint: true too"),
    (gate(leaveCordoned=True, readinessTaint=False), "set spec.readinessTaint: true too, or drop this field"),
    (gate(interruptionBudget={"percent": 101}),
        "spec.interruptionBudget.percent: must be a whole number from 0 to 100"),
    (gate(interruptionBudget={"percent": -1}), "spec.interruptionBudget.percent"),
    (gate(interruptionBudget={"count": -1}),
        "spec.interruptionBudget.count: must be a whole number of nodes, 0 or more"),
    (gate(interruptionBudget={"count": 1}, deploymentPolicy="p"),
     "spec: set at most one of deploymentPolicy and interruptionBudget"),
    (gate(nodeSelector={"matchLabels": {"a/b/c": "x"}}), "spec.nodeSelector.matchLabels[a/b/c]"),
    (gate(nodeSelector={"matchLabels": {"ok": "not ok"}}), "label value 'not ok'"),
    (gate(nodeSelector={"matchExpressions": [{"key": "k", "operator": "Near", "values": ["x"]}]}),
     "spec.nodeSelector.matchExpressions[0].operator: 'Near' is not one of In, NotIn, Exists, DoesNotExist"),
    (gate(nodeSelector={"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}),
     "spec.nodeSelector.matchExpressions[0].values: operator Exists takes no values"),
    (gate(podNonInterruptLabels={"matchLabels": {"": "x"}}), "spec.podNonInterruptLabels.matchLabels[]"),
    (gate({"Tuned": package()}), "spec.packages: package name 'Tuned' must match"),
    (gate({"t1": package()}), "spec.packages: package name 't1' must match"),
    (gate({"tuned": package(version="v1.0.0")}), "spec.packages[tuned].version: 'v1.0.0' is not a semantic version"),
    (gate({"tuned": {"image": "x"}}), "spec.packages[tuned].version: version is required"),
    (gate({"tuned": package(image="example.com/tool:1.0.1")}),
     'spec.packages[tuned].image: tag "1.0.1" differs from version "1.0.0"'),
    (gate({"tuned": package(image="Example.com/Tool")}),
        "spec.packages[tuned].image: 'Example.com/Tool' is not an image"),
    (gate({"tuned": package(image="x@sha256:abc")}), "spec.packages[tuned].image"),
    (gate({"tuned": package(interrupt={"type": "kexec"})}),
     "spec.packages[tuned].interrupt.type: unknown interrupt type 'kexec'"),
    (gate({"tuned": package(interrupt={"type": "service"})}),
     "spec.packages[tuned].interrupt.services: an interrupt of type service needs at least one entry in services"),
    (gate({"tuned": package(interrupt={"type": "drain", "services": ["tuned"]})}),
     "spec.packages[tuned].interrupt.services: an interrupt of type drain restarts nothing: drop services"),
    (gate({"tuned": package(config={"a.conf": "x"}, configInterrupts={"*.conf": {"type": "drain",
                                                                              "services": ["x"]}})}),
     "spec.packages[tuned].configInterrupts[*.conf].services: an interrupt of type drain restarts nothing"),
    (gate({"tuned": package(gracefulShutdown="2 minutes")}),
     "spec.packages[tuned].gracefulShutdown: '2 minutes' is not a duration"),
    (gate({"tuned": package(gracefulShutdown=30)}), "spec.packages[tuned].gracefulShutdown: must be a duration"),
    (gate({"tuned": package(config={"a.conf": "x"}, configInterrupts={"b.conf": {"type": "reboot"}})}),
     "spec.packages[tuned].configInterrupts[b.conf]: 'b.conf' is neither a config key nor a glob matching one"),
    (gate({"tuned": package(config={"a.conf": "x"},
                            configInterrupts={"*.conf": {"type": "service"}})}),
     "spec.packages[tuned].configInterrupts[*.conf].services"),
    (gate({"tuned": package(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "512Mi"}})}),
     "spec.packages[tuned].resources.limits[memory]: limit '512Mi' is below the request '1Gi'"),
    (gate({"tuned": package(resources={"requests": {"cpu": "-1"}})}),
     "spec.packages[tuned].resources.requests[cpu]: must be positive"),
    (gate({"tuned": package(resources={"limits": {"cpu": "lots"}})}),
     "spec.packages[tuned].resources.limits[cpu]: 'lots' is not a quantity"),
    # JSON's Infinity (found by the server's property test): refused, not a rule that raises
    (gate({"tuned": package(resources={"requests": {"cpu": float("inf")}})}),
     "spec.packages[tuned].resources.requests[cpu]: a quantity must be a finite number, not inf"),
    (gate({"tuned": package(uninstall={"apply": True})}), "spec.packages[tuned].uninstall.apply"),
    (gate({"tuned": package(dependsOn={"base": ">=1.0.0"})}),
     "spec.packages[tuned].dependsOn[base]: package 'base' is not in this gate"),
    (gate({"tuned": package(dependsOn={"tuned": "*"})}), "a package cannot depend on itself"),
    (gate({"base": package("1.1.0"), "tuned": package(dependsOn={"base": "^1.2"})}),
     "base is at version 1.1.0, which does not satisfy '^1.2'"),
    (gate({"base": package(), "tuned": package(dependsOn={"base": "about one"})}),
     "spec.packages[tuned].dependsOn[base]: 'about one' is not a version constraint"),
    (gate({"aa": package(dependsOn={"bb": "*"}), "bb": package(dependsOn={"aa": "*"})}),
     "dependency cycle aa → bb → aa"),
    (gate(waitTimeout="1d"), "spec.waitTimeout: '1d' is not a duration"),
    (gate(cordonWhileProtected=True), "spec.cordonWhileProtected: cordons nodes while their protected pods finish, "
                                      "and no pod is protected: set spec.podNonInterruptLabels too"),
    (gate(drain={"timeout": "soon"}), "spec.drain.timeout: 'soon' is not a duration"),
    (gate({"tuned": package(timeout="30")}), "spec.packages[tuned].timeout"),
    (gate(deploymentPolicy="missing"), 'spec.deploymentPolicy: DeploymentPolicy "missing" does not exist'),
    (gate(priority=0), "spec.priority: must be a whole number of at least 1"),
    (gate(packages=None) | {"spec": {"packages": []}}, "spec.packages: must be a map"),
    ({"metadata": {"name": "g"}, "spec": "nope"}, "spec: must be an object"),
]


@pytest.mark.parametrize(("obj", "fragment"), CASES, ids=[c[1][:50] for c in CASES])
def test_bad_nodegate_is_denied_naming_field_and_reason(obj: dict[str, Any], fragment: str) -> None:
    found = messages(obj)
    assert any(fragment in m for m in found), found


@pytest.mark.parametrize("image", [
    "tool", "ghcr.io/example/tool", "localhost:5000/tool", "registry.example.com:5000/team/sub/tool:1.0.0",
    "ghcr.io/example/tool@sha256:" + "a" * 64, "ghcr.io/example/tool:1.0.0@sha256:" + "b" * 64, "[::1]:5000/tool",
])
def test_image_without_tag_with_matching_tag_or_digest_is_fine(image: str) -> None:
    assert messages(gate({"tuned": package(image=image)})) == []


@pytest.mark.parametrize("interrupt", [
    {"type": "drain"}, {"type": "drain", "services": []}, {"type": "none"}, {"type": "reboot"},
    {"type": "restartAllServices"}, {"type": "service", "services": ["tuned"]},
])
def test_every_interrupt_type_is_admitted_in_interrupt_and_config_interrupts(interrupt: dict[str, Any]) -> None:
    assert messages(gate({"tuned": package(interrupt=interrupt)})) == []
    assert messages(gate({"tuned": package(config={"a.conf": "x"}, configInterrupts={"*.conf": interrupt})})) == []


def test_graceful_shutdown_is_a_duration() -> None:
    assert messages(gate({"tuned": package(gracefulShutdown="2m")})) == []
    assert messages(gate({"tuned": package(gracefulShutdown="0s")})) == []


def test_good_gate_asks_to_authorize_each_package() -> None:
    v = verdict(ten_package_gate())
    assert v.violations == ()
    assert [c.name for c in v.access] == sorted(ten_package_gate()["spec"]["packages"])
    assert {(c.verb, c.group, c.resource) for c in v.access} == {("use", "nodegate.io", "packages")}
    assert not v.allowed  # not until the authorizer said yes
    assert v.with_answers([True] * 10).allowed


def test_denied_package_names_package_and_user() -> None:
    v = verdict(gate({"tuned": package()})).with_answers([False])
    assert v.violations[0].forbidden
    assert v.violations[0].message.startswith('spec.packages[tuned]: user "alice" may not use package "tuned"')


def test_existing_policy_is_accepted_and_looked_up() -> None:
    obj = gate(deploymentPolicy="fleet")
    assert decide.plan_lookups(request("NodeGate", "CREATE", obj), "validate").policies == {"fleet"}
    assert messages(obj, facts=Facts(existing_policies=frozenset({"fleet"}))) == []


def test_update_only_authorizes_added_or_changed_packages() -> None:
    old = gate({"a-a": package(), "b-b": package()})
    new = gate({"a-a": package(), "b-b": package("1.1.0"), "c-c": package()})
    assert [c.name for c in verdict(new, old=old).access] == ["b-b", "c-c"]


def test_metadata_only_update_is_allowed_even_for_a_spec_now_invalid() -> None:
    old = gate(deploymentPolicy="gone")
    new = {**old, "metadata": {"name": "g", "finalizers": []}}
    assert verdict(new, old=old).allowed


def test_unchanged_policy_reference_is_not_checked_again() -> None:
    old = gate(deploymentPolicy="gone")
    new = gate(deploymentPolicy="gone", paused=True)
    assert messages(new, old=old) == []
    assert decide.plan_lookups(request("NodeGate", "UPDATE", new, old), "validate").policies == frozenset()


def test_downgrade_without_uninstall_is_refused_and_with_it_allowed() -> None:
    old = gate({"tuned": package("1.2.0")})
    assert any("downgrade from 1.2.0 to 1.1.0 needs the uninstall path" in m
               for m in messages(gate({"tuned": package("1.1.0")}), old=old))
    enabled = {"uninstall": {"enabled": True}}
    assert messages(gate({"tuned": package("1.1.0", **enabled)}), old=gate({"tuned": package("1.2.0",
        **enabled)})) == []
    assert messages(gate({"tuned": package("1.3.0")}), old=old) == []


def test_removing_an_uninstallable_package_still_installed_is_refused_naming_nodes() -> None:
    old = gate({"tuned": package(uninstall={"enabled": True}), "other": package()})
    new = gate({"other": package()})
    lookups = decide.plan_lookups(request("NodeGate", "UPDATE", new, old), "validate")
    assert lookups.installed == ("g", frozenset({"tuned"}))
    nodes = tuple(f"node-{i}" for i in range(5))
    found = messages(new, old=old, facts=Facts(installed_on={"tuned": nodes}))
    assert found == ["spec.packages[tuned]: cannot be removed while still installed on 5 node(s) (node-0, node-1, "
                     "node-2 and 2 more): set uninstall.apply: true, wait until it is uninstalled everywhere, then "
                     "remove it"]
    assert messages(new, old=old, facts=Facts(installed_on={})) == []


def test_removing_a_package_without_uninstall_needs_no_lookup() -> None:
    old = gate({"tuned": package(), "other": package()})
    assert decide.plan_lookups(request("NodeGate", "UPDATE", gate({"other": package()}), old), "validate").installed \
        is None


def test_every_violation_is_reported_at_once() -> None:
    obj = gate({"tuned": package("x", "Bad Image")}, interruptionBudget={"percent": 500}, waitTimeout="x")
    assert len(messages(obj)) >= 4


def test_a_build_version_may_be_tagged_with_an_underscore_for_its_plus() -> None:
    assert messages(gate({"tuned": package(image="ghcr.io/t/tool:1.0.0_b1", version="1.0.0+b1")})) == []
    assert messages(gate({"tuned": package(image="ghcr.io/t/tool:1.0.0_b2", version="1.0.0+b1")}))


def test_changing_where_root_code_runs_needs_use_on_every_package_of_the_gate() -> None:
    """A `patch nodegates` right alone must not widen a gate's selector, tolerations, budget or policy."""
    old = gate({"a-a": package(), "b-b": package()}, nodeSelector={"matchLabels": {"pool": "canary"}})
    for field, value in (("nodeSelector", {}), ("additionalTolerations", [{"operator": "Exists"}]),
                         ("interruptionBudget", {"percent": 100})):
        new = gate({"a-a": package(), "b-b": package()}, **{"nodeSelector": {"matchLabels": {"pool": "canary"}},
                                                           field: value})
        v = verdict(new, old=old)
        assert [c.name for c in v.access] == ["a-a", "b-b"], field
        denied = v.with_answers([True, False])
        assert not denied.allowed
        assert denied.violations[0].message.startswith(
            f'spec.{field}: user "alice" may not change spec.{field}: that decides where package "b-b" runs as root')
    # Other fields (pausing, say) need no package right.
    paused = gate({"a-a": package(), "b-b": package()}, nodeSelector={"matchLabels": {"pool": "canary"}}, paused=True)
    assert verdict(paused, old=old).access == ()
