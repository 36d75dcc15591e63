"""docs/api.md is generated from the models; it must be what the generator renders today."""

from __future__ import annotations

from pathlib import Path

from gate.api.crd import openapi_schema
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.cli.apidoc import render_api_doc

REPO = Path(__file__).resolve().parents[2]


def test_api_md_is_current() -> None:
    assert (REPO / "docs/api.md").read_text() == render_api_doc(), (
        "docs/api.md is stale: run `nodegate api-docs --output docs/api.md`")


def _fields(schema: dict, prefix: str = "") -> set[str]:  # type: ignore[type-arg]
    out = set()
    for name, child in schema.get("properties", {}).items():
        out.add(name)
        out |= _fields(child)
        out |= _fields(child.get("items") or {})
        extra = child.get("additionalProperties")
        if isinstance(extra, dict):
            out |= _fields(extra)
    return out


def test_every_field_of_both_kinds_has_a_row() -> None:
    text = render_api_doc()
    for model in (NodeGate, DeploymentPolicy):
        schema = openapi_schema(model)
        for part in ("spec", "status"):
            for name in _fields(schema["properties"][part]):
                assert f"| `{name}` |" in text, f"{model.__name__}: no row for {name}"
