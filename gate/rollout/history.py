"""A NodeGate's previous specs, kept as ControllerRevisions: what to write, and which revision `undo` means. Pure.

The operator keeps a gate's history the way the DaemonSet controller keeps a DaemonSet's: one
ControllerRevision per distinct rollout spec, numbered, owned by the gate. `nodegate rollout history`
lists them and `nodegate rollout undo` writes one back. Decisions:

* **What a revision holds**: `data.spec`, the gate's spec without the fields that are no rollout
  (`gate.api.state.NOT_ROLLOUT_FIELDS`: `paused`), exactly what `rollout_hash` hashes. Pausing is no
  new revision, and undo never pauses or resumes a gate.
* **Its name** is `<gate>-<rollout hash>` (at most 57 + 17 characters): the same spec always maps to
  the same name, so a crash between "decide" and "create" creates nothing twice, and a 409 on create
  says "it is there already".
* **Its number** (`revision`) grows: a new spec gets the greatest number plus one. A spec applied
  again (a revert by hand, or `undo`) reuses its revision and gets renumbered to the greatest plus
  one, so the newest revision is always the current spec and numbers never repeat in a history.
* **How many**: the current revision plus `limit` previous ones (an operator setting,
  `revision_history_limit`, 10 by default as for a DaemonSet); the oldest beyond that are deleted.
* **Whose**: the operator counts only revisions it signed (HMAC with its record key, over the gate's
  name and uid, the revision's data and its number; `gate.api.records`). A ControllerRevision someone
  else put in its namespace under a gate's label is ignored, and one squatting the name of a revision
  the operator needs is overwritten. The number is signed because it decides: the newest revision is
  the current spec, the oldest are deleted first, and `undo` goes back to the one before; whoever may
  patch a ControllerRevision would otherwise choose which old spec comes back. A renumbering is signed
  anew in the same write.
* **Revisions signed before the number was** (`nodegate.io/revision.v1`) do not check and are not
  counted: after the upgrade the current spec's revision is written anew (number 1) and the older
  ones are left to the garbage collector with their gate. A roll-back to a spec recorded only by an
  older operator finds no revision, as for a gate's first spec (`gate.lifecycle.rollback`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.records import KeyRing, keyed_signature, signature_fault
from gate.api.state import NOT_ROLLOUT_FIELDS, rollout_hash

SIGNATURE_ANNOTATION = "nodegate.io/revision-sig"
"""On a ControllerRevision the operator wrote: `<key id>:<hex HMAC>` (`sign_revision`)."""
HASH_LABEL = "nodegate.io/rollout-hash"
"""On a ControllerRevision: the gate's rollout hash that it holds (the name's suffix, as a label to select by)."""
SIGNATURE_DOMAIN = "nodegate.io/revision.v2"  # the record key signs node states too: this names what is signed
# (v1 signed no number: such a revision does not check, see above)


def history_selector(gate: str) -> str:
    """The label selector of a gate's ControllerRevisions. A gate's name fits a label value as it is
    (`keys.GATE_NAME_MAX` is 57)."""
    return f"{keys.STAGE_GATE_LABEL}={gate}"


def revision_spec(gate: NodeGate) -> Obj:
    """The part of the gate's spec a revision keeps: every field but `paused`, as `rollout_hash` hashes it."""
    spec: Obj = gate.spec.model_dump(by_alias=True, mode="json", exclude=set(NOT_ROLLOUT_FIELDS))
    return spec


def revision_name(gate: str, spec_hash: str) -> str:
    return f"{gate}-{spec_hash}"


def _message(gate: str, gate_uid: str, spec_hash: str, spec: Obj, number: int) -> bytes:
    return json.dumps([SIGNATURE_DOMAIN, gate, gate_uid, spec_hash, number, spec], sort_keys=True,
                      separators=(",", ":")).encode()


def sign_revision(ring: KeyRing, gate: str, gate_uid: str, spec_hash: str, spec: Obj, number: int) -> str:
    """The signature the operator puts on a revision it writes (`SIGNATURE_ANNOTATION`), for this number:
    a renumbering writes a new one."""
    return keyed_signature(ring, _message(gate, gate_uid, spec_hash, spec, number))


def revision_refusal(ring: KeyRing, gate: str, gate_uid: str, revision: Revision) -> str | None:
    """Why a revision is not one the operator wrote for this gate (name and uid), or None when it is."""
    fault = signature_fault(ring, revision.sig, _message(gate, gate_uid, revision.spec_hash, revision.spec,
                                                         revision.number))
    if fault == "unsigned":
        return "it carries no signature"
    if fault == "unknown-key":
        return f"it is not signed with a key the operator holds ({revision.sig.partition(':')[0]!r})"
    if fault == "mismatch":
        return (f"its signature does not match its data and number ({revision.number}) for gate {gate} (uid "
                f"{gate_uid}): changed since the operator wrote it, or signed before the number was")
    if revision.name != revision_name(gate, revision.spec_hash):
        return f"its name is not {revision_name(gate, revision.spec_hash)}"
    return None


@dataclass(frozen=True)
class Revision:
    """One ControllerRevision of a gate, as read from the API."""

    name: str
    number: int
    spec_hash: str
    spec: Obj = field(compare=False)
    resource_version: str = ""
    created: str = ""
    sig: str = ""


def parse_revision(obj: Obj, gate: str, gate_uid: str) -> Revision | None:
    """The revision, when the object is a ControllerRevision controlled by this gate (name and uid) that
    holds a spec; None for anything else (another gate's, an earlier gate's of that name, malformed)."""
    meta = obj.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if [(o.get("kind"), o.get("name"), o.get("uid")) for o in owners] != [("NodeGate", gate, gate_uid)]:
        return None
    data = obj.get("data")
    spec = data.get("spec") if isinstance(data, dict) else None
    number = obj.get("revision")
    if not isinstance(spec, dict) or not isinstance(number, int):
        return None
    return Revision(name=str(meta.get("name", "")), number=number,
                    spec_hash=str((meta.get("labels") or {}).get(HASH_LABEL, "")), spec=spec,
                    resource_version=str(meta.get("resourceVersion", "")),
                    created=str(meta.get("creationTimestamp", "")),
                    sig=str((meta.get("annotations") or {}).get(SIGNATURE_ANNOTATION, "")))


@dataclass(frozen=True)
class HistoryStep:
    """What the operator writes so that the gate's history holds its current spec as the newest revision:
    at most one of `create` (a new revision, this number) and `renumber` (an existing one gets this
    number), and the revisions to delete."""

    name: str
    number: int
    create: bool = False
    renumber: bool = False
    delete: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create or self.renumber or self.delete)


def plan_history(gate: NodeGate, revisions: list[Revision], limit: int) -> HistoryStep:
    """The step that makes the current spec the newest revision and keeps `limit` previous ones.

    `revisions` are the operator's own (signed, checked by the caller). The current spec's revision is
    created with the greatest number plus one when missing, renumbered so when it exists but is not the
    newest (the spec was applied before: a revert), and left alone when it is the newest. Then the
    oldest previous revisions beyond `limit` are deleted; the current one never is."""
    spec_hash = rollout_hash(gate)
    name = revision_name(gate.name, spec_hash)
    top = max((r.number for r in revisions), default=0)
    current = next((r for r in revisions if r.name == name), None)
    if current is None:
        number, create, renumber = top + 1, True, False
    elif current.number < top or sum(1 for r in revisions if r.number == top) > 1:
        number, create, renumber = top + 1, False, True
    else:
        number, create, renumber = current.number, False, False
    previous = sorted((r for r in revisions if r.name != name), key=lambda r: (r.number, r.name), reverse=True)
    delete = tuple(sorted(r.name for r in previous[max(limit, 0):]))
    return HistoryStep(name=name, number=number, create=create, renumber=renumber, delete=delete)


class UndoError(ValueError):
    """`undo` cannot go where it was asked to; the message says why and what there is."""


def undo_target(revisions: list[Revision], current_hash: str, to_revision: int | None) -> Revision:
    """The revision `undo` writes back: `to_revision` when given, else the newest one whose spec differs
    from the gate's current spec (the one before the current). A clear error when there is none."""
    ordered = sorted(revisions, key=lambda r: r.number)
    numbers = ", ".join(str(r.number) for r in ordered) or "none"
    if to_revision is not None:
        found = [r for r in ordered if r.number == to_revision]
        if not found:
            raise UndoError(f"no revision {to_revision} of this gate; it has revision(s) {numbers} "
                            "(`nodegate rollout history` lists them)")
        return found[0]
    older = [r for r in ordered if r.spec_hash != current_hash]
    if not older:
        raise UndoError(f"no previous revision to go back to (revision(s) kept: {numbers}); "
                        "the gate has had one rollout spec only, or its older ones were pruned")
    return older[-1]


def spec_summary(spec: Obj) -> str:
    """A revision in one line: its packages and versions, `a@1.0.0,b@2.1.0`."""
    packages = spec.get("packages") or {}
    return ",".join(f"{name}@{(pkg or {}).get('version', '?')}" for name, pkg in sorted(packages.items())) or "-"
