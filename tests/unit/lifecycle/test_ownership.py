"""Which stage pods are the operator's (gate.lifecycle.ownership): only those whose uid the node's signed
state records under their name, and whose shape is still the one recorded."""

from __future__ import annotations

from gate.api.state import NodeGateState, PodRecord, load_state
from gate.lifecycle.node import StagePod, Step
from gate.lifecycle.ownership import recognise

STEP = Step("tool", "apply", "1.0.0/abc")


def pod(name: str, uid: str, shape: str = "s1") -> StagePod:
    # Every pod here "succeeded" its step: what a forged status or a planted pod would show.
    return StagePod(name=name, kind="stages", phase="succeeded", steps=(STEP,), done=1, round=1, uid=uid, shape=shape)


def test_only_a_recorded_uid_with_its_recorded_shape_is_the_operators() -> None:
    recorded = {"ng-apply-1": PodRecord(uid="u-1", shape="s1"), "ng-apply-2": PodRecord(uid="u-2", shape="s1")}
    pods = {
        "ng-apply-1": pod("ng-apply-1", "u-1"),                 # the operator's, unchanged
        "ng-apply-2": pod("ng-apply-2", "u-9"),                 # its name, another pod (deleted and planted)
        "ng-apply-3": pod("ng-apply-3", "u-3"),                 # the labels and annotations only
        "ng-apply-4": pod("ng-apply-4", ""),                    # no uid at all
    }
    seen = recognise(pods, recorded)
    assert list(seen.ours) == ["ng-apply-1"]
    why = {f.pod.name: f.why for f in seen.foreign}
    assert "uid u-9, the operator's was u-2" in why["ng-apply-2"]
    assert "did not record creating" in why["ng-apply-3"]
    assert "uid none" in why["ng-apply-4"] or "did not record" in why["ng-apply-4"]
    changed = recognise({"ng-apply-1": pod("ng-apply-1", "u-1", shape="s2")}, recorded)
    assert changed.ours == {} and "changed since the operator created it" in changed.foreign[0].why


def test_without_a_record_no_pod_is_the_operators_and_the_record_survives_its_round_trip() -> None:
    assert recognise({"p": pod("p", "u-1")}, {}).ours == {}
    state = NodeGateState(status="in-progress", pods={"p": PodRecord(uid="u-1", shape="s1")})
    again = load_state(state.dump())
    assert again.pods == state.pods and list(recognise({"p": pod("p", "u-1")}, again.pods).ours) == ["p"]
