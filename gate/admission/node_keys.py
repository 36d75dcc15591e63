"""Who may write NodeGate's keys on a Node: one ValidatingAdmissionPolicy, generated here and nowhere else.

The keys on a Node drive the operator, which runs package images as root on the node: a forged
`state.<gate>` annotation once made it run a gate's package (and reboot) on a node the gate does not
select, and a forged `complete` state would mark a CVE fix done where it never ran. So, as the Node
authorizer and NodeRestriction say what a kubelet may change on its own Node, this policy says who may
change NodeGate's keys on any Node, in one place:

* written by the operator alone: the `state.<gate>` annotations, `cordoned-by`, `held-by` and
  `hand-off-released` (a hand-off hold, spec.leaveCordoned: `kubectl uncordon` ends it), the `status.<gate>`
  labels, the readiness taint (on UPDATE; a node may register with it, and the Node CREATE mutation
  adds it) and NodeGate's node conditions (`nodegate.io/...` types in `status.conditions`). Anyone
  else needs verb `bypass` on `nodegates.nodegate.io`, the right `docs/security.md` names for
  breaking glass;
* set by a person, for the operator to act on: `reset.<gate>` and `rerun.<gate>` need verb `patch` on
  that NodeGate (what `nodegate reset GATE` and `nodegate resume GATE` need anyway), and the
  `ignore` label, which opts a node out of every gate, needs `bypass`.

Why a ValidatingAdmissionPolicy and not the webhook: it runs inside the API server, so there is no
webhook to be down and no failure policy to fall back on, and a kubelet's writes never leave the API
server for it. Its CEL costs microseconds per Node write (maps of a node's annotations and labels),
and the operator's own writes are not evaluated at all (matchConditions). Status writes
(`nodes/status`, the kubelet's heartbeats and conditions) are evaluated too, since NodeGate's
conditions live there; what the kubelet writes never touches a NodeGate key, so it is never refused.

The chart's `templates/node-keys-policy.yaml` is this policy with Helm's names in place of the
operator's username and the object names (`nodegate manifests` writes it; a test fails when stale).
"""

from __future__ import annotations

from typing import Any

import yaml

from gate.api import keys

_G = keys.GROUP
_STATE = f"{_G}/state."
_STATUS = f"{_G}/status."
_RESET = keys.reset_annotation("")
_RERUN = keys.rerun_annotation("")
assert len(_RESET) == len(_RERUN)  # the gate's name is the rest of either key: one substring below
_GATE_CHECK = f"authorizer.group('{_G}').resource('{keys.NODEGATE_PLURAL}')"


def _map(obj: str, field: str) -> str:
    """A metadata map of `obj` (object or oldObject), empty where absent (oldObject is null on CREATE)."""
    guard = f"{obj} != null && " if obj == "oldObject" else ""
    return f"{guard}has({obj}.metadata.{field}) ? {obj}.metadata.{field} : {{}}"


def _changed(name: str) -> str:
    """Keys of the map variable pair `old<name>`/`new<name>` that were added, changed or removed."""
    old, new = f"variables.old{name}", f"variables.new{name}"
    return f"{new}.filter(k, !(k in {old}) || {old}[k] != {new}[k]) + {old}.filter(k, !(k in {new}))"


def _ours(obj: str, path: str, item: str, test: str) -> str:
    """The items of a list of `obj` (spec.taints, status.conditions) that are NodeGate's, [] where absent."""
    first = path.partition(".")[0]
    guard = f"{obj} != null && " if obj == "oldObject" else ""
    return (f"({guard}has({obj}.{first}) && has({obj}.{path}) ? {obj}.{path}.filter({item}, {test}) : [])")


def node_keys_policy(*, name: str, operator_username: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) named `name`."""
    taint = f"t.key == '{keys.READINESS_TAINT_KEY}'"
    condition = f"c.type.startsWith('{keys.CONDITION_PREFIX}')"
    bypass = f"{_GATE_CHECK}.check('{keys.BYPASS_VERB}').allowed()"
    may_patch = f"{_GATE_CHECK}.name(k.substring({len(_RESET)})).check('patch').allowed()"
    variables = [
        ("oldAnnotations", _map("oldObject", "annotations")),
        ("newAnnotations", _map("object", "annotations")),
        ("oldLabels", _map("oldObject", "labels")),
        ("newLabels", _map("object", "labels")),
        ("changedAnnotations", _changed("Annotations")),
        ("changedLabels", _changed("Labels")),
        # UPDATE only: a node may register with the taint (kubelet --register-with-taints, or the Node
        # CREATE mutation on the kubelet's own request); it is the taint's removal that lets work in.
        ("taintChanged", f"oldObject != null && {_ours('oldObject', 'spec.taints', 't', taint)}"
                         f" != {_ours('object', 'spec.taints', 't', taint)}"),
        ("conditionsChanged", f"{_ours('oldObject', 'status.conditions', 'c', condition)}"
                              f" != {_ours('object', 'status.conditions', 'c', condition)}"),
        ("operatorKeys",
         f"variables.changedAnnotations.filter(k, k.startsWith('{_STATE}') || k == '{keys.CORDONED_BY}'"
         f" || k == '{keys.HELD_BY}' || k == '{keys.HAND_OFF_RELEASED}')"
         f" + variables.changedLabels.filter(k, k.startsWith('{_STATUS}'))"
         f" + (variables.taintChanged ? ['taint {keys.READINESS_TAINT_KEY}'] : [])"
         f" + (variables.conditionsChanged ? ['node conditions {keys.CONDITION_PREFIX}*'] : [])"),
        ("requestKeys",
         f"variables.changedAnnotations.filter(k, k.startsWith('{_RESET}') || k.startsWith('{_RERUN}'))"),
        ("ignoreChanged", f"'{keys.IGNORE_LABEL}' in variables.changedLabels"),
        # Worked out here, not in the validation: a variable may ask the authorizer (a message may not,
        # so the message names every request of the write).
        ("refusedRequests", f"variables.requestKeys.filter(k, !({may_patch}))"),
    ]
    who = "'user \"' + request.userInfo.username + '\"'"
    validations = [
        {"expression": f"size(variables.operatorKeys) == 0 || {bypass}",
         "reason": "Forbidden",
         "messageExpression": (
             f"'NodeGate node keys are reserved to the NodeGate operator ({operator_username}): ' + {who}"
             f" + ' is not allowed verb \"{keys.BYPASS_VERB}\" on {keys.NODEGATE_PLURAL}.{_G}, so may not add, "
             "change or remove ' + variables.operatorKeys.join(', ')")},
        {"expression": f"!variables.ignoreChanged || {bypass}",
         "reason": "Forbidden",
         "messageExpression": (
             f"'label {keys.IGNORE_LABEL} opts a node out of every NodeGate: ' + {who} + ' is not allowed verb "
             f"\"{keys.BYPASS_VERB}\" on {keys.NODEGATE_PLURAL}.{_G}, so may not set, change or remove it'")},
        {"expression": "size(variables.refusedRequests) == 0",
         "reason": "Forbidden",
         "messageExpression": (
             f"{who} + ' may not ask NodeGate to reset or rerun a gate it may not patch: "
             "' + variables.requestKeys.join(', ')"
             f" + ' (each needs verb \"patch\" on the {keys.NODEGATE_PLURAL}.{_G} it names)'")},
    ]
    labels = {"app.kubernetes.io/name": "nodegate", "app.kubernetes.io/component": "operator"}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes", "nodes/status"],
                "operations": ["CREATE", "UPDATE"]}]},
            "matchConditions": [{"name": "not-the-operator",
                                 "expression": f"request.userInfo.username != '{operator_username}'"}],
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": validations,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


# -- the chart's template ------------------------------------------------------------------------------

_NAME = "__NAME__"
_OPERATOR = "__OPERATOR__"
_LABELS_LINE = "  labels:\n    app.kubernetes.io/name: nodegate\n    app.kubernetes.io/component: operator\n"
_HELM_LABELS = '  labels:\n    {{- include "nodegate.labels" (dict "ctx" $ "component" "operator") | nindent 4 }}\n'


def chart_template() -> str:
    """`templates/node-keys-policy.yaml`: the policy with Helm's names for the operator and the objects."""
    policy, binding = node_keys_policy(name=_NAME, operator_username=_OPERATOR)
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, width=1 << 20) for o in (policy, binding))
    body = body.replace(_LABELS_LINE, _HELM_LABELS)
    body = body.replace(_NAME, '{{ include "nodegate.fullname" . }}-node-keys')
    body = body.replace(_OPERATOR, '{{ include "nodegate.operatorUsername" . }}')
    return ("{{- /*\nGenerated by `nodegate manifests` from gate/admission/node_keys.py (why each rule: there and in\n"
            "docs/security.md); edit it there and run `make manifests`. A test fails while this file is stale.\n"
            "*/ -}}\n" + body)
