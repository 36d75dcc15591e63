"""Building blocks shared by both kinds: selectors, budgets, durations, conditions.

Every field carries a description: the CRD schema and docs/api.md are generated from these models,
so the text here is what a user reads in `kubectl explain`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, model_validator
from pydantic.alias_generators import to_camel

# Go's time.ParseDuration grammar, restricted to the units that make sense for rollouts.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

Obj = dict[str, Any]  # an object as the API server sends it (JSON), before or without a model


@functools.lru_cache(maxsize=1024)  # specs repeat a few durations; a timedelta is immutable
def parse_duration(text: str) -> timedelta:
    """Parse a Go-style duration ("1h30m", "90s", "250ms"); raise ValueError on anything else,
    a duration too long for any clock included ("99999999999999999h": timedelta's own limit is
    about 2.7 million years, and Go's time.Duration about 292 years)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration like 90s, 15m or 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text!r} is too long to be a duration") from None


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp as the API and NodeGate's records write it (`2026-12-01T10:00:00Z`), None
    when unset or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _parses(text: str) -> str:
    parse_duration(text)  # the pattern holds already; this refuses what overflows
    return text


# The models accept any duration that parses, without the per-field maximums that admission
# enforces (`gate.api.nodegate.STAGE_TIMEOUT_MAX` and the others): a gate stored before a maximum
# existed must still be read by the operator. One that does not parse at all could never be acted on.
Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=64,
        json_schema_extra={"format": "duration-go"},
    ),
    AfterValidator(_parses),
]


class Model(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python.

    Unknown fields are ignored rather than refused: the API server prunes them with the structural
    schema already, and an operator reading an object written by a newer CRD must not crash on it.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=False,
        use_attribute_docstrings=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def selector_holds(match_labels: Mapping[str, str], expressions: Iterable[tuple[str, str, Sequence[str]]],
                   labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics, written once: `matchLabels` and `matchExpressions` as
    (key, operator, values), all ANDed. Both the model (`LabelSelector.matches`) and the admission
    rules' raw selectors (`gate.admission.rules.syntax.selector_matches`, once valid) read it."""
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for key, op, values in expressions:
        present = key in labels
        if (op == "In" and not (present and labels[key] in values)) \
                or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


class LabelSelectorRequirement(Model):
    key: str = Field(max_length=317, description="The label key the selector applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values: In, NotIn, Exists or DoesNotExist."
    )
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list,
        max_length=256,
        description="Values for In and NotIn (non-empty); must be empty for Exists and DoesNotExist.",
    )


class LabelSelector(Model):
    """A metav1.LabelSelector. The empty selector selects everything."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels that must all be present with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        max_length=64,
        description="Requirements that must all hold; ANDed with matchLabels.",
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a set of labels satisfies this selector (Kubernetes semantics)."""
        return selector_holds(self.match_labels, ((r.key, r.operator, r.values) for r in self.match_expressions),
                              labels)

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def query(self) -> str:
        """The selector as a `labelSelector` query parameter (`k=v,k in (a,b),k notin (c),k,!k`), for a
        list the API server filters."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for r in self.match_expressions:
            values = ",".join(sorted(set(r.values)))
            parts.append({"In": f"{r.key} in ({values})", "NotIn": f"{r.key} notin ({values})",
                          "Exists": r.key, "DoesNotExist": f"!{r.key}"}[r.operator])
        return ",".join(parts)

    @functools.cached_property
    def key(self) -> Hashable:
        """`canonical()`, worked out once: what a plan's memo of matches per node is keyed by
        (`gate.rollout.snapshot.NodeSnapshot.matches`). A selector is never changed once parsed."""
        return self.canonical()

    def canonical(self) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, tuple[str, ...]], ...]]:
        """A hashable normal form: two selectors that select the same way compare equal."""
        labels = tuple(sorted(self.match_labels.items()))
        exprs = tuple(
            sorted((r.key, r.operator, tuple(sorted(set(r.values)))) for r in self.match_expressions)
        )
        return labels, exprs


BUDGET_RULES: list[JsonValue] = [
    {
        "rule": "has(self.percent) != has(self.count)",
        "message": "exactly one of percent or count must be set",
    }
]


class Budget(Model):
    """How many nodes may be disrupted at once. Always a hard ceiling, never a target."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": BUDGET_RULES})

    percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Percent of the matched nodes, rounded down but at least 1. "
            "Mutually exclusive with count."
        ),
    )
    count: int | None = Field(
        default=None, ge=0, description="An absolute number of nodes. Mutually exclusive with percent."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        if (self.percent is None) == (self.count is None):
            raise ValueError("exactly one of percent or count must be set")
        return self

    def ceiling(self, matched: int) -> int:
        """The most nodes of `matched` that may be disrupted at once (0 only when nothing matched)."""
        if matched <= 0:
            return 0
        if self.count is not None:
            return max(0, min(self.count, matched))
        assert self.percent is not None
        return max(1, matched * self.percent // 100)


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Model):
    """A standard metav1.Condition."""

    type: str = Field(max_length=316, description="Condition type: Ready, Progressing, Degraded, Paused; "
                      "Reconciling and Stalled (kstatus, present only while True); "
                      "Deleting on a NodeGate being deleted, Disabled on a disabled one.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        default="", max_length=1024, description="A CamelCase word saying why the condition has this status."
    )
    message: str = Field(default="", max_length=32768, description="A sentence for a person.")
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was computed for."
    )


class ObjectMeta(Model):
    """The parts of metav1.ObjectMeta NodeGate reads; the rest passes through untouched."""

    name: str = Field(default="", description="Object name.")
    generation: int | None = Field(default=None, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Opaque version for concurrency.")
    uid: str | None = Field(default=None, description="Unique id.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    finalizers: list[str] = Field(default_factory=list, description="Finalizers.")
    deletion_timestamp: str | None = Field(default=None, description="Set once deletion was requested.")
    creation_timestamp: str | None = Field(default=None, description="Creation time.")
