"""Which stage pods are the operator's: the rule the decider's inputs pass first (pure: no I/O).

A stage pod's containers' ends are stage results: "apply exited 0" records a package as installed.
Labels and annotations say which gate, node, round and steps a pod is for, but anyone who may create
pods in the operator's namespace can write those; and the kubelet (or anyone with `pods/status`)
writes the containers' ends. So a pod counts only when it is one the operator created, and still
runs what the operator built:

* **Recorded**: its uid is the one the operator recorded under its name in the node's state
  (`NodeGateState.pods`), which the operator signs (`gate.api.records`): nobody else can put a uid
  there. The uid is recorded in a write of its own right after the create returns it
  (`gate.controller.node_applier`), since a create cannot carry the uid it is about to get.
* **Unchanged**: the digest of its shape (images, commands, environment, mounts, host namespaces, its
  `nodegate.io/` labels and annotations: `gate.controller.podshape`) is still the one recorded. An
  image patched on the live pod, or a steps annotation rewritten, and it is no longer counted.

Anything else carrying a stage pod's labels is `foreign`: never shown to the decider (it is as if the
pod did not exist), reported once (`PodNotOurs`). One case is not foreign for long: a crash (or a lost
race on the node's write) between the create and the record leaves a pod under the name the operator
is about to use, unrecorded. The decider, not seeing it, asks for that pod again; the create answers
409, and the node applier adopts the pod found there only when it runs exactly what the operator builds
now (`gate.controller.podshape.shape_differences`), recording its uid as for a pod it just created.
Running what the operator would run, on the node it would run it on, such a pod is the operator's in
all but its creator. What the rule cannot tell is a status written about a pod that is the
operator's: the kubelet running it writes that (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gate.api.state import PodRecord
from gate.lifecycle.node import StagePod


@dataclass(frozen=True)
class Foreign:
    """A pod with a stage pod's labels that is not the operator's, and why."""

    pod: StagePod
    why: str


@dataclass(frozen=True)
class Recognised:
    ours: dict[str, StagePod] = field(default_factory=dict)
    foreign: list[Foreign] = field(default_factory=list)


def recognise(pods: Mapping[str, StagePod], recorded: Mapping[str, PodRecord]) -> Recognised:
    """Split a gate's stage pods on a node into the operator's (recorded uid, unchanged shape) and the rest."""
    out = Recognised()
    for name, pod in pods.items():
        why = refusal(pod, recorded.get(name))
        if why is None:
            out.ours[name] = pod
        else:
            out.foreign.append(Foreign(pod, why))
    return out


def refusal(pod: StagePod, record: PodRecord | None) -> str | None:
    """Why the pod is not the operator's, given what the node's signed state records under its name."""
    if record is None:
        return "the operator did not record creating a pod of this name on the node"
    if not pod.uid or pod.uid != record.uid:
        return (f"it is not the pod the operator created under this name (uid {pod.uid or 'none'}, the operator's "
                f"was {record.uid})")
    if pod.shape != record.shape:
        return ("what it runs changed since the operator created it (an image, a command, the environment, a mount, "
                "or its nodegate.io labels or annotations)")
    return None
