"""The chart's node-keys policy (templates/node-keys-policy.yaml, generated from gate/admission/node_keys.py),
rendered: exactly the objects the dev cluster installs, with the release's names. What it refuses is
proven on the real API server (tests/security/test_node_keys.py)."""

from __future__ import annotations

import pytest

from gate.admission.node_keys import node_keys_policy
from gate.api.common import Obj
from tests.chart.conftest import find, rendered


@pytest.mark.parametrize(("values", "namespace", "prefix", "operator"), [
    ({}, "nodegate-system", "nodegate", "system:serviceaccount:nodegate-system:nodegate-operator"),
    ({"fullnameOverride": "ng"}, "ops", "ng", "system:serviceaccount:ops:ng-operator"),
])
def test_the_rendered_policy_is_the_generated_one_for_the_release(values: Obj, namespace: str, prefix: str,
                                                                 operator: str) -> None:
    objs = rendered(values, namespace=namespace)
    name = f"{prefix}-node-keys"
    policy = find(objs, "ValidatingAdmissionPolicy", name)
    binding = find(objs, "ValidatingAdmissionPolicyBinding", name)
    want_policy, want_binding = node_keys_policy(name=name, operator_username=operator)
    assert policy["spec"] == want_policy["spec"]
    assert binding["spec"] == want_binding["spec"]
    assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
