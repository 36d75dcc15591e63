"""Small helpers of the security tier: the operator's metrics and process, read from outside."""

from __future__ import annotations

import urllib.request

from gate.devcluster.cluster import DevCluster


def operator_metrics(cluster: DevCluster) -> str:
    """The running operator's /metrics (its port is whatever it was last started with)."""
    port = cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def reconcile_failures(text: str) -> float:
    """Reconciles that raised, except lost optimistic-concurrency races (409 Conflict, requeued as every
    controller does when two writers meet on one object)."""
    return sum(v for labels, v in samples(text, "nodegate_reconcile_errors_total").items()
               if 'error="Conflict"' not in labels)


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
