"""What the cluster commands read: the snapshot a status is computed from, one gate, one node.

Shared by the commands of `gate.cli.status`, `plan`, `pause`, `delete`, `node_list`, `rerun`, `reset`,
`disable`, `nodes` and `logs`, and by the demo. Reads only: the operator is the only writer of node
state and gate status (see `gate.cli.fleet`). A missing gate or node is a `CliError` naming it; a
missing API (the CRDs not installed) is left to `gate.cli.kubectx.api_errors` to explain.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from pydantic import ValidationError

from gate.api import keys
from gate.api.common import LabelSelector, Obj
from gate.cli import stagepods
from gate.cli.errors import CliError
from gate.cli.kubectx import missing_api
from gate.cli.report import GateReport, Snapshot, build_reports
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient, Resource
from gate.kube.errors import Forbidden, NotFound


async def _items(client: KubeClient, res: Resource, namespace: str | None = None,
                 label_selector: str | None = None) -> list[Obj]:
    items, _ = await client.list(res, namespace, label_selector=label_selector)
    return items


async def fetch_snapshot(client: KubeClient, namespace: str, gate: str | None = None) -> Snapshot:
    """One consistent-enough read of everything the status needs (four lists, in parallel)."""

    async def pods() -> list[Obj] | None:
        try:
            return await _items(client, PODS, namespace, stagepods.SELECTOR)
        except Forbidden:
            return None  # the status still works, without the names of running stages

    gates, policies, nodes, pod_items = await asyncio.gather(
        _items(client, NODEGATES), _items(client, POLICIES), _items(client, NODES), pods())
    if gate is not None and not any(g["metadata"]["name"] == gate for g in gates):
        raise CliError(f"no NodeGate named {gate} (`kubectl get ng` lists them)")
    return Snapshot(gates=gates, policies={p["metadata"]["name"]: p for p in policies}, nodes=nodes,
                    pods=pod_items or [], pods_visible=pod_items is not None,
                    workloads=await _protected_pods(client, gates), namespace=namespace)


def protected_queries(gates: list[Obj]) -> list[str]:
    """The label selector queries of the gates' podNonInterruptLabels, each once."""
    queries = set()
    for raw in gates:
        selector = (raw.get("spec") or {}).get("podNonInterruptLabels")
        with contextlib.suppress(ValidationError):
            parsed = LabelSelector.model_validate(selector) if selector else None
            if parsed is not None and not parsed.is_empty():
                queries.add(parsed.query())
    return sorted(queries)


async def _protected_pods(client: KubeClient, gates: list[Obj]) -> list[Obj]:
    """The pods of every namespace that some gate's podNonInterruptLabels match: one list per distinct
    selector, filtered by the API server. None when the reader may not list pods: the status then
    cannot tell which nodes wait for protected pods, as the operator can."""
    found: dict[str, Obj] = {}
    for query in protected_queries(gates):
        try:
            for pod in await _items(client, PODS, label_selector=query):
                found[f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"] = pod
        except Forbidden:
            return []
    return list(found.values())


def reports_of(snapshot: Snapshot, gate: str | None) -> list[GateReport]:
    """The reports of every gate in `snapshot` (or only `gate`), as of now."""
    return build_reports(snapshot, datetime.now(UTC), [gate] if gate else None)


async def get_gate(client: KubeClient, name: str) -> Obj:
    return await _get_named(client, NODEGATES, name, f"no NodeGate named {name} (`kubectl get ng` lists them)")


async def get_node(client: KubeClient, name: str) -> Obj:
    return await _get_named(client, NODES, name, f"no node named {name}")


async def _get_named(client: KubeClient, res: Resource, name: str, missing: str) -> Obj:
    """The object, or CliError(`missing`) when there is no such object (a missing API is raised as is)."""
    try:
        return await client.get(res, name)
    except NotFound as exc:
        if missing_api(exc):
            raise
        raise CliError(missing) from None


def states_on(node: Obj) -> dict[str, str]:
    """gate name -> raw state annotation, for every gate that recorded progress on the node."""
    out = {}
    for key, value in (node["metadata"].get("annotations") or {}).items():
        gate = keys.gate_of_state_annotation(key)
        if gate is not None:
            out[gate] = value
    return out
