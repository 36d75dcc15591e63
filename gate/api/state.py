"""A node's progress for one gate: the `nodegate.io/state.<gate>` annotation, the operator's memory.

Everything the operator must remember across a crash lives here (or is derivable from objects whose
names are deterministic, such as the stage pods). The annotation is JSON; a hand-edited value that no
longer parses is reported as a failed node with the reason, never a crash, and never overwrites
other gates' annotations.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError

from gate.api.common import Model
from gate.api.keys import NodeStatus
from gate.api.nodegate import Interrupt, InterruptType, NodeGate, Package

StateVersion = Literal[1]
Stage = Literal["uninstall", "upgrade", "apply", "config", "interrupt", "post-interrupt", "post-uninstall"]
PACKAGE_STAGES: tuple[Stage, ...] = ("uninstall", "upgrade", "apply", "config")

# The phases of one round on a node, in order. A round starts when the planner picks the node and
# ends when everything the spec asks for is on the node (complete) or something failed for good.
# `soak` follows `finish` only under a DeploymentPolicy with `health`: the round's work is done and the
# node serves again, but it is complete only once it stayed healthy until `soakUntil`.
Phase = Literal["idle", "cordon", "wait-pods", "drain", "stages", "interrupt", "post-interrupt", "finish", "soak"]
PHASES: tuple[Phase, ...] = ("idle", "cordon", "wait-pods", "drain", "stages", "interrupt", "post-interrupt", "finish",
                             "soak")


class Installed(Model):
    """What a package left on the node when its last stage succeeded. Frozen: parsed states share
    equal records (`load_state`), so a change is always a new record."""

    model_config = ConfigDict(frozen=True)

    version: str = Field(description="Installed version.")
    spec_hash: str = Field(default="", description="Hash of the fields whose change re-runs apply.")
    config: dict[str, str] = Field(default_factory=dict, description="Hash per config key last applied.")


class Failure(Model):
    package: str | None = Field(default=None, description="Package whose stage failed; none for node steps.")
    stage: str = Field(description="Stage or node step that failed (drain, wait-pods, interrupt, ...).")
    reason: str = Field(description="CamelCase reason, e.g. StageFailed, DrainTimeout, ImagePullFailed.")
    message: str = Field(default="", description="What went wrong, for a person.")
    generation: int = Field(default=0, description="Gate generation the failure happened under.")
    rollout_hash: str = Field(default="", description="Hash of the gate's rollout spec (all of spec but paused) "
                              "the failure happened under: only a change of it gives the node another round.")


class Rollback(Model):
    """A round that takes the node back to the gate's previous revision (DeploymentPolicy `rollback: true`)."""

    to: str = Field(default="", description="Rollout hash of the revision the node goes back to (empty: none, the "
                    "gate's first spec: the packages new in the failed rollout are uninstalled).")
    revision: int = Field(default=0, description="That revision's number (0: none).")
    rollout_hash: str = Field(description="Hash of the rollout spec whose failed batch is rolled back.")
    batch: int = Field(description="The failed batch.")
    done: bool = Field(default=False, description="The node is back on the revision (`installed` says what it has).")


class PodRecord(Model):
    """A stage pod the operator created on the node: what makes it the operator's (`gate.lifecycle.ownership`).
    Frozen, like `Installed`."""

    model_config = ConfigDict(frozen=True)

    uid: str = Field(description="The pod's metadata.uid, as the API server returned it to the create.")
    shape: str = Field(description="Digest of what the operator built (images, commands, arguments, environment, "
                       "mounts, volumes, host namespaces, its nodegate.io labels and annotations) as the API server "
                       "stored it (`gate.controller.podshape`).")


class NodeGateState(Model):
    v: StateVersion = Field(default=1, description="Version of this record's format.")
    status: NodeStatus = Field(default="waiting", description="waiting, in-progress, complete, failed or blocked.")
    generation: int = Field(default=0, description="Gate generation of the current (or last) round.")
    rollout_hash: str = Field(default="", description="Hash of the gate's rollout spec (all of spec but paused) "
                              "the node last completed, or its current round started under.")
    round: int = Field(default=0, description="Bumped by each new round (a pick, a reset, a rerun), so stage pods "
                       "get new names.")
    batch: int = Field(default=0, description="Rollout batch the node was picked into (0: not picked).")
    compartment: str | None = Field(default=None, description="Compartment the node was picked in.")
    phase: Phase = Field(default="idle", description="Step of the current round: " + ", ".join(PHASES) + ".")
    phase_since: str | None = Field(default=None, description="When the current phase began (RFC 3339).")
    boot_id: str | None = Field(default=None, description="The node's bootID when last seen by the operator.")
    cordoned: bool = Field(default=False, description="NodeGate cordoned the node in this round.")
    own_reboot: str | None = Field(default=None, description="The boot ID of a reboot the node made on its own "
                                   "after its staged steps, counted as this round's interrupt (no cordon).")
    interrupt: Interrupt | None = Field(default=None, description="Merged interrupt this round needs.")
    interrupted: list[str] = Field(default_factory=list, description="Packages that asked for the interrupt.")
    installed: dict[str, Installed] = Field(default_factory=dict, description="What each package left on the node.")
    post_checked: list[str] = Field(default_factory=list, description="Packages whose check after the interrupt "
                                    "passed (post-interrupt; post-uninstall for one this round uninstalled).")
    drain_blocked_by: str | None = Field(default=None, description="The PodDisruptionBudget refusing an eviction.")
    pull_failing: str | None = Field(default=None, description="While a stage pod's image cannot be pulled (before "
                                     "the pull grace fails the node): the kubelet's reason and message, which name "
                                     "the image.")
    soak_until: str | None = Field(default=None, description="In phase soak: when the soak ends (RFC 3339); the node "
                                   "is complete then if it stayed Ready and healthy.")
    health_unreadable: str | None = Field(default=None, description="In phase soak, while a health signal cannot "
                                          "be read: which, and why (a signal that cannot be read never counts as "
                                          "healthy).")
    payload_placed: list[str] = Field(default_factory=list, description="The round's package stages (package/stage) "
                                      "whose payload its staging pod left on the host, for the round's spec of "
                                      "them: their first try in the window reads it there, with no copy of its own.")
    attempts: dict[str, int] = Field(default_factory=dict, description="package/stage -> failed attempts of that "
                                     "step in this round (its retries are the package's `retries`).")
    retry_at: str | None = Field(default=None, description="After a failed attempt: when the next may start "
                                 "(RFC 3339).")
    failure: Failure | None = Field(default=None, description="Why the node failed, when it did.")
    rollback: Rollback | None = Field(default=None, description="This node's roll-back of a failed batch: in "
                                      "progress, or done (cleared by its next forward round).")
    reruns: dict[str, str] = Field(default_factory=dict, description="package -> stage a person asked to rerun.")
    removing: bool = Field(default=False, description="Picked into a batch of the removal of its deleted gate "
                           "(batch and compartment are the removal's).")
    passed: bool = Field(default=False, description="The node completed this gate once: later rounds (an upgrade, "
                         "a config change, a reset) never put the readiness taint back.")
    pods: dict[str, PodRecord] = Field(default_factory=dict, description="The stage pods the operator created for "
                                       "this gate on the node, by name: only these are read as stage results.")
    sig: str = Field(default="", description="The operator's signature of this record: `<key id>:<HMAC-SHA256, hex>` "
                     "over the record without it, bound to the gate's and the node's names and uids "
                     "(`gate.api.records`). A record without a valid one is not the operator's and is never acted on.")

    def dump(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, exclude_defaults=True, mode="json"),
                          separators=(",", ":"), sort_keys=True)


class StateParseError(ValueError):
    """The annotation holds something that is not a valid state (hand-edited, truncated)."""


def load_state(raw: str | None) -> NodeGateState:
    if not raw:
        return NodeGateState()
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise StateParseError("the state annotation is not a JSON object")
        state = NodeGateState.model_validate(data)
    except RecursionError as exc:  # hand-nested thousands of levels deep: json.loads gives up
        raise StateParseError("the state annotation does not parse: nested too deep") from exc
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0][:200]
        raise StateParseError(f"the state annotation does not parse: {first}") from exc
    if state.installed:
        state.installed = {package: _shared(record) for package, record in state.installed.items()}
    return state


def _shared(record: Installed) -> Installed:
    """The one record for its contents: across a fleet most nodes hold the same few (one per package
    version and config), and the operator keeps every node's parsed states."""
    return _installed(record.version, record.spec_hash, tuple(sorted(record.config.items())))


@functools.lru_cache(maxsize=4096)  # a fleet holds far fewer; an old one is forgotten, never wrong
def _installed(version: str, spec_hash: str, config: tuple[tuple[str, str], ...]) -> Installed:
    return Installed(version=version, spec_hash=spec_hash, config=dict(config))


def _digest(payload: object) -> str:
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def spec_hash(package: Package) -> str:
    """Hash of what re-runs apply when it changes: image, env, resources (not version, not config)."""
    return package.memo("spec_hash", lambda: _digest({
        "image": package.image,
        "env": [e.to_wire() for e in package.env],
        "resources": package.resources.to_wire() if package.resources else None,
        "pullSecrets": [s.name for s in package.image_pull_secrets],
    }))


# Fields of a NodeGate's spec that neither say what the nodes must end up with nor how the rollout goes.
# Pausing bumps metadata.generation like any spec write, so the generation cannot tell a pause from a
# new version: this hash can, and it alone decides that a new rollout starts.
NOT_ROLLOUT_FIELDS = frozenset({"paused"})


def rollout_hash(gate: NodeGate) -> str:
    """Hash of the rollout spec: every field of `spec` but `paused` (`NOT_ROLLOUT_FIELDS`).

    A change of it is a new rollout: failed nodes get another round, stopped compartments resume and
    batches start small again. Defaults are filled in before hashing, so spelling a default out (or
    the mutating webhook doing it) is no change."""
    spec = gate.spec
    return spec.memo("rollout_hash", lambda: _digest(
        spec.model_dump(by_alias=True, mode="json", exclude=set(NOT_ROLLOUT_FIELDS))))


def config_hashes(package: Package) -> dict[str, str]:
    return dict(package.memo("config_hashes", lambda: {
        key: hashlib.sha256(value.encode()).hexdigest()[:16] for key, value in package.config.items()}))


def config_hash(package: Package) -> str:
    return _digest(config_hashes(package))


INTERRUPT_RANK: dict[InterruptType, int] = {"none": 0, "drain": 1, "service": 2, "restartAllServices": 3, "reboot": 4}


def failure_message(message: str) -> str:
    """A failure message for a person: the agent's JSON summary (a stage pod's termination message)
    becomes "step X exited N: <its message>"; anything else is returned as it is."""
    text = message.strip()
    if not text.startswith("{"):
        return text
    try:
        summary = json.loads(text)
    except ValueError:
        return text
    if not isinstance(summary, dict):
        return text
    parts = []
    step, code = summary.get("failedStep"), summary.get("exitCode")
    if step and code is not None:
        parts.append(f"step {step} exited {code}")
    elif step:
        parts.append(f"step {step} failed")
    elif code is not None:
        parts.append(f"exited {code}")
    detail = str(summary.get("message") or "").strip()
    if detail:
        parts.append(detail.splitlines()[-1] if len(detail) > 300 else detail)
    return ": ".join(parts) or text
