"""The operator's least-privilege RBAC, as data: used by the dev cluster and checked against the chart.

Every rule says why it exists. No wildcard verbs or resources.
"""

from __future__ import annotations

from typing import Any

from gate.api import keys

Obj = dict[str, Any]

OPERATOR_SERVICE_ACCOUNT = "nodegate-operator"
PACKAGE_SERVICE_ACCOUNT = "nodegate-package"

# (apiGroups, resources, verbs, why)
CLUSTER_RULES: list[tuple[list[str], list[str], list[str], str]] = [
    ([keys.GROUP], ["nodegates"], ["get", "list", "watch", "patch", "update"],
     "read gates; add and remove the cleanup finalizer"),
    ([keys.GROUP], ["nodegates/status"], ["get", "patch", "update"], "write conditions, counts and compartments"),
    ([keys.GROUP], ["deploymentpolicies"], ["get", "list", "watch"], "read compartments, budgets and windows"),
    ([""], ["nodes"], ["get", "list", "watch", "patch", "update"],
     "per-node state annotation, status label, cordon and the readiness taint"),
    ([""], ["pods"], ["get", "list", "watch"], "find pods to wait for and to drain on a node"),
    ([""], ["pods/eviction"], ["create"], "drain with the Eviction API so PodDisruptionBudgets are respected"),
    (["events.k8s.io"], ["events"], ["create", "patch"], "Events on NodeGates and Nodes (namespace default)"),
]

NAMESPACE_RULES: list[tuple[list[str], list[str], list[str], str]] = [
    (["batch"], ["jobs"], ["get", "list", "watch", "create", "delete"], "stage Jobs pinned to nodes"),
    ([""], ["pods"], ["get", "list", "watch"], "stage pods: image pull errors, termination messages"),
    ([""], ["configmaps"], ["get", "list", "watch", "create", "delete"], "package config mounted into stages"),
    (["coordination.k8s.io"], ["leases"], ["get", "create", "update"], "leader election"),
    ([""], ["events"], ["create", "patch"], "Events in the operator's namespace"),
]


def _rules(rules: list[tuple[list[str], list[str], list[str], str]]) -> list[Obj]:
    return [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v, _ in rules]


def operator_rbac(namespace: str) -> list[Obj]:
    sa = {"kind": "ServiceAccount", "name": OPERATOR_SERVICE_ACCOUNT, "namespace": namespace}
    labels = {"app.kubernetes.io/name": "nodegate", "app.kubernetes.io/component": "operator"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": OPERATOR_SERVICE_ACCOUNT, "namespace": namespace, "labels": labels}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
         "metadata": {"name": PACKAGE_SERVICE_ACCOUNT, "namespace": namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "nodegate-operator", "labels": labels}, "rules": _rules(CLUSTER_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "nodegate-operator", "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodegate-operator"},
         "subjects": [sa]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "nodegate-operator", "namespace": namespace, "labels": labels},
         "rules": _rules(NAMESPACE_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "nodegate-operator", "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodegate-operator"},
         "subjects": [sa]},
    ]
