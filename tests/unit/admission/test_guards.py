"""Issue 33's guards, judged by the pure rules: exec into NodeGate's pods, deleting a gate, changing a
policy that gates name, and readinessTaint selectors a kubelet could walk out of."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from gate.admission.configuration import webhook_configurations
from gate.admission.rules import decide
from gate.admission.rules.connect import (
    EXEC_STAGE_PODS_VERB,
    POD_NAME_PREFIX,
    WILDCARD_PROBE_VERB,
    host_access_pod,
)
from gate.admission.rules.facts import Facts, Lookups
from gate.admission.rules.kubelet_labels import kubelet_may_set, readiness_selector_warnings
from gate.admission.rules.review import AccessCheck, AdmissionRequest, Notice, Verdict
from gate.admission.testing import RecordedNotices, StaticFacts
from gate.api.keys import GROUP, NODEGATE_PLURAL
from gate.kube.errors import ConnectionFailed
from gate.lifecycle.node import Step, pod_name
from gate.lifecycle.prepull import RoundImages, prepull_pod_name
from tests.unit.admission.helpers import gate, package, request
from tests.unit.admission.server import running_server
from tests.unit.admission.test_server import post

NS = "nodegate-system"


def connect(sub: str, pod: str, namespace: str = NS, user: str = "oncall") -> AdmissionRequest:
    kinds = {"exec": "PodExecOptions", "attach": "PodAttachOptions", "portforward": "PodPortForwardOptions"}
    return AdmissionRequest.model_validate({
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": kinds[sub]}, "operation": "CONNECT",
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": sub,
        "name": pod, "namespace": namespace, "object": {"kind": kinds[sub], "apiVersion": "v1"},
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    })


def stage_pod(name: str = "ng-apply-0123", kind: str = "stages") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": {
        "app.kubernetes.io/managed-by": "nodegate", "nodegate.io/gate": "tuning", "nodegate.io/node": "n1",
        "nodegate.io/stage": kind}},
        "spec": {"nodeName": "n1", "hostPID": True,
                 "containers": [{"name": "a", "securityContext": {"privileged": True}}],
                 "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}


def operator_pod() -> dict[str, Any]:
    return {"metadata": {"name": "ng-operator-5d8f", "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "nodegate", "app.kubernetes.io/component": "operator"}},
            "spec": {"serviceAccountName": "nodegate-operator", "containers": [{"name": "operator"}]}}


def test_exec_attach_and_port_forward_into_a_stage_or_prepull_pod_ask_for_the_break_glass_verb_by_name() -> None:
    prepull = stage_pod("ng-prepull-9", kind="prepull")
    del prepull["spec"]["hostPID"], prepull["spec"]["volumes"], prepull["spec"]["containers"][0]["securityContext"]
    for pod in (stage_pod(), prepull):
        for sub in ("exec", "attach", "portforward"):
            req = connect(sub, pod["metadata"]["name"])
            assert decide.plan_lookups(req, "validate") == Lookups(pod=(NS, pod["metadata"]["name"]))
            verdict = decide.validate(req, Facts(pod=pod))
            named, wildcard = verdict.access
            assert (named.verb, named.group, named.resource, named.name, named.expect) == \
                (EXEC_STAGE_PODS_VERB, GROUP, NODEGATE_PLURAL, "tuning", True)
            assert (wildcard.verb, wildcard.expect) == (WILDCARD_PROBE_VERB, False)
            # the on-call engineer: neither the verb nor a wildcard
            refused = verdict.with_answers([False, False])
            assert not refused.allowed and f"pod {NS}/{pod['metadata']['name']}" in refused.violations[0].message
            assert "exec-stage-pods" in refused.violations[0].message
            # a cluster admin: allowed every verb, the probe too
            admin = verdict.with_answers([True, True])
            assert [v.message for v in admin.violations] == [wildcard.denied.message]
            message = admin.violations[0].message
            assert "by a wildcard" in message and pod["metadata"]["name"] in message
            # the break-glass holder: the verb by name, no wildcard; an Event is due
            passed = verdict.with_answers([True, False])
            assert passed.allowed and len(passed.notices) == 1
            notice = passed.notices[0]
            assert (notice.namespace, notice.kind, notice.name) == (NS, "Pod", pod["metadata"]["name"])
            assert '"oncall"' in notice.note and "n1" in notice.note


def test_pods_that_are_not_nodegates_stay_open_to_exec() -> None:
    assert decide.validate(connect("exec", "ng-operator-5d8f"), Facts(pod=operator_pod())) == Verdict()
    # a pod that does not exist: the API server answers 404 itself
    assert decide.validate(connect("exec", "ng-gone"), Facts(pod=None)) == Verdict()
    # a name no pod can have (a review sent straight to the port) is never looked up
    assert decide.plan_lookups(connect("exec", "../secrets/x"), "validate") == Lookups()
    # another namespace is not NodeGate's (the configuration never sends it; the rule holds anyway)
    assert decide.validate(connect("exec", "ng-apply-0123", namespace="team"), Facts(pod=stage_pod())) == Verdict()


def test_any_host_access_in_the_operators_namespace_counts_labelled_or_not() -> None:
    for spec in ({"hostNetwork": True}, {"hostPID": True}, {"hostIPC": True},
                 {"volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]},
                 {"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]}):
        assert host_access_pod({"metadata": {"name": "ng-x"}, "spec": spec}) is not None, spec
    assert host_access_pod(operator_pod()) is None
    assert host_access_pod({"metadata": {"labels": {"nodegate.io/stage": "stages"}}, "spec": {}}) is None  # not managed


def test_stage_and_prepull_pod_names_start_with_the_prefix_the_configuration_matches() -> None:
    assert pod_name("g", "n", 1, "stages", Step("p", "apply", "f")).startswith(POD_NAME_PREFIX)
    images = RoundImages(agent="a", packages={})
    assert prepull_pod_name("g", "n", images).startswith(POD_NAME_PREFIX)
    validating, _ = webhook_configurations(mode="url", operator_namespace="ops")
    [hook] = [h for h in validating["webhooks"] if h["name"].startswith("stage-pod-connect.")]
    assert hook["failurePolicy"] == "Fail" and hook["rules"][0]["operations"] == ["CONNECT"]
    assert hook["rules"][0]["resources"] == ["pods/exec", "pods/attach", "pods/portforward"]
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ops"]}]
    assert hook["matchConditions"][0]["expression"] == f"request.name.startsWith('{POD_NAME_PREFIX}')"
    [gates] = [h for h in validating["webhooks"] if h["name"].startswith("nodegates.")]
    assert gates["rules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]


def test_deleting_a_gate_needs_use_on_each_of_its_packages() -> None:
    old = gate({"base": package(), "tuning": package()}, name="fleet")
    req = request("NodeGate", "DELETE", None, old, user="deleter")
    assert decide.plan_lookups(req, "validate") == Lookups()
    verdict = decide.validate(req, Facts())
    assert [(c.verb, c.resource, c.name) for c in verdict.access] == [("use", "packages", "base"),
                                                                      ("use", "packages", "tuning")]
    refused = verdict.with_answers([True, False])
    [v] = refused.violations
    assert v.field == "spec.packages[tuning]" and v.forbidden
    assert 'user "deleter" may not delete NodeGate "fleet"' in v.reason and '"tuning"' in v.reason
    assert verdict.with_answers([True, True]).allowed
    assert decide.validate(request("NodeGate", "DELETE", None, gate({}, name="empty")), Facts()).allowed


def policy(name: str = "fleet", budget: int = 1) -> dict[str, Any]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": name},
            "spec": {"default": {"budget": {"count": budget}}}}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_changing_a_policy_needs_use_on_every_package_of_every_gate_naming_it(operation: str) -> None:
    new = policy(budget=5)
    old = policy() if operation == "UPDATE" else None
    req = request("DeploymentPolicy", operation, new, old, user="writer")
    assert decide.plan_lookups(req, "validate") == Lookups(gates_referencing="fleet")
    facts = Facts(referencing_gates=("a", "b"), referencing_packages={"a": ("base", "gpu"), "b": ("base",)})
    verdict = decide.validate(req, facts)
    assert [c.name for c in verdict.access] == ["base", "gpu"]
    refused = verdict.with_answers([False, True])
    message = refused.violations[-1].message
    assert message.startswith("spec: ") and 'DeploymentPolicy "fleet"' in message and "a, b" in message
    assert 'package "base"' in message and 'user "writer"' in message
    # nothing names it: no package right is needed
    assert decide.validate(req, Facts()).access == ()


def test_deleting_a_policy_a_gate_names_stays_refused_outright() -> None:
    req = request("DeploymentPolicy", "DELETE", None, policy(), user="writer")
    facts = Facts(referencing_gates=("a",), referencing_packages={"a": ("base",)})
    verdict = decide.validate(req, facts)
    assert verdict.access == () and "still referenced by NodeGate(s) a" in verdict.violations[0].message
    assert decide.validate(req, Facts()).allowed


def test_a_metadata_only_policy_update_asks_nothing() -> None:
    old, new = policy(), policy()
    new["metadata"]["labels"] = {"team": "x"}
    req = request("DeploymentPolicy", "UPDATE", new, old)
    assert decide.plan_lookups(req, "validate") == Lookups()
    assert decide.validate(req, Facts(referencing_gates=("a",), referencing_packages={"a": ("base",)})).allowed


@pytest.mark.parametrize(("key", "settable"), [
    ("pool", True), ("example.com/pool", True), ("kubernetes.io/hostname", True), ("kubernetes.io/arch", True),
    ("topology.kubernetes.io/zone", True), ("node.kubernetes.io/instance-type", True),
    ("node.kubernetes.io/anything", True), ("kubelet.kubernetes.io/x", True),
    ("node-restriction.kubernetes.io/pool", False), ("team.node-restriction.kubernetes.io/pool", False),
    ("node-role.kubernetes.io/gpu", False), ("k8s.io/thing", False), ("example.k8s.io/thing", False),
])
def test_kubelet_settable_labels_follow_node_restriction(key: str, settable: bool) -> None:
    assert kubelet_may_set(key) is settable


def test_a_readiness_taint_gate_selecting_on_a_kubelet_settable_label_is_warned_with_the_restricted_form() -> None:
    selector = {"matchLabels": {"pool": "gpu", "node-restriction.kubernetes.io/tier": "a"},
                "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]}
    obj = gate({"base": package()}, nodeSelector=selector, readinessTaint=True)
    verdict = decide.validate(request("NodeGate", "CREATE", obj), Facts())
    assert len(verdict.warnings) == 2
    assert '"pool"' in verdict.warnings[0] and '"node-restriction.kubernetes.io/pool"' in verdict.warnings[0]
    assert '"topology.kubernetes.io/zone"' in verdict.warnings[1]
    assert verdict.with_answers([True]).warnings == verdict.warnings  # kept through the access checks
    # none without readinessTaint, none on the restricted form
    assert readiness_selector_warnings({"nodeSelector": selector}) == []
    assert readiness_selector_warnings({"readinessTaint": True, "nodeSelector": {
        "matchLabels": {"node-restriction.kubernetes.io/pool": "gpu"}}}) == []


class BreakGlassHolder:
    """Allowed the break-glass verb by name, and nothing by a wildcard."""

    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]:
        return [c.verb == EXEC_STAGE_PODS_VERB for c in checks]


class FailingNotices:
    async def record(self, notice: Notice, user: str) -> None:
        raise ConnectionFailed("events: connection refused")


def _exec_review() -> bytes:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": connect("exec", "ng-apply-0123").model_dump(by_alias=True, mode="json")}
    return json.dumps(body).encode()


def test_the_server_lets_break_glass_through_only_with_its_event_written() -> None:
    facts = StaticFacts(pods=[stage_pod()])
    recorded = RecordedNotices()
    with running_server(facts=facts, authorizer=BreakGlassHolder(), notices=recorded) as srv:  # type: ignore[arg-type]
        status, body = post(srv, "/validate", _exec_review())
        assert status == 200 and body["response"]["allowed"] is True
    [(notice, user)] = recorded.recorded
    assert user == "oncall" and notice.name == "ng-apply-0123" and notice.reason == "BreakGlassExec"
    for notices in (FailingNotices(), None):  # no trace, no way in
        with running_server(facts=facts, authorizer=BreakGlassHolder(), notices=notices) as srv:  # type: ignore[arg-type]
            status, body = post(srv, "/validate", _exec_review())
            assert status == 200 and body["response"]["allowed"] is False
            assert "break-glass" in body["response"]["status"]["message"]
