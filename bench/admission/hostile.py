"""Legitimate reviews while a hostile client sends the largest specs admission allows.

    python3.11 -m bench.admission.hostile [--seconds 30] [--rate 20] [--hostile-clients 16]

Starts its own control plane (`nodegate dev` machinery, a state directory of its own) and the real
webhook process as `nodegate dev up` runs it: its SubjectAccessReviews go to the real API server,
whose RBAC answers them. Two clients, each a process of its own, send AdmissionReviews straight to
the webhook over TLS (the API server would add its own time on both sides, the same for both runs):

* legitimate: `--rate` reviews per second, each a small NodeGate CREATE (one package) by a user of
  its own (`dev-<i>`), so each needs one SubjectAccessReview that no cache can answer;
* hostile: `--hostile-clients` connections, each sending, back to back, a CREATE of the largest spec
  admission allows: 64 packages, each with 128 env entries from Secrets and 16 imagePullSecrets, the
  names long enough for a 1.39 MiB object (the API server stores objects of at most 1.5 MiB), and
  new names in every request so that nothing is answered from the cache: 9,280 distinct
  SubjectAccessReviews per request, all allowed. Each request is given up after 10 s, as the API
  server gives up on a webhook after its timeout.

Both users' rights come from group bindings (`use` on every package, `get` on every Secret of the
operator's namespace). Three runs of `--seconds` each, in this order: the baseline (the legitimate
load alone), the legitimate load with the hostile client, and the same again with the webhook
restarted with its bounds turned off (SARs in flight and body bytes unlimited; per-request dedupe
and the cache stay, as before this change). Prints, per run: the legitimate reviews' p50 / p99 / max
and failures (anything but a 200 with allowed=true), the p99 ratio to the baseline, the hostile
requests' outcomes, the SubjectAccessReviews the webhook sent, and the webhook's peak RSS.
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from gate.kube.client import CLUSTERROLEBINDINGS, CLUSTERROLES, ROLEBINDINGS, ROLES, KubeClient

REPO = Path(__file__).resolve().parents[2]
GROUP = "bench:writers"
NAMESPACE = "nodegate-system"
TOKEN = b"qqqqqqqq"  # replaced in each hostile body by fresh letters of the same length
HOSTILE_TIMEOUT = 10.0  # the webhook configurations' timeoutSeconds


# -- what is sent ---------------------------------------------------------------------------------

def _review(obj: dict[str, Any], user: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "nodegate.io", "version": "v1alpha1", "kind": "NodeGate"},
        "resource": {"group": "nodegate.io", "version": "v1alpha1", "resource": "nodegates"},
        "name": obj["metadata"]["name"], "operation": "CREATE", "object": obj,
        "userInfo": {"username": user, "groups": [GROUP, "system:authenticated"]}}},
        separators=(",", ":")).encode()


def legitimate(i: int) -> bytes:
    gate = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": f"legit-{i}"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "paused": True,
                     "packages": {"sysctl-tuning": {"version": "1.2.0", "image": "ghcr.io/example/sysctl-tuning"}}}}
    return _review(gate, f"dev-{i}")


def largest() -> bytes:
    """64 packages x (128 env Secrets + 16 imagePullSecrets), names padded to a 1.39 MiB object;
    every name holds TOKEN, for the sender to make each request's names new."""
    token, pad = TOKEN.decode(), "x" * 80
    packages = {}
    for p in range(64):
        packages[f"pkg-{token}-{chr(97 + p // 26)}{chr(97 + p % 26)}"] = {
            "version": "1.0.0", "image": f"ghcr.io/example/p{p}",
            "env": [{"name": f"E{i}", "valueFrom": {"secretKeyRef": {"name": f"s-{token}-{p}-{i}-{pad}", "key": "k"}}}
                    for i in range(128)],
            "imagePullSecrets": [{"name": f"r-{token}-{p}-{i}-{pad}"} for i in range(16)]}
    gate = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": f"hostile-{token}"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "paused": True, "packages": packages}}
    return _review(gate, "hostile")


def _fresh() -> bytes:
    return "".join(random.choices(string.ascii_lowercase, k=len(TOKEN))).encode()


# -- the two clients (processes of their own) ------------------------------------------------------

def _insecure() -> ssl.SSLContext:
    # A benchmark client of a loopback webhook: its certificate is the API server's business.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def run_legitimate(url: str, rate: float, seconds: float, first: int) -> dict[str, Any]:
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_insecure(), limit=64),
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(i: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            try:
                async with session.post(url + "/validate", data=legitimate(first + i),
                                        headers={"Content-Type": "application/json"}) as resp:
                    data = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures[type(exc).__name__] += 1
                return
            if status != 200:
                failures[f"HTTP {status}"] += 1
                return
            answer = json.loads(data)["response"]
            if not answer["allowed"]:
                failures["denied: " + answer.get("status", {}).get("message", "")[:80]] += 1
                return
            latencies.append(time.perf_counter() - at)

        start = time.perf_counter() + 0.05
        await asyncio.gather(*(one(i, start + i / rate) for i in range(int(rate * seconds))))
    latencies.sort()
    return {"answered": len(latencies), "failures": dict(failures),
            "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
            "p99_ms": 1000 * latencies[max(0, int(0.99 * len(latencies)) - 1)] if latencies else 0.0,
            "max_ms": 1000 * latencies[-1] if latencies else 0.0}


async def run_hostile(url: str, clients: int, seconds: float) -> dict[str, Any]:
    template = largest()
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_insecure(), limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=HOSTILE_TIMEOUT)) as session:
        async def client() -> None:
            while time.monotonic() < deadline:
                body = template.replace(TOKEN, _fresh())
                try:
                    async with session.post(url + "/validate", data=body,
                                            headers={"Content-Type": "application/json"}) as resp:
                        data = await resp.read()
                        if resp.status == 200:
                            outcomes["200 " + ("allowed" if json.loads(data)["response"]["allowed"]
                                               else "denied")] += 1
                        else:
                            outcomes[f"{resp.status}"] += 1
                            if resp.status == 429:
                                await asyncio.sleep(0.05)  # what a client told to retry shortly does
                except (aiohttp.ClientError, TimeoutError) as exc:
                    outcomes["gave up (10 s)" if isinstance(exc, TimeoutError) else type(exc).__name__] += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return {"outcomes": dict(outcomes), "body_bytes": len(template)}


def _client_main(args: argparse.Namespace) -> None:
    if args.command == "legitimate":
        result = asyncio.run(run_legitimate(args.url, args.rate, args.seconds, args.first))
    else:
        result = asyncio.run(run_hostile(args.url, args.clients, args.seconds))
    Path(args.out).write_text(json.dumps(result))


def _start_client(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.admission.hostile", *argv], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


# -- the webhook, read from outside -------------------------------------------------------------------

def metric(url: str, name: str) -> float:
    """A metric of the webhook; NaN when the webhook does not answer its /metrics within a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10, context=_insecure()) as resp:
                for line in resp.read().decode().splitlines():
                    if line.startswith(name + " "):
                        return float(line.split()[1])
            return 0.0
        except OSError:
            if time.monotonic() > deadline:
                return float("nan")
            time.sleep(1)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_ready(url: str, deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2, context=_insecure()) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the webhook did not become ready again")
        time.sleep(0.1)


async def grant(kube: KubeClient) -> None:
    """`use` on every package and `get` on every Secret of the operator's namespace, to the group."""
    rbac = "rbac.authorization.k8s.io/v1"
    subject = [{"kind": "Group", "name": GROUP, "apiGroup": "rbac.authorization.k8s.io"}]
    await kube.create(CLUSTERROLES, {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "bench-use"},
                                     "rules": [{"apiGroups": ["nodegate.io"], "resources": ["packages"],
                                                "verbs": ["use"]}]})
    await kube.create(CLUSTERROLEBINDINGS, {"apiVersion": rbac, "kind": "ClusterRoleBinding",
                                            "metadata": {"name": "bench-use"}, "subjects": subject,
                                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                        "kind": "ClusterRole", "name": "bench-use"}})
    await kube.create(ROLES, {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "bench-secrets"},
                              "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}, NAMESPACE)
    await kube.create(ROLEBINDINGS, {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "bench-secrets"},
                                     "subjects": subject, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                      "kind": "Role", "name": "bench-secrets"}},
                      NAMESPACE)


# -- the runs ---------------------------------------------------------------------------------------------

def one_run(name: str, url: str, pid: int, args: argparse.Namespace, first: int, hostile: bool,
            state: Path) -> dict[str, Any]:
    sent_before = metric(url, "nodegate_admission_subject_access_reviews_sent_total")
    refused_before = metric(url, "nodegate_admission_bodies_refused_total")
    legit_out, hostile_out = state / f"{name}-legit.json", state / f"{name}-hostile.json"
    procs = []
    if hostile:
        procs.append(_start_client("hostile", "--url", url, "--clients", str(args.hostile_clients),
                                   "--seconds", str(args.seconds), "--out", str(hostile_out)))
        time.sleep(2)  # the hostile load under way before the first legitimate review
    procs.append(_start_client("legitimate", "--url", url, "--rate", str(args.rate), "--seconds", str(args.seconds),
                               "--first", str(first), "--out", str(legit_out)))
    if hostile and args.py_spy:
        # Sampling the webhook while the hostile client runs: folded stacks, for flamegraph.pl or speedscope.
        out = Path(f"{args.py_spy}-{name.split()[0].strip(',')}.txt")
        subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-d",
                          str(int(args.seconds)), "-f", "raw", "-o", str(out), "-r", "50"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = rss_mib(pid)
    while any(p.poll() is None for p in procs):
        peak = max(peak, rss_mib(pid))
        time.sleep(0.2)
    result: dict[str, Any] = {"name": name, "legit": json.loads(legit_out.read_text()), "rss_peak_mib": peak,
                              "sars": metric(url, "nodegate_admission_subject_access_reviews_sent_total") - sent_before,
                              "bodies_refused": metric(url, "nodegate_admission_bodies_refused_total") - refused_before}
    if hostile:
        result["hostile"] = json.loads(hostile_out.read_text())
    return result


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    base = runs[0]["legit"]["p99_ms"] or 1.0
    lines = [f"legitimate: {args.rate:.0f} small NodeGate CREATEs per second for {args.seconds:.0f} s, one SAR each; "
             f"hostile: {args.hostile_clients} clients, each a {runs[1]['hostile']['body_bytes'] / 2**20:.2f} MiB "
             "CREATE of 9,280 SARs (new names every time) back to back", "",
             "| run | legit p50 / p99 / max | p99 vs baseline | legit failed | hostile requests | SARs sent | "
             "bodies refused (429) | webhook peak RSS |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        legit = run["legit"]
        failed = sum(legit["failures"].values())
        hostile = ", ".join(f"{k}: {v}" for k, v in sorted(run.get("hostile", {}).get("outcomes", {}).items())) or "-"
        lines.append(f"| {run['name']} | {legit['p50_ms']:.1f} / {legit['p99_ms']:.1f} / {legit['max_ms']:.1f} ms | "
                     f"{legit['p99_ms'] / base:.2f}x | {failed} of {legit['answered'] + failed} | {hostile} | "
                     f"{run['sars']:.0f} | {run['bodies_refused']:.0f} | {run['rss_peak_mib']:.0f} MiB |")
        for why, n in legit["failures"].items():
            lines.append(f"|   failed: {why} | {n} | | | | | | |")
    return "\n".join(lines)


async def _long(args: argparse.Namespace) -> None:
    from gate.devcluster.cluster import DevCluster, NodeSpec
    from gate.devcluster.services import WEBHOOK_PROCESS, install_crds, start_webhook, webhook_port

    state = Path(tempfile.mkdtemp(prefix="nodegate-hostile-"))
    cluster = DevCluster(state)
    try:
        await asyncio.to_thread(cluster.up, NodeSpec(0), progress=lambda m: None)
        await install_crds(cluster)
        await asyncio.to_thread(start_webhook, cluster, lambda m: None)
        async with await cluster.client() as kube:
            await grant(kube)
        url = f"https://127.0.0.1:{webhook_port(cluster)}"
        print(f"control plane in {state}; webhook on {url}", flush=True)
        await asyncio.sleep(2)  # RBAC's informers see the new bindings
        runs = []
        pid = cluster.processes()[WEBHOOK_PROCESS].pid
        runs.append(await asyncio.to_thread(one_run, "baseline", url, pid, args, 0, False, state))
        print(f"baseline: {runs[-1]['legit']}", flush=True)
        runs.append(await asyncio.to_thread(one_run, "with the hostile client", url, pid, args, 100_000, True, state))
        print(f"hostile: {runs[-1]['legit']}", flush=True)
        if not args.skip_unbounded:
            env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
                   "NODEGATE_WEBHOOK_SAR_MAX_IN_FLIGHT": "1000000", "NODEGATE_WEBHOOK_SAR_PER_REQUEST": "1000000",
                   "NODEGATE_WEBHOOK_MAX_BODIES_BYTES": str(2**40)}
            pid = cluster.restart(WEBHOOK_PROCESS, env=env).pid
            wait_ready(url, time.monotonic() + 60)
            runs.append(await asyncio.to_thread(one_run, "hostile, bounds off", url, pid, args, 200_000, True, state))
        print(report(runs, args))
    finally:
        await asyncio.to_thread(cluster.down, quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    legit = sub.add_parser("legitimate", help="the legitimate client (a process of the long mode)")
    legit.add_argument("--first", type=int, default=0)
    hostile = sub.add_parser("hostile", help="the hostile client (a process of the long mode)")
    hostile.add_argument("--clients", type=int, default=16)
    for p in (legit, hostile):
        p.add_argument("--url", required=True)
        p.add_argument("--out", required=True)
    for p in (legit, hostile, parser):
        p.add_argument("--seconds", type=float, default=30.0)
    for p in (legit, parser):
        p.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--hostile-clients", type=int, default=16)
    parser.add_argument("--skip-unbounded", action="store_true", help="leave out the run with the bounds off")
    parser.add_argument("--py-spy", default="", help="record the webhook with py-spy during the hostile runs into "
                                                      "<this>-<run>.txt (py-spy installed next to python)")
    args = parser.parse_args()
    if args.command:
        _client_main(args)
    else:
        asyncio.run(_long(args))


if __name__ == "__main__":
    main()
