"""Every name NodeGate writes onto other objects, in one place.

Node-side keys all live under `nodegate.io/`. A gate's per-node keys embed the gate's name, a DNS
subdomain of at most `GATE_NAME_MAX` (57) characters, so that `nodegate.io/state.<gate>` (and
`reset.`, `rerun.`) fits the 63 characters of a key's name part. The status label's prefix is longer
(`status.`), so the label key uses the name when it fits and a stable hash otherwise.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

GROUP: Final = "nodegate.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
NODEGATE_PLURAL: Final = "nodegates"
POLICY_PLURAL: Final = "deploymentpolicies"
PACKAGES_RESOURCE: Final = "packages"  # virtual resource for RBAC-scoped package use
USE_VERB: Final = "use"
BYPASS_VERB: Final = "bypass"

READINESS_TAINT_KEY: Final = f"{GROUP}/runtime-required"
READINESS_TAINT_EFFECT: Final = "NoSchedule"
CORDONED_BY: Final = f"{GROUP}/cordoned-by"
# A node left cordoned for the validator that comes next (spec.leaveCordoned): `held-by` names the gate
# that asked; once someone uncordons it, `hand-off-released` (when) says it is never held again.
HELD_BY: Final = f"{GROUP}/held-by"
HAND_OFF_RELEASED: Final = f"{GROUP}/hand-off-released"
# The Node condition a held node carries while it waits for its validator (status True).
HAND_OFF_CONDITION: Final = f"{GROUP}/held-for-hand-off"
IGNORE_LABEL: Final = f"{GROUP}/ignore"
FINALIZER: Final = f"{GROUP}/cleanup"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGER: Final = "nodegate"

# Labels on the stage pods and ConfigMaps the operator creates.
STAGE_GATE_LABEL: Final = f"{GROUP}/gate"
STAGE_NODE_LABEL: Final = f"{GROUP}/node"
STAGE_PACKAGE_LABEL: Final = f"{GROUP}/package"  # on a package's ConfigMap
# The kind of a stage pod: stages | interrupt | post-interrupt | removal; `prepull` on a prepull pod.
STAGE_KIND_LABEL: Final = f"{GROUP}/stage"
PREPULL_KIND: Final = "prepull"
# On a stage pod, one label per package it runs steps of: `package.nodegate.io/<package>: apply.config`.
POD_PACKAGE_PREFIX: Final = f"package.{GROUP}/"
# On the stage pods that hold an interrupt step: service | restartAllServices | reboot (a drain has none).
INTERRUPT_LABEL: Final = f"{GROUP}/interrupt"
# On the stage pods whose steps are their containers, started together and run in turn ("true").
IN_TURN_LABEL: Final = f"{GROUP}/in-turn"

NodeStatus = Literal["waiting", "in-progress", "complete", "failed", "blocked"]
NODE_STATUSES: Final[tuple[NodeStatus, ...]] = ("waiting", "in-progress", "complete", "failed", "blocked")

_LABEL_NAME_MAX = 63
# The annotations that carry a gate's name in their key (`state.`, `reset.`, `rerun.`) have the same
# 63-character limit on the part after `nodegate.io/`. They keep the name readable, as docs/api.md
# documents them, and a person (or a ValidatingAdmissionPolicy) reads the gate's name straight from
# the key, so the name is bounded instead: admission refuses a longer one at create, naming this.
_ANNOTATION_PREFIXES: Final = ("state.", "reset.", "rerun.")
GATE_NAME_MAX: Final = _LABEL_NAME_MAX - max(len(p) for p in _ANNOTATION_PREFIXES)


def _label_safe(prefix: str, gate: str) -> str:
    name = f"{prefix}.{gate}"
    if len(name) <= _LABEL_NAME_MAX:
        return name
    digest = hashlib.sha256(gate.encode()).hexdigest()[:10]
    keep = _LABEL_NAME_MAX - len(prefix) - 1 - len(digest) - 1
    return f"{prefix}.{gate[:keep].rstrip('.-')}-{digest}"


def state_annotation(gate: str) -> str:
    """Annotation holding the node's progress for `gate`: the operator's durable memory."""
    return f"{GROUP}/state.{gate}"


def status_label(gate: str) -> str:
    """Label with the node's status for `gate` (waiting | in-progress | complete | failed | blocked)."""
    return f"{GROUP}/{_label_safe('status', gate)}"


CONDITION_PREFIX: Final = f"{GROUP}/"


def failed_condition(gate: str) -> str:
    """Type of the Node condition a node carries while `gate` failed on it (status True, the failure's
    reason and message): `kubectl describe node` and tools that watch node conditions see why. A
    qualified name, as metav1.Condition types are (any gate name fits their 316 characters)."""
    return f"{GROUP}/failed.{gate}"


def blocked_condition(gate: str) -> str:
    """Type of the Node condition a node carries while `gate` cannot go on there for something outside
    it: reason ProtectedPods (pods matching podNonInterruptLabels still run, named in the message) or
    DrainBlocked (a PodDisruptionBudget refuses an eviction: the pod and the budget are named). Its
    lastTransitionTime says since when the node waits."""
    return f"{GROUP}/blocked.{gate}"


def gate_of_state_annotation(key: str) -> str | None:
    prefix = f"{GROUP}/state."
    return key[len(prefix) :] if key.startswith(prefix) else None


# Requests a person (or `nodegate`) leaves for the operator, which acts on them and removes them.
# The operator owns node state and gate status; requests keep it the only writer of both.
RESUME_ANNOTATION: Final = f"{GROUP}/resume"
"""On a NodeGate: clear stopped compartments. Value: compartment names, comma-separated, or "*"."""
RESTART_ANNOTATION: Final = f"{GROUP}/restart"
"""On a NodeGate: start its rollout afresh, as a spec change does: stopped compartments resume and
batches start small again (`nodegate reset GATE`). Value: when it was asked (informational)."""


def reset_annotation(gate: str) -> str:
    """On a Node: rerun `gate` on this node from scratch (forget what it installed)."""
    return f"{GROUP}/reset.{gate}"


def rerun_annotation(gate: str) -> str:
    """On a Node: rerun one package's stage of `gate` on this node. Value: "package/stage"."""
    return f"{GROUP}/rerun.{gate}"


DISABLED_ANNOTATION: Final = f"{GROUP}/disabled"
"""On a NodeGate: "true" makes the gate stay but do nothing (`nodegate disable`): it starts no round, taints
no joining node, holds no node back with the readiness taint, and no other gate waits for it."""

OPERATOR_VERSION_ANNOTATION: Final = f"{GROUP}/version"
"""On the operator's leader election Lease: the version of the operator that holds it (`nodegate version`)."""
