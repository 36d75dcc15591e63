"""The Validating- and MutatingWebhookConfiguration, generated here and nowhere else.

The Helm chart renders these same objects (service mode); the dev cluster registers them in url mode
(the API server calls a local process on 127.0.0.1). Choices, and why:

* `failurePolicy: Fail` for NodeGate and DeploymentPolicy: a spec that skipped validation could
  disrupt a fleet; refusing writes while the webhook is down is the safe side.
* Node CREATE mutation (the readiness taint) uses `Ignore`: with `Fail`, a webhook outage would keep
  every new node from registering, a cluster-wide outage of its own. The operator taints any matching
  node that joined without the taint before anything else runs there, so a missed mutation costs a
  short window in which pods may land on a node that is not ready, not a lost guarantee.
* Node UPDATE validation (taint protection) uses `Fail`, narrowed by `matchConditions` to requests that
  remove the readiness taint by someone other than the operator: ordinary node traffic (kubelet
  status, other controllers) never reaches the webhook, and while it is down only those removals wait.
* Exec, attach and port-forward into NodeGate's pods (`stage-pod-connect`) use `Fail`, scoped *to* the
  operator's namespace (namespaceSelector In) and narrowed by `matchConditions` to pods named as stage
  and prepull pods are (`ng-`): the request names only the pod (its object is a PodExecOptions, with no
  labels, so neither an objectSelector nor a CEL condition can see what the pod is), and the webhook
  reads it (gate.admission.rules.connect). The operator's and the webhook's own pods are never sent
  to it, so an outage never stops an exec into them. `sideEffects: NoneOnDryRun`: an allowed
  break-glass use leaves an Event (a CONNECT is never a dry run).
* `sideEffects: None`, `admissionReviewVersions: [v1]`, `matchPolicy: Equivalent`, short timeouts,
  `status` subresources left out (the rules name the resources only), the operator's namespace and
  kube-system excluded by namespaceSelector (it only acts on namespaced kinds; all three kinds here are
  cluster-scoped, so it is a guard for future rules).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from gate.admission.rules.connect import CONNECT_SUBRESOURCES, POD_NAME_PREFIX
from gate.api.keys import GROUP, NODEGATE_PLURAL, POLICY_PLURAL, READINESS_TAINT_EFFECT, READINESS_TAINT_KEY, VERSION

Mode = Literal["service", "url"]
FailurePolicy = Literal["Fail", "Ignore"]
DEFAULT_NAME = "nodegate"
VALIDATE_PATH = "/validate"
MUTATE_PATH = "/mutate"

_TAINT = f"t.key == '{READINESS_TAINT_KEY}' && t.effect == '{READINESS_TAINT_EFFECT}'"


def _ca(ca_bundle: bytes | str | None) -> dict[str, str]:
    if not ca_bundle:
        return {}
    raw = ca_bundle.encode() if isinstance(ca_bundle, str) else ca_bundle
    return {"caBundle": base64.b64encode(raw).decode()}


def webhook_configurations(
    *,
    mode: Mode,
    ca_bundle: bytes | str | None = None,
    name: str = DEFAULT_NAME,
    url: str = "https://127.0.0.1:9443",
    service_name: str = "nodegate-webhook",
    service_namespace: str = "nodegate-system",
    service_port: int = 443,
    operator_namespace: str = "nodegate-system",
    operator_service_account: str = "nodegate-operator",
    timeout_seconds: int = 5,
    node_mutation_failure_policy: FailurePolicy = "Ignore",
    labels: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ValidatingWebhookConfiguration, MutatingWebhookConfiguration) named `name`.

    `mode="service"` points at `service_name.service_namespace:service_port` (in cluster, for the chart);
    `mode="url"` at `url` (the dev cluster's local process). `ca_bundle` is the PEM bundle the API server
    trusts for the webhook; None leaves it out (cert-manager's cainjector fills it in).
    """
    if not 1 <= timeout_seconds <= 30:
        raise ValueError("timeout_seconds must be 1 to 30")

    def client(path: str) -> dict[str, Any]:
        if mode == "url":
            return {"url": url.rstrip("/") + path, **_ca(ca_bundle)}
        return {"service": {"name": service_name, "namespace": service_namespace, "path": path,
                            "port": service_port}, **_ca(ca_bundle)}

    operator = f"system:serviceaccount:{operator_namespace}:{operator_service_account}"

    def common() -> dict[str, Any]:
        # fresh objects per webhook: shared ones would come out of a YAML dump as anchors and aliases
        return {"sideEffects": "None", "admissionReviewVersions": ["v1"], "matchPolicy": "Equivalent",
                "namespaceSelector": {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": sorted({operator_namespace, "kube-system"})}]}}

    def crd_rule(plural: str, operations: list[str]) -> dict[str, Any]:
        return {"apiGroups": [GROUP], "apiVersions": [VERSION], "resources": [plural],
                "operations": operations, "scope": "Cluster"}

    def node_rule(operation: str) -> dict[str, Any]:
        return {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["nodes"], "operations": [operation],
                "scope": "Cluster"}

    def meta() -> dict[str, Any]:
        return {"name": name, "labels": {"app.kubernetes.io/name": "nodegate",
                                         "app.kubernetes.io/component": "webhook", **(labels or {})}}
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": meta(),
        "webhooks": [
            {"name": f"{NODEGATE_PLURAL}.validate.{GROUP}", "clientConfig": client(VALIDATE_PATH),
             "rules": [crd_rule(NODEGATE_PLURAL, ["CREATE", "UPDATE", "DELETE"])],
             "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds, **common()},
            {"name": f"{POLICY_PLURAL}.validate.{GROUP}", "clientConfig": client(VALIDATE_PATH),
             "rules": [crd_rule(POLICY_PLURAL, ["CREATE", "UPDATE", "DELETE"])],
             "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds, **common()},
            {"name": f"node-taint.validate.{GROUP}", "clientConfig": client(VALIDATE_PATH),
             "rules": [node_rule("UPDATE")],
             "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds, **common(),
             "matchConditions": [
                 {"name": "removes-readiness-taint", "expression": (
                     f"has(oldObject.spec) && has(oldObject.spec.taints) && oldObject.spec.taints.exists(t, {_TAINT})"
                     f" && !(has(object.spec) && has(object.spec.taints) && object.spec.taints.exists(t, {_TAINT}))")},
                 {"name": "not-the-operator", "expression": f"request.userInfo.username != '{operator}'"},
             ]},
            {"name": f"stage-pod-connect.validate.{GROUP}", "clientConfig": client(VALIDATE_PATH),
             "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CONNECT"], "scope": "Namespaced",
                        "resources": [f"pods/{s}" for s in CONNECT_SUBRESOURCES]}],
             "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds,
             "sideEffects": "NoneOnDryRun", "admissionReviewVersions": ["v1"], "matchPolicy": "Equivalent",
             "namespaceSelector": {"matchExpressions": [{
                 "key": "kubernetes.io/metadata.name", "operator": "In", "values": [operator_namespace]}]},
             "matchConditions": [
                 {"name": "nodegate-pod-name", "expression": f"request.name.startsWith('{POD_NAME_PREFIX}')"},
             ]},
        ],
    }
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": meta(),
        "webhooks": [
            {"name": f"defaults.mutate.{GROUP}", "clientConfig": client(MUTATE_PATH),
             "rules": [crd_rule(NODEGATE_PLURAL, ["CREATE", "UPDATE"]), crd_rule(POLICY_PLURAL, ["CREATE", "UPDATE"])],
             "failurePolicy": "Fail", "timeoutSeconds": timeout_seconds, "reinvocationPolicy": "Never", **common()},
            {"name": f"node-taint.mutate.{GROUP}", "clientConfig": client(MUTATE_PATH),
             "rules": [node_rule("CREATE")],
             "failurePolicy": node_mutation_failure_policy, "timeoutSeconds": min(timeout_seconds, 3),
             "reinvocationPolicy": "Never", **common(),
             "matchConditions": [
                 {"name": "not-yet-tainted", "expression": (
                     f"!has(object.spec) || !has(object.spec.taints) || !object.spec.taints.exists(t, {_TAINT})")},
             ]},
        ],
    }
    return validating, mutating


def ca_bundles_of(configuration: dict[str, Any]) -> list[str]:
    """The base64 caBundle of each webhook of a configuration ("" where unset)."""
    return [str(w.get("clientConfig", {}).get("caBundle", "")) for w in configuration.get("webhooks", [])]
