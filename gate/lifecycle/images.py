"""Which image each package's stage pods pull, and which tags must be resolved first (pure: no I/O).

A tag names whatever was pushed under it last. Pulled as a tag, one rollout could run two different
images on two nodes: a tag pushed again between the first node's pull and the tenth node's (by a
release pipeline, or by someone who may push to the repository). So the operator resolves each
package's tagged image (`image:version`, `gate.api.versions.image_reference`) to its manifest digest
once, records it in the gate's status (`status.images`), and every stage pod of the rollout pulls
`<repository>@<digest>`.

Decisions:

* **A record is reused while the package's image and version are the same.** The record keeps the
  reference it was resolved from; a package whose `image:version` differs from it is resolved again.
  So a new version (or image) resolves anew, and nothing else does: a resync, an operator restart
  or a tag pushed again never moves a rollout to other code. (To take a re-pushed tag on purpose,
  publish a new version, or pin the image by digest.)
* **An image pinned by digest in the spec needs no resolution** and gets no record: the spec already
  says exactly what runs.
* **Fail closed.** A package with a tagged image and no matching record has no pod image
  (`pod_images` lists it as unresolved): no stage pod of it is created, on any node, until the record
  exists. The gate's plan does not start rounds meanwhile (`gate.controller.gates`).
* **A record is checked before it is used.** `status.images` is written by whoever may write the
  gate's status, not only by the operator, so a record counts only when its digest is a digest
  (`sha256:` and 64 lowercase hex digits, `gate.api.digests.DIGEST`: nothing else can follow the `@`)
  and it names this package and exactly the `image:version` of the spec, which admission judged
  against the package's image binding. The pod's repository is always the spec's (`by_digest`), so a
  record can at most choose another manifest of the bound repository; one that fails the check is
  treated as missing, and resolved again.
* **What resolving writes is planned here** (`plan_images`): the records for the status, and while
  an image fails, the conditions that say so (ImagesResolved False, Ready False, Degraded True) and
  the Warning Event; `held` then says why no round may start, and the gate reconcile stops there
  (retried with backoff). The gate applier writes the plan and decides nothing.
* **Pull policy is explicit.** By digest, `IfNotPresent`: the content cannot differ, so a node that
  has it need not ask the registry again. With resolution turned off (`--resolve-digests=false`,
  for clusters whose operator cannot reach the registry) a tag is pulled with `Always`, so each node
  at least asks the registry what the tag names now, rather than running whatever old image it
  cached under that tag; two nodes may then still run different code if the tag moves mid-rollout.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gate.api.common import Obj
from gate.api.digests import DIGEST
from gate.api.nodegate import ImageRecord, NodeGate, Package
from gate.api.versions import image_reference
from gate.lifecycle.health import condition, same_status
from gate.lifecycle.node import EventRequest, PodRequest

PullPolicy = Literal["IfNotPresent", "Always"]


@dataclass(frozen=True)
class PodImage:
    """The image a package's stage pods name, and how the kubelet pulls it."""

    image: str
    pull_policy: PullPolicy


def tagged_reference(package: Package) -> str | None:
    """The tagged reference of a package's image (image:version), or None when the spec pins it by digest."""
    if "@" in package.image:
        return None
    return image_reference(package.image, package.version)


def by_digest(reference: str, digest: str) -> str:
    """`repository@digest` for a tagged `repository:tag` (a colon before the last slash is a port)."""
    head, slash, last = reference.rpartition("/")
    name = last.partition(":")[0]
    return f"{head}{slash}{name}@{digest}"


def recorded(gate: NodeGate) -> dict[tuple[str, str], ImageRecord]:
    """The gate's usable image records by (package, tagged reference): those whose digest is one
    (`DIGEST`). Looked up by the spec's own (package, image:version), so a record of another
    reference or repository is never used either."""
    records = gate.status.images if gate.status is not None else []
    return {(r.package, r.reference): r for r in records if DIGEST.match(r.digest)}


def _tagged(gate: NodeGate, also: Sequence[NodeGate]) -> dict[tuple[str, str], Package]:
    """(package, tagged reference) -> the package, over the gate's spec and the specs in `also`."""
    out: dict[tuple[str, str], Package] = {}
    for spec_of in (gate, *also):
        for name, package in spec_of.spec.packages.items():
            ref = tagged_reference(package)
            if ref is not None:
                out.setdefault((name, ref), package)
    return out


def pinned_images(gate: NodeGate, also: Sequence[NodeGate] = ()) -> list[ImageRecord]:
    """The images pinned by digest in the gate's spec and the specs in `also`, as records of their
    repository and digest: never stored (the spec says what runs), but judged by an image signature
    policy like the resolved ones (`gate.lifecycle.signatures`)."""
    out: dict[tuple[str, str], ImageRecord] = {}
    for spec_of in (gate, *also):
        for name, package in spec_of.spec.packages.items():
            if "@" in package.image:
                reference, _, digest = package.image.partition("@")
                out.setdefault((name, package.image), ImageRecord(package=name, reference=reference, digest=digest))
    return [out[key] for key in sorted(out)]


def to_resolve(gate: NodeGate, also: Sequence[NodeGate] = ()) -> dict[tuple[str, str], Package]:
    """(package, tagged reference) -> the package, for each image with no record of that very reference:
    the gate's packages, and those of the specs in `also` (where a failed batch goes back to,
    `gate.lifecycle.rollback.rollback_targets`, whose stage pods pull by digest too)."""
    records = recorded(gate)
    return {key: package for key, package in _tagged(gate, also).items() if key not in records}


def merged_records(gate: NodeGate, resolved: Iterable[ImageRecord], also: Sequence[NodeGate] = ()) -> list[ImageRecord]:
    """The records the status should hold: one per tagged image of the gate's packages and of the specs
    in `also`, the kept ones and the ones just resolved; the records of images no spec names any more
    (a package that went, a new version, one pinned by digest) are dropped. Sorted, so the status does
    not change by order."""
    fresh = {(r.package, r.reference): r for r in resolved}
    records = recorded(gate)
    out = [record for key in sorted(_tagged(gate, also)) if (record := fresh.get(key) or records.get(key)) is not None]
    return out


def pod_images(gate: NodeGate, packages: Iterable[str], *, resolve: bool,
               trusted: Container[tuple[str, str]] | None = None) -> tuple[dict[str, PodImage], list[str]]:
    """The image of each of `packages` as its stage pods pull it, and the packages that cannot be
    pulled yet (a tagged image without a record of its reference, while resolution is on). With an
    image signature policy, `trusted` holds the (reference, digest) pairs the operator judged runnable
    under it (`gate.lifecycle.signatures.trusted_digests`): a record of any other digest is not used."""
    records = recorded(gate)
    if trusted is not None:
        records = {key: r for key, r in records.items() if (r.reference, r.digest) in trusted}
    images: dict[str, PodImage] = {}
    missing: list[str] = []
    for name in packages:
        package = gate.spec.packages[name]
        ref = tagged_reference(package)
        if ref is None:
            if trusted is not None and tuple(package.image.partition("@")[::2]) not in trusted:
                missing.append(name)  # pinned, and not judged runnable under the image signature policy
                continue
            images[name] = PodImage(image_reference(package.image, package.version), "IfNotPresent")
        elif not resolve:
            images[name] = PodImage(ref, "Always")
        elif (record := records.get((name, ref))) is not None:
            images[name] = PodImage(by_digest(ref, record.digest), "IfNotPresent")
        else:
            missing.append(name)
    return images, missing


def same_records(current: Iterable[ImageRecord], wanted: Iterable[ImageRecord]) -> bool:
    def key(records: Iterable[ImageRecord]) -> list[tuple[str, str, str, str]]:
        return sorted((r.package, r.reference, r.digest, r.verified.model_dump_json() if r.verified else "")
                      for r in records)

    return key(current) == key(wanted)


def records_wire(records: Iterable[ImageRecord]) -> list[dict[str, Any]]:
    return [r.to_wire() for r in records]


def unresolved_message(problems: Mapping[str, str]) -> str:
    """The ImagesResolved=False message: each package's reference and why it could not be resolved."""
    return "; ".join(f"package {name}: {why}" for name, why in sorted(problems.items())) + (
        ". No stage pod of these packages starts on any node until their images resolve (retried with backoff)")


AGENT = "(agent)"  # the package name NodeGate's own agent image is judged under: no package can be named so


def request_packages(request: PodRequest) -> list[str]:
    """The packages whose images a stage pod of `request` pulls, in the order it runs them."""
    return list(dict.fromkeys(s.package for s in request.steps if s.package is not None))


def held_requests(gate: NodeGate, requests: Iterable[PodRequest], *, resolve: bool,
                  trusted: Container[tuple[str, str]] | None = None,
                  agent: ImageRecord | None = None) -> dict[str, list[str]]:
    """The stage pods of a node's decision held until their images may be pulled (fail closed: no stage
    pod pulls a tag the rollout has not pinned, nor, with an image signature policy, a digest it has
    not judged runnable, `trusted`; NodeGate's own image, `agent`, is judged as a package's, and with a
    policy an agent image not pinned by digest yet, None, holds every pod: the gate reconcile pins it): pod name
    -> the packages it waits for. The gate reconcile resolves and judges them, or says why it cannot;
    the node looks again after it."""
    held = {}
    for request in requests:
        unresolved = pod_images(gate, request_packages(request), resolve=resolve, trusted=trusted)[1]
        if trusted is not None and (agent is None or (agent.reference, agent.digest) not in trusted):
            unresolved.append(AGENT)
        if unresolved:
            held[request.name] = unresolved
    return held


@dataclass(frozen=True)
class Hold:
    """Why a gate's images hold it before any plan (`gate.lifecycle.signatures.hold_of`): the condition
    set False, its reason and message."""

    condition: str  # ImagesResolved or ImagesVerified
    reason: str
    message: str


@dataclass(frozen=True)
class ImagesPlan:
    """What resolving (and judging) a gate's images writes, before any other plan of the gate: `status`,
    the merge patch of its status (the records, and while the images hold the gate the conditions that
    say so; None: as it is), then `events` on the gate. `held`: the images hold the gate, no round may
    start, and the reconcile stops after these writes, retried with backoff."""

    status: Obj | None = None
    events: list[EventRequest] = field(default_factory=list)
    held: Hold | None = None


def plan_images(gate: NodeGate, status: Obj, records: Sequence[ImageRecord], hold: Hold | None, now: datetime,
                warnings: Sequence[EventRequest] = ()) -> ImagesPlan:
    """The gate's image `records` (resolved, merged and judged) for its status, and while `hold` holds
    the gate: its condition False, Ready False and Degraded True, each with its message, the status
    Degraded, and a Warning Event; `warnings` (images that fail the signature policy in warn mode) are
    said before it."""
    current = gate.status.images if gate.status is not None else []
    patch: Obj = {}
    if not same_records(current, records):
        patch["images"] = records_wire(records)
    if hold is not None:
        # Ready no longer (the spec's packages cannot start), Degraded, and the condition that says why.
        previous = gate.status.conditions if gate.status is not None else []
        generation = gate.metadata.generation or 0
        held: dict[str, Literal["True", "False"]] = {hold.condition: "False", "Ready": "False", "Degraded": "True"}
        kept = [c for c in status.get("conditions") or [] if c.get("type") not in held]
        patch["conditions"] = [*kept, *(condition(type_, value, hold.reason, hold.message, previous, now,
                                                  generation).to_wire() for type_, value in held.items())]
        patch.update({"status": "Degraded", "observedGeneration": generation})
    write = bool(patch) and not same_status(status, {**status, **patch})
    events = [*warnings, *([EventRequest("gate", "Warning", hold.reason, hold.message)] if hold else [])]
    return ImagesPlan(status=patch if write else None, events=events, held=hold)
