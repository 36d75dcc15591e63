"""How a stage pod lays out its steps as containers (pure: no I/O).

Three layouts, all read back in the steps' order (`gate.controller.pods.stage_pod_view`):

* **in turn** (`in_turn`), a pod of several steps: the steps are the pod's containers, started together,
  and each runs once the one before it succeeded (`gate.agent.turns`). The steps keep their order, their
  one-at-a-time run on the host and a container each (status, logs, exit code per step);
* **side by side** (`side_by_side`), several checks after the interrupt: the pod's containers, started
  together, in no order;
* **a chain**, a pod of one step, or one that ends with a reboot: every step but the last is an init
  container, one after another, and the last is the pod's container.

Why a reboot keeps the chain: the reboot wipes the node's containers, and the kubelet on the new boot
knows how the pod's steps ended only from the status it posted to the API server before it. A chain
starts the reboot only once the kubelet saw every step before it end (so its status says so, and the
round records them as done: `gate.lifecycle.disruption`); steps in turn would start it as soon as the
agent before it wrote its record, often before the kubelet's next look, and the new boot would find
those steps' ends lost and run them, and the reboot, again.

Payload copies (the package image's `cp`, `payload_container`) are init containers before the steps in
every layout. Why not a chain of init containers for several steps, as NodeWright's stage pods chain a
stage and its check: the kubelet starts each init container after the first only at its next look at
the node's containers, and on its default (generic) PLEG that is a relist, every second. A window of
six steps and a service restart was out of service 6.9 to 7.4 s in a chain, 3.7 to 3.9 s in turn, on
real nodes (bench/README.md, "Steps in turn").
"""

from __future__ import annotations

from collections.abc import Sequence

from gate.agent.turns import TURNS_DIR
from gate.api.common import Obj
from gate.lifecycle.node import Step

PAYLOAD_PREFIX = "payload-"
TURNS_VOLUME = "turns"  # the pod's emptyDir of the steps' records (`gate.agent.turns`)
AFTER_INTERRUPT: frozenset[str] = frozenset(("post-interrupt", "post-uninstall"))


def payload_container(package: str) -> str:
    return f"{PAYLOAD_PREFIX}{package}"


def side_by_side(steps: Sequence[Step]) -> bool:
    """Whether a pod runs its steps side by side, in no order: when every step is a package's check after
    the interrupt, and there are several. Those checks prove what the node booted with and change nothing
    (docs/packages.md, "Stages"), and each reads and writes only its own package's directory on the host
    under its own lock, so their order says nothing: they end with the slowest of them."""
    return len(steps) > 1 and all(s.package is not None and s.stage in AFTER_INTERRUPT for s in steps)


def in_turn(steps: Sequence[Step], reboot: bool) -> bool:
    """Whether a pod's steps run in turn: when it has several, they are not checks side by side, and its
    interrupt (`reboot`: the pod's is a reboot) is not a reboot, which keeps the chain (above)."""
    return len(steps) > 1 and not side_by_side(steps) and not (reboot and any(s.package is None for s in steps))


def layout(containers: list[Obj], steps: Sequence[Step], turns: bool) -> Obj:
    """The pod's init containers and containers from its containers in the steps' order (payload copies
    among them). In turn (`turns`, from `in_turn`) or side by side, the payload copies one after another
    and every step started at once, each step in turn waiting for the one before it and recording its own
    end in the pod's emptyDir `TURNS_VOLUME` (`gate.agent.turns`); otherwise (a chain) every container but
    the last one after another and the last as the pod's container."""
    if not (turns or side_by_side(steps)):
        return {"initContainers": containers[:-1], "containers": containers[-1:]}
    copies = [c for c in containers if c["name"].startswith(PAYLOAD_PREFIX)]
    running = [c for c in containers if c not in copies]
    if turns:
        for index, container in enumerate(running):
            container["args"] += ["--turn", str(index), "--turns", TURNS_DIR]
            container["volumeMounts"].append({"name": TURNS_VOLUME, "mountPath": TURNS_DIR})
    return {"initContainers": copies, "containers": running}
