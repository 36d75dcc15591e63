"""The operator hands each stage pod the facts of its node: labels, annotations, place in the rollout."""

from __future__ import annotations

from gate.api.common import Obj
from gate.api.facts import FACTS_ANNOTATION, OperatorFacts
from gate.controller.pods import FACTS_DIR, FACTS_FILE
from gate.kube.cache import WatchCache
from gate.kube.client import NODES, PODS
from gate.rollout import order_key
from tests.integration.operator.conftest import NAMESPACE, Scenario


async def test_each_stage_pod_carries_its_nodes_labels_annotations_and_batch(scenario: Scenario) -> None:
    seen: dict[str, Obj] = {}

    def record(kind: str, pod: Obj) -> None:
        if (pod["metadata"].get("annotations") or {}).get("nodegate.io/gate-name") == scenario.name:
            seen.setdefault(pod["metadata"]["name"], pod)

    pods = WatchCache(scenario.kube, PODS, namespace=NAMESPACE)
    pods.subscribe(record)
    await pods.start()
    try:
        nodes = await scenario.add_nodes(2, {"pool": "gpu"})
        first, second = sorted(nodes, key=order_key)
        await scenario.kube.patch(NODES, second, {"metadata": {"annotations": {"example.com/rack": "r7"}}})
        await scenario.apply_gate({"tool": {"version": "1.0.0", "image": "registry.example.com/tool"}},
                                  interruptionBudget={"count": 1})
        await scenario.wait_ready()
    finally:
        await pods.stop()

    facts: dict[str, OperatorFacts] = {}
    for pod in seen.values():
        facts[pod["spec"]["nodeName"]] = OperatorFacts.model_validate_json(
            pod["metadata"]["annotations"][FACTS_ANNOTATION])
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--node-facts") + 1] == f"{FACTS_DIR}/{FACTS_FILE}"
    assert set(facts) == {first, second}
    for node in nodes:
        assert facts[node].node == node
        assert facts[node].labels["pool"] == "gpu" and facts[node].labels["test"] == scenario.name
        assert not any(k.startswith("nodegate.io/state.") for k in facts[node].annotations)
    assert facts[second].annotations["example.com/rack"] == "r7"
    # One node at a time: the first in pick order is batch 1, the other batch 2 of the same compartment.
    first_place, second_place = facts[first].rollout, facts[second].rollout
    assert (first_place.compartment, first_place.batch, first_place.round) == ("__default__", 1, 1)
    assert (second_place.compartment, second_place.batch, second_place.round) == ("__default__", 2, 1)
