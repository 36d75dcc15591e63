"""`nodegate demo`: a live rollout on a local control plane with simulated nodes."""

from __future__ import annotations

import sys
from pathlib import Path

from gate.devcluster.cluster import DevCluster, NodeSpec


def run_demo(*, quick: bool, nodes: int, state_dir: Path | None) -> int:
    cluster = DevCluster(state_dir)
    cluster.up(NodeSpec(nodes, {"demo": "true"}), progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"\nA real control plane with {nodes} simulated nodes is running.")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print("  kubectl get nodes")
    print("The live rollout is not yet part of this build (the operator lands next); "
          "stop the cluster with `nodegate dev down`.")
    return 0
