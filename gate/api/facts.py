"""Facts about a node for the steps of a package: what the operator knows when it starts a stage.

A step may need to know where it runs: the node's name, its labels (its pool, zone or GPU model),
its annotations, and its place in the rollout. The Downward API cannot read a Node's labels, so the
operator writes these facts into the stage pod itself, as the JSON of the pod annotation
`nodegate.io/node-facts`, and a downwardAPI volume projects that annotation into a file the agent
reads (`gate.controller.pods`). The agent adds what only the host knows (the packages NodeGate's
agent recorded there) and hands the whole to every step (`gate.agent.facts`).

The facts are bounded: a pod's annotations may hold 256 KiB in all, a node's as much again. Labels
and annotations are kept, in key order, while they fit their budget; the keys left out are named in
`omitted`. The gates' own `state.<gate>` annotations are never copied: they are the operator's
memory, large, and what they say for a step is in `rollout` and in the installed packages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final, Literal

from pydantic import Field

from gate.api import keys
from gate.api.common import Model

FACTS_ANNOTATION: Final = f"{keys.GROUP}/node-facts"
LABELS_BUDGET: Final = 16 * 1024
ANNOTATIONS_BUDGET: Final = 32 * 1024
OMITTED_MAX: Final = 100


class RolloutPlace(Model):
    """Where the node stands in the gate's rollout when the stage starts."""

    compartment: str | None = Field(default=None, description="Compartment the node was picked in.")
    batch: int = Field(default=0, description="Rollout batch of its compartment the node was picked into "
                       "(1 is the first; 0: not picked by the planner, e.g. a removal).")
    round: int = Field(default=0, description="How many rounds the gate started on the node: 1 is the first; a "
                       "reset, a rerun or a spec change starts another.")


class OperatorFacts(Model):
    """What the operator writes into the stage pod (the `nodegate.io/node-facts` annotation)."""

    v: Literal[1] = Field(default=1, description="Version of this record's format.")
    node: str = Field(description="The node's name.")
    labels: dict[str, str] = Field(default_factory=dict, description="The node's labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="The node's annotations, without the "
                                        "gates' state annotations.")
    omitted: list[str] = Field(default_factory=list, description="Label and annotation keys left out to keep the "
                               "facts within their budget.")
    rollout: RolloutPlace = Field(default_factory=RolloutPlace)

    def dump(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), separators=(",", ":"), sort_keys=True)


def _within(items: Mapping[str, str], budget: int, omitted: list[str]) -> dict[str, str]:
    """The entries, in key order, that fit in `budget` bytes of JSON; an entry too big is skipped (and
    named in `omitted`), so the small ones after it still get in."""
    kept: dict[str, str] = {}
    used = 0
    for key in sorted(items):
        size = len(json.dumps(key)) + len(json.dumps(items[key])) + 2
        if used + size > budget:
            if len(omitted) < OMITTED_MAX:
                omitted.append(key)
            continue
        kept[key] = items[key]
        used += size
    return kept


def operator_facts(node: str, labels: Mapping[str, str], annotations: Mapping[str, str],
                   rollout: RolloutPlace | None = None) -> OperatorFacts:
    """The bounded facts of a node, from its labels and annotations as the operator last saw them."""
    omitted: list[str] = []
    own = {k: v for k, v in annotations.items() if keys.gate_of_state_annotation(k) is None}
    return OperatorFacts(node=node, labels=_within(labels, LABELS_BUDGET, omitted),
                         annotations=_within(own, ANNOTATIONS_BUDGET, omitted), omitted=omitted,
                         rollout=rollout or RolloutPlace())
