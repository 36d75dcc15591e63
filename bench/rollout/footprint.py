"""What the operator's memory is made of at fleet scale, without an API server.

    python -m bench.rollout.footprint --nodes 5000

Builds, in this process, what the operator holds per node once a rollout is done: each Node as
its cache keeps it (`gate.controller.views.node_fields`), and its fleet view with the gate's state
parsed (`fleet_node`, every node complete with three packages installed). The baseline, measured in
the same run: the same Nodes as the API sends them (a kwok Node, as `bench.rollout` makes them).
Printed: RSS after the operator's imports (`/proc/self/status`), what each part keeps
(tracemalloc), and the ratio of the Nodes as sent to the Nodes as kept (the state annotation and the
status label included). What this leaves out is what a live operator holds on
top: connections and their buffers, stage pods in flight, Events of the last ten minutes, and what a
watch event or a plan holds for a moment (`bench.rollout.run` measures the whole process).
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

import gate.cli.main
import gate.controller.operator  # noqa: F401
from gate.api.state import Installed, NodeGateState
from gate.controller.views import fleet_node, node_fields

PACKAGES = ("kernel-tuning", "gpu-driver-cfg", "security-agent")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def node_as_sent(name: str) -> bytes:
    """A Node as the API server sends a kwok node: the manifest plus the status kwok reports."""
    from gate.devcluster.cluster import node_manifest  # not the operator's: after the imports' reading

    node: dict[str, Any] = node_manifest(name, {"bench": "rollout", "pool": "pool-a"}, [])
    node["metadata"].update(uid=f"uid-{name}", resourceVersion="1", creationTimestamp="2026-12-03T08:20:05Z",
                            annotations={"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"})
    stamp = "2026-12-03T08:20:05Z"
    conditions = [{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": stamp,
                   "lastTransitionTime": stamp} for t, s, r, m in (
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"))]
    resources = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}
    node["status"] = {
        "addresses": [{"address": "192.168.0.1", "type": "InternalIP"}], "allocatable": resources,
        "capacity": resources, "conditions": conditions, "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"architecture": "amd64", "bootID": f"boot-{name}", "containerRuntimeVersion": "kwok-0.8.0",
                     "kernelVersion": "6.8.0-kwok", "kubeProxyVersion": "", "kubeletVersion": "kwok-0.8.0",
                     "machineID": f"machine-{name}", "operatingSystem": "linux", "osImage": "Simulated Linux",
                     "systemUUID": f"uuid-{name}"},
        "phase": "Running",
    }
    return orjson.dumps(node)


def complete_state(name: str) -> str:
    state = NodeGateState(status="complete", generation=1, rollout_hash="3f2a9c1d7e5b8a60", round=1, batch=3,
                          compartment="pool-a", boot_id=f"boot-{name}", passed=True,
                          installed={p: Installed(version="1.0.0", spec_hash="9d1e7f3a5c2b4e68") for p in PACKAGES})
    return state.dump()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures: dict[str, Any] = {"nodes": args.nodes, "rss_after_imports_mib": round(rss_mib(), 1)}
    names = [f"node-{i}" for i in range(args.nodes)]
    sent = [node_as_sent(n) for n in names]
    states = {n: complete_state(n) for n in names}

    # Python's own accounting of the objects each step keeps (tracemalloc), not RSS: freed memory
    # stays in the process, so RSS after one step would hide what the next one takes.
    tracemalloc.start()
    whole = [orjson.loads(raw) for raw in sent]
    figures["nodes_as_sent_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
    del whole
    tracemalloc.stop()
    tracemalloc.start()
    kept = [node_fields(orjson.loads(raw)) for raw in sent]
    for node in kept:
        name = node["metadata"]["name"]
        node["metadata"]["annotations"]["nodegate.io/state.bench-fleet"] = states[name]
        node["metadata"]["labels"]["status.nodegate.io/bench-fleet"] = "complete"
    figures["nodes_as_kept_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
    views = [fleet_node(node) for node in kept]
    for view in views:
        _ = view.progresses
    figures["fleet_views_with_states_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20
                                                   - figures["nodes_as_kept_mib"], 1)
    tracemalloc.stop()
    figures["sent_over_kept"] = round(figures["nodes_as_sent_mib"] / max(figures["nodes_as_kept_mib"], 0.1), 2)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
