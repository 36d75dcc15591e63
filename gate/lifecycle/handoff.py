"""The onboarding hand-off (spec.leaveCordoned): a joining node left cordoned for the validator next.

Many fleets run a burn-in or acceptance suite on a new node before it serves, and that suite
uncordons the node when it passes. A gate that asks for the hand-off cordons a node that joined with
the readiness taint in the same write that lifts the taint (`gate.lifecycle.machine`), marking it
`held-by: <gate>`. The hold has no `cordoned-by`, so the rounds that come later treat it as someone
else's cordon: they keep it, and their uncordon at the end never releases it.

Only an outside actor releases it (`kubectl uncordon`, `nodegate node release`): the operator
notices a node that is schedulable with its mark still on, removes the mark and records
`hand-off-released`, which no round, reset, or deletion and re-creation of a gate removes, so the
node is never held again. Everything here is pure: annotations in, decisions out.
"""

from __future__ import annotations

from collections.abc import Mapping

from gate.api import keys
from gate.lifecycle.condition import NodeCondition


def hold_wanted(annotations: Mapping[str, str], asked_by: str | None) -> str | None:
    """The gate to name in the hold when a joining node's taint is lifted now, or None: nobody asks,
    or the node was released once already (it is never held again)."""
    if asked_by is None or keys.HAND_OFF_RELEASED in annotations:
        return None
    return asked_by


def held(annotations: Mapping[str, str], unschedulable: bool) -> str | None:
    """The gate holding the node for hand-off (cordoned, its mark on), or None."""
    return annotations.get(keys.HELD_BY) if unschedulable else None


def release_noticed(annotations: Mapping[str, str], unschedulable: bool) -> bool:
    """Someone uncordoned a held node: its mark must go, and the release be recorded for good."""
    return keys.HELD_BY in annotations and not unschedulable


def hold_condition(annotations: Mapping[str, str], unschedulable: bool) -> NodeCondition | None:
    """The Node condition `nodegate.io/held-for-hand-off` while the node is held, None otherwise, so
    that `kubectl describe node` and tools that watch node conditions say why the node takes no pods."""
    gate = held(annotations, unschedulable)
    if gate is None:
        return None
    return NodeCondition(keys.HAND_OFF_CONDITION, "True", "HeldForHandOff",
                         f"NodeGate {gate} left the node cordoned for the validator that comes next "
                         "(spec.leaveCordoned); `kubectl uncordon` (or `nodegate node release`) releases it for good")
