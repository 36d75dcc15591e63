"""`nodegate delete GATE [--force]`: delete a NodeGate; the operator cleans its nodes up, then it goes.

The gate's finalizer keeps it while the operator uninstalls what allows it and removes the gate's keys
from every node. A paused gate starts no uninstall: `--force` unpauses it after the deletion (so no
rollout round starts in between). Takes `--dry-run` and says what it changed.
"""

from __future__ import annotations

import argparse
import asyncio

from gate.api.common import Obj
from gate.cli.kubectx import connect
from gate.cli.snapshot import get_gate
from gate.cli.targets import changed
from gate.kube.client import NODEGATES


def cmd_delete(args: argparse.Namespace) -> int:
    return asyncio.run(_delete(args))


async def _delete(args: argparse.Namespace) -> int:
    g = args.gate
    async with connect(args) as client:
        gate = await get_gate(client, g)
        paused = bool((gate.get("spec") or {}).get("paused"))
        deleting = bool(gate["metadata"].get("deletionTimestamp"))
        if deleting and not (paused and args.force):
            print(f"NodeGate {g} is already being deleted{' (paused: no uninstall starts)' if paused else ''}; "
                  "nothing changed." + (f" `nodegate delete {g} --force` lets its removal go on." if paused else ""))
            return 0
        if not deleting:
            options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if args.dry_run:
                options["dryRun"] = ["All"]
            await client.delete(NODEGATES, g, body=options, missing_ok=False)
        if paused and args.force:
            # After the deletion, so the unpaused gate never starts a rollout round: only its removal.
            await client.patch(NODEGATES, g, {"spec": {"paused": False}}, dry_run=args.dry_run)
    after = ("The operator uninstalls what allows it, uncordons and removes the gate's keys from every node, "
             "then the gate goes.")
    if paused and args.force:
        done = "deleted and set spec.paused=false" if not deleting else "set spec.paused=false"
        changed(f"NodeGate {g}: {done}. {after}", args.dry_run)
    elif paused:
        changed(f"NodeGate {g}: deleted. It is paused: no uninstall starts while it stays paused (its condition "
                f"Deleting says so); `nodegate delete {g} --force` or `nodegate resume {g}` lets the removal go on.",
                args.dry_run)
    else:
        changed(f"NodeGate {g}: deleted. {after}", args.dry_run)
    return 0
