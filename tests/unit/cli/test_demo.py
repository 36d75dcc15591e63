"""The demo's story rests on two facts about its manifests: the pool sizes and where the failure lands."""

from __future__ import annotations

import pytest

from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.cli.demo import DEMO_LABEL, FAILING_POOL, POOL_LABEL, failing_node, manifest, pool_sizes
from gate.cli.errors import CliError
from gate.rollout import NodeSnapshot, simulate


def test_sixty_nodes_make_a_small_canary_and_two_even_pools() -> None:
    assert pool_sizes(60) == {"canary": 4, "pool-a": 28, "pool-b": 28}
    assert pool_sizes(12) == {"canary": 2, "pool-a": 5, "pool-b": 5}
    with pytest.raises(CliError):
        pool_sizes(5)


@pytest.mark.parametrize("nodes", [12, 60, 200])
def test_the_planted_failure_lands_in_the_second_batch_of_its_pool(nodes: int) -> None:
    gate = NodeGate.model_validate(manifest("gate.yaml"))
    policy = DeploymentPolicy.model_validate(manifest("policy.yaml"))
    snapshots = [NodeSnapshot(f"{pool}-{i}", {DEMO_LABEL: "true", POOL_LABEL: pool})
                 for pool, count in pool_sizes(nodes).items() for i in range(count)]
    pool = [s.name for s in snapshots if s.labels[POOL_LABEL] == FAILING_POOL]
    bad = failing_node(pool)

    [batches] = [c.batches for c in simulate(gate, policy, snapshots).compartments if c.name == FAILING_POOL]
    assert bad in batches[1].nodes, "the first batch must succeed and the second fail"
    assert all(len(c.batches) > 1 for c in simulate(gate, policy, snapshots).compartments if c.matched)


def test_the_bad_spec_differs_from_the_good_one_only_in_the_image_tag() -> None:
    bad, good = manifest("bad-gate.yaml"), manifest("gate.yaml")
    image = bad["spec"]["packages"]["sysctl-tuning"]["image"]
    assert image == good["spec"]["packages"]["sysctl-tuning"]["image"] + ":2.0.0"
    assert bad["metadata"]["name"] == good["metadata"]["name"]
