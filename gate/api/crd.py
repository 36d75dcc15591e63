"""CustomResourceDefinitions generated from the pydantic models: one source for both.

pydantic emits JSON Schema with `$ref`s, `anyOf [X, null]` for optionals and titles; Kubernetes needs a
*structural* OpenAPI v3 schema: every node typed, no references, no anyOf at the type level. This
module rewrites the one into the other and adds what only Kubernetes knows (CEL rules, list types,
int-or-string, printer columns, the status subresource).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy

Schema = dict[str, Any]

_DROP = {"title", "default", "format", "examples"}


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)  # the field's own description wins over the model's docstring
        return target
    return node


def _structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = _resolve(node, defs)
    if node.get("x-kubernetes-int-or-string"):
        out: Schema = {"x-kubernetes-int-or-string": True}
        if "description" in node:
            out["description"] = node["description"]
        return out
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']!r} structurally")
        merged = dict(_resolve(options[0], defs))
        for key, value in node.items():
            if key != "anyOf":
                merged[key] = value
        return _structural(merged, defs)

    out = {}
    for key, value in node.items():
        if key in _DROP or key.startswith("$"):
            continue
        if key == "properties":
            out["properties"] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out["additionalProperties"] = _structural(value, defs)
            elif node.get("x-kubernetes-preserve-unknown-fields"):
                continue
            else:
                continue  # pydantic's `additionalProperties: true` for open dicts
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "type" not in out and "properties" in out:
        out["type"] = "object"
    default = node.get("default")
    if isinstance(default, (bool, int, str)) and default != "" and "description" in out:
        shown = json.dumps(default) if not isinstance(default, str) else default
        out["description"] = f"{out['description'].rstrip('.')}. Default: {shown}."
    # description and type first: the generated YAML reads like hand-written CRDs
    ordered: Schema = {k: out.pop(k) for k in ("description", "type") if k in out}
    ordered.update(out)
    return ordered


def openapi_schema(model: type[Any]) -> Schema:
    """The structural OpenAPI v3 schema of a top-level kind."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _structural(raw, defs)
    props = schema["properties"]
    # The API server owns metadata's schema; a CRD may only say it is an object.
    props["metadata"] = {"type": "object"}
    # kstatus (Flux, kpt, cli-utils) reads an object without conditions as Current: a gate applied a
    # moment ago, before the operator wrote its first status, would look done. The API server fills
    # this default whenever it reads the object, so until the operator has written a status the
    # object says observedGeneration 0 < generation, which kstatus reads as InProgress
    # (LatestGenerationNotObserved) and Argo CD's script as Progressing (gate.lifecycle.health).
    props["status"]["default"] = {"observedGeneration": 0}
    schema.pop("required", None)
    schema["required"] = ["spec"]
    return schema


_NODEGATE_COLUMNS = [
    {"name": "Status", "type": "string", "jsonPath": ".status.status", "description": "Summary state."},
    {
        "name": "Complete",
        "type": "string",
        "jsonPath": ".status.progress",
        "description": "Complete nodes of matched nodes.",
    },
    {"name": "In progress", "type": "integer", "jsonPath": ".status.nodes.inProgress"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.nodes.failed"},
    {"name": "Policy", "type": "string", "jsonPath": ".spec.deploymentPolicy"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_POLICY_COLUMNS = [
    {"name": "Used by", "type": "string", "jsonPath": ".status.usedBy", "description": "Gates using it."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# `kubectl get nodegate-all` lists both kinds. A category must not equal any name of a kind (singular,
# plural or short name): kubectl expands a category before it resolves a resource, so a category
# `nodegate` turned `kubectl get nodegate NAME` into a get of two kinds ("you must specify only one
# resource"). A test checks every name of both kinds against it.
CATEGORY = "nodegate-all"


def _crd(kind: str, plural: str, short: str, model: type[Any], columns: list[Schema]) -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{keys.GROUP}",
            "labels": {"app.kubernetes.io/name": "nodegate", "app.kubernetes.io/part-of": "nodegate"},
        },
        "spec": {
            "group": keys.GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": keys.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": openapi_schema(model)},
                }
            ],
        },
    }


def nodegate_crd() -> Schema:
    return _crd("NodeGate", keys.NODEGATE_PLURAL, "ng", NodeGate, _NODEGATE_COLUMNS)


def policy_crd() -> Schema:
    return _crd("DeploymentPolicy", keys.POLICY_PLURAL, "dp", DeploymentPolicy, _POLICY_COLUMNS)


def all_crds() -> dict[str, Schema]:
    """File name -> CRD, in the order they should be applied."""
    return {
        f"{keys.GROUP}_{keys.NODEGATE_PLURAL}.yaml": nodegate_crd(),
        f"{keys.GROUP}_{keys.POLICY_PLURAL}.yaml": policy_crd(),
    }


class _Dumper(yaml.SafeDumper):
    """Block style, no aliases, stable key order: generated files diff cleanly."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(crd: Schema) -> str:
    header = "# Generated by `nodegate crds` from gate/api. Do not edit by hand.\n"
    return header + yaml.dump(crd, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False)


def write_crds(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, crd in all_crds().items():
        path = directory / name
        path.write_text(render(crd))
        written.append(path)
    return written


def stale_crds(directory: Path) -> list[str]:
    """Names of CRD files in `directory` that differ from what the models generate."""
    stale = []
    for name, crd in all_crds().items():
        path = directory / name
        if not path.exists() or path.read_text() != render(crd):
            stale.append(name)
    return stale


if __name__ == "__main__":  # pragma: no cover - debugging aid
    print(json.dumps(openapi_schema(NodeGate), indent=1))
