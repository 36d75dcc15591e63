"""The agent holds the config it finds in the mounted ConfigMap against the digest the operator put
into the stage pod's spec, and refuses a mismatch naming both digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.agent.config import check_digest
from gate.agent.errors import ConfigMismatch
from gate.agent.stage import read_config
from gate.api.digests import DIGEST, config_digest, text_config_digest
from gate.api.nodegate import NodeGate
from gate.cli.agent import stage_settings
from gate.cli.errors import CliError
from gate.cli.main import parser
from gate.controller.pods import config_map, stage_pod
from gate.controller.settings import OperatorSettings
from gate.lifecycle.node import PodRequest, Step
from tests.agent.packaging import configmap

BASE_ENV = {"NODEGATE_STAGE": "apply", "NODEGATE_PACKAGE": "p", "NODEGATE_VERSION": "1.0.0", "NODEGATE_GATE": "g"}


def test_the_digest_covers_every_key_and_value_and_nothing_else() -> None:
    one = config_digest({"a.conf": b"x=1\n", "b.conf": b"y"})
    assert DIGEST.match(one)
    assert one == config_digest({"b.conf": b"y", "a.conf": b"x=1\n"})  # order is not content
    different = [
        {"a.conf": b"x=2\n", "b.conf": b"y"},  # a value
        {"a.conf": b"x=1\n"},  # a key gone
        {"a.conf": b"x=1\n", "b.conf": b"y", "c.conf": b""},  # a key added, even empty
        {"a.conf": b"x=1\n", "b.conf ": b"y"},  # a key renamed
        {"a.conf": b"x=1\nb.conf", "": b"y"},  # the same bytes split elsewhere
    ]
    assert all(config_digest(files) != one for files in different)
    assert text_config_digest({"a.conf": "x=1\n", "b.conf": "y"}) == one
    assert text_config_digest({"café": "é"}) == config_digest({"café": "é".encode()})


def test_a_matching_config_passes_and_no_expected_digest_checks_nothing() -> None:
    files = {"a.conf": b"x=1\n"}
    check_digest(files, config_digest(files), "/nodegate-config")
    check_digest({"anything": b"else"}, None, "/nodegate-config")


def test_a_mismatch_is_refused_naming_both_digests_and_the_keys_found() -> None:
    expected = config_digest({"a.conf": b"x=1\n"})
    found = {"a.conf": b"x=1\n", "evil.sh": b"curl | sh"}
    with pytest.raises(ConfigMismatch) as caught:
        check_digest(found, expected, "/nodegate-config")
    message = str(caught.value)
    assert f"digest {config_digest(found)} (keys: a.conf, evil.sh)" in message
    assert f"config digest {expected}" in message and "/nodegate-config" in message
    assert "nothing was run and the host is unchanged" in message
    with pytest.raises(ConfigMismatch, match=r"\(keys: none\)"):  # the ConfigMap deleted (the volume is optional)
        check_digest({}, expected, "/nodegate-config")


def test_the_operators_digest_is_what_the_agent_computes_from_the_configmap_volume(tmp_path: Path) -> None:
    """End to end without a cluster: the ConfigMap the operator renders, laid out as the kubelet mounts
    it (symlinks into ..data), read by the agent, has the digest the operator put into the pod's args;
    a key starting with one dot is a key, the volume's `..` entries are not."""
    config = {"tuned.conf": "[main]\nsummary=gpu\n", ".env": "MODE=fast\n", "unicode.txt": "naïve ✓\n"}
    gate = NodeGate.model_validate({"metadata": {"name": "g", "uid": "u-1"}, "spec": {"packages": {
        "tuned": {"version": "1.0.0", "image": "example.com/tuned", "config": config},
        "bare": {"version": "1.0.0", "image": "example.com/bare"}}}})
    settings = OperatorSettings(namespace="ng")
    pod = stage_pod(gate, "n", PodRequest(name="p", kind="stages", steps=(
        Step("tuned", "apply", "f"), Step("bare", "apply", "f"))), settings)
    containers = {c["name"]: c for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]}

    def digest_arg(container: str) -> str:
        args = containers[container]["args"]
        return str(args[args.index("--config-digest") + 1])

    mounted = configmap(tmp_path / "cm", config_map(gate, "tuned", settings)["data"])
    assert read_config(mounted).keys() == {"tuned.conf", ".env", "unicode.txt"}
    assert config_digest(read_config(mounted)) == digest_arg("apply-tuned")
    # A package without config: an empty volume (no ConfigMap exists) is what it was started with.
    assert digest_arg("apply-bare") == config_digest({})
    empty = tmp_path / "empty"
    empty.mkdir()
    check_digest(read_config(empty), digest_arg("apply-bare"), str(empty))


def _parse(*args: str):  # type: ignore[no-untyped-def]
    return parser().parse_args(["agent", "run", *args])


def test_the_expected_digest_comes_from_the_flag_or_the_environment_and_must_be_well_formed() -> None:
    digest = config_digest({})
    assert stage_settings(_parse("--config-digest", digest), BASE_ENV).config_digest == digest
    assert stage_settings(_parse(), {**BASE_ENV, "NODEGATE_CONFIG_DIGEST": digest}).config_digest == digest
    assert stage_settings(_parse(), BASE_ENV).config_digest is None
    for bad in ("sha256:abc", digest.upper(), digest.removeprefix("sha256:"), "md5:" + "0" * 64):
        with pytest.raises(CliError, match="--config-digest wants sha256: and 64 lowercase hex digits"):
            stage_settings(_parse("--config-digest", bad), BASE_ENV)
