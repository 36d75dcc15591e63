"""Small helpers of the security tier: the operator's metrics and process, read from outside."""

from __future__ import annotations

import urllib.request

from gate.devcluster.cluster import DevCluster


def operator_metrics(cluster: DevCluster) -> str:
    """The running operator's /metrics (its port is whatever it was last started with)."""
    port = cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def total(text: str, name: str) -> float:
    """The sum of every sample of a metric (all label sets)."""
    out = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            out += float(line.rsplit(" ", 1)[1])
    return out


def samples(text: str, name: str) -> dict[str, float]:
    """Every sample of a metric, by its label set as written."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def operator_pid(cluster: DevCluster) -> int | None:
    proc = cluster.processes().get("operator")
    return proc.pid if proc is not None and proc.alive() else None
