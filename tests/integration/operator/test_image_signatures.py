"""Image signatures enforced by the operator, on the real control plane with the real registry (issue 34).

The session's operator is started again as `nodegate dev up --image-signatures FILE` starts it: with
the dev cluster's policy file (`gate.devcluster.services.set_image_signatures`), which turns digest
resolution on; the tests rewrite that file to change the policy while it runs, and the session's
operator is put back without a policy afterwards. Images are pushed to the dev cluster's registry
(distribution) by `push` of test_image_digests, and signed in cosign's simple-signing format
(`sign`): with the real cosign when it is built in the cache (`gate.devcluster.cosign`), else by
`sign_like_cosign`, a test fixture that writes what `cosign sign --new-bundle-format=false` writes
(a simple-signing payload naming the digest, as a layer of a manifest under the tag
`sha256-<hex>.sig`, its ECDSA P-256 signature in the layer's `dev.cosignproject.cosign/signature`
annotation) with `cryptography`. The operator's verifier reads either the same way.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gate.api import keys
from gate.api.common import Obj
from gate.api.cosign import SIGNATURE_ANNOTATION, SIMPLESIGNING_TYPE, signature_tag
from gate.api.nodegate import NodeGate
from gate.controller.images import ImageResolver
from gate.controller.metrics import OperatorMetrics
from gate.controller.settings import OperatorSettings
from gate.devcluster import cosign, registry
from gate.devcluster.cluster import DevCluster
from gate.devcluster.services import AGENT_IMAGE_ENV, set_image_signatures, start_operator
from gate.kube.client import EVENTS, KubeClient
from gate.lifecycle.images import AGENT
from tests.conftest import unique
from tests.integration.operator.conftest import OPERATOR_FLAGS, Scenario, wait_for
from tests.integration.operator.test_image_digests import (
    OCI_CONFIG,
    OCI_MANIFEST,
    Pulls,
    images_of,
    push,
    put_manifest,
    rolled_out,
    upload_blob,
)
from tests.integration.operator.test_image_digests import pulls as pulls  # the fixture: every stage pod as created

RULE = "tests"
AGENT_REPOSITORY = "nodegate-sig/agent"


def sign_like_cosign(port: int, repository: str, digest: str, key: ec.EllipticCurvePrivateKey) -> None:
    """A test fixture: the simple-signing signature `cosign sign --new-bundle-format=false` attaches."""
    payload = json.dumps({"critical": {"identity": {"docker-reference": f"127.0.0.1:{port}/{repository}"},
                                       "image": {"docker-manifest-digest": digest},
                                       "type": "cosign container image signature"},
                          "optional": None}).encode()
    signature = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    layer = upload_blob(port, repository, payload)
    config = b'{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}'
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": OCI_CONFIG, "digest": upload_blob(port, repository, config),
                                      "size": len(config)},
                           "layers": [{"mediaType": SIMPLESIGNING_TYPE, "digest": layer, "size": len(payload),
                                       "annotations": {SIGNATURE_ANNOTATION: signature}}]}).encode()
    put_manifest(port, repository, signature_tag(digest), manifest)


class Signer:
    """A key pair the tests sign with: the real cosign's when it is built, else the fixture's."""

    def __init__(self, directory: Path) -> None:
        self.cosign = cosign.binary()
        if self.cosign is not None:
            self.key_file, pub = cosign.generate_key_pair(self.cosign, directory)
            self.public_pem = pub.read_text()
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())
            self.public_pem = self.key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def sign(self, port: int, repository: str, digest: str) -> None:
        if self.cosign is not None:
            cosign.sign(self.cosign, f"127.0.0.1:{port}/{repository}@{digest}", self.key_file, fmt="simplesigning")
        else:
            sign_like_cosign(port, repository, digest, self.key)


def policy_text(port: int, keys_: dict[str, str], *, mode: str = "enforce") -> str:
    return json.dumps({"mode": mode, "unmatched": "allow", "rules": [{
        "name": RULE, "repositories": [f"127.0.0.1:{port}/nodegate-sig/**"],
        "keys": [{"name": name, "pem": pem} for name, pem in keys_.items()]}]})


@pytest.fixture(scope="module")
def registry_port(cluster: DevCluster) -> int:
    return registry.start_registry(cluster.procs, lambda m: None)


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Signer, Signer]:
    """The trusted key and another one."""
    return Signer(tmp_path_factory.mktemp("trusted")), Signer(tmp_path_factory.mktemp("other"))


@pytest.fixture(scope="module")
def agent_digest(registry_port: int, signers: tuple[Signer, Signer]) -> str:
    """NodeGate's own agent image, signed with the trusted key, under the tag `dev`."""
    agent = push(registry_port, AGENT_REPOSITORY, "dev", "the agent")
    signers[0].sign(registry_port, AGENT_REPOSITORY, agent)
    return agent


@pytest.fixture(scope="module")
def verifying_operator(cluster: DevCluster, operator: int, registry_port: int, signers: tuple[Signer, Signer],
                       agent_digest: str) -> Iterator[int]:
    """The session's operator as `nodegate dev up --image-signatures FILE` starts it, trusting the first
    key for the test's repositories; put back without a policy afterwards. Its agent image is named by
    tag, as the chart's default names it: the operator resolves it to a digest, judges it like a
    package's, and pins it (test_enforce_...)."""
    cluster.stop_process("operator")
    set_image_signatures(cluster, policy_text(registry_port, {"trusted": signers[0].public_pem}))
    env = {AGENT_IMAGE_ENV: f"127.0.0.1:{registry_port}/{AGENT_REPOSITORY}:dev"}
    try:
        yield start_operator(cluster, lambda m: None, extra=[*OPERATOR_FLAGS, "--resolve-timeout", "5"], env=env)
    finally:
        cluster.stop_process("operator")
        set_image_signatures(cluster, None)
        start_operator(cluster, lambda m: None, extra=OPERATOR_FLAGS)


def conditions(gate: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (gate.get("status") or {}).get("conditions") or []}


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of the operator's series of `name` that carry `labels`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for row in text.splitlines():
        series, _, value = row.rpartition(" ")
        if series.partition("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


async def held_again(port: int) -> None:
    """Wait until the operator has reconciled the held gates twice more (each hold is a reconcile error,
    retried with backoff): whatever it would have done to the nodes meanwhile, it would have done."""
    start = metric(port, "nodegate_reconcile_errors_total", kind="gate", error="ImagesUnverified")

    async def twice() -> bool:
        return metric(port, "nodegate_reconcile_errors_total", kind="gate", error="ImagesUnverified") >= start + 2

    await wait_for(twice, what="two more reconciles of a held gate")


async def event(kube: KubeClient, gate: str, reason: str, *needles: str) -> None:
    async def seen() -> bool:
        items, _ = await kube.list(EVENTS, "default")
        return any(e.get("reason") == reason and (e.get("regarding") or {}).get("name") == gate
                   and e.get("type") == "Warning" and all(n in e.get("note", "") for n in needles) for e in items)

    await wait_for(seen, what=f"a Warning Event {reason} on {gate}")


async def nothing_started(scenario: Scenario, pulls: Pulls, nodes: list[str]) -> None:
    """No stage pod of the gate, and none of `nodes` cordoned or in a round."""
    assert pulls.of(scenario.name) == []
    for node in nodes:
        assert (await scenario.node(node))["spec"].get("unschedulable") is not True
        assert (await scenario.state(node)).get("status") != "in-progress"
        assert await scenario.node_status(node) in (None, "pending")


async def test_enforce_holds_an_unsigned_image_before_any_cordon_and_runs_the_signed_one(
        verifying_operator: int, registry_port: int, signers: tuple[Signer, Signer], agent_digest: str,
        scenario: Scenario, pulls: Pulls, kube: KubeClient) -> None:
    repo = f"nodegate-sig/{scenario.name}"
    image = f"127.0.0.1:{registry_port}/{repo}"
    unsigned = push(registry_port, repo, "1.0.0", "unsigned")
    foreign = push(registry_port, repo, "1.1.0", "signed by another key")
    signers[1].sign(registry_port, repo, foreign)
    signed = push(registry_port, repo, "2.0.0", "signed")
    signers[0].sign(registry_port, repo, signed)
    missing_before = metric(verifying_operator, "nodegate_image_verifications_total", result="SignatureMissing")
    await scenario.add_nodes(2)

    await scenario.apply_gate({"pkg": {"version": "1.0.0", "image": image}}, interruptionBudget={"count": 1})
    gate = await scenario.wait_condition("ImagesVerified", "False")
    held = conditions(gate)
    assert held["ImagesVerified"]["reason"] == "SignatureMissing"
    message = held["ImagesVerified"]["message"]
    assert all(part in message for part in ("package pkg", f"{image}:1.0.0", unsigned, f"rule {RULE}")), message
    assert (held["Ready"]["status"], held["Degraded"]["status"], gate["status"]["status"]) == ("False", "True",
                                                                                             "Degraded")
    record = images_of(gate)["pkg"]
    assert record["digest"] == unsigned and record["verified"]["reason"] == "SignatureMissing"
    assert record["verified"]["rule"] == RULE and record["verified"]["mode"] == "enforce"
    await event(kube, scenario.name, "SignatureMissing", f"{image}:1.0.0", unsigned)
    await held_again(verifying_operator)
    await nothing_started(scenario, pulls, scenario.nodes)
    assert metric(verifying_operator, "nodegate_image_verifications_total", result="SignatureMissing") > missing_before
    assert metric(verifying_operator, "nodegate_gate_images_unverified", gate=scenario.name) == 1

    # Signed, but by a key the rule does not list: held too, naming why.
    await scenario.apply_gate({"pkg": {"version": "1.1.0", "image": image}}, interruptionBudget={"count": 1})

    async def refused_foreign() -> bool:
        c = conditions(await scenario.gate()).get("ImagesVerified", {})
        return c.get("status") == "False" and foreign in c.get("message", "")

    await wait_for(refused_foreign, what="the image signed by another key refused")
    reason = conditions(await scenario.gate())["ImagesVerified"]["reason"]
    assert reason in ("SignatureInvalid", "UntrustedKey"), reason
    await held_again(verifying_operator)
    await nothing_started(scenario, pulls, scenario.nodes)

    # The agent's tag was resolved and pinned when the first gate was judged: pushed again now, unsigned,
    # it changes nothing that runs (the stage pods below pull the pinned, verified digest).
    agent_tag = push(registry_port, AGENT_REPOSITORY, "dev", f"the agent, pushed again by {scenario.name}")

    # Signed with the trusted key: the rollout runs, by that digest, and says it verified.
    await scenario.apply_gate({"pkg": {"version": "2.0.0", "image": image}}, interruptionBudget={"count": 1})

    async def complete() -> bool:
        return all([await scenario.node_status(n) == "complete" for n in scenario.nodes])

    await wait_for(complete, what="the signed image rolled out")
    gate = await scenario.wait_ready()
    verified = conditions(gate)["ImagesVerified"]
    assert (verified["status"], verified["reason"]) == ("True", "Verified")
    record = images_of(gate)["pkg"]
    assert record["digest"] == signed and record["verified"]["key"] == "trusted"
    assert {p["payloads"]["pkg"] for p in pulls.of(scenario.name)} == {(f"{image}@{signed}", "IfNotPresent")}
    # NodeGate's own agent image: by the digest its tag named when it was judged, not by the tag.
    assert agent_tag != agent_digest
    assert set().union(*(p["agents"] for p in pulls.of(scenario.name))) == {
        f"127.0.0.1:{registry_port}/{AGENT_REPOSITORY}@{agent_digest}"}


async def test_warn_mode_runs_and_warns_and_a_key_removed_mid_rollout_holds_the_remaining_nodes(
        cluster: DevCluster, verifying_operator: int, registry_port: int, signers: tuple[Signer, Signer],
        scenario: Scenario, pulls: Pulls, kube: KubeClient) -> None:
    trusted = {"trusted": signers[0].public_pem}
    repo = f"nodegate-sig/{scenario.name}"
    image = f"127.0.0.1:{registry_port}/{repo}"
    unsigned = push(registry_port, repo, "1.0.0", "unsigned, in warn mode")
    signed = push(registry_port, repo, "2.0.0", "signed")
    signers[0].sign(registry_port, repo, signed)
    first = await scenario.add_nodes(1)
    try:
        # Warn mode: the unsigned image runs; the condition and an Event say what enforce would refuse.
        set_image_signatures(cluster, policy_text(registry_port, trusted, mode="warn"))
        await scenario.apply_gate({"pkg": {"version": "1.0.0", "image": image}}, interruptionBudget={"count": 1})
        await scenario.wait_node(first[0], "complete")
        gate = await scenario.wait_ready()
        warned = conditions(gate)["ImagesVerified"]
        assert (warned["status"], warned["reason"]) == ("True", "SignatureMissing")
        assert warned["message"].startswith("warn mode") and unsigned in warned["message"]
        assert images_of(gate)["pkg"]["verified"]["mode"] == "warn"
        await event(kube, scenario.name, "SignatureMissing", "warn mode", unsigned)

        # Enforce again, the signed version on the first node; then the trusted key is removed from the
        # policy (a rotation gone wrong) and more nodes join the rollout: they are held, none cordoned.
        set_image_signatures(cluster, policy_text(registry_port, trusted))
        await scenario.apply_gate({"pkg": {"version": "2.0.0", "image": image}}, interruptionBudget={"count": 1})

        await rolled_out(scenario, "pkg", signed, complete=1)
        set_image_signatures(cluster, policy_text(registry_port, {"other": signers[1].public_pem}))
        gate = await scenario.wait_condition("ImagesVerified", "False")
        message = conditions(gate)["ImagesVerified"]["message"]
        assert signed in message and f"package (agent): image 127.0.0.1:{registry_port}/{AGENT_REPOSITORY}" in message
        before = len(pulls.of(scenario.name))
        later = await scenario.add_nodes(2, start=1)
        await event(kube, scenario.name, conditions(gate)["ImagesVerified"]["reason"], signed)
        await held_again(verifying_operator)
        assert len(pulls.of(scenario.name)) == before
        for node in later:
            assert (await scenario.node(node))["spec"].get("unschedulable") is not True
            assert (await scenario.state(node)).get("status") != "in-progress"
        assert keys.FINALIZER in (await scenario.gate())["metadata"]["finalizers"]
    finally:
        set_image_signatures(cluster, policy_text(registry_port, trusted))



async def test_a_tagged_agent_image_that_does_not_resolve_holds_then_is_pinned_once_it_does(
        registry_port: int, signers: tuple[Signer, Signer], kube: KubeClient, tmp_path: Path) -> None:
    """The operator's resolver in this process, against the real registry: NodeGate's agent image by a
    tag the registry does not have yet is a problem of package (agent), naming the image, and nothing
    is pinned; once the tag exists (signed), it is judged and the settings name it by digest."""
    policy = tmp_path / "policy.json"
    policy.write_text(policy_text(registry_port, {"trusted": signers[0].public_pem}))
    repository = f"nodegate-sig/agent-{unique('tag')}"
    tagged = f"127.0.0.1:{registry_port}/{repository}:dev"
    settings = OperatorSettings(agent_image=tagged, image_signatures=str(policy), resolve_timeout=5)
    resolver = ImageResolver(settings, kube, OperatorMetrics())
    gate = NodeGate.model_validate({"metadata": {"name": "agent-tag"}, "spec": {"packages": {"pkg": {
        "version": "1.0.0", "image": f"127.0.0.1:{registry_port}/nodegate-sig/pkg"}}}})

    _, judged, unread = await resolver.verify(gate, [])
    assert judged == [] and settings.agent_image == tagged
    assert unread[AGENT].startswith(f"NodeGate's agent image {tagged} (in every stage pod) could not be resolved")

    digest = push(registry_port, repository, "dev", "an agent pushed late")
    signers[0].sign(registry_port, repository, digest)
    _, judged, unread = await resolver.verify(gate, [])
    assert unread == {} and settings.agent_image == f"127.0.0.1:{registry_port}/{repository}@{digest}"
    assert [(j.record.package, j.record.digest, j.verdict.reason) for j in judged] == [(AGENT, digest, "Verified")]
