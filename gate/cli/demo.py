"""`nodegate demo`: a live rollout on a local control plane with simulated nodes, start to end.

The story, in six steps: start (or restart) the demo's own control plane with 60 simulated nodes in
three compartments, the admission webhook and the operator; show a bad spec refused by the webhook;
apply the demo's DeploymentPolicy and NodeGate (the example packages); follow the rollout live until
a planted failure stops one compartment; fix it, rerun the package on that node and resume the
compartment with the same `nodegate` commands a person would type; follow it to the end, summarise,
and say how to explore further. Ctrl-C stops everything the demo started.

Ctrl-C is honoured at every moment, which takes three things. SIGINT gets Python's handler even when
the demo was started with SIGINT ignored (a `&` job of a script inherits that), and SIGTERM counts as
a Ctrl-C, so the demo never leaves its control plane behind. A Ctrl-C inside an event loop reaches
this module as KeyboardInterrupt: `asyncio.run` cancels its task and raises it, which holds only as
long as no code on the way swallows the cancellation (`gate.kube.cache.WatchCache.stop` once did),
and only once the loop exists: a Ctrl-C while `asyncio.run` is still building its loop leaves a
half-made loop whose finaliser prints a traceback, so `run_async` builds the loop with the signals
held back (they arrive the moment it is whole).
And a command the demo runs for the person (`nodegate rerun ...`) turns a Ctrl-C into exit code 130,
which the demo turns back into KeyboardInterrupt rather than a failed step.

The demo runs those commands through the `nodegate` entry point it is given (`cli`), rather than
importing `gate.cli.main`, which imports this module: no import circle (a contract in .importlinter).

The demo keeps its state in its own directory (`~/.cache/nodegate/demo`), so it never touches a
cluster `nodegate dev up` started. `--quick` runs the same story on 12 nodes with short stages and
stops the control plane at the end: the integration tests run it that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gate.cli.errors import CliError

MANIFESTS = Path(__file__).resolve().parent / "demo_manifests"
GATE = "host-tuning"
POLICY = "demo-fleet"
DEMO_LABEL = "nodegate.dev/demo"
POOL_LABEL = "nodegate.dev/pool"
POOLS = ("canary", "pool-a", "pool-b")
FAILING_POOL = "pool-b"
FAILING_PACKAGE = "chrony-conf"
FAILURE_STAGE_NAME = "demo-planted-failure"
# What the agent would say on a node without chrony: its JSON summary, as a stage pod leaves it.
FAILURE_SUMMARY = {"package": FAILING_PACKAGE, "version": "1.0.0", "stage": "apply", "ok": False,
                   "failedStep": "enable-confdir", "exitCode": 1,
                   "message": "/etc/chrony/chrony.conf not found: is chrony installed?", "durationSeconds": 0.04}
# Fast operator settings for simulated nodes, whose stages take a second or less.
OPERATOR_FLAGS = ["--poll-seconds", "0.5", "--image-pull-grace", "10", "--pending-timeout", "60",
                  "--reboot-timeout", "60", "--resync-seconds", "30"]


Cli = Callable[[Sequence[str]], int]  # the `nodegate` entry point: argv -> exit code
INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT)
T = TypeVar("T")


class DemoError(RuntimeError):
    """The demo could not tell its story (something did not happen in time); the message says what."""


@dataclass(frozen=True)
class DemoSettings:
    nodes: int
    job_seconds: float
    quick: bool
    keep: bool  # leave the control plane running at the end
    state_dir: Path
    phase_timeout: float  # longest wait for one phase of the rollout
    cert_manager: bool = False  # the webhook's certificate from the real cert-manager, not self-managed

    @property
    def pools(self) -> dict[str, int]:
        return pool_sizes(self.nodes)


def pool_sizes(nodes: int) -> dict[str, int]:
    """How many nodes each compartment gets: a small canary, the rest split between the pools."""
    if nodes < 6:
        raise CliError("the demo needs at least 6 nodes (2 per compartment)")
    canary = max(2, round(nodes / 15))
    pool_a = (nodes - canary) // 2
    return {"canary": canary, "pool-a": pool_a, "pool-b": nodes - canary - pool_a}


def default_state_dir() -> Path:
    from gate.devcluster.build import cache_root

    return Path(os.environ.get("NODEGATE_DEMO_DIR", cache_root() / "demo"))


def manifest(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((MANIFESTS / name).read_text())
    return data


def failing_node(names: list[str]) -> str:
    """A pool-b node in the compartment's second batch: the first batch succeeds, the second fails.

    Nodes are picked in the order of `gate.rollout.order_key`, and the linear strategy's first batch
    has two nodes, so the third node in that order is in batch 2 whatever the pool's size."""
    from gate.rollout import order_key

    return sorted(names, key=order_key)[2]


# -- output --------------------------------------------------------------------------------------


class Narrator:
    """Step headers, commands and remarks; rich in a terminal, plain text otherwise."""

    def __init__(self, quick: bool) -> None:
        from rich.console import Console

        self.console = Console(highlight=False)
        self.rich = sys.stdout.isatty()
        self.quick = quick
        self.step = 0
        self.steps = 6

    def header(self, text: str) -> None:
        self.step += 1
        if self.rich:
            self.console.rule(f"[bold]Step {self.step}/{self.steps}  {text}", align="left")
        else:
            print(f"\n== Step {self.step}/{self.steps}: {text}", flush=True)

    def say(self, text: str) -> None:
        if self.rich:
            self.console.print(text)
        else:
            print(text, flush=True)

    def command(self, text: str) -> None:
        if self.rich:
            self.console.print(f"[bold cyan]$ {text}[/]")
        else:
            print(f"$ {text}", flush=True)

    def progress(self, text: str) -> None:
        if self.rich:
            self.console.print(f"[dim]  {text}[/]")
        else:
            print(f"  {text}", flush=True)

    def pause(self, seconds: float) -> None:
        """Time to read, in a terminal; none in quick mode or when nobody is watching."""
        if self.rich and not self.quick:
            time.sleep(seconds)


# -- the story -----------------------------------------------------------------------------------


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, with SIGINT and SIGTERM held back while the event loop is built (a Ctrl-C
    that lands inside the loop's constructor leaves a half-made loop that fails in its finaliser);
    one held back arrives as soon as the loop is whole, and interrupts `run` as any other would."""
    runner = asyncio.Runner()
    try:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            runner.get_loop()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return runner.run(coro)
    finally:
        coro.close()  # no-op once run; a coroutine never started must not warn it was never awaited
        runner.close()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside: SIGINT raises KeyboardInterrupt (Python's handler, even if SIGINT was inherited ignored),
    and SIGTERM does what SIGINT does. The previous handlers come back on the way out."""

    def terminate(signum: int, frame: object) -> None:
        signal.raise_signal(signal.SIGINT)  # through whichever SIGINT handler is current (asyncio.run's)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(*, quick: bool, nodes: int | None, state_dir: Path | None, cli: Cli, keep: bool = False,
             down: bool = False, cert_manager: bool = False) -> int:
    with interruptible():
        return _run_demo(quick=quick, nodes=nodes, state_dir=state_dir, cli=cli, keep=keep, down=down,
                         cert_manager=cert_manager)


def _run_demo(*, quick: bool, nodes: int | None, state_dir: Path | None, cli: Cli, keep: bool,
              down: bool, cert_manager: bool = False) -> int:
    from gate.devcluster.cluster import DevCluster

    settings = DemoSettings(
        nodes=nodes or (12 if quick else 60), job_seconds=0.3 if quick else 1.0, quick=quick,
        keep=keep or not quick, state_dir=(state_dir or default_state_dir()).resolve(),
        phase_timeout=240.0 if quick else 600.0, cert_manager=cert_manager,
    )
    cluster = DevCluster(settings.state_dir)
    if down:
        stopped = cluster.down(quiet=True)
        print(f"Stopped the demo's {', '.join(stopped)}." if stopped else "The demo was not running.")
        return 0
    pool_sizes(settings.nodes)  # refuse a bad --nodes before starting anything
    say = Narrator(quick)
    started = time.monotonic()
    try:
        _story(cluster, settings, say, cli)
    except KeyboardInterrupt:
        # A second Ctrl-C must not cut the clean-up short (it takes seconds): it would leave processes.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        say.say("\nInterrupted: stopping the demo's control plane ...")
        cluster.down(quiet=True)
        return INTERRUPTED
    except (DemoError, CliError) as exc:
        say.say(f"\nThe demo failed: {exc}")
        say.say(f"Process logs: {cluster.logs}")
        cluster.down(quiet=True, keep_state=True)
        return 1
    except BaseException:
        cluster.down(quiet=True, keep_state=True)
        raise
    say.say(f"\nThe demo took {time.monotonic() - started:.0f}s.")
    if settings.keep:
        _explore(cluster, say)
    else:
        cluster.down(quiet=True)
        say.say("Stopped the demo's control plane (--quick).")
    return 0


def _story(cluster: Any, settings: DemoSettings, say: Narrator, cli: Cli) -> None:
    from gate.devcluster import services
    from gate.devcluster.cluster import NodeSpec

    pools = settings.pools
    say.header(f"A real control plane with {settings.nodes} simulated nodes")
    if cluster.processes():
        say.progress(f"Stopping the previous demo run ({settings.state_dir}) to start afresh ...")
        cluster.down(quiet=True)
    cluster.up(None, job_seconds=settings.job_seconds, progress=say.progress)
    names: dict[str, list[str]] = {}
    for pool, count in pools.items():
        spec = NodeSpec(count, {DEMO_LABEL: "true", POOL_LABEL: pool}, prefix=f"{pool}-")
        names[pool] = run_async(cluster.add_nodes(spec))
    say.progress("Nodes: " + ", ".join(f"{n} in {p}" for p, n in pools.items()) +
                 f" (kwok plays their kubelet; a stage takes {settings.job_seconds:g}s)")
    run_async(services.install_crds(cluster))
    if settings.cert_manager:
        from gate.devcluster import certmanager

        say.progress("The webhook's certificate comes from cert-manager (its controller and cainjector run "
                     "next to the control plane).")
        certmanager.start_webhook(cluster, say.progress)
    else:
        services.start_webhook(cluster, say.progress)
    services.start_operator(cluster, say.progress, extra=OPERATOR_FLAGS)
    # Everything below talks to the demo cluster, as `export KUBECONFIG=...` would make it.
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    ledger = PodLedger()
    ledger.start()
    try:
        _rollout(settings, say, cli, names, ledger)
    finally:
        ledger.stop()


def _rollout(settings: DemoSettings, say: Narrator, cli: Cli, names: dict[str, list[str]], ledger: PodLedger
             ) -> None:
    say.header("Admission: a bad spec is refused with its reason")
    run_async(_apply(manifest("policy.yaml")))
    say.command("kubectl apply -f bad-gate.yaml   # sysctl-tuning 1.0.0 with the image tag :2.0.0")
    refusal = run_async(_refused(manifest("bad-gate.yaml")))
    say.say(f"[red]{_escape(refusal)}[/]" if say.rich else refusal)
    say.pause(3)

    bad_node = failing_node(names[FAILING_POOL])
    say.header(f"Rolling out NodeGate {GATE} under DeploymentPolicy {POLICY}")
    run_async(_plant_failure(bad_node))
    say.say(f"Planted failure: node {bad_node} has no chrony, so {FAILING_PACKAGE} fails there "
            f"(a kwok Stage fails its pod with the agent's summary).")
    run_async(_apply(manifest("gate.yaml")))
    say.command(f"kubectl apply -f {POLICY}.yaml -f {GATE}.yaml")
    say.pause(2)
    _follow(say, settings, f"{FAILING_POOL} stops at its failed batch; the other compartments carry on",
            lambda r: _compartment_state(r, FAILING_POOL) == "stopped")
    report = run_async(_report())
    failed = [f for f in report.failed if f.name == bad_node]
    if not failed:
        raise DemoError(f"{FAILING_POOL} stopped, but node {bad_node} is not among the failed nodes")
    say.say(f"Node {bad_node} failed in {failed[0].where}: {failed[0].reason}: {failed[0].message}")
    say.say(f"Its batch failed, and with failureThreshold 1 compartment {FAILING_POOL} stopped: it starts "
            "nothing new until a person resumes it. The node stays cordoned.")
    say.pause(4)

    say.header(f"Fix the node, rerun {FAILING_PACKAGE} there, resume {FAILING_POOL}")
    run_async(_remove_failure())
    say.say(f"(Installing chrony on {bad_node}: here, removing the planted failure.)")
    for argv in (["package", "logs", bad_node, FAILING_PACKAGE],
                 ["rerun", GATE, "--node", bad_node, "--package", FAILING_PACKAGE],
                 ["resume", GATE, "--compartment", FAILING_POOL]):
        _run_command(cli, argv, say)
    say.pause(2)

    say.header("Following the rollout to the end")
    _follow(say, settings, "every node completes", lambda r: r.done and r.summary == "Ready")

    say.header("Summary")
    report = run_async(_report())
    if not report.done:
        raise DemoError(f"the rollout ended with {report.complete} of {report.matched} nodes complete")
    evidence = run_async(_settled_evidence(sorted(n for pool in names.values() for n in pool), ledger))
    for line in summary_lines(report, evidence, bad_node):
        say.say(line)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _run_command(cli: Cli, argv: list[str], say: Narrator) -> None:
    say.command("nodegate " + " ".join(argv))
    code = cli(argv)
    if code == INTERRUPTED:  # the command met the person's Ctrl-C: the demo stops, it did not fail
        raise KeyboardInterrupt
    if code != 0:
        raise DemoError(f"`nodegate {' '.join(argv)}` exited {code}")


def _compartment_state(report: Any, name: str) -> str | None:
    for c in report.compartments:
        if c.name == name:
            state: str = c.state
            return state
    return None


# -- talking to the cluster ----------------------------------------------------------------------


async def _client() -> Any:
    from gate.kube.client import KubeClient

    return await KubeClient.from_kubeconfig(os.environ["KUBECONFIG"], user_agent="nodegate-demo")


async def _apply(obj: dict[str, Any]) -> None:
    async with await _client() as kube:
        await kube.apply(obj, field_manager="nodegate-demo")


async def _refused(obj: dict[str, Any]) -> str:
    from gate.kube.client import NODEGATES
    from gate.kube.errors import ApiError

    async with await _client() as kube:
        try:
            await kube.create(NODEGATES, obj, dry_run=True)
        except ApiError as exc:
            return f'Error from server: {exc.message}'
    raise DemoError("the API server admitted a NodeGate whose image tag differs from its version: "
                    "is the admission webhook registered?")


async def _plant_failure(node: str) -> None:
    from gate.devcluster.stages import failing_stage

    stage = failing_stage(FAILURE_STAGE_NAME, nodes=[node], package=FAILING_PACKAGE, stage="apply",
                          message=json.dumps(FAILURE_SUMMARY, separators=(",", ":")))
    async with await _client() as kube:
        await kube.apply(stage, field_manager="nodegate-demo")


async def _remove_failure() -> None:
    from gate.kube.client import KWOK_STAGES

    async with await _client() as kube:
        await kube.delete(KWOK_STAGES, FAILURE_STAGE_NAME)


async def _report() -> Any:
    from gate.cli.snapshot import fetch_snapshot, reports_of

    async with await _client() as kube:
        [report] = reports_of(await fetch_snapshot(kube, "nodegate-system", GATE), GATE)
    return report


def _follow(say: Narrator, settings: DemoSettings, until_text: str, until: Callable[[Any], bool]) -> None:
    say.progress(f"Live status until {until_text} ...")
    run_async(_follow_async(say, settings, until))


async def _follow_async(say: Narrator, settings: DemoSettings, until: Callable[[Any], bool]) -> None:
    """Keep the gate's status on screen until `until(report)`: a live rich view in a terminal, a
    one-line progress every two seconds otherwise (and the full status once at the end)."""
    from gate.cli.render import render_rich, render_text
    from gate.cli.snapshot import reports_of
    from gate.cli.status import StatusFeed

    started = time.monotonic()
    async with await _client() as kube:
        feed = StatusFeed(kube, "nodegate-system")
        await feed.start()
        try:
            reports = reports_of(feed.snapshot(), GATE)
            if say.rich:
                from rich.live import Live

                with Live(render_rich(reports, limit=8), console=say.console, refresh_per_second=4,
                          auto_refresh=False) as live:
                    while not (reports and until(reports[0])):
                        _check_time(started, settings)
                        await feed.wait(0.5)
                        reports = reports_of(feed.snapshot(), GATE)
                        live.update(render_rich(reports, limit=8), refresh=True)
            else:
                last = ""
                while True:
                    line = _one_line(reports[0]) if reports else ""
                    if line and line != last:
                        print(f"  {time.monotonic() - started:5.0f}s  {line}", flush=True)
                        last = line
                    if reports and until(reports[0]):
                        break
                    _check_time(started, settings)
                    await asyncio.sleep(2.0)
                    feed.check()
                    reports = reports_of(feed.snapshot(), GATE)
                sys.stdout.write(render_text(reports))
        finally:
            await feed.stop()


def _check_time(started: float, settings: DemoSettings) -> None:
    if time.monotonic() - started > settings.phase_timeout:
        raise DemoError(f"the rollout did not get there within {settings.phase_timeout:.0f}s; "
                        f"see `nodegate status {GATE}` and the operator's log")


def _one_line(report: Any) -> str:
    parts = []
    for c in report.compartments:
        extra = []
        if c.in_progress:
            extra.append(f"{c.in_progress} running")
        if c.failed:
            extra.append(f"{c.failed} failed")
        if c.state in ("stopped", "complete"):
            extra.append(c.state)
        parts.append(f"{c.name} {c.complete}/{c.matched}" + (f" ({', '.join(extra)})" if extra else ""))
    return "  |  ".join(parts)


# -- the summary: only what the cluster shows ----------------------------------------------------

# The operator's Events on a node that mark the steps of a round with an interrupt, in order.
NODE_STEPS = (("Cordoned", "cordoned"), ("Drained", "drained"), ("Rebooted", "rebooted (a new boot ID)"),
              ("Uncordoned", "uncordoned"))
# The steps of stage pods, in the order a round runs them, and how each reads.
STEP_STAGES = {"uninstall": "uninstall", "upgrade": "upgrade", "apply": "apply", "config": "config",
               "interrupt": "interrupt", "post-interrupt": "post-interrupt check",
               "post-uninstall": "post-uninstall check"}


class PodLedger:
    """Every stage pod of the demo's gate as last seen, by a watch of the operator's namespace that runs
    in a thread of its own for the whole rollout. The operator deletes each stage pod once the node's
    state records its steps, so only a watch sees them all; a relist after a lost watch may miss a pod
    created and deleted in between (the summary then counts fewer, never more)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def observe(self, kind: str, pod: dict[str, Any]) -> None:
        """A watch event: keep the newest copy of each of the gate's pods (a DELETED event's is its last)."""
        from gate.cli.stagepods import gate_of

        if gate_of(pod) != GATE:
            return
        meta = pod.get("metadata") or {}
        with self._lock:
            old = self._pods.get(meta.get("name", ""))
            if old is None or _resource_version(pod) >= _resource_version(old):
                self._pods[meta.get("name", "")] = pod

    def counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Stage pods by kind, their steps that ran (whose container terminated) by stage, and how many
        of those failed."""
        from gate.cli.stagepods import kind_of, step_states

        with self._lock:
            pods = list(self._pods.values())
        kinds: dict[str, int] = {}
        steps: dict[str, int] = {}
        failed = 0
        for pod in pods:
            kinds[kind_of(pod)] = kinds.get(kind_of(pod), 0) + 1
            for step in step_states(pod):
                if step.phase in ("succeeded", "failed"):
                    steps[step.step.stage] = steps.get(step.step.stage, 0) + 1
                    failed += step.phase == "failed"
        return kinds, steps, failed

    def start(self, timeout: float = 30.0) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()), name="demo-stage-pods",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self.error is not None:
            self.stop()
            raise DemoError(f"could not watch the stage pods in nodegate-system: {self.error or 'no answer'}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)

    async def _watch(self) -> None:
        from gate.cli.stagepods import SELECTOR
        from gate.kube.cache import WatchCache
        from gate.kube.client import PODS

        try:
            async with await _client() as kube:
                cache = WatchCache(kube, PODS, namespace="nodegate-system", label_selector=SELECTOR)
                cache.subscribe(self.observe)
                await cache.start()
                self._ready.set()
                try:
                    while not self._stop.is_set():
                        await asyncio.sleep(0.1)
                finally:
                    await cache.stop()
        except Exception as exc:  # said by start(), or the summary counts what was seen until then
            self.error = exc
            self._ready.set()


def _resource_version(obj: dict[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class Evidence:
    """What the cluster shows once the rollout is over, for the summary to state and nothing else.

    Events are best effort (and the operator sends an identical one at most once per ten minutes), so
    they prove that a step happened on a node, never how often."""

    node_reasons: dict[str, frozenset[str]]  # demo node -> reasons of the operator's Events about it
    installed: dict[str, dict[str, str]]  # demo node -> package -> version, from its state annotation
    cordoned: tuple[str, ...]  # demo nodes unschedulable now
    gate_reasons: dict[str, int]  # reason -> how many of the operator's Events about the gate
    gate_warnings: tuple[tuple[str, str], ...]  # (reason, note) of the gate's Warning and Resumed Events
    pods: dict[str, int]  # kind (stages, interrupt, post-interrupt, ...) -> stage pods the watch saw
    steps: dict[str, int]  # stage -> steps of those pods whose container terminated
    steps_failed: int  # of those, the ones that exited non-zero
    wanted: dict[str, str]  # package -> version the gate asks for


def summary_lines(report: Any, ev: Evidence, bad_node: str) -> list[str]:
    """The summary, each statement counted from `report` (the gate status and node labels) or `ev`."""
    nodes = sorted(ev.node_reasons)
    total = len(nodes)
    failed_nodes = f", {len(report.failed)} failed" if report.failed else ""
    lines = [f"NodeGate {GATE}: {report.summary}, {report.complete} of {report.matched} nodes complete{failed_nodes}."]

    good, bad = ev.gate_reasons.get("BatchSucceeded", 0), ev.gate_reasons.get("BatchFailed", 0)
    lines.append(f"{good + bad} batches across {len(report.compartments)} compartments, {bad} failed "
                 "(the gate's Events).")

    seen = {reason: [n for n in nodes if reason in ev.node_reasons[n]] for reason, _ in NODE_STEPS}
    if total and all(len(v) == total for v in seen.values()):
        lines.append(f"Every node ({total}) was " + _series([text for _, text in NODE_STEPS]) +
                     ", by the operator's Events on the nodes.")
    else:
        parts = [f"{len(seen[reason])} of {total} {text}" for reason, text in NODE_STEPS]
        lines.append("The operator's Events on the nodes: " + ", ".join(parts) + ".")
    lines.append("Cordoned now: " + (", ".join(ev.cordoned) if ev.cordoned else "none") + ".")

    full = [n for n in nodes if all(ev.installed.get(n, {}).get(p) == v for p, v in ev.wanted.items())]
    versions = ", ".join(f"{p} {v}" for p, v in sorted(ev.wanted.items()))
    lines.append(f"{len(full)} of {total} nodes record all {len(ev.wanted)} packages installed at the gate's "
                 f"versions in their state annotation ({versions}).")

    if ev.pods:
        ran = ", ".join(f"{ev.steps[s]} {STEP_STAGES[s]}" for s in STEP_STAGES if s in ev.steps)
        pods, steps = sum(ev.pods.values()), sum(ev.steps.values())
        lines.append(f"{pods} stage pods ran {steps} steps ({ran or 'none'}); {ev.steps_failed} failed "
                     "(a watch of the stage pods).")
        interrupts = ev.pods.get("interrupt", 0)
        if interrupts == total and len(seen["Rebooted"]) == total:
            lines.append(f"{interrupts} interrupt pods for {total} nodes: the packages' interrupts were merged "
                         "into one reboot per node.")
    else:
        lines.append("The watch of the operator's namespace saw no stage pod: no count of steps run.")

    stopped = ev.gate_reasons.get("CompartmentStopped", 0)
    resumed = ev.gate_reasons.get("Resumed", 0)
    if stopped and resumed and bad_node in ev.installed and bad_node in full:
        lines.append(f"The planted failure on {bad_node} stopped {FAILING_POOL} after {bad} failed "
                     f"batch{'es' if bad != 1 else ''}; a rerun and a resume finished it.")
    else:
        lines.append(f"The planted failure on {bad_node}: {stopped} CompartmentStopped and {resumed} Resumed "
                     f"Events; {bad_node} is {report.node_states.get(bad_node, 'unknown')}.")
    if ev.gate_warnings:
        lines.append("What the NodeGate's Events say about it:")
        for reason, note in ev.gate_warnings[:8]:
            kind = "Normal" if reason == "Resumed" else "Warning"
            lines.append(f"  {kind:8} {reason:20} {_readable(note)}")
    return lines


def _series(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


async def _evidence(nodes: list[str], ledger: PodLedger) -> Evidence:
    from gate.api import keys
    from gate.api.state import StateParseError, load_state
    from gate.controller.events import CLUSTER_EVENTS_NAMESPACE, CONTROLLER
    from gate.kube.client import EVENTS, NODES

    wanted = {name: pkg["version"] for name, pkg in manifest("gate.yaml")["spec"]["packages"].items()}
    async with await _client() as kube:
        (node_items, _), (events, _) = await asyncio.gather(
            kube.list(NODES, label_selector=f"{DEMO_LABEL}=true"), kube.list(EVENTS, CLUSTER_EVENTS_NAMESPACE))
    installed: dict[str, dict[str, str]] = {}
    cordoned = []
    for node in node_items:
        name = node["metadata"]["name"]
        try:
            state = load_state((node["metadata"].get("annotations") or {}).get(keys.state_annotation(GATE)))
        except StateParseError:
            state = None
        installed[name] = {p: i.version for p, i in state.installed.items()} if state else {}
        if (node.get("spec") or {}).get("unschedulable"):
            cordoned.append(name)
    reasons: dict[str, set[str]] = {n: set() for n in nodes}
    gate_reasons: dict[str, int] = {}
    warnings = []
    for e in sorted(events, key=lambda e: e.get("eventTime") or ""):
        regarding = e.get("regarding") or {}
        if e.get("reportingController") != CONTROLLER:
            continue
        if regarding.get("kind") == "Node" and regarding.get("name") in reasons:
            reasons[regarding["name"]].add(e.get("reason", ""))
        elif regarding.get("kind") == "NodeGate" and regarding.get("name") == GATE:
            gate_reasons[e.get("reason", "")] = gate_reasons.get(e.get("reason", ""), 0) + 1
            if e.get("type") == "Warning" or e.get("reason") == "Resumed":
                warnings.append((e.get("reason", ""), e.get("note", "")))
    pods, steps, steps_failed = ledger.counts()
    return Evidence(node_reasons={n: frozenset(r) for n, r in reasons.items()}, installed=installed,
                    cordoned=tuple(sorted(cordoned)), gate_reasons=gate_reasons, gate_warnings=tuple(warnings),
                    pods=pods, steps=steps, steps_failed=steps_failed, wanted=wanted)


async def _settled_evidence(nodes: list[str], ledger: PodLedger, timeout: float = 10.0) -> Evidence:
    """The evidence once the operator's last Events are in: it sends a node's Complete Event after the
    node's write that the status reflects, so a summary read at once could miss the last few."""
    deadline = time.monotonic() + timeout
    last = await _evidence(nodes, ledger)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        ev = await _evidence(nodes, ledger)
        if ev == last and all("Complete" in r for r in ev.node_reasons.values()):
            return ev
        last = ev
    return last


def _readable(note: str) -> str:
    """An Event's note on one line, with an agent's JSON summary in it shown as `failure_message` does."""
    from gate.api.state import failure_message

    start = note.find("{")
    if start >= 0:
        note = note[:start] + failure_message(note[start:])
    line = " ".join(note.split())
    return line if len(line) <= 140 else line[:137] + "..."


def _explore(cluster: Any, say: Narrator) -> None:
    from gate.devcluster.build import binary_paths

    kubectl = "kubectl"
    if shutil.which("kubectl") is None:
        kubectl = str(binary_paths(("kubernetes",))["kubectl"])
    nodegate = nodegate_command()
    say.say("\nThe control plane keeps running. Explore it:")
    lines = [(f"export KUBECONFIG={cluster.kubeconfig}", ""),
             (f"{kubectl} get ng", "NodeGates and their progress"),
             (f"{kubectl} get nodes -L {POOL_LABEL} -L nodegate.io/status.{GATE}", ""),
             (f"{nodegate} status", "the status you saw, once (-w: live)"),
             (f"{nodegate} plan {GATE}", "every batch, per compartment"),
             (f"{nodegate} node list --gate {GATE}", "every node, its phase and batch"),
             (f"{kubectl} events --for nodegate/{GATE}", "what the operator said about it"),
             (f"{nodegate} demo --down", "stop it")]
    width = max(len(cmd) for cmd, _ in lines)
    for cmd, comment in lines:
        say.command(f"{cmd.ljust(width)}   # {comment}" if comment else cmd)


def nodegate_command() -> str:
    """How to run `nodegate` again from this shell: on PATH, as invoked (.venv/bin/nodegate), or the module."""
    if shutil.which("nodegate"):
        return "nodegate"
    invoked = sys.argv[0]
    if Path(invoked).name in ("nodegate", "kubectl-nodegate") and Path(invoked).exists():
        return invoked if Path(invoked).name == "nodegate" else "kubectl nodegate"
    return f"{Path(sys.executable).name} -m gate.cli.main"
