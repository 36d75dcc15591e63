"""`nodegate reset GATE`: run a whole gate again from scratch, on every node it has run on.

It asks the operator through the requests it already honours, so the operator stays the only
writer of node state and gate status: the annotation `nodegate.io/reset.<gate>` on every node that
carries the gate's state (the operator forgets what the gate installed there and runs it again,
once a round running there ends), and `nodegate.io/restart` on the gate (its rollout starts afresh,
as after a spec change: stopped compartments resume and batches start small again). The nodes go
back in line, so the new round follows the gate's rollout order, budgets, strategies and windows
like the first one did.

What it will do is said first. It changes every node of the gate, so it asks before it does, unless
`--yes`; without a terminal to ask on it needs `--yes` (or `--dry-run`, which only shows).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gate.api import keys

SHOWN_NAMES = 10


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")


def cmd_reset(args: argparse.Namespace) -> int:
    return asyncio.run(_reset(args))


async def _reset(args: argparse.Namespace) -> int:
    from gate.cli.errors import CliError
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_gate, states_on
    from gate.cli.targets import changed, now_stamp, patch_nodes
    from gate.controller.views import node_states
    from gate.kube.client import NODEGATES, NODES

    g = args.gate
    ask = not args.dry_run and not args.yes
    if ask and not sys.stdin.isatty():
        raise CliError(f"nodegate reset changes every node of NodeGate {g}: confirm with --yes "
                       "(or see what it does with --dry-run)")
    async with connect(args) as client:
        gate = await get_gate(client, g)
        nodes, _ = await client.list(NODES)
        ran = sorted(n["metadata"]["name"] for n in nodes if g in states_on(n))
        busy = sorted(n["metadata"]["name"] for n in nodes
                      if (s := node_states(n, [g]).get(g)) is not None and not isinstance(s, Exception)
                      and s.status == "in-progress")
        stopped = [c["name"] for c in (gate.get("status") or {}).get("compartments") or []
                   if c.get("state") == "stopped"]
        if not ran and not stopped:
            print(f"NodeGate {g} has not run on any node and no compartment is stopped; nothing to reset.")
            return 0
        plan = [f"NodeGate {g}: reset {len(ran)} node{'s' if len(ran) != 1 else ''}"
                + (f" ({_names(ran)})" if ran else "")
                + f": the operator forgets what {g} installed on each and runs it there again from scratch, "
                "in the gate's rollout order, under its budgets and windows."]
        if busy:
            plan.append(f"{len(busy)} in progress now ({_names(busy)}) finish their round first.")
        plan.append("Batches start small again" + (
            f", and stopped compartment{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} resume." if stopped
            else "."))
        print(" ".join(plan))
        if ask:
            answer = input(f"Reset NodeGate {g}? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                print("Nothing changed.")
                return 0
        stamp = now_stamp()
        await patch_nodes(client, {n: {"metadata": {"annotations": {keys.reset_annotation(g): stamp}}} for n in ran},
                          dry_run=args.dry_run)
        await client.patch(NODEGATES, g, {"metadata": {"annotations": {keys.RESTART_ANNOTATION: stamp}}},
                           dry_run=args.dry_run)
    what = [f"annotation {keys.reset_annotation(g)} on {len(ran)} node{'s' if len(ran) != 1 else ''}"] if ran else []
    what.append(f"annotation {keys.RESTART_ANNOTATION} on the gate")
    changed(f"NodeGate {g}: requested the reset ({' and '.join(what)}).", args.dry_run)
    return 0


def register(sub: Any) -> None:
    from gate.cli.fleet import cluster_parents

    cluster, dry = cluster_parents()
    reset = sub.add_parser("reset", parents=[cluster, dry],
                           help="run a NodeGate again from scratch on every node it has run on")
    reset.add_argument("gate", metavar="GATE")
    reset.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=cmd_reset)
