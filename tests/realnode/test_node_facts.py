"""On a real node, a step's facts arrive the way the design says: the operator's annotation on the stage
pod, projected by the kubelet's downwardAPI volume, read by the agent and written for the steps."""

from __future__ import annotations

import json

import yaml

from tests.realnode.conftest import POOL_LABEL, RealCluster


def test_the_agent_writes_the_nodes_facts_from_the_projected_annotation(real: RealCluster, gate_name: str) -> None:
    node = real.nodes[-1]
    real.kubectl.apply(yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": gate_name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real", "kubernetes.io/hostname": node}},
                 "interruptionBudget": {"count": 1},
                 "packages": {"grub-cmdline": {
                     "version": "1.0.0", "image": real.images["grub-cmdline"], "interrupt": {"type": "none"},
                     "env": [{"name": "KERNEL_ARGS", "value": "nodegate.facts=1"}], "uninstall": {"enabled": True}}}},
    }))
    try:
        real.wait_complete(gate_name)
        base = f"/var/lib/nodegate/{gate_name}/grub-cmdline/node"
        raw = real.node_file(node, f"{base}/facts.json")
        assert raw is not None, "the agent wrote no facts on the node"
        facts = json.loads(raw)
        assert facts["node"] == node
        assert facts["labels"][POOL_LABEL] == "real" and facts["labels"]["kubernetes.io/hostname"] == node
        assert facts["rollout"] == {"compartment": "__default__", "batch": 1, "round": 1}  # its first round
        assert not any(k.startswith("nodegate.io/state.") for k in facts["annotations"])
        assert real.node_file(node, f"{base}/labels") is not None
        assert f"{POOL_LABEL}=real\n" in (real.node_file(node, f"{base}/labels") or "")
    finally:
        real.delete_gate(gate_name)
