"""The published JSON Schema of package.yaml is generated from the models and kept current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gate.agent.package import SCHEMA_ID, package_schema, schema_text
from gate.cli.main import main

REPO = Path(__file__).resolve().parents[3]
PUBLISHED = REPO / "packages" / "package.schema.json"


def test_the_published_schema_is_current() -> None:
    assert PUBLISHED.read_text() == schema_text(), "run `nodegate package schema -o packages/package.schema.json`"


def test_schema_check_command_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n")
    assert main(["package", "schema", "--check", "--output", str(stale)]) == 1
    assert main(["package", "schema", "--output", str(stale)]) == 0
    assert main(["package", "schema", "--check", "--output", str(stale)]) == 0


def test_the_schema_names_itself_and_refuses_unknown_fields() -> None:
    schema = package_schema()
    assert schema["$id"] == SCHEMA_ID
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Step"]["oneOf"] == [{"required": ["script"]}, {"required": ["command"]}]
    assert set(schema["$defs"]["Stages"]["properties"]) == {
        "apply", "apply-check", "config", "config-check", "upgrade", "upgrade-check", "uninstall",
        "uninstall-check", "post-interrupt-check", "post-uninstall-check",
    }


def test_a_json_schema_validator_agrees_with_the_models_on_the_examples() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(PUBLISHED.read_text()))
    for manifest in sorted((REPO / "packages").glob("*/package.yaml")):
        validator.validate(yaml.safe_load(manifest.read_text()))
    bad = yaml.safe_load((REPO / "packages/sysctl-tuning/package.yaml").read_text())
    bad["stages"]["apply"][0]["command"] = "true"  # script and command both set
    assert list(validator.iter_errors(bad))
