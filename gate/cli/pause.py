"""`nodegate pause GATE` and `nodegate resume GATE [-c COMPARTMENT]`: stop starting new work, and go on.

Pause sets `spec.paused` (stages running now finish). Resume clears it and, for compartments a failed
batch stopped, leaves the `nodegate.io/resume` annotation on the gate: the operator acts on that
request and removes it. Both take `--dry-run` (a server-side dry run) and say what they changed.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from gate.api import keys
from gate.api.common import Obj
from gate.cli.errors import CliError
from gate.cli.kubectx import connect
from gate.cli.snapshot import get_gate
from gate.cli.targets import changed
from gate.kube.client import NODEGATES, POLICIES
from gate.kube.errors import NotFound


def cmd_pause(args: argparse.Namespace) -> int:
    return asyncio.run(_pause(args))


async def _pause(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        if (gate.get("spec") or {}).get("paused"):
            print(f"NodeGate {args.gate} is already paused; nothing changed.")
            return 0
        await client.patch(NODEGATES, args.gate, {"spec": {"paused": True}}, dry_run=args.dry_run)
    changed(f"NodeGate {args.gate}: set spec.paused=true. No new work starts; stages running now finish.",
            args.dry_run)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    return asyncio.run(_resume(args))


def _compartment_names(values: Sequence[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


async def _resume(args: argparse.Namespace) -> int:
    wanted = _compartment_names(args.compartment)
    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        spec = gate.get("spec") or {}
        compartments = ((gate.get("status") or {}).get("compartments")) or []
        known = {c.get("name") for c in compartments}
        if spec.get("deploymentPolicy"):
            try:
                policy = await client.get(POLICIES, spec["deploymentPolicy"])
                known |= {c.get("name") for c in (policy.get("spec") or {}).get("compartments") or []}
            except NotFound:
                pass
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise CliError(f"NodeGate {args.gate} has no compartment {', '.join(unknown)} "
                           f"(it has: {', '.join(sorted(str(k) for k in known)) or 'none yet'})")
        stopped = [c["name"] for c in compartments if c.get("state") == "stopped"
                   and (not wanted or c["name"] in wanted)]
        paused = bool(spec.get("paused"))
        patch: Obj = {}
        if paused:
            patch["spec"] = {"paused": False}
        if stopped:
            patch["metadata"] = {"annotations": {keys.RESUME_ANNOTATION: ",".join(wanted) if wanted else "*"}}
        if not patch:
            scope = f"compartment {', '.join(wanted)} is not stopped" if wanted else "no compartment is stopped"
            print(f"NodeGate {args.gate} is not paused and {scope}; nothing changed.")
            return 0
        await client.patch(NODEGATES, args.gate, patch, dry_run=args.dry_run)
    if paused:
        changed(f"NodeGate {args.gate}: set spec.paused=false.", args.dry_run)
    if stopped:
        changed(f"NodeGate {args.gate}: asked the operator to resume stopped compartment"
                f"{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} "
                f"(annotation {keys.RESUME_ANNOTATION}). Their failed nodes stay failed: "
                "`nodegate rerun` or `nodegate node reset` gives them another round.", args.dry_run)
    return 0
