"""Raw API objects (dicts, as the API server returns them) for the CLI's pure tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gate.api import keys
from gate.api.state import Failure, NodeGateState
from gate.controller.jobs import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION

Obj = dict[str, Any]
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday
PKG = {"version": "1.0.0", "image": "example.com/pkg"}


def iso(moment: datetime) -> str:
    return moment.isoformat()


def gate(name: str = "g", *, packages: dict[str, Any] | None = None, status: Obj | None = None,
         generation: int = 1, **spec: Any) -> Obj:
    body: Obj = {"nodeSelector": {"matchLabels": {"pool": "x"}}, "packages": packages or {"pkg": PKG}}
    body.update(spec)
    obj: Obj = {"apiVersion": keys.API_VERSION, "kind": "NodeGate",
                "metadata": {"name": name, "generation": generation,
                             "creationTimestamp": iso(NOW - timedelta(days=1))},
                "spec": body}
    obj["status"] = status if status is not None else {"observedGeneration": generation}
    return obj


def policy(name: str = "p", *compartments: Obj, windows: list[Obj] | None = None) -> Obj:
    return {"apiVersion": keys.API_VERSION, "kind": "DeploymentPolicy", "metadata": {"name": name},
            "spec": {"compartments": list(compartments), "windows": windows or []}}


def compartment(name: str, pool: str, budget: Obj, strategy: Obj | None = None) -> Obj:
    out: Obj = {"name": name, "selector": {"matchLabels": {"tier": pool}}, "budget": budget}
    if strategy is not None:
        out["strategy"] = strategy
    return out


def node(name: str, *, labels: dict[str, str] | None = None, states: dict[str, NodeGateState | str] | None = None,
         unschedulable: bool = False) -> Obj:
    annotations = {}
    for g, state in (states or {}).items():
        annotations[keys.state_annotation(g)] = state if isinstance(state, str) else state.dump()
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": "x", **(labels or {})}, "annotations": annotations,
                         "creationTimestamp": iso(NOW - timedelta(days=2))},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "boot-1"}}}


def complete(batch: int = 1, compartment: str = "__default__") -> NodeGateState:
    from gate.api.state import Installed

    return NodeGateState(status="complete", batch=batch, round=1, compartment=compartment,
                         installed={"pkg": Installed(version="1.0.0")})


def running(batch: int = 1, phase: str = "stages", since: timedelta = timedelta(seconds=42), **kw: Any
            ) -> NodeGateState:
    return NodeGateState(status="in-progress", batch=batch, round=1, phase=phase,  # type: ignore[arg-type]
                         phase_since=iso(NOW - since), **kw)


def failed(batch: int = 1, *, reason: str = "StageFailed", message: str = "", package: str | None = "pkg",
           stage: str = "apply", cordoned: bool = False) -> NodeGateState:
    return NodeGateState(status="failed", batch=batch, round=1, cordoned=cordoned,
                         failure=Failure(package=package, stage=stage, reason=reason, message=message, generation=1))


def agent_summary(step: str, code: int, message: str) -> str:
    return json.dumps({"package": "pkg", "version": "1.0.0", "stage": "apply", "ok": False, "failedStep": step,
                       "exitCode": code, "message": message, "durationSeconds": 0.2})


def job(gate_name: str, node_name: str, stage: str, *, package: str | None = "pkg", interrupt: str | None = None,
        finished: str | None = None) -> Obj:
    labels = {keys.STAGE_KIND_LABEL: stage}
    if package:
        labels[keys.STAGE_PACKAGE_LABEL] = package
    if interrupt:
        labels[keys.INTERRUPT_LABEL] = interrupt
    conditions = [{"type": finished, "status": "True"}] if finished else []
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"ng-{stage}-{node_name}", "namespace": "nodegate-system", "labels": labels,
                         "annotations": {GATE_NAME_ANNOTATION: gate_name, NODE_NAME_ANNOTATION: node_name}},
            "status": {"conditions": conditions, "active": 0 if finished else 1}}
