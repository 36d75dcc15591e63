"""`nodegate node reset|ignore|unignore|release`: requests on one node, several, or every node a selector matches.

`node reset` leaves the annotation `nodegate.io/reset.<gate>` (the operator forgets what the gate
installed there and runs it again from scratch, once a round running there ends); `node ignore`
sets the label `nodegate.io/ignore=true` (every gate leaves the node alone), `unignore` removes it.
`node release` uncordons a node held for hand-off (spec.leaveCordoned), exactly what `kubectl
uncordon` does: the operator notices, removes its `held-by` mark and never holds the node again.
Every node named must exist before anything is written; a node that already is as asked is named
and left alone.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gate.api import keys


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("nodes", nargs="*", metavar="NODE", help="the nodes, by name")
    parser.add_argument("--selector", "-l", metavar="SELECTOR",
                        help="every node matching this label selector instead (e.g. -l pool=gpu,zone!=b)")


def cmd_node_reset(args: argparse.Namespace) -> int:
    return asyncio.run(_node_reset(args))


async def _node_reset(args: argparse.Namespace) -> int:
    from gate.cli.errors import CliError
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_gate
    from gate.cli.targets import changed, now_stamp, patch_nodes, select_nodes
    from gate.controller.views import node_states

    async with connect(args) as client:
        nodes = await select_nodes(client, args.nodes, args.selector)
        if args.gate:
            await get_gate(client, args.gate)
        stamp = now_stamp()
        plans: dict[str, list[str]] = {}
        busy: dict[str, set[str]] = {}
        for node in nodes:
            states = node_states(node)
            name = node["metadata"]["name"]
            plans[name] = [args.gate] if args.gate else sorted(states)
            busy[name] = {g for g, s in states.items() if not isinstance(s, Exception) and s.status == "in-progress"}
        if not any(plans.values()):
            if len(nodes) == 1:
                raise CliError(f"no NodeGate has run on node {nodes[0]['metadata']['name']}; nothing to reset")
            raise CliError(f"no NodeGate has run on any of these {len(nodes)} nodes; nothing to reset")
        patches = {n: {"metadata": {"annotations": {keys.reset_annotation(g): stamp for g in gates}}}
                   for n, gates in plans.items() if gates}
        await patch_nodes(client, patches, dry_run=args.dry_run)
    for name, gates in plans.items():
        if not gates:
            print(f"node/{name}: no NodeGate has run here; nothing to reset.")
        for g in gates:
            then = " once the round running there now ends" if g in busy[name] else ""
            changed(f"node/{name}: requested a reset for NodeGate {g} (annotation {keys.reset_annotation(g)}); "
                    f"the operator forgets what {g} installed and runs it there again from scratch{then}.",
                    args.dry_run)
    return 0


def cmd_node_ignore(args: argparse.Namespace) -> int:
    return asyncio.run(_node_ignore(args, ignore=True))


def cmd_node_unignore(args: argparse.Namespace) -> int:
    return asyncio.run(_node_ignore(args, ignore=False))


async def _node_ignore(args: argparse.Namespace, *, ignore: bool) -> int:
    from gate.cli.kubectx import connect
    from gate.cli.targets import changed, patch_nodes, select_nodes

    async with connect(args) as client:
        nodes = await select_nodes(client, args.nodes, args.selector)
        already = [n["metadata"]["name"] for n in nodes
                   if ((n["metadata"].get("labels") or {}).get(keys.IGNORE_LABEL) == "true") == ignore]
        todo = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] not in already]
        value = "true" if ignore else None
        await patch_nodes(client, {n: {"metadata": {"labels": {keys.IGNORE_LABEL: value}}} for n in todo},
                          dry_run=args.dry_run)
    for name in already:
        print(f"node/{name} is already {'ignored' if ignore else 'not ignored'}; nothing changed.")
    for name in todo:
        if ignore:
            changed(f"node/{name}: labelled {keys.IGNORE_LABEL}=true. Every NodeGate leaves it alone from now on "
                    "(a round running there stops once its stage pod ends).", args.dry_run)
        else:
            changed(f"node/{name}: removed the label {keys.IGNORE_LABEL}. NodeGates that select it take it "
                    "back into their rollouts.", args.dry_run)
    return 0


def cmd_node_release(args: argparse.Namespace) -> int:
    return asyncio.run(_node_release(args))


async def _node_release(args: argparse.Namespace) -> int:
    from gate.cli.errors import CliError
    from gate.cli.kubectx import connect
    from gate.cli.targets import changed, patch_nodes, select_nodes

    async with connect(args) as client:
        nodes = await select_nodes(client, args.nodes, args.selector)
        holders = {n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(keys.HELD_BY) for n in nodes}
        todo = [n["metadata"]["name"] for n in nodes
                if holders[n["metadata"]["name"]] and (n.get("spec") or {}).get("unschedulable")]
        if not todo:
            raise CliError("no node named is held for hand-off (cordoned with annotation "
                           f"{keys.HELD_BY}); nothing to release. A node cordoned otherwise: kubectl uncordon")
        # Only spec.unschedulable, as `kubectl uncordon` writes it: the mark is the operator's to remove.
        await patch_nodes(client, {n: {"spec": {"unschedulable": False}} for n in todo}, dry_run=args.dry_run)
    for name in sorted(set(holders) - set(todo)):
        print(f"node/{name} is not held for hand-off; nothing changed.")
    for name in todo:
        changed(f"node/{name}: uncordoned. NodeGate {holders[name]} held it for hand-off; the operator removes "
                f"its mark {keys.HELD_BY} and never holds the node again.", args.dry_run)
    return 0


def register(sub: Any) -> None:
    """Add `reset`, `ignore`, `unignore` and `release` to the `node` group (gate.cli.fleet adds the group
    and `list`)."""
    from gate.cli.fleet import cluster_parents, subparsers_of

    node_sub = subparsers_of(sub.choices["node"])
    cluster, dry = cluster_parents()
    reset = node_sub.add_parser("reset", parents=[cluster, dry],
                                help="run a NodeGate on nodes again from scratch (e.g. after fixing them)")
    add_node_arguments(reset)
    reset.add_argument("--gate", "-g", help="only this NodeGate (default: every NodeGate that ran on each node)")
    reset.set_defaults(func=cmd_node_reset)
    ignore = node_sub.add_parser("ignore", parents=[cluster, dry],
                                 help=f"opt nodes out of every NodeGate ({keys.IGNORE_LABEL}=true)")
    add_node_arguments(ignore)
    ignore.set_defaults(func=cmd_node_ignore)
    unignore = node_sub.add_parser("unignore", parents=[cluster, dry], help="opt nodes back in")
    add_node_arguments(unignore)
    unignore.set_defaults(func=cmd_node_unignore)
    release = node_sub.add_parser("release", parents=[cluster, dry],
                                  help="uncordon nodes held for hand-off (spec.leaveCordoned), as kubectl uncordon")
    add_node_arguments(release)
    release.set_defaults(func=cmd_node_release)
