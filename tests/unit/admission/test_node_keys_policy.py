"""The policy on NodeGate's node keys (gate.admission.node_keys): its shape, and the chart's copy.

What it refuses, and to whom, is proven on the real API server (tests/security/test_node_keys.py);
here, only what needs no cluster."""

from __future__ import annotations

from gate.admission.node_keys import chart_template, node_keys_policy
from gate.api import keys

OPERATOR = "system:serviceaccount:nodegate-system:nodegate-operator"


def test_the_operator_is_never_evaluated_and_nodes_and_their_status_are() -> None:
    policy, binding = node_keys_policy(name="p", operator_username=OPERATOR)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [{"name": "not-the-operator",
                                        "expression": f"request.userInfo.username != '{OPERATOR}'"}]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes", "nodes/status"] and rule["operations"] == ["CREATE", "UPDATE"]
    assert binding["spec"] == {"policyName": "p", "validationActions": ["Deny"]}


def test_every_key_the_operator_owns_is_named_in_the_policy() -> None:
    policy, _ = node_keys_policy(name="p", operator_username=OPERATOR)
    text = str(policy)
    for key in (keys.state_annotation(""), keys.CORDONED_BY, f"{keys.GROUP}/status.", keys.READINESS_TAINT_KEY,
                keys.CONDITION_PREFIX, keys.reset_annotation(""), keys.rerun_annotation(""), keys.IGNORE_LABEL):
        assert key in text, key


def test_the_chart_template_is_the_policy_with_helm_names() -> None:
    text = chart_template()
    assert '{{ include "nodegate.operatorUsername" . }}' in text
    assert 'name: {{ include "nodegate.fullname" . }}-node-keys' in text
    assert '{{- include "nodegate.labels" (dict "ctx" $ "component" "operator") | nindent 4 }}' in text
    assert OPERATOR not in text
