"""`Stager.pod_for`: the staging pod the node reconcile hands the decider, from the operator's cache."""

from __future__ import annotations

from typing import cast

from gate.api.state import NodeGateState
from gate.controller.pods import staging_pod, unstage_pod
from gate.controller.staging import Stager
from gate.controller.world import World
from gate.kube.client import KubeClient
from gate.lifecycle.serving import Serving, ServingCatalog
from gate.lifecycle.staging import staging_pod_name, staging_steps, undo_pod_name
from tests.unit.controller.test_pods import SETTINGS
from tests.unit.lifecycle.test_machine import gate

CATALOG = ServingCatalog({"k": Serving("1.0.0", {"apply": ("write",)}, frozenset({"apply"}))})


def test_a_staging_pod_whose_undo_exists_is_not_the_rounds_staging() -> None:
    g = gate({"k": {"version": "1.0.0", "image": "registry.example.com/k", "interrupt": {"type": "reboot"}}})
    world = World(SETTINGS, cast(KubeClient, None))  # no watch runs: the cache is filled by hand
    stager = Stager(SETTINGS, world, cast(KubeClient, None), CATALOG)
    state = NodeGateState()
    steps = staging_steps(g, state, CATALOG)
    name = staging_pod_name(g.name, "n1", steps)
    assert stager.pod_for(g, state, "n1") is None
    pod = staging_pod(g, "n1", name, steps, SETTINGS)
    pod["metadata"] |= {"namespace": SETTINGS.namespace, "resourceVersion": "1"}
    world.pods.observe(pod)
    view = stager.pod_for(g, state, "n1")
    assert view is not None and view.name == name and view.generation == 1  # the cache keeps the annotation
    # Its undo runs or ran: what it staged is being taken back, so the round never counts it as staged.
    undo = unstage_pod(pod, undo_pod_name(name))
    undo["metadata"] |= {"resourceVersion": "2"}
    world.pods.observe(undo)
    assert stager.pod_for(g, state, "n1") is None
