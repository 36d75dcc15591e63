"""Image signatures in a rollout: which verdicts hold a gate, and what its status says (pure: no I/O).

With an image signature policy (`--image-signatures FILE`, `gate.api.signatures`), the operator judges
every digest a gate's stage pods would pull (`gate.controller.imagetrust`) after resolving it and before
anything of the gate is planned. This module turns those verdicts into the gate's records and status.

Decisions:

* **Enforce holds the whole gate, before any node is cordoned.** A package image that fails (no
  signature, a bad one, one by a key the rule does not list, or no rule while `unmatched: refuse`)
  holds the gate as an image that does not resolve does: `ImagesVerified=False` with the verdict's
  reason, Ready=False, Degraded, a Warning Event, and no plan at all (no cordon, no prepull, no stage
  pod), retried with backoff. A node mid-round keeps the pod it already runs (that digest was verified
  when it was created); it starts no new one.
* **Warn mode runs, and says the same as a warning.** `ImagesVerified` stays `True` (the gate is not
  held, and kstatus tools must not read it as failed) with the failure's reason (SignatureMissing, ...)
  and a message that starts with "warn mode", and a Warning Event once per verdict.
* **The record says, the operator's memory decides.** Each image record carries what the policy
  decided (`ImageRecord.verified`: the policy's fingerprint, the reason, the rule and the key), so
  `kubectl get` and `nodegate status` show it. But the status can be written by whoever may write it,
  so a stage pod pulls a digest only when the operator itself judged it under the current policy since
  it started (`trusted_digests`, handed to `gate.lifecycle.images.pod_images`); a record it has not
  judged in this process is judged again first. Once a pod is created, its image is part of the shape
  the node's signed record holds (`gate.lifecycle.ownership`): a pod whose image is changed afterwards
  is not the operator's.
* **NodeGate's own agent image is judged like a package's** (`agent_image`): its failure holds every
  gate, and names the package `(agent)`. A tagged agent image (the chart's default) is first resolved
  to a digest and pinned for the operator's process (`gate.controller.images`), so stage pods pull the
  digest that was judged; until then no stage pod starts.
* **A changed policy judges everything again.** A verdict is kept with the policy's fingerprint; a
  record judged under another fingerprint counts as not judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gate.api.common import Condition
from gate.api.nodegate import ImageRecord, ImageVerification
from gate.api.signatures import SignaturePolicy, Verdict
from gate.lifecycle.health import condition
from gate.lifecycle.images import AGENT as AGENT  # re-exported: where the agent's record is made
from gate.lifecycle.images import Hold, unresolved_message
from gate.lifecycle.node import EventRequest

CONDITION = "ImagesVerified"
PASSED = ("Verified", "NotCovered")  # the reasons of a verdict that is ok


@dataclass(frozen=True)
class Judged:
    """One image record and what the policy decided for its digest."""

    record: ImageRecord
    verdict: Verdict


def runs(verdict: Verdict, policy: SignaturePolicy) -> bool:
    """Whether stage pods may pull the digest: it passed, or it failed in warn mode."""
    return verdict.ok or policy.mode == "warn"


def recorded_verdict(judged: Judged, policy: SignaturePolicy, now: datetime) -> ImageRecord:
    """The record with what the policy decided; one that already says so keeps its time, so the status
    does not change at every reconcile."""
    record, verdict = judged.record, judged.verdict
    wanted = ImageVerification(policy=policy.fingerprint(), reason=verdict.reason, mode=policy.mode,
                               rule=verdict.rule, key=verdict.key,
                               verified_at=now.isoformat(timespec="seconds").replace("+00:00", "Z"))
    old = record.verified
    if old is not None and old.model_copy(update={"verified_at": wanted.verified_at}) == wanted:
        return record
    return record.model_copy(update={"verified": wanted})


def held(judged: Iterable[Judged], policy: SignaturePolicy) -> list[Judged]:
    """The images that hold the gate: those that failed, in enforce mode."""
    return [j for j in judged if not runs(j.verdict, policy)]


def warned(judged: Iterable[Judged], policy: SignaturePolicy) -> list[Judged]:
    """The images that failed and run anyway (warn mode)."""
    return [j for j in judged if not j.verdict.ok and runs(j.verdict, policy)]


def failure_message(failed: Sequence[Judged], *, mode: str) -> str:
    """What `ImagesVerified` and the Event say: each package, its image, digest, rule and why."""
    parts = "; ".join(f"package {j.record.package}: {_about(j)}" for j in failed)
    if mode == "warn":
        return f"warn mode: {parts}. The images run anyway (the image signature policy's mode is warn)"
    return f"{parts}. No node of this gate is cordoned and no stage pod starts until its images verify"


def _about(judged: Judged) -> str:
    record, verdict = judged.record, judged.verdict
    head = f"image {record.reference} (digest {record.digest}, rule {verdict.rule or 'none'}): {verdict.reason}"
    return f"{head}: {verdict.message}" if verdict.message else head


def hold_of(problems: Mapping[str, str], refused: Sequence[Judged]) -> Hold | None:
    """What holds the gate: images that do not resolve (or whose signatures cannot be read) first,
    then images the policy refuses (enforce mode); None when nothing does."""
    if problems:
        return Hold("ImagesResolved", "ResolveFailed", unresolved_message(problems))
    if refused:
        return Hold(CONDITION, refused[0].verdict.reason, failure_message(refused, mode="enforce"))
    return None


def warnings(warned: Sequence[Judged]) -> list[EventRequest]:
    """The Warning Event on the gate for images that fail the policy in warn mode (they run anyway)."""
    if not warned:
        return []
    return [EventRequest("gate", "Warning", warned[0].verdict.reason, failure_message(warned, mode="warn"))]


def verified_condition(records: Sequence[ImageRecord], previous: Sequence[Condition], now: datetime,
                       generation: int) -> Condition | None:
    """`ImagesVerified` of a gate whose rollout is planned (its images passed, or failed in warn mode),
    from its records; None without a signature policy (no record says what one decided)."""
    judged = [r for r in records if r.verified is not None]
    if not judged:
        return None
    failed = [r for r in judged if r.verified is not None and r.verified.reason not in PASSED]
    if failed:
        first = failed[0].verified
        assert first is not None
        parts = "; ".join(f"package {r.package}: image {r.reference} (digest {r.digest}, rule "
                          f"{r.verified.rule or 'none'}): {r.verified.reason}" for r in failed if r.verified)
        return condition(CONDITION, "True", first.reason,
                         f"warn mode: {parts}. The images run anyway (the image signature policy's mode is warn)",
                         previous, now, generation)
    signed = sum(1 for r in judged if r.verified is not None and r.verified.reason == "Verified")
    message = f"{signed} package image(s) verified by a key of their rule"
    if len(judged) > signed:
        message += f", {len(judged) - signed} in repositories no rule covers (allowed by the policy)"
    return condition(CONDITION, "True", "Verified", message, previous, now, generation)


def agent_image(image: str) -> ImageRecord | None:
    """NodeGate's agent image (in every stage pod) as a record to judge like a package's, when it is
    pinned by digest (the chart's `image.digest`, or the operator's own pin of a tag); None for a tag,
    which the operator resolves and pins first (docs/supply-chain.md)."""
    if "@" not in image:
        return None
    repository, _, digest = image.partition("@")
    return ImageRecord(package=AGENT, reference=repository, digest=digest)


def trusted_digests(judged: Mapping[tuple[str, str], Verdict], policy: SignaturePolicy) -> frozenset[tuple[str, str]]:
    """(reference, digest) pairs a stage pod may pull under the policy: those judged and allowed to run."""
    return frozenset(key for key, verdict in judged.items() if runs(verdict, policy))
