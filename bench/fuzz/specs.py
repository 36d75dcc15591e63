"""Fuzzing NodeGate and DeploymentPolicy specs end to end: admission, then the operator.

    python3.11 -m bench.fuzz.specs [--specs 500] [--nodes 4] [--seed N]     # long mode: its own control plane

Specs are drawn from the CRD schemas (generated from gate/api's models: the shapes the API server
itself checks), with plausible values for the fields whose meaning the schema cannot say (versions,
images, durations, label selectors, policy names), and then mutated (a field replaced by random JSON,
removed, wrapped in a list, pushed past a bound). Each one is created through the real API server,
where the schema, the CRD's CEL rules and the admission webhook judge it. Every refusal must carry a
message (a refusal because the webhook could not answer, "failed calling webhook", is a finding).
Everything admitted is handed to the running operator: every accepted gate must get a status for its
generation, the operator process must stay up, its reconcile error counter must not climb, and its
log must not say it could not read an object the webhook admitted.

Every gate's node selector is narrowed to this run's own simulated nodes, so nothing else in the
cluster is touched; everything is deleted at the end. tests/security/test_fuzz_specs.py runs the
short mode on the test session's control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from bench.fuzz.strategies import json_paths, json_values, slot, text
from gate.api.common import Obj
from gate.api.crd import all_crds
from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.kube.client import NODEGATES, NODES, POLICIES, KubeClient
from gate.kube.errors import ApiError, NotFound

FUZZ_LABEL = "nodegate.dev/fuzz"


def _schemas() -> dict[str, Obj]:
    out = {}
    for crd in all_crds().values():
        kind = crd["spec"]["names"]["kind"]
        out[kind] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return out


# Values a schema cannot describe: what a person would plausibly write, good and bad.
PLAUSIBLE: dict[str, list[Any]] = {
    "version": ["1.0.0", "1.2.3", "2.0.0-rc.1", "0.0.1+build.7", "1.0", "v1.0.0", "latest", ""],
    "image": ["ghcr.io/example/tool", "registry.example.com:5000/team/tool", "tool",
              "ghcr.io/example/tool@sha256:" + "a" * 64, "ghcr.io/example/tool:1.0.0", "ghcr.io/example/tool:9.9.9",
              "UPPER/case", "registry.example.com:99999/x", "a//b"],
    "waitTimeout": ["1h", "30m", "0s", "1.5h", "24h", "1d", "-1h"],
    "timeout": ["30m", "10s", "1h30m", "0s", "1d", "10"],
    "deploymentPolicy": ["{policy}", "{policy}", "no-such-policy", "UPPER", ""],
    "name": ["canary", "pool-a", "__default__", "x", "a" * 70, ""],
    "start": ["01:00", "23:59", "24:00", "1:00", "00:00"],
    "end": ["05:00", "01:00", "00:00", "25:61"],
    "timeZone": ["UTC", "Europe/Paris", "America/New_York", "Mars/Olympus", ""],
    "days": [["Sat", "Sun"], ["Mon"], ["Funday"], []],
    "key": ["pool", "nodegate.dev/ring", "example.com/a", "bad key!", ""],
    "services": [["tuned"], ["chronyd", "tuned"], [], ["../x"]],
}
PACKAGE_NAMES = ["base", "tuned", "nvidia-driver", "agent-x", "a", "Bad_Name", "z" * 45, "x-"]
QUANTITIES = ["100m", "1", "256Mi", "1Gi", 2, "-1", "1.5.5", "0"]


@st.composite
def from_schema(draw: st.DrawFn, schema: Obj, name: str = "", policies: tuple[str, ...] = ()) -> Any:
    if name in PLAUSIBLE and draw(st.integers(0, 4)):
        value = draw(st.sampled_from(PLAUSIBLE[name]))
        if value == "{policy}":
            return draw(st.sampled_from(policies)) if policies else "no-such-policy"
        return value
    if schema.get("x-kubernetes-int-or-string"):
        return draw(st.sampled_from(QUANTITIES))
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return draw(st.sampled_from([{"secretKeyRef": {"name": "s", "key": "k"}},
                                     {"fieldRef": {"fieldPath": "spec.nodeName"}}, {}]) | json_values)
    kind = schema.get("type")
    if "enum" in schema:
        return draw(st.sampled_from(schema["enum"]))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "integer":
        low, high = schema.get("minimum", -5), schema.get("maximum", 1000)
        return draw(st.sampled_from([low, high, low - 1, high + 1]) | st.integers(low, high))
    if kind == "string":
        if "pattern" in schema and draw(st.booleans()):
            return draw(st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) < 40))
        return draw(text)
    if kind == "array":
        return draw(st.lists(from_schema(schema.get("items", {}), name, policies), max_size=3))
    if kind == "object":
        out: Obj = {}
        for prop, sub in (schema.get("properties") or {}).items():
            if prop in schema.get("required", []) or draw(st.integers(0, 2)) == 0:
                out[prop] = draw(from_schema(sub, prop, policies))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            keys = st.sampled_from(PACKAGE_NAMES) if name == "packages" else \
                st.sampled_from(PLAUSIBLE["key"]) | text
            for key in draw(st.lists(keys, max_size=2, unique=True)):
                out[key] = draw(from_schema(extra, key, policies))
        return out
    return draw(json_values)


@st.composite
def mutated(draw: st.DrawFn, spec: Obj) -> Obj:
    doc = json.loads(json.dumps(spec))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        paths = [p for p in json_paths(doc) if p]
        if not paths:
            break
        parent, key = slot(doc, draw(st.sampled_from(paths)))
        action = draw(st.sampled_from(["replace", "delete", "wrap", "stringify"]))
        if action == "delete":
            del parent[key]
        elif action == "wrap":
            parent[key] = [parent[key]]
        elif action == "stringify":
            parent[key] = json.dumps(parent[key])
        else:
            parent[key] = draw(json_values)
    return doc


def narrowed(spec: Any, run: str) -> Any:
    """Whatever the spec says, the gate selects only this run's nodes (a spec whose nodeSelector is not
    an object is left as it is: the API server refuses it)."""
    if not isinstance(spec, dict):
        return spec
    selector = spec.get("nodeSelector", {})
    if not isinstance(selector, dict):
        return spec
    labels = selector.get("matchLabels", {})
    if not isinstance(labels, dict):
        return spec
    return {**spec, "nodeSelector": {**selector, "matchLabels": {**labels, FUZZ_LABEL: run}}}


@dataclass
class Outcome:
    kind: str
    name: str
    spec: Any
    accepted: bool
    message: str = ""

    @property
    def refused_by(self) -> str:
        m = self.message
        if "failed calling webhook" in m:
            return "webhook unreachable"
        if "admission webhook" in m and "denied the request" in m:
            return "webhook"
        if "ValidatingAdmissionPolicy" in m:
            return "policy"
        return "schema or CEL"


@dataclass
class SpecFindings:
    outcomes: list[Outcome] = field(default_factory=list)
    unhandled: list[str] = field(default_factory=list)  # accepted gates the operator never reported on
    unreadable: list[str] = field(default_factory=list)  # operator log lines: admitted but not parseable
    reconcile_errors: Counter[str] = field(default_factory=Counter)  # by error type, during the run
    operator_restarted: bool = False
    seconds: float = 0.0

    @property
    def accepted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.accepted]

    @property
    def reconcile_failures(self) -> int:
        """Reconciles that raised something other than a lost optimistic-concurrency race."""
        return sum(n for error, n in self.reconcile_errors.items() if error != "Conflict")

    @property
    def silent_refusals(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.accepted and (not o.message.strip()
                                                                 or o.refused_by == "webhook unreachable")]


def draw_specs(count: int, run: str, *, seed_value: int | None = None) -> list[tuple[str, Any]]:
    """`count` (kind, spec) pairs: a third DeploymentPolicies (drawn first, so gates can name them),
    the rest NodeGates narrowed to this run's nodes."""
    schemas = _schemas()
    policy_count = max(1, count // 3)
    policy_names = tuple(f"{run}-p{i}" for i in range(policy_count))
    out: list[tuple[str, Any]] = []
    def collector(kind: str) -> Any:
        def draw_one(data: st.DataObject) -> None:
            spec = data.draw(mutated(data.draw(from_schema(schemas[kind], "", policy_names))))
            out.append((kind, narrowed(spec, run) if kind == "NodeGate" else spec))
        return draw_one

    for kind, n in (("DeploymentPolicy", policy_count), ("NodeGate", count - policy_count)):
        run_all = settings(max_examples=n, deadline=None, database=None, derandomize=seed_value is None,
                           suppress_health_check=list(HealthCheck))(given(data=st.data())(collector(kind)))
        if seed_value is not None:
            run_all = seed(seed_value)(run_all)
        run_all()
    return out


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _errors(text: str) -> Counter[str]:
    """nodegate_reconcile_errors_total by error type (Conflict: a write lost an optimistic-concurrency
    race and the key is requeued, as every controller does; anything else is a failure)."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("nodegate_reconcile_errors_total{"):
            error = line.split('error="', 1)[1].split('"', 1)[0]
            out[error] += int(float(line.rsplit(" ", 1)[1]))
    return out


async def run_specs(cluster: DevCluster, kube: KubeClient, count: int, *, nodes: int = 2, settle: float = 90.0,
                    seed_value: int | None = None) -> SpecFindings:
    """Draw `count` specs, create them, let the operator handle the accepted ones, delete everything."""
    run = f"fuzz-{time.time_ns() % 10**8:08d}"
    findings = SpecFindings()
    started = time.monotonic()
    names = await cluster.add_nodes(NodeSpec(nodes, {FUZZ_LABEL: run}, prefix=f"{run}-"))
    operator = cluster.processes()["operator"]
    port = cluster.ports()["operator"]
    log_file = Path(operator.log)
    log_offset = log_file.stat().st_size
    errors_before = _errors(_metrics(port))
    specs = draw_specs(count, run, seed_value=seed_value)
    gates: list[str] = []
    policies: list[str] = []
    try:
        for i, (kind, spec) in enumerate(specs):
            name = f"{run}-p{i}" if kind == "DeploymentPolicy" else f"{run}-g{i}"  # policies come first
            body = {"apiVersion": "nodegate.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}
            try:
                await kube.create(NODEGATES if kind == "NodeGate" else POLICIES, body)
                findings.outcomes.append(Outcome(kind, name, spec, True))
                (gates if kind == "NodeGate" else policies).append(name)
            except ApiError as exc:
                findings.outcomes.append(Outcome(kind, name, spec, False, exc.message))
        deadline = time.monotonic() + settle
        pending = set(gates)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                gate = await kube.get(NODEGATES, name)
                status = gate.get("status") or {}
                if status.get("observedGeneration") == gate["metadata"]["generation"] and status.get("conditions"):
                    pending.discard(name)
            await asyncio.sleep(1.0)
        findings.unhandled = sorted(pending)
        findings.operator_restarted = not operator.alive()
        if not findings.operator_restarted:
            findings.reconcile_errors = _errors(_metrics(port)) - errors_before
        log = log_file.read_text(errors="replace")[log_offset:]
        findings.unreadable = [line for line in log.splitlines()
                               if "does not parse" in line or "Reconcile crashed" in line][:20]
    finally:
        await _delete_all(kube, gates, policies, names)
    findings.seconds = time.monotonic() - started
    return findings


async def _delete_all(kube: KubeClient, gates: list[str], policies: list[str], nodes: list[str]) -> None:
    for name in gates:
        await kube.delete(NODEGATES, name)
    deadline = time.monotonic() + 180
    while gates and time.monotonic() < deadline:
        left = []
        for name in gates:
            try:
                await kube.get(NODEGATES, name)
                left.append(name)
            except NotFound:
                pass
        gates = left
        await asyncio.sleep(1.0)
    if gates:
        print(f"gates not deleted in time (finalizer kept): {gates}", file=sys.stderr)
    for name in policies:
        try:
            await kube.delete(POLICIES, name)
        except ApiError as exc:
            print(f"policy {name} not deleted: {exc.message}", file=sys.stderr)
    for name in nodes:
        await kube.delete(NODES, name)


def report(f: SpecFindings) -> str:
    by_kind = Counter((o.kind, "accepted" if o.accepted else f"refused by {o.refused_by}") for o in f.outcomes)
    lines = [f"specs: {len(f.outcomes)} in {f.seconds:.0f} s"]
    lines += [f"  {kind:16} {what:28} {n}" for (kind, what), n in sorted(by_kind.items())]
    lines += [f"refusals without a message or with the webhook unreachable: {len(f.silent_refusals)}",
              f"accepted gates the operator did not report on: {len(f.unhandled)} {f.unhandled[:5]}",
              f"operator restarted: {f.operator_restarted}; reconcile errors during the run by type: "
              f"{dict(f.reconcile_errors) or 'none'}",
              f"operator log lines about unreadable objects or crashed reconciles: {len(f.unreadable)}"]
    lines += [f"  {line[:300]}" for line in f.unreadable[:5]]
    samples = [o for o in f.outcomes if not o.accepted][:3]
    lines += ["  e.g. refused " + o.kind + ": " + re.sub(r"\s+", " ", o.message)[:200] for o in samples]
    lines += [f"  silent: {o.kind} {json.dumps(o.spec)[:200]} -> {o.message[:200]!r}" for o in f.silent_refusals[:5]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    from gate.devcluster.services import start

    state = Path(tempfile.mkdtemp(prefix="nodegate-fuzz-specs-"))
    cluster = DevCluster(state)
    try:
        cluster.up(NodeSpec(0), job_seconds=0.5, progress=lambda m: None)
        start(cluster, webhook=True, operator=True, progress=lambda m: None)

        async def go() -> SpecFindings:
            async with await cluster.client() as kube:
                return await run_specs(cluster, kube, args.specs, nodes=args.nodes, settle=300,
                                       seed_value=args.seed)

        findings = asyncio.run(go())
        print(report(findings))
        bad = (findings.silent_refusals or findings.unhandled or findings.unreadable or findings.operator_restarted
               or findings.reconcile_failures)
        sys.exit(1 if bad else 0)
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
