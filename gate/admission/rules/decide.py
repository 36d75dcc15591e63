"""`review -> verdict`: which rules apply to a request, and what they decide.

Two steps, both pure: `plan_lookups` names what the rules need to know about other objects, and
`validate` / `mutate` decide from the request and those `Facts`. Questions for the authorizer come
back inside the verdict (`Verdict.access`); the server asks them and folds the answers in.
"""

from __future__ import annotations

from typing import Any, Literal

from gate.admission.rules import connect, defaults, images, inputs, kubelet_labels, nodegate, policy
from gate.admission.rules.facts import Facts, Lookups
from gate.admission.rules.review import ALLOW, AccessCheck, AdmissionRequest, Verdict, Violation
from gate.api.keys import BYPASS_VERB, GROUP, NODEGATE_PLURAL, PACKAGES_RESOURCE, READINESS_TAINT_KEY, USE_VERB
from gate.lifecycle import taint

Kind = Literal["NodeGate", "DeploymentPolicy", "Node", "PodConnect"]
Webhook = Literal["validate", "mutate"]


class ReviewError(ValueError):
    """A review the rules cannot judge (a kind they do not know, an object missing); the server
    answers it with a 4xx instead of a verdict."""


def kind_of(req: AdmissionRequest) -> Kind:
    if connect.is_pod_connect(req):
        return "PodConnect"  # the kind is PodExecOptions, PodAttachOptions or PodPortForwardOptions
    gvk = req.kind
    if gvk.group == GROUP and gvk.kind in ("NodeGate", "DeploymentPolicy"):
        return gvk.kind  # type: ignore[return-value]
    if gvk.group == "" and gvk.kind == "Node":
        return "Node"
    raise ReviewError(f"NodeGate's webhook does not handle kind {gvk.kind!r} of group {gvk.group!r}; "
                      "check the webhook configuration's rules")


def _new(req: AdmissionRequest) -> dict[str, Any]:
    if req.object is None:
        raise ReviewError(f"request.object is required for {req.operation}")
    return req.object


def _old(req: AdmissionRequest) -> dict[str, Any]:
    if req.old_object is None:
        raise ReviewError(f"request.oldObject is required for {req.operation}")
    return req.old_object


def _name(req: AdmissionRequest, obj: dict[str, Any] | None) -> str:
    meta = obj.get("metadata") if obj else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return req.name or (name if isinstance(name, str) else "")


def _spec_changed(req: AdmissionRequest) -> bool:
    return req.operation != "UPDATE" or nodegate.spec_of(_old(req)) != nodegate.spec_of(_new(req)) \
        or _old(req).get("spec") != _new(req).get("spec")


# -- what to look up -------------------------------------------------------------------------------


def plan_lookups(req: AdmissionRequest, webhook: Webhook) -> Lookups:
    kind = kind_of(req)
    if webhook == "mutate":
        if kind == "Node" and req.operation == "CREATE":
            return Lookups(readiness_gates=True)
        return Lookups()
    if kind == "PodConnect":
        return Lookups(pod=connect.pod_to_read(req))
    if kind == "DeploymentPolicy" and req.operation == "DELETE":
        return Lookups(gates_referencing=_name(req, req.old_object))
    if kind == "DeploymentPolicy" and req.operation in ("CREATE", "UPDATE") and _spec_changed(req):
        return Lookups(gates_referencing=_name(req, req.object))
    if kind != "NodeGate" or req.operation not in ("CREATE", "UPDATE") or not _spec_changed(req):
        return Lookups()
    new_spec = nodegate.spec_of(_new(req)) or {}
    old_spec = nodegate.spec_of(req.old_object) if req.operation == "UPDATE" else None
    policies: frozenset[str] = frozenset()
    ref = new_spec.get("deploymentPolicy")
    if isinstance(ref, str) and ref and (old_spec is None or old_spec.get("deploymentPolicy") != ref):
        policies = frozenset({ref})
    installed = None
    if old_spec is not None:
        removed = nodegate.removed_uninstallable(old_spec, new_spec)
        if removed:
            installed = (_name(req, req.object), removed)
    return Lookups(policies=policies, installed=installed)


# -- validation ------------------------------------------------------------------------------------


def validate(req: AdmissionRequest, facts: Facts, image_policy: images.ImagePolicy = images.ALLOW_ALL) -> Verdict:
    """`image_policy` is the cluster's (the webhook's settings), not a fact about other objects."""
    kind = kind_of(req)
    if kind == "NodeGate":
        return _validate_nodegate(req, facts, image_policy)
    if kind == "DeploymentPolicy":
        return _validate_policy(req, facts)
    if kind == "PodConnect":
        return connect.validate_connect(req, facts)
    return _validate_node(req, facts)


_NEED = "ask an admin for a RoleBinding to a role such as nodegate-package-user"


def _use(req: AdmissionRequest, package: str, field: str, why: str) -> AccessCheck:
    """`use` on `package`, refused with `why` (which says what the write would do with it)."""
    who = req.user_info.username or "(anonymous)"
    return AccessCheck(
        user=req.user_info, verb=USE_VERB, group=GROUP, resource=PACKAGES_RESOURCE, name=package,
        denied=Violation(field, f'user "{who}" may not {why}, which needs verb "{USE_VERB}" on '
                                f"{PACKAGES_RESOURCE}.{GROUP} (resourceName {package}, or any); {_NEED}",
                         forbidden=True))


def _delete_nodegate(req: AdmissionRequest) -> Verdict:
    """Deleting a gate uninstalls its packages wherever it ran, as removing each of them by an
    UPDATE does: it needs `use` on each (a gate without packages, or a cluster admin, passes)."""
    name = _name(req, req.old_object)
    spec = nodegate.spec_of(req.old_object) or {}
    return Verdict(access=tuple(
        _use(req, package, f"spec.packages[{package}]",
             f'delete NodeGate "{name}": that removes package "{package}" from every node it ran on')
        for package in sorted(nodegate.packages_of(spec))))


def _validate_nodegate(req: AdmissionRequest, facts: Facts, image_policy: images.ImagePolicy) -> Verdict:
    if req.operation == "DELETE":
        return _delete_nodegate(req)
    if req.operation not in ("CREATE", "UPDATE") or not _spec_changed(req):
        return ALLOW  # metadata-only updates (finalizers, labels) never wait on spec rules
    new = _new(req)
    old_spec = nodegate.spec_of(_old(req)) if req.operation == "UPDATE" else None
    new_spec = new.get("spec", {})
    ref = new_spec.get("deploymentPolicy") if isinstance(new_spec, dict) else None
    check_policy = old_spec is None or old_spec.get("deploymentPolicy") != ref
    violations = nodegate.validate_spec(new_spec, existing_policies=facts.existing_policies if check_policy else None)
    if req.operation == "CREATE":
        violations = nodegate.name_violations(_name(req, new)) + violations
    if isinstance(new_spec, dict) and old_spec is not None:
        violations += nodegate.update_violations(old_spec, new_spec, dict(facts.installed_on))
    changed = nodegate.changed_packages(old_spec, new_spec if isinstance(new_spec, dict) else {})
    if isinstance(new_spec, dict):
        violations += images.image_violations(nodegate.packages_of(new_spec), changed, image_policy)
        violations += inputs.input_violations(nodegate.packages_of(new_spec), changed, image_policy)
    warnings = tuple(kubelet_labels.readiness_selector_warnings(new_spec))
    if violations:
        return Verdict(violations=tuple(violations), warnings=warnings)
    who = req.user_info.username or "(anonymous)"
    checks = [
        AccessCheck(
            user=req.user_info, verb=USE_VERB, group=GROUP, resource=PACKAGES_RESOURCE, name=name,
            denied=Violation(f"spec.packages[{name}]", f'user "{who}" may not use package "{name}": it needs verb '
                             f'"{USE_VERB}" on {PACKAGES_RESOURCE}.{GROUP} (resourceName {name}, or any); {_NEED}',
                             forbidden=True),
        )
        for name in changed
    ]
    # Widening where root code runs (the selector, tolerations, budget, policy) is using every package
    # of the gate there: a `patch nodegates` right alone must not do it.
    placement = nodegate.placement_changed(old_spec, new_spec) if isinstance(new_spec, dict) else []
    if placement:
        fields = ", ".join(f"spec.{f}" for f in placement)
        checks += [
            AccessCheck(
                user=req.user_info, verb=USE_VERB, group=GROUP, resource=PACKAGES_RESOURCE, name=name,
                denied=Violation(f"spec.{placement[0]}", f'user "{who}" may not change {fields}: that decides where '
                                 f'package "{name}" runs as root, which needs verb "{USE_VERB}" on '
                                 f"{PACKAGES_RESOURCE}.{GROUP} (resourceName {name}, or any); {_NEED}",
                                 forbidden=True),
            )
            for name in sorted(nodegate.packages_of(new_spec)) if name not in changed
        ]
    # A package's pods receive the Secrets and ConfigMaps its env and imagePullSecrets name, from the
    # operator's namespace: whoever names one must be allowed to read it there, or the operator would
    # hand a package what its author may not see.
    packages = nodegate.packages_of(new_spec) if isinstance(new_spec, dict) else {}
    ns = facts.operator_namespace
    for name in changed:
        for where, resource, obj in nodegate.referenced_objects(packages.get(name)):
            kind = "Secret" if resource == "secrets" else "ConfigMap"
            checks.append(AccessCheck(
                user=req.user_info, verb="get", group="", resource=resource, name=obj, namespace=ns,
                denied=Violation(f"spec.packages[{name}].{where}", f'user "{who}" may not get {kind} "{obj}" in '
                                 f'namespace {ns}, where the package\'s pods would receive it; name only {kind}s '
                                 "you may read there", forbidden=True)))
    return Verdict(access=tuple(checks), warnings=warnings)


def _validate_policy(req: AdmissionRequest, facts: Facts) -> Verdict:
    if req.operation == "DELETE":
        # No package right to ask about: a policy that gates name cannot be deleted at all, and one
        # that none names decides nothing.
        return Verdict(violations=tuple(policy.delete_violations(_name(req, req.old_object), facts.referencing_gates)))
    if req.operation not in ("CREATE", "UPDATE") or not _spec_changed(req):
        return ALLOW
    violations = tuple(policy.validate_spec(_new(req).get("spec", {})))
    return Verdict(violations=violations, access=() if violations else _policy_use(req, _name(req, req.object), facts))


def _policy_use(req: AdmissionRequest, name: str, facts: Facts) -> tuple[AccessCheck, ...]:
    """A policy decides the budget, batches and health of every gate naming it: changing it is changing
    them, so it needs `use` on each package of each of those gates (as a gate's own budget does)."""
    gates_of: dict[str, list[str]] = {}
    for gate in facts.referencing_gates:
        for package in facts.referencing_packages.get(gate, ()):
            gates_of.setdefault(package, []).append(gate)
    verb = "create" if req.operation == "CREATE" else "change"
    return tuple(
        _use(req, package, "spec",
             f'{verb} DeploymentPolicy "{name}": NodeGate(s) {", ".join(sorted(gates))} name it '
             f'(spec.deploymentPolicy), so it decides how package "{package}" rolls out there')
        for package, gates in sorted(gates_of.items()))


def _validate_node(req: AdmissionRequest, facts: Facts) -> Verdict:
    if req.operation != "UPDATE":
        return ALLOW
    old, new = _old(req), _new(req)
    if not _removes_readiness_taint(old, new):
        return ALLOW
    who = req.user_info.username or "(anonymous)"
    if who == facts.operator_username:
        return ALLOW
    denied = Violation(
        "spec.taints",
        f"removing the taint {READINESS_TAINT_KEY}:NoSchedule is reserved to the NodeGate operator, which lifts it "
        f"once every readinessTaint gate selecting the node is complete there; user \"{who}\" is not allowed verb "
        f'"{BYPASS_VERB}" on {NODEGATE_PLURAL}.{GROUP}',
        forbidden=True,
    )
    return Verdict(access=(AccessCheck(user=req.user_info, verb=BYPASS_VERB, group=GROUP, resource=NODEGATE_PLURAL,
                                       name="", denied=denied),))


def _removes_readiness_taint(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return taint.has_readiness_taint(taint.node_taints(old)) and not taint.has_readiness_taint(taint.node_taints(new))


# -- mutation --------------------------------------------------------------------------------------


def mutate(req: AdmissionRequest, facts: Facts) -> Verdict:
    """Defaults and the readiness taint. Mutation never refuses: what is wrong, validation says."""
    kind = kind_of(req)
    if req.operation not in ("CREATE", "UPDATE"):
        return ALLOW
    obj = _new(req)
    if kind == "NodeGate":
        return Verdict(patch=defaults.nodegate_defaults(obj))
    if kind == "DeploymentPolicy":
        return Verdict(patch=defaults.policy_defaults(obj))
    if req.operation == "CREATE":
        return Verdict(patch=defaults.node_taint(obj, facts.readiness_gates))
    return ALLOW
