"""The chart tier: `helm lint`/`helm template` (no cluster) and installs into the session's control plane.

Rendering goes through gate.cli.manifests.render, the same code that writes the plain manifests:
the pinned helm, `--kube-version` of the dev cluster, values from a file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gate.api.common import Obj
from gate.cli.manifests import CHART, documents, helm_path, kube_version, render

REPO = Path(__file__).resolve().parent.parent.parent
CHART_DIR = REPO / CHART


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chart/" in str(item.fspath) and "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


def rendered(values: Obj | None = None, *, namespace: str = "nodegate-system", hooks: bool = True) -> list[Obj]:
    """The chart's objects for `values` (hooks included unless told otherwise)."""
    docs = documents(render(CHART_DIR, namespace=namespace, values=values))
    return [d.obj for d in docs if hooks or not d.hook]


def rendered_text(values: Obj | None = None, *, namespace: str = "nodegate-system") -> str:
    return render(CHART_DIR, namespace=namespace, values=values)


def helm(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_path(), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def lint(values: Obj, namespace: str = "nodegate-system") -> subprocess.CompletedProcess[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
        yaml.safe_dump(values, vf)
        vf.flush()
        return helm("lint", "--strict", str(CHART_DIR), "--namespace", namespace, "--kube-version", kube_version(),
                    "--values", vf.name, check=False)


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def env_of(container: Obj) -> dict[str, str]:
    """A container's plain env values (valueFrom fieldRef shown as 'fieldRef:<path>')."""
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = str(e["value"])
        else:
            out[e["name"]] = "fieldRef:" + e["valueFrom"]["fieldRef"]["fieldPath"]
    return out
