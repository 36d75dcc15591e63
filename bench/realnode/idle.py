"""Where a node's idle time goes: the gaps between one stage pod and the next, and around the reboot.

`bench.realnode.run` watches the node and its stage pods while a round runs and keeps, for each pod,
the moments the bench's watch saw it (created, ended, gone: exact to the millisecond, a watch
event's delay after the API server stored the change) and the API's own timestamps (creation, the
sandbox ready, its containers' start and finish: whole seconds, as the API writes them). This module
turns them into the gaps of each transition of the round, in the order they happened:

* cordon → first pod created                        (the operator: drain, and the round's first pod)
* pod N's last container finished → its end seen   (the kubelet: its relist, then the pod status
                                                       write; the finish time is truncated to the
                                                       second, so this reads up to 1 s long)
* its end seen → its terminal phase seen            (the kubelet stops the sandbox first; the
                                                       operator need not wait for it)
* pod N's end seen → pod N+1 seen created           (the operator: the watch event, the work queue,
                                                       the decision, the node write, the pod create);
                                                       its end is the first of the two above
* pod N+1 created → its first container started       (the kubelet: the sandbox and the container
                                                       create; whole seconds)
* reboot pod started → node seen with a new boot ID   (the reboot itself: down, boot, the kubelet's
                                                       first status write)
* new boot ID seen → node seen Ready                  (the kubelet: runtime up, a relist)
* node Ready → next pod seen created                  (the operator, and whatever it waited for)
* last pod seen ended → uncordon seen                 (the operator: the round's finish)

Pure: it takes the records and returns rows; `run.py` collects them and prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class PodSeen:
    """One stage pod as the bench saw it (seconds since the epoch; None: not seen)."""

    name: str
    reboot: bool = False  # it holds a reboot, its last step (`running`: that step's)
    added: float | None = None  # the watch saw it first (created)
    running: float | None = None  # the watch saw a container of it running
    steps_ended: float | None = None  # the watch saw its last step's container end (gate.controller.pods)
    ended: float | None = None  # the watch saw it Succeeded or Failed
    gone: float | None = None  # the watch saw it deleted
    created: float | None = None  # creationTimestamp (whole seconds)
    first_start: float | None = None  # its first container's startedAt (whole seconds)
    last_finish: float | None = None  # its last container's finishedAt (whole seconds)


@dataclass(frozen=True)
class NodeSeen:
    """One watch event of the node: when, cordoned, boot ID, Ready."""

    at: float
    unschedulable: bool
    boot_id: str
    ready: bool


@dataclass(frozen=True)
class Gap:
    """One transition of a round: from what to what, and how long it took (None: not measured)."""

    what: str
    who: str  # "operator", "kubelet", "reboot"; "(kubelet)": overlaps the others, not summed
    seconds: float | None


def _gap(what: str, who: str, start: float | None, end: float | None) -> Gap:
    return Gap(what, who, None if start is None or end is None else end - start)


def transitions(pods: Sequence[PodSeen], node: Sequence[NodeSeen], reboot_started: float | None = None) -> list[Gap]:
    """The gaps of one node's round, in order (see the module docstring). `reboot_started`: the reboot step's
    start by the API's own time, for a real node whose kubelet never reported that step running before the
    shutdown (the watch then never sees it run)."""
    order = sorted((p for p in pods if p.added is not None), key=lambda p: p.added or 0.0)
    cordon = next((n.at for n in node if n.unschedulable), None)
    out: list[Gap] = []
    if order and cordon is not None:
        out.append(_gap(f"cordon -> {order[0].name} created", "operator", cordon, order[0].added))
    for i, pod in enumerate(order):
        if i > 0:
            out.append(_gap(f"{pod.name}: created -> first container started", "kubelet",
                            pod.created, pod.first_start))
        if pod.reboot:
            out += _reboot(pod, order[i + 1] if i + 1 < len(order) else None, node, reboot_started)
            continue
        end = _first(pod.steps_ended, pod.ended)
        out.append(_gap(f"{pod.name}: finished -> end seen", "kubelet", pod.last_finish, end))
        if pod.steps_ended is not None:
            out.append(Gap(f"{pod.name}: end seen -> terminal phase seen", "(kubelet)",
                           None if pod.ended is None else pod.ended - pod.steps_ended))
        if i + 1 < len(order):
            after = order[i + 1]
            out.append(_gap(f"{pod.name} end seen -> {after.name} created", "operator", end, after.added))
    last = order[-1] if order else None
    if last is not None and cordon is not None:
        uncordon = next((n.at for n in node if n.at > cordon and not n.unschedulable), None)
        out.append(_gap(f"{last.name} end seen -> uncordon", "operator", _first(last.steps_ended, last.ended),
                        uncordon))
    return out


def _first(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _reboot(pod: PodSeen, after: PodSeen | None, node: Sequence[NodeSeen], started: float | None) -> list[Gap]:
    """The reboot pod's start to the next pod: the reboot, the kubelet's return, the operator's look."""
    start = pod.running  # the watch's time: kwok's container times are not the node's
    what = f"{pod.name}: started -> new boot ID seen"
    if start is None and started is not None:
        start, what = started, f"{pod.name}: started (API time, whole seconds) -> new boot ID seen"
    before = [n.boot_id for n in node if start is not None and n.at <= start]
    boot = before[-1] if before else None
    new_boot = next((n.at for n in node if boot is not None and n.boot_id != boot), None)
    ready = next((n.at for n in node if new_boot is not None and n.at >= new_boot and n.ready), None)
    out = [_gap(what, "reboot", start, new_boot),
           _gap("new boot ID seen -> node Ready seen", "kubelet", new_boot, ready)]
    seen = _first(pod.steps_ended, pod.ended, pod.gone)
    if seen is not None:
        out.append(_gap(f"node Ready -> {pod.name} end seen (or gone)", "kubelet", ready, seen))
    if after is not None:
        out.append(_gap(f"node Ready -> {after.name} created", "operator", ready, after.added))
    return out


def summary(gaps: Sequence[Gap]) -> dict[str, float]:
    """Seconds per party, and how many transitions pod to pod the operator made and their total."""
    out: dict[str, float] = {}
    for gap in gaps:
        if gap.seconds is not None:
            out[gap.who] = out.get(gap.who, 0.0) + gap.seconds
    between = [g.seconds for g in gaps if g.who == "operator" and g.seconds is not None and " end seen -> " in g.what
               and "uncordon" not in g.what]
    out["operator, pod ended to next created (sum)"] = sum(between)
    out["operator, pod ended to next created (transitions)"] = float(len(between))
    return out


def table(node: str, gaps: Sequence[Gap]) -> list[str]:
    """The rows `run.py` prints for one node."""
    lines = [f"  {node}:"]
    for gap in gaps:
        seconds = "   -  " if gap.seconds is None else f"{gap.seconds:6.2f}"
        lines.append(f"    {gap.who:<8} {seconds} s  {gap.what}")
    totals = summary(gaps)
    parts = ", ".join(f"{who} {totals.get(who, 0.0):.1f} s" for who in ("operator", "kubelet", "reboot"))
    lines.append(f"    in all: {parts}")
    return lines
