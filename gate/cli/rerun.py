"""`nodegate rerun GATE --node NODE --package PACKAGE [--stage apply|config]`: one stage on one node again.

Leaves the request `nodegate.io/rerun.<gate>=<package>/<stage>` on the node; the operator runs the
stage there again in the node's next round (after the round running now) and removes the request.
The gate must have run on the node. Takes `--dry-run` and says what it changed.
"""

from __future__ import annotations

import argparse
import asyncio

from gate.api import keys
from gate.cli.errors import CliError
from gate.cli.kubectx import connect
from gate.cli.snapshot import get_gate, get_node
from gate.cli.targets import changed
from gate.kube.client import NODES


def cmd_rerun(args: argparse.Namespace) -> int:
    return asyncio.run(_rerun(args))


async def _rerun(args: argparse.Namespace) -> int:
    from gate.controller.views import node_states

    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        packages = sorted((gate.get("spec") or {}).get("packages") or {})
        if args.package not in packages:
            raise CliError(f"NodeGate {args.gate} has no package {args.package} (it has: {', '.join(packages)})")
        node = await get_node(client, args.node)
        states = node_states(node, [args.gate])
        if args.gate not in states:
            raise CliError(f"NodeGate {args.gate} has not run on node {args.node}; nothing to rerun")
        key = keys.rerun_annotation(args.gate)
        pending = (node["metadata"].get("annotations") or {}).get(key)
        value = f"{args.package}/{args.stage}"
        await client.patch(NODES, args.node, {"metadata": {"annotations": {key: value}}}, dry_run=args.dry_run)
    state = states[args.gate]
    busy = not isinstance(state, Exception) and state.status == "in-progress"
    replaced = f" It replaces the pending request {pending}." if pending and pending != value else ""
    then = " once the round running there now ends" if busy else " in its next round"
    changed(f"node/{args.node}: requested a rerun of {args.package} {args.stage} for NodeGate {args.gate} "
            f"(annotation {key}={value}); the operator runs it again{then}.{replaced}", args.dry_run)
    return 0
