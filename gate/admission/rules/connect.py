"""Exec, attach and port-forward into NodeGate's host-access pods: refused, for every identity.

A stage pod is privileged, in the host's PID and network namespaces, with the host's root mounted:
a shell in one is a root shell on the node. Whoever may `create pods/exec` in the operator's
namespace (a grant many clusters give on-call engineers cluster-wide) would otherwise hold every
node. So a CONNECT on `pods/exec`, `pods/attach` or `pods/portforward` into one of NodeGate's pods
is refused at admission, before the API server contacts the kubelet, cluster admins included.

What the request says is only the pod's name (the object is a `PodExecOptions`, with no labels),
so the webhook reads the pod (`Lookups.pod`) and this module judges it. A pod is NodeGate's when it
carries a stage pod's or prepull pod's labels (`managed-by: nodegate` and `nodegate.io/stage`), or
asks for host access at all: in the operator's namespace, the
chart's host-access policy admits host access only on the operator's stage pods, so any such pod is
one, labelled or not. Refusing a pod that merely carries the labels costs nothing: the operator's and
the webhook's own pods carry none of them and stay open to exec.

**Break glass.** Verb `exec-stage-pods` on `nodegates.nodegate.io`, with the gate's name as
resourceName (or none, for every gate), lets a person in; the webhook leaves a Warning Event
`BreakGlassExec` on the pod naming the user. It is its own verb, not `bypass`: removing a readiness
taint is not a root shell, and who holds one need not hold the other. It must be granted **by name**:
a wildcard (`verbs: ["*"]`, cluster-admin, `system:masters`) does not carry it, which the webhook
tells by a second question, about a verb no role names (`WILDCARD_PROBE_VERB`): whoever is allowed
that holds a wildcard, and is refused. A cluster admin who must break the glass binds the verb to an
identity of their own (or impersonates one that holds it), which leaves the grant in RBAC as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from gate.admission.rules.facts import Facts
from gate.admission.rules.review import ALLOW, AccessCheck, AdmissionRequest, Notice, Verdict, Violation
from gate.api import keys

CONNECT_SUBRESOURCES: Final = ("exec", "attach", "portforward")
EXEC_STAGE_PODS_VERB: Final = "exec-stage-pods"
WILDCARD_PROBE_VERB: Final = "nodegate-wildcard-probe"
"""A verb no role names: a user allowed it holds a wildcard verb (or is in system:masters)."""
BREAK_GLASS_REASON: Final = "BreakGlassExec"
POD_NAME_PREFIX: Final = "ng-"
"""Every stage and prepull pod's name starts so (`gate.lifecycle.node.pod_name`,
`gate.lifecycle.prepull.prepull_pod_name`): the webhook configuration sends only CONNECTs into pods
so named to the webhook, so an outage never stops an exec into the operator's own pods."""
_POD_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SUBRESOURCE_WORDS: Final = {"exec": "exec", "attach": "attach", "portforward": "port-forward"}


def is_pod_connect(req: AdmissionRequest) -> bool:
    return (req.operation == "CONNECT" and req.resource.group == "" and req.resource.resource == "pods"
            and req.sub_resource in CONNECT_SUBRESOURCES)


def pod_to_read(req: AdmissionRequest) -> tuple[str, str] | None:
    """(namespace, name) of the pod to read, None for a name no pod can have: the API server only
    sends real ones, and a review sent straight to the webhook's port must not steer its reads."""
    if len(req.name) > 253 or not _POD_NAME.match(req.name) or not _POD_NAME.match(req.namespace):
        return None
    return req.namespace, req.name


def _meta(pod: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    return meta, labels if isinstance(labels, dict) else {}


def _has_host_access(spec: Mapping[str, Any]) -> bool:
    if any(spec.get(k) is True for k in ("hostPID", "hostIPC", "hostNetwork")):
        return True
    volumes = spec.get("volumes")
    if isinstance(volumes, list) and any(isinstance(v, dict) and v.get("hostPath") is not None for v in volumes):
        return True
    for group in ("containers", "initContainers", "ephemeralContainers"):
        containers = spec.get(group)
        for c in containers if isinstance(containers, list) else []:
            context = c.get("securityContext") if isinstance(c, dict) else None
            if isinstance(context, dict) and context.get("privileged") is True:
                return True
    return False


def host_access_pod(pod: Mapping[str, Any]) -> str | None:
    """Why `pod` is one of NodeGate's host-access pods (a phrase for a message), or None."""
    _, labels = _meta(pod)
    if labels.get(keys.MANAGED_BY_LABEL) == keys.MANAGER and keys.STAGE_KIND_LABEL in labels:
        kind = labels[keys.STAGE_KIND_LABEL]
        return "a NodeGate prepull pod" if kind == keys.PREPULL_KIND else f"a NodeGate stage pod ({kind})"
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    if _has_host_access(spec):
        return "a pod with host access in NodeGate's namespace (only stage pods may have it there)"
    return None


def validate_connect(req: AdmissionRequest, facts: Facts) -> Verdict:
    """Refuse an exec, attach or port-forward into one of NodeGate's host-access pods, unless the
    user holds `exec-stage-pods` by name (then allowed, with a Notice for the Event)."""
    pod = facts.pod
    if not is_pod_connect(req) or pod is None or req.namespace != facts.operator_namespace:
        return ALLOW
    what = host_access_pod(pod)
    if what is None:
        return ALLOW
    _, labels = _meta(pod)
    gate = labels.get(keys.STAGE_GATE_LABEL)
    gate = gate if isinstance(gate, str) else ""
    who = req.user_info.username or "(anonymous)"
    action = _SUBRESOURCE_WORDS.get(req.sub_resource, req.sub_resource)
    target = f"pod {req.namespace}/{req.name}"
    scope = f'resourceName "{gate}" or none' if gate else "no resourceName"
    refused = (f"{action} into {target} is refused: it is {what}, and NodeGate's stage pods run privileged with "
               "the host's root mounted (a shell there is root on the node); NodeGate refuses this to every identity, "
               "cluster admins included")
    named = AccessCheck(
        user=req.user_info, verb=EXEC_STAGE_PODS_VERB, group=keys.GROUP, resource=keys.NODEGATE_PLURAL, name=gate,
        denied=Violation("", f'{refused}. Break glass: verb "{EXEC_STAGE_PODS_VERB}" on '
                             f'{keys.NODEGATE_PLURAL}.{keys.GROUP} ({scope}), which user "{who}" does not hold '
                             "(docs/operations.md)", forbidden=True))
    wildcard = AccessCheck(
        user=req.user_info, verb=WILDCARD_PROBE_VERB, group=keys.GROUP, resource=keys.NODEGATE_PLURAL, name=gate,
        expect=False,
        denied=Violation("", f'{refused}. User "{who}" holds every verb on {keys.NODEGATE_PLURAL}.{keys.GROUP} '
                             f'by a wildcard (cluster-admin, system:masters); the break-glass verb '
                             f'"{EXEC_STAGE_PODS_VERB}" counts only when granted by name (docs/operations.md)',
                         forbidden=True))
    node = _node_of(pod) or labels.get(keys.STAGE_NODE_LABEL) or "(none)"
    note = (f'User "{who}" was allowed {action} into {what} {target}' + (f' of NodeGate "{gate}"' if gate else "")
            + f' on node {node}, by the break-glass verb "{EXEC_STAGE_PODS_VERB}"')
    notice = Notice(namespace=req.namespace, kind="Pod", name=req.name, reason=BREAK_GLASS_REASON, note=note)
    return Verdict(access=(named, wildcard), notices=(notice,))


def _node_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, dict) else None
    return node if isinstance(node, str) else ""
