"""Where the rules' `Facts` come from: the webhook's watch caches, and live reads where a stale cache
could let a wrong answer through.

* Node CREATE (the hot path) reads the readinessTaint gates from the NodeGate cache: no API call.
* "Does this DeploymentPolicy exist?" asks the cache, and on a miss the API server (a policy created a
  moment ago may not have reached the cache yet; a false denial would be wrong).
* "Which gates reference this policy, with which packages?" (any change of a policy) and "where is this
  package still installed?" (UPDATE removing a package) are rare and must not miss a write from a
  moment ago: always live.
* The pod of an exec, attach or port-forward in the operator's namespace: read live (a stage pod is
  created a moment before anyone could exec into it; a cache would miss it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from gate.admission.rules import policy as policy_rules
from gate.admission.rules.facts import DEFAULT_OPERATOR_NAMESPACE, Facts, Lookups, ReadinessGate
from gate.api.keys import DISABLED_ANNOTATION, state_annotation, status_label
from gate.kube.cache import WatchCache
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.kube.errors import NotFound

log = logging.getLogger(__name__)


class ClusterFacts:
    def __init__(self, client: KubeClient, *, operator_username: str,
                 operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE) -> None:
        self.client = client
        self.operator_username = operator_username
        self.operator_namespace = operator_namespace
        self.gates = WatchCache(client, NODEGATES)
        self.policies = WatchCache(client, POLICIES)

    async def start(self) -> None:
        await asyncio.gather(self.gates.start(), self.policies.start())

    async def stop(self) -> None:
        await asyncio.gather(self.gates.stop(), self.policies.stop())

    @property
    def synced(self) -> bool:
        return self.gates.synced and self.policies.synced

    async def facts(self, lookups: Lookups) -> Facts:
        if lookups.empty:
            return Facts(operator_username=self.operator_username, operator_namespace=self.operator_namespace)
        existing = frozenset(await _gather_existing(self, lookups.policies))
        referencing: tuple[str, ...] = ()
        packages: dict[str, tuple[str, ...]] = {}
        if lookups.gates_referencing:
            gates, _ = await self.client.list(NODEGATES)
            referencing = tuple(policy_rules.referencing_gates(lookups.gates_referencing, gates))
            packages = policy_rules.referencing_packages(lookups.gates_referencing, gates)
        pod = None
        # Only NodeGate's namespace holds its pods (and only there may the webhook read pods).
        if lookups.pod and lookups.pod[0] == self.operator_namespace:
            namespace, name = lookups.pod
            try:
                pod = await self.client.get(PODS, name, namespace)
            except NotFound:
                pod = None
        installed: dict[str, tuple[str, ...]] = {}
        if lookups.installed:
            installed = await self._installed(*lookups.installed)
        readiness = readiness_gates(self.gates.items()) if lookups.readiness_gates else ()
        return Facts(existing_policies=existing, referencing_gates=referencing, referencing_packages=packages,
                     installed_on=installed, readiness_gates=readiness, operator_username=self.operator_username,
                     operator_namespace=self.operator_namespace, pod=pod)

    async def _policy_exists(self, name: str) -> bool:
        if self.policies.get(name) is not None:
            return True
        try:
            await self.client.get(POLICIES, name)
            return True
        except NotFound:
            return False

    async def _installed(self, gate: str, packages: frozenset[str]) -> dict[str, tuple[str, ...]]:
        # Nodes the gate touched carry its status label; the state annotation says what is installed.
        nodes, _ = await self.client.list(NODES, label_selector=status_label(gate))
        found: dict[str, list[str]] = {p: [] for p in packages}
        for node in nodes:
            annotation = (node.get("metadata", {}).get("annotations") or {}).get(state_annotation(gate))
            present = installed_packages(annotation)
            for package in packages:
                if present is None or package in present:
                    found[package].append(str(node["metadata"]["name"]))
        return {p: tuple(sorted(n)) for p, n in found.items() if n}


async def _gather_existing(source: ClusterFacts, names: frozenset[str]) -> list[str]:
    answers = await asyncio.gather(*(source._policy_exists(n) for n in sorted(names)))
    return [n for n, yes in zip(sorted(names), answers, strict=True) if yes]


def readiness_gates(gates: list[dict[str, Any]]) -> tuple[ReadinessGate, ...]:
    out = []
    for gate in gates:
        spec = gate.get("spec")
        meta = gate.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if (isinstance(spec, dict) and spec.get("readinessTaint") is True and not meta.get("deletionTimestamp")
                and annotations.get(DISABLED_ANNOTATION) != "true"):  # a disabled gate taints no joining node
            out.append(ReadinessGate(str(meta.get("name")), spec.get("nodeSelector")))
    return tuple(out)


def installed_packages(annotation: str | None) -> set[str] | None:
    """Packages a node's `state.<gate>` annotation records as installed (its `installed` map, see
    gate.api.state); None when it cannot be read: then every package counts as installed there, since
    refusing a removal is the mistake a person can recover from. No annotation: nothing installed."""
    if not annotation:
        return set()
    try:
        data = json.loads(annotation)
    except (ValueError, RecursionError):  # a hand-edited value nested deeper than the parser goes
        return None
    if not isinstance(data, dict):
        return None
    installed = data.get("installed", {})
    return {str(name) for name in installed} if isinstance(installed, dict) else None
