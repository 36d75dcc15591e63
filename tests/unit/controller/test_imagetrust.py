"""The operator's image signature policy file: refused at start when it cannot be used, read again when
it changes (a new fingerprint forgets every verdict), the last good one kept when a change does not
parse (gate.controller.imagetrust, and `nodegate operator run --image-signatures`)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gate.cli.operator import cmd_run
from gate.controller.imagetrust import ImageTrust, read_policy
from gate.controller.metrics import OperatorMetrics
from gate.controller.settings import OperatorSettings


def pem() -> str:
    return ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def policy(mode: str = "enforce", key: str | None = None) -> str:
    return json.dumps({"mode": mode, "rules": [{"name": "team", "repositories": ["registry.example.com/team/*"],
                                                 "keys": [{"name": "k", "pem": key or pem()}]}]})


def write(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a new modification time, as a ConfigMap volume's swap gives


def test_a_policy_that_cannot_be_used_stops_the_start_naming_the_field(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(json.dumps({"mode": "audit"}))
    assert cmd_run(argparse.Namespace(image_signatures=str(bad))) == 2
    err = capsys.readouterr().err
    assert "--image-signatures" in err and "mode" in err
    assert cmd_run(argparse.Namespace(image_signatures=str(tmp_path / "missing.yaml"))) == 2
    assert "cannot be read" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text(policy())
    assert cmd_run(argparse.Namespace(image_signatures=str(good), resolve_digests=False)) == 2
    assert "--resolve-digests true" in capsys.readouterr().err
    with pytest.raises(ValueError, match="mode"):
        read_policy(str(bad))


async def test_a_changed_policy_is_read_again_forgets_its_verdicts_and_a_broken_change_keeps_the_last_good(
        tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    key = pem()
    write(path, policy(key=key), 1_000_000_000)
    trust = ImageTrust(OperatorSettings(image_signatures=str(path)), OperatorMetrics())
    assert trust.policy is not None and trust.policy.mode == "enforce"
    first = trust.policy.fingerprint()
    # A repository no rule covers is judged without asking a registry: NotCovered, allowed.
    image = ("other.example.com/team/a:1", "sha256:" + "1" * 64)
    assert (await trust.judge(*image, None)).reason == "NotCovered"
    assert trust.trusted() == {image}
    assert trust.changed() is False, "nothing changed"
    write(path, policy(key=key) + "\n", 2_000_000_000)  # another file, the same policy: verdicts kept
    assert trust.changed() is False and trust.trusted()
    write(path, policy("warn", key=key), 3_000_000_000)
    assert trust.changed() is True
    assert trust.policy.mode == "warn" and trust.policy.fingerprint() != first
    assert trust.trusted() == frozenset(), "every digest is judged again under the new policy"
    write(path, "mode: [", 4_000_000_000)
    assert trust.changed() is False and trust.policy.mode == "warn", "the last good policy is kept"
    assert ImageTrust(OperatorSettings(), OperatorMetrics()).trusted() is None, "no policy: nothing filtered"
