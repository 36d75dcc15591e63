"""Admission latency and throughput over TLS: our webhook next to a bare aiohttp handler.

    python3.11 -m bench.admission.run [--seconds 10] [--rate 500] [--concurrency 32]

For each payload (validating a 10-package NodeGate; mutating a joining Node), in the same run and
alternating between the two servers: p50/p99 latency at a fixed offered rate (open loop: latency is
measured from each request's scheduled send time, so a stall is not hidden by the client slowing
down), then the highest sustained rate with `--concurrency` keep-alive connections (closed loop).
One server process each; the load generator is a separate process. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from gate.certs import pki

REPO = Path(__file__).resolve().parents[2]


def ten_package_review() -> bytes:
    packages = {}
    for i in range(10):
        name = f"pkg-{chr(97 + i)}"
        packages[name] = {
            "version": f"1.{i}.0", "image": f"registry.example.com:5000/team/{name}",
            "config": {"a.conf": "x", "b.conf": "y"},
            "configInterrupts": {"*.conf": {"type": "service", "services": ["svc"]}},
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
            "dependsOn": {f"pkg-{chr(96 + i)}": ">=1.0.0"} if i else {},
            "timeout": "30m", "uninstall": {"enabled": True},
        }
    obj = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": "bench"},
           "spec": {"nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}}, "deploymentPolicy": "fleet",
                    "waitTimeout": "2h", "priority": 200, "sequencing": "node", "packages": packages}}
    return _review({"group": "nodegate.io", "version": "v1alpha1", "kind": "NodeGate"}, obj)


def node_review() -> bytes:
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-17", "labels": {
        "pool": "pool-8", "zone": "a", "kubernetes.io/hostname": "gpu-node-17", "kubernetes.io/os": "linux"}},
           "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}}
    return _review({"group": "", "version": "v1", "kind": "Node"}, obj)


def _review(kind: dict[str, str], obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": kind, "operation": "CREATE", "object": obj,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}}).encode()


async def fixed_rate(url: str, body: bytes, ctx: ssl.SSLContext, rate: float, seconds: float) -> dict[str, float]:
    total = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(ssl=ctx, limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(scheduled: float) -> None:
            nonlocal errors
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.perf_counter() - scheduled)

        for _ in range(20):  # warm the connections and the server
            await one(time.perf_counter())
        latencies.clear()
        start = time.perf_counter() + 0.05
        await asyncio.gather(*(one(start + i / rate) for i in range(total)))
    latencies.sort()
    return {"p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * latencies[int(0.99 * len(latencies)) - 1],
            "max_ms": 1000 * latencies[-1], "errors": errors}


async def max_rate(url: str, body: bytes, ctx: ssl.SSLContext, concurrency: int, seconds: float) -> float:
    done = 0
    connector = aiohttp.TCPConnector(ssl=ctx, limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    done += resp.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def start_server(kind: str, port: int, tls: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bench.admission.servers", kind, "--port", str(port),
                             "--cert", str(tls / "tls.crt"), "--key", str(tls / "tls.key")],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def measure(args: argparse.Namespace) -> None:
    import socket

    ca = pki.create_ca("bench-ca")
    leaf = pki.issue(ca, "bench", hosts=["127.0.0.1"], server=True)
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    with tempfile.TemporaryDirectory() as tmp:
        tls = Path(tmp)
        (tls / "tls.crt").write_bytes(leaf.cert_pem)
        (tls / "tls.key").write_bytes(leaf.key_pem)
        ports = {}
        procs = {}
        for kind in ("ours", "bare"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports[kind] = s.getsockname()[1]
            procs[kind] = start_server(kind, ports[kind], tls)
        try:
            payloads = [("validate 10-package NodeGate", "/validate", ten_package_review()),
                        ("mutate joining Node", "/mutate", node_review())]
            print(f"TLS 1.3, keep-alive; offered rate {args.rate:.0f} req/s for {args.seconds:.0f}s; "
                  f"max rate with {args.concurrency} connections for {args.seconds:.0f}s")
            print(f"{'payload':30} {'server':6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6} "
                  f"{'max req/s':>10}")
            for label, path, body in payloads:
                rows = {}
                for kind in ("ours", "bare"):
                    url = f"https://127.0.0.1:{ports[kind]}{path}"
                    lat = await fixed_rate(url, body, ctx, args.rate, args.seconds)
                    rows[kind] = (lat, 0.0)
                for kind in ("ours", "bare"):
                    url = f"https://127.0.0.1:{ports[kind]}{path}"
                    rows[kind] = (rows[kind][0], await max_rate(url, body, ctx, args.concurrency, args.seconds))
                for kind, (lat, rps) in rows.items():
                    print(f"{label:30} {kind:6} {lat['p50_ms']:8.2f} {lat['p99_ms']:8.2f} {lat['max_ms']:8.2f} "
                          f"{lat['errors']:6.0f} {rps:10.0f}")
                ratio = rows["ours"][0]["p99_ms"] / rows["bare"][0]["p99_ms"]
                print(f"{'':30} p99 ours/bare at {args.rate:.0f} req/s: {ratio:.2f}x")
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--concurrency", type=int, default=32)
    asyncio.run(measure(p.parse_args()))


if __name__ == "__main__":
    main()
