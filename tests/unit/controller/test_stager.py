"""The stager (`gate.controller.staging`) on the operator's cache: which staging pod the node reconcile hands
the decider (`Stager.pod_for`), and which pods of the staging kinds are the operator's (its signature of what
they run, `gate.api.records.sign_pod`)."""

from __future__ import annotations

import asyncio
from typing import cast

from gate.api.common import Obj
from gate.api.records import KeyRing
from gate.api.state import NodeGateState
from gate.controller.pods import GENERATION_ANNOTATION, staging_pod, unstage_pod
from gate.controller.podshape import SIGNATURE_ANNOTATION
from gate.controller.signing import Signer
from gate.controller.staging import Stager
from gate.controller.world import World
from gate.kube.client import KubeClient
from gate.lifecycle.serving import Serving, ServingCatalog
from gate.lifecycle.staging import GateStaging, staging_pod_name, staging_steps, undo_pod_name
from tests.unit.controller.test_pods import SETTINGS
from tests.unit.lifecycle.test_machine import gate

CATALOG = ServingCatalog({"k": Serving("1.0.0", {"apply": ("write",)}, frozenset({"apply"}))})
G = gate({"k": {"version": "1.0.0", "image": "registry.example.com/k", "interrupt": {"type": "reboot"}}})


def _stager() -> tuple[World, Stager]:
    world = World(SETTINGS, cast(KubeClient, None))  # no watch runs: the cache is filled by hand
    world.signer = Signer(KeyRing({"k1": b"k" * 32}), lambda _: None)
    return world, Stager(SETTINGS, world, cast(KubeClient, None), CATALOG)


def _observe(world: World, pod: Obj, rv: str, uid: str) -> None:
    pod["metadata"] |= {"namespace": SETTINGS.namespace, "resourceVersion": rv, "uid": uid}
    world.pods.observe(pod)


def _staging(stager: Stager, *, signed: bool = True) -> Obj:
    steps = staging_steps(G, NodeGateState(), CATALOG)
    pod = staging_pod(G, "n1", staging_pod_name(G.name, "n1", steps), steps, SETTINGS)
    return stager._signed(pod) if signed else pod


def test_a_staging_pod_whose_undo_exists_is_not_the_rounds_staging() -> None:
    world, stager = _stager()
    state = NodeGateState()
    assert stager.pod_for(G, state, "n1") is None
    pod = _staging(stager)
    _observe(world, pod, "1", "u1")
    view = stager.pod_for(G, state, "n1")
    assert view is not None and view.name == pod["metadata"]["name"] and view.generation == 1  # the annotation
    # Its undo runs or ran: what it staged is being taken back, so the round never counts it as staged.
    undo = stager._signed(unstage_pod(pod, undo_pod_name(pod["metadata"]["name"])))
    _observe(world, undo, "2", "u2")
    assert stager.pod_for(G, state, "n1") is None


def test_a_staging_pod_not_signed_as_it_is_is_never_read_and_is_deleted_by_uid() -> None:
    world, stager = _stager()
    state = NodeGateState()
    planted = _staging(stager, signed=False)
    _observe(world, planted, "1", "planted")
    assert stager.pod_for(G, state, "n1") is None
    writes = asyncio.run(stager.plan(G, GateStaging()))
    [foreign] = writes.foreign
    assert (foreign.name, foreign.uid, foreign.gate, foreign.node) == (planted["metadata"]["name"], "planted",
                                                                       G.name, "n1")
    assert "no signature" in foreign.why and not writes.delete and not writes.create
    # The operator's own pod, its generation rewritten since: its signature no longer matches.
    own = _staging(stager)
    own["metadata"]["annotations"][GENERATION_ANNOTATION] = "7"
    _observe(world, own, "2", "own")
    assert stager.pod_for(G, state, "n1") is None
    [foreign] = asyncio.run(stager.plan(G, GateStaging())).foreign
    assert foreign.uid == "own" and "does not match" in foreign.why
    # Signed with a key the ring does not hold (a rotation that dropped it, or made up).
    other = _staging(stager)
    other["metadata"]["annotations"][SIGNATURE_ANNOTATION] = "k0:" + "0" * 64
    _observe(world, other, "3", "other")
    [foreign] = asyncio.run(stager.plan(G, GateStaging())).foreign
    assert "'k0'" in foreign.why
    # Signed as it is: the operator's.
    _observe(world, _staging(stager), "4", "good")
    assert not asyncio.run(stager.plan(G, GateStaging())).foreign
    assert stager.pod_for(G, state, "n1") is not None


def test_an_undo_pod_carries_a_signature_of_its_own() -> None:
    _, stager = _stager()
    pod = _staging(stager)
    copied = unstage_pod(pod, undo_pod_name(pod["metadata"]["name"]))
    assert SIGNATURE_ANNOTATION not in copied["metadata"]["annotations"]  # the staging pod's is not carried over
    signed = stager._signed(copied)
    assert stager._refusal(signed) is None and stager._refusal(pod) is None
    signed["spec"]["containers"][0]["args"][-1] = "serving"  # what it runs changed: no longer what was signed
    assert stager._refusal(signed) is not None
