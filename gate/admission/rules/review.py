"""AdmissionReview v1 on the wire, and the verdict the rules hand back.

The request models accept what the API server sends (unknown fields ignored, camelCase aliases) and
refuse what it never sends: a review without `request.uid`, `kind` or `operation` is malformed input,
answered with a 4xx by the server, not a verdict.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

ADMISSION_API_VERSION = "admission.k8s.io/v1"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str


class GroupVersionResource(_Wire):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(_Wire):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)


class AdmissionRequest(_Wire):
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource = Field(default_factory=GroupVersionResource)
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    operation: Operation
    user_info: UserInfo = Field(default_factory=UserInfo)
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool = False


class AdmissionReview(_Wire):
    api_version: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class Status(_Wire):
    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None


class AdmissionResponse(_Wire):
    uid: str
    allowed: bool
    status: Status | None = None
    patch_type: Literal["JSONPatch"] | None = None
    patch: str | None = None  # base64 of the JSON patch
    warnings: list[str] | None = None


class AdmissionReviewResponse(_Wire):
    api_version: str = ADMISSION_API_VERSION
    kind: str = "AdmissionReview"
    response: AdmissionResponse


# -- verdicts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One reason to refuse: the field a person has to change, and why."""

    field: str
    reason: str
    forbidden: bool = False  # an authorization refusal (403) rather than an invalid value (422)

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}" if self.field else self.reason


@dataclass(frozen=True)
class AccessCheck:
    """A question for the authorizer (a SubjectAccessReview), and the violation if the answer is no."""

    user: UserInfo
    verb: str
    group: str
    resource: str
    name: str
    denied: Violation
    namespace: str = ""  # "" for cluster-scoped resources and virtual ones (packages)
    expect: bool = True
    """The answer the request needs: False for a question whose yes refuses it (a right held only
    through a wildcard, `gate.admission.rules.connect`)."""

    def cache_key(self) -> tuple[object, ...]:
        extra = tuple(sorted((k, tuple(v)) for k, v in self.user.extra.items()))
        return (self.user.username, self.user.uid, tuple(sorted(self.user.groups)), extra,
                self.verb, self.group, self.resource, self.namespace, self.name)


JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class Notice:
    """A Warning Event the server leaves when the request is allowed: the use of a break-glass right.
    The request is refused when the Event cannot be written (no break-glass without its trace)."""

    namespace: str
    kind: str
    name: str
    reason: str
    note: str


@dataclass(frozen=True)
class Verdict:
    """What the rules decided. `access` lists the authorizer questions still to be asked: the
    request is allowed only when there are no violations and every one of them is answered yes."""

    violations: tuple[Violation, ...] = ()
    access: tuple[AccessCheck, ...] = ()
    patch: JsonPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    notices: tuple[Notice, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.violations and not self.access

    def with_answers(self, answers: Sequence[bool]) -> Verdict:
        """Fold the authorizer's answers (one per access check, in order) in: every answer other than
        the check's `expect` is a violation."""
        if len(answers) != len(self.access):
            raise ValueError(f"{len(self.access)} access checks but {len(answers)} answers")
        denied = tuple(check.denied for check, yes in zip(self.access, answers, strict=True) if yes != check.expect)
        return replace(self, violations=self.violations + denied, access=())


ALLOW = Verdict()


def deny(*violations: Violation) -> Verdict:
    return Verdict(violations=tuple(violations))


def response_for(uid: str, verdict: Verdict) -> AdmissionReviewResponse:
    """The AdmissionReview answer for a verdict whose access checks are already folded in."""
    if verdict.access:
        raise ValueError("fold the access checks in (Verdict.with_answers) before answering")
    warnings = list(verdict.warnings) or None
    if verdict.violations:
        message = "; ".join(v.message for v in verdict.violations)
        causes = [{"field": v.field, "message": v.reason,
                   "reason": "FieldValueForbidden" if v.forbidden else "FieldValueInvalid"}
                  for v in verdict.violations]
        forbidden = any(v.forbidden for v in verdict.violations)
        status = Status(code=403 if forbidden else 422, reason="Forbidden" if forbidden else "Invalid",
                        message=message, details={"causes": causes})
        return AdmissionReviewResponse(response=AdmissionResponse(
            uid=uid, allowed=False, warnings=warnings, status=status))
    patch = None
    if verdict.patch:
        patch = base64.b64encode(json.dumps(verdict.patch, separators=(",", ":")).encode()).decode()
    return AdmissionReviewResponse(response=AdmissionResponse(
        uid=uid, allowed=True, warnings=warnings, patch=patch, patch_type="JSONPatch" if patch else None,
    ))
