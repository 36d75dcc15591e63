"""Chaos runs on a control plane of their own: does NodeGate keep its promises when everything fails?

    python -m bench.chaos.run            # short: 30 nodes, an undisturbed run, one disturbed run
    python -m bench.chaos.run --long     # long: 100 nodes, an undisturbed run, three disturbed runs
                                         #       (36 operator kills, 6 leader failovers, 6 API server
                                         #       restarts, 3 etcd restarts)
    python -m bench.chaos.run --real-nodes 2 --rounds 12   # the faults of real hosts on real nodes
                                         #       (bench/chaos/realnodes.py; root only)

Each run is a rollout with drains (one pod per node under a PodDisruptionBudget) and reboots over
three compartments, with readiness-tainted nodes joining late; see `gate.testing.chaos`. The
undisturbed run is the same rollout in the same invocation, on the same control plane: the figure a
disturbed run's time to converge is compared with. An invariant watcher with its own watches judges
every run (`gate.testing.invariants`). Printed: runs, kills survived, violations, time to converge
against the undisturbed run, watch expiries (410) the watcher itself went through, evictions, and
how much each invariant was exercised. Nothing here asserts on time; the exit status is 1 when a
run did not converge or any invariant was violated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gate.devcluster.cluster import DevCluster
from gate.devcluster.services import install_crds
from gate.testing.chaos import Chaos, Fleet, RunResult, chaos_run, table


def modes(args: argparse.Namespace) -> tuple[Fleet, Chaos, int]:
    def given(value: int | None, default: int) -> int:
        return default if value is None else value

    if args.long:
        nodes = given(args.nodes, 100)
        fleet = Fleet(nodes=nodes, late=nodes // 10, replicas=2)
        chaos = Chaos(kills=given(args.kills, 12), failovers=2, apiserver_restarts=1, graceful_apiserver_restarts=1,
                      etcd_restarts=1, leader_pauses=args.leader_pauses, pause=(0.5, 6.0))
        return fleet, chaos, given(args.runs, 3)
    nodes = given(args.nodes, 30)
    fleet = Fleet(nodes=nodes, late=max(2, nodes // 8), replicas=2)
    chaos = Chaos(kills=given(args.kills, 4), failovers=1, apiserver_restarts=1, etcd_restarts=1,
                  leader_pauses=args.leader_pauses, pause=(0.2, 2.0))
    return fleet, chaos, given(args.runs, 1)


def figures(result: RunResult, baseline: RunResult | None) -> dict[str, Any]:
    cov = result.report.coverage
    base = baseline.seconds if baseline is not None else None
    return {
        "run": result.name, "converged": result.converged, "seconds": result.seconds,
        "vs_undisturbed": round(result.seconds / base, 2) if result.seconds and base else None,
        "done": dict(result.done), "planned": asdict(result.chaos),
        "violations": [str(v) for v in result.report.violations],
        "watch_expiries_410": dict(result.report.expired), "watch_reconnects": dict(result.report.reconnects),
        "evictions": result.evictions, "error": result.error, "notes": result.notes,
        "coverage": {"node_events": cov.node_events, "pod_events": cov.pod_events,
                     "disruptions_judged": cov.disruptions_judged, "uncordons_judged": cov.uncordons_judged,
                     "interrupts_judged": cov.interrupts_judged, "taint_lifts_judged": cov.taint_lifts_judged,
                     "pods_seen": cov.pods_seen, "steps_seen": cov.steps_seen,
                     "unverified_in_blind_windows": cov.unverified,
                     "relists": dict(cov.relists),
                     "peaks": {f"{g}/{c}": asdict(p) for (g, c), p in cov.peaks.items()}},
    }


async def invocation(cluster: DevCluster, fleet: Fleet, chaos: Chaos, runs: int, args: argparse.Namespace,
                     journal_dir: Path | None) -> tuple[RunResult, list[RunResult]]:
    def journal(name: str) -> Path | None:
        return journal_dir / f"{name}.jsonl" if journal_dir is not None else None

    stamp = time.strftime("%H%M%S")
    name = f"calm-{stamp}"
    baseline = await chaos_run(cluster, name, fleet, Chaos(), seed=args.seed, timeout=args.timeout,
                               journal=journal(name))
    results = []
    for i in range(runs):
        name = f"chaos-{stamp}-{i + 1}"
        results.append(await chaos_run(cluster, name, fleet, chaos, seed=args.seed + i + 1, timeout=args.timeout,
                                       journal=journal(name)))
    return baseline, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help="100 nodes, three disturbed runs (run by hand)")
    parser.add_argument("--nodes", type=int, help="nodes per run (default 30, long 100)")
    parser.add_argument("--runs", type=int, help="disturbed runs (default 1, long 3)")
    parser.add_argument("--kills", type=int, help="operator kills per disturbed run (default 4, long 12)")
    parser.add_argument("--leader-pauses", type=int, default=0,
                        help="per disturbed run: freeze the leader (SIGSTOP) until the standby leads, then let it "
                             "run again (opt-in, see docs/reliability.md)")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="how long a simulated stage runs")
    parser.add_argument("--seed", type=int, default=20260)
    parser.add_argument("--timeout", type=float, default=1800, help="per run")
    parser.add_argument("--journal-dir", type=Path, help="write each run's event journal here (JSON lines)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--real-nodes", type=int, default=0,
                        help="real-node mode: this many real nodes, the faults of real hosts at random moments "
                             "(bench/chaos/realnodes.py)")
    parser.add_argument("--rounds", type=int, default=12, help="real-node mode: rounds, one fault each")
    args = parser.parse_args()
    if args.real_nodes:
        from bench.chaos import realnodes

        realnodes.main(args)
        return
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("gate.kube.cache").setLevel(logging.ERROR)  # restarts interrupt watches: expected
    fleet, chaos, runs = modes(args)
    if args.journal_dir:
        args.journal_dir.mkdir(parents=True, exist_ok=True)

    state = Path(tempfile.mkdtemp(prefix="nodegate-chaos-"))
    cluster = DevCluster(state)
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        cluster.up(job_seconds=args.job_seconds, progress=lambda m: print(m, flush=True))
        asyncio.run(install_crds(cluster))
        baseline, results = asyncio.run(invocation(cluster, fleet, chaos, runs, args, args.journal_dir))
    finally:
        cluster.down(quiet=True)
        shutil.rmtree(state, ignore_errors=True)
    load_after = os.getloadavg()

    everything = [baseline, *results]
    kills = sum(r.kills for r in results)
    survived = sum(r.kills for r in results if r.ok)
    violations = sum(len(r.report.violations) for r in everything)
    print()
    print(f"Chaos runs: {fleet.nodes} nodes each ({fleet.late} joining late, readiness-tainted), "
          f"{fleet.replicas} operator replicas, stages of {args.job_seconds:g}s, a reboot and a drain per node")
    print(table(everything, baseline))
    print()
    for r in everything:
        print(f"{r.name}: {r.report.summary()}")
        peaks = ", ".join(f"{comp} {p.disrupted} of ceiling {p.ceiling}"
                          for (_, comp), p in sorted(r.report.coverage.peaks.items()))
        print(f"  most disrupted at once: {peaks or '-'}")
        for v in r.report.violations:
            print(f"  VIOLATION {v}")
        if r.error:
            print(f"  ERROR {r.error}")
        for note in r.notes:
            print(f"  note: {note}")
    print()
    disturbed = [r.seconds for r in results if r.seconds is not None]
    mean = sum(disturbed) / len(disturbed) if disturbed else None
    print(f"runs: {len(everything)} ({len(results)} disturbed), converged: {sum(r.converged for r in everything)}")
    print(f"operator kills (SIGKILL, failovers included): {kills}, survived: {survived}")
    print(f"violations: {violations}")
    if baseline.seconds is not None and mean is not None:
        print(f"time to converge: undisturbed {baseline.seconds:.1f}s, disturbed {mean:.1f}s on average "
              f"({mean / baseline.seconds:.2f}x)")
    print(f"wall time {time.monotonic() - started:.0f}s; load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f} (2 cores: other work on the machine slows every run)")
    if args.json:
        args.json.write_text(json.dumps({
            "mode": "long" if args.long else "short", "fleet": asdict(fleet), "job_seconds": args.job_seconds,
            "runs": [figures(r, baseline) for r in everything], "kills": kills, "kills_survived": survived,
            "violations": violations, "load_before": load_before, "load_after": load_after}, indent=2) + "\n")
    raise SystemExit(0 if all(r.ok for r in everything) else 1)


if __name__ == "__main__":
    main()
