"""A changed package's env and imagePullSecrets name Secrets and ConfigMaps of the operator's
namespace, which its pods receive: the requester must be allowed to get each one there."""

from __future__ import annotations

from gate.admission.authz import review_body
from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from tests.unit.admission.helpers import gate, package, request

FACTS = Facts(operator_namespace="ops")
REFS = {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "webhook-tls", "key": "signer.key"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "PLAIN", "value": "x"}],
        "imagePullSecrets": [{"name": "registry"}]}


def _checks(verdict: decide.Verdict) -> list[tuple[str, str, str, str, str]]:
    return [(c.verb, c.resource, c.namespace, c.name, c.denied.field) for c in verdict.access]


def test_every_referenced_secret_and_config_map_needs_get_in_the_operators_namespace() -> None:
    verdict = decide.validate(request("NodeGate", "CREATE", gate({"tuned": package(**REFS)})), FACTS)
    assert _checks(verdict) == [
        ("use", "packages", "", "tuned", "spec.packages[tuned]"),
        ("get", "secrets", "ops", "webhook-tls", "spec.packages[tuned].env[0].valueFrom.secretKeyRef"),
        ("get", "configmaps", "ops", "settings", "spec.packages[tuned].env[1].valueFrom.configMapKeyRef"),
        ("get", "secrets", "ops", "registry", "spec.packages[tuned].imagePullSecrets[0]"),
    ]
    denied = verdict.access[1].denied
    assert denied.forbidden and 'may not get Secret "webhook-tls" in namespace ops' in denied.reason


def test_unchanged_packages_are_not_asked_again() -> None:
    old = gate({"tuned": package(**REFS)})
    new = gate({"tuned": package(**REFS), "base": package()}, paused=True)
    verdict = decide.validate(request("NodeGate", "UPDATE", new, old), FACTS)
    assert _checks(verdict) == [("use", "packages", "", "base", "spec.packages[base]")]


def test_malformed_references_are_the_schemas_business_not_a_crash() -> None:
    odd = {"env": [{"name": "A", "valueFrom": {"secretKeyRef": "nope"}}, "x", {"name": "B", "valueFrom": []}],
           "imagePullSecrets": ["registry", {"name": ""}]}
    verdict = decide.validate(request("NodeGate", "CREATE", gate({"tuned": package(**odd)})), FACTS)
    # the rules leave the malformed entries to the CRD schema (no violation) and name no object from them:
    # only the package itself is asked for
    assert verdict.violations == ()
    assert _checks(verdict) == [("use", "packages", "", "tuned", "spec.packages[tuned]")]


def test_the_subject_access_review_names_the_namespace() -> None:
    verdict = decide.validate(request("NodeGate", "CREATE", gate({"tuned": package(**REFS)})), FACTS)
    body = review_body(verdict.access[1])
    assert body["spec"]["resourceAttributes"] == {"verb": "get", "group": "", "resource": "secrets",
                                                  "name": "webhook-tls", "namespace": "ops"}
    assert "namespace" not in review_body(verdict.access[0])["spec"]["resourceAttributes"]
