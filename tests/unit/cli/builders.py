"""Raw API objects (dicts, as the API server returns them) for the CLI's pure tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.api.state import Failure, NodeGateState

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
    return NodeGateState(status="in-progress", batch=batch, round=1, phase=phase,
                         phase_since=iso(NOW - since), **kw)


def failed(batch: int = 1, *, reason: str = "StageFailed", message: str = "", package: str | None = "pkg",
           stage: str = "apply", cordoned: bool = False) -> NodeGateState:
    return NodeGateState(status="failed", batch=batch, round=1, cordoned=cordoned,
                         failure=Failure(package=package, stage=stage, reason=reason, message=message, generation=1))


def agent_summary(step: str, code: int, message: str) -> str:
    return json.dumps({"package": "pkg", "version": "1.0.0", "stage": "apply", "ok": False, "failedStep": step,
                       "exitCode": code, "message": message, "durationSeconds": 0.2})


# How a builder's step ended: its container terminated with 0, terminated with 1 (the agent's summary as
# its termination message), runs now, or has not started.
StepEnd = str  # "done" | "failed" | "running" | "waiting"


def stage_pod(gate_name: str, node_name: str, steps: list[tuple[str | None, str]], ends: list[StepEnd] | None = None,
              *, kind: str = "stages", interrupt: str | None = None, phase: str | None = None,
              created: datetime = NOW, attempt: int = 0, packages: dict[str, Any] | None = None) -> Obj:
    """A stage pod as the operator renders it (`gate.controller.pods.stage_pod`), with the status a
    kubelet would report: each step's container state from `ends` (missing ones have not started)."""
    from gate.api.nodegate import Interrupt, NodeGate
    from gate.controller.pods import container_name
    from gate.controller.pods import stage_pod as render
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.node import PodRequest, Step

    model = NodeGate.model_validate(gate(gate_name, packages=packages))
    request = PodRequest(name=f"ng-{kind}-{node_name}-{attempt}", kind=kind,  # type: ignore[arg-type]
                         steps=tuple(Step(p, s) for p, s in steps), round=1, attempt=attempt,  # type: ignore[arg-type]
                         interrupt=Interrupt(type=interrupt) if interrupt else None)
    pod = render(model, node_name, request, OperatorSettings(namespace="nodegate-system"))
    pod["metadata"]["creationTimestamp"] = iso(created)
    ends = ends or []
    statuses = []
    for step, end in zip(request.steps, ends, strict=False):
        state: Obj
        if end == "done":
            state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": iso(created)}}
        elif end == "failed":
            state = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": iso(created),
                                    "message": agent_summary("install", 1, "disk full")}}
        elif end == "running":
            state = {"running": {"startedAt": iso(created)}}
        else:
            state = {"waiting": {"reason": "PodInitializing"}}
        statuses.append({"name": container_name(step), "state": state})
    if phase is None:
        phase = ("Failed" if "failed" in ends else
                 "Succeeded" if ends and len(ends) == len(steps) and set(ends) == {"done"} else "Pending")
    inits = {c["name"] for c in pod["spec"]["initContainers"]}  # as laid out (gate.controller.steporder)
    pod["status"] = {"phase": phase, "initContainerStatuses": [s for s in statuses if s["name"] in inits],
                     "containerStatuses": [s for s in statuses if s["name"] not in inits]}
    return pod
