"""The readiness taint's one home: only the taint with its effect counts, and both writes keep the rest."""

from __future__ import annotations

from gate.api import keys
from gate.lifecycle import taint

OURS = {"key": keys.READINESS_TAINT_KEY, "effect": keys.READINESS_TAINT_EFFECT}
OTHER_EFFECT = {"key": keys.READINESS_TAINT_KEY, "effect": "NoExecute"}
GPU = {"key": "gpu", "effect": "NoSchedule"}


def test_only_the_taint_with_its_effect_counts_in_every_form() -> None:
    assert taint.has_readiness_taint([GPU, OURS])
    assert taint.has_readiness_taint(((keys.READINESS_TAINT_KEY, keys.READINESS_TAINT_EFFECT),))
    for taints in ([OTHER_EFFECT], ((keys.READINESS_TAINT_KEY, "NoExecute"),), None, "x", [None, "x"], []):
        assert not taint.has_readiness_taint(taints), taints
    assert taint.has_readiness_taint(taint.node_taints({"spec": {"taints": [OURS]}}))
    assert taint.node_taints({"spec": "x"}) is None


def test_the_writes_add_once_and_remove_only_ours() -> None:
    assert taint.with_readiness_taint([GPU, OTHER_EFFECT]) == [GPU, OTHER_EFFECT, OURS]
    assert taint.with_readiness_taint([GPU, OURS]) is None
    assert taint.without_readiness_taint([GPU, OURS, OTHER_EFFECT]) == [GPU, OTHER_EFFECT]
    assert taint.without_readiness_taint([GPU, OTHER_EFFECT]) is None


def test_join_patch_adds_the_taint_where_it_is_missing_and_a_selected_node_is_joining() -> None:
    def selected(labels: object) -> bool:
        return labels == {"pool": "gpu"}

    node = {"metadata": {"labels": {"pool": "gpu", keys.IGNORE_LABEL: "true"}}}
    assert taint.join_patch(node, selected) == [{"op": "add", "path": "/spec", "value": {"taints": [OURS]}}]
    assert taint.join_patch({**node, "spec": {}}, selected) == [{"op": "add", "path": "/spec/taints", "value": [OURS]}]
    assert taint.join_patch({**node, "spec": {"taints": [OTHER_EFFECT]}}, selected) == [
        {"op": "add", "path": "/spec/taints/-", "value": OURS}]
    assert taint.join_patch({**node, "spec": {"taints": [OURS]}}, selected) == []
    assert taint.join_patch({"metadata": {"labels": {"pool": "cpu"}}}, selected) == []
