"""The real AdmissionServer over real TLS on loopback, in a thread of its own (so sync clients and
hypothesis can drive it)."""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gate.admission.bodies import BodyBudget
from gate.admission.notices import NoticeSink
from gate.admission.server import AdmissionServer
from gate.admission.testing import FixedAuthorizer, StaticFacts
from gate.certs import pki
from gate.certs.reload import ReloadableCertificate


@dataclass
class Running:
    port: int
    ca: pki.KeyPair
    server: AdmissionServer
    certificate: ReloadableCertificate
    loop: asyncio.AbstractEventLoop

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        return ctx

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.client_context(), timeout=10)

    def call(self, fn: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(fn, self.loop).result(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(*, facts: StaticFacts | None = None, authorizer: FixedAuthorizer | None = None,
                   load_certificate: bool = True, max_body_bytes: int = 3 * 1024 * 1024,
                   bodies: BodyBudget | None = None, notices: NoticeSink | None = None) -> Iterator[Running]:
    ca = pki.create_ca("test-ca")
    certificate = ReloadableCertificate()
    if load_certificate:
        leaf = pki.issue(ca, "webhook", hosts=["127.0.0.1"], server=True)
        certificate.load(leaf.cert_pem, leaf.key_pem)
    server = AdmissionServer(facts=facts or StaticFacts(), authorizer=authorizer or FixedAuthorizer(),
                             certificate=certificate, max_body_bytes=max_body_bytes, bodies=bodies, notices=notices)
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port, ssl_context=certificate.context).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield Running(port, ca, server, certificate, loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
