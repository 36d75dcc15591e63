"""Node labels a kubelet may set or remove on its own Node, as the NodeRestriction admission plugin
decides (plugin/pkg/admission/noderestriction/admission.go, `getForbiddenLabels`, and
`k8s.io/kubelet/pkg/apis.IsKubeletLabel`).

A kubelet may change any label of its own Node except those under `node-restriction.kubernetes.io/`
(or a subdomain of it) and the `kubernetes.io` / `k8s.io` labels it does not own. It owns the well
known ones (hostname, os, arch, instance type, zone, region) and everything under
`kubelet.kubernetes.io/` and `node.kubernetes.io/`. A `readinessTaint` gate that selects on a label
the kubelet may remove lets a node walk out of the gate, and the operator then lifts a taint no gate
holds (docs/security.md): admission warns and names the `node-restriction.kubernetes.io/` form,
which only whoever may patch Nodes as a person (not the node itself) can set.
"""

from __future__ import annotations

from typing import Any, Final

NODE_RESTRICTION: Final = "node-restriction.kubernetes.io"
_KUBELET_LABELS: Final = frozenset({
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type",
    "kubernetes.io/os", "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
_KUBELET_NAMESPACES: Final = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _namespace(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else ""


def _in(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def kubelet_may_set(key: str) -> bool:
    """Whether NodeRestriction lets a kubelet add, change or remove label `key` on its own Node."""
    namespace = _namespace(key)
    if _in(namespace, NODE_RESTRICTION):
        return False
    if _in(namespace, "kubernetes.io") or _in(namespace, "k8s.io"):
        return key in _KUBELET_LABELS or any(_in(namespace, ns) for ns in _KUBELET_NAMESPACES)
    return True


def restricted_form(key: str) -> str:
    """The `node-restriction.kubernetes.io/` label a kubelet cannot set, for the same name."""
    return f"{NODE_RESTRICTION}/{key.rsplit('/', 1)[-1]}"


def selector_keys(selector: object) -> list[str]:
    """The label keys a LabelSelector reads (matchLabels, then matchExpressions), each once."""
    if not isinstance(selector, dict):
        return []
    out: list[str] = []
    labels = selector.get("matchLabels")
    if isinstance(labels, dict):
        out += [str(k) for k in labels]
    expressions: Any = selector.get("matchExpressions")
    for expr in expressions if isinstance(expressions, list) else []:
        if isinstance(expr, dict) and isinstance(expr.get("key"), str):
            out.append(expr["key"])
    return list(dict.fromkeys(out))


def readiness_selector_warnings(spec: object) -> list[str]:
    """Warnings for a `readinessTaint: true` gate whose nodeSelector reads labels a kubelet may set."""
    if not isinstance(spec, dict) or spec.get("readinessTaint") is not True:
        return []
    return [f'spec.nodeSelector: a kubelet may set or remove label "{key}" on its own Node, so a node could leave '
            f'this readinessTaint gate and lose the taint; select on "{restricted_form(key)}", which a kubelet '
            "cannot set (docs/security.md)"
            for key in selector_keys(spec.get("nodeSelector")) if kubelet_may_set(key)]
