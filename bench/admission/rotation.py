"""Certificate rotation under load: a steady stream of AdmissionReviews against the real webhook
process while its self-managed certificates rotate, counting every request that fails.

    python3.11 -m bench.admission.rotation [--rate 1000] [--seconds 60] [--rotations 6]   # long mode

starts its own control plane (`nodegate dev` machinery, a state directory of its own) and the
webhook as `nodegate dev up` runs it (self-managed certificates, checked every 2 s, a new CA trusted
5 s before the serving certificate moves to it), then offers `--rate` requests per second for
`--seconds` from a separate load process while it makes the webhook rotate `--rotations` times,
alternating the two kinds of rotation the planner (gate.certs.rotation.plan) does on its own:

* serving: the Secret is given a serving certificate 20 days from expiry: the webhook renews it
  from the same CA;
* CA: the Secret is given a signing CA 200 days from expiry: the webhook creates a new CA, puts it
  in the trust bundle (the configurations' caBundle) next to the old one, and moves the serving
  certificate to it once the bundle had time to propagate.

The load process trusts what the API server trusts: the caBundle of the ValidatingWebhookConfiguration,
re-read every 0.5 s. Most requests reuse keep-alive connections; every `--fresh-every`-th opens a new
one, so handshakes happen throughout and each records which certificate it was served. A request
fails when it gets anything but a 200 with an AdmissionReview, or no answer (TLS, connection, 10 s
timeout). The load is paced at `--rate` with at most 128 requests in flight, so when the machine cannot
keep up the client sends less rather than piling up requests: the rate reached is what the webhook
sustained. Prints the target and reached rates, failures, latency and the certificates served.
tests/security/test_rotation_under_load.py runs the short mode on the test session's control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import hashlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gate.certs import pki
from gate.certs.rotation import SIGNER_CERT, SIGNER_KEY, TLS_CERT, TLS_KEY, TRUST_BUNDLE, split_pem
from gate.kube.client import SECRETS, VALIDATING_WEBHOOKS, KubeClient

REPO = Path(__file__).resolve().parents[2]
SECRET = "nodegate-webhook-tls"
NAMESPACE = "nodegate-system"
CONFIGURATION = "nodegate"
HOSTS = ["127.0.0.1", "localhost"]


# -- what is sent -----------------------------------------------------------------------------------

def _review(kind: dict[str, str], operation: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "load", "kind": kind, "operation": operation, "object": obj,
        "userInfo": {"username": "load", "groups": ["system:authenticated"]}}}).encode()


def payloads() -> list[tuple[str, bytes]]:
    """What the API server sends during node joins and rollouts, none needing an API call to answer:
    a joining Node (mutation, from the watch cache), a NodeGate with a bad field (denied by the rules),
    and a valid DeploymentPolicy (allowed)."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-17", "labels": {
        "pool": "pool-8", "kubernetes.io/hostname": "gpu-node-17"}}, "spec": {}}
    gate = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": "load"},
            "spec": {"waitTimeout": "1d", "packages": {}}}
    policy = {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": "load"},
              "spec": {"default": {"budget": {"percent": 25}, "strategy": {"fixed": {"initialBatch": 1}}}}}
    return [("/mutate", _review({"group": "", "version": "v1", "kind": "Node"}, "CREATE", node)),
            ("/validate", _review({"group": "nodegate.io", "version": "v1alpha1", "kind": "NodeGate"}, "CREATE", gate)),
            ("/validate", _review({"group": "nodegate.io", "version": "v1alpha1", "kind": "DeploymentPolicy"},
                                  "CREATE", policy))]


# -- the load -----------------------------------------------------------------------------------------

@dataclass
class Result:
    offered_rate: float
    seconds: float
    sent: int = 0
    ok: int = 0
    failures: int = 0
    failure_samples: list[str] = field(default_factory=list)
    fresh_connections: int = 0
    served: dict[str, list[float]] = field(default_factory=dict)  # certificate sha256 -> [first, last] seen
    issuers: dict[str, str] = field(default_factory=dict)  # certificate sha256 -> issuer CN
    trust_updates: int = 0
    completed_per_second: list[int] = field(default_factory=list)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0

    @property
    def reached_rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "reached_rate": self.reached_rate})


class Trust:
    """One client TLS context whose trusted CAs grow as the webhook configuration's caBundle does:
    what the API server does with caBundle, done by the load process."""

    def __init__(self, bundle: bytes) -> None:
        self.context = ssl.create_default_context(cadata=bundle.decode())
        self.known = set(split_pem(bundle))

    def add(self, bundle: bytes) -> bool:
        new = [pem for pem in split_pem(bundle) if pem not in self.known]
        for pem in new:
            self.context.load_verify_locations(cadata=pem.decode())
            self.known.add(pem)
        return bool(new)


async def configuration_bundle(kube: KubeClient, name: str = CONFIGURATION) -> bytes:
    config = await kube.get(VALIDATING_WEBHOOKS, name)
    bundles = {w["clientConfig"].get("caBundle", "") for w in config["webhooks"]}
    return b"".join(base64.b64decode(b) for b in sorted(bundles) if b)


async def run_load(url: str, rate: float, seconds: float, trust: Trust, refresh: Callable[[], Awaitable[bytes]],
                   *, connections: int = 32, fresh_every: int = 20, timeout: float = 30.0,
                   in_flight: int = 128, stop_file: Path | None = None) -> Result:
    """Send up to `rate` requests per second for `seconds`, or until `stop_file` exists, every
    `fresh_every`-th over a new connection."""
    result = Result(offered_rate=rate, seconds=seconds)
    bodies = payloads()
    latencies: list[float] = []
    completions: list[float] = []
    keepalive = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trust.context, limit=connections),
                                      timeout=aiohttp.ClientTimeout(total=timeout))
    stop = asyncio.Event()

    async def refresher() -> None:
        while not stop.is_set():
            try:
                if trust.add(await refresh()):
                    result.trust_updates += 1
            except Exception as exc:  # a failed refresh is retried; it is not a request of the load
                print(f"trust refresh failed: {exc}", file=sys.stderr)
            await asyncio.sleep(0.5)

    def fail(why: str) -> None:
        result.failures += 1
        if len(result.failure_samples) < 20:
            result.failure_samples.append(why)

    host, port = _host_port(url)

    async def over_a_new_connection(path: str, body: bytes) -> tuple[int, bytes]:
        # A raw HTTP/1.1 request on a connection of its own, so the certificate it was served is known.
        reader, writer = await asyncio.open_connection(host, port, ssl=trust.context, server_hostname=host)
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            if der:
                _saw(result, der)
                result.fresh_connections += 1
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
        head, _, payload = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0, payload

    async def over_keepalive(path: str, body: bytes) -> tuple[int, bytes]:
        async with keepalive.post(url + path, data=body, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.read()

    async def one(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        path, body = bodies[i % len(bodies)]
        result.sent += 1
        try:
            if i % fresh_every == 0:
                status, data = await asyncio.wait_for(over_a_new_connection(path, body), timeout)
            else:
                status, data = await over_keepalive(path, body)
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError, OSError, ValueError, IndexError) as exc:
            fail(f"{type(exc).__name__}: {exc}")
            return
        if status != 200 or b'"AdmissionReview"' not in data:
            fail(f"HTTP {status}: {data[:120]!r}")
            return
        now = time.perf_counter()
        result.ok += 1
        latencies.append(now - at)
        completions.append(now)

    refreshing = asyncio.create_task(refresher())
    start = time.perf_counter() + 0.05
    try:
        # Paced at `rate`, with at most `in_flight` requests outstanding: when the server falls behind,
        # the client sends less instead of queueing requests until they time out on its side, so a
        # failure is the server's (or the rotation's), never the load generator's backlog.
        slots = asyncio.Semaphore(in_flight)
        sent: set[asyncio.Task[None]] = set()
        i = 0
        total = int(rate * seconds)
        while i < total and not (stop_file is not None and i % 50 == 0 and stop_file.exists()):
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            await slots.acquire()
            task = asyncio.create_task(one(i, time.perf_counter()))
            sent.add(task)
            task.add_done_callback(lambda t: (sent.discard(t), slots.release()))
            i += 1
        offered_for = time.perf_counter() - start
        await asyncio.gather(*sent)
        result.seconds = offered_for
        result.offered_rate = rate
    finally:
        stop.set()
        await refreshing
        await keepalive.close()
    if latencies:
        latencies.sort()
        result.p50_ms = 1000 * statistics.median(latencies)
        result.p99_ms = 1000 * latencies[max(0, int(0.99 * len(latencies)) - 1)]
        result.max_ms = 1000 * latencies[-1]
    buckets: dict[int, int] = {}
    for t in completions:
        buckets[int(t - start)] = buckets.get(int(t - start), 0) + 1
    result.completed_per_second = [buckets.get(s, 0) for s in range(int(result.seconds) + 1)]
    return result


def _host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def _saw(result: Result, der: bytes) -> None:
    from cryptography import x509

    digest = hashlib.sha256(der).hexdigest()[:16]
    now = time.monotonic()
    seen = result.served.setdefault(digest, [now, now])
    seen[1] = now
    if digest not in result.issuers:
        issuer = x509.load_der_x509_certificate(der).issuer.rfc4514_string()
        result.issuers[digest] = issuer


# -- making the webhook rotate -------------------------------------------------------------------------

async def expire_serving_soon(kube: KubeClient, namespace: str = NAMESPACE, secret: str = SECRET) -> None:
    """The Secret's serving certificate, 20 days from expiry (renewed at 30): the webhook renews it."""
    obj = await kube.get(SECRETS, secret, namespace)
    data = obj["data"]
    signer = pki.KeyPair(base64.b64decode(data[SIGNER_CERT]), base64.b64decode(data[SIGNER_KEY]))
    leaf = pki.issue(signer, "nodegate-webhook", hosts=HOSTS, server=True, valid_for=dt.timedelta(days=20))
    obj["data"] = {**data, TLS_CERT: _b64(leaf.cert_pem), TLS_KEY: _b64(leaf.key_pem)}
    await kube.replace(SECRETS, obj)


async def expire_ca_soon(kube: KubeClient, namespace: str = NAMESPACE, secret: str = SECRET) -> None:
    """The Secret's signing CA, 200 days from expiry (replaced at 365): the webhook makes a new CA,
    publishes it next to the old ones and later moves the serving certificate to it. The serving
    certificate and the trust bundle stay as they are, so nothing changes for clients until then."""
    obj = await kube.get(SECRETS, secret, namespace)
    data = obj["data"]
    aging = pki.create_ca(f"nodegate-webhook-ca-aging-{time.time_ns()}", valid_for=dt.timedelta(days=200))
    trust = base64.b64decode(data[TRUST_BUNDLE])
    obj["data"] = {**data, SIGNER_CERT: _b64(aging.cert_pem), SIGNER_KEY: _b64(aging.key_pem),
                   TRUST_BUNDLE: _b64(aging.cert_pem + trust)}
    await kube.replace(SECRETS, obj)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# -- the load as a process of its own -------------------------------------------------------------------

def load_argv(url: str, kubeconfig: Path, rate: float, seconds: float, out: Path, *, connections: int = 32,
              fresh_every: int = 20, stop_file: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "bench.admission.rotation", "load", "--url", url, "--kubeconfig", str(kubeconfig),
            "--rate", str(rate), "--seconds", str(seconds), "--out", str(out), "--connections", str(connections),
            "--fresh-every", str(fresh_every), *(["--stop-file", str(stop_file)] if stop_file else [])]


def start_load(url: str, kubeconfig: Path, rate: float, seconds: float, out: Path,
               **kw: Any) -> subprocess.Popen[str]:
    """Start the load process; it prints "ready" once it trusts the webhook and is about to send."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(load_argv(url, kubeconfig, rate, seconds, out, **kw), stdout=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise RuntimeError(f"the load process did not start: {line!r}")
    return proc


async def _load_main(args: argparse.Namespace) -> None:
    kube = await KubeClient.from_kubeconfig(args.kubeconfig)
    try:
        trust = Trust(await configuration_bundle(kube))
        print("ready", flush=True)
        result = await run_load(args.url, args.rate, args.seconds, trust, lambda: configuration_bundle(kube),
                                connections=args.connections, fresh_every=args.fresh_every,
                                stop_file=Path(args.stop_file) if args.stop_file else None)
    finally:
        await kube.close()
    Path(args.out).write_text(result.as_json())


# -- long mode --------------------------------------------------------------------------------------------

def report(result: dict[str, Any], rotations: list[str]) -> str:
    served = sorted(result["served"].items(), key=lambda kv: kv[1][0])
    lines = [
        f"target {result['offered_rate']:.0f} req/s for {result['seconds']:.1f} s; "
        f"reached {result['reached_rate']:.0f} req/s ({result['ok']} answered of {result['sent']} sent); "
        f"failed requests: {result['failures']}",
        f"latency p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms; "
        f"answered per second: min {min(result['completed_per_second'][1:-1] or [0])}, "
        f"max {max(result['completed_per_second'] or [0])}",
        f"rotations made: {', '.join(rotations) or 'none'}; caBundle changes seen by the client: "
        f"{result['trust_updates']}; new connections: {result['fresh_connections']}",
        f"serving certificates seen on new connections, in order: {len(served)}",
    ]
    lines += [f"  {digest} issued by {result['issuers'][digest]}" for digest, _ in served]
    lines += [f"  failure: {f}" for f in result["failure_samples"]]
    return "\n".join(lines)


async def _long(args: argparse.Namespace) -> None:
    from gate.devcluster.cluster import DevCluster, NodeSpec
    from gate.devcluster.services import install_crds, start_webhook, webhook_port

    state = Path(tempfile.mkdtemp(prefix="nodegate-rotation-"))
    cluster = DevCluster(state)
    try:
        await asyncio.to_thread(cluster.up, NodeSpec(0), progress=lambda m: None)
        await install_crds(cluster)
        await asyncio.to_thread(start_webhook, cluster, lambda m: None)
        port = webhook_port(cluster)
        out = state / "load.json"
        print(f"control plane in {state}; webhook on 127.0.0.1:{port}; "
              f"load {args.rate:.0f} req/s for {args.seconds:.0f} s")
        proc = await asyncio.to_thread(start_load, f"https://127.0.0.1:{port}", cluster.kubeconfig, args.rate,
                                       args.seconds, out, connections=args.connections, fresh_every=args.fresh_every)
        rotations: list[str] = []
        async with await cluster.client() as kube:
            gap = args.seconds / (args.rotations + 1)
            for i in range(args.rotations):
                await asyncio.sleep(gap)
                kind = "CA" if i % 2 else "serving"
                await (expire_ca_soon(kube) if kind == "CA" else expire_serving_soon(kube))
                rotations.append(f"{kind}@{gap * (i + 1):.0f}s")
        await asyncio.to_thread(proc.wait)
        print(report(json.loads(out.read_text()), rotations))
    finally:
        await asyncio.to_thread(cluster.down, quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    load = sub.add_parser("load", help="the load process (started by the long mode and by the test)")
    load.add_argument("--url", required=True)
    load.add_argument("--kubeconfig", required=True)
    load.add_argument("--out", required=True)
    load.add_argument("--stop-file", default=None, help="stop offering load once this file exists")
    for p in (parser, load):
        p.add_argument("--rate", type=float, default=1000.0)
        p.add_argument("--seconds", type=float, default=60.0)
        p.add_argument("--connections", type=int, default=32)
        p.add_argument("--fresh-every", type=int, default=20)
    parser.add_argument("--rotations", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(_load_main(args) if args.command == "load" else _long(args))


if __name__ == "__main__":
    main()
