"""NodeGate's least-privilege RBAC, as data: the one source of the chart's Roles and of the dev cluster's.

`nodegate manifests` writes these rules, with their reasons as comments, into the Helm chart
(`charts/nodegate/templates/_rules.tpl`); a test renders the chart and compares its RBAC with the
objects built here; the dev cluster installs the objects built here and runs the operator and the
webhook as their ServiceAccounts. Another test removes each verb of each rule in turn and shows that
the API call it exists for is then refused (tests/chart/test_rbac_necessity.py).

No wildcard verbs or resources. Every rule says why it exists.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from gate.api import keys
from gate.api.common import Obj
from gate.controller.events import CLUSTER_EVENTS_NAMESPACE

OPERATOR_SERVICE_ACCOUNT = "nodegate-operator"
PACKAGE_SERVICE_ACCOUNT = "nodegate-package"
WEBHOOK_SERVICE_ACCOUNT = "nodegate-webhook"
PRE_DELETE_SERVICE_ACCOUNT = "nodegate-pre-delete"

# Placeholders in resourceNames, filled per install (Python: arguments; the chart: template expressions).
CONFIGURATION = "{configuration}"
"""the name of both webhook configurations"""
SECRET = "{secret}"
"""the name of the webhook's self-managed certificate Secret"""
STATE_KEY = "{state_key}"
"""the name of the Secret holding the operator's record signing keys (gate.controller.signing)"""


class Rule(NamedTuple):
    """One PolicyRule and why NodeGate needs it. Index-compatible with the (apiGroups, resources,
    verbs, why) tuples of earlier versions."""

    api_groups: list[str]
    resources: list[str]
    verbs: list[str]
    why: str
    resource_names: list[str] = []  # noqa: RUF012 - a NamedTuple default, never mutated

    def wire(self, names: dict[str, str] | None = None) -> Obj:
        rule: Obj = {"apiGroups": list(self.api_groups), "resources": list(self.resources),
                     "verbs": list(self.verbs)}
        if self.resource_names:
            rule["resourceNames"] = [(names or {}).get(n, n) for n in self.resource_names]
        return rule


# -- the operator -----------------------------------------------------------------------------------

# ClusterRole: cluster-scoped kinds, and pods in every namespace (drains).
CLUSTER_RULES: list[Rule] = [
    Rule([keys.GROUP], ["nodegates"], ["list", "watch"], "the operator's cache of NodeGates"),
    Rule([keys.GROUP], ["nodegates"], ["patch"],
         "add and remove the cleanup finalizer; clear the resume annotation once consumed"),
    Rule([keys.GROUP], ["nodegates/status"], ["patch"], "write conditions, node counts and compartments"),
    Rule([keys.GROUP], ["deploymentpolicies"], ["list", "watch"],
         "the operator's cache of compartments, budgets and windows"),
    Rule([keys.GROUP], ["deploymentpolicies/status"], ["patch"],
         "write a policy's Ready/Stalled conditions, observedGeneration and usedBy"),
    Rule([""], ["nodes"], ["list", "watch"], "the operator's cache of the fleet"),
    Rule([""], ["nodes"], ["patch"],
         "one write per step: state annotation, status label, cordon and the readiness taint"),
    Rule([""], ["nodes/status"], ["patch"],
         "the conditions nodegate.io/failed.<gate> on a failed node and nodegate.io/blocked.<gate> on one "
         "held by protected pods or a PodDisruptionBudget (kubectl describe node shows why)"),
    Rule([""], ["pods"], ["list", "watch"],
         "pods on a node (every namespace) to drain; the cache of every pod's node and labels, so a node whose "
         "protected pods run is not picked; also the cache of stage pods (their steps' ends and termination "
         "messages)"),
    Rule([""], ["pods/eviction"], ["create"], "drain with the Eviction API so PodDisruptionBudgets are respected"),
]

# Role in the operator's namespace: stage pods and their config, the leader Lease.
NAMESPACE_RULES: list[Rule] = [
    Rule([""], ["pods"], ["create", "delete"],
         "run a phase of a round on a node (a pod pinned to it); delete it once its steps are recorded"),
    Rule([""], ["pods"], ["get"],
         "read a staging pod whole (the cache keeps pods slimmed) to run its undo with the very spec it staged"),
    Rule([""], ["configmaps"], ["create"],
         "package config mounted into stages (immutable, named by content; garbage-collected with the gate)"),
    Rule([""], ["configmaps"], ["get"],
         "read a package ConfigMap that already exists under its name, to refuse one that is not NodeGate's"),
    Rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"],
         "leader election: read, create and renew (compare-and-swap) the Lease"),
    Rule(["apps"], ["controllerrevisions"], ["list", "create", "patch", "delete"],
         "a gate's history (nodegate rollout history/undo): list a gate's revisions, record its spec as a new one, "
         "renumber one applied again, delete those beyond the history limit or squatting a revision's name"),
    Rule([""], ["secrets"], ["create"],
         "create the record signing key Secret on first start (RBAC cannot name an object not yet created)"),
    Rule([""], ["secrets"], ["get", "patch"],
         "read the key that signs the operator's node records; mark the adoption of older records done",
         [STATE_KEY]),
]

# Role in the namespace where Kubernetes keeps Events of cluster-scoped objects (kubectl describe
# node/nodegate reads them there): the operator reports on Nodes and NodeGates only.
EVENTS_NAMESPACE = CLUSTER_EVENTS_NAMESPACE
EVENTS_RULES: list[Rule] = [
    Rule(["events.k8s.io"], ["events"], ["create"], "Events on NodeGates and Nodes"),
]

# -- the admission webhook --------------------------------------------------------------------------

WEBHOOK_CLUSTER_RULES: list[Rule] = [
    Rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"],
         "RBAC-scoped package use and the taint bypass: ask the API server about the requesting user"),
    Rule([keys.GROUP], ["nodegates"], ["list", "watch"],
         "the NodeGate cache (readinessTaint gates); gates referencing a policy being deleted"),
    Rule([keys.GROUP], ["deploymentpolicies"], ["list", "watch"], "the DeploymentPolicy cache"),
    Rule([keys.GROUP], ["deploymentpolicies"], ["get"], "a policy created a moment ago, not yet in the cache"),
    Rule([""], ["nodes"], ["list"], "nodes where a package being removed is still installed"),
]

# Role in the operator's namespace: exec, attach and port-forward into NodeGate's pods.
WEBHOOK_NAMESPACE_RULES: list[Rule] = [
    Rule([""], ["pods"], ["get"],
         "read the pod an exec, attach or port-forward goes into: refused when it is a stage or prepull pod"),
    Rule(["events.k8s.io"], ["events"], ["create"],
         "a Warning Event on the pod when the break-glass verb exec-stage-pods lets someone in"),
]

# Self-managed certificates only (cert-manager mode needs none of these).
WEBHOOK_SELF_MANAGED_CLUSTER_RULES: list[Rule] = [
    Rule(["admissionregistration.k8s.io"], ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
         ["get", "update"], "keep the caBundle of NodeGate's own two configurations current",
         [CONFIGURATION]),
]
WEBHOOK_SELF_MANAGED_NAMESPACE_RULES: list[Rule] = [
    Rule([""], ["secrets"], ["create"],
         "create the certificate Secret on first start (RBAC cannot name an object not yet created)"),
    Rule([""], ["secrets"], ["get", "update"],
         "read the certificate Secret and rotate it in place (compare-and-swap between replicas)", [SECRET]),
]

# -- the chart's pre-delete hook ---------------------------------------------------------------------

PRE_DELETE_RULES: list[Rule] = [
    Rule(["admissionregistration.k8s.io"], ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
         ["delete"], "remove both webhook configurations first, so no webhook without a server refuses writes",
         [CONFIGURATION]),
]

RuleSet = Literal["operator-cluster", "operator-namespace", "operator-events", "webhook-cluster",
                  "webhook-namespace", "webhook-self-managed-cluster", "webhook-self-managed-namespace", "pre-delete"]

RULE_SETS: dict[RuleSet, list[Rule]] = {
    "operator-cluster": CLUSTER_RULES,
    "operator-namespace": NAMESPACE_RULES,
    "operator-events": EVENTS_RULES,
    "webhook-cluster": WEBHOOK_CLUSTER_RULES,
    "webhook-namespace": WEBHOOK_NAMESPACE_RULES,
    "webhook-self-managed-cluster": WEBHOOK_SELF_MANAGED_CLUSTER_RULES,
    "webhook-self-managed-namespace": WEBHOOK_SELF_MANAGED_NAMESPACE_RULES,
    "pre-delete": PRE_DELETE_RULES,
}


def _rules(rules: list[Rule], names: dict[str, str] | None = None) -> list[Obj]:
    return [r.wire(names) for r in rules]


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "nodegate", "app.kubernetes.io/component": component}


def _sa(name: str, namespace: str, component: str, *, automount: bool | None = None) -> Obj:
    obj: Obj = {"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace, "labels": _labels(component)}}
    if automount is not None:
        obj["automountServiceAccountToken"] = automount
    return obj


def _role(kind: str, name: str, namespace: str | None, rules: list[Obj], component: str) -> Obj:
    meta: Obj = {"name": name, "labels": _labels(component)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "rules": rules}


def _binding(kind: str, name: str, namespace: str | None, role_kind: str, role: str, subject: Obj,
             component: str) -> Obj:
    meta: Obj = {"name": name, "labels": _labels(component)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [subject]}


def operator_rbac(namespace: str, *, prefix: str = "nodegate") -> list[Obj]:
    """The operator's ServiceAccount (and the package pods' one, with no token) and its roles.

    `prefix` names everything (`<prefix>-operator`, the key Secret `<prefix>-state-key`, ...): the chart's
    fullname; "nodegate" by default.
    """
    sa_name, role = f"{prefix}-operator", f"{prefix}-operator"
    names = {STATE_KEY: state_key_secret(prefix)}
    sa = {"kind": "ServiceAccount", "name": sa_name, "namespace": namespace}
    return [
        _sa(sa_name, namespace, "operator"),
        _sa(f"{prefix}-package", namespace, "operator", automount=False),
        _role("ClusterRole", role, None, _rules(CLUSTER_RULES), "operator"),
        _binding("ClusterRoleBinding", role, None, "ClusterRole", role, sa, "operator"),
        _role("Role", role, namespace, _rules(NAMESPACE_RULES, names), "operator"),
        _binding("RoleBinding", role, namespace, "Role", role, sa, "operator"),
        _role("Role", f"{role}-events", EVENTS_NAMESPACE, _rules(EVENTS_RULES), "operator"),
        _binding("RoleBinding", f"{role}-events", EVENTS_NAMESPACE, "Role", f"{role}-events", sa, "operator"),
    ]


def state_key_secret(prefix: str = "nodegate") -> str:
    """The Secret of the operator's record signing keys, for an install named `prefix`."""
    return f"{prefix}-state-key"


def webhook_rbac(namespace: str, *, prefix: str = "nodegate", self_managed: bool = True,
                 configuration_name: str = "nodegate", secret_name: str = "nodegate-webhook-tls") -> list[Obj]:
    """The webhook's ServiceAccount and roles; the certificate rules only for self-managed certificates."""
    name = f"{prefix}-webhook"
    sa = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    names = {CONFIGURATION: configuration_name, SECRET: secret_name}
    cluster = WEBHOOK_CLUSTER_RULES + (WEBHOOK_SELF_MANAGED_CLUSTER_RULES if self_managed else [])
    objs = [
        _sa(name, namespace, "webhook"),
        _role("ClusterRole", name, None, _rules(cluster, names), "webhook"),
        _binding("ClusterRoleBinding", name, None, "ClusterRole", name, sa, "webhook"),
        _role("Role", f"{name}-pods", namespace, _rules(WEBHOOK_NAMESPACE_RULES), "webhook"),
        _binding("RoleBinding", f"{name}-pods", namespace, "Role", f"{name}-pods", sa, "webhook"),
    ]
    if self_managed:
        objs += [
            _role("Role", f"{name}-certs", namespace, _rules(WEBHOOK_SELF_MANAGED_NAMESPACE_RULES, names), "webhook"),
            _binding("RoleBinding", f"{name}-certs", namespace, "Role", f"{name}-certs", sa, "webhook"),
        ]
    return objs


def pre_delete_rbac(namespace: str, *, prefix: str = "nodegate", configuration_name: str = "nodegate") -> list[Obj]:
    """The chart's pre-delete hook: delete the webhook configurations, nothing else."""
    name = f"{prefix}-pre-delete"
    sa = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    return [
        _sa(name, namespace, "pre-delete"),
        _role("ClusterRole", name, None, _rules(PRE_DELETE_RULES, {CONFIGURATION: configuration_name}), "pre-delete"),
        _binding("ClusterRoleBinding", name, None, "ClusterRole", name, sa, "pre-delete"),
    ]
