"""The chart's host-access policy (templates/host-access-policy.yaml), rendered: one policy and its
binding, scoped to the release's namespace, operator and package ServiceAccount, whatever they are
called. What it admits and refuses is proven on the real API server in tests/security/test_host_access.py;
the chart install (test_install.py) runs the operator's stage pods under it in a namespace of its own."""

from __future__ import annotations

import yaml

from gate.api.common import Obj
from tests.chart.conftest import REPO, find, rendered


def _policy(values: Obj, namespace: str = "nodegate-system") -> tuple[Obj, Obj]:
    objs = rendered(values, namespace=namespace)
    prefix = values.get("fullnameOverride") or "nodegate"
    return (find(objs, "ValidatingAdmissionPolicy", f"{prefix}-host-access"),
            find(objs, "ValidatingAdmissionPolicyBinding", f"{prefix}-host-access"))


def _expressions(policy: Obj) -> str:
    spec = policy["spec"]
    parts = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
    parts += [v["expression"] + v["messageExpression"] for v in spec["validations"]]
    return "\n".join(parts)


def test_policy_is_bound_denying_and_fails_closed() -> None:
    policy, binding = _policy({})
    assert binding["spec"] == {"policyName": "nodegate-host-access", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["operations"])
             for r in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert rules[(("",), ("pods", "pods/resize"))] == {"CREATE", "UPDATE"}
    assert rules[(("",), ("pods/ephemeralcontainers",))] == {"UPDATE"}
    assert rules[(("batch",), ("jobs", "cronjobs"))] == {"CREATE", "UPDATE"}
    assert rules[(("apps",), ("deployments", "replicasets", "statefulsets", "daemonsets"))] == {"CREATE", "UPDATE"}


def test_policy_names_the_releases_namespace_operator_and_package_account() -> None:
    policy, binding = _policy({"fullnameOverride": "ng"}, namespace="ops")
    text = _expressions(policy)
    assert "'ops'" in text and "system:serviceaccount:ops:ng-operator" in text and "'ng-package'" in text
    assert "nodegate-system" not in text and "nodegate-operator" not in text and "nodegate-package" not in text
    assert binding["spec"]["policyName"] == "ng-host-access"


def test_only_the_operators_own_pods_get_host_access_no_job_or_job_controller_does() -> None:
    policy, _ = _policy({})
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["spec"]["variables"]}
    assert variables["stagePod"] == (
        "object.kind == 'Pod' && request.operation == 'CREATE' && variables.runsAsPackage && "
        "request.userInfo.username == 'system:serviceaccount:nodegate-system:nodegate-operator'")
    text = _expressions(policy)
    assert "job-controller" not in text and "kube-controller-manager" not in text and "'Job'" not in text
    [in_namespace, _, _] = policy["spec"]["validations"]
    assert " ".join(in_namespace["expression"].split()) == (
        "request.namespace != 'nodegate-system' || !variables.hostAccess || variables.stagePod"
        " || variables.podSpecChange")


def test_no_spec_change_of_a_host_access_pod_in_the_namespace_whoever_asks() -> None:
    """A stage pod's images, tolerations, deadline and resources are changeable in place by the API; the
    policy refuses every such UPDATE of a host-access pod in the namespace, naming no exception (the
    operator never updates a stage pod). Ephemeral containers stay with the first validation."""
    policy, _ = _policy({})
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["spec"]["variables"]}
    assert variables["podSpecChange"] == (
        "object.kind == 'Pod' && request.operation == 'UPDATE' "
        "&& !(has(request.subResource) && request.subResource == 'ephemeralcontainers')")
    [_, update, _] = policy["spec"]["validations"]
    assert " ".join(update["expression"].split()) == (
        "request.namespace != 'nodegate-system' || !variables.hostAccess || !variables.podSpecChange")
    assert "userInfo" not in update["expression"] and "cannot be changed" in update["messageExpression"]


def test_policy_is_the_same_in_both_certificate_modes() -> None:
    assert _policy({}) == _policy({"certManager": {"enabled": True}})


def test_plain_manifests_ship_the_policy_with_the_operator() -> None:
    kustomization = yaml.safe_load((REPO / "operator" / "kustomization.yaml").read_text())
    assert "host-access-policy.yaml" in kustomization["resources"]
    shipped = [o for o in yaml.safe_load_all((REPO / "operator" / "host-access-policy.yaml").read_text()) if o]
    policy, binding = _policy({})
    assert [o["kind"] for o in shipped] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert shipped[0]["spec"] == policy["spec"] and shipped[1]["spec"] == binding["spec"]
