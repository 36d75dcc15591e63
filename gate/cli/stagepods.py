"""Stage pods as the CLI reads them: whose they are, and how far each of their steps got (pure: no I/O).

The operator runs each phase of a node's round as one bare pod whose steps are containers that run
one after another (`gate.controller.pods`). `status`, `package logs` and the demo all ask the same
things of such a pod: which gate and node it is for (the full names are annotations, the labels may
be hashed), which of its steps runs now (the first whose container has not terminated), and how each
step ended (its container's exit code and termination message, the agent's JSON summary). They are
answered here once, on top of the operator's own reading of the steps (`pod_steps`, `container_name`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gate.api import keys
from gate.api.common import Obj
from gate.controller.pods import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION, container_name, pod_steps
from gate.kube.objects import container_states, pod_ended
from gate.lifecycle.node import Step

StepPhase = Literal["pending", "running", "succeeded", "failed"]

# The operator's stage pods in its namespace: managed by NodeGate and of a stage kind.
SELECTOR = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER},{keys.STAGE_KIND_LABEL}"


@dataclass(frozen=True)
class StepState:
    """One step of a stage pod as its container reports it."""

    step: Step
    container: str
    phase: StepPhase
    exit_code: int | None = None
    message: str = ""  # the termination message: the agent's JSON summary

    @property
    def ran(self) -> bool:
        return self.phase != "pending"

    @property
    def what(self) -> str:
        """How the step reads in one line: "chrony-conf apply", "interrupt reboot"."""
        return f"{self.step.package} {self.step.stage}" if self.step.package else self.step.stage


def meta(pod: Obj) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's labels and annotations, never None."""
    m = pod.get("metadata") or {}
    return m.get("labels") or {}, m.get("annotations") or {}


def gate_of(pod: Obj) -> str:
    return meta(pod)[1].get(GATE_NAME_ANNOTATION, "")


def node_of(pod: Obj) -> str:
    return meta(pod)[1].get(NODE_NAME_ANNOTATION, "")


def kind_of(pod: Obj) -> str:
    return meta(pod)[0].get(keys.STAGE_KIND_LABEL, "")


def has_package(pod: Obj, package: str) -> bool:
    return f"{keys.POD_PACKAGE_PREFIX}{package}" in meta(pod)[0]


def step_states(pod: Obj) -> list[StepState]:
    """Every step of the pod, in the order they run, with what its container says. Steps in turn
    (`gate.controller.steporder`) all run from the pod's start: one after the first that has not ended
    is pending, waiting for its turn."""
    by_name = container_states(pod)
    in_turn = meta(pod)[0].get(keys.IN_TURN_LABEL) == "true"
    waiting = False
    out = []
    for step in pod_steps(pod):
        name = container_name(step)
        state = by_name.get(name, {})
        term = state.get("terminated")
        if term is not None:
            code = term.get("exitCode")
            out.append(StepState(step, name, "succeeded" if code == 0 else "failed", code,
                                 (term.get("message") or "").strip()))
        elif "running" in state and not waiting:
            out.append(StepState(step, name, "running"))
        else:
            out.append(StepState(step, name, "pending"))
        waiting = waiting or (in_turn and term is None)
    return out


def current_step(pod: Obj) -> StepState | None:
    """The step running now, or next to run: the first whose container has not terminated (None once
    the pod ended, or when every step terminated)."""
    if pod_ended(pod):
        return None
    return next((s for s in step_states(pod) if s.phase in ("pending", "running")), None)


def of_node(pods: Iterable[Obj], node: str, gate: str | None = None) -> list[Obj]:
    """The stage pods of `node` (and of `gate` when given), newest first; pods being deleted count."""
    mine = [p for p in pods if node_of(p) == node and (gate is None or gate_of(p) == gate)]
    return sorted(mine, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp", ""),
                                       (p.get("metadata") or {}).get("name", "")), reverse=True)


def running(pods: Sequence[Obj]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(gate, node) -> the step each of its unfinished stage pods runs now, e.g. "chrony-conf apply", or
    the interrupt's type, "reboot" (a pod being deleted runs nothing that counts)."""
    out: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        gate, node = gate_of(pod), node_of(pod)
        if not gate or not node or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        step = current_step(pod)
        if step is None:
            continue
        what = step.what if step.step.package else meta(pod)[0].get(keys.INTERRUPT_LABEL) or step.what
        out.setdefault((gate, node), []).append(what)
    return {k: tuple(sorted(set(v))) for k, v in out.items()}
