"""Event sequences for the invariant checker, written the way the cluster would produce them.

`Cluster` hands out increasing revisions (one per change, as etcd does) and keeps the current version
of every node, so a test reads like the story it tells: cordon a node, create a stage pod, end it,
uncordon.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.testing.events import Change, Event, Relist

NAMESPACE = "nodegate-system"


class Cluster:
    def __init__(self, start: int = 100) -> None:
        self._rv = itertools.count(start)
        self.events: list[Event] = []
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[str, Obj] = {}
        self._uids = itertools.count(1)

    def next_rv(self) -> int:
        return next(self._rv)

    # -- specs ------------------------------------------------------------------------------------

    def gate(self, name: str, *, selector: dict[str, str] | None = None, budget: dict[str, int] | None = None,
             policy: str | None = None, readiness: bool = False, generation: int = 1,
             deleting: bool = False, leave_cordoned: bool = False) -> Obj:
        spec: Obj = {"nodeSelector": {"matchLabels": selector or {"pool": "test"}}, "readinessTaint": readiness,
                     "leaveCordoned": leave_cordoned,
                     "packages": {"pkg": {"version": "1.0.0", "image": "registry.example.com/pkg"}}}
        if budget is not None:
            spec["interruptionBudget"] = budget
        if policy is not None:
            spec["deploymentPolicy"] = policy
        meta: Obj = {"name": name, "generation": generation, "resourceVersion": str(self.next_rv())}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        obj = {"apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": meta, "spec": spec}
        self.events.append(Change("nodegates", "ADDED", obj, int(meta["resourceVersion"])))
        return obj

    def policy(self, name: str, compartments: list[Obj], default_budget: dict[str, int] | None = None,
               generation: int = 1) -> Obj:
        rv = self.next_rv()
        obj = {"apiVersion": keys.API_VERSION, "kind": "DeploymentPolicy",
               "metadata": {"name": name, "generation": generation, "resourceVersion": str(rv)},
               "spec": {"default": {"budget": default_budget or {"percent": 100}}, "compartments": compartments}}
        self.events.append(Change("deploymentpolicies", "ADDED", obj, rv))
        return obj

    # -- nodes ------------------------------------------------------------------------------------

    def node(self, name: str, labels: dict[str, str] | None = None, *, tainted: bool = False) -> Obj:
        rv = self.next_rv()
        obj: Obj = {"metadata": {"name": name, "uid": f"node-{name}", "resourceVersion": str(rv),
                                 "labels": {"pool": "test", **(labels or {})}, "annotations": {}},
                    "spec": {"unschedulable": False,
                             "taints": [{"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}] if tainted else []}}
        self.nodes[name] = obj
        self.events.append(Change("nodes", "ADDED", obj, rv))
        return obj

    def update(self, name: str, *, state: dict[str, Obj | None] | None = None, cordon: str | None = None,
               uncordon: bool = False, untaint: bool = False, taint: bool = False,
               annotations: dict[str, str | None] | None = None, labels: dict[str, str] | None = None,
               emit: bool = True) -> Obj:
        """A new version of the node: `state` sets (or with None removes) gates' state annotations;
        `cordon=G` cordons it for gate G; `uncordon` lifts the cordon and its annotation; then
        `annotations` are set (None removes one)."""
        old = self.nodes[name]
        meta = json.loads(json.dumps(old["metadata"]))
        spec = json.loads(json.dumps(old["spec"]))
        for gate, value in (state or {}).items():
            key = keys.state_annotation(gate)
            if value is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = json.dumps(value)
        if cordon is not None:
            spec["unschedulable"] = True
            meta["annotations"][keys.CORDONED_BY] = cordon
        if uncordon:
            spec["unschedulable"] = False
            meta["annotations"].pop(keys.CORDONED_BY, None)
        for key, val in (annotations or {}).items():
            if val is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = val
        meta["labels"].update(labels or {})
        if untaint:
            spec["taints"] = [t for t in spec["taints"] if t["key"] != keys.READINESS_TAINT_KEY]
        if taint:
            spec["taints"] = [*spec["taints"], {"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}]
        rv = self.next_rv()
        meta["resourceVersion"] = str(rv)
        obj = {"metadata": meta, "spec": spec}
        self.nodes[name] = obj
        if emit:
            self.events.append(Change("nodes", "MODIFIED", obj, rv))
        return obj

    # -- stage pods -------------------------------------------------------------------------------

    def pod(self, name: str, *, gate: str, node: str, stages: tuple[str, ...] = ("apply",), package: str = "pkg",
            version: str = "1.0.0", generation: int = 1, interrupt: str | None = None, round_: int = 1,
            steps: list[tuple[str, str]] | None = None, emit: bool = True, kind: str | None = None) -> Obj:
        """A stage pod as the operator renders it: `steps` (package, stage) one after another, by
        default `stages` of `package`; with `interrupt`, the interrupt pod of that type instead; `kind`
        overrides its kind label (a staging pod's `staging`)."""
        rv = self.next_rv()
        labels = {keys.MANAGED_BY_LABEL: keys.MANAGER}
        containers: list[Obj] = []
        wire: list[list[str | None]] = []
        if interrupt is not None:
            labels |= {keys.STAGE_KIND_LABEL: "interrupt", keys.INTERRUPT_LABEL: interrupt}
            containers.append({"name": "interrupt", "args": ["agent", "interrupt", "--type", interrupt]})
            wire.append([None, "interrupt", "", "interrupt"])
        else:
            steps = steps or [(package, stage) for stage in stages]
            kinds = {"post-interrupt" if stage == "post-interrupt" else "stages" for _, stage in steps}
            labels[keys.STAGE_KIND_LABEL] = kinds.pop() if len(kinds) == 1 else "stages"
            for pkg, stage in steps:
                if f"payload-{pkg}" not in {c["name"] for c in containers}:
                    containers.append({"name": f"payload-{pkg}", "args": []})
                key = f"{keys.POD_PACKAGE_PREFIX}{pkg}"
                labels[key] = f"{labels[key]}.{stage}" if key in labels else stage
                containers.append({"name": f"{stage}-{pkg}", "args": [
                    "agent", "run", "--stage", stage, "--package", pkg, "--version", version, "--gate", gate,
                    "--generation", str(generation)]})
                wire.append([pkg, stage, f"{version}/h", f"{stage}-{pkg}"])
        if kind is not None:
            labels[keys.STAGE_KIND_LABEL] = kind
        obj: Obj = {"metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{next(self._uids)}",
                                 "resourceVersion": str(rv), "labels": labels,
                                 "annotations": {"nodegate.io/gate-name": gate, "nodegate.io/node-name": node,
                                                 "nodegate.io/steps": json.dumps(wire),
                                                 "nodegate.io/round": str(round_)}},
                    "spec": {"initContainers": containers[:-1], "containers": containers[-1:]},
                    "status": {"phase": "Pending"}}
        self.pods[name] = obj
        if emit:
            self.events.append(Change("pods", "ADDED", obj, rv))
        return obj

    def end_pod(self, name: str, outcome: str = "Succeeded", *, failed_step: int = 0, emit: bool = True,
                phase: str | None = None) -> Obj:
        """The pod ended: every step done, or (`Failed`) the steps before `failed_step` done, that one
        exited 1 and the later ones never ran. `phase` (default: the outcome) is the phase written with
        it: Running, as the kubelet writes the containers' ends before it stopped the sandbox."""
        old = self.pods[name]
        steps = [w[3] for w in json.loads(old["metadata"]["annotations"]["nodegate.io/steps"])]
        ran = steps if outcome == "Succeeded" else steps[: failed_step + 1]
        codes = {c: 0 for c in ran} | ({} if outcome == "Succeeded" else {steps[failed_step]: 1})
        init = {c["name"] for c in old["spec"]["initContainers"]}
        statuses = [{"name": c, "state": {"terminated": {"exitCode": code}}} for c, code in codes.items()]
        rv = self.next_rv()
        obj = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rv)},
               "status": {"phase": phase or outcome,
                          "initContainerStatuses": [s for s in statuses if s["name"] in init],
                          "containerStatuses": [s for s in statuses if s["name"] not in init]}}
        self.pods[name] = obj
        if emit:
            self.events.append(Change("pods", "MODIFIED", obj, rv))
        return obj

    def delete_pod(self, name: str, *, emit: bool = True) -> None:
        old = self.pods.pop(name)
        rv = self.next_rv()
        if emit:
            self.events.append(Change("pods", "DELETED", {**old, "metadata": {**old["metadata"],
                                                                               "resourceVersion": str(rv)}}, rv))

    # -- relists ----------------------------------------------------------------------------------

    def relist(self, resource: str, since: int) -> Relist:
        objects = list(self.nodes.values()) if resource == "nodes" else list(self.pods.values())
        event = Relist(resource, objects, since, self.next_rv())  # type: ignore[arg-type]
        self.events.append(event)
        return event


def state(status: str, **fields: Any) -> Obj:
    return {"v": 1, "status": status, **fields}
