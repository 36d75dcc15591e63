"""The DeploymentPolicy kind: compartments of nodes, their budgets, strategies and windows."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from gate.api.common import Budget, Condition, Duration, LabelSelector, Model, ObjectMeta, parse_duration

DEFAULT_COMPARTMENT = "__default__"
COMPARTMENT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
MAX_COMPARTMENTS = 64
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
HHMM_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class FixedStrategy(Model):
    """Every batch has the same size."""

    initial_batch: int = Field(default=1, ge=1, description="Nodes in each batch.")
    batch_threshold: int = Field(
        default=100,
        ge=1,
        le=100,
        description="Percent of a batch's nodes that must succeed for the batch to count as good.",
    )
    failure_threshold: int | None = Field(
        default=3,
        ge=1,
        description="Consecutive failed batches that stop the compartment until a person resumes it.",
    )
    safety_limit: int = Field(
        default=50,
        ge=1,
        le=100,
        description=(
            "Progress (percent of the compartment complete) below which a failed batch shrinks the next one."
        ),
    )


class LinearStrategy(FixedStrategy):
    """Each good batch is `delta` nodes larger than the one before."""

    delta: int = Field(default=1, ge=1, description="Nodes added to the batch size after a good batch.")


class ExponentialStrategy(FixedStrategy):
    """Each good batch is `growthFactor` times the one before."""

    growth_factor: int = Field(default=2, ge=2, description="Multiplier of the batch size after a good batch.")


STRATEGY_RULES: list[JsonValue] = [
    {
        "rule": "(has(self.fixed) ? 1 : 0) + (has(self.linear) ? 1 : 0) + (has(self.exponential) ? 1 : 0) == 1",
        "message": "set exactly one of fixed, linear or exponential",
    }
]

StrategyKind = Literal["fixed", "linear", "exponential"]


class Strategy(Model):
    """Exactly one of fixed, linear or exponential."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": STRATEGY_RULES})

    fixed: FixedStrategy | None = Field(default=None, description="Constant batch size.")
    linear: LinearStrategy | None = Field(default=None, description="Batch grows by delta.")
    exponential: ExponentialStrategy | None = Field(default=None, description="Batch grows by growthFactor.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Strategy:
        chosen = [k for k in ("fixed", "linear", "exponential") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError("set exactly one of fixed, linear or exponential")
        return self

    @property
    def kind(self) -> StrategyKind:
        if self.linear is not None:
            return "linear"
        if self.exponential is not None:
            return "exponential"
        return "fixed"

    @property
    def params(self) -> FixedStrategy:
        """The chosen strategy's parameters (linear and exponential extend fixed)."""
        chosen = self.fixed or self.linear or self.exponential
        assert chosen is not None
        return chosen


def default_strategy() -> Strategy:
    return Strategy(fixed=FixedStrategy())


class NodeConditionMatch(Model):
    """A Node condition that makes a node unhealthy, as node-problem-detector, NVSentinel or DCGM set them."""

    type: str = Field(min_length=1, max_length=316, description="Condition type, e.g. GpuUnhealthy.")
    status: Literal["True", "False", "Unknown"] = Field(
        default="True", description="The status that means unhealthy (default True)."
    )


class PrometheusSignal(Model):
    """A PromQL instant query per node, asked of a Prometheus endpoint that the operator's installer
    configured (chart value `operator.health.prometheus.endpoints`): a non-empty result means the node
    is unhealthy. A policy names an endpoint; it never gives an address (the field `url` of earlier
    versions is gone: the operator asks no address that a policy writer chooses)."""

    endpoint: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Name of a Prometheus endpoint the operator's chart configures "
        "(operator.health.prometheus.endpoints: name -> URL, TLS, bearer token). A gate whose policy names "
        "an endpoint the operator does not know starts nothing, and its status says so. Replaces the field "
        "url, which is removed: a policy names an endpoint, never an address.",
    )
    query: str = Field(
        min_length=1, max_length=4096,
        description="PromQL instant query; $NODE is replaced by the node's name. Any sample in the result "
        "means unhealthy; a query that fails never counts as healthy. A failure message shows how many "
        "samples came back, their greatest value and the labels of the node's own series only.",
    )


class Health(Model):
    """How a node proves it is healthy after its round: it soaks, uncordoned and serving, and must stay
    Ready and free of the signals below; its batch is judged only when every node of it passed."""

    soak: Duration = Field(
        default="0s",
        description="How long a node that completed its round must stay Ready and healthy before it counts "
        "as complete (0s: judged once, as soon as its round ends).",
    )
    node_conditions: list[NodeConditionMatch] = Field(
        default_factory=list, max_length=32,
        description="Node conditions that make a node unhealthy: any match during the soak fails it.",
    )
    prometheus: PrometheusSignal | None = Field(
        default=None, description="A query that must return nothing during the soak."
    )

    @property
    def soak_seconds(self) -> float:
        return parse_duration(self.soak).total_seconds()


class CompartmentDefault(Model):
    """Budget and strategy of the nodes no compartment selects."""

    budget: Budget = Field(
        default_factory=lambda: Budget(percent=100), description="Hard ceiling of nodes disrupted at once."
    )
    strategy: Strategy = Field(default_factory=default_strategy, description="How batches grow.")
    health: Health | None = Field(
        default=None, description="Soak and health signals a node must pass after its round (none: a node is "
        "complete when its round ends)."
    )
    rollback: bool = Field(
        default=False, description="A failed batch (a stage, a check or health) takes its changed nodes back to the "
        "gate's previous revision (each package's previous version, image and config; uninstalled where the package "
        "is new), under the same budget, and the compartment stops with reason RolledBack."
    )


COMPARTMENT_RULES: list[JsonValue] = [
    {"rule": "self.name != '__default__'", "message": "__default__ is reserved", "fieldPath": ".name"}
]


class Compartment(Model):
    """A named group of nodes rolled out under its own budget and strategy."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": COMPARTMENT_RULES})

    name: str = Field(
        max_length=63,
        description="Unique name; __default__ is reserved for the nodes no compartment selects.",
    )
    selector: LabelSelector = Field(description="The nodes of this compartment.")
    budget: Budget = Field(description="Hard ceiling of nodes disrupted at once in this compartment.")
    strategy: Strategy = Field(default_factory=default_strategy, description="How batches grow.")
    health: Health | None = Field(
        default=None, description="Soak and health signals a node must pass after its round (none: a node is "
        "complete when its round ends)."
    )
    rollback: bool = Field(
        default=False, description="A failed batch (a stage, a check or health) takes its changed nodes back to the "
        "gate's previous revision (each package's previous version, image and config; uninstalled where the package "
        "is new), under the same budget, and the compartment stops with reason RolledBack."
    )


class Window(Model):
    """A recurring time span during which new nodes may start."""

    days: list[Weekday] = Field(
        min_length=1, max_length=7, description="Days the window opens on: Mon, Tue, Wed, Thu, Fri, Sat, Sun."
    )
    start: Annotated[str, Field(pattern=HHMM_PATTERN)] = Field(description="Opening time, HH:MM (24h).")
    end: Annotated[str, Field(pattern=HHMM_PATTERN)] = Field(
        description="Closing time, HH:MM; earlier than start means the window runs past midnight."
    )
    time_zone: str = Field(default="UTC", max_length=64, description="IANA time zone, e.g. Europe/Berlin.")


class DeploymentPolicySpec(Model):
    default: CompartmentDefault = Field(
        default_factory=CompartmentDefault, description="Budget and strategy of the __default__ compartment."
    )
    compartments: list[Compartment] = Field(
        default_factory=list,
        max_length=MAX_COMPARTMENTS,
        description="Compartments; a node selected by several goes to the first one listed.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    windows: list[Window] = Field(
        default_factory=list,
        max_length=32,
        description="Maintenance windows; when set, new nodes start only inside one.",
    )


class DeploymentPolicyStatus(Model):
    observed_generation: int | None = Field(default=None, description="The generation the operator last read.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready once the operator read the spec; Stalled (kstatus, present only while True) while the "
        "spec cannot be used.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    used_by: list[str] = Field(default_factory=list, description="NodeGates that reference this policy.")


class DeploymentPolicy(Model):
    """How a rollout is split into compartments and batches."""

    api_version: str = Field(default="nodegate.io/v1alpha1", description="nodegate.io/v1alpha1")
    kind: str = Field(default="DeploymentPolicy", description="DeploymentPolicy")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: DeploymentPolicySpec = Field(default_factory=DeploymentPolicySpec, description="Desired state.")
    status: DeploymentPolicyStatus | None = Field(default=None, description="Observed state.")

    @property
    def name(self) -> str:
        return self.metadata.name

    def prometheus_endpoints(self) -> list[tuple[str, str]]:
        """(field, endpoint name) of every Prometheus signal of the policy, `default` first."""
        found = []
        if self.spec.default.health is not None and self.spec.default.health.prometheus is not None:
            found.append(("spec.default.health.prometheus.endpoint", self.spec.default.health.prometheus.endpoint))
        for i, c in enumerate(self.spec.compartments):
            if c.health is not None and c.health.prometheus is not None:
                found.append((f"spec.compartments[{i}].health.prometheus.endpoint", c.health.prometheus.endpoint))
        return found

    def unknown_endpoint(self, known: Collection[str]) -> str | None:
        """Why the operator cannot use this policy with the endpoints it knows: the first endpoint it names
        that is not among them, with the field and what is known (None: every one is known)."""
        for where, name in self.prometheus_endpoints():
            if name not in known:
                listed = ", ".join(sorted(known)) or "none"
                return (f"{where}: Prometheus endpoint {name!r} is not one the operator's installer configured "
                        f"(operator.health.prometheus.endpoints; configured: {listed})")
        return None
