"""`nodegate plan GATE`: every batch of a rollout, done, running and planned, assuming every node succeeds.

The same pure planner the operator runs (`gate.rollout.simulate`) on a snapshot of the cluster: the
plan is what the operator would do, not a second opinion.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime

from gate.cli.errors import CliError
from gate.cli.kubectx import connect
from gate.cli.output import print_data
from gate.cli.render import plan_data, plan_text
from gate.cli.snapshot import fetch_snapshot


def cmd_plan(args: argparse.Namespace) -> int:
    return asyncio.run(_plan(args))


async def _plan(args: argparse.Namespace) -> int:
    from gate.api.nodegate import NodeGate
    from gate.api.policy import DeploymentPolicy
    from gate.api.state import NodeGateState
    from gate.controller.views import fleet_node
    from gate.lifecycle.soak import soak_left
    from gate.rollout import NodeSnapshot, simulate

    async with connect(args) as client:
        snapshot = await fetch_snapshot(client, args.namespace, args.gate)
    [raw] = [g for g in snapshot.gates if g["metadata"]["name"] == args.gate]
    gate = NodeGate.model_validate(raw)
    policy = None
    if gate.spec.deployment_policy:
        found = snapshot.policies.get(gate.spec.deployment_policy)
        if found is None:
            raise CliError(f"NodeGate {gate.name} names DeploymentPolicy {gate.spec.deployment_policy}, "
                           "which does not exist")
        policy = DeploymentPolicy.model_validate(found)
    nodes = []
    soaking: dict[str, float] = {}
    now = datetime.now(UTC)
    for obj in snapshot.nodes:
        fnode = fleet_node(obj)
        nodes.append(NodeSnapshot(fnode.view.name, dict(fnode.view.labels),
                                  dict(fnode.progresses)))  # as the operator reads them (a held node takes no budget)
        state = fnode.states.get(gate.name)
        if isinstance(state, NodeGateState) and state.status == "in-progress" and state.phase == "soak":
            left = soak_left(state.soak_until, now)
            if left is not None:
                soaking[fnode.view.name] = left
    sim = simulate(gate, policy, nodes)
    if args.output == "text":
        sys.stdout.write(plan_text(sim, gate.spec.deployment_policy, soaking=soaking))
    else:
        print_data(plan_data(sim, gate.spec.deployment_policy, soaking), args.output)
    return 0
