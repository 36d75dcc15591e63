"""Chart values that follow the fleet: fleet.nodes and fleet.packages size the operator from the
costs bench/rollout measured, operator.resources overrides them, and a LimitRange gives package pods
that state no resources the defaults of the agent (rendered here, applied in the dev cluster below).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest

from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.pods import stage_pod
from gate.controller.settings import OperatorSettings
from gate.devcluster.cluster import DevCluster
from gate.kube.client import NAMESPACES, NODES, PODS, SERVICEACCOUNTS, KubeClient, resource_for
from gate.kube.errors import ApiError
from gate.lifecycle.node import PodRequest, Step
from tests.chart.conftest import find, rendered
from tests.conftest import unique

# bench/README.md, bench.rollout with 3 packages per node
BENCH = {1000: {"rss_mib": 116.0, "cpu_seconds": 34.9}, 10000: {"rss_mib": 280.4, "cpu_seconds": 559.9}}


def operator_resources(values: Obj) -> Obj:
    deployment = find(rendered(values), "Deployment", "nodegate-operator")
    resources: Obj = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    return resources


def expected(nodes: int, packages: int) -> Obj:
    """The formula of values.yaml (key fleet), written out again independently of the template."""
    s = nodes * packages / 3
    memory = math.ceil((98 + 0.01827 * s) / 16) * 16
    cpu = max(100, math.ceil(s * 56 / 600 / 10) * 10)
    return {"requests": {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}, "limits": {"memory": f"{max(512, 2 * memory)}Mi"}}


@pytest.mark.parametrize(("nodes", "packages"), [(1, 1), (100, 3), (1000, 3), (5000, 3), (5000, 6), (20000, 3),
                                                 (50000, 10)])
def test_fleet_values_set_the_operators_requests_and_limits_by_the_documented_formula(nodes: int,
                                                                                       packages: int) -> None:
    assert operator_resources({"fleet": {"nodes": nodes, "packages": packages}}) == expected(nodes, packages)


def test_the_defaults_are_the_benchmarks_1000_nodes_and_the_documented_examples_hold() -> None:
    assert operator_resources({}) == expected(1000, 3) == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                           "limits": {"memory": "512Mi"}}
    assert operator_resources({"fleet": {"nodes": 5000}}) == {"requests": {"cpu": "470m", "memory": "192Mi"},
                                                              "limits": {"memory": "512Mi"}}
    assert operator_resources({"fleet": {"nodes": 20000}}) == {"requests": {"cpu": "1870m", "memory": "464Mi"},
                                                               "limits": {"memory": "928Mi"}}


@pytest.mark.parametrize("nodes", sorted(BENCH))
def test_the_memory_request_covers_the_measured_peak_and_the_limit_leaves_room(nodes: int) -> None:
    resources = operator_resources({"fleet": {"nodes": nodes, "packages": 3}})
    request = int(resources["requests"]["memory"].removesuffix("Mi"))
    limit = int(resources["limits"]["memory"].removesuffix("Mi"))
    assert BENCH[nodes]["rss_mib"] <= request < BENCH[nodes]["rss_mib"] + 16
    assert limit >= 2 * request
    # the CPU request is the measured per-node CPU of rolling the whole fleet in ten minutes
    cpu = int(resources["requests"]["cpu"].removesuffix("m"))
    per_node_ms = BENCH[nodes]["cpu_seconds"] * 1000 / nodes
    assert cpu >= max(100, nodes * per_node_ms / 600 - 10)


def test_explicit_operator_resources_replace_the_computed_ones_whole() -> None:
    mine = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "4Gi", "cpu": "4"}}
    assert operator_resources({"operator": {"resources": mine}, "fleet": {"nodes": 50000}}) == mine


def test_fleet_values_are_checked() -> None:
    with pytest.raises(Exception, match="/fleet/nodes"):
        rendered({"fleet": {"nodes": 0}})
    with pytest.raises(Exception, match="/fleet/packages"):
        rendered({"fleet": {"packages": 1.5}})


def test_the_limitrange_gives_containers_without_resources_the_agents_defaults_in_the_release_namespace() -> None:
    limit_range = find(rendered({}, namespace="ops"), "LimitRange", "nodegate-package")
    assert limit_range["metadata"]["namespace"] == "ops"
    assert limit_range["spec"]["limits"] == [{"type": "Container", "defaultRequest": {"cpu": "50m", "memory": "64Mi"},
                                              "default": {"memory": "1Gi"}}]
    # defaults only: a min or max would bind the chart's own pods, which state their resources
    assert not {"min", "max", "maxLimitRequestRatio"} & set(limit_range["spec"]["limits"][0])
    for obj in rendered({}):
        if obj["kind"] in ("Deployment", "Job"):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert not [o for o in rendered({"limitRange": {"enabled": False}}) if o["kind"] == "LimitRange"]


# -- in the dev cluster: the API server's LimitRanger fills a real stage pod -------------------------------

@pytest.fixture
async def package_namespace(cluster: DevCluster, kube: KubeClient) -> AsyncIterator[str]:
    """A namespace holding the chart's LimitRange (rendered for it) and the package ServiceAccount."""
    namespace = unique("ng-lr")
    await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    try:
        limit_range = find(rendered({}, namespace=namespace), "LimitRange", "nodegate-package")
        await kube.create(resource_for(limit_range), limit_range)
        await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                            "metadata": {"name": "nodegate-package", "namespace": namespace}})
        yield namespace
    finally:
        await kube.delete(NAMESPACES, namespace)


def _request(name: str, package: str) -> PodRequest:
    return PodRequest(name=unique(name), kind="stages", steps=(Step(package, "apply", "1.0.0", version="1.0.0"),))


async def test_the_limitrange_fills_a_stage_pod_that_states_no_resources_and_leaves_a_packages_own(
        cluster: DevCluster, kube: KubeClient, package_namespace: str) -> None:
    settings = OperatorSettings(namespace=package_namespace)
    node = (await kube.list(NODES))[0][0]["metadata"]["name"]
    gate = NodeGate.model_validate({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": unique("lr"), "uid": "u-1"},
        "spec": {"packages": {
            "plain": {"version": "1.0.0", "image": "registry.example.com/plain"},
            "sized": {"version": "1.0.0", "image": "registry.example.com/sized",
                      "resources": {"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"memory": "2Gi"}}}}}})
    pods = {}
    for package in ("plain", "sized"):
        pod = stage_pod(gate, node, _request(f"lr-{package}", package), settings)
        pod["metadata"].pop("ownerReferences")  # no NodeGate object behind this gate: nothing to own the pod
        pods[package] = await kube.create(PODS, pod)  # as the API server stored it, defaults filled in
    plain = pods["plain"]["spec"]
    lr_defaults = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}
    assert plain["containers"][0]["name"] == "apply-plain" and plain["containers"][0]["resources"] == lr_defaults
    assert plain["initContainers"][0]["name"] == "payload-plain"
    assert plain["initContainers"][0]["resources"] == lr_defaults
    annotation = pods["plain"]["metadata"]["annotations"]["kubernetes.io/limit-ranger"]
    assert "LimitRanger plugin set" in annotation and "container apply-plain" in annotation
    sized = pods["sized"]["spec"]
    assert sized["containers"][0]["resources"] == {"requests": {"cpu": "250m", "memory": "300Mi"},
                                                   "limits": {"memory": "2Gi"}}


async def test_a_package_requesting_more_memory_than_the_default_limit_without_a_limit_of_its_own_is_refused(
        cluster: DevCluster, kube: KubeClient, package_namespace: str) -> None:
    """What docs/install.md warns of: the LimitRange fills in its 1Gi limit, below the request."""
    settings = OperatorSettings(namespace=package_namespace)
    node = (await kube.list(NODES))[0][0]["metadata"]["name"]
    gate = NodeGate.model_validate({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": unique("lr"), "uid": "u-2"},
        "spec": {"packages": {"big": {"version": "1.0.0", "image": "registry.example.com/big",
                                      "resources": {"requests": {"memory": "2Gi"}}}}}})
    pod = stage_pod(gate, node, _request("lr-big", "big"), settings)
    pod["metadata"].pop("ownerReferences")
    with pytest.raises(ApiError) as refused:
        await kube.create(PODS, pod)
    # The operator fails the node with this message (reason PodRefused: gate.lifecycle.round.write_refused).
    assert refused.value.status in (403, 422)
    assert "must be less than or equal to memory limit" in refused.value.message, refused.value.message
    pods, _ = await kube.list(PODS, namespace=package_namespace)
    assert [p for p in pods if p["metadata"]["name"] == pod["metadata"]["name"]] == []
