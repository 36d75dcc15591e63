"""Random NodeGate and DeploymentPolicy specs through admission into the running operator
(bench/fuzz/specs.py, the short mode: 60 specs; `python3.11 -m bench.fuzz.specs --specs 500` is the long
mode). Every refusal carries a message from the schema, the CRD's CEL rules or the webhook (never
"failed calling webhook"); every admitted gate gets a status from the operator for its generation; the
operator stays up, logs no object it could not read and no crashed reconcile, and no reconcile fails
other than by losing a write race (409, requeued), of which there are a few per gate at most.
Every gate selects only the run's own nodes; everything is deleted after.
"""

from __future__ import annotations

from bench.fuzz.specs import report, run_specs
from gate.devcluster.cluster import DevCluster
from gate.kube.client import KubeClient
from tests.integration.conftest import Webhook

SPECS = 60


async def test_random_specs_are_refused_with_a_message_or_handled_by_the_operator(
        cluster: DevCluster, kube: KubeClient, webhook: Webhook, operator: int) -> None:
    findings = await run_specs(cluster, kube, SPECS, nodes=2, settle=90)
    print("\n" + report(findings))
    assert len(findings.outcomes) == SPECS
    assert findings.accepted and len(findings.accepted) < SPECS, "the generator must reach both outcomes"
    assert findings.silent_refusals == [], [(o.name, o.message[:200]) for o in findings.silent_refusals[:3]]
    assert not findings.operator_restarted
    assert findings.unhandled == [], f"admitted gates the operator never reported on: {findings.unhandled}"
    assert findings.unreadable == [], findings.unreadable[:3]
    assert findings.reconcile_failures == 0, dict(findings.reconcile_errors)
    # Lost write races (409) are requeued like in every controller; a crash loop would be many per gate.
    assert findings.reconcile_errors["Conflict"] <= 10 * len(findings.accepted), dict(findings.reconcile_errors)
