"""The two servers the benchmark compares, each run as a process of its own:

* `ours`: the real AdmissionServer (the same aiohttp app `nodegate webhook serve` runs) with in-memory
  facts (40 NodeGates, 10 of them readinessTaint gates) and an authorizer answering yes. The SAR round
  trip is the API server's cost, not ours, and in steady state the SAR cache answers it.
* `bare`: an aiohttp TLS handler that reads the body and returns a fixed "allowed" review.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

from aiohttp import web

from gate.admission.server import AdmissionServer, settle_garbage_collector
from gate.admission.testing import FixedAuthorizer, StaticFacts
from gate.certs.reload import ReloadableCertificate

ALLOWED = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "response": {"uid": "fixed", "allowed": True}}).encode()


def gates() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(40):
        out.append({"metadata": {"name": f"gate-{i}"}, "spec": {
            "readinessTaint": i % 4 == 0,
            "nodeSelector": {"matchLabels": {"pool": f"pool-{i}"},
                             "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}}})
    return out


def bare_app() -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ALLOWED, content_type="application/json")

    app = web.Application()
    app.router.add_post("/validate", handler)
    app.router.add_post("/mutate", handler)
    return app


async def main(kind: str, port: int, cert: Path, key: Path) -> None:
    certificate = ReloadableCertificate()
    certificate.load(cert.read_bytes(), key.read_bytes())
    if kind == "ours":
        app = AdmissionServer(facts=StaticFacts(gates=gates(), policies=["fleet"]),
                              authorizer=FixedAuthorizer(record=False), certificate=certificate).app()
    else:
        app = bare_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=certificate.context, backlog=1024).start()
    if kind == "ours":
        settle_garbage_collector()  # as `nodegate webhook serve` does once it listens
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["ours", "bare"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    a = p.parse_args()
    asyncio.run(main(a.kind, a.port, a.cert, a.key))
