"""The NodeGate kind: which nodes, which packages, how to disrupt them safely."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, JsonValue, PrivateAttr

from gate.api import keys
from gate.api.common import Budget, Condition, Duration, LabelSelector, Model, ObjectMeta

T = TypeVar("T")
PACKAGE_NAME_PATTERN = r"^[a-z][-a-z0-9]{0,41}[a-z]$"
MAX_PACKAGES = 64

# systemd's unit name characters (letters, digits, `-_.:@` and the `\` of its escapes, at most 255),
# starting with a letter, digit or `_`: a name starting with `-` would reach `systemctl` as a flag,
# and a glob (`*`) would restart whatever it matches (that is restartAllServices' job).
SERVICE_NAME_PATTERN = r"^[A-Za-z0-9_][-A-Za-z0-9_.:@\\]{0,254}$"
SERVICE_NAME_RULE = "a systemd unit name: letters, digits and -_.:@\\, starting with a letter, digit or _, " \
    "at most 255 characters"

# The longest each duration may be. Longer is no rollout anyone means: a stage or a drain that takes
# more than this is stuck, and a protected pod that may run longer than 30 days is waited for by
# leaving waitTimeout unset. Admission refuses more, naming the field (gate.admission.rules.nodegate);
# the models accept more, so that a gate stored before these maximums existed is still read.
STAGE_TIMEOUT_MAX = "24h"
GRACEFUL_SHUTDOWN_MAX = "1h"
WAIT_TIMEOUT_MAX = "720h"
DRAIN_TIMEOUT_MAX = "168h"

# ConfigMap keys (k8s.io/apimachinery IsConfigMapKey): the package's config becomes a ConfigMap whose
# keys are these, and its values together at most 1 MiB (core validation's MaxSecretSize, in bytes).
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
CONFIG_KEY_MAX = 253
CONFIG_SIZE_MAX = 1024 * 1024
CONFIG_KEY_RULE = "letters, digits, '-', '_' or '.', at most 253 characters, not '.' or '..' nor starting with '..'"

# From the weakest to the strongest: each one disrupts the node at least as much as the one before
# (every interrupt but none cordons and drains the node), so merging keeps the strongest.
InterruptType = Literal["none", "drain", "service", "restartAllServices", "reboot"]

INTERRUPT_RULES: list[JsonValue] = [
    {
        "rule": "!has(self.type) || self.type != 'service' || (has(self.services) && size(self.services) > 0)",
        "message": "an interrupt of type service needs at least one entry in services",
    },
    {
        # A drain restarts nothing: units listed with it would silently stay as they are.
        "rule": "!has(self.type) || self.type != 'drain' || !has(self.services) || size(self.services) == 0",
        "message": "an interrupt of type drain restarts nothing: drop services, or use type service",
    },
]


class Interrupt(Model):
    """What must happen to the node for a change to take effect."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": INTERRUPT_RULES})

    type: InterruptType = Field(
        default="none",
        description=(
            "none: nothing; drain: cordon, wait for protected pods and drain the node, restart nothing; "
            "service: drain, then restart the listed systemd services; restartAllServices: drain, then restart "
            "every service; reboot: drain, then reboot the node."
        ),
    )
    # A schema pattern, not a CEL rule with a friendlier message: a rule per interrupt (64 packages,
    # each with 64 configInterrupts of 64 services) is past the API server's cost budget for a CRD.
    services: list[Annotated[str, Field(max_length=255, pattern=SERVICE_NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=64,
        description="systemd units to restart; required when type is service. Each is " + SERVICE_NAME_RULE + ".",
    )


class EnvVar(Model):
    """A corev1.EnvVar passed to the package's stages."""

    name: str = Field(max_length=256, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A corev1.EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


Quantity = Annotated[
    int | str,
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]


class Resources(Model):
    """corev1.ResourceRequirements of the package's stage containers."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32, description="Minimum resources, e.g. {cpu: 100m, memory: 64Mi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32, description="Maximum resources; each at least its request."
    )


UNINSTALL_RULES: list[JsonValue] = [
    {
        "rule": "!(has(self.apply) && self.apply) || (has(self.enabled) && self.enabled)",
        "message": "apply needs enabled: true",
    }
]


class Uninstall(Model):
    """Whether and when the package's uninstall stage runs."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": UNINSTALL_RULES})

    enabled: bool = Field(
        default=False,
        description="The package can be uninstalled: removing it from the gate or deleting the gate runs uninstall.",
    )
    apply: bool = Field(
        default=False,
        description="Uninstall now: run the uninstall stage on every node (needs enabled).",
    )
    interrupt: Interrupt | None = Field(
        default=None,
        description=(
            "Interrupt after the uninstall: the node is cordoned, protected pods waited for and the node drained "
            "first, and after the interrupt the package's post-uninstall-check runs (its uninstall-check when it "
            "has none) before the node is uncordoned. Unset: the package's own interrupt; {type: none} for none."
        ),
    )


class LocalObjectReference(Model):
    name: str = Field(max_length=253, description="Name of a Secret in the operator's namespace.")


class Memoized(Model):
    """A model whose derived values (hashes) are computed once: specs are never changed in place (nor
    copied with `model_copy(update=...)`, which would carry the memo over)."""

    _memo: dict[str, Any] = PrivateAttr(default_factory=dict)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        # Straight to pydantic's private storage: the attribute route costs more than the hashes saved.
        memo: dict[str, Any] = self.__pydantic_private__["_memo"]  # type: ignore[index]
        if key not in memo:
            memo[key] = compute()
        value: T = memo[key]
        return value


_BAD_CONFIG_KEYS = ("self.config.filter(k, !k.matches('" + CONFIG_KEY_PATTERN + "') || k.size() > "
                    + str(CONFIG_KEY_MAX) + " || k.startsWith('..') || k == '.')")

PACKAGE_RULES: list[JsonValue] = [
    {
        # The ConfigMap the config becomes would be refused only after the node was cordoned and drained.
        "rule": "!has(self.config) || " + _BAD_CONFIG_KEYS + ".size() == 0",
        "message": "config keys must be ConfigMap keys: " + CONFIG_KEY_RULE,
        "messageExpression": ("'config key \"' + " + _BAD_CONFIG_KEYS + "[0] + '\" is no ConfigMap key: "
                              + CONFIG_KEY_RULE.replace("'", "\\'") + "'"),
        "fieldPath": ".config",
    },
]


class Package(Memoized):
    """One host-layer package: an image carrying stages and checks, at a version."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": PACKAGE_RULES})

    version: str = Field(
        max_length=128,
        description="Semantic version of the package; the image tag unless the image is pinned by digest.",
    )
    image: str = Field(
        max_length=512,
        description=(
            "Image without a tag (the tag is the version) or with an @sha256 digest, "
            "e.g. ghcr.io/example/nvidia-tuned."
        ),
    )
    interrupt: Interrupt | None = Field(
        default=None, description="Interrupt after apply or upgrade; none when unset."
    )
    config: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Files made available to the stages (a ConfigMap). A change re-runs the config stage. Keys are "
        "ConfigMap keys (" + CONFIG_KEY_RULE + "); the values together at most 1 MiB.",
    )
    config_interrupts: dict[str, Interrupt] = Field(
        default_factory=dict,
        max_length=64,
        description="Interrupts run after a config change, keyed by config key or glob (e.g. '*.conf').",
    )
    depends_on: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_PACKAGES,
        description=(
            "Packages of the same gate that must be complete first, with a version constraint (e.g. '>=1.2.0')."
        ),
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=128, description="Environment of the stages.")
    resources: Resources | None = Field(default=None, description="Resources of the stage containers.")
    timeout: Duration = Field(
        default="30m",
        description=f"How long one stage may run; exceeding it fails the stage. At most {STAGE_TIMEOUT_MAX}.",
    )
    graceful_shutdown: Duration | None = Field(
        default=None,
        description=(
            "How long a running step has to clean up when its stage pod is stopped (past the steps' "
            "deadline, say): the agent passes SIGTERM on to the step, and what still runs after this long is "
            "killed. The "
            f"stage pods' terminationGracePeriodSeconds; Kubernetes' 30s when unset. At most {GRACEFUL_SHUTDOWN_MAX}."
        ),
    )
    retries: int = Field(default=2, ge=0, le=20, description="How often a failed stage is retried, with backoff.")
    uninstall: Uninstall = Field(default_factory=Uninstall, description="Uninstall behaviour.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the image."
    )

    def interrupt_or_none(self) -> Interrupt:
        return self.interrupt or Interrupt()

    def uninstall_interrupt(self) -> Interrupt:
        """What an uninstall of the package needs: `uninstall.interrupt`, else the package's own."""
        return self.uninstall.interrupt or self.interrupt_or_none()


class Drain(Model):
    """How a node is drained before an interrupt."""

    timeout: Duration = Field(
        default="15m",
        description="How long to keep retrying evictions refused by a PodDisruptionBudget; then the node fails. "
        f"At most {DRAIN_TIMEOUT_MAX}.",
    )
    grace_period_seconds: int | None = Field(
        default=None, ge=0, description="Override of the pods' termination grace period; theirs when unset."
    )
    delete_empty_dir_data: bool = Field(
        default=False, description="Evict pods that use emptyDir volumes (their data is lost)."
    )


class Toleration(Model):
    """A corev1.Toleration."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty matches all."
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long to stay.")


PACKAGE_NAME_RULE = "(lowercase letters, digits and '-', 2 to 43 characters)"
_BAD_PACKAGE_NAMES = "self.packages.filter(k, !k.matches('" + PACKAGE_NAME_PATTERN + "'))"

NODEGATE_SPEC_RULES: list[JsonValue] = [
    {
        "rule": "!(has(self.deploymentPolicy) && has(self.interruptionBudget))",
        "message": "set at most one of deploymentPolicy and interruptionBudget",
    },
    {
        "rule": "!has(self.leaveCordoned) || !self.leaveCordoned || (has(self.readinessTaint) && self.readinessTaint)",
        "message": "leaveCordoned holds a node that joined with the readiness taint, and this gate gives no node "
                   "that taint: set readinessTaint: true too, or drop leaveCordoned",
        "fieldPath": ".leaveCordoned",
    },
    {
        "rule": "!has(self.packages) || self.packages.all(k, k.matches('" + PACKAGE_NAME_PATTERN + "'))",
        "message": "package names must match " + PACKAGE_NAME_PATTERN,
        # The API server runs this rule before the validating webhook, so its message is the refusal a
        # person reads: it names the key, as the webhook's does (the static message is the fallback).
        # One key when several break the pattern: naming them all, or even counting them, costs more
        # than the API server allows a message (map keys have no maximum length).
        "messageExpression": (
            "'package name ' + " + _BAD_PACKAGE_NAMES + "[0] + ' must match " + PACKAGE_NAME_PATTERN + " "
            + PACKAGE_NAME_RULE.replace("'", "\\'") + "'"
        ),
        "fieldPath": ".packages",
    },
]


class NodeGateSpec(Memoized):
    """What to install on which nodes, and how carefully."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": NODEGATE_SPEC_RULES})

    node_selector: LabelSelector = Field(
        default_factory=LabelSelector, description="The nodes this gate manages; empty selects every node."
    )
    readiness_taint: bool = Field(
        default=False,
        description=(
            "New matching nodes join with the taint nodegate.io/runtime-required:NoSchedule, lifted once "
            "every readinessTaint gate selecting the node is complete there."
        ),
    )
    leave_cordoned: bool = Field(
        default=False,
        description=(
            "Hand a joining node over to whatever validates it next: a node that joined with the readiness "
            "taint is cordoned (annotation nodegate.io/held-by names the gate) in the same write that lifts "
            "its taint, once every readinessTaint gate selecting it is complete there. A plain `kubectl "
            "uncordon` releases it for good (annotation nodegate.io/hand-off-released). Needs readinessTaint."
        ),
    )
    priority: int = Field(default=200, ge=1, description="Lower runs first.")
    sequencing: Literal["node", "all"] = Field(
        default="node",
        description=(
            "node: wait for higher-priority gates on this node; all: wait until they are complete everywhere."
        ),
    )
    serial: bool = Field(default=False, description="Run one package at a time on a node. Since the stages "
                         "of a round run as the steps of one stage pod, one after another, every gate runs so; "
                         "the field is kept for manifests that set it.")
    paused: bool = Field(default=False, description="Start no new work; running stages finish.")
    interruption_budget: Budget | None = Field(
        default=None,
        description="Nodes disrupted at once (100% when unset); mutually exclusive with deploymentPolicy.",
    )
    deployment_policy: str | None = Field(
        default=None, max_length=253, description="Name of a DeploymentPolicy governing the rollout."
    )
    pod_non_interrupt_labels: LabelSelector | None = Field(
        default=None, description="Pods that must finish on their own before a node is interrupted."
    )
    wait_timeout: Duration | None = Field(
        default=None,
        description=f"How long a node waits for its protected pods before it fails with WaitTimeout; forever "
        f"when unset. At most {WAIT_TIMEOUT_MAX}.",
    )
    cordon_while_protected: bool = Field(
        default=False,
        description="Cordon a node whose protected pods still run, so that no new job lands there while they "
        "finish; the node counts against the budget while it is so cordoned, and is cordoned only when no node "
        "free of protected pods is left to start. When false (the default) such a node is neither picked nor "
        "cordoned: the rollout takes the next node, and this one in its turn once its pods ended.",
    )
    drain: Drain = Field(default_factory=Drain, description="Drain settings.")
    additional_tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations added to the package pods."
    )
    packages: dict[str, Package] = Field(
        default_factory=dict,
        max_length=MAX_PACKAGES,
        description="Packages by name; a name matches " + PACKAGE_NAME_PATTERN + ".",
    )


class NodeCounts(Model):
    matched: int = Field(default=0, description="Nodes the gate selects (not ignored).")
    complete: int = Field(default=0, description="Nodes where every package is complete.")
    in_progress: int = Field(default=0, description="Nodes with work running.")
    failed: int = Field(default=0, description="Nodes where a stage failed for good.")
    waiting: int = Field(default=0, description="Nodes waiting for their turn.")
    blocked: int = Field(default=0, description="Nodes blocked by a higher-priority gate, a stopped compartment or "
                         "protected pods still running on them.")
    waiting_for_pods: int = Field(default=0, description="Of the blocked nodes, those whose protected pods "
                                  "(podNonInterruptLabels) still run: they start once the pods ended.")
    ignored: int = Field(default=0, description="Nodes the selector matches that carry nodegate.io/ignore=true: the "
                         "gate skips them, and Ready says so (they are not in matched).")


class CompartmentRollback(Model):
    """The roll-back of a compartment's failed batch (DeploymentPolicy `rollback: true`, `gate.lifecycle.rollback`)."""

    batch: int = Field(description="The failed batch whose changed nodes go back.")
    rollout_hash: str = Field(default="", description="Hash of the rollout spec the batch failed under.")
    reason: Literal["Pending", "RolledBack", "NoRevision"] = Field(
        default="Pending", description="Pending while the gate's history is not read yet; RolledBack once the "
        "revision to go back to is known; NoRevision when there is none (pruned or deleted): nothing is rolled back.")
    revision: int = Field(default=0, description="Number of the revision the nodes go back to (0: none, the gate's "
                          "first spec: packages new in it are uninstalled).")
    to: str = Field(default="", description="Rollout hash of that revision (empty: none).")
    nodes: list[str] = Field(default_factory=list, max_length=1000,
                             description="The batch's changed nodes, to roll back.")


class CompartmentStatus(Model):
    name: str = Field(description="Compartment name; __default__ for nodes no selector claims.")
    matched: int = Field(default=0, description="Nodes of the gate in this compartment.")
    ceiling: int = Field(default=0, description="Most nodes disrupted at once (the budget).")
    in_progress: int = Field(default=0, description="Nodes disrupted now.")
    complete: int = Field(default=0, description="Nodes done.")
    failed: int = Field(default=0, description="Nodes failed.")
    soaking: int = Field(default=0, description="Nodes whose round went through and that serve while they prove "
                         "healthy (DeploymentPolicy health.soak): they hold no disruption slot, but their batch is "
                         "judged only once they passed.")
    batch: int = Field(default=0, description="Number of the current batch (1-based; 0 before the first).")
    batch_size: int = Field(default=0, description="Size of the current batch.")
    consecutive_failures: int = Field(default=0, description="Failed batches in a row.")
    state: Literal["waiting", "rolling", "complete", "stopped", "outside-window"] = Field(
        default="waiting", description="waiting, rolling, complete, stopped or outside-window."
    )
    rollback: CompartmentRollback | None = Field(
        default=None, description="While the compartment is stopped by a failed batch under `rollback: true`: that "
        "batch's roll-back.")


class ImageVerification(Model):
    """What the operator's image signature policy decided for a record's digest (`gate.lifecycle.signatures`)."""

    policy: str = Field(max_length=80, description="Fingerprint of the signature policy it was judged under: a "
                        "changed policy judges the digest again.")
    reason: str = Field(max_length=40, description="Verified, NotCovered (no rule covers the repository and the "
                        "policy allows it), or why it failed: NoRule, SignatureMissing, SignatureInvalid, "
                        "UntrustedKey (recorded in warn mode, where it runs anyway).")
    mode: str = Field(default="enforce", max_length=10, description="The policy's mode then: enforce or warn.")
    rule: str | None = Field(default=None, max_length=253, description="The policy rule that judged it.")
    key: str | None = Field(default=None, max_length=253, description="The key whose signature verified it.")
    verified_at: str | None = Field(default=None, description="When the operator judged it (RFC 3339).")


class ImageRecord(Model):
    """A package image resolved to the digest its stage pods pull (`gate.lifecycle.images`)."""

    package: str = Field(max_length=43, description="The package whose image this is.")
    reference: str = Field(
        max_length=1024,
        description="The tagged reference it was resolved from (image:version): it is reused while the package's "
        "image and version stay these, and resolved again when either changes.",
    )
    digest: str = Field(
        max_length=128,
        description="The manifest digest the registry served for the reference (sha256:...); stage pods pull "
        "<repository>@<digest>, so a tag pushed again later cannot change what this rollout runs.",
    )
    resolved_at: str | None = Field(default=None, description="When the operator read the digest (RFC 3339).")
    verified: ImageVerification | None = Field(
        default=None,
        description="With an image signature policy (`--image-signatures`): what it decided for this digest. "
        "Shown, not trusted: a stage pod pulls a digest only when the operator itself judged it under the current "
        "policy (docs/supply-chain.md).",
    )


class NodeGateStatus(Model):
    observed_generation: int | None = Field(default=None, description="The generation last acted on.")
    rollout_hash: str | None = Field(
        default=None,
        description="Hash of the rollout spec (all of spec but paused) last acted on: a change of it starts a new "
        "rollout; a pause or a resume changes the generation, not this.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded and Paused; Reconciling while nodes have work left and Stalled "
        "when the rollout needs a person (kstatus' abnormal-true conditions: present only while True); "
        "Deleting while the gate is being deleted (its reason "
        "Paused: no uninstall starts until the gate is unpaused); Disabled while `nodegate disable` holds it "
        "(annotation nodegate.io/disabled=true); ImagesResolved while the operator resolves package images to "
        "digests (False, reason ResolveFailed: nothing of the gate starts, the message names the image); "
        "ImagesVerified with an image signature policy (False, reason SignatureMissing, SignatureInvalid, "
        "UntrustedKey or NoRule: nothing of the gate starts, the message names the package, image, digest and "
        "rule; True with that reason in warn mode, where the image runs anyway); "
        "DrainBlocked while a PodDisruptionBudget holds a drain (it names the node, the pod and the budget); "
        "ImagePullFailing while the kubelet cannot pull a stage pod's image (it names the node, the image and "
        "the kubelet's message, before the pull grace fails the node).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    status: str | None = Field(
        default=None, description="One word summary for kubectl get: Ready, Progressing, Degraded, Paused, Deleting, "
        "Disabled."
    )
    progress: str | None = Field(default=None, description="Complete of matched nodes, e.g. 12/40.")
    nodes: NodeCounts = Field(default_factory=NodeCounts, description="Node counts by state.")
    waiting_for_pods_since: str | None = Field(
        default=None, description="Since when the node that has waited longest for its protected pods waits "
        "(RFC 3339); unset while none waits.",
    )
    compartments: list[CompartmentStatus] = Field(
        default_factory=list,
        description="Rollout progress per compartment.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    images: list[ImageRecord] = Field(
        default_factory=list,
        max_length=64,
        description="Per package and tagged image, the digest it was resolved to once for the rollout; stage pods "
        "pull by this digest. While a failed batch goes back (DeploymentPolicy rollback), the images of the spec "
        "it goes back to are recorded too. Absent for an image pinned by digest in the spec, and when the "
        "operator runs with --resolve-digests=false.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["package", "reference"]},
    )


NODEGATE_RULES: list[JsonValue] = [
    {
        # Checked at create only (a name never changes): a gate admitted before the limit existed can
        # still be updated and deleted. `optionalOldSelf` makes oldSelf absent at create.
        "rule": f"oldSelf.hasValue() || self.metadata.name.size() <= {keys.GATE_NAME_MAX}",
        "optionalOldSelf": True,
        # Static: any messageExpression at the root (even the name's length) is past the API server's
        # cost budget for a CRD.
        "message": f"metadata.name: a NodeGate name must be at most {keys.GATE_NAME_MAX} characters: the node "
                   f"annotation {keys.GROUP}/state.<name> must fit the 63 characters of a key's name",
    },
]


class NodeGate(Model):
    """A set of host-layer packages rolled out to the nodes a selector picks."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": NODEGATE_RULES})

    api_version: str = Field(default="nodegate.io/v1alpha1", description="nodegate.io/v1alpha1")
    kind: str = Field(default="NodeGate", description="NodeGate")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: NodeGateSpec = Field(default_factory=NodeGateSpec, description="Desired state.")
    status: NodeGateStatus | None = Field(default=None, description="Observed state.")

    @property
    def name(self) -> str:
        return self.metadata.name
