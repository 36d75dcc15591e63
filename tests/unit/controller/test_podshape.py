"""What a stage pod runs, as one comparable value (gate.controller.podshape): a pod adopted under the operator's
name must run exactly what it builds, and a recorded pod's digest shows any later change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gate.api import keys
from gate.api.common import Obj
from gate.controller.pods import stage_pod, stage_pod_fields, stage_pod_view
from gate.controller.podshape import SHAPE_FIELD, SIGNATURE_ANNOTATION, built_digest, shape_differences, shape_digest
from tests.unit.controller.test_pods import SETTINGS, gate, request


def built() -> Obj:
    return stage_pod(gate(), "node-7", request(("base", "apply"), ("tuned", "apply")), SETTINGS)


def as_stored(pod: Obj) -> Obj:
    """The pod as the API server returns it: uid, defaults filled in, annotations of others added."""
    out = copy.deepcopy(pod)
    out["metadata"].update(uid="u-1", resourceVersion="5", creationTimestamp="2026-12-05T10:00:00Z")
    out["metadata"]["annotations"]["example.com/note"] = "someone's"
    spec = out["spec"]
    spec.update(schedulerName="default-scheduler", securityContext={}, priority=0, enableServiceLinks=True)
    for c in spec["initContainers"] + spec["containers"]:
        c.update(imagePullPolicy=c.get("imagePullPolicy", "IfNotPresent"), resources={},
                 terminationMessagePath=c.get("terminationMessagePath", "/dev/termination-log"),
                 terminationMessagePolicy=c.get("terminationMessagePolicy", "File"))
    for v in spec["volumes"]:
        for kind in ("configMap", "downwardAPI"):
            if kind in v:
                v[kind]["defaultMode"] = 420
        for item in (v.get("downwardAPI") or {}).get("items") or []:
            item["fieldRef"]["apiVersion"] = "v1"
    return out


def test_the_pod_as_stored_runs_what_the_operator_built() -> None:
    pod = built()
    assert shape_differences(pod, as_stored(pod)) == []
    # The cache keeps the digest of the whole pod; the view carries it with the uid.
    view = stage_pod_view(stage_pod_fields(as_stored(pod)))
    assert (view.uid, view.shape) == ("u-1", shape_digest(as_stored(pod)))
    assert stage_pod_fields(stage_pod_fields(as_stored(pod))) == stage_pod_fields(as_stored(pod))
    # What a staging pod's signature covers is the same for the manifest and the pod stored from it, and leaves
    # the signature itself out.
    signed = as_stored(pod)
    signed["metadata"]["annotations"][SIGNATURE_ANNOTATION] = "k1:00"
    assert built_digest(pod) == built_digest(as_stored(pod)) == built_digest(signed)


@pytest.mark.parametrize(("change", "named"), [
    (lambda p: p["spec"]["containers"][0].update(image="evil.example.com/x"), "containers[0].image"),
    (lambda p: p["spec"]["containers"][1]["args"].append("--skip-check"), "containers[1].args"),
    (lambda p: p["spec"]["initContainers"][1].update(command=["sh", "-c", "id"]), "initContainers[1].command"),
    (lambda p: p["spec"]["containers"][0]["env"].append({"name": "LD_PRELOAD", "value": "/x.so"}),
     "containers[0].env"),
    (lambda p: p["spec"]["containers"][0].update(envFrom=[{"configMapRef": {"name": "x"}}]), "containers[0].envFrom"),
    (lambda p: p["spec"]["containers"][0]["volumeMounts"][0].update(subPath="etc"),
     "containers[0].volumeMounts[0].subPath"),
    (lambda p: p["spec"]["containers"].append({"name": "sidecar", "image": "x"}), "containers"),
    (lambda p: p["spec"].update(ephemeralContainers=[{"name": "debug", "image": "x"}]), "ephemeralContainers"),
    (lambda p: p["spec"].update(nodeName="node-8"), "nodeName"),
    (lambda p: p["spec"].update(hostIPC=True), "hostIPC"),
    (lambda p: p["spec"]["volumes"][0]["hostPath"].update(path="/etc"), "volumes[0].hostPath.path"),
    (lambda p: p["metadata"]["annotations"].update({"nodegate.io/steps": "[]"}), "annotations.nodegate.io/steps"),
    (lambda p: p["metadata"]["annotations"].update({"nodegate.io/extra": "1"}), "annotations.nodegate.io/extra"),
    (lambda p: p["metadata"]["labels"].update({keys.STAGE_KIND_LABEL: "interrupt"}),
     f"labels.{keys.STAGE_KIND_LABEL}"),
])
def test_a_pod_that_runs_anything_else_differs_naming_the_field(change: Any, named: str) -> None:
    pod = built()
    live = as_stored(pod)
    before = shape_digest(live)
    change(live)
    assert named in shape_differences(pod, live)
    assert shape_digest(live) != before, "the recorded digest shows the change on a live pod too"
    assert built_digest(live) != built_digest(pod), "a staging pod's signature no longer covers it"


def _bumped(pod: Obj) -> None:
    pod["spec"]["containers"][1]["args"].append("--skip-check")
    pod["metadata"]["generation"] += 1  # as the API server does for any change of a pod's spec (1.34 on)


@pytest.mark.parametrize("change", [
    lambda p: p["spec"]["containers"][0].update(image="evil.example.com/x"),
    lambda p: p["spec"]["initContainers"][1].update(image="evil.example.com/x"),
    lambda p: p["spec"].update(ephemeralContainers=[{"name": "debug", "image": "x"}]),
    lambda p: p["spec"].update(activeDeadlineSeconds=1),
    lambda p: p["metadata"]["annotations"].update({"nodegate.io/steps": "[]"}),
    lambda p: p["metadata"]["labels"].update({keys.STAGE_KIND_LABEL: "interrupt"}),
    _bumped,
    lambda p: p["metadata"].update(uid="u-2"),  # another pod under the name
])
def test_the_cache_takes_the_digest_again_only_when_the_shape_may_have_changed(change: Any) -> None:
    """The cache keeps a pod's digest from its copy before when only its status (or a key of others) changed:
    the kubelet's updates. A field a live pod's spec may change on any Kubernetes version (an image, an
    ephemeral container, the deadline) is compared itself, not through the generation; a `nodegate.io/` label
    or annotation, another generation or another uid, and the digest is taken again."""
    live = as_stored(built())
    live["metadata"]["generation"] = 1
    cached = stage_pod_fields(copy.deepcopy(live))
    marked = {**cached, SHAPE_FIELD: "the copy before's"}  # shows when the digest is taken from it

    update = copy.deepcopy(live)  # the kubelet's status update, and a label of someone else's
    update["metadata"].update(resourceVersion="6", labels={**update["metadata"]["labels"], "example.com/team": "x"})
    update["status"] = {"phase": "Running", "containerStatuses": [{"name": "apply-base", "state": {"running": {}}}]}
    assert stage_pod_fields(copy.deepcopy(update), marked)[SHAPE_FIELD] == "the copy before's"

    change(update)
    assert stage_pod_fields(copy.deepcopy(update), marked)[SHAPE_FIELD] == shape_digest(update)


def test_annotations_and_labels_of_others_and_the_status_change_no_shape() -> None:
    live = as_stored(built())
    before = shape_digest(live)
    live["metadata"]["labels"]["example.com/team"] = "x"
    live["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "apply-tuned", "state": {
        "terminated": {"exitCode": 0}}}]}
    assert shape_digest(live) == before


def test_an_empty_list_the_api_server_leaves_out_is_no_difference() -> None:
    from tests.unit.controller.test_pods import INTERRUPT

    pod = stage_pod(gate(), "node-7", INTERRUPT, SETTINGS)
    assert pod["spec"]["containers"][0]["env"] == []
    stored = as_stored(pod)
    del stored["spec"]["containers"][0]["env"]
    assert shape_differences(pod, stored) == []
    stored["spec"]["containers"][0]["env"] = [{"name": "BASH_ENV", "value": "/tmp/x"}]
    assert shape_differences(pod, stored) == ["containers[0].env"]


def test_node_facts_taken_a_moment_earlier_do_not_stop_the_adoption_but_change_the_recorded_digest() -> None:
    """Found in the merged suite: two gates working on one node, the record write of the first lost the race,
    and by the next look the other gate's status label had changed the node's facts; the operator's own pod
    then read as not its own for a resync period. Adoption compares what runs; the recorded digest still
    covers the facts the pod was created with."""
    from gate.api.facts import FACTS_ANNOTATION

    pod = built()
    live = as_stored(pod)
    before = shape_digest(live)
    assert FACTS_ANNOTATION in live["metadata"]["annotations"]
    live["metadata"]["annotations"][FACTS_ANNOTATION] = '{"node": "node-7", "labels": {"nodegate.io/status.b": "x"}}'
    assert shape_differences(pod, live) == []
    assert shape_digest(live) != before
    live["spec"]["containers"][0]["image"] = "evil.example.com/x"
    assert shape_differences(pod, live) == ["containers[0].image"]
