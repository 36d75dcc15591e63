"""The operator process: the wiring of its parts, as controller-runtime's manager wires a controller.

* Leader election (`gate.kube.lease`) through a client of its own (`gate.controller.clients`): only
  the leader works, and its work's writes pass the leader's fence (`gate.kube.fence`), so none goes
  out after the renew deadline; a standby serves health and waits.
* The caches and the index (`gate.controller.world`), fed by watches; their events go through the
  pure handlers of `gate.controller.triggers` into the work queue (`gate.controller.queue`) as typed
  keys.
* Workers take keys off the queue and hand each to its reconciler:
  - `GateKey` and `PolicyKey`: `gate.controller.gates` (plan the gate across the fleet, or its removal;
    a DeploymentPolicy's status), debounced: many node events make one gate reconcile;
  - `NodeKey`, `JoinKey` and `TaintKey`: `gate.controller.nodes` (one step of a node's state machine;
    the readiness taint of a node that just joined, or that no gate holds back any longer);
  - `HistoryKey`: `gate.controller.history` (the gate's spec as its newest ControllerRevision).
  Each reads only the caches, decides with the pure core, has an applier (`gate.controller.executor`)
  send the decision, and returns when to look again (`gate.controller.result`), which `_look_again`
  turns into the queue's calls. Every Node write carries the resourceVersion it was decided on, so a
  decision made on a stale copy is refused by the API server (409) and simply decided again.
* Health and metrics (`gate.controller.health`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from gate import __version__
from gate.api import keys
from gate.api.common import Obj
from gate.api.records import unsigned
from gate.api.state import StateParseError, load_state
from gate.controller import signing, triggers
from gate.controller.clients import OperatorClients
from gate.controller.endpoints import EndpointBook
from gate.controller.events import EventRecorder
from gate.controller.gate_applier import GateApplier
from gate.controller.gates import GateReconciler, PolicyReconciler
from gate.controller.health import Health
from gate.controller.history import HistoryReconciler
from gate.controller.images import ImageResolver, ImagesUnresolved
from gate.controller.imagetrust import ImageTrust
from gate.controller.metrics import OperatorMetrics
from gate.controller.node_applier import NodeApplier
from gate.controller.nodes import JoinReconciler, NodeReconciler, TaintReconciler
from gate.controller.prepull import Prepuller
from gate.controller.queue import WorkQueue
from gate.controller.result import DONE, Result
from gate.controller.settings import OperatorSettings
from gate.controller.signals import SignalReader
from gate.controller.staging import Stager
from gate.controller.triggers import GateKey, HistoryKey, JoinKey, NodeKey, PolicyKey, TaintKey, Triggered
from gate.controller.workloads import gates_protecting
from gate.controller.world import World
from gate.kube.cache import WatchCache
from gate.kube.client import NODES
from gate.kube.errors import ApiError, Conflict, ConnectionFailed
from gate.kube.lease import LeaderElector
from gate.lifecycle.node import Timing
from gate.lifecycle.serving import ServingCatalog

log = logging.getLogger("nodegate.operator")


class Operator:
    def __init__(self, settings: OperatorSettings, clients: OperatorClients,
                 metrics: OperatorMetrics | None = None, serving: ServingCatalog | None = None) -> None:
        self.settings = settings
        client = self.client = clients.work
        self.metrics = metrics or OperatorMetrics()
        recorder = self.recorder = EventRecorder(client, settings.identity)
        timing = Timing(image_pull_grace=settings.image_pull_grace, pending_timeout=settings.pending_timeout,
                        reboot_timeout=settings.reboot_timeout, poll=settings.poll_seconds,
                        health_poll=settings.health_poll_seconds)
        self.world = World(settings, client)
        # The image signature policy (--image-signatures): read now, so a bad file stops the start.
        self.image_trust = ImageTrust(settings, self.metrics)
        gate_applier = GateApplier(settings, client, self.metrics, recorder, self.world)
        node_applier = NodeApplier(settings, client, self.metrics, recorder, self.world)
        prepuller = Prepuller(settings, self.world, self.metrics)
        # Which packages stage while serving: the catalog's, which the command hands in (`gate.cli.operator`).
        stager = Stager(settings, self.world, client, serving or ServingCatalog(), self.metrics, self.image_trust)
        # The Prometheus endpoints the installer configured: the only ones a policy may name.
        self.endpoints = EndpointBook(settings.prometheus_endpoints or None)
        self.gates = GateReconciler(self.metrics, self.world, gate_applier,
                                    ImageResolver(settings, client, self.metrics, self.image_trust), prepuller,
                                    self.endpoints, stager)
        self.policies = PolicyReconciler(client, self.world, self.endpoints)
        self.signals = SignalReader(self.endpoints, interval=settings.health_poll_seconds,
                                    concurrency=settings.health_queries)
        self.nodes = NodeReconciler(settings, client, timing, self.world, node_applier, self.signals,
                                   prepuller, self.image_trust, stager)
        self.joins = JoinReconciler(self.world, node_applier)
        self.taints = TaintReconciler(self.world, node_applier)
        self.history = HistoryReconciler(settings, client, self.world)
        self.ready = False
        self.elector = LeaderElector(clients.lease, settings.lease_name, settings.namespace, settings.identity,
                                     lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds,
                                     renew_deadline=settings.renew_deadline, fence=clients.fence,
                                     annotations={keys.OPERATOR_VERSION_ANNOTATION: __version__})
        self.health = Health(settings, client, self.metrics, lambda: self.elector.is_leader, lambda: self.ready)

    async def run(self) -> None:
        """Serve health and metrics, and do the work whenever this replica is the leader."""
        runner = await self.health.serve()
        try:
            await self.elector.run(self._lead, self._stand_down)
        finally:
            if runner is not None:
                await runner.cleanup()

    async def _lead(self) -> None:
        world = self.world
        self.metrics.leader.set(1)
        world.queue = WorkQueue()
        self.history.recorded.clear()  # the history may have changed while another replica led
        for cache in world.caches:
            cache.synced = False
        world.pods.subscribe(self._on_pod)
        world.workloads.subscribe(self._on_workload)
        world.nodes.subscribe(self._on_node)
        world.gates.subscribe(self._on_gate)
        world.policies.subscribe(self._on_policy)
        try:
            adopt = await self._load_key()
            await self._start_caches(world.caches)
            for pod in world.pods.items():
                if not triggers.is_staging_pod(pod):
                    world.index.pod_event("ADDED", pod)
            for pod in world.workloads.items():
                world.workload_index.pod_event("ADDED", pod)
            await self._sign_records(adopt=adopt)
            self.ready = True
            gc.freeze()  # the first lists and the imports live long: out of the collector's scans (gate.cli.operator)
            log.info("Caches synced; gates=%d nodes=%d", len(world.gates), len(world.nodes))
            for gate in world.gates.items():  # everything, as on a spec change of every gate
                self._queue(triggers.on_gate(gate, None, world.nodes.items()))
            for policy in world.policies.items():
                world.queue.add(PolicyKey(policy["metadata"]["name"]))
            for node in world.nodes.items():  # with no gate at all, no gate event looks at the taints
                if triggers.needs_taint_look(node):
                    world.queue.add(TaintKey(node["metadata"]["name"]))
            workers = [asyncio.create_task(self._worker(i)) for i in range(self.settings.workers)]
            workers.append(asyncio.create_task(self._resync()))
            workers.append(asyncio.create_task(self._watch_image_policy()))
            await asyncio.gather(*workers)
        finally:
            self.ready = False
            gc.unfreeze()  # what the caches held goes back to the collector: a standby holds none of it
            world.queue.close()
            await self.signals.close()
            for cache in world.caches:
                await cache.stop()
                cache._listeners.clear()

    async def _load_key(self) -> bool:
        """The record signing key, loaded (or created) once, when this replica first leads; whether the
        records on the nodes still wait for adoption (`gate.controller.signing`)."""
        delay = 0.5
        while True:
            try:
                ring, pending = await signing.load_or_create(self.client, self.settings.namespace,
                                                             self.settings.state_key_secret)
                break
            except (ApiError, ConnectionFailed) as exc:
                log.warning("Signing key not loaded; secret=%s/%s error=%s retry_in=%.1fs", self.settings.namespace,
                            self.settings.state_key_secret, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        if self.world.signer is None:
            self.world.signer = signing.Signer(ring, self.world.gate_uid)
            self.world.trust_epoch += 1
            log.info("Loaded the record signing key; secret=%s/%s keys=%d signing=%s", self.settings.namespace,
                     self.settings.state_key_secret, len(ring.keys), ring.signing_id)
        return pending

    async def _sign_records(self, *, adopt: bool) -> None:
        """Before any work: sign anew, with the newest key, the records that need it
        (`gate.controller.signing.needs_signing`): those of an older key after a rotation, and with
        `adopt` (trust on first use, the key was just created) those an operator that did not sign left,
        then mark the adoption done: from then on an unsigned record is not the operator's."""
        world, signer = self.world, self.world.signer
        assert signer is not None
        if not adopt and len(signer.ring.keys) == 1:
            return
        signed: dict[str, int] = {}
        for name in [n["metadata"]["name"] for n in world.nodes.items()]:
            for _ in range(100):
                node = world.nodes.get(name)
                if node is None:
                    break
                annotations: dict[str, str] = {}
                for key, raw in (node["metadata"].get("annotations") or {}).items():
                    gname = keys.gate_of_state_annotation(key)
                    gate = world.gate(gname) if gname is not None else None
                    if gate is None:
                        continue
                    try:
                        state = load_state(raw)
                    except StateParseError:
                        continue  # reported as unreadable, as before
                    if signing.needs_signing(signer, gate.name, node, state, adopt=adopt):
                        annotations[key] = signer.sign(gate, node, unsigned(state)).dump()
                if not annotations:
                    break
                patch = {"metadata": {"annotations": annotations,
                                      "resourceVersion": node["metadata"]["resourceVersion"]}}
                try:
                    world.nodes.observe(await self.client.patch(NODES, name, patch))
                except Conflict:  # the node changed since the cache saw it: look at what it holds now
                    await asyncio.sleep(0.1)
                    continue
                for key in annotations:
                    gname = str(keys.gate_of_state_annotation(key))
                    signed[gname] = signed.get(gname, 0) + 1
                break
        if adopt:
            await signing.adoption_done(self.client, self.settings.namespace, self.settings.state_key_secret)
        world.trust_epoch += 1
        what = "Adopted the node records written before records were signed" if adopt else \
            "Signed the node records of older keys with the newest"
        log.warning("%s; records=%d gates=%s key=%s", what, sum(signed.values()), ",".join(sorted(signed)) or "-",
                    signer.ring.signing_id)
        if not adopt:
            return
        for gate_name, count in sorted(signed.items()):
            obj = world.gates.get(gate_name)
            if obj is not None:
                await self.recorder.emit(obj, "Normal", "RecordsAdopted",
                                         f"NodeGate signed {count} node record{'s' if count != 1 else ''} of this gate "
                                         "that it found unsigned when it created its signing key (trust on first "
                                         "use: an upgrade from an operator that did not sign)")

    async def _start_caches(self, caches: tuple[WatchCache, ...]) -> None:
        delay = 0.5
        while True:
            try:
                await asyncio.gather(*(c.start() for c in caches if not c.synced))
                return
            except (ApiError, ConnectionFailed) as exc:
                hint = " (are the NodeGate CRDs installed?)" if isinstance(exc, ApiError) and exc.status == 404 else ""
                log.warning("Caches did not sync%s; error=%s retry_in=%.1fs", hint, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _stand_down(self) -> None:
        self.metrics.leader.set(0)
        self.ready = False
        log.warning("Stopped all work: not the leader")

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            # A safety net, not the engine: every change arrives as an event; this catches a lost one.
            for gate in self.world.gates.items():
                self._queue(triggers.on_gate(gate, None, self.world.nodes.items()))

    async def _watch_image_policy(self) -> None:
        """A changed image signature policy judges every digest again: every gate is reconciled now
        (its reconcile judges its images before it plans; node reconciles wait for that)."""
        while True:
            await asyncio.sleep(self.settings.poll_seconds)
            if self.image_trust.changed():
                log.info("Image signature policy changed, every gate's images are judged again; gates=%d",
                         len(self.world.gates))
                for gate in self.world.gates.items():
                    self._queue(triggers.on_gate(gate, None, self.world.nodes.items()))

    async def _worker(self, number: int) -> None:
        queue = self.world.queue
        while True:
            key = await queue.get()
            started = time.monotonic()
            try:
                result = DONE
                match key:
                    case GateKey(gate):
                        result = await self.gates.reconcile(key)
                        self.world.gate_cost[gate] = time.monotonic() - started
                    case PolicyKey():
                        await self.policies.reconcile(key)
                    case JoinKey():
                        result = await self.joins.reconcile(key)
                    case TaintKey():
                        result = await self.taints.reconcile(key)
                    case NodeKey():
                        result = await self.nodes.reconcile(key)
                    case HistoryKey():
                        result = await self.history.reconcile(key)
                queue.forget(key)
                self._look_again(result)
            except asyncio.CancelledError:
                raise
            except (ApiError, ConnectionFailed, ImagesUnresolved) as exc:
                # Temporary: asked again with backoff (ImagesUnresolved: the gate's status and an Event say why).
                delay = queue.retry(key)
                level = logging.DEBUG if isinstance(exc, ApiError) and exc.status == 409 else logging.WARNING
                log.log(level, "Reconcile failed; key=%s error=%s retry_in=%.2fs", key, exc, delay)
                self.metrics.reconcile_errors.labels(key.kind, type(exc).__name__).inc()
            except Exception as exc:
                delay = queue.retry(key)
                log.exception("Reconcile crashed; key=%s retry_in=%.2fs", key, delay)
                self.metrics.reconcile_errors.labels(key.kind, type(exc).__name__).inc()
            finally:
                queue.done(key)
                self.metrics.reconcile_duration.labels(key.kind).observe(time.monotonic() - started)
                self.metrics.queue_depth.set(len(queue))

    def _look_again(self, result: Result) -> None:
        """The one place a reconcile's `Result` becomes the queue's calls (controller-runtime's
        reconcileHandler): each key after its delay (a key being processed now is queued again once
        its worker is done), each gate debounced."""
        for key, after in result.looks.items():
            self.world.queue.add_after(key, after)
        for gate in sorted(result.replan):
            self.world.gate_later(gate)

    # -- event handlers: map changes to keys ------------------------------------------------------

    def _queue(self, triggered: Triggered) -> None:
        for key in triggered.now:
            self.world.queue.add(key)
        for gate in triggered.later:
            self.world.gate_later(gate)
        for gate in triggered.soon:
            self.world.gate_later(gate, soon=True)

    def _on_gate(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        world = self.world
        if kind in ("ADDED", "DELETED"):
            world.trust_epoch += 1  # records check against the gates' uids: parse the fleet again
        self._queue(triggers.on_gate(obj, world.gate_seen.get(name), world.nodes.items(), world.policies.items(),
                                     kind=kind))
        world.gate_seen[name] = triggers.gate_seen(obj)

    def _on_policy(self, kind: str, obj: Obj) -> None:
        self._queue(triggers.on_policy(kind, obj, self.world.gates.items()))

    def _on_node(self, kind: str, obj: Obj) -> None:
        replan = self.world.node_replans(kind, obj)
        self._queue(triggers.on_node(kind, obj, self.world.gates.items(), replan=replan,
                                     in_round=self.world.rounds_on(obj["metadata"]["name"])))

    def _on_workload(self, kind: str, pod: Obj) -> None:
        """A pod anywhere started or ended on a node: plan the gates it is a protected pod of, so that
        a node whose protected job ended is picked in its turn."""
        changed = self.world.workload_index.pod_event(kind, pod)
        if changed:
            gates = [(g.name, g.spec.pod_non_interrupt_labels) for g in self.world.all_gates()]
            for gate in gates_protecting(changed, gates):
                self.world.gate_later(gate)

    def _on_pod(self, kind: str, pod: Obj) -> None:
        fleet = triggers.is_staging_pod(pod)  # never a round's stage pod: not in the stage pod index
        owner = triggers.on_staging_pod(kind, pod) if fleet else triggers.on_prepull_pod(kind, pod)
        if owner is not None:
            gate, node = owner
            # Its node's round may be waiting for it before its cordon, and its end (or going) frees a slot of the
            # bound (a deleted gate's finalizer waits for its last staging or undo pod to go).
            self._queue(Triggered(now=(NodeKey(gate, node),) if self.world.in_progress(gate, node) else (),
                                  soon=(gate,)))
        if fleet or owner is not None:
            return
        self.world.index.pod_event(kind, pod)
        stage = triggers.stage_owner(pod)
        self._queue(triggers.on_pod(kind, pod, in_round=stage is not None and self.world.in_progress(*stage)))


__all__ = ["Operator"]
