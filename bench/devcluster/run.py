"""How fast the local control plane starts, and what it weighs.

    python -m bench.devcluster.run [--nodes 10 1000]

For each node count: wall time of `nodegate dev up --nodes N --no-webhook --no-operator` from a
cold state directory (binaries already built) to every node Ready, then the peak resident memory
(VmHWM) of each control plane process, summed. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gate.devcluster.cluster import DevCluster


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(nodes: int) -> dict[str, float]:
    state = Path(tempfile.mkdtemp(prefix="nodegate-devbench-"))
    try:
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "up", "--nodes", str(nodes), "--state-dir",
                        str(state), "--no-webhook", "--no-operator"], check=True, capture_output=True)
        elapsed = time.monotonic() - start
        cluster = DevCluster(state)
        rss = {name: peak_rss(p.pid) / 2**20 for name, p in cluster.processes().items()}
        return {"nodes": nodes, "up_seconds": round(elapsed, 1),
                **{f"{k}_peak_mib": round(v, 1) for k, v in rss.items()},
                "control_plane_peak_mib": round(sum(rss.values()), 1)}
    finally:
        DevCluster(state).down(quiet=True)
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 1000])
    args = parser.parse_args()
    for count in args.nodes:
        result = measure(count)
        print("  ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
