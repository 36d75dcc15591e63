"""Input that cannot roll out, through the real API server and the webhook: what the manifest table
(tests/integration/manifests) cannot hold in a file of reasonable size or says twice."""

from __future__ import annotations

import yaml

from tests.conftest import Kubectl, unique
from tests.integration.conftest import Webhook


def _gate(name: str, package: dict[str, object]) -> str:
    return yaml.safe_dump({"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
                           "spec": {"nodeSelector": {"matchLabels": {"nodegate.dev/selects": "nothing"}},
                                    "packages": {"tuned": {"version": "1.0.0", "image": "ghcr.io/example/tuned",
                                                           **package}}}})


def _refused(kubectl: Kubectl, manifest: str) -> str:
    # Server-side: a client-side apply keeps the whole object in an annotation, whose 256 KiB a large
    # config is past before any rule of NodeGate's is asked.
    proc = kubectl.run("apply", "--server-side", "-f", "-", stdin=manifest, check=False)
    if proc.returncode == 0:
        kubectl.run("delete", "-f", "-", "--wait=false", stdin=manifest, check=False)
    assert proc.returncode != 0, "admitted"
    return proc.stderr


def test_config_over_a_config_maps_size_is_refused_naming_the_package(kubectl: Kubectl, webhook: Webhook) -> None:
    # two keys of 600,000 bytes: each fits, together they are past the ConfigMap's 1 MiB
    stderr = _refused(kubectl, _gate(unique("big-config"), {"config": {"a.conf": "a" * 600_000,
                                                                        "b.conf": "b" * 600_000}}))
    assert "spec.packages[tuned].config: the values add up to 1200000 bytes; a ConfigMap holds at most 1048576" \
        in stderr, stderr


def test_a_config_at_the_size_limit_is_admitted(kubectl: Kubectl, webhook: Webhook) -> None:
    name = unique("full-config")
    manifest = _gate(name, {"config": {"a.conf": "a" * 1_048_000}})
    proc = kubectl.run("apply", "--server-side", "--dry-run=server", "-f", "-", stdin=manifest, check=False)
    assert proc.returncode == 0, proc.stderr


def test_env_names_a_pod_refuses_are_refused_naming_the_entry(kubectl: Kubectl, webhook: Webhook) -> None:
    stderr = _refused(kubectl, _gate(unique("env-name"), {"env": [{"name": "OK", "value": "1"},
                                                                   {"name": "A=B", "value": "2"}]}))
    assert "spec.packages[tuned].env[1].name: 'A=B' is no environment variable name" in stderr, stderr


def test_every_duration_past_its_maximum_is_named(kubectl: Kubectl, webhook: Webhook) -> None:
    name = unique("durations")
    manifest = yaml.safe_load(_gate(name, {"timeout": "25h", "gracefulShutdown": "2h"}))
    manifest["spec"].update({"waitTimeout": "99999999999999999h", "drain": {"timeout": "169h"}})
    stderr = _refused(kubectl, yaml.safe_dump(manifest))
    for fragment in ("spec.packages[tuned].timeout: '25h' is longer than the maximum of 24h",
                     "spec.packages[tuned].gracefulShutdown: '2h' is longer than the maximum of 1h",
                     "spec.waitTimeout: '99999999999999999h' is longer than the maximum of 720h",
                     "spec.drain.timeout: '169h' is longer than the maximum of 168h"):
        assert fragment in stderr, stderr
    assert "logged as a bug" not in stderr
