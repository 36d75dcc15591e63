"""What `nodegate demo` is made of: its gate, policy and pools, the failure it plants, its settings.

The demo's NodeGate and DeploymentPolicy are manifests next to this module (`demo_manifests`,
read by `manifest`); the nodes are split into a small canary and two pools (`pool_sizes`), and one
node of `pool-b`'s second batch gets the planted failure (`failing_node`), so the first batch
succeeds and the second stops the compartment. The demo talks to its own control plane only
(`client`, through the KUBECONFIG the demo set).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gate.cli.errors import CliError

MANIFESTS = Path(__file__).resolve().parent / "demo_manifests"
GATE = "host-tuning"
POLICY = "demo-fleet"
DEMO_LABEL = "nodegate.dev/demo"
POOL_LABEL = "nodegate.dev/pool"
POOLS = ("canary", "pool-a", "pool-b")
FAILING_POOL = "pool-b"
FAILING_PACKAGE = "chrony-conf"
FAILURE_STAGE_NAME = "demo-planted-failure"
# What the agent would say on a node without chrony: its JSON summary, as a stage pod leaves it.
FAILURE_SUMMARY = {"package": FAILING_PACKAGE, "version": "1.0.0", "stage": "apply", "ok": False,
                   "failedStep": "enable-confdir", "exitCode": 1,
                   "message": "/etc/chrony/chrony.conf not found: is chrony installed?", "durationSeconds": 0.04}
# Fast operator settings for simulated nodes, whose stages take a second or less.
OPERATOR_FLAGS = ["--poll-seconds", "0.5", "--image-pull-grace", "10", "--pending-timeout", "60",
                  "--reboot-timeout", "60", "--resync-seconds", "30"]



class DemoError(RuntimeError):
    """The demo could not tell its story (something did not happen in time); the message says what."""


@dataclass(frozen=True)
class DemoSettings:
    nodes: int
    job_seconds: float
    quick: bool
    keep: bool  # leave the control plane running at the end
    state_dir: Path
    phase_timeout: float  # longest wait for one phase of the rollout
    cert_manager: bool = False  # the webhook's certificate from the real cert-manager, not self-managed

    @property
    def pools(self) -> dict[str, int]:
        return pool_sizes(self.nodes)


def pool_sizes(nodes: int) -> dict[str, int]:
    """How many nodes each compartment gets: a small canary, the rest split between the pools."""
    if nodes < 6:
        raise CliError("the demo needs at least 6 nodes (2 per compartment)")
    canary = max(2, round(nodes / 15))
    pool_a = (nodes - canary) // 2
    return {"canary": canary, "pool-a": pool_a, "pool-b": nodes - canary - pool_a}


def default_state_dir() -> Path:
    from gate.devcluster.build import cache_root

    return Path(os.environ.get("NODEGATE_DEMO_DIR", cache_root() / "demo"))


def manifest(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((MANIFESTS / name).read_text())
    return data


def failing_node(names: list[str]) -> str:
    """A pool-b node in the compartment's second batch: the first batch succeeds, the second fails.

    Nodes are picked in the order of `gate.rollout.order_key`, and the linear strategy's first batch
    has two nodes, so the third node in that order is in batch 2 whatever the pool's size."""
    from gate.rollout import order_key

    return sorted(names, key=order_key)[2]


async def client() -> Any:
    from gate.kube.client import KubeClient

    return await KubeClient.from_kubeconfig(os.environ["KUBECONFIG"], user_agent="nodegate-demo")
