"""Compartments: which budget and strategy govern a node.

* A gate with a DeploymentPolicy: one compartment per `spec.compartments` entry, in the order listed,
  then `__default__` (the policy's `spec.default`) for the nodes no selector claims.
* A node several selectors match belongs to the **first one listed**: the order is the policy
  author's explicit statement of precedence, it does not depend on node labels changing elsewhere,
  and the CRD documents it on the field.
* A gate with `interruptionBudget` and no policy: one compartment `__default__` with that budget and
  a fixed strategy whose initialBatch is the ceiling, so the budget alone sets the pace (the other
  strategy fields keep FixedStrategy's defaults: batchThreshold 100, failureThreshold 3,
  safetyLimit 50, so failures stay bounded there too).
* A gate with neither: the same, with a budget of 100%.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gate.api.common import Budget, LabelSelector
from gate.api.nodegate import NodeGate
from gate.api.policy import DEFAULT_COMPARTMENT, DeploymentPolicy, FixedStrategy, Health, Strategy


class PolicyMismatch(ValueError):
    """The policy handed to the planner is not the one the gate names (or one is missing).

    Planning with a stand-in budget could disrupt more nodes than the author allowed, so the planner
    refuses; the operator reports it on the gate and plans nothing until the policy exists.
    """


@dataclass(frozen=True)
class CompartmentSpec:
    """A compartment as the planner uses it. `strategy` None means: fill the budget. With `health`,
    nodes soak after their round, and batches fill as the budget frees (`gate.rollout.planner.decide`)."""

    name: str
    selector: LabelSelector | None
    budget: Budget
    strategy: Strategy | None
    health: Health | None = None
    rollback: bool = False  # a failed batch stops the compartment at once, and its nodes go back

    def strategy_for(self, ceiling: int) -> Strategy:
        if self.strategy is not None:
            return self.strategy
        return Strategy(fixed=FixedStrategy(initial_batch=max(1, ceiling)))


def compartments_of(gate: NodeGate, policy: DeploymentPolicy | None) -> tuple[CompartmentSpec, ...]:
    """The gate's compartments in precedence order; `__default__` is always last."""
    wanted = gate.spec.deployment_policy
    if wanted is None:
        if policy is not None:
            raise PolicyMismatch(f"gate {gate.name} names no DeploymentPolicy but {policy.name} was given")
        budget = gate.spec.interruption_budget or Budget(percent=100)
        return (CompartmentSpec(DEFAULT_COMPARTMENT, None, budget, None),)
    if policy is None or policy.name != wanted:
        found = "none" if policy is None else policy.name
        raise PolicyMismatch(f"gate {gate.name} needs DeploymentPolicy {wanted}, got {found}")
    listed = tuple(
        CompartmentSpec(c.name, c.selector, c.budget, c.strategy, c.health, c.rollback)
        for c in policy.spec.compartments
    )
    default = policy.spec.default
    return (*listed, CompartmentSpec(DEFAULT_COMPARTMENT, None, default.budget, default.strategy, default.health,
                                     default.rollback))


def assign_compartment(specs: Sequence[CompartmentSpec], labels: Mapping[str, str], *,
                       matches: Callable[[LabelSelector], bool] | None = None) -> str:
    """The first listed compartment whose selector matches, else `__default__`. `matches` answers for
    the labels from a memo (`NodeSnapshot.matches`)."""
    for spec in specs:
        if spec.selector is not None and (matches(spec.selector) if matches else spec.selector.matches(labels)):
            return spec.name
    return DEFAULT_COMPARTMENT
