"""Which `nodegate.io/state.<gate>` records are the operator's own: signing and checking them, without I/O.

The node-keys policy (`gate.admission.node_keys`) lets only the operator, or a holder of `bypass`, write
a state annotation. This is the defence behind it, for when the policy is missing (deleted, never
installed with the plain manifests) or a `bypass` identity is abused: the operator signs every record
it writes and acts only on records that carry its signature, so a forged "complete" cannot make it
skip a CVE fix, and a forged round in progress cannot make it run a stage or reboot a node.

Decisions:

* **HMAC-SHA256, not a public-key signature.** Only the operator signs and only the operator checks,
  so a shared secret is enough, and it is small and fast (a plan of 5,000 nodes checks every record).
* **What is signed**: the record's canonical encoding (`NodeGateState.dump` without `sig`: sorted keys,
  defaults left out, so a field the format does not know is not part of it) together with the gate's
  name and uid and the node's name and uid. A record copied to another node, or kept across a gate
  deleted and created again under its name, does not check.
* **Key ring**: several keys, each with an id; the newest signs (the greatest id, ids sort by time),
  any verifies. `sig` is `<key id>:<hex digest>`, so a check tries one key, and rotation is: add a new
  key, restart, let records be rewritten, remove the old one (docs/operations.md).
* **Not defended**: a replay of a record the operator once wrote for the same gate and node (it still
  checks). The policy is the first line against that; the record's `round`, `generation` and
  `rollout_hash` keep an old one from skipping a newer rollout (it reads as out of date).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from gate.api.state import NodeGateState

KEY_BYTES_MIN = 32
KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,63}$")
SIGNATURE_DOMAIN = "nodegate.io/state.v1"  # names what is signed, so the key signs nothing else by accident
POD_SIGNATURE_DOMAIN = "nodegate.io/pod.v1"  # a staging or undo pod's (`sign_pod`)


class KeyRingError(ValueError):
    """The key ring cannot be used as it is; the message names the key and why."""


@dataclass(frozen=True)
class Binding:
    """What a record is about: it checks only on this gate (name and uid) and this node (name and uid)."""

    gate: str
    gate_uid: str
    node: str
    node_uid: str


@dataclass(frozen=True)
class KeyRing:
    """The operator's signing keys, by id. The greatest id signs; every key verifies."""

    keys: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyRingError("the key ring holds no key: the operator cannot sign its records")
        for kid, secret in self.keys.items():
            if not KEY_ID.match(kid):
                raise KeyRingError(f"key id {kid!r} must be 1-63 characters of letters, digits, '.', '_' or '-'")
            if len(secret) < KEY_BYTES_MIN:
                raise KeyRingError(f"key {kid!r} has {len(secret)} bytes; a signing key needs at least "
                                   f"{KEY_BYTES_MIN} random bytes")

    @property
    def signing_id(self) -> str:
        return max(self.keys)


@dataclass(frozen=True)
class Refusal:
    """A record that is not the operator's: why, and which record (a digest of its text), so that it is
    reported once, not at every look."""

    why: str
    record: str


def _message(state: NodeGateState, binding: Binding) -> bytes:
    body = state.model_copy(update={"sig": ""}).dump()
    return json.dumps([SIGNATURE_DOMAIN, binding.gate, binding.gate_uid, binding.node, binding.node_uid, body],
                      separators=(",", ":")).encode()


def keyed_signature(ring: KeyRing, message: bytes) -> str:
    """`<key id>:<hex digest>`: the HMAC-SHA256 of `message` with the ring's newest key. What every signature
    of the operator's is (node records, ControllerRevisions, staging and undo pods); each message names its
    domain, so one kind's signature is never another's."""
    kid = ring.signing_id
    return f"{kid}:{hmac.new(ring.keys[kid], message, hashlib.sha256).hexdigest()}"


def signature_fault(ring: KeyRing, sig: str, message: bytes) -> Literal["unsigned", "unknown-key", "mismatch"] | None:
    """What is wrong with `sig` as a `keyed_signature` of `message` (no signature, not `<id>:...` of a key the
    ring holds, or not its digest), None when nothing is: each kind of signature words its own refusal."""
    if not sig:
        return "unsigned"
    kid, sep, digest = sig.partition(":")
    secret = ring.keys.get(kid)
    if not sep or secret is None:
        return "unknown-key"
    if not hmac.compare_digest(digest, hmac.new(secret, message, hashlib.sha256).hexdigest()):
        return "mismatch"
    return None


def sign(state: NodeGateState, ring: KeyRing, binding: Binding) -> NodeGateState:
    """The record as the operator writes it: signed with the newest key for this gate and node."""
    return state.model_copy(update={"sig": keyed_signature(ring, _message(state, binding))})


def refusal(state: NodeGateState, ring: KeyRing, binding: Binding) -> str | None:
    """Why the record is not the operator's (a message naming what is wrong), or None when it is."""
    kid, sep, digest = state.sig.partition(":")
    if state.sig and (not sep or not digest):
        return "its signature is not <key id>:<digest>"
    fault = signature_fault(ring, state.sig, _message(state, binding))
    if fault == "unsigned":
        return "it carries no signature"
    if fault == "unknown-key":
        return f"it is signed with key {kid!r}, which the operator does not hold"
    if fault == "mismatch":
        return (f"its signature does not match it for gate {binding.gate} (uid {binding.gate_uid}) on node "
                f"{binding.node} (uid {binding.node_uid}): it was changed, copied from another node, or "
                "written for an earlier gate of that name")
    return None


def _pod_message(namespace: str, name: str, shape: str) -> bytes:
    return json.dumps([POD_SIGNATURE_DOMAIN, namespace, name, shape], separators=(",", ":")).encode()


def sign_pod(ring: KeyRing, namespace: str, name: str, shape: str) -> str:
    """The signature of a pod the operator creates without recording it in a node's state (a staging or undo
    pod, `gate.controller.staging`): over its namespace, name and the digest of what it runs as built
    (`gate.controller.podshape.built_digest`)."""
    return keyed_signature(ring, _pod_message(namespace, name, shape))


def pod_refusal(ring: KeyRing, sig: str | None, namespace: str, name: str, shape: str) -> str | None:
    """Why a pod is not one the operator signed as it is now (`sign_pod`), or None when it is."""
    fault = signature_fault(ring, sig or "", _pod_message(namespace, name, shape))
    if fault == "unsigned":
        return "it carries no signature of the operator's"
    if fault == "unknown-key":
        return f"it is not signed with a key the operator holds ({(sig or '').partition(':')[0]!r})"
    if fault == "mismatch":
        return ("its signature does not match what it runs: its nodegate.io labels or annotations, or what it "
                "runs, changed since the operator created it, or the operator never created it under this name")
    return None


def unsigned(state: NodeGateState) -> NodeGateState:
    """The record as the operator keeps it in memory: without its signature (written anew at each write)."""
    return state.model_copy(update={"sig": ""}) if state.sig else state


def record_digest(raw: str) -> str:
    """A short digest of a record's text: the same forged record is reported once."""
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
