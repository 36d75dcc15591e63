"""`nodegate disable GATE` / `nodegate enable GATE`: a gate that stays but does nothing, and back.

Disabling sets the annotation `nodegate.io/disabled=true` on the NodeGate, which the operator and the
webhook honour: no round starts on any node (a round running now finishes, so no node is left
cordoned), the webhook taints no joining node for it, the operator takes the readiness taint off
every node no enabled gate holds back, and other gates stop waiting for it (priority, sequencing,
readiness). Its spec, status and nodes' records stay as they are. Pausing differs: a paused gate
still holds joining nodes back with its readiness taint, and other gates still wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gate.api import keys


def cmd_disable(args: argparse.Namespace) -> int:
    return asyncio.run(_switch(args, disable=True))


def cmd_enable(args: argparse.Namespace) -> int:
    return asyncio.run(_switch(args, disable=False))


async def _switch(args: argparse.Namespace, *, disable: bool) -> int:
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_gate
    from gate.cli.targets import changed
    from gate.kube.client import NODEGATES

    g = args.gate
    async with connect(args) as client:
        gate = await get_gate(client, g)
        now = (gate["metadata"].get("annotations") or {}).get(keys.DISABLED_ANNOTATION) == "true"
        if now == disable:
            print(f"NodeGate {g} is already {'disabled' if disable else 'enabled'}; nothing changed.")
            return 0
        value = "true" if disable else None
        await client.patch(NODEGATES, g, {"metadata": {"annotations": {keys.DISABLED_ANNOTATION: value}}},
                           dry_run=args.dry_run)
    taint = bool((gate.get("spec") or {}).get("readinessTaint"))
    if disable:
        released = (" and takes the readiness taint off every node no other gate holds back" if taint else "")
        changed(f"NodeGate {g}: annotated {keys.DISABLED_ANNOTATION}=true. It starts no new round (rounds running now "
                f"finish), taints no joining node{released}; other gates stop waiting for it. "
                f"`nodegate enable {g}` turns it back on.", args.dry_run)
    else:
        joined = (" Nodes that joined while it was disabled and have not passed it get the readiness taint until "
                  "they do." if taint else "")
        changed(f"NodeGate {g}: removed the annotation {keys.DISABLED_ANNOTATION}. It rolls out again.{joined}",
                args.dry_run)
    return 0


def register(sub: Any) -> None:
    from gate.cli.fleet import cluster_parents

    cluster, dry = cluster_parents()
    disable = sub.add_parser("disable", parents=[cluster, dry],
                             help="a NodeGate that stays but does nothing: no rounds, no readiness taint")
    disable.add_argument("gate", metavar="GATE")
    disable.set_defaults(func=cmd_disable)
    enable = sub.add_parser("enable", parents=[cluster, dry], help="turn a disabled NodeGate back on")
    enable.add_argument("gate", metavar="GATE")
    enable.set_defaults(func=cmd_enable)
