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

What the demo is made of (its gate, policy, pools and planted failure) is `gate.cli.demo_settings`;
the summary at its end, only what the cluster shows, is `gate.cli.demo_evidence`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gate.cli.demo_evidence import PodLedger, settled_evidence, summary_lines
from gate.cli.demo_settings import (
    DEMO_LABEL,
    FAILING_PACKAGE,
    FAILING_POOL,
    FAILURE_STAGE_NAME,
    FAILURE_SUMMARY,
    GATE,
    OPERATOR_FLAGS,
    POLICY,
    POOL_LABEL,
    DemoError,
    DemoSettings,
    client,
    default_state_dir,
    failing_node,
    manifest,
    pool_sizes,
)
from gate.cli.errors import CliError

Cli = Callable[[Sequence[str]], int]  # the `nodegate` entry point: argv -> exit code
INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT)
T = TypeVar("T")


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
    evidence = run_async(settled_evidence(sorted(n for pool in names.values() for n in pool), ledger))
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


async def _apply(obj: dict[str, Any]) -> None:
    async with await client() as kube:
        await kube.apply(obj, field_manager="nodegate-demo")


async def _refused(obj: dict[str, Any]) -> str:
    from gate.kube.client import NODEGATES
    from gate.kube.errors import ApiError

    async with await client() as kube:
        try:
            await kube.create(NODEGATES, obj, dry_run=True)
        except ApiError as exc:
            return f'Error from server: {exc.message}'
    raise DemoError("the API server admitted a NodeGate whose image tag differs from its version: "
                    "is the admission webhook registered?")


async def _plant_failure(node: str) -> None:
    from gate.devcluster.stages import failing_stage

    # chrony-conf's apply has no serving step: a staging pod only places its payload, and the planted failure
    # (no chrony on the node) shows in the window, as it would on a real node.
    stage = failing_stage(FAILURE_STAGE_NAME, nodes=[node], package=FAILING_PACKAGE, stage="apply",
                          message=json.dumps(FAILURE_SUMMARY, separators=(",", ":")), in_the_round=True)
    async with await client() as kube:
        await kube.apply(stage, field_manager="nodegate-demo")


async def _remove_failure() -> None:
    from gate.kube.client import KWOK_STAGES

    async with await client() as kube:
        await kube.delete(KWOK_STAGES, FAILURE_STAGE_NAME)


async def _report() -> Any:
    from gate.cli.snapshot import fetch_snapshot, reports_of

    async with await client() as kube:
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
    async with await client() as kube:
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
