"""The two GitOps evaluators NodeGate's objects are judged by, run for real.

* kstatus: `kstatus-probe` (gate/devcluster/kstatus_probe) calls sigs.k8s.io/cli-utils' status.Compute,
  the library Flux, kpt and cli-utils use; it is built from the Go module proxy like the control plane.
* Argo CD: the health scripts of charts/nodegate/docs/argocd, run on Lua 5.1 (lupa), the language
  version of gopher-lua, which Argo CD runs them on. Like Argo CD, the object is the global `obj` and
  the script returns a table with `status` and `message`.

Recorded objects (testdata/*.yaml beside each script, listed in health_test.yaml as Argo CD keeps its
own resource customizations) come from real rollouts: the live tests write them when
NODEGATE_RECORD_GITOPS=1 is set (tests/integration/operator/test_gitops_health.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from gate.api.common import Obj

REPO = Path(__file__).resolve().parent.parent
ARGOCD = REPO / "charts" / "nodegate" / "docs" / "argocd"
RECORD_ENV = "NODEGATE_RECORD_GITOPS"


def script_dir(kind: str) -> Path:
    return ARGOCD / "nodegate.io" / kind


@dataclass(frozen=True)
class Health:
    status: str
    message: str


def argocd_scripts() -> dict[str, str]:
    """Kind -> health script, as shipped in the `argocd-cm` snippet."""
    data = yaml.safe_load((ARGOCD / "argocd-cm.yaml").read_text())["data"]
    prefix = "resource.customizations.health.nodegate.io_"
    return {key.removeprefix(prefix): script for key, script in data.items() if key.startswith(prefix)}


def argocd_health(obj: Obj, script: str | None = None) -> Health:
    """Argo CD's verdict on `obj`: its kind's script of the argocd-cm snippet on a fresh Lua 5.1 runtime."""
    import lupa.lua51 as lua51

    script = script if script is not None else argocd_scripts()[obj["kind"]]
    lua = lua51.LuaRuntime(unpack_returned_tuples=False)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script)
    if result is None:
        raise AssertionError(f"the {obj['kind']} health script returned nothing")
    return Health(str(result["status"]), str(result["message"]))


@dataclass(frozen=True)
class Kstatus:
    status: str
    message: str
    conditions: list[Obj]


def kstatus(objs: list[Obj]) -> list[Kstatus]:
    """kstatus' status.Compute on each object, in order."""
    from gate.devcluster.build import ensure_built

    probe = ensure_built(("kstatus-probe",), progress=lambda m: None)["kstatus-probe"]
    proc = subprocess.run([str(probe)], input=json.dumps(objs), capture_output=True, text=True, check=False,
                          timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"kstatus-probe failed ({proc.returncode}): {proc.stderr}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == len(objs), proc.stdout
    return [Kstatus(v["status"], v["message"], v["conditions"]) for v in lines]


def recorded(obj: Obj) -> Obj:
    """The object as stored in testdata: what the API server returned, less the server's bookkeeping."""
    meta = {k: v for k, v in obj["metadata"].items()
            if k not in ("managedFields", "resourceVersion", "uid", "creationTimestamp")}
    return {**obj, "metadata": meta}


def record(name: str, obj: Obj, health: Health) -> None:
    """With NODEGATE_RECORD_GITOPS=1, store `obj` as testdata/<name>.yaml and its expected health in
    health_test.yaml (Argo CD's format); otherwise do nothing."""
    if os.environ.get(RECORD_ENV) != "1":
        return
    directory = script_dir(obj["kind"])
    (directory / "testdata").mkdir(parents=True, exist_ok=True)
    (directory / "testdata" / f"{name}.yaml").write_text(yaml.safe_dump(recorded(obj), sort_keys=False))
    tests_file = directory / "health_test.yaml"
    tests = (yaml.safe_load(tests_file.read_text()) if tests_file.exists() else None) or {"tests": []}
    path = f"testdata/{name}.yaml"
    cases = [t for t in tests["tests"] if t["inputPath"] != path]
    cases.append({"healthStatus": {"status": health.status, "message": health.message}, "inputPath": path})
    tests_file.write_text(yaml.safe_dump({"tests": sorted(cases, key=lambda t: t["inputPath"])}, sort_keys=False))
